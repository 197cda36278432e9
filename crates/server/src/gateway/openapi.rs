//! The OpenAPI 3 document of `/api/v1`, made from the routes and the services' descriptors, so
//! it cannot drift from what is served: every route is an operation; a `{field}` segment is a
//! path parameter; a GET's or DELETE's other scalar fields are query parameters; a POST's or
//! PUT's request message is the JSON body; answers are the response messages' schemas.

use std::collections::BTreeMap;

use prost_reflect::{DescriptorPool, FieldDescriptor, Kind, MessageDescriptor};
use serde_json::{json, Map, Value};

use super::routes::{Reply, ROUTES};
use super::transcode;

/// The document.
pub fn document(pool: &DescriptorPool) -> anyhow::Result<Value> {
    let mut paths: BTreeMap<&str, Map<String, Value>> = BTreeMap::new();
    let mut schemas = BTreeMap::new();
    for r in ROUTES {
        let method =
            transcode::method(pool, r.rpc).ok_or_else(|| anyhow::anyhow!("{}: no such method", r.rpc))?;
        let path_fields: Vec<&str> = r.path_fields().collect();
        let mut parameters: Vec<Value> = path_fields
            .iter()
            .map(|f| {
                json!({"name": f, "in": "path", "required": true,
                       "schema": path_schema(&method.input(), f)})
            })
            .collect();
        let mut op = json!({
            "operationId": r.rpc.rsplit('/').next().unwrap_or(r.rpc),
            "summary": r.summary,
            "tags": [r.path.split('/').nth(3).unwrap_or("api")],
            "x-grpc-method": r.rpc,
        });
        if r.body {
            add_schema(&method.input(), &mut schemas);
            op["requestBody"] = json!({"required": true, "content": {"application/json": {
                "schema": {"$ref": reference(&method.input())}}}});
        } else {
            for f in method.input().fields() {
                if path_fields.contains(&f.name()) || !query_field(&f) {
                    continue;
                }
                parameters.push(json!({"name": f.name(), "in": "query", "required": false,
                    "schema": field_schema(&f, &mut schemas),
                    "explode": false, "style": "form"}));
            }
        }
        op["parameters"] = Value::Array(parameters);
        op["responses"] = responses(r.reply, &method.output(), &mut schemas);
        paths.entry(r.path).or_default().insert(r.method.to_ascii_lowercase(), op);
    }
    schemas.insert(
        "Error".to_string(),
        json!({"type": "object", "required": ["error"], "properties": {"error": {"type": "object",
            "required": ["code", "message"],
            "properties": {"code": {"type": "string", "description": "the gRPC code's name, e.g. PERMISSION_DENIED"},
                           "message": {"type": "string"}}}}}),
    );
    Ok(json!({
        "openapi": "3.0.3",
        "info": {"title": "kairos", "version": "v1",
                 "description": "The kairos job and admin services as JSON over HTTP: each operation is the gRPC method named in x-grpc-method, with the same authentication, roles, limits and answers."},
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}, {"session": []}],
        "paths": paths,
        "components": {
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer", "description": "an API token (`kairos token create`)"},
                "session": {"type": "apiKey", "in": "cookie", "name": super::session::SESSION_COOKIE,
                            "description": "the web UI's login (POST /ui/login); changes also need the X-CSRF-Token header"}
            },
            "schemas": schemas,
        }
    }))
}

/// An operation's answers: `reply` of `output` messages, or an error.
fn responses(reply: Reply, output: &MessageDescriptor, schemas: &mut BTreeMap<String, Value>) -> Value {
    let ok = match reply {
        Reply::Json => {
            add_schema(output, schemas);
            json!({"application/json": {"schema": {"$ref": reference(output)}}})
        }
        Reply::Events => {
            add_schema(output, schemas);
            json!({"text/event-stream": {"schema": {"type": "string",
                "description": format!("one `data:` line per {} (JSON), as server-sent events", output.name())}}})
        }
        Reply::Text => json!({"text/plain": {"schema": {"type": "string"}}}),
    };
    json!({
        "200": {"description": "OK", "content": ok},
        "default": {"description": "an error: the gRPC code's HTTP status, and the code and message",
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    })
}

/// Whether `f` can be given in a query string.
fn query_field(f: &FieldDescriptor) -> bool {
    !f.is_map() && !matches!(f.kind(), Kind::Message(_) | Kind::Bytes)
}

/// The schema of a path field (a dotted name reaches into nested messages).
fn path_schema(msg: &MessageDescriptor, name: &str) -> Value {
    let (head, rest) = name.split_once('.').map_or((name, None), |(h, r)| (h, Some(r)));
    match (msg.get_field_by_name(head), rest) {
        (Some(f), Some(rest)) => match f.kind() {
            Kind::Message(inner) => path_schema(&inner, rest),
            _ => json!({"type": "string"}),
        },
        (Some(f), None) => scalar_schema(&f.kind()),
        (None, _) => json!({"type": "string"}),
    }
}

fn reference(msg: &MessageDescriptor) -> String {
    format!("#/components/schemas/{}", msg.full_name())
}

/// Adds `msg`'s schema (and those it refers to) to `schemas`.
fn add_schema(msg: &MessageDescriptor, schemas: &mut BTreeMap<String, Value>) {
    if schemas.contains_key(msg.full_name()) {
        return;
    }
    schemas.insert(msg.full_name().to_string(), Value::Null);
    let mut properties = Map::new();
    for f in msg.fields() {
        properties.insert(f.name().to_string(), field_schema(&f, schemas));
    }
    schemas.insert(msg.full_name().to_string(), json!({"type": "object", "properties": properties}));
}

fn field_schema(f: &FieldDescriptor, schemas: &mut BTreeMap<String, Value>) -> Value {
    if f.is_map() {
        if let Kind::Message(entry) = f.kind() {
            let value = entry.map_entry_value_field();
            return json!({"type": "object", "additionalProperties": field_schema(&value, schemas)});
        }
    }
    let one = match f.kind() {
        Kind::Message(m) => {
            add_schema(&m, schemas);
            json!({"$ref": reference(&m)})
        }
        k => scalar_schema(&k),
    };
    if f.is_list() {
        json!({"type": "array", "items": one})
    } else {
        one
    }
}

fn scalar_schema(kind: &Kind) -> Value {
    match kind {
        Kind::String => json!({"type": "string"}),
        Kind::Bool => json!({"type": "boolean"}),
        Kind::Bytes => json!({"type": "string", "format": "byte"}),
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => json!({"type": "integer", "format": "int32"}),
        Kind::Uint32 | Kind::Fixed32 => json!({"type": "integer", "format": "int32", "minimum": 0}),
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => json!({"type": "integer", "format": "int64"}),
        Kind::Uint64 | Kind::Fixed64 => json!({"type": "integer", "format": "int64", "minimum": 0}),
        Kind::Float => json!({"type": "number", "format": "float"}),
        Kind::Double => json!({"type": "number", "format": "double"}),
        Kind::Enum(e) => {
            json!({"type": "string", "enum": e.values().map(|v| v.name().to_string()).collect::<Vec<_>>()})
        }
        Kind::Message(m) => json!({"$ref": reference(m)}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The document and the routes agree both ways, and every reference resolves.
    #[test]
    fn the_document_describes_exactly_the_routes() {
        let doc = document(&transcode::pool().unwrap()).unwrap();
        let paths = doc["paths"].as_object().unwrap();
        let mut described = 0;
        for (path, ops) in paths {
            for (method, op) in ops.as_object().unwrap() {
                described += 1;
                let route = ROUTES
                    .iter()
                    .find(|r| r.method == method.to_ascii_uppercase() && r.path == path)
                    .unwrap_or_else(|| panic!("{method} {path} is described but not routed"));
                assert_eq!(route.path, path.as_str());
                assert_eq!(op["x-grpc-method"], route.rpc);
                // Every path parameter is declared, and nothing else is "in: path".
                let declared: Vec<&str> = op["parameters"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|p| p["in"] == "path")
                    .map(|p| p["name"].as_str().unwrap())
                    .collect();
                let template: Vec<&str> = route.path_fields().collect();
                assert_eq!(declared, template, "{method} {path}");
            }
        }
        assert_eq!(described, ROUTES.len());
        let text = doc.to_string();
        for r in text.split("\"$ref\":\"#/components/schemas/").skip(1) {
            let name = r.split('"').next().unwrap();
            assert!(doc["components"]["schemas"][name].is_object(), "{name} is referred to but not defined");
        }
        // Query parameters are real fields of the request.
        let list = &paths["/api/v1/jobs"]["get"]["parameters"];
        let names: Vec<&str> = list.as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap()).collect();
        assert!(names.contains(&"states") && names.contains(&"page_token"), "{names:?}");
    }
}

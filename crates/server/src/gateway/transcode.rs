//! JSON ⇄ protobuf for the gateway, through the services' own descriptors: a request is built
//! from the JSON body and the path's and query's parameters, encoded, and sent to this replica's
//! gRPC port as raw bytes; the answer is decoded the same way. No message is described twice.

use bytes::{Buf, BufMut, Bytes};
use prost::Message;
use prost_reflect::{DescriptorPool, DynamicMessage, FieldDescriptor, Kind, MethodDescriptor};
use serde_json::{Map, Value};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::Status;

/// The services' descriptors (built with the protos; a bad set is a build error, checked by the
/// tests).
pub fn pool() -> Result<DescriptorPool, prost_reflect::DescriptorError> {
    DescriptorPool::decode(kairos_proto::v1::FILE_DESCRIPTOR_SET)
}

/// The method behind `rpc` (`/kairos.v1.JobService/GetJob`).
pub fn method(pool: &DescriptorPool, rpc: &str) -> Option<MethodDescriptor> {
    let (service, name) = rpc.strip_prefix('/')?.split_once('/')?;
    pool.get_service_by_name(service)?.methods().find(|m| m.name() == name)
}

/// The request for `method`: the JSON `body` (may be empty) with `params` (path segments and
/// query pairs, by field name; a dotted name is a nested field) set on it, encoded. A field
/// that does not exist, or a value of the wrong kind, is `INVALID_ARGUMENT` naming it.
pub fn request(method: &MethodDescriptor, body: &[u8], params: &[(String, String)]) -> Result<Bytes, Status> {
    let mut json = if body.iter().all(u8::is_ascii_whitespace) {
        Map::new()
    } else {
        match serde_json::from_slice::<Value>(body) {
            Ok(Value::Object(m)) => m,
            Ok(_) => return Err(Status::invalid_argument("the body must be a JSON object")),
            Err(e) => return Err(Status::invalid_argument(format!("the body is not JSON: {e}"))),
        }
    };
    let input = method.input();
    for (name, raw) in params {
        set_param(&mut json, &input, name, raw)?;
    }
    let json = Value::Object(json);
    check_numbers(&json, &input, "")?;
    let options = prost_reflect::DeserializeOptions::new().deny_unknown_fields(true);
    let msg = DynamicMessage::deserialize_with_options(input, json, &options)
        .map_err(|e| Status::invalid_argument(format!("request: {e}")))?;
    Ok(msg.encode_to_vec().into())
}

/// Refuses a JSON number outside its field's integer type, naming the field (the decoder's own
/// error names no field): `spec.resources.gpus: -2 is not a non-negative 32-bit integer`.
fn check_numbers(json: &Value, msg: &prost_reflect::MessageDescriptor, at: &str) -> Result<(), Status> {
    let Value::Object(map) = json else { return Ok(()) };
    for (key, value) in map {
        let Some(field) = msg.get_field_by_name(key).or_else(|| msg.get_field_by_json_name(key)) else {
            continue;
        };
        let path = if at.is_empty() { key.clone() } else { format!("{at}.{key}") };
        if field.is_map() {
            continue;
        }
        let items: Vec<&Value> = match value {
            Value::Array(a) if field.is_list() => a.iter().collect(),
            v => vec![v],
        };
        for item in items {
            match field.kind() {
                Kind::Message(m) => check_numbers(item, &m, &path)?,
                kind => check_integer(item, &kind, &path)?,
            }
        }
    }
    Ok(())
}

/// A JSON number in a field of integer `kind` that the kind cannot hold.
fn check_integer(v: &Value, kind: &Kind, path: &str) -> Result<(), Status> {
    let Value::Number(n) = v else { return Ok(()) };
    let (fits, what) = match kind {
        Kind::Uint32 | Kind::Fixed32 => {
            (n.as_u64().is_some_and(|x| x <= u64::from(u32::MAX)), "a non-negative 32-bit integer")
        }
        Kind::Uint64 | Kind::Fixed64 => (n.as_u64().is_some(), "a non-negative integer"),
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => {
            (n.as_i64().is_some_and(|x| i32::try_from(x).is_ok()), "a 32-bit integer")
        }
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => (n.as_i64().is_some(), "an integer"),
        _ => (true, ""),
    };
    if fits {
        Ok(())
    } else {
        Err(Status::invalid_argument(format!("{path}: {n} is not {what}")))
    }
}

/// Sets `name` (dotted for nested messages) in `json` to `raw` read as that field's type.
fn set_param(
    json: &mut Map<String, Value>,
    msg: &prost_reflect::MessageDescriptor,
    name: &str,
    raw: &str,
) -> Result<(), Status> {
    let unknown = || Status::invalid_argument(format!("unknown parameter \"{name}\""));
    let (head, rest) = match name.split_once('.') {
        Some((h, r)) => (h, Some(r)),
        None => (name, None),
    };
    let field = msg.get_field_by_name(head).ok_or_else(unknown)?;
    match (rest, field.kind()) {
        (Some(rest), Kind::Message(inner)) if !field.is_list() && !field.is_map() => {
            let slot = json.entry(head.to_string()).or_insert_with(|| Value::Object(Map::new()));
            let Value::Object(nested) = slot else {
                return Err(Status::invalid_argument(format!("\"{head}\" must be an object")));
            };
            set_param(nested, &inner, rest, raw)
        }
        (Some(_), _) => Err(unknown()),
        (None, _) => {
            let value = scalar(&field, raw, name)?;
            json.insert(head.to_string(), value);
            Ok(())
        }
    }
}

/// A query or path value as JSON of the field's type; a list field takes comma-separated values.
fn scalar(field: &FieldDescriptor, raw: &str, name: &str) -> Result<Value, Status> {
    let bad = |what: &str| Status::invalid_argument(format!("parameter \"{name}\": \"{raw}\" is not {what}"));
    if field.is_list() {
        let items: Result<Vec<Value>, Status> =
            raw.split(',').filter(|s| !s.is_empty()).map(|s| one(field, s, &bad)).collect();
        return items.map(Value::Array);
    }
    if field.is_map() {
        return Err(Status::invalid_argument(format!("parameter \"{name}\" is a map: send it in the body")));
    }
    one(field, raw, &bad)
}

fn one(field: &FieldDescriptor, raw: &str, bad: &dyn Fn(&str) -> Status) -> Result<Value, Status> {
    Ok(match field.kind() {
        Kind::String => Value::String(raw.to_string()),
        Kind::Bool => match raw {
            "" | "true" | "1" => Value::Bool(true),
            "false" | "0" => Value::Bool(false),
            _ => return Err(bad("true or false")),
        },
        Kind::Int32 | Kind::Int64 | Kind::Sint32 | Kind::Sint64 | Kind::Sfixed32 | Kind::Sfixed64 => {
            Value::from(raw.parse::<i64>().map_err(|_| bad("an integer"))?)
        }
        Kind::Uint32 | Kind::Uint64 | Kind::Fixed32 | Kind::Fixed64 => {
            Value::from(raw.parse::<u64>().map_err(|_| bad("a non-negative integer"))?)
        }
        Kind::Double | Kind::Float => Value::from(raw.parse::<f64>().map_err(|_| bad("a number"))?),
        Kind::Enum(e) => {
            // `RUNNING`, `running` or `JOB_STATE_RUNNING` for JobState's JOB_STATE_RUNNING.
            let prefix = enum_prefix(e.name());
            let wanted = raw.to_ascii_uppercase();
            let found = e.values().find(|v| v.name() == wanted || v.name() == format!("{prefix}{wanted}"));
            match found {
                Some(v) => Value::String(v.name().to_string()),
                None => return Err(bad(&format!("a {}", e.name()))),
            }
        }
        Kind::Bytes | Kind::Message(_) => return Err(bad("allowed here: send it in the body")),
    })
}

/// `JobState` → `JOB_STATE_`: the prefix proto style gives an enum's values.
pub fn enum_prefix(name: &str) -> String {
    let mut out = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out.push('_');
    out
}

/// `bytes`, a message of `method`'s output type, as JSON: fields by their proto names, all
/// present (defaults included), enums by name, 64-bit integers as numbers.
pub fn response(method: &MethodDescriptor, bytes: Bytes) -> Result<Value, Status> {
    let msg = DynamicMessage::decode(method.output(), bytes)
        .map_err(|e| Status::internal(format!("decoding the answer: {e}")))?;
    let options = prost_reflect::SerializeOptions::new()
        .use_proto_field_name(true)
        .skip_default_fields(false)
        .stringify_64_bit_integers(false);
    msg.serialize_with_options(serde_json::value::Serializer, &options)
        .map_err(|e| Status::internal(format!("encoding the answer: {e}")))
}

/// Passes already-encoded messages through tonic unchanged.
#[derive(Clone, Copy, Debug, Default)]
pub struct RawCodec;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }

    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(rpc: &str) -> MethodDescriptor {
        method(&pool().unwrap(), rpc).unwrap()
    }

    #[test]
    fn query_and_path_values_take_their_fields_types() {
        let list = m("/kairos.v1.JobService/ListJobs");
        let params = [("states", "running,PENDING"), ("limit", "5"), ("user", "alice"), ("mine", "")]
            .map(|(k, v)| (k.to_string(), v.to_string()));
        let bytes = request(&list, b"", &params).unwrap();
        let req = kairos_proto::v1::ListJobsRequest::decode(bytes).unwrap();
        assert_eq!(req.states, vec![2, 1]);
        assert_eq!((req.limit, req.user.as_str(), req.mine), (5, "alice", true));

        let put = m("/kairos.v1.AdminService/PutQos");
        let body = br#"{"qos": {"priority": 7}}"#;
        let bytes = request(&put, body, &[("qos.name".into(), "urgent".into())]).unwrap();
        let req = kairos_proto::v1::PutQosRequest::decode(bytes).unwrap();
        let qos = req.qos.unwrap();
        assert_eq!((qos.name.as_str(), qos.priority), ("urgent", 7));
    }

    #[test]
    fn a_number_its_field_cannot_hold_is_refused_naming_the_field() {
        let submit = m("/kairos.v1.JobService/Submit");
        for (body, says) in [
            (
                r#"{"spec": {"resources": {"gpus": -2}}}"#,
                "spec.resources.gpus: -2 is not a non-negative 32-bit integer",
            ),
            (r#"{"spec": {"after_ok": [1, -5]}}"#, "spec.after_ok: -5 is not a non-negative integer"),
            (r#"{"spec": {"resources": {"gpus": 4294967296}}}"#, "spec.resources.gpus: 4294967296"),
        ] {
            let e = request(&submit, body.as_bytes(), &[]).unwrap_err();
            assert!(e.message().contains(says), "{body}: {}", e.message());
        }
        assert!(request(&submit, br#"{"spec": {"resources": {"gpus": 2}}}"#, &[]).is_ok());
    }

    #[test]
    fn bad_requests_name_what_is_wrong() {
        let list = m("/kairos.v1.JobService/ListJobs");
        for (params, body, says) in [
            (vec![("nope", "1")], "", "unknown parameter \"nope\""),
            (vec![("limit", "-1")], "", "\"limit\": \"-1\" is not a non-negative integer"),
            (vec![("states", "DANCING")], "", "is not a JobState"),
            (vec![("all", "maybe")], "", "is not true or false"),
            (vec![], "[1]", "must be a JSON object"),
            (vec![], "{", "not JSON"),
            (vec![], r#"{"limit": "x"}"#, "request:"),
            (vec![], r#"{"unknown_field": 1}"#, "unknown_field"),
        ] {
            let params: Vec<(String, String)> =
                params.into_iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            let e = request(&list, body.as_bytes(), &params).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument);
            assert!(e.message().contains(says), "{} lacks {says}", e.message());
        }
    }

    #[test]
    fn answers_read_as_json_with_every_field_by_its_proto_name() {
        let get = m("/kairos.v1.JobService/GetJob");
        let job = kairos_proto::v1::Job { id: 7, state: 2, user: "alice".into(), ..Default::default() };
        let json = response(&get, job.encode_to_vec().into()).unwrap();
        assert_eq!(json["id"], 7);
        assert_eq!(json["state"], "JOB_STATE_RUNNING");
        assert_eq!(json["user"], "alice");
        assert_eq!(json["gpu_ids"], Value::Array(vec![]));
        assert_eq!(enum_prefix("JobState"), "JOB_STATE_");
    }
}

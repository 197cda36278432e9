//! The gateway as an axum router: every entry of the route table (`routes::ROUTES`) is an
//! axum route of its method and path (the path's `{field}`s are axum's path parameters, the
//! query read by axum's `Query`), beside the login, the OpenAPI document and the pages. What
//! every answer gets is a tower layer: the body bound (413 from the declared length, before
//! the call is authenticated or any of the body read) and the security headers. Outside the
//! routes: 404 and 405 as JSON errors under `/api/`, as small pages elsewhere.
//!
//! `serve` accepts connections under the connection bounds (`connlimit`) and serves each over
//! HTTP/1.1 with the head's part of the request deadline (`kairos_telemetry::http`).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode, Uri};
use axum::response::Response;
use axum::routing::{get, on, post, MethodFilter, MethodRouter};
use axum::Router;
use tonic::Status;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::set_header::SetResponseHeaderLayer;

use super::routes::{Route, ROUTES};
use super::{assets, error, json_bytes, too_large, Gateway, LOGIN_BYTES_MAX};
use crate::connlimit::ConnLimit;

/// The gateway's routes, bounds and headers.
pub fn router(gateway: Arc<Gateway>) -> Router {
    let body_max = gateway.body_max;
    let mut by_path: BTreeMap<String, MethodRouter<Arc<Gateway>>> = BTreeMap::new();
    for route in ROUTES {
        let at = by_path.remove(&route.axum_path()).unwrap_or_default();
        let at = match route.method {
            // A GET route is not a HEAD one (axum would answer HEAD with it).
            "GET" => at.merge(call(route, MethodFilter::GET)).on(MethodFilter::HEAD, not_allowed),
            "POST" => at.merge(call(route, MethodFilter::POST)),
            "PUT" => at.merge(call(route, MethodFilter::PUT)),
            _ => at.merge(call(route, MethodFilter::DELETE)),
        };
        by_path.insert(route.axum_path(), at);
    }
    let api = by_path.into_iter().fold(Router::new(), |api, (path, at)| api.route(&path, at));
    let login = Router::new().route("/ui/login", post(login));
    Router::new()
        .merge(bounded(api, body_max))
        .merge(bounded(login, LOGIN_BYTES_MAX))
        .route("/api/v1/openapi.json", get(openapi))
        .route("/ui/logout", post(|| async { super::logout() }))
        .merge(assets::router())
        .merge(super::ports::router())
        .fallback(not_found)
        .method_not_allowed_fallback(not_allowed)
        .layer(SetResponseHeaderLayer::overriding(
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ))
        .layer(SetResponseHeaderLayer::overriding(
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        ))
        .layer(SetResponseHeaderLayer::if_not_present(
            header::CACHE_CONTROL,
            HeaderValue::from_static("no-store"),
        ))
        .with_state(gateway)
}

/// `routes` with bodies bounded to `max` bytes: a larger declared length is answered 413 (a
/// JSON error) before the handler runs; a longer chunked body fails its read.
fn bounded(routes: Router<Arc<Gateway>>, max: usize) -> Router<Arc<Gateway>> {
    routes.layer(RequestBodyLimitLayer::new(max)).layer(axum::middleware::map_response(
        move |answer: Response| async move {
            let json = answer
                .headers()
                .get(header::CONTENT_TYPE)
                .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
            match answer.status() {
                StatusCode::PAYLOAD_TOO_LARGE if !json => error(too_large(max)),
                _ => answer,
            }
        },
    ))
}

/// A route's path parameters, as axum decodes them (or why not).
type PathParams = Result<Path<Vec<(String, String)>>, PathRejection>;
/// A route's query parameters, as axum decodes them (or why not).
type QueryParams = Result<Query<Vec<(String, String)>>, QueryRejection>;

/// `route` at its method.
fn call(route: &'static Route, filter: MethodFilter) -> MethodRouter<Arc<Gateway>> {
    on(filter, move |gateway: State<Arc<Gateway>>, path: PathParams, query: QueryParams, req: Request| {
        handle(route, gateway, path, query, req)
    })
}

/// One call of `route`: its path's and query's parameters, then the call.
async fn handle(
    route: &'static Route,
    State(gateway): State<Arc<Gateway>>,
    path: PathParams,
    query: QueryParams,
    req: Request,
) -> Response {
    let path = match path {
        // The values in order, set on the fields the route's path names.
        Ok(Path(p)) => route.path_fields().map(str::to_string).zip(p.into_iter().map(|(_, v)| v)).collect(),
        Err(e) => return error(Status::invalid_argument(format!("the path: {}", e.body_text()))),
    };
    let query = match query {
        Ok(Query(q)) => q,
        Err(e) => return error(Status::invalid_argument(format!("the query: {}", e.body_text()))),
    };
    gateway.route(route, path, query, req).await.unwrap_or_else(error)
}

async fn openapi(State(gateway): State<Arc<Gateway>>) -> Response {
    super::bytes(StatusCode::OK, "application/json", gateway.openapi.clone())
}

async fn login(State(gateway): State<Arc<Gateway>>, req: Request) -> Response {
    gateway.login(req).await.unwrap_or_else(error)
}

/// A JSON error of the API.
fn api_error(status: StatusCode, code: &str, message: String) -> Response {
    let body = serde_json::json!({"error": {"code": code, "message": message}});
    super::bytes(status, "application/json", json_bytes(&body))
}

/// No route has the path: 404 under `/api/`; elsewhere a page, 404 or, for a method other
/// than GET, 405.
async fn not_found(method: Method, uri: Uri) -> Response {
    let path = uri.path();
    match method {
        _ if path.starts_with("/api/") => {
            api_error(StatusCode::NOT_FOUND, "NOT_FOUND", format!("{method} has no API route at {path}"))
        }
        Method::GET | Method::HEAD => assets::refusal(StatusCode::NOT_FOUND),
        _ => assets::refusal(StatusCode::METHOD_NOT_ALLOWED),
    }
}

/// The path has routes, none of this method: 405 (a GET off the API: 404, no such page).
async fn not_allowed(method: Method, uri: Uri) -> Response {
    let path = uri.path();
    match method {
        _ if path.starts_with("/api/") => {
            let message = format!("{method} is not allowed on {path}");
            api_error(StatusCode::METHOD_NOT_ALLOWED, "METHOD_NOT_ALLOWED", message)
        }
        Method::GET | Method::HEAD => assets::refusal(StatusCode::NOT_FOUND),
        _ => assets::refusal(StatusCode::METHOD_NOT_ALLOWED),
    }
}

/// Serves the gateway on `listener` until the task is dropped: connections bounded per address
/// and in all (`limit`), each given the head's part of the request deadline to send a head.
pub async fn serve(listener: tokio::net::TcpListener, gateway: Arc<Gateway>, limit: ConnLimit) {
    let settings = kairos_telemetry::http::Http1 {
        head_timeout: gateway.head_timeout,
        head_bytes_max: None,
        keep_alive: true,
    };
    let app = router(gateway);
    loop {
        let (stream, addr) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "http: accepting a connection failed");
                tokio::time::sleep(crate::connlimit::ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let Some(slot) = limit.slot(addr.ip()) else {
            tracing::warn!(%addr, "http: connection refused: too many open connections");
            continue;
        };
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "http: TCP_NODELAY");
        }
        let served = kairos_telemetry::http::serve_connection(stream, app.clone(), settings, || {});
        tokio::spawn(async move {
            let _slot = slot;
            if let Err(e) = served.await {
                tracing::debug!(error = %e, "http connection ended");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use axum::body::Body;
    use http_body_util::BodyExt;
    use kairos_consensus::auth::ClusterKey;
    use tower::ServiceExt;

    use super::*;
    use crate::gateway::{session, Options};

    /// A gateway whose gRPC port is closed; the token "good" is alice's, any other refused.
    fn app() -> (Router, ClusterKey) {
        let key = ClusterKey::new(&"s".repeat(32));
        let check: crate::gateway::TokenCheck = Arc::new(|token: &str| match token {
            "good" => Ok("alice".to_string()),
            _ => Err(Status::unauthenticated("no such token")),
        });
        let gateway = Gateway::new(Options {
            grpc_url: "http://127.0.0.1:1".into(),
            tls: None,
            key: key.clone(),
            body_max: 1024,
            check,
            request_timeout: Duration::from_secs(30),
        })
        .unwrap();
        (router(Arc::new(gateway)), key)
    }

    async fn ask(app: &Router, req: http::Request<Body>) -> (StatusCode, http::HeaderMap, String) {
        let answer = app.clone().oneshot(req).await.unwrap();
        let (parts, body) = answer.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        (parts.status, parts.headers, String::from_utf8_lossy(&body).to_string())
    }

    fn req(method: &str, uri: &str, headers: &[(&str, &str)], body: Body) -> http::Request<Body> {
        let mut r = http::Request::builder().method(method).uri(uri);
        for (k, v) in headers {
            r = r.header(*k, *v);
        }
        r.body(body).unwrap()
    }

    fn code(body: &str) -> String {
        let json: serde_json::Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
        json["error"]["code"].as_str().unwrap_or("").to_string()
    }

    #[tokio::test]
    async fn paths_and_methods_find_their_route_or_a_json_404_or_405() {
        let (app, _) = app();
        for (method, uri, status, want) in [
            ("PATCH", "/api/v1/jobs/42", 405, "METHOD_NOT_ALLOWED"),
            ("HEAD", "/api/v1/jobs", 405, "METHOD_NOT_ALLOWED"),
            ("GET", "/api/v1/jobs/42/nothing", 404, "NOT_FOUND"),
            ("GET", "/api/v1/jobs/", 404, "NOT_FOUND"),
            ("POST", "/api/v1/nothing", 404, "NOT_FOUND"),
            ("GET", "/api/v1/jobs/42", 401, "UNAUTHENTICATED"),
            ("DELETE", "/api/v1/qos/urgent", 401, "UNAUTHENTICATED"),
        ] {
            let (got, headers, body) = ask(&app, req(method, uri, &[], Body::empty())).await;
            assert_eq!(got.as_u16(), status, "{method} {uri}: {body}");
            if method != "HEAD" {
                // (A HEAD answer has no body.)
                assert_eq!(code(&body), want, "{method} {uri}");
            }
            assert_eq!(headers[header::CONTENT_TYPE], "application/json");
            assert_eq!(headers[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
            assert_eq!(headers[header::CACHE_CONTROL], "no-store");
        }
        // Off the API: small pages.
        for (method, uri, status) in
            [("GET", "/nope", 404), ("POST", "/nope", 405), ("POST", "/", 405), ("GET", "/ui/login", 404)]
        {
            let (got, headers, _) = ask(&app, req(method, uri, &[], Body::empty())).await;
            assert_eq!(got.as_u16(), status, "{method} {uri}");
            assert_eq!(headers[header::CONTENT_TYPE], "text/html; charset=utf-8", "{method} {uri}");
        }
        let (got, headers, _) = ask(&app, req("GET", "/app.js", &[], Body::empty())).await;
        assert_eq!(got, StatusCode::OK);
        assert!(headers.contains_key(header::CONTENT_SECURITY_POLICY));
        assert_eq!(headers[header::REFERRER_POLICY], "no-referrer");
        let (got, _, doc) = ask(&app, req("GET", "/api/v1/openapi.json", &[], Body::empty())).await;
        assert_eq!(got, StatusCode::OK);
        assert!(doc.contains("/api/v1/jobs/{job_id}/cancel"));
    }

    #[tokio::test]
    async fn parameters_come_from_the_path_and_the_query_once_each() {
        let (app, _) = app();
        let bearer = [("authorization", "Bearer good")];
        // A path parameter (decoded, dotted for a nested field) is not given again in the query.
        let put = req("PUT", "/api/v1/qos/a%20b?qos.name=x", &bearer, Body::from("{}"));
        let (got, _, body) = ask(&app, put).await;
        assert_eq!(got, StatusCode::BAD_REQUEST, "{body}");
        assert!(body.contains("\\\"qos.name\\\" is given by the path"), "{body}");
        let (got, _, body) = ask(&app, req("GET", "/api/v1/jobs?colour=red", &bearer, Body::empty())).await;
        assert_eq!(got, StatusCode::BAD_REQUEST, "{body}");
        assert!(body.contains("colour"), "{body}");
        // Query values are decoded (`+` is a space) before their field reads them.
        let (got, _, body) = ask(&app, req("GET", "/api/v1/jobs?limit=x+y", &bearer, Body::empty())).await;
        assert_eq!(got, StatusCode::BAD_REQUEST, "{body}");
        assert!(body.contains("\\\"x y\\\" is not a non-negative integer"), "{body}");
    }

    /// A body that records whether anything read it.
    fn watched(read: Arc<AtomicBool>) -> Body {
        let chunks = futures::stream::iter([Ok::<_, std::io::Error>(bytes::Bytes::from_static(b"{}"))]);
        Body::from_stream(futures::StreamExt::inspect(chunks, move |_| read.store(true, Ordering::SeqCst)))
    }

    #[tokio::test]
    async fn a_stranger_is_refused_before_a_byte_of_the_body_is_read_and_bodies_are_bounded() {
        let (app, key) = app();
        for headers in [
            vec![],
            vec![("authorization", "Bearer kairos_bogus")],
            // The session cookie without the page's CSRF value changes nothing.
            vec![("cookie", "kairos_session=good")],
        ] {
            let read = Arc::new(AtomicBool::new(false));
            let (got, _, body) =
                ask(&app, req("POST", "/api/v1/jobs", &headers, watched(read.clone()))).await;
            assert!(matches!(got.as_u16(), 401 | 403), "{headers:?}: {body}");
            assert!(!read.load(Ordering::SeqCst), "{headers:?}: the body was read");
        }
        // A declared length past the bound: 413 before the token is even looked at.
        let big = req("POST", "/api/v1/jobs", &[("content-length", "5000")], Body::from(vec![b' '; 5000]));
        let (got, _, body) = ask(&app, big).await;
        assert_eq!((got, code(&body).as_str()), (StatusCode::PAYLOAD_TOO_LARGE, "OUT_OF_RANGE"), "{body}");
        // An undeclared one is cut off at the bound as it is read.
        let chunks = futures::stream::iter((0..5).map(|_| Ok::<_, std::io::Error>(vec![b' '; 512])));
        let (got, _, body) = ask(
            &app,
            req("POST", "/api/v1/jobs", &[("authorization", "Bearer good")], Body::from_stream(chunks)),
        )
        .await;
        assert_eq!((got, code(&body).as_str()), (StatusCode::PAYLOAD_TOO_LARGE, "OUT_OF_RANGE"), "{body}");
        // The login has its own, smaller bound, and wants JSON.
        let login = req("POST", "/ui/login", &[("content-length", "5000")], Body::from(vec![b' '; 5000]));
        assert_eq!(ask(&app, login).await.0, StatusCode::PAYLOAD_TOO_LARGE);
        let form = req("POST", "/ui/login", &[("content-type", "text/plain")], Body::from("token=x"));
        assert_eq!(ask(&app, form).await.0, StatusCode::BAD_REQUEST);
        // With the CSRF value, the cookie gets as far as the call (this gateway's gRPC port is
        // closed: 503), as does a GET without it.
        let csrf = session::csrf_for(&key, "good");
        let with = [("cookie", "kairos_session=good"), (session::CSRF_HEADER, csrf.as_str())];
        let (got, _, body) = ask(&app, req("POST", "/api/v1/jobs/7/cancel", &with, Body::from("{}"))).await;
        assert_eq!(got, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        let read = [("cookie", "kairos_session=good")];
        let (got, _, body) = ask(&app, req("GET", "/api/v1/jobs/7", &read, Body::empty())).await;
        assert_eq!(got, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    }
}

//! The JSON HTTP API and the web UI, at `kairosd --http-addr`.
//!
//! Each API route (`routes`) is one gRPC method, and the gateway calls it on this replica's own
//! gRPC port with the caller's token: authentication, roles, rate limits, message bounds and
//! the forwarding of leader-only calls are the gRPC services' own, not a second copy. The
//! gateway adds what HTTP needs: the session cookie and its CSRF check (`session`), a bound on
//! the body checked before it is read, JSON errors with the gRPC code's HTTP meaning, the
//! OpenAPI document (`openapi`) and the embedded pages (`assets`).
//!
//! What a stranger can hold is bounded: an API call's token is checked (`TokenCheck`, the
//! services' own check, made from the headers) before a byte of its body is read, so a call
//! without a valid token is answered 401 and its connection closed unread; a request must
//! arrive whole, head and body, within the request deadline (408 and closed past it); streams
//! are shared out among users (`shares`); and connections are bounded per address and in all
//! with the gRPC port's bounds, fitted under the descriptor limit (`connlimit`).

pub mod assets;
pub mod openapi;
pub mod routes;
pub mod session;
pub mod shares;
pub mod transcode;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use kairos_consensus::auth::ClusterKey;
use prost_reflect::DescriptorPool;
use tokio_stream::StreamExt;
use tonic::Status;

use crate::connlimit::ConnLimit;
use routes::{Reply, Route};
use session::Credential;

/// A response body: whole, or streamed from a gRPC server stream.
pub type Body = http_body_util::combinators::UnsyncBoxBody<Bytes, Status>;

/// The longest a client may take to send a request's head (at most half the request deadline).
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client may take to send a whole request, head and body (`--http-request-timeout`).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the check of a token this replica cannot settle itself (asked of the leader) may take.
const AUTH_TIMEOUT: Duration = Duration::from_secs(5);
/// Streams (events, followed logs) open at once through this gateway; more are refused with 429.
pub const STREAMS_MAX: usize = 512;
/// Streams one user may hold open through this gateway: an eighth, so that one user cannot
/// shut the others out.
pub const STREAMS_PER_USER: usize = STREAMS_MAX / 8;
/// The largest answer taken from the gRPC services.
const ANSWER_BYTES_MAX: usize = 64 * 1024 * 1024;
/// The largest login body.
const LOGIN_BYTES_MAX: usize = 4096;

/// The user a token names, checked from the token alone the way the services check it
/// (`Ctx::principal`): `UNAUTHENTICATED` for a token no replica accepts, `UNAVAILABLE` when
/// only the leader can settle it (the gateway then asks the leader, through `WhoAmI`).
pub type TokenCheck = Arc<dyn Fn(&str) -> Result<String, Status> + Send + Sync>;

/// What the gateway needs to start.
pub struct Options {
    /// This replica's gRPC address, as the gateway dials it (`http://127.0.0.1:7001`).
    pub grpc_url: String,
    pub tls: Option<tonic::transport::ClientTlsConfig>,
    /// The cluster key (CSRF values).
    pub key: ClusterKey,
    /// The largest request body, refused with 413 before it is read.
    pub body_max: usize,
    /// Who a token is, checked before a body is read.
    pub check: TokenCheck,
    /// The deadline for a whole request, head and body.
    pub request_timeout: Duration,
}

/// The gateway's state, shared by every connection.
pub struct Gateway {
    pool: DescriptorPool,
    channel: tonic::transport::Channel,
    key: ClusterKey,
    body_max: usize,
    check: TokenCheck,
    /// The request deadline, as the time for the head and then the time for the body.
    head_timeout: Duration,
    body_timeout: Duration,
    streams: shares::StreamShares,
    openapi: Bytes,
}

impl Gateway {
    pub fn new(options: Options) -> anyhow::Result<Gateway> {
        let pool = transcode::pool()?;
        let head_timeout = HEAD_TIMEOUT.min(options.request_timeout / 2);
        let mut endpoint = tonic::transport::Endpoint::from_shared(options.grpc_url.clone())?
            .connect_timeout(Duration::from_secs(5));
        if let Some(tls) = options.tls {
            endpoint = endpoint.tls_config(tls)?;
        }
        let openapi = serde_json::to_vec_pretty(&openapi::document(&pool)?)?.into();
        Ok(Gateway {
            pool,
            channel: endpoint.connect_lazy(),
            key: options.key,
            body_max: options.body_max,
            check: options.check,
            head_timeout,
            body_timeout: options.request_timeout.saturating_sub(head_timeout),
            streams: shares::StreamShares::new(STREAMS_MAX, STREAMS_PER_USER),
            openapi,
        })
    }

    /// The user `token` names, settled before anything of the request's body is read: here when
    /// this replica can, else by the leader (`WhoAmI` through this replica, which passes it on).
    /// The `WhoAmI` route and its method (a login's and an authentication's call).
    fn who_am_i(&self) -> Result<(&'static routes::Route, prost_reflect::MethodDescriptor), Status> {
        let route = routes::ROUTES
            .iter()
            .find(|r| r.rpc.ends_with("/WhoAmI"))
            .ok_or_else(|| Status::internal("no WhoAmI route"))?;
        let method = transcode::method(&self.pool, route.rpc)
            .ok_or_else(|| Status::internal("WhoAmI is not a method"))?;
        Ok((route, method))
    }

    async fn authenticate(&self, token: &str) -> Result<String, Status> {
        match (self.check)(token) {
            Err(s) if s.code() == tonic::Code::Unavailable => {}
            settled => return settled,
        }
        let (route, method) = self.who_am_i()?;
        let request = grpc_request(transcode::request(&method, b"", &[])?, token, &http::HeaderMap::new())?;
        let path: http::uri::PathAndQuery =
            route.rpc.parse().map_err(|_| Status::internal(format!("{} is not a path", route.rpc)))?;
        let mut grpc = tonic::client::Grpc::new(self.channel.clone());
        let asked = async {
            grpc.ready().await.map_err(|e| Status::unavailable(format!("this replica's gRPC port: {e}")))?;
            grpc.unary(request, path, transcode::RawCodec).await
        };
        let answer = tokio::time::timeout(AUTH_TIMEOUT, asked)
            .await
            .map_err(|_| Status::unavailable("no replica settled the token in time; try again"))??
            .into_inner();
        let who = <kairos_proto::v1::WhoAmIResponse as prost::Message>::decode(answer)
            .map_err(|e| Status::internal(format!("decoding WhoAmI: {e}")))?;
        Ok(who.user)
    }

    /// Answers one HTTP request.
    pub async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<Body> {
        let path = req.uri().path().to_string();
        let method = req.method().as_str().to_string();
        let mut answer = match (method.as_str(), path.as_str()) {
            ("GET", "/api/v1/openapi.json") => {
                bytes(StatusCode::OK, "application/json", self.openapi.clone())
            }
            ("POST", "/ui/login") => self.login(req).await.unwrap_or_else(error),
            ("POST", "/ui/logout") => logout(),
            (_, p) if p.starts_with("/api/") => self.api(req).await,
            (m, p) => assets::serve(m, p),
        };
        let h = answer.headers_mut();
        h.insert("x-content-type-options", HeaderValue::from_static("nosniff"));
        h.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
        h.entry(header::CACHE_CONTROL).or_insert(HeaderValue::from_static("no-store"));
        answer
    }

    /// A call of the JSON API: 404 for a path no route has, 405 for a method its route lacks.
    async fn api(&self, req: Request<Incoming>) -> Response<Body> {
        match routes::find(req.method().as_str(), req.uri().path()) {
            Ok((route, params)) => self.route(route, params, req).await.unwrap_or_else(error),
            Err(known) => {
                let (status, code, what) = match known {
                    true => (StatusCode::METHOD_NOT_ALLOWED, "METHOD_NOT_ALLOWED", "is not allowed on"),
                    false => (StatusCode::NOT_FOUND, "NOT_FOUND", "has no API route at"),
                };
                let message = format!("{} {what} {}", req.method(), req.uri().path());
                let body = serde_json::json!({"error": {"code": code, "message": message}});
                bytes(status, "application/json", json_bytes(&body))
            }
        }
    }

    /// A call of `route`.
    async fn route(
        &self,
        route: &'static Route,
        path_params: routes::PathParams,
        req: Request<Incoming>,
    ) -> Result<Response<Body>, Status> {
        refuse_oversized(&req, self.body_max)?;
        let token = match session::credential(req.headers(), &self.key) {
            Credential::Header(t) => t,
            Credential::Cookie { token, csrf_ok } if csrf_ok || route.method == "GET" => token,
            Credential::Cookie { .. } => {
                return Err(Status::permission_denied(format!(
                    "a change under the session cookie needs the {} header from the page",
                    session::CSRF_HEADER
                )))
            }
            Credential::None => {
                return Err(Status::unauthenticated(
                    "no token: log in, or pass `Authorization: Bearer TOKEN` (`kairos token create`)",
                ))
            }
        };
        let mut params: Vec<(String, String)> =
            path_params.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        let asked = query(req.uri().query().unwrap_or(""))?;
        if let Some((k, _)) = asked.iter().find(|(k, _)| params.iter().any(|(p, _)| p == k)) {
            return Err(Status::invalid_argument(format!("\"{k}\" is given by the path, not the query")));
        }
        params.extend(asked);
        // Who the token is, before a byte of the body is read: a stranger's body is never read.
        let user = self.authenticate(&token).await?;
        let slot = match route.reply {
            Reply::Json => None,
            Reply::Events | Reply::Text => Some(self.streams.take(&user)?),
        };
        let headers = req.headers().clone();
        let body = match route.body {
            true => match read_body(req.into_body(), self.body_max, self.body_timeout).await {
                Ok(body) => body,
                Err(BodyError::Late) => return Ok(request_timeout(self.head_timeout + self.body_timeout)),
                Err(BodyError::Refused(s)) => return Err(s),
            },
            false => Bytes::new(),
        };
        let method = transcode::method(&self.pool, route.rpc)
            .ok_or_else(|| Status::internal(format!("{} is not a method", route.rpc)))?;
        let message = transcode::request(&method, &body, &params)?;
        let request = grpc_request(message, &token, &headers)?;
        self.call(route, &method, request, slot).await
    }

    /// Calls `route`'s method on this replica and turns the answer into HTTP.
    async fn call(
        &self,
        route: &Route,
        method: &prost_reflect::MethodDescriptor,
        request: tonic::Request<Bytes>,
        slot: Option<shares::StreamSlot>,
    ) -> Result<Response<Body>, Status> {
        let path: http::uri::PathAndQuery =
            route.rpc.parse().map_err(|_| Status::internal(format!("{} is not a path", route.rpc)))?;
        let mut grpc =
            tonic::client::Grpc::new(self.channel.clone()).max_decoding_message_size(ANSWER_BYTES_MAX);
        grpc.ready().await.map_err(|e| Status::unavailable(format!("this replica's gRPC port: {e}")))?;
        if route.reply == Reply::Json {
            let answer = grpc.unary(request, path, transcode::RawCodec).await?.into_inner();
            let json = transcode::response(method, answer)?;
            return Ok(bytes(StatusCode::OK, "application/json", json_bytes(&json)));
        }
        let permit = slot.ok_or_else(|| Status::internal("a stream without its slot"))?;
        let stream = grpc.server_streaming(request, path, transcode::RawCodec).await?.into_inner();
        let method = method.clone();
        let (kind, frames): (&str, Body) = match route.reply {
            Reply::Events => {
                let frames = stream.map(move |m| {
                    let _held = &permit;
                    let json = transcode::response(&method, m?)?;
                    Ok(Frame::data(Bytes::from(format!(
                        "data: {}\n\n",
                        String::from_utf8_lossy(&json_bytes(&json))
                    ))))
                });
                ("text/event-stream", BodyExt::boxed_unsync(StreamBody::new(frames)))
            }
            _ => {
                let frames = stream.map(move |m| {
                    let _held = &permit;
                    let chunk = <kairos_proto::v1::LogChunk as prost::Message>::decode(m?)
                        .map_err(|e| Status::internal(format!("decoding a log chunk: {e}")))?;
                    Ok(Frame::data(Bytes::from(chunk.data)))
                });
                ("text/plain; charset=utf-8", BodyExt::boxed_unsync(StreamBody::new(frames)))
            }
        };
        let mut answer = Response::new(frames);
        answer.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
        answer.headers_mut().insert("x-accel-buffering", HeaderValue::from_static("no"));
        Ok(answer)
    }

    /// `POST /ui/login` with `{"token": "…"}`: checks the token (it must name a user) and sets
    /// the session and CSRF cookies; answers who it is.
    async fn login(&self, req: Request<Incoming>) -> Result<Response<Body>, Status> {
        // A cross-site form cannot send JSON without the browser asking first.
        let json = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/json"));
        if !json {
            return Err(Status::invalid_argument("log in with a JSON body: {\"token\": \"…\"}"));
        }
        refuse_oversized(&req, LOGIN_BYTES_MAX)?;
        let body = match read_body(req.into_body(), LOGIN_BYTES_MAX, self.body_timeout).await {
            Ok(body) => body,
            Err(BodyError::Late) => return Ok(request_timeout(self.head_timeout + self.body_timeout)),
            Err(BodyError::Refused(s)) => return Err(s),
        };
        let token = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v.get("token").and_then(|t| t.as_str()).map(|t| t.trim().to_string()))
            .filter(|t| session::cookie_safe(t))
            .ok_or_else(|| Status::invalid_argument("log in with a JSON body: {\"token\": \"…\"}"))?;
        let (route, method) = self.who_am_i()?;
        let request = grpc_request(transcode::request(&method, b"", &[])?, &token, &http::HeaderMap::new())?;
        let mut answer = self.call(route, &method, request, None).await?;
        for c in session::login_cookies(&self.key, &token) {
            let v = HeaderValue::from_str(&c)
                .map_err(|_| Status::invalid_argument("token not usable in a cookie"))?;
            answer.headers_mut().append(header::SET_COOKIE, v);
        }
        Ok(answer)
    }
}

/// `POST /ui/logout`: both cookies expire.
fn logout() -> Response<Body> {
    let mut answer = bytes(StatusCode::OK, "application/json", Bytes::from_static(b"{}"));
    for c in session::logout_cookies() {
        if let Ok(v) = HeaderValue::from_str(&c) {
            answer.headers_mut().append(header::SET_COOKIE, v);
        }
    }
    answer
}

/// 413 from the declared length alone, before any of the body is read.
fn refuse_oversized(req: &Request<Incoming>, max: usize) -> Result<(), Status> {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    match declared {
        Some(n) if n > max as u64 => Err(too_large(max)),
        _ => Ok(()),
    }
}

fn too_large(max: usize) -> Status {
    Status::out_of_range(format!("the body is larger than {max} bytes"))
}

/// Why a body was not read.
enum BodyError {
    /// It did not arrive within the request deadline.
    Late,
    Refused(Status),
}

/// The body, at most `max` bytes (a chunked body is cut off there: 413), read within `within`.
async fn read_body<B>(body: B, max: usize, within: Duration) -> Result<Bytes, BodyError>
where
    B: hyper::body::Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    match tokio::time::timeout(within, Limited::new(body, max).collect()).await {
        Err(_) => Err(BodyError::Late),
        Ok(Ok(b)) => Ok(b.to_bytes()),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(BodyError::Refused(too_large(max))),
        Ok(Err(e)) => Err(BodyError::Refused(Status::invalid_argument(format!("reading the body: {e}")))),
    }
}

/// 408: the request did not arrive whole within the deadline; the connection is closed.
fn request_timeout(deadline: Duration) -> Response<Body> {
    let message = format!("the request did not arrive whole within {deadline:?}");
    let body = serde_json::json!({"error": {"code": "REQUEST_TIMEOUT", "message": message}});
    let mut answer = bytes(StatusCode::REQUEST_TIMEOUT, "application/json", json_bytes(&body));
    answer.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    answer
}

/// The query's `name=value` pairs, decoded (`+` is a space).
fn query(q: &str) -> Result<Vec<(String, String)>, Status> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let dec = |s: &str| routes::percent_decode(&s.replace('+', " "));
            match (dec(k), dec(v)) {
                (Some(k), Some(v)) => Ok((k, v)),
                _ => Err(Status::invalid_argument(format!("the query has a malformed pair \"{pair}\""))),
            }
        })
        .collect()
}

/// The gRPC request carrying `message` with the caller's token and the headers the services
/// read (acting as another user, the trace).
fn grpc_request(
    message: Bytes,
    token: &str,
    headers: &http::HeaderMap,
) -> Result<tonic::Request<Bytes>, Status> {
    let mut request = tonic::Request::new(message);
    let md = request.metadata_mut();
    let bearer = format!("Bearer {token}")
        .parse()
        .map_err(|_| Status::unauthenticated("the token has characters no header can carry"))?;
    md.insert(kairos_proto::wire::AUTH_HEADER, bearer);
    for name in [crate::auth::ACT_AS_HEADER, "traceparent"] {
        if let Some(v) = headers.get(name).and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok()) {
            md.insert(name, v);
        }
    }
    Ok(request)
}

fn json_bytes(v: &serde_json::Value) -> Bytes {
    serde_json::to_vec(v).unwrap_or_default().into()
}

/// A whole body.
pub fn bytes(status: StatusCode, kind: &'static str, body: Bytes) -> Response<Body> {
    let mut r =
        Response::new(BodyExt::boxed_unsync(Full::new(body).map_err(|never: Infallible| match never {})));
    *r.status_mut() = status;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
    r
}

/// The HTTP status that carries a gRPC code's meaning.
pub fn http_status(code: tonic::Code) -> StatusCode {
    use tonic::Code::*;
    match code {
        Ok => StatusCode::OK,
        InvalidArgument | FailedPrecondition => StatusCode::BAD_REQUEST,
        OutOfRange => StatusCode::PAYLOAD_TOO_LARGE,
        Unauthenticated => StatusCode::UNAUTHORIZED,
        PermissionDenied => StatusCode::FORBIDDEN,
        NotFound => StatusCode::NOT_FOUND,
        AlreadyExists | Aborted => StatusCode::CONFLICT,
        ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Cancelled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
        Unknown | Internal | DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// `{"error": {"code": "PERMISSION_DENIED", "message": "…"}}` with the code's HTTP status.
pub fn error(status: Status) -> Response<Body> {
    let code = format!("{:?}", status.code());
    let body = serde_json::json!({"error": {"code": screaming(&code), "message": status.message()}});
    bytes(http_status(status.code()), "application/json", json_bytes(&body))
}

/// `PermissionDenied` → `PERMISSION_DENIED`.
fn screaming(s: &str) -> String {
    transcode::enum_prefix(s).trim_end_matches('_').to_string()
}

/// Serves HTTP/1.1 on `listener` until the task is dropped: connections bounded per address
/// and in all (`limit`), each given the head's part of the request deadline to send a head.
pub async fn serve(listener: tokio::net::TcpListener, gateway: Arc<Gateway>, limit: ConnLimit) {
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
        let _ = stream.set_nodelay(true);
        let gateway = gateway.clone();
        let head_timeout = gateway.head_timeout;
        tokio::spawn(async move {
            let _slot = slot;
            let service = hyper::service::service_fn(move |req| {
                let gateway = gateway.clone();
                async move { Ok::<_, Infallible>(gateway.handle(req).await) }
            });
            let served = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(head_timeout)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
            if let Err(e) = served {
                tracing::debug!(error = %e, "http connection ended");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_codes_keep_their_meaning_over_http() {
        assert_eq!(http_status(tonic::Code::Unauthenticated), StatusCode::UNAUTHORIZED);
        assert_eq!(http_status(tonic::Code::PermissionDenied), StatusCode::FORBIDDEN);
        assert_eq!(http_status(tonic::Code::ResourceExhausted), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(screaming("PermissionDenied"), "PERMISSION_DENIED");
        assert_eq!(
            query("a=1&b=x%20y+z&c").unwrap(),
            [("a", "1"), ("b", "x y z"), ("c", "")].map(|(k, v)| (k.to_string(), v.to_string()))
        );
        assert!(query("a=%zz").is_err());
    }

    #[tokio::test]
    async fn a_body_is_read_within_its_deadline_and_its_bound_or_not_at_all() {
        let frame = |b: &'static [u8]| Ok::<_, Infallible>(Frame::data(Bytes::from_static(b)));
        // A trickle that never ends is given up at the deadline.
        let trickle = StreamBody::new(futures::StreamExt::chain(
            futures::stream::iter([frame(b"{")]),
            futures::stream::pending(),
        ));
        let started = std::time::Instant::now();
        let late = read_body(trickle, 1024, Duration::from_millis(200)).await;
        assert!(matches!(late, Err(BodyError::Late)));
        assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
        // Past the bound: 413; within both: the bytes.
        let big = StreamBody::new(futures::stream::iter([frame(b"0123456789")]));
        match read_body(big, 4, Duration::from_secs(5)).await {
            Err(BodyError::Refused(s)) => assert_eq!(http_status(s.code()), StatusCode::PAYLOAD_TOO_LARGE),
            _ => panic!("a body past its bound was read"),
        }
        let fine = StreamBody::new(futures::stream::iter([frame(b"{}")]));
        assert!(matches!(read_body(fine, 4, Duration::from_secs(5)).await, Ok(b) if b == "{}"));
        let answer = request_timeout(Duration::from_secs(30));
        assert_eq!(answer.status(), StatusCode::REQUEST_TIMEOUT);
        assert_eq!(answer.headers()[header::CONNECTION], "close");
    }
}

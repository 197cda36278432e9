//! The JSON HTTP API and the web UI, at `kairosd --http-addr`.
//!
//! Each API route (`routes`) is one gRPC method, and the gateway calls it on this replica's own
//! gRPC port with the caller's token: authentication, roles, rate limits, message bounds and
//! the forwarding of leader-only calls are the gRPC services' own, not a second copy. The
//! gateway adds what HTTP needs: the session cookie and its CSRF check (`session`), a bound on
//! the body checked before it is read, JSON errors with the gRPC code's HTTP meaning, the
//! OpenAPI document (`openapi`) and the embedded pages (`assets`). It is an axum router
//! (`app`: the route table as routes, bounds and headers as tower layers) served over HTTP/1.1
//! by the daemons' one HTTP stack (`kairos_telemetry::http`).
//!
//! What a stranger can hold is bounded: an API call's token is checked (`TokenCheck`, the
//! services' own check, made from the headers) before a byte of its body is read, so a call
//! without a valid token is answered 401 and its connection closed unread; a request must
//! arrive whole, head and body, within the request deadline (408 and closed past it); streams
//! are shared out among users (`shares`); and connections are bounded per address and in all
//! with the gRPC port's bounds, fitted under the descriptor limit (`connlimit`).

pub mod app;
pub mod assets;
pub mod openapi;
pub mod ports;
pub mod routes;
pub mod session;
pub mod shares;
pub mod transcode;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use bytes::Bytes;
use http::{header, HeaderValue, StatusCode};
use http_body_util::{BodyExt, Limited};
use kairos_consensus::auth::ClusterKey;
use prost_reflect::DescriptorPool;
use tokio_stream::StreamExt;
use tonic::Status;

use routes::{Reply, Route};
use session::Credential;

pub use app::serve;

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

    /// A call of `route` with the path's parameters and the query's (`path`, `query`), the
    /// body bounded by the layers before it (`app`).
    async fn route(
        &self,
        route: &'static Route,
        path: Vec<(String, String)>,
        query: Vec<(String, String)>,
        req: Request,
    ) -> Result<Response, Status> {
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
        let mut params = path;
        if let Some((k, _)) = query.iter().find(|(k, _)| params.iter().any(|(p, _)| p == k)) {
            return Err(Status::invalid_argument(format!("\"{k}\" is given by the path, not the query")));
        }
        params.extend(query);
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
    ) -> Result<Response, Status> {
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
        let (kind, frames) = match route.reply {
            Reply::Events => {
                let frames = stream.map(move |m| {
                    let _held = &permit;
                    let json = transcode::response(&method, m?)?;
                    Ok::<_, Status>(Bytes::from(format!(
                        "data: {}\n\n",
                        String::from_utf8_lossy(&json_bytes(&json))
                    )))
                });
                ("text/event-stream", Body::from_stream(frames))
            }
            _ => {
                let frames = stream.map(move |m| {
                    let _held = &permit;
                    let chunk = <kairos_proto::v1::LogChunk as prost::Message>::decode(m?)
                        .map_err(|e| Status::internal(format!("decoding a log chunk: {e}")))?;
                    Ok::<_, Status>(Bytes::from(chunk.data))
                });
                ("text/plain; charset=utf-8", Body::from_stream(frames))
            }
        };
        let mut answer = Response::new(frames);
        answer.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
        answer.headers_mut().insert("x-accel-buffering", HeaderValue::from_static("no"));
        Ok(answer)
    }

    /// `POST /ui/login` with `{"token": "…"}`: checks the token (it must name a user) and sets
    /// the session and CSRF cookies; answers who it is.
    async fn login(&self, req: Request) -> Result<Response, Status> {
        // A cross-site form cannot send JSON without the browser asking first.
        let json = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/json"));
        if !json {
            return Err(Status::invalid_argument("log in with a JSON body: {\"token\": \"…\"}"));
        }
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
fn logout() -> Response {
    let mut answer = bytes(StatusCode::OK, "application/json", Bytes::from_static(b"{}"));
    for c in session::logout_cookies() {
        if let Ok(v) = HeaderValue::from_str(&c) {
            answer.headers_mut().append(header::SET_COOKIE, v);
        }
    }
    answer
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
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    match tokio::time::timeout(within, Limited::new(body, max).collect()).await {
        Err(_) => Err(BodyError::Late),
        Ok(Ok(b)) => Ok(b.to_bytes()),
        Ok(Err(e)) if past_bound(&*e) => Err(BodyError::Refused(too_large(max))),
        Ok(Err(e)) => Err(BodyError::Refused(Status::invalid_argument(format!("reading the body: {e}")))),
    }
}

/// Whether `e`, or an error it wraps (the bound layer's, under axum's), is a body past its bound.
fn past_bound(e: &(dyn std::error::Error + 'static)) -> bool {
    std::iter::successors(Some(e), |e| e.source()).any(|e| e.is::<http_body_util::LengthLimitError>())
}

/// 408: the request did not arrive whole within the deadline; the connection is closed.
fn request_timeout(deadline: Duration) -> Response {
    let message = format!("the request did not arrive whole within {deadline:?}");
    let body = serde_json::json!({"error": {"code": "REQUEST_TIMEOUT", "message": message}});
    let mut answer = bytes(StatusCode::REQUEST_TIMEOUT, "application/json", json_bytes(&body));
    answer.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    answer
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
pub fn bytes(status: StatusCode, kind: &'static str, body: Bytes) -> Response {
    let mut r = Response::new(Body::from(body));
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
pub fn error(status: Status) -> Response {
    let code = format!("{:?}", status.code());
    let body = serde_json::json!({"error": {"code": screaming(&code), "message": status.message()}});
    bytes(http_status(status.code()), "application/json", json_bytes(&body))
}

/// `PermissionDenied` → `PERMISSION_DENIED`.
fn screaming(s: &str) -> String {
    transcode::enum_prefix(s).trim_end_matches('_').to_string()
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
    }

    #[tokio::test]
    async fn a_body_is_read_within_its_deadline_and_its_bound_or_not_at_all() {
        use http_body::Frame;
        use http_body_util::StreamBody;
        let frame = |b: &'static [u8]| Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from_static(b)));
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

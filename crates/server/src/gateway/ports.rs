//! The web UI's way into a job's web server: `/jobs/{id}/port/{port}/…` carries an HTTP
//! request to the port the job listens on, through the same `JobService.Session` FORWARD
//! tunnel `kairos port-forward` opens, on this replica's own gRPC port with the caller's token,
//! so the services' checks hold (the owner or an admin; the agent connects only to a port a
//! process of the job listens on).
//!
//! Two spellings: under `/jobs/{id}/port/{port}/` the job's server sees the path without the
//! prefix (`/jobs/7/port/8000/a/b?x` → `/a/b?x`: a plain server, `python -m http.server`);
//! under `/jobs/{id}/absolute/{port}/` it sees the whole path, for a server told its base
//! URL (Jupyter's `--ServerApp.base_url=/jobs/{id}/absolute/{port}/`, TensorBoard's
//! `--path_prefix`). HTTP/1.1 is spoken over the tunnel (hyper's client on an in-memory pipe
//! bridged to the session); hop-by-hop headers and kairos's own credentials (its cookies,
//! `Authorization`, the CSRF header) are not passed on, and the job cannot set kairos's
//! cookies. Bodies are bounded both ways (`BODY_BYTES_MAX`), the whole exchange by
//! `EXCHANGE_TIMEOUT`; each exchange holds one of the caller's stream slots (`shares`).
//! WebSocket upgrades are not carried (the HTTP stack serves no upgrades).

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use axum::routing::any;
use axum::Router;
use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use kairos_proto::v1 as pb;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use super::session::{self, Credential};
use super::{read_body, BodyError, Gateway};

/// The largest request body sent to a job, and the largest answer taken from it.
pub const BODY_BYTES_MAX: usize = 16 << 20;
/// How long one exchange may take, tunnel opened, request sent and answer read.
pub const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(30);
/// The in-memory pipe between hyper and the tunnel, and the most sent in one stdin chunk
/// (the controller takes at most `sessions::STDIN_CHUNK_MAX`).
const PIPE_BYTES: usize = 64 * 1024;
const CHUNK_BYTES: usize = 32 * 1024;
/// Headers that belong to one connection, never passed on (RFC 9110 § 7.6.1), besides those
/// a `Connection` header names.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];
/// kairos's own request headers, never shown to a job.
const KAIROS_HEADERS: &[&str] = &["authorization", session::CSRF_HEADER, crate::auth::ACT_AS_HEADER];

/// Whether the job's server sees the path under the prefix or without it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathMode {
    /// `/jobs/{id}/port/{port}/rest` → `/rest`.
    Strip,
    /// `/jobs/{id}/absolute/{port}/rest` as it is.
    Keep,
}

impl PathMode {
    /// The path segment after the job id.
    fn segment(self) -> &'static str {
        match self {
            PathMode::Strip => "port",
            PathMode::Keep => "absolute",
        }
    }
}

/// Where an exchange goes: the job, the port, and the prefix the browser uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortPath {
    pub job_id: u64,
    pub port: u16,
    pub mode: PathMode,
    /// `/jobs/{id}/{segment}/{port}`, no trailing slash.
    pub prefix: String,
    /// The path the job's server is sent, with the query.
    pub upstream: String,
}

/// The routes: both spellings, each with and without a rest (a prefix without its trailing
/// slash is redirected to it, so relative links resolve under the prefix).
pub fn router() -> Router<Arc<Gateway>> {
    let mut r = Router::new();
    for mode in [PathMode::Strip, PathMode::Keep] {
        let base = format!("/jobs/{{job}}/{}/{{port}}", mode.segment());
        let handler = move |gw: State<Arc<Gateway>>, req: Request| exchange(gw, mode, req);
        r = r
            .route(&base, any(slash))
            .route(&format!("{base}/"), any(handler))
            .route(&format!("{base}/{{*rest}}"), any(handler));
    }
    r
}

/// `/jobs/7/port/8000` → `/jobs/7/port/8000/` (with the query).
async fn slash(req: Request) -> Response {
    let uri = req.uri();
    let to = match uri.query() {
        Some(q) => format!("{}/?{q}", uri.path()),
        None => format!("{}/", uri.path()),
    };
    let mut r = Response::new(Body::empty());
    *r.status_mut() = StatusCode::PERMANENT_REDIRECT;
    if let Ok(v) = HeaderValue::from_str(&to) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r
}

/// The job, port and upstream path of a request's raw (still percent-encoded) path and query.
pub fn parse_path(path: &str, query: Option<&str>, mode: PathMode) -> Option<PortPath> {
    let mut parts = path.strip_prefix("/jobs/")?.splitn(4, '/');
    let job_id: u64 = parts.next()?.parse().ok().filter(|j| *j > 0)?;
    if parts.next()? != mode.segment() {
        return None;
    }
    let port: u16 = parts.next()?.parse().ok().filter(|p| *p > 0)?;
    let rest = parts.next()?;
    let prefix = format!("/jobs/{job_id}/{}/{port}", mode.segment());
    let path = match mode {
        PathMode::Strip => format!("/{rest}"),
        PathMode::Keep => path.to_string(),
    };
    let upstream = match query {
        Some(q) => format!("{path}?{q}"),
        None => path,
    };
    Some(PortPath { job_id, port, mode, prefix, upstream })
}

/// One exchange: who asks, the body, the tunnel, the request, the answer, within the deadline.
async fn exchange(State(gw): State<Arc<Gateway>>, mode: PathMode, req: Request) -> Response {
    let Some(at) = parse_path(req.uri().path(), req.uri().query(), mode) else {
        return page(StatusCode::NOT_FOUND, "404 — no such job port", "");
    };
    let token = match session::credential(req.headers(), &gw.key) {
        Credential::Header(t) => t,
        // The cookie is SameSite=Strict: another site's page cannot send it, so the job's own
        // pages (which cannot know kairos's CSRF value) may change things in the job.
        Credential::Cookie { token, .. } => token,
        Credential::None => return unauthenticated(),
    };
    let user = match gw.authenticate(&token).await {
        Ok(user) => user,
        Err(s) => return refusal(&at, s),
    };
    let _slot = match gw.streams.take(&user) {
        Ok(slot) => slot,
        Err(s) => return refusal(&at, s.into()),
    };
    let (parts, body) = req.into_parts();
    let body = match read_body(body, BODY_BYTES_MAX, gw.body_timeout).await {
        Ok(b) => b,
        Err(BodyError::Late) => {
            return page(StatusCode::REQUEST_TIMEOUT, "408 — the request came too slowly", "")
        }
        Err(BodyError::Refused(s)) => return refusal(&at, s),
    };
    let upstream = match upstream_request(&parts, &at, body) {
        Ok(r) => r,
        Err(s) => return refusal(&at, s),
    };
    match tokio::time::timeout(EXCHANGE_TIMEOUT, send(&gw, &token, &at, upstream)).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(s)) => refusal(&at, s),
        Err(_) => page(
            StatusCode::GATEWAY_TIMEOUT,
            "504 — the job did not answer in time",
            &format!("port {} of job {} took over {EXCHANGE_TIMEOUT:?}", at.port, at.job_id),
        ),
    }
}

/// The tunnel opened, `request` sent over it, the answer read whole (bounded).
async fn send(
    gw: &Gateway,
    token: &str,
    at: &PortPath,
    request: http::Request<Full<Bytes>>,
) -> Result<Response, Status> {
    let pipe = open_tunnel(gw.channel.clone(), token, at).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(pipe))
        .await
        .map_err(|e| Status::unavailable(format!("HTTP over the tunnel: {e}")))?;
    let conn = tokio::spawn(conn);
    let answered = sender.send_request(request).await;
    let answer = match answered {
        Ok(a) => a,
        Err(e) => {
            conn.abort();
            return Err(Status::unavailable(format!("the job's port answered no HTTP: {e}")));
        }
    };
    let (parts, body) = answer.into_parts();
    let body = Limited::new(body, BODY_BYTES_MAX).collect().await;
    conn.abort();
    let body = body
        .map_err(|e| {
            Status::unavailable(format!("reading the job's answer (at most {BODY_BYTES_MAX} bytes): {e}"))
        })?
        .to_bytes();
    Ok(answer_of(parts, body, at))
}

/// Opens a FORWARD session to `at`'s job and port on this replica's gRPC port with `token`,
/// waits for it to open, and gives the pipe whose other end a task carries over it.
async fn open_tunnel(
    channel: tonic::transport::Channel,
    token: &str,
    at: &PortPath,
) -> Result<DuplexStream, Status> {
    let (tx, rx) = tokio::sync::mpsc::channel::<pb::SessionInput>(8);
    let open = pb::SessionOpen {
        job_id: at.job_id,
        kind: pb::SessionKind::Forward as i32,
        port: u32::from(at.port),
        ..Default::default()
    };
    tx.send(pb::SessionInput { input: Some(pb::session_input::Input::Open(open)) })
        .await
        .map_err(|_| Status::internal("the tunnel's input closed before it opened"))?;
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    let bearer = format!("Bearer {token}")
        .parse()
        .map_err(|_| Status::unauthenticated("the token has characters no header can carry"))?;
    request.metadata_mut().insert(kairos_proto::wire::AUTH_HEADER, bearer);
    let mut client = pb::job_service_client::JobServiceClient::new(channel);
    let mut outbound = client.session(request).await?.into_inner();
    match outbound.message().await? {
        Some(pb::SessionOutput { output: Some(pb::session_output::Output::Opened(_)) }) => {}
        Some(pb::SessionOutput { output: Some(pb::session_output::Output::Exit(e)) }) => {
            return Err(Status::unavailable(format!("the tunnel closed as it opened: {}", e.reason)))
        }
        _ => return Err(Status::unavailable("the tunnel did not open")),
    }
    let (ours, theirs) = tokio::io::duplex(PIPE_BYTES);
    tokio::spawn(carry(theirs, tx, outbound));
    Ok(ours)
}

/// Carries bytes between the pipe and the session until either ends: the pipe's reads as
/// numbered stdin chunks (its end as `eof`), the session's output in offset order (a gap
/// ends it: the exchange fails rather than passing on a torn answer).
async fn carry(
    pipe: DuplexStream,
    tx: tokio::sync::mpsc::Sender<pb::SessionInput>,
    mut outbound: tonic::Streaming<pb::SessionOutput>,
) {
    let (mut rd, mut wr) = tokio::io::split(pipe);
    let up = async move {
        let mut seq = 0u64;
        let mut buf = vec![0u8; CHUNK_BYTES];
        loop {
            // The pipe ends only when the exchange is over (hyper never half-closes a
            // connection awaiting an answer): then the tunnel is closed too.
            let n = rd.read(&mut buf).await.unwrap_or(0);
            seq += 1;
            let stdin = pb::SessionStdin { seq, data: buf[..n].to_vec(), eof: n == 0 };
            let sent = tx.send(pb::SessionInput { input: Some(pb::session_input::Input::Stdin(stdin)) });
            if sent.await.is_err() || n == 0 {
                return;
            }
        }
    };
    let down = async move {
        let mut next = 0u64;
        while let Ok(Some(m)) = outbound.message().await {
            match m.output {
                Some(pb::session_output::Output::Data(chunk)) => match fresh(&chunk, next) {
                    Some(bytes) if wr.write_all(bytes).await.is_ok() => {
                        next = chunk.offset + chunk.data.len() as u64;
                    }
                    Some(_) => break,
                    None if chunk.offset > next => break,
                    None => {}
                },
                Some(pb::session_output::Output::Exit(_)) => break,
                _ => {}
            }
        }
        let _ = wr.shutdown().await;
    };
    tokio::select! {
        _ = up => {}
        _ = down => {}
    }
}

/// The part of `chunk` past `next` (None when it holds nothing new, or starts after a gap).
fn fresh(chunk: &pb::SessionOutputChunk, next: u64) -> Option<&[u8]> {
    let end = chunk.offset + chunk.data.len() as u64;
    if chunk.offset > next || end <= next {
        return None;
    }
    let skip = usize::try_from(next - chunk.offset).ok()?;
    chunk.data.get(skip..)
}

/// Headers a `Connection` header names, beside the fixed hop-by-hop ones.
fn named_by_connection(headers: &HeaderMap) -> Vec<String> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|s| s.trim().to_ascii_lowercase())
        .filter(|s| !s.is_empty())
        .collect()
}

/// The `Host` the job's server is sent (the browser's goes as `X-Forwarded-Host`).
fn upstream_host(port: u16) -> String {
    format!("127.0.0.1:{port}")
}

/// The request the job's server gets: the method, the upstream path, the headers less
/// hop-by-hop ones and kairos's credentials (its cookies taken out of `Cookie`), `Host` its
/// own (`upstream_host`), the body.
pub fn upstream_request(
    parts: &http::request::Parts,
    at: &PortPath,
    body: Bytes,
) -> Result<http::Request<Full<Bytes>>, Status> {
    let dropped = named_by_connection(&parts.headers);
    let mut out = http::Request::builder().method(parts.method.clone()).uri(at.upstream.as_str());
    for (name, value) in &parts.headers {
        let n = name.as_str();
        if HOP_BY_HOP.contains(&n) || KAIROS_HEADERS.contains(&n) || dropped.iter().any(|d| d == n) {
            continue;
        }
        match n {
            "cookie" | "content-length" => continue,
            "host" => out = out.header("x-forwarded-host", value),
            _ => out = out.header(name, value),
        }
    }
    // The job's server is reached on its node's loopback, as a server there expects (Jupyter
    // refuses a Host that is not local unless told to allow remote access).
    out = out.header(header::HOST, upstream_host(at.port));
    if let Some(cookies) = foreign_cookies(&parts.headers) {
        out = out.header(header::COOKIE, cookies);
    }
    if at.mode == PathMode::Strip {
        out = out.header("x-forwarded-prefix", at.prefix.as_str());
    }
    out.body(Full::new(body)).map_err(|e| Status::invalid_argument(format!("the request: {e}")))
}

/// The request's cookies other than kairos's, as one `Cookie` value (None when none is left).
fn foreign_cookies(headers: &HeaderMap) -> Option<HeaderValue> {
    let kept: Vec<&str> = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .filter(|c| {
            let name = c.split('=').next().unwrap_or("").trim();
            name != session::SESSION_COOKIE && name != session::CSRF_COOKIE
        })
        .collect();
    match kept.is_empty() {
        true => None,
        false => HeaderValue::from_str(&kept.join("; ")).ok(),
    }
}

/// The job's answer as the browser gets it: its status and body, its headers less hop-by-hop
/// ones and any cookie named as kairos's, a redirect to an absolute path kept under the prefix.
pub fn answer_of(parts: http::response::Parts, body: Bytes, at: &PortPath) -> Response {
    let dropped = named_by_connection(&parts.headers);
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = parts.status;
    for (name, value) in &parts.headers {
        let n = name.as_str();
        if HOP_BY_HOP.contains(&n) || dropped.iter().any(|d| d == n) || n == "content-length" {
            continue;
        }
        // A sandboxed page has no cookies to keep, and a job sets none for the UI's origin (a
        // nameless one a browser would read as kairos's own, say), nor clears its site data.
        if name == header::SET_COOKIE || n == "clear-site-data" {
            continue;
        }
        let value = match name == header::LOCATION {
            true => relocated(value, at).unwrap_or_else(|| value.clone()),
            false => value.clone(),
        };
        r.headers_mut().append(name.clone(), value);
    }
    // The job's pages share the UI's origin: sandboxed into an opaque origin of their own, their
    // scripts can neither read kairos's cookies nor call its API as the person viewing them (an
    // admin opening another user's job, say). A server that needs its own cookies (Jupyter) is
    // for `kairos port-forward`/`kairos notebook`, on the user's own localhost.
    r.headers_mut().append(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(JOB_PAGE_CSP));
    r
}

/// What a job's page may do in the browser: run its scripts, forms, popups and downloads, in
/// an origin of its own.
pub const JOB_PAGE_CSP: &str = "sandbox allow-scripts allow-forms allow-popups allow-downloads";

/// A redirect kept under the prefix: to the `Host` the job was sent (`upstream_host`), as its
/// path; to an absolute path (`/a/`, not `//host/…`) in strip mode, under the prefix. Others
/// (None) go as they are.
fn relocated(location: &HeaderValue, at: &PortPath) -> Option<HeaderValue> {
    let to = location.to_str().ok()?;
    let upstream = format!("http://{}", upstream_host(at.port));
    let (path, own_host) = match to.strip_prefix(upstream.as_str()) {
        Some(p) if p.is_empty() || p.starts_with(['/', '?']) => (p, true),
        _ => (to, false),
    };
    // `http://host` and `http://host?q` are its root.
    let path = match own_host && !path.starts_with('/') {
        true => format!("/{path}"),
        false => path.to_string(),
    };
    if !path.starts_with('/') || path.starts_with("//") {
        return None;
    }
    match at.mode {
        PathMode::Strip => HeaderValue::from_str(&format!("{}{path}", at.prefix)).ok(),
        PathMode::Keep if own_host => HeaderValue::from_str(&path).ok(),
        PathMode::Keep => None,
    }
}

/// No credential: 401, with the way to the login.
fn unauthenticated() -> Response {
    page(
        StatusCode::UNAUTHORIZED,
        "401 — log in first",
        "<a href=\"/#/login\">Log in</a>, then open this page again.",
    )
}

/// A refused or failed exchange as a small page with the code's HTTP status (a job that does
/// not listen on the port, or a tunnel that broke: 502).
fn refusal(at: &PortPath, s: Status) -> Response {
    let status = match s.code() {
        tonic::Code::FailedPrecondition | tonic::Code::Unavailable => StatusCode::BAD_GATEWAY,
        tonic::Code::Unauthenticated => return unauthenticated(),
        code => super::http_status(code),
    };
    let title = match status {
        StatusCode::FORBIDDEN => "403 — not your job".to_string(),
        StatusCode::NOT_FOUND => "404 — no such job".to_string(),
        _ => format!("{} — port {} of job {}", status.as_u16(), at.port, at.job_id),
    };
    page(status, &title, &escape(s.message()))
}

/// A small page: `title` as its heading, `html` below it (already escaped).
fn page(status: StatusCode, title: &str, html: &str) -> Response {
    let body = format!(
        "<!doctype html><html lang=en><meta charset=utf-8><title>kairos</title><h1>{title}</h1><p>{html}</p><p><a href=\"/\">kairos</a></p></html>"
    );
    let mut r = super::bytes(status, "text/html; charset=utf-8", Bytes::from(body));
    let h = r.headers_mut();
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static("default-src 'none'"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    r
}

/// `s` safe as HTML text.
fn escape(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            '<' => "&lt;".to_string(),
            '>' => "&gt;".to_string(),
            '&' => "&amp;".to_string(),
            '"' => "&quot;".to_string(),
            '\'' => "&#39;".to_string(),
            c => c.to_string(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(uri: &str, headers: &[(&str, &str)]) -> http::request::Parts {
        let mut r = http::Request::builder().method("POST").uri(uri);
        for (k, v) in headers {
            r = r.header(*k, *v);
        }
        r.body(()).unwrap().into_parts().0
    }

    #[test]
    fn paths_lose_or_keep_their_prefix_and_keep_their_query_encoded() {
        let at = parse_path("/jobs/7/port/8000/a%20b/c", Some("x=1&y=%2F"), PathMode::Strip).unwrap();
        assert_eq!((at.job_id, at.port), (7, 8000));
        assert_eq!(at.upstream, "/a%20b/c?x=1&y=%2F");
        assert_eq!(at.prefix, "/jobs/7/port/8000");
        assert_eq!(parse_path("/jobs/7/port/8000/", None, PathMode::Strip).unwrap().upstream, "/");
        let keep = parse_path("/jobs/7/absolute/8888/lab/tree", Some("a=b"), PathMode::Keep).unwrap();
        assert_eq!(keep.upstream, "/jobs/7/absolute/8888/lab/tree?a=b");
        // No job 0, port 0 or past 65535, or spelling of the other mode.
        for bad in ["/jobs/0/port/80/", "/jobs/7/port/0/", "/jobs/7/port/70000/", "/jobs/x/port/80/"] {
            assert_eq!(parse_path(bad, None, PathMode::Strip), None, "{bad}");
        }
        assert_eq!(parse_path("/jobs/7/absolute/80/", None, PathMode::Strip), None);
    }

    #[test]
    fn the_job_gets_no_hop_by_hop_header_nor_kairos_credentials() {
        let at = parse_path("/jobs/7/port/8000/api", Some("q=1"), PathMode::Strip).unwrap();
        let p = parts(
            "/jobs/7/port/8000/api?q=1",
            &[
                ("authorization", "Bearer kairos_secret"),
                ("cookie", "kairos_session=kairos_secret; _xsrf=abc"),
                ("cookie", "kairos_csrf=mac;theme=dark"),
                ("x-csrf-token", "mac"),
                ("kairos-user", "bob"),
                ("connection", "keep-alive, x-private"),
                ("x-private", "1"),
                ("te", "trailers"),
                ("content-length", "99"),
                ("host", "kairos.example:8080"),
                ("accept", "text/html"),
            ],
        );
        let r = upstream_request(&p, &at, Bytes::from_static(b"hello")).unwrap();
        assert_eq!(r.uri(), "/api?q=1");
        assert_eq!(r.method(), http::Method::POST);
        let h = r.headers();
        for gone in [
            "authorization",
            "x-csrf-token",
            "kairos-user",
            "connection",
            "x-private",
            "te",
            "content-length",
        ] {
            assert!(!h.contains_key(gone), "{gone} was passed on: {h:?}");
        }
        assert_eq!(h[header::COOKIE], "_xsrf=abc; theme=dark");
        assert!(!format!("{h:?}").contains("kairos_secret"), "{h:?}");
        assert_eq!(h["host"], "127.0.0.1:8000");
        assert_eq!(h["x-forwarded-host"], "kairos.example:8080");
        assert_eq!(h["accept"], "text/html");
        assert_eq!(h["x-forwarded-prefix"], "/jobs/7/port/8000");
        // Only kairos's cookies: no Cookie header at all.
        let p = parts("/jobs/7/port/8000/", &[("cookie", "kairos_session=t; kairos_csrf=m")]);
        assert!(!upstream_request(&p, &at, Bytes::new()).unwrap().headers().contains_key(header::COOKIE));
    }

    #[test]
    fn the_answer_keeps_redirects_under_the_prefix_and_cannot_set_kairos_cookies() {
        let at = parse_path("/jobs/7/port/8000/dir", None, PathMode::Strip).unwrap();
        let answer = http::Response::builder()
            .status(301)
            .header("location", "/dir/")
            .header("set-cookie", "kairos_session=attacker; Path=/")
            .header("set-cookie", " kairos_csrf=x")
            .header("set-cookie", "app=1; Path=/")
            .header("set-cookie", "=kairos_session=attacker; Path=/api")
            .header("clear-site-data", "\"cookies\"")
            .header("connection", "close")
            .header("transfer-encoding", "chunked")
            .header("content-type", "text/html")
            .body(())
            .unwrap()
            .into_parts()
            .0;
        let r = answer_of(answer.clone(), Bytes::from_static(b"moved"), &at);
        assert_eq!(r.status(), StatusCode::MOVED_PERMANENTLY);
        assert_eq!(r.headers()[header::LOCATION], "/jobs/7/port/8000/dir/");
        let cookies: Vec<_> = r.headers().get_all(header::SET_COOKIE).iter().collect();
        assert!(cookies.is_empty(), "{cookies:?}");
        assert!(!r.headers().contains_key("clear-site-data"));
        assert!(
            !r.headers().contains_key(header::CONNECTION) && !r.headers().contains_key("transfer-encoding")
        );
        assert_eq!(r.headers()[header::CONTENT_TYPE], "text/html");
        // The page is sandboxed into an origin of its own, whatever policy the job sends.
        assert_eq!(r.headers()[header::CONTENT_SECURITY_POLICY], JOB_PAGE_CSP);
        // A server that knows its base URL, and redirects elsewhere, are left alone.
        let keep = parse_path("/jobs/7/absolute/8888/", None, PathMode::Keep).unwrap();
        let r = answer_of(answer.clone(), Bytes::new(), &keep);
        assert_eq!(r.headers()[header::LOCATION], "/dir/");
        for other in ["//evil.example/", "https://example.com/x", "http://127.0.0.1:80001/"] {
            assert_eq!(relocated(&HeaderValue::from_static(other), &at), None, "{other}");
        }
        // A redirect to the Host the job was sent is the same server: kept under the prefix.
        for (to, want) in [
            ("http://127.0.0.1:8000/tree?a", "/jobs/7/port/8000/tree?a"),
            ("http://127.0.0.1:8000", "/jobs/7/port/8000/"),
        ] {
            assert_eq!(relocated(&HeaderValue::from_static(to), &at).unwrap(), want, "{to}");
        }
        let keep_at = parse_path("/jobs/7/absolute/8000/", None, PathMode::Keep).unwrap();
        let to = HeaderValue::from_static("http://127.0.0.1:8000/jobs/7/absolute/8000/lab");
        assert_eq!(relocated(&to, &keep_at).unwrap(), "/jobs/7/absolute/8000/lab");
    }

    #[test]
    fn output_is_taken_in_offset_order_once() {
        let chunk =
            |offset: u64, data: &[u8]| pb::SessionOutputChunk { offset, data: data.to_vec(), stderr: false };
        assert_eq!(fresh(&chunk(0, b"abc"), 0), Some(&b"abc"[..]));
        // Replayed bytes already passed on are skipped; a chunk after a gap is refused.
        assert_eq!(fresh(&chunk(1, b"bcd"), 3), Some(&b"d"[..]));
        assert_eq!(fresh(&chunk(0, b"abc"), 3), None);
        assert_eq!(fresh(&chunk(5, b"x"), 3), None);
        assert_eq!(escape("<b a='1'>&"), "&lt;b a=&#39;1&#39;&gt;&amp;");
    }

    #[test]
    fn refusals_are_pages_with_the_codes_meaning() {
        let at = parse_path("/jobs/7/port/8000/", None, PathMode::Strip).unwrap();
        let r = refusal(&at, Status::permission_denied("job 7 is alice's"));
        assert_eq!(r.status(), StatusCode::FORBIDDEN);
        assert_eq!(r.headers()[header::CONTENT_TYPE], "text/html; charset=utf-8");
        assert_eq!(refusal(&at, Status::failed_precondition("no")).status(), StatusCode::BAD_GATEWAY);
        assert_eq!(refusal(&at, Status::unauthenticated("no")).status(), StatusCode::UNAUTHORIZED);
        assert_eq!(refusal(&at, Status::not_found("no")).status(), StatusCode::NOT_FOUND);
    }
}

/// The whole exchange through a stand-in for the gRPC `JobService.Session` (a FORWARD to a
/// local port, its first output chunk sent twice as a resumed stream would) to a real HTTP
/// server.
#[cfg(test)]
mod tunnel_tests {
    use std::task::{Context, Poll};

    use futures::future::BoxFuture;
    use http_body_util::BodyExt;
    use prost::Message;
    use tokio::net::TcpStream;
    use tokio::sync::mpsc;
    use tower::ServiceExt;

    use super::*;
    use crate::gateway::transcode::RawCodec;
    use crate::gateway::Options;

    type Out = mpsc::Sender<Result<Bytes, Status>>;

    /// `JobService.Session` as the controller answers it: "good" (alice) opens job 7's tunnel,
    /// anyone else is refused as a stranger to the job.
    #[derive(Clone)]
    struct FakeJobs;

    impl tonic::server::NamedService for FakeJobs {
        const NAME: &'static str = "kairos.v1.JobService";
    }

    impl tower_service::Service<http::Request<tonic::body::Body>> for FakeJobs {
        type Response = http::Response<tonic::body::Body>;
        type Error = std::convert::Infallible;
        type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
            Box::pin(async move { Ok(tonic::server::Grpc::new(RawCodec).streaming(Sessions, req).await) })
        }
    }

    struct Sessions;

    impl tonic::server::StreamingService<Bytes> for Sessions {
        type Response = Bytes;
        type ResponseStream = ReceiverStream<Result<Bytes, Status>>;
        type Future = BoxFuture<'static, Result<tonic::Response<Self::ResponseStream>, Status>>;

        fn call(&mut self, req: tonic::Request<tonic::Streaming<Bytes>>) -> Self::Future {
            Box::pin(async move {
                let bearer = req.metadata().get("authorization").and_then(|v| v.to_str().ok());
                if bearer != Some("Bearer good") {
                    return Err(Status::permission_denied("job 7 is alice's"));
                }
                let mut inbound = req.into_inner();
                let first = pb::SessionInput::decode(inbound.message().await?.unwrap()).unwrap();
                let Some(pb::session_input::Input::Open(open)) = first.input else { panic!("{first:?}") };
                assert_eq!((open.job_id, open.kind), (7, pb::SessionKind::Forward as i32));
                let tcp = TcpStream::connect(("127.0.0.1", open.port as u16)).await.map_err(|_| {
                    Status::failed_precondition(format!("job 7 does not listen on port {}", open.port))
                })?;
                let (tx, rx) = mpsc::channel(8);
                let opened = pb::session_output::Output::Opened(pb::SessionOpened::default());
                send(&tx, opened).await;
                tokio::spawn(bridge(tcp, inbound, tx));
                Ok(tonic::Response::new(ReceiverStream::new(rx)))
            })
        }
    }

    async fn send(tx: &Out, output: pb::session_output::Output) {
        let _ = tx.send(Ok(pb::SessionOutput { output: Some(output) }.encode_to_vec().into())).await;
    }

    /// The agent's part: stdin to the connection, the connection's bytes as numbered output.
    async fn bridge(tcp: TcpStream, mut inbound: tonic::Streaming<Bytes>, tx: Out) {
        let (mut rd, mut wr) = tcp.into_split();
        tokio::spawn(async move {
            while let Ok(Some(m)) = inbound.message().await {
                if let Some(pb::session_input::Input::Stdin(s)) = pb::SessionInput::decode(m).unwrap().input {
                    wr.write_all(&s.data).await.unwrap();
                }
            }
        });
        let (mut offset, mut buf) = (0u64, vec![0u8; 4096]);
        while let Ok(n @ 1..) = rd.read(&mut buf).await {
            let chunk = pb::SessionOutputChunk { offset, data: buf[..n].to_vec(), stderr: false };
            if offset == 0 {
                // Its first bytes (into the status line), then the whole chunk again from offset
                // 0, as a resumed stream replays: the bytes must be passed on once or the
                // answer is torn.
                let part = pb::SessionOutputChunk { data: buf[..n.min(10)].to_vec(), ..chunk.clone() };
                send(&tx, pb::session_output::Output::Data(part)).await;
            }
            send(&tx, pb::session_output::Output::Data(chunk)).await;
            offset += n as u64;
        }
        send(&tx, pb::session_output::Output::Exit(pb::SessionExit::default())).await;
    }

    /// The job's web server: answers with the path and headers it got.
    async fn job_server() -> u16 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let app = Router::new().fallback(|req: Request| async move {
            let (parts, body) = req.into_parts();
            let body = body.collect().await.unwrap().to_bytes();
            format!("{} {:?} body={}", parts.uri, parts.headers, String::from_utf8_lossy(&body))
        });
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        port
    }

    async fn gateway() -> Router {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        tokio::spawn(tonic::transport::Server::builder().add_service(FakeJobs).serve_with_incoming(incoming));
        let check: crate::gateway::TokenCheck = Arc::new(|token: &str| match token {
            "good" => Ok("alice".to_string()),
            "bob" => Ok("bob".to_string()),
            _ => Err(Status::unauthenticated("no such token")),
        });
        let gateway = Gateway::new(Options {
            grpc_url: format!("http://{addr}"),
            tls: None,
            key: kairos_consensus::auth::ClusterKey::new(&"s".repeat(32)),
            body_max: 1024,
            check,
            request_timeout: Duration::from_secs(30),
        })
        .unwrap();
        crate::gateway::app::router(Arc::new(gateway))
    }

    async fn get(app: &Router, uri: &str, cookie: &str) -> (StatusCode, HeaderMap, String) {
        let req = http::Request::builder().method("POST").uri(uri).header("cookie", cookie);
        let answer = app.clone().oneshot(req.body(Body::from("ping")).unwrap()).await.unwrap();
        let (parts, body) = answer.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        (parts.status, parts.headers, String::from_utf8_lossy(&body).to_string())
    }

    #[tokio::test]
    async fn the_owner_reaches_the_jobs_server_under_the_prefix_and_a_stranger_gets_403() {
        let (app, port) = (gateway().await, job_server().await);
        let uri = format!("/jobs/7/port/{port}/a/b?x=1");
        let (status, _, body) = get(&app, &uri, "kairos_session=good; app=1").await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert!(body.starts_with("/a/b?x=1 "), "{body}");
        assert!(body.ends_with("body=ping") && body.contains("\"cookie\": \"app=1\""), "{body}");
        assert!(!body.contains("kairos_session") && !body.contains("good"), "{body}");
        let (status, _, body) =
            get(&app, &format!("/jobs/7/absolute/{port}/lab"), "kairos_session=good").await;
        assert!(
            status == StatusCode::OK && body.starts_with(&format!("/jobs/7/absolute/{port}/lab ")),
            "{body}"
        );
        // Another user: the services' refusal, as a page; nobody: 401.
        let (status, headers, body) = get(&app, &uri, "kairos_session=bob").await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
        assert_eq!(headers[header::CONTENT_TYPE], "text/html; charset=utf-8");
        assert!(body.contains("alice"), "{body}");
        assert_eq!(get(&app, &uri, "").await.0, StatusCode::UNAUTHORIZED);
        // A port without a server: 502; the prefix without its slash: a redirect to it.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let (status, _, body) = get(&app, &format!("/jobs/7/port/{closed}/"), "kairos_session=good").await;
        assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
        assert!(body.contains(&format!("does not listen on port {closed}")), "{body}");
        let (status, headers, _) = get(&app, &format!("/jobs/7/port/{port}?q"), "").await;
        assert_eq!(status, StatusCode::PERMANENT_REDIRECT);
        assert_eq!(headers[header::LOCATION], format!("/jobs/7/port/{port}/?q").as_str());
    }
}

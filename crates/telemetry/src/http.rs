//! The daemons' one HTTP stack: axum routers served over HTTP/1.1 by hyper
//! (`serve_connection`, also the gateway's), and the `/metrics` endpoint on it.
//!
//! `/metrics`: each connection sends one request (head bounded to 8 KiB: 431 past it; sent
//! and answered within 5 s); `GET /metrics` gets the exposition rendered at that moment,
//! anything else 404 (405 for other methods), and the connection closes. At most 64
//! connections are served at once; when all are taken, a new one closes the oldest that has
//! not sent its request yet (so connections that only sit there cannot keep a scrape out), or
//! is itself closed when every one is busy answering.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{header, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;

/// Largest request head read (hyper's smallest read buffer).
const HEAD_BYTES_MAX: usize = 8 * 1024;
/// How long a client may take to send its request and read the answer.
const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections served at once.
const CONCURRENT_MAX: usize = 64;
/// The exposition's content type.
pub const EXPOSITION_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What renders the exposition for a scrape.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// How one HTTP/1.1 connection is served.
#[derive(Clone, Copy, Debug)]
pub struct Http1 {
    /// The time a client has to send a request's whole head (hyper's header read timeout).
    pub head_timeout: Duration,
    /// The largest head read (431 past it); hyper's default when None. At least 8 KiB.
    pub head_bytes_max: Option<usize>,
    /// Whether a connection may carry more than one request.
    pub keep_alive: bool,
}

/// Serves `app` on one connection until it closes. `on_request` is called as each request's
/// head has arrived, before the router sees it.
pub async fn serve_connection<I>(
    io: I,
    app: Router,
    settings: Http1,
    on_request: impl Fn() + Send + Sync + 'static,
) -> Result<(), hyper::Error>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        on_request();
        tower_service::Service::call(&mut app.clone(), req)
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(settings.head_timeout)
        .keep_alive(settings.keep_alive);
    if let Some(max) = settings.head_bytes_max {
        builder.max_buf_size(max.max(HEAD_BYTES_MAX));
    }
    builder.serve_connection(hyper_util::rt::TokioIo::new(io), service).await
}

/// Binds `addr` (HOST:PORT) for the metrics endpoint.
pub async fn bind(addr: &str) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// The metrics endpoint's routes: `GET /metrics` renders the exposition at scrape time.
pub fn router(render: Render) -> Router {
    let scrape = move || {
        let body = render();
        async move { ([(header::CONTENT_TYPE, EXPOSITION_TYPE)], body) }
    };
    Router::new().route("/metrics", get(scrape)).fallback(refuse).method_not_allowed_fallback(refuse)
}

/// 404 for another path, 405 for another method.
async fn refuse(method: Method) -> Response {
    match method {
        Method::GET | Method::HEAD => (StatusCode::NOT_FOUND, "only /metrics is served\n").into_response(),
        _ => (StatusCode::METHOD_NOT_ALLOWED, "GET only\n").into_response(),
    }
}

/// A connection being served: whether its request has arrived, and how to close it.
struct Open {
    asked: Arc<AtomicBool>,
    task: tokio::task::AbortHandle,
}

/// Serves scrapes on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, render: Render) {
    let app = router(render);
    let settings =
        Http1 { head_timeout: IO_TIMEOUT, head_bytes_max: Some(HEAD_BYTES_MAX), keep_alive: false };
    // Oldest first.
    let open: Arc<Mutex<Vec<Open>>> = Arc::default();
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(conn) => conn,
            Err(e) => {
                tracing::warn!(error = %e, "metrics endpoint: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let mut open = open.lock().unwrap_or_else(|p| p.into_inner());
        open.retain(|o| !o.task.is_finished());
        if open.len() >= CONCURRENT_MAX {
            match open.iter().position(|o| !o.asked.load(Ordering::SeqCst)) {
                Some(silent) => open.remove(silent).task.abort(),
                None => continue, // every one is being answered: this one waits no slot
            }
        }
        let asked = Arc::new(AtomicBool::new(false));
        let flag = asked.clone();
        let served =
            serve_connection(stream, app.clone(), settings, move || flag.store(true, Ordering::SeqCst));
        let task = tokio::spawn(async move {
            match tokio::time::timeout(IO_TIMEOUT, served).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::debug!(error = %e, "metrics endpoint: connection ended"),
                Err(_) => tracing::debug!("metrics endpoint: a scrape took past its time"),
            }
        });
        open.push(Open { asked, task: task.abort_handle() });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    /// A whole answer to the raw request `request` (the client side of a scrape, byte for byte).
    async fn get(addr: std::net::SocketAddr, request: &str) -> String {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(request.as_bytes()).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn metrics_are_served_at_their_path_and_nothing_else_is() {
        let listener = bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let calls = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let seen = calls.clone();
        let render: Render = Arc::new(move || {
            let n = seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            format!("kairos_scrapes {n}\n")
        });
        tokio::spawn(serve(listener, render));
        let ok = get(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(ok.to_ascii_lowercase().contains(&format!("content-type: {EXPOSITION_TYPE}\r\n")), "{ok}");
        assert!(ok.to_ascii_lowercase().contains("connection: close\r\n"), "{ok}");
        assert!(ok.ends_with("\r\n\r\nkairos_scrapes 1\n"), "{ok}");
        // Rendered afresh for every scrape.
        assert!(get(addr, "GET /metrics HTTP/1.1\r\n\r\n").await.ends_with("kairos_scrapes 2\n"));
        assert!(get(addr, "GET /metrics?x=1 HTTP/1.1\r\n\r\n").await.ends_with("kairos_scrapes 3\n"));
        assert!(get(addr, "GET / HTTP/1.1\r\n\r\n").await.starts_with("HTTP/1.1 404"));
        assert!(get(addr, "POST /metrics HTTP/1.1\r\n\r\n").await.starts_with("HTTP/1.1 405"));
        assert!(get(addr, "DELETE /other HTTP/1.1\r\n\r\n").await.starts_with("HTTP/1.1 405"));
        let huge = format!("GET /metrics HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(10_000));
        assert!(get(addr, &huge).await.starts_with("HTTP/1.1 431"));
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 3, "only the three scrapes rendered");
    }

    #[tokio::test]
    async fn connections_that_only_sit_there_cannot_keep_a_scrape_out() {
        let listener = bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let render: Render = Arc::new(|| "kairos_up 1\n".to_string());
        tokio::spawn(serve(listener, render));
        // Twice as many silent connections as there are places, kept open.
        let mut silent = Vec::new();
        for _ in 0..2 * CONCURRENT_MAX {
            silent.push(TcpStream::connect(addr).await.unwrap());
        }
        let started = std::time::Instant::now();
        let scrape = tokio::time::timeout(Duration::from_secs(2), get(addr, "GET /metrics HTTP/1.1\r\n\r\n"))
            .await
            .expect("the scrape waited behind silent connections");
        assert!(scrape.ends_with("kairos_up 1\n"), "{scrape}");
        assert!(started.elapsed() < IO_TIMEOUT, "{:?}", started.elapsed());
        drop(silent);
    }

    #[tokio::test]
    async fn a_head_that_does_not_arrive_in_time_closes_the_connection() {
        let listener = bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = router(Arc::new(|| "kairos_up 1\n".to_string()));
        let settings =
            Http1 { head_timeout: Duration::from_millis(300), head_bytes_max: None, keep_alive: true };
        tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            let _ = serve_connection(stream, app, settings, || {}).await;
        });
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\n").await.unwrap();
        let started = std::time::Instant::now();
        let mut out = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
        assert!(read.is_ok(), "the connection stayed open past its head timeout");
        assert!(started.elapsed() >= Duration::from_millis(250), "{:?}", started.elapsed());
        assert!(!String::from_utf8_lossy(&out).contains("kairos_up"), "a partial head was answered");
    }
}

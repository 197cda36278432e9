//! The `/metrics` endpoint: a minimal HTTP/1.1 server for Prometheus scrapes. Each connection
//! sends one request (head bounded to 8 KiB, read within 5 s); `GET /metrics` gets the
//! exposition rendered at that moment, anything else 404 (405 for other methods), and the
//! connection closes. At most 64 connections are served at once; when all are taken, a new one
//! closes the oldest that has not sent its request yet (so connections that only sit there
//! cannot keep a scrape out), or is itself closed when every one is busy answering.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Largest request head read.
const HEAD_BYTES_MAX: usize = 8 * 1024;
/// How long a client may take to send its request and read the answer.
const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections served at once.
const CONCURRENT_MAX: usize = 64;

/// What renders the exposition for a scrape.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// Binds `addr` (HOST:PORT) for the metrics endpoint.
pub async fn bind(addr: &str) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// A connection being served: whether its request has arrived, and how to close it.
struct Open {
    asked: Arc<AtomicBool>,
    task: tokio::task::AbortHandle,
}

/// Serves scrapes on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, render: Render) {
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
        {
            let mut open = open.lock().unwrap_or_else(|p| p.into_inner());
            open.retain(|o| !o.task.is_finished());
            if open.len() >= CONCURRENT_MAX {
                match open.iter().position(|o| !o.asked.load(Ordering::SeqCst)) {
                    Some(silent) => open.remove(silent).task.abort(),
                    None => continue, // every one is being answered: this one waits no slot
                }
            }
            let asked = Arc::new(AtomicBool::new(false));
            let render = render.clone();
            let flag = asked.clone();
            let task = tokio::spawn(async move {
                let _ = tokio::time::timeout(IO_TIMEOUT, answer(stream, &render, &flag)).await;
            });
            open.push(Open { asked, task: task.abort_handle() });
        }
    }
}

async fn answer(mut stream: TcpStream, render: &Render, asked: &AtomicBool) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        if head.len() >= HEAD_BYTES_MAX {
            return respond(&mut stream, "431 Request Header Fields Too Large", "text/plain", "").await;
        }
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
    }
    asked.store(true, Ordering::SeqCst);
    let line = head.split(|b| *b == b'\r').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split(' ');
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET", "/metrics") => {
            let body = render();
            respond(&mut stream, "200 OK", "text/plain; version=0.0.4; charset=utf-8", &body).await
        }
        ("GET", _) => respond(&mut stream, "404 Not Found", "text/plain", "only /metrics is served\n").await,
        _ => respond(&mut stream, "405 Method Not Allowed", "text/plain", "GET only\n").await,
    }
}

async fn respond(stream: &mut TcpStream, status: &str, kind: &str, body: &str) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(ok.ends_with("\r\n\r\nkairos_scrapes 1\n"), "{ok}");
        // Rendered afresh for every scrape.
        assert!(get(addr, "GET /metrics HTTP/1.1\r\n\r\n").await.ends_with("kairos_scrapes 2\n"));
        assert!(get(addr, "GET / HTTP/1.1\r\n\r\n").await.starts_with("HTTP/1.1 404"));
        assert!(get(addr, "POST /metrics HTTP/1.1\r\n\r\n").await.starts_with("HTTP/1.1 405"));
        let huge = format!("GET /metrics HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(10_000));
        assert!(get(addr, &huge).await.starts_with("HTTP/1.1 431"));
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 2, "only the two scrapes rendered");
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
}

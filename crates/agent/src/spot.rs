//! Spot interruption notices: on a spot instance the agent polls the instance metadata service
//! (IMDSv2: a session token first, then `spot/instance-action`). A 404 means no notice; a 200
//! means the instance will be reclaimed in about two minutes, and the agent asks the
//! controllers to drain its node (its jobs checkpoint and requeue).
//!
//! The client is a minimal HTTP/1.1 one over plain TCP: IMDS is a link-local HTTP endpoint and
//! this is all the agent needs from it. Responses are capped in size.

use std::time::Duration;

use thiserror::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Largest IMDS response read.
const RESPONSE_BYTES_MAX: u64 = 64 * 1024;
const TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, Error)]
pub enum ImdsError {
    #[error("IMDS URL \"{0}\" is not http://HOST[:PORT][/PREFIX]")]
    BadUrl(String),
    #[error("IMDS request failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("IMDS request timed out")]
    Timeout,
    #[error("IMDS answered something that is not HTTP")]
    BadResponse,
    #[error("IMDS answered status {0}")]
    Status(u16),
}

/// An IMDSv2 endpoint, e.g. `http://169.254.169.254` (tests: a prefix path is allowed).
#[derive(Clone, Debug)]
pub struct Imds {
    host: String,
    port: u16,
    prefix: String,
}

impl Imds {
    pub fn parse(url: &str) -> Result<Imds, ImdsError> {
        let rest = url.strip_prefix("http://").ok_or_else(|| ImdsError::BadUrl(url.to_string()))?;
        let (authority, prefix) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
            None => (rest, ""),
        };
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) => (h, p.parse().map_err(|_| ImdsError::BadUrl(url.to_string()))?),
            None => (authority, 80),
        };
        if host.is_empty() {
            return Err(ImdsError::BadUrl(url.to_string()));
        }
        Ok(Imds { host: host.to_string(), port, prefix: prefix.to_string() })
    }

    async fn request(
        &self,
        method: &str,
        path: &str,
        header: (&str, &str),
    ) -> Result<(u16, String), ImdsError> {
        let exchange = async {
            let mut stream = tokio::net::TcpStream::connect((self.host.as_str(), self.port)).await?;
            let req = format!(
                "{method} {}{path} HTTP/1.1\r\nHost: {}\r\n{}: {}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                self.prefix, self.host, header.0, header.1
            );
            stream.write_all(req.as_bytes()).await?;
            let mut raw = Vec::new();
            stream.take(RESPONSE_BYTES_MAX).read_to_end(&mut raw).await?;
            Ok::<_, ImdsError>(raw)
        };
        let raw = tokio::time::timeout(TIMEOUT, exchange).await.map_err(|_| ImdsError::Timeout)??;
        parse_response(&raw)
    }

    /// The pending spot interruption notice (its JSON), or None.
    pub async fn spot_notice(&self) -> Result<Option<String>, ImdsError> {
        let (status, token) =
            self.request("PUT", "/latest/api/token", ("X-aws-ec2-metadata-token-ttl-seconds", "300")).await?;
        if status != 200 {
            return Err(ImdsError::Status(status));
        }
        let (status, body) = self
            .request(
                "GET",
                "/latest/meta-data/spot/instance-action",
                ("X-aws-ec2-metadata-token", token.trim()),
            )
            .await?;
        match status {
            200 => Ok(Some(body.trim().chars().take(512).collect())),
            404 => Ok(None),
            other => Err(ImdsError::Status(other)),
        }
    }
}

/// (status, body) of a raw HTTP/1.1 response; anything else is `BadResponse`.
fn parse_response(raw: &[u8]) -> Result<(u16, String), ImdsError> {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text.split_once("\r\n\r\n").ok_or(ImdsError::BadResponse)?;
    let status_line = head.lines().next().ok_or(ImdsError::BadResponse)?;
    if !status_line.starts_with("HTTP/") {
        return Err(ImdsError::BadResponse);
    }
    let status =
        status_line.split_whitespace().nth(1).and_then(|c| c.parse().ok()).ok_or(ImdsError::BadResponse)?;
    Ok((status, body.to_string()))
}

/// Polls for a notice every `every` until one comes; returns it.
pub async fn wait_for_notice(imds: &Imds, every: Duration) -> String {
    loop {
        match imds.spot_notice().await {
            Ok(Some(notice)) => return notice,
            Ok(None) => {}
            Err(e) => tracing::debug!(error = %e, "spot notice poll"),
        }
        tokio::time::sleep(every).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake IMDS answering `notice` (None = 404) for a token it handed out.
    async fn fake_imds(notice: Option<&'static str>) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = listener.accept().await else { return };
                let mut buf = vec![0u8; 4096];
                let n = s.read(&mut buf).await.unwrap_or(0);
                let req = String::from_utf8_lossy(&buf[..n]).to_string();
                let reply = if req.starts_with("PUT /pre/latest/api/token") {
                    "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\ntok".to_string()
                } else if req.contains("spot/instance-action")
                    && req.contains("X-aws-ec2-metadata-token: tok")
                {
                    match notice {
                        Some(n) => format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{n}", n.len()),
                        None => "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n".to_string(),
                    }
                } else {
                    "HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n".to_string()
                };
                let _ = s.write_all(reply.as_bytes()).await;
            }
        });
        format!("http://{addr}/pre")
    }

    proptest::proptest! {
        /// Whatever the metadata endpoint answers, parsing ends in a value or a clean error.
        #[test]
        fn any_response_bytes_parse_or_fail_cleanly(raw in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let _ = parse_response(&raw);
        }
    }

    #[test]
    fn responses_that_are_not_http_are_refused() {
        assert_eq!(parse_response(b"HTTP/1.1 404 Not Found\r\n\r\n").unwrap().0, 404);
        for bad in [&b""[..], b"\r\n\r\n", b"SSH-2.0\r\n\r\nx", b"HTTP/1.1 abc\r\n\r\n", b"HTTP/1.1 200 OK"] {
            assert!(matches!(parse_response(bad), Err(ImdsError::BadResponse)), "{bad:?}");
        }
    }

    #[tokio::test]
    async fn a_notice_is_read_with_an_imdsv2_token_and_its_absence_is_none() {
        let quiet = Imds::parse(&fake_imds(None).await).unwrap();
        assert_eq!(quiet.spot_notice().await.unwrap(), None);
        let notice = r#"{"action": "terminate", "time": "2026-11-29T23:59:00Z"}"#;
        let loud = Imds::parse(&fake_imds(Some(notice)).await).unwrap();
        assert_eq!(loud.spot_notice().await.unwrap().as_deref(), Some(notice));
        assert!(Imds::parse("https://x").is_err());
        assert!(Imds::parse("http://:80").is_err());
    }
}

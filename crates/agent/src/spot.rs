//! Spot interruption notices: on a spot instance the agent polls the instance metadata service
//! (IMDSv2: a session token first, then `spot/instance-action`). A 404 means no notice; a 200
//! means the instance will be reclaimed in about two minutes, and the agent asks the
//! controllers to drain its node (its jobs checkpoint and requeue).
//!
//! The client is the AWS SDK's (`aws_config::imds`): it fetches and caches the session token,
//! retries what is worth retrying and bounds each attempt in time.

use std::time::Duration;

use aws_config::imds::client::error::ImdsError as SdkError;
use thiserror::Error;

/// How long connecting, and then reading an answer, may take.
const TIMEOUT: Duration = Duration::from_secs(2);
/// How long an IMDSv2 session token is asked for.
const TOKEN_TTL: Duration = Duration::from_secs(300);
/// The longest notice kept (characters).
const NOTICE_CHARS_MAX: usize = 512;

#[derive(Debug, Error)]
pub enum ImdsError {
    #[error("IMDS URL \"{0}\" is not http://HOST[:PORT][/PREFIX]")]
    BadUrl(String),
    #[error("IMDS request failed: {0}")]
    Request(Box<SdkError>),
    #[error("IMDS answered status {0}")]
    Status(u16),
}

/// An IMDSv2 endpoint, e.g. `http://169.254.169.254` (tests: a prefix path is allowed).
#[derive(Clone, Debug)]
pub struct Imds {
    client: aws_config::imds::Client,
}

impl Imds {
    pub fn parse(url: &str) -> Result<Imds, ImdsError> {
        let bad = || ImdsError::BadUrl(url.to_string());
        let uri: http::Uri = url.parse().map_err(|_| bad())?;
        if uri.scheme_str() != Some("http") || uri.host().is_none_or(str::is_empty) {
            return Err(bad());
        }
        let http = aws_smithy_http_client::Builder::new()
            .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
                aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
            ))
            .build_https();
        let config = aws_config::provider_config::ProviderConfig::without_region().with_http_client(http);
        let client = aws_config::imds::Client::builder()
            .configure(&config)
            .endpoint(url)
            .map_err(|_| bad())?
            .token_ttl(TOKEN_TTL)
            .connect_timeout(TIMEOUT)
            .read_timeout(TIMEOUT)
            .build();
        Ok(Imds { client })
    }

    /// The pending spot interruption notice (its JSON), or None.
    pub async fn spot_notice(&self) -> Result<Option<String>, ImdsError> {
        match self.client.get("/latest/meta-data/spot/instance-action").await {
            Ok(notice) => Ok(Some(notice.as_ref().trim().chars().take(NOTICE_CHARS_MAX).collect())),
            Err(SdkError::ErrorResponse(r)) => match r.response().status().as_u16() {
                404 => Ok(None),
                other => Err(ImdsError::Status(other)),
            },
            Err(e) => Err(ImdsError::Request(Box::new(e))),
        }
    }
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
    use axum::http::{HeaderMap, StatusCode};
    use axum::response::IntoResponse;
    use axum::routing::{get, put};

    /// A local IMDSv2 (a real HTTP server): a token for a PUT that asks for one with a TTL, and
    /// `notice` (None = 404) for a GET that carries it; 401 without the token.
    async fn fake_imds(notice: Option<&'static str>) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let token = |h: HeaderMap| async move {
            match h.get("x-aws-ec2-metadata-token-ttl-seconds") {
                Some(ttl) => {
                    let ttl = ttl.clone();
                    ([("x-aws-ec2-metadata-token-ttl-seconds", ttl)], "tok").into_response()
                }
                None => StatusCode::BAD_REQUEST.into_response(),
            }
        };
        let action = move |h: HeaderMap| async move {
            match (h.get("x-aws-ec2-metadata-token").is_some_and(|t| t == "tok"), notice) {
                (false, _) => StatusCode::UNAUTHORIZED.into_response(),
                (true, Some(n)) => n.into_response(),
                (true, None) => StatusCode::NOT_FOUND.into_response(),
            }
        };
        let app = axum::Router::new()
            .route("/latest/api/token", put(token))
            .route("/latest/meta-data/spot/instance-action", get(action));
        // Under a prefix, as the burst tests serve one IMDS per instance.
        let app = axum::Router::new().nest("/pre", app);
        tokio::spawn(async move { axum::serve(listener, app).await });
        format!("http://{addr}/pre")
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
        assert!(Imds::parse("not a url").is_err());
    }

    #[tokio::test]
    async fn an_endpoint_that_is_not_imds_is_an_error_not_a_notice() {
        // Nothing listens: a request error, after the client's own retries and timeouts.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let closed = format!("http://{}", listener.local_addr().unwrap());
        drop(listener);
        let started = std::time::Instant::now();
        assert!(matches!(Imds::parse(&closed).unwrap().spot_notice().await, Err(ImdsError::Request(_))));
        assert!(started.elapsed() < Duration::from_secs(30), "{:?}", started.elapsed());
        // An HTTP server without the token route: refused, not taken for "no notice".
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let other = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, axum::Router::new()).await });
        assert!(Imds::parse(&other).unwrap().spot_notice().await.is_err());
    }
}

//! The web UI's files, compiled into the binary (no build step at install time, nothing read
//! from disk at run time): one page whose script draws each view from the JSON API.

use axum::response::Response;
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use http::{header, HeaderValue, StatusCode};

use super::bytes;

const INDEX: &str = include_str!("../../ui/index.html");
const SCRIPT: &str = include_str!("../../ui/app.js");
const STYLE: &str = include_str!("../../ui/app.css");

/// Scripts and styles only from this origin, no framing, no inline script.
const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

/// The pages' routes (GET, and HEAD with it).
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    let file = |kind: &'static str, text: &'static str| get(move || async move { file(kind, text) });
    Router::new()
        .route("/", file("text/html; charset=utf-8", INDEX))
        .route("/index.html", file("text/html; charset=utf-8", INDEX))
        .route("/app.js", file("text/javascript; charset=utf-8", SCRIPT))
        .route("/app.css", file("text/css; charset=utf-8", STYLE))
}

fn file(kind: &'static str, text: &'static str) -> Response {
    let mut r = bytes(StatusCode::OK, kind, Bytes::from_static(text.as_bytes()));
    secure(&mut r);
    r
}

/// A refusal off the API as a small page: 404 (no such page) or 405 (a method other than GET).
pub fn refusal(status: StatusCode) -> Response {
    match status {
        StatusCode::METHOD_NOT_ALLOWED => page(status, "405 — method not allowed"),
        _ => page(StatusCode::NOT_FOUND, "404 — no such page"),
    }
}

fn page(status: StatusCode, what: &str) -> Response {
    let html = format!(
        "<!doctype html><html lang=en><meta charset=utf-8><title>kairos</title><h1>{what}</h1><p><a href=\"/\">kairos</a></p></html>"
    );
    let mut r = bytes(status, "text/html; charset=utf-8", Bytes::from(html));
    secure(&mut r);
    r
}

fn secure(r: &mut Response) {
    let h = r.headers_mut();
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_loads_only_its_own_script_and_style() {
        assert!(INDEX.contains("src=\"/app.js\"") && INDEX.contains("href=\"/app.css\""));
        // No inline script: the CSP forbids it, so one would silently not run.
        assert!(!INDEX.contains("<script>") && !INDEX.contains("onclick="));
        assert_eq!(refusal(StatusCode::NOT_FOUND).status(), StatusCode::NOT_FOUND);
        let refused = refusal(StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(refused.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(refused.headers()[header::X_FRAME_OPTIONS], "DENY");
        let script = file("text/javascript; charset=utf-8", SCRIPT);
        assert_eq!(script.headers()[header::CONTENT_TYPE], "text/javascript; charset=utf-8");
    }
}

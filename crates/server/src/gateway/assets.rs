//! The web UI's files, compiled into the binary (no build step at install time, nothing read
//! from disk at run time): one page whose script draws each view from the JSON API.

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};

use super::{bytes, Body};

const INDEX: &str = include_str!("../../ui/index.html");
const SCRIPT: &str = include_str!("../../ui/app.js");
const STYLE: &str = include_str!("../../ui/app.css");

/// Scripts and styles only from this origin, no framing, no inline script.
const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

/// The file at `path` (GET or HEAD); 404 and 405 as small pages.
pub fn serve(method: &str, path: &str) -> Response<Body> {
    if method != "GET" && method != "HEAD" {
        return page(StatusCode::METHOD_NOT_ALLOWED, "405 — method not allowed");
    }
    let (kind, text) = match path {
        "/" | "/index.html" => ("text/html; charset=utf-8", INDEX),
        "/app.js" => ("text/javascript; charset=utf-8", SCRIPT),
        "/app.css" => ("text/css; charset=utf-8", STYLE),
        _ => return page(StatusCode::NOT_FOUND, "404 — no such page"),
    };
    let mut r = bytes(StatusCode::OK, kind, Bytes::from_static(text.as_bytes()));
    secure(&mut r);
    r
}

fn page(status: StatusCode, what: &str) -> Response<Body> {
    let html = format!(
        "<!doctype html><html lang=en><meta charset=utf-8><title>kairos</title><h1>{what}</h1><p><a href=\"/\">kairos</a></p></html>"
    );
    let mut r = bytes(status, "text/html; charset=utf-8", Bytes::from(html));
    secure(&mut r);
    r
}

fn secure(r: &mut Response<Body>) {
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
        assert_eq!(serve("GET", "/nope").status(), StatusCode::NOT_FOUND);
        assert_eq!(serve("POST", "/").status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(serve("GET", "/app.js").status(), StatusCode::OK);
    }
}

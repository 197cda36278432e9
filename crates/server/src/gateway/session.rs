//! Who an HTTP call is from: `Authorization: Bearer TOKEN` (scripts, curl), or the web UI's
//! session cookie. Logging in stores the token in an HttpOnly, SameSite=Strict cookie that page
//! scripts cannot read, beside a CSRF cookie they can: every call that changes something under
//! the session cookie must echo it in `X-CSRF-Token`. The CSRF value is a MAC of the token under
//! the cluster key, so every replica checks it and none keeps a session table.

use cookie::{Cookie, SameSite};
use http::HeaderMap;
use kairos_consensus::auth::{sha256_hex, ClusterKey};

/// The cookie holding the API token.
pub const SESSION_COOKIE: &str = "kairos_session";
/// The cookie holding the CSRF value, readable by the page's script.
pub const CSRF_COOKIE: &str = "kairos_csrf";
/// The header a state-changing call under the session cookie carries the CSRF value in.
pub const CSRF_HEADER: &str = "x-csrf-token";
/// How long a login lasts in the browser (the token's own expiry still applies).
const SESSION_MAX_AGE_S: u64 = 12 * 3600;
/// The purpose the CSRF MAC is derived under.
const CSRF_PURPOSE: &str = "web-csrf";

/// The credential an HTTP call carries.
#[derive(Debug, PartialEq, Eq)]
pub enum Credential {
    /// `Authorization: Bearer …`: not sent by browsers on their own, so no CSRF check.
    Header(String),
    /// The session cookie, and whether the call proved it came from our page (CSRF).
    Cookie {
        token: String,
        csrf_ok: bool,
    },
    None,
}

/// The value of cookie `name` in the request's `Cookie` headers.
pub fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(Cookie::split_parse)
        .filter_map(Result::ok)
        .find(|c| c.name() == name)
        .map(|c| c.value().to_string())
}

/// The CSRF value that goes with `token`.
pub fn csrf_for(key: &ClusterKey, token: &str) -> String {
    key.mac(CSRF_PURPOSE, sha256_hex(token).as_bytes())
}

/// What the call authenticates with.
pub fn credential(headers: &HeaderMap, key: &ClusterKey) -> Credential {
    let bearer = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    if let Some(token) = bearer {
        return Credential::Header(token.to_string());
    }
    let Some(token) = cookie(headers, SESSION_COOKIE).filter(|t| !t.is_empty()) else {
        return Credential::None;
    };
    let sent = headers.get(CSRF_HEADER).and_then(|v| v.to_str().ok()).unwrap_or("");
    let csrf_ok = !sent.is_empty() && kairos_consensus::auth::ct_eq(sent, &csrf_for(key, &token));
    Credential::Cookie { token, csrf_ok }
}

/// A `Set-Cookie` value: `name=value` for the whole site, SameSite=Strict, for `max_age_s`.
fn set_cookie(name: &str, value: String, http_only: bool, max_age_s: u64) -> String {
    Cookie::build((name, value))
        .path("/")
        .http_only(http_only)
        .same_site(SameSite::Strict)
        .max_age(cookie::time::Duration::seconds(i64::try_from(max_age_s).unwrap_or(i64::MAX)))
        .build()
        .to_string()
}

/// The `Set-Cookie` values of a login with `token`.
pub fn login_cookies(key: &ClusterKey, token: &str) -> [String; 2] {
    [
        set_cookie(SESSION_COOKIE, token.to_string(), true, SESSION_MAX_AGE_S),
        set_cookie(CSRF_COOKIE, csrf_for(key, token), false, SESSION_MAX_AGE_S),
    ]
}

/// The `Set-Cookie` values of a logout: both cookies expire now.
pub fn logout_cookies() -> [String; 2] {
    [set_cookie(SESSION_COOKIE, String::new(), true, 0), set_cookie(CSRF_COOKIE, String::new(), false, 0)]
}

/// Whether a token may be put in a cookie as it is (API tokens and the bootstrap token are
/// printable ASCII without separators).
pub fn cookie_safe(token: &str) -> bool {
    !token.is_empty()
        && token.len() <= kairos_proto::wire::CREDENTIAL_LEN_MAX
        && token.bytes().all(|b| b.is_ascii_graphic() && !matches!(b, b';' | b',' | b'"' | b'\\'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn the_session_cookie_counts_only_with_its_csrf_value_for_changes() {
        let key = ClusterKey::new(&"s".repeat(32));
        let csrf = csrf_for(&key, "kairos_tok");
        let [session, csrf_cookie] = login_cookies(&key, "kairos_tok");
        assert!(session.starts_with("kairos_session=kairos_tok;"), "{session}");
        assert!(session.contains("HttpOnly") && session.contains("SameSite=Strict"), "{session}");
        assert!(session.contains("Path=/") && session.contains("Max-Age=43200"), "{session}");
        assert!(!csrf_cookie.contains("HttpOnly") && csrf_cookie.contains(&csrf));
        let c = credential(
            &headers(&[("cookie", "a=b; kairos_session=kairos_tok"), ("x-csrf-token", &csrf)]),
            &key,
        );
        assert_eq!(c, Credential::Cookie { token: "kairos_tok".into(), csrf_ok: true });
        // Another token's CSRF value, or none, proves nothing.
        let other = csrf_for(&key, "kairos_other");
        for sent in [other.as_str(), ""] {
            let c = credential(
                &headers(&[("cookie", "kairos_session=kairos_tok"), ("x-csrf-token", sent)]),
                &key,
            );
            assert_eq!(c, Credential::Cookie { token: "kairos_tok".into(), csrf_ok: false });
        }
        // Another cluster's key makes another value.
        assert_ne!(csrf_for(&ClusterKey::new(&"t".repeat(32)), "kairos_tok"), csrf);
        let c =
            credential(&headers(&[("authorization", "Bearer abc"), ("cookie", "kairos_session=x")]), &key);
        assert_eq!(c, Credential::Header("abc".into()));
        assert_eq!(credential(&headers(&[("cookie", "kairos_session=")]), &key), Credential::None);
        assert!(logout_cookies().iter().all(|c| c.contains("Max-Age=0")));
        // Cookies in several headers, spaced or not; a malformed pair does not hide the rest.
        let h = headers(&[("cookie", "a=b;x"), ("cookie", "kairos_csrf=c;kairos_session=t2")]);
        assert_eq!(cookie(&h, SESSION_COOKIE).as_deref(), Some("t2"));
        assert_eq!(cookie(&h, "a").as_deref(), Some("b"));
        assert_eq!(cookie(&h, "nope"), None);
        assert!(cookie_safe("kairos_0011_abc") && !cookie_safe("a;b") && !cookie_safe("a b"));
    }
}

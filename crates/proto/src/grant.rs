//! Session grants (`SessionGrant`): what a controller gives an agent with an interactive
//! session, sealed with HMAC-SHA256 under the node's credential (which only the controllers
//! and that node know), so the agent can check that a controller issued it for that job, user,
//! kind and port, and that it has not expired. One definition of the sealed bytes, used by both.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::v1::SessionGrant;

/// How long a grant opens sessions: it is issued for one open (or resume) at a time.
pub const GRANT_TTL_MS: i64 = 30_000;

/// Why an agent refuses a grant.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrantError {
    #[error("the session grant is not one a controller issued for this node")]
    BadMac,
    #[error("the session grant expired {0} ms ago")]
    Expired(i64),
}

/// The bytes a grant's MAC covers: every field but the MAC, each length-prefixed.
fn sealed(g: &SessionGrant) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + g.user.len() + g.caller.len());
    out.extend_from_slice(b"kairos-session-grant-v1");
    out.extend_from_slice(&g.job_id.to_be_bytes());
    out.extend_from_slice(&g.attempt.to_be_bytes());
    out.extend_from_slice(&g.submit_time_ms.to_be_bytes());
    for s in [&g.user, &g.caller] {
        out.extend_from_slice(&(s.len() as u64).to_be_bytes());
        out.extend_from_slice(s.as_bytes());
    }
    out.extend_from_slice(&g.kind.to_be_bytes());
    out.extend_from_slice(&g.port.to_be_bytes());
    out.extend_from_slice(&g.expires_ms.to_be_bytes());
    out
}

fn mac_of(node_credential: &str, g: &SessionGrant) -> Hmac<Sha256> {
    let mut mac = match <Hmac<Sha256> as KeyInit>::new_from_slice(node_credential.as_bytes()) {
        Ok(m) => m,
        Err(_) => unreachable!("HMAC accepts keys of any length"),
    };
    mac.update(&sealed(g));
    mac
}

/// Seals `grant` for the node whose credential is `node_credential` (sets its MAC).
pub fn seal(node_credential: &str, grant: &mut SessionGrant) {
    grant.mac = mac_of(node_credential, grant).finalize().into_bytes().to_vec();
}

/// Checks `grant`'s MAC under this node's credential (in constant time) and that it has not
/// expired at `now_ms`.
pub fn verify(node_credential: &str, grant: &SessionGrant, now_ms: i64) -> Result<(), GrantError> {
    mac_of(node_credential, grant).verify_slice(&grant.mac).map_err(|_| GrantError::BadMac)?;
    if now_ms > grant.expires_ms {
        return Err(GrantError::Expired(now_ms - grant.expires_ms));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant() -> SessionGrant {
        SessionGrant {
            job_id: 7,
            attempt: 1,
            submit_time_ms: 1_000,
            user: "alice".into(),
            caller: "alice".into(),
            kind: crate::v1::SessionKind::Exec as i32,
            port: 0,
            expires_ms: 50_000,
            mac: Vec::new(),
        }
    }

    #[test]
    fn a_sealed_grant_verifies_and_any_change_or_other_key_or_expiry_refuses_it() {
        let mut g = grant();
        seal("node.abc", &mut g);
        assert_eq!(verify("node.abc", &g, 49_999), Ok(()));
        assert_eq!(verify("node.other", &g, 49_999), Err(GrantError::BadMac));
        assert_eq!(verify("node.abc", &g, 50_010), Err(GrantError::Expired(10)));
        let tampered: [fn(&mut SessionGrant); 6] = [
            |g| g.job_id = 8,
            |g| g.attempt = 2,
            |g| g.user = "bob".into(),
            |g| g.kind = crate::v1::SessionKind::Forward as i32,
            |g| g.port = 22,
            |g| g.expires_ms += 1_000_000,
        ];
        for change in tampered {
            let mut t = g.clone();
            change(&mut t);
            assert_eq!(verify("node.abc", &t, 1), Err(GrantError::BadMac));
        }
        // The length prefixes keep "ab"+"c" apart from "a"+"bc".
        let (mut a, mut b) = (grant(), grant());
        (a.user, a.caller, b.user, b.caller) = ("ab".into(), "c".into(), "a".into(), "bc".into());
        seal("k", &mut a);
        b.mac = a.mac.clone();
        assert_eq!(verify("k", &b, 1), Err(GrantError::BadMac));
    }
}

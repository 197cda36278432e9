//! API tokens in the replicated state: who each token belongs to and what role it carries.
//!
//! Only a token's id and the SHA-256 of its secret are stored (hashed at the API edge, so the
//! state machine stays pure and no replica, snapshot or log ever holds a usable token).
//! Creating and revoking tokens are commands like any other, so every replica authenticates
//! the same callers after a failover.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::state::{ClusterState, Outcome, Rejection};

/// Most tokens a cluster keeps.
pub const TOKENS_MAX: usize = 10_000;
/// Length of a token id (hex characters).
pub const TOKEN_ID_LEN: usize = 16;

/// What a caller may do. Ordered: each role may do what the ones below it may.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Submits under the accounts it belongs to; sees and acts on its own jobs only.
    User,
    /// Also sees and cancels any job and drains nodes.
    Operator,
    /// Also changes QoS, partitions, accounts, burst configuration, tokens and membership.
    Admin,
}

impl Role {
    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "user" => Some(Role::User),
            "operator" => Some(Role::Operator),
            "admin" => Some(Role::Admin),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Role::User => "user",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }
}

/// One issued token, without its secret.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenRecord {
    pub user: String,
    pub role: Role,
    /// Lower-case hex SHA-256 of the token's secret part.
    pub secret_sha256: String,
    pub created_ms: i64,
    /// Who created it.
    pub created_by: String,
    /// After this time (Unix ms) the token is refused; `None` = until revoked.
    #[serde(default)]
    pub expires_ms: Option<i64>,
    /// Free text for operators ("ci pipeline", "alice's laptop").
    #[serde(default)]
    pub description: String,
}

impl TokenRecord {
    pub fn live_at(&self, now_ms: i64) -> bool {
        self.expires_ms.is_none_or(|e| now_ms < e)
    }
}

/// Issued tokens by id.
pub type Tokens = BTreeMap<String, TokenRecord>;

fn is_lower_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// A user name as tokens and jobs carry it: 1-64 of `[A-Za-z0-9._-]`.
pub fn valid_user_name(user: &str) -> bool {
    !user.is_empty()
        && user.len() <= 64
        && user.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
}

impl ClusterState {
    pub(crate) fn create_token(&mut self, id: &str, record: &TokenRecord) -> Outcome {
        let invalid = |m: String| Outcome::Rejected(Rejection::Invalid(m));
        if !is_lower_hex(id, TOKEN_ID_LEN) {
            return invalid(format!("token id: {TOKEN_ID_LEN} lower-case hex characters"));
        }
        if !is_lower_hex(&record.secret_sha256, 64) {
            return invalid("token hash: 64 lower-case hex characters".into());
        }
        if !valid_user_name(&record.user) {
            return invalid("user: 1-64 characters of [A-Za-z0-9._-]".into());
        }
        if record.description.len() > 256 {
            return invalid("description: at most 256 bytes".into());
        }
        if self.revoked_tokens.contains_key(id) {
            return Outcome::Rejected(Rejection::FailedPrecondition(format!("token {id} was revoked")));
        }
        if let Some(existing) = self.tokens.get(id) {
            // The same secret for the same user and role: a retry of the same create (ids and
            // secrets of a create with a request id derive from it).
            let retry = existing.secret_sha256 == record.secret_sha256
                && existing.user == record.user
                && existing.role == record.role;
            return if retry {
                Outcome::TokensChanged
            } else {
                Outcome::Rejected(Rejection::FailedPrecondition(format!(
                    "token {id} already exists with other settings (a request id used again for another user, role, lifetime or description)"
                )))
            };
        }
        if self.tokens.len() >= TOKENS_MAX {
            return Outcome::Rejected(Rejection::FailedPrecondition(format!(
                "the cluster holds {TOKENS_MAX} tokens already; revoke some first"
            )));
        }
        self.tokens.insert(id.to_string(), record.clone());
        Outcome::TokensChanged
    }

    /// Revokes token `id`; revoking a revoked token again succeeds (a retried revoke). Its id is
    /// remembered (the `TOKENS_MAX` most recent), so a late retry of its create is refused.
    pub(crate) fn revoke_token(&mut self, id: &str, now: i64) -> Outcome {
        if self.revoked_tokens.contains_key(id) {
            return Outcome::TokensChanged;
        }
        if self.tokens.remove(id).is_none() {
            return Outcome::Rejected(Rejection::NotFound(format!("token {id} not found")));
        }
        if self.revoked_tokens.len() >= TOKENS_MAX {
            let oldest = self
                .revoked_tokens
                .iter()
                .min_by_key(|(id, at)| (**at, (*id).clone()))
                .map(|(id, _)| id.clone());
            if let Some(oldest) = oldest {
                self.revoked_tokens.remove(&oldest);
            }
        }
        self.revoked_tokens.insert(id.to_string(), now);
        Outcome::TokensChanged
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Command, Op};

    fn record(user: &str) -> TokenRecord {
        TokenRecord {
            user: user.into(),
            role: Role::User,
            secret_sha256: "ab".repeat(32),
            created_ms: 1,
            created_by: "admin".into(),
            expires_ms: None,
            description: String::new(),
        }
    }

    fn apply(s: &mut ClusterState, op: Op) -> Outcome {
        s.apply(&Command { skipped_ms: 0, now_ms: 10, op })
    }

    #[test]
    fn a_retried_create_or_revoke_changes_nothing_and_a_revoked_token_never_returns() {
        let mut s = ClusterState::new();
        let id = "0123456789abcdef".to_string();
        let create = Op::CreateToken { id: id.clone(), record: record("alice") };
        assert_eq!(apply(&mut s, create.clone()), Outcome::TokensChanged);
        // The same create again (a retry: same secret, user and role) succeeds; one token.
        assert_eq!(apply(&mut s, create.clone()), Outcome::TokensChanged);
        assert_eq!(s.tokens.len(), 1);
        // Another secret, or another user, under the same id: refused.
        let other = TokenRecord { secret_sha256: "cd".repeat(32), ..record("alice") };
        let out = apply(&mut s, Op::CreateToken { id: id.clone(), record: other });
        assert!(matches!(out, Outcome::Rejected(Rejection::FailedPrecondition(_))), "{out:?}");
        let out = apply(&mut s, Op::CreateToken { id: id.clone(), record: record("mallory") });
        assert!(matches!(out, Outcome::Rejected(Rejection::FailedPrecondition(_))), "{out:?}");
        assert_eq!(s.tokens[&id].user, "alice");
        // Revoked (twice: a retried revoke succeeds), and a late retry of the create is refused.
        assert_eq!(apply(&mut s, Op::RevokeToken { id: id.clone() }), Outcome::TokensChanged);
        assert_eq!(apply(&mut s, Op::RevokeToken { id: id.clone() }), Outcome::TokensChanged);
        assert!(matches!(apply(&mut s, create), Outcome::Rejected(Rejection::FailedPrecondition(_))));
        assert!(s.tokens.is_empty());
        let unknown = Op::RevokeToken { id: "ffffffffffffffff".into() };
        assert!(matches!(apply(&mut s, unknown), Outcome::Rejected(Rejection::NotFound(_))));
    }

    #[test]
    fn revoked_ids_are_remembered_up_to_the_token_bound() {
        let mut s = ClusterState::new();
        for i in 0..TOKENS_MAX as u64 + 5 {
            let id = format!("{i:016x}");
            s.tokens.insert(id.clone(), record("alice"));
            let out = s.apply(&Command { skipped_ms: 0, now_ms: 10 + i as i64, op: Op::RevokeToken { id } });
            assert_eq!(out, Outcome::TokensChanged);
        }
        assert_eq!(s.revoked_tokens.len(), TOKENS_MAX);
        assert!(!s.revoked_tokens.contains_key(&format!("{:016x}", 4)), "the oldest is forgotten first");
        assert!(s.revoked_tokens.contains_key(&format!("{:016x}", 5)));
    }

    #[test]
    fn malformed_tokens_change_nothing() {
        let mut s = ClusterState::new();
        let before = s.clone();
        for (id, rec) in [
            ("short", record("alice")),
            ("0123456789ABCDEF", record("alice")),
            ("0123456789abcdef", record("bad user")),
            ("0123456789abcdef", TokenRecord { secret_sha256: "xyz".into(), ..record("alice") }),
            ("0123456789abcdef", TokenRecord { description: "d".repeat(300), ..record("alice") }),
        ] {
            let out = apply(&mut s, Op::CreateToken { id: id.into(), record: rec });
            assert!(matches!(out, Outcome::Rejected(Rejection::Invalid(_))), "{out:?}");
        }
        assert_eq!(s.tokens, before.tokens);
    }

    #[test]
    fn roles_are_ordered_and_expiry_is_exclusive() {
        assert!(Role::Admin > Role::Operator && Role::Operator > Role::User);
        assert_eq!(Role::parse("operator"), Some(Role::Operator));
        assert_eq!(Role::parse("root"), None);
        let r = TokenRecord { expires_ms: Some(100), ..record("a") };
        assert!(r.live_at(99) && !r.live_at(100));
    }
}

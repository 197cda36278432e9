//! Who is calling, and what they may do.
//!
//! Every request carries `authorization: Bearer <credential>`:
//! - users and scripts: an API token `kairos_<id>_<secret>` issued by an admin (its hash lives in
//!   the replicated state), or the bootstrap admin token from the controller's own file;
//! - agents: the join token to register, then the node credential the answer hands them
//!   (derived from the cluster secret for that node name, so every replica checks it);
//! - peers: see `kairos_consensus::service`.
//!
//! An admin may act as another user (`kairos-user` header, like `kubectl --as`): the call then
//! has that user's name and the user role. Tokens are compared in constant time and never
//! logged.

use kairos_consensus::auth::{bearer, ct_eq, sha256_hex, ClusterKey};
use kairos_scheduler::tokens::{valid_user_name, Role, TOKEN_ID_LEN};
use kairos_scheduler::ClusterState;
use tonic::metadata::MetadataMap;
use tonic::Status;

/// Metadata key an admin sets to act as another user.
pub const ACT_AS_HEADER: &str = "kairos-user";
/// Prefix of issued API tokens.
pub const TOKEN_PREFIX: &str = "kairos_";
/// The name the bootstrap admin token acts under.
pub const BOOTSTRAP_ADMIN: &str = "admin";
/// The token id audit records name for the bootstrap admin token (it has no issued id).
pub const BOOTSTRAP_TOKEN_ID: &str = "bootstrap";

/// An authenticated caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    pub user: String,
    pub role: Role,
    /// The id of the token it presented (`bootstrap`: the bootstrap admin token), for audit.
    pub token_id: String,
}

impl Principal {
    /// `PERMISSION_DENIED` unless the caller has at least `role`.
    pub fn require(&self, role: Role, what: &str) -> Result<(), Status> {
        if self.role >= role {
            Ok(())
        } else {
            Err(Status::permission_denied(format!(
                "{what} needs the {} role; \"{}\" has the {} role",
                role.as_str(),
                self.user,
                self.role.as_str()
            )))
        }
    }

    /// Whether the caller may see and act on a job of `owner`.
    pub fn owns_or_operates(&self, owner: &str) -> bool {
        self.role >= Role::Operator || self.user == owner
    }

    /// `PERMISSION_DENIED` unless the caller may act on job `id` of `owner`.
    pub fn check_job(&self, id: u64, owner: &str) -> Result<(), Status> {
        if self.owns_or_operates(owner) {
            Ok(())
        } else {
            Err(Status::permission_denied(format!("job {id} belongs to another user")))
        }
    }
}

/// The credentials a controller accepts besides the issued tokens.
#[derive(Clone, Debug)]
pub struct Auth {
    pub key: ClusterKey,
    admin_sha256: String,
    join_sha256: String,
}

fn unauthenticated(what: &str) -> Status {
    Status::unauthenticated(format!(
        "{what}: pass a token (`kairos --token-file FILE`, KAIROS_TOKEN or ~/.config/kairos/token)"
    ))
}

impl Auth {
    pub fn new(key: ClusterKey, admin_token: &str, join_token: &str) -> Auth {
        Auth { key, admin_sha256: sha256_hex(admin_token), join_sha256: sha256_hex(join_token) }
    }

    /// The user behind a request to the job or admin service. `issued` settles a token issued
    /// through the replicated state (only called for a token that is not the bootstrap admin's,
    /// so the common admin path takes no state lock).
    pub fn principal(
        &self,
        metadata: &MetadataMap,
        issued: impl FnOnce(&str) -> Result<Principal, Status>,
    ) -> Result<Principal, Status> {
        let token = bearer(metadata).ok_or_else(|| unauthenticated("no token"))?;
        let me = if ct_eq(&sha256_hex(token), &self.admin_sha256) {
            Principal { user: BOOTSTRAP_ADMIN.into(), role: Role::Admin, token_id: BOOTSTRAP_TOKEN_ID.into() }
        } else {
            issued(token)?
        };
        let Some(act_as) = metadata.get(ACT_AS_HEADER) else { return Ok(me) };
        let act_as = act_as
            .to_str()
            .ok()
            .filter(|u| valid_user_name(u))
            .ok_or_else(|| Status::invalid_argument("kairos-user: 1-64 characters of [A-Za-z0-9._-]"))?;
        if act_as == me.user {
            Ok(me)
        } else if me.role == Role::Admin {
            Ok(Principal { user: act_as.to_string(), role: Role::User, token_id: me.token_id })
        } else {
            Err(Status::permission_denied(format!(
                "acting as another user (\"{act_as}\") needs the admin role"
            )))
        }
    }

    /// An agent registering node `node`, whose current registration (if any) has `epoch`:
    /// with that registration's node credential (answers `Some(epoch)`), or with the join token
    /// (answers `None`; the state machine then admits only a name nobody holds).
    pub fn check_join(
        &self,
        metadata: &MetadataMap,
        node: &str,
        epoch: Option<u64>,
    ) -> Result<Option<u64>, Status> {
        let cred = bearer(metadata)
            .ok_or_else(|| Status::unauthenticated("register: no join token (agent --join-token-file)"))?;
        if let Some(e) = epoch.filter(|e| ct_eq(cred, &self.key.node_credential(node, *e))) {
            Ok(Some(e))
        } else if ct_eq(&sha256_hex(cred), &self.join_sha256) {
            Ok(None)
        } else {
            Err(Status::unauthenticated(format!(
                "register: invalid join token (nor the credential of node \"{}\")",
                node.chars().take(64).collect::<String>()
            )))
        }
    }

    /// An agent's call about node `node`, registered with `epoch`: only that registration's
    /// credential is accepted.
    pub fn check_node(&self, metadata: &MetadataMap, node: &str, epoch: Option<u64>) -> Result<(), Status> {
        match (bearer(metadata), epoch) {
            (Some(c), Some(e)) if ct_eq(c, &self.key.node_credential(node, e)) => Ok(()),
            (Some(_), _) => Err(Status::unauthenticated(format!(
                "no valid credential for node \"{}\" (register again)",
                node.chars().take(64).collect::<String>()
            ))),
            (None, _) => Err(Status::unauthenticated("no node credential (register first)")),
        }
    }
}

/// The check the agent service makes from the headers alone: the join token, or something
/// shaped like a node credential (which node it must be for is known only from the body).
pub fn agent_gate(
    auth: std::sync::Arc<Auth>,
) -> impl FnMut(tonic::Request<()>) -> Result<tonic::Request<()>, Status> + Clone {
    move |request: tonic::Request<()>| {
        let plausible = bearer(request.metadata())
            .is_some_and(|c| c.starts_with("node.") || ct_eq(&sha256_hex(c), &auth.join_sha256));
        if plausible {
            Ok(request)
        } else {
            Err(Status::unauthenticated("invalid join token or node credential"))
        }
    }
}

/// The answer to a token the state does not accept.
pub fn token_refused() -> Status {
    unauthenticated("invalid, expired or revoked token")
}

/// Splits `kairos_<id>_<secret>`.
pub fn split_token(token: &str) -> Option<(&str, &str)> {
    let rest = token.strip_prefix(TOKEN_PREFIX)?;
    let (id, secret) = rest.split_once('_')?;
    (id.len() == TOKEN_ID_LEN && !secret.is_empty()).then_some((id, secret))
}

/// Whether a token `state` does not accept might still be accepted by the leader: one whose id
/// is not known here yet (created a moment ago), or a live-looking one this replica's clock
/// calls expired. A malformed token, a wrong secret for a known id, or a revoked id never
/// becomes valid: a follower refuses those itself instead of relaying them.
pub fn leader_may_accept(token: &str, state: &ClusterState) -> bool {
    let Some((id, secret)) = split_token(token) else { return false };
    if state.revoked_tokens.contains_key(id) {
        return false;
    }
    match state.tokens.get(id) {
        None => true,
        Some(rec) => ct_eq(&sha256_hex(secret), &rec.secret_sha256),
    }
}

/// The principal of an issued token `kairos_<id>_<secret>` in `state`, if it is valid at
/// `now_ms` — the serving replica's wall clock, or the state's clock if that is ahead: the
/// state's clock moves only with writes, so on an idle cluster it would never reach an expiry.
pub fn issued_token(token: &str, state: &ClusterState, now_ms: i64) -> Option<Principal> {
    let (id, secret) = split_token(token)?;
    let rec = state.tokens.get(id)?;
    (ct_eq(&sha256_hex(secret), &rec.secret_sha256) && rec.live_at(now_ms.max(state.now_ms)))
        .then(|| Principal { user: rec.user.clone(), role: rec.role, token_id: id.to_string() })
}

#[cfg(test)]
mod tests {
    use kairos_consensus::auth::set_bearer;
    use kairos_scheduler::tokens::TokenRecord;

    use super::*;

    fn auth() -> Auth {
        Auth::new(ClusterKey::new(&"s".repeat(32)), "boot-admin", "join-me")
    }

    fn md(token: Option<&str>, act_as: Option<&str>) -> MetadataMap {
        let mut m = MetadataMap::new();
        if let Some(t) = token {
            set_bearer(&mut m, t);
        }
        if let Some(u) = act_as {
            m.insert(ACT_AS_HEADER, u.parse().unwrap());
        }
        m
    }

    fn state_with(id: &str, secret: &str, user: &str, role: Role, expires_ms: Option<i64>) -> ClusterState {
        let mut s = ClusterState::new();
        s.now_ms = 1000;
        s.tokens.insert(
            id.into(),
            TokenRecord {
                user: user.into(),
                role,
                secret_sha256: sha256_hex(secret),
                created_ms: 0,
                created_by: "admin".into(),
                expires_ms,
                description: String::new(),
            },
        );
        s
    }

    #[test]
    fn a_follower_relays_only_tokens_the_leader_could_accept() {
        let id = "00112233aabbccdd";
        let mut s = state_with(id, "sekrit", "alice", Role::User, Some(500));
        // Not known here yet: perhaps created a moment ago.
        assert!(leader_may_accept("kairos_99112233aabbccdd_new", &s));
        // Expired by this replica's reckoning: the leader's clock settles it.
        assert!(leader_may_accept(&format!("kairos_{id}_sekrit"), &s));
        // Never valid anywhere: malformed, a wrong secret for a known id, a revoked id.
        for bad in ["garbage", "kairos_x_y", "kairos_00112233aabbccdd_wrong", &"k".repeat(4000)] {
            assert!(!leader_may_accept(bad, &s), "{bad}");
        }
        s.revoked_tokens.insert("77112233aabbccdd".into(), 1);
        assert!(!leader_may_accept("kairos_77112233aabbccdd_any", &s));
    }

    #[test]
    fn tokens_authenticate_their_user_and_role() {
        let a = auth();
        let id = "00112233aabbccdd";
        let s = state_with(id, "sekrit", "alice", Role::User, None);
        let alice = a
            .principal(&md(Some(&format!("kairos_{id}_sekrit")), None), |t| {
                issued_token(t, &s, 0).ok_or_else(token_refused)
            })
            .unwrap();
        assert_eq!(alice, Principal { user: "alice".into(), role: Role::User, token_id: id.into() });
        let admin = a
            .principal(&md(Some("boot-admin"), None), |t| issued_token(t, &s, 0).ok_or_else(token_refused))
            .unwrap();
        assert_eq!(admin.role, Role::Admin);
        for bad in [None, Some("boot-admin2"), Some("kairos_00112233aabbccdd_wrong"), Some("kairos_x_y")] {
            let e = a
                .principal(&md(bad, None), |t| issued_token(t, &s, 0).ok_or_else(token_refused))
                .unwrap_err();
            assert_eq!(e.code(), tonic::Code::Unauthenticated, "{bad:?}");
            assert!(!e.message().contains("sekrit") && !e.message().contains("boot-admin"));
        }
        let expired = state_with(id, "sekrit", "alice", Role::User, Some(1000));
        let e = a
            .principal(&md(Some(&format!("kairos_{id}_sekrit")), None), |t| {
                issued_token(t, &expired, 0).ok_or_else(token_refused)
            })
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated);
        // Expired by the serving replica's clock, though the state's clock (moved only by
        // writes) has not reached the expiry.
        let later = state_with(id, "sekrit", "alice", Role::User, Some(5000));
        let token = format!("kairos_{id}_sekrit");
        assert!(issued_token(&token, &later, 4999).is_some());
        assert!(issued_token(&token, &later, 5000).is_none());
    }

    #[test]
    fn only_admins_act_as_others_and_then_only_as_users() {
        let a = auth();
        let id = "00112233aabbccdd";
        let s = state_with(id, "sekrit", "alice", Role::Operator, None);
        let as_bob = a
            .principal(&md(Some("boot-admin"), Some("bob")), |t| {
                issued_token(t, &s, 0).ok_or_else(token_refused)
            })
            .unwrap();
        assert_eq!(
            as_bob,
            Principal { user: "bob".into(), role: Role::User, token_id: BOOTSTRAP_TOKEN_ID.into() }
        );
        let alice = format!("kairos_{id}_sekrit");
        let e = a
            .principal(&md(Some(&alice), Some("bob")), |t| issued_token(t, &s, 0).ok_or_else(token_refused))
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        assert_eq!(
            a.principal(&md(Some(&alice), Some("alice")), |t| issued_token(t, &s, 0)
                .ok_or_else(token_refused))
                .unwrap()
                .role,
            Role::Operator
        );
        let e = a
            .principal(&md(Some("boot-admin"), Some("bad user")), |t| {
                issued_token(t, &s, 0).ok_or_else(token_refused)
            })
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
    }

    #[test]
    fn roles_gate_and_jobs_belong_to_their_owner() {
        let user = Principal { user: "alice".into(), role: Role::User, token_id: String::new() };
        assert_eq!(
            user.require(Role::Admin, "changing QoS").unwrap_err().code(),
            tonic::Code::PermissionDenied
        );
        assert!(user.check_job(1, "alice").is_ok());
        assert_eq!(user.check_job(1, "bob").unwrap_err().code(), tonic::Code::PermissionDenied);
        let op = Principal { user: "ops".into(), role: Role::Operator, token_id: String::new() };
        assert!(op.check_job(1, "bob").is_ok() && op.require(Role::Admin, "x").is_err());
    }

    proptest::proptest! {
        /// Whatever a caller puts in the credential and act-as headers, authentication answers
        /// with a principal only for a real credential, and otherwise with a clean status.
        #[test]
        fn any_header_authenticates_or_is_refused_cleanly(
            token in "[ -~]{0,80}",
            act_as in proptest::option::of("[ -~]{0,70}"),
            node in "[ -~]{0,20}",
        ) {
            let a = auth();
            let s = state_with("00112233aabbccdd", "sekrit", "alice", Role::User, None);
            let mut m = MetadataMap::new();
            if let Ok(v) = format!("Bearer {token}").parse() {
                m.insert(kairos_proto::wire::AUTH_HEADER, v);
            }
            if let Some(u) = act_as.as_deref().and_then(|u| u.parse().ok()) {
                m.insert(ACT_AS_HEADER, u);
            }
            match a.principal(&m, |t| issued_token(t, &s, 0).ok_or_else(token_refused)) {
                Ok(p) => proptest::prop_assert!(
                    token.trim() == "boot-admin" || token.trim() == "kairos_00112233aabbccdd_sekrit",
                    "{p:?} from {token:?}"
                ),
                Err(e) => proptest::prop_assert!(matches!(
                    e.code(),
                    tonic::Code::Unauthenticated | tonic::Code::InvalidArgument | tonic::Code::PermissionDenied
                )),
            }
            if let Err(e) = a.check_node(&m, &node, Some(1)) {
                proptest::prop_assert_eq!(e.code(), tonic::Code::Unauthenticated);
            }
            if a.check_join(&m, &node, Some(1)).is_ok() {
                proptest::prop_assert!(token.trim() == "join-me" || token.trim() == a.key.node_credential(&node, 1));
            }
        }
    }

    #[test]
    fn the_agent_gate_passes_only_join_tokens_and_node_shaped_credentials() {
        let mut gate = agent_gate(std::sync::Arc::new(auth()));
        let req = |t: Option<&str>| {
            let mut r = tonic::Request::new(());
            *r.metadata_mut() = md(t, None);
            r
        };
        assert!(gate(req(Some("join-me"))).is_ok());
        assert!(gate(req(Some(&auth().key.node_credential("n1", 1)))).is_ok());
        for bad in [None, Some("join-you"), Some("boot-admin"), Some("kairos_00112233aabbccdd_x")] {
            assert_eq!(gate(req(bad)).unwrap_err().code(), tonic::Code::Unauthenticated, "{bad:?}");
        }
    }

    #[test]
    fn agents_join_with_the_join_token_then_use_their_node_credential() {
        let a = auth();
        assert_eq!(a.check_join(&md(Some("join-me"), None), "n1", None).unwrap(), None);
        assert_eq!(a.check_join(&md(Some("join-me"), None), "n1", Some(3)).unwrap(), None);
        let n1 = a.key.node_credential("n1", 3);
        assert_eq!(a.check_join(&md(Some(&n1), None), "n1", Some(3)).unwrap(), Some(3));
        // A credential of an earlier registration, or of no registration, registers nothing.
        for epoch in [None, Some(4)] {
            let e = a.check_join(&md(Some(&n1), None), "n1", epoch).unwrap_err();
            assert_eq!(e.code(), tonic::Code::Unauthenticated);
        }
        for bad in [None, Some("join-you"), Some("boot-admin")] {
            assert_eq!(
                a.check_join(&md(bad, None), "n1", Some(3)).unwrap_err().code(),
                tonic::Code::Unauthenticated
            );
        }
        assert!(a.check_node(&md(Some(&n1), None), "n1", Some(3)).is_ok());
        for (node, epoch) in [("n2", Some(3)), ("n1", Some(4)), ("n1", None)] {
            let e = a.check_node(&md(Some(&n1), None), node, epoch).unwrap_err();
            assert_eq!(e.code(), tonic::Code::Unauthenticated);
        }
        assert!(a.check_node(&md(Some("join-me"), None), "n1", Some(3)).is_err());
    }
}

//! The agent's credentials: the join token it registers with the first time, and the node
//! credential the controller hands back, which it presents on every later call (re-registering
//! after a restart included) and which the log service checks on every request.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use kairos_proto::v1 as pb;

/// The node credential, shared with the log service (which checks callers against it).
pub type SharedCredential = Arc<RwLock<Option<String>>>;

/// What the agent presents. The node credential is kept in an owner-only file of the state
/// directory (`node.credential`): the join token registers only a name nobody holds, so a
/// restarted agent needs it.
#[derive(Clone, Default)]
pub struct Credentials {
    join: Option<Arc<str>>,
    node: SharedCredential,
    file: Option<PathBuf>,
    prefer_join: Arc<AtomicBool>,
}

impl Credentials {
    /// Credentials kept in memory only (the simulation's agents; tests).
    pub fn in_memory(join: Option<Arc<str>>) -> Credentials {
        Credentials { join, ..Credentials::default() }
    }

    /// The credential a previous run of this agent kept in `file`, if any.
    pub fn load(join: Option<Arc<str>>, file: PathBuf) -> Credentials {
        let node = kairos_proto::wire::read_credential_file(&file).ok();
        Credentials { join, node: Arc::new(RwLock::new(node)), file: Some(file), prefer_join: Arc::default() }
    }

    /// The node credential, if the agent has one.
    pub fn node(&self) -> Option<String> {
        self.node.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The node credential as the log service checks it (it changes with each registration).
    pub fn shared_node(&self) -> SharedCredential {
        self.node.clone()
    }

    /// A registration presenting `credential` was taken: it is kept (in memory and in the file)
    /// and the next registration presents it.
    pub fn taken(&self, credential: String) {
        self.prefer_join.store(false, Ordering::SeqCst);
        if self.node().as_deref() == Some(credential.as_str()) {
            return;
        }
        if let Some(file) = &self.file {
            // A missing file is what `write_private_new` needs; another error shows there.
            let _ = std::fs::remove_file(file);
            if let Err(e) = kairos_proto::wire::write_private_new(file, &credential) {
                tracing::warn!(error = %e.0, "cannot keep the node credential; a restart will need the name freed");
            }
        }
        *self.node.write().unwrap_or_else(|p| p.into_inner()) = Some(credential);
    }

    /// A registration with the join token (`with_join`) or the node credential was refused.
    /// A refusal is not proof: a just-elected leader may not have applied this node's
    /// registration yet. So the credential is kept (in memory and on disk) and the next
    /// registration tries the join token instead, the one after that the credential again,
    /// until one is taken; only a new registration replaces it.
    pub fn refused(&self, with_join: bool) {
        self.prefer_join.store(!with_join && self.join.is_some(), Ordering::SeqCst);
    }

    /// Whether the next registration presents the join token rather than the node credential.
    pub fn registers_with_join(&self) -> bool {
        self.node().is_none() || self.prefer_join.load(Ordering::SeqCst)
    }

    /// What the next registration presents (`registers_with_join`) — the credential is read
    /// once, so a concurrent `taken` cannot make the two disagree.
    pub fn presented(&self) -> (bool, Option<String>) {
        let node = self.node();
        let with_join = node.is_none() || self.prefer_join.load(Ordering::SeqCst);
        (with_join, if with_join { self.join.as_deref().map(str::to_string) } else { node })
    }

    /// `msg` with this node's credential (the join token before registration).
    pub fn request<T>(&self, msg: T) -> tonic::Request<T> {
        let mut req = tonic::Request::new(msg);
        if let Some(c) = self.node().as_deref().or(self.join.as_deref()) {
            kairos_proto::wire::set_bearer(req.metadata_mut(), c);
        }
        req
    }

    /// A registration request presenting `presented`.
    pub fn register_request(
        presented: Option<&str>,
        msg: pb::RegisterRequest,
    ) -> tonic::Request<pb::RegisterRequest> {
        let mut req = tonic::Request::new(msg);
        if let Some(c) = presented {
            kairos_proto::wire::set_bearer(req.metadata_mut(), c);
        }
        req
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const JOIN: &str = "join-token-0123456789";
    const NODE: &str = "node.0123456789abcdef0123";

    fn bearer<T>(req: &tonic::Request<T>) -> Option<String> {
        req.metadata().get("authorization").and_then(|v| v.to_str().ok()).map(str::to_string)
    }

    #[test]
    fn a_refused_credential_is_kept_and_alternates_with_the_join_token() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("node.credential");
        let creds = Credentials::load(Some(Arc::from(JOIN)), file.clone());
        assert!(creds.registers_with_join(), "no credential yet: the join token");
        creds.taken(NODE.into());
        assert!(!creds.registers_with_join());
        // A just-elected leader refuses the credential: the join token next, then the
        // credential again; the credential is never thrown away.
        creds.refused(false);
        assert!(creds.registers_with_join());
        assert_eq!(creds.presented(), (true, Some(JOIN.to_string())));
        creds.refused(true);
        assert!(!creds.registers_with_join());
        assert_eq!(creds.presented(), (false, Some(NODE.to_string())));
        assert!(file.exists());
        let reloaded = Credentials::load(None, file);
        assert_eq!(reloaded.node().as_deref(), Some(NODE));
    }

    #[test]
    fn without_a_join_token_a_refused_credential_is_presented_again() {
        let creds = Credentials::in_memory(None);
        creds.taken(NODE.into());
        creds.refused(false);
        assert!(!creds.registers_with_join(), "there is no join token to fall back on");
        assert_eq!(creds.presented(), (false, Some(NODE.to_string())));
    }

    #[test]
    fn a_taken_registration_ends_the_preference_for_the_join_token_and_replaces_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("node.credential");
        let creds = Credentials::load(Some(Arc::from(JOIN)), file.clone());
        creds.taken(NODE.into());
        creds.refused(false);
        assert!(creds.registers_with_join());
        creds.taken("node.fedcba9876543210fedc".into());
        assert!(!creds.registers_with_join());
        let reloaded = Credentials::load(None, file.clone());
        assert_eq!(reloaded.node().as_deref(), Some("node.fedcba9876543210fedc"));
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o077, 0, "owner-only");
    }

    #[test]
    fn calls_present_the_node_credential_once_there_is_one_else_the_join_token() {
        let creds = Credentials::in_memory(Some(Arc::from(JOIN)));
        let shared = creds.shared_node();
        assert_eq!(bearer(&creds.request(())).as_deref(), Some(format!("Bearer {JOIN}").as_str()));
        creds.taken(NODE.into());
        assert_eq!(bearer(&creds.request(())).as_deref(), Some(format!("Bearer {NODE}").as_str()));
        assert_eq!(shared.read().unwrap().as_deref(), Some(NODE), "the log service sees it");
        let none = Credentials::register_request(None, pb::RegisterRequest::default());
        assert_eq!(bearer(&none), None);
    }
}

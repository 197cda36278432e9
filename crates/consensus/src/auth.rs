//! The cluster secret and the credentials derived from it, plus the hashing and comparison
//! every bearer credential goes through.
//!
//! All controllers of a cluster share one secret file. From it each derives, with HMAC-SHA256
//! and a purpose string, the credential a replica presents to its peers (`raft:<id>`) and the
//! credential of each node (`node:<name>`), so any replica verifies them after a failover
//! without storing anything. Comparisons are constant-time.

use std::path::Path;
use std::sync::Arc;

use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

/// Shortest cluster secret accepted (bytes of the file, trimmed).
pub const SECRET_LEN_MIN: usize = 32;
pub use kairos_proto::wire::{bearer, ct_eq, read_credential, set_bearer, write_private_new};

#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("{0}")]
    File(String),
    #[error("no random source: {0}")]
    Random(String),
}

/// `n` random bytes from the OS, as lower-case hex.
pub fn random_hex(n: usize) -> Result<String, SecretError> {
    let mut buf = vec![0u8; n];
    getrandom::fill(&mut buf).map_err(|e| SecretError::Random(e.to_string()))?;
    Ok(hex::encode(buf))
}

/// Lower-case hex SHA-256 of `s`.
pub fn sha256_hex(s: &str) -> String {
    sha256_hex_bytes(s.as_bytes())
}

/// SHA-256 of `bytes`, hex.
pub fn sha256_hex_bytes(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The cluster secret. Cheap to clone; never printed.
#[derive(Clone)]
pub struct ClusterKey(Arc<Vec<u8>>);

impl std::fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterKey(…)")
    }
}

impl ClusterKey {
    pub fn new(secret: &str) -> ClusterKey {
        ClusterKey(Arc::new(secret.as_bytes().to_vec()))
    }

    /// Loads the secret file; with `create`, a missing file is first created with a fresh
    /// random secret (owner-only permissions).
    pub fn load(path: &Path, create: bool) -> Result<ClusterKey, SecretError> {
        let file = |e: kairos_proto::wire::WireError| SecretError::File(e.0);
        if create && !path.exists() {
            write_private_new(path, &random_hex(32)?).map_err(file)?;
        }
        Ok(ClusterKey::new(&read_credential(path, SECRET_LEN_MIN).map_err(file)?))
    }

    /// The credential for `purpose` (hex HMAC-SHA256 of the purpose under the secret).
    pub fn derive(&self, purpose: &str) -> String {
        // HMAC takes a key of any length; this cannot fail.
        let mut mac = match <Hmac<Sha256> as KeyInit>::new_from_slice(&self.0) {
            Ok(m) => m,
            Err(_) => unreachable!("HMAC accepts keys of any length"),
        };
        mac.update(purpose.as_bytes());
        hex::encode(mac.finalize().into_bytes())
    }

    /// The hex HMAC-SHA256 of `data` under a key derived for `purpose` (a backup's seal).
    pub fn mac(&self, purpose: &str, data: &[u8]) -> String {
        let key = self.derive(purpose);
        let mut mac = match <Hmac<Sha256> as KeyInit>::new_from_slice(key.as_bytes()) {
            Ok(m) => m,
            Err(_) => unreachable!("HMAC accepts keys of any length"),
        };
        mac.update(data);
        hex::encode(mac.finalize().into_bytes())
    }

    /// Whether `presented` is the credential for `purpose`.
    pub fn verify(&self, purpose: &str, presented: &str) -> bool {
        ct_eq(&self.derive(purpose), presented)
    }

    /// What replica `id` presents to its peers.
    pub fn peer_credential(&self, id: crate::types::ReplicaId) -> String {
        self.derive(&format!("raft:{id}"))
    }

    /// What the agent of node `name`, registration `epoch` (`Node::epoch`), presents to
    /// controllers (and controllers to its log service). A new registration of the name after
    /// `kairos node remove` has a new epoch, so credentials issued before are void.
    pub fn node_credential(&self, name: &str, epoch: u64) -> String {
        format!("node.{}", self.derive(&format!("node:{name}:{epoch}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_credentials_differ_by_purpose_and_secret() {
        let a = ClusterKey::new(&"a".repeat(32));
        let b = ClusterKey::new(&"b".repeat(32));
        assert_eq!(a.derive("raft:1"), a.derive("raft:1"));
        assert_ne!(a.derive("raft:1"), a.derive("raft:2"));
        assert_ne!(a.derive("raft:1"), b.derive("raft:1"));
        assert!(a.verify("raft:1", &a.peer_credential(1)));
        assert!(!a.verify("raft:2", &a.peer_credential(1)));
        assert!(!b.verify("raft:1", &a.peer_credential(1)));
        assert_ne!(a.node_credential("n1", 1), a.node_credential("n2", 1));
        assert_ne!(a.node_credential("n1", 1), a.node_credential("n1", 2));
        assert!(!format!("{a:?}").contains("aaaa"));
    }

    #[test]
    fn secret_files_are_created_private_and_validated() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cluster.secret");
        assert!(
            matches!(ClusterKey::load(&path, false), Err(SecretError::File(m)) if m.contains("No such file"))
        );
        let k1 = ClusterKey::load(&path, true).unwrap();
        let k2 = ClusterKey::load(&path, true).unwrap();
        assert_eq!(k1.derive("x"), k2.derive("x"), "an existing secret is kept");
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        std::fs::write(&path, "short\n").unwrap();
        assert!(
            matches!(ClusterKey::load(&path, true), Err(SecretError::File(m)) if m.contains("printable"))
        );
        std::fs::write(&path, format!("{}\u{7}\n", "x".repeat(40))).unwrap();
        assert!(
            matches!(ClusterKey::load(&path, true), Err(SecretError::File(m)) if m.contains("printable"))
        );
    }

    #[test]
    fn hashing_comparison_and_randomness() {
        assert!(ct_eq("abc", "abc") && !ct_eq("abc", "abd") && !ct_eq("abc", "ab"));
        assert_eq!(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        let (a, b) = (random_hex(16).unwrap(), random_hex(16).unwrap());
        assert!(a.len() == 32 && a != b);
    }
}

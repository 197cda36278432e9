//! Backups: a consistent copy of the replicated state in one file, and a new cluster started
//! from it.
//!
//! The file is one JSON line of metadata (`BackupHeader`: format, the log index and term the
//! state was applied at, when it was taken, its length, SHA-256 and seal) followed by the state
//! in the snapshot encoding. The seal is an HMAC-SHA256 of the header's fields and the state
//! under a key derived from the cluster secret: a backup edited by anyone without the secret (a
//! planted admin token, a phantom allocation) is refused, and so is one whose state fails the
//! state's own invariants (`ClusterState::check_invariants`). A damaged, truncated, forged or
//! inconsistent file is refused before anything is written.
//!
//! Restoring seeds an empty replica's storage as if the cluster's first entry (index 0, the
//! membership entry `initialize` writes) had been applied onto the backed-up state and compacted
//! into a snapshot: the snapshot holds the state and the new membership, the log is purged
//! through index 0. That replica then counts as initialised and stands for election; the other
//! (empty) replicas need index 0, which only the snapshot covers, so each receives the restored
//! state as a snapshot — as does any replica added later. No entry of the old cluster's log is
//! replayed.

use std::collections::BTreeMap;
use std::path::Path;

use kairos_scheduler::ClusterState;
use openraft::{BasicNode, LogId};
use serde::{Deserialize, Serialize};

use crate::auth::ClusterKey;
use crate::types::{ConsensusError, NodeId, ReplicaId};

/// Format of the backup file's first line (2: sealed with the cluster secret).
pub const BACKUP_FORMAT: u32 = 2;
/// What a backup's seal is derived for.
const SEAL_PURPOSE: &str = "backup";
/// Written into a data directory seeded from a backup: the backup's SHA-256.
const RESTORED_MARKER: &str = "restored-from.sha256";

/// What a backup file says about itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupHeader {
    pub kairos_backup: u32,
    /// The log index and term the state was applied at.
    pub applied_index: u64,
    pub applied_term: u64,
    /// When it was taken (Unix ms, the leader's clock).
    pub taken_at_ms: i64,
    /// Length and SHA-256 (hex) of the state bytes after the header line.
    pub bytes: u64,
    pub sha256: String,
    /// HMAC-SHA256 (hex) of the fields above and the state, under the cluster secret.
    pub seal: String,
}

/// What a backup's seal covers: every header field and the state bytes.
fn sealed(header: &BackupHeader, data: &[u8]) -> Vec<u8> {
    let mut covered = format!(
        "kairos-backup:{}:{}:{}:{}:{}:{}\n",
        header.kairos_backup,
        header.applied_index,
        header.applied_term,
        header.taken_at_ms,
        header.bytes,
        header.sha256
    )
    .into_bytes();
    covered.extend_from_slice(data);
    covered
}

/// The backup file of `state`, applied at `applied` (`None`: nothing applied yet), sealed
/// with `key`.
pub fn encode(
    state: &ClusterState,
    applied: Option<LogId<NodeId>>,
    taken_at_ms: i64,
    key: &ClusterKey,
) -> Result<Vec<u8>, ConsensusError> {
    let data = crate::store::encode_snapshot(state)?;
    let mut header = BackupHeader {
        kairos_backup: BACKUP_FORMAT,
        applied_index: applied.map_or(0, |l| l.index),
        applied_term: applied.map_or(0, |l| l.leader_id.term),
        taken_at_ms,
        bytes: data.len() as u64,
        sha256: crate::auth::sha256_hex_bytes(&data),
        seal: String::new(),
    };
    header.seal = key.mac(SEAL_PURPOSE, &sealed(&header, &data));
    let mut out = serde_json::to_vec(&header)?;
    out.push(b'\n');
    out.extend_from_slice(&data);
    Ok(out)
}

/// The header and state of a backup file; a file that is not one, is truncated or damaged, of
/// another format, not sealed with `key`, or whose state fails its invariants is refused.
pub fn decode(bytes: &[u8], key: &ClusterKey) -> Result<(BackupHeader, ClusterState), ConsensusError> {
    let bad = |why: String| ConsensusError::Format(format!("not a usable kairos backup: {why}"));
    let split = bytes.iter().position(|b| *b == b'\n').ok_or_else(|| bad("no header line".into()))?;
    let header: BackupHeader =
        serde_json::from_slice(&bytes[..split]).map_err(|e| bad(format!("header: {e}")))?;
    if header.kairos_backup != BACKUP_FORMAT {
        return Err(bad(format!(
            "format {} (this kairosd reads {BACKUP_FORMAT}, backups sealed with the cluster secret; take a new one with `kairos cluster snapshot save`)",
            header.kairos_backup
        )));
    }
    let data = &bytes[split + 1..];
    if data.len() as u64 != header.bytes {
        return Err(bad(format!(
            "{} bytes of state where the header says {} (truncated?)",
            data.len(),
            header.bytes
        )));
    }
    if crate::auth::sha256_hex_bytes(data) != header.sha256 {
        return Err(bad("its SHA-256 does not match the header (damaged)".into()));
    }
    let seal = key.mac(SEAL_PURPOSE, &sealed(&header, data));
    if !kairos_proto::wire::ct_eq(&seal, &header.seal) {
        return Err(bad(
            "its seal does not match: it was edited, or taken by a cluster with another secret (--cluster-secret-file)".into(),
        ));
    }
    let state = crate::store::decode_snapshot(data).map_err(|e| bad(e.to_string()))?;
    state.check_invariants().map_err(|why| bad(format!("its state fails its checks: {why}")))?;
    Ok((header, state))
}

/// Prepares `data_dir` to start the first replica of a new cluster of `members` from the backup
/// `bytes` (see the module's description). Returns the header, and `false` when the directory
/// was already seeded from this same backup (a restart: nothing is changed). Refuses a directory
/// holding other data.
pub fn seed(
    data_dir: &Path,
    members: &BTreeMap<ReplicaId, String>,
    bytes: &[u8],
    key: &ClusterKey,
) -> Result<(BackupHeader, bool), ConsensusError> {
    let (header, state) = decode(bytes, key)?;
    let marker = data_dir.join(RESTORED_MARKER);
    match std::fs::read_to_string(&marker) {
        Ok(seeded) if seeded.trim() == header.sha256 => return Ok((header, false)),
        Ok(_) => {
            return Err(ConsensusError::Format(format!(
                "{} was restored from another backup; restore into an empty data directory",
                data_dir.display()
            )))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(ConsensusError::Format(format!("reading {}: {e}", marker.display()))),
    }
    if crate::store::holds_data(data_dir) {
        return Err(ConsensusError::Format(format!(
            "{} already holds a replica's data; restore into an empty data directory",
            data_dir.display()
        )));
    }
    std::fs::create_dir_all(data_dir)
        .map_err(|e| ConsensusError::Format(format!("creating {}: {e}", data_dir.display())))?;
    let nodes: BTreeMap<ReplicaId, BasicNode> =
        members.iter().map(|(id, addr)| (*id, BasicNode::new(addr))).collect();
    crate::store::seed(data_dir, nodes, &state)?;
    // Last: a crash before this leaves a directory that a rerun refuses as holding data.
    std::fs::write(&marker, &header.sha256)
        .and_then(|_| std::fs::File::open(data_dir)?.sync_all())
        .map_err(|e| ConsensusError::Format(format!("writing {}: {e}", marker.display())))?;
    Ok((header, true))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ClusterState {
        let mut state = ClusterState::new();
        state.apply(&kairos_scheduler::Command {
            skipped_ms: 0,
            now_ms: 1_000,
            op: kairos_scheduler::Op::Submit {
                spec: kairos_scheduler::JobSpec::new("j", "alice", vec!["true".into()], 1),
                request_id: None,
                hold: true,
                limits: None,
            },
        });
        state
    }

    fn key() -> ClusterKey {
        ClusterKey::new(&"s".repeat(32))
    }

    #[test]
    fn a_backup_round_trips_and_damage_is_refused() {
        let state = sample();
        let bytes = encode(&state, None, 7, &key()).unwrap();
        let (header, back) = decode(&bytes, &key()).unwrap();
        assert_eq!(back, state);
        assert_eq!((header.applied_index, header.taken_at_ms), (0, 7));
        // Truncated, one byte flipped, another format, not a backup at all.
        let mut flipped = bytes.clone();
        let last = flipped.len() - 2;
        flipped[last] ^= 1;
        let other = String::from_utf8(bytes.clone()).unwrap().replacen(
            "\"kairos_backup\":2",
            "\"kairos_backup\":9",
            1,
        );
        for (bad, says) in [
            (&bytes[..bytes.len() - 1], "truncated"),
            (&flipped[..], "damaged"),
            (other.as_bytes(), "format 9"),
            (&b"hello\nworld"[..], "header"),
        ] {
            let e = decode(bad, &key()).unwrap_err().to_string();
            assert!(e.contains(says), "{e}");
        }
    }

    /// `bytes` with its state replaced by `state` and the SHA-256 made to match: what someone
    /// without the cluster secret can make.
    fn edited(bytes: &[u8], state: &ClusterState) -> Vec<u8> {
        let split = bytes.iter().position(|b| *b == b'\n').unwrap();
        let mut header: BackupHeader = serde_json::from_slice(&bytes[..split]).unwrap();
        let data = crate::store::encode_snapshot(state).unwrap();
        header.bytes = data.len() as u64;
        header.sha256 = crate::auth::sha256_hex_bytes(&data);
        let mut out = serde_json::to_vec(&header).unwrap();
        out.push(b'\n');
        out.extend_from_slice(&data);
        out
    }

    #[test]
    fn an_edited_backup_or_one_of_another_secret_is_refused_and_so_is_an_inconsistent_state() {
        let bytes = encode(&sample(), None, 7, &key()).unwrap();
        // A planted user: the digests match, the seal does not.
        let mut planted = sample();
        planted.apply(&kairos_scheduler::Command {
            skipped_ms: 0,
            now_ms: 2_000,
            op: kairos_scheduler::Op::Submit {
                spec: kairos_scheduler::JobSpec::new("planted", "mallory", vec!["true".into()], 1),
                request_id: None,
                hold: true,
                limits: None,
            },
        });
        let e = decode(&edited(&bytes, &planted), &key()).unwrap_err().to_string();
        assert!(e.contains("seal does not match"), "{e}");
        let e = decode(&bytes, &ClusterKey::new(&"t".repeat(32))).unwrap_err().to_string();
        assert!(e.contains("another secret"), "{e}");
        // Sealed with the secret but inconsistent (a job running on no GPU of any node).
        let mut broken = sample();
        if let Some(job) = broken.jobs.values_mut().next() {
            job.state = kairos_scheduler::JobState::Running;
        }
        assert!(broken.check_invariants().is_err());
        let sealed = encode(&broken, None, 7, &key()).unwrap();
        let e = decode(&sealed, &key()).unwrap_err().to_string();
        assert!(e.contains("fails its checks"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let members = BTreeMap::from([(1, "127.0.0.1:1".to_string())]);
        assert!(seed(dir.path(), &members, &sealed, &key()).is_err());
        assert!(!crate::store::holds_data(dir.path()), "a refused backup seeded something");
    }

    #[test]
    fn seeding_refuses_a_directory_with_data_and_is_a_no_op_when_repeated() {
        let dir = tempfile::tempdir().unwrap();
        let members = BTreeMap::from([(1, "127.0.0.1:1".to_string())]);
        let bytes = encode(&sample(), None, 1, &key()).unwrap();
        assert!(seed(dir.path(), &members, &bytes, &key()).unwrap().1, "seeded");
        assert!(
            !seed(dir.path(), &members, &bytes, &key()).unwrap().1,
            "the same backup again: nothing to do"
        );
        let other = encode(&ClusterState::new(), None, 2, &key()).unwrap();
        let e = seed(dir.path(), &members, &other, &key()).unwrap_err().to_string();
        assert!(e.contains("another backup"), "{e}");
        let used = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(used.path().join("raft.sled")).unwrap();
        let e = seed(used.path(), &members, &bytes, &key()).unwrap_err().to_string();
        assert!(e.contains("already holds"), "{e}");
    }
}

//! The consensus vocabulary the rest of the system speaks: replica ids, the log entry
//! (`Request`, a batch of commands) and its outcomes (`Response`), openraft's type config, and
//! the errors of opening storage. No behaviour beyond encoding an entry.

use std::sync::Arc;

use kairos_scheduler::{Command, Outcome};
use openraft::{BasicNode, Raft};
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Raft member identifier. Raft members are *replicas*; GPU machines are *nodes*.
pub type ReplicaId = u64;
pub(crate) type NodeId = ReplicaId;

/// Format version of log entries; a replica stops on an entry of another version.
pub const ENTRY_FORMAT_VERSION: u16 = 1;
/// Format version of snapshots.
pub const SNAPSHOT_FORMAT_VERSION: u32 = 1;

/// One Raft log entry: a batch of commands applied in order. The commands are shared, so the
/// copies openraft and the log's cache keep of an entry cost no deep clone (encoded as a list).
///
/// Its encoding (`{"version":…,"commands":[…]}`) is made once and shared by every copy too: the
/// leader's log, its cache and each follower's append carry those bytes instead of encoding the
/// commands again, and a follower keeps the bytes it received for its own log. Equality is the
/// commands'.
#[derive(Clone, Debug)]
pub struct Request {
    pub version: u16,
    pub commands: Arc<[Command]>,
    json: Arc<std::sync::OnceLock<Box<serde_json::value::RawValue>>>,
}

#[derive(Serialize)]
struct RequestRef<'a> {
    version: u16,
    commands: &'a [Command],
}

#[derive(Deserialize)]
struct RequestOwned {
    version: u16,
    commands: Vec<Command>,
}

impl Request {
    /// An entry of `commands` in the current format.
    pub fn new(commands: Vec<Command>) -> Request {
        Request { version: ENTRY_FORMAT_VERSION, commands: commands.into(), json: Arc::default() }
    }

    /// An entry of `commands` whose encodings (`serde_json::to_vec` of each, in order) the
    /// caller already made, so they are not made again. Encodings that do not fit together (not
    /// one per command, or not JSON) are dropped and the entry is encoded on first use instead.
    pub fn with_encoded(commands: Vec<Command>, encoded: &[Vec<u8>]) -> Request {
        let request = Request::new(commands);
        if encoded.len() != request.commands.len() {
            return request;
        }
        let mut json = format!("{{\"version\":{ENTRY_FORMAT_VERSION},\"commands\":[");
        json.reserve(encoded.iter().map(|e| e.len() + 1).sum::<usize>() + 2);
        for (i, e) in encoded.iter().enumerate() {
            let Ok(e) = std::str::from_utf8(e) else { return request };
            if i > 0 {
                json.push(',');
            }
            json.push_str(e);
        }
        json.push_str("]}");
        let Ok(raw) = serde_json::value::RawValue::from_string(json) else { return request };
        // In debug builds (the tests'), the encodings must be the commands' own.
        debug_assert_eq!(
            Some(raw.get()),
            serde_json::to_string(&RequestRef { version: request.version, commands: &request.commands })
                .ok()
                .as_deref(),
            "encodings are the commands' own"
        );
        let _ = request.json.set(raw);
        request
    }

    /// The entry's encoding, made on first use.
    pub fn json(&self) -> Result<&serde_json::value::RawValue, serde_json::Error> {
        if let Some(raw) = self.json.get() {
            return Ok(raw);
        }
        let raw =
            serde_json::value::to_raw_value(&RequestRef { version: self.version, commands: &self.commands })?;
        Ok(self.json.get_or_init(|| raw))
    }
}

impl PartialEq for Request {
    fn eq(&self, other: &Request) -> bool {
        self.version == other.version && self.commands == other.commands
    }
}

impl Eq for Request {}

impl Serialize for Request {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.json().map_err(serde::ser::Error::custom)?.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Request {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Request, D::Error> {
        let raw = Box::<serde_json::value::RawValue>::deserialize(d)?;
        let owned: RequestOwned = serde_json::from_str(raw.get()).map_err(serde::de::Error::custom)?;
        Ok(Request {
            version: owned.version,
            commands: owned.commands.into(),
            json: Arc::new(std::sync::OnceLock::from(raw)),
        })
    }
}

/// The outcomes of one entry's commands, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Response {
    pub outcomes: Vec<Outcome>,
}

openraft::declare_raft_types!(
    pub TypeConfig:
        D = Request,
        R = Response,
        NodeId = ReplicaId,
        Node = BasicNode,
        SnapshotData = std::io::Cursor<Vec<u8>>,
        AsyncRuntime = crate::runtime::KairosRuntime,
);

pub type KairosRaft = Raft<TypeConfig>;

/// Whether the replica these metrics are of leads a cluster it is a voter of. (A leader that
/// removed itself keeps openraft's leader state for a while; it must not act as leader.)
pub fn leads(m: &openraft::RaftMetrics<ReplicaId, BasicNode>) -> bool {
    m.state == openraft::ServerState::Leader
        && m.current_leader == Some(m.id)
        && m.membership_config.voter_ids().any(|v| v == m.id)
}

#[derive(Debug, Error)]
pub enum ConsensusError {
    #[error("decoding stored data: {0}")]
    Decode(#[from] serde_json::Error),
    #[error("stored data: {0}")]
    Format(String),
    #[error("data directory {0} is in use by another kairosd")]
    DataDirInUse(String),
    #[error(
        "the Raft log in {dir} is damaged and cannot be opened ({why}); this replica's data is lost: \
         move the directory away, start the replica empty with --join and add it back \
         (kairos cluster remove {id}, then kairos cluster add {id} ADDR)"
    )]
    Damaged { dir: String, why: String, id: ReplicaId },
    #[error("raft: {0}")]
    Raft(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn commands() -> Vec<Command> {
        let spec =
            kairos_scheduler::model::JobSpec::new("a \"b\"", "alice", vec!["echo".into(), "ü".into()], 1);
        (1..=3)
            .map(|n| Command {
                skipped_ms: 0,
                now_ms: n,
                op: kairos_scheduler::Op::Submit {
                    spec: spec.clone(),
                    request_id: Some(format!("r-{n}")),
                    hold: false,
                    limits: None,
                },
            })
            .collect()
    }

    #[test]
    fn an_entry_is_encoded_as_its_commands_and_keeps_the_bytes_it_was_decoded_from() {
        let plain = Request::new(commands());
        let bytes = serde_json::to_vec(&plain).unwrap();
        let expected =
            serde_json::to_vec(&RequestRef { version: ENTRY_FORMAT_VERSION, commands: &commands() }).unwrap();
        assert_eq!(bytes, expected, "the stored format is the plain one");
        // Copies share the encoding; a decoded entry equals the original and encodes to the same
        // bytes without encoding its commands again.
        assert!(std::ptr::eq(plain.json().unwrap(), plain.clone().json().unwrap()));
        let back: Request = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(back, plain);
        assert_eq!(back.json().unwrap().get().as_bytes(), &bytes[..]);
        // Inside an openraft entry too (the log's and the append's encoding).
        let entry = openraft::Entry::<TypeConfig> {
            log_id: openraft::LogId::new(openraft::CommittedLeaderId::new(2, 1), 7),
            payload: openraft::EntryPayload::Normal(back),
        };
        let decoded: openraft::Entry<TypeConfig> =
            serde_json::from_slice(&serde_json::to_vec(&entry).unwrap()).unwrap();
        assert_eq!(decoded.payload, openraft::EntryPayload::Normal(plain));
    }

    /// The leader applies an entry's commands and followers its bytes: bytes of other commands
    /// would make them diverge. Only the batcher gives encodings (of the same commands, just
    /// made); debug builds — every test — check them.
    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "encodings are the commands' own")]
    fn encodings_of_other_commands_are_caught_in_debug_builds() {
        let mut others = commands();
        others.reverse();
        let encoded: Vec<Vec<u8>> = others.iter().map(|c| serde_json::to_vec(c).unwrap()).collect();
        let _ = Request::with_encoded(commands(), &encoded);
    }

    #[test]
    fn encodings_given_with_an_entry_are_used_only_when_they_fit_together() {
        let encoded: Vec<Vec<u8>> = commands().iter().map(|c| serde_json::to_vec(c).unwrap()).collect();
        let plain = serde_json::to_vec(&Request::new(commands())).unwrap();
        let made = Request::with_encoded(commands(), &encoded);
        assert_eq!(serde_json::to_vec(&made).unwrap(), plain);
        // One missing, or not text: the entry is encoded from its commands instead.
        for bad in [encoded[..2].to_vec(), vec![vec![0xff], encoded[1].clone(), encoded[2].clone()]] {
            let made = Request::with_encoded(commands(), &bad);
            assert_eq!(serde_json::to_vec(&made).unwrap(), plain);
        }
    }
}

//! Replication of the scheduling core: openraft's type config, the log (a write-ahead log of
//! its own, `wal`) and state machine stores, and the Raft RPCs over tonic.
//!
//! Owns: durability (fsync before acknowledging), snapshots and log compaction, and turning
//! committed entries into `ClusterState::apply` calls. Must not: decide anything. Every
//! command arrives fully formed (time stamped by the leader); this crate only orders and
//! persists commands and applies them.
//!
//! ```text
//!   Replica::write(commands) ─▶ openraft ─▶ LogStore::append (wal: write, fdatasync)
//!                                         ─▶ commit ─▶ StateMachineStore::apply ─▶ ClusterState::apply
//!                                                                            └─▶ applied index (watch)
//! ```
//!
//! Modules: `types` (the vocabulary other crates speak: ids, the entry, the type config,
//! errors), `replica` (a running replica) and `status` (what it reports to operators); beneath
//! them the storage (`store`, `wal`, `fs` for files, `executor` for where blocking work runs),
//! the RPCs (`network`, `service`, `auth`) and the replica's helpers (`freshness`,
//! `peerclock`, `membership`, `failover`, `quorumcheck`, `failstop`, `backup`, `runtime`).

pub mod auth;
pub mod backup;
pub mod executor;
pub mod failover;
pub mod failstop;
pub mod freshness;
pub mod fs;
pub mod membership;
pub mod network;
pub mod peerclock;
pub mod quorumcheck;
pub mod replica;
pub mod runtime;
pub mod service;
pub mod status;
pub mod store;
pub mod types;
pub mod wal;

pub use replica::{Replica, ReplicaConfig, Storage, WriteError, HEARD_WAIT, WRITE_TIMEOUT};
pub use status::{state_digest, ReplicaStatus};
pub use store::{Applied, SharedState};
pub use types::{
    ConsensusError, KairosRaft, ReplicaId, Request, Response, TypeConfig, ENTRY_FORMAT_VERSION,
    SNAPSHOT_FORMAT_VERSION,
};

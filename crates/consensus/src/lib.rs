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

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use kairos_scheduler::{ClusterState, Command, Outcome};
use openraft::error::{ClientWriteError, RaftError};
use openraft::{BasicNode, Config, Raft, ServerState, SnapshotPolicy};
use serde::{Deserialize, Serialize};
use thiserror::Error;
use tokio::sync::watch;

pub mod auth;
pub mod backup;
pub mod failover;
pub mod failstop;
pub mod freshness;
pub mod fs;
pub mod membership;
pub mod network;
pub mod peerclock;
pub mod runtime;
pub mod service;
pub mod store;
pub mod wal;

pub use store::{Applied, SharedState};

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
        AsyncRuntime = runtime::KairosRuntime,
);

pub type KairosRaft = Raft<TypeConfig>;

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

/// Why a write did not commit.
#[derive(Debug, Error)]
pub enum WriteError {
    /// This replica is not the leader; `leader` is where to go, when known.
    #[error("not the leader (leader: {leader_addr:?})")]
    NotLeader { leader: Option<ReplicaId>, leader_addr: Option<String> },
    /// Not committed in time: most likely no quorum of replicas is reachable. The entry may
    /// still commit later.
    #[error("not committed within {0:?}; is a quorum of replicas up?")]
    Timeout(std::time::Duration),
    #[error("raft: {0}")]
    Raft(String),
}

/// How long a write may wait for its commit before the caller is told.
pub const WRITE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Settings of one replica.
#[derive(Clone, Debug)]
pub struct ReplicaConfig {
    pub id: ReplicaId,
    /// The address other replicas reach this one's Raft service at.
    pub addr: String,
    /// Take a snapshot (and compact the log) after this many applied entries.
    pub snapshot_logs: u64,
    /// Never initialise a cluster: wait for an existing one to add this replica.
    pub join: bool,
    /// The leader's heartbeat period to followers.
    pub heartbeat_ms: u64,
    /// A follower that hears nothing for a random time in [this, 2 × this] starts an election.
    /// It also bounds the failover gap: a follower refuses votes while its leader's lease
    /// (2 × this) has not expired.
    pub election_timeout_ms: u64,
    /// The cluster secret: peers prove membership with credentials derived from it.
    pub key: auth::ClusterKey,
    /// TLS towards peers (`https`), when the cluster uses it.
    pub peer_tls: Option<tonic::transport::ClientTlsConfig>,
}

impl ReplicaConfig {
    pub const HEARTBEAT_MS_DEFAULT: u64 = 50;
    pub const ELECTION_TIMEOUT_MS_DEFAULT: u64 = 150;
}

/// A replica's opened storage: the log (and vote), the state machine, the applied index it
/// reports and the commit index the log keeps.
pub struct Storage<LS> {
    pub log: LS,
    pub sm: store::StateMachineStore,
    pub applied: watch::Receiver<u64>,
    pub commit_index: Arc<std::sync::atomic::AtomicU64>,
}

/// The most a leader waits to hear a majority of the voters' clocks before stamping a command
/// (`Replica::stamp_heard`): a few heartbeats.
pub const HEARD_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// A running replica: the Raft handle plus read access to the applied state.
#[derive(Clone)]
pub struct Replica {
    pub id: ReplicaId,
    pub raft: KairosRaft,
    pub state: SharedState,
    /// The index of the last applied entry; changes after every apply.
    pub applied: watch::Receiver<u64>,
    /// The latest commit index this replica knows.
    pub commit_index: Arc<std::sync::atomic::AtomicU64>,
    /// When a quorum last confirmed this replica's leadership (term, time).
    confirmed: Arc<std::sync::Mutex<Option<(u64, tokio::time::Instant)>>>,
    /// One confirmation round at a time.
    confirming: Arc<tokio::sync::Mutex<()>>,
    /// How long a confirmation counts: no other leader can be elected sooner.
    lease: std::time::Duration,
    /// Appends accepted from the leader (recorded by the Raft service).
    pub contact: Arc<freshness::LeaderContact>,
    /// How stale the applied state may be for `state_fresh`.
    staleness: std::time::Duration,
    /// `state_fresh` has held at least once since this replica started.
    caught_up: Arc<std::sync::atomic::AtomicBool>,
    /// The latest applied stamp and when (`clock_ms`).
    clock: store::ClockSeen,
    /// The voters' wall clocks as their replies told them (`clock_ms`).
    peer_clocks: Arc<peerclock::PeerClocks>,
}

impl Replica {
    /// Opens (or creates) the replica's data under `data_dir` and starts Raft.
    ///
    /// A fresh replica initialises the cluster of `members` when it has the lowest id among them
    /// (the others wait to be contacted); a replica with existing data, or one started with
    /// `join`, never initialises.
    pub async fn open(
        config: &ReplicaConfig,
        data_dir: &Path,
        members: &BTreeMap<ReplicaId, String>,
    ) -> Result<Replica, ConsensusError> {
        std::fs::create_dir_all(data_dir)
            .map_err(|e| ConsensusError::Format(format!("creating {}: {e}", data_dir.display())))?;
        let log_store = store::LogStore::open(data_dir, config.id)?;
        let commit_index = log_store.commit_index();
        let (applied_tx, applied_rx) = watch::channel(0);
        let sm = store::StateMachineStore::new(data_dir, applied_tx)?;
        let peer_clocks = Arc::new(peerclock::PeerClocks::default());
        let network = network::Network {
            from: config.id,
            key: config.key.clone(),
            tls: config.peer_tls.clone(),
            clocks: peer_clocks.clone(),
        };
        Replica::start(
            config,
            members,
            Storage { log: log_store, sm, applied: applied_rx, commit_index },
            network,
            peer_clocks,
        )
        .await
    }

    /// Starts Raft for `config` on `storage`, talking to peers through `network`, which records
    /// the wall clocks peers answer with in `peer_clocks`: what `open` does once the storage is
    /// open. The deterministic simulation (`kairos-chaos`) starts replicas on its simulated disk
    /// and network through here.
    pub async fn start<LS, N>(
        config: &ReplicaConfig,
        members: &BTreeMap<ReplicaId, String>,
        storage: Storage<LS>,
        network: N,
        peer_clocks: Arc<peerclock::PeerClocks>,
    ) -> Result<Replica, ConsensusError>
    where
        LS: openraft::storage::RaftLogStorage<TypeConfig>,
        N: openraft::network::RaftNetworkFactory<TypeConfig>,
    {
        let Storage { log: log_store, sm, applied: applied_rx, commit_index } = storage;
        let shared = sm.shared();
        let clock = sm.clock();
        let raft_config = Config {
            cluster_name: "kairos".into(),
            heartbeat_interval: config.heartbeat_ms,
            election_timeout_min: config.election_timeout_ms,
            election_timeout_max: config.election_timeout_ms * 2,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(config.snapshot_logs),
            // Keep a tail of the log behind each snapshot so briefly lagging replicas catch up from
            // the log; anything further behind gets the snapshot.
            max_in_snapshot_log_to_keep: config.snapshot_logs / 10,
            ..Config::default()
        };
        let raft_config = Arc::new(raft_config.validate().map_err(|e| ConsensusError::Raft(e.to_string()))?);
        let raft = Raft::new(config.id, raft_config, network, log_store, sm)
            .await
            .map_err(|e| ConsensusError::Raft(e.to_string()))?;
        let initialized = raft.is_initialized().await.map_err(|e| ConsensusError::Raft(e.to_string()))?;
        let lowest = members.keys().next().copied().unwrap_or(config.id);
        if !initialized && !config.join && lowest == config.id {
            let nodes: BTreeMap<ReplicaId, BasicNode> =
                members.iter().map(|(id, addr)| (*id, BasicNode::new(addr))).collect();
            let nodes = if nodes.is_empty() {
                BTreeMap::from([(config.id, BasicNode::new(&config.addr))])
            } else {
                nodes
            };
            raft.initialize(nodes).await.map_err(|e| ConsensusError::Raft(e.to_string()))?;
        }
        Ok(Replica {
            id: config.id,
            raft,
            state: shared,
            applied: applied_rx,
            commit_index,
            confirmed: Arc::default(),
            confirming: Arc::default(),
            lease: std::time::Duration::from_millis(config.election_timeout_ms),
            contact: Arc::default(),
            staleness: freshness::staleness_bound(std::time::Duration::from_millis(config.heartbeat_ms)),
            caught_up: Arc::default(),
            clock,
            peer_clocks,
        })
    }

    /// The time to stamp into commands proposed now, given this machine's wall clock: the
    /// cluster's timeline, which one wall clock minutes off cannot jump, and which meets the
    /// wall clock a majority of the voters agree on after an outage (`kairos_scheduler::clock`).
    pub fn clock_ms(&self, wall_ms: i64) -> i64 {
        self.stamp(wall_ms).now_ms
    }

    /// `clock_ms` with the timeline's skipped time, for a `Command`.
    pub fn stamp(&self, wall_ms: i64) -> kairos_scheduler::clock::Stamp {
        self.stamp_and_heard(wall_ms).0
    }

    /// `stamp` for a command about to be proposed: a leader that has not yet heard a majority
    /// of the voters' clocks (it restarted leading, as openraft restores a leader whose vote was
    /// committed, before any reply came) waits for their replies to its heartbeats, at most
    /// `HEARD_WAIT`, so the first commands after an outage are not stamped with the old time.
    pub async fn stamp_heard(&self, wall_ms: impl Fn() -> i64) -> kairos_scheduler::clock::Stamp {
        let deadline = tokio::time::Instant::now() + HEARD_WAIT;
        loop {
            let (stamp, heard) = self.stamp_and_heard(wall_ms());
            if heard || !self.is_leader() || tokio::time::Instant::now() >= deadline {
                return stamp;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    /// The stamp, and whether a majority of the voters' clocks were heard for it.
    fn stamp_and_heard(&self, wall_ms: i64) -> (kairos_scheduler::clock::Stamp, bool) {
        let seen = *self.clock.lock().unwrap_or_else(|p| p.into_inner());
        let Some((last, at)) = seen else {
            return (kairos_scheduler::clock::Stamp { now_ms: wall_ms, skipped_ms: 0 }, true);
        };
        let voters: std::collections::BTreeSet<ReplicaId> =
            self.raft.metrics().borrow().membership_config.voter_ids().collect();
        let agreed = self.peer_clocks.agreed(self.id, wall_ms, &voters);
        let stamp = kairos_scheduler::clock::stamp(last, at.elapsed().as_millis() as i64, wall_ms, agreed);
        (stamp, agreed.is_some())
    }

    /// Proposes commands as one log entry and waits until it is committed (on a quorum's disks)
    /// and applied here. Returns one outcome per command.
    pub async fn write(&self, commands: Vec<Command>) -> Result<Vec<Outcome>, WriteError> {
        self.write_request(Request::new(commands)).await
    }

    /// `write` for an entry already made (`Request::with_encoded`).
    pub async fn write_request(&self, req: Request) -> Result<Vec<Outcome>, WriteError> {
        let result = tokio::time::timeout(WRITE_TIMEOUT, self.raft.client_write(req))
            .await
            .map_err(|_| WriteError::Timeout(WRITE_TIMEOUT))?;
        match result {
            Ok(resp) => Ok(resp.data.outcomes),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                Err(WriteError::NotLeader { leader: f.leader_id, leader_addr: f.leader_node.map(|n| n.addr) })
            }
            Err(e) => Err(WriteError::Raft(e.to_string())),
        }
    }

    /// Reads the applied state.
    pub fn read<T>(&self, f: impl FnOnce(&Applied) -> T) -> T {
        let guard = self.state.read().unwrap_or_else(|p| p.into_inner());
        f(&guard)
    }

    /// Whether this replica leads and a quorum confirmed it within the last election timeout.
    ///
    /// `is_leader` alone is this replica's belief: a leader that was paused or cut off keeps
    /// believing it until it hears of a newer term. Anything that must not be served by a
    /// deposed leader (node heartbeats: the real leader would judge those nodes silent) asks
    /// this instead. At most one confirmation round (a heartbeat to the followers) runs at a
    /// time, and one serves all callers for the lease.
    pub async fn leads_confirmed(&self) -> bool {
        if !self.is_leader() {
            return false;
        }
        let term = self.raft.metrics().borrow().current_term;
        let fresh = |c: &Option<(u64, tokio::time::Instant)>| {
            c.is_some_and(|(t, at)| t == term && at.elapsed() < self.lease)
        };
        if fresh(&self.confirmed.lock().unwrap_or_else(|p| p.into_inner())) {
            return true;
        }
        let _one = self.confirming.lock().await;
        if fresh(&self.confirmed.lock().unwrap_or_else(|p| p.into_inner())) {
            return true;
        }
        let started = tokio::time::Instant::now();
        match tokio::time::timeout(self.lease, self.raft.ensure_linearizable()).await {
            Ok(Ok(_)) => {
                *self.confirmed.lock().unwrap_or_else(|p| p.into_inner()) = Some((term, started));
                true
            }
            _ => false,
        }
    }

    /// Whether the applied state is known to hold everything the leader committed up to
    /// `staleness()` ago (`freshness`).
    pub fn state_fresh(&self) -> bool {
        let leads = self.is_leader();
        let (voters, quorum_ack_ms, applied, applied_own_term) = {
            let m = self.raft.metrics();
            let m = m.borrow();
            let applied = m.last_applied.as_ref().map(|l| l.index).unwrap_or(0);
            // A new leader holds everything committed before it only once it has applied an
            // entry of its own term (the blank entry it commits on election).
            let own_term = m.last_applied.as_ref().is_some_and(|l| l.leader_id.term == m.current_term);
            (m.membership_config.voter_ids().count(), m.millis_since_quorum_ack, applied, own_term)
        };
        if leads {
            let acked =
                voters <= 1 || quorum_ack_ms.is_some_and(|ms| ms <= self.staleness.as_millis() as u64);
            return acked && applied_own_term;
        }
        self.contact.fresh(std::time::Instant::now(), applied, self.staleness)
    }

    /// Whether this replica is in touch with a quorum: it leads and a quorum acknowledged it
    /// within `staleness()` (or it is the only voter), or it follows and accepted an append
    /// from the leader within that bound (a leader sends only while a quorum follows it). What
    /// the health service reports; unlike `state_fresh` it does not ask whether this replica has
    /// applied everything yet.
    pub fn quorum_reachable(&self) -> bool {
        if self.is_leader() {
            let m = self.raft.metrics();
            let m = m.borrow();
            let voters = m.membership_config.voter_ids().count();
            return voters <= 1
                || m.millis_since_quorum_ack.is_some_and(|ms| ms <= self.staleness.as_millis() as u64);
        }
        self.contact.heard_within(std::time::Instant::now(), self.staleness)
    }

    /// Whether this replica's state has caught up with the cluster since it started: the state
    /// was fresh (`state_fresh`) at least once. Until then it may lack entries the cluster
    /// committed — and acknowledged — while it was down, or whose commit it had not heard of
    /// (its stored commit index may lag). Afterwards it stays true: a replica cut off later
    /// still serves reads of what it had (the promise of reads without a quorum).
    pub fn caught_up(&self) -> bool {
        use std::sync::atomic::Ordering;
        if self.caught_up.load(Ordering::Acquire) {
            return true;
        }
        let fresh = self.state_fresh();
        if fresh {
            self.caught_up.store(true, Ordering::Release);
        }
        fresh
    }

    /// The bound `state_fresh` holds the applied state to.
    pub fn staleness(&self) -> std::time::Duration {
        self.staleness
    }

    /// Whether this replica currently leads a cluster it is a voter of. (A leader that removed
    /// itself keeps openraft's leader state for a while; it must not act as leader.)
    pub fn is_leader(&self) -> bool {
        let m = self.raft.metrics();
        let m = m.borrow();
        m.state == ServerState::Leader
            && m.current_leader == Some(self.id)
            && m.membership_config.voter_ids().any(|v| v == self.id)
    }

    /// A status summary for operators.
    /// The current leader and its address, as this replica knows them (cheap: no state is
    /// read). A replica removed from the membership knows no leader.
    pub fn leader(&self) -> (Option<ReplicaId>, Option<String>) {
        let m = self.raft.metrics();
        let m = m.borrow();
        let nodes = &m.membership_config;
        if !nodes.nodes().any(|(id, _)| *id == self.id) {
            return (None, None);
        }
        let leader = m.current_leader;
        let addr = leader.and_then(|l| nodes.nodes().find(|(id, _)| **id == l).map(|(_, n)| n.addr.clone()));
        (leader, addr)
    }

    pub fn status(&self) -> ReplicaStatus {
        let m = self.raft.metrics().borrow().clone();
        let (digest, applied_index) =
            self.read(|a| (state_digest(&a.state), a.last_applied.map(|l| l.index)));
        let members: BTreeMap<ReplicaId, String> =
            m.membership_config.nodes().map(|(id, n)| (*id, n.addr.clone())).collect();
        let voters: Vec<ReplicaId> = m.membership_config.voter_ids().collect();
        // A replica removed from the membership knows no current leader.
        let leader = m.current_leader.filter(|_| members.contains_key(&self.id));
        let replicas = members
            .iter()
            .map(|(id, addr)| {
                let role = if leader == Some(*id) {
                    "leader"
                } else if !voters.contains(id) {
                    "learner"
                } else if *id == self.id && m.state == ServerState::Candidate {
                    "candidate"
                } else {
                    "follower"
                };
                (*id, addr.clone(), role.to_string())
            })
            .collect();
        ReplicaStatus {
            id: self.id,
            leader,
            leader_addr: leader.and_then(|l| members.get(&l).cloned()),
            term: m.current_term,
            last_log_index: m.last_log_index.unwrap_or(0),
            commit_index: self.commit_index.load(std::sync::atomic::Ordering::Relaxed),
            applied_index: applied_index.unwrap_or(0),
            state_digest: digest,
            snapshot_index: m.snapshot.map(|l| l.index),
            replicas,
        }
    }
}

#[derive(Clone, Debug)]
pub struct ReplicaStatus {
    pub id: ReplicaId,
    pub leader: Option<ReplicaId>,
    pub leader_addr: Option<String>,
    pub term: u64,
    pub last_log_index: u64,
    pub commit_index: u64,
    pub applied_index: u64,
    pub state_digest: String,
    /// Last log index covered by this replica's snapshot (built or installed).
    pub snapshot_index: Option<u64>,
    /// (id, address, role)
    pub replicas: Vec<(ReplicaId, String, String)>,
}

/// A digest of the state: equal on replicas that applied the same log (FNV-1a 64 of the
/// snapshot encoding, which is deterministic because the state holds only ordered maps).
pub fn state_digest(state: &ClusterState) -> String {
    let bytes = store::encode_snapshot(state).unwrap_or_default();
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{hash:016x}")
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

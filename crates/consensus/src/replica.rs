//! A running replica: Raft started on its storage and network, the write path (propose, wait
//! for commit and apply), reads of the applied state, and what it knows of its own leadership
//! and freshness.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use kairos_scheduler::{Command, Outcome};
use openraft::error::{ClientWriteError, RaftError};
use openraft::{BasicNode, Config, Raft, SnapshotPolicy};
use thiserror::Error;
use tokio::sync::watch;

use crate::quorumcheck;
use crate::store::{Applied, SharedState};
use crate::types::{ConsensusError, KairosRaft, ReplicaId, Request, TypeConfig};
use crate::{auth, freshness, network, peerclock, store};

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
        let silence = Arc::new(quorumcheck::Silence::default());
        let network = quorumcheck::Gated::new(network, silence.clone(), config.id);
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
        let replica = Replica {
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
        };
        let deaf_after = replica.lease * quorumcheck::DEAF_AFTER_LEASES;
        tokio::spawn(quorumcheck::run(replica.raft.clone(), silence, deaf_after));
        Ok(replica)
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

    /// The nodes whose runs the entries applied since the last call may have changed
    /// (`ClusterState::take_changed_nodes`); one caller per replica: the agent service's hub.
    pub fn take_changed_nodes(&self) -> kairos_scheduler::state::changed::ChangedNodes {
        let mut guard = self.state.write().unwrap_or_else(|p| p.into_inner());
        guard.state.take_changed_nodes()
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
        match tokio::time::timeout(self.lease, self.confirm()).await {
            // Confirmed for the term that leads now, which must be the caller's (a round it
            // waited behind may have confirmed a later term of this replica's).
            Ok(Some(confirmed)) => {
                *self.confirmed.lock().unwrap_or_else(|p| p.into_inner()) = Some((confirmed, started));
                confirmed == term
            }
            _ => false,
        }
    }

    /// One confirmation round: a quorum answers a heartbeat sent now, and the state holds every
    /// entry of earlier terms (an entry of the term the round confirmed is applied; a new leader
    /// waits until it has). The term confirmed, read from the round's own read log id (a
    /// leader's is of its current term). Unlike a linearizable read it does not wait for the
    /// entries of its own term still being applied: under a flood of them (ten thousand
    /// registrations) that wait held every agent's heartbeat past its timeout. What those
    /// entries change, this leader proposed and tracks itself (`liveness::Liveness`: its
    /// `NodeDown`s in flight); a registration that skips its entry asks `applied_all_committed`.
    async fn confirm(&self) -> Option<u64> {
        let (read, applied) = self.raft.get_read_log_id().await.ok()?;
        let read = read?;
        let term = read.leader_id.term;
        if applied.is_some_and(|a| a.leader_id.term == term) {
            return Some(term);
        }
        if applied.is_none_or(|a| a.index < read.index) {
            let wait = self.raft.wait(None);
            wait.applied_index_at_least(Some(read.index), "a new leader applies").await.ok()?;
        }
        Some(term)
    }

    /// Whether the applied state holds every entry this replica knows committed.
    pub fn applied_all_committed(&self) -> bool {
        let committed = self.commit_index.load(std::sync::atomic::Ordering::SeqCst);
        self.read(|a| a.last_applied.map_or(0, |l| l.index)) >= committed
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
        crate::types::leads(&self.raft.metrics().borrow())
    }

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
}

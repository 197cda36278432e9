//! The simulated network between replicas: openraft's RPCs are delivered by calling the target's
//! `Raft` in the same process, after a delay drawn from the schedule's generator.
//!
//! A link can be cut one way (`cut` holds directed pairs: a request or a reply on it is lost and
//! the caller hears nothing until its RPC deadline), slow (extra random delay per message, which
//! also reorders messages of different streams), and replies can be lost with a probability
//! (the request took effect; the caller cannot tell). A paused replica neither receives nor
//! sends until it resumes: what reaches it waits, up to the caller's deadline.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kairos_consensus::peerclock::PeerClocks;
use kairos_consensus::{KairosRaft, ReplicaId, TypeConfig};
use openraft::error::{InstallSnapshotError, RPCError, RaftError, RemoteError, Timeout, Unreachable};
use openraft::network::{RPCOption, RPCTypes, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::BasicNode;
use tokio::time::Instant;

use crate::proxy::Rng;

/// Everything the network knows and every fault on it.
pub struct NetState {
    /// Replicas that run, by id.
    pub rafts: BTreeMap<ReplicaId, KairosRaft>,
    pub paused: BTreeSet<ReplicaId>,
    /// Directed links on which every message is lost.
    pub cut: BTreeSet<(ReplicaId, ReplicaId)>,
    /// Extra delay (up to this many ms, random per message) on every link.
    pub slow_ms: u64,
    /// Replies lost, per mille.
    pub lose_replies_per_mille: u64,
    /// How far each replica machine's wall clock is off.
    pub skew_ms: BTreeMap<ReplicaId, i64>,
    /// When the simulation started: its wall clocks read `super::WALL_BASE_MS` then.
    pub start: Instant,
    pub rng: Rng,
}

pub type Net = Arc<Mutex<NetState>>;

pub fn new_net(seed: u64) -> Net {
    Arc::new(Mutex::new(NetState {
        rafts: BTreeMap::new(),
        paused: BTreeSet::new(),
        cut: BTreeSet::new(),
        slow_ms: 0,
        lose_replies_per_mille: 0,
        skew_ms: BTreeMap::new(),
        start: Instant::now(),
        rng: Rng::new(seed),
    }))
}

pub fn lock(net: &Net) -> std::sync::MutexGuard<'_, NetState> {
    net.lock().unwrap_or_else(|p| p.into_inner())
}

impl NetState {
    /// Replica `id`'s machine's wall clock, in ms.
    pub fn wall_ms(&self, id: ReplicaId) -> i64 {
        let elapsed = Instant::now().saturating_duration_since(self.start).as_millis() as i64;
        super::WALL_BASE_MS + elapsed + self.skew_ms.get(&id).copied().unwrap_or(0)
    }

    /// One message on `from → to`: its delay, or None when it is lost.
    fn leg(&mut self, from: ReplicaId, to: ReplicaId, reply: bool) -> Option<Duration> {
        let lost = self.cut.contains(&(from, to))
            || (reply
                && self.lose_replies_per_mille > 0
                && self.rng.below(1000) < self.lose_replies_per_mille);
        if lost {
            return None;
        }
        let extra = if self.slow_ms > 0 { self.rng.below(self.slow_ms) } else { 0 };
        Some(Duration::from_millis(1 + self.rng.below(3) + extra))
    }
}

/// openraft's network factory for one replica.
pub struct SimNetwork {
    pub from: ReplicaId,
    pub net: Net,
    /// Where the wall clocks peers answer with are recorded, as `kairos_consensus::network` does.
    pub clocks: Arc<PeerClocks>,
}

impl RaftNetworkFactory<TypeConfig> for SimNetwork {
    type Network = SimConnection;

    async fn new_client(&mut self, target: ReplicaId, _node: &BasicNode) -> SimConnection {
        SimConnection { from: self.from, target, net: self.net.clone(), clocks: self.clocks.clone() }
    }
}

pub struct SimConnection {
    from: ReplicaId,
    target: ReplicaId,
    net: Net,
    clocks: Arc<PeerClocks>,
}

type RpcResult<T, E> = Result<T, RPCError<ReplicaId, BasicNode, RaftError<ReplicaId, E>>>;

fn unreachable<E: std::error::Error>(why: &str) -> RPCError<ReplicaId, BasicNode, RaftError<ReplicaId, E>> {
    RPCError::Unreachable(Unreachable::new(&std::io::Error::other(why.to_string())))
}

/// What `kairos_consensus::network` reports for a call that ran out of its deadline (a lost
/// message, a paused peer): a timeout, which openraft retries without backing off.
fn timed_out<E: std::error::Error>(
    action: RPCTypes,
    from: ReplicaId,
    target: ReplicaId,
    option: &RPCOption,
) -> RPCError<ReplicaId, BasicNode, RaftError<ReplicaId, E>> {
    RPCError::Timeout(Timeout { action, id: from, target, timeout: option.hard_ttl() })
}

impl SimConnection {
    /// Waits while either end is paused; false when the deadline passed first.
    async fn until_running(&self, deadline: Instant) -> bool {
        loop {
            let paused = {
                let n = lock(&self.net);
                n.paused.contains(&self.from) || n.paused.contains(&self.target)
            };
            if !paused {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn call<Resp, E, F, Fut>(&self, action: RPCTypes, option: &RPCOption, f: F) -> RpcResult<Resp, E>
    where
        E: std::error::Error,
        F: FnOnce(KairosRaft) -> Fut,
        Fut: Future<Output = Result<Resp, RaftError<ReplicaId, E>>>,
    {
        let deadline = Instant::now() + option.hard_ttl();
        let there = lock(&self.net).leg(self.from, self.target, false);
        let Some(delay) = there else {
            tokio::time::sleep_until(deadline).await;
            return Err(timed_out(action, self.from, self.target, option));
        };
        tokio::time::sleep(delay).await;
        if !self.until_running(deadline).await {
            return Err(timed_out(action, self.from, self.target, option));
        }
        let raft = lock(&self.net).rafts.get(&self.target).cloned();
        let Some(raft) = raft else {
            return Err(unreachable("peer down"));
        };
        let result = f(raft).await;
        // The reply carries the target's wall clock as it leaves.
        let wall = lock(&self.net).wall_ms(self.target);
        let back = lock(&self.net).leg(self.target, self.from, true);
        let Some(delay) = back else {
            tokio::time::sleep_until(deadline).await;
            return Err(timed_out(action, self.from, self.target, option));
        };
        tokio::time::sleep(delay).await;
        self.clocks.record(self.target, wall);
        match result {
            Ok(r) => Ok(r),
            Err(RaftError::Fatal(_)) => Err(unreachable("peer stopped")),
            Err(e) => Err(RPCError::RemoteError(RemoteError::new(self.target, e))),
        }
    }
}

impl RaftNetwork<TypeConfig> for SimConnection {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<ReplicaId>, openraft::error::Infallible> {
        self.call(RPCTypes::AppendEntries, &option, |raft| async move { raft.append_entries(rpc).await })
            .await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<ReplicaId>, InstallSnapshotError> {
        self.call(RPCTypes::InstallSnapshot, &option, |raft| async move { raft.install_snapshot(rpc).await })
            .await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<ReplicaId>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<ReplicaId>, openraft::error::Infallible> {
        self.call(RPCTypes::Vote, &option, |raft| async move { raft.vote(rpc).await }).await
    }
}

//! What every service of the daemon shares: the replica, the scheduler's wake-up, node
//! heartbeats (leader memory only), and the mapping of write failures to gRPC statuses.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kairos_consensus::{Replica, WriteError};
use kairos_scheduler::{Command, JobId, Op, Outcome, PendingReason};
use tokio::sync::Notify;
use tonic::Status;

use crate::auth::{Auth, Principal};
use crate::batch::Batcher;

use crate::status::unavailable;
pub use crate::status::{rejection_status, write_status, LEADER_HEADER};

#[derive(Clone, Debug)]
pub struct Timing {
    /// How often agents are told to heartbeat.
    pub heartbeat_interval: Duration,
    /// A node silent this long is declared down.
    pub node_timeout: Duration,
    /// Period of the scheduling pass when nothing wakes it.
    pub tick: Duration,
}

impl Timing {
    /// The agents' lease (`kairos_scheduler::liveness::lease`).
    pub fn lease(&self) -> Duration {
        kairos_scheduler::liveness::lease(self.node_timeout)
    }

    /// A fenced agent's grace (`kairos_scheduler::liveness::fence_grace`).
    pub fn fence_grace(&self) -> Duration {
        kairos_scheduler::liveness::fence_grace(self.node_timeout)
    }
}

/// Pending reasons and start estimates by job, as one planning pass derives them.
#[derive(Default)]
pub struct PendingReasons {
    reasons: BTreeMap<JobId, PendingReason>,
    estimates: BTreeMap<JobId, kairos_scheduler::planner::Estimate>,
}

impl PendingReasons {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn get(&self, id: &JobId) -> Option<&PendingReason> {
        self.reasons.get(id)
    }

    /// Sets a pending job's view's expected start and its reason (or why it has none).
    pub fn estimate_into(&self, view: &mut kairos_proto::v1::Job) {
        if let Some(e) = self.estimates.get(&view.id) {
            view.expected_start_ms = e.start_ms.unwrap_or(0);
            view.start_reason = e.why.clone();
        }
    }
}

/// The pending reasons of one applied state, shared by all readers of that state.
#[derive(Default)]
pub struct ReasonCache {
    applied_index: Option<u64>,
    reasons: Arc<PendingReasons>,
}

#[derive(Clone)]
pub struct Ctx {
    pub replica: Replica,
    /// Wakes the scheduling loop (submit, job exit, node join).
    pub kick: Arc<Notify>,
    /// Last heartbeat per node, as seen by this replica. Never replicated.
    /// Node liveness as this replica saw it while leading (`kairos_scheduler::liveness`).
    pub heartbeats: Arc<Mutex<kairos_scheduler::liveness::Liveness>>,
    pub timing: Timing,
    pub batcher: Batcher,
    /// At most one planning pass per applied index for all read paths together.
    pub reasons: Arc<Mutex<ReasonCache>>,
    /// The credentials this controller accepts.
    pub auth: Arc<Auth>,
    /// TLS towards agents' log services, when the cluster uses it.
    pub agent_tls: Option<tonic::transport::ClientTlsConfig>,
    /// Bounds on unfinished jobs, stamped into every submit this replica proposes.
    pub submit_limits: kairos_scheduler::quota::SubmitLimits,
    /// How long finished jobs stay live and how much history is kept, stamped into purges.
    pub retention: kairos_scheduler::history::Retention,
    /// This process's counters and histograms (`--metrics-addr`).
    pub metrics: Arc<crate::metrics::Metrics>,
}

/// Wall-clock time in Unix milliseconds; read only at the edge and stamped into commands.
pub fn now_ms() -> i64 {
    kairos_consensus::peerclock::wall_now_ms()
}

impl Ctx {
    /// The cluster's time (ms since the epoch) for commands proposed and decisions made now:
    /// this machine's wall clock, unless it is off the replicated timeline
    /// (`Replica::clock_ms`).
    pub fn cluster_now(&self) -> i64 {
        self.replica.clock_ms(now_ms())
    }

    /// `ops` as commands stamped now with the cluster's timeline (`Replica::stamp`).
    pub fn stamped(&self, ops: impl IntoIterator<Item = Op>) -> Vec<Command> {
        let stamp = self.replica.stamp(now_ms());
        ops.into_iter().map(|op| Command { now_ms: stamp.now_ms, skipped_ms: stamp.skipped_ms, op }).collect()
    }

    /// Commits one command (batched with concurrent ones) and returns its outcome.
    pub async fn write(&self, op: Op) -> Result<Outcome, Status> {
        let stamp = self.replica.stamp_heard(now_ms).await;
        self.batcher.write(Command { now_ms: stamp.now_ms, skipped_ms: stamp.skipped_ms, op }).await
    }

    /// The current pending reasons (computed once per applied index).
    pub fn pending_reasons(&self) -> Arc<PendingReasons> {
        let mut cache = self.reasons.lock().unwrap_or_else(|p| p.into_inner());
        let (index, reasons) = self.replica.read(|a| {
            let index = a.last_applied.map(|l| l.index);
            if cache.applied_index.is_some() && cache.applied_index == index {
                (index, None)
            } else {
                let config = kairos_scheduler::planner::PlanConfig {
                    estimates: kairos_scheduler::planner::ESTIMATES_MAX,
                    ..Default::default()
                };
                let out = kairos_scheduler::planner::plan_with(&a.state, config);
                (index, Some(PendingReasons { reasons: out.pending, estimates: out.estimates }))
            }
        });
        if let Some(reasons) = reasons {
            *cache = ReasonCache { applied_index: index, reasons: Arc::new(reasons) };
        }
        cache.reasons.clone()
    }

    /// The authenticated user behind a job or admin request.
    pub fn principal<T>(&self, req: &tonic::Request<T>) -> Result<Principal, Status> {
        // Authenticated from the headers before the body was decoded (`context::user_gate`).
        if let Some(me) = req.extensions().get::<Principal>() {
            return Ok(me.clone());
        }
        self.auth.principal(req.metadata(), |token| self.settle_token(token))
    }

    /// The refusal that ends a long stream whose caller's credential no longer holds (revoked,
    /// expired); None while it holds, or while this replica cannot tell (it answers that only
    /// the leader can settle the token: the stream goes on).
    /// The caller's credential judged again, as at the edge: `UNAVAILABLE` when only the leader
    /// can settle it.
    pub fn recheck(&self, credentials: &tonic::metadata::MetadataMap) -> Result<(), Status> {
        self.auth.principal(credentials, |token| self.settle_token(token)).map(|_| ())
    }

    pub fn revoked(&self, credentials: &tonic::metadata::MetadataMap) -> Option<Status> {
        match self.auth.principal(credentials, |token| self.settle_token(token)) {
            Err(refused) if refused.code() != tonic::Code::Unavailable => Some(refused),
            _ => None,
        }
    }

    /// Decides an issued token so that a revocation holds everywhere within the staleness
    /// bound and a new token works at once: only a replica whose state is fresh (the leader
    /// with a quorum's recent acknowledgement, or a follower that recently applied what the
    /// leader had committed; `Replica::state_fresh`) accepts one, and a follower that would
    /// refuse one (unknown — perhaps not applied here yet — revoked or expired) sends the
    /// caller to the leader, whose answer stands.
    fn settle_token(&self, token: &str) -> Result<Principal, Status> {
        let leads = self.replica.is_leader();
        if !self.replica.state_fresh() {
            return Err(self.to_leader(
                leads,
                &format!(
                    "this replica has not heard from {} within {:?}, so it cannot vouch for tokens",
                    if leads { "a quorum" } else { "the leader" },
                    self.replica.staleness()
                ),
            ));
        }
        let (found, leader_may) = self.replica.read(|a| {
            let found = crate::auth::issued_token(token, &a.state, self.cluster_now());
            (found.clone(), found.is_none() && !leads && crate::auth::leader_may_accept(token, &a.state))
        });
        match found {
            Some(me) => Ok(me),
            None if leader_may => {
                Err(self.to_leader(false, "the leader settles tokens this replica does not accept"))
            }
            None => Err(crate::auth::token_refused()),
        }
    }

    /// `UNAVAILABLE` with the leader's address (clients retry there), unless this replica is
    /// the leader or none is known.
    fn to_leader(&self, leads: bool, why: &str) -> Status {
        let (leader, addr) = self.replica.leader();
        unavailable(why, addr.filter(|_| !leads && leader != Some(self.replica.id)))
    }

    /// Sends a caller this replica cannot serve to the leader (`UNAVAILABLE` + its address).
    /// Reads are served only by a replica that has caught up with the cluster since it
    /// started (`Replica::caught_up`): a restarted replica's state may lack entries that were
    /// committed — and acknowledged to clients — while it was down, or whose commit it had not
    /// yet heard of (e2e `a_restarted_replica_serves_no_reads_until_it_has_caught_up`).
    pub fn readable(&self) -> Result<(), Status> {
        if self.replica.caught_up() {
            return Ok(());
        }
        let (_, leader_addr) = self.replica.leader();
        Err(unavailable("this replica restarted and has not caught up with the cluster yet", leader_addr))
    }

    pub fn not_leader(&self) -> Status {
        let (leader, leader_addr) = self.replica.leader();
        write_status(WriteError::NotLeader { leader, leader_addr })
    }

    /// The epoch of `node`'s registration, if it is registered.
    pub fn node_epoch(&self, node: &str) -> Option<u64> {
        self.replica.read(|a| a.state.nodes.get(node).map(|n| n.epoch))
    }

    /// An agent's call about `node`: only the credential of its current registration passes.
    pub fn authenticate_agent(
        &self,
        metadata: &tonic::metadata::MetadataMap,
        node: &str,
    ) -> Result<(), Status> {
        self.auth.check_node(metadata, node, self.node_epoch(node))
    }

    /// `NOT_FOUND` unless `node` is registered.
    pub fn check_node(&self, node: &str) -> Result<(), Status> {
        self.replica.read(|a| {
            if a.state.nodes.contains_key(node) {
                Ok(())
            } else {
                let name: String = node.chars().take(64).collect();
                Err(Status::not_found(format!("node \"{name}\" is not registered")))
            }
        })
    }

    /// Drains `node` (nothing new is placed there; its runs checkpoint and requeue unless
    /// `keep_runs`), for an operator or for the node's own agent (a spot notice, a failed
    /// health check).
    pub async fn drain_node(&self, node: String, reason: &str, keep_runs: bool) -> Result<(), Status> {
        self.check_node(&node)?;
        let reason: String = reason.chars().take(256).collect();
        tracing::warn!(node = %node, %reason, keep_runs, "node drains");
        self.node_write(Op::DrainNode { node, reason, keep_runs }).await
    }

    /// Writes a node-changing op; a rejection becomes its status, anything else wakes the
    /// scheduling loop (runs were stopped, GPUs freed or taken out).
    pub async fn node_write(&self, op: Op) -> Result<(), Status> {
        match self.write(op).await? {
            Outcome::Rejected(rej) => Err(rejection_status(rej)),
            _ => {
                self.kick.notify_one();
                Ok(())
            }
        }
    }

    /// A node's heartbeat: false when this leader judged the node silent (it must register
    /// again, after its `NodeDown`).
    pub fn liveness(&self) -> std::sync::MutexGuard<'_, kairos_scheduler::liveness::Liveness> {
        self.heartbeats.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The check a user-facing service makes from the headers alone, before a body is decoded.
pub fn user_gate(ctx: Ctx) -> impl FnMut(tonic::Request<()>) -> Result<tonic::Request<()>, Status> + Clone {
    // The router clones its service, this closure included, for every call: one `Arc`, not a
    // `Ctx` (a score of reference counts, each taken and dropped per call).
    let ctx = Arc::new(ctx);
    move |mut request: tonic::Request<()>| {
        // Handed on to the handler (request extensions survive decoding), so the caller is
        // authenticated once per call.
        let me = ctx.principal(&request)?;
        request.extensions_mut().insert(me);
        Ok(request)
    }
}

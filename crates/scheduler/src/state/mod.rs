//! The replicated cluster state and the commands that change it.
//!
//! `ClusterState::apply` is the state machine of the Raft log: a pure function of the state and
//! one command. Everything non-deterministic (the time, the command itself) is decided by the
//! leader and travels inside the command, so every replica applying the same log reaches a
//! byte-identical state.
//!
//! Architecture invariant: apply re-validates everything it is given. A plan computed from a
//! stale snapshot, a report from an agent about an old attempt, or a cancel of a finished job
//! is turned into a `Rejected`/`Ignored` outcome here, never into a double allocation.
//!
//! ```text
//!   Command { skipped_ms: 0, now_ms, op } ──▶ apply ──▶ (new state, Outcome)
//! ```
//!
//! By concept: `ops` (the log's vocabulary, its persistent format), this file (the state and the
//! apply dispatch), `submit` (users' job commands, policy), `runs` (placements, starts, exits,
//! time limits), `preempt`, `headroom` (the idle GPUs kept for inference), `elastic`, `node_ops`,
//! `nodes` (who may register a node name), `burst_apply` (cloud burst ops), `usage` (decayed
//! usage per account), `queries` (read-only questions) and `invariants`. Every op that hands
//! out GPUs checks them with `check_grant` (`crate::state::grant`), whose fit verdict is
//! `crate::fit::fits`, the planner's too.

pub mod brief;
pub mod burst_apply;
pub mod changed;
mod elastic;
pub mod events;
mod fits;
mod gpu_health;
pub mod grant;
mod headroom;
pub mod history;
mod history_runs;
pub mod idle;
mod invariants;
mod jobs;
mod node_ops;
mod nodes;
mod ops;
pub mod placed_topology;
mod policy_ops;
mod preempt;
mod queries;
pub mod quota;
pub mod reservations;
mod runs;
mod submit;
pub mod teams;
pub mod tokens;
pub mod usage;

pub use jobs::Jobs;
pub use ops::*;
pub use preempt::{reclaims, VictimCost, PREEMPTION_RECORDS_MAX, THRASH_PREEMPTIONS_MAX, THRASH_WINDOW_MS};
pub(crate) use queries::{limit_ms, over_wall};

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::limits::Usage;
use crate::model::{
    Allocation, GpuIndex, Job, JobId, JobSpec, JobState, Node, NodeInfo, NodeState, StopReason, TaskPlacement,
};
use crate::policy::{Policy, PolicyKind, Qos};
use crate::state::grant::Taking;
use crate::validate::{validate_node, validate_spec};

/// Everything the controller cluster agrees on.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterState {
    /// The latest time stamped into an applied command; never goes backwards.
    pub now_ms: i64,
    /// The most the timeline has skipped in all, of the applied commands' (`crate::clock`):
    /// `now_ms` moved that much more than time passed on any replica's monotonic clock.
    #[serde(default)]
    pub skipped_ms: i64,
    pub next_job_id: JobId,
    pub jobs: Jobs,
    pub nodes: BTreeMap<String, Node>,
    /// user → request id → the job that submit created; makes retried submits idempotent.
    #[serde(default)]
    pub submit_requests: BTreeMap<String, BTreeMap<String, JobId>>,
    /// QoS classes and submit rules.
    #[serde(default)]
    pub policy: Policy,
    /// The latest preemptions (bounded), for operators.
    #[serde(default)]
    pub preemptions: std::collections::VecDeque<PreemptionRecord>,
    /// Preemption victims ever, by how they were treated (`cancel`, `requeue`, `suspend`,
    /// `shrink`): the replicated counter behind `kairos_preemptions_total`.
    #[serde(default)]
    pub preemption_totals: BTreeMap<String, u64>,
    /// Decayed GPU usage per account, for fairshare.
    #[serde(default)]
    pub usage: BTreeMap<String, usage::AccountUsage>,
    /// The most GPUs any registered node has (kept on registration; every submit checks it).
    #[serde(default)]
    largest_node_gpus: u32,
    /// Jobs in state Suspended, checked after each command for resumption.
    #[serde(default)]
    pub suspended: BTreeSet<JobId>,
    /// Cloud burst: configuration, launch intents, instances, spend.
    #[serde(default)]
    pub burst: crate::burst::BurstState,
    /// Issued API tokens (hashed), by token id.
    #[serde(default)]
    pub tokens: crate::state::tokens::Tokens,
    /// Ids of revoked tokens (a retried create never brings one back), with when (Unix ms).
    #[serde(default)]
    pub revoked_tokens: BTreeMap<String, i64>,
    /// The last node epoch handed out (see `Node::epoch`); only grows.
    #[serde(default)]
    pub node_epoch_seq: u64,
    /// Unfinished jobs by user (a cache of `jobs`, rebuilt when missing).
    #[serde(skip)]
    pub(crate) unfinished: crate::state::quota::UnfinishedIndex,
    /// Records of finished jobs purged from `jobs` (bounded; `crate::state::history`).
    #[serde(default)]
    pub history: crate::state::history::History,
    /// Nodes joining, draining, down, up and leaving, and policy changes (bounded;
    /// `crate::state::events`).
    #[serde(default)]
    pub events: crate::state::events::ClusterEvents,
    /// Levels above the node and the nodes' domains (`crate::topology`).
    #[serde(default, skip_serializing_if = "crate::topology::Topology::is_empty")]
    pub topology: crate::topology::Topology,
    /// Gangs placed against the topology, and those spread past the fewest domains.
    #[serde(default, skip_serializing_if = "placed_topology::GangSpread::is_empty")]
    pub gang_spread: placed_topology::GangSpread,
    /// Reservations by name (`crate::reservation`, `state/reservations.rs`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub reservations: BTreeMap<String, crate::reservation::Reservation>,
    /// The planner's compact view of the unfinished jobs (a cache kept by apply).
    #[serde(skip)]
    pub(crate) job_index: crate::state::brief::JobIndex,
    /// The nodes whose runs changed since the controller last asked (a cache kept by apply).
    #[serde(skip)]
    pub(crate) changed: changed::Changes,
}

impl ClusterState {
    pub fn new() -> Self {
        ClusterState {
            now_ms: 0,
            skipped_ms: 0,
            next_job_id: 1,
            jobs: Jobs::default(),
            nodes: BTreeMap::new(),
            submit_requests: BTreeMap::new(),
            policy: Policy::default(),
            largest_node_gpus: 0,
            usage: BTreeMap::new(),
            preemptions: Default::default(),
            preemption_totals: BTreeMap::new(),
            suspended: BTreeSet::new(),
            burst: Default::default(),
            tokens: Default::default(),
            revoked_tokens: BTreeMap::new(),
            node_epoch_seq: 0,
            history: Default::default(),
            events: Default::default(),
            topology: Default::default(),
            gang_spread: Default::default(),
            reservations: BTreeMap::new(),
            unfinished: Default::default(),
            job_index: Default::default(),
            changed: Default::default(),
        }
    }

    /// Applies one committed command.
    pub fn apply(&mut self, cmd: &Command) -> Outcome {
        #[cfg(debug_assertions)]
        let checked = self.before_checked_command();
        // A new leader's clock may lag the old one's: time in the state never goes backwards.
        self.now_ms = self.now_ms.max(cmd.now_ms);
        self.skipped_ms = self.skipped_ms.max(cmd.skipped_ms);
        let now = self.now_ms;
        let node = cmd.op.node_changed();
        let before = node.map(|n| self.node_seen(n));
        let outcome = self.apply_op(&cmd.op, now);
        if let (Some(node), Some(before)) = (node, before) {
            self.note_node(node, before, now);
        }
        if !self.suspended.is_empty() {
            self.resume_ready(now);
        }
        if !self.burst.instances.is_empty() {
            self.track_burst_nodes(now);
        }
        self.note_changed(&cmd.op);
        self.job_index.update(&mut self.jobs);
        #[cfg(debug_assertions)]
        self.checked_changes(checked);
        outcome
    }

    /// The one place every `Op` meets its handler: add an operation here (and its handler in
    /// the file of its concept: `submit`, `runs`, `node_ops`, `preempt`, `elastic`,
    /// `policy_ops`, `tokens`, `burst_apply`).
    fn apply_op(&mut self, op: &Op, now: i64) -> Outcome {
        match op {
            Op::Submit { spec, request_id, hold, limits } => {
                self.submit(spec, request_id.as_deref(), *hold, limits.as_ref(), now)
            }
            Op::Cancel { job, by } => self.cancel(*job, by, now),
            Op::PurgeJobs { jobs, retention } => self.purge_jobs(jobs, retention, now),
            Op::RegisterNode { info } => self.register_node(info, now),
            Op::JoinNode { info, credential_epoch } => self.join_node(info, *credential_epoch, now),
            Op::RemoveNode { node } => self.remove_node(node),
            Op::NodeDown { node, reason } => self.node_down(node, reason, now),
            Op::ApplyPlan { plan } => self.apply_plan(plan, now),
            Op::JobStarted { job, attempt, node } => self.job_started(*job, *attempt, node, now),
            Op::JobExited { job, attempt, node, exit } => self.job_exited(*job, *attempt, node, exit, now),
            Op::EnforceTimeLimit { job, attempt } => self.enforce_time_limit(*job, *attempt, now),
            Op::SetPolicy { policy, audit } => {
                let outcome = self.set_policy(policy);
                if !matches!(outcome, Outcome::Rejected(_)) {
                    self.note_policy(audit, now);
                }
                outcome
            }
            Op::SetTopology { topology } => match topology.validate() {
                Ok(()) => {
                    self.topology = topology.clone();
                    Outcome::TopologyChanged
                }
                Err(e) => Outcome::Rejected(Rejection::Invalid(e.to_string())),
            },
            Op::Hold { job, by } => self.set_held(*job, true, by, now),
            Op::Preempt { preemptor, node, victims, gpus } => {
                self.preempt(*preemptor, node, victims, gpus, now)
            }
            Op::Vacate { victims } => self.vacate(victims, now),
            Op::RunNote { job, attempt, node, kind, message } => {
                self.run_note(*job, *attempt, node, kind, message, now)
            }
            Op::Checkpointed { job, attempt, node } => self.checkpointed(*job, *attempt, node, now),
            Op::Release { job, by } => self.set_held(*job, false, by, now),
            Op::Resize { job, attempt, gpus, more } => self.resize(*job, *attempt, gpus, more, now),
            Op::SetBurstConfig { config } => self.set_burst_config(config, now),
            Op::DrainNode { node, reason, keep_runs } => self.drain_node(node, reason, *keep_runs, now),
            Op::ResumeNode { node, only_reason } => self.resume_node(node, only_reason.as_deref()),
            Op::GpuFault { node, gpu, uuid, reason } => self.gpu_fault(node, *gpu, uuid, reason, now),
            Op::GpuReset { node, gpu } => self.gpu_reset(node, *gpu),
            Op::CreateToken { id, record } => self.create_token(id, record),
            Op::RevokeToken { id } => self.revoke_token(id, now),
            Op::BurstLaunch { launches, reason } => self.burst_launch(launches, reason, now),
            Op::BurstLaunched { intent, instance_id } => self.burst_launched(*intent, instance_id, now),
            Op::BurstLaunchFailed { intent, reason, capacity } => {
                self.burst_launch_failed(*intent, reason, *capacity, now)
            }
            Op::BurstTerminate { intent, reason } => self.burst_terminate(*intent, reason, now),
            Op::BurstGone { intent, reason } => self.burst_gone(*intent, reason, now),
            Op::BurstNote { message } => self.burst_note(message, now),
            Op::PutQos { qos, must_exist } => self.put_qos(qos, *must_exist),
            Op::PutPolicyItem { item, must_exist } => self.put_policy_item(item, *must_exist),
            Op::DeletePolicyItem { kind, name } => self.delete_policy_item(*kind, name),
            Op::DeleteQos { name } => self.delete_qos(name),
            Op::RunUsage { job, attempt, node, usage } => self.run_usage(*job, *attempt, node, usage),
            Op::RunIdle { job, attempt, node, since_ms } => {
                self.run_idle(*job, *attempt, node, *since_ms, now)
            }
            Op::PutReservation { reservation, must_exist } => {
                self.put_reservation(reservation, *must_exist, now)
            }
            Op::DeleteReservation { name } => self.delete_reservation(name, now),
            Op::ReservationTick => self.reservation_tick(now),
        }
    }
}

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
//!   Command { now_ms, op } ──▶ apply ──▶ (new state, Outcome)
//! ```

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::grant::Taking;
use crate::limits::Usage;
use crate::model::{
    Allocation, GpuIndex, Job, JobId, JobSpec, JobState, Node, NodeInfo, NodeState, StopReason, TaskPlacement,
};
use crate::policy::{Policy, Qos};
use crate::validate::{validate_node, validate_spec};

/// How a gang task the cluster lost is recorded among the ranks' exits.
const LOST_EXIT: i32 = i32::MIN;

/// Most attempts of one job; a job requeued this often ends instead.
pub const ATTEMPTS_MAX: u32 = 10;

/// Most placements one plan may carry.
pub const PLAN_PLACEMENTS_MAX: usize = 1024;

/// One GPU grant the planner proposes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    pub job: JobId,
    /// Rank 0's node and GPUs.
    pub node: String,
    pub gpus: Vec<GpuIndex>,
    /// Ranks 1.. of a gang job, each on a different node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub more: Vec<TaskPlacement>,
}

impl Placement {
    pub fn single(job: JobId, node: String, gpus: Vec<GpuIndex>) -> Placement {
        Placement { job, node, gpus, more: Vec::new() }
    }

    fn tasks(&self) -> impl Iterator<Item = (&str, &[GpuIndex])> {
        std::iter::once((self.node.as_str(), self.gpus.as_slice()))
            .chain(self.more.iter().map(|t| (t.node.as_str(), t.gpus.as_slice())))
    }
}

/// The planner's proposal, applied through the log and re-validated there.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    pub placements: Vec<Placement>,
}

/// A change to the cluster, stamped by the leader with the time it was decided.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Command {
    pub now_ms: i64,
    pub op: Op,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Op {
    /// `request_id`, when given, makes the submit idempotent per user: a retry of a submit
    /// that already committed returns the first job instead of creating another.
    Submit {
        spec: JobSpec,
        #[serde(default)]
        request_id: Option<String>,
        /// Submit held (pending until released).
        #[serde(default)]
        hold: bool,
        /// The proposing replica's bounds on unfinished jobs (none: unbounded).
        #[serde(default)]
        limits: Option<crate::quota::SubmitLimits>,
    },
    Cancel {
        job: JobId,
        by: String,
    },
    RegisterNode {
        info: NodeInfo,
    },
    /// An agent registers `info`: with the join token (`credential_epoch` None) only a name
    /// that is not registered; with a node credential only the registration of that epoch.
    JoinNode {
        info: NodeInfo,
        credential_epoch: Option<u64>,
    },
    /// An operator forgets a node that holds no job: its name is free for the join token
    /// again and every credential issued for it is void.
    RemoveNode {
        node: String,
    },
    NodeDown {
        node: String,
        reason: String,
    },
    ApplyPlan {
        plan: Plan,
    },
    JobStarted {
        job: JobId,
        attempt: u32,
        node: String,
    },
    JobExited {
        job: JobId,
        attempt: u32,
        node: String,
        exit: RunExit,
    },
    EnforceTimeLimit {
        job: JobId,
        attempt: u32,
    },
    /// Replaces the whole policy (validated first; nothing half-applied).
    SetPolicy {
        policy: Policy,
    },
    /// Creates or replaces one QoS; `must_exist` = Some(true) updates only, Some(false) creates only.
    PutQos {
        qos: Qos,
        #[serde(default)]
        must_exist: Option<bool>,
    },
    DeleteQos {
        name: String,
    },
    /// The node noted something about the current run of `job` (e.g. its log was truncated):
    /// recorded as an event of the job, nothing else changes.
    RunNote {
        job: JobId,
        attempt: u32,
        node: String,
        kind: String,
        message: String,
    },
    /// The current run of `job` finished a checkpoint.
    Checkpointed {
        job: JobId,
        attempt: u32,
        node: String,
    },
    /// Stops `victims` on `node` so that `preemptor` can take `gpus` there (claimed for it
    /// until it starts). Re-validated whole on apply.
    Preempt {
        preemptor: JobId,
        node: String,
        victims: Vec<JobId>,
        gpus: Vec<GpuIndex>,
    },
    /// Grows running elastic job `job` to `gpus` on its node (a superset of what it holds):
    /// it restarts there with the checkpoint signal; the added GPUs are claimed for it meanwhile.
    Resize {
        job: JobId,
        attempt: u32,
        gpus: Vec<GpuIndex>,
        /// Elastic gangs: ranks 1.. of the grown run (the current ones first, then new nodes);
        /// `gpus` is then rank 0's, unchanged.
        #[serde(default)]
        more: Vec<crate::model::TaskPlacement>,
    },
    /// Replaces the burst configuration (validated whole).
    SetBurstConfig {
        config: crate::burst::BurstConfig,
    },
    /// Records launch intents before any cloud call; refused whole if any limit would be exceeded.
    BurstLaunch {
        launches: Vec<crate::burst::LaunchRequest>,
        reason: String,
    },
    /// The cloud answered an intent with an instance (or the reconciler found it by its tag).
    BurstLaunched {
        intent: u64,
        instance_id: String,
    },
    /// The launch failed; `capacity` = the cloud had no capacity (that type backs off).
    BurstLaunchFailed {
        intent: u64,
        reason: String,
        capacity: bool,
    },
    /// Terminate an intent's instance (retried by the reconciler until confirmed).
    BurstTerminate {
        intent: u64,
        reason: String,
    },
    /// The instance is terminated or vanished; its node (if any) is down.
    BurstGone {
        intent: u64,
        reason: String,
    },
    /// Records why burst holds back (a limit, no fitting type), for `kairos burst status`.
    BurstNote {
        message: String,
    },
    /// The node is going away: nothing new is placed there and its jobs are stopped with the
    /// checkpoint signal and requeued (a spot interruption notice).
    DrainNode {
        node: String,
        reason: String,
    },
    /// Keeps a pending job from starting until released.
    Hold {
        job: JobId,
        by: String,
    },
    Release {
        job: JobId,
        by: String,
    },
    /// Issues an API token (only its hash is kept).
    CreateToken {
        id: String,
        record: crate::tokens::TokenRecord,
    },
    RevokeToken {
        id: String,
    },
}

/// How a job's process ended, as its agent saw it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RunExit {
    /// The process exited with this code.
    Code(i32),
    /// The process was killed by this signal.
    Signal(i32),
    /// The agent could not start the process, or no longer has it.
    Lost(String),
}

/// One preemption, kept for `kairos preemptions`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreemptionRecord {
    pub time_ms: i64,
    pub preemptor: JobId,
    pub victim: JobId,
    pub mode: crate::policy::PreemptMode,
    pub node: String,
    /// GPU-seconds of the victim's run that are lost (since its last checkpoint, or its start).
    pub gpu_s_lost: u64,
    /// An elastic victim was shrunk to this many GPUs instead of being stopped.
    #[serde(default)]
    pub shrunk_to: Option<u32>,
    /// The victim was suspended (SIGSTOP) and resumes once the preemptor is done.
    #[serde(default)]
    pub suspended: bool,
}

impl PreemptionRecord {
    /// What happened to the victim: "requeue", "cancel", "suspend" or "shrink".
    pub fn action(&self) -> &'static str {
        match (self.shrunk_to, self.suspended) {
            (Some(_), _) => "shrink",
            (None, true) => "suspend",
            (None, false) => self.mode.as_str(),
        }
    }
}

/// What a preemption does to one victim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum VictimAction {
    /// Stop the run; then requeue or cancel it, by mode.
    Stop(crate::policy::PreemptMode),
    /// Restart an elastic job on the GPUs it keeps.
    Shrink,
    /// Restart an elastic gang on its other nodes (this node's task is released).
    ShrinkGang,
    /// SIGSTOP the job and lend its GPUs to the preemptor.
    Suspend,
}

/// Most preemption records kept.
pub const PREEMPTION_RECORDS_MAX: usize = 1000;
/// A job preempted this often within `THRASH_WINDOW_MS` is not preempted again.
pub const THRASH_PREEMPTIONS_MAX: usize = 3;
pub const THRASH_WINDOW_MS: i64 = 3600 * 1000;

/// Why a command changed nothing. Rejection is a normal outcome, not an error.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Rejection {
    NotFound(String),
    Invalid(String),
    FailedPrecondition(String),
    /// A bound on the state (`kairosd --max-jobs-per-user`, `--max-jobs`) would be passed.
    ResourceExhausted(String),
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rejection::NotFound(m)
            | Rejection::Invalid(m)
            | Rejection::FailedPrecondition(m)
            | Rejection::ResourceExhausted(m) => f.write_str(m),
        }
    }
}

/// What applying one command did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    Submitted {
        job: JobId,
    },
    Cancelled {
        job: JobId,
        was_running: bool,
    },
    NodeRegistered {
        node: String,
        /// The registration's epoch (see `Node::epoch`).
        #[serde(default)]
        epoch: u64,
    },
    NodeRemoved {
        node: String,
    },
    NodeDown {
        node: String,
        failed_jobs: Vec<JobId>,
    },
    PlanApplied {
        accepted: Vec<JobId>,
        rejected: Vec<(JobId, String)>,
    },
    RunUpdated {
        job: JobId,
        state: JobState,
    },
    PolicyChanged,
    Preempted {
        preemptor: JobId,
        victims: Vec<JobId>,
    },
    HoldChanged {
        job: JobId,
        held: bool,
    },
    /// Burst state changed; the intents created (launches) or touched.
    Burst {
        intents: Vec<u64>,
    },
    TokensChanged,
    /// A stale or duplicate report: nothing to do.
    Ignored(String),
    Rejected(Rejection),
}

/// Everything the controller cluster agrees on.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterState {
    /// The latest time stamped into an applied command; never goes backwards.
    pub now_ms: i64,
    pub next_job_id: JobId,
    pub jobs: BTreeMap<JobId, Job>,
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
    /// Decayed GPU usage per account, for fairshare.
    #[serde(default)]
    pub usage: BTreeMap<String, crate::priority::AccountUsage>,
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
    pub tokens: crate::tokens::Tokens,
    /// Ids of revoked tokens (a retried create never brings one back), with when (Unix ms).
    #[serde(default)]
    pub revoked_tokens: BTreeMap<String, i64>,
    /// The last node epoch handed out (see `Node::epoch`); only grows.
    #[serde(default)]
    pub node_epoch_seq: u64,
    /// Unfinished jobs by user (a cache of `jobs`, rebuilt when missing).
    #[serde(skip)]
    pub(crate) unfinished: crate::quota::UnfinishedIndex,
}

impl ClusterState {
    pub fn new() -> Self {
        ClusterState {
            now_ms: 0,
            next_job_id: 1,
            jobs: BTreeMap::new(),
            nodes: BTreeMap::new(),
            submit_requests: BTreeMap::new(),
            policy: Policy::default(),
            largest_node_gpus: 0,
            usage: BTreeMap::new(),
            preemptions: Default::default(),
            suspended: BTreeSet::new(),
            burst: Default::default(),
            tokens: Default::default(),
            revoked_tokens: BTreeMap::new(),
            node_epoch_seq: 0,
            unfinished: Default::default(),
        }
    }

    /// Applies one committed command.
    pub fn apply(&mut self, cmd: &Command) -> Outcome {
        // A new leader's clock may lag the old one's: time in the state never goes backwards.
        self.now_ms = self.now_ms.max(cmd.now_ms);
        let now = self.now_ms;
        let outcome = self.apply_op(&cmd.op, now);
        if !self.suspended.is_empty() {
            self.resume_ready(now);
        }
        if !self.burst.instances.is_empty() {
            self.track_burst_nodes(now);
        }
        outcome
    }

    fn apply_op(&mut self, op: &Op, now: i64) -> Outcome {
        match op {
            Op::Submit { spec, request_id, hold, limits } => {
                self.submit(spec, request_id.as_deref(), *hold, limits.as_ref(), now)
            }
            Op::Cancel { job, by } => self.cancel(*job, by, now),
            Op::RegisterNode { info } => self.register_node(info, now),
            Op::JoinNode { info, credential_epoch } => self.join_node(info, *credential_epoch, now),
            Op::RemoveNode { node } => self.remove_node(node),
            Op::NodeDown { node, reason } => self.node_down(node, reason, now),
            Op::ApplyPlan { plan } => self.apply_plan(plan, now),
            Op::JobStarted { job, attempt, node } => self.job_started(*job, *attempt, node, now),
            Op::JobExited { job, attempt, node, exit } => self.job_exited(*job, *attempt, node, exit, now),
            Op::EnforceTimeLimit { job, attempt } => self.enforce_time_limit(*job, *attempt, now),
            Op::SetPolicy { policy } => self.set_policy(policy),
            Op::Hold { job, by } => self.set_held(*job, true, by, now),
            Op::Preempt { preemptor, node, victims, gpus } => {
                self.preempt(*preemptor, node, victims, gpus, now)
            }
            Op::RunNote { job, attempt, node, kind, message } => match self.current_run(*job, *attempt, node)
            {
                Ok(j) => {
                    let kind: String = kind.chars().take(32).collect();
                    j.record(now, &kind, message.chars().take(256).collect());
                    Outcome::RunUpdated { job: *job, state: j.state }
                }
                Err(why) => Outcome::Ignored(why),
            },
            Op::Checkpointed { job, attempt, node } => match self.current_run(*job, *attempt, node) {
                Ok(j) => {
                    j.last_checkpoint_ms = Some(now);
                    Outcome::RunUpdated { job: *job, state: JobState::Running }
                }
                Err(why) => Outcome::Ignored(why),
            },
            Op::Release { job, by } => self.set_held(*job, false, by, now),
            Op::Resize { job, attempt, gpus, more } => {
                if more.is_empty() {
                    self.grow(*job, *attempt, gpus, now)
                } else {
                    self.grow_gang(*job, *attempt, gpus, more, now)
                }
            }
            Op::SetBurstConfig { config } => self.set_burst_config(config, now),
            Op::DrainNode { node, reason } => self.drain_node(node, reason, now),
            Op::CreateToken { id, record } => self.create_token(id, record),
            Op::RevokeToken { id } => self.revoke_token(id, now),
            Op::BurstLaunch { launches, reason } => self.burst_launch(launches, reason, now),
            Op::BurstLaunched { intent, instance_id } => self.burst_launched(*intent, instance_id, now),
            Op::BurstLaunchFailed { intent, reason, capacity } => {
                self.burst_launch_failed(*intent, reason, *capacity, now)
            }
            Op::BurstTerminate { intent, reason } => self.burst_terminate(*intent, reason, now),
            Op::BurstGone { intent, reason } => self.burst_gone(*intent, reason, now),
            Op::BurstNote { message } => {
                self.burst.note(now, message.chars().take(256).collect());
                Outcome::Burst { intents: Vec::new() }
            }
            Op::PutQos { qos, must_exist } => {
                match (must_exist, self.policy.qos.contains_key(&qos.name)) {
                    (Some(true), false) => {
                        return Outcome::Rejected(Rejection::NotFound(format!(
                            "qos \"{}\" not found",
                            qos.name
                        )))
                    }
                    (Some(false), true) => {
                        return Outcome::Rejected(Rejection::FailedPrecondition(format!(
                            "qos \"{}\" already exists",
                            qos.name
                        )))
                    }
                    _ => {}
                }
                let mut policy = self.policy.clone();
                policy.qos.insert(qos.name.clone(), qos.clone());
                self.set_policy(&policy)
            }
            Op::DeleteQos { name } => {
                if !self.policy.qos.contains_key(name) {
                    return Outcome::Rejected(Rejection::NotFound(format!("qos \"{name}\" not found")));
                }
                let mut policy = self.policy.clone();
                policy.qos.remove(name);
                if let Some((profile, _)) = policy.profile_qos.iter().find(|(_, q)| *q == name) {
                    return Outcome::Rejected(Rejection::FailedPrecondition(format!(
                        "qos \"{name}\" is the default of profile {}; change the submit rule first",
                        profile.as_str()
                    )));
                }
                if let Some(user) = policy.qos.values().find(|q| q.preempt.contains(name)) {
                    return Outcome::Rejected(Rejection::FailedPrecondition(format!(
                        "qos \"{name}\" is preempted by qos \"{}\"; change that first",
                        user.name
                    )));
                }
                self.set_policy(&policy)
            }
        }
    }

    /// The largest GPU count of any registered node (0 when there is none).
    pub fn largest_node_gpus(&self) -> u32 {
        self.largest_node_gpus
    }

    pub(crate) fn refresh_largest_node(&mut self) {
        self.largest_node_gpus = self.nodes.values().map(Node::gpu_count).max().unwrap_or(0);
    }

    /// A job's effective wall-clock limit in seconds.
    /// Without its own limit a job gets the tighter of its QoS's and its partition's max wall.
    pub fn time_limit_s(&self, job: &Job) -> Option<u64> {
        job.spec.time_limit_s.or_else(|| {
            let qos = self.policy.qos(&job.spec.qos).map(|q| q.max_wall_s);
            let part = self.partition_of(job).and_then(|p| p.max_wall_s);
            match (qos, part) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            }
        })
    }

    /// The jobs with a run on `node` (holding GPUs there, or suspended there), in id order:
    /// O(GPUs of the node + suspended jobs), not O(jobs).
    pub fn jobs_on(&self, node: &str) -> Vec<&Job> {
        let Some(n) = self.nodes.get(node) else { return Vec::new() };
        let mut ids: BTreeSet<JobId> = n.allocated.values().copied().collect();
        ids.extend(self.suspended.iter().filter(|id| {
            self.jobs.get(id).and_then(|j| j.allocation.as_ref()).is_some_and(|a| a.node == node)
        }));
        ids.iter().filter_map(|id| self.jobs.get(id)).collect()
    }

    /// The jobs with a run (running or suspended: a suspended job keeps its QoS usage), found
    /// through the nodes' GPU maps: O(running), not O(jobs).
    pub fn jobs_running(&self) -> impl Iterator<Item = &Job> {
        let mut ids: Vec<JobId> = self.nodes.values().flat_map(|n| n.allocated.values().copied()).collect();
        ids.extend(self.suspended.iter().copied());
        ids.sort_unstable();
        ids.dedup();
        ids.into_iter().filter_map(|id| self.jobs.get(&id))
    }

    /// GPU fragmentation of the Up nodes: (free GPUs, free GPUs on nodes that are entirely
    /// free). Packing small jobs keeps the second close to the first, so whole nodes stay
    /// available for large jobs.
    pub fn fragmentation(&self) -> (u32, u32) {
        let up = self.nodes.values().filter(|n| n.state == NodeState::Up);
        up.fold((0, 0), |(free, whole), n| {
            let f = n.gpu_count() - n.allocated.len() as u32;
            (free + f, whole + if n.allocated.is_empty() { f } else { 0 })
        })
    }

    /// Whether any Up node has a free GPU (if not, no plan can place anything).
    pub fn has_free_gpus(&self) -> bool {
        self.nodes.values().any(|n| n.state == NodeState::Up && n.allocated.len() < n.info.gpus.len())
    }

    /// The partition a job runs in (None only for jobs from before partitions existed).
    pub fn partition_of(&self, job: &Job) -> Option<&crate::policy::Partition> {
        let name =
            if job.spec.partition.is_empty() { &self.policy.default_partition } else { &job.spec.partition };
        self.policy.partitions.get(name)
    }

    /// A job's time limit in milliseconds (its QoS maximum when it set none; a year at most).
    /// Whether `job` asks for more time than its partition allows (it waits:
    /// `PendingReason::PartitionTimeLimit`; a placement of it is refused).
    pub fn over_partition_wall(&self, job: &Job) -> bool {
        self.partition_of(job)
            .and_then(|p| p.max_wall_s)
            .is_some_and(|max| self.time_limit_ms(job) > (max as i64).saturating_mul(1000))
    }

    pub fn time_limit_ms(&self, job: &Job) -> i64 {
        let secs = self.time_limit_s(job).unwrap_or(crate::validate::TIME_LIMIT_S_MAX);
        (secs.min(crate::validate::TIME_LIMIT_S_MAX) as i64).saturating_mul(1000)
    }

    /// When a running job will have ended at the latest: its start plus its time limit (plus
    /// the time it spent suspended).
    pub fn expected_end_ms(&self, job: &Job) -> i64 {
        let suspended = self.suspended_ms(job, self.now_ms);
        job.start_time_ms
            .unwrap_or(self.now_ms)
            .saturating_add(self.time_limit_ms(job))
            .saturating_add(suspended)
    }

    /// How long the current run of `job` has been suspended in all, at `now_ms`.
    fn suspended_ms(&self, job: &Job, now_ms: i64) -> i64 {
        job.suspended_ms.saturating_add(job.suspended_since.map_or(0, |t| now_ms.saturating_sub(t)))
    }

    /// Running jobs past their time limit at `now_ms` that have not been asked to stop yet.
    pub fn expired_runs(&self, now_ms: i64) -> Vec<(JobId, u32)> {
        let running: BTreeSet<JobId> =
            self.nodes.values().flat_map(|n| n.allocated.values().copied()).collect();
        running
            .iter()
            .filter_map(|id| self.jobs.get(id))
            .filter(|j| j.state == JobState::Running)
            .filter(|j| j.allocation.as_ref().is_some_and(|a| a.stop.is_none()))
            .filter(|j| self.past_limit(j, now_ms))
            .map(|j| (j.id, j.attempt))
            .collect()
    }

    fn past_limit(&self, job: &Job, now_ms: i64) -> bool {
        match (self.time_limit_s(job), job.start_time_ms) {
            (Some(limit_s), Some(start)) => {
                // Time spent suspended does not count.
                let suspended = self.suspended_ms(job, now_ms);
                now_ms.saturating_sub(start).saturating_sub(suspended)
                    >= (limit_s as i64).saturating_mul(1000)
            }
            _ => false,
        }
    }

    fn submit(
        &mut self,
        spec: &JobSpec,
        request_id: Option<&str>,
        hold: bool,
        limits: Option<&crate::quota::SubmitLimits>,
        now: i64,
    ) -> Outcome {
        if request_id.is_some_and(|r| r.is_empty() || r.len() > crate::validate::REQUEST_ID_LEN_MAX) {
            let max = crate::validate::REQUEST_ID_LEN_MAX;
            return Outcome::Rejected(Rejection::Invalid(format!("request_id: must be 1 to {max} bytes")));
        }
        if let Some(job) = request_id.and_then(|r| self.submit_requests.get(&spec.user)?.get(r)) {
            return Outcome::Submitted { job: *job };
        }
        if let Err(e) = validate_spec(spec) {
            return Outcome::Rejected(Rejection::Invalid(e.to_string()));
        }
        if let Some(limits) = limits {
            if let Err(r) = self.check_submit_limits(&spec.user, limits) {
                return Outcome::Rejected(r);
            }
        }
        let partition_name =
            if spec.partition.is_empty() { &self.policy.default_partition } else { &spec.partition };
        let Some(partition) = self.policy.partitions.get(partition_name) else {
            let name: String = spec.partition.chars().take(64).collect();
            return Outcome::Rejected(Rejection::Invalid(format!("partition: unknown partition \"{name}\"")));
        };
        let qos = match (spec.qos.is_empty(), &partition.default_qos) {
            (false, _) => self.policy.qos(&spec.qos),
            (true, Some(d)) => self.policy.qos(d),
            (true, None) => self.policy.default_qos(spec.profile),
        };
        let Some(qos) = qos else {
            let known: Vec<&str> = self.policy.qos.keys().map(String::as_str).collect();
            let name: String = spec.qos.chars().take(64).collect();
            return Outcome::Rejected(Rejection::Invalid(format!(
                "qos: unknown qos \"{name}\" (known: {})",
                known.join(", ")
            )));
        };
        if let Err(why) = Self::check_qos_fit(spec, qos) {
            return Outcome::Rejected(why);
        }
        if !partition.allowed_qos.is_empty() && !partition.allowed_qos.contains(&qos.name) {
            return Outcome::Rejected(Rejection::Invalid(format!(
                "qos \"{}\" is not allowed in partition \"{}\"",
                qos.name, partition.name
            )));
        }
        let partition_name = partition.name.clone();
        if let Some(dep) = spec.after_ok.iter().find(|d| !self.jobs.contains_key(d)) {
            return Outcome::Rejected(Rejection::NotFound(format!("after_ok: job {dep} not found")));
        }
        let (qos_name, priority) = (qos.name.clone(), qos.priority);
        let account = match self.policy.resolve_account(&spec.user, &spec.account) {
            Ok(a) => a,
            Err(why) if spec.account.is_empty() => {
                return Outcome::Rejected(Rejection::FailedPrecondition(why))
            }
            Err(why) => return Outcome::Rejected(Rejection::Invalid(why)),
        };
        // A job that may burst may also be larger than any on-prem node, up to the largest
        // allowed cloud instance type.
        let cloud = &self.burst.config;
        let may_burst = if cloud.qos.is_empty() { qos.burstable } else { cloud.qos.contains(&qos.name) };
        let largest_cloud = if cloud.enabled && may_burst {
            cloud.instance_types.iter().map(|t| t.gpus).max().unwrap_or(0)
        } else {
            0
        };
        let largest = self.largest_node_gpus().max(largest_cloud);
        if largest > 0 && spec.gpus > largest {
            return Outcome::Rejected(Rejection::FailedPrecondition(format!(
                "job requests {} GPUs but the largest node has {largest}",
                spec.gpus
            )));
        }
        let id = self.next_job_id;
        self.next_job_id += 1;
        let mut spec = spec.clone();
        spec.qos = qos_name;
        spec.account = account;
        spec.partition = partition_name;
        let mut job = Job {
            id,
            spec,
            priority,
            state: JobState::Pending,
            reason: String::new(),
            attempt: 0,
            allocation: None,
            last_node: String::new(),
            last_gpus: Vec::new(),
            last_more: Vec::new(),
            exit_code: None,
            signal: None,
            submit_time_ms: now,
            start_time_ms: None,
            end_time_ms: None,
            events: Vec::new(),
            held: hold,
            claim: None,
            preempted_at: Vec::new(),
            last_checkpoint_ms: None,
            width: None,
            tasks_now: None,
            suspended_ms: 0,
            suspended_since: None,
        };
        job.record(now, "submitted", format!("by \"{}\", qos \"{}\"", job.spec.user, job.spec.qos));
        if let Some(r) = request_id {
            self.submit_requests.entry(job.spec.user.clone()).or_default().insert(r.to_string(), id);
        }
        self.unfinished.added(&job.spec.user);
        self.jobs.insert(id, job);
        Outcome::Submitted { job: id }
    }

    /// Whether a job could ever run under `qos`: its time limit and size within the QoS maxima.
    fn check_qos_fit(spec: &JobSpec, qos: &Qos) -> Result<(), Rejection> {
        if let Some(limit) = spec.time_limit_s {
            if limit > qos.max_wall_s {
                return Err(Rejection::Invalid(format!(
                    "time_limit_s: {limit}s is more than qos \"{}\" allows ({}s)",
                    qos.name, qos.max_wall_s
                )));
            }
        }
        if let Some(grace) = spec.checkpoint_grace_s.filter(|g| *g > qos.grace_s) {
            return Err(Rejection::Invalid(format!(
                "checkpoint.grace_s: {grace}s is more than qos \"{}\" allows ({}s)",
                qos.name, qos.grace_s
            )));
        }
        for (what, limit) in [("in total", qos.grp_gpus), ("per user", qos.user_gpus)] {
            if let Some(max) = limit.filter(|max| spec.total_gpus() > *max) {
                return Err(Rejection::FailedPrecondition(format!(
                    "job requests {} GPUs but qos \"{}\" allows {max} GPUs {what}",
                    spec.total_gpus(),
                    qos.name
                )));
            }
        }
        Ok(())
    }

    /// Replaces the policy after validating it whole; a QoS still used by an unfinished job
    /// cannot disappear.
    fn set_policy(&mut self, policy: &Policy) -> Outcome {
        if let Err(e) = policy.validate() {
            return Outcome::Rejected(Rejection::Invalid(e.to_string()));
        }
        // Nothing an unfinished job refers to may disappear.
        let unfinished = || self.jobs.values().filter(|j| !j.state.is_terminal());
        let missing = unfinished()
            .find_map(|j| (!policy.qos.contains_key(&j.spec.qos)).then_some(("qos", &j.spec.qos, j.id)))
            .or_else(|| {
                unfinished().find_map(|j| {
                    (!policy.accounts.contains_key(&j.spec.account)).then_some((
                        "account",
                        &j.spec.account,
                        j.id,
                    ))
                })
            })
            .or_else(|| {
                unfinished().find_map(|j| {
                    let gone =
                        !j.spec.partition.is_empty() && !policy.partitions.contains_key(&j.spec.partition);
                    gone.then_some(("partition", &j.spec.partition, j.id))
                })
            });
        if let Some((what, name, job)) = missing {
            return Outcome::Rejected(Rejection::FailedPrecondition(format!(
                "{what} \"{name}\" is in use by job {job}"
            )));
        }
        self.policy = policy.clone();
        // Priorities follow the QoS; pending and running jobs take the new values.
        for job in self.jobs.values_mut().filter(|j| !j.state.is_terminal()) {
            if let Some(q) = self.policy.qos.get(&job.spec.qos) {
                job.priority = q.priority;
            }
        }
        Outcome::PolicyChanged
    }

    /// Whether `job` could preempt anything at all: its QoS preempts some QoS, or its partition
    /// is above the lowest tier (a cheap filter before looking for victims).
    pub fn may_preempt(&self, job: &Job) -> bool {
        let by_qos = self.policy.qos(&job.spec.qos).is_some_and(|q| !q.preempt.is_empty());
        let lowest = self.policy.partitions.values().map(|p| p.priority_tier).min().unwrap_or(0);
        by_qos || self.partition_of(job).is_some_and(|p| p.priority_tier > lowest)
    }

    /// Whether running job `victim` may be preempted by `preemptor` at `now`, else why not.
    pub fn preemptible(&self, preemptor: &Job, victim: &Job, now: i64) -> Result<(), String> {
        let (p_qos, v_qos) = (self.policy.qos(&preemptor.spec.qos), self.policy.qos(&victim.spec.qos));
        let (Some(p_qos), Some(v_qos)) = (p_qos, v_qos) else { return Err("unknown qos".into()) };
        let alloc = victim.allocation.as_ref().ok_or("not running")?;
        if victim.state != JobState::Running || alloc.stop.is_some() {
            return Err(format!("job {} is not running undisturbed", victim.id));
        }
        // Slurm's preempt/qos and preempt/partition_prio: by QoS preempt list, or from a
        // partition of a higher priority tier.
        let tier = |j: &Job| self.partition_of(j).map(|p| p.priority_tier).unwrap_or(0);
        if !p_qos.preempt.contains(&v_qos.name) && tier(preemptor) <= tier(victim) {
            return Err(format!(
                "qos \"{}\" may not preempt qos \"{}\" and its partition tier is not higher",
                p_qos.name, v_qos.name
            ));
        }
        if v_qos.preempt_mode == crate::policy::PreemptMode::Off {
            return Err(format!("qos \"{}\" is never preempted", v_qos.name));
        }
        if alloc.task_count() > 1 && victim.tasks() <= victim.spec.min_tasks.unwrap_or(u32::MAX) {
            return Err(format!("job {} is a gang that cannot release a node", victim.id));
        }
        let ran_ms = now.saturating_sub(victim.start_time_ms.unwrap_or(now));
        if ran_ms < (v_qos.preempt_exempt_s as i64).saturating_mul(1000) {
            return Err(format!("job {} is inside its preempt-exempt time", victim.id));
        }
        let recent = victim.preempted_at.iter().filter(|t| now - **t < THRASH_WINDOW_MS).count();
        if recent >= THRASH_PREEMPTIONS_MAX {
            return Err(format!("job {} was preempted {recent} times in the last hour", victim.id));
        }
        Ok(())
    }

    fn preempt(
        &mut self,
        preemptor: JobId,
        node: &str,
        victims: &[JobId],
        gpus: &[GpuIndex],
        now: i64,
    ) -> Outcome {
        let reject = |m: String| Outcome::Rejected(Rejection::FailedPrecondition(m));
        let Some(p) = self.jobs.get(&preemptor) else {
            return Outcome::Rejected(Rejection::NotFound(format!("job {preemptor} not found")));
        };
        if p.state != JobState::Pending || p.claim.is_some() || p.held || p.spec.tasks > 1 {
            return reject(format!("job {preemptor} cannot preempt now"));
        }
        if victims.is_empty() || gpus.len() != p.gpus() as usize {
            return reject("a preemption needs victims and exactly the preemptor's GPU count".into());
        }
        // The GPUs: of a node open to the preemptor, each free or a victim's, claimed by nobody.
        if let Err(e) = self.check_grant(p, node, gpus, Some(p.gpus()), Taking::FromVictims(victims)) {
            return reject(e.to_string());
        }
        for v in victims {
            let Some(victim) = self.jobs.get(v) else { return reject(format!("job {v} not found")) };
            if let Err(why) = self.preemptible(p, victim, now) {
                return reject(why);
            }
            if victim.allocation.as_ref().is_none_or(|a| a.rank_on(node).is_none()) {
                return reject(format!("job {v} does not run on \"{node}\""));
            }
        }
        // What happens to each victim: shrink, suspend, or stop (requeue / cancel).
        let mut actions = Vec::with_capacity(victims.len());
        for v in victims {
            let victim = &self.jobs[v];
            // The victim's task on this node (rank 0's for a single-node job).
            let held = victim
                .allocation
                .as_ref()
                .and_then(|a| a.tasks().find(|(_, n, _)| *n == node).map(|(_, _, g)| g))
                .unwrap_or_default();
            let taken: Vec<GpuIndex> = held.iter().copied().filter(|g| gpus.contains(g)).collect();
            if taken.is_empty() {
                return reject(format!("job {v} gives none of the GPUs"));
            }
            actions.push((*v, self.victim_action(victim, taken.len() as u32), taken));
        }
        // Commit: victims stop, shrink or pause; the GPUs are claimed for the preemptor.
        for (v, action, taken) in actions {
            let victim = self.jobs.get_mut(&v).expect("validated");
            let held = victim.total_gpus();
            let safe_at =
                victim.start_time_ms.unwrap_or(now).max(victim.last_checkpoint_ms.unwrap_or(i64::MIN));
            let lost_s = now.saturating_sub(safe_at).max(0) as u64 / 1000;
            let mut record = PreemptionRecord {
                time_ms: now,
                preemptor,
                victim: v,
                mode: crate::policy::PreemptMode::Requeue,
                node: node.to_string(),
                gpu_s_lost: u64::from(held) * lost_s,
                shrunk_to: None,
                suspended: false,
            };
            let alloc = victim.allocation.as_mut().expect("a victim runs");
            let message = match action {
                VictimAction::Stop(mode) => {
                    alloc.stop = Some(StopReason::Preempted { by: preemptor, mode });
                    record.mode = mode;
                    format!("by job {preemptor}, mode {}, {} GPU-s lost", mode.as_str(), record.gpu_s_lost)
                }
                VictimAction::ShrinkGang => {
                    alloc.stop = Some(StopReason::Resize { by: Some(preemptor) });
                    // Every other node of the gang is kept (claimed for the next run).
                    let kept: Vec<(String, Vec<GpuIndex>)> = alloc
                        .tasks()
                        .filter(|(_, n, _)| *n != node)
                        .map(|(_, n, g)| (n.to_string(), g.to_vec()))
                        .collect();
                    record.shrunk_to = Some(kept.iter().map(|(_, g)| g.len() as u32).sum());
                    for (n, gs) in &kept {
                        if let Some(n) = self.nodes.get_mut(n) {
                            for g in gs {
                                n.claimed.insert(*g, v);
                            }
                        }
                    }
                    format!(
                        "by job {preemptor}: releasing node \"{node}\", {} nodes remain, {} GPU-s lost",
                        kept.len(),
                        record.gpu_s_lost
                    )
                }
                VictimAction::Shrink => {
                    alloc.stop = Some(StopReason::Resize { by: Some(preemptor) });
                    let kept: Vec<GpuIndex> =
                        alloc.gpus.iter().copied().filter(|g| !taken.contains(g)).collect();
                    record.shrunk_to = Some(kept.len() as u32);
                    let n = self.nodes.get_mut(node).expect("validated");
                    for g in &kept {
                        n.claimed.insert(*g, v);
                    }
                    format!(
                        "by job {preemptor}: shrinking to {} GPUs, {} GPU-s lost",
                        kept.len(),
                        record.gpu_s_lost
                    )
                }
                VictimAction::Suspend => {
                    alloc.lent = taken.clone();
                    victim.state = JobState::Suspended;
                    victim.suspended_since = Some(now);
                    record.mode = crate::policy::PreemptMode::Suspend;
                    record.suspended = true;
                    record.gpu_s_lost = 0;
                    self.suspended.insert(v);
                    let n = self.nodes.get_mut(node).expect("validated");
                    n.allocated.retain(|g, holder| *holder != v || !taken.contains(g));
                    format!("by job {preemptor}: suspended, GPUs {taken:?} lent until it ends")
                }
            };
            let victim = self.jobs.get_mut(&v).expect("validated");
            victim.preempted_at.push(now);
            if victim.preempted_at.len() > 16 {
                victim.preempted_at.remove(0);
            }
            victim.record(now, "preempted", message);
            self.preemptions.push_back(record);
            if self.preemptions.len() > PREEMPTION_RECORDS_MAX {
                self.preemptions.pop_front();
            }
        }
        let n = self.nodes.get_mut(node).expect("validated");
        for g in gpus {
            n.claimed.insert(*g, preemptor);
        }
        let p = self.jobs.get_mut(&preemptor).expect("validated");
        p.claim = Some(crate::model::Claim { node: node.to_string(), gpus: gpus.to_vec(), more: Vec::new() });
        p.record(now, "preempting", format!("jobs {victims:?} on \"{node}\" for GPUs {gpus:?}"));
        Outcome::Preempted { preemptor, victims: victims.to_vec() }
    }

    /// How preemption treats `victim` when `taken` of its GPUs go to the preemptor: an elastic
    /// job that keeps at least its minimum is shrunk; a suspendable one under a SUSPEND QoS is
    /// paused; otherwise its QoS mode decides (SUSPEND without `suspendable` requeues).
    fn victim_action(&self, victim: &Job, taken: u32) -> VictimAction {
        use crate::policy::PreemptMode;
        if victim.allocation.as_ref().is_some_and(|a| a.task_count() > 1) {
            // Only an elastic gang above its minimum is preemptible at all (`preemptible`).
            return VictimAction::ShrinkGang;
        }
        let kept = victim.gpus().saturating_sub(taken);
        if victim.spec.is_elastic() && kept > 0 && victim.spec.min_gpus.is_some_and(|m| kept >= m) {
            return VictimAction::Shrink;
        }
        match self.policy.qos(&victim.spec.qos).map(|q| q.preempt_mode) {
            Some(PreemptMode::Suspend) if victim.spec.suspendable => VictimAction::Suspend,
            Some(PreemptMode::Suspend | PreemptMode::Requeue) => VictimAction::Stop(PreemptMode::Requeue),
            _ => VictimAction::Stop(PreemptMode::Cancel),
        }
    }

    /// Whether preempting `victim` to take `taken` of its GPUs loses no work (it is suspended).
    pub fn preemption_is_free(&self, victim: &Job, taken: u32) -> bool {
        self.victim_action(victim, taken) == VictimAction::Suspend
    }

    /// Resumes every suspended job whose lent GPUs are free again (no holder, no claim).
    fn resume_ready(&mut self, now: i64) {
        let ready: Vec<JobId> = self
            .suspended
            .iter()
            .copied()
            .filter(|id| {
                let Some(job) = self.jobs.get(id) else { return false };
                let Some(a) = job.allocation.as_ref().filter(|a| a.stop.is_none()) else { return false };
                let Some(n) = self.nodes.get(&a.node).filter(|n| n.state == NodeState::Up) else {
                    return false;
                };
                job.state == JobState::Suspended
                    && a.lent.iter().all(|g| !n.allocated.contains_key(g) && !n.claimed.contains_key(g))
            })
            .collect();
        for id in ready {
            self.suspended.remove(&id);
            let job = self.jobs.get_mut(&id).expect("checked");
            let a = job.allocation.as_mut().expect("checked");
            let lent = std::mem::take(&mut a.lent);
            let node = self.nodes.get_mut(&a.node).expect("checked");
            for g in &lent {
                node.allocated.insert(*g, id);
            }
            job.state = JobState::Running;
            job.suspended_ms += job.suspended_since.take().map_or(0, |t| now.saturating_sub(t));
            job.record(now, "resumed", format!("GPUs {lent:?} are back"));
        }
    }

    /// Drains `name`: Draining (nothing new placed), every run there stopped with the checkpoint
    /// signal and requeued on exit; a burst node's instance is terminated.
    fn drain_node(&mut self, name: &str, reason: &str, now: i64) -> Outcome {
        let reason: String = reason.chars().take(256).collect();
        let Some(node) = self.nodes.get_mut(name) else {
            return Outcome::Rejected(Rejection::NotFound(format!("node \"{name}\" not found")));
        };
        match node.state {
            NodeState::Up => {
                node.state = NodeState::Draining;
                node.reason = format!("draining: {reason}");
            }
            NodeState::Draining if node.reason.starts_with("draining:") => {
                return Outcome::Ignored(format!("node \"{name}\" is already draining"))
            }
            NodeState::Draining => node.reason = format!("draining: {reason}"),
            NodeState::Down => return Outcome::Ignored(format!("node \"{name}\" is down")),
        }
        // Preemptors waiting for GPUs here plan again elsewhere.
        let claimers: BTreeSet<JobId> = node.claimed.values().copied().collect();
        for c in claimers {
            self.drop_claim(c);
        }
        let jobs: Vec<JobId> = self.jobs_on(name).iter().map(|j| j.id).collect();
        for id in jobs {
            let Some(job) = self.jobs.get_mut(&id) else { continue };
            let Some(alloc) = job.allocation.as_mut() else { continue };
            // Runs already stopping for good keep their reason; a preempted or resizing run
            // would come back here, so it is drained too.
            if matches!(alloc.stop, None | Some(StopReason::Preempted { .. } | StopReason::Resize { .. })) {
                alloc.stop = Some(StopReason::Drained);
                job.record(now, "drain", format!("node \"{name}\" is draining: {reason}"));
            }
            self.drop_claim(id);
        }
        if let Some(intent) = self.burst.intent_of_node(name) {
            self.burst_terminate(intent, &reason, now);
        }
        Outcome::NodeDown { node: name.to_string(), failed_jobs: Vec::new() }
    }

    /// Whether running `job` may grow to `gpus` GPUs within its QoS limits.
    pub fn may_grow(&self, job: &Job, gpus: u32, tasks: u32) -> bool {
        let usage = Usage::of(self.jobs_running().filter(|j| j.id != job.id), &self.policy);
        let mut grown = job.clone();
        grown.width = Some(gpus);
        grown.tasks_now = Some(tasks);
        usage.admits(&grown, &self.policy).is_ok()
    }

    /// Grows a running elastic gang onto more nodes (see `Op::Resize`), re-validated whole.
    fn grow_gang(
        &mut self,
        id: JobId,
        attempt: u32,
        gpus: &[GpuIndex],
        more: &[crate::model::TaskPlacement],
        now: i64,
    ) -> Outcome {
        let reject = |m: String| Outcome::Rejected(Rejection::FailedPrecondition(m));
        let Some(job) = self.jobs.get(&id) else {
            return Outcome::Rejected(Rejection::NotFound(format!("job {id} not found")));
        };
        let Some(a) = job.allocation.as_ref().filter(|a| a.stop.is_none()) else {
            return reject(format!("job {id} is not running undisturbed"));
        };
        if job.state != JobState::Running || job.attempt != attempt || !job.spec.is_elastic_gang() {
            return reject(format!("job {id} attempt {attempt} is not a running elastic gang"));
        }
        let total = 1 + more.len() as u32;
        if gpus != a.gpus.as_slice()
            || !more.starts_with(&a.more)
            || total <= a.task_count()
            || total > job.spec.tasks
        {
            return reject(format!(
                "job {id}: not a growth of its {} nodes within {}",
                a.task_count(),
                job.spec.tasks
            ));
        }
        let mut used: BTreeSet<&str> = a.tasks().map(|(_, n, _)| n).collect();
        for t in &more[a.more.len()..] {
            if !used.insert(t.node.as_str()) {
                return reject(format!("job {id}: two tasks on \"{}\"", t.node));
            }
            if let Err(e) = self.check_grant(job, &t.node, &t.gpus, Some(job.gpus()), Taking::Free) {
                return reject(e.to_string());
            }
        }
        if !self.may_grow(job, job.gpus(), total) {
            return reject(format!("job {id}: growing to {total} nodes would exceed a qos limit"));
        }
        let claims: Vec<(String, Vec<GpuIndex>)> = std::iter::once((a.node.clone(), a.gpus.clone()))
            .chain(more.iter().map(|t| (t.node.clone(), t.gpus.clone())))
            .collect();
        for (node, gs) in &claims {
            if let Some(n) = self.nodes.get_mut(node) {
                for g in gs {
                    n.claimed.insert(*g, id);
                }
            }
        }
        let job = self.jobs.get_mut(&id).expect("checked");
        job.allocation.as_mut().expect("checked").stop = Some(StopReason::Resize { by: None });
        job.record(now, "resizing", format!("growing to {total} nodes"));
        Outcome::RunUpdated { job: id, state: JobState::Running }
    }

    /// Grows a running elastic job to `gpus` (see `Op::Resize`), re-validated whole.
    fn grow(&mut self, id: JobId, attempt: u32, gpus: &[GpuIndex], now: i64) -> Outcome {
        let reject = |m: String| Outcome::Rejected(Rejection::FailedPrecondition(m));
        let Some(job) = self.jobs.get(&id) else {
            return Outcome::Rejected(Rejection::NotFound(format!("job {id} not found")));
        };
        let Some(a) = job.allocation.as_ref().filter(|a| a.stop.is_none() && a.more.is_empty()) else {
            return reject(format!("job {id} is not running undisturbed"));
        };
        if job.state != JobState::Running || job.attempt != attempt || !job.spec.is_elastic() {
            return reject(format!("job {id} attempt {attempt} is not a running elastic job"));
        }
        let wanted: BTreeSet<GpuIndex> = gpus.iter().copied().collect();
        if wanted.len() != gpus.len()
            || wanted.len() as u32 > job.spec.gpus
            || wanted.len() <= a.gpus.len()
            || !a.gpus.iter().all(|g| wanted.contains(g))
        {
            return reject(format!(
                "job {id}: {gpus:?} does not grow {:?} within {} GPUs",
                a.gpus, job.spec.gpus
            ));
        }
        let added: Vec<GpuIndex> = wanted.iter().copied().filter(|g| !a.gpus.contains(g)).collect();
        if let Err(e) = self.check_grant(job, &a.node, &added, None, Taking::Free) {
            return reject(e.to_string());
        }
        if !self.may_grow(job, wanted.len() as u32, 1) {
            return reject(format!("job {id}: growing to {} GPUs would exceed a qos limit", wanted.len()));
        }
        let node = a.node.clone();
        let n = self.nodes.get_mut(&node).expect("checked");
        for g in &wanted {
            n.claimed.insert(*g, id);
        }
        let job = self.jobs.get_mut(&id).expect("checked");
        job.allocation.as_mut().expect("checked").stop = Some(StopReason::Resize { by: None });
        job.record(now, "resizing", format!("growing to {} GPUs {gpus:?}", gpus.len()));
        Outcome::RunUpdated { job: id, state: JobState::Running }
    }

    /// A resized run's process is gone: the job goes back to the queue as its next attempt,
    /// holding a claim on exactly the GPUs of its new size (claimed when the resize began).
    fn resized_run_ended(&mut self, id: JobId, by: Option<JobId>, now: i64) -> Outcome {
        let Some(alloc) = self.jobs.get(&id).and_then(|j| j.allocation.as_ref()) else {
            return Outcome::Ignored(format!("job {id} has no run"));
        };
        let gang = self.jobs.get(&id).is_some_and(|j| j.spec.tasks > 1);
        // The next run's tasks: its nodes in rank order, then nodes claimed to grow a gang.
        let mut order: Vec<String> = alloc.tasks().map(|(_, n, _)| n.to_string()).collect();
        if gang {
            let more = self
                .nodes
                .iter()
                .filter(|(name, n)| !order.contains(name) && n.claimed.values().any(|h| *h == id));
            let more: Vec<String> = more.map(|(name, _)| name.clone()).collect();
            order.extend(more);
        }
        let target: Vec<(String, Vec<GpuIndex>)> = order
            .into_iter()
            .filter_map(|name| {
                let gpus: Vec<GpuIndex> = self
                    .nodes
                    .get(&name)?
                    .claimed
                    .iter()
                    .filter(|(_, h)| **h == id)
                    .map(|(g, _)| *g)
                    .collect();
                (!gpus.is_empty()).then_some((name, gpus))
            })
            .collect();
        let gpus: usize = target.iter().map(|(_, g)| g.len()).sum();
        let reason = match (by, gang) {
            (Some(p), true) => format!("shrunk for job {p} to {} nodes", target.len()),
            (None, true) => format!("grown to {} nodes", target.len()),
            (Some(p), false) => format!("shrunk for job {p} to {gpus} GPUs"),
            (None, false) => format!("grown to {gpus} GPUs"),
        };
        self.requeue_run(id, &reason, now);
        let mut tasks = target.into_iter();
        if let Some((node, first)) = tasks.next() {
            let more: Vec<crate::model::TaskPlacement> =
                tasks.map(|(node, gpus)| crate::model::TaskPlacement { node, gpus }).collect();
            let claim = crate::model::Claim { node, gpus: first, more };
            for (n, gs) in claim.tasks() {
                if let Some(n) = self.nodes.get_mut(n) {
                    for g in gs {
                        n.claimed.insert(*g, id);
                    }
                }
            }
            if let Some(job) = self.jobs.get_mut(&id) {
                if gang {
                    job.tasks_now = Some(1 + claim.more.len() as u32);
                } else {
                    job.width = Some(claim.gpus.len() as u32);
                }
                job.claim = Some(claim);
            }
        }
        Outcome::RunUpdated { job: id, state: JobState::Pending }
    }

    /// A preempted run's process is gone: requeue it (next attempt) or cancel it, by mode.
    fn preempted_run_ended(
        &mut self,
        id: JobId,
        by: JobId,
        mode: crate::policy::PreemptMode,
        now: i64,
    ) -> Outcome {
        let reason = format!("preempted by job {by}");
        if mode == crate::policy::PreemptMode::Requeue {
            // Requeue regardless of --requeue: the cluster, not the job, stopped it.
            self.requeue_run(id, &reason, now);
            return Outcome::RunUpdated { job: id, state: JobState::Pending };
        }
        self.end_run(id, JobState::Cancelled, reason, now);
        Outcome::RunUpdated { job: id, state: JobState::Cancelled }
    }

    /// Drops every claim of a job: a pending job's (it was cancelled or placed, or its node went
    /// down) and a resizing run's on its node.
    pub(crate) fn drop_claim(&mut self, id: JobId) {
        let Some(job) = self.jobs.get_mut(&id) else { return };
        let mut names: Vec<String> = Vec::new();
        if let Some(c) = job.claim.take() {
            names.extend(c.tasks().map(|(n, _)| n.to_string()));
        }
        if let Some(a) = job.allocation.as_ref() {
            names.extend(a.tasks().map(|(_, n, _)| n.to_string()));
        }
        for name in names {
            if let Some(node) = self.nodes.get_mut(&name) {
                node.claimed.retain(|_, holder| *holder != id);
            }
        }
    }

    fn set_held(&mut self, id: JobId, held: bool, by: &str, now: i64) -> Outcome {
        let Some(job) = self.jobs.get_mut(&id) else {
            return Outcome::Rejected(Rejection::NotFound(format!("job {id} not found")));
        };
        if job.state != JobState::Pending {
            let verb = if held { "held" } else { "released" };
            return Outcome::Rejected(Rejection::FailedPrecondition(format!(
                "job {id} is {}; only pending jobs can be {verb}",
                job.state.as_str()
            )));
        }
        if job.held != held {
            job.held = held;
            job.record(now, if held { "held" } else { "released" }, format!("by \"{by}\""));
        }
        Outcome::HoldChanged { job: id, held }
    }

    /// Whether the job's dependencies let it start: `Ok` when all completed, else the reason.
    pub fn dependency_state(&self, job: &Job) -> Result<(), crate::planner::PendingReason> {
        use crate::planner::PendingReason;
        for dep in &job.spec.after_ok {
            match self.jobs.get(dep).map(|d| d.state) {
                Some(JobState::Completed) => {}
                Some(s) if s.is_terminal() => return Err(PendingReason::DependencyNeverSatisfied(*dep)),
                _ => return Err(PendingReason::Dependency),
            }
        }
        Ok(())
    }

    fn cancel(&mut self, id: JobId, by: &str, now: i64) -> Outcome {
        let Some(job) = self.jobs.get_mut(&id) else {
            return Outcome::Rejected(Rejection::NotFound(format!("job {id} not found")));
        };
        match job.state {
            JobState::Pending => {
                self.unfinished.ended(&job.spec.user);
                job.state = JobState::Cancelled;
                job.reason = format!("cancelled by \"{by}\"");
                job.end_time_ms = Some(now);
                job.record(now, "cancelled", format!("by \"{by}\" while pending"));
                self.drop_claim(id);
                Outcome::Cancelled { job: id, was_running: false }
            }
            JobState::Running | JobState::Suspended => {
                if let Some(alloc) = job.allocation.as_mut() {
                    // A preempted or resizing run would come back; a cancel ends it for good.
                    let stopping_for_good = matches!(
                        alloc.stop,
                        Some(StopReason::Cancelled | StopReason::TimeLimit | StopReason::TaskFailed)
                    );
                    if !stopping_for_good {
                        alloc.stop = Some(StopReason::Cancelled);
                        job.record(now, "cancel-requested", format!("by \"{by}\""));
                    }
                }
                // A resizing run no longer needs the GPUs of its next run.
                self.drop_claim(id);
                Outcome::Cancelled { job: id, was_running: true }
            }
            state => Outcome::Rejected(Rejection::FailedPrecondition(format!(
                "job {id} already ended ({})",
                state.as_str()
            ))),
        }
    }

    pub(crate) fn register_node(&mut self, info: &NodeInfo, now: i64) -> Outcome {
        if let Err(e) = validate_node(info) {
            return Outcome::Rejected(Rejection::Invalid(e.to_string()));
        }
        if let Err(why) = self.check_burst_node(info) {
            return Outcome::Rejected(Rejection::FailedPrecondition(why));
        }
        let present: BTreeSet<GpuIndex> = info.gpus.iter().map(|g| g.index).collect();
        // Runs on a GPU that vanished (held, or lent while suspended) are lost; claims on one
        // are dropped (the claimer plans again).
        let lost: Vec<JobId> = self
            .jobs_on(&info.name)
            .iter()
            .filter(|j| {
                j.allocation.as_ref().is_some_and(|a| {
                    a.tasks().any(|(_, n, gpus)| n == info.name && gpus.iter().any(|g| !present.contains(g)))
                })
            })
            .map(|j| j.id)
            .collect();
        for job in lost {
            self.fail_run(job, JobState::NodeFail, "GPU vanished from its node".into(), now);
        }
        let claimers: BTreeSet<JobId> = self
            .nodes
            .get(&info.name)
            .map(|n| n.claimed.iter().filter(|(g, _)| !present.contains(g)).map(|(_, j)| *j).collect())
            .unwrap_or_default();
        for job in claimers {
            self.drop_claim(job);
        }
        match self.nodes.get_mut(&info.name) {
            Some(node) => {
                node.info = info.clone();
                // A draining node stays draining when its agent reconnects.
                if node.state != NodeState::Draining {
                    node.state = NodeState::Up;
                    node.reason.clear();
                }
            }
            None => {
                let node = Node {
                    info: info.clone(),
                    state: NodeState::Up,
                    reason: String::new(),
                    allocated: BTreeMap::new(),
                    claimed: BTreeMap::new(),
                    epoch: self.node_epoch_seq + 1,
                };
                self.node_epoch_seq += 1;
                self.nodes.insert(info.name.clone(), node);
            }
        }
        self.refresh_largest_node();
        let epoch = self.nodes.get(&info.name).map(|n| n.epoch).unwrap_or_default();
        Outcome::NodeRegistered { node: info.name.clone(), epoch }
    }

    pub(crate) fn node_down(&mut self, name: &str, reason: &str, now: i64) -> Outcome {
        let Some(node) = self.nodes.get_mut(name) else {
            return Outcome::Rejected(Rejection::NotFound(format!("node \"{name}\" not found")));
        };
        if node.state == NodeState::Down {
            return Outcome::Ignored(format!("node \"{name}\" is already down"));
        }
        node.state = NodeState::Down;
        node.reason = reason.to_string();
        let claimers: BTreeSet<JobId> = node.claimed.values().copied().collect();
        for c in claimers {
            self.drop_claim(c);
        }
        let jobs: BTreeSet<JobId> = self.jobs_on(name).iter().map(|j| j.id).collect();
        for &job in &jobs {
            let gang =
                self.jobs.get(&job).and_then(|j| j.allocation.as_ref()).is_some_and(|a| a.task_count() > 1);
            if gang {
                // Its task here is lost; the tasks on healthy nodes are stopped and release
                // their GPUs as they exit.
                self.gang_task_exited(
                    job,
                    name,
                    &RunExit::Lost(format!("node \"{name}\" down: {reason}")),
                    now,
                );
            } else {
                self.fail_run(job, JobState::NodeFail, format!("node \"{name}\" down: {reason}"), now);
            }
        }
        Outcome::NodeDown { node: name.to_string(), failed_jobs: jobs.into_iter().collect() }
    }

    fn apply_plan(&mut self, plan: &Plan, now: i64) -> Outcome {
        let mut accepted = Vec::new();
        let mut rejected = Vec::new();
        let mut usage = Usage::of(self.jobs_running(), &self.policy);
        for (i, p) in plan.placements.iter().enumerate() {
            if i >= PLAN_PLACEMENTS_MAX {
                rejected.push((p.job, "plan too large".to_string()));
                continue;
            }
            let checked = self.check_placement(p).and_then(|()| {
                let job = &self.jobs[&p.job];
                usage.admits(job, &self.policy).map_err(|r| format!("job {}: {r}", p.job))?;
                usage.add(job, &self.policy);
                Ok(())
            });
            match checked {
                Ok(()) => {
                    self.place(p, now);
                    accepted.push(p.job);
                }
                Err(why) => rejected.push((p.job, why)),
            }
        }
        Outcome::PlanApplied { accepted, rejected }
    }

    /// Re-validates one placement against the current state.
    fn check_placement(&self, p: &Placement) -> Result<(), String> {
        let job = self.jobs.get(&p.job).ok_or_else(|| format!("job {} not found", p.job))?;
        if job.state != JobState::Pending {
            return Err(format!("job {} is {}, not pending", p.job, job.state.as_str()));
        }
        if job.held {
            return Err(format!("job {} is held", p.job));
        }
        self.dependency_state(job).map_err(|r| format!("job {}: {r}", p.job))?;
        let tasks: Vec<(&str, &[GpuIndex])> = p.tasks().collect();
        if tasks.len() != job.tasks() as usize {
            return Err(format!("job {} needs {} tasks, plan gives {}", p.job, job.tasks(), tasks.len()));
        }
        let distinct: BTreeSet<&str> = tasks.iter().map(|(n, _)| *n).collect();
        if distinct.len() != tasks.len() {
            return Err(format!("job {}: two tasks on one node", p.job));
        }
        if self.over_partition_wall(job) {
            return Err(format!("job {}: {}", p.job, crate::planner::PendingReason::PartitionTimeLimit));
        }
        for (name, gpus) in tasks {
            self.check_grant(job, name, gpus, Some(job.gpus()), Taking::Free).map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    fn place(&mut self, p: &Placement, now: i64) {
        self.drop_claim(p.job);
        for (name, gpus) in p.tasks() {
            let node = self.nodes.get_mut(name).expect("placement was validated");
            for gpu in gpus {
                node.allocated.insert(*gpu, p.job);
            }
        }
        let job = self.jobs.get_mut(&p.job).expect("placement was validated");
        job.state = JobState::Running;
        job.reason.clear();
        job.last_checkpoint_ms = None;
        job.suspended_ms = 0;
        job.suspended_since = None;
        job.allocation = Some(Allocation {
            node: p.node.clone(),
            gpus: p.gpus.clone(),
            more: p.more.clone(),
            started: false,
            stop: None,
            exits: BTreeMap::new(),
            failure: None,
            lent: Vec::new(),
        });
        job.last_node = p.node.clone();
        job.last_gpus = p.gpus.clone();
        job.last_more = p.more.clone();
        job.start_time_ms = Some(now);
        let mut msg = format!("node \"{}\" GPUs {:?}", p.node, p.gpus);
        for t in &p.more {
            msg.push_str(&format!(", node \"{}\" GPUs {:?}", t.node, t.gpus));
        }
        job.record(now, "allocated", msg);
    }

    /// The running job's allocation, if `job`/`attempt`/`node` name its current run.
    fn current_run(&mut self, id: JobId, attempt: u32, node: &str) -> Result<&mut Job, String> {
        let job = self.jobs.get_mut(&id).ok_or_else(|| format!("job {id} not found"))?;
        let matches = matches!(job.state, JobState::Running | JobState::Suspended)
            && job.attempt == attempt
            && job.allocation.as_ref().is_some_and(|a| a.rank_on(node).is_some());
        if matches {
            Ok(job)
        } else {
            Err(format!("job {id} attempt {attempt} on \"{node}\" is not a current run"))
        }
    }

    fn job_started(&mut self, id: JobId, attempt: u32, node: &str, now: i64) -> Outcome {
        let job = match self.current_run(id, attempt, node) {
            Ok(job) => job,
            Err(why) => return Outcome::Ignored(why),
        };
        let alloc = job.allocation.as_mut().expect("current run has an allocation");
        if alloc.started {
            return Outcome::Ignored(format!("job {id} already started"));
        }
        alloc.started = true;
        job.start_time_ms = Some(now);
        job.record(now, "started", format!("on \"{node}\""));
        Outcome::RunUpdated { job: id, state: JobState::Running }
    }

    fn job_exited(&mut self, id: JobId, attempt: u32, node: &str, exit: &RunExit, now: i64) -> Outcome {
        let job = match self.current_run(id, attempt, node) {
            Ok(job) => job,
            Err(why) => return Outcome::Ignored(why),
        };
        if job.allocation.as_ref().is_some_and(|a| a.task_count() > 1) {
            return self.gang_task_exited(id, node, exit, now);
        }
        let stop = job.allocation.as_ref().and_then(|a| a.stop);
        match stop {
            Some(StopReason::Preempted { by, mode }) => return self.preempted_run_ended(id, by, mode, now),
            Some(StopReason::Resize { by }) => return self.resized_run_ended(id, by, now),
            Some(StopReason::Drained) => {
                // The cluster, not the job, stopped it: requeue regardless of --requeue.
                self.requeue_run(id, "its node was drained", now);
                return Outcome::RunUpdated { job: id, state: JobState::Pending };
            }
            _ => {}
        }
        let (state, reason) = match (stop, exit) {
            (Some(StopReason::Cancelled), _) => (JobState::Cancelled, "cancelled".to_string()),
            (Some(StopReason::TimeLimit), _) => (JobState::Timeout, "time limit reached".to_string()),
            (Some(StopReason::TaskFailed), _) => (JobState::Failed, "a task failed".to_string()),
            (Some(StopReason::Preempted { .. } | StopReason::Resize { .. } | StopReason::Drained), _) => {
                unreachable!("handled above")
            }
            (None, RunExit::Code(0)) => (JobState::Completed, String::new()),
            (None, RunExit::Code(c)) => (JobState::Failed, format!("exit code {c}")),
            (None, RunExit::Signal(s)) => (JobState::Failed, format!("killed by signal {s}")),
            (None, RunExit::Lost(m)) => (JobState::Failed, format!("lost: {m}")),
        };
        match exit {
            RunExit::Code(c) => job.exit_code = Some(*c),
            RunExit::Signal(s) => job.signal = Some(*s),
            RunExit::Lost(_) => {}
        }
        let state = if matches!(exit, RunExit::Lost(_)) && stop.is_none() {
            // The cluster, not the job, lost this run: requeue it where the job allows.
            self.fail_run(id, state, reason, now)
        } else {
            self.end_run(id, state, reason, now);
            state
        };
        Outcome::RunUpdated { job: id, state }
    }

    /// One task of a gang ended. Its GPUs are released at once (its process is gone); the
    /// first failure stops the other tasks; the job ends when every task has ended.
    fn gang_task_exited(&mut self, id: JobId, node: &str, exit: &RunExit, now: i64) -> Outcome {
        let Some(job) = self.jobs.get_mut(&id) else {
            return Outcome::Ignored(format!("job {id} not found"));
        };
        let Some(alloc) = job.allocation.as_mut() else {
            return Outcome::Ignored(format!("job {id} has no run"));
        };
        let Some(rank) = alloc.rank_on(node) else {
            return Outcome::Ignored(format!("no task of job {id} on \"{node}\""));
        };
        if alloc.exits.contains_key(&rank) {
            return Outcome::Ignored(format!("rank {rank} of job {id} already ended"));
        }
        let (code, failure) = match exit {
            RunExit::Code(0) => (0, None),
            RunExit::Code(c) => (*c, Some(format!("rank {rank} on \"{node}\" exited with code {c}"))),
            RunExit::Signal(s) => (-*s, Some(format!("rank {rank} on \"{node}\" was killed by signal {s}"))),
            RunExit::Lost(m) => (LOST_EXIT, Some(format!("rank {rank} on \"{node}\" lost: {m}"))),
        };
        alloc.exits.insert(rank, code);
        let first_failure = failure.filter(|_| alloc.failure.is_none() && alloc.stop.is_none());
        if let Some(f) = &first_failure {
            alloc.stop = Some(StopReason::TaskFailed);
            alloc.failure = Some(f.clone());
        }
        let done = alloc.exits.len() as u32 == alloc.task_count();
        let (stop, failure) = (alloc.stop, alloc.failure.clone());
        if let Some(f) = first_failure {
            match exit {
                RunExit::Code(c) => job.exit_code = Some(*c),
                RunExit::Signal(s) => job.signal = Some(*s),
                RunExit::Lost(_) => {}
            }
            job.record(now, "task-failed", format!("{f}; stopping the other tasks"));
        }
        // The cluster lost a task (node down, agent lost it): requeue where the job allows.
        let lost = stop == Some(StopReason::TaskFailed)
            && self
                .jobs
                .get(&id)
                .and_then(|j| j.allocation.as_ref())
                .is_some_and(|a| a.exits.values().any(|c| *c == LOST_EXIT));
        if let Some(n) = self.nodes.get_mut(node) {
            n.allocated.retain(|_, holder| *holder != id);
        }
        if !done {
            return Outcome::RunUpdated { job: id, state: JobState::Running };
        }
        let (state, reason) = match stop {
            Some(StopReason::Cancelled) => (JobState::Cancelled, "cancelled".to_string()),
            Some(StopReason::TimeLimit) => (JobState::Timeout, "time limit reached".to_string()),
            Some(StopReason::TaskFailed) => (JobState::Failed, failure.unwrap_or_default()),
            Some(StopReason::Preempted { by, .. }) => (JobState::Cancelled, format!("preempted by job {by}")),
            Some(StopReason::Resize { by }) => return self.resized_run_ended(id, by, now),
            Some(StopReason::Drained) => {
                self.requeue_run(id, "a node of the gang was drained", now);
                return Outcome::RunUpdated { job: id, state: JobState::Pending };
            }
            None => {
                if let Some(j) = self.jobs.get_mut(&id) {
                    j.exit_code = Some(0);
                }
                (JobState::Completed, String::new())
            }
        };
        let state = if lost && state == JobState::Failed {
            self.fail_run(id, JobState::NodeFail, reason, now)
        } else {
            self.end_run(id, state, reason, now);
            state
        };
        Outcome::RunUpdated { job: id, state }
    }

    fn enforce_time_limit(&mut self, id: JobId, attempt: u32, now: i64) -> Outcome {
        let past = self.jobs.get(&id).is_some_and(|j| self.past_limit(j, now));
        let Some(job) = self.jobs.get_mut(&id) else {
            return Outcome::Ignored(format!("job {id} not found"));
        };
        if job.state != JobState::Running || job.attempt != attempt || !past {
            return Outcome::Ignored(format!("job {id} attempt {attempt} is not past its limit"));
        }
        let Some(alloc) = job.allocation.as_mut() else {
            return Outcome::Ignored(format!("job {id} has no allocation"));
        };
        if alloc.stop.is_some() {
            return Outcome::Ignored(format!("job {id} is already stopping"));
        }
        alloc.stop = Some(StopReason::TimeLimit);
        job.record(now, "time-limit", "wall-clock limit reached, stopping".into());
        Outcome::RunUpdated { job: id, state: JobState::Running }
    }

    /// Ends a run the cluster lost (node down, run lost): the job goes back to Pending with the
    /// next attempt when it allows requeue and has attempts left, else ends in `state`.
    /// Returns the job's new state.
    fn fail_run(&mut self, id: JobId, state: JobState, reason: String, now: i64) -> JobState {
        let requeue = self.jobs.get(&id).is_some_and(|j| j.spec.requeue && j.attempt + 1 < ATTEMPTS_MAX);
        if !requeue {
            self.end_run(id, state, reason, now);
            return state;
        }
        self.requeue_run(id, &reason, now);
        JobState::Pending
    }

    /// Charges the GPU time of `job`'s current run to its account and the account's ancestors.
    fn charge_run(&mut self, id: JobId, now: i64) {
        let Some(job) = self.jobs.get(&id) else { return };
        let Some(start) = job.start_time_ms else { return };
        // Suspended time is not charged: the GPUs were lent to the preemptor.
        let suspended = self.suspended_ms(job, now);
        let ran_ms = now.saturating_sub(start).saturating_sub(suspended).max(0);
        let gpu_ms = u128::from(job.gpus()) * ran_ms as u128;
        if gpu_ms == 0 {
            return;
        }
        let half_life = self.policy.weights.fairshare_half_life_s;
        for account in self.policy.account_chain(&job.spec.account) {
            self.usage.entry(account).or_default().charge(gpu_ms, now, half_life);
        }
    }

    /// Takes a job's allocation and frees every GPU it holds or claims.
    fn release_run(&mut self, id: JobId) {
        self.drop_claim(id);
        self.suspended.remove(&id);
        let Some(job) = self.jobs.get_mut(&id) else { return };
        job.suspended_since = None;
        let Some(alloc) = job.allocation.take() else { return };
        for (_, name, _) in alloc.tasks() {
            if let Some(node) = self.nodes.get_mut(name) {
                node.allocated.retain(|_, holder| *holder != id);
            }
        }
    }

    /// Sends a job's current run back to the queue as its next attempt (usage charged, GPUs freed).
    fn requeue_run(&mut self, id: JobId, reason: &str, now: i64) {
        self.charge_run(id, now);
        self.release_run(id);
        let Some(job) = self.jobs.get_mut(&id) else { return };
        job.attempt += 1;
        job.state = JobState::Pending;
        job.exit_code = None;
        job.signal = None;
        job.start_time_ms = None;
        job.reason.clear();
        job.record(now, "requeued", format!("{reason}; attempt {} follows", job.attempt));
    }

    /// Ends a job's current run in a terminal state and releases its GPUs.
    fn end_run(&mut self, id: JobId, state: JobState, reason: String, now: i64) {
        debug_assert!(state.is_terminal());
        if self.jobs.get(&id).is_some_and(|j| j.allocation.is_some()) {
            self.charge_run(id, now);
        }
        self.release_run(id);
        let Some(job) = self.jobs.get_mut(&id) else { return };
        if !job.state.is_terminal() {
            self.unfinished.ended(&job.spec.user);
        }
        job.state = state;
        job.end_time_ms = Some(now);
        job.record(now, &state.as_str().to_ascii_lowercase(), reason.clone());
        job.reason = reason;
    }

    /// Checks the ownership invariants; used by tests and debug assertions.
    ///
    /// - every allocated GPU exists on its node and is held by a running job that lists it;
    /// - every running job's GPUs are held by it, on an existing node;
    /// - no GPU is held by two jobs (by construction of the per-node map, checked both ways).
    pub fn check_invariants(&self) -> Result<(), String> {
        self.check_unfinished_index()?;
        for (name, node) in &self.nodes {
            for (gpu, holder) in &node.allocated {
                if !node.info.gpus.iter().any(|g| g.index == *gpu) {
                    return Err(format!("node {name} allocates missing GPU {gpu}"));
                }
                let job = self.jobs.get(holder).ok_or(format!("GPU held by unknown job {holder}"))?;
                let alloc = job
                    .allocation
                    .as_ref()
                    .ok_or(format!("job {holder} holds GPU {gpu} without allocation"))?;
                let listed = alloc.tasks().any(|(rank, n, gpus)| {
                    n == name.as_str() && gpus.contains(gpu) && !alloc.exits.contains_key(&rank)
                }) && !alloc.lent.contains(gpu);
                if !matches!(job.state, JobState::Running | JobState::Suspended) || !listed {
                    return Err(format!("GPU {gpu} of {name} held by job {holder} which does not own it"));
                }
            }
        }
        for (name, node) in &self.nodes {
            for (gpu, claimer) in &node.claimed {
                let ok = self.jobs.get(claimer).is_some_and(|j| match j.state {
                    JobState::Pending => j
                        .claim
                        .as_ref()
                        .is_some_and(|c| c.tasks().any(|(n, gs)| n == name.as_str() && gs.contains(gpu))),
                    // A resizing run claims the GPUs of its next run (on its own nodes, or for a
                    // grown gang, on new ones).
                    JobState::Running => j
                        .allocation
                        .as_ref()
                        .is_some_and(|a| matches!(a.stop, Some(StopReason::Resize { .. }))),
                    _ => false,
                });
                if !ok {
                    return Err(format!(
                        "GPU {gpu} of {name} is claimed by job {claimer} which has no such claim"
                    ));
                }
            }
        }
        for job in self.jobs.values() {
            if (job.state == JobState::Suspended) != self.suspended.contains(&job.id) {
                return Err(format!(
                    "job {} is {} but the suspended set disagrees",
                    job.id,
                    job.state.as_str()
                ));
            }
            match (&job.allocation, job.state) {
                (Some(alloc), JobState::Running | JobState::Suspended) => {
                    if !alloc.lent.is_empty() && job.state != JobState::Suspended {
                        return Err(format!("job {} lends GPUs but is not suspended", job.id));
                    }
                    if alloc.task_count() != job.tasks() {
                        return Err(format!(
                            "job {} runs {} of {} tasks",
                            job.id,
                            alloc.task_count(),
                            job.tasks()
                        ));
                    }
                    let nodes: BTreeSet<&str> = alloc.tasks().map(|(_, n, _)| n).collect();
                    if nodes.len() != alloc.task_count() as usize {
                        return Err(format!("job {} has two tasks on one node", job.id));
                    }
                    for (rank, name, gpus) in alloc.tasks().filter(|(r, _, _)| !alloc.exits.contains_key(r)) {
                        let node = self.nodes.get(name).ok_or(format!("job {} on unknown node", job.id))?;
                        if gpus.len() != job.gpus() as usize {
                            return Err(format!("job {} rank {rank} has {} GPUs", job.id, gpus.len()));
                        }
                        for gpu in gpus.iter().filter(|g| !alloc.lent.contains(g)) {
                            if node.allocated.get(gpu) != Some(&job.id) {
                                return Err(format!("job {} lists GPU {gpu} it does not hold", job.id));
                            }
                        }
                    }
                }
                (None, JobState::Running | JobState::Suspended) => {
                    return Err(format!("running job {} has no allocation", job.id))
                }
                (Some(_), _) => return Err(format!("job {} is not running but has an allocation", job.id)),
                (None, _) => {}
            }
        }
        Ok(())
    }
}

//! The log's vocabulary: commands (`Op`), what applying one did (`Outcome`), plans and
//! placements, run exits and preemption records. Persistent format: every change here must
//! stay readable from logs and snapshots written before it (serde defaults, new variants last).

use super::*;

/// How a gang task the cluster lost is recorded among the ranks' exits.
pub(crate) const LOST_EXIT: i32 = i32::MIN;

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

impl Op {
    /// The node whose registration or state this operation may change (what the cluster's
    /// event log compares before and after).
    pub(crate) fn node_changed(&self) -> Option<&str> {
        match self {
            Op::RegisterNode { info } | Op::JoinNode { info, .. } => Some(&info.name),
            Op::RemoveNode { node }
            | Op::NodeDown { node, .. }
            | Op::DrainNode { node, .. }
            | Op::ResumeNode { node, .. } => Some(node),
            _ => None,
        }
    }
}

impl Placement {
    pub fn single(job: JobId, node: String, gpus: Vec<GpuIndex>) -> Placement {
        Placement { job, node, gpus, more: Vec::new() }
    }

    pub(crate) fn tasks(&self) -> impl Iterator<Item = (&str, &[GpuIndex])> {
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
    /// How much time the cluster's timeline has skipped in all, as the stamping replica knew
    /// it (`crate::clock`): never counted as time a run ran.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub skipped_ms: i64,
    pub op: Op,
}

fn is_zero(v: &i64) -> bool {
    *v == 0
}

// A submit carries a whole job spec, inline: ops are built once per command and moved into a
// log entry, never held in bulk, so the size of the largest variant costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
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
        limits: Option<crate::state::quota::SubmitLimits>,
    },
    /// Finished jobs leave the live state for the history (`crate::state::history`); apply re-checks
    /// that each is finished and has been for `retention.job_ms`.
    PurgeJobs {
        jobs: Vec<JobId>,
        retention: crate::state::history::Retention,
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
        /// Who applied it and the what-if they confirmed (`crate::state::events`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        audit: Option<crate::state::events::PolicyAudit>,
    },
    /// Replaces the topology above the nodes (validated first).
    SetTopology {
        topology: crate::topology::Topology,
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
    /// Stops running `victims` (they requeue) so the QoS headrooms have their idle GPUs again.
    /// Re-validated whole on apply: a shortfall exists, each victim may be preempted by a QoS
    /// with headroom, and no more are stopped than needed (all but the last fall short).
    Vacate {
        victims: Vec<JobId>,
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
        /// Runs there go on (only nothing new is placed): a failed health check drains this
        /// way unless the agent is told to requeue.
        #[serde(default)]
        keep_runs: bool,
    },
    /// A draining node takes work again. `only_reason` (a prefix) resumes only a drain whose
    /// reason starts with it: an agent whose health check passes again undoes its own drain,
    /// never an operator's.
    ResumeNode {
        node: String,
        #[serde(default)]
        only_reason: Option<String>,
    },
    /// GPU `gpu` of `node` is unhealthy (a fatal XID, a double-bit ECC error, NVML lost it):
    /// it is never granted again until reset, and the run on it is stopped and requeued.
    /// `uuid`, when given, must be the GPU's (a report about a GPU since replaced is refused).
    GpuFault {
        node: String,
        gpu: GpuIndex,
        uuid: String,
        reason: String,
    },
    /// An operator returns an unhealthy GPU to service.
    GpuReset {
        node: String,
        gpu: GpuIndex,
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
        record: crate::state::tokens::TokenRecord,
    },
    RevokeToken {
        id: String,
    },
    /// Creates or replaces one account or partition (`must_exist` as for `PutQos`); the
    /// resulting policy is validated whole, like `SetPolicy`, but concurrent edits of other
    /// pieces are not lost.
    PutPolicyItem {
        item: crate::policy::PolicyItem,
        #[serde(default)]
        must_exist: Option<bool>,
    },
    /// Deletes one account or partition (refused while an unfinished job uses it).
    DeletePolicyItem {
        kind: crate::policy::PolicyKind,
        name: String,
    },
    /// What the current run of `job` used on `node` (its cgroup's peak memory, CPU time, and
    /// whether the kernel's OOM killer struck in it), reported just before its exit.
    RunUsage {
        job: JobId,
        attempt: u32,
        node: String,
        usage: crate::model::RunUsage,
    },
    /// The current run of `job` on `node` has had its GPUs idle (below its idle GPU rule's
    /// threshold) since `since_ms` (the agent's clock, capped at now), or is busy again (None).
    RunIdle {
        job: JobId,
        attempt: u32,
        node: String,
        since_ms: Option<i64>,
    },
    /// Creates (`must_exist` Some(false)), replaces (Some(true)) or puts a reservation
    /// (`crate::reservation`); validated whole against the nodes, the policy and the other
    /// reservations.
    PutReservation {
        reservation: crate::reservation::Reservation,
        must_exist: Option<bool>,
    },
    DeleteReservation {
        name: String,
    },
    /// Carries out what reservations' windows opening and closing at the command's time
    /// decide (binds GPU counts, stops the runs on reserved resources, ends one-off ones);
    /// proposed by the leader when `ClusterState::reservations_due`.
    ReservationTick,
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
    /// Another team's borrower taken for a preemptor within its guarantee: the preemptor's
    /// account, and the GPUs the victim's team gave back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reclaimed_for: Option<String>,
    #[serde(default)]
    pub reclaimed_gpus: u32,
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

/// Why a command changed nothing. Rejection is a normal outcome, not an error.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Rejection {
    NotFound(String),
    Invalid(String),
    FailedPrecondition(String),
    /// A bound on the state (`kairosd --max-jobs-per-user`, `--max-jobs`) would be passed.
    ResourceExhausted(String),
    /// The caller may not do this (a QoS its account does not allow).
    PermissionDenied(String),
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rejection::NotFound(m)
            | Rejection::Invalid(m)
            | Rejection::FailedPrecondition(m)
            | Rejection::ResourceExhausted(m)
            | Rejection::PermissionDenied(m) => f.write_str(m),
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
    /// A node's GPU health or drain changed (`GpuFault`, `GpuReset`, `ResumeNode`); the jobs
    /// whose runs were stopped for it.
    NodeChanged {
        node: String,
        stopped: Vec<JobId>,
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
    TopologyChanged,
    ReservationChanged {
        name: String,
    },
    /// Windows opened and closed by `Op::ReservationTick`, and the runs it stopped.
    ReservationsTicked {
        opened: Vec<String>,
        closed: Vec<String>,
        stopped: Vec<JobId>,
    },
    Preempted {
        preemptor: JobId,
        victims: Vec<JobId>,
    },
    /// Runs stopped for the headroom (`Op::Vacate`).
    Vacated {
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
    /// Finished jobs moved from the live state into the history.
    Purged {
        jobs: u32,
    },
    /// A stale or duplicate report: nothing to do.
    Ignored(String),
    Rejected(Rejection),
}

//! Domain types of the cluster: nodes, GPUs, jobs and their events.
//!
//! These are plain Rust types owned by the scheduling core. They are serialised only as part of
//! the replicated state (Raft log entries and snapshots), which is a versioned persistent format:
//! add fields with `#[serde(default)]`, never change the meaning of an existing one.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use crate::fit::{CpuMem, GPU_MILLI};

/// A job's identifier, assigned in submit order by the state machine.
pub type JobId = u64;

/// A GPU's index on its node (as NVML and `CUDA_VISIBLE_DEVICES` number them).
pub type GpuIndex = u32;

/// Most events kept per job; older ones are dropped first.
pub const JOB_EVENTS_MAX: usize = 64;

/// What kind of work a job is; selects the default QoS and later policies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Profile {
    Training,
    Inference,
    /// (What a history record of an earlier version, which kept no profile, reads as.)
    #[default]
    Batch,
    /// An interactive allocation (`kairos alloc`): its command runs on a terminal its user
    /// attaches to, and it ends `Completed` with that command's exit code, whatever it is.
    Interactive,
}

impl Profile {
    pub fn as_str(self) -> &'static str {
        match self {
            Profile::Training => "training",
            Profile::Inference => "inference",
            Profile::Batch => "batch",
            Profile::Interactive => "interactive",
        }
    }
}

/// One GPU of a node as the agent discovered it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gpu {
    pub index: GpuIndex,
    pub uuid: String,
    pub model: String,
    pub memory_mib: u64,
    /// GPUs with the same group share an NVLink/PCIe domain.
    pub link_group: u32,
    /// A MIG instance: the index of the GPU it is carved from (`index` is then the instance's
    /// own, `model` its profile).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_parent: Option<u32>,
}

/// A node as its agent describes itself when registering.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    pub name: String,
    /// Address of the agent's log service.
    pub addr: String,
    pub gpus: Vec<Gpu>,
    pub cpus: u32,
    pub memory_mib: u64,
    pub labels: BTreeMap<String, String>,
    pub gpu_backend: String,
    /// How the agent isolates runs: "cgroup2" (a cgroup per run), or "pgroup" (process groups
    /// only, where no cgroup can be created), plus the Unix account runs execute as
    /// ("submitter" or "agent"), e.g. "cgroup2,submitter".
    #[serde(default)]
    pub isolation: String,
}

/// How the reason of a drain its node's health-check program caused begins (after
/// "draining: "): only such a drain ends when the program passes again.
pub const HEALTH_CHECK_REASON: &str = "health check: ";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeState {
    Up,
    Draining,
    Down,
}

/// A GPU machine known to the cluster, with the GPUs currently granted to jobs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    pub info: NodeInfo,
    pub state: NodeState,
    /// Why the node is not Up (empty when it is).
    pub reason: String,
    /// GPU index -> the job holding it. The only record of GPU ownership.
    pub allocated: BTreeMap<GpuIndex, JobId>,
    /// GPU index -> the pending preemptor it is promised to (no other job may take it).
    #[serde(default)]
    pub claimed: BTreeMap<GpuIndex, JobId>,
    /// Which registration of this name this is: the node credential is derived from the name
    /// and the epoch, so removing a node (`Op::RemoveNode`) voids every credential issued
    /// for it before.
    #[serde(default)]
    pub epoch: u64,
    /// Every job with a live task on this node -> the CPUs and memory that task holds. The only
    /// record of CPU and memory use (a CPU-only job holds no GPU, so it is listed only here).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub held: BTreeMap<JobId, CpuMem>,
    /// GPU index -> why it is unhealthy (its agent saw a fatal XID, a double-bit ECC error, or
    /// the GPU stopped answering). Such a GPU is never granted until an operator resets it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub faults: BTreeMap<GpuIndex, GpuFault>,
    /// GPU index -> the jobs holding fractions of it (job -> thousandths). A shared GPU is in
    /// no job's `allocated`: it is the only record of fractional ownership.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub shared: BTreeMap<GpuIndex, BTreeMap<JobId, u32>>,
}

/// Why and since when a GPU is unhealthy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuFault {
    /// What the agent saw, e.g. "XID 79" or "NVML: GPU is lost".
    pub reason: String,
    pub since_ms: i64,
}

impl Node {
    /// The CPUs and memory jobs may be granted on this node (what the agent reported,
    /// reservations for the system already taken out).
    pub fn capacity(&self) -> CpuMem {
        CpuMem { cpus: self.info.cpus, mem_mib: self.info.memory_mib }
    }

    /// The CPUs and memory held by jobs.
    pub fn used(&self) -> CpuMem {
        self.held.values().fold(CpuMem::default(), |a, s| a.plus(*s))
    }

    /// The CPUs and memory not held by any job.
    pub fn free_cpu_mem(&self) -> CpuMem {
        self.capacity().minus(self.used())
    }

    pub fn gpu_count(&self) -> u32 {
        self.info.gpus.len() as u32
    }

    /// Whether GPU `gpu` is healthy.
    pub fn healthy(&self, gpu: GpuIndex) -> bool {
        !self.faults.contains_key(&gpu)
    }

    /// Whether GPU `gpu` may be granted whole: healthy and not shared by fractions.
    pub fn usable(&self, gpu: GpuIndex) -> bool {
        self.healthy(gpu) && !self.shared.contains_key(&gpu)
    }

    /// The healthy GPUs (whole, or shared by fractions for now).
    pub fn healthy_gpus(&self) -> impl Iterator<Item = &Gpu> {
        self.info.gpus.iter().filter(|g| self.healthy(g.index))
    }

    /// Thousandths of GPU `gpu` that fractions hold.
    pub fn shared_milli(&self, gpu: GpuIndex) -> u32 {
        self.shared.get(&gpu).map_or(0, |s| s.values().sum())
    }

    /// The GPUs that may be granted whole (every GPU but the unhealthy and the shared ones).
    pub fn usable_gpus(&self) -> impl Iterator<Item = &Gpu> {
        self.info.gpus.iter().filter(|g| self.usable(g.index))
    }

    /// Indices of healthy GPUs not held by any job, in ascending order.
    pub fn free_gpus(&self) -> Vec<GpuIndex> {
        self.usable_gpus().map(|g| g.index).filter(|i| !self.allocated.contains_key(i)).collect()
    }

    /// How many healthy GPUs no job holds.
    pub fn free_gpu_count(&self) -> u32 {
        self.usable_gpus().filter(|g| !self.allocated.contains_key(&g.index)).count() as u32
    }
}

/// What a user asked for. Only fields the core honours today are here; the API edge rejects
/// requests that use anything else.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSpec {
    pub name: String,
    pub user: String,
    pub argv: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub workdir: String,
    /// `workdir` is the submit directory (sbatch's default), entered where it can be.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub workdir_is_submit_dir: bool,
    pub gpus: u32,
    /// CPUs per task (node), resolved at submit (0: none asked for, the job shares the node's
    /// cores nobody was granted).
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub cpus: u32,
    /// Host memory per task (node) in MiB, resolved at submit (0: none reserved, no limit).
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub mem_mib: u64,
    /// Resolved QoS name (the API edge fills in the profile's default).
    pub qos: String,
    pub profile: Profile,
    /// Wall-clock limit; `None` means the QoS maximum.
    pub time_limit_s: Option<u64>,
    /// Requeue (next attempt) instead of ending when the cluster loses the run (node failure).
    #[serde(default)]
    pub requeue: bool,
    /// Start only after all these jobs completed successfully (an array's id: every task).
    #[serde(default)]
    pub after_ok: Vec<JobId>,
    /// Start only after all these jobs ended, however (Slurm's `afterany`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after_any: Vec<JobId>,
    /// Start only after all these jobs ended and one of them (a task of an array) did not
    /// complete (Slurm's `afternotok`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after_not_ok: Vec<JobId>,
    /// Failed runs (a non-zero exit, a signal) started again before the job fails
    /// (Kubernetes' `backoffLimit`).
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub retries: u32,
    /// A fraction of one GPU in thousandths (1..=999; 0: whole GPUs): `gpus` is then 1 and the
    /// job shares that GPU with other fractions (its QoS must allow sharing).
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub gpu_milli: u32,
    /// Only GPUs whose model contains this (case-insensitive), e.g. "H100".
    #[serde(default)]
    pub gpu_model: Option<String>,
    /// Fairshare account (resolved at submit; "" asks for the user's default).
    #[serde(default)]
    pub account: String,
    /// Partition (resolved at submit; "" asks for the cluster's default).
    #[serde(default)]
    pub partition: String,
    /// Gang jobs: this many tasks, each on its own node with `gpus` GPUs (all or nothing).
    #[serde(default = "one_task")]
    pub tasks: u32,
    /// Elastic jobs: the fewest GPUs the job can run on. Preemption shrinks such a job (restart
    /// on fewer GPUs) instead of stopping it, and it grows back when GPUs free up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_gpus: Option<u32>,
    /// Elastic gangs: the fewest nodes (tasks) the gang can run on. Preemption releases whole
    /// nodes of it (restart on fewer) instead of stopping it, and it grows back later.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_tasks: Option<u32>,
    /// The job tolerates SIGSTOP/SIGCONT: a SUSPEND-mode preemption pauses it instead.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub suspendable: bool,
    /// The signal that asks the job to checkpoint before a requeue or resize, sent first with the grace ending at the checkpoint report; without one a preempted job gets SIGTERM at once and SIGKILL when its grace ends (as Slurm).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_signal: Option<Box<str>>,
    /// How long the job may take to checkpoint and exit (at most, and by default, the QoS grace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_grace_s: Option<u64>,
    /// The W3C trace context of the submit that created the job (set by the controller), so
    /// the pass that places it and the agent that launches it join one trace per job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<Box<str>>,
    /// A job array (`crate::array`): in a submit, every index; in each task, its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array: Option<Box<ArraySpec>>,
    /// Run inside this container image (None: the node's own userspace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<Box<Container>>,
    /// Place the tasks inside one domain of a topology level (`crate::topology`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<Box<crate::topology::TopologyAsk>>,
    /// The reservation it runs in (`--reservation`, `crate::reservation`): only on its
    /// resources, only while its window is open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation: Option<Box<str>>,
    /// `Profile::Interactive`: how long (s) the job lives with no client attached to its
    /// terminal (0: `KEEP_ALIVE_DEFAULT_S`).
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub keep_alive_s: u32,
}

/// How long an interactive job lives with no client attached, unless it asks otherwise.
pub const KEEP_ALIVE_DEFAULT_S: u32 = 60;
/// The longest keep-alive a job may ask for.
pub const KEEP_ALIVE_MAX_S: u32 = 24 * 3600;

/// A job's container: its image, host paths bound into it, and its working directory there.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Container {
    /// `oci:/layout[:tag]`, `oci-archive:/image.tar[:tag]`, or a registry reference.
    pub image: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<ContainerMount>,
    /// Inside the container ("" : the job's directory, bound in at its own path).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub workdir: String,
}

/// A host path bound into a container.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerMount {
    pub src: String,
    pub dst: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_only: bool,
}

impl ContainerMount {
    /// `SRC:DST` or `SRC:DST:ro` (`:rw` too), both absolute.
    pub fn parse(text: &str) -> Option<ContainerMount> {
        let parts: Vec<&str> = text.split(':').collect();
        let (src, dst, read_only) = match parts.as_slice() {
            [src, dst] => (*src, *dst, false),
            [src, dst, "ro"] => (*src, *dst, true),
            [src, dst, "rw"] => (*src, *dst, false),
            _ => return None,
        };
        Some(ContainerMount { src: src.to_string(), dst: dst.to_string(), read_only })
    }

    /// Back to `SRC:DST[:ro]`.
    pub fn text(&self) -> String {
        format!("{}:{}{}", self.src, self.dst, if self.read_only { ":ro" } else { "" })
    }
}

/// A job array: one submit, one job ("task") per index, like Slurm's `--array=0-31:2,40%4`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArraySpec {
    /// In a submit: every index (ascending, distinct). In a task: empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub indices: Vec<u32>,
    /// How many tasks of the array may run at once (`%N`; None: no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_running: Option<u32>,
    /// In a task: the array's id (its first task's job id), its index, and the task count.
    #[serde(default)]
    pub id: JobId,
    #[serde(default)]
    pub index: u32,
    #[serde(default)]
    pub count: u32,
}

/// How a job depends on another (Slurm's `--dependency` types kairos has).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DependencyKind {
    AfterOk,
    AfterAny,
    AfterNotOk,
}

impl DependencyKind {
    /// The job spec's field.
    pub fn field(self) -> &'static str {
        match self {
            DependencyKind::AfterOk => "after_ok",
            DependencyKind::AfterAny => "after_any",
            DependencyKind::AfterNotOk => "after_not_ok",
        }
    }
}

fn one_task() -> u32 {
    1
}

impl JobSpec {
    /// Every job it depends on, and how.
    pub fn dependencies(&self) -> impl Iterator<Item = (DependencyKind, JobId)> + '_ {
        let ok = self.after_ok.iter().map(|d| (DependencyKind::AfterOk, *d));
        let any = self.after_any.iter().map(|d| (DependencyKind::AfterAny, *d));
        ok.chain(any).chain(self.after_not_ok.iter().map(|d| (DependencyKind::AfterNotOk, *d)))
    }

    /// A single-task batch job of `user` running `argv` on `gpus` GPUs, everything else at its
    /// default (QoS and account resolved at submit).
    pub fn new(name: &str, user: &str, argv: Vec<String>, gpus: u32) -> JobSpec {
        JobSpec {
            name: name.to_string(),
            user: user.to_string(),
            argv,
            env: BTreeMap::new(),
            workdir: String::new(),
            workdir_is_submit_dir: false,
            gpus,
            cpus: 0,
            mem_mib: 0,
            qos: String::new(),
            profile: Profile::Batch,
            time_limit_s: None,
            requeue: false,
            after_ok: Vec::new(),
            after_any: Vec::new(),
            after_not_ok: Vec::new(),
            retries: 0,
            gpu_milli: 0,
            gpu_model: None,
            account: String::new(),
            partition: String::new(),
            tasks: 1,
            min_gpus: None,
            min_tasks: None,
            suspendable: false,
            checkpoint_signal: None,
            checkpoint_grace_s: None,
            traceparent: None,
            array: None,
            container: None,
            topology: None,
            reservation: None,
            keep_alive_s: 0,
        }
    }

    /// Whether preemption may shrink the job (fewer GPUs) instead of stopping it.
    pub fn is_elastic(&self) -> bool {
        self.min_gpus.is_some_and(|m| m < self.gpus) && self.tasks <= 1
    }

    /// Whether preemption may release whole nodes of this gang instead of stopping it.
    pub fn is_elastic_gang(&self) -> bool {
        self.min_tasks.is_some_and(|m| m < self.tasks) && self.tasks > 1
    }

    /// GPUs of all tasks together.
    pub fn total_gpus(&self) -> u32 {
        self.gpus.saturating_mul(self.tasks.max(1))
    }

    /// The CPUs and memory each task holds on its node.
    pub fn cpu_mem(&self) -> CpuMem {
        CpuMem { cpus: self.cpus, mem_mib: self.mem_mib }
    }
}

fn is_zero_u32(v: &u32) -> bool {
    *v == 0
}

fn is_zero_u64(v: &u64) -> bool {
    *v == 0
}

/// Whether a GPU model name satisfies a job's model constraint ("H100" matches
/// "NVIDIA H100 80GB HBM3"); a set of models is written with `|` ("V100M16|V100M32": any).
pub fn model_matches(constraint: Option<&str>, model: &str) -> bool {
    let Some(c) = constraint else { return true };
    // Case-insensitive substring test without allocating.
    let m = model.as_bytes();
    let contains = |c: &[u8]| c.len() <= m.len() && m.windows(c.len()).any(|w| w.eq_ignore_ascii_case(c));
    // One model (the usual case) without splitting; a set is `|`-separated.
    if !c.as_bytes().contains(&b'|') {
        return contains(c.as_bytes());
    }
    c.split('|').any(|c| contains(c.trim().as_bytes()))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum JobState {
    Pending,
    Running,
    Completed,
    Failed,
    Cancelled,
    Timeout,
    NodeFail,
    /// Stopped with SIGSTOP by a SUSPEND preemption; keeps its allocation, part of which is
    /// lent to the preemptor, and resumes (SIGCONT) when the lent GPUs are free again.
    Suspended,
    /// The kernel's OOM killer ended it at its memory limit (nothing else on the node touched).
    OutOfMemory,
}

impl JobState {
    pub fn is_terminal(self) -> bool {
        !matches!(self, JobState::Pending | JobState::Running | JobState::Suspended)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Pending => "PENDING",
            JobState::Running => "RUNNING",
            JobState::Completed => "COMPLETED",
            JobState::Failed => "FAILED",
            JobState::Cancelled => "CANCELLED",
            JobState::Timeout => "TIMEOUT",
            JobState::NodeFail => "NODE_FAIL",
            JobState::Suspended => "SUSPENDED",
            JobState::OutOfMemory => "OUT_OF_MEMORY",
        }
    }
}

/// Why a running job is being stopped by the cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StopReason {
    Cancelled,
    TimeLimit,
    /// A task of a gang failed (or lost its node): the other tasks are stopped.
    TaskFailed,
    /// Preempted by job `by`; `mode` says what happens once the process is gone.
    Preempted {
        by: JobId,
        mode: PreemptMode,
    },
    /// An elastic job restarts on another GPU count: shrunk for preemptor `by`, or grown back
    /// (`by` = None). The GPUs of its next run are claimed for it on its node meanwhile.
    Resize {
        by: Option<JobId>,
    },
    /// Its node is draining (a spot interruption notice): checkpoint, stop, requeue.
    Drained,
    /// Stopped to give the QoS headrooms their idle GPUs back (`Op::Vacate`): checkpoint,
    /// stop, requeue.
    Vacated,
    /// A GPU of the run became unhealthy (`Op::GpuFault`; the message is the allocation's
    /// `failure`): stop, requeue.
    GpuFailed,
    /// Its GPUs stayed idle and its idle GPU rule requeues (`Op::RunIdle`): checkpoint, stop,
    /// requeue.
    Idle,
    /// A reservation's window opened on its resources (`Op::ReservationTick`): checkpoint (within
    /// a drain's grace), stop, requeue.
    ReservationOpened,
}

/// GPUs freed by preemption and promised to the preemptor until it starts (or kept for a
/// resized job's next run: an elastic gang's claim covers all its remaining nodes).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    pub node: String,
    pub gpus: Vec<GpuIndex>,
    /// Ranks 1.. of a claimed gang placement.
    #[serde(default)]
    pub more: Vec<TaskPlacement>,
}

impl Claim {
    /// (node, GPUs) of every claimed task.
    pub fn tasks(&self) -> impl Iterator<Item = (&str, &[GpuIndex])> {
        std::iter::once((self.node.as_str(), self.gpus.as_slice()))
            .chain(self.more.iter().map(|t| (t.node.as_str(), t.gpus.as_slice())))
    }
}

/// One task of a gang job (ranks after the first).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskPlacement {
    pub node: String,
    pub gpus: Vec<GpuIndex>,
}

/// Where and how a job runs right now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocation {
    /// Rank 0's node and GPUs (the only task of a single-node job).
    pub node: String,
    pub gpus: Vec<GpuIndex>,
    /// Ranks 1.. of a gang job, each on its own node.
    #[serde(default)]
    pub more: Vec<TaskPlacement>,
    /// An agent reported a task started; the run must never be launched again.
    pub started: bool,
    /// Set when the cluster asked the agents to stop the run.
    pub stop: Option<StopReason>,
    /// Gangs: how each rank that already ended ended (code, or negative signal).
    #[serde(default)]
    pub exits: BTreeMap<u32, i32>,
    /// Gangs: why the run failed, from the first rank that failed.
    #[serde(default)]
    pub failure: Option<String>,
    /// Suspended jobs: the GPUs lent to the preemptor (not in the node's `allocated` meanwhile).
    #[serde(default)]
    pub lent: Vec<GpuIndex>,
    /// It started beyond its team's guarantee, on GPUs borrowed from others' idle share
    /// (`crate::guarantee`): reclaim takes such runs first.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub borrowing: bool,
}

impl Allocation {
    /// (rank, node, GPUs) of every task.
    pub fn tasks(&self) -> impl Iterator<Item = (u32, &str, &[GpuIndex])> {
        std::iter::once((0, self.node.as_str(), self.gpus.as_slice())).chain(
            self.more.iter().enumerate().map(|(i, t)| (i as u32 + 1, t.node.as_str(), t.gpus.as_slice())),
        )
    }

    /// The rank running on `node`, if any.
    pub fn rank_on(&self, node: &str) -> Option<u32> {
        self.tasks().find(|(_, n, _)| *n == node).map(|(r, _, _)| r)
    }

    pub fn task_count(&self) -> u32 {
        1 + self.more.len() as u32
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobEvent {
    pub time_ms: i64,
    /// What happened: one of a few fixed words almost always, so not a string of its own.
    pub kind: std::borrow::Cow<'static, str>,
    pub message: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    pub id: JobId,
    pub spec: JobSpec,
    pub priority: i64,
    pub state: JobState,
    /// Why the job ended (for terminal states); pending reasons are derived by the planner.
    pub reason: String,
    /// Starts at 0; incremented each time the job is requeued.
    pub attempt: u32,
    pub allocation: Option<Allocation>,
    /// Node and GPUs of the last allocation, kept after the job ends for `show` and logs.
    pub last_node: String,
    pub last_gpus: Vec<GpuIndex>,
    /// Ranks 1.. of the last allocation of a gang job.
    #[serde(default)]
    pub last_more: Vec<TaskPlacement>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub submit_time_ms: i64,
    pub start_time_ms: Option<i64>,
    pub end_time_ms: Option<i64>,
    pub events: Vec<JobEvent>,
    /// Held by a user: stays pending until released.
    #[serde(default)]
    pub held: bool,
    /// A preemptor's claim on the GPUs its victims are freeing.
    #[serde(default)]
    pub claim: Option<Claim>,
    /// When this job was preempted (most recent last, bounded): the anti-thrash window.
    #[serde(default)]
    pub preempted_at: Vec<i64>,
    /// When the current run last reported a finished checkpoint (work before it is safe).
    #[serde(default)]
    pub last_checkpoint_ms: Option<i64>,
    /// Elastic jobs: the GPU count of the current (or next) run when resized (None = `spec.gpus`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub width: Option<u32>,
    /// Elastic gangs: the task (node) count of the current (or next) run when resized.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tasks_now: Option<u32>,
    /// Time the current run spent suspended (does not count against its time limit).
    #[serde(default)]
    pub suspended_ms: i64,
    /// When the current suspension began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspended_since: Option<i64>,
    /// The cluster's skipped time (`ClusterState::skipped_ms`) when the current run started:
    /// what the timeline skips while it runs does not count against its time limit.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub skipped_at_start_ms: i64,
    /// Failed runs retried so far (`JobSpec::retries`).
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub retried: u32,
    /// The node each recent attempt ran on (its first task's), for its log: at most
    /// `ATTEMPT_NODES_KEPT`, the latest.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attempt_nodes: BTreeMap<u32, String>,
    /// What its runs used, as its agents reported it (all attempts and tasks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<RunUsage>,
    /// The current run's GPUs have been idle since then (its idle GPU policy's threshold).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_idle_since: Option<i64>,
}

/// What a run used on its nodes (`Op::RunUsage`, one per task and attempt): sacct's MaxRSS and
/// CPU time, and what the agent measured of its GPUs (`TRESUsageIn*` of `gres/gpuutil` and
/// `gres/gpumem`). On a job, the sum over all its attempts and tasks (peaks: the largest).
/// Integers only (replicated state); zero fields are left out of the log and the measured ones
/// have short names there: one record per task and attempt stays under 256 bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunUsage {
    /// Peak resident memory of the run's cgroup, KiB (the largest of its tasks).
    #[serde(rename = "rss", alias = "max_rss_kib", default, skip_serializing_if = "is_zero_u64")]
    pub max_rss_kib: u64,
    /// CPU time, user and system, of all its processes and tasks, ms.
    #[serde(rename = "cpu", alias = "cpu_ms", default, skip_serializing_if = "is_zero_u64")]
    pub cpu_ms: u64,
    /// How often the kernel's OOM killer killed a process of the run (of attempt `oom_attempt`).
    #[serde(rename = "oom", alias = "oom_kills", default, skip_serializing_if = "is_zero_u32")]
    pub oom_kills: u32,
    /// The attempt `oom_kills` counts for (on a job: its latest reported attempt).
    #[serde(rename = "oa", default, skip_serializing_if = "is_zero_u32")]
    pub oom_attempt: u32,
    /// Wall time it ran, spawn to exit, ms (summed over tasks and attempts).
    #[serde(rename = "w", default, skip_serializing_if = "is_zero_u64")]
    pub wall_ms: u64,
    /// GPU-ms sampled (GPUs × time, a fraction counting its share), and of those the busy ones.
    #[serde(rename = "g", default, skip_serializing_if = "is_zero_u64")]
    pub gpu_ms: u64,
    #[serde(rename = "gb", default, skip_serializing_if = "is_zero_u64")]
    pub gpu_busy_ms: u64,
    /// Peak and 95th-percentile utilisation of one of its GPUs in one sample, percent.
    #[serde(rename = "ux", default, skip_serializing_if = "is_zero_u32")]
    pub gpu_util_max_pct: u32,
    #[serde(rename = "u95", default, skip_serializing_if = "is_zero_u32")]
    pub gpu_util_p95_pct: u32,
    /// Peak device memory in use on one of its GPUs, and that GPU's memory, MiB.
    #[serde(rename = "mx", default, skip_serializing_if = "is_zero_u64")]
    pub gpu_mem_max_mib: u64,
    #[serde(rename = "md", default, skip_serializing_if = "is_zero_u64")]
    pub gpu_mem_device_mib: u64,
    /// Samples the GPU figures come from.
    #[serde(rename = "n", default, skip_serializing_if = "is_zero_u32")]
    pub samples: u32,
}

impl RunUsage {
    /// Adds one task's report of attempt `attempt` to the job's sum.
    pub fn add(&mut self, attempt: u32, r: &RunUsage) {
        if self.oom_attempt != attempt {
            self.oom_kills = 0;
            self.oom_attempt = attempt;
        }
        self.max_rss_kib = self.max_rss_kib.max(r.max_rss_kib);
        self.cpu_ms = self.cpu_ms.saturating_add(r.cpu_ms);
        self.oom_kills = self.oom_kills.saturating_add(r.oom_kills);
        self.wall_ms = self.wall_ms.saturating_add(r.wall_ms);
        self.gpu_ms = self.gpu_ms.saturating_add(r.gpu_ms);
        self.gpu_busy_ms = self.gpu_busy_ms.saturating_add(r.gpu_busy_ms);
        self.gpu_util_max_pct = self.gpu_util_max_pct.max(r.gpu_util_max_pct);
        self.gpu_util_p95_pct = self.gpu_util_p95_pct.max(r.gpu_util_p95_pct);
        if r.gpu_mem_max_mib >= self.gpu_mem_max_mib && r.gpu_mem_device_mib > 0 {
            self.gpu_mem_max_mib = r.gpu_mem_max_mib;
            self.gpu_mem_device_mib = r.gpu_mem_device_mib;
        }
        self.samples = self.samples.saturating_add(r.samples);
    }

    /// The OOM killer struck in attempt `attempt`.
    pub fn oom_in(&self, attempt: u32) -> bool {
        self.oom_kills > 0 && self.oom_attempt == attempt
    }
}

/// How many attempts' nodes a job keeps (`Job::attempt_nodes`).
pub const ATTEMPT_NODES_KEPT: usize = 16;

fn is_zero(v: &i64) -> bool {
    *v == 0
}

impl Job {
    /// Its run is stopping so another job can take its GPUs (preempted, or shrunk for one):
    /// what the API shows as PREEMPTING.
    pub fn preempting(&self) -> bool {
        self.state == JobState::Running
            && self.allocation.as_ref().is_some_and(|a| {
                matches!(a.stop, Some(StopReason::Preempted { .. } | StopReason::Resize { by: Some(_) }))
            })
    }

    /// What batch scripts read about their job, with Slurm's names (`SLURM_JOB_ID`,
    /// `SLURM_ARRAY_TASK_ID`, …) and, for array tasks, kairos's (`KAIROS_ARRAY_TASK_ID`,
    /// `KAIROS_ARRAY_JOB_ID`); set for every run beside the agent's own `KAIROS_*` variables.
    pub fn batch_env(&self) -> Vec<(String, String)> {
        let s = &self.spec;
        let mut env: Vec<(&str, String)> = vec![
            ("SLURM_JOB_ID", self.id.to_string()),
            ("SLURM_JOBID", self.id.to_string()),
            ("SLURM_JOB_NAME", s.name.clone()),
            ("SLURM_JOB_USER", s.user.clone()),
            ("SLURM_JOB_PARTITION", s.partition.clone()),
            ("SLURM_JOB_ACCOUNT", s.account.clone()),
            ("SLURM_JOB_QOS", s.qos.clone()),
            ("SLURM_NTASKS", self.tasks().to_string()),
            ("SLURM_NNODES", self.tasks().to_string()),
            ("SLURM_JOB_NUM_NODES", self.tasks().to_string()),
            ("SLURM_GPUS_ON_NODE", self.gpus().to_string()),
            ("SLURM_RESTART_COUNT", self.attempt.to_string()),
        ];
        if !s.workdir.is_empty() {
            env.push(("SLURM_SUBMIT_DIR", s.workdir.clone()));
        }
        if let Some(a) = &s.array {
            env.extend([
                ("SLURM_ARRAY_JOB_ID", a.id.to_string()),
                ("SLURM_ARRAY_TASK_ID", a.index.to_string()),
                ("SLURM_ARRAY_TASK_COUNT", a.count.to_string()),
                ("KAIROS_ARRAY_JOB_ID", a.id.to_string()),
                ("KAIROS_ARRAY_TASK_ID", a.index.to_string()),
                // A Kubernetes Indexed Job's pod reads its index here.
                ("JOB_COMPLETION_INDEX", a.index.to_string()),
            ]);
            if let Some(n) = a.max_running {
                env.push(("SLURM_ARRAY_TASK_MAX_RUNNING", n.to_string()));
            }
        }
        env.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
    }

    /// GPUs per task of the current (or next) run: the spec's, unless an elastic job was resized.
    pub fn gpus(&self) -> u32 {
        self.width.unwrap_or(self.spec.gpus)
    }

    /// Tasks (nodes) of the current (or next) run: the spec's, unless an elastic gang shrank.
    pub fn tasks(&self) -> u32 {
        self.tasks_now.unwrap_or(self.spec.tasks).max(1)
    }

    /// GPUs of all tasks of the current (or next) run together.
    pub fn total_gpus(&self) -> u32 {
        self.gpus().saturating_mul(self.tasks())
    }

    pub(crate) fn record(
        &mut self,
        time_ms: i64,
        kind: impl Into<std::borrow::Cow<'static, str>>,
        message: String,
    ) {
        if self.events.len() >= JOB_EVENTS_MAX {
            self.events.remove(0);
        }
        // Room for exactly the first event (a pending job's only one), not the four a first
        // push reserves: 168 bytes less for each of 100k queued jobs.
        if self.events.capacity() == 0 {
            self.events.reserve_exact(1);
        }
        self.events.push(JobEvent { time_ms, kind: kind.into(), message });
    }
}
/// What happens to a running job of a QoS when it is preempted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum PreemptMode {
    /// Never preempted.
    Off,
    Cancel,
    Requeue,
    Suspend,
}

impl PreemptMode {
    pub fn as_str(self) -> &'static str {
        match self {
            PreemptMode::Off => "off",
            PreemptMode::Cancel => "cancel",
            PreemptMode::Requeue => "requeue",
            PreemptMode::Suspend => "suspend",
        }
    }

    pub fn parse(s: &str) -> Option<PreemptMode> {
        match s.to_ascii_lowercase().as_str() {
            "off" => Some(PreemptMode::Off),
            "cancel" => Some(PreemptMode::Cancel),
            "requeue" => Some(PreemptMode::Requeue),
            "suspend" => Some(PreemptMode::Suspend),
            _ => None,
        }
    }
}

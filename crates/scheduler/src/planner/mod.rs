//! The planner: from a state snapshot, which pending jobs start where, and why the rest wait.
//!
//! Pure: the same state gives the same plan; "now" is the state's own clock. Jobs are taken by
//! priority, then submit order. Held jobs, jobs with unmet dependencies, jobs over a QoS limit
//! and jobs no Up node could ever hold wait without holding back the jobs behind them.
//!
//! **EASY backfill**: the first job that does not fit gets a reservation — the node and GPUs
//! where it can start earliest (a gang: the nodes, one per task, whose GPUs are all free
//! soonest), and that time, computed from the running (and just placed) jobs' time limits. A
//! lower-priority job may then start only where it does not touch the reserved GPUs, or if its
//! own time limit ends before the reservation starts. So backfill never
//! delays the top blocked job past its reservation (property-tested with virtual time).
//!
//! Placement is inside one node: the node whose free GPUs fit most tightly (packing keeps whole
//! nodes free for large jobs), and within it GPUs of one link group when possible. Nodes are
//! indexed by free-GPU count, so a pass over 100k jobs and 10k nodes stays cheap.
//!
//! ```text
//!   &ClusterState ──▶ plan ──▶ PlanOutput { plan (proposed through Raft), pending reasons }
//! ```
//!
//! The rooms, as Nomad splits feasibility from ranking: `pass` (the node table of one pass and
//! what it takes), `feasible` (may this node take this task: `FreeNode`, ending in
//! `fit::fits`), `rank` (which node is best: tightest fit, link groups), `checks` (the sequence
//! each job goes through), `place` (a job that passed them), `gang`, `fraction`, `backfill`
//! (the reservation), `preempt`, `grow`, and `never` (could a job ever be placed, for reports).

use std::collections::{BTreeMap, BTreeSet};

use crate::fit::{fits, NodeFree, TaskAsk};
use crate::model::TaskPlacement;
use crate::model::{model_matches, CpuMem, Gpu, GpuIndex, Job, JobId, JobState, Node, NodeState};
use crate::policy::Partition;
use crate::queue::{scan, Queued};
use crate::state::brief::JobIndex;
use crate::state::{over_wall, ClusterState, Placement, Plan, PLAN_PLACEMENTS_MAX};

mod backfill;
mod checks;
mod estimate;
mod feasible;
mod fraction;
mod gang;
mod grow;
mod never;
mod pass;
mod place;
mod preempt;
mod rank;
mod topo;
mod windows;

use checks::{Largest, Planning};
use feasible::{Ask, FreeNode};
use pass::{FreeKey, Pass};
use preempt::vacate_for;
use rank::pick_gpus;

pub use crate::reasons::PendingReason;
pub use estimate::{Estimate, ESTIMATES_MAX};
pub use never::{never_placeable, Unplaceable};

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PlanOutput {
    pub plan: Plan,
    /// Every pending job that is not in the plan, with its reason (none when
    /// `PlanConfig::reasons` is off).
    pub pending: BTreeMap<JobId, PendingReason>,
    /// The top blocked job's reservation (EASY backfill), if any.
    pub reservation: Option<Reservation>,
    /// Running jobs to preempt so the top blocked job can start, if its QoS may.
    pub preemption: Option<PreemptPlan>,
    /// Expected starts of waiting jobs (`PlanConfig::estimates` of them at most), and why
    /// that late.
    pub estimates: BTreeMap<JobId, Estimate>,
    /// Shrunk elastic jobs to grow back onto free GPUs of their node, or shrunk elastic gangs
    /// onto free nodes (only when no job waits for resources).
    pub grow: Vec<GrowPlan>,
    /// Running jobs to stop so the QoS headrooms have their idle GPUs again (`Op::Vacate`),
    /// cheapest first; the last one makes up the shortfall.
    pub vacate: Vec<JobId>,
}

/// Growing one running elastic job back (proposed as `Op::Resize`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrowPlan {
    pub job: JobId,
    pub attempt: u32,
    /// Rank 0's GPUs after growing (a single-node job's whole new set).
    pub gpus: Vec<GpuIndex>,
    /// Gangs: ranks 1.. after growing (the current ones, then the new nodes).
    pub more: Vec<TaskPlacement>,
}

/// A proposed preemption: stop `victims` on `node` and give `gpus` there to `preemptor`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreemptPlan {
    pub preemptor: JobId,
    pub node: String,
    pub victims: Vec<JobId>,
    pub gpus: Vec<GpuIndex>,
}

/// Where and when the top blocked job will start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reservation {
    pub job: JobId,
    pub node: String,
    pub gpus: Vec<GpuIndex>,
    /// A gang's other tasks: the nodes and GPUs held for ranks 1.. .
    pub more: Vec<TaskPlacement>,
    pub start_ms: i64,
    /// What frees the last of its GPUs (`Estimate::why` words it).
    pub(crate) why: estimate::Cause,
}

/// Planner settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanConfig {
    /// EASY backfill on (else the first blocked job holds back everything behind it).
    pub backfill: bool,
    /// How many waiting jobs get a start estimate (`PlanOutput::estimates`): the pass that
    /// answers users (`kairos queue --start`) asks for them, the leader's own pass not.
    pub estimates: usize,
    /// Whether `PlanOutput::pending` is filled: the read paths show the reasons, the leader's
    /// pass acts only on the plan (a map of 100k reasons is a sixth of a pass). The plan is the
    /// same either way.
    pub reasons: bool,
}

impl PlanConfig {
    /// The leader's own pass (`propose`): the plan, no reasons, no estimates.
    pub const LEADER: PlanConfig = PlanConfig { backfill: true, estimates: 0, reasons: false };
}

impl Default for PlanConfig {
    fn default() -> Self {
        PlanConfig { backfill: true, estimates: 0, reasons: true }
    }
}

/// Computes a plan for the current state with the default settings.
pub fn plan(state: &ClusterState) -> PlanOutput {
    plan_with(state, PlanConfig::default())
}

/// Computes a plan for the current state: each pending job, by priority, goes through the
/// checks of `Planning::consider` (Nomad's feasibility checks, then placement): the first that
/// fails records its pending reason.
pub fn plan_with(state: &ClusterState, config: PlanConfig) -> PlanOutput {
    // A fresh job index when apply kept none (declared first: the pass outlives nothing of it).
    let built;
    let index = match state.job_index.current(&state.jobs) {
        Some(index) => index,
        None => {
            built = JobIndex::build(&state.jobs);
            &built
        }
    };
    let mut scan = scan(state, index);
    let headroom = state.headroom_gpus();
    // Nothing waits, nothing may grow back, no headroom to refill: no node table to build.
    if scan.len() == 0 && scan.elastic.is_empty() && headroom == 0 {
        return PlanOutput::default();
    }
    let pass = Pass::new(state);
    let largest = Largest::new(state, &pass);
    let mut p = Planning {
        state,
        config,
        pass,
        largest,
        usage: std::mem::take(&mut scan.usage),
        array_running: std::mem::take(&mut scan.array_running),
        guarantees_now: scan.guarantees.clone(),
        reclaim_tries: 0,
        guarantees: std::mem::take(&mut scan.guarantees),
        headroom,
        out: PlanOutput::default(),
        waiting: false,
        blocked: false,
        held_hints: 0,
        strict: false,
        estimates_left: config.estimates,
    };
    // Reasons are kept by queue entry (entries are in id order), so the map is built in one
    // ordered sweep at the end: far cheaper than 100k inserts, and no sort.
    let mut reasons: Vec<Option<PendingReason>> =
        if config.reasons { vec![None; scan.len()] } else { Vec::new() };
    for (entry, q) in scan.queue() {
        let decided = p.consider(q);
        if let Some(reason) = reasons.get_mut(entry) {
            *reason = decided.err();
        }
    }
    if !p.waiting {
        p.out.grow = p.pass.grow_back(&scan.elastic);
    }
    if headroom > 0 && p.out.preemption.is_none() {
        let shortfall = headroom.saturating_sub(p.pass.free_total + state.headroom_freeing());
        p.out.vacate = vacate_for(state, shortfall);
    }
    let mut out = p.out;
    out.pending = scan.ids().zip(reasons).filter_map(|(id, r)| Some((id, r?))).collect();
    out
}

#[cfg(test)]
mod tests;

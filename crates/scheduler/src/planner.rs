//! The planner: from a state snapshot, which pending jobs start where, and why the rest wait.
//!
//! Pure: the same state gives the same plan. Jobs are taken by priority, then submit order.
//! The first job that does not fit blocks every job behind it (no backfill yet), except jobs
//! that no Up node could ever hold, which wait without blocking others.
//!
//! Placement is inside one node: the node whose free GPUs fit most tightly (packing keeps whole
//! nodes free for large jobs), and within it GPUs of one link group when possible.
//!
//! ```text
//!   &ClusterState ──▶ plan ──▶ PlanOutput { plan (proposed through Raft), pending reasons }
//! ```

use std::collections::BTreeMap;

use crate::limits::Usage;
use crate::model::{model_matches, GpuIndex, Job, JobId, JobState, NodeState};
use crate::state::{ClusterState, Placement, Plan, PLAN_PLACEMENTS_MAX};

/// Why a pending job is not starting now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PendingReason {
    /// It fits no node's free GPUs right now.
    Resources,
    /// A higher-priority job is waiting ahead of it.
    Priority,
    /// No Up node has enough GPUs in total.
    ReqNodeNotAvail(String),
    /// Starting it would exceed its QoS's GPU limit for all jobs together.
    QosGrpGpuLimit,
    /// Starting it would exceed its QoS's per-user GPU limit.
    QosUserGpuLimit,
    /// Starting it would exceed its QoS's per-user running-job limit.
    QosUserJobLimit,
    /// Held by a user (`kairos hold`); `kairos release` lets it start.
    JobHeldUser,
    /// Waiting for the jobs it depends on to complete.
    Dependency,
    /// A job it depends on ended without completing: it can never start.
    DependencyNeverSatisfied(JobId),
}

impl std::fmt::Display for PendingReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PendingReason::Resources => f.write_str("Resources"),
            PendingReason::Priority => f.write_str("Priority"),
            PendingReason::ReqNodeNotAvail(why) => write!(f, "ReqNodeNotAvail: {why}"),
            PendingReason::QosGrpGpuLimit => f.write_str("QosGrpGpuLimit"),
            PendingReason::QosUserGpuLimit => f.write_str("QosUserGpuLimit"),
            PendingReason::QosUserJobLimit => f.write_str("QosUserJobLimit"),
            PendingReason::JobHeldUser => f.write_str("JobHeldUser"),
            PendingReason::Dependency => f.write_str("Dependency"),
            PendingReason::DependencyNeverSatisfied(dep) => {
                write!(f, "DependencyNeverSatisfied: job {dep} did not complete")
            }
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PlanOutput {
    pub plan: Plan,
    /// Every pending job that is not in the plan, with its reason.
    pub pending: BTreeMap<JobId, PendingReason>,
}

/// Free GPUs of one Up node during planning: (index, link group), ascending by index.
struct FreeNode<'a> {
    name: &'a str,
    /// (index, link group, model) of each free GPU, ascending by index.
    free: Vec<(GpuIndex, u32, &'a str)>,
}

/// Pending jobs in the order the planner considers them.
pub fn queue_order(state: &ClusterState) -> Vec<&Job> {
    let mut pending: Vec<&Job> = state.jobs.values().filter(|j| j.state == JobState::Pending).collect();
    pending.sort_by_key(|j| (std::cmp::Reverse(j.priority), j.id));
    pending
}

/// Computes a plan for the current state.
pub fn plan(state: &ClusterState) -> PlanOutput {
    let mut nodes: Vec<FreeNode> = state
        .nodes
        .iter()
        .filter(|(_, n)| n.state == NodeState::Up)
        .map(|(name, n)| FreeNode {
            name,
            free: n
                .info
                .gpus
                .iter()
                .filter(|g| !n.allocated.contains_key(&g.index))
                .map(|g| (g.index, g.link_group, g.model.as_str()))
                .collect(),
        })
        .collect();
    // The most GPUs of a model (constraint) one Up node has, per constraint seen.
    let mut largest: BTreeMap<Option<String>, u32> = BTreeMap::new();
    let mut largest_up = |model: Option<&str>| -> u32 {
        *largest.entry(model.map(str::to_string)).or_insert_with(|| {
            let up = state.nodes.values().filter(|n| n.state == NodeState::Up);
            up.map(|n| n.info.gpus.iter().filter(|g| model_matches(model, &g.model)).count() as u32)
                .max()
                .unwrap_or(0)
        })
    };

    let mut usage = Usage::of(state.jobs_running());
    let mut out = PlanOutput::default();
    let mut blocked = false;
    for job in queue_order(state) {
        // Held jobs, unmet dependencies and QoS limits: the job waits without holding back
        // the jobs behind it.
        if job.held {
            out.pending.insert(job.id, PendingReason::JobHeldUser);
            continue;
        }
        if let Err(reason) = state.dependency_state(job) {
            out.pending.insert(job.id, reason);
            continue;
        }
        if let Err(reason) = usage.admits(job, &state.policy) {
            out.pending.insert(job.id, reason);
            continue;
        }
        let model = job.spec.gpu_model.as_deref();
        let largest_up = largest_up(model);
        if job.spec.gpus > largest_up {
            let of = model.map(|m| format!(" {m}")).unwrap_or_default();
            let why = if largest_up == 0 {
                format!("no up node has{of} GPUs")
            } else {
                format!("no up node has {}{of} GPUs", job.spec.gpus)
            };
            out.pending.insert(job.id, PendingReason::ReqNodeNotAvail(why));
            continue;
        }
        if blocked || out.plan.placements.len() >= PLAN_PLACEMENTS_MAX {
            out.pending.insert(job.id, PendingReason::Priority);
            continue;
        }
        match place(&mut nodes, job.spec.gpus, model) {
            Some((node, gpus)) => {
                usage.add(job);
                out.plan.placements.push(Placement { job: job.id, node, gpus });
            }
            None => {
                out.pending.insert(job.id, PendingReason::Resources);
                blocked = true;
            }
        }
    }
    out
}

/// Picks a node and GPUs for `count` GPUs, and takes them from `nodes`.
fn place(nodes: &mut [FreeNode], count: u32, model: Option<&str>) -> Option<(String, Vec<GpuIndex>)> {
    let count = count as usize;
    let eligible = |n: &FreeNode| -> Vec<(GpuIndex, u32)> {
        n.free.iter().filter(|(_, _, m)| model_matches(model, m)).map(|(i, g, _)| (*i, *g)).collect()
    };
    let (node, free) = nodes
        .iter_mut()
        .map(|n| {
            let free = eligible(n);
            (n, free)
        })
        .filter(|(_, free)| free.len() >= count)
        .min_by_key(|(n, free)| (free.len(), n.name))?;
    let gpus = pick_gpus(&free, count);
    node.free.retain(|(i, _, _)| !gpus.contains(i));
    Some((node.name.to_string(), gpus))
}

/// Chooses `count` GPUs from `free`: all from the tightest-fitting link group when one can hold
/// them, else the lowest indices.
fn pick_gpus(free: &[(GpuIndex, u32)], count: usize) -> Vec<GpuIndex> {
    let mut groups: BTreeMap<u32, Vec<GpuIndex>> = BTreeMap::new();
    for (index, group) in free {
        groups.entry(*group).or_default().push(*index);
    }
    let best = groups.values().filter(|g| g.len() >= count).min_by_key(|g| g.len());
    match best {
        Some(group) => group[..count].to_vec(),
        None => free.iter().take(count).map(|(i, _)| *i).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Command, Op, Outcome};
    use crate::testing::{node_info, spec};

    fn state_with(nodes: &[(&str, u32)]) -> ClusterState {
        let mut s = ClusterState::new();
        for (name, gpus) in nodes {
            s.apply(&Command { now_ms: 1, op: Op::RegisterNode { info: node_info(name, *gpus) } });
        }
        s
    }

    fn submit(s: &mut ClusterState, gpus: u32, qos: &str) -> JobId {
        match s.apply(&Command {
            now_ms: 2,
            op: Op::Submit { spec: spec(gpus, qos), request_id: None, hold: false },
        }) {
            Outcome::Submitted { job } => job,
            other => panic!("submit failed: {other:?}"),
        }
    }

    #[test]
    fn higher_priority_goes_first_then_submit_order() {
        let mut s = state_with(&[("a", 2)]);
        let low = submit(&mut s, 1, "batch");
        let high = submit(&mut s, 1, "inference");
        let high2 = submit(&mut s, 1, "inference");
        let out = plan(&s);
        let jobs: Vec<JobId> = out.plan.placements.iter().map(|p| p.job).collect();
        assert_eq!(jobs, vec![high, high2]);
        assert_eq!(out.pending.get(&low), Some(&PendingReason::Resources));
    }

    #[test]
    fn blocked_job_blocks_lower_ones_but_impossible_one_does_not() {
        let mut s = state_with(&[("a", 4)]);
        let first = submit(&mut s, 3, "batch");
        let big = submit(&mut s, 4, "batch");
        let small = submit(&mut s, 1, "batch");
        // Node "a" loses its GPUs' availability: mark it down so only "b" (2 GPUs) is up.
        s.apply(&Command { now_ms: 3, op: Op::RegisterNode { info: node_info("b", 2) } });
        s.apply(&Command { now_ms: 3, op: Op::NodeDown { node: "a".into(), reason: "test".into() } });
        let out = plan(&s);
        assert!(matches!(out.pending.get(&first), Some(PendingReason::ReqNodeNotAvail(_))));
        assert!(matches!(out.pending.get(&big), Some(PendingReason::ReqNodeNotAvail(_))));
        assert_eq!(out.plan.placements, vec![Placement { job: small, node: "b".into(), gpus: vec![0] }]);

        let mut s = state_with(&[("a", 4)]);
        let first = submit(&mut s, 3, "batch");
        let second = submit(&mut s, 2, "batch");
        let third = submit(&mut s, 1, "batch");
        let out = plan(&s);
        assert_eq!(out.plan.placements.len(), 1);
        assert_eq!(out.plan.placements[0].job, first);
        assert_eq!(out.pending.get(&second), Some(&PendingReason::Resources));
        assert_eq!(out.pending.get(&third), Some(&PendingReason::Priority));
    }

    #[test]
    fn packs_onto_the_tightest_node_and_keeps_link_groups() {
        let mut s = state_with(&[("a", 8), ("b", 8)]);
        let j1 = submit(&mut s, 6, "batch");
        let out = plan(&s);
        assert_eq!(
            s.apply(&Command { now_ms: 3, op: Op::ApplyPlan { plan: out.plan } }),
            Outcome::PlanApplied { accepted: vec![j1], rejected: vec![] }
        );
        let j2 = submit(&mut s, 2, "batch");
        let out = plan(&s);
        // "a" has 2 free GPUs left: the 2-GPU job goes there, keeping "b" whole.
        assert_eq!(out.plan.placements, vec![Placement { job: j2, node: "a".into(), gpus: vec![6, 7] }]);
        // Four GPUs on an empty 8-GPU node with link groups of 4 come from one group.
        let j3 = submit(&mut s, 4, "batch");
        let mut out = plan(&s);
        out.plan.placements.retain(|p| p.job == j3);
        assert_eq!(
            out.plan.placements,
            vec![Placement { job: j3, node: "b".into(), gpus: vec![0, 1, 2, 3] }]
        );
    }

    #[test]
    fn pick_gpus_prefers_one_group() {
        let free = [(1, 0), (2, 0), (4, 1), (5, 1), (6, 1)];
        assert_eq!(pick_gpus(&free, 2), vec![1, 2]);
        assert_eq!(pick_gpus(&free, 3), vec![4, 5, 6]);
        assert_eq!(pick_gpus(&free, 4), vec![1, 2, 4, 5]);
    }
}

//! Which nodes' runs (`crate::orders::runs_on`) the applied commands may have changed since the
//! controller last asked, so that it wakes only those nodes' assignment streams: with ten
//! thousand agents connected, waking every stream on every applied entry costs the leader
//! nodes × entries reads of the state.
//!
//! A node's runs are read from its jobs, the nodes they run on (rank 0's address) and the
//! policy (checkpoint grace, idle rule). So a command changes the runs of: every node a job it
//! handed out mutably had runs on, before (`Jobs` records them as it hands the job out) and
//! after; the node whose registration it changed and every node sharing a job with it; every
//! node for a policy change or when every job was handed out. `check` is the proof kept in
//! debug builds: `ClusterState::apply` compares each unchanged node's runs before and after on
//! small clusters (every unit test, the deterministic simulation).

use std::collections::BTreeSet;

use super::{ClusterState, Op};

/// More changed nodes than this are kept as "all" (nobody may be asking: the set stays small).
pub const CHANGED_NODES_MAX: usize = 4096;

/// The nodes whose runs may have changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ChangedNodes {
    /// Every node (a new state, a policy change, too many to list).
    #[default]
    All,
    Some(BTreeSet<String>),
}

impl ChangedNodes {
    /// No node.
    pub fn none() -> ChangedNodes {
        ChangedNodes::Some(BTreeSet::new())
    }

    pub fn contains(&self, node: &str) -> bool {
        match self {
            ChangedNodes::All => true,
            ChangedNodes::Some(nodes) => nodes.contains(node),
        }
    }

    fn add(&mut self, node: &str) {
        if let ChangedNodes::Some(nodes) = self {
            if nodes.len() >= CHANGED_NODES_MAX {
                *self = ChangedNodes::All;
            } else if !nodes.contains(node) {
                nodes.insert(node.to_string());
            }
        }
    }
}

/// The changed nodes as the state keeps them: a cache (equal whatever it holds, not
/// serialized), "all" in a new or restored state.
#[derive(Clone, Debug, Default)]
pub struct Changes(ChangedNodes);

impl PartialEq for Changes {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Changes {}

/// Debug builds check each command's changed nodes (`check`) on states this small.
#[cfg(debug_assertions)]
const CHECKED_NODES_MAX: usize = 64;
#[cfg(debug_assertions)]
const CHECKED_JOBS_MAX: usize = 2_000;

impl ClusterState {
    /// The nodes whose runs the commands applied since the last call may have changed.
    pub fn take_changed_nodes(&mut self) -> ChangedNodes {
        std::mem::replace(&mut self.changed.0, ChangedNodes::none())
    }

    /// In debug builds, on a small state: a copy of it before a command, with the changes
    /// gathered so far set aside (`checked_changes` compares and puts them back).
    #[cfg(debug_assertions)]
    pub(crate) fn before_checked_command(&mut self) -> Option<(ClusterState, ChangedNodes)> {
        if self.nodes.len() > CHECKED_NODES_MAX || self.jobs.len() > CHECKED_JOBS_MAX {
            return None;
        }
        let gathered = self.take_changed_nodes();
        Some((self.clone(), gathered))
    }

    /// After the command: its changed nodes hold every node whose runs changed; then the
    /// changes gathered before it are added back.
    #[cfg(debug_assertions)]
    pub(crate) fn checked_changes(&mut self, before: Option<(ClusterState, ChangedNodes)>) {
        let Some((before, gathered)) = before else { return };
        if let Err(e) = check(&before, self, &self.changed.0) {
            panic!("changed nodes missed a change: {e}");
        }
        match (gathered, &mut self.changed.0) {
            (ChangedNodes::Some(nodes), ChangedNodes::Some(_)) => {
                for n in &nodes {
                    self.changed.0.add(n);
                }
            }
            _ => self.changed.0 = ChangedNodes::All,
        }
    }

    /// After `op` applied (before the job index takes the touched ids): adds the nodes whose
    /// runs it may have changed.
    pub(crate) fn note_changed(&mut self, op: &Op) {
        let policy = matches!(
            op,
            Op::SetPolicy { .. }
                | Op::PutQos { .. }
                | Op::DeleteQos { .. }
                | Op::PutPolicyItem { .. }
                | Op::DeletePolicyItem { .. }
        );
        let before = self.jobs.take_nodes_before();
        let Some(before) = before.filter(|_| !policy) else {
            self.changed.0 = ChangedNodes::All;
            return;
        };
        if self.changed.0 == ChangedNodes::All {
            return;
        }
        let mut changed = std::mem::take(&mut self.changed.0);
        for node in &before {
            changed.add(node);
        }
        let after = self.jobs.touched().iter().filter_map(|id| self.jobs.get(id)?.allocation.as_ref());
        for a in after {
            for (_, node, _) in a.tasks() {
                changed.add(node);
            }
        }
        if let Some(node) = op.node_changed() {
            changed.add(node);
            for j in self.jobs_on(node) {
                for (_, n, _) in j.allocation.iter().flat_map(|a| a.tasks()) {
                    changed.add(n);
                }
            }
        }
        self.changed.0 = changed;
    }
}

/// Every node `changed` leaves out has the same runs in `after` as in `before`. Checked on what
/// a node's runs are read from (`orders::runs_on`): its jobs, each whole, the address of each
/// one's rank-0 node, and the policy (a change of it must change every node).
pub fn check(before: &ClusterState, after: &ClusterState, changed: &ChangedNodes) -> Result<(), String> {
    let ChangedNodes::Some(listed) = changed else { return Ok(()) };
    if before.policy != after.policy {
        return Err(format!("the policy changed but only nodes {listed:?} are among the changed nodes"));
    }
    let nodes: BTreeSet<&String> = before.nodes.keys().chain(after.nodes.keys()).collect();
    for node in nodes.into_iter().filter(|n| !listed.contains(n.as_str())) {
        if view(before, node) != view(after, node) {
            return Err(format!(
                "node {node}'s runs changed but it is not among the changed nodes {listed:?}"
            ));
        }
    }
    Ok(())
}

/// What `node`'s runs are read from in `s`: its jobs, and where each one's rank 0 runs.
fn view<'a>(s: &'a ClusterState, node: &str) -> Vec<(&'a crate::model::Job, Option<&'a str>)> {
    let addr = |j: &crate::model::Job| {
        let a = j.allocation.as_ref()?;
        s.nodes.get(&a.node).map(|n| n.info.addr.as_str())
    };
    s.jobs_on(node).into_iter().map(|j| (j, addr(j))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Command, Outcome};
    use crate::testing::{node_info, spec};

    fn apply(s: &mut ClusterState, op: Op) -> Outcome {
        s.apply(&Command { skipped_ms: 0, now_ms: 5, op })
    }

    fn listed(s: &mut ClusterState) -> BTreeSet<String> {
        match s.take_changed_nodes() {
            ChangedNodes::Some(n) => n,
            ChangedNodes::All => panic!("all"),
        }
    }

    #[test]
    fn only_the_nodes_a_command_touched_are_changed() {
        let mut s = ClusterState::new();
        assert_eq!(s.take_changed_nodes(), ChangedNodes::All, "a new state: everyone reads it once");
        for n in ["n1", "n2", "n3"] {
            apply(&mut s, Op::RegisterNode { info: node_info(n, 2) });
        }
        assert_eq!(s.take_changed_nodes(), ChangedNodes::All, "the first commands: still all");
        apply(&mut s, Op::RegisterNode { info: node_info("n4", 2) });
        assert_eq!(listed(&mut s), BTreeSet::from(["n4".to_string()]));
        let Outcome::Submitted { job } = apply(
            &mut s,
            Op::Submit { spec: spec(2, "training"), request_id: None, hold: false, limits: None },
        ) else {
            panic!()
        };
        assert!(listed(&mut s).is_empty(), "a pending job runs nowhere");
        let plan = crate::planner::plan(&s).plan;
        apply(&mut s, Op::ApplyPlan { plan });
        let on = s.jobs[&job].allocation.as_ref().unwrap().node.clone();
        assert_eq!(listed(&mut s), BTreeSet::from([on.clone()]));
        apply(&mut s, Op::JobStarted { job, attempt: 0, node: on.clone() });
        assert_eq!(listed(&mut s), BTreeSet::from([on.clone()]));
        apply(&mut s, Op::Cancel { job, by: "alice".into() });
        apply(&mut s, Op::JobExited { job, attempt: 0, node: on.clone(), exit: crate::RunExit::Code(0) });
        assert_eq!(listed(&mut s), BTreeSet::from([on.clone()]), "the run left its node: it is told");
        let mut policy = s.policy.clone();
        policy.qos.values_mut().for_each(|q| q.grace_s += 1);
        apply(&mut s, Op::SetPolicy { policy, audit: None });
        assert_eq!(s.take_changed_nodes(), ChangedNodes::All, "a policy change: every node");
    }

    #[test]
    fn the_check_finds_a_node_whose_runs_changed_unlisted() {
        let mut s = ClusterState::new();
        apply(&mut s, Op::RegisterNode { info: node_info("n1", 2) });
        apply(&mut s, Op::Submit { spec: spec(1, "training"), request_id: None, hold: false, limits: None });
        let before = s.clone();
        let plan = crate::planner::plan(&s).plan;
        apply(&mut s, Op::ApplyPlan { plan });
        assert_eq!(check(&before, &s, &ChangedNodes::All), Ok(()));
        assert_eq!(check(&before, &s, &ChangedNodes::Some(BTreeSet::from(["n1".to_string()]))), Ok(()));
        let err = check(&before, &s, &ChangedNodes::none()).unwrap_err();
        assert!(err.contains("n1"), "{err}");
    }
}

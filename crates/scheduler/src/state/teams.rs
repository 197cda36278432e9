//! Team guarantees against the state (`crate::guarantee`): what each team holds now, and what
//! each waits for and is owed (`team_needs`, the oracle the simulator, the property tests and
//! the fault simulation judge the planner by).

use std::collections::BTreeMap;

use crate::guarantee::Guarantees;
use crate::model::JobState;
use crate::state::ClusterState;

/// What one guaranteed team waits for (`ClusterState::team_needs`): GPUs of its waiting jobs (unclaimed, not
/// held), whether it is owed — its smallest waiting job fits what is left of its guarantee —
/// and whether reclaim could serve it now: some node holds that job from free GPUs and runs of
/// other teams over their guarantee that reclaim could take (running alone on their node
/// undisturbed, their QoS preempted at all, past the exempt time, under the anti-thrash bound,
/// no larger than what their team holds beyond its guarantee). Computed from the jobs, not by
/// the planner: the oracle the simulator, the property tests and the fault simulation judge
/// the planner by.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TeamNeed {
    pub team: String,
    pub waiting: u64,
    pub owed: bool,
    pub reclaimable: bool,
}

impl ClusterState {
    /// The team guarantees of the policy with what the jobs hold now: runs not being stopped
    /// and preemptors' claims (O(running + claims); nothing without a guarantee).
    pub fn guarantees(&self) -> Guarantees {
        let mut g = Guarantees::new(&self.policy);
        if g.active() {
            for job in self.jobs_running().chain(self.claimants()) {
                g.count(job);
            }
        }
        g
    }

    /// Every guaranteed team's need at the state's own clock.
    pub fn team_needs(&self) -> Vec<TeamNeed> {
        let state = self;
        let g = state.guarantees();
        if !g.active() {
            return Vec::new();
        }
        let mut waiting: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
        let pending =
            state.jobs.values().filter(|j| j.state == JobState::Pending && j.claim.is_none() && !j.held);
        for j in pending {
            if let Some(team) = g.nearest(&j.spec.account) {
                let w = waiting.entry(team).or_insert((0, u64::MAX));
                w.0 += u64::from(j.total_gpus());
                w.1 = w.1.min(u64::from(j.total_gpus()));
            }
        }
        let takers = reclaimable_by_node(state, &g);
        g.teams()
            .map(|(team, guaranteed, held)| {
                let (gpus, smallest) = waiting.get(team).copied().unwrap_or((0, u64::MAX));
                let owed = smallest != u64::MAX && held + smallest <= guaranteed;
                let reclaimable = owed
                    && takers.values().any(|(free, teams)| {
                        let others: u64 =
                            teams.iter().filter(|(t, _)| t.as_str() != team).map(|(_, n)| n).sum();
                        others > 0 && free + others >= smallest
                    });
                TeamNeed { team: team.to_string(), waiting: gpus, owed, reclaimable }
            })
            .collect()
    }
}

/// Per Up node: its free GPUs, and per team over its guarantee (its nearest guaranteed
/// account, or the account itself without one) the GPUs of its runs there reclaim could take.
fn reclaimable_by_node(
    state: &ClusterState,
    g: &Guarantees,
) -> BTreeMap<String, (u64, BTreeMap<String, u64>)> {
    let mut nodes = BTreeMap::new();
    for (name, n) in state.nodes.iter().filter(|(_, n)| n.state == crate::model::NodeState::Up) {
        let free = n
            .usable_gpus()
            .filter(|x| !n.allocated.contains_key(&x.index) && !n.claimed.contains_key(&x.index));
        nodes.insert(name.clone(), (free.count() as u64, BTreeMap::new()));
    }
    for j in state.jobs_running() {
        let Some(q) = state.policy.qos(&j.spec.qos) else { continue };
        let Some(a) = j.allocation.as_ref().filter(|a| a.stop.is_none() && a.task_count() == 1) else {
            continue;
        };
        let takeable = j.state == JobState::Running && state.undisturbed_victim(j, q, state.now_ms).is_ok();
        if takeable && g.over(&j.spec.account) >= u64::from(j.total_gpus()) {
            let team = g.nearest(&j.spec.account).unwrap_or(&j.spec.account).to_string();
            if let Some((_, teams)) = nodes.get_mut(&a.node) {
                *teams.entry(team).or_default() += u64::from(j.total_gpus());
            }
        }
    }
    nodes
}

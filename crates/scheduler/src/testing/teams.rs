//! The team-guarantee world of the property tests: random clusters, teams with guarantees (one
//! sometimes without, one sometimes with a borrow limit), and streams of training and inference
//! jobs, run in virtual time through the real proposer (`propose`) and apply; victims take up
//! to their grace to stop. Three checkers judge every step, each computed from the jobs
//! themselves, not from `crate::guarantee`:
//!
//! - `check_preemption`: no preemption by another team takes a team below its guarantee;
//! - `OwedWatch`: a team owed GPUs (a job within its guarantee waits, unclaimed) that reclaim
//!   could serve (`ClusterState::team_needs`) gets them within grace + 2 rounds;
//! - `check_caps`: no team holds more than its guarantee plus its borrow limit.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use crate::model::JobState;
use crate::policy::{Guarantee, Policy};
use crate::propose::propose;
use crate::state::{ClusterState, Command, Op, Outcome, RunExit};
use crate::testing::{node_info, spec};

/// A generated world.
#[derive(Clone, Debug)]
pub struct World {
    /// GPUs per node.
    pub nodes: Vec<u32>,
    /// Per team: its guarantee (None: it only borrows) and borrow limit.
    pub teams: Vec<(Option<u32>, Option<u32>)>,
    /// Per job: team, arrival round, run time in rounds, inference (else training).
    pub jobs: Vec<(usize, u32, u32, bool)>,
}

/// Seconds a round lasts, and the victims' grace in rounds.
pub const ROUND_MS: i64 = 1000;
pub const GRACE_ROUNDS: u32 = 4;

pub fn world() -> impl Strategy<Value = World> {
    (proptest::collection::vec(2u32..7, 1..4), 2usize..5).prop_flat_map(|(nodes, teams)| {
        let total: u32 = nodes.iter().sum();
        let team =
            (proptest::option::weighted(0.85, 0..=total / 2), proptest::option::weighted(0.2, 0u32..4));
        let job = (0..teams, 0u32..40, 1u32..25, proptest::bool::weighted(0.25));
        (Just(nodes), proptest::collection::vec(team, teams), proptest::collection::vec(job, 1..60))
            .prop_map(|(nodes, teams, jobs)| World { nodes, teams, jobs })
    })
}

fn team_name(i: usize) -> String {
    format!("t{i}")
}

/// The world's policy: its teams under root, guarantees scaled down to fit the cluster.
fn policy(w: &World) -> Policy {
    let mut p = Policy::default();
    let total: u32 = w.nodes.iter().sum();
    let asked: u32 = w.teams.iter().filter_map(|t| t.0).sum();
    for (i, (gpus, borrow_limit)) in w.teams.iter().enumerate() {
        let mut a = p.accounts["root"].clone();
        a.name = team_name(i);
        a.parent = Some("root".into());
        let gpus = gpus.map(|g| if asked > total { g * total / asked } else { g });
        a.guarantee = gpus.map(|gpus| Guarantee { gpus, borrow_limit: *borrow_limit, lend_limit: None });
        p.accounts.insert(a.name.clone(), a);
    }
    let training = p.qos.get_mut("training").expect("shipped");
    training.grace_s = u64::from(GRACE_ROUNDS) * (ROUND_MS as u64) / 1000;

    p
}

/// GPUs each team holds, from the jobs: runs not being stopped, and preemptors' claims.
fn held(s: &ClusterState) -> BTreeMap<String, u64> {
    let mut held = BTreeMap::new();
    for j in s.jobs.values() {
        let gpus = match j.state {
            JobState::Running | JobState::Suspended => j
                .allocation
                .as_ref()
                .filter(|a| a.stop.is_none())
                .map_or(0, |a| u64::from(j.total_gpus()) - a.lent.len() as u64),
            JobState::Pending => j.claim.as_ref().map_or(0, |c| c.gpus.len() as u64),
            _ => 0,
        };
        *held.entry(j.spec.account.clone()).or_default() += gpus;
    }
    held
}

fn guarantee<'s>(s: &'s ClusterState, team: &str) -> Option<&'s Guarantee> {
    s.policy.accounts.get(team).and_then(|a| a.guarantee.as_ref())
}

/// A preemption about to be applied to `s` leaves every other team it takes from with at
/// least its guarantee.
/// `preemptor`: None for a headroom refill (`Op::Vacate`), which serves no one team.
pub fn check_preemption(s: &ClusterState, preemptor: Option<u64>, victims: &[u64]) -> Result<(), String> {
    let to = match preemptor {
        Some(id) => match s.jobs.get(&id) {
            Some(p) => p.spec.account.as_str(),
            None => return Ok(()),
        },
        None => "",
    };
    let mut after = held(s);
    for v in victims.iter().filter_map(|v| s.jobs.get(v)) {
        if v.spec.account != to && v.allocation.as_ref().is_some_and(|a| a.stop.is_none()) {
            *after.entry(v.spec.account.clone()).or_default() -= u64::from(v.total_gpus());
        }
    }
    let preemptor = preemptor.map_or("the headroom".to_string(), |id| format!("job {id} of {to}"));
    for v in victims.iter().filter_map(|v| s.jobs.get(v)).filter(|v| v.spec.account != to) {
        let team = &v.spec.account;
        if let Some(g) = guarantee(s, team) {
            let left = after[team];
            if left < u64::from(g.gpus) {
                return Err(format!(
                    "{preemptor} preempted job {} of {team}, leaving {team} {left} of its {} guaranteed GPUs",
                    v.id, g.gpus
                ));
            }
        }
    }
    Ok(())
}

/// No team holds more than its guarantee plus its borrow limit.
pub fn check_caps(s: &ClusterState) -> Result<(), String> {
    for (team, gpus) in held(s) {
        if let Some(limit) =
            guarantee(s, &team).and_then(|g| Some(u64::from(g.gpus) + u64::from(g.borrow_limit?)))
        {
            if gpus > limit {
                return Err(format!(
                    "team {team} holds {gpus} GPUs, over its guarantee and borrow limit {limit}"
                ));
            }
        }
    }
    Ok(())
}

/// Teams owed GPUs that reclaim could serve (`ClusterState::team_needs`), and since when (ms).
pub struct OwedWatch {
    since: BTreeMap<String, i64>,
    bound_ms: i64,
}

impl OwedWatch {
    /// A watch that allows owed waits up to `bound_ms`.
    pub fn new(bound_ms: i64) -> OwedWatch {
        OwedWatch { since: BTreeMap::new(), bound_ms }
    }

    /// The state at `now_ms`: a team owed GPUs while reclaim could serve it, for longer than
    /// the bound, is a violation.
    pub fn observe(&mut self, s: &ClusterState, now_ms: i64) -> Result<(), String> {
        let owed: BTreeSet<String> =
            s.team_needs().into_iter().filter(|n| n.reclaimable).map(|n| n.team).collect();
        self.since.retain(|team, _| owed.contains(team));
        for team in owed {
            let since = *self.since.entry(team.clone()).or_insert(now_ms);
            if now_ms - since > self.bound_ms {
                return Err(format!("team {team} owed GPUs since {since} ms, still at {now_ms} ms"));
            }
        }
        Ok(())
    }
}

/// Runs `w` for its jobs' arrivals plus enough rounds to drain: each round the proposer is
/// asked until it proposes nothing new (a real leader plans again after every change), runs
/// start at once, end on time, and victims stop within their grace. Every checker judges
/// every round and every preemption; the first violation is returned.
pub fn run(w: &World) -> Result<ClusterState, String> {
    let mut s = ClusterState::new();
    let c = |now_ms: i64, op: Op| Command { skipped_ms: 0, now_ms, op };
    for (i, gpus) in w.nodes.iter().enumerate() {
        s.apply(&c(0, Op::RegisterNode { info: node_info(&format!("n{i}"), *gpus) }));
    }
    if s.apply(&c(0, Op::SetPolicy { policy: policy(w), audit: None })) != Outcome::PolicyChanged {
        return Err("the world's policy was refused".into());
    }
    let mut ends: BTreeMap<u64, u32> = BTreeMap::new();
    let mut runs_of: BTreeMap<u64, u32> = BTreeMap::new();
    let mut watch = OwedWatch::new(i64::from(GRACE_ROUNDS + 2) * ROUND_MS);
    for round in 0..100u32 {
        let now = i64::from(round) * ROUND_MS + 1;
        for (team, _, runs, inference) in w.jobs.iter().filter(|j| j.1 == round) {
            let mut sp = spec(1, if *inference { "inference" } else { "training" });
            sp.account = team_name(*team);
            sp.time_limit_s = Some(3600);
            let out = s.apply(&c(now, Op::Submit { spec: sp, request_id: None, hold: false, limits: None }));
            if let Outcome::Submitted { job } = out {
                runs_of.insert(job, *runs);
            }
        }
        // Runs that end: finished, or a victim done stopping.
        let due: Vec<u64> = ends.iter().filter(|(_, r)| **r <= round).map(|(id, _)| *id).collect();
        for id in due {
            ends.remove(&id);
            let Some(j) = s.jobs.get(&id) else { continue };
            let Some(a) = j.allocation.as_ref() else { continue };
            let exit = if a.stop.is_some() { RunExit::Signal(15) } else { RunExit::Code(0) };
            s.apply(&c(now, Op::JobExited { job: id, attempt: j.attempt, node: a.node.clone(), exit }));
        }
        for _ in 0..64 {
            let ops = propose(&s, now, &BTreeSet::new(), 3600);
            let mut changed = false;
            for op in ops {
                // Judged on the state it is applied to; what apply refuses changes nothing.
                let judged = match &op {
                    Op::Preempt { preemptor, victims, .. } => check_preemption(&s, Some(*preemptor), victims),
                    Op::Vacate { victims } => check_preemption(&s, None, victims),
                    _ => Ok(()),
                };
                let victims = match &op {
                    Op::Preempt { victims, .. } | Op::Vacate { victims } => victims.clone(),
                    _ => Vec::new(),
                };
                match s.apply(&c(now, op)) {
                    Outcome::PlanApplied { accepted, .. } => {
                        for id in accepted {
                            let j = &s.jobs[&id];
                            let node = j.allocation.as_ref().expect("placed").node.clone();
                            s.apply(&c(now, Op::JobStarted { job: id, attempt: j.attempt, node }));
                            ends.insert(id, round + runs_of.get(&id).copied().unwrap_or(1));
                            changed = true;
                        }
                    }
                    Outcome::Preempted { .. } | Outcome::Vacated { .. } => {
                        judged?;
                        // Victims stop within their grace: after 0 to GRACE_ROUNDS rounds.
                        for v in victims {
                            ends.insert(v, round + (v as u32 + round) % (GRACE_ROUNDS + 1));
                        }
                        changed = true;
                    }
                    Outcome::Rejected(_) | Outcome::Ignored(_) => {}
                    _ => changed = true,
                }
                check_caps(&s)?;
            }
            if !changed {
                break;
            }
        }
        s.check_invariants()?;
        watch.observe(&s, now)?;
    }
    Ok(s)
}

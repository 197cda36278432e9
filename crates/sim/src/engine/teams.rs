//! Team guarantees in a replay: per guaranteed account, how much of what it was owed it got,
//! how long it waited while owed, and what it lent and borrowed — measured from the state
//! after each instant's events, integrated over time.
//!
//! Owed (`ClusterState::team_needs`): the team has a waiting job that fits in what
//! is left of its guarantee. Its owed waits are counted twice: all of them, and those while
//! reclaim could serve it (other teams' borrowed runs reclaim may take would make room for it
//! on some node) — the waits reclaim is meant to end within the grace. Entitled: the smaller of its guarantee and its demand (what it holds plus what
//! waits); honoured: what of that it held.

use std::collections::BTreeMap;

use kairos_scheduler::ClusterState;

use crate::report::{percentile, TeamFigures};

#[derive(Default)]
struct Team {
    guaranteed: u64,
    /// Measured after the last events: held, entitled, lent, borrowed.
    now: [u64; 4],
    /// GPU-ms of each, integrated.
    areas: [f64; 4],
    /// Owed since (any), and owed while reclaimable borrowers held GPUs since.
    owed_since: [Option<i64>; 2],
    owed_waits_s: [Vec<f64>; 2],
}

pub(super) struct TeamSide {
    teams: BTreeMap<String, Team>,
    last_ms: i64,
}

impl TeamSide {
    /// Only for a policy with guarantees.
    pub(super) fn new(state: &ClusterState) -> Option<TeamSide> {
        state.policy.has_guarantees().then(|| TeamSide { teams: BTreeMap::new(), last_ms: 0 })
    }

    /// Integrates up to `now` what the last measurement found.
    pub(super) fn advance(&mut self, now: i64) {
        let dt = (now - self.last_ms).max(0) as f64;
        for t in self.teams.values_mut() {
            for (area, v) in t.areas.iter_mut().zip(t.now) {
                *area += v as f64 * dt;
            }
        }
        self.last_ms = now;
    }

    /// Measures the state after the events (and the pass) at `now`.
    pub(super) fn observe(&mut self, state: &ClusterState, now: i64) {
        let needs = state.team_needs();
        for r in state.guarantees().report() {
            let Some(need) = needs.iter().find(|n| n.team == r.account) else { continue };
            let t = self.teams.entry(r.account.clone()).or_default();
            t.guaranteed = r.guaranteed;
            let entitled = r.guaranteed.min(r.in_use + need.waiting);
            t.now = [r.in_use.min(entitled), entitled, r.lent, r.borrowed];
            for (k, owed) in [need.owed, need.reclaimable].into_iter().enumerate() {
                match (owed, t.owed_since[k]) {
                    (true, None) => t.owed_since[k] = Some(now),
                    (false, Some(since)) => {
                        t.owed_since[k] = None;
                        t.owed_waits_s[k].push((now - since) as f64 / 1000.0);
                    }
                    _ => {}
                }
            }
        }
    }

    /// Per team, at `end_ms` (a wait still open counts to then).
    pub(super) fn report(&self, end_ms: i64) -> Vec<TeamFigures> {
        let hours = |ms: f64| (ms / 3_600_000.0 * 1000.0).round() / 1000.0;
        self.teams
            .iter()
            .map(|(name, t)| {
                let waits = |k: usize| {
                    let mut waits = t.owed_waits_s[k].clone();
                    if let Some(since) = t.owed_since[k] {
                        waits.push((end_ms - since).max(0) as f64 / 1000.0);
                    }
                    waits.sort_by(f64::total_cmp);
                    waits
                };
                let (all, waits) = (waits(0), waits(1));
                let [honoured, entitled, lent, borrowed] = t.areas;
                TeamFigures {
                    account: name.clone(),
                    guaranteed_gpus: t.guaranteed,
                    entitled_gpu_hours: hours(entitled),
                    honoured_gpu_hours: hours(honoured),
                    honoured: if entitled > 0.0 {
                        (honoured / entitled * 1000.0).round() / 1000.0
                    } else {
                        1.0
                    },
                    owed_waits: waits.len(),
                    owed_wait_p50_s: percentile(&waits, 0.5),
                    owed_wait_p99_s: percentile(&waits, 0.99),
                    owed_wait_max_s: waits.last().copied().unwrap_or(0.0),
                    owed_any_waits: all.len(),
                    owed_any_wait_p99_s: percentile(&all, 0.99),
                    owed_any_wait_max_s: all.last().copied().unwrap_or(0.0),
                    lent_gpu_hours: hours(lent),
                    borrowed_gpu_hours: hours(borrowed),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use kairos_scheduler::policy::{Guarantee, Policy};

    use crate::engine::{simulate, SimConfig};
    use crate::trace::{TraceJob, TraceNode};

    /// Two teams of 4 on 8 GPUs: the first team's long jobs fill the cluster, the second's
    /// arrive later, within its guarantee, and take back what was borrowed.
    #[test]
    fn a_replay_with_teams_reclaims_and_reports_each_team() {
        let nodes: Vec<TraceNode> = (0..2)
            .map(|i| TraceNode { name: format!("n{i}"), gpus: 4, model: "T4".into(), ..TraceNode::default() })
            .collect();
        // a0's jobs arrive first and fill all 8 GPUs; a1's ten minutes later.
        let jobs: Vec<TraceJob> = (0..24)
            .map(|i| TraceJob {
                name: format!("j{i}"),
                submit_ms: if crate::engine::account_of(1, i, 2) == "a0" { 0 } else { 600_000 },
                duration_ms: 3_600_000,
                gpus: 1,
                ..TraceJob::default()
            })
            .collect();
        let mut policy = crate::engine::replay_policy();
        let config = SimConfig { accounts: 2, ..SimConfig::default() };
        let fairshare = simulate(&nodes, &jobs, &policy, &config);
        assert!(fairshare.teams.is_empty(), "no guarantees, no team figures");
        add_teams(&mut policy);
        let teams = simulate(&nodes, &jobs, &policy, &config);
        assert_eq!(teams.teams.iter().map(|t| t.account.as_str()).collect::<Vec<_>>(), ["a0", "a1"]);
        assert!(teams.preemptions > 0, "reclaim preempted borrowers");
        for t in &teams.teams {
            assert!(t.entitled_gpu_hours > 0.0 && t.honoured > 0.9, "{t:?}");
            // Reclaim ends an owed wait within the 10 s grace and a pass.
            assert!(t.owed_wait_max_s <= 12.0, "{t:?}");
        }
        assert!(teams.utilization >= fairshare.utilization - 1e-9);
        let table = crate::Report::table(&[("teams".into(), teams)]);
        assert!(table.contains("team a1 (4 GPUs): guaranteed GPU-h honoured"), "{table}");
    }

    fn add_teams(policy: &mut Policy) {
        for name in ["a0", "a1"] {
            let mut a = policy.accounts["root"].clone();
            a.name = name.into();
            a.parent = Some("root".into());
            a.guarantee = Some(Guarantee { gpus: 4, borrow_limit: None, lend_limit: None });
            policy.accounts.insert(name.into(), a);
        }
    }
}

//! Bounds on the state: how many unfinished jobs one user, and the whole cluster, may have.
//!
//! The replica that proposes a submit stamps its configured limits into the command
//! (`Op::Submit::limits`, from `kairosd --max-jobs-per-user/--max-jobs`), so apply enforces them
//! exactly — also for the submits of one group commit — and every replica decides alike.
//! Counting is kept in `UnfinishedIndex`, a cache rebuilt from the jobs whenever a state is
//! new (deserialized), so it never travels in snapshots.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::state::{ClusterState, Rejection};

/// Limits a submit is admitted under.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubmitLimits {
    /// Unfinished (pending, running, suspended) jobs one user may have.
    pub max_jobs_per_user: u32,
    /// Unfinished jobs the cluster may hold.
    pub max_jobs: u32,
    /// Submitted by an operator: any QoS, whatever the account allows.
    #[serde(default)]
    pub any_qos: bool,
}

/// Unfinished jobs by user, derived from `ClusterState::jobs` (a cache: equal to any other, never
/// serialized, rebuilt when missing).
#[derive(Clone, Debug, Default)]
pub struct UnfinishedIndex(Option<Counts>);

#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Counts {
    by_user: BTreeMap<String, u64>,
    total: u64,
}

impl PartialEq for UnfinishedIndex {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for UnfinishedIndex {}

impl UnfinishedIndex {
    fn counts(state: &ClusterState) -> Counts {
        let mut c = Counts::default();
        for j in state.jobs.values().filter(|j| !j.state.is_terminal()) {
            *c.by_user.entry(j.spec.user.clone()).or_default() += 1;
            c.total += 1;
        }
        c
    }

    /// A job of `user` was added (unfinished).
    pub(crate) fn added(&mut self, user: &str) {
        if let Some(c) = &mut self.0 {
            *c.by_user.entry(user.to_string()).or_default() += 1;
            c.total += 1;
        }
    }

    /// A job of `user` reached a terminal state.
    pub(crate) fn ended(&mut self, user: &str) {
        if let Some(c) = &mut self.0 {
            if let Some(n) = c.by_user.get_mut(user) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    c.by_user.remove(user);
                }
            }
            c.total = c.total.saturating_sub(1);
        }
    }
}

impl ClusterState {
    /// `RESOURCE_EXHAUSTED` when one more unfinished job of `user` would pass `limits`.
    pub(crate) fn check_submit_limits(
        &mut self,
        user: &str,
        limits: &SubmitLimits,
        adding: u64,
    ) -> Result<(), Rejection> {
        if self.unfinished.0.is_none() {
            self.unfinished.0 = Some(UnfinishedIndex::counts(self));
        }
        let Some(c) = &self.unfinished.0 else { return Ok(()) };
        let mine = c.by_user.get(user).copied().unwrap_or(0);
        if mine + adding > u64::from(limits.max_jobs_per_user) {
            return Err(Rejection::ResourceExhausted(format!(
                "user \"{user}\" has {mine} unfinished jobs: the limit is {} (kairosd --max-jobs-per-user)",
                limits.max_jobs_per_user
            )));
        }
        if c.total + adding > u64::from(limits.max_jobs) {
            return Err(Rejection::ResourceExhausted(format!(
                "the cluster holds {} unfinished jobs: the limit is {} (kairosd --max-jobs)",
                c.total, limits.max_jobs
            )));
        }
        Ok(())
    }

    /// Whether the cached counts (if built) match the jobs; for `check_invariants`.
    pub(crate) fn check_unfinished_index(&self) -> Result<(), String> {
        match &self.unfinished.0 {
            Some(c) if *c != UnfinishedIndex::counts(self) => {
                Err(format!("unfinished-job counts drifted: {c:?} vs {:?}", UnfinishedIndex::counts(self)))
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Command, Op, Outcome};
    use crate::testing::{node_info, spec};

    fn submit(s: &mut ClusterState, user: &str, limits: SubmitLimits) -> Outcome {
        let mut sp = spec(1, "batch");
        sp.user = user.into();
        let out = s.apply(&Command {
            skipped_ms: 0,
            now_ms: 2,
            op: Op::Submit { spec: sp, request_id: None, hold: true, limits: Some(limits) },
        });
        s.check_invariants().unwrap();
        out
    }

    #[test]
    fn unfinished_jobs_are_bounded_per_user_and_in_all_and_ended_jobs_free_room() {
        let mut s = ClusterState::new();
        s.apply(&Command { skipped_ms: 0, now_ms: 1, op: Op::RegisterNode { info: node_info("n1", 2) } });
        let l = SubmitLimits { max_jobs_per_user: 2, max_jobs: 3, any_qos: false };
        assert!(matches!(submit(&mut s, "alice", l), Outcome::Submitted { .. }));
        assert!(matches!(submit(&mut s, "alice", l), Outcome::Submitted { .. }));
        let before = s.jobs.len();
        match submit(&mut s, "alice", l) {
            Outcome::Rejected(Rejection::ResourceExhausted(m)) => {
                assert!(m.contains("--max-jobs-per-user"), "{m}")
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(s.jobs.len(), before, "a refused submit changed the state");
        assert!(matches!(submit(&mut s, "bob", l), Outcome::Submitted { .. }));
        match submit(&mut s, "carol", l) {
            Outcome::Rejected(Rejection::ResourceExhausted(m)) => assert!(m.contains("--max-jobs)"), "{m}"),
            other => panic!("{other:?}"),
        }
        // A cancelled job no longer counts.
        s.apply(&Command { skipped_ms: 0, now_ms: 3, op: Op::Cancel { job: 1, by: "alice".into() } });
        s.check_invariants().unwrap();
        assert!(matches!(submit(&mut s, "alice", l), Outcome::Submitted { .. }));
        // A job that runs and exits no longer counts either.
        s.apply(&Command { skipped_ms: 0, now_ms: 4, op: Op::Release { job: 2, by: "alice".into() } });
        let plan = crate::plan(&s).plan;
        s.apply(&Command { skipped_ms: 0, now_ms: 5, op: Op::ApplyPlan { plan } });
        s.apply(&Command {
            skipped_ms: 0,
            now_ms: 6,
            op: Op::JobStarted { job: 2, attempt: 0, node: "n1".into() },
        });
        let exit = crate::state::RunExit::Code(0);
        s.apply(&Command {
            skipped_ms: 0,
            now_ms: 7,
            op: Op::JobExited { job: 2, attempt: 0, node: "n1".into(), exit },
        });
        s.check_invariants().unwrap();
        assert_eq!(s.jobs[&2].state, crate::model::JobState::Completed);
        assert!(matches!(submit(&mut s, "alice", l), Outcome::Submitted { .. }));
        // A state read back (a snapshot) rebuilds its counts and decides alike.
        let mut copy: ClusterState = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert!(matches!(submit(&mut copy, "alice", l), Outcome::Rejected(_)));
    }
}

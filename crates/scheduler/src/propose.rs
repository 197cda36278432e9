//! What the leader proposes: one pure function from the applied state, the time and the nodes
//! whose heartbeats stopped, to the ops of one pass. `server/src/leader.rs` only gathers those
//! inputs and proposes the result; apply re-validates every op, so a pass computed on a stale
//! state is harmless.
//!
//! The decision whether planning can achieve anything at all uses the core's own rules
//! (`ClusterState::may_preempt`: a QoS preempt list *or* a higher partition tier), so the gate
//! and the planner cannot disagree.

use std::collections::BTreeSet;

use crate::model::{JobState, NodeState};
use crate::planner::{plan_with, PlanConfig};
use crate::state::{ClusterState, Op};

/// How often the leader looks for finished jobs past the retention (one scan of the jobs).
pub const PURGE_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// A replica's leadership as its leader loop tracks it (`kairosd` and the simulation alike): a
/// new term starts with no liveness and a full grace, so a failover never causes mass NodeDown;
/// purges come every `PURGE_EVERY`.
#[derive(Debug, Default)]
pub struct Leadership {
    /// The term it leads and since when.
    since: Option<(u64, std::time::Instant)>,
    last_purge: Option<std::time::Instant>,
}

impl Leadership {
    /// At `now`, leading in `term` (None: not leading): how long it has led this term, the
    /// liveness reset when the term is new.
    pub fn led_for(
        &mut self,
        term: Option<u64>,
        now: std::time::Instant,
        liveness: &mut crate::liveness::Liveness,
    ) -> Option<std::time::Duration> {
        let Some(term) = term else {
            self.since = None;
            return None;
        };
        if self.since.is_none_or(|(t, _)| t != term) {
            self.since = Some((term, now));
            *liveness = crate::liveness::Liveness::default();
        }
        self.since.map(|(_, at)| now.saturating_duration_since(at))
    }

    /// Whether this pass purges (every `PURGE_EVERY`).
    pub fn purges(&mut self, now: std::time::Instant) -> bool {
        let due = self.last_purge.is_none_or(|at| now.saturating_duration_since(at) >= PURGE_EVERY);
        if due {
            self.last_purge = Some(now);
        }
        due
    }
}

/// What one tick of the leader loop is given besides the replica.
#[derive(Clone, Copy, Debug)]
pub struct Tick<'r> {
    /// This replica's monotonic clock.
    pub now: std::time::Instant,
    /// The cluster's time.
    pub now_ms: i64,
    pub node_timeout: std::time::Duration,
    /// The retention finished jobs are purged by, every `PURGE_EVERY`.
    pub retention: &'r crate::state::history::Retention,
}

impl Leadership {
    /// One tick of the leader loop, as `kairosd`'s and the simulation's both take it: while
    /// the replica leads, how long it has led (its liveness reset when the term is new) and the
    /// ops of its step (`leader_step`, purging when due) on one read of the state; None while
    /// it does not lead.
    pub fn tick<S: crate::liveness::Seat>(
        &mut self,
        seat: &S,
        tick: Tick,
    ) -> Option<(std::time::Duration, Vec<Op>)> {
        let term = seat.term();
        let led_for = seat.read(|_, live| self.led_for(term, tick.now, live))?;
        let step = Step {
            led_for,
            node_timeout: tick.node_timeout,
            now: tick.now,
            now_ms: tick.now_ms,
            purge: self.purges(tick.now).then_some(tick.retention),
        };
        Some((led_for, seat.read(|state, live| leader_step(state, live, step))))
    }
}

/// What a leader step is given besides the state and the liveness it updates.
#[derive(Clone, Copy, Debug)]
pub struct Step<'r> {
    /// How long this replica has led.
    pub led_for: std::time::Duration,
    pub node_timeout: std::time::Duration,
    /// This replica's monotonic clock.
    pub now: std::time::Instant,
    /// The cluster's time.
    pub now_ms: i64,
    /// When it is time to look (the caller's cadence): the retention to purge finished jobs by.
    pub purge: Option<&'r crate::state::history::Retention>,
}

/// One step of the leader, as `kairosd` and the simulation both take it: judge which nodes fell
/// silent (`Liveness::judge_silent`, condemning them), propose, and purge what is due.
pub fn leader_step(state: &ClusterState, liveness: &mut crate::liveness::Liveness, step: Step) -> Vec<Op> {
    // Silent nodes and time limits are swept on a cadence (`SWEEPS_PER_TIMEOUT`), not at
    // every step: the loop steps at every submit.
    let sweep = liveness.sweep_due(step.now, step.node_timeout);
    let silent = match sweep {
        true => liveness.judge_silent(state, step.led_for, step.node_timeout, step.now),
        false => BTreeSet::new(),
    };
    let mut ops = propose_with(state, step.now_ms, &silent, step.node_timeout.as_secs(), sweep);
    if let Some(retention) = step.purge {
        ops.extend(crate::state::history::purge_due(state, step.now_ms, retention));
    }
    ops
}

/// The ops of one leader pass at `now_ms`. `silent` are the nodes whose heartbeats stopped
/// `timeout_s` ago or more (empty while a new leader gives every node its grace).
pub fn propose(state: &ClusterState, now_ms: i64, silent: &BTreeSet<String>, timeout_s: u64) -> Vec<Op> {
    propose_with(state, now_ms, silent, timeout_s, true)
}

/// `propose`, looking for runs past their time limits only when `limits`.
fn propose_with(
    state: &ClusterState,
    now_ms: i64,
    silent: &BTreeSet<String>,
    timeout_s: u64,
    limits: bool,
) -> Vec<Op> {
    let mut ops = Vec::new();
    for (name, node) in &state.nodes {
        if node.state != NodeState::Down && silent.contains(name) {
            ops.push(Op::NodeDown { node: name.clone(), reason: format!("no heartbeat for {timeout_s}s") });
        }
    }
    if limits {
        for (job, attempt) in state.expired_runs(now_ms) {
            ops.push(Op::EnforceTimeLimit { job, attempt });
        }
    }
    // A window opening or closing changes what may start: the pass waits for the next step,
    // on the state the tick made.
    if state.reservations_due(now_ms) {
        ops.push(Op::ReservationTick);
        return ops;
    }
    if may_place_or_preempt(state) {
        let out = plan_with(state, PlanConfig::LEADER);
        if let Some(p) = out.preemption {
            ops.push(Op::Preempt { preemptor: p.preemptor, node: p.node, victims: p.victims, gpus: p.gpus });
        }
        if !out.plan.placements.is_empty() {
            ops.push(Op::ApplyPlan { plan: out.plan });
        }
        for g in out.grow {
            ops.push(Op::Resize { job: g.job, attempt: g.attempt, gpus: g.gpus, more: g.more });
        }
        // After the placements: the headroom's shortfall is judged with them applied.
        if !out.vacate.is_empty() {
            ops.push(Op::Vacate { victims: out.vacate });
        }
    }
    ops
}

/// Whether a planning pass can change anything: a GPU is free (or a CPU, for a job asking no GPU), a pending job holds a claim
/// or may preempt, or the headroom lacks GPUs. (Saves the pass on a cluster full of work that
/// cannot preempt.)
fn may_place_or_preempt(state: &ClusterState) -> bool {
    state.has_free_gpus()
        || state.has_shared_room()
        || (state.has_free_cpus()
            && state.job_index.pending_gpuless(&state.jobs).unwrap_or_else(|| {
                state.jobs.values().any(|j| j.state == JobState::Pending && j.spec.gpus == 0)
            }))
        || state.headroom_shortfall() > 0
        || state
            .job_index
            .pending_may_act(&state.jobs, &state.policy)
            .unwrap_or_else(|| pending_may_act(state))
}

/// Some pending job holds a claim or may preempt (by QoS or tier; with team guarantees any
/// pending job may reclaim), from the job records (what the kept index answers without
/// reading them; the property driver checks they agree).
pub(crate) fn pending_may_act(state: &ClusterState) -> bool {
    let none = crate::guarantee::Guarantees::default();
    let teams = state.policy.has_guarantees();
    state.jobs.values().any(|j| {
        j.state == JobState::Pending && (j.claim.is_some() || teams || state.may_preempt(j, &none, false))
    })
}

#[cfg(test)]
mod leadership_tests {
    use super::*;

    #[test]
    fn a_new_term_resets_the_liveness_and_restarts_the_lead_and_purges_come_every_second() {
        let t0 = std::time::Instant::now();
        let mut l = Leadership::default();
        let mut live = crate::liveness::Liveness::default();
        assert_eq!(l.led_for(None, t0, &mut live), None);
        assert_eq!(l.led_for(Some(3), t0, &mut live), Some(std::time::Duration::ZERO));
        let later = t0 + std::time::Duration::from_secs(5);
        live.heartbeat("n1", later, 42);
        assert_eq!(l.led_for(Some(3), later, &mut live), Some(std::time::Duration::from_secs(5)));
        assert_eq!(live.last_seen_ms("n1"), 42, "the same term keeps what it heard");
        assert_eq!(l.led_for(Some(4), later, &mut live), Some(std::time::Duration::ZERO), "a new term");
        assert_eq!(live.last_seen_ms("n1"), 0, "a new term starts with no liveness");
        assert!(l.purges(t0));
        assert!(!l.purges(t0 + std::time::Duration::from_millis(500)));
        assert!(l.purges(t0 + PURGE_EVERY));
    }

    #[test]
    fn a_tick_steps_only_while_leading_and_judges_silence_only_after_a_full_timeout_of_lead() {
        use crate::liveness::desk_tests::{desk, join};
        let d = desk();
        join(&d, None).unwrap();
        let retention = crate::state::history::Retention {
            job_ms: 1_000,
            history_max_jobs: 10,
            history_max_age_ms: i64::MAX,
        };
        let timeout = std::time::Duration::from_secs(10);
        let t0 = std::time::Instant::now();
        let tick = |at| Tick { now: at, now_ms: 1, node_timeout: timeout, retention: &retention };
        let mut l = Leadership::default();
        let follower = crate::liveness::desk_tests::Desk { leader: false, ..desk() };
        assert!(l.tick(&follower, tick(t0)).is_none(), "a replica that does not lead proposes nothing");
        let (led_for, ops) = l.tick(&d, tick(t0)).unwrap();
        assert_eq!(led_for, std::time::Duration::ZERO);
        assert!(ops.is_empty(), "a new leader's grace: {ops:?}");
        let (led_for, ops) = l.tick(&d, tick(t0 + timeout)).unwrap();
        assert_eq!(led_for, timeout);
        assert!(ops.iter().any(|op| matches!(op, Op::NodeDown { node, .. } if node == "n1")), "{ops:?}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Command, Outcome, RunExit};
    use crate::testing::{node_info, spec};

    fn apply(s: &mut ClusterState, now_ms: i64, op: Op) -> Outcome {
        s.apply(&Command { skipped_ms: 0, now_ms, op })
    }

    /// Applies what `propose` says, as the leader would.
    fn pass(s: &mut ClusterState, now_ms: i64) -> Vec<Op> {
        let ops = propose(s, now_ms, &BTreeSet::new(), 20);
        for op in ops.clone() {
            apply(s, now_ms, op);
        }
        ops
    }

    fn submit(s: &mut ClusterState, now_ms: i64, gpus: u32, partition: &str) -> u64 {
        let mut sp = spec(gpus, "batch");
        sp.partition = partition.into();
        match apply(s, now_ms, Op::Submit { spec: sp, request_id: None, hold: false, limits: None }) {
            Outcome::Submitted { job } => job,
            other => panic!("{other:?}"),
        }
    }

    fn partition(name: &str, tier: u32) -> crate::policy::Partition {
        crate::policy::Partition {
            name: name.into(),
            nodes: ["n1".to_string()].into(),
            selector: Default::default(),
            priority_tier: tier,
            allowed_qos: Default::default(),
            default_qos: None,
            max_wall_s: None,
            resources: Default::default(),
            idle_gpu: None,
        }
    }

    fn two_tiers() -> ClusterState {
        let mut s = ClusterState::new();
        apply(&mut s, 1, Op::RegisterNode { info: node_info("n1", 2) });
        let mut policy = s.policy.clone();
        for p in [partition("low", 0), partition("high", 2)] {
            policy.partitions.insert(p.name.clone(), p);
        }
        assert!(matches!(apply(&mut s, 1, Op::SetPolicy { policy, audit: None }), Outcome::PolicyChanged));
        s
    }

    #[test]
    fn a_higher_partition_tier_preempts_on_a_full_cluster() {
        let mut s = two_tiers();
        let low = submit(&mut s, 10, 2, "low");
        pass(&mut s, 10);
        apply(&mut s, 11, Op::JobStarted { job: low, attempt: 0, node: "n1".into() });
        assert!(!s.has_free_gpus());
        // Batch preempts nothing by QoS; only the tier lets `high` in.
        let high = submit(&mut s, 20, 2, "high");
        let ops = pass(&mut s, 20);
        assert!(
            ops.iter().any(|op| matches!(op, Op::Preempt { preemptor, victims, .. } if *preemptor == high && victims == &[low])),
            "{ops:?}"
        );
        apply(
            &mut s,
            21,
            Op::JobExited { job: low, attempt: 0, node: "n1".into(), exit: RunExit::Signal(15) },
        );
        pass(&mut s, 22);
        assert_eq!(s.jobs[&high].state, JobState::Running);
        assert_eq!(s.jobs[&low].state, JobState::Pending, "requeued (batch is REQUEUE)");
    }

    #[test]
    fn a_full_cluster_of_work_that_cannot_preempt_costs_no_pass() {
        let mut s = two_tiers();
        let first = submit(&mut s, 10, 2, "high");
        pass(&mut s, 10);
        apply(&mut s, 11, Op::JobStarted { job: first, attempt: 0, node: "n1".into() });
        submit(&mut s, 20, 2, "low");
        assert!(!may_place_or_preempt(&s), "a lower tier may not preempt");
        assert!(propose(&s, 20, &BTreeSet::new(), 20).is_empty());
    }

    #[test]
    fn silent_nodes_go_down_once_and_expired_runs_are_ended() {
        let mut s = ClusterState::new();
        apply(&mut s, 1, Op::RegisterNode { info: node_info("n1", 1) });
        apply(&mut s, 1, Op::RegisterNode { info: node_info("n2", 1) });
        let mut sp = spec(1, "batch");
        sp.time_limit_s = Some(60);
        let job = match apply(&mut s, 2, Op::Submit { spec: sp, request_id: None, hold: false, limits: None })
        {
            Outcome::Submitted { job } => job,
            other => panic!("{other:?}"),
        };
        pass(&mut s, 2);
        let node = s.jobs[&job].allocation.as_ref().unwrap().node.clone();
        apply(&mut s, 3, Op::JobStarted { job, attempt: 0, node });
        let silent: BTreeSet<String> = ["n2".to_string()].into();
        let ops = propose(&s, 70_000, &silent, 20);
        assert!(
            ops.contains(&Op::NodeDown { node: "n2".into(), reason: "no heartbeat for 20s".into() }),
            "{ops:?}"
        );
        assert!(ops.contains(&Op::EnforceTimeLimit { job, attempt: 0 }), "{ops:?}");
        apply(&mut s, 70_000, Op::NodeDown { node: "n2".into(), reason: "x".into() });
        let again = propose(&s, 70_000, &silent, 20);
        assert!(!again.iter().any(|op| matches!(op, Op::NodeDown { .. })), "a down node again: {again:?}");
    }
}

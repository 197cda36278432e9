//! The property tests: random command sequences keep every invariant, and a replay of the log
//! gives a byte-identical state.

use super::*;
use crate::testing::driver::{drive, preemption_step, step, Step};

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn no_gpu_is_ever_held_by_two_jobs(steps in proptest::collection::vec(step(), 1..80)) {
        let (s, _) = drive(&steps);
        // Every holder of a GPU with its thousandths: a whole GPU is 1000, a fraction its share.
        let mut owners: std::collections::BTreeMap<_, Vec<(_, u32)>> = std::collections::BTreeMap::new();
        for job in s.jobs.values().filter(|j| matches!(j.state, JobState::Running | JobState::Suspended)) {
            let a = job.allocation.as_ref().unwrap();
            let milli = if job.spec.gpu_milli > 0 { job.spec.gpu_milli } else { crate::model::GPU_MILLI };
            // Tasks still running; a suspended job's lent GPUs are the preemptor's meanwhile.
            for (_, node, gpus) in a.tasks().filter(|(rank, _, _)| !a.exits.contains_key(rank)) {
                for g in gpus.iter().filter(|g| !a.lent.contains(g)) {
                    owners.entry((node.to_string(), *g)).or_default().push((job.id, milli));
                }
            }
        }
        for ((node, g), holders) in &owners {
            // Fractions share a GPU up to a whole one; a whole holder (1000) is therefore alone.
            let total: u32 = holders.iter().map(|(_, m)| m).sum();
            prop_assert!(total <= crate::model::GPU_MILLI, "GPU {g} of {node} held past a whole GPU: {holders:?}");
        }
    }

    #[test]
    fn replaying_the_log_gives_an_identical_state(steps in proptest::collection::vec(step(), 1..80)) {
        let (s, log) = drive(&steps);
        let mut replica = ClusterState::new();
        for c in &log {
            replica.apply(c);
        }
        prop_assert_eq!(&replica, &s);
        // Byte-identical once serialised, as snapshots are.
        prop_assert_eq!(serde_json::to_vec(&replica).unwrap(), serde_json::to_vec(&s).unwrap());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Full nodes preempted over and over (suspend, shrink, grow back, requeue), with exits,
    /// cancels and node failures in between: every invariant and QoS limit holds after every
    /// command (checked inside `drive`), and replaying the log gives the same state.
    #[test]
    fn preemption_keeps_every_invariant(steps in proptest::collection::vec(preemption_step(), 1..100)) {
        let (s, log) = drive(&steps);
        let mut replica = ClusterState::new();
        for c in &log {
            replica.apply(c);
        }
        prop_assert_eq!(serde_json::to_vec(&replica).unwrap(), serde_json::to_vec(&s).unwrap());
    }
}

/// The preemption driver reaches headroom refills (so the property above covers `Op::Vacate`):
/// over a fixed set of generated sequences, some runs were stopped for the headroom.
#[test]
fn the_preemption_driver_refills_the_headroom() {
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let strategy = proptest::collection::vec(preemption_step(), 1..100);
    let mut vacated = 0;
    for _ in 0..200 {
        let steps = strategy.new_tree(&mut runner).expect("a sequence").current();
        let (s, _) = drive(&steps);
        vacated += s.preemption_totals.get("vacate").copied().unwrap_or(0);
    }
    assert!(vacated > 0, "no sequence stopped a run for the headroom");
}

/// The minimal case a fresh-clone CI found: the limits checker read a dependency from the live
/// jobs after it was purged into the history, and panicked (`drive` runs `check_limits`).
#[test]
fn a_dependency_purged_into_the_history_is_checked_there() {
    let submit = |flags| Step::Submit { gpus: 1, qos: 0, rid: None, flags };
    let steps = [
        submit(0),
        submit(5),
        Step::Plan,
        Step::RankExited { job: 0, rank: 0, code: 0 },
        Step::Purge { jobs: vec![0] },
        Step::Plan,
    ];
    let (s, _) = drive(&steps);
    let dependent = s.jobs.values().find(|j| !j.spec.after_ok.is_empty()).expect("the dependent job");
    assert!(!s.jobs.contains_key(&dependent.spec.after_ok[0]), "the dependency was purged");
    assert_eq!(dependent.state, JobState::Running, "its dependency completed: it ran");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// The planner and apply judge a fit with the same leaf (`fit::fits`): a plan made from a
    /// state, applied to that same state, has every placement accepted; so has its
    /// preemption and its first grow-back. States from random sequences (nodes of several
    /// sizes and models registered, failed and drained; jobs with CPUs, memory, models,
    /// partitions, gangs, fractions and limits, running, exiting and preempted).
    #[test]
    fn applying_a_fresh_plan_to_the_state_it_was_made_from_rejects_nothing(
        steps in proptest::collection::vec(prop_oneof![step(), preemption_step()], 1..80),
    ) {
        let (s, _) = drive(&steps);
        let out = plan(&s);
        let now = s.now_ms;
        let mut applied = s.clone();
        let placed: Vec<_> = out.plan.placements.iter().map(|p| p.job).collect();
        match applied.apply(&cmd(now, Op::ApplyPlan { plan: out.plan.clone() })) {
            Outcome::PlanApplied { accepted, rejected } => {
                prop_assert!(rejected.is_empty(), "fresh plan {:?} rejected {rejected:?}", out.plan);
                prop_assert_eq!(accepted, placed);
            }
            other => prop_assert!(false, "fresh plan {:?}: {other:?}", out.plan),
        }
        if let Some(p) = out.preemption {
            let op = Op::Preempt { preemptor: p.preemptor, node: p.node, victims: p.victims, gpus: p.gpus };
            let outcome = s.clone().apply(&cmd(now, op));
            prop_assert!(!matches!(outcome, Outcome::Rejected(_) | Outcome::Ignored(_)), "{outcome:?}");
        }
        if let Some(g) = out.grow.first() {
            let op = Op::Resize { job: g.job, attempt: g.attempt, gpus: g.gpus.clone(), more: g.more.clone() };
            let outcome = s.clone().apply(&cmd(now, op));
            prop_assert!(!matches!(outcome, Outcome::Rejected(_) | Outcome::Ignored(_)), "{outcome:?}");
        }
    }
}

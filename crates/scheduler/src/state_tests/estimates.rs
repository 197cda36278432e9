//! Start estimates: each waiting job's expected start from the pass's timeline of time limits,
//! windows and earlier estimates, checked against the starts the planner then makes.

use super::*;
use crate::planner::{plan_with, PlanConfig, ESTIMATES_MAX};

fn estimates(s: &ClusterState) -> std::collections::BTreeMap<u64, crate::planner::Estimate> {
    plan_with(s, PlanConfig { estimates: ESTIMATES_MAX, ..Default::default() }).estimates
}

fn submit(s: &mut ClusterState, gpus: u32, limit_s: Option<u64>, now: i64) -> u64 {
    let mut sp = spec(gpus, "training");
    sp.time_limit_s = limit_s;
    submitted(s.apply(&cmd(now, Op::Submit { spec: sp, request_id: None, hold: false, limits: None })))
}

/// Runs the leader until `until` in steps of 100 ms: time limits enforced, runs end as soon as
/// told to stop, every placement started at once.
fn run_until(s: &mut ClusterState, from: i64, until: i64) {
    let mut now = from;
    while now <= until {
        for op in crate::propose::propose(s, now, &Default::default(), 30) {
            s.apply(&cmd(now, op));
        }
        let ids: Vec<u64> = s.jobs.keys().copied().collect();
        for id in ids {
            let j = &s.jobs[&id];
            let Some(a) = j.allocation.as_ref() else { continue };
            let (attempt, node) = (j.attempt, a.node.clone());
            if j.start_time_ms.is_none() {
                s.apply(&cmd(now, Op::JobStarted { job: id, attempt, node }));
            } else if a.stop.is_some() {
                s.apply(&cmd(now, Op::JobExited { job: id, attempt, node, exit: RunExit::Signal(9) }));
            }
        }
        now += 100;
    }
}

#[test]
fn three_queued_jobs_are_estimated_to_start_when_the_ones_ahead_reach_their_time_limits() {
    let mut s = cluster(4);
    let running = submit(&mut s, 4, Some(10), 1_000);
    run_until(&mut s, 1_000, 1_000);
    let queued: Vec<u64> = [5, 6, 7].iter().map(|l| submit(&mut s, 4, Some(*l), 2_000)).collect();
    let est = estimates(&s);
    let starts: Vec<Option<i64>> = queued.iter().map(|j| est[j].start_ms).collect();
    assert_eq!(starts, vec![Some(11_000), Some(16_000), Some(22_000)]);
    assert_eq!(est[&queued[0]].why, format!("after job {running} ends (time limit) on n1"));
    assert!(est[&queued[1]].why.contains(&format!("after job {}", queued[0])), "{}", est[&queued[1]].why);
    // When nothing else changes, the planner starts them then (within one 100 ms step).
    run_until(&mut s, 2_000, 30_000);
    for (j, want) in queued.iter().zip(starts) {
        let got = s.jobs[j].start_time_ms.expect("started");
        // Each end and start here takes one 100 ms step of the loop, so the lag adds up.
        assert!((got - want.unwrap()).abs() <= 300, "job {j}: estimated {want:?}, started {got}");
    }
}

#[test]
fn a_job_behind_a_long_run_or_a_window_is_told_when_and_why() {
    let mut s = cluster(4);
    let forever = submit(&mut s, 4, None, 1_000);
    run_until(&mut s, 1_000, 1_000);
    let waits = submit(&mut s, 2, Some(60), 2_000);
    let est = estimates(&s);
    // Every QoS has a wall-clock limit: the training QoS's 48 h.
    assert_eq!(est[&waits].start_ms, Some(1_000 + 48 * 3_600_000));
    assert_eq!(est[&waits].why, format!("after job {forever} ends (time limit) on n1"));
    // The leader's own pass makes none.
    assert!(plan(&s).estimates.is_empty());

    let mut s = cluster(4);
    let r = crate::reservation::Reservation {
        name: "maint".into(),
        nodes: vec!["n1".into()],
        start_ms: 20_000,
        end_ms: 50_000,
        ..Default::default()
    };
    s.apply(&cmd(1_000, Op::PutReservation { reservation: r, must_exist: Some(false) }));
    let long = submit(&mut s, 1, Some(60), 1_000);
    let est = estimates(&s);
    assert_eq!(est[&long].start_ms, Some(50_000), "{:?}", est[&long]);
    assert_eq!(est[&long].why, "after reservation maint's window ends on n1");
}

//! The inference headroom: training stays out of it, and runs are stopped to refill it —
//! only as many as it lacks, only preemptible ones, re-validated on apply.

use super::*;

/// One 4-GPU node; inference keeps 1 GPU idle and may preempt training, which requeues.
fn with_headroom() -> ClusterState {
    let mut s = cluster(4);
    let mut policy = crate::policy::Policy::default();
    let inference = policy.qos.get_mut("inference").unwrap();
    inference.headroom_gpus = 1;
    inference.preempt = ["training".to_string()].into();
    policy.qos.get_mut("training").unwrap().preempt_mode = crate::policy::PreemptMode::Requeue;
    s.apply(&cmd(0, Op::SetPolicy { policy, audit: None }));
    s
}

/// One 4-GPU node, inference keeping 1 GPU idle; two 1-GPU and one 2-GPU training runs
/// started at t = 0 (all 4 GPUs busy: the headroom lacks 1).
fn full() -> (ClusterState, Vec<u64>) {
    let mut s = with_headroom();
    let mut ids = Vec::new();
    for gpus in [1, 1, 2] {
        let id = submitted(s.apply(&cmd(
            0,
            Op::Submit { spec: spec(gpus, "training"), request_id: None, hold: false, limits: None },
        )));
        ids.push(id);
    }
    // Placed by hand: the planner would keep the headroom free.
    let placements = vec![
        Placement::single(ids[0], "n1".into(), vec![0]),
        Placement::single(ids[1], "n1".into(), vec![1]),
        Placement::single(ids[2], "n1".into(), vec![2, 3]),
    ];
    s.apply(&cmd(0, Op::ApplyPlan { plan: Plan { placements } }));
    for id in &ids {
        s.apply(&cmd(0, Op::JobStarted { job: *id, attempt: 0, node: "n1".into() }));
    }
    assert_eq!(s.headroom_shortfall(), 1);
    (s, ids)
}

#[test]
fn the_cheapest_run_is_stopped_to_refill_the_headroom_and_requeues() {
    let (mut s, ids) = full();
    // Job 2 saved a checkpoint a minute ago: stopping it loses least.
    s.apply(&cmd(540_000, Op::Checkpointed { job: ids[1], attempt: 0, node: "n1".into() }));
    let out = plan(&s);
    assert_eq!(out.vacate, vec![ids[1]]);
    let ops = crate::propose::propose(&s, 600_000, &Default::default(), 0);
    assert_eq!(ops.last(), Some(&Op::Vacate { victims: vec![ids[1]] }));
    assert_eq!(
        s.apply(&cmd(600_000, Op::Vacate { victims: vec![ids[1]] })),
        Outcome::Vacated { victims: vec![ids[1]] }
    );
    assert_eq!(s.jobs[&ids[1]].allocation.as_ref().unwrap().stop, Some(StopReason::Vacated));
    // Its GPU is on its way back: nothing more is stopped, and a repeat is refused.
    assert_eq!(s.headroom_shortfall(), 0);
    assert!(plan(&s).vacate.is_empty());
    assert!(matches!(s.apply(&cmd(600_001, Op::Vacate { victims: vec![ids[0]] })), Outcome::Rejected(_)));
    s.apply(&cmd(
        605_000,
        Op::JobExited { job: ids[1], attempt: 0, node: "n1".into(), exit: RunExit::Signal(15) },
    ));
    let j = &s.jobs[&ids[1]];
    assert_eq!((j.state, j.attempt), (JobState::Pending, 1), "requeued, next attempt");
    // Its GPU now stays idle for inference: the requeued job waits for the headroom.
    assert_eq!(plan(&s).pending.get(&ids[1]), Some(&PendingReason::Headroom));
    assert_eq!(s.preemption_totals.get("vacate"), Some(&1));
    s.check_invariants().unwrap();
}

#[test]
fn a_refill_is_refused_when_it_stops_more_than_needed_or_what_it_may_not() {
    let (mut s, ids) = full();
    let rejected = |s: &mut ClusterState, victims: Vec<u64>| {
        matches!(s.apply(&cmd(600_000, Op::Vacate { victims })), Outcome::Rejected(_))
    };
    assert!(rejected(&mut s, vec![ids[0], ids[1]]), "the first already makes up the shortfall");
    assert!(rejected(&mut s, vec![ids[0], ids[0]]), "named twice");
    assert!(rejected(&mut s, vec![]), "no victims");
    assert!(rejected(&mut s, vec![999]), "unknown job");
    // A QoS no headroom QoS may preempt is never stopped for it.
    let mut policy = s.policy.clone();
    policy.qos.get_mut("inference").unwrap().preempt.clear();
    s.apply(&cmd(600_000, Op::SetPolicy { policy: policy.clone(), audit: None }));
    assert!(plan(&s).vacate.is_empty());
    assert!(rejected(&mut s, vec![ids[0]]));
    // Nor one whose QoS cancels preempted jobs.
    policy.qos.get_mut("inference").unwrap().preempt = ["training".to_string()].into();
    policy.qos.get_mut("training").unwrap().preempt_mode = crate::policy::PreemptMode::Cancel;
    s.apply(&cmd(600_000, Op::SetPolicy { policy: policy.clone(), audit: None }));
    assert!(rejected(&mut s, vec![ids[0]]));
    // Nor anything once no headroom is configured.
    policy.qos.get_mut("training").unwrap().preempt_mode = crate::policy::PreemptMode::Requeue;
    policy.qos.get_mut("inference").unwrap().headroom_gpus = 0;
    s.apply(&cmd(600_000, Op::SetPolicy { policy, audit: None }));
    assert!(rejected(&mut s, vec![ids[0]]));
    // Nothing changed.
    assert!(s.jobs.values().all(|j| j.allocation.as_ref().is_some_and(|a| a.stop.is_none())));
    s.check_invariants().unwrap();
}

#[test]
fn a_run_too_big_to_fit_outside_the_headroom_is_not_stopped_for_it() {
    // 4 GPUs, 1 kept idle: a 4-GPU training job may start (it could never start otherwise) and
    // uses the headroom; stopping it would only let it start there again.
    let mut s = with_headroom();
    let big = submitted(s.apply(&cmd(
        0,
        Op::Submit { spec: spec(4, "training"), request_id: None, hold: false, limits: None },
    )));
    run_plan(&mut s, 0);
    s.apply(&cmd(0, Op::JobStarted { job: big, attempt: 0, node: "n1".into() }));
    assert_eq!(s.jobs[&big].state, JobState::Running, "the headroom does not hold it");
    assert_eq!(s.headroom_shortfall(), 1);
    assert!(plan(&s).vacate.is_empty());
    assert!(matches!(s.apply(&cmd(600_000, Op::Vacate { victims: vec![big] })), Outcome::Rejected(_)));
}

//! Preemption: victims, modes, tiers, anti-thrash, suspension.

use super::*;

#[test]
fn urgent_work_preempts_the_cheapest_training_victim_which_requeues() {
    let mut s = cluster(4);
    let older = submitted(s.apply(&cmd(
        0,
        Op::Submit { spec: spec(2, "training"), request_id: None, hold: false, limits: None },
    )));
    run_plan(&mut s, 0);
    s.apply(&cmd(0, Op::JobStarted { job: older, attempt: 0, node: "n1".into() }));
    let newer = submitted(s.apply(&cmd(
        600_000,
        Op::Submit { spec: spec(2, "training"), request_id: None, hold: false, limits: None },
    )));
    run_plan(&mut s, 600_000);
    s.apply(&cmd(600_000, Op::JobStarted { job: newer, attempt: 0, node: "n1".into() }));
    let mut inf = spec(1, "inference");
    inf.user = "svc".into();
    let urgent = submitted(s.apply(&cmd(
        700_000,
        Op::Submit { spec: spec(2, "urgent"), request_id: None, hold: false, limits: None },
    )));
    let out = plan(&s);
    let p = out.preemption.clone().expect("a preemption");
    assert_eq!((p.preemptor, p.victims.clone()), (urgent, vec![newer]), "the victim that lost least work");
    let op = Op::Preempt {
        preemptor: urgent,
        node: p.node.clone(),
        victims: p.victims.clone(),
        gpus: p.gpus.clone(),
    };
    assert!(matches!(s.apply(&cmd(700_001, op.clone())), Outcome::Preempted { .. }));
    // Applying it again (a deposed leader's duplicate) is refused.
    assert!(matches!(s.apply(&cmd(700_002, op)), Outcome::Rejected(_)));
    assert_eq!(plan(&s).pending[&urgent], PendingReason::Preempting);
    assert!(
        matches!(s.jobs[&newer].allocation.as_ref().unwrap().stop, Some(StopReason::Preempted { by, .. }) if by == urgent)
    );
    // Nobody else may take the claimed GPUs, even through a forged plan.
    let other = submitted(s.apply(&cmd(
        700_003,
        Op::Submit { spec: spec(2, "batch"), request_id: None, hold: false, limits: None },
    )));
    s.apply(&cmd(
        700_004,
        Op::JobExited { job: newer, attempt: 0, node: "n1".into(), exit: RunExit::Signal(10) },
    ));
    assert_eq!(
        (s.jobs[&newer].state, s.jobs[&newer].attempt),
        (JobState::Pending, 1),
        "requeued, next attempt"
    );
    let forged = Plan { placements: vec![Placement::single(other, "n1".into(), p.gpus.clone())] };
    let Outcome::PlanApplied { accepted, .. } = s.apply(&cmd(700_005, Op::ApplyPlan { plan: forged })) else {
        panic!()
    };
    assert!(accepted.is_empty());
    let Outcome::PlanApplied { accepted, .. } = run_plan(&mut s, 700_006) else { panic!() };
    assert_eq!(accepted, vec![urgent]);
    assert_eq!(s.jobs[&urgent].allocation.as_ref().unwrap().gpus, p.gpus);
    assert!(s.nodes["n1"].claimed.is_empty());
    assert_eq!(s.preemptions.len(), 1);
    // The replicated counter behind kairos_preemptions_total counted the requeued victim once.
    assert_eq!(s.preemption_totals.get("requeue"), Some(&1));
    assert_eq!(s.preemption_totals.values().sum::<u64>(), 1);
    s.check_invariants().unwrap();
}

#[test]
fn a_higher_tier_partition_preempts_a_lower_one() {
    let mut s = cluster(2);
    let mut policy = s.policy.clone();
    policy.partitions.insert(
        "prod".into(),
        crate::policy::Partition {
            name: "prod".into(),
            nodes: Default::default(),
            selector: Default::default(),
            priority_tier: 10,
            allowed_qos: Default::default(),
            default_qos: None,
            max_wall_s: None,
            resources: Default::default(),
            idle_gpu: None,
        },
    );
    s.apply(&cmd(0, Op::SetPolicy { policy, audit: None }));
    let victim = submitted(
        s.apply(&cmd(0, Op::Submit { spec: spec(2, "batch"), request_id: None, hold: false, limits: None })),
    );
    run_plan(&mut s, 0);
    s.apply(&cmd(0, Op::JobStarted { job: victim, attempt: 0, node: "n1".into() }));
    // Same QoS (batch preempts nothing), but from the higher-tier partition.
    let mut sp = spec(2, "batch");
    sp.partition = "prod".into();
    let prod =
        submitted(s.apply(&cmd(1_000, Op::Submit { spec: sp, request_id: None, hold: false, limits: None })));
    let p = plan(&s).preemption.expect("partition-tier preemption");
    assert_eq!((p.preemptor, p.victims.clone()), (prod, vec![victim]));
    // The other way round: once the prod job runs, a default-partition job does not preempt it.
    let op = Op::Preempt { preemptor: prod, node: p.node, victims: p.victims, gpus: p.gpus };
    s.apply(&cmd(1_001, op));
    s.apply(&cmd(
        1_002,
        Op::JobExited { job: victim, attempt: 0, node: "n1".into(), exit: RunExit::Signal(10) },
    ));
    run_plan(&mut s, 1_003);
    assert_eq!(s.jobs[&prod].state, JobState::Running);
    s.apply(&cmd(1_003, Op::JobStarted { job: prod, attempt: 0, node: "n1".into() }));
    assert_eq!(s.jobs[&victim].state, JobState::Pending, "requeued (batch is REQUEUE)");
    s.now_ms = 10_000_000;
    assert!(plan(&s).preemption.is_none(), "a lower tier never preempts a higher one");
}

#[test]
fn the_victim_with_the_freshest_checkpoint_loses_least_and_is_chosen() {
    let mut s = cluster(2);
    let older = submitted(s.apply(&cmd(
        0,
        Op::Submit { spec: spec(1, "training"), request_id: None, hold: false, limits: None },
    )));
    let newer = submitted(s.apply(&cmd(
        0,
        Op::Submit { spec: spec(1, "training"), request_id: None, hold: false, limits: None },
    )));
    run_plan(&mut s, 0);
    s.apply(&cmd(0, Op::JobStarted { job: older, attempt: 0, node: "n1".into() }));
    s.apply(&cmd(300_000, Op::JobStarted { job: newer, attempt: 0, node: "n1".into() }));
    // The older job checkpointed a moment ago: preempting it loses less than the newer one.
    s.apply(&cmd(590_000, Op::Checkpointed { job: older, attempt: 0, node: "n1".into() }));
    let urgent = submitted(s.apply(&cmd(
        600_000,
        Op::Submit { spec: spec(1, "urgent"), request_id: None, hold: false, limits: None },
    )));
    let p = plan(&s).preemption.unwrap();
    assert_eq!((p.preemptor, p.victims), (urgent, vec![older]));
    // A checkpoint report about another attempt is ignored.
    assert!(matches!(
        s.apply(&cmd(600_001, Op::Checkpointed { job: newer, attempt: 3, node: "n1".into() })),
        Outcome::Ignored(_)
    ));
}

#[test]
fn never_preempted_qos_exempt_time_and_anti_thrash_are_respected() {
    let mut s = cluster(2);
    let inf = submitted(s.apply(&cmd(
        0,
        Op::Submit { spec: spec(2, "inference"), request_id: None, hold: false, limits: None },
    )));
    run_plan(&mut s, 0);
    s.apply(&cmd(0, Op::JobStarted { job: inf, attempt: 0, node: "n1".into() }));
    let urgent = submitted(s.apply(&cmd(
        10_000,
        Op::Submit { spec: spec(2, "urgent"), request_id: None, hold: false, limits: None },
    )));
    assert!(plan(&s).preemption.is_none(), "inference is never preempted");
    let forced = Op::Preempt { preemptor: urgent, node: "n1".into(), victims: vec![inf], gpus: vec![0, 1] };
    assert!(matches!(s.apply(&cmd(10_001, forced)), Outcome::Rejected(_)));
    s.apply(&cmd(10_002, Op::Cancel { job: inf, by: "a".into() }));
    s.apply(&cmd(
        10_003,
        Op::JobExited { job: inf, attempt: 0, node: "n1".into(), exit: RunExit::Signal(15) },
    ));
    // A training job inside its exempt time is safe.
    let mut policy = s.policy.clone();
    policy.qos.get_mut("training").unwrap().preempt_exempt_s = 60;
    s.apply(&cmd(10_004, Op::SetPolicy { policy, audit: None }));
    s.apply(&cmd(10_005, Op::Cancel { job: urgent, by: "a".into() }));
    let t = submitted(s.apply(&cmd(
        10_006,
        Op::Submit { spec: spec(2, "training"), request_id: None, hold: false, limits: None },
    )));
    run_plan(&mut s, 10_006);
    s.apply(&cmd(10_006, Op::JobStarted { job: t, attempt: 0, node: "n1".into() }));
    let u2 = submitted(s.apply(&cmd(
        20_000,
        Op::Submit { spec: spec(2, "urgent"), request_id: None, hold: false, limits: None },
    )));
    assert!(plan(&s).preemption.is_none(), "inside the exempt time");
    s.now_ms = 80_000;
    assert!(plan(&s).preemption.is_some(), "past the exempt time");
    // Three recent preemptions protect a job from a fourth.
    s.jobs.get_mut(&t).unwrap().preempted_at = vec![70_000, 75_000, 79_000];
    assert!(plan(&s).preemption.is_none(), "anti-thrash");
    let _ = u2;
}

#[test]
fn a_suspendable_job_is_paused_lends_its_gpus_and_resumes_when_the_preemptor_ends() {
    let mut s = cluster(4);
    let mut policy = s.policy.clone();
    policy.qos.get_mut("batch").unwrap().preempt_mode = crate::policy::PreemptMode::Suspend;
    s.apply(&cmd(0, Op::SetPolicy { policy, audit: None }));
    let mut sp = spec(4, "batch");
    sp.suspendable = true;
    sp.time_limit_s = Some(100);
    let victim = start(&mut s, sp, 0);
    let urgent = submitted(s.apply(&cmd(
        50_000,
        Op::Submit { spec: spec(2, "urgent"), request_id: None, hold: false, limits: None },
    )));
    let p = preempt(&mut s, 50_000);
    assert_eq!(p.victims, vec![victim]);
    let v = &s.jobs[&victim];
    assert_eq!(v.state, JobState::Suspended);
    let a = v.allocation.as_ref().unwrap();
    assert_eq!((a.gpus.len(), a.lent.clone(), a.stop), (4, p.gpus.clone(), None), "paused, not stopped");
    let record = s.preemptions.back().unwrap();
    assert_eq!((record.action(), record.gpu_s_lost), ("suspend", 0), "nothing is lost");
    // The preemptor starts on the lent GPUs at once; nobody else may use them meanwhile.
    let Outcome::PlanApplied { accepted, .. } = run_plan(&mut s, 50_001) else { panic!() };
    assert_eq!(accepted, vec![urgent]);
    assert_eq!(s.jobs[&urgent].allocation.as_ref().unwrap().gpus, p.gpus);
    s.check_invariants().unwrap();
    // Suspended time does not count against the time limit.
    assert!(s.expired_runs(150_000).is_empty());
    // The preemptor ends: the victim resumes with all its GPUs.
    s.apply(&cmd(
        200_000,
        Op::JobExited { job: urgent, attempt: 0, node: "n1".into(), exit: RunExit::Code(0) },
    ));
    let v = &s.jobs[&victim];
    assert_eq!((v.state, v.attempt, v.suspended_ms), (JobState::Running, 0, 150_000));
    assert!(v.allocation.as_ref().unwrap().lent.is_empty());
    assert_eq!(s.nodes["n1"].allocated.len(), 4);
    assert!(s.suspended.is_empty());
    assert!(s.expired_runs(250_000).is_empty(), "not yet 100 s of running");
    assert_eq!(s.expired_runs(250_001), vec![(victim, 0)], "started at 1 ms");
    s.check_invariants().unwrap();
}

#[test]
fn a_suspended_job_can_be_cancelled_and_one_that_is_not_suspendable_is_requeued() {
    let mut s = cluster(4);
    let mut policy = s.policy.clone();
    policy.qos.get_mut("batch").unwrap().preempt_mode = crate::policy::PreemptMode::Suspend;
    s.apply(&cmd(0, Op::SetPolicy { policy, audit: None }));
    let mut sp = spec(2, "batch");
    sp.suspendable = true;
    let paused = start(&mut s, sp, 0);
    let plain = start(&mut s, spec(2, "batch"), 1_000);
    s.apply(&cmd(2_000, Op::Submit { spec: spec(4, "urgent"), request_id: None, hold: false, limits: None }));
    let p = preempt(&mut s, 2_000);
    assert_eq!(p.victims, vec![paused, plain]);
    assert_eq!(s.jobs[&paused].state, JobState::Suspended);
    assert!(matches!(
        s.jobs[&plain].allocation.as_ref().unwrap().stop,
        Some(StopReason::Preempted { mode: crate::policy::PreemptMode::Requeue, .. })
    ));
    // Cancelling the suspended job stops it for good; its exit frees what it still held.
    s.apply(&cmd(3_000, Op::Cancel { job: paused, by: "alice".into() }));
    assert_eq!(s.jobs[&paused].allocation.as_ref().unwrap().stop, Some(StopReason::Cancelled));
    s.apply(&cmd(
        3_001,
        Op::JobExited { job: paused, attempt: 0, node: "n1".into(), exit: RunExit::Signal(15) },
    ));
    assert_eq!(s.jobs[&paused].state, JobState::Cancelled);
    assert!(s.suspended.is_empty());
    s.check_invariants().unwrap();
}

/// Two 1-GPU jobs of `qos_a` and `qos_b` running on one 2-GPU node since t = 0, and an urgent
/// 1-GPU job at `now`: which one does the planner pick as its victim?
fn victim_of(
    policy: crate::policy::Policy,
    qos_a: &str,
    qos_b: &str,
    recent_a: &[i64],
    now: i64,
) -> (u64, u64, u64) {
    let mut s = cluster(2);
    s.apply(&cmd(0, Op::SetPolicy { policy, audit: None }));
    let mut ids = Vec::new();
    for qos in [qos_a, qos_b] {
        let id = submitted(
            s.apply(&cmd(0, Op::Submit { spec: spec(1, qos), request_id: None, hold: false, limits: None })),
        );
        ids.push(id);
    }
    run_plan(&mut s, 0);
    for id in &ids {
        s.apply(&cmd(0, Op::JobStarted { job: *id, attempt: 0, node: "n1".into() }));
    }
    s.jobs.get_mut(&ids[0]).expect("job a").preempted_at.extend_from_slice(recent_a);
    submitted(s.apply(&cmd(
        now,
        Op::Submit { spec: spec(1, "urgent"), request_id: None, hold: false, limits: None },
    )));
    let p = plan(&s).preemption.expect("a preemption");
    assert_eq!(p.victims.len(), 1);
    (ids[0], ids[1], p.victims[0])
}

#[test]
fn the_victim_that_frees_its_gpus_sooner_is_chosen_at_equal_lost_work() {
    // Both ran 10 min without a checkpoint; batch (the lower priority, which was chosen before
    // the grace counted) may take 5 min to stop, training 10 s.
    let mut policy = crate::policy::Policy::default();
    policy.qos.get_mut("training").unwrap().grace_s = 10;
    policy.qos.get_mut("batch").unwrap().grace_s = 300;
    let (training, _batch, victim) = victim_of(policy, "training", "batch", &[], 600_000);
    assert_eq!(victim, training);
}

#[test]
fn a_recently_preempted_victim_is_spared_at_equal_lost_work() {
    // Same QoS, same start: before, the lower id was taken though it was preempted twice in
    // the last hour (below the anti-thrash bound of 3).
    let policy = crate::policy::Policy::default();
    let (again, fresh, victim) = victim_of(policy, "training", "training", &[0, 100_000], 600_000);
    assert_eq!(victim, fresh, "job {again} was preempted twice recently");
    // Outside the window the earlier preemptions no longer count.
    let hour = crate::state::THRASH_WINDOW_MS;
    let (again, _, victim) =
        victim_of(crate::policy::Policy::default(), "training", "training", &[0, 1], hour + 10);
    assert_eq!(victim, again);
}

#[test]
fn a_victim_that_checkpoints_on_the_preemption_signal_lost_no_work() {
    let mut s = cluster(2);
    let victim = submitted(s.apply(&cmd(
        0,
        Op::Submit { spec: spec(2, "training"), request_id: None, hold: false, limits: None },
    )));
    run_plan(&mut s, 0);
    s.apply(&cmd(0, Op::JobStarted { job: victim, attempt: 0, node: "n1".into() }));
    let urgent = submitted(s.apply(&cmd(
        600_000,
        Op::Submit { spec: spec(2, "urgent"), request_id: None, hold: false, limits: None },
    )));
    let p = plan(&s).preemption.expect("a preemption");
    let op = Op::Preempt { preemptor: urgent, node: p.node, victims: p.victims, gpus: p.gpus };
    assert!(matches!(s.apply(&cmd(600_001, op)), Outcome::Preempted { .. }));
    let lost = |s: &ClusterState| s.preemptions.iter().rev().find(|r| r.victim == victim).unwrap().gpu_s_lost;
    assert_eq!(lost(&s), 2 * 600, "ten minutes of two GPUs since its start");
    // It saves on the signal: the record says so.
    s.apply(&cmd(600_500, Op::Checkpointed { job: victim, attempt: 0, node: "n1".into() }));
    assert_eq!(lost(&s), 0);
    assert!(s.jobs[&victim].events.iter().any(|e| e.message.contains("no work lost")));
}

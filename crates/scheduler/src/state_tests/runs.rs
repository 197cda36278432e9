//! Plans, runs, exits, node failures, gangs and drains.

use super::*;

#[test]
fn stale_plan_is_rejected_and_cannot_double_allocate() {
    let mut s = cluster(2);
    let a = submitted(
        s.apply(&cmd(2, Op::Submit { spec: spec(2, "batch"), request_id: None, hold: false, limits: None })),
    );
    let b = submitted(
        s.apply(&cmd(2, Op::Submit { spec: spec(2, "batch"), request_id: None, hold: false, limits: None })),
    );
    let stale = Plan { placements: vec![Placement::single(b, "n1".into(), vec![0, 1])] };
    assert_eq!(run_plan(&mut s, 3), Outcome::PlanApplied { accepted: vec![a], rejected: vec![] });
    let out = s.apply(&cmd(4, Op::ApplyPlan { plan: stale.clone() }));
    let Outcome::PlanApplied { accepted, rejected } = out else { panic!("{out:?}") };
    assert!(accepted.is_empty());
    assert_eq!(rejected, vec![(b, format!("GPU 0 of \"n1\" is held by job {a}"))]);
    // Re-applying the plan that already took effect is rejected too: the job is no longer pending.
    let replay = Plan { placements: vec![Placement::single(a, "n1".into(), vec![0, 1])] };
    let Outcome::PlanApplied { accepted, .. } = s.apply(&cmd(5, Op::ApplyPlan { plan: replay })) else {
        panic!()
    };
    assert!(accepted.is_empty());
    s.check_invariants().unwrap();
}

#[test]
fn run_lifecycle_completed_failed_cancelled_timeout() {
    let mut s = cluster(4);
    let ok = submitted(
        s.apply(&cmd(2, Op::Submit { spec: spec(1, "batch"), request_id: None, hold: false, limits: None })),
    );
    let bad = submitted(
        s.apply(&cmd(2, Op::Submit { spec: spec(1, "batch"), request_id: None, hold: false, limits: None })),
    );
    let cancel = submitted(
        s.apply(&cmd(2, Op::Submit { spec: spec(1, "batch"), request_id: None, hold: false, limits: None })),
    );
    let mut limited = spec(1, "batch");
    limited.time_limit_s = Some(10);
    let timeout = submitted(
        s.apply(&cmd(2, Op::Submit { spec: limited, request_id: None, hold: false, limits: None })),
    );
    run_plan(&mut s, 3);
    for j in [ok, bad, cancel, timeout] {
        s.apply(&cmd(4, Op::JobStarted { job: j, attempt: 0, node: "n1".into() }));
        assert!(s.jobs[&j].allocation.as_ref().unwrap().started);
    }
    // A report about another attempt or node is ignored.
    let stale =
        s.apply(&cmd(5, Op::JobExited { job: ok, attempt: 1, node: "n1".into(), exit: RunExit::Code(0) }));
    assert!(matches!(stale, Outcome::Ignored(_)));
    s.apply(&cmd(5, Op::JobExited { job: ok, attempt: 0, node: "n1".into(), exit: RunExit::Code(0) }));
    s.apply(&cmd(5, Op::JobExited { job: bad, attempt: 0, node: "n1".into(), exit: RunExit::Code(3) }));
    assert_eq!(s.jobs[&ok].state, JobState::Completed);
    assert_eq!(s.jobs[&bad].state, JobState::Failed);
    assert_eq!(s.jobs[&bad].exit_code, Some(3));

    assert_eq!(
        s.apply(&cmd(6, Op::Cancel { job: cancel, by: "alice".into() })),
        Outcome::Cancelled { job: cancel, was_running: true }
    );
    assert_eq!(s.jobs[&cancel].state, JobState::Running, "stays running until the agent confirms");
    assert_eq!(s.jobs[&cancel].allocation.as_ref().unwrap().stop, Some(StopReason::Cancelled));
    s.apply(&cmd(7, Op::JobExited { job: cancel, attempt: 0, node: "n1".into(), exit: RunExit::Signal(9) }));
    assert_eq!(s.jobs[&cancel].state, JobState::Cancelled);
    assert!(matches!(
        s.apply(&cmd(8, Op::Cancel { job: cancel, by: "a".into() })),
        Outcome::Rejected(Rejection::FailedPrecondition(_))
    ));
    assert!(matches!(
        s.apply(&cmd(8, Op::Cancel { job: 999, by: "a".into() })),
        Outcome::Rejected(Rejection::NotFound(_))
    ));

    // Started at 4 ms with a 10 s limit: not expired at 10.003 s, expired at 10.004 s.
    assert!(s.expired_runs(10_003).is_empty());
    assert_eq!(s.expired_runs(10_004), vec![(timeout, 0)]);
    assert!(matches!(
        s.apply(&cmd(10_000, Op::EnforceTimeLimit { job: timeout, attempt: 0 })),
        Outcome::Ignored(_)
    ));
    s.apply(&cmd(14_004, Op::EnforceTimeLimit { job: timeout, attempt: 0 }));
    assert!(s.expired_runs(20_000).is_empty(), "a stopping job is not reported again");
    s.apply(&cmd(
        14_100,
        Op::JobExited { job: timeout, attempt: 0, node: "n1".into(), exit: RunExit::Signal(9) },
    ));
    assert_eq!(s.jobs[&timeout].state, JobState::Timeout);
    assert!(s.nodes["n1"].allocated.is_empty());
    s.check_invariants().unwrap();
}

#[test]
fn a_run_note_becomes_an_event_of_the_current_run_only() {
    let mut s = cluster(2);
    let j = submitted(
        s.apply(&cmd(2, Op::Submit { spec: spec(1, "batch"), request_id: None, hold: false, limits: None })),
    );
    run_plan(&mut s, 3);
    let note = |attempt: u32, node: &str| Op::RunNote {
        job: j,
        attempt,
        node: node.into(),
        kind: "log truncated".into(),
        message: "the log reached 4096 bytes".into(),
    };
    assert!(matches!(s.apply(&cmd(4, note(0, "n1"))), Outcome::RunUpdated { .. }));
    let events = &s.jobs[&j].events;
    assert!(events.iter().any(|e| e.kind == "log truncated" && e.message.contains("4096")), "{events:?}");
    // Another node's or attempt's note changes nothing.
    let before = s.clone();
    assert!(matches!(s.apply(&cmd(5, note(0, "n2"))), Outcome::Ignored(_)));
    assert!(matches!(s.apply(&cmd(5, note(3, "n1"))), Outcome::Ignored(_)));
    assert_eq!(s.jobs, before.jobs);
}

#[test]
fn node_down_fails_its_jobs_and_frees_gpus() {
    let mut s = cluster(2);
    let j = submitted(
        s.apply(&cmd(2, Op::Submit { spec: spec(2, "batch"), request_id: None, hold: false, limits: None })),
    );
    run_plan(&mut s, 3);
    let out = s.apply(&cmd(4, Op::NodeDown { node: "n1".into(), reason: "silent".into() }));
    assert_eq!(out, Outcome::NodeDown { node: "n1".into(), failed_jobs: vec![j] });
    assert_eq!(s.jobs[&j].state, JobState::NodeFail);
    assert_eq!(s.nodes["n1"].state, NodeState::Down);
    assert!(s.nodes["n1"].allocated.is_empty());
    s.apply(&cmd(5, Op::RegisterNode { info: node_info("n1", 2) }));
    assert_eq!(s.nodes["n1"].state, NodeState::Up);
    s.check_invariants().unwrap();
}

/// Found by the deterministic simulation (issue 14): a cancel acknowledged while the run was
/// stopping for its time limit ended the job TIMEOUT.
#[test]
fn an_acknowledged_cancel_of_a_run_stopping_for_its_time_limit_ends_it_cancelled() {
    let mut s = cluster(2);
    let mut sp = spec(1, "batch");
    sp.time_limit_s = Some(1);
    let id = start(&mut s, sp, 2);
    s.apply(&cmd(5_000, Op::EnforceTimeLimit { job: id, attempt: 0 }));
    assert!(s.jobs[&id].allocation.as_ref().is_some_and(|a| a.stop == Some(StopReason::TimeLimit)));
    let out = s.apply(&cmd(5_100, Op::Cancel { job: id, by: "alice".into() }));
    assert_eq!(out, Outcome::Cancelled { job: id, was_running: true });
    s.apply(&cmd(5_200, Op::JobExited { job: id, attempt: 0, node: "n1".into(), exit: RunExit::Signal(15) }));
    assert_eq!(s.jobs[&id].state, JobState::Cancelled);
    assert_eq!(s.check_invariants(), Ok(()));
}

/// Found by the deterministic simulation (issue 14): a cancel was acknowledged, the run's node
/// went down before it stopped, and the job — requeueable — was queued again and completed.
#[test]
fn a_run_stopping_for_good_ends_so_when_its_node_fails_instead_of_requeueing() {
    let stops = [
        (Op::Cancel { job: 0, by: "alice".into() }, JobState::Cancelled),
        (Op::EnforceTimeLimit { job: 0, attempt: 0 }, JobState::Timeout),
    ];
    for (stop, ended) in stops {
        let mut s = cluster(2);
        let mut sp = spec(1, "training");
        sp.requeue = true;
        sp.time_limit_s = Some(1);
        let id = start(&mut s, sp, 2);
        let stop = match stop {
            Op::Cancel { by, .. } => Op::Cancel { job: id, by },
            Op::EnforceTimeLimit { .. } => Op::EnforceTimeLimit { job: id, attempt: 0 },
            other => other,
        };
        s.apply(&cmd(5_000, stop));
        assert_eq!(s.jobs[&id].state, JobState::Running, "stopping, not stopped");
        assert!(s.jobs[&id].allocation.as_ref().is_some_and(|a| a.stop.is_some()));
        s.apply(&cmd(6_000, Op::NodeDown { node: "n1".into(), reason: "silent".into() }));
        assert_eq!(s.jobs[&id].state, ended);
        assert_eq!(s.jobs[&id].attempt, 0, "not requeued");
        assert_eq!(s.check_invariants(), Ok(()));
    }
}

#[test]
fn requeueable_jobs_go_back_to_pending_with_the_next_attempt_when_their_node_fails() {
    let mut s = cluster(2);
    let mut sp = spec(1, "batch");
    sp.requeue = true;
    let requeued =
        submitted(s.apply(&cmd(2, Op::Submit { spec: sp, request_id: None, hold: false, limits: None })));
    let ended = submitted(
        s.apply(&cmd(2, Op::Submit { spec: spec(1, "batch"), request_id: None, hold: false, limits: None })),
    );
    run_plan(&mut s, 3);
    s.apply(&cmd(4, Op::NodeDown { node: "n1".into(), reason: "silent".into() }));
    assert_eq!(s.jobs[&requeued].state, JobState::Pending);
    assert_eq!(s.jobs[&requeued].attempt, 1);
    assert_eq!(s.jobs[&ended].state, JobState::NodeFail);
    // A report from the old attempt is stale now.
    let stale = s.apply(&cmd(
        5,
        Op::JobExited { job: requeued, attempt: 0, node: "n1".into(), exit: RunExit::Code(0) },
    ));
    assert!(matches!(stale, Outcome::Ignored(_)));
    s.apply(&cmd(6, Op::RegisterNode { info: node_info("n1", 2) }));
    run_plan(&mut s, 7);
    assert_eq!(s.jobs[&requeued].state, JobState::Running);
    // Attempts are bounded: a job that keeps losing its node ends after ATTEMPTS_MAX.
    for t in 0..20 {
        s.apply(&cmd(10 + 2 * t, Op::NodeDown { node: "n1".into(), reason: "flapping".into() }));
        s.apply(&cmd(11 + 2 * t, Op::RegisterNode { info: node_info("n1", 2) }));
        run_plan(&mut s, 11 + 2 * t);
    }
    assert_eq!(s.jobs[&requeued].state, JobState::NodeFail);
    assert_eq!(s.jobs[&requeued].attempt, crate::state::ATTEMPTS_MAX - 1);
    s.check_invariants().unwrap();
}

#[test]
fn a_gang_is_placed_whole_on_distinct_nodes_and_ends_when_every_task_has() {
    let mut s = ClusterState::new();
    for n in ["n1", "n2", "n3"] {
        s.apply(&cmd(1, Op::RegisterNode { info: node_info(n, 4) }));
    }
    let small = submitted(
        s.apply(&cmd(2, Op::Submit { spec: spec(1, "batch"), request_id: None, hold: false, limits: None })),
    );
    run_plan(&mut s, 2);
    let mut gang = spec(4, "batch");
    gang.tasks = 3;
    let g = submitted(
        s.apply(&cmd(3, Op::Submit { spec: gang.clone(), request_id: None, hold: false, limits: None })),
    );
    // n1 has only 3 free GPUs: three whole 4-GPU nodes are not available, so nothing is placed.
    let out = plan(&s);
    assert!(out.plan.placements.is_empty());
    assert_eq!(out.pending[&g], PendingReason::Resources);
    // A forged partial gang is rejected.
    let partial = Plan { placements: vec![Placement::single(g, "n2".into(), vec![0, 1, 2, 3])] };
    let Outcome::PlanApplied { accepted, .. } = s.apply(&cmd(4, Op::ApplyPlan { plan: partial })) else {
        panic!()
    };
    assert!(accepted.is_empty());
    s.apply(&cmd(5, Op::JobExited { job: small, attempt: 0, node: "n1".into(), exit: RunExit::Code(0) }));
    let Outcome::PlanApplied { accepted, .. } = run_plan(&mut s, 6) else { panic!() };
    assert_eq!(accepted, vec![g]);
    let alloc = s.jobs[&g].allocation.clone().unwrap();
    let nodes: Vec<&str> = alloc.tasks().map(|(_, n, _)| n).collect();
    assert_eq!(nodes, vec!["n1", "n2", "n3"]);
    // Rank 1 fails: its GPUs are free at once, the others are asked to stop.
    s.apply(&cmd(7, Op::JobExited { job: g, attempt: 0, node: "n2".into(), exit: RunExit::Code(2) }));
    assert_eq!(s.jobs[&g].state, JobState::Running);
    assert_eq!(s.jobs[&g].allocation.as_ref().unwrap().stop, Some(StopReason::TaskFailed));
    assert!(s.nodes["n2"].allocated.is_empty());
    assert_eq!(s.nodes["n1"].allocated.len(), 4, "rank 0 still holds its GPUs until it exits");
    s.check_invariants().unwrap();
    s.apply(&cmd(8, Op::JobExited { job: g, attempt: 0, node: "n1".into(), exit: RunExit::Signal(15) }));
    s.apply(&cmd(8, Op::JobExited { job: g, attempt: 0, node: "n3".into(), exit: RunExit::Signal(15) }));
    let job = &s.jobs[&g];
    assert_eq!(job.state, JobState::Failed);
    assert_eq!(job.exit_code, Some(2));
    assert!(job.reason.contains("rank 1 on \"n2\" exited with code 2"), "{}", job.reason);
    assert!(s.nodes.values().all(|n| n.allocated.is_empty()));

    // A requeueable gang that loses a node comes back as its next attempt once all tasks ended.
    gang.requeue = true;
    let g2 =
        submitted(s.apply(&cmd(9, Op::Submit { spec: gang, request_id: None, hold: false, limits: None })));
    run_plan(&mut s, 9);
    s.apply(&cmd(10, Op::NodeDown { node: "n3".into(), reason: "silent".into() }));
    assert_eq!(s.jobs[&g2].state, JobState::Running, "the healthy tasks are still stopping");
    assert!(s.nodes["n3"].allocated.is_empty());
    s.apply(&cmd(11, Op::JobExited { job: g2, attempt: 0, node: "n1".into(), exit: RunExit::Signal(15) }));
    s.apply(&cmd(11, Op::JobExited { job: g2, attempt: 0, node: "n2".into(), exit: RunExit::Signal(15) }));
    assert_eq!((s.jobs[&g2].state, s.jobs[&g2].attempt), (JobState::Pending, 1));
    s.check_invariants().unwrap();
    // Only two nodes are up now: the gang waits for a third.
    assert!(matches!(plan(&s).pending[&g2], PendingReason::ReqNodeNotAvail(_)));
}

#[test]
fn a_drained_node_takes_no_work_and_its_jobs_requeue_through_the_checkpoint_path() {
    let mut s = cluster(2);
    let id = start(&mut s, spec(1, "inference"), 0);
    assert!(!s.jobs[&id].spec.requeue);
    let out = s
        .apply(&cmd(10, Op::DrainNode { node: "n1".into(), reason: "spot notice".into(), keep_runs: false }));
    assert!(matches!(out, Outcome::NodeDown { .. }), "{out:?}");
    assert_eq!(s.nodes["n1"].state, NodeState::Draining);
    assert_eq!(s.jobs[&id].allocation.as_ref().unwrap().stop, Some(StopReason::Drained));
    // Draining again changes nothing; an agent reconnecting does not undo it.
    assert!(matches!(
        s.apply(&cmd(11, Op::DrainNode { node: "n1".into(), reason: "x".into(), keep_runs: false })),
        Outcome::Ignored(_)
    ));
    s.apply(&cmd(12, Op::RegisterNode { info: node_info("n1", 2) }));
    assert_eq!(s.nodes["n1"].state, NodeState::Draining);
    // The job checkpoints and exits: requeued (the cluster stopped it), and nothing starts here.
    s.apply(&cmd(13, Op::JobExited { job: id, attempt: 0, node: "n1".into(), exit: RunExit::Code(0) }));
    assert_eq!((s.jobs[&id].state, s.jobs[&id].attempt), (JobState::Pending, 1));
    assert!(plan(&s).plan.placements.is_empty());
    assert!(matches!(
        s.apply(&cmd(14, Op::DrainNode { node: "nope".into(), reason: "x".into(), keep_runs: false })),
        Outcome::Rejected(Rejection::NotFound(_))
    ));
    s.check_invariants().unwrap();
}

#[test]
fn time_the_timeline_skipped_does_not_count_against_a_time_limit() {
    let mut s = cluster(2);
    let mut sp = spec(1, "batch");
    sp.time_limit_s = Some(10);
    // Started at 1 s on a timeline that lags the clocks by a minute (all replicas were down).
    let id = start(&mut s, sp.clone(), 1_000);
    assert_eq!(s.jobs[&id].skipped_at_start_ms, 0);
    // At 5 s the timeline catches up: it skips 60 s.
    s.apply(&Command { now_ms: 65_000, skipped_ms: 60_000, op: Op::Hold { job: 999, by: "alice".into() } });
    assert_eq!((s.now_ms, s.skipped_ms), (65_000, 60_000));
    // 9 s of the 10 s limit have passed, not 69 s.
    assert!(s.expired_runs(70_000).is_empty());
    assert!(matches!(
        s.apply(&Command {
            now_ms: 70_000,
            skipped_ms: 60_000,
            op: Op::EnforceTimeLimit { job: id, attempt: 0 }
        }),
        Outcome::Ignored(_)
    ));
    assert_eq!(s.expected_end_ms(&s.jobs[&id]), 71_000);
    assert_eq!(s.expired_runs(71_000), vec![(id, 0)]);
    // A command stamped before the jump (skipping less) changes neither the time nor the skip.
    s.apply(&cmd(6_000, Op::Hold { job: 999, by: "alice".into() }));
    assert_eq!((s.now_ms, s.skipped_ms), (70_000, 60_000));
    // A run started after the jump counts from it as usual.
    let later = start(&mut s, sp, 70_000);
    assert_eq!(s.jobs[&later].skipped_at_start_ms, 60_000);
    assert!(s.expired_runs(79_999).iter().all(|(j, _)| *j != later));
    assert!(s.expired_runs(80_000).contains(&(later, 0)));
    s.check_invariants().unwrap();
}

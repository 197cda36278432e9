//! Job arrays: one submit, a task per index with consecutive ids, the `%N` limit on running
//! tasks enforced by the planner, cancel of the whole array by its id.

use super::*;
use crate::model::ArraySpec;

fn array_spec(indices: Vec<u32>, max_running: Option<u32>) -> crate::model::JobSpec {
    let mut sp = spec(1, "batch");
    sp.array = Some(Box::new(ArraySpec { indices, max_running, id: 0, index: 0, count: 0 }));
    sp
}

#[test]
fn an_array_is_a_task_per_index_and_at_most_n_run_at_once() {
    let mut s = cluster(8);
    let first = submitted(s.apply(&cmd(
        2,
        Op::Submit {
            spec: array_spec(vec![0, 2, 4, 6, 40], Some(2)),
            request_id: Some("arr".into()),
            hold: false,
            limits: None,
        },
    )));
    let tasks: Vec<(u64, u32, u64)> =
        s.jobs.values().filter_map(|j| j.spec.array.as_ref().map(|a| (j.id, a.index, a.id))).collect();
    assert_eq!(
        tasks,
        vec![
            (first, 0, first),
            (first + 1, 2, first),
            (first + 2, 4, first),
            (first + 3, 6, first),
            (first + 4, 40, first)
        ]
    );
    // A retried submit is the same array.
    let again = s.apply(&cmd(
        3,
        Op::Submit {
            spec: array_spec(vec![0, 2, 4, 6, 40], Some(2)),
            request_id: Some("arr".into()),
            hold: false,
            limits: None,
        },
    ));
    assert_eq!(again, Outcome::Submitted { job: first });
    assert_eq!(s.jobs.len(), 5);
    // Eight free GPUs, but two tasks at a time.
    let p = plan(&s);
    assert_eq!(p.plan.placements.iter().map(|pl| pl.job).collect::<Vec<_>>(), vec![first, first + 1]);
    assert_eq!(p.pending.get(&(first + 2)), Some(&PendingReason::JobArrayTaskLimit));
    run_plan(&mut s, 4);
    assert!(plan(&s).plan.placements.is_empty(), "two run: no third");
    // One ends: the next one starts.
    s.apply(&cmd(5, Op::JobStarted { job: first, attempt: 0, node: "n1".into() }));
    s.apply(&cmd(6, Op::JobExited { job: first, attempt: 0, node: "n1".into(), exit: RunExit::Code(0) }));
    assert_eq!(plan(&s).plan.placements.iter().map(|pl| pl.job).collect::<Vec<_>>(), vec![first + 2]);
    // The array's id cancels every unfinished task; a task's own id cancels only it.
    assert!(matches!(
        s.apply(&cmd(7, Op::Cancel { job: first + 4, by: "alice".into() })),
        Outcome::Cancelled { .. }
    ));
    assert!(matches!(
        s.apply(&cmd(8, Op::Cancel { job: first, by: "alice".into() })),
        Outcome::Cancelled { .. }
    ));
    let states: Vec<JobState> = s.jobs.values().map(|j| j.state).collect();
    assert_eq!(states[0], JobState::Completed);
    assert!(states[2..].iter().all(|st| *st == JobState::Cancelled), "{states:?}");
    assert_eq!(s.jobs[&(first + 1)].allocation.as_ref().and_then(|a| a.stop), Some(StopReason::Cancelled));
    assert_eq!(s.check_invariants(), Ok(()));
}

#[test]
fn bad_arrays_are_refused_whole() {
    let mut s = cluster(8);
    for bad in [
        array_spec(vec![], None),
        array_spec(vec![3, 1], None),
        array_spec(vec![1], Some(0)),
        array_spec(vec![2_000_000], None),
    ] {
        let out = s.apply(&cmd(2, Op::Submit { spec: bad, request_id: None, hold: false, limits: None }));
        assert!(
            matches!(out, Outcome::Rejected(Rejection::Invalid(ref m)) if m.starts_with("array:")),
            "{out:?}"
        );
    }
    // Past the per-user limit as a whole: nothing is created.
    let limits = crate::state::quota::SubmitLimits { max_jobs_per_user: 3, max_jobs: 100, any_qos: false };
    let out = s.apply(&cmd(
        3,
        Op::Submit {
            spec: array_spec(vec![1, 2, 3, 4], None),
            request_id: None,
            hold: false,
            limits: Some(limits),
        },
    ));
    assert!(matches!(out, Outcome::Rejected(Rejection::ResourceExhausted(_))), "{out:?}");
    assert!(s.jobs.is_empty());
}

#[test]
fn apply_refuses_a_plan_that_starts_more_tasks_than_the_arrays_limit() {
    let mut s = cluster(8);
    let first = submitted(s.apply(&cmd(
        2,
        Op::Submit { spec: array_spec(vec![0, 1, 2], Some(1)), request_id: None, hold: false, limits: None },
    )));
    // A stale or forged plan placing two tasks of a %1 array: the second is refused.
    let forged = Plan {
        placements: vec![
            Placement { job: first, node: "n1".into(), gpus: vec![0], more: Vec::new() },
            Placement { job: first + 1, node: "n1".into(), gpus: vec![1], more: Vec::new() },
        ],
    };
    match s.apply(&cmd(3, Op::ApplyPlan { plan: forged })) {
        Outcome::PlanApplied { accepted, rejected } => {
            assert_eq!(accepted, vec![first]);
            assert_eq!(rejected.len(), 1, "{rejected:?}");
            assert!(rejected[0].1.contains("JobArrayTaskLimit"), "{rejected:?}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(s.check_invariants(), Ok(()));
}

#[test]
fn a_dependency_on_an_array_waits_for_every_task_and_fails_with_any() {
    let mut s = cluster(8);
    let submit = |s: &mut ClusterState, sp: crate::model::JobSpec| {
        submitted(s.apply(&cmd(2, Op::Submit { spec: sp, request_id: None, hold: false, limits: None })))
    };
    let arr = submit(&mut s, array_spec(vec![0, 1, 2], Some(1)));
    let dependent = |kind: &str, s: &mut ClusterState| {
        let mut sp = spec(1, "batch");
        match kind {
            "ok" => sp.after_ok = vec![arr],
            "any" => sp.after_any = vec![arr],
            _ => sp.after_not_ok = vec![arr],
        }
        submit(s, sp)
    };
    let (ok, any, not_ok) = (dependent("ok", &mut s), dependent("any", &mut s), dependent("notok", &mut s));
    let end = |s: &mut ClusterState, task: u64, code: i32, now: i64| {
        s.apply(&cmd(now, Op::JobStarted { job: task, attempt: 0, node: "n1".into() }));
        s.apply(&cmd(
            now,
            Op::JobExited { job: task, attempt: 0, node: "n1".into(), exit: RunExit::Code(code) },
        ));
    };
    run_plan(&mut s, 3);
    // Task 0 completes: every dependent still waits for the rest of the array.
    end(&mut s, arr, 0, 4);
    for dep in [ok, any, not_ok] {
        assert_eq!(plan(&s).pending.get(&dep), Some(&PendingReason::Dependency), "job {dep}");
    }
    // Task 1 fails: afterok can never be met, the others wait for task 2.
    run_plan(&mut s, 5);
    end(&mut s, arr + 1, 3, 6);
    assert_eq!(plan(&s).pending.get(&ok), Some(&PendingReason::DependencyNeverSatisfied(arr)));
    assert_eq!(plan(&s).pending.get(&any), Some(&PendingReason::Dependency));
    assert_eq!(plan(&s).pending.get(&not_ok), Some(&PendingReason::Dependency));
    run_plan(&mut s, 7);
    end(&mut s, arr + 2, 0, 8);
    let Outcome::PlanApplied { mut accepted, .. } = run_plan(&mut s, 9) else { panic!() };
    accepted.sort();
    assert_eq!(accepted, vec![any, not_ok], "afterany and afternotok start once the last task ended");
    assert_eq!(plan(&s).pending.get(&ok), Some(&PendingReason::DependencyNeverSatisfied(arr)));

    // Every task completes: afternotok can never be met; afterok starts.
    let arr2 = submit(&mut s, array_spec(vec![0, 1], None));
    let mut sp = spec(1, "batch");
    sp.after_not_ok = vec![arr2];
    let never = submit(&mut s, sp);
    let mut sp = spec(1, "batch");
    sp.after_ok = vec![arr2];
    let after = submit(&mut s, sp);
    run_plan(&mut s, 10);
    end(&mut s, arr2, 0, 11);
    end(&mut s, arr2 + 1, 0, 11);
    assert_eq!(plan(&s).pending.get(&never), Some(&PendingReason::DependencyCompleted(arr2)));
    let Outcome::PlanApplied { accepted, .. } = run_plan(&mut s, 12) else { panic!() };
    assert!(accepted.contains(&after), "{accepted:?}");
    // An unknown job in any list is refused, naming the list.
    let mut sp = spec(1, "batch");
    sp.after_any = vec![999];
    assert_eq!(
        s.apply(&cmd(13, Op::Submit { spec: sp, request_id: None, hold: false, limits: None })),
        Outcome::Rejected(Rejection::NotFound("after_any: job 999 not found".into()))
    );
}

#[test]
fn a_failed_run_is_retried_up_to_its_retries_then_the_job_fails() {
    let mut s = cluster(8);
    let mut sp = spec(1, "batch");
    sp.retries = 2;
    let id =
        submitted(s.apply(&cmd(2, Op::Submit { spec: sp, request_id: None, hold: false, limits: None })));
    for attempt in 0..3 {
        run_plan(&mut s, 3 + i64::from(attempt));
        assert_eq!(s.jobs[&id].state, JobState::Running, "attempt {attempt}");
        s.apply(&cmd(4, Op::JobStarted { job: id, attempt, node: "n1".into() }));
        s.apply(&cmd(5, Op::JobExited { job: id, attempt, node: "n1".into(), exit: RunExit::Code(2) }));
    }
    let j = &s.jobs[&id];
    assert_eq!((j.state, j.attempt, j.retried, j.exit_code), (JobState::Failed, 2, 2, Some(2)));
    assert!(j.events.iter().any(|e| e.message.contains("exit code 2; retry 2 of 2")), "{:?}", j.events);
    // A completed run is never retried; a job without retries fails at once.
    let once = submitted(
        s.apply(&cmd(9, Op::Submit { spec: spec(1, "batch"), request_id: None, hold: false, limits: None })),
    );
    run_plan(&mut s, 10);
    s.apply(&cmd(11, Op::JobExited { job: once, attempt: 0, node: "n1".into(), exit: RunExit::Signal(9) }));
    assert_eq!(s.jobs[&once].state, JobState::Failed);
}

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

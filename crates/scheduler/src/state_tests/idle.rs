//! Idle GPUs: the agent says a run's GPUs stayed idle; apply marks the job and acts by its rule.

use super::*;
use crate::policy::{IdleAction, IdleGpu, Policy, PolicyError};

fn with_rule(s: &mut ClusterState, qos: &str, action: IdleAction) -> IdleGpu {
    let mut policy = s.policy.clone();
    let rule = IdleGpu { after_s: 20, below_milli: 50, action };
    policy.qos.get_mut(qos).unwrap().idle_gpu = Some(rule);
    assert!(matches!(s.apply(&cmd(2, Op::SetPolicy { policy, audit: None })), Outcome::PolicyChanged));
    rule
}

fn idle(job: u64, attempt: u32, since: Option<i64>) -> Op {
    Op::RunIdle { job, attempt, node: "n1".into(), since_ms: since }
}

fn events(s: &ClusterState, id: u64, kind: &str) -> usize {
    s.jobs[&id].events.iter().filter(|e| e.kind == kind).count()
}

#[test]
fn notify_marks_the_job_once_and_busy_clears_the_mark() {
    let mut s = cluster(2);
    with_rule(&mut s, "batch", IdleAction::Notify);
    let id = start(&mut s, spec(1, "batch"), 10);
    assert!(matches!(s.apply(&cmd(40, idle(id, 0, Some(20)))), Outcome::RunUpdated { .. }));
    assert_eq!(s.jobs[&id].gpu_idle_since, Some(20));
    let event = s.jobs[&id].events.last().unwrap();
    assert_eq!(event.kind, "gpu idle");
    assert!(event.message.starts_with("GPUs idle below 5 % since 1970-01-01 00:00:00 UTC"), "{event:?}");
    assert!(matches!(s.apply(&cmd(41, idle(id, 0, Some(30)))), Outcome::Ignored(_)), "reported once");
    assert!(s.jobs[&id].allocation.as_ref().unwrap().stop.is_none(), "notify stops nothing");
    assert!(matches!(s.apply(&cmd(50, idle(id, 0, None))), Outcome::RunUpdated { .. }));
    assert_eq!((s.jobs[&id].gpu_idle_since, events(&s, id, "gpu busy")), (None, 1));
    // An agent's clock ahead of the cluster's is capped at now.
    s.apply(&cmd(60, idle(id, 0, Some(1_000))));
    assert_eq!(s.jobs[&id].gpu_idle_since, Some(60));
}

#[test]
fn requeue_stops_the_run_with_its_checkpoint_signal_and_the_next_attempt_starts_clean() {
    let mut s = cluster(1);
    with_rule(&mut s, "training", IdleAction::Requeue);
    let id = start(&mut s, spec(1, "training"), 10);
    s.apply(&cmd(40, idle(id, 0, Some(20))));
    assert_eq!(s.jobs[&id].allocation.as_ref().unwrap().stop, Some(StopReason::Idle));
    let order = &crate::orders::runs_on(&s, "n1")[0];
    let (signal, grace) = crate::orders::checkpoint_of(&s, s.jobs.get(&id).unwrap());
    assert_eq!(order.action, crate::orders::RunAction::Stop { signal: signal.to_string(), grace_s: grace });
    s.apply(&cmd(45, Op::JobExited { job: id, attempt: 0, node: "n1".into(), exit: RunExit::Code(0) }));
    let job = &s.jobs[&id];
    assert_eq!((job.state, job.attempt), (JobState::Pending, 1), "requeued even though it exited 0");
    assert!(job.events.last().unwrap().message.contains("GPUs were idle"), "{:?}", job.events.last());
    run_plan(&mut s, 46);
    assert_eq!((s.jobs[&id].state, s.jobs[&id].gpu_idle_since), (JobState::Running, None));
    s.check_invariants().unwrap();
}

#[test]
fn cancel_ends_the_job_and_its_record_says_why() {
    let mut s = cluster(1);
    with_rule(&mut s, "batch", IdleAction::Cancel);
    let id = start(&mut s, spec(1, "batch"), 10);
    s.apply(&cmd(40, idle(id, 0, Some(20))));
    s.apply(&cmd(41, Op::JobExited { job: id, attempt: 0, node: "n1".into(), exit: RunExit::Signal(15) }));
    assert_eq!(s.jobs[&id].state, JobState::Cancelled);
    let record = crate::state::history::JobRecord::of(&s.jobs[&id], 0);
    assert!(record.idle_note.ends_with("; cancelled"), "{}", record.idle_note);
}

#[test]
fn the_partition_s_rule_wins_a_stale_attempt_and_a_job_without_a_rule_are_ignored() {
    let mut s = cluster(2);
    with_rule(&mut s, "batch", IdleAction::Cancel);
    let mut policy = s.policy.clone();
    let default = policy.default_partition.clone();
    policy.partitions.get_mut(&default).unwrap().idle_gpu =
        Some(IdleGpu { after_s: 60, below_milli: 10, action: IdleAction::Notify });
    s.apply(&cmd(3, Op::SetPolicy { policy, audit: None }));
    let id = start(&mut s, spec(1, "batch"), 10);
    assert_eq!(crate::orders::runs_on(&s, "n1")[0].idle_watch.map(|r| r.after_s), Some(60));
    assert!(matches!(s.apply(&cmd(40, idle(id, 1, Some(20)))), Outcome::Ignored(_)), "a stale attempt");
    s.apply(&cmd(41, idle(id, 0, Some(20))));
    assert_eq!(s.jobs[&id].state, JobState::Running, "notified, by the partition's rule, not cancelled");
    let mut s = cluster(1);
    let id = start(&mut s, spec(1, "batch"), 10);
    assert!(crate::orders::runs_on(&s, "n1")[0].idle_watch.is_none());
    assert!(matches!(s.apply(&cmd(40, idle(id, 0, Some(20)))), Outcome::Ignored(_)));
}

#[test]
fn bad_rules_and_acting_on_an_inference_qos_are_refused() {
    let mut policy = Policy::default();
    policy.qos.get_mut("training").unwrap().idle_gpu =
        Some(IdleGpu { after_s: 0, below_milli: 50, action: IdleAction::Notify });
    assert!(matches!(policy.validate(), Err(PolicyError::BadIdleGpu(_))));
    policy.qos.get_mut("training").unwrap().idle_gpu =
        Some(IdleGpu { after_s: 10, below_milli: 1001, action: IdleAction::Notify });
    assert!(matches!(policy.validate(), Err(PolicyError::BadIdleGpu(_))));
    policy.qos.get_mut("training").unwrap().idle_gpu = None;
    policy.qos.get_mut("inference").unwrap().idle_gpu =
        Some(IdleGpu { after_s: 10, below_milli: 50, action: IdleAction::Requeue });
    let err = policy.validate().unwrap_err();
    assert!(err.to_string().contains("may only notify"), "{err}");
    policy.qos.get_mut("inference").unwrap().idle_gpu =
        Some(IdleGpu { after_s: 10, below_milli: 50, action: IdleAction::Notify });
    policy.validate().unwrap();
}

//! Unhealthy GPUs are never granted, the runs on them requeue, a reset returns them; drains that
//! keep their runs, and resuming.

use super::*;
use crate::model::GpuFault;

fn fault(node: &str, gpu: u32, reason: &str) -> Op {
    Op::GpuFault { node: node.into(), gpu, uuid: format!("GPU-{node}-{gpu}"), reason: reason.into() }
}

#[test]
fn a_failed_gpu_requeues_its_run_and_is_never_granted_until_reset() {
    let mut s = cluster(2);
    let id = start(&mut s, spec(1, "batch"), 0);
    let gpu = s.jobs[&id].allocation.as_ref().unwrap().gpus[0];
    assert!(!s.jobs[&id].spec.requeue, "requeued although the job did not ask for it");
    let out = s.apply(&cmd(10, fault("n1", gpu, "XID 79")));
    assert_eq!(out, Outcome::NodeChanged { node: "n1".into(), stopped: vec![id] });
    assert_eq!(s.nodes["n1"].faults[&gpu], GpuFault { reason: "XID 79".into(), since_ms: 10 });
    assert_eq!(s.jobs[&id].allocation.as_ref().unwrap().stop, Some(StopReason::GpuFailed));
    s.check_invariants().unwrap();
    // Told again (the agent repeats a GPU that keeps failing): nothing changes.
    assert!(matches!(s.apply(&cmd(11, fault("n1", gpu, "XID 79"))), Outcome::Ignored(_)));
    // The run ends: requeued, with the GPU's story.
    s.apply(&cmd(12, Op::JobExited { job: id, attempt: 0, node: "n1".into(), exit: RunExit::Signal(15) }));
    assert_eq!((s.jobs[&id].state, s.jobs[&id].attempt), (JobState::Pending, 1));
    let last = s.jobs[&id].events.last().unwrap();
    assert!(last.message.starts_with(&format!("GPU {gpu} (GPU-n1-{gpu}) failed: XID 79")), "{last:?}");
    // Only the healthy GPU is offered: the job goes there, a 2-GPU job waits.
    run_plan(&mut s, 13);
    assert_ne!(s.jobs[&id].allocation.as_ref().unwrap().gpus, vec![gpu]);
    let big = submitted(
        s.apply(&cmd(14, Op::Submit { spec: spec(2, "batch"), request_id: None, hold: false, limits: None })),
    );
    assert!(
        matches!(plan(&s).pending[&big], PendingReason::ReqNodeNotAvail(_)),
        "{:?}",
        plan(&s).pending[&big]
    );
    // A plan naming the unhealthy GPU (a stale leader's) is refused on apply.
    let forged = Plan { placements: vec![Placement::single(big, "n1".into(), vec![0, 1])] };
    match s.apply(&cmd(15, Op::ApplyPlan { plan: forged })) {
        Outcome::PlanApplied { accepted, rejected } => {
            assert!(accepted.is_empty());
            assert!(rejected[0].1.contains("unhealthy") || rejected[0].1.contains("held"), "{rejected:?}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(s.nodes["n1"].free_gpus(), Vec::<u32>::new());
    // Reset: the GPU is back.
    assert_eq!(
        s.apply(&cmd(16, Op::GpuReset { node: "n1".into(), gpu })),
        Outcome::NodeChanged { node: "n1".into(), stopped: vec![] }
    );
    assert!(matches!(s.apply(&cmd(17, Op::GpuReset { node: "n1".into(), gpu })), Outcome::Ignored(_)));
    assert_eq!(s.nodes["n1"].free_gpus(), vec![gpu]);
    s.check_invariants().unwrap();
}

#[test]
fn a_fault_report_about_another_gpu_or_node_is_refused_and_changes_nothing() {
    let mut s = cluster(2);
    let before = s.clone();
    let stale =
        Op::GpuFault { node: "n1".into(), gpu: 0, uuid: "GPU-replaced".into(), reason: "XID 79".into() };
    assert!(matches!(s.apply(&cmd(5, stale)), Outcome::Rejected(Rejection::FailedPrecondition(_))));
    assert!(matches!(s.apply(&cmd(5, fault("n1", 7, "XID 79"))), Outcome::Rejected(Rejection::NotFound(_))));
    assert!(matches!(
        s.apply(&cmd(5, fault("nope", 0, "XID 79"))),
        Outcome::Rejected(Rejection::NotFound(_))
    ));
    assert!(matches!(
        s.apply(&cmd(5, Op::GpuReset { node: "n1".into(), gpu: 9 })),
        Outcome::Rejected(Rejection::NotFound(_))
    ));
    assert_eq!(s.nodes, before.nodes);
    // A GPU replaced (another UUID at its index) comes back healthy when its agent registers.
    s.apply(&cmd(6, fault("n1", 1, "XID 48")));
    s.apply(&cmd(7, Op::RegisterNode { info: node_info("n1", 2) }));
    assert!(s.nodes["n1"].faults.contains_key(&1), "the same GPU keeps its fault across a restart");
    let mut swapped = node_info("n1", 2);
    swapped.gpus[1].uuid = "GPU-new".into();
    s.apply(&cmd(8, Op::RegisterNode { info: swapped }));
    assert!(s.nodes["n1"].faults.is_empty());
}

#[test]
fn the_invariant_checker_catches_an_unhealthy_gpu_held_by_a_run_that_goes_on() {
    let mut s = cluster(2);
    let id = start(&mut s, spec(1, "batch"), 0);
    let gpu = s.jobs[&id].allocation.as_ref().unwrap().gpus[0];
    let mut broken = s.clone();
    broken.nodes.get_mut("n1").unwrap().faults.insert(gpu, GpuFault { reason: "XID 79".into(), since_ms: 1 });
    let err = broken.check_invariants().unwrap_err();
    assert!(err.contains("unhealthy"), "{err}");
    let mut claimed = s.clone();
    let free = claimed.nodes["n1"].free_gpus()[0];
    let n = claimed.nodes.get_mut("n1").unwrap();
    n.faults.insert(free, GpuFault { reason: "XID 79".into(), since_ms: 1 });
    n.claimed.insert(free, id);
    assert!(claimed.check_invariants().is_err());
}

#[test]
fn a_drain_that_keeps_its_runs_ends_on_resume_and_only_its_own_reason_is_resumed() {
    let mut s = cluster(2);
    let id = start(&mut s, spec(1, "batch"), 0);
    let drain =
        |keep_runs, reason: &str| Op::DrainNode { node: "n1".into(), reason: reason.into(), keep_runs };
    let out = s.apply(&cmd(5, drain(true, "health check: disk full")));
    assert!(matches!(out, Outcome::NodeChanged { .. }), "{out:?}");
    assert_eq!(s.nodes["n1"].state, NodeState::Draining);
    assert_eq!(s.jobs[&id].allocation.as_ref().unwrap().stop, None, "its runs go on");
    assert!(plan(&s).plan.placements.is_empty());
    // Another prefix does not resume it; the health check's does.
    let resume =
        |only: Option<&str>| Op::ResumeNode { node: "n1".into(), only_reason: only.map(str::to_string) };
    assert!(matches!(s.apply(&cmd(6, resume(Some("spot")))), Outcome::Ignored(_)));
    assert!(matches!(s.apply(&cmd(7, resume(Some("health check: ")))), Outcome::NodeChanged { .. }));
    assert_eq!(s.nodes["n1"].state, NodeState::Up);
    // An operator's drain is never ended by the health check, and a later drain that does not
    // keep runs stops them even on a node already draining.
    s.apply(&cmd(8, drain(true, "health check: disk full")));
    assert!(matches!(s.apply(&cmd(9, drain(false, "operator"))), Outcome::NodeDown { .. }));
    assert_eq!(s.jobs[&id].allocation.as_ref().unwrap().stop, Some(StopReason::Drained));
    s.apply(&cmd(10, drain(false, "drained by ops: rack work")));
    assert!(matches!(s.apply(&cmd(11, resume(Some("health check: ")))), Outcome::Ignored(_)));
    assert_eq!(s.nodes["n1"].state, NodeState::Draining);
    assert!(matches!(s.apply(&cmd(12, resume(None))), Outcome::NodeChanged { .. }));
    assert!(matches!(s.apply(&cmd(13, resume(None))), Outcome::Ignored(_)));
    s.check_invariants().unwrap();
}

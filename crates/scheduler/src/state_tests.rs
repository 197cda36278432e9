//! Tests of `ClusterState::apply`: unit cases and the property tests of its invariants.

use proptest::prelude::*;

use crate::model::{JobState, NodeState, StopReason};
use crate::planner::plan;
use crate::planner::PendingReason;
use crate::state::{ClusterState, Command, Op, Outcome, Placement, Plan, Rejection, RunExit};
use crate::testing::{node_info, node_info_model, spec};

fn cmd(now_ms: i64, op: Op) -> Command {
    Command { now_ms, op }
}

fn submitted(out: Outcome) -> u64 {
    match out {
        Outcome::Submitted { job } => job,
        other => panic!("expected a submit, got {other:?}"),
    }
}

fn cluster(gpus: u32) -> ClusterState {
    let mut s = ClusterState::new();
    s.apply(&cmd(1, Op::RegisterNode { info: node_info("n1", gpus) }));
    s
}

fn run_plan(s: &mut ClusterState, now: i64) -> Outcome {
    let p = plan(s).plan;
    s.apply(&cmd(now, Op::ApplyPlan { plan: p }))
}

#[test]
fn submit_assigns_ids_in_order_and_rejects_bad_specs_without_change() {
    let mut s = cluster(8);
    assert_eq!(
        submitted(s.apply(&cmd(
            2,
            Op::Submit { spec: spec(1, "batch"), request_id: None, hold: false, limits: None }
        ))),
        1
    );
    let before = s.clone();
    let zero =
        s.apply(&cmd(3, Op::Submit { spec: spec(0, "batch"), request_id: None, hold: false, limits: None }));
    assert!(matches!(zero, Outcome::Rejected(Rejection::Invalid(m)) if m.contains("gpus")));
    let too_big =
        s.apply(&cmd(3, Op::Submit { spec: spec(9, "batch"), request_id: None, hold: false, limits: None }));
    assert_eq!(
        too_big,
        Outcome::Rejected(Rejection::FailedPrecondition(
            "job requests 9 GPUs but the largest node has 8".into()
        ))
    );
    let mut empty = spec(1, "batch");
    empty.argv.clear();
    assert!(matches!(
        s.apply(&cmd(3, Op::Submit { spec: empty, request_id: None, hold: false, limits: None })),
        Outcome::Rejected(_)
    ));
    assert!(matches!(
        s.apply(&cmd(3, Op::Submit { spec: spec(1, "nope"), request_id: None, hold: false, limits: None })),
        Outcome::Rejected(Rejection::Invalid(m)) if m.contains("unknown qos")
    ));
    for reserved in ["CUDA_VISIBLE_DEVICES", "KAIROS_JOB_ID", "RANK"] {
        let mut sneaky = spec(1, "batch");
        sneaky.env.insert(reserved.into(), "0".into());
        assert!(matches!(
            s.apply(&cmd(3, Op::Submit { spec: sneaky, request_id: None, hold: false, limits: None })),
            Outcome::Rejected(Rejection::Invalid(m)) if m.contains("cannot be overridden")
        ));
    }
    let mut s2 = s.clone();
    s2.now_ms = before.now_ms;
    assert_eq!(s2, before, "rejected submits change nothing but the clock");
    assert_eq!(
        submitted(s.apply(&cmd(
            4,
            Op::Submit { spec: spec(1, "batch"), request_id: None, hold: false, limits: None }
        ))),
        2
    );
}

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

#[test]
fn a_retried_submit_with_the_same_request_id_returns_the_first_job() {
    let mut s = cluster(1);
    let submit = |s: &mut ClusterState, user: &str, rid: &str| {
        let mut sp = spec(1, "batch");
        sp.user = user.into();
        s.apply(&cmd(2, Op::Submit { spec: sp, request_id: Some(rid.into()), hold: false, limits: None }))
    };
    let first = submitted(submit(&mut s, "alice", "r1"));
    assert_eq!(submitted(submit(&mut s, "alice", "r1")), first);
    assert_eq!(s.jobs.len(), 1);
    // Request ids are per user.
    assert_ne!(submitted(submit(&mut s, "bob", "r1")), first);
    assert!(matches!(submit(&mut s, "alice", ""), Outcome::Rejected(Rejection::Invalid(_))));
    assert!(matches!(submit(&mut s, "alice", &"x".repeat(129)), Outcome::Rejected(Rejection::Invalid(_))));
    assert_eq!(s.jobs.len(), 2);
    // The dedup index is part of the replicated state: it must survive a snapshot round trip.
    let bytes = serde_json::to_vec(&s).expect("state serialises");
    let back: ClusterState = serde_json::from_slice(&bytes).expect("state deserialises");
    assert_eq!(back, s);
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
fn an_inference_job_starts_before_a_queue_of_pending_training_jobs() {
    let mut s = cluster(8);
    let mut training = Vec::new();
    for _ in 0..20 {
        let mut sp = spec(8, "");
        sp.profile = crate::model::Profile::Training;
        training.push(submitted(
            s.apply(&cmd(2, Op::Submit { spec: sp, request_id: None, hold: false, limits: None })),
        ));
    }
    run_plan(&mut s, 3);
    assert_eq!(s.jobs[&training[0]].state, JobState::Running);
    let mut sp = spec(1, "");
    sp.profile = crate::model::Profile::Inference;
    let inference =
        submitted(s.apply(&cmd(4, Op::Submit { spec: sp, request_id: None, hold: false, limits: None })));
    assert_eq!(s.jobs[&inference].spec.qos, "inference", "the submit rule picks the profile's QoS");
    // The training job finishes; the freed node goes to the inference job, not the next training job.
    s.apply(&cmd(
        5,
        Op::JobExited { job: training[0], attempt: 0, node: "n1".into(), exit: RunExit::Code(0) },
    ));
    let Outcome::PlanApplied { accepted, .. } = run_plan(&mut s, 6) else { panic!() };
    assert_eq!(accepted, vec![inference]);
}

#[test]
fn qos_limits_hold_jobs_with_a_reason_and_max_wall_rejects() {
    let mut s = cluster(8);
    let mut policy = s.policy.clone();
    let batch = policy.qos.get_mut("batch").unwrap();
    batch.grp_gpus = Some(4);
    batch.user_jobs = Some(2);
    assert_eq!(s.apply(&cmd(1, Op::SetPolicy { policy })), Outcome::PolicyChanged);
    // More GPUs than the group limit could ever allow: rejected at submit.
    assert!(matches!(
        s.apply(&cmd(2, Op::Submit { spec: spec(5, "batch"), request_id: None, hold: false, limits: None })),
        Outcome::Rejected(Rejection::FailedPrecondition(m)) if m.contains("allows 4 GPUs in total")
    ));
    // Over the QoS's max wall: rejected.
    let mut long = spec(1, "batch");
    long.time_limit_s = Some(25 * 3600);
    assert!(matches!(
        s.apply(&cmd(2, Op::Submit { spec: long, request_id: None, hold: false, limits: None })),
        Outcome::Rejected(Rejection::Invalid(m)) if m.contains("more than qos \"batch\" allows")
    ));
    let a = submitted(
        s.apply(&cmd(2, Op::Submit { spec: spec(3, "batch"), request_id: None, hold: false, limits: None })),
    );
    let b = submitted(
        s.apply(&cmd(2, Op::Submit { spec: spec(2, "batch"), request_id: None, hold: false, limits: None })),
    );
    let mut bob = spec(1, "batch");
    bob.user = "bob".into();
    let c =
        submitted(s.apply(&cmd(2, Op::Submit { spec: bob, request_id: None, hold: false, limits: None })));
    let d = submitted(
        s.apply(&cmd(2, Op::Submit { spec: spec(1, "batch"), request_id: None, hold: false, limits: None })),
    );
    let out = plan(&s);
    // a (3 GPUs) starts; b would make 5 > 4 (group limit); c fits (4); d would be alice's third
    // job... but first the group limit (3 + 1 + 1 > 4) holds it.
    let placed: Vec<u64> = out.plan.placements.iter().map(|p| p.job).collect();
    assert_eq!(placed, vec![a, c]);
    assert_eq!(out.pending[&b], crate::planner::PendingReason::QosGrpGpuLimit);
    assert_eq!(out.pending[&d], crate::planner::PendingReason::QosGrpGpuLimit);
    // A forged plan that ignores the limit is rejected on apply.
    let forged = Plan {
        placements: vec![
            Placement::single(a, "n1".into(), vec![0, 1, 2]),
            Placement::single(b, "n1".into(), vec![3, 4]),
        ],
    };
    let Outcome::PlanApplied { accepted, rejected } = s.apply(&cmd(3, Op::ApplyPlan { plan: forged })) else {
        panic!()
    };
    assert_eq!(accepted, vec![a]);
    assert!(rejected[0].1.contains("QosGrpGpuLimit"), "{rejected:?}");
    s.check_invariants().unwrap();
}

#[test]
fn policy_changes_are_validated_whole_and_refuse_removing_a_qos_in_use() {
    let mut s = cluster(1);
    let before = s.policy.clone();
    let j = submitted(s.apply(&cmd(
        2,
        Op::Submit { spec: spec(1, "premium"), request_id: None, hold: false, limits: None },
    )));
    let mut without_premium = s.policy.clone();
    without_premium.qos.remove("premium");
    assert!(matches!(
        s.apply(&cmd(3, Op::SetPolicy { policy: without_premium })),
        Outcome::Rejected(Rejection::FailedPrecondition(m)) if m == format!("qos \"premium\" is in use by job {j}")
    ));
    assert!(matches!(s.apply(&cmd(3, Op::DeleteQos { name: "premium".into() })), Outcome::Rejected(_)));
    assert!(
        matches!(s.apply(&cmd(3, Op::DeleteQos { name: "batch".into() })), Outcome::Rejected(Rejection::FailedPrecondition(m)) if m.contains("default of profile batch"))
    );
    assert!(matches!(
        s.apply(&cmd(3, Op::DeleteQos { name: "gold".into() })),
        Outcome::Rejected(Rejection::NotFound(_))
    ));
    let mut cyclic = s.policy.clone();
    cyclic.qos.get_mut("training").unwrap().preempt.insert("batch".into());
    cyclic.qos.get_mut("batch").unwrap().preempt.insert("training".into());
    assert!(matches!(
        s.apply(&cmd(3, Op::SetPolicy { policy: cyclic })),
        Outcome::Rejected(Rejection::Invalid(_))
    ));
    assert_eq!(s.policy, before, "refused changes changed nothing");
    // A new QoS, then a priority change that pending jobs follow.
    let mut gold = before.qos["premium"].clone();
    gold.name = "gold".into();
    gold.priority = 999;
    assert_eq!(s.apply(&cmd(4, Op::PutQos { qos: gold, must_exist: Some(false) })), Outcome::PolicyChanged);
    let g = submitted(
        s.apply(&cmd(5, Op::Submit { spec: spec(1, "gold"), request_id: None, hold: false, limits: None })),
    );
    assert_eq!(s.jobs[&g].priority, 999);
    let mut premium = s.policy.qos["premium"].clone();
    premium.priority = 7;
    s.apply(&cmd(6, Op::PutQos { qos: premium, must_exist: Some(true) }));
    assert_eq!(s.jobs[&j].priority, 7);
    s.apply(&cmd(7, Op::Cancel { job: j, by: "a".into() }));
    assert_eq!(s.apply(&cmd(8, Op::DeleteQos { name: "premium".into() })), Outcome::PolicyChanged);
}

#[test]
fn after_ok_waits_for_its_parent_and_a_failed_parent_never_satisfies_it() {
    let mut s = cluster(4);
    let parent = submitted(
        s.apply(&cmd(2, Op::Submit { spec: spec(1, "batch"), request_id: None, hold: false, limits: None })),
    );
    let failing = submitted(
        s.apply(&cmd(2, Op::Submit { spec: spec(1, "batch"), request_id: None, hold: false, limits: None })),
    );
    let mut child_spec = spec(1, "batch");
    child_spec.after_ok = vec![parent];
    let child = submitted(
        s.apply(&cmd(2, Op::Submit { spec: child_spec, request_id: None, hold: false, limits: None })),
    );
    let mut orphan_spec = spec(1, "batch");
    orphan_spec.after_ok = vec![failing];
    let orphan = submitted(
        s.apply(&cmd(2, Op::Submit { spec: orphan_spec, request_id: None, hold: false, limits: None })),
    );
    let mut unknown = spec(1, "batch");
    unknown.after_ok = vec![999];
    assert_eq!(
        s.apply(&cmd(2, Op::Submit { spec: unknown, request_id: None, hold: false, limits: None })),
        Outcome::Rejected(Rejection::NotFound("after_ok: job 999 not found".into()))
    );
    run_plan(&mut s, 3);
    assert_eq!(plan(&s).pending[&child], PendingReason::Dependency);
    // A forged plan cannot start the child early.
    let forged = Plan { placements: vec![Placement::single(child, "n1".into(), vec![3])] };
    let Outcome::PlanApplied { accepted, .. } = s.apply(&cmd(4, Op::ApplyPlan { plan: forged })) else {
        panic!()
    };
    assert!(accepted.is_empty());
    s.apply(&cmd(5, Op::JobExited { job: parent, attempt: 0, node: "n1".into(), exit: RunExit::Code(0) }));
    s.apply(&cmd(5, Op::JobExited { job: failing, attempt: 0, node: "n1".into(), exit: RunExit::Code(1) }));
    assert_eq!(plan(&s).pending[&orphan], PendingReason::DependencyNeverSatisfied(failing));
    let Outcome::PlanApplied { accepted, .. } = run_plan(&mut s, 6) else { panic!() };
    assert_eq!(accepted, vec![child]);
}

#[test]
fn held_jobs_wait_until_released_and_only_pending_jobs_can_be_held() {
    let mut s = cluster(2);
    let held = submitted(
        s.apply(&cmd(2, Op::Submit { spec: spec(1, "urgent"), request_id: None, hold: true, limits: None })),
    );
    let other = submitted(
        s.apply(&cmd(2, Op::Submit { spec: spec(1, "batch"), request_id: None, hold: false, limits: None })),
    );
    assert_eq!(plan(&s).pending[&held], PendingReason::JobHeldUser);
    let Outcome::PlanApplied { accepted, .. } = run_plan(&mut s, 3) else { panic!() };
    assert_eq!(accepted, vec![other], "a held job does not block the queue");
    assert!(matches!(
        s.apply(&cmd(4, Op::Hold { job: other, by: "a".into() })),
        Outcome::Rejected(Rejection::FailedPrecondition(_))
    ));
    assert_eq!(
        s.apply(&cmd(4, Op::Release { job: held, by: "a".into() })),
        Outcome::HoldChanged { job: held, held: false }
    );
    let Outcome::PlanApplied { accepted, .. } = run_plan(&mut s, 5) else { panic!() };
    assert_eq!(accepted, vec![held]);
}

#[test]
fn a_gpu_model_constraint_is_honoured_by_plan_and_apply() {
    let mut s = ClusterState::new();
    s.apply(&cmd(1, Op::RegisterNode { info: node_info_model("h", 4, "NVIDIA H100 80GB HBM3") }));
    s.apply(&cmd(1, Op::RegisterNode { info: node_info_model("a", 8, "NVIDIA A100-SXM4-40GB") }));
    let mut sp = spec(2, "batch");
    sp.gpu_model = Some("a100".into());
    let j = submitted(
        s.apply(&cmd(2, Op::Submit { spec: sp.clone(), request_id: None, hold: false, limits: None })),
    );
    let forged = Plan { placements: vec![Placement::single(j, "h".into(), vec![0, 1])] };
    let Outcome::PlanApplied { accepted, .. } = s.apply(&cmd(3, Op::ApplyPlan { plan: forged })) else {
        panic!()
    };
    assert!(accepted.is_empty(), "placed on H100s");
    run_plan(&mut s, 4);
    assert_eq!(s.jobs[&j].allocation.as_ref().unwrap().node, "a");
    // More of a model than any node has: waits with a reason naming the model.
    sp.gpus = 6;
    sp.gpu_model = Some("H100".into());
    let big =
        submitted(s.apply(&cmd(5, Op::Submit { spec: sp, request_id: None, hold: false, limits: None })));
    assert_eq!(plan(&s).pending[&big], PendingReason::ReqNodeNotAvail("no up node has 6 H100 GPUs".into()));
}

fn two_accounts() -> crate::policy::Policy {
    use crate::policy::Account;
    let mut policy = crate::policy::Policy::default();
    for (name, user) in [("a", "alice"), ("b", "bob")] {
        let account = Account {
            name: name.into(),
            parent: Some("root".into()),
            shares: 1,
            users: [user.to_string()].into(),
        };
        policy.accounts.insert(name.into(), account);
    }
    policy
}

#[test]
fn fairshare_favours_the_account_with_less_past_usage() {
    let mut s = cluster(1);
    assert_eq!(s.apply(&cmd(1, Op::SetPolicy { policy: two_accounts() })), Outcome::PolicyChanged);
    // Alice's account uses the GPU for ten hours.
    let mut heavy = spec(1, "batch");
    heavy.user = "alice".into();
    let j = submitted(
        s.apply(&cmd(2, Op::Submit { spec: heavy.clone(), request_id: None, hold: false, limits: None })),
    );
    assert_eq!(s.jobs[&j].spec.account, "a", "the user's default account");
    run_plan(&mut s, 2);
    s.apply(&cmd(2, Op::JobStarted { job: j, attempt: 0, node: "n1".into() }));
    let ten_hours = 10 * 3600 * 1000;
    s.apply(&cmd(ten_hours, Op::JobExited { job: j, attempt: 0, node: "n1".into(), exit: RunExit::Code(0) }));
    assert!(s.usage["a"].gpu_ms > 0 && s.usage["root"].gpu_ms == s.usage["a"].gpu_ms);
    // Both submit now, Alice first: Bob's job starts first.
    let alice = submitted(
        s.apply(&cmd(ten_hours, Op::Submit { spec: heavy, request_id: None, hold: false, limits: None })),
    );
    let mut light = spec(1, "batch");
    light.user = "bob".into();
    let bob = submitted(
        s.apply(&cmd(ten_hours, Op::Submit { spec: light, request_id: None, hold: false, limits: None })),
    );
    let factors = crate::priority::fairshare_factors(&s);
    assert!(factors["b"] > factors["a"], "{factors:?}");
    let Outcome::PlanApplied { accepted, .. } = run_plan(&mut s, ten_hours) else { panic!() };
    assert_eq!(accepted, vec![bob]);
    assert_eq!(plan(&s).pending[&alice], PendingReason::Resources);
}

#[test]
fn accounts_are_checked_at_submit_and_cannot_vanish_under_jobs() {
    let mut s = cluster(1);
    s.apply(&cmd(1, Op::SetPolicy { policy: two_accounts() }));
    let mut sp = spec(1, "batch");
    sp.user = "bob".into();
    sp.account = "a".into();
    assert!(matches!(
        s.apply(&cmd(2, Op::Submit { spec: sp.clone(), request_id: None, hold: false, limits: None })),
        Outcome::Rejected(Rejection::Invalid(m)) if m.contains("does not belong to account \"a\"")
    ));
    sp.account = "zz".into();
    assert!(matches!(
        s.apply(&cmd(2, Op::Submit { spec: sp.clone(), request_id: None, hold: false, limits: None })),
        Outcome::Rejected(Rejection::Invalid(m)) if m.contains("unknown account")
    ));
    sp.account = "b".into();
    submitted(s.apply(&cmd(2, Op::Submit { spec: sp, request_id: None, hold: false, limits: None })));
    let mut without_b = two_accounts();
    without_b.accounts.remove("b");
    assert!(matches!(
        s.apply(&cmd(3, Op::SetPolicy { policy: without_b })),
        Outcome::Rejected(Rejection::FailedPrecondition(m)) if m.contains("account \"b\" is in use")
    ));
    let mut cyclic = two_accounts();
    cyclic.accounts.get_mut("root").unwrap().parent = Some("a".into());
    assert!(matches!(
        s.apply(&cmd(3, Op::SetPolicy { policy: cyclic })),
        Outcome::Rejected(Rejection::Invalid(_))
    ));
    let mut no_weights = two_accounts();
    no_weights.weights = crate::priority::PriorityWeights {
        qos: 0,
        age: 0,
        fairshare: 0,
        job_size: 0,
        partition: 0,
        ..Default::default()
    };
    assert!(matches!(
        s.apply(&cmd(3, Op::SetPolicy { policy: no_weights })),
        Outcome::Rejected(Rejection::Invalid(_))
    ));
}

fn with_partition(mut policy: crate::policy::Policy) -> crate::policy::Policy {
    let part = crate::policy::Partition {
        name: "big".into(),
        nodes: Default::default(),
        selector: [("rack".to_string(), "r2".to_string())].into(),
        priority_tier: 5,
        allowed_qos: ["training".to_string(), "batch".to_string()].into(),
        default_qos: Some("training".into()),
        max_wall_s: Some(3600),
    };
    policy.partitions.insert(part.name.clone(), part);
    policy
}

#[test]
fn partitions_confine_jobs_to_their_nodes_and_apply_their_rules() {
    let mut s = ClusterState::new();
    s.apply(&cmd(1, Op::RegisterNode { info: node_info("n1", 4) }));
    let mut r2 = node_info("n2", 4);
    r2.labels.insert("rack".into(), "r2".into());
    s.apply(&cmd(1, Op::RegisterNode { info: r2 }));
    assert_eq!(
        s.apply(&cmd(1, Op::SetPolicy { policy: with_partition(s.policy.clone()) })),
        Outcome::PolicyChanged
    );
    let mut sp = spec(1, "");
    sp.partition = "big".into();
    sp.time_limit_s = Some(600);
    let j = submitted(
        s.apply(&cmd(2, Op::Submit { spec: sp.clone(), request_id: None, hold: false, limits: None })),
    );
    assert_eq!(s.jobs[&j].spec.qos, "training", "the partition's default qos");
    // A forged plan onto a node outside the partition is rejected; the planner picks n2.
    let forged = Plan { placements: vec![Placement::single(j, "n1".into(), vec![0])] };
    let Outcome::PlanApplied { accepted, .. } = s.apply(&cmd(3, Op::ApplyPlan { plan: forged })) else {
        panic!()
    };
    assert!(accepted.is_empty());
    run_plan(&mut s, 3);
    assert_eq!(s.jobs[&j].allocation.as_ref().unwrap().node, "n2");
    // A QoS the partition does not allow is refused; a limit over its max wall waits.
    let mut urgent = sp.clone();
    urgent.qos = "urgent".into();
    assert!(matches!(
        s.apply(&cmd(4, Op::Submit { spec: urgent, request_id: None, hold: false, limits: None })),
        Outcome::Rejected(Rejection::Invalid(m)) if m.contains("not allowed in partition")
    ));
    let mut long = sp.clone();
    long.time_limit_s = Some(7200);
    let l =
        submitted(s.apply(&cmd(4, Op::Submit { spec: long, request_id: None, hold: false, limits: None })));
    assert_eq!(plan(&s).pending[&l], PendingReason::PartitionTimeLimit);
    // Without its own limit, a job gets the partition's tighter max wall (not PartitionTimeLimit).
    let mut unlimited = sp.clone();
    unlimited.time_limit_s = None;
    let u = submitted(
        s.apply(&cmd(4, Op::Submit { spec: unlimited, request_id: None, hold: false, limits: None })),
    );
    assert_eq!(s.time_limit_s(&s.jobs[&u]), Some(3600));
    assert_ne!(plan(&s).pending.get(&u), Some(&PendingReason::PartitionTimeLimit));
    let mut unknown = sp;
    unknown.partition = "nope".into();
    assert!(matches!(
        s.apply(&cmd(4, Op::Submit { spec: unknown, request_id: None, hold: false, limits: None })),
        Outcome::Rejected(_)
    ));
    // A partition in use cannot be removed.
    let mut without = s.policy.clone();
    without.partitions.remove("big");
    assert!(matches!(
        s.apply(&cmd(5, Op::SetPolicy { policy: without })),
        Outcome::Rejected(Rejection::FailedPrecondition(_))
    ));
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
        },
    );
    s.apply(&cmd(0, Op::SetPolicy { policy }));
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
    s.apply(&cmd(10_004, Op::SetPolicy { policy }));
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

/// Submits `sp` at `now`, plans, and reports it started; returns its id.
fn start(s: &mut ClusterState, sp: crate::model::JobSpec, now: i64) -> u64 {
    let id =
        submitted(s.apply(&cmd(now, Op::Submit { spec: sp, request_id: None, hold: false, limits: None })));
    run_plan(s, now);
    let node = s.jobs[&id].allocation.as_ref().expect("placed").node.clone();
    s.apply(&cmd(now, Op::JobStarted { job: id, attempt: s.jobs[&id].attempt, node }));
    id
}

/// Applies the planner's preemption at `now`.
fn preempt(s: &mut ClusterState, now: i64) -> crate::planner::PreemptPlan {
    let p = plan(s).preemption.expect("a preemption");
    let op = Op::Preempt {
        preemptor: p.preemptor,
        node: p.node.clone(),
        victims: p.victims.clone(),
        gpus: p.gpus.clone(),
    };
    assert!(matches!(s.apply(&cmd(now, op)), Outcome::Preempted { .. }));
    s.check_invariants().unwrap();
    p
}

#[test]
fn a_suspendable_job_is_paused_lends_its_gpus_and_resumes_when_the_preemptor_ends() {
    let mut s = cluster(4);
    let mut policy = s.policy.clone();
    policy.qos.get_mut("batch").unwrap().preempt_mode = crate::policy::PreemptMode::Suspend;
    s.apply(&cmd(0, Op::SetPolicy { policy }));
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
    s.apply(&cmd(0, Op::SetPolicy { policy }));
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

#[test]
fn an_elastic_job_shrinks_for_a_preemptor_and_grows_back_afterwards() {
    let mut s = cluster(4);
    let mut sp = spec(4, "training");
    sp.min_gpus = Some(2);
    let elastic = start(&mut s, sp, 0);
    let urgent = submitted(s.apply(&cmd(
        60_000,
        Op::Submit { spec: spec(2, "urgent"), request_id: None, hold: false, limits: None },
    )));
    let p = preempt(&mut s, 60_000);
    assert_eq!(p.victims, vec![elastic]);
    assert_eq!(
        s.jobs[&elastic].allocation.as_ref().unwrap().stop,
        Some(StopReason::Resize { by: Some(urgent) })
    );
    assert_eq!(s.preemptions.back().unwrap().action(), "shrink");
    let kept: Vec<u32> = (0..4).filter(|g| !p.gpus.contains(g)).collect();
    // The victim checkpoints and exits; it comes back on the GPUs it kept, the urgent job on
    // the others, both in the next pass.
    s.apply(&cmd(
        61_000,
        Op::JobExited { job: elastic, attempt: 0, node: "n1".into(), exit: RunExit::Code(0) },
    ));
    let j = &s.jobs[&elastic];
    assert_eq!((j.state, j.attempt, j.gpus()), (JobState::Pending, 1, 2));
    s.check_invariants().unwrap();
    let Outcome::PlanApplied { accepted, .. } = run_plan(&mut s, 61_001) else { panic!() };
    assert_eq!(accepted, vec![urgent, elastic], "by priority");
    assert_eq!(s.jobs[&elastic].allocation.as_ref().unwrap().gpus, kept);
    s.apply(&cmd(61_002, Op::JobStarted { job: elastic, attempt: 1, node: "n1".into() }));
    assert!(plan(&s).grow.is_empty(), "nothing is free");
    // The urgent job ends: the elastic job grows back to its full size (one more restart).
    s.apply(&cmd(
        90_000,
        Op::JobExited { job: urgent, attempt: 0, node: "n1".into(), exit: RunExit::Code(0) },
    ));
    let grow = plan(&s).grow;
    assert_eq!(
        grow.iter().map(|g| (g.job, g.attempt, g.gpus.clone())).collect::<Vec<_>>(),
        vec![(elastic, 1, vec![0, 1, 2, 3])]
    );
    let (job, attempt, gpus) = (grow[0].job, grow[0].attempt, grow[0].gpus.clone());
    // While a job waits for resources, nothing grows.
    let mut busy = s.clone();
    busy.apply(&cmd(
        90_000,
        Op::Submit { spec: spec(4, "batch"), request_id: None, hold: false, limits: None },
    ));
    assert!(plan(&busy).grow.is_empty());
    assert!(matches!(
        s.apply(&cmd(90_001, Op::Resize { job, attempt, gpus: gpus.clone(), more: Vec::new() })),
        Outcome::RunUpdated { .. }
    ));
    assert!(
        matches!(
            s.apply(&cmd(90_002, Op::Resize { job, attempt, gpus, more: Vec::new() })),
            Outcome::Rejected(_)
        ),
        "once"
    );
    s.check_invariants().unwrap();
    // The freed GPUs are claimed for it while it restarts.
    let other = submitted(s.apply(&cmd(
        90_003,
        Op::Submit { spec: spec(2, "batch"), request_id: None, hold: false, limits: None },
    )));
    let Outcome::PlanApplied { accepted, .. } = run_plan(&mut s, 90_004) else { panic!() };
    assert!(accepted.is_empty());
    s.apply(&cmd(
        91_000,
        Op::JobExited { job: elastic, attempt: 1, node: "n1".into(), exit: RunExit::Code(0) },
    ));
    let Outcome::PlanApplied { accepted, .. } = run_plan(&mut s, 91_001) else { panic!() };
    assert_eq!(accepted, vec![elastic]);
    let j = &s.jobs[&elastic];
    assert_eq!((j.attempt, j.gpus(), j.allocation.as_ref().unwrap().gpus.len()), (2, 4, 4));
    assert_eq!(plan(&s).pending.get(&other), Some(&PendingReason::Resources));
    s.check_invariants().unwrap();
}

#[test]
fn growing_back_respects_qos_limits() {
    let mut s = cluster(4);
    let mut policy = s.policy.clone();
    policy.qos.get_mut("training").unwrap().user_gpus = Some(3);
    s.apply(&cmd(0, Op::SetPolicy { policy }));
    let mut sp = spec(3, "training");
    sp.min_gpus = Some(1);
    let elastic = start(&mut s, sp, 0);
    // Pretend an earlier shrink: it runs on 2 GPUs, one more would be within the limit...
    let mut shrunk = s.clone();
    shrunk.jobs.get_mut(&elastic).unwrap().width = Some(2);
    let a = shrunk.jobs.get_mut(&elastic).unwrap().allocation.as_mut().unwrap();
    let dropped = a.gpus.pop().unwrap();
    shrunk.nodes.get_mut("n1").unwrap().allocated.remove(&dropped);
    shrunk.check_invariants().unwrap();
    assert_eq!(plan(&shrunk).grow.len(), 1);
    // ...but not once the limit is lower than that.
    let mut policy = shrunk.policy.clone();
    policy.qos.get_mut("training").unwrap().user_gpus = Some(2);
    shrunk.apply(&cmd(1, Op::SetPolicy { policy }));
    assert!(plan(&shrunk).grow.is_empty());
    let gpus = vec![0, 1, 2];
    assert!(matches!(
        shrunk.apply(&cmd(2, Op::Resize { job: elastic, attempt: 0, gpus, more: Vec::new() })),
        Outcome::Rejected(_)
    ));
}

#[test]
fn bad_elastic_and_checkpoint_specs_are_rejected_and_change_nothing() {
    use crate::validate::ValidationError;
    let mut s = cluster(4);
    let mut sp = spec(2, "training");
    sp.min_gpus = Some(3);
    assert_eq!(crate::validate_spec(&sp), Err(ValidationError::BadMinGpus { min: 3, gpus: 2 }));
    sp.min_gpus = Some(0);
    assert!(crate::validate_spec(&sp).is_err());
    sp.min_gpus = Some(1);
    sp.tasks = 2;
    assert_eq!(crate::validate_spec(&sp), Err(ValidationError::ElasticGang));
    let mut sp = spec(2, "training");
    sp.checkpoint_signal = Some("SIGKILL".into());
    assert!(matches!(crate::validate_spec(&sp), Err(ValidationError::BadCheckpointSignal(_))));
    assert_eq!(crate::validate::checkpoint_signal("usr2"), Ok("SIGUSR2"));
    assert!(crate::validate::checkpoint_signal("SIGBOGUS").is_err());
    // The QoS grace is the most a job may ask for.
    let mut sp = spec(2, "training");
    sp.checkpoint_grace_s = Some(301);
    let before = s.clone();
    let out = s.apply(&cmd(5, Op::Submit { spec: sp.clone(), request_id: None, hold: false, limits: None }));
    assert!(
        matches!(&out, Outcome::Rejected(Rejection::Invalid(m)) if m.contains("checkpoint.grace_s")),
        "{out:?}"
    );
    assert_eq!(s.jobs, before.jobs);
    sp.checkpoint_grace_s = Some(300);
    submitted(s.apply(&cmd(6, Op::Submit { spec: sp, request_id: None, hold: false, limits: None })));
}

#[test]
fn clock_never_goes_backwards() {
    let mut s = cluster(1);
    s.apply(&cmd(100, Op::Submit { spec: spec(1, "batch"), request_id: None, hold: false, limits: None }));
    s.apply(&cmd(50, Op::Submit { spec: spec(1, "batch"), request_id: None, hold: false, limits: None }));
    assert_eq!(s.now_ms, 100);
    assert_eq!(s.jobs[&2].submit_time_ms, 100);
}

/// An abstract step of the property tests; indices are resolved against the current state.
#[derive(Clone, Debug)]
enum Step {
    Register {
        node: u8,
        gpus: u32,
    },
    Submit {
        gpus: u32,
        qos: u8,
        rid: Option<u8>,
        /// Picks the constraints (dependency, model, partition, gang, elastic, suspendable).
        flags: u8,
    },
    Cancel {
        job: u8,
    },
    Plan,
    /// A plan computed now but applied after a few more steps.
    SavePlan,
    ApplySaved,
    /// A hand-made placement, often invalid.
    Forge {
        job: u8,
        node: u8,
        gpus: Vec<u32>,
    },
    Started {
        job: u8,
    },
    Exited {
        job: u8,
        code: i32,
    },
    NodeDown {
        node: u8,
    },
    TimeLimit {
        job: u8,
    },
    Hold {
        job: u8,
        held: bool,
    },
    RankExited {
        job: u8,
        rank: u8,
        code: i32,
    },
    /// Applies the planner's preemption, if it proposes one.
    Preempt,
    /// Applies the planner's first grow-back, if it proposes one.
    Grow,
    /// Cancels every pending job (so that nothing waits and elastic jobs may grow back).
    Drain,
    Tick {
        ms: u32,
    },
}

fn step() -> impl Strategy<Value = Step> {
    // Weighted so that runs start, fill the nodes and get preempted often enough to matter.
    prop_oneof![
        1 => (0u8..3, 1u32..9).prop_map(|(node, gpus)| Step::Register { node, gpus }),
        4 => (1u32..10, 0u8..5, proptest::option::of(0u8..4), any::<u8>())
            .prop_map(|(gpus, qos, rid, flags)| Step::Submit { gpus, qos, rid, flags }),
        1 => (0u8..24).prop_map(|job| Step::Cancel { job }),
        3 => Just(Step::Plan),
        1 => Just(Step::SavePlan),
        1 => Just(Step::ApplySaved),
        1 => (0u8..24, 0u8..3, proptest::collection::vec(0u32..9, 0..4))
            .prop_map(|(job, node, gpus)| Step::Forge { job, node, gpus }),
        4 => (0u8..24).prop_map(|job| Step::Started { job }),
        2 => (0u8..24, 0i32..3).prop_map(|(job, code)| Step::Exited { job, code }),
        1 => (0u8..3).prop_map(|node| Step::NodeDown { node }),
        1 => (0u8..24).prop_map(|job| Step::TimeLimit { job }),
        1 => (0u8..24, any::<bool>()).prop_map(|(job, held)| Step::Hold { job, held }),
        1 => (0u8..24, 0u8..3, 0i32..2).prop_map(|(job, rank, code)| Step::RankExited { job, rank, code }),
        3 => Just(Step::Preempt),
        2 => Just(Step::Grow),
        1 => (0u32..100_000).prop_map(|ms| Step::Tick { ms }),
    ]
}

/// Steps that keep the nodes full of training and batch work and preempt it often: suspend,
/// shrink, grow back and stop, interleaved with exits, cancels and node failures.
fn preemption_step() -> impl Strategy<Value = Step> {
    prop_oneof![
        5 => (1u32..5, prop_oneof![Just(0u8), Just(3u8), Just(4u8)], any::<u8>())
            .prop_map(|(gpus, qos, flags)| Step::Submit { gpus, qos, rid: None, flags }),
        4 => Just(Step::Plan),
        3 => (0u8..24).prop_map(|job| Step::Started { job }),
        4 => Just(Step::Preempt),
        2 => Just(Step::Grow),
        1 => Just(Step::Drain),
        2 => (0u8..24, 0i32..2).prop_map(|(job, code)| Step::Exited { job, code }),
        1 => (0u8..24).prop_map(|job| Step::Cancel { job }),
        1 => (0u8..3).prop_map(|node| Step::NodeDown { node }),
        1 => (0u8..3, 4u32..7).prop_map(|(node, gpus)| Step::Register { node, gpus }),
        1 => (0u32..100_000).prop_map(|ms| Step::Tick { ms }),
    ]
}

const QOS: [&str; 5] = ["urgent", "premium", "inference", "training", "batch"];

/// Turns abstract steps into concrete commands, applying them as it goes.
fn drive(steps: &[Step]) -> (ClusterState, Vec<Command>) {
    let mut s = ClusterState::new();
    let mut log = Vec::new();
    // Tight limits, so the generated streams hit them.
    let mut policy = s.policy.clone();
    policy.qos.get_mut("batch").unwrap().preempt_mode = crate::policy::PreemptMode::Suspend;
    for (name, q) in policy.qos.iter_mut() {
        q.grp_gpus = Some(if name == "batch" { 6 } else { 9 });
        q.user_gpus = Some(5);
        q.user_jobs = Some(3);
    }
    policy.partitions.insert(
        "p2".into(),
        crate::policy::Partition {
            name: "p2".into(),
            nodes: ["n2".to_string()].into(),
            selector: Default::default(),
            priority_tier: 3,
            allowed_qos: Default::default(),
            default_qos: None,
            max_wall_s: None,
        },
    );
    let c = Command { now_ms: 0, op: Op::SetPolicy { policy } };
    assert_eq!(s.apply(&c), Outcome::PolicyChanged);
    log.push(c);
    // Start with nodes, so that runs fill them and preemption gets exercised.
    for (node, gpus, model) in [("n0", 6, "H100"), ("n1", 4, "A100"), ("n2", 4, "H100")] {
        let c = Command { now_ms: 0, op: Op::RegisterNode { info: node_info_model(node, gpus, model) } };
        s.apply(&c);
        log.push(c);
    }
    let mut now = 0i64;
    let mut saved = Plan::default();
    for step in steps {
        let job_id = |j: &u8| u64::from(*j) + 1;
        let node_name = |n: &u8| format!("n{n}");
        let op = match step {
            Step::Register { node, gpus } => {
                let model = if *node == 1 { "A100" } else { "H100" };
                Some(Op::RegisterNode { info: node_info_model(&node_name(node), *gpus, model) })
            }
            Step::Hold { job, held } => Some(if *held {
                Op::Hold { job: job_id(job), by: "bob".into() }
            } else {
                Op::Release { job: job_id(job), by: "bob".into() }
            }),
            Step::Submit { gpus, qos, rid, flags } => {
                let mut sp = spec(*gpus, QOS[*qos as usize]);
                sp.time_limit_s = Some(60);
                sp.requeue = gpus % 2 == 0;
                sp.user = if (flags / 128 + qos) % 2 == 0 { "alice".into() } else { "bob".into() };
                // Each constraint on about one job in eight, independently of its size.
                if flags % 8 == 1 {
                    sp.gpu_model = Some("a100".into());
                }
                if (flags / 8) % 8 == 2 {
                    sp.partition = "p2".into();
                }
                if (flags / 64) == 3 {
                    sp.tasks = 2;
                    sp.gpus = 2;
                    // Half the gangs are elastic down to one node.
                    sp.min_tasks = (flags % 2 == 0).then_some(1);
                } else if flags % 4 == 0 && sp.gpus > 1 {
                    sp.min_gpus = Some(sp.gpus / 2);
                }
                sp.suspendable = flags % 3 == 1;
                if flags % 16 == 5 && s.next_job_id > 1 {
                    sp.after_ok = vec![s.next_job_id - 1];
                }
                Some(Op::Submit {
                    spec: sp,
                    request_id: rid.map(|r| format!("r{r}")),
                    hold: false,
                    limits: None,
                })
            }
            Step::Cancel { job } => Some(Op::Cancel { job: job_id(job), by: "bob".into() }),
            Step::Plan => Some(Op::ApplyPlan { plan: plan(&s).plan }),
            Step::SavePlan => {
                saved = plan(&s).plan;
                None
            }
            Step::ApplySaved => Some(Op::ApplyPlan { plan: saved.clone() }),
            Step::Preempt => plan(&s).preemption.map(|p| Op::Preempt {
                preemptor: p.preemptor,
                node: p.node,
                victims: p.victims,
                gpus: p.gpus,
            }),
            Step::Grow => plan(&s).grow.first().map(|g| Op::Resize {
                job: g.job,
                attempt: g.attempt,
                gpus: g.gpus.clone(),
                more: g.more.clone(),
            }),
            Step::Drain => {
                let pending: Vec<u64> =
                    s.jobs.values().filter(|j| j.state == JobState::Pending).map(|j| j.id).collect();
                for job in pending {
                    let c = Command { now_ms: now, op: Op::Cancel { job, by: "ops".into() } };
                    s.apply(&c);
                    log.push(c);
                }
                None
            }
            Step::Forge { job, node, gpus } => {
                // Even-sized forgeries also claim a second task on the next node (gang forgery).
                let more = if gpus.len() % 2 == 0 {
                    vec![crate::model::TaskPlacement {
                        node: node_name(&((node + 1) % 3)),
                        gpus: gpus.clone(),
                    }]
                } else {
                    Vec::new()
                };
                let placement =
                    Placement { job: job_id(job), node: node_name(node), gpus: gpus.clone(), more };
                Some(Op::ApplyPlan { plan: Plan { placements: vec![placement] } })
            }
            Step::RankExited { job, rank, code } => {
                let id = job_id(job);
                s.jobs.get(&id).and_then(|j| {
                    let a = j.allocation.as_ref()?;
                    let (_, node, _) = a.tasks().nth(*rank as usize % a.task_count() as usize)?;
                    Some(Op::JobExited {
                        job: id,
                        attempt: j.attempt,
                        node: node.to_string(),
                        exit: RunExit::Code(*code),
                    })
                })
            }
            Step::Started { job } | Step::Exited { job, .. } => {
                let id = job_id(job);
                s.jobs.get(&id).and_then(|j| j.allocation.as_ref().map(|a| (j.attempt, a.node.clone()))).map(
                    |(attempt, node)| match step {
                        Step::Exited { code, .. } => {
                            Op::JobExited { job: id, attempt, node, exit: RunExit::Code(*code) }
                        }
                        _ => Op::JobStarted { job: id, attempt, node },
                    },
                )
            }
            Step::NodeDown { node } => Some(Op::NodeDown { node: node_name(node), reason: "test".into() }),
            Step::TimeLimit { job } => Some(Op::EnforceTimeLimit { job: job_id(job), attempt: 0 }),
            Step::Tick { ms } => {
                now += i64::from(*ms);
                None
            }
        };
        if let Some(op) = op {
            let c = Command { now_ms: now, op };
            s.apply(&c);
            log.push(c);
            if let Err(e) = s.check_invariants() {
                panic!("invariant broken after {step:?}: {e}");
            }
            check_limits(&s);
        }
    }
    (s, log)
}

/// Policy invariants of the running jobs: QoS limits, dependencies, GPU models.
fn check_limits(s: &ClusterState) {
    use std::collections::BTreeMap;
    let mut qos_gpus: BTreeMap<&str, u32> = BTreeMap::new();
    let mut user_gpus: BTreeMap<(&str, &str), u32> = BTreeMap::new();
    let mut user_jobs: BTreeMap<(&str, &str), u32> = BTreeMap::new();
    for j in s.jobs.values().filter(|j| matches!(j.state, JobState::Running | JobState::Suspended)) {
        // Every running (or suspended) job met its dependencies and runs on GPUs of its model.
        for dep in &j.spec.after_ok {
            assert_eq!(s.jobs[dep].state, JobState::Completed, "job {} started before job {dep}", j.id);
        }
        let alloc = j.allocation.as_ref().unwrap();
        if j.spec.partition == "p2" {
            assert_eq!(alloc.node, "n2", "job {} ran outside its partition", j.id);
        }
        for (_, node, gpus) in alloc.tasks().filter(|(rank, _, _)| !alloc.exits.contains_key(rank)) {
            for g in gpus {
                let model = &s.nodes[node].info.gpus.iter().find(|x| x.index == *g).unwrap().model;
                assert!(
                    crate::model::model_matches(j.spec.gpu_model.as_deref(), model),
                    "job {} on a {model}",
                    j.id
                );
            }
        }
        *qos_gpus.entry(&j.spec.qos).or_default() += j.total_gpus();
        *user_gpus.entry((&j.spec.qos, &j.spec.user)).or_default() += j.total_gpus();
        *user_jobs.entry((&j.spec.qos, &j.spec.user)).or_default() += 1;
    }
    for (qos, used) in qos_gpus {
        assert!(used <= s.policy.qos[qos].grp_gpus.unwrap_or(u32::MAX), "qos {qos} holds {used} GPUs");
    }
    for ((qos, user), used) in user_gpus {
        assert!(used <= s.policy.qos[qos].user_gpus.unwrap_or(u32::MAX), "{user} holds {used} GPUs of {qos}");
    }
    for ((qos, user), used) in user_jobs {
        assert!(used <= s.policy.qos[qos].user_jobs.unwrap_or(u32::MAX), "{user} runs {used} jobs of {qos}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn no_gpu_is_ever_held_by_two_jobs(steps in proptest::collection::vec(step(), 1..80)) {
        let (s, _) = drive(&steps);
        let mut owners = std::collections::BTreeMap::new();
        for job in s.jobs.values().filter(|j| matches!(j.state, JobState::Running | JobState::Suspended)) {
            let a = job.allocation.as_ref().unwrap();
            // Tasks still running; a suspended job's lent GPUs are the preemptor's meanwhile.
            for (_, node, gpus) in a.tasks().filter(|(rank, _, _)| !a.exits.contains_key(rank)) {
                for g in gpus.iter().filter(|g| !a.lent.contains(g)) {
                    prop_assert!(owners.insert((node.to_string(), *g), job.id).is_none(), "GPU {g} of {node} held twice");
                }
            }
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

#[test]
fn a_drained_node_takes_no_work_and_its_jobs_requeue_through_the_checkpoint_path() {
    let mut s = cluster(2);
    let id = start(&mut s, spec(1, "inference"), 0);
    assert!(!s.jobs[&id].spec.requeue);
    let out = s.apply(&cmd(10, Op::DrainNode { node: "n1".into(), reason: "spot notice".into() }));
    assert!(matches!(out, Outcome::NodeDown { .. }), "{out:?}");
    assert_eq!(s.nodes["n1"].state, NodeState::Draining);
    assert_eq!(s.jobs[&id].allocation.as_ref().unwrap().stop, Some(StopReason::Drained));
    // Draining again changes nothing; an agent reconnecting does not undo it.
    assert!(matches!(
        s.apply(&cmd(11, Op::DrainNode { node: "n1".into(), reason: "x".into() })),
        Outcome::Ignored(_)
    ));
    s.apply(&cmd(12, Op::RegisterNode { info: node_info("n1", 2) }));
    assert_eq!(s.nodes["n1"].state, NodeState::Draining);
    // The job checkpoints and exits: requeued (the cluster stopped it), and nothing starts here.
    s.apply(&cmd(13, Op::JobExited { job: id, attempt: 0, node: "n1".into(), exit: RunExit::Code(0) }));
    assert_eq!((s.jobs[&id].state, s.jobs[&id].attempt), (JobState::Pending, 1));
    assert!(plan(&s).plan.placements.is_empty());
    assert!(matches!(
        s.apply(&cmd(14, Op::DrainNode { node: "nope".into(), reason: "x".into() })),
        Outcome::Rejected(Rejection::NotFound(_))
    ));
    s.check_invariants().unwrap();
}

#[test]
fn an_elastic_gang_releases_a_node_for_a_preemptor_and_grows_back_onto_a_free_one() {
    let mut s = ClusterState::new();
    for n in ["n1", "n2", "n3"] {
        s.apply(&cmd(1, Op::RegisterNode { info: node_info(n, 2) }));
    }
    let mut sp = spec(2, "training");
    sp.tasks = 3;
    sp.min_tasks = Some(2);
    let gang =
        submitted(s.apply(&cmd(2, Op::Submit { spec: sp, request_id: None, hold: false, limits: None })));
    run_plan(&mut s, 2);
    let nodes: Vec<String> =
        s.jobs[&gang].allocation.as_ref().unwrap().tasks().map(|(_, n, _)| n.to_string()).collect();
    for n in &nodes {
        s.apply(&cmd(3, Op::JobStarted { job: gang, attempt: 0, node: n.clone() }));
    }
    let urgent = submitted(s.apply(&cmd(
        60_000,
        Op::Submit { spec: spec(2, "urgent"), request_id: None, hold: false, limits: None },
    )));
    let p = preempt(&mut s, 60_000);
    assert_eq!(p.victims, vec![gang]);
    assert_eq!(
        s.jobs[&gang].allocation.as_ref().unwrap().stop,
        Some(StopReason::Resize { by: Some(urgent) })
    );
    assert_eq!(s.preemptions.back().unwrap().action(), "shrink");
    // Every rank checkpoints and exits; the gang comes back on the two nodes it kept.
    for n in &nodes {
        s.apply(&cmd(
            61_000,
            Op::JobExited { job: gang, attempt: 0, node: n.clone(), exit: RunExit::Code(0) },
        ));
    }
    let j = &s.jobs[&gang];
    assert_eq!((j.state, j.attempt, j.tasks()), (JobState::Pending, 1, 2));
    s.check_invariants().unwrap();
    let Outcome::PlanApplied { accepted, .. } = run_plan(&mut s, 61_001) else { panic!() };
    assert_eq!(accepted, vec![urgent, gang]);
    let kept: Vec<&str> = s.jobs[&gang].allocation.as_ref().unwrap().tasks().map(|(_, n, _)| n).collect();
    assert!(!kept.contains(&p.node.as_str()) && kept.len() == 2, "{kept:?} / {}", p.node);
    s.check_invariants().unwrap();
    // Below its minimum it is not preempted again.
    let _ = submitted(s.apply(&cmd(
        62_000,
        Op::Submit { spec: spec(2, "urgent"), request_id: None, hold: false, limits: None },
    )));
    assert!(plan(&s).preemption.is_none(), "2 nodes is its minimum");
    s.apply(&cmd(62_001, Op::Cancel { job: urgent + 1, by: "a".into() }));
    // The urgent job ends: the gang grows back onto the freed node.
    s.apply(&cmd(
        90_000,
        Op::JobExited { job: urgent, attempt: 0, node: p.node.clone(), exit: RunExit::Code(0) },
    ));
    let grow = plan(&s).grow;
    assert_eq!(grow.len(), 1);
    assert_eq!(grow[0].more.len(), 2, "{grow:?}");
    let g = grow[0].clone();
    let op = Op::Resize { job: g.job, attempt: g.attempt, gpus: g.gpus, more: g.more };
    assert!(matches!(s.apply(&cmd(90_001, op.clone())), Outcome::RunUpdated { .. }));
    assert!(matches!(s.apply(&cmd(90_002, op)), Outcome::Rejected(_)), "once");
    s.check_invariants().unwrap();
    let ranks: Vec<String> =
        s.jobs[&gang].allocation.as_ref().unwrap().tasks().map(|(_, n, _)| n.to_string()).collect();
    for n in &ranks {
        s.apply(&cmd(
            91_000,
            Op::JobExited { job: gang, attempt: 1, node: n.clone(), exit: RunExit::Code(0) },
        ));
    }
    let Outcome::PlanApplied { accepted, .. } = run_plan(&mut s, 91_001) else { panic!() };
    assert_eq!(accepted, vec![gang]);
    let j = &s.jobs[&gang];
    assert_eq!((j.attempt, j.tasks(), j.allocation.as_ref().unwrap().task_count()), (2, 3, 3));
    s.check_invariants().unwrap();
}

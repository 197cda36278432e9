//! Submits, holds, dependencies, QoS limits, accounts, partitions and policy changes.

use super::*;

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
    assert!(
        matches!(zero, Outcome::Rejected(Rejection::Invalid(m)) if m.contains("without GPUs asks for at least 1 CPU"))
    );
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
    assert_eq!(s.apply(&cmd(1, Op::SetPolicy { policy, audit: None })), Outcome::PolicyChanged);
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
    assert_eq!(out.pending[&b], crate::reasons::PendingReason::QosGrpGpuLimit);
    assert_eq!(out.pending[&d], crate::reasons::PendingReason::QosGrpGpuLimit);
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
    without_premium.accounts.get_mut("root").unwrap().qos.allowed.remove("premium");
    assert!(matches!(
        s.apply(&cmd(3, Op::SetPolicy { policy: without_premium, audit: None })),
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
        s.apply(&cmd(3, Op::SetPolicy { policy: cyclic, audit: None })),
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
    // Still allowed by the root account: removing it there first (else the list would shrink
    // behind the operator's back).
    assert!(matches!(
        s.apply(&cmd(8, Op::DeleteQos { name: "premium".into() })),
        Outcome::Rejected(Rejection::FailedPrecondition(m)) if m.contains("allowed by account \"root\"")
    ));
    let mut root = s.policy.accounts["root"].clone();
    root.qos.allowed.remove("premium");
    let put = Op::PutPolicyItem { item: crate::policy::PolicyItem::Account(root), must_exist: Some(true) };
    assert_eq!(s.apply(&cmd(8, put)), Outcome::PolicyChanged);
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
    // More of a model than any node has: refused at submit, naming the model.
    sp.gpus = 6;
    sp.gpu_model = Some("H100".into());
    let big = s.apply(&cmd(5, Op::Submit { spec: sp.clone(), request_id: None, hold: false, limits: None }));
    assert!(
        matches!(&big, Outcome::Rejected(Rejection::FailedPrecondition(m)) if m.starts_with("job requests 6 \"H100\" GPUs but the largest node has 4")),
        "{big:?}"
    );
    // With a node of it down, it waits with a reason naming the model.
    sp.gpus = 4;
    s.apply(&cmd(6, Op::NodeDown { node: "h".into(), reason: "silent".into() }));
    let waits =
        submitted(s.apply(&cmd(7, Op::Submit { spec: sp, request_id: None, hold: false, limits: None })));
    assert_eq!(plan(&s).pending[&waits], PendingReason::ReqNodeNotAvail("no up node has H100 GPUs".into()));
}

#[test]
fn a_model_set_places_on_any_of_its_models_and_never_on_another() {
    let mut s = ClusterState::new();
    for (name, model) in [("m16", "Tesla V100M16"), ("m32", "Tesla V100M32"), ("p", "Tesla P100")] {
        s.apply(&cmd(1, Op::RegisterNode { info: node_info_model(name, 1, model) }));
    }
    let mut sp = spec(1, "batch");
    sp.gpu_model = Some("V100M16|V100M32".into());
    let ids: Vec<u64> = (0..3)
        .map(|_| {
            let submit = Op::Submit { spec: sp.clone(), request_id: None, hold: false, limits: None };
            submitted(s.apply(&cmd(2, submit)))
        })
        .collect();
    run_plan(&mut s, 3);
    let nodes: std::collections::BTreeSet<String> =
        ids[..2].iter().map(|id| s.jobs[id].allocation.as_ref().unwrap().node.clone()).collect();
    assert_eq!(nodes, ["m16".to_string(), "m32".to_string()].into());
    // The P100 is free, yet the third waits: it is not in the set.
    assert_eq!(s.jobs[&ids[2]].state, JobState::Pending);
    assert!(s.nodes["p"].allocated.is_empty());
    let forged = Plan { placements: vec![Placement::single(ids[2], "p".into(), vec![0])] };
    let Outcome::PlanApplied { accepted, .. } = s.apply(&cmd(4, Op::ApplyPlan { plan: forged })) else {
        panic!()
    };
    assert!(accepted.is_empty(), "apply placed a V100 set on a P100");
}

#[test]
fn fairshare_favours_the_account_with_less_past_usage() {
    let mut s = cluster(1);
    assert_eq!(
        s.apply(&cmd(1, Op::SetPolicy { policy: two_accounts(), audit: None })),
        Outcome::PolicyChanged
    );
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
    // An answer's priority (its own account's factor only) is the planner's (every account's).
    let all = crate::priority::Prioritizer::new(&s);
    for job in [alice, bob].map(|id| &s.jobs[&id]) {
        let one = crate::priority::Prioritizer::for_account(&s, &job.spec.account);
        assert_eq!(one.priority(job), all.priority(job), "job {}", job.id);
    }
    assert_ne!(all.priority(&s.jobs[&alice]), all.priority(&s.jobs[&bob]), "usage tells them apart");
    let Outcome::PlanApplied { accepted, .. } = run_plan(&mut s, ten_hours) else { panic!() };
    assert_eq!(accepted, vec![bob]);
    assert_eq!(plan(&s).pending[&alice], PendingReason::Resources);
}

#[test]
fn accounts_are_checked_at_submit_and_cannot_vanish_under_jobs() {
    let mut s = cluster(1);
    s.apply(&cmd(1, Op::SetPolicy { policy: two_accounts(), audit: None }));
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
        s.apply(&cmd(3, Op::SetPolicy { policy: without_b, audit: None })),
        Outcome::Rejected(Rejection::FailedPrecondition(m)) if m.contains("account \"b\" is in use")
    ));
    let mut cyclic = two_accounts();
    cyclic.accounts.get_mut("root").unwrap().parent = Some("a".into());
    assert!(matches!(
        s.apply(&cmd(3, Op::SetPolicy { policy: cyclic, audit: None })),
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
        s.apply(&cmd(3, Op::SetPolicy { policy: no_weights, audit: None })),
        Outcome::Rejected(Rejection::Invalid(_))
    ));
}

#[test]
fn partitions_confine_jobs_to_their_nodes_and_apply_their_rules() {
    let mut s = ClusterState::new();
    s.apply(&cmd(1, Op::RegisterNode { info: node_info("n1", 4) }));
    let mut r2 = node_info("n2", 4);
    r2.labels.insert("rack".into(), "r2".into());
    s.apply(&cmd(1, Op::RegisterNode { info: r2 }));
    assert_eq!(
        s.apply(&cmd(1, Op::SetPolicy { policy: with_partition(s.policy.clone()), audit: None })),
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
        s.apply(&cmd(5, Op::SetPolicy { policy: without, audit: None })),
        Outcome::Rejected(Rejection::FailedPrecondition(_))
    ));
}

#[test]
fn clock_never_goes_backwards() {
    let mut s = cluster(1);
    s.apply(&cmd(100, Op::Submit { spec: spec(1, "batch"), request_id: None, hold: false, limits: None }));
    s.apply(&cmd(50, Op::Submit { spec: spec(1, "batch"), request_id: None, hold: false, limits: None }));
    assert_eq!(s.now_ms, 100);
    assert_eq!(s.jobs[&2].submit_time_ms, 100);
}

#[test]
fn accounts_and_partitions_are_put_and_deleted_one_at_a_time_and_validated_whole() {
    use crate::policy::{Account, Partition, PolicyItem, PolicyKind};
    let mut s = cluster(2);
    let account = |name: &str, parent: &str| {
        PolicyItem::Account(Account {
            name: name.into(),
            parent: Some(parent.into()),
            shares: 2,
            users: Default::default(),
            qos: Default::default(),
            user_qos: Default::default(),
            guarantee: None,
        })
    };
    let put =
        |s: &mut ClusterState, item, must_exist| s.apply(&cmd(5, Op::PutPolicyItem { item, must_exist }));
    assert_eq!(put(&mut s, account("vision", "root"), Some(false)), Outcome::PolicyChanged);
    assert!(matches!(
        put(&mut s, account("vision", "root"), Some(false)),
        Outcome::Rejected(Rejection::FailedPrecondition(m)) if m.contains("already exists")
    ));
    assert!(matches!(
        put(&mut s, account("nlp", "root"), Some(true)),
        Outcome::Rejected(Rejection::NotFound(_))
    ));
    // Validated whole: a parent that does not exist is refused and nothing changes.
    let before = s.policy.clone();
    assert!(matches!(
        put(&mut s, account("orphan", "ghost"), None),
        Outcome::Rejected(Rejection::Invalid(_))
    ));
    assert_eq!(s.policy, before);
    // Another piece put meanwhile does not undo the first (no whole-policy read-modify-write).
    let part = PolicyItem::Partition(Partition {
        name: "fast".into(),
        nodes: ["n1".to_string()].into(),
        selector: Default::default(),
        priority_tier: 3,
        allowed_qos: Default::default(),
        default_qos: None,
        max_wall_s: None,
        resources: Default::default(),
        idle_gpu: None,
    });
    assert_eq!(put(&mut s, part, None), Outcome::PolicyChanged);
    assert!(s.policy.accounts.contains_key("vision") && s.policy.partitions.contains_key("fast"));
    // A partition in use cannot be deleted; an unused one can; a missing one is NOT_FOUND.
    let mut sp = spec(1, "batch");
    sp.partition = "fast".into();
    submitted(s.apply(&cmd(6, Op::Submit { spec: sp, request_id: None, hold: true, limits: None })));
    let delete = |s: &mut ClusterState, kind, name: &str| {
        s.apply(&cmd(7, Op::DeletePolicyItem { kind, name: name.into() }))
    };
    assert!(matches!(
        delete(&mut s, PolicyKind::Partition, "fast"),
        Outcome::Rejected(Rejection::FailedPrecondition(m)) if m.contains("in use")
    ));
    assert_eq!(delete(&mut s, PolicyKind::Account, "vision"), Outcome::PolicyChanged);
    assert!(matches!(
        delete(&mut s, PolicyKind::Account, "vision"),
        Outcome::Rejected(Rejection::NotFound(_))
    ));
}

#[test]
fn a_precheck_answers_what_apply_would_without_a_change_and_passes_what_changes() {
    let mut s = cluster(2);
    let running = start(&mut s, spec(1, "batch"), 1);
    let pending = submitted(
        s.apply(&cmd(2, Op::Submit { spec: spec(1, "batch"), request_id: None, hold: true, limits: None })),
    );
    let by = || "alice".to_string();
    // Each case: the precheck, then what apply says on a copy (it must agree).
    let cases: Vec<(Op, Result<Option<Outcome>, ()>)> = vec![
        (Op::Hold { job: running, by: by() }, Err(())),
        (Op::Hold { job: pending, by: by() }, Ok(Some(Outcome::HoldChanged { job: pending, held: true }))),
        (Op::Release { job: pending, by: by() }, Ok(None)),
        (Op::Hold { job: 999, by: by() }, Err(())),
        (Op::Cancel { job: running, by: by() }, Ok(None)),
        (Op::Cancel { job: 999, by: by() }, Err(())),
    ];
    for (op, want) in cases {
        let got = s.precheck(&op);
        let mut copy = s.clone();
        let applied = copy.apply(&cmd(s.now_ms, op.clone()));
        match (&got, &want) {
            (Err(r), Err(())) => assert_eq!(applied, Outcome::Rejected(r.clone()), "{op:?}"),
            (Ok(Some(answer)), Ok(Some(expected))) => {
                assert_eq!(answer, expected, "{op:?}");
                assert_eq!(&applied, answer, "{op:?}");
                assert_eq!(
                    copy, s,
                    "{op:?}: a call answered without the log changed nothing in apply either"
                );
            }
            (Ok(None), Ok(None)) => assert_ne!(copy, s, "{op:?} passed on but changes nothing"),
            _ => panic!("{op:?}: precheck {got:?}, expected {want:?}"),
        }
    }
    // Cancelled once: a second cancel is answered without the log; a finished job is refused.
    s.apply(&cmd(4, Op::Cancel { job: running, by: by() }));
    assert_eq!(
        s.precheck(&Op::Cancel { job: running, by: by() }),
        Ok(Some(Outcome::Cancelled { job: running, was_running: true }))
    );
    s.apply(&cmd(5, Op::Cancel { job: pending, by: by() }));
    assert!(matches!(
        s.precheck(&Op::Cancel { job: pending, by: by() }),
        Err(Rejection::FailedPrecondition(_))
    ));
    assert!(matches!(
        s.precheck(&Op::Release { job: pending, by: by() }),
        Err(Rejection::FailedPrecondition(_))
    ));
}

#[test]
fn a_qos_an_account_does_not_allow_is_refused_naming_the_allowed_ones() {
    use crate::policy::QosAccess;
    let mut s = cluster(4);
    let mut policy = two_accounts();
    // The shipped tree: every QoS but `urgent` at the root. Account b may use urgent too, and
    // defaults to inference; alice alone, in a, may use urgent.
    let b = policy.accounts.get_mut("b").unwrap();
    b.qos = QosAccess {
        allowed: ["urgent", "inference", "training"].map(String::from).into(),
        default: Some("inference".into()),
    };
    assert_eq!(
        s.apply(&cmd(1, Op::SetPolicy { policy: policy.clone(), audit: None })),
        Outcome::PolicyChanged
    );
    let limits = crate::state::quota::SubmitLimits { max_jobs_per_user: 100, max_jobs: 100, any_qos: false };
    let submit = |s: &mut ClusterState, user: &str, qos: &str, limits| {
        let mut sp = spec(1, qos);
        sp.user = user.into();
        s.apply(&cmd(2, Op::Submit { spec: sp, request_id: None, hold: true, limits: Some(limits) }))
    };
    let before = s.clone();
    assert_eq!(
        submit(&mut s, "alice", "urgent", limits),
        Outcome::Rejected(Rejection::PermissionDenied(
            "qos \"urgent\" is not allowed for user \"alice\" in account \"a\" (allowed: batch, inference, interactive, premium, training)"
                .into()
        ))
    );
    assert_eq!(
        (&s.jobs, s.next_job_id),
        (&before.jobs, before.next_job_id),
        "a refused submit changes nothing"
    );
    // bob's account was given urgent; its own list replaces the inherited one.
    let job = submitted(submit(&mut s, "bob", "urgent", limits));
    assert_eq!(s.jobs[&job].spec.qos, "urgent");
    assert!(
        matches!(submit(&mut s, "bob", "batch", limits), Outcome::Rejected(Rejection::PermissionDenied(m)) if m.contains("allowed: inference, training, urgent"))
    );
    // A job naming no QoS gets the account's default (before the profile's).
    let job = submitted(submit(&mut s, "bob", "", limits));
    assert_eq!(s.jobs[&job].spec.qos, "inference");
    // An operator's submit may use any QoS.
    submitted(submit(
        &mut s,
        "alice",
        "urgent",
        crate::state::quota::SubmitLimits { any_qos: true, ..limits },
    ));
    // One user's entry in an account comes before the account's.
    policy.accounts.get_mut("a").unwrap().user_qos.insert(
        "alice".into(),
        QosAccess {
            allowed: ["urgent", "training"].map(String::from).into(),
            default: Some("training".into()),
        },
    );
    assert_eq!(
        s.apply(&cmd(3, Op::SetPolicy { policy: policy.clone(), audit: None })),
        Outcome::PolicyChanged
    );
    let job = submitted(submit(&mut s, "alice", "urgent", limits));
    assert_eq!(s.jobs[&job].spec.qos, "urgent");
    let job = submitted(submit(&mut s, "alice", "", limits));
    assert_eq!(s.jobs[&job].spec.qos, "training");
    assert_eq!(
        s.policy.qos_access("carol", "a"),
        crate::policy::EffectiveQos {
            allowed: Some(
                ["batch", "inference", "interactive", "premium", "training"].map(String::from).into()
            ),
            default: None
        },
        "another user of a inherits the root's list"
    );
    // A policy whose default is not among what the account allows, or names no QoS, is refused.
    let mut bad = policy.clone();
    bad.accounts.get_mut("b").unwrap().qos.default = Some("batch".into());
    assert!(matches!(s.apply(&cmd(4, Op::SetPolicy { policy: bad, audit: None })), Outcome::Rejected(_)));
    let mut bad = policy;
    bad.accounts.get_mut("a").unwrap().qos.allowed.insert("nope".into());
    assert!(matches!(s.apply(&cmd(4, Op::SetPolicy { policy: bad, audit: None })), Outcome::Rejected(_)));
}

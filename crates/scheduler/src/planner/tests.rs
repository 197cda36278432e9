//! Unit tests of the planner's passes.

use super::*;
use crate::state::{Command, Op, Outcome};
use crate::testing::{node_info, spec};

fn state_with(nodes: &[(&str, u32)]) -> ClusterState {
    let mut s = ClusterState::new();
    for (name, gpus) in nodes {
        s.apply(&Command { skipped_ms: 0, now_ms: 1, op: Op::RegisterNode { info: node_info(name, *gpus) } });
    }
    s
}

fn submit(s: &mut ClusterState, gpus: u32, qos: &str) -> JobId {
    match s.apply(&Command {
        skipped_ms: 0,
        now_ms: 2,
        op: Op::Submit { spec: spec(gpus, qos), request_id: None, hold: false, limits: None },
    }) {
        Outcome::Submitted { job } => job,
        other => panic!("submit failed: {other:?}"),
    }
}

#[test]
fn higher_priority_goes_first_then_submit_order() {
    let mut s = state_with(&[("a", 2)]);
    let low = submit(&mut s, 1, "batch");
    let high = submit(&mut s, 1, "inference");
    let high2 = submit(&mut s, 1, "inference");
    let out = plan(&s);
    let jobs: Vec<JobId> = out.plan.placements.iter().map(|p| p.job).collect();
    assert_eq!(jobs, vec![high, high2]);
    assert_eq!(out.pending.get(&low), Some(&PendingReason::Resources));
}

#[test]
fn blocked_job_blocks_lower_ones_but_impossible_one_does_not() {
    let mut s = state_with(&[("a", 4)]);
    let first = submit(&mut s, 3, "batch");
    let big = submit(&mut s, 4, "batch");
    let small = submit(&mut s, 1, "batch");
    // Node "a" loses its GPUs' availability: mark it down so only "b" (2 GPUs) is up.
    s.apply(&Command { skipped_ms: 0, now_ms: 3, op: Op::RegisterNode { info: node_info("b", 2) } });
    s.apply(&Command {
        skipped_ms: 0,
        now_ms: 3,
        op: Op::NodeDown { node: "a".into(), reason: "test".into() },
    });
    let out = plan(&s);
    assert!(matches!(out.pending.get(&first), Some(PendingReason::ReqNodeNotAvail(_))));
    assert!(matches!(out.pending.get(&big), Some(PendingReason::ReqNodeNotAvail(_))));
    assert_eq!(out.plan.placements, vec![Placement::single(small, "b".into(), vec![0])]);

    let mut s = state_with(&[("a", 4)]);
    let first = submit(&mut s, 3, "batch");
    let second = submit(&mut s, 2, "batch");
    let third = submit(&mut s, 1, "batch");
    // Without backfill the blocked job holds back everything behind it.
    let out = plan_with(&s, PlanConfig { backfill: false, ..Default::default() });
    assert_eq!(out.plan.placements.len(), 1);
    assert_eq!(out.plan.placements[0].job, first);
    assert_eq!(out.pending.get(&second), Some(&PendingReason::Resources));
    assert_eq!(out.pending.get(&third), Some(&PendingReason::Priority));
    // With backfill the third job may use the reserved GPU: its limit ends no later than
    // the reservation starts (all have the same 24 h limit).
    let out = plan(&s);
    let placed: Vec<JobId> = out.plan.placements.iter().map(|p| p.job).collect();
    assert_eq!(placed, vec![first, third]);
    let r = out.reservation.unwrap();
    assert_eq!((r.job, r.node.as_str(), r.start_ms), (second, "a", s.now_ms + 24 * 3600 * 1000));
}

#[test]
fn packs_onto_the_tightest_node_and_keeps_link_groups() {
    let mut s = state_with(&[("a", 8), ("b", 8)]);
    let j1 = submit(&mut s, 6, "batch");
    let out = plan(&s);
    assert_eq!(
        s.apply(&Command { skipped_ms: 0, now_ms: 3, op: Op::ApplyPlan { plan: out.plan } }),
        Outcome::PlanApplied { accepted: vec![j1], rejected: vec![] }
    );
    let j2 = submit(&mut s, 2, "batch");
    let out = plan(&s);
    // "a" has 2 free GPUs left: the 2-GPU job goes there, keeping "b" whole.
    assert_eq!(out.plan.placements, vec![Placement::single(j2, "a".into(), vec![6, 7])]);
    // Packing kept node "b" whole: no free GPU is stranded on a partly used node.
    assert_eq!(s.fragmentation(), (10, 8));
    // Four GPUs on an empty 8-GPU node with link groups of 4 come from one group.
    let j3 = submit(&mut s, 4, "batch");
    let mut out = plan(&s);
    out.plan.placements.retain(|p| p.job == j3);
    assert_eq!(out.plan.placements, vec![Placement::single(j3, "b".into(), vec![0, 1, 2, 3])]);
}

#[test]
fn a_whole_node_job_behind_a_preemptor_still_gets_the_reservation() {
    let mut s = state_with(&[("a", 8), ("b", 8), ("c", 8)]);
    let run = |s: &mut ClusterState, gpus: u32, limit_s: u64, node: &str, qos: &str| {
        let mut sp = spec(gpus, qos);
        sp.time_limit_s = Some(limit_s);
        let Outcome::Submitted { job } = s.apply(&Command {
            skipped_ms: 0,
            now_ms: 2,
            op: Op::Submit { spec: sp, request_id: None, hold: false, limits: None },
        }) else {
            panic!("submit failed")
        };
        let plan = Plan { placements: vec![Placement::single(job, node.into(), (0..gpus).collect())] };
        s.apply(&Command { skipped_ms: 0, now_ms: 2, op: Op::ApplyPlan { plan } });
        s.apply(&Command {
            skipped_ms: 0,
            now_ms: 2,
            op: Op::JobStarted { job, attempt: 0, node: node.into() },
        });
        assert_eq!(s.jobs[&job].state, JobState::Running);
    };
    // Only "a" runs preemptible work (inference is never preempted).
    run(&mut s, 8, 3600, "a", "training");
    run(&mut s, 6, 3600, "b", "inference");
    run(&mut s, 6, 7200, "c", "inference");
    let urgent = submit(&mut s, 8, "urgent");
    let mut whole = spec(8, "training");
    whole.time_limit_s = Some(3600);
    let Outcome::Submitted { job: whole } = s.apply(&Command {
        skipped_ms: 0,
        now_ms: 3,
        op: Op::Submit { spec: whole, request_id: None, hold: false, limits: None },
    }) else {
        panic!("submit failed")
    };
    let small = submit(&mut s, 1, "training");
    let out = plan(&s);
    assert_eq!(out.preemption.as_ref().map(|p| (p.preemptor, p.node.as_str())), Some((urgent, "a")));
    // The 8-GPU job waiting behind the preemptor holds node "b" (free soonest) ...
    let r = out.reservation.expect("a reservation for the whole-node job");
    assert_eq!((r.job, r.node.as_str(), r.gpus.len()), (whole, "b", 8));
    assert_eq!(out.pending.get(&whole), Some(&PendingReason::Resources));
    // ... so the long small job keeps off it (before, it was packed onto "b").
    assert_eq!(
        out.plan.placements.iter().map(|p| (p.job, p.node.as_str())).collect::<Vec<_>>(),
        vec![(small, "c")]
    );
}

#[test]
fn training_leaves_the_inference_headroom_free_and_inference_takes_it() {
    let mut s = state_with(&[("a", 4), ("b", 4)]);
    let mut policy = s.policy.clone();
    policy.qos.get_mut("inference").expect("inference qos").headroom_gpus = 2;
    s.apply(&Command { skipped_ms: 0, now_ms: 2, op: Op::SetPolicy { policy, audit: None } });
    let big = submit(&mut s, 4, "training");
    let second = submit(&mut s, 3, "training");
    let small = submit(&mut s, 1, "training");
    let out = plan(&s);
    // 8 GPUs, 2 kept idle: the 4-GPU job fits (4 left), the 3-GPU one would leave 1.
    let placed: Vec<JobId> = out.plan.placements.iter().map(|p| p.job).collect();
    assert_eq!(placed, vec![big, small], "the 1-GPU job leaves 3 free");
    assert_eq!(out.pending.get(&second), Some(&PendingReason::Headroom));
    s.apply(&Command { skipped_ms: 0, now_ms: 3, op: Op::ApplyPlan { plan: out.plan } });
    // A job that could never start outside the headroom (7 > 8 - 2) is not held by it.
    let mut t = state_with(&[("a", 8)]);
    let mut policy = t.policy.clone();
    policy.qos.get_mut("inference").expect("inference qos").headroom_gpus = 2;
    t.apply(&Command { skipped_ms: 0, now_ms: 2, op: Op::SetPolicy { policy, audit: None } });
    let (whole, six) = (submit(&mut t, 8, "training"), submit(&mut t, 6, "training"));
    let out = plan(&t);
    assert_eq!(out.plan.placements.iter().map(|p| p.job).collect::<Vec<_>>(), vec![whole]);
    assert_eq!(out.pending.get(&six), Some(&PendingReason::Headroom), "6 + 2 fit in 8: it waits for them");
    // Inference may use the headroom.
    let inf = submit(&mut s, 2, "inference");
    let out = plan(&s);
    assert_eq!(out.plan.placements.iter().map(|p| p.job).collect::<Vec<_>>(), vec![inf]);
    assert_eq!(out.pending.get(&second), Some(&PendingReason::Headroom));
    // Without headroom the 3-GPU job starts in the GPUs the inference job has not taken.
    let mut policy = s.policy.clone();
    policy.qos.get_mut("inference").expect("inference qos").headroom_gpus = 0;
    s.apply(&Command { skipped_ms: 0, now_ms: 4, op: Op::SetPolicy { policy, audit: None } });
    s.apply(&Command { skipped_ms: 0, now_ms: 4, op: Op::Cancel { job: inf, by: "alice".into() } });
    let out = plan(&s);
    assert_eq!(out.plan.placements.iter().map(|p| p.job).collect::<Vec<_>>(), vec![second]);
}

#[test]
fn a_task_takes_exactly_what_is_free_and_not_one_more() {
    // Node "a": 4 GPUs, 8 CPUs, 16 GiB; a running job holds 1 GPU, 1 CPU and 1 GiB.
    let mut s = ClusterState::new();
    let mut info = node_info("a", 4);
    (info.cpus, info.memory_mib) = (8, 16 << 10);
    s.apply(&Command { skipped_ms: 0, now_ms: 1, op: Op::RegisterNode { info } });
    let with = |s: &mut ClusterState, gpus, cpus, mem_mib| {
        let mut sp = spec(gpus, "batch");
        (sp.cpus, sp.mem_mib) = (cpus, mem_mib);
        let op = Op::Submit { spec: sp, request_id: None, hold: false, limits: None };
        match s.apply(&Command { skipped_ms: 0, now_ms: 2, op }) {
            Outcome::Submitted { job } => job,
            other => panic!("submit failed: {other:?}"),
        }
    };
    with(&mut s, 1, 1, 1 << 10);
    let plan_first = plan(&s).plan;
    s.apply(&Command { skipped_ms: 0, now_ms: 2, op: Op::ApplyPlan { plan: plan_first } });
    for (gpus, cpus, mem, fits) in [
        (3, 7, 15 << 10, true),
        (4, 7, 15 << 10, false),
        (3, 8, 15 << 10, false),
        (3, 7, (15 << 10) + 1, false),
    ] {
        let mut t = s.clone();
        let job = with(&mut t, gpus, cpus, mem);
        let out = plan(&t);
        let placed = out.plan.placements.iter().any(|p| p.job == job);
        assert_eq!(placed, fits, "{gpus} GPUs, {cpus} CPUs, {mem} MiB: {out:?}");
    }
}

#[test]
fn pick_gpus_prefers_one_group() {
    let free = [(1, 0), (2, 0), (4, 1), (5, 1), (6, 1)];
    assert_eq!(pick_gpus(&free, 2), vec![1, 2]);
    assert_eq!(pick_gpus(&free, 3), vec![4, 5, 6]);
    assert_eq!(pick_gpus(&free, 4), vec![1, 2, 4, 5]);
}

//! GPU fractions: packed onto one GPU together up to a whole GPU, never across GPUs, never
//! with a whole-GPU job, only where the QoS shares and never for training.

use super::*;

fn fraction(milli: u32) -> crate::model::JobSpec {
    let mut sp = spec(1, "inference");
    sp.profile = crate::model::Profile::Inference;
    sp.gpu_milli = milli;
    sp
}

fn submit(s: &mut ClusterState, sp: crate::model::JobSpec, now: i64) -> Outcome {
    s.apply(&cmd(now, Op::Submit { spec: sp, request_id: None, hold: false, limits: None }))
}

#[test]
fn four_quarter_fractions_share_one_gpu_a_fifth_and_a_whole_gpu_job_wait() {
    let mut s = cluster(1);
    let ids: Vec<u64> = (0..4).map(|_| start(&mut s, fraction(250), 0)).collect();
    assert_eq!(s.nodes["n1"].shared[&0].len(), 4);
    assert!(s.nodes["n1"].allocated.is_empty(), "a shared GPU is held by no one whole");
    s.check_invariants().unwrap();
    let fifth = submitted(submit(&mut s, fraction(250), 1));
    let whole = submitted(submit(&mut s, spec(1, "batch"), 1));
    let out = plan(&s);
    assert!(out.plan.placements.is_empty(), "{:?}", out.plan);
    assert_eq!(out.pending[&fifth], PendingReason::Resources);
    // A plan putting the whole-GPU job on the shared GPU is refused on apply.
    let forged = Plan { placements: vec![Placement::single(whole, "n1".into(), vec![0])] };
    let Outcome::PlanApplied { accepted, rejected } = s.apply(&cmd(2, Op::ApplyPlan { plan: forged })) else {
        panic!()
    };
    assert!(accepted.is_empty() && rejected[0].1.contains("shared"), "{rejected:?}");
    // One fraction ends: the fifth takes its place; all four end: the GPU is whole again.
    s.apply(&cmd(3, Op::JobExited { job: ids[0], attempt: 0, node: "n1".into(), exit: RunExit::Code(0) }));
    run_plan(&mut s, 4);
    assert_eq!(s.jobs[&fifth].state, JobState::Running);
    assert_eq!(s.jobs[&whole].state, JobState::Pending);
    for id in ids[1..].iter().chain([&fifth]) {
        s.apply(&cmd(5, Op::JobExited { job: *id, attempt: 0, node: "n1".into(), exit: RunExit::Code(0) }));
    }
    assert!(s.nodes["n1"].shared.is_empty());
    run_plan(&mut s, 6);
    assert_eq!(s.jobs[&whole].state, JobState::Running);
    s.check_invariants().unwrap();
}

#[test]
fn fractions_pack_onto_the_fullest_gpu_that_fits_and_never_span_two() {
    let mut s = cluster(2);
    let half = start(&mut s, fraction(500), 0);
    let gpu = s.jobs[&half].allocation.as_ref().unwrap().gpus[0];
    let quarter = start(&mut s, fraction(250), 1);
    assert_eq!(s.jobs[&quarter].allocation.as_ref().unwrap().gpus, vec![gpu], "packed beside the half");
    // 0.4 does not fit beside 0.75: the other GPU, never a bit of each.
    let more = start(&mut s, fraction(400), 2);
    assert_ne!(s.jobs[&more].allocation.as_ref().unwrap().gpus, vec![gpu]);
    // In one pass, several fractions pack too.
    let ids: Vec<u64> = (0..2).map(|_| submitted(submit(&mut s, fraction(300), 3))).collect();
    run_plan(&mut s, 3);
    let other = s.jobs[&more].allocation.as_ref().unwrap().gpus[0];
    for id in ids {
        assert_eq!(s.jobs[&id].allocation.as_ref().unwrap().gpus, vec![other], "job {id}");
    }
    assert_eq!(s.nodes["n1"].shared_milli(other), 1000);
    s.check_invariants().unwrap();
}

#[test]
fn training_and_qos_without_sharing_are_refused_fractions_and_bad_fractions_are_invalid() {
    let mut s = cluster(2);
    let mut training = fraction(250);
    training.qos = "training".into();
    training.profile = crate::model::Profile::Training;
    assert!(matches!(submit(&mut s, training, 1), Outcome::Rejected(Rejection::FailedPrecondition(_))));
    let mut batch = fraction(250);
    batch.qos = "batch".into();
    assert!(matches!(submit(&mut s, batch, 1), Outcome::Rejected(Rejection::FailedPrecondition(_))));
    for bad in [1000, 1500] {
        assert!(matches!(submit(&mut s, fraction(bad), 1), Outcome::Rejected(Rejection::Invalid(_))));
    }
    let mut two = fraction(250);
    two.gpus = 2;
    assert!(matches!(submit(&mut s, two, 1), Outcome::Rejected(Rejection::Invalid(_))));
    assert!(s.jobs.is_empty());
}

#[test]
fn a_fault_of_a_shared_gpu_stops_every_fraction_on_it_and_the_checker_sees_overcommit() {
    let mut s = cluster(1);
    let ids: Vec<u64> = (0..2).map(|_| start(&mut s, fraction(500), 0)).collect();
    let out = s.apply(&cmd(
        1,
        Op::GpuFault { node: "n1".into(), gpu: 0, uuid: String::new(), reason: "XID 79".into() },
    ));
    assert_eq!(out, Outcome::NodeChanged { node: "n1".into(), stopped: ids.clone() });
    s.check_invariants().unwrap();
    for id in &ids {
        s.apply(&cmd(
            2,
            Op::JobExited { job: *id, attempt: 0, node: "n1".into(), exit: RunExit::Signal(15) },
        ));
        assert_eq!(s.jobs[id].state, JobState::Pending);
    }
    assert!(s.nodes["n1"].shared.is_empty());
    assert!(plan(&s).plan.placements.is_empty(), "nothing goes onto the unhealthy GPU");
    // The checker catches fractions past a whole GPU.
    let mut t = cluster(1);
    let a = start(&mut t, fraction(500), 0);
    t.nodes.get_mut("n1").unwrap().shared.get_mut(&0).unwrap().insert(a, 1200);
    assert!(t.check_invariants().is_err());
}

//! A job no registered node could ever hold is refused at submit (CPUs, memory, the GPU model
//! set, a fraction, or all of them at once), naming the largest node's figures; what only the
//! current load or a node that is down prevents waits.

use super::*;
use crate::model::JobSpec;

/// Node "a": 4 H100, 8 CPUs, 16 GiB; node "b": 2 A100, 32 CPUs, 64 GiB.
fn two_nodes() -> ClusterState {
    let mut s = ClusterState::new();
    let mut a = node_info_model("a", 4, "NVIDIA H100 80GB HBM3");
    (a.cpus, a.memory_mib) = (8, 16 << 10);
    let mut b = node_info_model("b", 2, "NVIDIA A100-SXM4-40GB");
    (b.cpus, b.memory_mib) = (32, 64 << 10);
    for info in [a, b] {
        s.apply(&cmd(1, Op::RegisterNode { info }));
    }
    s
}

fn asking(gpus: u32, cpus: u32, mem_mib: u64, model: Option<&str>) -> JobSpec {
    let mut sp = spec(gpus, "batch");
    (sp.cpus, sp.mem_mib, sp.gpu_model) = (cpus, mem_mib, model.map(str::to_string));
    sp
}

fn submit(s: &mut ClusterState, sp: JobSpec, now: i64) -> Outcome {
    s.apply(&cmd(now, Op::Submit { spec: sp, request_id: None, hold: false, limits: None }))
}

/// The refusal's message, after checking that the refusal changed nothing.
fn refused(s: &mut ClusterState, sp: JobSpec) -> String {
    let before = s.clone();
    match submit(s, sp, 5) {
        Outcome::Rejected(Rejection::FailedPrecondition(m)) => {
            let mut after = s.clone();
            after.now_ms = before.now_ms; // the clock alone moves
            assert!(after == before, "a refused submit changes nothing but the clock");
            m
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn a_job_no_registered_node_could_hold_is_refused_naming_the_largest_node() {
    let mut s = two_nodes();
    assert_eq!(
        refused(&mut s, asking(1, 64, 0, None)),
        "job requests 64 CPUs per node but the largest node has 32: node \"b\" (2 GPUs, 32 CPUs, 65536 MiB of memory)"
    );
    assert_eq!(
        refused(&mut s, asking(1, 1, 128 << 10, None)),
        "job requests 131072 MiB of memory per node but the largest node has 65536 MiB: node \"b\" (2 GPUs, 32 CPUs, 65536 MiB of memory)"
    );
    assert_eq!(
        refused(&mut s, asking(1, 0, 0, Some("L40S"))),
        "gpu_model: no node has a GPU of model \"L40S\" (the nodes have NVIDIA H100 80GB HBM3, NVIDIA A100-SXM4-40GB)"
    );
    // A model set counts only its GPUs: two A100s at most.
    assert_eq!(
        refused(&mut s, asking(3, 0, 0, Some("a100|v100"))),
        "job requests 3 \"a100|v100\" GPUs but the largest node has 2: node \"b\" (2 \"a100|v100\" GPUs, 32 CPUs, 65536 MiB of memory)"
    );
    // Each figure fits some node, but none has them all at once.
    let m = refused(&mut s, asking(4, 16, 0, None));
    assert!(m.starts_with("no node has 4 GPUs, 16 CPUs and 0 MiB of memory at once; the largest: "), "{m}");
    assert!(m.contains("node \"a\" (4 GPUs, 8 CPUs") && m.contains("node \"b\" (2 GPUs, 32 CPUs"), "{m}");
    // A fraction needs one GPU of its model.
    let mut fraction = asking(1, 0, 0, Some("L40S"));
    (fraction.gpu_milli, fraction.qos, fraction.profile) =
        (250, "inference".into(), crate::model::Profile::Inference);
    let m = refused(&mut s, fraction.clone());
    assert!(m.starts_with("job requests a fraction of a \"L40S\" GPU but no node has one"), "{m}");
    fraction.gpu_model = Some("H100".into());
    submitted(submit(&mut s, fraction, 6));
    // What fits exactly is taken.
    submitted(submit(&mut s, asking(2, 32, 64 << 10, Some("A100")), 6));
    submitted(submit(&mut s, asking(4, 8, 16 << 10, None), 6));
    s.check_invariants().unwrap();
}

#[test]
fn what_only_load_or_a_node_down_prevents_waits_and_nothing_is_refused_before_any_node() {
    // Before any node registered: nothing to judge by, as with the GPU count.
    let mut empty = ClusterState::new();
    submitted(submit(&mut empty, asking(1, 64, 1 << 20, Some("L40S")), 2));

    let mut s = two_nodes();
    let big = submitted(submit(&mut s, asking(1, 32, 0, None), 2));
    run_plan(&mut s, 3);
    assert_eq!(s.jobs[&big].state, JobState::Running);
    // Node "b"'s CPUs are held: the next such job waits for them.
    let next = submitted(submit(&mut s, asking(1, 32, 0, None), 4));
    assert!(
        matches!(plan(&s).pending[&next], PendingReason::ResourcesShort("CPUs")),
        "{:?}",
        plan(&s).pending[&next]
    );
    // A node that is down is still registered: a job only it could hold waits for it.
    s.apply(&cmd(5, Op::NodeDown { node: "b".into(), reason: "silent".into() }));
    let waits = submitted(submit(&mut s, asking(1, 0, 32 << 10, None), 6));
    assert!(matches!(plan(&s).pending[&waits], PendingReason::ReqNodeNotAvail(_)));
    // Once it is removed, what only it could hold is refused.
    for id in [big, next, waits] {
        s.apply(&cmd(7, Op::Cancel { job: id, by: "alice".into() }));
    }
    assert!(matches!(s.apply(&cmd(8, Op::RemoveNode { node: "b".into() })), Outcome::NodeRemoved { .. }));
    let m = refused(&mut s, asking(1, 0, 32 << 10, None));
    assert!(m.contains("the largest node has 16384 MiB: node \"a\""), "{m}");
    s.check_invariants().unwrap();
}

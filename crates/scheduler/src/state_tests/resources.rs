//! CPUs and memory beside GPUs: placement, the pending reason, preemption for CPUs, the
//! partition's defaults and maxima, and OUT_OF_MEMORY.

use super::*;
use crate::model::{CpuMem, RunUsage};

/// One node with 4 GPUs, 8 CPUs and 16 GiB.
fn small_node() -> ClusterState {
    let mut s = ClusterState::new();
    let mut info = node_info("n1", 4);
    info.cpus = 8;
    info.memory_mib = 16 << 10;
    s.apply(&cmd(1, Op::RegisterNode { info }));
    s
}

fn with(gpus: u32, cpus: u32, mem_mib: u64, qos: &str) -> crate::model::JobSpec {
    let mut sp = spec(gpus, qos);
    sp.cpus = cpus;
    sp.mem_mib = mem_mib;
    sp
}

fn submit(s: &mut ClusterState, sp: crate::model::JobSpec, now: i64) -> u64 {
    submitted(s.apply(&cmd(now, Op::Submit { spec: sp, request_id: None, hold: false, limits: None })))
}

#[test]
fn cpus_and_memory_bind_placement_and_the_reason_names_the_short_one() {
    let mut s = small_node();
    let big = start(&mut s, with(1, 6, 1024, "batch"), 10);
    assert_eq!(s.nodes["n1"].held[&big], CpuMem { cpus: 6, mem_mib: 1024 });
    let cpu_short = submit(&mut s, with(1, 4, 1024, "batch"), 11);
    let out = plan(&s);
    assert!(out.plan.placements.is_empty(), "3 GPUs are free but only 2 CPUs: {out:?}");
    assert_eq!(out.pending[&cpu_short], PendingReason::ResourcesShort("CPUs"));
    assert_eq!(out.pending[&cpu_short].to_string(), "Resources: not enough free CPUs");
    // A forced placement is refused by apply's one grant check.
    let forced = Plan { placements: vec![Placement::single(cpu_short, "n1".into(), vec![3])] };
    let refused = s.apply(&cmd(12, Op::ApplyPlan { plan: forced }));
    assert!(format!("{refused:?}").contains("CPUs free"), "{refused:?}");
    s.apply(&cmd(13, Op::Cancel { job: cpu_short, by: "a".into() }));
    let mem_short = submit(&mut s, with(1, 1, (15 << 10) + 1, "batch"), 14);
    assert_eq!(plan(&s).pending[&mem_short], PendingReason::ResourcesShort("memory"));
    // Asking more than any node has: never, refused at submit.
    let never = s.apply(&cmd(
        15,
        Op::Submit { spec: with(1, 9, 0, "batch"), request_id: None, hold: false, limits: None },
    ));
    assert!(
        matches!(&never, Outcome::Rejected(Rejection::FailedPrecondition(w)) if w.contains("9 CPUs")),
        "{never:?}"
    );
    // The big job ends: its CPUs and memory are free again, and the waiting one starts.
    s.apply(&cmd(20, Op::JobExited { job: big, attempt: 0, node: "n1".into(), exit: RunExit::Code(0) }));
    assert!(s.nodes["n1"].held.is_empty());
    run_plan(&mut s, 21);
    assert_eq!(s.jobs[&mem_short].state, JobState::Running);
    s.check_invariants().unwrap();
}

#[test]
fn a_cpu_only_job_runs_beside_a_node_full_of_gpu_work() {
    let mut s = small_node();
    let gpus = start(&mut s, with(4, 2, 0, "batch"), 10);
    let cpu = submit(&mut s, with(0, 2, 0, "batch"), 11);
    let ops = crate::propose::propose(&s, 12, &Default::default(), 60);
    assert!(
        ops.iter().any(|op| matches!(op, Op::ApplyPlan { .. })),
        "the leader plans with no GPU free: {ops:?}"
    );
    run_plan(&mut s, 12);
    let a = s.jobs[&cpu].allocation.as_ref().expect("placed");
    assert!(a.gpus.is_empty());
    assert_eq!(s.jobs_on("n1").iter().map(|j| j.id).collect::<Vec<_>>(), vec![gpus, cpu]);
    s.check_invariants().unwrap();
}

#[test]
fn urgent_work_preempts_for_the_cpus_it_lacks_even_with_gpus_free() {
    let mut s = small_node();
    let hog = start(&mut s, with(1, 8, 0, "training"), 10);
    let urgent = submit(&mut s, with(1, 4, 0, "urgent"), 1_000_000);
    let p = plan(&s).preemption.expect("a preemption for CPUs");
    assert_eq!(p.victims, vec![hog]);
    assert!(!p.gpus.contains(&s.jobs[&hog].allocation.as_ref().unwrap().gpus[0]), "free GPUs first: {p:?}");
    let out = s.apply(&cmd(
        1_000_001,
        Op::Preempt { preemptor: urgent, node: p.node, victims: p.victims, gpus: p.gpus },
    ));
    assert!(matches!(out, Outcome::Preempted { .. }), "{out:?}");
    s.apply(&cmd(
        1_000_002,
        Op::JobExited { job: hog, attempt: 0, node: "n1".into(), exit: RunExit::Signal(15) },
    ));
    run_plan(&mut s, 1_000_003);
    assert_eq!(s.jobs[&urgent].state, JobState::Running);
    s.check_invariants().unwrap();
}

#[test]
fn partition_defaults_fill_in_and_its_maxima_refuse() {
    let mut s = small_node();
    let mut policy = s.policy.clone();
    let part = policy.partitions.get_mut("default").unwrap();
    part.resources.def_cpus_per_gpu = Some(2);
    part.resources.def_mem_per_gpu_mib = Some(1024);
    part.resources.max_cpus_per_node = Some(6);
    assert!(matches!(s.apply(&cmd(2, Op::SetPolicy { policy, audit: None })), Outcome::PolicyChanged));
    let id = submit(&mut s, with(2, 0, 0, "batch"), 3);
    assert_eq!(s.jobs[&id].spec.cpu_mem(), CpuMem { cpus: 4, mem_mib: 2048 }, "2 GPUs × the defaults");
    let own = submit(&mut s, with(2, 1, 0, "batch"), 4);
    assert_eq!(s.jobs[&own].spec.cpus, 1, "a job's own request wins");
    let out = s.apply(&cmd(
        5,
        Op::Submit { spec: with(4, 0, 0, "batch"), request_id: None, hold: false, limits: None },
    ));
    assert!(format!("{out:?}").contains("maximum of 6"), "{out:?}");
}

#[test]
fn an_exit_after_the_oom_killer_struck_ends_out_of_memory_and_history_keeps_the_usage() {
    let mut s = small_node();
    let id = start(&mut s, with(1, 1, 256, "batch"), 10);
    let usage = RunUsage { max_rss_kib: 262_144, cpu_ms: 1500, oom_kills: 1, ..Default::default() };
    s.apply(&cmd(11, Op::RunUsage { job: id, attempt: 0, node: "n1".into(), usage }));
    s.apply(&cmd(12, Op::JobExited { job: id, attempt: 0, node: "n1".into(), exit: RunExit::Signal(9) }));
    let job = &s.jobs[&id];
    assert_eq!(job.state, JobState::OutOfMemory);
    assert!(job.reason.contains("256 MiB"), "{}", job.reason);
    let r = crate::state::history::JobRecord::of(job, 0);
    assert_eq!((r.req_cpus, r.req_mem_mib, r.used.max_rss_kib, r.used.cpu_ms), (1, 256, 262_144, 1500));
    // Without the OOM killer the same signal is a plain failure.
    let other = start(&mut s, with(1, 1, 256, "batch"), 20);
    s.apply(&cmd(21, Op::JobExited { job: other, attempt: 0, node: "n1".into(), exit: RunExit::Signal(9) }));
    assert_eq!(s.jobs[&other].state, JobState::Failed);
}

#[test]
fn the_property_checker_catches_a_node_handing_out_more_cpus_than_it_has() {
    let mut s = small_node();
    let id = start(&mut s, with(1, 4, 0, "batch"), 10);
    crate::testing::driver::check_limits(&s);
    s.nodes.get_mut("n1").unwrap().held.insert(id, CpuMem { cpus: 9, mem_mib: 0 });
    let caught = std::panic::catch_unwind(|| crate::testing::driver::check_limits(&s));
    assert!(caught.is_err(), "9 CPUs held of 8 must fail the check");
}

#[test]
fn fairshare_charges_cpus_and_memory_at_their_billing_weights() {
    let charged = |billing: crate::policy::BillingWeights| {
        let mut s = small_node();
        let mut policy = s.policy.clone();
        policy.weights.billing = billing;
        assert!(matches!(s.apply(&cmd(2, Op::SetPolicy { policy, audit: None })), Outcome::PolicyChanged));
        let id = start(&mut s, with(1, 4, 2048, "batch"), 10);
        s.apply(&cmd(1010, Op::JobExited { job: id, attempt: 0, node: "n1".into(), exit: RunExit::Code(0) }));
        let account = s.jobs[&id].spec.account.clone();
        s.usage[&account].gpu_ms
    };
    use crate::policy::BillingWeights;
    assert_eq!(charged(BillingWeights::default()), 1000, "1 GPU for 1 s: GPUs only by default");
    // + 4 CPUs at 0.25 and 2 GiB at 0.5: 1 + 1 + 1 = 3 GPU-equivalents for 1 s.
    assert_eq!(charged(BillingWeights { gpu_milli: 1000, cpu_milli: 250, mem_gb_milli: 500 }), 3000);
    let mut s = small_node();
    let mut policy = s.policy.clone();
    policy.weights.billing = BillingWeights { gpu_milli: 0, cpu_milli: 0, mem_gb_milli: 0 };
    assert!(
        matches!(s.apply(&cmd(2, Op::SetPolicy { policy, audit: None })), Outcome::Rejected(_)),
        "nothing charged at all"
    );
}

#[test]
fn usage_adds_up_over_attempts_and_ranks_and_an_earlier_attempt_s_oom_is_not_the_current_one_s() {
    let mut s = small_node();
    let id = start(&mut s, with(1, 1, 256, "batch"), 10);
    let gpu = |busy, max, mem| RunUsage {
        cpu_ms: 1000,
        wall_ms: 10_000,
        gpu_ms: 10_000,
        gpu_busy_ms: busy,
        gpu_util_max_pct: max,
        gpu_util_p95_pct: max,
        gpu_mem_max_mib: mem,
        gpu_mem_device_mib: 81_920,
        samples: 10,
        ..Default::default()
    };
    let first = RunUsage { oom_kills: 1, max_rss_kib: 100, ..gpu(8_000, 80, 30_000) };
    s.apply(&cmd(11, Op::RunUsage { job: id, attempt: 0, node: "n1".into(), usage: first }));
    // The first attempt ends on a GPU fault: requeued, then runs again.
    s.apply(&cmd(
        12,
        Op::GpuFault { node: "n1".into(), gpu: 0, uuid: "GPU-n1-0".into(), reason: "XID 79".into() },
    ));
    s.apply(&cmd(13, Op::JobExited { job: id, attempt: 0, node: "n1".into(), exit: RunExit::Signal(15) }));
    assert_eq!((s.jobs[&id].state, s.jobs[&id].attempt), (JobState::Pending, 1));
    super::run_plan(&mut s, 14);
    let second = RunUsage { max_rss_kib: 50, ..gpu(0, 3, 1_000) };
    s.apply(&cmd(15, Op::RunUsage { job: id, attempt: 1, node: "n1".into(), usage: second }));
    s.apply(&cmd(16, Op::JobExited { job: id, attempt: 1, node: "n1".into(), exit: RunExit::Code(1) }));
    let job = &s.jobs[&id];
    assert_eq!(job.state, JobState::Failed, "attempt 0's OOM kill is not attempt 1's: {}", job.reason);
    let u = job.usage.unwrap();
    assert_eq!((u.cpu_ms, u.wall_ms, u.gpu_ms, u.gpu_busy_ms, u.samples), (2000, 20_000, 20_000, 8_000, 20));
    assert_eq!((u.gpu_util_max_pct, u.gpu_mem_max_mib, u.max_rss_kib, u.oom_kills), (80, 30_000, 100, 0));
}

#[test]
fn a_run_s_usage_record_in_the_log_stays_under_256_bytes() {
    // A week on 8 GPUs and 64 cores, sampled every 10 s, on a node with a long name.
    let week_ms = 7 * 24 * 3_600_000;
    let usage = RunUsage {
        max_rss_kib: 512 << 20,
        cpu_ms: 64 * week_ms,
        oom_kills: 0,
        oom_attempt: 0,
        wall_ms: week_ms,
        gpu_ms: 8 * week_ms,
        gpu_busy_ms: 8 * week_ms - 1,
        gpu_util_max_pct: 100,
        gpu_util_p95_pct: 99,
        gpu_mem_max_mib: 143_771,
        gpu_mem_device_mib: 143_771,
        samples: (week_ms / 10_000) as u32,
    };
    let op = Op::RunUsage { job: 1 << 40, attempt: 12, node: "gpu-h200-rack12-node034".into(), usage };
    let bytes = serde_json::to_vec(&cmd(1_800_000_000_000, op)).unwrap();
    assert!(bytes.len() < 256, "{} bytes: {}", bytes.len(), String::from_utf8_lossy(&bytes));
}

#[test]
fn usage_recorded_under_the_earlier_names_still_reads() {
    let old: RunUsage = serde_json::from_str(r#"{"max_rss_kib":5,"cpu_ms":6,"oom_kills":1}"#).unwrap();
    assert_eq!((old.max_rss_kib, old.cpu_ms, old.oom_kills, old.gpu_ms), (5, 6, 1, 0));
    let record: crate::state::history::JobRecord = serde_json::from_str(
        r#"{"id":1,"name":"","user":"u","account":"a","partition":"p","qos":"q","state":"Completed",
            "reason":"","exit_code":0,"signal":null,"gpus":1,"node":"n","submit_ms":0,"start_ms":1,
            "end_ms":2,"attempts":1,"preemptions":0,"gpu_seconds":0,"max_rss_kib":7,"cpu_ms":8}"#,
    )
    .unwrap();
    assert_eq!((record.used.max_rss_kib, record.used.cpu_ms, record.time_limit_s), (7, 8, 0));
}

//! `kairos-bench schedule`: full planning passes of the pure core on a large synthetic
//! cluster (its state built through the commands a cluster applies), the plan's apply, and the
//! state's memory.

use std::time::Instant;

use anyhow::{bail, Context};
use serde_json::json;

fn rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kb: f64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    (kb / 1024.0).round()
}

/// Builds the state through the same commands a cluster applies, then times `plan`.
/// Node `n` of the schedule benchmark: `gpus` GPUs in link groups of 4, every fifth node A100s.
fn bench_node(n: u32, gpus: u32) -> kairos_scheduler::NodeInfo {
    let gpus = (0..gpus)
        .map(|i| kairos_scheduler::Gpu {
            index: i,
            uuid: format!("GPU-{n}-{i}"),
            model: if n.is_multiple_of(5) { "A100".into() } else { "H100".into() },
            memory_mib: 81920,
            link_group: i / 4,
            mig_parent: None,
        })
        .collect();
    kairos_scheduler::NodeInfo {
        name: format!("node-{n:05}"),
        addr: format!("10.0.{}.{}:7101", n / 256, n % 256),
        gpus,
        cpus: 128,
        memory_mib: 1 << 20,
        labels: Default::default(),
        gpu_backend: "fake".into(),
        isolation: String::new(),
    }
}

/// Running jobs for the schedule benchmark: placed GPU by GPU across the nodes with explicit
/// plans (under no QoS limit, so the setup is not refused by one); how many were placed.
fn place_running(
    state: &mut kairos_scheduler::ClusterState,
    nodes: u32,
    gpus_per_node: u32,
    running: u32,
    spec: &dyn Fn(u32, u32) -> kairos_scheduler::JobSpec,
    now: i64,
) -> u32 {
    use kairos_scheduler::{Command, Op, Placement, Plan};
    let mut apply = |op: Op| state.apply(&Command { skipped_ms: 0, now_ms: now, op });
    let mut placements = Vec::new();
    let (mut node, mut gpu) = (0u32, 0u32);
    let mut placed = 0u32;
    for i in 0..running {
        let want = [1, 1, 2, 1][(i % 4) as usize].min(gpus_per_node);
        if gpu + want > gpus_per_node {
            node += 1;
            gpu = 0;
        }
        if node >= nodes {
            break;
        }
        let mut sp = spec(i, want);
        sp.gpu_model = None;
        sp.qos = "premium".into();
        if let kairos_scheduler::Outcome::Submitted { job } =
            apply(Op::Submit { spec: sp, request_id: None, hold: false, limits: None })
        {
            placements.push(Placement::single(job, format!("node-{node:05}"), (gpu..gpu + want).collect()));
            placed += 1;
        }
        gpu += want;
        if placements.len() == 1000 {
            apply(Op::ApplyPlan { plan: Plan { placements: std::mem::take(&mut placements) } });
        }
    }
    apply(Op::ApplyPlan { plan: Plan { placements } });
    placed
}

/// Submits the schedule bench's `pending` jobs (ids after the `running` ones); with `fractions`,
/// one-GPU inference jobs ask 100, 250 or 500 thousandths. Returns how many asked a fraction.
fn submit_pending(
    state: &mut kairos_scheduler::ClusterState,
    running: u32,
    pending: u32,
    gpus_per_node: u32,
    fractions: bool,
    spec: &dyn Fn(u32, u32) -> kairos_scheduler::JobSpec,
    now: i64,
) -> anyhow::Result<u32> {
    use kairos_scheduler::{Command, Op, Profile};
    let mut fractional = 0u32;
    for i in 0..pending {
        let gpus = if i.is_multiple_of(16) {
            0
        } else {
            [1, 1, 2, 4, 8, 1, 2, 8][(i % 8) as usize].min(gpus_per_node)
        };
        let mut spec = spec(running + i, gpus);
        let fraction = fractions && gpus == 1 && spec.profile == Profile::Inference;
        if fraction {
            spec.gpu_milli = [100, 250, 500][(i % 3) as usize];
        }
        let outcome = state.apply(&Command {
            skipped_ms: 0,
            now_ms: now,
            op: Op::Submit { spec, request_id: None, hold: false, limits: None },
        });
        if fraction {
            anyhow::ensure!(
                matches!(outcome, kairos_scheduler::Outcome::Submitted { .. }),
                "a fractional inference job was refused: {outcome:?}"
            );
            fractional += 1;
        }
    }
    Ok(fractional)
}

/// Job `i` of the schedule benchmark, asking `gpus` GPUs: training, inference and batch in
/// turn, from 200 users, with time limits, every 17th on A100s.
fn schedule_job(i: u32, gpus: u32) -> kairos_scheduler::JobSpec {
    use kairos_scheduler::{JobSpec, Profile};
    let profiles =
        [("training", Profile::Training), ("inference", Profile::Inference), ("batch", Profile::Batch)];
    let (qos, profile) = profiles[(i % 3) as usize];
    let mut spec =
        JobSpec::new(&format!("job-{i}"), &format!("user-{}", i % 200), vec!["train.py".into()], gpus);
    spec.qos = qos.into();
    spec.profile = profile;
    spec.time_limit_s = Some(600 + u64::from(i % 3600));
    spec.gpu_model = i.is_multiple_of(17).then(|| "A100".to_string());
    // CPUs and memory beside the GPUs (nodes have 128 CPUs and 1 TiB): data-loading-heavy
    // jobs ask 16 CPUs per GPU, the rest 12; 64 GiB per GPU; every 16th pending job is
    // CPU-only (4 CPUs, 16 GiB).
    let gpus = spec.gpus;
    spec.cpus = if gpus == 0 { 4 } else { gpus * if i.is_multiple_of(7) { 16 } else { 12 } };
    spec.mem_mib = if gpus == 0 { 16 << 10 } else { u64::from(gpus) * (64 << 10) };
    spec
}

/// Fragmentation after applying one pass: free GPUs stranded on partly used nodes (free, on
/// whole nodes). Applying that pass's plan (what every replica does with it) is timed too (ms).
fn after_one_pass(state: &kairos_scheduler::ClusterState, now: i64) -> (u32, u32, f64) {
    use kairos_scheduler::{Command, Op};
    let mut after = state.clone();
    let plan = kairos_scheduler::plan(state).plan;
    let t0 = Instant::now();
    after.apply(&Command { skipped_ms: 0, now_ms: now, op: Op::ApplyPlan { plan } });
    let apply_ms = t0.elapsed().as_secs_f64() * 1000.0;
    let (free, whole) = after.fragmentation();
    (free, whole, apply_ms)
}

/// `passes` planning passes over `state` with `config`: each one's time (ms), sorted, and the
/// last one's output.
fn timed_passes(
    state: &kairos_scheduler::ClusterState,
    passes: usize,
    config: kairos_scheduler::PlanConfig,
) -> anyhow::Result<(Vec<f64>, kairos_scheduler::PlanOutput)> {
    let mut times = Vec::new();
    let mut last = None;
    for _ in 0..passes {
        let t0 = Instant::now();
        let out = kairos_scheduler::plan_with(state, config);
        times.push(t0.elapsed().as_secs_f64() * 1000.0);
        last = Some(out);
    }
    times.sort_by(|a, b| a.total_cmp(b));
    Ok((times, last.context("no pass ran")?))
}

pub(crate) fn bench_schedule(
    nodes: u32,
    gpus_per_node: u32,
    pending: u32,
    running: u32,
    passes: usize,
    fractions: bool,
    racks: u32,
) -> anyhow::Result<serde_json::Value> {
    use kairos_scheduler::{ClusterState, Command, Op};
    let rss_before = rss_mb();
    let mut state = ClusterState::new();
    let now = 1_000_000i64;
    let apply = |state: &mut ClusterState, op: Op| state.apply(&Command { skipped_ms: 0, now_ms: now, op });
    let per_rack = nodes.div_ceil(racks.max(1));
    for n in 0..nodes {
        let mut info = bench_node(n, gpus_per_node);
        if racks > 0 {
            info.labels.insert("rack".into(), format!("r{}", n / per_rack));
        }
        apply(&mut state, Op::RegisterNode { info });
    }
    if racks > 0 {
        let topology =
            kairos_scheduler::topology::Topology { levels: vec!["rack".into()], ..Default::default() };
        apply(&mut state, Op::SetTopology { topology });
    }
    let placed = place_running(&mut state, nodes, gpus_per_node, running, &schedule_job, now);
    let fractional =
        submit_pending(&mut state, running, pending, gpus_per_node, fractions, &schedule_job, now)?;
    // The controller's memory for this state (before any copy of it), per job.
    let rss_state = rss_mb();
    let jobs = state.jobs.len().max(1) as f64;
    let bytes_per_job = ((rss_state - rss_before).max(0.0) * 1024.0 * 1024.0 / jobs).round();
    let (free, whole, apply_ms) = after_one_pass(&state, now);
    // The leader's pass (`propose`: the plan only), then the read paths' (every pending job's
    // reason too, once per applied index): the same plan, or the bench says so.
    let (times, out) = timed_passes(&state, passes, kairos_scheduler::PlanConfig::LEADER)?;
    let (read_times, read) = timed_passes(&state, passes, kairos_scheduler::PlanConfig::default())?;
    if read.plan != out.plan || read.preemption != out.preemption || read.reservation != out.reservation {
        bail!("the pass with reasons planned differently from the leader's");
    }
    Ok(json!({
        "bench": "schedule",
        "nodes": nodes,
        "gpus_per_node": gpus_per_node,
        "cpus_per_node": 128,
        "memory_mib_per_node": 1 << 20,
        "running": placed,
        "pending": pending,
        "pending_fractions": fractional,
        "racks": racks,
        "pass_ms_p50": (times[times.len() / 2] * 10.0).round() / 10.0,
        "pass_ms_max": (times[times.len() - 1] * 10.0).round() / 10.0,
        "pass_with_reasons_ms_p50": (read_times[read_times.len() / 2] * 10.0).round() / 10.0,
        "reasons": read.pending.len(),
        "placed": out.plan.placements.len(),
        "reservation": out.reservation.is_some(),
        "apply_plan_ms": (apply_ms * 10.0).round() / 10.0,
        "free_gpus_after_pass": free,
        "free_gpus_on_whole_nodes": whole,
        "rss_mb": rss_mb(),
        "state_rss_mb": rss_state,
        "bytes_per_job": bytes_per_job,
    }))
}

//! What a what-if costs (`kairos policy what-if`, `kairos sim --history`): a synthetic history
//! of `jobs` jobs over `days` days on `nodes` nodes of `gpus` GPUs — training (1–8 GPUs, up to
//! 12 h), inference (1–2 GPUs, up to 30 min), whole-node gangs of 2–4 nodes, in five accounts,
//! arrivals following the day — written as a history trace, read back, and replayed once
//! through the production core. Reports the file's size, the time to read it, the replay's
//! wall and CPU time (one thread), and the process's peak memory.

use std::time::Instant;

use kairos_sim::history::{HistoryJob, HistoryTrace, NodeShape, Recorded, Window};
use serde_json::json;

/// A small deterministic generator (no dependency, same numbers every run).
struct Draw(u64);

impl Draw {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [lo, hi].
    fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

/// The synthetic history.
pub fn synthetic(jobs: u32, days: u32, nodes: u32, gpus: u32) -> HistoryTrace {
    const T0: i64 = 1_780_000_000_000;
    let span_ms = i64::from(days.max(1)) * 86_400_000;
    let mut d = Draw(53);
    let mut out = Vec::with_capacity(jobs as usize);
    for id in 0..u64::from(jobs) {
        // Arrivals: uniform over the window, twice as dense in the day's working half.
        let mut at = (d.next() % span_ms as u64) as i64;
        if d.next().is_multiple_of(3) {
            at = at - at % 86_400_000 + 8 * 3_600_000 + (d.next() % (12 * 3_600_000)) as i64;
        }
        let kind = d.next() % 100;
        let (qos, gpus_per_task, tasks, work_s) = if kind < 35 {
            ("inference", d.between(1, 2) as u32, 1, d.between(60, 1800))
        } else if kind < 38 {
            ("training", gpus, d.between(2, 4) as u32, d.between(1800, 6 * 3600))
        } else {
            ("training", 1 << d.between(0, 3), 1, d.between(600, 12 * 3600))
        };
        let account = format!("team{}", d.next() % 5);
        out.push(HistoryJob {
            id: id + 1,
            name: format!("job-{id}"),
            user: account.clone(),
            account: String::new(),
            qos: qos.into(),
            profile: qos.into(),
            submit_ms: T0 + at.min(span_ms - 1),
            work_ms: work_s as i64 * 1000,
            gpus: gpus_per_task.min(gpus),
            tasks,
            requeue: true,
            checkpoint_on_signal: d.next().is_multiple_of(2),
            stop_ms: 5_000,
            recorded: Recorded { state: "COMPLETED".into(), ..Recorded::default() },
            ..HistoryJob::default()
        });
    }
    out.sort_by_key(|j| (j.submit_ms, j.id));
    let shape = |i: u32| NodeShape {
        name: format!("n{i:05}"),
        gpus,
        gpu_model: "H100".into(),
        cpus: 128,
        memory_mib: 1 << 20,
        labels: Default::default(),
    };
    HistoryTrace {
        window: Window { from_ms: T0, to_ms: T0 + span_ms, ..Window::default() },
        nodes: (0..nodes).map(shape).collect(),
        node_events: Vec::new(),
        jobs: out,
    }
}

/// Peak resident memory of this process (KiB).
fn peak_rss_kib() -> i64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes one rusage into the buffer it is given.
    unsafe {
        libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr());
        usage.assume_init().ru_maxrss
    }
}

pub fn run(jobs: u32, days: u32, nodes: u32, gpus: u32) -> anyhow::Result<serde_json::Value> {
    let trace = synthetic(jobs, days, nodes, gpus);
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("history.jsonl");
    std::fs::write(&file, trace.to_jsonl())?;
    drop(trace);
    let read = Instant::now();
    let text = std::fs::read_to_string(&file)?;
    let trace = HistoryTrace::parse("history.jsonl", &text)?;
    let read_s = read.elapsed().as_secs_f64();
    drop(text);
    let policy = kairos_sim::replay_policy();
    let cpu_before = crate::cpu::used(std::process::id()).unwrap_or_default();
    let wall = Instant::now();
    let replay = kairos_sim::simulate_history(&trace, &policy, &kairos_sim::SimConfig::default());
    let replay_s = wall.elapsed().as_secs_f64();
    let cpu_s =
        crate::cpu::used(std::process::id()).unwrap_or_default().saturating_sub(cpu_before).as_secs_f64();
    let r = replay.report.rounded();
    Ok(json!({
        "bench": "replay",
        "jobs": jobs,
        "days": days,
        "nodes": nodes,
        "gpus": nodes * gpus,
        "trace_mb": (std::fs::metadata(&file)?.len() as f64 / 1e6 * 10.0).round() / 10.0,
        "read_s": (read_s * 1000.0).round() / 1000.0,
        "replay_s": (replay_s * 1000.0).round() / 1000.0,
        "replay_cpu_s": (cpu_s * 1000.0).round() / 1000.0,
        "peak_rss_mib": peak_rss_kib() / 1024,
        "utilization": r.utilization,
        "preemptions": r.preemptions,
        "unfinished": r.unfinished,
        "inference_wait_p99_s": r.inference.wait_s.p99,
        "training_wait_p99_s": r.training.wait_s.p99,
    }))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_synthetic_history_is_the_same_every_time_and_replays() {
        let a = super::synthetic(300, 1, 4, 8);
        assert_eq!(a, super::synthetic(300, 1, 4, 8));
        assert_eq!((a.jobs.len(), a.nodes.len()), (300, 4));
        let v = super::run(300, 1, 4, 8).unwrap();
        assert_eq!(v["jobs"], 300);
        assert!(v["replay_s"].as_f64().unwrap() > 0.0 && v["peak_rss_mib"].as_i64().unwrap() > 0, "{v}");
    }
}

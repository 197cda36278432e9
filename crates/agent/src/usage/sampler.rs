//! The sampler: every interval, one reading of every GPU (one inventory query per tick, not per
//! run) and of every live run's cgroup, off the async runtime and under a deadline; idle
//! changes leave as status reports.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kairos_proto::v1 as pb;
use tokio::sync::mpsc;

use super::meter::{GpuReading, IdleChange, Reading};
use super::{now_ms, Target, Usage};
use crate::gpu::GpuInventory;

/// The most one tick's readings may take before the tick is skipped.
const READ_DEADLINE: Duration = Duration::from_secs(5);

/// Samples every live run of `usage` each `interval` until the report channel closes.
pub async fn run(
    usage: Usage,
    inv: Arc<dyn GpuInventory>,
    gpus: Vec<pb::Gpu>,
    interval: Duration,
    node: String,
    reports: mpsc::Sender<pb::StatusReport>,
) {
    usage.set_interval(interval);
    let gpus = Arc::new(gpus);
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !reports.is_closed() {
        tick.tick().await;
        let targets = usage.targets();
        if targets.is_empty() {
            continue;
        }
        let (inv, gpus) = (Arc::clone(&inv), Arc::clone(&gpus));
        let read = tokio::task::spawn_blocking(move || read_all(inv.as_ref(), &gpus, &targets));
        let readings = match tokio::time::timeout(READ_DEADLINE, read).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "a usage sample failed");
                continue;
            }
            Err(_) => {
                tracing::warn!("a usage sample took over {READ_DEADLINE:?}; skipped");
                continue;
            }
        };
        for (key, change) in usage.add(readings) {
            let (status, since) = match change {
                IdleChange::Idle { since_ms } => (pb::RunStatus::Idle, since_ms),
                IdleChange::Busy => (pb::RunStatus::Busy, 0),
            };
            tracing::info!(job = key.0, attempt = key.1, ?change, "GPU idle watch");
            let report = pb::StatusReport {
                node_id: node.clone(),
                job_id: key.0,
                attempt: key.1,
                status: status as i32,
                idle_since_ms: since,
                ..Default::default()
            };
            if reports.send(report).await.is_err() {
                return;
            }
        }
    }
}

/// One reading of each target (blocking: the inventory and cgroup files).
pub fn read_all(
    inv: &dyn GpuInventory,
    gpus: &[pb::Gpu],
    targets: &[Target],
) -> Vec<(crate::decide::RunKey, Reading)> {
    let levels: BTreeMap<u32, (u32, u64)> = inv
        .usage()
        .into_iter()
        .map(|u| {
            (u.index, ((u.utilization * 100.0).round().clamp(0.0, 100.0) as u32, u.memory_used_bytes >> 20))
        })
        .collect();
    let time_ms = now_ms();
    targets
        .iter()
        .map(|t| {
            let gpus = t.gpus.iter().map(|&g| gpu_reading(g, gpus, &levels)).collect();
            let (cpu_ms, mem_kib) = cgroup_reading(&t.dirs);
            (t.key, Reading { time_ms, gpus, cpu_ms, mem_kib })
        })
        .collect()
}

/// GPU `index` as measured: its own figures, else (a MIG instance NVML does not measure) its
/// parent's; its memory from the inventory.
fn gpu_reading(index: u32, gpus: &[pb::Gpu], levels: &BTreeMap<u32, (u32, u64)>) -> GpuReading {
    let gpu = gpus.iter().find(|g| g.index == index);
    let (util_pct, mem_mib) = levels
        .get(&index)
        .or_else(|| gpu.and_then(|g| g.mig_parent).and_then(|p| levels.get(&p)))
        .copied()
        .unwrap_or((0, 0));
    GpuReading { gpu: index, util_pct, mem_mib, device_mib: gpu.map_or(0, |g| g.memory_mib) }
}

/// The run's CPU time (ms: v2's `cpu.stat`, as the end report reads it) and memory in use (KiB:
/// v1's `memory.usage_in_bytes` where the limit is there, else v2's `memory.current`).
fn cgroup_reading(dirs: &super::CgroupDirs) -> (Option<u64>, Option<u64>) {
    let v2 = dirs.v2.as_deref();
    let cpu = v2.and_then(|d| keyed(d, "cpu.stat", "usage_usec").map(|us| us / 1000));
    let mem = dirs
        .v1_memory
        .as_deref()
        .and_then(|d| number(d, "memory.usage_in_bytes"))
        .or_else(|| v2.and_then(|d| number(d, "memory.current")))
        .map(|b| b / 1024);
    (cpu, mem)
}

/// A cgroup file's first number (small files the kernel writes; read bounded).
fn number(dir: &Path, file: &str) -> Option<u64> {
    read_small(&dir.join(file))?.split_whitespace().next()?.parse().ok()
}

fn keyed(dir: &Path, file: &str, key: &str) -> Option<u64> {
    let text = read_small(&dir.join(file))?;
    text.lines().find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
}

fn read_small(path: &Path) -> Option<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path).ok()?.take(64 * 1024).read_to_string(&mut text).ok()?;
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mig_instance_nvml_does_not_measure_reads_as_its_parent() {
        let gpus = vec![
            pb::Gpu { index: 0, memory_mib: 80_000, ..Default::default() },
            pb::Gpu { index: 1, memory_mib: 18_000, mig_parent: Some(0), ..Default::default() },
        ];
        let levels = BTreeMap::from([(0, (70, 5_000))]);
        assert_eq!(
            gpu_reading(1, &gpus, &levels),
            GpuReading { gpu: 1, util_pct: 70, mem_mib: 5_000, device_mib: 18_000 }
        );
        assert_eq!(gpu_reading(7, &gpus, &levels).util_pct, 0);
    }

    #[test]
    fn cgroup_files_of_either_version_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let (v2, v1) = (dir.path().join("v2"), dir.path().join("v1"));
        std::fs::create_dir_all(&v2).unwrap();
        std::fs::create_dir_all(&v1).unwrap();
        std::fs::write(v2.join("cpu.stat"), "usage_usec 2500000\nuser_usec 1\n").unwrap();
        std::fs::write(v2.join("memory.current"), "4096\n").unwrap();
        std::fs::write(v1.join("memory.usage_in_bytes"), "8192\n").unwrap();
        let dirs = super::super::CgroupDirs { v2: Some(v2.clone()), ..Default::default() };
        assert_eq!(cgroup_reading(&dirs), (Some(2500), Some(4)));
        let dirs = super::super::CgroupDirs { v2: Some(v2), v1_memory: Some(v1), ..Default::default() };
        assert_eq!(cgroup_reading(&dirs), (Some(2500), Some(8)));
    }
}

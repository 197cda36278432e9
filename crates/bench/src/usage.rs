//! What measuring runs costs the agent: one sampler tick (`usage::sampler::read_all`, one
//! inventory query for all GPUs, each run's cgroup files, then `Usage::add`) for `runs` runs
//! on `gpus` fake GPUs whose usage a control file sets, timed in process CPU, and that as a share
//! of a core at the sampling interval.

use std::time::Duration;

use kairos_agent::gpu::{FakeInventory, GpuInventory};
use kairos_agent::usage::{sampler, CgroupDirs, Usage};
use serde_json::json;

pub fn run(gpus: u32, runs: u32, ticks: u32, interval: Duration) -> anyhow::Result<serde_json::Value> {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("gpu-usage");
    let lines: String = (0..gpus).map(|g| format!("{g} {} {}\n", 10 + g * 10, 1000 * (g + 1))).collect();
    std::fs::write(&file, lines)?;
    let mut inv = FakeInventory::parse("bench", &gpus.to_string(), "H100", 81_920)?;
    inv.usage = Some(kairos_agent::fake_usage::FakeUsageFile::new(file));
    let offered = inv.discover()?;
    let usage = Usage::default();
    for r in 0..runs {
        // Each run's cgroup files, as the kernel writes them (small files read whole).
        let cg = dir.path().join(format!("run-{r}"));
        std::fs::create_dir_all(&cg)?;
        std::fs::write(cg.join("cpu.stat"), "usage_usec 123456789\nuser_usec 1\nsystem_usec 2\n")?;
        std::fs::write(cg.join("memory.current"), "1073741824\n")?;
        // Four quarter-GPU runs per GPU.
        let mine = vec![r % gpus.max(1)];
        let dirs = CgroupDirs { v2: Some(cg), v1_memory: None };
        usage.start((u64::from(r) + 1, 0), &mine, 250, None, dirs, 0);
    }
    let before = crate::cpu::used(std::process::id()).unwrap_or_default();
    for _ in 0..ticks {
        let readings = sampler::read_all(&inv, &offered, &usage.targets());
        usage.add(readings);
    }
    let spent = crate::cpu::used(std::process::id()).unwrap_or_default().saturating_sub(before);
    let per_tick_us = spent.as_micros() as f64 / f64::from(ticks.max(1));
    let share = per_tick_us / interval.as_micros() as f64 * 100.0;
    Ok(json!({
        "bench": "usage",
        "gpus": gpus,
        "runs": runs,
        "ticks": ticks,
        "cpu_us_per_tick": (per_tick_us * 10.0).round() / 10.0,
        "interval_s": interval.as_secs_f64(),
        "core_percent_at_interval": (share * 1000.0).round() / 1000.0,
    }))
}

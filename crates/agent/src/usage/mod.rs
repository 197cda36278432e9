//! What each run uses, measured on the node (`--usage-interval`): per assigned GPU its
//! utilisation and device memory (the inventory's `usage`: NVML per device, or the fake GPUs'
//! control file), and the run's cgroup CPU time and memory. Each run's `Meter` keeps the
//! aggregates its end report carries (one replicated record per attempt) and a bounded series
//! (`ReadUsage`, `kairos top`); a run's idle watch reports its GPUs idle and busy again.
//!
//! ```text
//!   sampler tick ─▶ readings (off the runtime, with a deadline) ─▶ Usage::add ─▶ meters
//!                                                                    └─▶ idle/busy reports
//!   run exit ─▶ Usage::finish ─▶ RunUsageStats on the EXITED report
//! ```

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use kairos_proto::v1 as pb;

use crate::decide::RunKey;

pub mod meter;
pub mod sampler;

pub use meter::{IdleChange, IdleWatch, Meter, Reading};

/// Ended runs whose series is still served (`kairos top` just after the end).
const ENDED_KEPT: usize = 64;

/// Where a run's cgroup figures are read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CgroupDirs {
    /// The v2 run cgroup (`cpu.stat`, `memory.current`).
    pub v2: Option<PathBuf>,
    /// The v1 memory controller's run directory (`memory.usage_in_bytes`).
    pub v1_memory: Option<PathBuf>,
}

/// A run being measured.
#[derive(Clone, Debug)]
struct Live {
    gpus: Vec<u32>,
    dirs: CgroupDirs,
    meter: Meter,
}

/// What a sampler tick reads for a run.
#[derive(Clone, Debug)]
pub struct Target {
    pub key: RunKey,
    pub gpus: Vec<u32>,
    pub dirs: CgroupDirs,
}

#[derive(Debug, Default)]
struct Table {
    live: BTreeMap<RunKey, Live>,
    ended: VecDeque<pb::UsageSeries>,
}

/// Every run's meter on this node.
#[derive(Clone, Debug, Default)]
pub struct Usage {
    table: Arc<Mutex<Table>>,
    /// The sampling interval (ms), for the series' answers.
    interval_ms: Arc<std::sync::atomic::AtomicU32>,
}

impl Usage {
    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn set_interval(&self, interval: std::time::Duration) {
        let ms = interval.as_millis().min(u128::from(u32::MAX)) as u32;
        self.interval_ms.store(ms, std::sync::atomic::Ordering::Relaxed);
    }

    /// Starts measuring a run spawned at `now_ms`.
    pub fn start(
        &self,
        key: RunKey,
        gpus: &[u32],
        milli: u32,
        watch: Option<IdleWatch>,
        dirs: CgroupDirs,
        now_ms: i64,
    ) {
        let live = Live { gpus: gpus.to_vec(), dirs, meter: Meter::new(now_ms, milli, watch) };
        self.lock().live.insert(key, live);
    }

    /// The runs to read at a tick.
    pub fn targets(&self) -> Vec<Target> {
        let table = self.lock();
        table
            .live
            .iter()
            .map(|(k, l)| Target { key: *k, gpus: l.gpus.clone(), dirs: l.dirs.clone() })
            .collect()
    }

    /// Adds a tick's readings; returns the idle changes to report.
    pub fn add(&self, readings: Vec<(RunKey, Reading)>) -> Vec<(RunKey, IdleChange)> {
        let mut table = self.lock();
        let mut changes = Vec::new();
        for (key, r) in readings {
            if let Some(change) = table.live.get_mut(&key).and_then(|l| l.meter.add(&r)) {
                changes.push((key, change));
            }
        }
        changes
    }

    /// Ends a run's measurement at `end_ms`: its aggregates, for the end report (none when it
    /// was never measured). Its series stays readable a while.
    pub fn finish(&self, key: RunKey, end_ms: i64) -> Option<pb::RunUsageStats> {
        let mut table = self.lock();
        let live = table.live.remove(&key)?;
        let series = self.answer(key, &live, end_ms, false);
        let totals = series.totals;
        table.ended.push_back(series);
        while table.ended.len() > ENDED_KEPT {
            table.ended.pop_front();
        }
        totals
    }

    /// The series of run `key` (live, or ended recently).
    pub fn series(&self, key: RunKey, now_ms: i64) -> Option<pb::UsageSeries> {
        let table = self.lock();
        if let Some(live) = table.live.get(&key) {
            return Some(self.answer(key, live, now_ms, true));
        }
        table.ended.iter().rev().find(|s| (s.job_id, s.attempt) == key).cloned()
    }

    /// The latest sample of every live run (the per-job gauges).
    pub fn latest(&self) -> Vec<(RunKey, pb::UsageSample)> {
        let table = self.lock();
        table.live.iter().filter_map(|(k, l)| Some((*k, l.meter.latest()?.clone()))).collect()
    }

    fn answer(&self, key: RunKey, live: &Live, now_ms: i64, running: bool) -> pb::UsageSeries {
        let interval = self.interval_ms.load(std::sync::atomic::Ordering::Relaxed);
        let (samples, interval_ms) = live.meter.series(interval);
        pb::UsageSeries {
            job_id: key.0,
            attempt: key.1,
            node: String::new(),
            interval_ms,
            samples,
            totals: Some(live.meter.totals(now_ms)),
            running,
            max_rss_kib: 0,
            cpu_time_ms: 0,
        }
    }
}

/// Now, Unix ms.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

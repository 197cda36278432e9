//! One run's measured usage, from its samples (pure: time arrives with each reading).
//!
//! Each sample counts for the time since the one before (the first, since the run started), so
//! the mean is time-weighted whatever the interval. Utilisation percentiles come from a fixed
//! 101-bucket histogram and the series is bounded: when full, neighbouring samples merge and
//! the interval doubles. Memory stays bounded whatever a run's length.

use kairos_proto::v1 as pb;

/// Samples a run keeps at most (the series is thinned beyond).
pub const SERIES_MAX: usize = 256;

/// One GPU of a run, as one sample saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuReading {
    pub gpu: u32,
    /// Utilisation, percent (0..=100).
    pub util_pct: u32,
    pub mem_mib: u64,
    /// The GPU's (or instance's) memory.
    pub device_mib: u64,
}

/// What one sample saw of a run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reading {
    /// The agent's clock, Unix ms.
    pub time_ms: i64,
    pub gpus: Vec<GpuReading>,
    /// The run's cgroup CPU time so far (ms) and memory in use (KiB), where readable.
    pub cpu_ms: Option<u64>,
    pub mem_kib: Option<u64>,
}

/// When a run's GPUs count as idle: all below `below_milli` thousandths for `after_ms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdleWatch {
    pub after_ms: i64,
    pub below_milli: u32,
}

/// A change to report: the run's GPUs have been idle since then, or are busy again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdleChange {
    Idle { since_ms: i64 },
    Busy,
}

/// The idle watch's state: below since when, and whether that was reported.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct IdleState {
    below_since: Option<i64>,
    reported: bool,
}

/// A run's meter.
#[derive(Clone, Debug)]
pub struct Meter {
    started_ms: i64,
    last_ms: i64,
    /// Thousandths of a GPU each of its GPUs counts for (1000, or its fraction).
    share_milli: u64,
    gpu_ms: u64,
    /// Busy GPU-ms × 100 (utilisation percent × share), divided out when read.
    busy_pct_ms: u64,
    histogram: [u32; 101],
    util_max: u32,
    mem_max_mib: u64,
    mem_device_mib: u64,
    samples: u32,
    last_cpu_ms: Option<u64>,
    series: Vec<pb::UsageSample>,
    /// Each series entry covers this many samples (doubles as the series is thinned).
    per_entry: u32,
    /// Samples waiting to fill the next series entry.
    pending: Vec<pb::UsageSample>,
    watch: Option<IdleWatch>,
    idle: IdleState,
}

impl Meter {
    /// A run that started at `started_ms` on GPUs shared `milli` thousandths each (0: whole).
    pub fn new(started_ms: i64, milli: u32, watch: Option<IdleWatch>) -> Meter {
        Meter {
            started_ms,
            last_ms: started_ms,
            share_milli: if milli == 0 { 1000 } else { u64::from(milli.min(1000)) },
            gpu_ms: 0,
            busy_pct_ms: 0,
            histogram: [0; 101],
            util_max: 0,
            mem_max_mib: 0,
            mem_device_mib: 0,
            samples: 0,
            last_cpu_ms: None,
            series: Vec::new(),
            per_entry: 1,
            pending: Vec::new(),
            watch,
            idle: IdleState::default(),
        }
    }

    /// Adds a sample; says whether the run's GPUs just became idle (for its watch) or busy again.
    pub fn add(&mut self, r: &Reading) -> Option<IdleChange> {
        let dt = (r.time_ms - self.last_ms).max(0) as u64;
        let cpu_milli = match (self.last_cpu_ms, r.cpu_ms) {
            (Some(before), Some(now)) if dt > 0 => (now.saturating_sub(before) * 1000 / dt) as u32,
            (None, Some(now)) if dt > 0 && self.samples == 0 => (now * 1000 / dt) as u32,
            _ => 0,
        };
        self.last_ms = self.last_ms.max(r.time_ms);
        self.last_cpu_ms = r.cpu_ms.or(self.last_cpu_ms);
        self.samples += 1;
        for g in &r.gpus {
            let util = g.util_pct.min(100);
            let weighted = dt * self.share_milli / 1000;
            self.gpu_ms += weighted;
            self.busy_pct_ms += weighted * u64::from(util);
            self.histogram[util as usize] += 1;
            self.util_max = self.util_max.max(util);
            if g.mem_mib >= self.mem_max_mib {
                self.mem_max_mib = g.mem_mib;
                self.mem_device_mib = g.device_mib;
            }
        }
        let gpus =
            r.gpus.iter().map(|g| pb::GpuSample { gpu: g.gpu, util_pct: g.util_pct, mem_mib: g.mem_mib });
        let sample = pb::UsageSample {
            time_ms: r.time_ms,
            gpus: gpus.collect(),
            cpu_milli,
            mem_kib: r.mem_kib.unwrap_or(0),
        };
        self.push(sample);
        self.watch_idle(r)
    }

    fn watch_idle(&mut self, r: &Reading) -> Option<IdleChange> {
        let watch = self.watch?;
        if r.gpus.is_empty() {
            return None;
        }
        let below = r.gpus.iter().all(|g| g.util_pct.min(100) * 10 < watch.below_milli);
        if !below {
            let was = std::mem::take(&mut self.idle);
            return was.reported.then_some(IdleChange::Busy);
        }
        let since = *self.idle.below_since.get_or_insert(r.time_ms);
        if !self.idle.reported && r.time_ms - since >= watch.after_ms {
            self.idle.reported = true;
            return Some(IdleChange::Idle { since_ms: since });
        }
        None
    }

    /// Appends to the series, merging `per_entry` samples into one entry; thins it when full.
    fn push(&mut self, sample: pb::UsageSample) {
        self.pending.push(sample);
        if self.pending.len() < self.per_entry as usize {
            return;
        }
        let merged = merge(std::mem::take(&mut self.pending));
        self.series.push(merged);
        if self.series.len() >= SERIES_MAX {
            let old = std::mem::take(&mut self.series);
            let mut pairs = old.into_iter();
            while let Some(a) = pairs.next() {
                self.series.push(match pairs.next() {
                    Some(b) => merge(vec![a, b]),
                    None => a,
                });
            }
            self.per_entry *= 2;
        }
    }

    /// The 95th percentile of per-GPU utilisation over every sample, percent.
    fn p95(&self) -> u32 {
        let total: u64 = self.histogram.iter().map(|&n| u64::from(n)).sum();
        if total == 0 {
            return 0;
        }
        let rank = (total * 95).div_ceil(100);
        let mut seen = 0u64;
        for (pct, &n) in self.histogram.iter().enumerate() {
            seen += u64::from(n);
            if seen >= rank {
                return pct as u32;
            }
        }
        100
    }

    /// The aggregates so far; `end_ms` ends the wall time.
    pub fn totals(&self, end_ms: i64) -> pb::RunUsageStats {
        pb::RunUsageStats {
            wall_ms: (end_ms - self.started_ms).max(0) as u64,
            gpu_ms: self.gpu_ms,
            gpu_busy_ms: self.busy_pct_ms / 100,
            gpu_util_max_pct: self.util_max,
            gpu_util_p95_pct: self.p95(),
            gpu_mem_max_mib: self.mem_max_mib,
            gpu_mem_device_mib: self.mem_device_mib,
            samples: self.samples,
        }
    }

    /// The series (thinned), with the samples not yet merged, and the interval each entry covers.
    pub fn series(&self, interval_ms: u32) -> (Vec<pb::UsageSample>, u32) {
        let mut all = self.series.clone();
        all.extend(self.pending.iter().cloned());
        (all, interval_ms.saturating_mul(self.per_entry))
    }

    /// The latest sample, if any.
    pub fn latest(&self) -> Option<&pb::UsageSample> {
        self.pending.last().or(self.series.last())
    }
}

/// Several consecutive samples as one: the last time, mean utilisation and CPU, peak memory.
fn merge(samples: Vec<pb::UsageSample>) -> pb::UsageSample {
    let n = samples.len().max(1) as u64;
    let Some(last) = samples.last() else { return pb::UsageSample::default() };
    let mut out = pb::UsageSample {
        time_ms: last.time_ms,
        gpus: Vec::new(),
        cpu_milli: (samples.iter().map(|s| u64::from(s.cpu_milli)).sum::<u64>() / n) as u32,
        mem_kib: samples.iter().map(|s| s.mem_kib).max().unwrap_or(0),
    };
    for g in &last.gpus {
        let same: Vec<&pb::GpuSample> =
            samples.iter().flat_map(|s| &s.gpus).filter(|x| x.gpu == g.gpu).collect();
        let k = same.len().max(1) as u64;
        out.gpus.push(pb::GpuSample {
            gpu: g.gpu,
            util_pct: (same.iter().map(|x| u64::from(x.util_pct)).sum::<u64>() / k) as u32,
            mem_mib: same.iter().map(|x| x.mem_mib).max().unwrap_or(0),
        });
    }
    out
}

#[cfg(test)]
#[path = "meter_tests.rs"]
mod tests;

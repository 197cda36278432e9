//! The figures derived from one history record's measured usage (docs/usage.md): what
//! `history`'s usage columns, `eff`, `report usage` and `policy advise` all compute alike.
//! Each is `None` when the record holds no measurement to derive it from.

use kairos_proto::v1 as pb;

/// GPU_UTIL: the time-weighted mean utilisation of its GPUs, percent (Slurm's TRESUsageInAve
/// gres/gpuutil): 100 × busy GPU-ms / sampled GPU-ms.
pub fn gpu_util_pct(r: &pb::JobRecord) -> Option<f64> {
    (r.gpu_ms > 0).then(|| 100.0 * r.gpu_busy_ms as f64 / r.gpu_ms as f64)
}

/// GPU_UTIL_MAX: the largest utilisation of any of its GPUs in one sample, percent.
pub fn gpu_util_max_pct(r: &pb::JobRecord) -> Option<u32> {
    (r.gpu_ms > 0).then_some(r.gpu_util_max_pct)
}

/// GPU_MEM_MAX: the peak device memory in use on one of its GPUs, MiB.
pub fn gpu_mem_max_mib(r: &pb::JobRecord) -> Option<u64> {
    (r.gpu_ms > 0 || r.gpu_mem_max_mib > 0).then_some(r.gpu_mem_max_mib)
}

/// The peak GPU memory as a share of its GPU's memory, percent.
pub fn gpu_mem_pct(r: &pb::JobRecord) -> Option<f64> {
    (r.gpu_mem_device_mib > 0).then(|| 100.0 * r.gpu_mem_max_mib as f64 / r.gpu_mem_device_mib as f64)
}

/// CPU cores in use on average per task: CPU time / run time (run time sums its tasks).
pub fn cores_used(r: &pb::JobRecord) -> Option<f64> {
    (r.run_ms > 0).then(|| r.cpu_time_ms as f64 / r.run_ms as f64)
}

/// CPU_EFF (seff's CPU Efficiency): 100 × CPU time / (CPUs asked per task × run time).
pub fn cpu_eff_pct(r: &pb::JobRecord) -> Option<f64> {
    let core_ms = cpu_core_ms(r);
    (core_ms > 0).then(|| 100.0 * r.cpu_time_ms as f64 / core_ms as f64)
}

/// The core-ms it held: CPUs asked per task × run time (0 when either is unknown).
pub fn cpu_core_ms(r: &pb::JobRecord) -> u128 {
    u128::from(r.req_cpus) * u128::from(r.run_ms)
}

/// MEM_EFF (seff's Memory Efficiency): 100 × MaxRSS / memory asked per task.
pub fn mem_eff_pct(r: &pb::JobRecord) -> Option<f64> {
    (r.req_memory_mib > 0 && r.max_rss_kib > 0)
        .then(|| 100.0 * r.max_rss_kib as f64 / (r.req_memory_mib as f64 * 1024.0))
}

/// GPU-hours allocated (its `gpu_seconds`: GPUs × wall time of its last run).
pub fn gpu_hours(r: &pb::JobRecord) -> f64 {
    r.gpu_seconds as f64 / 3600.0
}

/// Busy GPU-hours: the GPU-time its GPUs were measured busy.
pub fn busy_gpu_hours(r: &pb::JobRecord) -> f64 {
    r.gpu_busy_ms as f64 / 3.6e6
}

/// GPUs per task of its run (0 for a CPU-only job; a fraction counts as one).
pub fn gpus_per_task(r: &pb::JobRecord) -> u32 {
    r.gpus / r.tasks.max(1)
}

/// Wait before its (last) start, seconds.
pub fn wait_s(r: &pb::JobRecord) -> Option<f64> {
    (r.start_time_ms > 0 && r.submit_time_ms > 0)
        .then(|| (r.start_time_ms - r.submit_time_ms).max(0) as f64 / 1000.0)
}

/// Wall time of its last run, seconds (until `now` while it runs).
pub fn elapsed_s(r: &pb::JobRecord, now_ms: i64) -> Option<f64> {
    match (r.start_time_ms, r.end_time_ms) {
        (0, _) => None,
        (start, 0) => Some((now_ms - start).max(0) as f64 / 1000.0),
        (start, end) => Some((end - start).max(0) as f64 / 1000.0),
    }
}

/// The `p`th percentile (0–100) by nearest rank: the smallest value with at least p % of the
/// values at or below it. `None` for no values.
pub fn percentile(values: &[f64], p: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// A percentage as tables show it (`42.5`), or `-` when not measured.
pub fn pct_cell(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.1}"))
}

/// A number for JSON with two decimals (null when not measured).
pub fn json_num(v: Option<f64>) -> serde_json::Value {
    v.map_or(serde_json::Value::Null, |v| serde_json::json!((v * 100.0).round() / 100.0))
}

/// A size in MiB as people read it, or `-`.
pub fn mib_cell(v: Option<u64>) -> String {
    v.map_or_else(|| "-".into(), |m| if m == 0 { "0".into() } else { crate::output::mib(m) })
}

#[cfg(test)]
pub mod tests {
    use super::*;

    /// A finished record: `gpus` GPUs on one task, measured for `run_ms`.
    pub fn record(id: u64, gpus: u32, run_ms: u64) -> pb::JobRecord {
        pb::JobRecord {
            id,
            user: "alice".into(),
            account: "vision".into(),
            qos: "training".into(),
            partition: "default".into(),
            state: pb::JobState::Completed as i32,
            gpus,
            tasks: 1,
            run_ms,
            submit_time_ms: 1_000_000,
            start_time_ms: 1_060_000,
            end_time_ms: 1_060_000 + run_ms as i64,
            gpu_seconds: u64::from(gpus) * run_ms / 1000,
            ..Default::default()
        }
    }

    #[test]
    fn the_columns_follow_the_formulas_and_are_blank_unmeasured() {
        let mut r = record(1, 2, 100_000);
        assert_eq!(gpu_util_pct(&r), None, "no GPU sampled: blank");
        assert_eq!((gpu_util_max_pct(&r), gpu_mem_max_mib(&r), mem_eff_pct(&r)), (None, None, None));
        assert_eq!(cpu_eff_pct(&r), None, "no CPUs asked: blank");
        r.gpu_ms = 200_000;
        r.gpu_busy_ms = 90_000;
        r.gpu_util_max_pct = 80;
        r.gpu_mem_max_mib = 9_000;
        r.gpu_mem_device_mib = 80_000;
        r.req_cpus = 4;
        r.cpu_time_ms = 100_000;
        r.req_memory_mib = 1024;
        r.max_rss_kib = 256 * 1024;
        assert_eq!(gpu_util_pct(&r), Some(45.0));
        assert_eq!((gpu_util_max_pct(&r), gpu_mem_max_mib(&r)), (Some(80), Some(9_000)));
        assert_eq!(cpu_eff_pct(&r), Some(25.0), "one core busy of four");
        assert_eq!(cores_used(&r), Some(1.0));
        assert_eq!(mem_eff_pct(&r), Some(25.0));
        assert_eq!(gpu_mem_pct(&r), Some(11.25));
        assert_eq!((gpu_hours(&r), busy_gpu_hours(&r)), (200.0 / 3600.0, 0.025));
        assert_eq!(wait_s(&r), Some(60.0));
        assert_eq!((pct_cell(gpu_util_pct(&r)), pct_cell(None)), ("45.0".to_string(), "-".to_string()));
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(50.0));
        assert_eq!(percentile(&v, 99.0), Some(99.0));
        assert_eq!(percentile(&v, 100.0), Some(100.0));
        assert_eq!(percentile(&[3.0, 1.0, 2.0], 50.0), Some(2.0));
        assert_eq!(percentile(&[7.0], 95.0), Some(7.0));
        assert_eq!(percentile(&[7.0], 0.0), Some(7.0));
        assert_eq!(percentile(&[], 50.0), None);
    }
}

//! The figures of one history record (pure): Slurm's `TRESUsageInAve`/`Max` of `gres/gpuutil`
//! and `gres/gpumem`, and seff's CPU and memory efficiency.

use kairos_proto::v1 as pb;

/// GPU utilisation, time-weighted over every sample of every GPU, percent (None: not measured).
pub fn gpu_util(r: &pb::JobRecord) -> Option<f64> {
    (r.gpu_ms > 0).then(|| 100.0 * r.gpu_busy_ms as f64 / r.gpu_ms as f64)
}

/// Cores used on average by one task while it ran.
pub fn cores_used(r: &pb::JobRecord) -> Option<f64> {
    (r.run_ms > 0).then(|| r.cpu_time_ms as f64 / r.run_ms as f64)
}

/// CPU time over what its CPUs could give in its run time, percent.
pub fn cpu_eff(r: &pb::JobRecord) -> Option<f64> {
    (r.req_cpus > 0).then_some(())?;
    cores_used(r).map(|c| 100.0 * c / f64::from(r.req_cpus))
}

/// Peak memory over what it asked for, percent.
pub fn mem_eff(r: &pb::JobRecord) -> Option<f64> {
    (r.req_memory_mib > 0 && r.max_rss_kib > 0)
        .then(|| 100.0 * r.max_rss_kib as f64 / (r.req_memory_mib as f64 * 1024.0))
}

/// Peak GPU memory over the GPU's memory, percent.
pub fn gpu_mem_share(r: &pb::JobRecord) -> Option<f64> {
    (r.gpu_mem_device_mib > 0).then(|| 100.0 * r.gpu_mem_max_mib as f64 / r.gpu_mem_device_mib as f64)
}

/// GPU-hours it held (all its GPUs × its run time).
pub fn gpu_hours(r: &pb::JobRecord) -> f64 {
    r.gpu_seconds as f64 / 3600.0
}

/// GPU-hours its GPUs were busy.
pub fn busy_gpu_hours(r: &pb::JobRecord) -> f64 {
    r.gpu_busy_ms as f64 / 3.6e6
}

/// Seconds from submit to start (None: not started).
pub fn wait_s(r: &pb::JobRecord) -> Option<f64> {
    (r.start_time_ms > 0).then(|| (r.start_time_ms - r.submit_time_ms).max(0) as f64 / 1000.0)
}

/// Seconds it ran (None: not started or not ended).
pub fn ran_s(r: &pb::JobRecord) -> Option<f64> {
    (r.start_time_ms > 0 && r.end_time_ms > 0)
        .then(|| (r.end_time_ms - r.start_time_ms).max(0) as f64 / 1000.0)
}

/// A percentage as a column shows it ("-": not measured).
pub fn pct(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.1}%"))
}

/// The `q`-quantile (0..=1) of `values` (nearest rank; None when empty).
pub fn quantile(values: &[f64], q: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    Some(v[rank - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_of_a_record_and_blanks_when_not_measured() {
        let r = pb::JobRecord {
            gpu_ms: 60_000,
            gpu_busy_ms: 24_000,
            run_ms: 10_000,
            cpu_time_ms: 10_000,
            req_cpus: 4,
            req_memory_mib: 1024,
            max_rss_kib: 256 * 1024,
            gpu_mem_max_mib: 20_000,
            gpu_mem_device_mib: 80_000,
            gpu_seconds: 7200,
            ..Default::default()
        };
        assert_eq!(gpu_util(&r), Some(40.0));
        assert_eq!((cores_used(&r), cpu_eff(&r)), (Some(1.0), Some(25.0)));
        assert_eq!((mem_eff(&r), gpu_mem_share(&r)), (Some(25.0), Some(25.0)));
        assert_eq!(gpu_hours(&r), 2.0);
        let blank = pb::JobRecord::default();
        assert_eq!((gpu_util(&blank), cpu_eff(&blank), mem_eff(&blank)), (None, None, None));
        assert_eq!((pct(Some(24.96)), pct(None)), ("25.0%".to_string(), "-".to_string()));
    }

    #[test]
    fn quantiles_by_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(
            (quantile(&v, 0.5), quantile(&v, 0.99), quantile(&v, 1.0)),
            (Some(50.0), Some(99.0), Some(100.0))
        );
        assert_eq!(quantile(&[], 0.5), None);
    }
}

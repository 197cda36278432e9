use super::*;

fn reading(t: i64, utils: &[u32], mem: u64) -> Reading {
    let gpus = utils
        .iter()
        .enumerate()
        .map(|(i, &u)| GpuReading { gpu: i as u32, util_pct: u, mem_mib: mem, device_mib: 81_920 })
        .collect();
    Reading { time_ms: t, gpus, cpu_ms: None, mem_kib: None }
}

#[test]
fn eighty_percent_for_thirty_seconds_then_idle_as_long_averages_forty() {
    let mut m = Meter::new(0, 0, None);
    for t in (1..=60).map(|s| s * 1000) {
        m.add(&reading(t, &[if t <= 30_000 { 80 } else { 0 }], 30_000));
    }
    let s = m.totals(60_000);
    assert_eq!((s.wall_ms, s.gpu_ms, s.samples), (60_000, 60_000, 60));
    assert_eq!(s.gpu_busy_ms * 100 / s.gpu_ms, 40);
    assert_eq!((s.gpu_util_max_pct, s.gpu_mem_max_mib, s.gpu_mem_device_mib), (80, 30_000, 81_920));
}

#[test]
fn samples_are_weighted_by_the_time_they_cover_not_counted() {
    // One long sample at 100 % and nine short ones at 0 %: the mean follows time.
    let mut m = Meter::new(0, 0, None);
    m.add(&reading(9_000, &[100], 1));
    for t in 1..=9 {
        m.add(&reading(9_000 + t * 111, &[0], 1));
    }
    let s = m.totals(10_000);
    assert_eq!(s.gpu_busy_ms, 9_000);
    assert!(s.gpu_busy_ms * 100 / s.gpu_ms >= 89, "{s:?}");
}

#[test]
fn the_p95_is_the_value_under_which_95_of_100_samples_fall() {
    let mut m = Meter::new(0, 0, None);
    for i in 0..100u32 {
        m.add(&reading(i64::from(i + 1) * 10, &[i + 1], 0));
    }
    let s = m.totals(1000);
    assert_eq!((s.gpu_util_p95_pct, s.gpu_util_max_pct), (95, 100));
}

#[test]
fn a_fraction_counts_its_share_of_the_gpu() {
    let mut m = Meter::new(0, 250, None);
    m.add(&reading(4_000, &[60], 1));
    let s = m.totals(4_000);
    assert_eq!((s.gpu_ms, s.gpu_busy_ms), (1_000, 600));
}

#[test]
fn the_series_stays_bounded_and_covers_the_whole_run_at_a_coarser_interval() {
    let mut m = Meter::new(0, 0, None);
    for t in 1..=10_000i64 {
        m.add(&reading(t * 1000, &[(t % 100) as u32], t as u64));
    }
    let (series, interval) = m.series(1000);
    assert!(series.len() <= SERIES_MAX + 64, "{}", series.len());
    assert!(interval >= 32_000, "{interval}");
    assert_eq!(series.last().unwrap().time_ms, 10_000_000);
    // Merging keeps the peak memory of what it merged.
    assert_eq!(series.last().unwrap().gpus[0].mem_mib, 10_000);
}

#[test]
fn cpu_use_between_samples_is_cores_in_thousandths() {
    let mut m = Meter::new(0, 0, None);
    m.add(&Reading { time_ms: 1000, cpu_ms: Some(500), ..Default::default() });
    m.add(&Reading { time_ms: 3000, cpu_ms: Some(4500), ..Default::default() });
    let (series, _) = m.series(1000);
    assert_eq!(series.iter().map(|s| s.cpu_milli).collect::<Vec<_>>(), [500, 2000]);
}

#[test]
fn idle_is_reported_once_after_the_watch_s_time_and_busy_clears_it() {
    let watch = IdleWatch { after_ms: 20_000, below_milli: 50 };
    let mut m = Meter::new(0, 0, Some(watch));
    let mut changes = Vec::new();
    for t in 1..=40 {
        // Two GPUs: idle from 5 s (4 % is below 5 %), one busy again at 35 s.
        let utils = if t < 5 {
            [90, 90]
        } else if t < 35 {
            [4, 0]
        } else {
            [0, 70]
        };
        if let Some(c) = m.add(&reading(t * 1000, &utils, 1)) {
            changes.push((t, c));
        }
    }
    assert_eq!(changes, [(25, IdleChange::Idle { since_ms: 5_000 }), (35, IdleChange::Busy)]);
}

#[test]
fn without_a_watch_or_gpus_nothing_is_ever_idle() {
    let mut m = Meter::new(0, 0, None);
    assert!((1..100).all(|t| m.add(&reading(t * 1000, &[0], 1)).is_none()));
    let mut cpu_only = Meter::new(0, 0, Some(IdleWatch { after_ms: 1, below_milli: 1000 }));
    assert!((1..100).all(|t| cpu_only.add(&reading(t * 1000, &[], 1)).is_none()));
}

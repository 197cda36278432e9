//! `kairos top JOB`: a running job's live usage from its node's agent (`JobService.JobUsage`),
//! redrawn every interval until the run ends: per GPU the latest utilisation and memory with a
//! sparkline of its utilisation over the series, CPU cores and memory.

use std::io::IsTerminal;
use std::time::Duration;

use kairos_proto::v1 as pb;
use serde_json::{json, Value};

use crate::client::Client;
use crate::output::{mib, print_json};

const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
/// Columns of a sparkline.
const SPARK_WIDTH: usize = 40;

/// Percentages (0–100) as a sparkline of at most `width` characters: the newest values, each
/// character the mean of its share of them.
pub fn sparkline(values: &[u32], width: usize) -> String {
    if values.is_empty() || width == 0 {
        return String::new();
    }
    let buckets = values.len().min(width);
    (0..buckets)
        .map(|b| {
            let (from, to) = (b * values.len() / buckets, (b + 1) * values.len() / buckets);
            let part = &values[from..to.max(from + 1)];
            let mean = part.iter().map(|v| u64::from((*v).min(100))).sum::<u64>() / part.len() as u64;
            BARS[(mean as usize * (BARS.len() - 1) + 50) / 100]
        })
        .collect()
}

/// Per GPU of the series: its utilisation in every sample (oldest first).
fn gpu_series(series: &pb::UsageSeries) -> std::collections::BTreeMap<u32, Vec<u32>> {
    let mut out: std::collections::BTreeMap<u32, Vec<u32>> = Default::default();
    for s in &series.samples {
        for g in &s.gpus {
            out.entry(g.gpu).or_default().push(g.util_pct);
        }
    }
    out
}

/// One frame of `top` as text.
pub fn frame(series: &pb::UsageSeries) -> String {
    let state = if series.running { "running" } else { "ended" };
    let mut out = format!(
        "job {} attempt {} on {}: {state}, {} samples every {}s\n",
        series.job_id,
        series.attempt,
        if series.node.is_empty() { "-" } else { &series.node },
        series.samples.len(),
        series.interval_ms / 1000
    );
    let last = series.samples.last();
    out += &format!("{:<4} {:>5} {:>8}  UTIL OVER TIME\n", "GPU", "UTIL", "MEMORY");
    for (gpu, utils) in gpu_series(series) {
        let now = last.and_then(|s| s.gpus.iter().find(|g| g.gpu == gpu));
        let util = now.map_or_else(|| "-".into(), |g| format!("{}%", g.util_pct));
        let mem = now.map_or_else(|| "-".into(), |g| mib(g.mem_mib));
        out += &format!("{gpu:<4} {util:>5} {mem:>8}  {}\n", sparkline(&utils, SPARK_WIDTH));
    }
    if let Some(s) = last {
        out += &format!(
            "CPU {:.2} cores   memory {} (peak {})   CPU time {}\n",
            f64::from(s.cpu_milli) / 1000.0,
            mib(s.mem_kib.div_ceil(1024)),
            mib(series.max_rss_kib.div_ceil(1024)),
            super::neat::clock((series.cpu_time_ms / 1000) as i64)
        );
    }
    if let Some(t) = series.totals.as_ref().filter(|t| t.gpu_ms > 0) {
        out += &format!(
            "so far: GPU utilisation mean {:.1} %, p95 {} %, max {} %; GPU memory peak {} of {}\n",
            100.0 * t.gpu_busy_ms as f64 / t.gpu_ms as f64,
            t.gpu_util_p95_pct,
            t.gpu_util_max_pct,
            mib(t.gpu_mem_max_mib),
            mib(t.gpu_mem_device_mib)
        );
    }
    out
}

/// One frame as JSON (`--json`: one object per line and frame).
pub fn frame_json(series: &pb::UsageSeries) -> Value {
    let samples: Vec<Value> = series
        .samples
        .iter()
        .map(|s| {
            json!({
                "time": crate::output::time_json(s.time_ms),
                "cpu_cores": f64::from(s.cpu_milli) / 1000.0,
                "mem_kib": s.mem_kib,
                "gpus": s.gpus.iter().map(|g| json!({"gpu": g.gpu, "util_pct": g.util_pct, "mem_mib": g.mem_mib})).collect::<Vec<_>>(),
            })
        })
        .collect();
    let t = series.totals.unwrap_or_default();
    json!({
        "job_id": series.job_id,
        "attempt": series.attempt,
        "node": series.node,
        "running": series.running,
        "interval_ms": series.interval_ms,
        "max_rss_kib": series.max_rss_kib,
        "cpu_time_ms": series.cpu_time_ms,
        "totals": {
            "wall_ms": t.wall_ms, "gpu_ms": t.gpu_ms, "gpu_busy_ms": t.gpu_busy_ms,
            "gpu_util_max_pct": t.gpu_util_max_pct, "gpu_util_p95_pct": t.gpu_util_p95_pct,
            "gpu_mem_max_mib": t.gpu_mem_max_mib, "gpu_mem_device_mib": t.gpu_mem_device_mib, "samples": t.samples,
        },
        "samples": samples,
    })
}

#[derive(clap::Args, Debug)]
pub struct TopArgs {
    /// The job's id.
    pub id: u64,
    /// How often to redraw (e.g. 2s, 1m).
    #[arg(long, default_value = "5s", value_parser = parse_interval)]
    pub interval: Duration,
    /// Print one frame and exit.
    #[arg(long)]
    pub once: bool,
}

fn parse_interval(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s)
        .map_err(|_| format!("cannot parse \"{s}\" as a duration (e.g. 2s, 1m)"))?;
    if d < Duration::from_millis(200) || d > Duration::from_secs(3600) {
        return Err(format!("\"{s}\": the interval is between 200ms and 1h"));
    }
    Ok(d)
}

pub async fn top(client: &Client, json: bool, args: TopArgs) -> anyhow::Result<i32> {
    let tty = std::io::stdout().is_terminal() && !json;
    loop {
        let req = pb::JobUsageRequest { job_id: args.id };
        let series = client.jobs(req, |mut c, r| async move { c.job_usage(r).await }).await?.into_inner();
        if json {
            println!("{}", frame_json(&series));
        } else {
            if tty && !args.once {
                print!("\x1b[2J\x1b[H");
            }
            print!("{}", frame(&series));
        }
        if args.once || !series.running {
            return Ok(0);
        }
        tokio::time::sleep(args.interval).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sparkline_scales_percent_to_eight_bars_and_keeps_to_its_width() {
        assert_eq!(sparkline(&[0, 14, 50, 100], 40), "▁▂▅█");
        assert_eq!(sparkline(&[100, 100, 0, 0], 2), "█▁", "each character the mean of its share");
        assert_eq!(sparkline(&[250], 5), "█", "over 100 % counts as 100 %");
        assert_eq!(sparkline(&[], 5), "");
        assert_eq!(sparkline(&[50; 100], 40).chars().count(), 40);
    }

    #[test]
    fn a_frame_shows_each_gpus_latest_sample_and_the_hosts_use() {
        let sample = |t: i64, a: u32, b: u32| pb::UsageSample {
            time_ms: t,
            gpus: vec![
                pb::GpuSample { gpu: 0, util_pct: a, mem_mib: 9_000 },
                pb::GpuSample { gpu: 3, util_pct: b, mem_mib: 512 },
            ],
            cpu_milli: 1_300,
            mem_kib: 2 * 1024 * 1024,
        };
        let series = pb::UsageSeries {
            job_id: 12,
            node: "n1".into(),
            interval_ms: 10_000,
            samples: vec![sample(1, 80, 0), sample(2, 80, 0), sample(3, 0, 0)],
            totals: Some(pb::RunUsageStats {
                gpu_ms: 60_000,
                gpu_busy_ms: 16_000,
                gpu_util_max_pct: 80,
                gpu_mem_max_mib: 9_000,
                gpu_mem_device_mib: 81_920,
                ..Default::default()
            }),
            running: true,
            max_rss_kib: 3 * 1024 * 1024,
            cpu_time_ms: 65_000,
            ..Default::default()
        };
        let text = frame(&series);
        assert!(text.starts_with("job 12 attempt 0 on n1: running, 3 samples every 10s\n"), "{text}");
        assert!(text.contains("0       0%     8.8G  ██▁\n"), "{text}");
        assert!(text.contains("3       0%     512M  ▁▁▁\n"), "{text}");
        assert!(text.contains("CPU 1.30 cores   memory 2.0G (peak 3.0G)   CPU time 00:01:05"), "{text}");
        assert!(text.contains("mean 26.7 %, p95 0 %, max 80 %"), "{text}");
        let j = frame_json(&series);
        assert_eq!(
            (j["running"].as_bool(), j["samples"][2]["gpus"][0]["util_pct"].as_u64()),
            (Some(true), Some(0))
        );
    }
}

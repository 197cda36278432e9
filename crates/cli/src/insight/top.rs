//! `kairos top JOB`: the job's usage as its node measures it now, refreshed: per GPU its
//! utilisation and memory with a sparkline of the series, CPU cores and memory.

use std::io::IsTerminal;
use std::time::Duration;

use clap::Args;
use kairos_proto::v1 as pb;

use crate::client::Client;
use crate::output::print_json;

#[derive(Args, Debug)]
pub struct TopArgs {
    /// The job's id.
    pub id: u64,
    /// How often to refresh (e.g. 2s).
    #[arg(long, default_value = "2s", value_parser = parse_interval)]
    pub interval: Duration,
    /// Print one frame and exit.
    #[arg(long)]
    pub once: bool,
}

fn parse_interval(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("\"{s}\": {e}"))?;
    if d < Duration::from_millis(200) {
        return Err(format!("\"{s}\" is shorter than 200ms"));
    }
    Ok(d)
}

pub async fn top(client: &Client, json: bool, args: TopArgs) -> anyhow::Result<i32> {
    let tty = std::io::stdout().is_terminal() && !json;
    loop {
        let req = pb::JobUsageRequest { job_id: args.id };
        let series = client.jobs(req, |mut c, r| async move { c.job_usage(r).await }).await?.into_inner();
        if json {
            print_json(&serde_json::to_value(series_json(&series))?);
        } else {
            if tty {
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

fn series_json(s: &pb::UsageSeries) -> serde_json::Value {
    let samples: Vec<serde_json::Value> = s
        .samples
        .iter()
        .map(|x| {
            serde_json::json!({
                "time_ms": x.time_ms,
                "cpu_cores": f64::from(x.cpu_milli) / 1000.0,
                "mem_kib": x.mem_kib,
                "gpus": x.gpus.iter().map(|g| serde_json::json!({"gpu": g.gpu, "util_pct": g.util_pct, "mem_mib": g.mem_mib})).collect::<Vec<_>>(),
            })
        })
        .collect();
    serde_json::json!({
        "job_id": s.job_id, "attempt": s.attempt, "node": s.node, "running": s.running,
        "interval_ms": s.interval_ms, "samples": samples,
    })
}

/// One frame, as text.
pub fn frame(s: &pb::UsageSeries) -> String {
    let state = if s.running { "running" } else { "ended" };
    let mut out = format!(
        "job {} attempt {} on {}: {state}, {} samples every {:.1}s\n",
        s.job_id,
        s.attempt,
        s.node,
        s.samples.len(),
        f64::from(s.interval_ms) / 1000.0
    );
    let Some(last) = s.samples.last() else {
        return out + "no sample yet\n";
    };
    out += "GPU   UTIL   MEMORY      HISTORY\n";
    for g in &last.gpus {
        let history: Vec<u32> = s
            .samples
            .iter()
            .filter_map(|x| x.gpus.iter().find(|y| y.gpu == g.gpu))
            .map(|y| y.util_pct)
            .collect();
        out +=
            &format!("{:<5} {:>4}%  {:>7} MiB  {}\n", g.gpu, g.util_pct, g.mem_mib, sparkline(&history, 40));
    }
    out += &format!(
        "CPU {:.2} cores   memory {}\n",
        f64::from(last.cpu_milli) / 1000.0,
        crate::output::mib(last.mem_kib / 1024)
    );
    out
}

/// The last `width` percentages as bars.
pub fn sparkline(values: &[u32], width: usize) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let from = values.len().saturating_sub(width);
    values[from..].iter().map(|v| BARS[(*v.min(&100) as usize * 7 + 50) / 100]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_shows_each_gpu_now_and_its_history() {
        let sample = |t, u| pb::UsageSample {
            time_ms: t,
            gpus: vec![pb::GpuSample { gpu: 3, util_pct: u, mem_mib: 30_000 }],
            cpu_milli: 1500,
            mem_kib: 2 << 20,
        };
        let s = pb::UsageSeries {
            job_id: 9,
            node: "n1".into(),
            interval_ms: 500,
            samples: vec![sample(1, 0), sample(2, 50), sample(3, 80)],
            running: true,
            ..Default::default()
        };
        let text = frame(&s);
        assert!(text.contains("job 9 attempt 0 on n1: running, 3 samples every 0.5s"), "{text}");
        assert!(text.contains("3       80%    30000 MiB  ▁▅▇"), "{text}");
        assert!(text.contains("CPU 1.50 cores   memory 2.0G"), "{text}");
        assert_eq!(sparkline(&[0, 100, 100], 2), "██");
    }
}

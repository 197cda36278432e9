//! `kairos report usage`: sreport with efficiency — per account, user, QoS or partition, what
//! the jobs of a window were allocated and what they used, and a TOTAL. It reads the same
//! `ListHistory` query as `kairos history --since … --until …`, so its sums are the sums of
//! `history --json`'s fields (docs/usage.md says how each figure is made).

use std::collections::BTreeMap;

use kairos_proto::v1 as pb;
use serde_json::{json, Value};

use super::figures as fig;
use crate::client::Client;
use crate::output::{print_json, table};

/// What the rows group by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum By {
    Account,
    User,
    Qos,
    Partition,
}

impl By {
    fn key(self, r: &pb::JobRecord) -> String {
        let k = match self {
            By::Account => &r.account,
            By::User => &r.user,
            By::Qos => &r.qos,
            By::Partition => &r.partition,
        };
        if k.is_empty() {
            "-".into()
        } else {
            k.clone()
        }
    }
}

/// One row: the sums over its jobs (raw, as `history --json` has them) and the figures made of
/// them.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Row {
    pub key: String,
    pub jobs: u64,
    pub gpu_seconds: u64,
    pub gpu_ms: u64,
    pub gpu_busy_ms: u64,
    /// Σ cpu_time_ms and Σ req_cpus × run_ms over jobs that asked for CPUs and ran.
    pub cpu_time_ms: u64,
    pub cpu_core_ms: u128,
    /// Σ max_rss_kib and Σ req_memory_mib × 1024 over jobs that asked for memory and measured it.
    pub max_rss_kib: u64,
    pub req_memory_kib: u64,
    pub preemptions: u64,
    pub preempted_jobs: u64,
    /// GPU-ms measured in runs before the last of preempted jobs (see `lost_gpu_ms`).
    pub lost_gpu_ms: u64,
    /// Per job: GPU memory peak over device memory (%), and wait (s).
    pub gpu_mem_pcts: Vec<f64>,
    pub waits_s: Vec<f64>,
}

/// GPU-time lost to preemption, as far as the record tells: its `gpu_seconds` cover only its
/// last run while `gpu_ms` (sampled) covers every attempt, so for a preempted job the GPU-ms
/// measured beyond its last run's allocation are the earlier, preempted runs'. An upper bound
/// of lost work (a checkpoint may have saved some); 0 for unmeasured or never preempted jobs.
pub fn lost_gpu_ms(r: &pb::JobRecord) -> u64 {
    if r.preemptions == 0 {
        return 0;
    }
    r.gpu_ms.saturating_sub(r.gpu_seconds.saturating_mul(1000))
}

impl Row {
    fn add(&mut self, r: &pb::JobRecord) {
        self.jobs += 1;
        self.gpu_seconds += r.gpu_seconds;
        self.gpu_ms += r.gpu_ms;
        self.gpu_busy_ms += r.gpu_busy_ms;
        if fig::cpu_core_ms(r) > 0 {
            self.cpu_time_ms += r.cpu_time_ms;
            self.cpu_core_ms += fig::cpu_core_ms(r);
        }
        if fig::mem_eff_pct(r).is_some() {
            self.max_rss_kib += r.max_rss_kib;
            self.req_memory_kib += r.req_memory_mib * 1024;
        }
        self.preemptions += u64::from(r.preemptions);
        self.preempted_jobs += u64::from(r.preemptions > 0);
        self.lost_gpu_ms += lost_gpu_ms(r);
        self.gpu_mem_pcts.extend(fig::gpu_mem_pct(r));
        self.waits_s.extend(fig::wait_s(r));
    }

    pub fn idle_share(&self) -> Option<f64> {
        (self.gpu_ms > 0).then(|| 1.0 - self.gpu_busy_ms as f64 / self.gpu_ms as f64)
    }

    pub fn cpu_eff_pct(&self) -> Option<f64> {
        (self.cpu_core_ms > 0).then(|| 100.0 * self.cpu_time_ms as f64 / self.cpu_core_ms as f64)
    }

    pub fn mem_eff_pct(&self) -> Option<f64> {
        (self.req_memory_kib > 0).then(|| 100.0 * self.max_rss_kib as f64 / self.req_memory_kib as f64)
    }

    fn json(&self) -> Value {
        json!({
            "key": self.key,
            "jobs": self.jobs,
            "gpu_seconds": self.gpu_seconds,
            "gpu_hours": fig::json_num(Some(self.gpu_seconds as f64 / 3600.0)),
            "gpu_ms": self.gpu_ms,
            "gpu_busy_ms": self.gpu_busy_ms,
            "busy_gpu_hours": fig::json_num(Some(self.gpu_busy_ms as f64 / 3.6e6)),
            "idle_share": fig::json_num(self.idle_share()),
            "gpu_mem_p95_pct": fig::json_num(fig::percentile(&self.gpu_mem_pcts, 95.0)),
            "cpu_time_ms": self.cpu_time_ms,
            "cpu_core_ms": self.cpu_core_ms as u64,
            "cpu_eff_pct": fig::json_num(self.cpu_eff_pct()),
            "max_rss_kib": self.max_rss_kib,
            "req_memory_kib": self.req_memory_kib,
            "mem_eff_pct": fig::json_num(self.mem_eff_pct()),
            "preemptions": self.preemptions,
            "preempted_jobs": self.preempted_jobs,
            "gpu_hours_lost": fig::json_num(Some(self.lost_gpu_ms as f64 / 3.6e6)),
            "wait_p50_s": fig::json_num(fig::percentile(&self.waits_s, 50.0)),
            "wait_p99_s": fig::json_num(fig::percentile(&self.waits_s, 99.0)),
        })
    }

    fn cells(&self) -> Vec<String> {
        let opt = |v: Option<f64>, digits: usize| v.map_or_else(|| "-".into(), |v| format!("{v:.digits$}"));
        vec![
            self.key.clone(),
            self.jobs.to_string(),
            format!("{:.2}", self.gpu_seconds as f64 / 3600.0),
            format!("{:.2}", self.gpu_busy_ms as f64 / 3.6e6),
            opt(self.idle_share().map(|s| s * 100.0), 1),
            opt(fig::percentile(&self.gpu_mem_pcts, 95.0), 1),
            opt(self.cpu_eff_pct(), 1),
            opt(self.mem_eff_pct(), 1),
            self.preemptions.to_string(),
            format!("{:.2}", self.lost_gpu_ms as f64 / 3.6e6),
            opt(fig::percentile(&self.waits_s, 50.0), 0),
            opt(fig::percentile(&self.waits_s, 99.0), 0),
        ]
    }
}

pub const HEADER: [&str; 12] = [
    "GROUP",
    "JOBS",
    "GPU_HOURS",
    "BUSY_GPU_HOURS",
    "IDLE_%",
    "GPU_MEM_P95_%",
    "CPU_EFF_%",
    "MEM_EFF_%",
    "PREEMPTIONS",
    "GPU_HOURS_LOST",
    "WAIT_P50_S",
    "WAIT_P99_S",
];

/// The rows per group (by key) and the TOTAL over every record.
pub fn rows(records: &[pb::JobRecord], by: By) -> (Vec<Row>, Row) {
    let mut groups: BTreeMap<String, Row> = BTreeMap::new();
    let mut total = Row { key: "TOTAL".into(), ..Row::default() };
    for r in records {
        let key = by.key(r);
        groups.entry(key.clone()).or_insert_with(|| Row { key, ..Row::default() }).add(r);
        total.add(r);
    }
    (groups.into_values().collect(), total)
}

pub fn report_json(rows: &[Row], total: &Row, by: By, since_ms: i64, until_ms: i64) -> Value {
    json!({
        "by": format!("{by:?}").to_ascii_lowercase(),
        "since": crate::output::time_json(since_ms),
        "until": crate::output::time_json(until_ms),
        "groups": rows.iter().map(Row::json).collect::<Vec<_>>(),
        "total": total.json(),
    })
}

/// CSV: the table's header and rows, TOTAL last (group names quoted when they need it).
pub fn report_csv(rows: &[Row], total: &Row) -> String {
    let quote = |c: &str| {
        if c.contains([',', '"', '\n']) {
            format!("\"{}\"", c.replace('"', "\"\""))
        } else {
            c.to_string()
        }
    };
    let mut out = HEADER.join(",") + "\n";
    for row in rows.iter().chain(std::iter::once(total)) {
        out += &row.cells().iter().map(|c| quote(c)).collect::<Vec<_>>().join(",");
        out.push('\n');
    }
    out
}

#[derive(clap::Args, Debug)]
pub struct UsageArgs {
    /// Jobs live at or after this time: a time ago (`30d`), a date or an RFC 3339 time.
    #[arg(long, short = 'S', default_value = "30d")]
    pub since: String,
    /// Jobs live at or before this time (same forms). Default: now.
    #[arg(long, short = 'E')]
    pub until: Option<String>,
    /// Rows per account, user, QoS or partition.
    #[arg(long, value_enum, default_value = "account")]
    pub by: By,
    /// Print CSV (the table's columns, TOTAL last); --json prints JSON.
    #[arg(long)]
    pub csv: bool,
}

pub async fn usage(client: &Client, json: bool, args: UsageArgs) -> anyhow::Result<i32> {
    let now = super::records::now_ms();
    let (since, until) = super::records::window(Some(&args.since), args.until.as_deref(), 0, now)?;
    let request = pb::ListHistoryRequest { since_ms: since, until_ms: until, ..Default::default() };
    let records = super::records::all(client, request).await?;
    let (rows, total) = rows(&records, args.by);
    if json && args.csv {
        anyhow::bail!("--json and --csv: choose one");
    }
    if json {
        print_json(&report_json(&rows, &total, args.by, since, until));
    } else if args.csv {
        print!("{}", report_csv(&rows, &total));
    } else {
        let lines: Vec<Vec<String>> = rows.iter().chain(std::iter::once(&total)).map(Row::cells).collect();
        table(&HEADER, &lines);
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::insight::figures::tests::record;

    fn history() -> Vec<pb::JobRecord> {
        let mut a = record(1, 2, 3_600_000); // 2 GPU-hours
        a.gpu_ms = 7_200_000;
        a.gpu_busy_ms = 3_600_000;
        a.gpu_mem_max_mib = 40_000;
        a.gpu_mem_device_mib = 80_000;
        a.req_cpus = 4;
        a.cpu_time_ms = 3_600_000;
        a.req_memory_mib = 1024;
        a.max_rss_kib = 512 * 1024;
        let mut b = record(2, 1, 1_800_000);
        b.account = "nlp".into();
        b.gpu_ms = 3_600_000; // 1 h measured over two attempts, the last 0.5 h
        b.gpu_busy_ms = 360_000;
        b.gpu_mem_max_mib = 8_000;
        b.gpu_mem_device_mib = 80_000;
        b.preemptions = 1;
        b.start_time_ms = b.submit_time_ms + 600_000;
        let mut c = record(3, 0, 600_000); // CPU-only, nothing asked
        c.cpu_time_ms = 600_000;
        c.start_time_ms = 0;
        vec![a, b, c]
    }

    #[test]
    fn groups_sum_their_jobs_and_the_total_sums_every_job() {
        let (rows, total) = rows(&history(), By::Account);
        assert_eq!(
            rows.iter().map(|r| (r.key.as_str(), r.jobs)).collect::<Vec<_>>(),
            [("nlp", 1), ("vision", 2)]
        );
        let vision = &rows[1];
        assert_eq!(vision.gpu_seconds, 7_200);
        assert_eq!(vision.idle_share(), Some(0.5));
        assert_eq!(vision.cpu_eff_pct(), Some(25.0), "the CPU-only job asked none: not counted");
        assert_eq!(vision.mem_eff_pct(), Some(50.0));
        assert_eq!(total.jobs, 3);
        assert_eq!(total.gpu_seconds, rows.iter().map(|r| r.gpu_seconds).sum::<u64>());
        assert_eq!(total.gpu_busy_ms, 3_960_000);
        assert_eq!((total.preemptions, total.preempted_jobs), (1, 1));
        assert_eq!(total.lost_gpu_ms, 1_800_000, "the measured GPU-ms beyond its last run's");
        assert_eq!(fig::percentile(&total.gpu_mem_pcts, 95.0), Some(50.0));
        assert_eq!(fig::percentile(&total.waits_s, 50.0), Some(60.0));
        assert_eq!(fig::percentile(&total.waits_s, 99.0), Some(600.0));
    }

    #[test]
    fn json_and_csv_carry_the_groups_and_total() {
        let (rows, total) = rows(&history(), By::Qos);
        assert_eq!(rows.len(), 1);
        let j = report_json(&rows, &total, By::Qos, 0, 0);
        assert_eq!(j["by"], "qos");
        assert_eq!(j["total"]["gpu_seconds"], 9_000);
        assert_eq!(j["total"]["gpu_hours"], 2.5);
        assert_eq!(j["total"]["busy_gpu_hours"], 1.1);
        assert_eq!(j["groups"][0]["key"], "training");
        assert_eq!(j["total"]["idle_share"], 0.63);
        let csv = report_csv(&rows, &total);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("GROUP,JOBS,GPU_HOURS"));
        assert!(lines[2].starts_with("TOTAL,3,2.50,1.10,63.3,"), "{}", lines[2]);
    }
}

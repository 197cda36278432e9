//! `kairos report usage`: sreport with efficiency — per account, user, QoS or partition, what
//! was held and what was used, over the same records `kairos history` lists for the window (so
//! the totals are the sums of its records).

use std::collections::BTreeMap;

use clap::{Args, ValueEnum};
use kairos_proto::v1 as pb;
use serde::Serialize;

use super::figures;
use crate::client::Client;
use crate::output::{print_json, table};

#[derive(Args, Debug)]
pub struct ReportArgs {
    /// Jobs live at or after this time: a time ago (`30d`), a date or an RFC 3339 time.
    #[arg(long, short = 'S', default_value = "30d")]
    pub since: String,
    /// Jobs live at or before this time (default: now).
    #[arg(long, short = 'E')]
    pub until: Option<String>,
    /// One row per account, user, QoS or partition.
    #[arg(long, value_enum, default_value_t = By::Account)]
    pub by: By,
    /// Comma-separated values instead of a table.
    #[arg(long)]
    pub csv: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum By {
    Account,
    User,
    Qos,
    Partition,
}

/// One row of the report (and its total).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Row {
    pub key: String,
    pub jobs: u64,
    /// GPU-hours held (GPUs × run time), and of those measured busy.
    pub gpu_hours: f64,
    pub busy_gpu_hours: f64,
    /// Share of the measured GPU time that was idle (None: nothing measured).
    pub idle_share: Option<f64>,
    /// 95th percentile over its jobs of peak GPU memory over the GPU's memory.
    pub gpu_mem_p95: Option<f64>,
    /// CPU time over what the CPUs asked for could give; peak memory over what was asked.
    pub cpu_eff: Option<f64>,
    pub mem_eff: Option<f64>,
    pub preemptions: u64,
    /// GPU-hours of work preemptions lost (from the controllers' preemption records).
    pub gpu_hours_lost: f64,
    pub wait_p50_s: Option<f64>,
    pub wait_p99_s: Option<f64>,
}

pub async fn report(client: &Client, json: bool, args: ReportArgs) -> anyhow::Result<i32> {
    let now = crate::args::now_ms();
    let since = crate::args::parse_when(&args.since, now).map_err(|e| anyhow::anyhow!("--since: {e}"))?;
    let until = match &args.until {
        Some(s) => crate::args::parse_when(s, now).map_err(|e| anyhow::anyhow!("--until: {e}"))?,
        None => 0,
    };
    let records = super::records(
        client,
        pb::ListHistoryRequest { since_ms: since, until_ms: until, ..Default::default() },
    )
    .await?;
    // Preemption records are the operators' view; without them no loss is counted.
    let lost: BTreeMap<u64, u64> = client
        .admin(pb::ListPreemptionsRequest { since_ms: since }, |mut c, r| async move {
            c.list_preemptions(r).await
        })
        .await
        .map(|r| r.into_inner().preemptions)
        .unwrap_or_default()
        .into_iter()
        .fold(BTreeMap::new(), |mut m, p| {
            *m.entry(p.victim).or_default() += p.gpu_s_lost;
            m
        });
    let (rows, total) = summarise(&records, args.by, &lost);
    if json {
        print_json(
            &serde_json::json!({ "by": format!("{:?}", args.by).to_lowercase(), "rows": rows, "total": total }),
        );
    } else {
        print_rows(&rows, &total, args.csv);
    }
    Ok(0)
}

fn key_of(r: &pb::JobRecord, by: By) -> String {
    let k = match by {
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

/// The rows per group, and the total over every record.
pub fn summarise(records: &[pb::JobRecord], by: By, lost_gpu_s: &BTreeMap<u64, u64>) -> (Vec<Row>, Row) {
    let mut groups: BTreeMap<String, Vec<&pb::JobRecord>> = BTreeMap::new();
    for r in records {
        groups.entry(key_of(r, by)).or_default().push(r);
    }
    let rows = groups.into_iter().map(|(k, rs)| row(k, &rs, lost_gpu_s)).collect();
    let all: Vec<&pb::JobRecord> = records.iter().collect();
    (rows, row("TOTAL".into(), &all, lost_gpu_s))
}

fn row(key: String, rs: &[&pb::JobRecord], lost_gpu_s: &BTreeMap<u64, u64>) -> Row {
    let sum = |f: fn(&pb::JobRecord) -> u64| rs.iter().map(|r| f(r)).sum::<u64>();
    let (gpu_ms, busy_ms) = (sum(|r| r.gpu_ms), sum(|r| r.gpu_busy_ms));
    let cpu_asked: f64 = rs.iter().map(|r| f64::from(r.req_cpus) * r.run_ms as f64).sum();
    let mem_rs: Vec<&&pb::JobRecord> =
        rs.iter().filter(|r| r.req_memory_mib > 0 && r.max_rss_kib > 0).collect();
    let mem_asked: f64 = mem_rs.iter().map(|r| r.req_memory_mib as f64 * 1024.0).sum();
    let gpu_mem: Vec<f64> = rs.iter().filter_map(|r| figures::gpu_mem_share(r)).map(|p| p / 100.0).collect();
    let waits: Vec<f64> = rs.iter().filter_map(|r| figures::wait_s(r)).collect();
    Row {
        key,
        jobs: rs.len() as u64,
        gpu_hours: rs.iter().map(|r| figures::gpu_hours(r)).sum(),
        busy_gpu_hours: rs.iter().map(|r| figures::busy_gpu_hours(r)).sum(),
        idle_share: (gpu_ms > 0).then(|| 1.0 - busy_ms as f64 / gpu_ms as f64),
        gpu_mem_p95: figures::quantile(&gpu_mem, 0.95),
        cpu_eff: (cpu_asked > 0.0)
            .then(|| sum(|r| if r.req_cpus > 0 { r.cpu_time_ms } else { 0 }) as f64 / cpu_asked),
        mem_eff: (mem_asked > 0.0)
            .then(|| mem_rs.iter().map(|r| r.max_rss_kib as f64).sum::<f64>() / mem_asked),
        preemptions: sum(|r| u64::from(r.preemptions)),
        gpu_hours_lost: rs.iter().map(|r| lost_gpu_s.get(&r.id).copied().unwrap_or(0) as f64 / 3600.0).sum(),
        wait_p50_s: figures::quantile(&waits, 0.5),
        wait_p99_s: figures::quantile(&waits, 0.99),
    }
}

const HEADER: [&str; 12] = [
    "KEY",
    "JOBS",
    "GPU_HOURS",
    "BUSY_GPU_HOURS",
    "IDLE",
    "GPU_MEM_P95",
    "CPU_EFF",
    "MEM_EFF",
    "PREEMPTIONS",
    "GPU_HOURS_LOST",
    "WAIT_P50",
    "WAIT_P99",
];

fn cells(r: &Row) -> Vec<String> {
    let share = |v: Option<f64>| v.map_or_else(|| "-".into(), |v| format!("{:.1}%", v * 100.0));
    let secs = |v: Option<f64>| v.map_or_else(|| "-".into(), super::eff::duration);
    vec![
        r.key.clone(),
        r.jobs.to_string(),
        format!("{:.3}", r.gpu_hours),
        format!("{:.3}", r.busy_gpu_hours),
        share(r.idle_share),
        share(r.gpu_mem_p95),
        share(r.cpu_eff),
        share(r.mem_eff),
        r.preemptions.to_string(),
        format!("{:.3}", r.gpu_hours_lost),
        secs(r.wait_p50_s),
        secs(r.wait_p99_s),
    ]
}

fn print_rows(rows: &[Row], total: &Row, csv: bool) {
    let mut all: Vec<Vec<String>> = rows.iter().map(cells).collect();
    all.push(cells(total));
    if csv {
        println!("{}", HEADER.join(",").to_lowercase());
        for r in all {
            println!("{}", r.join(","));
        }
    } else {
        table(&HEADER, &all);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: u64, qos: &str, gpu_seconds: u64, busy: u64, wait_ms: i64) -> pb::JobRecord {
        pb::JobRecord {
            id,
            qos: qos.into(),
            gpu_seconds,
            gpu_ms: gpu_seconds * 1000,
            gpu_busy_ms: busy,
            submit_time_ms: 1_000,
            start_time_ms: 1_000 + wait_ms,
            req_cpus: 2,
            run_ms: 10_000,
            cpu_time_ms: 5_000,
            preemptions: (id % 2) as u32,
            ..Default::default()
        }
    }

    #[test]
    fn groups_add_up_to_the_total_and_the_total_to_the_records() {
        let records = vec![
            job(1, "training", 3600, 1_800_000, 0),
            job(2, "training", 7200, 0, 4_000),
            job(3, "inference", 360, 360_000, 1_000),
        ];
        let lost = BTreeMap::from([(1, 1800)]);
        let (rows, total) = summarise(&records, By::Qos, &lost);
        assert_eq!(rows.iter().map(|r| r.key.as_str()).collect::<Vec<_>>(), ["inference", "training"]);
        let training = &rows[1];
        assert_eq!((training.jobs, training.gpu_hours, training.busy_gpu_hours), (2, 3.0, 0.5));
        assert_eq!(training.idle_share, Some(1.0 - 1_800_000.0 / 10_800_000.0));
        assert_eq!((training.preemptions, training.gpu_hours_lost), (1, 0.5));
        assert_eq!((total.jobs, total.gpu_hours), (3, 3.1));
        assert_eq!(rows.iter().map(|r| r.busy_gpu_hours).sum::<f64>(), total.busy_gpu_hours);
        assert_eq!(total.cpu_eff, Some(0.25));
        assert_eq!((total.wait_p50_s, total.wait_p99_s), (Some(1.0), Some(4.0)));
        assert_eq!(cells(&total)[6], "25.0%");
    }
}

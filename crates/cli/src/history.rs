//! `kairos history`: accounting, like Slurm's sacct — finished jobs (also those purged from the
//! live state into the history) and unfinished ones, filtered by time, user, account and state.

use std::time::{Duration, UNIX_EPOCH};

use clap::Args;
use kairos_proto::v1 as pb;
use serde_json::{json, Value};

use crate::args::{now_ms, parse_when};
use crate::client::Client;
use crate::insight::figures;
use crate::output::{job_state_name, print_json, table, time_json};

#[derive(Args, Debug)]
pub struct HistoryArgs {
    /// Jobs live at or after this time: a time ago (`2h`, `7d`), a date (`2026-11-30`) or an RFC
    /// 3339 time (`2026-11-30T08:00:00Z`). Default: 1 day ago.
    #[arg(long, short = 'S')]
    pub since: Option<String>,
    /// Jobs live at or before this time (same forms). Default: now.
    #[arg(long, short = 'E')]
    pub until: Option<String>,
    /// Only this user's jobs.
    #[arg(long, short = 'u')]
    pub user: Option<String>,
    /// Only jobs in these states, comma-separated (e.g. FAILED,TIMEOUT).
    #[arg(long, short = 's', value_delimiter = ',')]
    pub state: Vec<String>,
    /// Only this account's jobs.
    #[arg(long, short = 'A')]
    pub account: Option<String>,
    /// Columns, comma-separated, of ID, NAME, USER, ACCOUNT, PARTITION, QOS, STATE, EXIT, GPUS,
    /// NODE, SUBMIT, START, END, ELAPSED, GPU_SECONDS, PREEMPTIONS, ATTEMPTS, REQ_CPUS, REQ_MEM,
    /// MAX_RSS, CPU_TIME, GPU_UTIL, GPU_UTIL_MAX, GPU_MEM_MAX, CPU_EFF, MEM_EFF, REASON (sacct's
    /// ReqCPUS, ReqMem, MaxRSS, TotalCPU; GPU_UTIL is the time-weighted mean of its GPUs'
    /// utilisation — TRESUsageInAve of gres/gpuutil —, GPU_UTIL_MAX and GPU_MEM_MAX the peaks on
    /// one GPU — TRESUsageInMax of gres/gpuutil and gres/gpumem —, CPU_EFF and MEM_EFF seff's
    /// CPU and memory efficiency; all attempts and tasks, as their nodes measured them).
    #[arg(long, value_delimiter = ',')]
    pub format: Vec<String>,
    /// Write the window as a history trace (JSONL) to FILE instead: every job live in it with
    /// what the planner reads and the work it needed, the nodes and their recorded changes,
    /// and the policy — what `kairos sim --history FILE` and `kairos policy what-if` replay.
    #[arg(long, value_name = "FILE.jsonl", conflicts_with_all = ["user", "state", "account", "format"])]
    pub export_trace: Option<std::path::PathBuf>,
}

/// Every column `--format` knows, in the default order.
const COLUMNS: [&str; 27] = [
    "ID",
    "NAME",
    "USER",
    "ACCOUNT",
    "PARTITION",
    "QOS",
    "STATE",
    "EXIT",
    "GPUS",
    "NODE",
    "SUBMIT",
    "START",
    "END",
    "ELAPSED",
    "GPU_SECONDS",
    "PREEMPTIONS",
    "ATTEMPTS",
    "REQ_CPUS",
    "REQ_MEM",
    "MAX_RSS",
    "CPU_TIME",
    "GPU_UTIL",
    "GPU_UTIL_MAX",
    "GPU_MEM_MAX",
    "CPU_EFF",
    "MEM_EFF",
    "REASON",
];
/// The columns shown without `--format`.
const DEFAULT: [&str; 14] = [
    "ID",
    "NAME",
    "USER",
    "QOS",
    "STATE",
    "EXIT",
    "GPUS",
    "NODE",
    "SUBMIT",
    "START",
    "END",
    "ELAPSED",
    "GPU_SECONDS",
    "PREEMPTIONS",
];

fn elapsed_s(r: &pb::JobRecord, now: i64) -> i64 {
    match (r.start_time_ms, r.end_time_ms) {
        (0, _) => 0,
        (start, 0) => (now - start) / 1000,
        (start, end) => (end - start).max(0) / 1000,
    }
}

/// D-HH:MM:SS like sacct's Elapsed.
fn clock(seconds: i64) -> String {
    let (d, rest) = (seconds / 86_400, seconds % 86_400);
    let hms = format!("{:02}:{:02}:{:02}", rest / 3600, rest % 3600 / 60, rest % 60);
    if d > 0 {
        format!("{d}-{hms}")
    } else {
        hms
    }
}

fn when(ms: i64) -> String {
    if ms <= 0 {
        return "-".into();
    }
    let t = UNIX_EPOCH + Duration::from_millis(ms as u64);
    humantime::format_rfc3339_seconds(t).to_string()
}

pub fn record_json(r: &pb::JobRecord, now: i64) -> Value {
    json!({
        "id": r.id,
        "name": r.name,
        "user": r.user,
        "account": r.account,
        "partition": r.partition,
        "qos": r.qos,
        "state": job_state_name(r.state),
        "reason": r.reason,
        "exit_code": r.exit_code,
        "signal": if r.signal == 0 { Value::Null } else { json!(r.signal) },
        "gpus": r.gpus,
        "node": if r.node.is_empty() { Value::Null } else { Value::String(r.node.clone()) },
        "submit_time": time_json(r.submit_time_ms),
        "start_time": time_json(r.start_time_ms),
        "end_time": time_json(r.end_time_ms),
        "elapsed_s": elapsed_s(r, now),
        "gpu_seconds": r.gpu_seconds,
        "preemptions": r.preemptions,
        "attempts": r.attempts,
        "req_cpus": r.req_cpus,
        "req_memory_mib": r.req_memory_mib,
        "max_rss_kib": r.max_rss_kib,
        "cpu_time_ms": r.cpu_time_ms,
        "run_ms": r.run_ms,
        "gpu_ms": r.gpu_ms,
        "gpu_busy_ms": r.gpu_busy_ms,
        "gpu_util": figures::gpu_util(r),
        "gpu_util_p95": r.gpu_util_p95_pct,
        "gpu_util_max": r.gpu_util_max_pct,
        "gpu_mem_max_mib": r.gpu_mem_max_mib,
        "gpu_mem_device_mib": r.gpu_mem_device_mib,
        "cpu_eff": figures::cpu_eff(r),
        "mem_eff": figures::mem_eff(r),
        "time_limit_s": r.time_limit_s,
        "idle_note": if r.idle_note.is_empty() { Value::Null } else { json!(r.idle_note) },
        "purged": r.purged,
        "array_job_id": if r.array_job_id == 0 { Value::Null } else { json!(r.array_job_id) },
        "array_task_id": if r.array_job_id == 0 { Value::Null } else { json!(r.array_task_id) },
    })
}

fn cell(r: &pb::JobRecord, column: &str, now: i64) -> String {
    let or_dash = |s: &str| if s.is_empty() { "-".to_string() } else { s.to_string() };
    match column {
        // An array task as `queue` shows it (sacct's JobID).
        "ID" if r.array_job_id != 0 => format!("{}_{}", r.array_job_id, r.array_task_id),
        "ID" => r.id.to_string(),
        "NAME" => or_dash(&r.name),
        "USER" => r.user.clone(),
        "ACCOUNT" => or_dash(&r.account),
        "PARTITION" => or_dash(&r.partition),
        "QOS" => r.qos.clone(),
        "STATE" => job_state_name(r.state).to_string(),
        "EXIT" => match (r.exit_code, r.signal) {
            (Some(code), _) => code.to_string(),
            (None, 0) => "-".into(),
            (None, sig) => format!("sig{sig}"),
        },
        "GPUS" => r.gpus.to_string(),
        "NODE" => or_dash(&r.node),
        "SUBMIT" => when(r.submit_time_ms),
        "START" => when(r.start_time_ms),
        "END" => when(r.end_time_ms),
        "ELAPSED" => clock(elapsed_s(r, now)),
        "GPU_SECONDS" => r.gpu_seconds.to_string(),
        "PREEMPTIONS" => r.preemptions.to_string(),
        "ATTEMPTS" => r.attempts.to_string(),
        "REQ_CPUS" => r.req_cpus.to_string(),
        "REQ_MEM" => crate::output::mib(r.req_memory_mib),
        "MAX_RSS" => format!("{}K", r.max_rss_kib),
        // sacct's TotalCPU: [D-]HH:MM:SS.mmm
        "CPU_TIME" => format!("{}.{:03}", clock((r.cpu_time_ms / 1000) as i64), r.cpu_time_ms % 1000),
        "GPU_UTIL" => figures::pct(figures::gpu_util(r)),
        "GPU_UTIL_MAX" if r.gpu_ms > 0 => format!("{}%", r.gpu_util_max_pct),
        "GPU_MEM_MAX" if r.gpu_ms > 0 => format!("{}M", r.gpu_mem_max_mib),
        "GPU_UTIL_MAX" | "GPU_MEM_MAX" => "-".into(),
        "CPU_EFF" => figures::pct(figures::cpu_eff(r)),
        "MEM_EFF" => figures::pct(figures::mem_eff(r)),
        _ => or_dash(&r.reason),
    }
}

pub async fn history(client: &Client, json: bool, args: HistoryArgs) -> anyhow::Result<i32> {
    let now = now_ms();
    let since = match &args.since {
        Some(s) => parse_when(s, now).map_err(|e| anyhow::anyhow!("--since: {e}"))?,
        None => now - 86_400_000,
    };
    let until = match &args.until {
        Some(s) => parse_when(s, now).map_err(|e| anyhow::anyhow!("--until: {e}"))?,
        None => 0,
    };
    if let Some(path) = &args.export_trace {
        return crate::whatif::export_trace(client, since, until, path).await;
    }
    let states = args
        .state
        .iter()
        .map(|s| {
            crate::jobs::state_of(s)
                .map(|s| s as i32)
                .ok_or_else(|| anyhow::anyhow!("--state: unknown state \"{s}\""))
        })
        .collect::<anyhow::Result<Vec<i32>>>()?;
    let columns: Vec<&str> = if args.format.is_empty() {
        DEFAULT.to_vec()
    } else {
        args.format
            .iter()
            .map(|c| {
                COLUMNS.iter().copied().find(|h| h.eq_ignore_ascii_case(c.trim())).ok_or_else(|| {
                    anyhow::anyhow!("--format: unknown column \"{c}\" (use {})", COLUMNS.join(","))
                })
            })
            .collect::<anyhow::Result<Vec<&str>>>()?
    };
    let request = pb::ListHistoryRequest {
        since_ms: since,
        until_ms: until,
        user: args.user.unwrap_or_default(),
        account: args.account.unwrap_or_default(),
        states,
        ..Default::default()
    };
    let records = crate::insight::records(client, request).await?;
    if json {
        print_json(&Value::Array(records.iter().map(|r| record_json(r, now)).collect()));
    } else {
        let rows: Vec<Vec<String>> =
            records.iter().map(|r| columns.iter().map(|c| cell(r, c, now)).collect()).collect();
        table(&columns, &rows);
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_parse_as_ago_dates_and_rfc3339() {
        let now = 1_764_547_200_000; // 2025-12-01T00:00:00Z
        assert_eq!(parse_when("2h", now), Ok(now - 7_200_000));
        assert_eq!(parse_when("2025-11-30", now), Ok(now - 86_400_000));
        assert_eq!(parse_when("2025-11-30T12:00:00Z", now), Ok(now - 43_200_000));
        assert!(parse_when("yesterday-ish", now).unwrap_err().contains("cannot parse \"yesterday-ish\""));
        assert_eq!(clock(93_784), "1-02:03:04");
        assert_eq!(clock(59), "00:00:59");
    }
}

//! How the CLI prints things: JSON objects for scripts (`--json`), tables and key/value lists
//! for people. The JSON keys are a contract users' scripts rely on; add keys, never rename.

use std::time::{Duration, UNIX_EPOCH};

use kairos_proto::v1 as pb;
use serde_json::{json, Value};

pub fn job_state_name(state: i32) -> &'static str {
    match pb::JobState::try_from(state) {
        Ok(pb::JobState::Pending) => "PENDING",
        Ok(pb::JobState::Running) => "RUNNING",
        Ok(pb::JobState::Completed) => "COMPLETED",
        Ok(pb::JobState::Failed) => "FAILED",
        Ok(pb::JobState::Cancelled) => "CANCELLED",
        Ok(pb::JobState::Timeout) => "TIMEOUT",
        Ok(pb::JobState::NodeFail) => "NODE_FAIL",
        Ok(pb::JobState::Preempting) => "PREEMPTING",
        Ok(pb::JobState::Suspended) => "SUSPENDED",
        Ok(pb::JobState::OutOfMemory) => "OUT_OF_MEMORY",
        _ => "UNKNOWN",
    }
}

pub(crate) fn profile_name(p: i32) -> &'static str {
    match pb::Profile::try_from(p) {
        Ok(pb::Profile::Training) => "training",
        Ok(pb::Profile::Inference) => "inference",
        Ok(pb::Profile::Batch) => "batch",
        Ok(pb::Profile::Interactive) => "interactive",
        _ => "",
    }
}

fn node_state_name(s: i32) -> &'static str {
    match pb::NodeState::try_from(s) {
        Ok(pb::NodeState::Up) => "UP",
        Ok(pb::NodeState::Draining) => "DRAINING",
        Ok(pb::NodeState::Down) => "DOWN",
        _ => "UNKNOWN",
    }
}

/// RFC 3339 time, or null for "not yet" (0).
pub fn time_json(ms: i64) -> Value {
    if ms <= 0 {
        return Value::Null;
    }
    let t = UNIX_EPOCH + Duration::from_millis(ms as u64);
    Value::String(humantime::format_rfc3339_millis(t).to_string())
}

/// A time as people read it, in the local time zone (`2026-12-07T10:00:00`, as squeue
/// prints it); "N/A" for none (0).
pub fn local_time(ms: i64) -> String {
    if ms <= 0 {
        return "N/A".into();
    }
    let secs = ms.div_euclid(1000) as libc::time_t;
    // SAFETY: tzset reads TZ into libc's globals; localtime_r writes only into `tm`, which
    // outlives the call.
    let tm = unsafe {
        tzset();
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&secs, &mut tm).is_null() {
            return text(&time_json(ms));
        }
        tm
    };
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    )
}

extern "C" {
    /// POSIX: initialises the local time zone from TZ (localtime_r need not).
    fn tzset();
}

pub fn job_json(job: &pb::Job) -> Value {
    let spec = job.spec.clone().unwrap_or_default();
    let gpus = spec.resources.as_ref().map(|r| r.gpus).unwrap_or(0);
    let mut v = json!({
        "id": job.id,
        "name": spec.name,
        "user": job.user,
        "account": spec.account,
        "partition": spec.partition,
        "state": job_state_name(job.state),
        "reason": job.reason,
        "gpus": gpus,
        "node": if job.node.is_empty() { Value::Null } else { Value::String(job.node.clone()) },
        "gpu_ids": job.gpu_ids,
        "nodes": spec.resources.as_ref().map(|r| r.tasks.max(1)).unwrap_or(1),
        "tasks": job.tasks.iter().map(|t| json!({"rank": t.rank, "node": t.node, "gpu_ids": t.gpu_ids})).collect::<Vec<_>>(),
        "exit_code": job.exit_code,
        "signal": if job.signal == 0 { Value::Null } else { json!(job.signal) },
        "attempt": job.attempt,
        "gpu_idle_since": time_json(job.gpu_idle_since_ms),
        "qos": job.qos,
        "profile": profile_name(job.profile),
        "priority": job.priority,
        "time_limit_s": if spec.time_limit_s == 0 { Value::Null } else { json!(spec.time_limit_s) },
        "requeue": spec.requeue.unwrap_or(false),
        "after_ok": spec.after_ok,
        "held": spec.hold,
        "gpu_model": spec.resources.as_ref().map(|r| r.gpu_model.clone()).filter(|m| !m.is_empty()),
        "command": spec.argv,
        "submit_time": time_json(job.submit_time_ms),
        "start_time": time_json(job.start_time_ms),
        "end_time": time_json(job.end_time_ms),
        "last_checkpoint": time_json(job.last_checkpoint_ms),
        "events": job.events.iter().map(|e| json!({"time": time_json(e.time_ms), "kind": e.kind, "message": e.message})).collect::<Vec<_>>(),
        "purged": job.purged,
        "array_job_id": if job.array_job_id == 0 { Value::Null } else { json!(job.array_job_id) },
        "array_task_id": if job.array_job_id == 0 { Value::Null } else { json!(job.array_task_id) },
        "image": spec.container.as_ref().map(|c| c.image.clone()),
        "image_digest": image_digest(job),
        "container_mounts": spec.container.as_ref().map(|c| c.mounts.clone()),
        "container_workdir": spec.container.as_ref().map(|c| c.workdir.clone()).filter(|w| !w.is_empty()),
    });
    // Beside the macro (its recursion bound): what the job asked for besides GPUs.
    let more = [
        ("after_any", json!(spec.after_any)),
        ("after_not_ok", json!(spec.after_not_ok)),
        ("retries", json!(spec.retries)),
        ("cpus", json!(spec.resources.as_ref().map(|r| r.cpus).filter(|c| *c > 0))),
        ("memory_mib", json!(spec.resources.as_ref().map(|r| r.memory_mib).filter(|m| *m > 0))),
        (
            "checkpoint_signal",
            json!(spec.checkpoint.as_ref().map(|c| c.signal.clone()).filter(|s| !s.is_empty())),
        ),
        // The limit it runs under (its own, else its QoS's or partition's).
        ("time_limit", json!((job.effective_time_limit_s > 0).then_some(job.effective_time_limit_s))),
        ("topology", json!(spec.resources.as_ref().and_then(|r| r.topology.as_ref()).map(topology_text))),
        ("domains", json!(domains(job))),
        // Its current run borrows GPUs beyond its account's guarantee.
        ("borrowing", json!(job.borrowing)),
        ("reservation", json!((!spec.reservation.is_empty()).then(|| spec.reservation.clone()))),
        // Pending: when it is expected to start (Unix ms, and as a time) and why then, or why
        // there is no estimate (`kairos queue --start`).
        ("expected_start_ms", json!((job.expected_start_ms > 0).then_some(job.expected_start_ms))),
        ("expected_start", time_json(job.expected_start_ms)),
        ("start_reason", json!((!job.start_reason.is_empty()).then(|| job.start_reason.clone()))),
    ];
    for (k, value) in more {
        v[k] = value;
    }
    v
}

/// A topology ask as the user writes it (`rack=required`; `--switches` shows its count and wait).
fn topology_text(t: &pb::TopologyRequest) -> String {
    let level = if t.level.is_empty() { "lowest level" } else { t.level.as_str() };
    let mut s = format!("{level}={}", if t.required { "required" } else { "preferred" });
    if t.max_domains > 1 {
        s.push_str(&format!(", at most {} domains", t.max_domains));
    }
    if t.relax_after_s > 0 {
        s.push_str(&format!(", preferred after {} s", t.relax_after_s));
    }
    s
}

/// The topology domains the job's latest allocation got, as its `allocated` event names them
/// (`rack r1`; `racks r1, r2 (...)`).
fn domains(job: &pb::Job) -> Option<String> {
    let e = job.events.iter().rev().find(|e| e.kind == "allocated")?;
    e.message.split_once("; ").map(|(_, d)| d.to_string())
}

/// The digest of the image the job's latest run used, from the node's "image" event.
fn image_digest(job: &pb::Job) -> Option<String> {
    let e = job.events.iter().rev().find(|e| e.kind == "image")?;
    let digest = e.message.rsplit_once("(digest ")?.1.trim_end_matches(')');
    Some(digest.to_string())
}

pub fn node_json(node: &pb::Node) -> Value {
    let info = node.info.clone().unwrap_or_default();
    let mut allocated: Vec<(u32, u64)> = node.allocated.iter().map(|(g, j)| (*g, *j)).collect();
    allocated.sort();
    // An open maintenance reservation shows (as Slurm's MAINT) on an up node; a draining or
    // down one keeps its state (the reason column names the reservation).
    let state = if !node.maint.is_empty() && node.state == pb::NodeState::Up as i32 {
        "MAINT"
    } else {
        node_state_name(node.state)
    };
    let mut v = json!({
        "name": node.name,
        "state": state,
        "reason": node.reason,
        "addr": info.addr,
        "gpu_backend": info.gpu_backend,
        "isolation": info.isolation,
        "labels": info.labels.iter().collect::<std::collections::BTreeMap<_, _>>(),
        "gpus": info.gpus.iter().map(|g| json!({
            "index": g.index, "uuid": g.uuid, "model": g.model, "memory_mib": g.memory_mib, "link_group": g.link_group,
            "mig_parent": g.mig_parent,
        })).collect::<Vec<_>>(),
        "gpus_total": info.gpus.len(),
        "gpus_allocated": allocated.len(),
        "cpus_total": info.cpus,
        "cpus_used": node.cpus_used,
        "memory_mib_total": info.memory_mib,
        "memory_mib_used": node.memory_used_mib,
        "allocated": allocated.iter().map(|(g, j)| json!({"gpu": g, "job": j})).collect::<Vec<_>>(),
        "gpus_shared": node.shared.iter().map(|s| json!({"gpu": s.gpu, "job": s.job_id, "fraction": f64::from(s.milli) / 1000.0})).collect::<Vec<_>>(),
        "gpus_unhealthy": node.faults.iter().map(|f| json!({
            "gpu": f.gpu, "reason": f.reason, "since": time_json(f.since_ms),
        })).collect::<Vec<_>>(),
        "last_heartbeat": time_json(node.last_heartbeat_ms),
    });
    // The open maintenance reservation holding it (null: none).
    v["maint"] = json!((!node.maint.is_empty()).then(|| node.maint.clone()));
    v
}

pub fn cluster_json(s: &pb::ClusterStatusResponse) -> Value {
    json!({
        "id": s.id,
        "leader": s.leader,
        "leader_addr": s.leader_addr,
        "term": s.term,
        "last_log_index": s.last_log_index,
        "commit_index": s.commit_index,
        "applied_index": s.applied_index,
        "state_digest": s.state_digest,
        "snapshot_index": s.snapshot_index,
        "replicas": s.replicas.iter().map(|r| json!({"id": r.id, "addr": r.addr, "role": r.role, "reachable": r.reachable})).collect::<Vec<_>>(),
    })
}

fn text(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) if s.is_empty() => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Prints rows as a left-aligned table with a header.
pub fn table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let parts: Vec<String> =
            cells.iter().enumerate().map(|(i, c)| format!("{c:<w$}", w = widths[i])).collect();
        println!("{}", parts.join("  ").trim_end());
    };
    line(header.iter().map(|h| h.to_string()).collect());
    for row in rows {
        line(row.clone());
    }
}

/// A job as one-line messages name it: `ID`, or `ID (ARRAY_INDEX)` for an array task.
pub fn job_label(job: &pb::Job) -> String {
    if job.array_job_id == 0 {
        job.id.to_string()
    } else {
        format!("{} ({}_{})", job.id, job.array_job_id, job.array_task_id)
    }
}

/// A job's id as tables show it: `ID`, or `ARRAY_INDEX` for an array task, or
/// `ARRAY_[INDICES%N]` for pending tasks folded onto one line (`fold_pending_tasks`).
fn shown_id(job: &pb::Job) -> String {
    if job.array_job_id == 0 {
        return job.id.to_string();
    }
    match job.spec.as_ref().map(|s| s.array_indices.as_slice()).filter(|i| i.len() > 1) {
        Some(indices) => {
            let limit =
                if job.array_max_running > 0 { format!("%{}", job.array_max_running) } else { String::new() };
            format!("{}_[{}{limit}]", job.array_job_id, ranges(indices))
        }
        None => format!("{}_{}", job.array_job_id, job.array_task_id),
    }
}

/// `1,2,3,5` as `1-3,5`.
fn ranges(indices: &[u32]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < indices.len() {
        let mut j = i;
        while j + 1 < indices.len() && indices[j + 1] == indices[j] + 1 {
            j += 1;
        }
        out.push(if i == j { indices[i].to_string() } else { format!("{}-{}", indices[i], indices[j]) });
        i = j + 1;
    }
    out.join(",")
}

/// Folds the pending tasks of each job array onto the line of its first pending task (like
/// squeue): that line lists every pending index (`ARRAY_[2-7%2]`).
pub fn fold_pending_tasks(jobs: Vec<pb::Job>) -> Vec<pb::Job> {
    use std::collections::BTreeMap;
    let pending = |j: &pb::Job| j.array_job_id != 0 && j.state == pb::JobState::Pending as i32;
    let mut indices: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
    for j in jobs.iter().filter(|j| pending(j)) {
        indices.entry(j.array_job_id).or_default().push(j.array_task_id);
    }
    let mut out = Vec::with_capacity(jobs.len());
    for mut j in jobs {
        if !pending(&j) {
            out.push(j);
            continue;
        }
        if let Some(mut all) = indices.remove(&j.array_job_id) {
            all.sort_unstable();
            if let Some(spec) = j.spec.as_mut() {
                spec.array_indices = all;
            }
            out.push(j);
        }
    }
    out
}

pub fn job_row(job: &pb::Job) -> Vec<String> {
    let j = job_json(job);
    let gpus = if job.gpu_ids.is_empty() {
        text(&j["gpus"])
    } else {
        format!(
            "{}[{}]",
            text(&j["gpus"]),
            job.gpu_ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
        )
    };
    vec![
        shown_id(job),
        text(&j["name"]),
        text(&j["user"]),
        text(&j["qos"]),
        text(&j["state"]),
        gpus,
        text(&j["node"]),
        // A run whose GPUs its idle GPU rule found idle, or that borrows beyond its team's
        // guarantee, is marked (the columns stay).
        match (job.gpu_idle_since_ms, text(&j["reason"]), job.borrowing) {
            (0, reason, false) => reason,
            (0, r, true) if r.is_empty() || r == "-" => "borrowing".to_string(),
            (0, r, true) => format!("borrowing; {r}"),
            (_, r, _) if r.is_empty() || r == "-" => "GPUs idle".to_string(),
            (_, r, _) => format!("GPUs idle; {r}"),
        },
    ]
}

pub const JOB_HEADER: [&str; 8] = ["ID", "NAME", "USER", "QOS", "STATE", "GPUS", "NODE", "REASON"];

pub fn print_job_details(job: &pb::Job) {
    let j = job_json(job);
    for key in [
        "id",
        "name",
        "user",
        "state",
        "reason",
        "qos",
        "profile",
        "priority",
        "gpus",
        "node",
        "gpu_ids",
        "exit_code",
        "signal",
        "attempt",
        "time_limit_s",
        "time_limit",
        "cpus",
        "memory_mib",
        "gpu_model",
        "topology",
        "domains",
        "borrowing",
        "reservation",
        "checkpoint_signal",
        "after_ok",
        "after_any",
        "after_not_ok",
        "retries",
        "command",
        "image",
        "image_digest",
        "submit_time",
        "start_time",
        "end_time",
        "gpu_idle_since",
    ] {
        println!("{key:>13}: {}", text(&j[key]));
    }
    if job.purged {
        println!("{:>13}: past the retention; only its history record is kept", "purged");
    }
    if job.gpu_idle_since_ms > 0 {
        println!("{:>13}: GPUs idle since {}", "idle", text(&time_json(job.gpu_idle_since_ms)));
    }
    if let Some(line) = expected_start_line(job) {
        println!("{line}");
    }
    if !job.events.is_empty() {
        println!("{:>13}:", "events");
        for e in &job.events {
            println!("    {}  {:<16} {}", text(&time_json(e.time_ms)), e.kind, e.message);
        }
    }
}

/// A pending job's "Expected start: TIME (WHY)", or "Expected start: none (WHY)" when the pass
/// found no start; None for other jobs and pending ones it did not estimate.
pub fn expected_start_line(job: &pb::Job) -> Option<String> {
    if job.state != pb::JobState::Pending as i32 {
        return None;
    }
    match (job.expected_start_ms, job.start_reason.as_str()) {
        (0, "") => None,
        (0, why) => Some(format!("Expected start: none ({why})")),
        (ms, "") => Some(format!("Expected start: {}", local_time(ms))),
        (ms, why) => Some(format!("Expected start: {} ({why})", local_time(ms))),
    }
}

/// `kairos queue --start`'s row of a pending job: its expected start and why then.
pub fn start_row(job: &pb::Job) -> Vec<String> {
    let row = job_row(job);
    let why = if job.start_reason.is_empty() { "-".to_string() } else { job.start_reason.clone() };
    vec![
        row[0].clone(),
        row[1].clone(),
        row[2].clone(),
        row[3].clone(),
        row[5].clone(),
        local_time(job.expected_start_ms),
        why,
        row[7].clone(),
    ]
}

pub const START_HEADER: [&str; 8] =
    ["ID", "NAME", "USER", "QOS", "GPUS", "START_TIME", "START_REASON", "REASON"];

pub fn node_row(node: &pb::Node) -> Vec<String> {
    let n = node_json(node);
    let model = node.info.as_ref().and_then(|i| i.gpus.first()).map(|g| g.model.clone()).unwrap_or_default();
    vec![
        text(&n["name"]),
        text(&n["state"]),
        format!("{}/{}", gpus_used(node), n["gpus_total"]),
        format!("{}/{}", node.cpus_used, node.info.as_ref().map_or(0, |i| i.cpus)),
        format!("{}/{}", mib(node.memory_used_mib), mib(node.info.as_ref().map_or(0, |i| i.memory_mib))),
        if model.is_empty() { "-".into() } else { model },
        text(&n["gpu_backend"]),
        text(&n["isolation"]),
        text(&n["addr"]),
        unhealthy(node),
        match (node.maint.is_empty(), node.reason.is_empty()) {
            (true, _) => text(&n["reason"]),
            (false, true) => format!("maintenance reservation {}", node.maint),
            (false, false) => format!("maintenance reservation {}; {}", node.maint, node.reason),
        },
    ]
}

/// GPUs held whole or shared by fractions.
fn gpus_used(node: &pb::Node) -> usize {
    let shared: std::collections::BTreeSet<u32> = node.shared.iter().map(|s| s.gpu).collect();
    node.allocated.len() + shared.len()
}

/// A node's unhealthy GPUs as `3(XID 79),5(double-bit ECC error)`, or `-`.
fn unhealthy(node: &pb::Node) -> String {
    if node.faults.is_empty() {
        return "-".into();
    }
    node.faults.iter().map(|f| format!("{}({})", f.gpu, f.reason)).collect::<Vec<_>>().join(",")
}

pub const NODE_HEADER: [&str; 11] = [
    "NAME",
    "STATE",
    "GPUS(USED/ALL)",
    "CPUS(USED/ALL)",
    "MEM(USED/ALL)",
    "MODEL",
    "BACKEND",
    "RUNS",
    "ADDR",
    "UNHEALTHY",
    "REASON",
];

/// A size in MiB as people read it: 512M, 1.5G, 2T.
pub fn mib(m: u64) -> String {
    match m {
        0 => "0".into(),
        m if m >= 1 << 20 => format!("{:.1}T", m as f64 / (1u64 << 20) as f64),
        m if m >= 1 << 10 => format!("{:.1}G", m as f64 / 1024.0),
        m => format!("{m}M"),
    }
}

pub fn print_json(v: &serde_json::Value) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

/// Prints a listing: a JSON array with `--json`, else a table.
pub fn print_list<T>(
    json: bool,
    items: &[T],
    to_json: impl Fn(&T) -> serde_json::Value,
    header: &[&str],
    to_row: impl Fn(&T) -> Vec<String>,
) {
    if json {
        print_json(&serde_json::Value::Array(items.iter().map(to_json).collect()));
    } else {
        table(header, &items.iter().map(to_row).collect::<Vec<_>>());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_whose_gpus_are_idle_is_marked_in_the_reason_column_and_its_json() {
        let mut job = pb::Job { id: 4, state: pb::JobState::Running as i32, ..Default::default() };
        assert_eq!(job_row(&job)[7], "-", "no reason: a dash");
        assert_eq!(job_json(&job)["gpu_idle_since"], Value::Null);
        job.gpu_idle_since_ms = 1_764_547_200_000;
        assert_eq!(job_row(&job)[7], "GPUs idle");
        assert_eq!(job_row(&job).len(), JOB_HEADER.len(), "the columns stay as they were");
        assert_eq!(job_json(&job)["gpu_idle_since"], "2025-12-01T00:00:00.000Z");
        job.reason = "held by admin".into();
        assert_eq!(job_row(&job)[7], "GPUs idle; held by admin");
    }

    #[test]
    fn a_node_under_maintenance_shows_maint_and_a_pending_job_its_expected_start() {
        let mut node = pb::Node {
            name: "n1".into(),
            state: pb::NodeState::Up as i32,
            maint: "m".into(),
            ..Default::default()
        };
        assert_eq!(
            (node_json(&node)["state"].as_str(), node_json(&node)["maint"].as_str()),
            (Some("MAINT"), Some("m"))
        );
        assert_eq!(node_row(&node)[10], "maintenance reservation m");
        node.state = pb::NodeState::Draining as i32;
        node.reason = "disk".into();
        assert_eq!(node_json(&node)["state"], "DRAINING", "a drain still shows");
        assert_eq!(node_row(&node)[10], "maintenance reservation m; disk");
        node.maint.clear();
        assert!(node_json(&node)["maint"].is_null());

        let why = "after job 3 ends (time limit) on n1";
        let mut job = pb::Job {
            id: 4,
            state: pb::JobState::Pending as i32,
            start_reason: why.into(),
            ..Default::default()
        };
        assert_eq!(
            expected_start_line(&job).as_deref(),
            Some("Expected start: none (after job 3 ends (time limit) on n1)")
        );
        assert!(job_json(&job)["expected_start_ms"].is_null());
        job.expected_start_ms = 1_764_547_200_000;
        let line = expected_start_line(&job).unwrap();
        assert!(line.starts_with("Expected start: 2025-1") && line.ends_with(&format!(" ({why})")), "{line}");
        assert_eq!(job_json(&job)["expected_start_ms"], 1_764_547_200_000i64);
        assert_eq!(
            (job_json(&job)["start_reason"].as_str(), job_json(&job)["expected_start"].as_str()),
            (Some(why), Some("2025-12-01T00:00:00.000Z"))
        );
        assert_eq!(start_row(&job)[6], why);
        assert_eq!(start_row(&job).len(), START_HEADER.len());
        job.state = pb::JobState::Running as i32;
        assert_eq!(expected_start_line(&job), None);
        assert_eq!(local_time(0), "N/A");
    }
}

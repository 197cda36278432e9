//! `kairos eff JOB`: seff's one screen — what a job asked for beside what it used (GPUs, GPU
//! memory, CPUs, memory, wall time), with one-line suggestions for its next submission.

use kairos_proto::v1 as pb;
use serde_json::{json, Value};

use super::figures as fig;
use super::neat;
use crate::client::Client;
use crate::output::{job_state_name, mib, print_json, profile_name};

/// Headroom on observed use before suggesting a smaller ask.
const HEADROOM: f64 = 1.25;
/// Headroom on run time before suggesting a shorter limit.
const TIME_HEADROOM: f64 = 1.5;
/// Below this mean GPU utilisation (percent) the job holds GPUs it does not use.
const IDLE_PCT: f64 = 10.0;

/// The job's screen as JSON (`kairos eff --json`).
pub fn eff_json(r: &pb::JobRecord, now: i64) -> Value {
    json!({
        "id": r.id,
        "name": r.name,
        "user": r.user,
        "account": r.account,
        "qos": r.qos,
        "partition": r.partition,
        "profile": profile_name(r.profile),
        "state": job_state_name(r.state),
        "exit_code": r.exit_code,
        "signal": if r.signal == 0 { Value::Null } else { json!(r.signal) },
        "gpus": {
            "count": r.gpus,
            "gpu_milli": r.gpu_milli,
            "util_mean_pct": fig::json_num(fig::gpu_util_pct(r)),
            "util_p95_pct": fig::gpu_util_max_pct(r).map(|_| r.gpu_util_p95_pct),
            "util_max_pct": fig::gpu_util_max_pct(r),
            "busy_gpu_hours": fig::json_num(Some(fig::busy_gpu_hours(r))),
            "allocated_gpu_hours": fig::json_num(Some(fig::gpu_hours(r))),
        },
        "gpu_memory": {
            "peak_mib": fig::gpu_mem_max_mib(r),
            "device_mib": (r.gpu_mem_device_mib > 0).then_some(r.gpu_mem_device_mib),
            "peak_pct": fig::json_num(fig::gpu_mem_pct(r)),
        },
        "cpus": {
            "requested": r.req_cpus,
            "cores_used": fig::json_num(fig::cores_used(r)),
            "cpu_time_ms": r.cpu_time_ms,
            "efficiency_pct": fig::json_num(fig::cpu_eff_pct(r)),
        },
        "memory": {
            "requested_mib": r.req_memory_mib,
            "max_rss_kib": r.max_rss_kib,
            "efficiency_pct": fig::json_num(fig::mem_eff_pct(r)),
        },
        "time": {
            "elapsed_s": fig::elapsed_s(r, now).map(|s| s as u64),
            "limit_s": (r.time_limit_s > 0).then_some(r.time_limit_s),
            "run_ms": r.run_ms,
        },
        "idle_note": if r.idle_note.is_empty() { Value::Null } else { json!(r.idle_note) },
        "suggestions": suggestions(r, now),
    })
}

/// The one-line suggestions, each only when the measurement supports it.
pub fn suggestions(r: &pb::JobRecord, now: i64) -> Vec<String> {
    [cpu_advice(r), mem_advice(r), gpu_idle_advice(r), gpu_mem_advice(r), time_advice(r, now)]
        .into_iter()
        .flatten()
        .collect()
}

fn cpu_advice(r: &pb::JobRecord) -> Option<String> {
    let used = fig::cores_used(r)?;
    let enough = ((used * HEADROOM).ceil() as u32).max(1);
    (r.req_cpus > 0 && enough < r.req_cpus)
        .then(|| format!("asked -c {}, used {used:.1} cores: -c {enough} would do", r.req_cpus))
}

fn mem_advice(r: &pb::JobRecord) -> Option<String> {
    if r.req_memory_mib == 0 || r.max_rss_kib == 0 {
        return None;
    }
    let peak = r.max_rss_kib.div_ceil(1024);
    let enough = neat::mem_mib(peak as f64 * HEADROOM);
    (enough < r.req_memory_mib).then(|| {
        format!(
            "asked --mem {}, peaked at {}: --mem {} would do",
            neat::mem_arg(r.req_memory_mib),
            mib(peak),
            neat::mem_arg(enough)
        )
    })
}

fn gpu_idle_advice(r: &pb::JobRecord) -> Option<String> {
    let util = fig::gpu_util_pct(r)?;
    (r.gpus > 0 && util < IDLE_PCT)
        .then(|| format!("GPUs {util:.0} % busy: this job holds GPUs it does not use"))
}

/// A whole-GPU job that used little of its GPU and its memory would fit a fraction of one.
fn gpu_mem_advice(r: &pb::JobRecord) -> Option<String> {
    let util = fig::gpu_util_pct(r)?;
    if r.gpu_milli > 0 || r.gpu_mem_device_mib == 0 || r.gpu_mem_max_mib == 0 || util >= 50.0 {
        return None;
    }
    let need = r.gpu_mem_max_mib as f64 * HEADROOM;
    let k = [7u64, 4, 2].into_iter().find(|k| need <= (r.gpu_mem_device_mib / k) as f64)?;
    let fraction = (1000 / k) as f64 / 1000.0;
    Some(format!(
        "GPU memory peaked at {} of {}: a 1/{k} GPU (--gpu-fraction {fraction}) would hold it, where its QoS shares GPUs",
        mib(r.gpu_mem_max_mib),
        mib(r.gpu_mem_device_mib)
    ))
}

fn time_advice(r: &pb::JobRecord, now: i64) -> Option<String> {
    let elapsed = fig::elapsed_s(r, now)? as u64;
    if r.time_limit_s == 0 || r.end_time_ms == 0 {
        return None;
    }
    if r.state == pb::JobState::Timeout as i32 {
        return Some(format!(
            "hit its {} time limit: ask for more (--time) or checkpoint",
            neat::duration_text(r.time_limit_s)
        ));
    }
    let enough = neat::duration_up((elapsed as f64 * TIME_HEADROOM) as u64);
    (r.state == pb::JobState::Completed as i32 && enough < r.time_limit_s).then(|| {
        format!(
            "ran {} of a {} limit: --time {} would do",
            neat::duration_text(elapsed),
            neat::duration_text(r.time_limit_s),
            neat::duration_text(enough)
        )
    })
}

/// The text screen.
pub fn screen(r: &pb::JobRecord, now: i64) -> String {
    let nm = "not measured";
    let or_nm = |v: Option<String>| v.unwrap_or_else(|| nm.to_string());
    let exit = match (r.exit_code, r.signal) {
        (Some(c), _) => format!(" (exit {c})"),
        (None, 0) => String::new(),
        (None, s) => format!(" (signal {s})"),
    };
    let gpus = match r.gpu_milli {
        0 => format!("{} asked", r.gpus),
        m => format!("{:.3} of a GPU asked", f64::from(m) / 1000.0),
    };
    let util = fig::gpu_util_pct(r).map(|u| {
        format!("utilisation mean {u:.1} %, p95 {} %, max {} %", r.gpu_util_p95_pct, r.gpu_util_max_pct)
    });
    let busy = (r.gpu_ms > 0)
        .then(|| format!("{:.3} busy of {:.3} allocated", fig::busy_gpu_hours(r), fig::gpu_hours(r)));
    let gpu_mem = fig::gpu_mem_max_mib(r).filter(|m| *m > 0).map(|m| match fig::gpu_mem_pct(r) {
        Some(p) => format!("peak {} on one GPU of {} ({p:.1} %)", mib(m), mib(r.gpu_mem_device_mib)),
        None => format!("peak {} on one GPU", mib(m)),
    });
    let cpus = fig::cores_used(r).map(|c| match fig::cpu_eff_pct(r) {
        Some(e) => format!("{} asked, {c:.2} cores used (CPU efficiency {e:.1} %)", r.req_cpus),
        None => format!("{c:.2} cores used"),
    });
    let mem = (r.max_rss_kib > 0).then(|| match fig::mem_eff_pct(r) {
        Some(e) => format!(
            "{} asked, peak {} (memory efficiency {e:.1} %)",
            mib(r.req_memory_mib),
            mib(r.max_rss_kib.div_ceil(1024))
        ),
        None => format!("peak {} (none asked)", mib(r.max_rss_kib.div_ceil(1024))),
    });
    let wall = fig::elapsed_s(r, now).map(|e| match r.time_limit_s {
        0 => format!("{} (no limit)", neat::clock(e as i64)),
        l => format!("{} of a {} limit", neat::clock(e as i64), neat::clock(l as i64)),
    });
    let mut out = vec![
        ("Job ID", r.id.to_string()),
        ("Name", if r.name.is_empty() { "-".into() } else { r.name.clone() }),
        ("User / account", format!("{} / {}", r.user, if r.account.is_empty() { "-" } else { &r.account })),
        (
            "QoS / partition",
            format!("{} / {}", r.qos, if r.partition.is_empty() { "-" } else { &r.partition }),
        ),
        ("State", format!("{}{exit}", job_state_name(r.state))),
        ("GPUs", format!("{gpus}; {}", or_nm(util))),
        ("GPU-hours", or_nm(busy)),
        ("GPU memory", or_nm(gpu_mem)),
        ("CPUs", or_nm(cpus)),
        ("Memory", or_nm(mem)),
        ("Wall time", wall.unwrap_or_else(|| "not started".into())),
    ];
    if !r.idle_note.is_empty() {
        out.push(("Idle GPUs", r.idle_note.clone()));
    }
    let mut text: String = out.iter().map(|(k, v)| format!("{:<16} {v}\n", format!("{k}:"))).collect();
    let advice = suggestions(r, now);
    if !advice.is_empty() {
        text.push_str("Suggestions:\n");
        text.extend(advice.iter().map(|a| format!("  {a}\n")));
    }
    text
}

pub async fn eff(client: &Client, json: bool, id: u64) -> anyhow::Result<i32> {
    let record = super::records::one(client, id).await?;
    let now = super::records::now_ms();
    if json {
        print_json(&eff_json(&record, now));
    } else {
        print!("{}", screen(&record, now));
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::insight::figures::tests::record;

    /// A job that asked much and used little of everything.
    fn wasteful() -> pb::JobRecord {
        let mut r = record(9, 1, 720_000); // ran 12 minutes
        r.time_limit_s = 86_400;
        r.req_cpus = 8;
        r.cpu_time_ms = 936_000; // 1.3 cores
        r.req_memory_mib = 64 * 1024;
        r.max_rss_kib = (9.1 * 1024.0 * 1024.0) as u64;
        r.gpu_ms = 720_000;
        r.gpu_busy_ms = 21_600; // 3 %
        r.gpu_util_max_pct = 12;
        r.gpu_mem_max_mib = 9_000;
        r.gpu_mem_device_mib = 81_920;
        r.exit_code = Some(0);
        r
    }

    #[test]
    fn suggestions_name_the_smaller_ask_with_headroom() {
        let advice = suggestions(&wasteful(), 0);
        assert_eq!(
            advice,
            [
                "asked -c 8, used 1.3 cores: -c 2 would do",
                "asked --mem 64G, peaked at 9.1G: --mem 12G would do",
                "GPUs 3 % busy: this job holds GPUs it does not use",
                "GPU memory peaked at 8.8G of 80.0G: a 1/7 GPU (--gpu-fraction 0.142) would hold it, where its QoS shares GPUs",
                "ran 12m of a 1day limit: --time 20m would do",
            ]
        );
    }

    #[test]
    fn a_job_that_used_what_it_asked_gets_no_suggestion() {
        let mut r = wasteful();
        r.req_cpus = 2;
        r.req_memory_mib = 12 * 1024;
        r.gpu_busy_ms = 650_000;
        r.time_limit_s = 1_200;
        assert_eq!(suggestions(&r, 0), Vec::<String>::new());
        r.state = pb::JobState::Timeout as i32;
        assert_eq!(suggestions(&r, 0), ["hit its 20m time limit: ask for more (--time) or checkpoint"]);
    }

    #[test]
    fn an_unmeasured_job_says_so_and_suggests_nothing() {
        let r = record(3, 2, 0);
        assert!(suggestions(&r, 0).is_empty());
        let text = screen(&r, 0);
        assert!(text.contains("GPUs:            2 asked; not measured"), "{text}");
        assert!(text.contains("CPUs:            not measured"), "{text}");
        let j = eff_json(&r, 0);
        assert_eq!(
            (j["gpus"]["util_mean_pct"].clone(), j["cpus"]["efficiency_pct"].clone()),
            (Value::Null, Value::Null)
        );
    }

    #[test]
    fn the_screen_shows_asked_beside_used() {
        let text = screen(&wasteful(), 0);
        assert!(text.contains("utilisation mean 3.0 %, p95 0 %, max 12 %"), "{text}");
        assert!(text.contains("8 asked, 1.30 cores used (CPU efficiency 16.2 %)"), "{text}");
        assert!(text.contains("Wall time:       00:12:00 of a 1-00:00:00 limit"), "{text}");
        assert!(text.contains("Suggestions:\n  asked -c 8"), "{text}");
        let j = eff_json(&wasteful(), 0);
        assert_eq!(j["cpus"]["cores_used"].as_f64(), Some(1.3));
        assert_eq!(j["suggestions"].as_array().map(Vec::len), Some(5));
    }
}

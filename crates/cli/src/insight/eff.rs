//! `kairos eff JOB`: seff's one screen — what a job asked for against what it used (GPUs, GPU
//! memory, CPUs, memory, wall time), and what it could ask for next time.

use kairos_proto::v1 as pb;
use serde_json::{json, Value};

use super::figures::{self, pct};
use crate::client::Client;
use crate::output::{job_state_name, mib, print_json};

pub async fn eff(client: &Client, json: bool, id: u64) -> anyhow::Result<i32> {
    let r = super::record(client, id).await?;
    if json {
        print_json(&eff_json(&r));
    } else {
        print!("{}", screen(&r));
    }
    Ok(0)
}

fn eff_json(r: &pb::JobRecord) -> Value {
    json!({
        "id": r.id,
        "state": job_state_name(r.state),
        "gpus": r.gpus,
        "gpu_util": figures::gpu_util(r),
        "gpu_util_p95": (r.gpu_ms > 0).then_some(r.gpu_util_p95_pct),
        "gpu_util_max": (r.gpu_ms > 0).then_some(r.gpu_util_max_pct),
        "gpu_hours": figures::gpu_hours(r),
        "busy_gpu_hours": figures::busy_gpu_hours(r),
        "gpu_mem_max_mib": r.gpu_mem_max_mib,
        "gpu_mem_device_mib": r.gpu_mem_device_mib,
        "req_cpus": r.req_cpus,
        "cores_used": figures::cores_used(r),
        "cpu_eff": figures::cpu_eff(r),
        "req_memory_mib": r.req_memory_mib,
        "max_rss_kib": r.max_rss_kib,
        "mem_eff": figures::mem_eff(r),
        "ran_s": figures::ran_s(r),
        "time_limit_s": r.time_limit_s,
        "idle_note": r.idle_note,
        "suggestions": suggestions(r),
    })
}

/// The screen, as text.
pub fn screen(r: &pb::JobRecord) -> String {
    let mut out = format!(
        "Job {}: {} (user {}, account {}, QoS {})\nState: {}{}\n",
        r.id,
        if r.name.is_empty() { "-" } else { &r.name },
        r.user,
        if r.account.is_empty() { "-" } else { &r.account },
        r.qos,
        job_state_name(r.state),
        r.exit_code.map(|c| format!(" (exit {c})")).unwrap_or_default(),
    );
    if let Some(ran) = figures::ran_s(r) {
        let limit = match r.time_limit_s {
            0 => String::new(),
            l => format!(" of a {} limit ({:.1} %)", duration(l as f64), 100.0 * ran / l as f64),
        };
        out += &format!("Wall time: {}{limit}\n", duration(ran));
    }
    if r.gpus > 0 {
        out += &format!(
            "GPUs: {}; utilisation mean {}, p95 {}, max {}\nGPU-hours: {:.3} held, {:.3} busy\n",
            r.gpus,
            pct(figures::gpu_util(r)),
            measured_pct(r, r.gpu_util_p95_pct),
            measured_pct(r, r.gpu_util_max_pct),
            figures::gpu_hours(r),
            figures::busy_gpu_hours(r),
        );
        if r.gpu_mem_device_mib > 0 {
            out += &format!(
                "GPU memory: peak {} of {} on one GPU ({})\n",
                mib(r.gpu_mem_max_mib),
                mib(r.gpu_mem_device_mib),
                pct(figures::gpu_mem_share(r))
            );
        }
    }
    if let Some(cores) = figures::cores_used(r) {
        out += &format!(
            "CPUs: {cores:.2} of {} cores used (CPU efficiency {})\n",
            r.req_cpus,
            pct(figures::cpu_eff(r))
        );
    }
    if r.max_rss_kib > 0 {
        let asked =
            if r.req_memory_mib > 0 { format!(" of {}", mib(r.req_memory_mib)) } else { String::new() };
        out += &format!(
            "Memory: peak {}{asked} (memory efficiency {})\n",
            kib(r.max_rss_kib),
            pct(figures::mem_eff(r))
        );
    }
    if !r.idle_note.is_empty() {
        out += &format!("Idle: {}\n", r.idle_note);
    }
    let advice = suggestions(r);
    if advice.is_empty() {
        out += "Suggestions: none; it used what it asked for\n";
    } else {
        out += "Suggestions:\n";
        for line in advice {
            out += &format!("  {line}\n");
        }
    }
    out
}

fn measured_pct(r: &pb::JobRecord, v: u32) -> String {
    if r.gpu_ms > 0 {
        format!("{v}%")
    } else {
        "-".into()
    }
}

fn kib(k: u64) -> String {
    if k < 1024 {
        format!("{k}K")
    } else {
        mib(k / 1024)
    }
}

/// Seconds as people read them: 40s, 12m, 3.5h, 2.0d.
pub fn duration(s: f64) -> String {
    match s {
        s if s < 120.0 => format!("{s:.0}s"),
        s if s < 7200.0 => format!("{:.0}m", s / 60.0),
        s if s < 172_800.0 => format!("{:.1}h", s / 3600.0),
        s => format!("{:.1}d", s / 86_400.0),
    }
}

/// A neat limit at least `s` seconds: whole minutes up to 2 h, whole hours up to 2 days, then
/// whole days, as `--time` and `max_wall` take them.
pub fn neat_limit(s: f64) -> String {
    let s = s.max(60.0);
    if s <= 7200.0 {
        format!("{}m", (s / 60.0).ceil() as u64)
    } else if s <= 172_800.0 {
        format!("{}h", (s / 3600.0).ceil() as u64)
    } else {
        format!("{}d", (s / 86_400.0).ceil() as u64)
    }
}

/// A neat memory size at least `m` MiB: whole GiB from 1 GiB, else multiples of 128 MiB.
pub fn neat_mem(m: f64) -> String {
    if m >= 1024.0 {
        format!("{}G", (m / 1024.0).ceil() as u64)
    } else {
        format!("{}M", ((m / 128.0).ceil() as u64).max(1) * 128)
    }
}

/// One line per thing the job asked for well beyond what it used.
pub fn suggestions(r: &pb::JobRecord) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(used) = figures::cores_used(r) {
        let enough = ((used * 1.25).ceil() as u32).max(1);
        if r.req_cpus >= 2 && enough < r.req_cpus {
            out.push(format!("asked -c {}, used {used:.1} cores: -c {enough} would do", r.req_cpus));
        }
    }
    let peak_mib = r.max_rss_kib as f64 / 1024.0;
    if r.req_memory_mib > 0 && peak_mib > 0.0 && peak_mib * 1.25 < r.req_memory_mib as f64 / 2.0 {
        out.push(format!(
            "asked --mem {}, peaked at {}: --mem {} would do",
            mib(r.req_memory_mib),
            kib(r.max_rss_kib),
            neat_mem(peak_mib * 1.25)
        ));
    }
    if let Some(util) = figures::gpu_util(r).filter(|u| *u < 10.0) {
        out.push(format!(
            "GPUs {util:.0} % busy: this job holds GPUs it does not use (fewer --gpus, or a --gpu-fraction)"
        ));
    }
    if let Some(share) = figures::gpu_mem_share(r).filter(|s| *s < 25.0 && r.gpus == 1 && r.gpu_milli == 0) {
        out.push(format!(
            "GPU memory peaked at {} ({share:.0} % of the GPU): an inference job would fit --gpu-fraction 0.25",
            mib(r.gpu_mem_max_mib)
        ));
    }
    let completed = job_state_name(r.state) == "COMPLETED";
    if let (Some(ran), true, true) = (figures::ran_s(r), completed, r.time_limit_s > 0) {
        let limit = r.time_limit_s as f64;
        if ran * 4.0 < limit && ran * 1.5 < limit - 60.0 {
            out.push(format!(
                "ran {} of a {} limit: --time {} would do (and backfills sooner)",
                duration(ran),
                duration(limit),
                neat_limit(ran * 1.5)
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> pb::JobRecord {
        pb::JobRecord {
            id: 7,
            state: pb::JobState::Completed as i32,
            gpus: 1,
            start_time_ms: 1_000,
            end_time_ms: 721_000,
            time_limit_s: 86_400,
            req_cpus: 8,
            run_ms: 720_000,
            cpu_time_ms: 936_000,
            req_memory_mib: 65_536,
            max_rss_kib: 9 << 20,
            gpu_ms: 720_000,
            gpu_busy_ms: 21_600,
            gpu_util_max_pct: 9,
            gpu_util_p95_pct: 5,
            gpu_mem_max_mib: 8_000,
            gpu_mem_device_mib: 81_920,
            gpu_seconds: 720,
            ..Default::default()
        }
    }

    #[test]
    fn a_job_that_asked_too_much_gets_a_line_per_resource() {
        let advice = suggestions(&record());
        assert_eq!(advice[0], "asked -c 8, used 1.3 cores: -c 2 would do");
        assert_eq!(advice[1], "asked --mem 64.0G, peaked at 9.0G: --mem 12G would do");
        assert!(advice[2].starts_with("GPUs 3 % busy"), "{advice:?}");
        assert!(advice[3].contains("--gpu-fraction 0.25"), "{advice:?}");
        assert_eq!(advice[4], "ran 12m of a 24.0h limit: --time 18m would do (and backfills sooner)");
        let text = screen(&record());
        assert!(text.contains("utilisation mean 3.0%, p95 5%, max 9%"), "{text}");
        assert!(text.contains("CPUs: 1.30 of 8 cores used (CPU efficiency 16.2%)"), "{text}");
    }

    #[test]
    fn a_job_that_used_what_it_asked_gets_none() {
        let mut r = record();
        (r.req_cpus, r.req_memory_mib, r.gpu_busy_ms, r.gpu_mem_max_mib, r.time_limit_s) =
            (2, 12_288, 648_000, 70_000, 1200);
        assert_eq!(suggestions(&r), Vec::<String>::new());
        assert!(screen(&r).contains("Suggestions: none"));
    }

    #[test]
    fn neat_sizes_and_limits() {
        assert_eq!(
            (neat_limit(30.0), neat_limit(1000.0), neat_limit(10_000.0), neat_limit(200_000.0)),
            ("1m".into(), "17m".into(), "3h".into(), "3d".into())
        );
        assert_eq!((neat_mem(100.0), neat_mem(1500.0)), ("128M".into(), "2G".into()));
    }
}

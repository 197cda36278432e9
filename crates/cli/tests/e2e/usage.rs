//! What a job really used, measured on its node (issue 52): fake GPUs whose utilisation and
//! memory a control file sets (`kairos-agent --fake-gpu-usage`), sampled per run, aggregated into
//! one record per attempt, shown by `history`, `eff`, `top`, summed by `report usage`; idle GPUs
//! found and acted on by the policy; advice from the history.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use crate::harness::{wait_for, wait_for_within, Cluster, Options};

/// A cluster whose one agent reads GPU usage from a file this test writes, sampling often.
fn measured(gpus: u32, extra: &[&str]) -> (Cluster, tempfile::TempDir, PathBuf) {
    let dir = tempfile::Builder::new().prefix("kairos-usage-").tempdir().expect("temp dir");
    let file = dir.path().join("gpu-usage");
    set_usage(&file, &[]);
    let mut flags: Vec<String> =
        ["--fake-gpu-usage", file.to_str().unwrap(), "--usage-interval", "500ms"].map(String::from).to_vec();
    flags.extend(extra.iter().map(|s| s.to_string()));
    let c = Cluster::start_opts(1, gpus, Options { agent_flags: flags, ..Options::default() });
    (c, dir, file)
}

/// Writes the control file whole (a rename), `(gpu, util %, memory MiB)` per line.
fn set_usage(file: &Path, gpus: &[(u32, u32, u64)]) {
    let text: String = gpus.iter().map(|(g, u, m)| format!("{g} {u} {m}\n")).collect();
    let tmp = file.with_extension("tmp");
    std::fs::write(&tmp, format!("# GPU UTIL MEM_MIB\n{text}")).unwrap();
    std::fs::rename(&tmp, file).unwrap();
}

/// An RFC 3339 time of the JSON output, in Unix ms.
fn ms(v: &Value) -> i64 {
    let t = humantime::parse_rfc3339(v.as_str().unwrap_or_else(|| panic!("a time: {v}"))).unwrap();
    t.duration_since(UNIX_EPOCH).unwrap().as_millis() as i64
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64
}

fn record(c: &Cluster, id: u64) -> Value {
    let all: Vec<Value> = serde_json::from_str(&c.ok(&["history", "--json"])).unwrap();
    all.into_iter().find(|r| r["id"] == id).unwrap_or_else(|| panic!("job {id} is in the history"))
}

/// The row of `history --format id,COLUMNS...` for job `id`, split on whitespace.
fn columns(c: &Cluster, id: u64, format: &str) -> Vec<String> {
    let table = c.ok(&["history", "--format", &format!("id,{format}")]);
    let row = table
        .lines()
        .find(|l| l.split_whitespace().next() == Some(&id.to_string()))
        .unwrap_or_else(|| panic!("job {id} in\n{table}"));
    row.split_whitespace().skip(1).map(|s| s.trim_end_matches('%').to_string()).collect()
}

fn number(s: &str) -> f64 {
    s.trim_end_matches('%').parse().unwrap_or_else(|_| panic!("a number: {s:?}"))
}

#[test]
fn a_gpu_busy_then_idle_shows_its_time_weighted_utilisation_and_a_one_core_job_its_cpu_efficiency() {
    let (c, _dir, file) = measured(1, &["--cpus", "4"]);
    set_usage(&file, &[(0, 80, 30_000)]);
    let go = c.path("go");
    let wait_go = format!("while [ ! -e {} ]; do sleep 0.1; done", go.display());
    let gpu_job = c.submit(&["--gpus", "1", "-c", "1", "--", "sh", "-c", &wait_go]);
    let started = ms(&c.wait_state(gpu_job, "RUNNING")["start_time"]);

    // Live: `top` shows the GPU at 80 %.
    let frame = wait_for("a sample in top", || {
        let out = c.kairos(&["top", &gpu_job.to_string(), "--once"]);
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        (out.status.success() && text.contains("80")).then_some(text)
    });
    assert!(frame.contains("30000") || frame.contains("29.3G") || frame.contains("30000M"), "{frame}");

    // 30 s at 80 %, then idle for 10 s.
    std::thread::sleep(Duration::from_millis((started + 30_000 - now_ms()).max(0) as u64));
    set_usage(&file, &[(0, 0, 1_000)]);
    let switched = now_ms();
    std::thread::sleep(Duration::from_secs(10));
    std::fs::write(&go, "").unwrap();
    assert_eq!(c.wait_done(gpu_job)["state"], "COMPLETED");

    let r = record(&c, gpu_job);
    let (start, end) = (ms(&r["start_time"]), ms(&r["end_time"]));
    let expected = 80.0 * (switched - start) as f64 / (end - start) as f64;
    let cols = columns(&c, gpu_job, "GPU_UTIL,GPU_UTIL_MAX,GPU_MEM_MAX");
    let util = number(&cols[0]);
    assert!((util - expected).abs() <= 2.0, "GPU_UTIL {util}, time-weighted mean {expected:.1}: {r}");
    assert_eq!(number(&cols[1]), 80.0, "{cols:?}");
    assert!(cols[2].starts_with("30000") || cols[2] == "29.3G", "GPU_MEM_MAX {cols:?}");
    let eff = c.ok(&["eff", &gpu_job.to_string()]);
    assert!(eff.contains(&format!("utilisation mean {}%, p95 80%, max 80%", cols[0])), "{eff}");

    // A job asking 4 CPUs that keeps one busy: CPU_EFF 25 % (what its own shell measured, ± 5).
    let burn = r#"timeout 6 sh -c 'while :; do :; done'; times"#;
    let cpu_job = c.submit(&["--gpus", "0", "-c", "4", "--", "sh", "-c", burn]);
    assert_eq!(c.wait_done(cpu_job)["state"], "COMPLETED");
    let r = record(&c, cpu_job);
    let ran_ms = (ms(&r["end_time"]) - ms(&r["start_time"])) as f64;
    let own_ms = shell_cpu_ms(&c.ok(&["logs", &cpu_job.to_string()]));
    let expected = 100.0 * own_ms / (4.0 * ran_ms);
    let cpu_eff = number(&columns(&c, cpu_job, "CPU_EFF")[0]);
    assert!(
        (cpu_eff - expected).abs() <= 5.0 && cpu_eff <= 30.0,
        "CPU_EFF {cpu_eff}, its shell's {expected:.1}"
    );
    let eff = c.ok(&["eff", &cpu_job.to_string()]);
    assert!(eff.contains("-c 2 would do") || eff.contains("-c 1 would do"), "{eff}");
}

/// The CPU time (user + system) the shell's `times` printed for itself and its children:
/// lines of "0m5.120s 0m0.030s".
fn shell_cpu_ms(log: &str) -> f64 {
    let lines: Vec<&str> = log.lines().filter(|l| l.contains('m') && l.ends_with('s')).collect();
    assert_eq!(lines.len(), 2, "{log}");
    lines
        .iter()
        .flat_map(|l| l.split_whitespace())
        .map(|t| {
            let (m, s) = t.trim_end_matches('s').split_once('m').unwrap();
            m.parse::<f64>().unwrap() * 60_000.0 + s.parse::<f64>().unwrap() * 1000.0
        })
        .sum()
}

/// A job that resumes from its step file and saves it on SIGTERM.
const RESUMES: &str = r#"
dir=$KAIROS_CHECKPOINT_DIR; step=0
[ -f "$dir/step" ] && step=$(cat "$dir/step")
echo "attempt $KAIROS_RESTART_COUNT from step $step"
term=0
trap 'term=1' TERM
while :; do
  if [ "$term" = 1 ]; then echo "$step" > "$dir/step.tmp" && mv "$dir/step.tmp" "$dir/step"; exit 0; fi
  step=$((step + 1))
  sleep 0.1
done
"#;

#[test]
fn an_idle_job_is_requeued_through_its_checkpoint_within_an_interval_and_a_busy_one_runs_on() {
    let (c, _dir, file) = measured(2, &[]);
    set_usage(&file, &[(0, 90, 2_000), (1, 90, 2_000)]);
    // The training QoS acts on idle GPUs after 20 s below 5 %.
    let mut policy: toml::Table = toml::from_str(&c.ok(&["policy", "export"])).unwrap();
    let training = policy["qos"]["training"].as_table().unwrap().clone();
    let mut training = training;
    training.insert(
        "idle_gpu".into(),
        toml::from_str::<toml::Table>(r#"v = { after = "20s", below = 0.05, action = "requeue" }"#).unwrap()
            ["v"]
            .clone(),
    );
    policy["qos"].as_table_mut().unwrap().insert("training".into(), training.into());
    let file_policy = c.path("idle.toml");
    std::fs::write(&file_policy, toml::to_string(&policy).unwrap()).unwrap();
    c.ok(&["policy", "apply", "--yes", file_policy.to_str().unwrap()]);

    let submit = || c.submit(&["--qos", "training", "--gpus", "1", "--", "sh", "-c", RESUMES]);
    let (a, b) = (submit(), submit());
    let gpu_of = |id: u64| c.wait_state(id, "RUNNING")["gpu_ids"][0].as_u64().unwrap() as u32;
    let (ga, gb) = (gpu_of(a), gpu_of(b));
    assert_ne!(ga, gb);
    // `a`'s GPU goes idle; `b`'s stays busy.
    set_usage(&file, &[(ga, 1, 2_000), (gb, 90, 2_000)]);
    let idle_from = now_ms();
    let job = wait_for_within("the idle job to be requeued", Duration::from_secs(60), || {
        let j = c.job(a);
        (j["attempt"].as_u64() >= Some(1) && j["state"] == "RUNNING").then_some(j)
    });
    let events = job["events"].as_array().unwrap();
    let idle = events.iter().find(|e| e["kind"] == "gpu idle").unwrap_or_else(|| panic!("{job}"));
    assert!(idle["message"].as_str().unwrap().contains("below 5 %"), "{idle}");
    let at = ms(&idle["time"]);
    assert!(
        (idle_from + 20_000 - 1_000..=idle_from + 20_000 + 3_000).contains(&at),
        "idle after 20 s within an interval: {} ms",
        at - idle_from
    );
    // Its checkpoint was kept: the new attempt resumed past step 0.
    let logs = wait_for("the resumed attempt's first line", || {
        // The new attempt's log exists once its agent launched it.
        let out = c.kairos(&["logs", &a.to_string()]);
        let l = String::from_utf8_lossy(&out.stdout).to_string();
        (out.status.success() && l.contains("attempt 1")).then_some(l)
    });
    let from: u64 = logs
        .split("attempt 1 from step ")
        .nth(1)
        .unwrap()
        .trim()
        .split('\n')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(from > 100, "resumed from its checkpoint: {logs}");
    // The busy one ran on, never idle.
    let busy = c.job(b);
    assert_eq!((busy["state"].as_str(), busy["attempt"].as_u64()), (Some("RUNNING"), Some(0)), "{busy}");
    assert!(busy["events"].as_array().unwrap().iter().all(|e| e["kind"] != "gpu idle"), "{busy}");
    let started = Instant::now();
    for id in [a, b] {
        c.ok(&["cancel", &id.to_string()]);
    }
    for id in [a, b] {
        c.wait_done(id);
    }
    assert!(started.elapsed() < Duration::from_secs(30));
}

#[test]
fn report_usage_totals_are_the_sums_of_history_and_advice_is_a_policy_apply_accepts() {
    let (c, _dir, file) = measured(2, &["--cpus", "2"]);
    set_usage(&file, &[(0, 50, 4_000), (1, 10, 8_000)]);
    let mut ids = Vec::new();
    for (qos, gpus) in [("training", "1"), ("training", "2"), ("inference", "1"), ("batch", "0")] {
        ids.push(c.submit(&["--qos", qos, "--gpus", gpus, "--", "sleep", "2"]));
    }
    for id in &ids {
        assert_eq!(c.wait_done(*id)["state"], "COMPLETED");
    }
    let history: Vec<Value> = serde_json::from_str(&c.ok(&["history", "--json"])).unwrap();
    let report: Value =
        serde_json::from_str(&c.ok(&["report", "usage", "--by", "account", "--json"])).unwrap();
    let total = report["total"].clone();
    let sum = |key: &str| history.iter().map(|r| r[key].as_f64().unwrap_or(0.0)).sum::<f64>();
    assert_eq!(total["jobs"].as_u64(), Some(history.len() as u64), "{report}");
    let gpu_hours = sum("gpu_seconds") / 3600.0;
    assert!((total["gpu_hours"].as_f64().unwrap() - gpu_hours).abs() < 1e-6, "{report}");
    let busy_hours = sum("gpu_busy_ms") / 3.6e6;
    assert!(
        busy_hours > 0.0 && (total["busy_gpu_hours"].as_f64().unwrap() - busy_hours).abs() < 1e-6,
        "{report}"
    );
    let per_account: f64 =
        report["rows"].as_array().unwrap().iter().map(|r| r["gpu_hours"].as_f64().unwrap()).sum();
    assert!((per_account - gpu_hours).abs() < 1e-6, "{report}");

    let advice = c.ok(&["policy", "advise"]);
    let file = c.path("advised.toml");
    std::fs::write(&file, &advice).unwrap();
    c.ok(&["policy", "apply", "--yes", "--dry-run", file.to_str().unwrap()]);
}

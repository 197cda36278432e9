//! Preemption end to end: urgent work on a cluster full of training, victims checkpoint,
//! requeue and resume (examples/train.sh).

use std::collections::BTreeMap;

use crate::harness::{submit_training, train_script, wait_for, Cluster};

#[test]
fn urgent_job_preempts_a_training_job_which_resumes_from_its_checkpoint() {
    let c = Cluster::start_with(3, 2, &[]);
    let steps = |name: &str| c.path(&format!("{name}.steps"));
    let first = submit_training(&c, &[], 40, &steps("first"));
    let second = submit_training(&c, &[], 40, &steps("second"));
    c.wait_state(first, "RUNNING");
    c.wait_state(second, "RUNNING");
    // Both GPUs are busy with training; let them make progress, then the urgent job arrives.
    wait_for("training progress", || {
        let n = std::fs::read_to_string(steps("second")).unwrap_or_default().lines().count();
        (n >= 8).then_some(())
    });
    let urgent = c.submit(&["--qos", "urgent", "--", "true"]);
    let job = c.wait_done(urgent);
    assert_eq!(job["state"], "COMPLETED", "{job}");

    // Exactly one victim (the one that started last, so lost least work) was preempted and requeued.
    let list: serde_json::Value = serde_json::from_str(&c.ok(&["preemptions", "--json"])).unwrap();
    let list = list.as_array().unwrap();
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!(list[0]["preemptor"], urgent);
    assert_eq!(list[0]["mode"], "requeue");
    let victim = list[0]["victim"].as_u64().unwrap();
    let (victim_name, other) = if victim == first { ("first", second) } else { ("second", first) };
    // Both training jobs finish; the victim as its second attempt.
    let v = c.wait_done(victim);
    assert_eq!((v["state"].as_str(), v["attempt"].as_u64()), (Some("COMPLETED"), Some(1)), "{v}");
    assert_eq!(c.wait_done(other)["attempt"], 0);
    let kinds: Vec<&str> =
        v["events"].as_array().unwrap().iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert!(kinds.contains(&"preempted") && kinds.contains(&"requeued"), "{kinds:?}");
    // Progress is continuous: every step exactly once, across the preemption.
    let log = std::fs::read_to_string(steps(victim_name)).unwrap();
    let got: Vec<u32> = log.lines().map(|l| l.trim_start_matches("step ").parse().unwrap()).collect();
    let want: Vec<u32> = (1..=40).collect();
    assert_eq!(got, want, "steps lost or repeated across the preemption");
    // Each attempt's own log: the run before the requeue, and the current one.
    let id = victim.to_string();
    let first = c.ok(&["logs", &id, "--attempt", "0"]);
    assert!(
        first.starts_with("attempt 0 resumes at step 0") && first.contains("checkpointed at step"),
        "{first}"
    );
    let current = c.ok(&["logs", &id]);
    assert!(current.starts_with("attempt 1 resumes at step ") && !current.contains("attempt 0"), "{current}");
    assert_eq!(c.ok(&["logs", &id, "--attempt", "1"]), current);
    let out = c.kairos(&["logs", &id, "--attempt", "2"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("has had attempts 0 to 1 only"));
}

#[test]
fn a_preemption_interrupted_by_leader_failover_completes_exactly_once() {
    let mut c = Cluster::start_with(3, 1, &[]);
    let marks = c.path("marks");
    // A victim that takes a while to checkpoint: it leaves time to kill the leader mid-preemption.
    let script = format!(
        "echo \"start $KAIROS_RESTART_COUNT $(date +%s%N)\" >> {m}; trap 'sleep 1; echo \"stop $(date +%s%N)\" >> {m}; exit 0' TERM; \
         while :; do sleep 0.1; done",
        m = marks.display()
    );
    let victim = c.submit(&["--qos", "training", "--", "sh", "-c", &script]);
    c.wait_state(victim, "RUNNING");
    wait_for("the victim to start", || std::fs::read_to_string(&marks).ok().filter(|s| s.contains("start")));
    let urgent_mark = c.path("urgent");
    let urgent = c.submit(&[
        "--qos",
        "urgent",
        "--",
        "sh",
        "-c",
        &format!("echo \"urgent $(date +%s%N)\" >> {}", urgent_mark.display()),
    ]);
    c.wait_state(victim, "PREEMPTING");
    let leader = c.leader();
    c.kill_controller(leader);
    assert_eq!(c.wait_done(urgent)["state"], "COMPLETED");
    // The urgent process ran once, and only after the victim's process had stopped.
    let urgent_runs = std::fs::read_to_string(&urgent_mark).unwrap();
    assert_eq!(urgent_runs.lines().count(), 1, "{urgent_runs}");
    let urgent_at: u128 = urgent_runs.split_whitespace().nth(1).unwrap().parse().unwrap();
    let log = std::fs::read_to_string(&marks).unwrap();
    let stop_at: u128 = log
        .lines()
        .find(|l| l.starts_with("stop"))
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    assert!(stop_at <= urgent_at, "the urgent job started before the victim stopped: {log} / {urgent_runs}");
    // One preemption, one requeue: the victim runs again as attempt 1.
    wait_for("the victim's second attempt", || {
        let j = c.try_job(victim)?;
        (j["attempt"] == 1 && j["state"] == "RUNNING").then_some(())
    });
    let list: serde_json::Value = serde_json::from_str(&c.ok(&["preemptions", "--json"])).unwrap();
    assert_eq!(list.as_array().unwrap().len(), 1, "{list}");
    c.ok(&["cancel", &victim.to_string()]);
}

/// Lines of `path` as (first word, the rest), for the marker files the test jobs write.
fn marks(path: &std::path::Path) -> Vec<(String, Vec<String>)> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace().map(str::to_string);
            Some((words.next()?, words.collect()))
        })
        .collect()
}

#[test]
fn a_suspendable_job_is_paused_for_urgent_work_and_resumes_where_it_was() {
    let c = Cluster::start_with(1, 2, &[]);
    c.ok(&["qos", "update", "batch", "--preempt-mode", "suspend"]);
    let ticks = c.path("ticks");
    let script = format!("while :; do date +%s%N >> {}; sleep 0.05; done", ticks.display());
    let victim = c.submit(&["--qos", "batch", "--gpus", "2", "--suspendable", "--", "sh", "-c", &script]);
    c.wait_state(victim, "RUNNING");
    wait_for("ticks", || (marks(&ticks).len() >= 5).then_some(()));
    let urgent_mark = c.path("urgent");
    let urgent = c.submit(&[
        "--qos",
        "urgent",
        "--gpus",
        "2",
        "--",
        "sh",
        "-c",
        &format!(
            "echo \"start $(date +%s%N) $CUDA_VISIBLE_DEVICES\" >> {m}; sleep 2; echo \"end $(date +%s%N)\" >> {m}",
            m = urgent_mark.display()
        ),
    ]);
    let paused = c.wait_state(victim, "SUSPENDED");
    assert_eq!(paused["attempt"], 0);
    assert_eq!(c.wait_done(urgent)["state"], "COMPLETED");
    // Resumed, same attempt (nothing restarted), and ticking again.
    let resumed = c.wait_state(victim, "RUNNING");
    assert_eq!(resumed["attempt"], 0, "{resumed}");
    let urgent_marks = marks(&urgent_mark);
    let at =
        |kind: &str| -> u128 { urgent_marks.iter().find(|(k, _)| k == kind).unwrap().1[0].parse().unwrap() };
    let (start, end) = (at("start"), at("end"));
    wait_for("ticks after the resume", || {
        marks(&ticks).iter().any(|(t, _)| t.parse::<u128>().unwrap() > end).then_some(())
    });
    // While the urgent job held the GPUs the suspended job did not run at all.
    let during: Vec<u128> =
        marks(&ticks).iter().map(|(t, _)| t.parse().unwrap()).filter(|t| *t > start && *t < end).collect();
    assert!(during.is_empty(), "the suspended job ran while paused: {during:?}");
    let list: serde_json::Value = serde_json::from_str(&c.ok(&["preemptions", "--json"])).unwrap();
    assert_eq!(list[0]["mode"], "suspend", "{list}");
    assert_eq!(list[0]["gpu_s_lost"], 0, "{list}");
    let kinds: Vec<String> = resumed["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap().to_string())
        .collect();
    assert!(kinds.iter().any(|k| k == "resumed"), "{kinds:?}");
    c.ok(&["cancel", &victim.to_string()]);
    assert_eq!(c.wait_done(victim)["state"], "CANCELLED");
}

#[test]
fn an_elastic_job_shrinks_for_urgent_work_and_grows_back_without_losing_a_step() {
    let c = Cluster::start_with(1, 4, &[]);
    let (steps, attempts) = (c.path("steps"), c.path("attempts"));
    let elastic = c.submit(&[
        "--qos",
        "training",
        "--gpus",
        "4",
        "--min-gpus",
        "2",
        // Its own checkpoint signal and grace (train.sh traps whatever KAIROS_CHECKPOINT_SIGNAL says).
        "--checkpoint-signal",
        "usr2",
        "--checkpoint-grace",
        "60s",
        "--env",
        "STEPS=60",
        "--env",
        "CHECKPOINT_EVERY=5",
        "--env",
        &format!("OUT={}", steps.display()),
        "--env",
        &format!("ATTEMPTS={}", attempts.display()),
        "--",
        "sh",
        &train_script(),
    ]);
    c.wait_state(elastic, "RUNNING");
    wait_for("training progress", || (marks(&steps).len() >= 8).then_some(()));
    let urgent_mark = c.path("urgent");
    let urgent = c.submit(&[
        "--qos",
        "urgent",
        "--gpus",
        "2",
        "--",
        "sh",
        "-c",
        &format!("echo \"urgent $CUDA_VISIBLE_DEVICES\" >> {}; sleep 1", urgent_mark.display()),
    ]);
    assert_eq!(c.wait_done(urgent)["state"], "COMPLETED");
    let job = c.wait_done(elastic);
    assert_eq!((job["state"].as_str(), job["attempt"].as_u64()), (Some("COMPLETED"), Some(2)), "{job}");
    // Attempt 0 on 4 GPUs, attempt 1 shrunk to the 2 the urgent job left, attempt 2 grown back.
    let runs = marks(&attempts);
    let gpus: Vec<&str> = runs.iter().map(|(_, rest)| rest[2].as_str()).collect();
    assert_eq!(gpus, vec!["4", "2", "4"], "{runs:?}");
    let devices = |i: usize| -> Vec<String> { runs[i].1[4].split(',').map(str::to_string).collect() };
    let urgent_devices: Vec<String> = marks(&urgent_mark)[0].1[0].split(',').map(str::to_string).collect();
    assert!(
        devices(1).iter().all(|d| !urgent_devices.contains(d)),
        "shared a GPU: {runs:?} / {urgent_devices:?}"
    );
    // Continuous progress across both restarts: every step exactly once.
    let got: Vec<u32> = marks(&steps).iter().map(|(_, rest)| rest[0].parse().unwrap()).collect();
    assert_eq!(got, (1..=60).collect::<Vec<u32>>(), "steps lost or repeated");
    let list: serde_json::Value = serde_json::from_str(&c.ok(&["preemptions", "--json"])).unwrap();
    let list = list.as_array().unwrap();
    assert_eq!((list.len(), list[0]["mode"].as_str()), (1, Some("shrink")), "{list:?}");
}

#[test]
fn bad_preemption_settings_are_refused_at_submit_and_change_nothing() {
    let c = Cluster::start_with(1, 4, &[]);
    let cases: [(&[&str], &str); 4] = [
        (&["--gpus", "2", "--min-gpus", "3"], "min_gpus: 3 must be between 1 and gpus (2)"),
        (&["--gpus", "2", "--min-gpus", "0"], "an elastic job runs on at least 1 GPU"),
        (&["--checkpoint-signal", "SIGBOGUS"], "checkpoint.signal: unknown signal \"SIGBOGUS\""),
        (
            &["--qos", "training", "--checkpoint-grace", "10m"],
            "checkpoint.grace_s: 600s is more than qos \"training\" allows (300s)",
        ),
    ];
    for (flags, message) in cases {
        let mut args = vec!["submit"];
        args.extend_from_slice(flags);
        args.extend_from_slice(&["--", "true"]);
        let out = c.kairos(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flags:?} was accepted");
        assert!(stderr.contains(message), "{flags:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    }
    assert!(c.jobs().is_empty(), "bad input created jobs");
}

#[test]
fn an_elastic_gang_gives_up_a_node_for_urgent_work_and_grows_back() {
    let mut c = Cluster::start_with(1, 2, &[]);
    c.add_agent("node-b", 2);
    let attempts = c.path("attempts");
    let gang = c.submit(&[
        "--qos",
        "training",
        "--nodes",
        "2",
        "--gpus-per-node",
        "2",
        "--min-nodes",
        "1",
        "--env",
        "STEPS=60",
        "--env",
        &format!("ATTEMPTS={}", attempts.display()),
        "--",
        "sh",
        &train_script(),
    ]);
    c.wait_state(gang, "RUNNING");
    wait_for("both ranks", || (marks(&attempts).len() >= 2).then_some(()));
    let urgent = c.submit(&["--qos", "urgent", "--gpus", "2", "--", "sleep", "1"]);
    assert_eq!(c.wait_done(urgent)["state"], "COMPLETED");
    let job = c.wait_done(gang);
    assert_eq!((job["state"].as_str(), job["attempt"].as_u64()), (Some("COMPLETED"), Some(2)), "{job}");
    // WORLD_SIZE per attempt: 2 ranks, then 1 (a node released), then 2 again (grown back).
    let mut worlds: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (_, rest) in marks(&attempts) {
        worlds.entry(rest[0].clone()).or_default().push(rest[8].clone());
    }
    let want: BTreeMap<String, Vec<String>> = [
        ("0".to_string(), vec!["2".to_string(), "2".to_string()]),
        ("1".to_string(), vec!["1".to_string()]),
        ("2".to_string(), vec!["2".to_string(), "2".to_string()]),
    ]
    .into();
    assert_eq!(worlds, want, "{:?}", marks(&attempts));
    let list: serde_json::Value = serde_json::from_str(&c.ok(&["preemptions", "--json"])).unwrap();
    assert_eq!(list[0]["mode"], "shrink", "{list}");
}

#[test]
fn a_job_of_a_higher_partition_tier_preempts_on_a_full_cluster() {
    // Slurm's preempt/partition_prio: a batch job in `high` (tier 2) takes the node from a batch
    // job in `low` (tier 0), though batch's QoS preempts nothing.
    let c = Cluster::start(2);
    c.ok(&["partition", "create", "low", "--nodes", "node-a", "--tier", "0"]);
    c.ok(&["partition", "create", "high", "--nodes", "node-a", "--tier", "2"]);
    let low = c.submit(&["--partition", "low", "--gpus", "2", "--", "sleep", "300"]);
    c.wait_state(low, "RUNNING");
    let high = c.submit(&["--partition", "high", "--gpus", "2", "--", "sleep", "300"]);
    c.wait_state(high, "RUNNING");
    let low_now = c.job(low);
    assert_eq!(low_now["state"], "PENDING", "{low_now}");
    c.ok(&["cancel", &high.to_string()]);
    c.ok(&["cancel", &low.to_string()]);
}

/// A job that saves a checkpoint when asked (its checkpoint signal) and keeps working, and
/// saves and exits on SIGTERM — as training frameworks do.
const SAVES_ON_SIGTERM: &str = r#"
dir=$KAIROS_CHECKPOINT_DIR; step=0
[ -f "$dir/step" ] && step=$(cat "$dir/step")
save() { echo "$step" > "$dir/step.tmp" && mv "$dir/step.tmp" "$dir/step"; touch "$dir/.kairos-checkpoint"; }
ck=0; term=0
trap 'ck=1' USR1
trap 'term=1' TERM
while [ "$step" -lt 60 ]; do
  if [ "$term" = 1 ]; then save; echo "saved at step $step on SIGTERM"; exit 0; fi
  if [ "$ck" = 1 ]; then save; ck=0; echo "checkpoint at step $step, working on"; fi
  step=$((step + 1))
  echo "step $step" >> "$OUT"
  sleep 0.1
done
"#;

#[test]
fn a_requeued_job_that_saves_on_sigterm_loses_no_work() {
    let c = Cluster::start(1);
    let out = c.path("steps");
    // It asks for a checkpoint signal: that comes first, SIGTERM after its checkpoint report.
    let victim = c.submit(&[
        "--qos",
        "training",
        "--checkpoint-signal",
        "SIGUSR1",
        "--env",
        &format!("OUT={}", out.display()),
        "--",
        "sh",
        "-c",
        SAVES_ON_SIGTERM,
    ]);
    c.wait_state(victim, "RUNNING");
    wait_for("some progress", || {
        (std::fs::read_to_string(&out).unwrap_or_default().lines().count() >= 8).then_some(())
    });
    let started = std::time::Instant::now();
    let urgent = c.submit(&["--qos", "urgent", "--", "true"]);
    assert_eq!(c.wait_done(urgent)["state"], "COMPLETED");
    // The training grace is 300 s: the checkpoint report ended it early, SIGTERM followed.
    assert!(started.elapsed() < std::time::Duration::from_secs(60), "{:?}", started.elapsed());
    let v = c.wait_done(victim);
    assert_eq!((v["state"].as_str(), v["attempt"].as_u64()), (Some("COMPLETED"), Some(1)), "{v}");
    // Every step exactly once: the steps after the requested checkpoint were saved on SIGTERM,
    // not thrown away by a kill.
    let got = steps_written(&out);
    assert_eq!(got, (1..=60).collect::<Vec<u32>>(), "steps lost or repeated across the preemption");
    // The first attempt ended on SIGTERM, by itself, after its requested checkpoint.
    let first = std::fs::read_to_string(c.job_dir("agent", victim).join("attempt-0.log")).unwrap();
    assert!(first.contains("checkpoint at step") && first.contains("saved at step"), "{first}");
}

/// The steps a training script wrote to `out` ("step N" lines), in order.
fn steps_written(out: &std::path::Path) -> Vec<u32> {
    std::fs::read_to_string(out)
        .unwrap()
        .lines()
        .map(|l| l.trim_start_matches("step ").parse().unwrap())
        .collect()
}

/// Milliseconds since the epoch of an RFC 3339 time the CLI printed.
fn ms(v: &serde_json::Value) -> u128 {
    let t = humantime::parse_rfc3339(v.as_str().unwrap_or_else(|| panic!("no time: {v}"))).unwrap();
    t.duration_since(std::time::UNIX_EPOCH).unwrap().as_millis()
}

#[test]
fn a_slurm_style_job_that_saves_on_sigterm_frees_its_gpus_at_once_and_loses_nothing() {
    // A training job written for Slurm: no checkpoint signal asked for; on SIGTERM it saves
    // (half a second) and exits. The training QoS's grace is 5 minutes.
    let c = Cluster::start(1);
    c.ok(&["qos", "update", "inference", "--preempt", "training"]);
    let out = c.path("steps");
    let script = r#"
dir=$KAIROS_CHECKPOINT_DIR; step=0
[ -f "$dir/step" ] && step=$(cat "$dir/step")
term=0
trap 'term=1' TERM
while [ "$step" -lt 40 ]; do
  if [ "$term" = 1 ]; then sleep 0.5; echo "$step" > "$dir/step"; echo "saved at step $step"; exit 0; fi
  step=$((step + 1))
  echo "step $step" >> "$OUT"
  sleep 0.1
done
"#;
    let victim = c.submit(&[
        "--qos",
        "training",
        "--env",
        &format!("OUT={}", out.display()),
        "--",
        "sh",
        "-c",
        script,
    ]);
    c.wait_state(victim, "RUNNING");
    wait_for("some progress", || {
        (std::fs::read_to_string(&out).unwrap_or_default().lines().count() >= 5).then_some(())
    });
    let inference = c.submit(&["--qos", "inference", "--", "sleep", "1"]);
    let running = c.wait_state(inference, "RUNNING");
    let waited = ms(&running["start_time"]) - ms(&running["submit_time"]);
    assert!(waited <= 2_000, "the inference job started {waited} ms after its submit");
    assert_eq!(c.wait_done(inference)["state"], "COMPLETED");
    let v = c.wait_done(victim);
    assert_eq!((v["state"].as_str(), v["attempt"].as_u64()), (Some("COMPLETED"), Some(1)), "{v}");
    let got = steps_written(&out);
    assert_eq!(got, (1..=40).collect::<Vec<u32>>(), "steps lost or repeated across the preemption");
    let first = std::fs::read_to_string(c.job_dir("agent", victim).join("attempt-0.log")).unwrap();
    assert!(first.contains("saved at step"), "{first}");
}

#[test]
fn inference_starts_in_the_headroom_and_training_is_stopped_to_refill_it_without_losing_work() {
    // One agent with 2 GPUs; inference keeps 1 idle and may preempt training.
    let c = Cluster::start_with(3, 2, &[]);
    c.ok(&["qos", "update", "inference", "--headroom-gpus", "1", "--preempt", "training"]);
    let steps = c.path("trainer.steps");
    let trainer = submit_training(&c, &[], 40, &steps);
    c.wait_state(trainer, "RUNNING");
    // A second training job would leave no GPU idle: it waits, saying why.
    let second = c.submit(&["--qos", "training", "--", "true"]);
    wait_for("the second training job to wait for the headroom", || {
        (c.job(second)["reason"] == "Headroom").then_some(())
    });
    wait_for("training progress", || {
        let n = std::fs::read_to_string(&steps).unwrap_or_default().lines().count();
        (n >= 8).then_some(())
    });
    // Inference starts in the idle GPU without preempting anything ...
    let inference = c.submit(&["--qos", "inference", "--", "sleep", "2"]);
    let job = c.wait_done(inference);
    assert_eq!((job["state"].as_str(), job["attempt"].as_u64()), (Some("COMPLETED"), Some(0)), "{job}");
    let list: serde_json::Value = serde_json::from_str(&c.ok(&["preemptions", "--json"])).unwrap();
    assert!(list.as_array().unwrap().iter().all(|p| p["preemptor"] != inference), "{list}");
    // ... and the training run is stopped (checkpoint signal) to give the headroom its GPU
    // back, requeued, and resumed from its checkpoint: every step exactly once.
    let t = c.wait_done(trainer);
    assert_eq!((t["state"].as_str(), t["attempt"].as_u64()), (Some("COMPLETED"), Some(1)), "{t}");
    let events = t["events"].as_array().unwrap();
    assert!(
        events
            .iter()
            .any(|e| e["kind"] == "preempted" && e["message"].as_str().unwrap().contains("headroom")),
        "{t}"
    );
    let log = std::fs::read_to_string(&steps).unwrap();
    let got: Vec<u32> = log.lines().map(|l| l.trim_start_matches("step ").parse().unwrap()).collect();
    assert_eq!(got, (1..=40).collect::<Vec<u32>>(), "steps lost or repeated across the refill");
    assert_eq!(c.wait_done(second)["state"], "COMPLETED");
    let inf: serde_json::Value =
        serde_json::from_str(&c.ok(&["qos", "show", "inference", "--json"])).unwrap();
    assert_eq!(inf["headroom_gpus"], 1, "{inf}");
    let table = c.ok(&["qos", "list"]);
    let row = table.lines().find(|l| l.starts_with("inference")).unwrap_or_default();
    assert!(table.contains("HEADROOM") && row.split_whitespace().last() == Some("1"), "{table}");
}

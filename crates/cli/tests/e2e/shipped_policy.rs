//! The shipped policy is the one the README promises: on a new cluster (no policy applied) a
//! user's inference job starts at once by checkpointing that user's training, which resumes from
//! its checkpoint; `kairos sim` without `--policy` replays that same policy.

use std::process::{Command, Output};

use crate::harness::{wait_for, Cluster};

/// `kairos` as the plain user whose token is `token` (no admin rights, nobody's contexts).
fn as_user(c: &Cluster, token: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kairos"))
        .arg("--controllers")
        .arg(c.addrs())
        .env("HOME", c.path("no-home"))
        .env_remove("XDG_CONFIG_HOME")
        .env_remove("KAIROS_TOKEN_FILE")
        .env_remove("KAIROS_CONTEXT")
        .env("KAIROS_TOKEN", token)
        .args(args)
        .output()
        .expect("run kairos")
}

fn submitted(out: &Output) -> u64 {
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "submit failed: {stderr}");
    stdout.trim().parse().unwrap_or_else(|_| panic!("not a job id: {stdout:?}"))
}

/// Milliseconds since the epoch of an RFC 3339 time the CLI printed.
fn ms(v: &serde_json::Value) -> u128 {
    let t = humantime::parse_rfc3339(v.as_str().unwrap_or_else(|| panic!("no time: {v}"))).unwrap();
    t.duration_since(std::time::UNIX_EPOCH).unwrap().as_millis()
}

#[test]
fn on_a_new_cluster_inference_checkpoints_training_at_once_and_training_resumes() {
    let c = Cluster::start(2);
    let token = c.ok(&["token", "create", "--user", "alice", "--role", "user"]).trim().to_string();
    // A plain user is not given urgent (the operators' to hand out) …
    let out = as_user(&c, &token, &["submit", "--qos", "urgent", "--", "true"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("qos \"urgent\" is not allowed"), "{err}");
    // … but the everyday profiles: training fills both GPUs.
    let steps = c.path("train.steps");
    let train = format!("{}/../../examples/train.sh", env!("CARGO_MANIFEST_DIR"));
    let out_env = format!("OUT={}", steps.display());
    let training = submitted(&as_user(
        &c,
        &token,
        &[
            "submit",
            "--profile",
            "training",
            "--gpus",
            "2",
            "--env",
            "STEPS=60",
            "--env",
            "CHECKPOINT_EVERY=25",
            "--env",
            &out_env,
            "--",
            "sh",
            &train,
        ],
    ));
    c.wait_state(training, "RUNNING");
    wait_for("training progress", || {
        let n = std::fs::read_to_string(&steps).unwrap_or_default().lines().count();
        (n >= 8).then_some(())
    });
    // The same user's inference starts at once: training is checkpointed and requeued.
    let inference =
        submitted(&as_user(&c, &token, &["submit", "--profile", "inference", "--gpus", "1", "--", "true"]));
    let job = c.wait_done(inference);
    assert_eq!((job["state"].as_str(), job["qos"].as_str()), (Some("COMPLETED"), Some("inference")), "{job}");
    let waited_ms = ms(&job["start_time"]) - ms(&job["submit_time"]);
    let qos: serde_json::Value = serde_json::from_str(&c.ok(&["qos", "show", "training", "--json"])).unwrap();
    let grace_ms = u128::from(qos["grace_s"].as_u64().unwrap()) * 1000;
    assert!(
        grace_ms > 0 && waited_ms < grace_ms,
        "inference waited {waited_ms} ms; training's grace is {grace_ms} ms"
    );
    assert!(waited_ms < 20_000, "inference waited {waited_ms} ms for a checkpoint that takes a step");
    let list: serde_json::Value = serde_json::from_str(&c.ok(&["preemptions", "--json"])).unwrap();
    let list = list.as_array().unwrap();
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!(
        (list[0]["preemptor"].as_u64(), list[0]["victim"].as_u64()),
        (Some(inference), Some(training))
    );
    assert_eq!(list[0]["mode"], "requeue");
    // Training resumes from its checkpoint (taken on the signal, between the periodic ones):
    // every step exactly once, over two attempts.
    let t = c.wait_done(training);
    assert_eq!((t["state"].as_str(), t["attempt"].as_u64()), (Some("COMPLETED"), Some(1)), "{t}");
    let got: Vec<u32> = std::fs::read_to_string(&steps)
        .unwrap()
        .lines()
        .map(|l| l.trim_start_matches("step ").parse().unwrap())
        .collect();
    assert_eq!(got, (1..=60).collect::<Vec<u32>>(), "steps lost or repeated across the preemption");
    let before = c.ok(&["logs", &training.to_string(), "--attempt", "0"]);
    assert!(before.contains("checkpointed at step"), "{before}");
    let resumed = c.ok(&["logs", &training.to_string()]);
    let at: u32 = resumed
        .strip_prefix("attempt 1 resumes at step ")
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{resumed}"));
    // Where the signal's checkpoint left it, not a periodic one (every 25 steps) or step 0.
    assert!(at >= 8 && before.contains(&format!("checkpointed at step {at};")), "resumed at {at}: {before}");

    // `kairos sim` without --policy replays exactly this cluster's policy.
    let qos_list = c.ok(&["qos", "list"]);
    std::fs::write(
        c.path("one.jsonl"),
        "{\"submit_s\": 0, \"duration_s\": 60, \"gpus\": 1, \"class\": \"inference\"}\n",
    )
    .unwrap();
    let sim = Command::new(env!("CARGO_BIN_EXE_kairos"))
        .args(["sim", "--cluster", "1x2", "--jobs"])
        .arg(c.path("one.jsonl"))
        .output()
        .unwrap();
    assert!(sim.status.success(), "{}", String::from_utf8_lossy(&sim.stderr));
    let text = String::from_utf8_lossy(&sim.stdout);
    let mut lines = text.lines();
    assert!(lines.next().is_some_and(|l| l.starts_with("policy: shipped")), "{text}");
    let table: Vec<&str> = lines.take_while(|l| !l.is_empty()).collect();
    assert_eq!(
        table,
        qos_list.lines().collect::<Vec<_>>(),
        "kairos sim:\n{text}\nkairos qos list:\n{qos_list}"
    );
    assert!(qos_list.contains("inference") && qos_list.contains("batch,training"), "{qos_list}");
}

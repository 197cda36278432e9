//! Preemption end to end: urgent work on a cluster full of training, victims checkpoint,
//! requeue and resume (examples/train.sh).

use crate::harness::{wait_for, Cluster};

fn train_script() -> String {
    format!("{}/../../examples/train.sh", env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn urgent_job_preempts_a_training_job_which_resumes_from_its_checkpoint() {
    let c = Cluster::start_with(3, 2, &[]);
    let steps = |name: &str| c.path(&format!("{name}.steps"));
    let submit_training = |name: &str| {
        let env_out = format!("OUT={}", steps(name).display());
        c.submit(&[
            "--qos",
            "training",
            "--env",
            "STEPS=40",
            "--env",
            "CHECKPOINT_EVERY=5",
            "--env",
            &env_out,
            "--",
            "sh",
            &train_script(),
        ])
    };
    let first = submit_training("first");
    let second = submit_training("second");
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
}

#[test]
fn a_preemption_interrupted_by_leader_failover_completes_exactly_once() {
    let mut c = Cluster::start_with(3, 1, &[]);
    let marks = c.path("marks");
    // A victim that takes a while to checkpoint: it leaves time to kill the leader mid-preemption.
    let script = format!(
        "echo \"start $KAIROS_RESTART_COUNT $(date +%s%N)\" >> {m}; trap 'sleep 1; echo \"stop $(date +%s%N)\" >> {m}; exit 0' USR1; \
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

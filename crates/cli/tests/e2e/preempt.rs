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

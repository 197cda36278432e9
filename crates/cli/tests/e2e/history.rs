//! Retention and accounting: finished jobs leave the live state after `--job-retention` and
//! are found by `kairos history` and `kairos show`, the same after a leader failover.

use serde_json::Value;

use crate::harness::{wait_for, Cluster};

fn history(c: &Cluster, args: &[&str]) -> Vec<Value> {
    let mut full = vec!["history", "--json"];
    full.extend_from_slice(args);
    let v: Value = serde_json::from_str(&c.ok(&full)).unwrap();
    v.as_array().unwrap().clone()
}

#[test]
fn a_job_past_the_retention_leaves_the_queue_and_stays_in_the_history_across_a_failover() {
    let mut c = Cluster::start_with(3, 2, &["--job-retention", "2s"]);
    let failed = c.submit(&["--name", "exits-3", "--", "sh", "-c", "exit 3"]);
    let running = c.submit(&["--name", "sleeper", "--", "sleep", "300"]);
    assert_eq!(c.wait_done(failed)["exit_code"], 3);
    c.wait_state(running, "RUNNING");
    // Gone from the live state once the retention has passed ...
    wait_for("the finished job to leave the live state", || {
        let all: Value = serde_json::from_str(&c.ok(&["queue", "--all", "--json"])).ok()?;
        let ids: Vec<u64> = all.as_array()?.iter().filter_map(|j| j["id"].as_u64()).collect();
        (!ids.contains(&failed) && ids.contains(&running)).then_some(())
    });
    // ... and in the history, with its exit code; the running job is there too, live.
    let records = history(&c, &[]);
    let record = records.iter().find(|r| r["id"] == failed).expect("the purged job in the history").clone();
    assert_eq!(
        (record["state"].as_str(), record["exit_code"].as_i64()),
        (Some("FAILED"), Some(3)),
        "{record}"
    );
    assert_eq!(
        (record["purged"].as_bool(), record["name"].as_str()),
        (Some(true), Some("exits-3")),
        "{record}"
    );
    assert_eq!(record["gpus"], 1);
    let live = records.iter().find(|r| r["id"] == running).expect("the running job");
    assert_eq!((live["state"].as_str(), live["purged"].as_bool()), (Some("RUNNING"), Some(false)), "{live}");
    // Filters.
    let failed_only = history(&c, &["--state", "FAILED"]);
    assert_eq!(failed_only.iter().map(|r| r["id"].as_u64().unwrap()).collect::<Vec<_>>(), vec![failed]);
    assert!(history(&c, &["--user", "nobody-else"]).is_empty());
    assert!(history(&c, &["--until", "2000-01-01"]).is_empty(), "nothing was live in 1999");
    // `show` finds it too.
    let shown: Value = serde_json::from_str(&c.ok(&["show", &failed.to_string(), "--json"])).unwrap();
    assert_eq!((shown["exit_code"].as_i64(), shown["purged"].as_bool()), (Some(3), Some(true)), "{shown}");
    assert!(c.ok(&["show", &failed.to_string()]).contains("only its history record is kept"));
    let table = c.ok(&["history", "--format", "id,state,exit"]);
    assert!(
        table
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == [&failed.to_string(), "FAILED", "3"]),
        "{table}"
    );
    // After a failover the new leader's history is the same.
    let before: Vec<Value> = records.iter().filter(|r| r["purged"] == true).cloned().collect();
    let leader = c.leader();
    c.kill_controller(leader);
    let new_leader = c.leader();
    assert_ne!(new_leader, leader);
    let after: Vec<Value> = history(&c, &[]).into_iter().filter(|r| r["purged"] == true).collect();
    assert_eq!(after, before);
    c.ok(&["cancel", &running.to_string()]);
    // Bad input: one-line errors.
    for (args, says) in [
        (&["history", "--since", "someday"][..], "--since: cannot parse \"someday\""),
        (&["history", "--state", "DONE"][..], "--state: unknown state"),
        (&["history", "--format", "id,colour"][..], "--format: unknown column"),
    ] {
        let out = c.kairos(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(says) && err.lines().count() == 1, "{err}");
    }
}

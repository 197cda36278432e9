//! High availability: three (and more) kairosd replicas as real processes on loopback.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde_json::Value;

use crate::harness::{bin, free_addr, wait_for, Cluster};

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).to_string()
}

/// Submits `true` jobs one after another until `stop`, recording each acknowledged id with the
/// time it was acknowledged.
fn submit_loop(
    addrs: String,
    token_file: std::path::PathBuf,
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<Vec<(u64, Instant)>>>,
) {
    while !stop.load(Ordering::Relaxed) {
        let out = crate::harness::kairos_cmd()
            .args(["--controllers", &addrs, "submit", "--", "true"])
            .env("KAIROS_TOKEN_FILE", &token_file)
            .output()
            .expect("run kairos");
        if out.status.success() {
            let id: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().expect("a job id");
            acked.lock().unwrap().push((id, Instant::now()));
        }
    }
}

#[test]
fn leader_kill_9_under_continuous_submits_loses_no_acknowledged_submit() {
    let mut c = Cluster::start_with(3, 8, &[]);
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(Mutex::new(Vec::new()));
    let writer = {
        let (addrs, token, stop, acked) = (c.addrs(), c.token_file(), stop.clone(), acked.clone());
        std::thread::spawn(move || submit_loop(addrs, token, stop, acked))
    };
    wait_for("submits before the kill", || (acked.lock().unwrap().len() >= 5).then_some(()));
    let leader = c.leader();
    c.kill_controller(leader);
    let killed_at = Instant::now();
    wait_for("submits acknowledged after the kill", || {
        let after = acked.lock().unwrap().iter().filter(|(_, t)| *t > killed_at).count();
        (after >= 5).then_some(())
    });
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();

    let new_leader = c.leader();
    assert_ne!(new_leader, leader, "the killed replica cannot lead");
    let present: BTreeSet<u64> = c.jobs().iter().map(|j| j["id"].as_u64().unwrap()).collect();
    let acked: Vec<u64> = acked.lock().unwrap().iter().map(|(id, _)| *id).collect();
    let acked_set: BTreeSet<u64> = acked.iter().copied().collect();
    assert_eq!(acked_set.len(), acked.len(), "one job id acknowledged twice: {acked:?}");
    let lost: Vec<&u64> = acked_set.difference(&present).collect();
    assert!(lost.is_empty(), "acknowledged submits lost: {lost:?}");

    // The killed replica comes back from its data dir, catches up, and all three agree.
    c.start_controller(leader);
    for id in &acked {
        assert_eq!(c.wait_done(*id)["state"], "COMPLETED", "job {id}");
    }
    let status = c.wait_converged();
    assert!(status["applied_index"].as_u64().unwrap() > 0);
    assert_eq!(status["replicas"].as_array().unwrap().len(), 3);
}

#[test]
fn follower_loss_is_invisible_and_losing_quorum_stops_writes_but_not_reads() {
    let mut c = Cluster::start_with(3, 2, &[]);
    let leader = c.leader();
    let followers: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
    c.kill_controller(followers[0]);
    let id = c.submit(&["--", "true"]);
    assert_eq!(c.wait_done(id)["state"], "COMPLETED");

    c.kill_controller(followers[1]);
    let out = c.kairos(&["submit", "--", "true"]);
    assert_eq!(out.status.code(), Some(1), "a write without quorum succeeded");
    let err = stderr(&out);
    assert_eq!(err.trim_end().lines().count(), 1, "{err:?}");
    assert!(err.contains("quorum"), "{err:?}");
    assert!(err.contains("Unavailable"), "{err:?}");
    // Reads still answer from the surviving replica.
    let queue = c.ok(&["queue", "--all", "--json"]);
    assert!(queue.contains(&format!("\"id\": {id}")), "{queue}");
    assert_eq!(c.job(id)["state"], "COMPLETED");

    // One replica back: quorum again, writes succeed.
    c.start_controller(followers[1]);
    let next = c.submit(&["--", "true"]);
    assert_eq!(c.wait_done(next)["state"], "COMPLETED");
}

#[test]
fn a_running_job_survives_leader_failover_and_completes_once() {
    let mut c = Cluster::start_with(3, 1, &[]);
    let starts = c.path("starts");
    let script = format!("echo $KAIROS_RESTART_COUNT >> {}; sleep 3", starts.display());
    let id = c.submit(&["--", "sh", "-c", &script]);
    wait_for("the job to start", || std::fs::metadata(&starts).ok().map(|_| ()));
    let leader = c.leader();
    c.kill_controller(leader);
    let job = c.wait_done(id);
    assert_eq!(job["state"], "COMPLETED", "{job}");
    assert_eq!(job["attempt"], 0);
    assert_eq!(std::fs::read_to_string(&starts).unwrap(), "0\n", "the job was started again");
    let kinds: Vec<&str> =
        job["events"].as_array().unwrap().iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds.iter().filter(|k| **k == "started").count(), 1, "{kinds:?}");
    assert_eq!(kinds.iter().filter(|k| **k == "completed").count(), 1, "{kinds:?}");
    assert!(!kinds.contains(&"node_fail"), "{kinds:?}");
}

#[test]
fn added_replica_installs_a_snapshot_becomes_voter_and_removing_the_leader_hands_over() {
    let mut c = Cluster::start_with(3, 8, &["--snapshot-logs", "5"]);
    let ids: Vec<u64> = (0..12).map(|_| c.submit(&["--", "true"])).collect();
    for id in &ids {
        c.wait_done(*id);
    }
    // Wait until the leader has compacted its log behind a snapshot.
    let leader = c.leader();
    wait_for("a snapshot on the leader", || {
        c.status_of(leader)?["snapshot_index"].as_u64().filter(|i| *i > 5)
    });

    let addr = free_addr();
    let mut joiner = c.controller_command(4, &addr);
    joiner.arg("--join");
    c.controllers.push(crate::harness::Controller {
        id: 4,
        addr: addr.clone(),
        child: Some(joiner.spawn().unwrap()),
        metrics: None,
        http: None,
    });
    let status: Value = serde_json::from_str(&c.ok(&["cluster", "add", "4", &addr, "--json"])).unwrap();
    let role = |s: &Value, id: u64| {
        s["replicas"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["id"] == id)
            .map(|r| r["role"].as_str().unwrap().to_string())
    };
    assert_eq!(role(&status, 4).as_deref(), Some("follower"), "{status}");
    // The new replica was brought up to date by a snapshot, not by replaying the whole log.
    let new = wait_for("the new replica to have a snapshot", || {
        c.status_of(3).filter(|s| s["snapshot_index"].is_u64())
    });
    assert!(new["snapshot_index"].as_u64().unwrap() > 0, "{new}");
    let converged = c.wait_converged();
    assert_eq!(converged["replicas"].as_array().unwrap().len(), 4);
    // The new replica is among those `wait_converged` compared (asked in turn, while nothing
    // else applied); a later status alone may already include a newer entry.
    assert!(c
        .status_of(3)
        .is_some_and(|s| s["applied_index"].as_u64() >= converged["applied_index"].as_u64()));

    // Removing the leader hands leadership to another voter.
    let leader = c.leader();
    let leader_id = c.controllers[leader].id.to_string();
    c.ok(&["cluster", "remove", &leader_id]);
    let removed = leader;
    let next = wait_for("a new leader", || {
        let l = c.leader();
        (l != removed).then_some(l)
    });
    let status = c.status_of(next).unwrap();
    assert!(role(&status, c.controllers[removed].id).is_none(), "removed replica still listed: {status}");
    c.kill_controller(removed);
    let id = c.submit(&["--", "true"]);
    assert_eq!(c.wait_done(id)["state"], "COMPLETED");
}

#[test]
fn bad_membership_input_is_refused_and_changes_nothing() {
    let c = Cluster::start_with(3, 1, &[]);
    let before = c.wait_converged()["replicas"].clone();
    let taken = c.controllers[1].addr.clone();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec!["cluster".into(), "add".into(), "2".into(), free_addr()], "replica 2 is already a member"),
        (vec!["cluster".into(), "add".into(), "9".into(), taken], "already belongs to replica 2"),
        (vec!["cluster".into(), "add".into(), "9".into(), "nowhere".into()], "is not HOST:PORT"),
        (vec!["cluster".into(), "remove".into(), "7".into()], "replica 7 is not a member"),
    ];
    for (args, expected) in &cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = c.kairos(&args);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(stderr(&out).contains(expected), "{args:?}: {}", stderr(&out));
    }
    assert_eq!(c.wait_converged()["replicas"], before);

    // The last voter of a one-replica cluster cannot be removed.
    let single = Cluster::start(1);
    let out = single.kairos(&["cluster", "remove", "1"]);
    assert!(stderr(&out).contains("last voter"), "{}", stderr(&out));

    // kairosd refuses a peers list without itself, and a data dir already in use.
    let out = std::process::Command::new(bin("kairosd"))
        .args(["--id", "5", "--addr", &free_addr(), "--peers", &c.peers()])
        .arg("--data-dir")
        .arg(c.path("never-used"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("--peers does not include this replica (5)"), "{}", stderr(&out));
    let out = c
        .controller_command(1, &free_addr())
        .args(["--peers", &c.peers()])
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("--addr is"), "{}", stderr(&out));
    let out = std::process::Command::new(bin("kairosd"))
        .args(["--id", "1", "--addr", &free_addr()])
        .arg("--data-dir")
        .arg(c.path("controller-1"))
        .stdout(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("is in use by another kairosd"), "{}", stderr(&out));
    // The refused processes changed nothing: the cluster still serves.
    let id = c.submit(&["--", "true"]);
    assert_eq!(c.wait_done(id)["state"], "COMPLETED");
    assert_eq!(c.wait_converged()["replicas"], before);
}

#[test]
fn a_paused_leader_neither_hangs_clients_nor_keeps_the_agents() {
    let c = Cluster::start_with(3, 2, &[]);
    let leader = c.leader();
    let pid = c.controllers[leader].child.as_ref().map(|ch| ch.id()).expect("leader process");
    // Frozen with its sockets open: connections are accepted, nothing is answered, and when it
    // wakes it still believes it leads.
    crate::harness::signal(pid, libc::SIGSTOP);
    // Listed first, the silent replica is skipped; the others elect a leader and serve.
    let mut order: Vec<String> = vec![c.controllers[leader].addr.clone()];
    order.extend(c.controllers.iter().enumerate().filter(|(i, _)| *i != leader).map(|(_, r)| r.addr.clone()));
    let cli = |addrs: &[String], args: &[&str]| {
        crate::harness::kairos_cmd()
            .arg("--controllers")
            .arg(addrs.join(","))
            .env("KAIROS_TOKEN_FILE", c.token_file())
            .args(args)
            .output()
            .unwrap()
    };
    let out = cli(&order, &["submit", "--", "true"]);
    assert!(out.status.success(), "submit with a paused leader: {}", stderr(&out));
    let id: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    // The agent left the paused leader (its heartbeat timed out) and runs the job for the new one.
    let job = wait_for("the job to complete under the new leader", || {
        let out = cli(&order[1..], &["show", &id.to_string(), "--json"]);
        let job: Value = serde_json::from_slice(&out.stdout).ok()?;
        (job["state"] == "COMPLETED").then_some(job)
    });
    assert_eq!(job["attempt"], 0, "{job}");
    // Woken up, the old leader learns of the new term and follows; nothing diverged and the
    // node was never declared down.
    crate::harness::signal(pid, libc::SIGCONT);
    c.wait_converged();
    let nodes: Value = serde_json::from_str(&c.ok(&["nodes", "--json"])).unwrap();
    assert_eq!(nodes[0]["state"], "UP", "{nodes}");
    let next = c.submit(&["--", "true"]);
    assert_eq!(c.wait_done(next)["state"], "COMPLETED");
}

#[test]
fn a_restarted_replica_serves_no_reads_until_it_has_caught_up() {
    let mut c = Cluster::start_with(3, 2, &[]);
    let leader = c.leader();
    let follower = (0..3).find(|i| *i != leader).unwrap();
    let ids: Vec<u64> = (0..6).map(|_| c.submit(&["--hold", "--", "true"])).collect();
    // Power goes at once: the follower may not have heard that the last submits committed.
    for i in 0..3 {
        c.kill_controller(i);
    }
    c.start_controller(follower);
    let alone = c.controller_addr(follower);
    let list = |c: &Cluster| {
        let out = c.kairos_at(&alone, &["queue", "--all", "--json"]);
        let ids = out.status.success().then(|| {
            let v: Value = serde_json::from_slice(&out.stdout).expect("queue JSON");
            v.as_array().unwrap().iter().map(|j| j["id"].as_u64().unwrap()).collect::<Vec<u64>>()
        });
        (ids, stderr(&out))
    };
    wait_for("the replica to listen", || {
        c.kairos_at(&alone, &["cluster", "status"]).status.success().then_some(())
    });
    // Alone it cannot learn what was committed: it answers no read rather than an old one.
    let deadline = Instant::now() + std::time::Duration::from_secs(3);
    while Instant::now() < deadline {
        match list(&c) {
            (Some(seen), _) => assert_eq!(seen, ids, "a read from a replica that has not caught up"),
            (None, err) => assert!(err.contains("caught up"), "{err}"),
        }
    }
    // With a quorum back it catches up and every acknowledged job is there.
    c.start_controller(leader);
    let seen = wait_for("the replica to catch up and answer", || list(&c).0);
    assert_eq!(seen, ids);
}

/// The CLI at every replica, the leader first (its streams start there).
fn at_leader_first(c: &Cluster, args: &[&str]) -> std::process::Child {
    let leader = c.leader();
    let mut addrs = vec![c.controllers[leader].addr.clone()];
    addrs.extend((0..c.controllers.len()).filter(|i| *i != leader).map(|i| c.controllers[i].addr.clone()));
    crate::harness::kairos_cmd()
        .arg("--controllers")
        .arg(addrs.join(","))
        .env("KAIROS_TOKEN_FILE", c.token_file())
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run kairos")
}

#[test]
fn wait_and_logs_follow_survive_the_leader_they_talk_to_and_lose_no_line() {
    let mut c = Cluster::start_with(3, 1, &[]);
    let id = c.submit(&["--", "sh", "-c", "for i in $(seq 1 40); do echo line $i; sleep 0.1; done; exit 7"]);
    c.wait_state(id, "RUNNING");
    let wait = at_leader_first(&c, &["wait", &id.to_string()]);
    let follow = at_leader_first(&c, &["logs", "--follow", &id.to_string()]);
    std::thread::sleep(std::time::Duration::from_millis(1200));
    let leader = c.leader();
    c.kill_controller(leader);
    let wait = wait.wait_with_output().unwrap();
    assert_eq!(wait.status.code(), Some(7), "wait: {}", String::from_utf8_lossy(&wait.stderr));
    let follow = follow.wait_with_output().unwrap();
    assert!(follow.status.success(), "logs: {}", String::from_utf8_lossy(&follow.stderr));
    let want: String = (1..=40).map(|i| format!("line {i}\n")).collect();
    assert_eq!(String::from_utf8_lossy(&follow.stdout), want, "lines lost or repeated");
}

#[test]
fn wait_exits_69_when_every_controller_is_gone() {
    let mut c = Cluster::start_with(3, 1, &[]);
    let id = c.submit(&["--", "sleep", "300"]);
    c.wait_state(id, "RUNNING");
    let wait = at_leader_first(&c, &["wait", &id.to_string()]);
    std::thread::sleep(std::time::Duration::from_millis(500));
    for i in 0..3 {
        c.kill_controller(i);
    }
    let started = Instant::now();
    let out = wait.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(69), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no controller answered"));
    assert!(started.elapsed() < std::time::Duration::from_secs(40), "{:?}", started.elapsed());
}

/// When a job's `submit_time` (RFC 3339) was, in ms since the epoch.
fn submit_ms(job: &Value) -> i64 {
    let text = job["submit_time"].as_str().expect("submit_time");
    let t = humantime::parse_rfc3339(text).expect("an RFC 3339 time");
    t.duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

fn wall_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

#[test]
fn after_every_replica_was_down_a_minute_the_cluster_time_is_the_clocks_again() {
    let mut c = Cluster::start_with(3, 1, &[]);
    let before = c.submit(&["--", "true"]);
    assert!((submit_ms(&c.job(before)) - wall_ms()).abs() < 2_000);
    c.wait_done(before);
    for i in 0..3 {
        c.kill_controller(i);
    }
    std::thread::sleep(std::time::Duration::from_secs(60));
    for i in 0..3 {
        c.start_controller(i);
    }
    let id = wait_for("a leader to take a submit", || {
        let sent = wall_ms();
        let out = c.kairos(&["submit", "--hold", "--", "true"]);
        out.status
            .success()
            .then(|| (String::from_utf8_lossy(&out.stdout).trim().parse::<u64>().unwrap(), sent))
    });
    let (id, sent) = id;
    let stamped = submit_ms(&c.job(id));
    assert!(
        (stamped - sent).abs() <= 2_000,
        "submitted at {sent} ms by the clock, stamped {stamped} ms ({} s off)",
        (stamped - sent) / 1000
    );
    // What the time is used for sees it: a job just submitted is in the last minute's history.
    let recent = c.ok(&["history", "--json", "--since", "1m"]);
    let ids: Vec<u64> = serde_json::from_str::<Value>(&recent)
        .unwrap()
        .as_array()
        .map(|a| a.iter().filter_map(|j| j["id"].as_u64()).collect())
        .unwrap_or_default();
    assert!(ids.contains(&id), "job {id} missing from `history --since 1m`: {recent}");
    assert!(!ids.contains(&before), "job {before} ended over a minute ago: {recent}");
}

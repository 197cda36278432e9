//! End-to-end tests of the vertical slice: real `kairosd`, `kairos-agent` and `kairos`
//! processes over loopback sockets, real sled files and real job processes.

mod anyreplica;
mod backup;
mod batch;
mod burst;
mod burst_chaos;
mod capacity;
mod confinement;
mod containers;
mod contexts;
mod daily;
mod dependencies;
mod deploy;
mod docs;
mod durability;
mod gang;
mod gateway_bounds;
mod gpu_health;
mod guarantees;
mod ha;
mod harness;
mod history;
mod images;
mod interactive;
mod isolation;
mod kueue_import;
mod limits;
mod observability;
mod policy;
mod powercut;
mod preempt;
mod pty;
mod python_client;
mod reservations;
mod resources;
mod restart;
mod scale;
mod security;
mod shipped_policy;
mod sim;
mod topology;
mod usage;
mod web;
mod whatif;

use std::collections::BTreeSet;

use harness::{alive, read_pid, signal, wait_for, Cluster};

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).to_string()
}

#[test]
fn two_gpu_job_sees_two_distinct_gpus_and_exit_codes_are_kept() {
    let c = Cluster::start(8);
    let id = c.submit(&["--gpus", "2", "--", "sh", "-c", "echo $CUDA_VISIBLE_DEVICES"]);
    let job = c.wait_done(id);
    assert_eq!(job["state"], "COMPLETED", "{job}");
    assert_eq!(job["exit_code"], 0);
    assert_eq!(job["gpus"], 2);
    let logs = c.ok(&["logs", &id.to_string()]);
    let gpus: Vec<&str> = logs.trim().split(',').collect();
    let distinct: BTreeSet<&str> = gpus.iter().copied().collect();
    assert_eq!(gpus.len(), 2, "logs: {logs:?}");
    assert_eq!(distinct.len(), 2, "logs: {logs:?}");
    let allotted: Vec<String> = job["gpu_ids"].as_array().unwrap().iter().map(|g| g.to_string()).collect();
    assert_eq!(gpus, allotted.iter().map(String::as_str).collect::<Vec<_>>());

    let failing = c.submit(&["--", "sh", "-c", "exit 3"]);
    let job = c.wait_done(failing);
    assert_eq!(job["state"], "FAILED");
    assert_eq!(job["exit_code"], 3);
    // `kairos wait` exits with the job's own exit code.
    assert!(c.kairos(&["wait", &id.to_string()]).status.success());
    assert_eq!(c.kairos(&["wait", &failing.to_string()]).status.code(), Some(3));
}

#[test]
fn nine_one_gpu_jobs_on_eight_gpus_never_overlap_past_capacity() {
    let c = Cluster::start(8);
    let stamps = c.path("stamps");
    std::fs::create_dir_all(&stamps).unwrap();
    let script = format!(
        "d={}; echo \"$(date +%s%N) $CUDA_VISIBLE_DEVICES\" > $d/$KAIROS_JOB_ID.start; sleep 1.5; date +%s%N > $d/$KAIROS_JOB_ID.end",
        stamps.display()
    );
    let ids: Vec<u64> = (0..9).map(|_| c.submit(&["--gpus", "1", "--", "sh", "-c", &script])).collect();
    for id in &ids {
        assert_eq!(c.wait_done(*id)["state"], "COMPLETED");
    }
    // Intervals from the processes' own clocks.
    let mut intervals = Vec::new();
    for id in &ids {
        let start = std::fs::read_to_string(stamps.join(format!("{id}.start"))).unwrap();
        let mut parts = start.split_whitespace();
        let t0: u128 = parts.next().unwrap().parse().unwrap();
        let gpu: String = parts.next().unwrap().to_string();
        let t1: u128 =
            std::fs::read_to_string(stamps.join(format!("{id}.end"))).unwrap().trim().parse().unwrap();
        intervals.push((t0, t1, gpu));
    }
    let mut peak = 0;
    for (t0, _, _) in &intervals {
        let overlapping: Vec<&(u128, u128, String)> =
            intervals.iter().filter(|(s, e, _)| s <= t0 && t0 < e).collect();
        peak = peak.max(overlapping.len());
        let gpus: BTreeSet<&String> = overlapping.iter().map(|(_, _, g)| g).collect();
        assert_eq!(gpus.len(), overlapping.len(), "two live jobs shared a GPU: {overlapping:?}");
    }
    assert!(peak <= 8, "{peak} jobs ran at once on 8 GPUs");
    assert!(peak >= 2, "jobs did not run concurrently at all (peak {peak})");
}

#[test]
fn controller_kill_9_and_restart_keeps_every_acknowledged_job() {
    let mut c = Cluster::start(2);
    let ids: Vec<u64> = (0..4).map(|_| c.submit(&["--", "sh", "-c", "sleep 3"])).collect();
    wait_for("two jobs running", || {
        let running = c.jobs().iter().filter(|j| j["state"] == "RUNNING").count();
        (running == 2).then_some(())
    });
    let before: Vec<(u64, String)> = c
        .jobs()
        .iter()
        .map(|j| (j["id"].as_u64().unwrap(), j["state"].as_str().unwrap().to_string()))
        .collect();
    assert!(before.iter().any(|(_, s)| s == "PENDING"), "{before:?}");
    c.kill_controller(0);
    c.start_controller(0);
    // Every acknowledged job is back, none lost, none invented.
    let after = wait_for("the restarted controller to answer", || {
        let out = c.kairos(&["queue", "--all", "--json"]);
        out.status.success().then(|| serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap())
    });
    let after_ids: Vec<u64> = after.as_array().unwrap().iter().map(|j| j["id"].as_u64().unwrap()).collect();
    assert_eq!(after_ids, ids);
    for (id, state) in &before {
        let now = c.job(*id)["state"].as_str().unwrap().to_string();
        // States only move forward across the restart.
        let ok = now == *state
            || (state == "PENDING" && now != "PENDING")
            || (state == "RUNNING" && now == "COMPLETED");
        assert!(ok, "job {id} was {state} before the restart and is {now} after");
    }
    // The agent reconnects and the queue drains.
    for id in &ids {
        assert_eq!(c.wait_done(*id)["state"], "COMPLETED", "job {id}");
    }
    let next = c.submit(&["--", "true"]);
    assert_eq!(next, ids[ids.len() - 1] + 1, "job ids continue after a restart");
}

#[test]
fn cancel_kills_the_whole_process_group() {
    let c = Cluster::start(1);
    let pidfile = c.path("child.pid");
    let script = format!("sleep 300 & echo $! > {}; wait", pidfile.display());
    let id = c.submit(&["--", "sh", "-c", &script]);
    let child = wait_for("the job's child to start", || read_pid(&pidfile));
    assert!(alive(child));
    c.ok(&["cancel", &id.to_string()]);
    let job = c.wait_done(id);
    assert_eq!(job["state"], "CANCELLED");
    wait_for("the job's child to be gone", || (!alive(child)).then_some(()));
    // The GPU is free again: the next job starts.
    let next = c.submit(&["--", "true"]);
    assert_eq!(c.wait_done(next)["state"], "COMPLETED");
    // Cancelling again is refused with a clear message.
    let again = c.kairos(&["cancel", &id.to_string()]);
    assert!(!again.status.success());
    assert!(stderr(&again).contains("already ended"), "{}", stderr(&again));
}

#[test]
fn time_limit_stops_the_job_as_timeout() {
    let c = Cluster::start(1);
    let id = c.submit(&["--time", "1s", "--", "sleep", "300"]);
    let job = c.wait_done(id);
    assert_eq!(job["state"], "TIMEOUT", "{job}");
    assert_eq!(job["time_limit_s"], 1);
}

#[test]
fn bad_input_gets_a_one_line_error_and_changes_nothing() {
    let c = Cluster::start(8);
    let before = c.jobs().len();
    let cases: &[(&[&str], &str)] = &[
        (&["submit", "--gpus", "0", "--mem", "lots", "--", "true"], "\"lots\" is not a size"),
        (
            &["submit", "--gpus", "1", "-c", "100000", "--", "true"],
            "cpus: 100000 per task is more than the limit",
        ),
        (&["submit", "--gpus", "-1", "--", "true"], "negative"),
        (&["submit", "--gpus", "9", "--", "true"], "largest node has 8"),
        (&["submit", "--gpus", "1", "--"], "command is empty"),
        (&["submit", "--time", "soon", "--", "true"], "cannot parse \"soon\""),
        (&["submit", "--qos", "gold", "--", "true"], "unknown qos \"gold\""),
        (&["submit", "--env", "CUDA_VISIBLE_DEVICES=7", "--", "true"], "cannot be overridden"),
        (&["show", "424242"], "job 424242 not found"),
        (&["cancel", "424242"], "job 424242 not found"),
        (&["logs", "424242"], "job 424242 not found"),
        (&["show", "abc"], "invalid value 'abc'"),
    ];
    for (args, expected) in cases {
        let out = c.kairos(args);
        let err = stderr(&out);
        assert!(!out.status.success(), "kairos {args:?} succeeded");
        assert_eq!(err.trim_end().lines().count(), 1, "kairos {args:?}: not one line: {err:?}");
        assert!(err.contains(expected), "kairos {args:?}: {err:?} lacks {expected:?}");
        assert!(out.stdout.is_empty(), "kairos {args:?} printed to stdout");
    }
    assert_eq!(c.jobs().len(), before, "bad input created jobs");

    // No controller at all: a clear message, not a panic.
    let out = crate::harness::kairos_cmd().args(["--controllers", "127.0.0.1:1", "queue"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.starts_with("kairos: cannot reach controller at 127.0.0.1:1"), "{err:?}");
    assert_eq!(err.trim_end().lines().count(), 1);
}

#[test]
fn silent_node_goes_down_its_jobs_end_node_fail_or_are_requeued() {
    let mut c = Cluster::start(2);
    let pidfile = c.path("job.pid");
    let id = c.submit(&["--", "sh", "-c", &format!("echo $$ > {}; exec sleep 300", pidfile.display())]);
    let pid = wait_for("the job to start", || read_pid(&pidfile));
    // A requeueable job: its second attempt succeeds at once.
    let pidfile2 = c.path("requeued.pid");
    let script = format!(
        "[ \"$KAIROS_RESTART_COUNT\" = 1 ] && exit 0; echo $$ > {}; exec sleep 300",
        pidfile2.display()
    );
    let requeued = c.submit(&["--requeue", "--", "sh", "-c", &script]);
    let pid2 = wait_for("the requeueable job to start", || read_pid(&pidfile2));
    c.kill_agent();
    let job = c.wait_state(id, "NODE_FAIL");
    assert!(job["reason"].as_str().unwrap().contains("down"), "{job}");
    let job = c.wait_state(requeued, "PENDING");
    assert_eq!(job["attempt"], 1, "{job}");
    let nodes: serde_json::Value = serde_json::from_str(&c.ok(&["nodes", "--json"])).unwrap();
    assert_eq!(nodes[0]["state"], "DOWN");
    // SIGKILL of the agent cannot stop its jobs, but its watchdog fences them when the lease
    // lapses — before the leader declares the node down and requeues them — so the requeued
    // attempt never runs beside the old one (a restarted agent would kill leftovers too).
    assert!(!alive(pid) && !alive(pid2), "the runs of a dead agent outlived its lease");
    c.start_agent();
    c.wait_node_up();
    wait_for("the orphaned jobs to be killed", || (!alive(pid) && !alive(pid2)).then_some(()));
    let job = c.wait_done(requeued);
    assert_eq!((job["state"].as_str(), job["attempt"].as_u64()), (Some("COMPLETED"), Some(1)), "{job}");
    let next = c.submit(&["--", "true"]);
    assert_eq!(c.wait_done(next)["state"], "COMPLETED");
}

#[test]
fn kairos_up_stops_cleanly_on_sigterm_leaving_no_processes() {
    let dir = tempfile::Builder::new().prefix("kairos-up-").tempdir().unwrap();
    let addr = harness::free_addr();
    let agent_addr = harness::free_addr();
    // `kairos up` adds a context of its own and makes it current: a private HOME shows that the
    // CLI then needs neither addresses nor a token — and that another cluster's context, and a
    // token already there, are left as they were.
    let home = dir.path().join("home");
    let config_dir = home.join(".config").join("kairos");
    std::fs::create_dir_all(&config_dir).unwrap();
    let other = "current = \"local\"\n\n[contexts.local]\ncontrollers = [\"10.9.9.9:7001\"]\ntoken_file = \"/elsewhere/admin.token\"\n";
    std::fs::write(config_dir.join("config.toml"), other).unwrap();
    std::fs::write(config_dir.join("token"), "kairos-admin.another-clusters-token\n").unwrap();
    // The CLI's pointer at another cluster, as a user of one has exported: `up` takes its
    // addresses from its own flags only.
    let mut up = crate::harness::kairos_cmd()
        .env("HOME", &home)
        .env("KAIROS_CONTROLLERS", "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3")
        .env_remove("XDG_CONFIG_HOME")
        .env_remove("KAIROS_TOKEN")
        .env_remove("KAIROS_TOKEN_FILE")
        .args(["up", "--addr", &addr, "--agent-addr", &agent_addr, "--fake-gpus", "2"])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // A failed assertion below must not leave the cluster running: SIGTERM on the way out
    // (kairos up stops its daemons on it), unless the test already stopped it.
    struct StopOnDrop(u32);
    impl Drop for StopOnDrop {
        fn drop(&mut self) {
            signal(self.0, libc::SIGTERM);
        }
    }
    let stop = StopOnDrop(up.id());
    let cli = |args: &[&str]| {
        crate::harness::kairos_cmd()
            .env("HOME", &home)
            .env_remove("XDG_CONFIG_HOME")
            .env_remove("KAIROS_TOKEN")
            .env_remove("KAIROS_TOKEN_FILE")
            .env_remove("KAIROS_CONTROLLERS")
            .env_remove("KAIROS_CONTEXT")
            .args(args)
            .output()
            .unwrap()
    };
    wait_for("kairos up to serve", || {
        let out = cli(&["nodes", "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        (v[0]["state"] == "UP").then_some(())
    });
    let contexts: serde_json::Value =
        serde_json::from_slice(&cli(&["context", "list", "--json"]).stdout).unwrap();
    let port = addr.rsplit(':').next().unwrap();
    let mine = contexts.as_array().unwrap().iter().find(|c| c["current"] == true).cloned().unwrap();
    assert_eq!(mine["name"], format!("local-{port}"), "{contexts}");
    assert_eq!(mine["controllers"], serde_json::json!([addr]));
    let config = std::fs::read_to_string(config_dir.join("config.toml")).unwrap();
    assert!(config.contains("[contexts.local]\ncontrollers = [\"10.9.9.9:7001\"]"), "{config}");
    assert_eq!(
        std::fs::read_to_string(config_dir.join("token")).unwrap(),
        "kairos-admin.another-clusters-token\n"
    );
    // Switching: the other context is used (and does not answer), then back.
    assert!(cli(&["context", "use", "local"]).status.success());
    let out = cli(&["--json", "nodes"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("/elsewhere/admin.token"), "{}", stderr(&out));
    let out = cli(&["--context", &format!("local-{port}"), "nodes", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(cli(&["context", "use", &format!("local-{port}")]).status.success());
    let out = cli(&["context", "use", "nope"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("context \"nope\" not found"), "{}", stderr(&out));
    let pidfile = dir.path().join("job.pid");
    let out = cli(&["submit", "--", "sh", "-c", &format!("echo $$ > {}; exec sleep 300", pidfile.display())]);
    assert!(out.status.success(), "{}", stderr(&out));
    let job_pid = wait_for("the job to start", || read_pid(&pidfile));

    signal(up.id(), libc::SIGTERM);
    let status = wait_for("kairos up to exit", || up.try_wait().unwrap());
    // Stopped and reaped: its pid may be another process's now.
    std::mem::forget(stop);
    assert!(status.success(), "kairos up exited with {status}");
    assert!(!alive(job_pid), "the job outlived kairos up");
    // No daemon of this cluster is left: nothing runs with this data directory on its command line.
    let marker = dir.path().display().to_string();
    let leftovers: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(&marker) && !c.contains("cargo"))
        .collect();
    assert!(leftovers.is_empty(), "left running: {leftovers:?}");
}

#[test]
fn logs_follow_streams_until_the_job_ends_and_wait_reports_the_outcome() {
    let c = Cluster::start(1);
    let id = c.submit(&["--", "sh", "-c", "echo first; sleep 1; echo second >&2"]);
    c.wait_state(id, "RUNNING");
    // Follows the running job's log and returns by itself once the job has ended.
    let out = c.ok(&["logs", "--follow", &id.to_string()]);
    assert_eq!(out, "first\nsecond\n");
    let out = c.kairos(&["wait", &id.to_string(), "--json"]);
    assert!(out.status.success());
    let job: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(job["state"], "COMPLETED");
    // A job that never started has no logs yet: a clear error.
    let held = c.submit(&["--hold", "--", "true"]);
    let out = c.kairos(&["logs", &held.to_string()]);
    assert!(stderr(&out).contains("has not started yet"), "{}", stderr(&out));
}

#[test]
fn a_user_flooding_submits_is_rate_limited_and_others_are_not() {
    let c = Cluster::start_with(1, 1, &["--submit-rate-per-user", "1", "--submit-burst-per-user", "2"]);
    let as_user = |user: &str| c.cli_as(user).args(["submit", "--hold", "--", "true"]).output().unwrap();
    // A burst of 2, then 1 per second: ten quick submits cannot all pass.
    let start = std::time::Instant::now();
    let mut accepted = 0;
    let mut refused = None;
    for _ in 0..10 {
        let out = as_user("flood");
        if out.status.success() {
            accepted += 1;
        } else {
            refused = Some(stderr(&out));
            break;
        }
    }
    let refused = refused.expect("a submit beyond the rate is refused");
    assert!(refused.contains("submit rate limit: at most 1 writes/s per user"), "{refused}");
    assert!(accepted >= 2 && accepted <= 2 + start.elapsed().as_secs() as usize + 1, "{accepted} accepted");
    assert!(as_user("calm").status.success(), "another user is not limited");
    assert_eq!(c.jobs().len(), accepted + 1, "the refused submit created nothing");
}

#[test]
fn refused_or_redundant_holds_releases_and_cancels_cost_no_log_entry_and_are_rate_limited() {
    let c = Cluster::start_with(1, 1, &["--submit-rate-per-user", "2", "--submit-burst-per-user", "40"]);
    let commit = || c.status_of(0).and_then(|s| s["commit_index"].as_u64()).expect("a commit index");
    let held = c.cli_as("mallory").args(["submit", "--hold", "--", "true"]).output().unwrap();
    let held: u64 = String::from_utf8_lossy(&held.stdout).trim().parse().expect("a job id");
    let done = c.cli_as("mallory").args(["submit", "--", "true"]).output().unwrap();
    let done: u64 = String::from_utf8_lossy(&done.stdout).trim().parse().expect("a job id");
    c.wait_done(done);
    // Let the scheduler's own writes settle, then count.
    std::thread::sleep(std::time::Duration::from_millis(600));
    let before = commit();
    let mut refused = 0;
    for _ in 0..10 {
        // Already held; cannot release a finished job; cannot cancel it again.
        for args in
            [["hold", &held.to_string()], ["release", &done.to_string()], ["cancel", &done.to_string()]]
        {
            let out = c.cli_as("mallory").args(args).output().unwrap();
            if !out.status.success() {
                refused += 1;
            }
        }
    }
    assert_eq!(refused, 20, "the redundant holds answer, the rest are refused");
    assert_eq!(commit(), before, "refused or redundant calls committed log entries");
    // Past the burst, the user is slowed down; another user is not.
    let mut limited = None;
    for _ in 0..40 {
        let out = c.cli_as("mallory").args(["hold", &held.to_string()]).output().unwrap();
        if !out.status.success() {
            limited = Some(stderr(&out));
            break;
        }
    }
    let limited = limited.expect("holds beyond the rate are refused");
    assert!(limited.contains("hold rate limit"), "{limited}");
    let other = c.cli_as("calm").args(["submit", "--hold", "--", "true"]).output().unwrap();
    assert!(other.status.success(), "{}", stderr(&other));
}

#[test]
fn queue_filters_select_jobs_and_format_picks_columns() {
    let c = Cluster::start(1);
    let a = c.submit(&["--hold", "--name", "alpha", "--qos", "batch", "--", "true"]);
    let b = c.submit(&["--hold", "--name", "beta", "--qos", "inference", "--", "true"]);
    let out = c.cli_as("alice").args(["submit", "--hold", "--name", "gamma", "--", "true"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let g: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    let ids = |args: &[&str]| -> Vec<u64> {
        let mut full = vec!["queue", "--json"];
        full.extend_from_slice(args);
        let v: serde_json::Value = serde_json::from_str(&c.ok(&full)).unwrap();
        v.as_array().unwrap().iter().map(|j| j["id"].as_u64().unwrap()).collect()
    };
    assert_eq!(ids(&[]), vec![a, b, g]);
    assert_eq!(ids(&["--name", "alpha"]), vec![a]);
    assert_eq!(ids(&["--qos", "inference"]), vec![b]);
    assert_eq!(ids(&["--user", "alice"]), vec![g]);
    assert_eq!(ids(&["--me"]), vec![a, b], "the admin's own jobs");
    assert_eq!(ids(&["--state", "pending,RUNNING"]), vec![a, b, g]);
    assert_eq!(ids(&["--state", "COMPLETED"]), Vec::<u64>::new());
    assert_eq!(ids(&["--partition", "default"]), vec![a, b, g]);
    assert_eq!(ids(&["--partition", "nowhere"]), Vec::<u64>::new());
    // Columns by name, in the order asked.
    let table = c.ok(&["queue", "--format", "state,id"]);
    let mut lines = table.lines();
    assert_eq!(lines.next().unwrap().split_whitespace().collect::<Vec<_>>(), ["STATE", "ID"]);
    assert_eq!(lines.next().unwrap().split_whitespace().collect::<Vec<_>>(), ["PENDING", &a.to_string()]);
    // Bad filters are one-line errors.
    for (args, says) in [
        (&["queue", "--state", "DONE"][..], "--state"),
        (&["queue", "--format", "id,colour"][..], "--format"),
    ] {
        let out = c.kairos(args);
        assert_eq!(out.status.code(), Some(1));
        assert!(stderr(&out).contains(says) && stderr(&out).lines().count() == 1, "{}", stderr(&out));
    }
}

#[test]
fn completions_and_man_pages_are_generated() {
    let out = crate::harness::kairos_cmd().args(["completions", "bash"]).output().unwrap();
    assert!(out.status.success());
    let script = String::from_utf8_lossy(&out.stdout);
    assert!(
        script.contains("_kairos()") && script.contains("submit") && script.contains("--gpus"),
        "{script}"
    );
    let dir = tempfile::tempdir().unwrap();
    let out = crate::harness::kairos_cmd().args(["man"]).arg(dir.path()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for page in ["kairos.1", "kairos-submit.1", "kairos-queue.1"] {
        let text =
            std::fs::read_to_string(dir.path().join(page)).unwrap_or_else(|_| panic!("{page} missing"));
        assert!(text.contains(".TH"), "{page}: {text}");
    }
}

#[test]
fn a_reader_that_closes_the_pipe_early_ends_the_output_quietly_with_status_0() {
    let c = Cluster::start(1);
    for _ in 0..3 {
        c.submit(&["--hold", "--", "true"]);
    }
    for args in [&["queue", "--all"][..], &["history"][..], &["completions", "bash"][..]] {
        let mut child = c
            .cli()
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // The reader goes away before anything is written (`| head -0`, a closed pager).
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked") && err.is_empty(), "{args:?}: {err}");
        assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
    }
}

#[test]
fn kairos_up_on_a_taken_port_fails_fast_naming_it_whatever_kairos_controllers_says() {
    let dir = tempfile::Builder::new().prefix("kairos-up-").tempdir().unwrap();
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = held.local_addr().unwrap().to_string();
    let started = std::time::Instant::now();
    let out = crate::harness::kairos_cmd()
        .env("HOME", dir.path().join("home"))
        .env("KAIROS_CONTROLLERS", "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3")
        .args(["up", "--addr", &taken, "--agent-addr", &harness::free_addr()])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(started.elapsed() < std::time::Duration::from_secs(10), "{:?}", started.elapsed());
    assert!(stderr(&out).contains(&taken), "{}", stderr(&out));
    drop(held);
}

#[test]
fn array_task_ids_work_everywhere_and_waiting_on_an_array_waits_for_every_task() {
    let c = Cluster::start(4);
    // Task 0 ends at once, task 1 fails (exit 3) after a second, task 2 completes after two.
    let script = "echo task $SLURM_ARRAY_TASK_ID; sleep $SLURM_ARRAY_TASK_ID; [ $SLURM_ARRAY_TASK_ID = 1 ] && exit 3; exit 0";
    let array = c.submit(&["--array", "0-2", "--", "sh", "-c", script]);
    let a = array.to_string();
    let out = c.kairos(&["wait", &a]);
    assert_eq!(out.status.code(), Some(3), "the worst task's outcome: {}", stderr(&out));
    // It returned only once every task had ended.
    let states: Vec<String> = (0..3)
        .map(|i| {
            let j: serde_json::Value =
                serde_json::from_str(&c.ok(&["show", &format!("{a}_{i}"), "--json"])).unwrap();
            assert_eq!(j["array_task_id"], i, "{j}");
            j["state"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(states, ["COMPLETED", "FAILED", "COMPLETED"]);
    // Accounting names the tasks as the queue does.
    let history = c.ok(&["history", "--format", "id,state"]);
    for (i, state) in [(0, "COMPLETED"), (1, "FAILED"), (2, "COMPLETED")] {
        assert!(
            history
                .lines()
                .any(|l| l.split_whitespace().collect::<Vec<_>>() == [format!("{a}_{i}").as_str(), state]),
            "{history}"
        );
    }
    // Each command takes ARRAY_INDEX.
    assert_eq!(c.ok(&["logs", &format!("{a}_2")]), "task 2\n");
    assert_eq!(c.kairos(&["wait", &format!("{a}_1")]).status.code(), Some(3));
    assert_eq!(c.kairos(&["wait", &format!("{a}_0")]).status.code(), Some(0));
    let held = c.submit(&["--hold", "--array", "0-1", "--", "true"]);
    c.ok(&["release", &format!("{held}_1")]);
    assert_eq!(c.kairos(&["wait", &format!("{held}_1")]).status.code(), Some(0));
    c.ok(&["hold", &format!("{held}_0")]);
    c.ok(&["cancel", &format!("{held}_0")]);
    let out = c.kairos(&["show", &format!("{a}_9")]);
    assert!(!out.status.success() && stderr(&out).contains("no task 9"), "{}", stderr(&out));
}

/// `PPid` of a process, from /proc (None once it is gone).
fn parent_of(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("PPid:")).and_then(|v| v.trim().parse().ok())
}

#[test]
fn what_a_job_leaves_behind_is_adopted_and_reaped_by_the_agent_not_pid_1() {
    let c = Cluster::start(1);
    let agent = c.agent.as_ref().unwrap().id();
    let pidfile = c.path("orphan.pid");
    // A helper the job starts and whose parent exits at once: an orphan while the job runs.
    let script = format!("sh -c 'sleep 300 & echo $! > {}'; sleep 300", pidfile.display());
    let id = c.submit(&["--", "sh", "-c", &script]);
    let orphan = wait_for("the helper to start", || read_pid(&pidfile));
    let parent = wait_for("the helper's parent to exit", || parent_of(orphan).filter(|p| *p != 0));
    assert_eq!(parent, agent, "the orphan went to {parent}, not the agent ({agent})");
    // Cancelled, its processes are killed: the agent reaps the orphan; no zombie is left.
    c.ok(&["cancel", &id.to_string()]);
    assert_eq!(c.wait_done(id)["state"], "CANCELLED");
    crate::harness::wait_for_within("the orphan to be reaped", std::time::Duration::from_secs(5), || {
        (!std::path::Path::new(&format!("/proc/{orphan}")).exists()).then_some(())
    });
}

//! Reservations and start estimates end to end (issue 56): a maintenance window backfills only
//! jobs that end before it, then requeues the runs on its node and shows it MAINT; a GPU-count
//! reservation is bound to free GPUs and used only by its access list (`--reservation`,
//! `#SBATCH --reservation`); `kairos queue --start` estimates starts the scheduler then makes;
//! a leader failover during a window changes no reservation.

use std::time::{Duration, UNIX_EPOCH};

use serde_json::Value;

use crate::harness::{wait_for, Cluster, Options};

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).to_string()
}

/// An RFC 3339 time of the CLI's JSON in Unix ms.
fn ms(v: &Value) -> i64 {
    let text = v.as_str().unwrap_or_else(|| panic!("{v} is not a time"));
    let t = humantime::parse_rfc3339(text).unwrap_or_else(|e| panic!("{text}: {e}"));
    t.duration_since(UNIX_EPOCH).unwrap().as_millis() as i64
}

/// `kairos reservation list --json`.
fn reservations(c: &Cluster) -> Vec<Value> {
    let v: Value = serde_json::from_str(&c.ok(&["reservation", "list", "--json"])).expect("list JSON");
    v.as_array().cloned().unwrap_or_default()
}

/// Reservation `name` once its window is open (its opening carried out).
fn wait_open(c: &Cluster, name: &str) -> Value {
    wait_for(&format!("reservation {name}'s window to open"), || {
        reservations(c).into_iter().find(|r| r["name"] == name && r["open"] == true)
    })
}

fn node(c: &Cluster, name: &str) -> Value {
    let nodes: Value = serde_json::from_str(&c.ok(&["nodes", "--json"])).expect("nodes JSON");
    nodes.as_array().unwrap().iter().find(|n| n["name"] == name).cloned().expect("the node is listed")
}

fn gpu_ids(job: &Value) -> Vec<u64> {
    job["gpu_ids"].as_array().unwrap().iter().map(|g| g.as_u64().unwrap()).collect()
}

/// The bound GPUs of a reservation's JSON on `node`.
fn bound_on(r: &Value, node: &str) -> Vec<u64> {
    r["bound"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["node"] == node)
        .flat_map(|b| b["gpus"].as_array().unwrap().iter().map(|g| g.as_u64().unwrap()))
        .collect()
}

/// A failed command: its exit status is not 0 and it says why in one line, containing `says`.
fn refused(out: &std::process::Output, says: &str) {
    let err = stderr(out);
    assert!(!out.status.success(), "accepted; stdout: {}", String::from_utf8_lossy(&out.stdout));
    assert!(
        err.contains(says) && err.trim_end().lines().count() == 1,
        "wanted one line with {says:?}: {err}"
    );
}

#[test]
fn a_maintenance_window_takes_only_jobs_that_end_before_it_then_requeues_its_node_s_runs() {
    let mut c = Cluster::start_opts(1, 0, Options { no_agent: true, ..Options::default() });
    c.add_agent("n1", 2);
    // A long, requeue-able run on n1 before the reservation exists.
    let long = c.submit(&["--requeue", "--", "sleep", "1000"]);
    assert_eq!(c.wait_state(long, "RUNNING")["node"], "n1");
    let out = c.ok(&[
        "reservation",
        "create",
        "maint",
        "--nodes",
        "n1",
        "--start",
        "+20s",
        "--duration",
        "20s",
        "--maint",
    ]);
    assert!(out.starts_with("reservation \"maint\" created: n1 from "), "{out}");
    let r = reservations(&c).pop().expect("the reservation is listed");
    assert_eq!(
        (r["nodes"][0].as_str(), r["maint"].as_bool(), r["open"].as_bool()),
        (Some("n1"), Some(true), Some(false))
    );
    let (window_start, window_end) =
        (r["next_start_ms"].as_i64().unwrap(), r["next_end_ms"].as_i64().unwrap());
    assert_eq!(window_end - window_start, 20_000, "{r}");
    // n1 has a free GPU, but a job whose time limit runs into the window does not start there;
    // one whose limit ends before the window opens does (after it: backfill into the gap).
    let sixty = c.submit(&["--time", "60s", "--", "sleep", "1000"]);
    let ten = c.submit(&["--time", "10s", "--", "sleep", "1000"]);
    assert_eq!(c.wait_state(ten, "RUNNING")["node"], "n1");
    let waiting = c.job(sixty);
    assert_eq!(waiting["state"], "PENDING", "{waiting}");
    // It is expected to start when the window ends, and is told why.
    assert_eq!(waiting["start_reason"], "after reservation maint's window ends on n1", "{waiting}");
    let expected = waiting["expected_start_ms"].as_i64().expect("an estimate");
    assert!((expected - window_end).abs() <= 1_000, "expected {expected}, window ends {window_end}");
    let shown = c.ok(&["show", &sixty.to_string()]);
    assert!(
        shown.contains("Expected start: ") && shown.contains("(after reservation maint's window ends on n1)"),
        "{shown}"
    );
    // Another node joins: the 60 s job starts there.
    c.add_agent("n2", 2);
    assert_eq!(c.wait_state(sixty, "RUNNING")["node"], "n2");
    // The 10 s job ended at its time limit, before the window opened.
    let ended = c.wait_done(ten);
    assert_eq!(ended["state"], "TIMEOUT", "{ended}");
    assert!(ms(&ended["end_time"]) < window_start, "{ended}");
    // The window opens: n1 shows MAINT; the long run is checkpointed, stopped, requeued, and
    // runs again on n2.
    let n1 = wait_for("n1 to show MAINT", || Some(node(&c, "n1")).filter(|n| n["state"] == "MAINT"));
    assert_eq!(n1["maint"], "maint", "{n1}");
    assert!(node(&c, "n2")["maint"].is_null());
    let table = c.ok(&["nodes"]);
    let line = table.lines().find(|l| l.starts_with("n1 ")).expect("n1's row");
    assert!(line.contains("MAINT") && line.contains("maintenance reservation maint"), "{table}");
    let again = wait_for("the long run to run again", || {
        c.try_job(long).filter(|j| j["attempt"] == 1 && j["state"] == "RUNNING")
    });
    assert_eq!(again["node"], "n2", "{again}");
    let events: Vec<&str> =
        again["events"].as_array().unwrap().iter().filter_map(|e| e["message"].as_str()).collect();
    assert!(events.iter().any(|m| m.contains("reservation \"maint\" opens")), "{events:?}");
    assert!(ms(&again["start_time"]) >= window_start, "{again}");
    assert_eq!(wait_open(&c, "maint")["open"], true);
    // During the window nothing else starts on n1: n2 is full, so the next job waits until the
    // window ends, then starts on n1.
    let after = c.submit(&["--time", "30s", "--", "sleep", "1000"]);
    std::thread::sleep(Duration::from_millis(1_000));
    assert_eq!(c.job(after)["state"], "PENDING");
    let started = c.wait_state(after, "RUNNING");
    assert_eq!(started["node"], "n1", "{started}");
    assert!(ms(&started["start_time"]) >= window_end, "{started}");
    // A one-off reservation ends with its window: n1 is up again and the list is empty.
    wait_for("the reservation to end", || reservations(&c).is_empty().then_some(()));
    let n1 = node(&c, "n1");
    assert_eq!((n1["state"].as_str(), n1["maint"].is_null()), (Some("UP"), true), "{n1}");
}

#[test]
fn a_gpu_count_reservation_binds_free_gpus_for_its_access_list_only() {
    let c = Cluster::start(4);
    c.ok(&["account", "create", "a", "--parent", "root", "--users", "alice"]);
    c.ok(&["account", "create", "b", "--parent", "root", "--users", "bob"]);
    let as_ok = |user: &str, args: &[&str]| -> String {
        let out = c.cli_as(user).args(args).output().unwrap();
        assert!(out.status.success(), "{user} {args:?}: {}", stderr(&out));
        String::from_utf8(out.stdout).unwrap()
    };
    let id = |s: String| -> u64 { s.trim().parse().unwrap_or_else(|_| panic!("{s:?} is not a job id")) };
    // Bob runs before the reservation: binding stops the fewest runs, so not this one.
    let bob_run = id(as_ok("bob", &["submit", "--account", "b", "--", "sleep", "1000"]));
    c.wait_state(bob_run, "RUNNING");
    // Refusals, each one line, changing nothing.
    let create = |user: Option<&str>, args: &[&str]| {
        let mut cmd = match user {
            Some(u) => c.cli_as(u),
            None => c.cli(),
        };
        cmd.args(["reservation", "create"]).args(args).output().unwrap()
    };
    refused(
        &create(Some("alice"), &["x", "--gpus", "1", "--start", "now", "--duration", "1m"]),
        "PermissionDenied",
    );
    refused(
        &create(None, &["x", "--gpus", "9", "--start", "now", "--duration", "1m"]),
        "9 GPUs asked, the nodes it may bind have 4",
    );
    refused(
        &create(None, &["x", "--nodes", "nope", "--start", "+1h", "--duration", "1m"]),
        "node \"nope\" not found",
    );
    refused(&create(None, &["x", "--start", "+1h", "--duration", "1m"]), "give --nodes LIST or --gpus N");
    refused(&create(None, &["x", "--gpus", "1", "--start", "+1h"]), "--duration D or --end TIME");
    refused(
        &create(None, &["x", "--gpus", "1", "--start", "soon", "--duration", "1m"]),
        "cannot parse \"soon\" as a time",
    );
    refused(
        &create(None, &["x", "--gpus", "1", "--start", "+1h", "--end", "+30m"]),
        "the window must end after it starts",
    );
    assert!(reservations(&c).is_empty());
    // Two GPUs for account a, from now.
    c.ok(&[
        "reservation",
        "create",
        "train",
        "--gpus",
        "2",
        "--accounts",
        "a",
        "--start",
        "now",
        "--duration",
        "5m",
    ]);
    let r = wait_open(&c, "train");
    let bound = bound_on(&r, "node-a");
    assert_eq!(bound.len(), 2, "{r}");
    let bob_gpus = gpu_ids(&c.job(bob_run));
    assert!(bound.iter().all(|g| !bob_gpus.contains(g)), "bound {bound:?} over Bob's run {bob_gpus:?}");
    let bob_job = c.job(bob_run);
    assert_eq!((bob_job["state"].as_str(), bob_job["attempt"].as_u64()), (Some("RUNNING"), Some(0)));
    let shown = c.ok(&["reservation", "show", "train"]);
    assert!(shown.contains(&format!("bound: node-a[{},{}]", bound[0], bound[1])), "{shown}");
    assert!(shown.contains("created_by: ") && shown.contains("access: accounts a"), "{shown}");
    let listed = c.ok(&["reservation", "list"]);
    assert!(
        listed.starts_with("NAME") && listed.contains("2 GPUs on node-a[") && listed.contains("OPEN"),
        "{listed}"
    );
    // Bob's jobs do not use the reserved GPUs: one takes the last free GPU, the other waits.
    let b1 = id(as_ok("bob", &["submit", "--account", "b", "--", "sleep", "1000"]));
    let b1_gpus = gpu_ids(&c.wait_state(b1, "RUNNING"));
    assert!(b1_gpus.iter().all(|g| !bound.contains(g)), "{b1_gpus:?} is reserved");
    let b2 = id(as_ok("bob", &["submit", "--account", "b", "--", "sleep", "1000"]));
    std::thread::sleep(Duration::from_millis(1_500));
    assert_eq!(c.job(b2)["state"], "PENDING", "Bob's job took a reserved GPU");
    // Alice's jobs naming it start on them at once: by `submit --reservation` and by
    // `#SBATCH --reservation=`.
    let asked = std::time::Instant::now();
    let a1 = id(as_ok(
        "alice",
        &["submit", "--account", "a", "--reservation", "train", "--time", "2m", "--", "sleep", "1000"],
    ));
    let a1_job = c.wait_state(a1, "RUNNING");
    assert!(asked.elapsed() < Duration::from_secs(10), "it took {:?} to start", asked.elapsed());
    assert_eq!(a1_job["reservation"], "train");
    let script = c.path("in-reservation.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\n#SBATCH --reservation=train\n#SBATCH --gres=gpu:1 --account=a --time=2:00\nsleep 1000\n",
    )
    .unwrap();
    let a2 = id(as_ok("alice", &["batch", script.to_str().unwrap()]));
    let a2_job = c.wait_state(a2, "RUNNING");
    assert_eq!(a2_job["reservation"], "train");
    let mut in_window: Vec<u64> = gpu_ids(&a1_job).into_iter().chain(gpu_ids(&a2_job)).collect();
    in_window.sort_unstable();
    assert_eq!(in_window, bound, "Alice's jobs run on the reserved GPUs");
    assert_eq!(c.job(b2)["state"], "PENDING");
    // A user not on the list naming it is refused, in one line, and nothing is submitted.
    let before = c.jobs().len();
    let out = c
        .cli_as("bob")
        .args(["submit", "--account", "b", "--reservation", "train", "--", "true"])
        .output()
        .unwrap();
    refused(&out, "PermissionDenied");
    assert!(stderr(&out).contains("not on reservation \"train\"'s access list"), "{}", stderr(&out));
    assert_eq!(c.jobs().len(), before, "nothing was submitted");
    // Put on the list by an update (the rest kept, the bound GPUs too), Bob may name it; his
    // job waits for the reservation's GPUs.
    c.ok(&["reservation", "update", "train", "--users", "bob"]);
    let r = reservations(&c).pop().unwrap();
    assert_eq!(
        (r["users"][0].as_str(), r["accounts"][0].as_str(), r["open"].as_bool()),
        (Some("bob"), Some("a"), Some(true)),
        "{r}"
    );
    assert_eq!(bound_on(&r, "node-a"), bound, "{r}");
    let b3 = id(as_ok(
        "bob",
        &["submit", "--account", "b", "--reservation", "train", "--time", "2m", "--", "sleep", "1000"],
    ));
    let waits = wait_for("Bob's job's reason", || {
        c.try_job(b3).filter(|j| j["reason"].as_str().is_some_and(|r| !r.is_empty()))
    });
    assert_eq!(waits["state"], "PENDING", "{waits}");
    assert!(waits["reason"].as_str().unwrap().contains("train"), "{waits}");
    c.ok(&["reservation", "delete", "train"]);
    assert!(reservations(&c).is_empty());
    refused(&c.kairos(&["reservation", "show", "train"]), "reservation \"train\" not found");
}

#[test]
fn queue_start_estimates_the_starts_the_scheduler_then_makes() {
    let c = Cluster::start(3);
    // Three runs that end at their time limits, 6, 9 and 12 s after they start.
    let running: Vec<u64> =
        ["6s", "9s", "12s"].iter().map(|t| c.submit(&["--time", t, "--", "sleep", "1000"])).collect();
    for r in &running {
        c.wait_state(*r, "RUNNING");
    }
    let queued: Vec<u64> = (0..3).map(|_| c.submit(&["--time", "30s", "--", "sleep", "1000"])).collect();
    // The estimates, read once.
    let estimates: Vec<(i64, String)> = wait_for("the estimates", || {
        let v: Value = serde_json::from_str(&c.ok(&["queue", "--start", "--json"])).ok()?;
        let jobs = v.as_array()?;
        assert!(jobs.iter().all(|j| j["state"] == "PENDING"), "--start lists pending jobs only: {v}");
        queued
            .iter()
            .map(|id| {
                let j = jobs.iter().find(|j| j["id"] == *id)?;
                Some((j["expected_start_ms"].as_i64()?, j["start_reason"].as_str()?.to_string()))
            })
            .collect::<Option<Vec<_>>>()
    });
    for (i, (_, why)) in estimates.iter().enumerate() {
        assert_eq!(why, &format!("after job {} ends (time limit) on node-a", running[i]), "{estimates:?}");
    }
    assert!(estimates.windows(2).all(|w| w[0].0 < w[1].0), "{estimates:?}");
    let table = c.ok(&["queue", "--start"]);
    assert!(
        table.starts_with("ID") && table.contains("START_TIME") && table.contains("START_REASON"),
        "{table}"
    );
    for (id, (_, why)) in queued.iter().zip(&estimates) {
        let row =
            table.lines().find(|l| l.starts_with(&format!("{id} "))).unwrap_or_else(|| panic!("{table}"));
        assert!(row.contains(why.as_str()), "{table}");
    }
    assert!(
        !table.lines().any(|l| l.starts_with(&format!("{} ", running[0]))),
        "a running job is listed: {table}"
    );
    let shown = c.ok(&["show", &queued[0].to_string()]);
    assert!(
        shown.contains("Expected start: ") && shown.contains(&format!("({})", estimates[0].1)),
        "{shown}"
    );
    // Nothing else changes: each starts within 2 s of its estimate.
    for (id, (expected, _)) in queued.iter().zip(&estimates) {
        let job = c.wait_state(*id, "RUNNING");
        let started = ms(&job["start_time"]);
        assert!(
            (started - expected).abs() <= 2_000,
            "job {id}: expected at {expected}, started at {started}"
        );
        assert!(
            job["expected_start_ms"].is_null() && job["start_reason"].is_null(),
            "a running job has none: {job}"
        );
    }
}

#[test]
fn a_leader_failover_during_a_window_changes_no_reservation() {
    let mut c = Cluster::start_with(3, 4, &[]);
    c.add_agent("n2", 2);
    c.ok(&["reservation", "create", "m", "--nodes", "n2", "--maint", "--start", "now", "--duration", "5m"]);
    c.ok(&["reservation", "create", "g", "--gpus", "2", "--start", "now", "--duration", "5m"]);
    let g = wait_open(&c, "g");
    wait_open(&c, "m");
    assert_eq!(bound_on(&g, "node-a").len(), 2, "{g}");
    // A job in the reservation and one beside it, on node-a.
    let inside = c.submit(&["--reservation", "g", "--gpus", "2", "--time", "2m", "--", "sleep", "1000"]);
    let beside = c.submit(&["--gpus", "1", "--", "sleep", "1000"]);
    for id in [inside, beside] {
        c.wait_state(id, "RUNNING");
    }
    let mut inside_gpus = gpu_ids(&c.job(inside));
    inside_gpus.sort_unstable();
    assert_eq!(inside_gpus, bound_on(&g, "node-a"));
    assert_eq!(node(&c, "n2")["state"], "MAINT");
    c.wait_converged();
    let before = reservations(&c);
    let leader = c.leader();
    c.kill_controller(leader);
    let new_leader = c.leader();
    assert_ne!(new_leader, leader);
    let at_new = |args: &[&str]| -> Value {
        wait_for(&format!("{args:?} at the new leader"), || {
            let out = c.kairos_at(&c.controller_addr(new_leader), args);
            out.status.success().then(|| serde_json::from_slice(&out.stdout).unwrap())
        })
    };
    // Give the new leader a few ticks to (wrongly) tick the windows again.
    std::thread::sleep(Duration::from_millis(1_500));
    let after = at_new(&["reservation", "list", "--json"]);
    assert_eq!(after, Value::Array(before.clone()), "the reservations changed across the failover");
    assert!(before.len() == 2 && before.iter().all(|r| r["open"] == true), "{before:?}");
    let nodes = at_new(&["nodes", "--json"]);
    let n2 = nodes.as_array().unwrap().iter().find(|n| n["name"] == "n2").unwrap();
    assert_eq!((n2["state"].as_str(), n2["maint"].as_str()), (Some("MAINT"), Some("m")), "{n2}");
    for id in [inside, beside] {
        let job = at_new(&["show", &id.to_string(), "--json"]);
        assert_eq!((job["state"].as_str(), job["attempt"].as_u64()), (Some("RUNNING"), Some(0)), "{job}");
    }
}

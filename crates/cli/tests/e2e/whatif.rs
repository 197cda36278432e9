//! Policy what-if on the cluster's own history (issue 53): a scripted stretch of real work
//! (training, inference preempting, an array under a group limit, a gang, a dependency, a held
//! job, a cancel, a node drained and resumed) runs on two agents with fake GPUs; its history is
//! exported as a trace, replayed under the policy that ran (reproducing every start within 2 s
//! and the preemption), and under proposals, before `policy apply` asks and records the hash.

use std::io::Write;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::{wait_for, Cluster};

/// Sleeps until `at` after `t0`.
fn at(t0: Instant, s: f64) {
    let until = t0 + Duration::from_secs_f64(s);
    if let Some(d) = until.checked_duration_since(Instant::now()) {
        std::thread::sleep(d);
    }
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("JSON ({e}): {text}"))
}

/// The policy file of the cluster with `edit` applied to its text.
fn proposal(c: &Cluster, name: &str, edit: impl Fn(&str) -> String) -> String {
    let exported = c.ok(&["policy", "export"]);
    let changed = edit(&exported);
    assert_ne!(changed, exported, "the proposal {name} changes something");
    let path = c.path(name);
    std::fs::write(&path, changed).unwrap();
    path.display().to_string()
}

/// `[qos.NAME]`'s line starting with `key` replaced by `line` (added when missing).
fn set_qos(text: &str, qos: &str, key: &str, line: &str) -> String {
    let mut out = Vec::new();
    let mut inside = false;
    let mut done = false;
    for l in text.lines() {
        if l.starts_with('[') {
            if inside && !done {
                out.push(line.to_string());
                done = true;
            }
            inside = l.trim() == format!("[qos.{qos}]");
        }
        if inside && l.trim_start().starts_with(&format!("{key} ")) {
            out.push(line.to_string());
            done = true;
            continue;
        }
        out.push(l.to_string());
    }
    if inside && !done {
        out.push(line.to_string());
    }
    out.join("\n") + "\n"
}

#[test]
fn the_history_replays_as_it_happened_and_what_ifs_show_their_changes_before_apply() {
    let mut c = Cluster::start(4);
    c.add_agent("node-b", 4);
    // The policy that runs: batch work one GPU at a time.
    let limited = proposal(&c, "limited.toml", |t| set_qos(t, "batch", "grp_gpus", "grp_gpus = 1"));
    c.ok(&["policy", "apply", "--yes", "--no-what-if", &limited]);

    let t0 = Instant::now();
    let gang = c.submit(&["-N", "2", "--gpus", "1", "--qos", "training", "--time", "1m", "--", "sleep", "8"]);
    let premium = c.submit(&["--gpus", "2", "--qos", "premium", "--time", "2m", "--", "sleep", "30"]);
    at(t0, 3.0);
    let train = c.submit(&["--gpus", "4", "--qos", "training", "--time", "2m", "--", "sleep", "20"]);
    let array = c.ok(&[
        "submit", "--array", "0-1", "--gpus", "1", "--qos", "batch", "--time", "1m", "--", "sleep", "10",
    ]);
    let after = c.submit(&[
        "--after-ok",
        &gang.to_string(),
        "--gpus",
        "1",
        "--qos",
        "batch",
        "--time",
        "1m",
        "--",
        "sleep",
        "2",
    ]);
    let held = c.submit(&["--hold", "--gpus", "1", "--qos", "training", "--time", "1m", "--", "sleep", "2"]);
    let doomed = c.submit(&["--gpus", "4", "--qos", "training", "--time", "1m", "--", "sleep", "5"]);
    at(t0, 10.0);
    c.ok(&["cancel", &doomed.to_string()]);
    at(t0, 14.0);
    let inference = c.submit(&["--gpus", "2", "--qos", "inference", "--time", "1m", "--", "sleep", "6"]);
    let inf = c.wait_done(inference);
    assert_eq!(inf["state"], "COMPLETED", "{inf}");
    at(t0, 22.0);
    let premium_node = c.job(premium)["node"].as_str().unwrap_or_default().to_string();
    c.ok(&["drain", &premium_node, "--reason", "maintenance"]);
    at(t0, 24.0);
    c.ok(&["release", &held.to_string()]);
    at(t0, 26.0);
    c.ok(&["node", "resume", &premium_node]);
    for id in [gang, premium, train, after, held] {
        let j = c.wait_done(id);
        assert_eq!(j["state"], "COMPLETED", "{j}");
    }
    let _ = array;
    let preemptions = json(&c.ok(&["preemptions", "--json"]));
    assert_eq!(preemptions.as_array().map(Vec::len), Some(1), "one preemption happened: {preemptions}");

    // The window as a trace (both nodes joined inside it: with the drain and the resume, four
    // node changes), replayed under the policy it was exported with.
    let trace = c.path("week.jsonl");
    let out = c.ok(&["history", "--since", "10m", "--export-trace", trace.to_str().unwrap()]);
    assert!(out.contains("exported 9 jobs, 0 nodes and 4 node changes"), "{out}");
    let replays = json(&c.ok(&["sim", "--history", trace.to_str().unwrap(), "--json"]));
    let f = &replays[0]["fidelity"];
    assert_eq!(f["reproduced"], f["compared"], "every start within 2 s: {f}");
    assert_eq!(
        (f["recorded_preemptions"].as_u64(), f["replayed_preemptions"].as_u64()),
        (Some(1), Some(1)),
        "{f}"
    );
    assert_eq!(f["poor"], false);
    let text = c.ok(&["sim", "--history", trace.to_str().unwrap()]);
    assert!(text.contains("fidelity: 9/9 starts within 2 s"), "{text}");

    // No preemption for inference: it waits longer, nothing is preempted.
    let gentle = proposal(&c, "gentle.toml", |t| set_qos(t, "inference", "preempt", "preempt = []"));
    let w = json(&c.ok(&["policy", "what-if", &gentle, "--since", "10m", "--json"]));
    assert_eq!(
        (w["current"]["preemptions"].as_u64(), w["proposed"]["preemptions"].as_u64()),
        (Some(1), Some(0)),
        "{w}"
    );
    let p99 = |side: &str| w[side]["by_qos"]["inference"]["wait_s"]["p99"].as_f64().unwrap();
    assert!(p99("proposed") > p99("current") + 2.0, "{w}");
    let said = |w: &Value, start: &str| {
        w["changes"].as_array().unwrap().iter().any(|s| s.as_str().unwrap().starts_with(start))
    };
    assert!(said(&w, "qos inference: wait p99"), "{}", w["changes"]);
    assert!(w["changes"].to_string().contains("1 fewer preemption of its jobs (1 → 0)"), "{}", w["changes"]);
    // A larger group limit for batch: the array's second task no longer waits for the first.
    let roomy = proposal(&c, "roomy.toml", |t| set_qos(t, "batch", "grp_gpus", "grp_gpus = 4"));
    let w = json(&c.ok(&["policy", "what-if", &roomy, "--since", "10m", "--json"]));
    let batch = |side: &str| w[side]["by_qos"]["batch"]["wait_s"]["p99"].as_f64().unwrap();
    assert!(batch("current") >= 8.0 && batch("proposed") < batch("current") - 5.0, "{w}");
    assert!(said(&w, "qos batch: wait p99"), "{}", w["changes"]);
    let offline =
        json(&c.ok(&["sim", "--history", trace.to_str().unwrap(), "--compare", &limited, &roomy, "--json"]));
    assert_eq!(
        offline[1]["report"]["by_qos"]["batch"], w["proposed"]["by_qos"]["batch"],
        "one replay, two doors"
    );

    // Apply asks first: without an answer nothing changes.
    let out = c.kairos(&["policy", "apply", "--since", "10m", &roomy]);
    let printed = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(out.status.code(), Some(1), "{printed}");
    assert!(printed.contains("qos batch: wait p99") && printed.contains("policy not applied"), "{printed}");
    assert!(c.ok(&["policy", "export"]).contains("grp_gpus = 1"), "unchanged");
    // Confirmed: applied, and the audit event keeps the comparison's hash and the token.
    let mut child = c
        .cli()
        .args(["policy", "apply", "--since", "10m", &roomy])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"yes\n").unwrap();
    let out = child.wait_with_output().unwrap();
    let printed = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success() && printed.contains("policy applied"), "{printed}");
    let hash = printed
        .lines()
        .find_map(|l| l.strip_prefix("summary sha256: "))
        .expect("the hash printed")
        .to_string();
    let events = json(&c.ok(&["events", "--json"]));
    let last =
        events.as_array().unwrap().iter().rev().find(|e| e["kind"] == "policy applied").unwrap().clone();
    assert_eq!(
        (last["what_if_hash"].as_str(), last["token_id"].as_str()),
        (Some(hash.as_str()), Some("bootstrap")),
        "{last}"
    );
    assert!(events
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["kind"] == "node draining" && e["node"] == premium_node.as_str()));
    wait_for("the new limit", || c.ok(&["policy", "export"]).contains("grp_gpus = 4").then_some(()));
}

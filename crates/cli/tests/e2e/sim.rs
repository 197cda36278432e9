//! `kairos sim`: the replay of a trace excerpt is deterministic (same seed, same bytes), its JSON
//! has the documented keys, and a policy change shows in its figures.

use serde_json::Value;

fn testdata(file: &str) -> String {
    format!("{}/../sim/testdata/{file}", env!("CARGO_MANIFEST_DIR"))
}

fn policy(file: &str) -> String {
    format!("{}/../../deploy/sim/{file}", env!("CARGO_MANIFEST_DIR"))
}

/// `kairos sim` of the 400-task excerpt on the excerpt's first 20 nodes (40 GPUs: full at times).
fn sim(args: &[&str]) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let nodes = dir.path().join("nodes.csv");
    let all = std::fs::read_to_string(testdata("alibaba_nodes_40.csv")).unwrap();
    std::fs::write(&nodes, all.lines().take(21).map(|l| format!("{l}\n")).collect::<String>()).unwrap();
    std::process::Command::new(env!("CARGO_BIN_EXE_kairos"))
        .arg("sim")
        .args(["--pods", &testdata("alibaba_pods_400.csv"), "--nodes", nodes.to_str().unwrap()])
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn the_replay_is_deterministic_and_a_policy_change_shows_in_its_figures() {
    let first = sim(&["--json", "--seed", "3", "--load", "5"]);
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    let again = sim(&["--json", "--seed", "3", "--load", "5"]);
    assert_eq!(first.stdout, again.stdout, "the same seed gave other output");
    let report: Value = serde_json::from_slice(&first.stdout).unwrap();
    for key in [
        "jobs",
        "inference",
        "training",
        "utilization",
        "preemptions",
        "redone_gpu_hours",
        "fragmentation",
        "makespan_s",
    ] {
        assert!(report.get(key).is_some(), "no {key}: {report}");
    }
    for class in ["inference", "training"] {
        for key in ["p50", "p90", "p99", "max"] {
            assert!(report[class]["wait_s"][key].is_number(), "{class}.wait_s.{key}: {report}");
        }
        assert!(report[class]["completion_s"].is_number() && report[class]["slowdown"].is_number());
    }
    assert_eq!(report["jobs"], 353, "the excerpt's GPU tasks the trace scheduled");
    assert_eq!(
        (report["gpus"].as_u64(), report["unfinished"].as_u64()),
        (Some(40), Some(4)),
        "8-GPU tasks fit no 2-GPU node: {report}"
    );
    let utilization = report["utilization"].as_f64().unwrap();
    assert!(utilization > 0.0 && utilization <= 1.0, "{report}");
    // Side by side: inference that may preempt training against inference that waits.
    let compare = |json: bool| {
        let (replay, waiting) = (policy("replay.toml"), policy("no-preemption.toml"));
        let mut args = vec!["--seed", "3", "--load", "5", "--compare", replay.as_str(), waiting.as_str()];
        args.extend(json.then_some("--json"));
        sim(&args)
    };
    let out = compare(true);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let both: Value = serde_json::from_slice(&out.stdout).unwrap();
    let (preempting, waiting) = (&both[policy("replay.toml")], &both[policy("no-preemption.toml")]);
    assert!(preempting["preemptions"].as_u64().unwrap() > 0, "{both}");
    assert_eq!(waiting["preemptions"], 0, "{both}");
    assert!(
        preempting["inference"]["wait_s"]["p99"].as_f64() < waiting["inference"]["wait_s"]["p99"].as_f64(),
        "preemption did not shorten inference waits: {both}"
    );
    // The plot: an SVG with both panels.
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("replay.svg");
    let out = sim(&["--seed", "3", "--load", "5", "--plot", svg.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let picture = std::fs::read_to_string(&svg).unwrap();
    assert!(
        picture.starts_with("<svg") && picture.contains("Wait CDF") && picture.contains("GPUs allocated")
    );
    assert_eq!(picture.matches("<polyline").count(), 3);
    // The table names both.
    let table = compare(false);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.contains("replay.toml") && text.contains("inference wait p50 / p99 / max"), "{text}");
}

#[test]
fn bad_sim_input_is_a_one_line_error() {
    for (args, says) in [
        (&["--load", "0"][..], "--load: 0 is not a positive factor"),
        (&["--inflate", "-1"][..], "--inflate: -1 is not a factor"),
        (&["--policy", "/nonexistent.toml"][..], "reading /nonexistent.toml"),
    ] {
        let out = sim(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(says) && err.trim().lines().count() == 1, "{err}");
    }
}

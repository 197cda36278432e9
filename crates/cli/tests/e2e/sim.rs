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

/// `kairos sim` of the excerpt on a cluster of its own (`--cluster`), arrivals compressed to an
/// offered load.
fn sim_on(cluster: &str, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_kairos"))
        .args(["sim", "--pods", &testdata("alibaba_pods_400.csv"), "--cluster", cluster])
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn at_an_offered_load_of_1_3_inference_headroom_trades_training_wait_for_inference_wait() {
    // 4 × 8 GPUs; the excerpt's pods that existed at the trace's start arrive with the rest
    // (--from), compressed until the work asked inside the arrival window is 1.3 × the GPUs'.
    let (replay, headroom, waiting) =
        (policy("replay.toml"), policy("headroom.toml"), policy("no-preemption.toml"));
    let out = sim_on(
        "4x8",
        &["--from", "9900000", "--offered-load", "1.3", "--json", "--compare", &replay, &headroom, &waiting],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let all: Value = serde_json::from_slice(&out.stdout).unwrap();
    let (r, h, w) = (&all[&replay], &all[&headroom], &all[&waiting]);
    for x in [r, h, w] {
        assert_eq!((x["gpus"].as_u64(), x["unfinished"].as_u64()), (Some(32), Some(0)), "{all}");
        let offered = x["offered_load"].as_f64().unwrap();
        assert!((offered - 1.3).abs() < 0.002, "offered load {offered}: {all}");
        assert!(x["load"].as_f64().unwrap() > 1.0 && x["arrival_window_s"].as_f64().unwrap() > 0.0);
    }
    let p = |x: &Value, class: &str, q: &str| x[class]["wait_s"][q].as_f64().unwrap();
    // Preempting training starts inference after its victims stop (the modelled 5 s); waiting
    // for training to end takes far longer.
    assert!(p(r, "inference", "p99") <= 10.0 && p(w, "inference", "p50") > 1000.0, "{all}");
    // Idle GPUs kept for inference (refilled by stopping training) start it at once, and cost
    // training wait and utilisation.
    assert!(p(h, "inference", "p50") < p(r, "inference", "p50"), "{all}");
    assert!(p(h, "inference", "p99") < p(r, "inference", "p99"), "{all}");
    assert!(p(h, "training", "p50") > p(r, "training", "p50"), "{all}");
    assert!(h["utilization"].as_f64() < r["utilization"].as_f64(), "{all}");
}

#[test]
fn bad_sim_input_is_a_one_line_error() {
    for (cluster, says) in [("4by8", "--cluster: \"4by8\" is not NODESxGPUS"), ("0x8", "is not NODESxGPUS")] {
        let out = sim_on(cluster, &[]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(says) && err.trim().lines().count() == 1, "{err}");
    }
    let out = sim_on("4x8", &["--offered-load", "50"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--offered-load: 50 is more than these jobs can offer"), "{err}");
    for (args, says) in [
        (&["--offered-load", "0"][..], "--offered-load: 0 is not in (0, 100]"),
        (&["--load", "0"][..], "--load: 0 is not a positive factor"),
        (&["--inflate", "-1"][..], "--inflate: -1 is not a factor"),
        (&["--policy", "/nonexistent.toml"][..], "reading /nonexistent.toml"),
    ] {
        let out = sim(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(says) && err.trim().lines().count() == 1, "{err}");
    }
}

#[test]
fn burst_in_the_replay_runs_waiting_inference_in_the_cloud_and_says_what_it_cost() {
    // Inference that may not preempt waits days on 32 saturated GPUs; burst runs it in the cloud.
    let (burst, waiting) = (policy("burst.toml"), policy("no-preemption.toml"));
    let args =
        ["--from", "9900000", "--offered-load", "1.3", "--policy", &waiting, "--json", "--burst", &burst];
    let out = sim_on("4x8", &args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(sim_on("4x8", &args).stdout, out.stdout, "the same seed gave other output");
    let both: Value = serde_json::from_slice(&out.stdout).unwrap();
    let (without, with) = (&both["no burst"], &both[&burst]);
    assert!(without.get("burst").is_none(), "{without}");
    let b = &with["burst"];
    for key in [
        "instances_launched",
        "launch_failures",
        "spot_interruptions",
        "instance_hours",
        "idle_instance_hours",
        "boot_instance_hours",
        "spend_usd",
        "spend_per_day_usd",
        "cloud_jobs",
        "cloud_gpu_hours",
    ] {
        assert!(b[key].is_number(), "no burst.{key}: {with}");
    }
    assert!(b["instances_launched"].as_u64() > Some(0) && b["cloud_jobs"].as_u64() > Some(0), "{b}");
    // The limits of deploy/sim/burst.toml: 40 $/h at most, so never more than that per hour.
    let (spend, hours) = (b["spend_usd"].as_f64().unwrap(), b["instance_hours"].as_f64().unwrap());
    assert!(spend > 0.0 && spend <= 5.672 * hours + 0.01, "{b}");
    let p99 = |x: &Value| x["inference"]["wait_s"]["p99"].as_f64().unwrap();
    assert!(p99(with) * 10.0 < p99(without), "burst did not shorten inference waits: {both}");
    // The picture: spend against inference p99, a point per configuration.
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("burst.svg");
    let plot = ["--from", "9900000", "--offered-load", "1.3", "--policy", &waiting, "--burst", &burst];
    let out = sim_on("4x8", &[&plot[..], &["--plot", svg.to_str().unwrap()]].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let picture = std::fs::read_to_string(&svg).unwrap();
    assert!(picture.contains("Cloud spend vs inference wait") && picture.matches("<circle").count() == 2);
    // The table says what the cloud did.
    assert!(String::from_utf8_lossy(&out.stdout).contains("cloud: spend $ (per day)"));
}

#[test]
fn a_bad_burst_file_is_a_one_line_error() {
    let dir = tempfile::tempdir().unwrap();
    let shipped = std::fs::read_to_string(policy("burst.toml")).unwrap();
    for (name, text, says) in [
        ("unknown.toml", format!("{shipped}\nboot = \"1m\"\n"), "unknown field `boot`"),
        (
            "capacity.toml",
            format!("{shipped}capacity_errors = {{ \"p5.48xlarge\" = 0.5 }}\n"),
            "sim.capacity_errors: \"p5.48xlarge\" is not one of the instance_types",
        ),
        ("qos.toml", shipped.replace("qos = [\"inference\"]", "qos = [\"nope\"]"), "unknown qos \"nope\""),
        (
            "boot.toml",
            shipped.replace("boot_min = \"3m\"", "boot_min = \"9m\""),
            "sim.boot_min must be at most",
        ),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        let out = sim_on("4x8", &["--burst", path.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(says) && err.trim().lines().count() == 1,
            "{name}: {err}"
        );
    }
}

/// Every job of a report is finished (counted in its class) or named among the unfinished with
/// why, and the per-class counts add up.
fn accounted(report: &Value) -> Vec<Value> {
    let finished =
        report["inference"]["jobs"].as_u64().unwrap() + report["training"]["jobs"].as_u64().unwrap();
    let unfinished = report["unfinished_jobs"].as_array().unwrap().clone();
    assert_eq!(report["jobs"].as_u64().unwrap(), finished + unfinished.len() as u64, "{report}");
    assert_eq!(report["unfinished"].as_u64().unwrap(), unfinished.len() as u64, "{report}");
    let counted: u64 = report["unfinished_by"]
        .as_object()
        .unwrap()
        .values()
        .flat_map(|by| by.as_object().unwrap().values().map(|n| n.as_u64().unwrap()))
        .sum();
    assert_eq!(counted, unfinished.len() as u64, "{report}");
    for j in &unfinished {
        assert!(!j["name"].as_str().unwrap().is_empty() && !j["reason"].as_str().unwrap().is_empty(), "{j}");
        assert!(["inference", "training"].contains(&j["class"].as_str().unwrap()), "{j}");
    }
    unfinished
}

#[test]
fn jobs_asking_for_gpu_models_the_cluster_lacks_are_reported_never_placeable_with_the_model_sets() {
    let dir = tempfile::tempdir().unwrap();
    let pods = dir.path().join("pods.csv");
    std::fs::write(
        &pods,
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n\
         v1,1000,1024,1,1000,V100M16|V100M32,BE,Succeeded,0,100,0\n\
         v2,1000,1024,2,1000,V100M16|V100M32,BE,Succeeded,0,100,0\n\
         h1,1000,1024,1,1000,H100,LS,Succeeded,0,100,0\n\
         t1,1000,1024,1,1000,T4,LS,Succeeded,0,100,0\n\
         any,1000,1024,2,1000,,BE,Succeeded,10,100,10\n\
         cpu,48000,1024,1,1000,,BE,Succeeded,10,100,10\n",
    )
    .unwrap();
    let run = |json: bool| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_kairos"));
        cmd.args(["sim", "--pods", pods.to_str().unwrap(), "--cluster", "2x4:T4:32:256G"]);
        if json {
            cmd.arg("--json");
        }
        cmd.output().unwrap()
    };
    let out = run(true);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let unfinished = accounted(&report);
    let named: Vec<(&str, &str, &str)> = unfinished
        .iter()
        .map(|j| {
            (j["name"].as_str().unwrap(), j["constraint"].as_str().unwrap(), j["reason"].as_str().unwrap())
        })
        .collect();
    assert_eq!(
        named,
        [
            ("h1", "gpu_model", "GPU models H100; the nodes have T4"),
            ("cpu", "cpus", "48 CPUs; the largest node with its GPUs has 32"),
            ("v1", "gpu_model", "GPU models V100M16|V100M32; the nodes have T4"),
            ("v2", "gpu_model", "GPU models V100M16|V100M32; the nodes have T4"),
        ],
        "{report}"
    );
    assert!(unfinished.iter().all(|j| j["never_placeable"] == true), "{report}");
    assert_eq!(
        report["unfinished_by"]["training"]["never placeable: GPU models V100M16|V100M32; the nodes have T4"],
        2,
        "{report}"
    );
    // The table says the same per class.
    let out = run(false);
    let text = String::from_utf8_lossy(&out.stdout);
    let row = |label: &str| text.lines().find(|l| l.starts_with(label)).unwrap_or_default().to_string();
    assert!(
        row("unfinished inference").contains("1 never placeable: GPU models H100; the nodes have T4"),
        "{text}"
    );
    let training = row("unfinished training");
    assert!(
        training.contains("2 never placeable: GPU models V100M16|V100M32; the nodes have T4")
            && training.contains("1 never placeable: 48 CPUs"),
        "{text}"
    );
    assert!(text.contains("jobs  ") && text.contains("6 (4 unfinished)"), "{text}");
}

#[test]
fn with_gpu_fractions_every_job_of_the_excerpt_finishes_or_is_named_under_each_shipped_policy() {
    let files: Vec<String> =
        ["replay.toml", "headroom.toml", "no-preemption.toml"].iter().map(|f| policy(f)).collect();
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("all.svg");
    // The shipped policy (no --policy) and each of deploy/sim's, side by side and drawn.
    let mut runs: Vec<(String, Value)> = Vec::new();
    let out = sim(&["--json", "--seed", "3", "--load", "5", "--gpu-fractions"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    runs.push(("shipped".into(), serde_json::from_slice(&out.stdout).unwrap()));
    let mut args =
        vec!["--json", "--seed", "3", "--load", "5", "--gpu-fractions", "--plot", svg.to_str().unwrap()];
    args.push("--compare");
    args.extend(files.iter().map(String::as_str));
    let out = sim(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let all: Value = serde_json::from_slice(&out.stdout).unwrap();
    runs.extend(files.iter().map(|f| (f.clone(), all[f].clone())));
    for (name, report) in &runs {
        let unfinished = accounted(report);
        // The excerpt's 8-GPU tasks fit none of its 2-GPU nodes; nothing else is left.
        assert_eq!(unfinished.len(), 4, "{name}: {report}");
        for j in &unfinished {
            assert_eq!(
                (j["never_placeable"].as_bool(), j["constraint"].as_str()),
                (Some(true), Some("gpus")),
                "{name}: {j}"
            );
            assert_eq!(j["reason"], "8 GPUs; the largest node has 2 of them", "{name}: {j}");
        }
    }
    // --compare --plot draws every policy: three lines each, under its name.
    let picture = std::fs::read_to_string(&svg).unwrap();
    assert_eq!(picture.matches("<polyline").count(), 3 * files.len(), "{picture}");
    assert!(files.iter().all(|f| picture.contains(f.as_str())));
}

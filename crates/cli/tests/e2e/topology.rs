//! Topology-aware placement on real agents: gangs inside one rack (required waits with reason
//! `Topology`, preferred spreads and says so), the topology file and tree, and a multi-GPU job
//! inside one NVLink island of a node.

use crate::harness::{wait_for, Cluster, Options};

/// Racks of the six one-GPU nodes: a1, b1, c1 in r1; a2, b2, c2 in r2 (name order alternates
/// racks, so the first two single-GPU jobs land one in each).
fn rack(node: &str) -> &'static str {
    if node.ends_with('1') {
        "r1"
    } else {
        "r2"
    }
}

fn nodes_of(job: &serde_json::Value) -> Vec<String> {
    job["tasks"].as_array().unwrap().iter().map(|t| t["node"].as_str().unwrap().to_string()).collect()
}

#[test]
fn a_required_gang_waits_for_one_rack_and_a_preferred_one_spreads_saying_so() {
    let mut c = Cluster::start_opts(1, 1, Options { no_agent: true, ..Options::default() });
    for name in ["a1", "a2", "b1", "b2", "c1", "c2"] {
        c.add_agent_with(name, 1, &["--label", &format!("rack={}", rack(name))]);
    }
    // One node of each rack busy (before the topology names the level, name order spreads them).
    let sleeper = || c.submit(&["--gpus", "1", "--", "sleep", "300"]);
    let (s1, s2) = (sleeper(), sleeper());
    let rack_of_job = |j: u64| rack(c.wait_state(j, "RUNNING")["tasks"][0]["node"].as_str().unwrap());
    assert_eq!([rack_of_job(s1), rack_of_job(s2)], ["r1", "r2"]);
    // The topology names the level; a file placing a node not registered lists it.
    let file = c.path("topology.toml");
    std::fs::write(&file, "levels = [\"rack\"]\n[rack]\nr3 = [\"z9\"]\n").unwrap();
    let applied = c.ok(&["topology", "apply", file.to_str().unwrap()]);
    assert!(applied.contains("not registered (yet): z9"), "{applied}");
    let show = c.ok(&["topology", "show"]);
    assert!(show.lines().any(|l| l.split_whitespace().collect::<Vec<_>>() == ["b2", "r2"]), "{show}");
    let tree = c.ok(&["nodes", "--topology"]);
    assert!(tree.contains("rack r1: 2 GPUs free on 3 nodes") && tree.contains("  b1: 1 GPUs free"), "{tree}");

    let gang = ["--nodes", "3", "--gpus-per-node", "1"];
    let required = c.submit(&[&gang[..], &["--topology", "rack=required", "--", "true"]].concat());
    let reason = wait_for("the Topology reason", || {
        let r = c.job(required)["reason"].as_str().unwrap_or_default().to_string();
        r.starts_with("Topology").then_some(r)
    });
    assert!(reason.contains("no rack has 3 nodes free for it (the most: rack r1, 2)"), "{reason}");
    assert_eq!(c.job(required)["state"], "PENDING");

    // r1's busy node frees: the gang starts inside r1.
    c.ok(&["cancel", &s1.to_string()]);
    let done = c.wait_done(required);
    assert_eq!(done["state"], "COMPLETED", "{done}");
    let placed = nodes_of(&done);
    assert!(placed.iter().all(|n| rack(n) == "r1"), "{placed:?}");
    assert_eq!(done["domains"], "rack r1", "{done}");
    let show = c.ok(&["show", &required.to_string()]);
    assert!(show.contains("rack=required") && show.contains("rack r1"), "{show}");

    // Small jobs fill the fullest rack first (r2, one node busy), keeping r1 whole.
    let (s3, s4) = (sleeper(), sleeper());
    assert_eq!([rack_of_job(s3), rack_of_job(s4)], ["r2", "r2"]);
    let s5 = sleeper();
    assert_eq!(rack_of_job(s5), "r1");
    // Two free nodes in r1, one in r2: preferred starts at once across the racks and says so.
    c.ok(&["cancel", &s3.to_string()]);
    c.wait_done(s3);
    let preferred = c.submit(&[&gang[..], &["--topology", "rack=preferred", "--", "sleep", "2"]].concat());
    let done = c.wait_done(preferred);
    assert_eq!(done["state"], "COMPLETED", "{done}");
    let racks: std::collections::BTreeSet<&str> = nodes_of(&done).iter().map(|n| rack(n)).collect();
    assert_eq!(racks.len(), 2, "{done}");
    let allocated =
        done["events"].as_array().unwrap().iter().find(|e| e["kind"] == "allocated").unwrap().clone();
    assert!(allocated["message"].as_str().unwrap().contains("racks r1, r2 (preferred"), "{allocated}");
    for j in [s2, s4, s5] {
        c.ok(&["cancel", &j.to_string()]);
    }
    // A bad file changes nothing.
    std::fs::write(&file, "levels = [\"rack\"]\n[rack]\nr1 = [\"a1\"]\nr2 = [\"a1\"]\n").unwrap();
    let out = c.kairos(&["topology", "apply", file.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("node a1 is in rack r1 and rack r2"));
    assert!(c.ok(&["topology", "show"]).contains("z9"), "the applied topology stays");
}

#[test]
fn a_two_gpu_job_gets_two_gpus_of_one_nvlink_island() {
    let options =
        Options { agent_flags: vec!["--fake-gpu-topology".into(), "0-3,4-7".into()], ..Options::default() };
    let c = Cluster::start_opts(1, 8, options);
    c.wait_node_up();
    // Six one-GPU sleepers take GPUs 0–5 (island 0 first, tightest); all but those on 1 and 5
    // are cancelled.
    let sleepers: Vec<u64> = (0..6).map(|_| c.submit(&["--gpus", "1", "--", "sleep", "300"])).collect();
    let mut on = std::collections::BTreeMap::new();
    for j in &sleepers {
        let job = c.wait_state(*j, "RUNNING");
        on.insert(job["gpu_ids"][0].as_u64().unwrap(), *j);
    }
    assert_eq!(on.keys().copied().collect::<Vec<_>>(), [0, 1, 2, 3, 4, 5]);
    for gpu in [0, 2, 3, 4] {
        c.ok(&["cancel", &on[&gpu].to_string()]);
        c.wait_done(on[&gpu]);
    }
    let out = c.path("cvd");
    let script = format!("echo $CUDA_VISIBLE_DEVICES > {}", out.display());
    let two = c.submit(&["--gpus", "2", "--", "sh", "-c", &script]);
    let done = c.wait_done(two);
    assert_eq!(done["state"], "COMPLETED", "{done}");
    let gpus: Vec<u64> = done["gpu_ids"].as_array().unwrap().iter().map(|g| g.as_u64().unwrap()).collect();
    assert!(gpus == [0, 2] || gpus == [6, 7], "GPUs of one island, never 0 and 4: {gpus:?}");
    let seen = std::fs::read_to_string(&out).unwrap();
    let want: Vec<String> = gpus.iter().map(u64::to_string).collect();
    assert_eq!(seen.trim(), want.join(","));
    for gpu in [1, 5] {
        c.ok(&["cancel", &on[&gpu].to_string()]);
    }
}

//! GPU health end to end: faults injected into the fake backend at run time take a GPU out of
//! service and requeue the run on it; an operator's reset returns it; an operator's
//! health-check program drains its node and, passing again, returns it.

use std::io::Write;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::{wait_for, wait_for_within, Cluster, Options};

fn inject(file: &std::path::Path, line: &str) {
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(file).unwrap();
    writeln!(f, "{line}").unwrap();
}

fn nodes(c: &Cluster) -> Value {
    serde_json::from_str(&c.ok(&["nodes", "--json"])).unwrap()
}

/// The leader's `kairos_gpus{state="unhealthy"}`.
fn unhealthy_metric(c: &Cluster) -> Option<f64> {
    let addr = c.controllers[c.leader()].metrics.clone()?;
    let (_, text) = crate::observability::http_get(&addr, "/metrics")?;
    text.lines()
        .find_map(|l| l.strip_prefix("kairos_gpus{state=\"unhealthy\"} "))
        .and_then(|v| v.parse().ok())
}

#[test]
fn an_injected_xid_79_requeues_the_run_and_keeps_the_gpu_out_until_reset_and_xid_13_changes_nothing() {
    let faults_dir = tempfile::tempdir().unwrap();
    let faults = faults_dir.path().join("faults");
    let flags = vec!["--fake-gpu-faults".to_string(), faults.display().to_string()];
    let c = Cluster::start_opts(1, 2, Options { agent_flags: flags, metrics: true, ..Options::default() });
    let id = c.submit(&["--gpus", "1", "--", "sleep", "600"]);
    let job = c.wait_state(id, "RUNNING");
    let gpu = job["gpu_ids"][0].as_u64().unwrap();

    // XID 13 is the application's error: nothing changes.
    inject(&faults, &format!("{gpu} 13"));
    std::thread::sleep(Duration::from_millis(1500));
    let job = c.job(id);
    assert_eq!((job["state"].as_str(), job["attempt"].as_u64()), (Some("RUNNING"), Some(0)), "{job}");
    assert_eq!(nodes(&c)[0]["gpus_unhealthy"], serde_json::json!([]));

    // XID 79 (fallen off the bus): the run is requeued, and its next attempt avoids the GPU.
    let injected = Instant::now();
    inject(&faults, &format!("{gpu} 79"));
    wait_for_within("the job to be requeued", Duration::from_secs(10), || {
        (c.job(id)["attempt"].as_u64() == Some(1)).then_some(())
    });
    let took = injected.elapsed();
    eprintln!("XID 79 to requeue: {} ms", took.as_millis());
    assert!(took < Duration::from_secs(2), "requeued {} ms after the fault", took.as_millis());
    let events = c.ok(&["show", &id.to_string()]);
    assert!(events.contains(&format!("GPU {gpu} (GPU-fake-node-a-{gpu}) failed: XID 79")), "{events}");
    let job = c.wait_state(id, "RUNNING");
    assert_ne!(job["gpu_ids"][0].as_u64(), Some(gpu), "{job}");
    let node = &nodes(&c)[0];
    assert_eq!(node["gpus_unhealthy"][0]["gpu"].as_u64(), Some(gpu), "{node}");
    assert_eq!(node["gpus_unhealthy"][0]["reason"], "XID 79");
    let table = c.ok(&["nodes"]);
    assert!(table.contains("UNHEALTHY") && table.contains(&format!("{gpu}(XID 79)")), "{table}");
    wait_for("the unhealthy GPU in the metrics", || (unhealthy_metric(&c) == Some(1.0)).then_some(()));

    // The healthy GPU is taken; the unhealthy one is never given: the next job waits.
    let next = c.submit(&["--gpus", "1", "--", "true"]);
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(c.job(next)["state"], "PENDING");
    // Only operators reset GPUs; the reset returns it and the waiting job starts.
    let out = c.cli_as("alice").args(["node", "gpu-reset", "node-a", &gpu.to_string()]).output().unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("operator"));
    c.ok(&["node", "gpu-reset", "node-a", &gpu.to_string()]);
    assert_eq!(c.wait_done(next)["state"], "COMPLETED");
    assert_eq!(nodes(&c)[0]["gpus_unhealthy"], serde_json::json!([]));
    wait_for("the metrics to show no unhealthy GPU", || (unhealthy_metric(&c) == Some(0.0)).then_some(()));
    let out = c.kairos(&["node", "gpu-reset", "node-a", "7"]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("has no GPU 7"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    c.ok(&["cancel", &id.to_string()]);
}

#[test]
fn a_failing_health_check_drains_its_node_with_its_message_and_passing_again_returns_it() {
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("broken");
    let program = dir.path().join("check.sh");
    std::fs::write(
        &program,
        format!(
            "#!/bin/sh\nif [ -e {} ]; then echo 'ERROR: /scratch is full'; echo more; exit 1; fi\nexit 0\n",
            broken.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&program, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let flags =
        ["--health-check-program", &program.display().to_string(), "--health-check-interval", "300ms"]
            .iter()
            .map(|s| s.to_string())
            .collect();
    let c = Cluster::start_opts(1, 2, Options { agent_flags: flags, ..Options::default() });
    let running = c.submit(&["--gpus", "1", "--", "sleep", "600"]);
    c.wait_state(running, "RUNNING");

    std::fs::write(&broken, "").unwrap();
    let node = wait_for("the node to drain", || {
        let n = nodes(&c)[0].clone();
        (n["state"] == "DRAINING").then_some(n)
    });
    assert_eq!(node["reason"], "draining: health check: ERROR: /scratch is full");
    // Its runs go on (the default action), nothing new starts there.
    let waiting = c.submit(&["--gpus", "1", "--", "true"]);
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(c.job(waiting)["state"], "PENDING");
    let job = c.job(running);
    assert_eq!((job["state"].as_str(), job["attempt"].as_u64()), (Some("RUNNING"), Some(0)), "{job}");

    // Fixed: the node returns by itself and the waiting job runs.
    std::fs::remove_file(&broken).unwrap();
    wait_for("the node to return", || (nodes(&c)[0]["state"] == "UP").then_some(()));
    assert_eq!(c.wait_done(waiting)["state"], "COMPLETED");

    // An operator's drain is the operator's: a passing check does not end it; resume does.
    c.ok(&["drain", "node-a", "--reason", "rack work"]);
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(nodes(&c)[0]["state"], "DRAINING");
    c.ok(&["node", "resume", "node-a"]);
    assert_eq!(nodes(&c)[0]["state"], "UP");
}

#[test]
fn a_fake_mig_layout_of_seven_instances_runs_seven_one_instance_jobs_at_once_each_on_its_own_uuid() {
    let flags =
        ["--fake-gpu-model", "H200", "--fake-mig", "7x1g.18gb"].iter().map(|s| s.to_string()).collect();
    let c = Cluster::start_opts(1, 1, Options { agent_flags: flags, ..Options::default() });
    let node = &nodes(&c)[0];
    // The parent is offered only as its instances.
    assert_eq!(node["gpus_total"], 7, "{node}");
    assert!(node["gpus"].as_array().unwrap().iter().all(|g| g["model"] == "H200 MIG 1g.18gb"), "{node}");
    assert!(node["gpus"].as_array().unwrap().iter().all(|g| g["mig_parent"] == 0), "{node}");
    let seen = c.path("seen");
    std::fs::create_dir_all(&seen).unwrap();
    let go = c.path("go");
    // Each job says what it sees, then waits for the test: all seven must run at once.
    let script = format!(
        "echo $CUDA_VISIBLE_DEVICES > {0}/.$KAIROS_JOB_ID && mv {0}/.$KAIROS_JOB_ID {0}/$KAIROS_JOB_ID; for i in $(seq 600); do [ -e {1} ] && exit 0; sleep 0.1; done; exit 1",
        seen.display(),
        go.display()
    );
    let ids: Vec<u64> = (0..7)
        .map(|_| c.submit(&["--gpus", "1", "--gpu-model", "1g.18gb", "--", "sh", "-c", &script]))
        .collect();
    let eighth = c.submit(&["--gpus", "1", "--", "true"]);
    let uuids = wait_for("seven jobs running at once", || {
        let files: Vec<String> = ids
            .iter()
            .filter_map(|id| std::fs::read_to_string(seen.join(id.to_string())).ok())
            .map(|s| s.trim().to_string())
            .collect();
        (files.len() == 7).then_some(files)
    });
    let distinct: std::collections::BTreeSet<&String> = uuids.iter().collect();
    assert_eq!(distinct.len(), 7, "{uuids:?}");
    assert!(uuids.iter().all(|u| u.starts_with("MIG-fake-node-a-0-")), "{uuids:?}");
    assert_eq!(c.job(eighth)["state"], "PENDING", "an eighth instance does not exist");
    std::fs::write(&go, "").unwrap();
    for id in ids.iter().chain([&eighth]) {
        assert_eq!(c.wait_done(*id)["state"], "COMPLETED", "job {id}");
    }
}

#[test]
fn four_quarter_gpu_inference_jobs_share_one_gpu_a_fifth_waits_and_training_never_shares() {
    let c = Cluster::start(1);
    let seen = c.path("seen");
    std::fs::create_dir_all(&seen).unwrap();
    let go = c.path("go");
    let script = format!(
        "echo $CUDA_VISIBLE_DEVICES $CUDA_MPS_ACTIVE_THREAD_PERCENTAGE $KAIROS_GPU_FRACTION $CUDA_MPS_PINNED_DEVICE_MEM_LIMIT > {0}/.$KAIROS_JOB_ID && mv {0}/.$KAIROS_JOB_ID {0}/$KAIROS_JOB_ID; for i in $(seq 600); do [ -e {1} ] && exit 0; sleep 0.1; done; exit 1",
        seen.display(),
        go.display()
    );
    let quarter = ["--profile", "inference", "--gpu-fraction", "0.25", "--", "sh", "-c", &script];
    let ids: Vec<u64> = (0..4).map(|_| c.submit(&quarter)).collect();
    let seen_by = wait_for("four fractions running at once", || {
        let files: Vec<String> =
            ids.iter().filter_map(|id| std::fs::read_to_string(seen.join(id.to_string())).ok()).collect();
        (files.len() == 4).then_some(files)
    });
    assert!(seen_by.iter().all(|s| s.trim() == "0 25 0.250 0=20480M"), "{seen_by:?}");
    let fifth = c.submit(&quarter);
    let whole = c.submit(&["--gpus", "1", "--", "true"]);
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(
        (c.job(fifth)["state"].as_str(), c.job(whole)["state"].as_str()),
        (Some("PENDING"), Some("PENDING"))
    );
    let node = &nodes(&c)[0];
    assert_eq!(node["gpus_shared"].as_array().unwrap().len(), 4, "{node}");
    assert!(c.ok(&["nodes"]).lines().nth(1).unwrap().contains(" 1/1 "), "{}", c.ok(&["nodes"]));
    // Training never shares; a bad fraction is a one-line error.
    let out = c.kairos(&["submit", "--profile", "training", "--gpu-fraction", "0.5", "--", "true"]);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success() && err.contains("does not share GPUs"), "{err}");
    let out = c.kairos(&["submit", "--gpu-fraction", "1.5", "--", "true"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("between 0.001 and 0.999"));
    std::fs::write(&go, "").unwrap();
    for id in ids.iter().chain([&fifth, &whole]) {
        assert_eq!(c.wait_done(*id)["state"], "COMPLETED", "job {id}");
    }
}

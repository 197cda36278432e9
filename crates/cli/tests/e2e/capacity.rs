//! Jobs that no node could ever hold are refused at submit, naming the largest node; what only
//! the load prevents waits; `kairos up --cpus --memory` offers a fake capacity (as
//! `--fake-gpus` does) whose enforcement stays clamped to the host.

use crate::harness::{Cluster, Options};
use crate::restart::Up;

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).to_string()
}

#[test]
fn more_cpus_or_memory_than_any_node_has_is_refused_at_submit_naming_the_largest_node() {
    let flags = ["--cpus", "2", "--memory", "4G"].map(String::from).to_vec();
    let c = Cluster::start_opts(1, 2, Options { agent_flags: flags, ..Options::default() });
    let out = c.kairos(&["submit", "-c", "64", "--", "true"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(
        err.contains("job requests 64 CPUs per node but the largest node has 2: node \"node-a\" (2 GPUs, 2 CPUs, 4096 MiB of memory)"),
        "{err}"
    );
    let err = stderr(&c.kairos(&["submit", "--mem", "8G", "--", "true"]));
    assert!(err.contains("8192 MiB of memory per node but the largest node has 4096 MiB"), "{err}");
    let err = stderr(&c.kairos(&["submit", "--gpus", "1", "--gpu-model", "L40S", "--", "true"]));
    assert!(err.contains("no node has a GPU of model \"L40S\""), "{err}");
    assert_eq!(c.jobs().len(), 0, "a refused submit creates no job");
    // What only the load prevents waits: two CPUs held, the next job asking two waits for them.
    let holder = c.submit(&["-c", "2", "--", "sleep", "300"]);
    c.wait_state(holder, "RUNNING");
    let waiter = c.submit(&["-c", "2", "--", "true"]);
    let job = crate::harness::wait_for("the second job's reason", || {
        let job = c.try_job(waiter)?;
        job["reason"].as_str().is_some_and(|r| r.contains("CPUs")).then_some(job)
    });
    assert_eq!(job["state"], "PENDING", "{job}");
    c.ok(&["cancel", &holder.to_string()]);
    assert_eq!(c.wait_done(waiter)["state"], "COMPLETED");
}

#[test]
fn kairos_up_with_fake_cpus_and_memory_runs_a_job_bigger_than_the_host_within_the_hosts_cores() {
    let up = Up::start(&["--cpus", "16", "--memory", "64G"]);
    let nodes: serde_json::Value = serde_json::from_str(&up.ok(&["nodes", "--json"])).expect("nodes JSON");
    assert_eq!(
        (nodes[0]["cpus_total"].as_u64(), nodes[0]["memory_mib_total"].as_u64()),
        (Some(16), Some(65536))
    );
    let id = up.submit(&["-c", "8", "--mem", "32G", "--", "nproc"]);
    let job = up.wait_done(id);
    assert_eq!(job["state"], "COMPLETED", "{job}");
    let nproc: usize = up.ok(&["logs", &id.to_string()]).trim().parse().expect("nproc's output");
    let host = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    assert!((1..=host).contains(&nproc), "the job saw {nproc} cores; the host has {host}");
    let err = stderr(&up.cli(&["submit", "-c", "64", "--", "true"]));
    assert!(err.contains("the largest node has 16: node \"local\""), "{err}");
}

//! Jobs are more than GPU counts: CPUs and memory scheduled beside GPUs, and enforced on the
//! node — a cpuset of the granted cores, a memory limit whose breach ends only the job that
//! broke it (OUT_OF_MEMORY), GPU device rules — and accounted (peak memory, CPU time). Real
//! cgroups (this machine's v1 cpuset/memory/devices/pids controllers, as root like CI).

use std::process::Command;

use serde_json::Value;

use crate::harness::{wait_for, Cluster, Options};

fn as_root() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "the resource tests set cgroup limits: run them as root (CI does)"
    );
    assert!(
        std::path::Path::new("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists(),
        "these tests need the cgroup v1 memory controller (this project's test machines have it)"
    );
}

/// One node offering 3 CPUs and 4 GiB to jobs, with 2 fake GPUs.
fn cluster() -> Cluster {
    as_root();
    let flags = ["--cpus", "3", "--memory", "4G"].iter().map(|s| s.to_string()).collect();
    Cluster::start_opts(1, 2, Options { agent_flags: flags, ..Options::default() })
}

fn logs(c: &Cluster, id: u64) -> String {
    c.ok(&["logs", &id.to_string()])
}

/// The job's memory limit as its own cgroup says (v1 memory.limit_in_bytes, or v2 memory.max).
const SHOW_LIMITS: &str = r#"echo "nproc=$(nproc)"
path=$(awk -F: '$2 == "memory" { print $3 }' /proc/self/cgroup)
if [ -n "$path" ]; then echo "limit=$(cat /sys/fs/cgroup/memory$path/memory.limit_in_bytes)"; fi"#;

#[test]
fn a_job_gets_its_cores_and_memory_limit_and_a_second_waits_naming_cpus() {
    let c = cluster();
    let nodes: Value = serde_json::from_str(&c.ok(&["nodes", "--json"])).unwrap();
    let node = &nodes[0];
    assert_eq!((node["cpus_total"].as_u64(), node["memory_mib_total"].as_u64()), (Some(3), Some(4096)));
    let isolation = node["isolation"].as_str().unwrap_or_default();
    assert!(isolation.contains("limits=cpuset+memory+pids+devices"), "{isolation}");

    let two = c.submit(&["--gpus", "0", "-c", "2", "--mem", "256M", "--", "sh", "-c", SHOW_LIMITS]);
    let one = c.submit(&["--gpus", "0", "-c", "1", "--", "sh", "-c", SHOW_LIMITS]);
    for id in [two, one] {
        assert_eq!(c.wait_done(id)["state"], "COMPLETED", "{}", logs(&c, id));
    }
    let out = logs(&c, two);
    assert!(out.contains("nproc=2"), "{out}");
    assert!(out.contains(&format!("limit={}", 256u64 << 20)), "{out}");
    assert!(logs(&c, one).contains("nproc=1"), "a 1-CPU job's cpuset is one core: {}", logs(&c, one));

    // 3 CPUs: a 2-CPU job runs, a second waits and says it is CPUs it lacks.
    let first = c.submit(&["--gpus", "0", "-c", "2", "--", "sleep", "60"]);
    c.wait_state(first, "RUNNING");
    let second = c.submit(&["--gpus", "0", "-c", "2", "--", "true"]);
    let reason = wait_for("the second job's pending reason", || {
        let job = c.job(second);
        let reason = job["reason"].as_str().unwrap_or_default().to_string();
        (job["state"] == "PENDING" && reason.contains("CPUs")).then_some(reason)
    });
    assert_eq!(reason, "Resources: not enough free CPUs");
    let nodes: Value = serde_json::from_str(&c.ok(&["nodes", "--json"])).unwrap();
    assert_eq!(nodes[0]["cpus_used"].as_u64(), Some(2));
    // Too many for any node: never, refused at submit.
    let never = c.kairos(&["submit", "--gpus", "0", "-c", "4", "--", "true"]);
    let err = String::from_utf8_lossy(&never.stderr);
    assert!(!never.status.success() && err.contains("4 CPUs per node but the largest node has 3"), "{err}");
    c.ok(&["cancel", &first.to_string()]);
    assert_eq!(c.wait_done(second)["state"], "COMPLETED");
}

#[test]
fn a_job_over_its_memory_ends_out_of_memory_and_its_neighbour_runs_on() {
    let c = cluster();
    let neighbour =
        c.submit(&["--gpus", "0", "-c", "1", "--mem", "64M", "--", "sh", "-c", "sleep 3; echo still-here"]);
    c.wait_state(neighbour, "RUNNING");
    // 512 MiB through tail (which keeps a line without a newline whole) under a 128 MiB limit.
    let hog = c.submit(&[
        "--gpus",
        "0",
        "-c",
        "1",
        "--mem",
        "128M",
        "--",
        "sh",
        "-c",
        "head -c 512M /dev/zero | tail > /dev/null",
    ]);
    let job = c.wait_done(hog);
    assert_eq!(job["state"], "OUT_OF_MEMORY", "{job}");
    assert!(job["reason"].as_str().unwrap_or_default().contains("out of memory"), "{job}");
    let wait = c.kairos(&["wait", &hog.to_string()]);
    assert_eq!(wait.status.code(), Some(122), "kairos wait's code for OUT_OF_MEMORY");
    assert_eq!(c.wait_done(neighbour)["state"], "COMPLETED");
    assert!(logs(&c, neighbour).contains("still-here"));
}

#[test]
fn a_job_opens_its_own_gpu_device_and_is_refused_another() {
    let c = cluster();
    // Stand-ins for /dev/nvidia0 and /dev/nvidia1: no driver behind them, so an open the
    // device rules permit fails with ENXIO and one they deny with EPERM.
    let dev = c.path("dev");
    std::fs::create_dir_all(&dev).unwrap();
    for minor in [0, 1] {
        let path = dev.join(format!("nvidia{minor}"));
        let st = Command::new("mknod").arg(&path).args(["c", "195", &minor.to_string()]).status().unwrap();
        assert!(st.success(), "mknod {}", path.display());
    }
    let script = format!(
        "own=$CUDA_VISIBLE_DEVICES; other=$((1 - own)); \
         cat {d}/nvidia$own 2>&1 | sed 's/^/own: /'; cat {d}/nvidia$other 2>&1 | sed 's/^/other: /'",
        d = dev.display()
    );
    let id = c.submit(&["--gpus", "1", "--", "sh", "-c", &script]);
    c.wait_done(id);
    let out = logs(&c, id);
    let line = |prefix: &str| out.lines().find(|l| l.starts_with(prefix)).unwrap_or_default().to_string();
    assert!(line("own: ").contains("No such device or address"), "its own GPU opens (ENXIO): {out}");
    assert!(line("other: ").contains("Operation not permitted"), "another GPU is denied (EPERM): {out}");
}

/// Seconds of a `times` line ("0m1.234s 0m0.050s"): user + system.
fn times_line(line: &str) -> f64 {
    line.split_whitespace()
        .filter_map(|t| {
            let (m, s) = t.strip_suffix('s')?.split_once('m')?;
            Some(m.parse::<f64>().ok()? * 60.0 + s.parse::<f64>().ok()?)
        })
        .sum()
}

#[test]
fn history_keeps_requests_peak_memory_and_cpu_time_and_batch_takes_slurm_resource_options() {
    let c = cluster();
    // ~200 MiB held at once, then a CPU-bound loop; `times` says what the shell and its
    // children used, for comparison with what the cgroup recorded.
    let script = "head -c 200M /dev/zero | tail > /dev/null; i=0; \
                  while [ $i -lt 1000000 ]; do i=$((i+1)); done; times";
    let id = c.submit(&["--gpus", "0", "-c", "1", "--mem", "1G", "--", "sh", "-c", script]);
    assert_eq!(c.wait_done(id)["state"], "COMPLETED");
    let out = logs(&c, id);
    let used: f64 = out.lines().filter(|l| l.contains('m') && l.ends_with('s')).map(times_line).sum();
    assert!(used > 0.3, "the job burned CPU: {out}");
    let history: Value =
        serde_json::from_str(&c.ok(&["history", "--json", "--since", "1h"])).expect("history JSON");
    let record =
        history.as_array().unwrap().iter().find(|r| r["id"] == id).cloned().expect("the job's record");
    assert_eq!((record["req_cpus"].as_u64(), record["req_memory_mib"].as_u64()), (Some(1), Some(1024)));
    let cpu_s = record["cpu_time_ms"].as_u64().unwrap() as f64 / 1000.0;
    assert!((cpu_s - used).abs() <= used * 0.25, "CPU time {cpu_s} s vs the job's own {used} s");
    let rss_mib = record["max_rss_kib"].as_u64().unwrap() as f64 / 1024.0;
    assert!((rss_mib - 200.0).abs() <= 50.0, "peak memory {rss_mib} MiB for ~200 MiB held");
    let table = c.ok(&["history", "--since", "1h", "--format", "ID,REQ_CPUS,REQ_MEM,MAX_RSS,CPU_TIME"]);
    assert!(table.lines().any(|l| l.starts_with(&id.to_string()) && l.contains("1.0G")), "{table}");

    // An unmodified Slurm script asking CPUs, memory and tasks runs.
    let good = c.path("good.sbatch");
    std::fs::write(
        &good,
        "#!/bin/sh\n#SBATCH -c 1 --mem=64M\n#SBATCH -n 2 --ntasks-per-node=2\n#SBATCH --mail-type=END,FAIL\n\
         echo cpus=$SLURM_CPUS_PER_TASK mem=$SLURM_MEM_PER_NODE\n",
    )
    .unwrap();
    let out = c.ok(&["batch", good.to_str().unwrap()]);
    let batch_id: u64 = out.trim().rsplit(' ').next().unwrap().parse().unwrap_or_else(|_| panic!("{out}"));
    assert_eq!(c.wait_done(batch_id)["state"], "COMPLETED");
    assert!(logs(&c, batch_id).contains("cpus=2 mem=64"), "{}", logs(&c, batch_id));
    // Three unsupported options: all named at once, nothing submitted.
    let bad = c.path("bad.sbatch");
    std::fs::write(
        &bad,
        "#!/bin/sh\n#SBATCH --exclusive\n#SBATCH --licenses=matlab:1 -c 1\n#SBATCH --nodelist=n1\ntrue\n",
    )
    .unwrap();
    let before = c.jobs().len();
    let out = c.kairos(&["batch", bad.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    for option in ["--exclusive", "--licenses", "--nodelist"] {
        assert!(err.contains(option), "{option} not named: {err}");
    }
    assert_eq!(c.jobs().len(), before, "nothing was submitted");
}

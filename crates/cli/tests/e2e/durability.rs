//! Storage failures stop a replica (fail-stop), and what it acknowledged survives them.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::harness::{wait_for, Cluster};

/// A small tmpfs mounted over a directory for one test, unmounted when dropped.
struct SmallDisk {
    dir: std::path::PathBuf,
}

impl SmallDisk {
    fn mount(dir: &std::path::Path, size: &str) -> SmallDisk {
        // SAFETY: geteuid has no preconditions.
        assert_eq!(unsafe { libc::geteuid() }, 0, "mounting a small disk needs root (CI runs as root)");
        std::fs::create_dir_all(dir).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "kairos-test-disk"])
            .arg(dir)
            .output()
            .expect("run mount");
        assert!(out.status.success(), "mount: {}", String::from_utf8_lossy(&out.stderr));
        SmallDisk { dir: dir.to_path_buf() }
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).output();
    }
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    let out = Command::new("cp").arg("-a").arg(format!("{}/.", from.display())).arg(to).output().unwrap();
    assert!(out.status.success(), "cp: {}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn a_replica_on_a_full_disk_exits_and_keeps_every_acknowledged_job_on_a_larger_one() {
    let mut c = Cluster::start(1);
    // Move the replica's data onto a 3 MiB disk.
    c.kill_controller(0);
    let data = c.path("controller-1");
    let saved = c.path("controller-1.saved");
    std::fs::rename(&data, &saved).unwrap();
    let disk = SmallDisk::mount(&data, "3m");
    copy_dir(&saved, &data);
    c.start_controller(0);
    wait_for("the replica to serve", || c.kairos(&["queue"]).status.success().then_some(()));
    // Submits of 40 KB each until the disk is full.
    let big = format!("BIG={}", "x".repeat(40_000));
    let mut acknowledged = Vec::new();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(120) {
        let out = c.kairos(&["submit", "--hold", "--env", &big, "--", "true"]);
        if !out.status.success() {
            break;
        }
        acknowledged.push(String::from_utf8_lossy(&out.stdout).trim().to_string());
    }
    assert!(!acknowledged.is_empty(), "nothing was acknowledged before the disk filled");
    // The replica stops itself, non-zero, with the reason in its log.
    let log_tail = |c: &Cluster| {
        let log = std::fs::read_to_string(c.path("kairosd-1.log")).unwrap_or_default();
        log[log.len().saturating_sub(3000)..].to_string()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = c.controllers[0].child.as_mut().and_then(|ch| ch.try_wait().ok().flatten()) {
            break s;
        }
        let n = acknowledged.len();
        assert!(
            Instant::now() < deadline,
            "the replica kept running on a full disk after {n} submits; its log ends:\n{}",
            log_tail(&c)
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(!status.success(), "exited with {status}");
    let log = std::fs::read_to_string(c.path("kairosd-1.log")).unwrap_or_default().to_lowercase();
    assert!(
        ["no space", "disk full", "storage"].iter().any(|w| log.contains(w)),
        "the log does not say why: {}",
        &log[log.len().saturating_sub(2000)..]
    );
    c.controllers[0].child = None;
    // Moved to a larger disk, it starts and has every acknowledged job.
    let larger = c.path("controller-1.larger");
    copy_dir(&data, &larger);
    drop(disk);
    std::fs::remove_dir_all(&data).unwrap();
    std::fs::rename(&larger, &data).unwrap();
    c.start_controller(0);
    wait_for("the replica to serve again", || c.kairos(&["queue"]).status.success().then_some(()));
    for id in &acknowledged {
        let out = c.kairos(&["show", id]);
        assert!(
            out.status.success(),
            "acknowledged job {id} is missing: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    eprintln!("{} submits acknowledged before the 3 MiB disk filled", acknowledged.len());
}

#[test]
fn sigterm_stops_a_replica_with_open_agent_streams_within_ten_seconds() {
    let mut c = Cluster::start(1);
    c.wait_node_up();
    let id = c.submit(&["--", "sleep", "300"]);
    c.wait_state(id, "RUNNING");
    let child = c.controllers[0].child.as_mut().unwrap();
    crate::harness::signal(child.id(), libc::SIGTERM);
    let started = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "kairosd did not stop within 10 s of SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}");
}

#[test]
fn a_flipped_bit_in_a_replicas_log_refuses_it_with_one_line_and_it_is_re_added_from_the_others() {
    let mut c = Cluster::start_with(3, 8, &[]);
    let ids: Vec<u64> = (0..20).map(|_| c.submit(&["--hold", "--", "true"])).collect();
    c.wait_converged();
    let victim = c.follower();
    let id = c.controllers[victim].id;
    c.kill_controller(victim);
    // One flipped bit in the middle of its log: entries it had acknowledged.
    let log_dir = c.path(&format!("controller-{id}/raft.log"));
    let mut segments: Vec<_> = std::fs::read_dir(&log_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "wal"))
        .collect();
    segments.sort();
    let segment = segments.first().expect("a log segment").clone();
    let mut bytes = std::fs::read(&segment).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x04;
    std::fs::write(&segment, &bytes).unwrap();
    // It refuses to start, with one line that names the segment, and changes nothing.
    let mut damaged = c
        .controller_command(id, &c.controllers[victim].addr.clone())
        .args(["--peers", &c.peers()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while damaged.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(30) {
            let _ = damaged.kill();
            panic!("a replica with a damaged log started (and serves a log that lost entries)");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = damaged.wait_with_output().unwrap();
    assert!(!out.status.success(), "a damaged replica started");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = stderr.lines().find(|l| l.starts_with("kairosd:")).unwrap_or_else(|| panic!("{stderr}"));
    assert!(line.contains("damaged") && line.contains(&segment.display().to_string()), "{line}");
    assert!(line.contains(&format!("kairos cluster remove {id}")), "{line}");
    assert_eq!(std::fs::read(&segment).unwrap(), bytes, "the refused log was changed");
    // The others kept every acknowledged job; the replica is re-added empty as the message says.
    for job in &ids {
        assert_eq!(c.job(*job)["state"], "PENDING");
    }
    c.ok(&["cluster", "remove", &id.to_string()]);
    std::fs::rename(c.path(&format!("controller-{id}")), c.path(&format!("controller-{id}.damaged")))
        .unwrap();
    let addr = c.controllers[victim].addr.clone();
    let mut joiner = c.controller_command(id, &addr);
    joiner.arg("--join");
    c.controllers[victim].child = Some(joiner.spawn().unwrap());
    c.ok(&["cluster", "add", &id.to_string(), &addr]);
    // Converged: all three (the re-added one included) at one applied index with one digest —
    // asked of each in turn, so compared while nothing else applies (the agent may register or
    // be marked down in between on a loaded machine: a later status alone could differ).
    let converged = c.wait_converged();
    assert_eq!(converged["replicas"].as_array().unwrap().len(), 3, "{converged}");
    assert!(c
        .status_of(victim)
        .is_some_and(|s| s["applied_index"].as_u64() >= converged["applied_index"].as_u64()));
    // It serves every job it was given back.
    for job in &ids {
        let out = c.kairos_at(&addr, &["show", &job.to_string(), "--json"]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
}

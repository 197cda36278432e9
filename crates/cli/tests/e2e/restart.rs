//! A single controller under `kairos up` crashes (`kill -9`) while a job runs: `kairos up`
//! starts it again, the agent keeps the run under its lease meanwhile, and the job runs on to
//! its own end — not FAILED "lost".

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tempfile::TempDir;

use crate::harness::{alive, free_addr, read_pid, signal, wait_for, wait_for_within};

/// `kairos up` with a private HOME and data directory; stopped, with its daemons and their
/// jobs, when dropped.
pub struct Up {
    pub dir: TempDir,
    pub addr: String,
    child: Child,
    /// Every daemon pid seen, to be sure none outlives the test.
    seen: std::cell::RefCell<Vec<u32>>,
}

impl Up {
    /// Starts `kairos up` with 2 fake GPUs and `extra` flags, and waits for its node to be up.
    pub fn start(extra: &[&str]) -> Up {
        let dir = tempfile::Builder::new().prefix("kairos-up-").tempdir().expect("temp dir");
        std::fs::create_dir_all(dir.path().join("home")).expect("home");
        let addr = free_addr();
        let log = std::fs::File::create(dir.path().join("up.log")).expect("up.log");
        let child = Command::new(env!("CARGO_BIN_EXE_kairos"))
            .env("HOME", dir.path().join("home"))
            .env_remove("XDG_CONFIG_HOME")
            .env_remove("KAIROS_CONTROLLERS")
            .env_remove("KAIROS_TOKEN")
            .env_remove("KAIROS_TOKEN_FILE")
            .env_remove("KAIROS_CONTEXT")
            .args(["up", "--addr", &addr, "--agent-addr", &free_addr(), "--fake-gpus", "2"])
            .args(extra)
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log handle"))
            .stderr(log)
            .spawn()
            .expect("start kairos up");
        let up = Up { dir, addr, child, seen: Default::default() };
        wait_for("kairos up's node to be up", || {
            let v: Value = serde_json::from_slice(&up.cli(&["nodes", "--json"]).stdout).ok()?;
            (v[0]["state"] == "UP").then_some(())
        });
        up
    }

    /// The CLI against this cluster with its admin token, reading no configuration of the
    /// caller's.
    pub fn cli(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_kairos"))
            .env("HOME", self.dir.path().join("home"))
            .env_remove("XDG_CONFIG_HOME")
            .env_remove("KAIROS_CONTEXT")
            .env_remove("KAIROS_TOKEN")
            .env("KAIROS_TOKEN_FILE", self.dir.path().join("data/admin.token"))
            .args(["--controllers", &self.addr])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run kairos")
    }

    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.cli(args);
        assert!(out.status.success(), "kairos {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).to_string()
    }

    pub fn submit(&self, args: &[&str]) -> u64 {
        let out = self.ok(&[&["submit"], args].concat());
        out.trim().parse().unwrap_or_else(|_| panic!("submit printed {out:?}"))
    }

    /// The job, or None while no controller answers.
    pub fn try_job(&self, id: u64) -> Option<Value> {
        let out = self.cli(&["show", &id.to_string(), "--json"]);
        out.status.success().then(|| serde_json::from_slice(&out.stdout).ok()).flatten()
    }

    pub fn wait_done(&self, id: u64) -> Value {
        wait_for(&format!("job {id} to end"), || {
            let job = self.try_job(id)?;
            let state = job["state"].as_str().unwrap_or_default();
            (!["PENDING", "RUNNING", "PREEMPTING", "SUSPENDED"].contains(&state)).then_some(job)
        })
    }

    /// What `kairos up` printed so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("up.log")).unwrap_or_default()
    }

    /// The pid of `kairos up`'s child called `name` (kairosd, kairos-agent), if one runs.
    pub fn daemon(&self, name: &str) -> Option<u32> {
        let pid = children(self.child.id()).into_iter().find(|p| comm(*p).as_deref() == Some(name))?;
        self.seen.borrow_mut().push(pid);
        Some(pid)
    }
}

/// The children of `pid` (every thread's), from /proc.
fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|c| c.split_whitespace().filter_map(|p| p.parse().ok()).collect::<Vec<u32>>())
        .collect()
}

/// A process's command name (its first 15 bytes).
fn comm(pid: u32) -> Option<String> {
    Some(std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?.trim().to_string())
}

impl Drop for Up {
    fn drop(&mut self) {
        // SIGTERM: `kairos up` stops its daemons, and the agent every job, before it exits.
        if let Ok(None) = self.child.try_wait() {
            signal(self.child.id(), libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(40);
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        for pid in self.seen.borrow().iter() {
            if alive(*pid) && comm(*pid).is_some_and(|c| c == "kairosd" || c == "kairos-agent") {
                signal(*pid, libc::SIGKILL);
            }
        }
    }
}

/// A job that writes its pid, waits for `go` to appear, then exits 7.
fn waiting_job(pidfile: &Path, go: &Path) -> String {
    format!("echo $$ > {}; while [ ! -e {} ]; do sleep 0.1; done; exit 7", pidfile.display(), go.display())
}

#[test]
fn a_kill_9_of_kairos_ups_controller_restarts_it_and_the_running_job_ends_with_its_own_exit_code() {
    let up = Up::start(&[]);
    let (pidfile, go): (PathBuf, PathBuf) = (up.dir.path().join("job.pid"), up.dir.path().join("go"));
    let id = up.submit(&["--", "sh", "-c", &waiting_job(&pidfile, &go)]);
    let job_pid = wait_for("the job to start", || read_pid(&pidfile));
    wait_for("the job to read RUNNING", || (up.try_job(id)?["state"] == "RUNNING").then_some(()));
    let agent = up.daemon("kairos-agent").expect("kairos up's agent");
    let first = up.daemon("kairosd").expect("kairos up's kairosd");

    signal(first, libc::SIGKILL);
    let killed = Instant::now();
    let second =
        wait_for("kairos up to start kairosd again", || up.daemon("kairosd").filter(|p| *p != first));
    let back = wait_for("the restarted kairosd to answer", || up.try_job(id));
    assert_eq!(back["state"], "RUNNING", "{back}");
    // Past the agent's lease (10 s, half the default node timeout) counted from the crash: the
    // restarted controller renews it, and the run is the same process, never restarted.
    while killed.elapsed() < Duration::from_secs(14) {
        assert!(alive(job_pid), "the job's process died after the controller's crash");
        std::thread::sleep(Duration::from_millis(200));
    }
    let job = up.try_job(id).expect("the controller answers");
    assert_eq!((job["state"].as_str(), job["attempt"].as_u64()), (Some("RUNNING"), Some(0)), "{job}");
    assert!(alive(agent), "the agent ran on through the controller's crash");
    assert_eq!(up.daemon("kairosd"), Some(second), "one restart was enough");

    std::fs::write(&go, "").expect("go");
    let done = up.wait_done(id);
    assert_eq!((done["state"].as_str(), done["exit_code"].as_i64()), (Some("FAILED"), Some(7)), "{done}");
    assert_eq!(done["attempt"].as_u64(), Some(0), "{done}");
    let log = up.log();
    assert!(log.contains("kairosd 1 (pid") && log.contains("starting it again in 0.5 s"), "{log}");
    assert!(log.contains("kairosd 1 started again"), "{log}");

    // A job submitted after the restart runs too: the cluster is whole.
    let after = up.submit(&["--", "true"]);
    assert_eq!(up.wait_done(after)["state"], "COMPLETED");
    wait_for_within("nothing of the job to be left", Duration::from_secs(10), || {
        (!alive(job_pid)).then_some(())
    });
}

//! A real local cluster for tests: `kairosd` and `kairos-agent` as child processes on loopback
//! ports, data in a temporary directory, driven through the `kairos` binary.
//!
//! Everything started here is stopped in `Drop` (SIGTERM, then SIGKILL), and every wait is
//! bounded, so a failing test neither hangs nor leaves processes behind.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tempfile::TempDir;

/// Upper bound of any wait in these tests; generous for a loaded 2-core CI machine.
pub const WAIT: Duration = Duration::from_secs(60);

pub fn bin(name: &str) -> PathBuf {
    let kairos = PathBuf::from(env!("CARGO_BIN_EXE_kairos"));
    let path = kairos.parent().expect("target dir").join(name);
    assert!(path.exists(), "{} is missing: run `cargo build --bins` before the tests", path.display());
    path
}

/// The Python with the test packages (moto, boto3, grpcio, kairos_client): `KAIROS_TEST_PYTHON`
/// (scripts/test.sh points it at the environment it installed them into), else `python3`.
pub fn python() -> String {
    std::env::var("KAIROS_TEST_PYTHON").unwrap_or_else(|_| "python3".to_string())
}

/// A loopback address with a free port for a daemon to bind. Ports come from below the
/// kernel's ephemeral range (32768+), so no outgoing connection can take one between this
/// check and the daemon's bind; a per-process offset keeps concurrent test binaries apart.
pub fn free_addr() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let base = 20_000 + (std::process::id() % 64) * 160;
    loop {
        let port = base + NEXT.fetch_add(1, Ordering::SeqCst) % 10_240;
        let port = 20_000 + (port - 20_000) % 12_000;
        if std::net::TcpListener::bind(("127.0.0.1", port as u16)).is_ok() {
            return format!("127.0.0.1:{port}");
        }
    }
}

/// Environment variables through which the invoking user's kairos configuration reaches a CLI.
pub const CALLER_SETTINGS: &[&str] = &[
    "XDG_CONFIG_HOME",
    "KAIROS_CONTEXT",
    "KAIROS_CONTROLLERS",
    "KAIROS_TOKEN",
    "KAIROS_TOKEN_FILE",
    "KAIROS_CA",
    "KAIROS_CERT",
    "KAIROS_KEY",
];

/// The tests' own HOME (`target/tmp/e2e-home`), with no kairos contexts unless a test puts
/// some there: what `kairos_cmd` gives every CLI.
pub fn test_home() -> PathBuf {
    let home = Path::new(env!("CARGO_TARGET_TMPDIR")).join("e2e-home");
    std::fs::create_dir_all(&home).expect("the tests' HOME");
    home
}

/// A `kairos` command that reads none of the invoking user's configuration: HOME is `home` (the
/// contexts it sees are those in `home/.config/kairos`), and the caller's kairos settings in
/// the environment (`CALLER_SETTINGS`) are removed. A stale context in the user's
/// `~/.config/kairos` must not decide a test, nor may a test's `kairos up` add one there.
pub fn kairos_in(home: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kairos"));
    cmd.env("HOME", home);
    for var in CALLER_SETTINGS {
        cmd.env_remove(var);
    }
    cmd
}

/// `kairos_in` the tests' own HOME: how every test starts a `kairos` of its own.
pub fn kairos_cmd() -> Command {
    kairos_in(&test_home())
}

/// Polls `f` until it returns `Some`, or panics with `what` after `WAIT`.
pub fn wait_for<T>(what: &str, f: impl FnMut() -> Option<T>) -> T {
    wait_for_within(what, WAIT, f)
}

/// `wait_for` with a bound of its own, for waits whose length is the amount of work they wait
/// on (hundreds of jobs), not a reaction time.
pub fn wait_for_within<T>(what: &str, within: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) on a pid we started; no memory is involved.
    unsafe {
        libc::kill(pid as i32, sig);
    }
}

/// Whether a process exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat.rsplit(')').next().and_then(|rest| rest.split_whitespace().next());
            !matches!(state, Some("Z") | Some("X") | None)
        }
        Err(_) => false,
    }
}

pub fn stop_child(child: &mut Child) {
    if let Ok(None) = child.try_wait() {
        signal(child.id(), libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
    }
    let _ = child.wait();
}

pub struct Controller {
    pub id: u64,
    pub addr: String,
    pub child: Option<Child>,
    /// Its `--metrics-addr`, when the cluster serves metrics.
    pub metrics: Option<String>,
    /// Its `--http-addr`, when the cluster serves the JSON API and web UI.
    pub http: Option<String>,
}

pub struct Cluster {
    pub dir: TempDir,
    pub controllers: Vec<Controller>,
    pub agent: Option<Child>,
    /// More agents (nodes) started with `add_agent`.
    pub more_agents: Vec<Child>,
    gpus: u32,
    /// Extra flags for every kairosd (e.g. a small snapshot threshold).
    pub controller_flags: Vec<String>,
    /// Extra flags for the first kairosd only (e.g. --restore-from).
    pub first_controller_flags: Vec<String>,
    /// Extra flags for every agent (e.g. TLS files).
    pub agent_flags: Vec<String>,
    /// Extra environment for every CLI call (e.g. KAIROS_CA).
    pub cli_env: Vec<(String, String)>,
    /// The agent's `--metrics-addr`, when the cluster serves metrics.
    pub agent_metrics: Option<String>,
    /// Extra environment for every daemon (e.g. OTEL_EXPORTER_OTLP_ENDPOINT).
    pub daemon_env: Vec<(String, String)>,
}

/// What a cluster starts with besides the defaults.
#[derive(Default)]
pub struct Options {
    pub controller_flags: Vec<String>,
    /// Flags for the first kairosd only.
    pub first_controller_flags: Vec<String>,
    pub agent_flags: Vec<String>,
    pub cli_env: Vec<(String, String)>,
    /// Every daemon serves Prometheus metrics on an address of its own.
    pub metrics: bool,
    /// Every kairosd serves the JSON API and web UI on an address of its own.
    pub http: bool,
    /// Extra environment for every daemon.
    pub daemon_env: Vec<(String, String)>,
    /// Start no agent (the test starts it with `start_agent`, e.g. after placing a credential).
    pub no_agent: bool,
}

impl Cluster {
    /// A controller and one agent with `gpus` fake GPUs.
    pub fn start(gpus: u32) -> Cluster {
        Cluster::start_with(1, gpus, &[])
    }

    /// `replicas` controllers forming one Raft cluster, and one agent with `gpus` fake GPUs.
    pub fn start_with(replicas: u64, gpus: u32, flags: &[&str]) -> Cluster {
        let controller_flags = flags.iter().map(|f| f.to_string()).collect();
        Cluster::start_opts(replicas, gpus, Options { controller_flags, ..Options::default() })
    }

    /// `replicas` controllers and one agent with `gpus` fake GPUs, with extra `options`.
    pub fn start_opts(replicas: u64, gpus: u32, options: Options) -> Cluster {
        let dir = tempfile::Builder::new().prefix("kairos-e2e-").tempdir().expect("temp dir");
        let metrics = || options.metrics.then(free_addr);
        let controllers = (1..=replicas)
            .map(|id| Controller {
                id,
                addr: free_addr(),
                child: None,
                metrics: metrics(),
                http: options.http.then(free_addr),
            })
            .collect();
        let agent_metrics = metrics();
        // One cluster secret and two tokens shared by every replica, agent and CLI call.
        for (file, content) in [
            ("cluster.secret", "e2e-cluster-secret-0123456789abcdef0123456789"),
            ("admin.token", "kairos-admin.e2e-0123456789abcdef"),
            ("join.token", "kairos-join.e2e-0123456789abcdef"),
        ] {
            std::fs::write(dir.path().join(file), content).expect("secret file");
            // Owner-only, as kairosd writes its own (jobs of other users must not read them).
            std::fs::set_permissions(
                dir.path().join(file),
                std::os::unix::fs::PermissionsExt::from_mode(0o600),
            )
            .expect("secret file mode");
        }
        let mut c = Cluster {
            dir,
            controllers,
            agent: None,
            more_agents: Vec::new(),
            gpus,
            controller_flags: options.controller_flags,
            first_controller_flags: options.first_controller_flags,
            agent_flags: options.agent_flags,
            cli_env: options.cli_env,
            agent_metrics,
            daemon_env: options.daemon_env,
        };
        for i in 0..c.controllers.len() {
            c.start_controller(i);
        }
        if !options.no_agent {
            c.start_agent();
            c.wait_node_up();
        }
        c
    }

    /// Where the CLI runs (a job's default working directory, as sbatch's is where it was
    /// submitted): the cluster's own, writable by every user (sticky), as a shared scratch is.
    pub fn submit_dir(&self) -> PathBuf {
        let dir = self.dir.path().join("submit");
        if !dir.is_dir() {
            std::fs::create_dir_all(&dir).expect("submit dir");
            std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o1777))
                .expect("submit dir mode");
        }
        dir
    }

    pub fn path(&self, sub: &str) -> PathBuf {
        self.dir.path().join(sub)
    }

    /// The directory of `job` on the agent whose state directory is `agent` (e.g. "agent"):
    /// `jobs/<id>-<submit ms>`.
    pub fn job_dir(&self, agent: &str, job: u64) -> PathBuf {
        let jobs = self.path(&format!("{agent}/jobs"));
        let prefix = format!("{job}-");
        std::fs::read_dir(&jobs)
            .unwrap_or_else(|e| panic!("listing {}: {e}", jobs.display()))
            .flatten()
            .map(|e| e.path())
            .find(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(&prefix)))
            .unwrap_or_else(|| panic!("no directory of job {job} in {}", jobs.display()))
    }

    /// The bootstrap admin token's file (what every CLI call of the harness uses).
    pub fn token_file(&self) -> PathBuf {
        self.path("admin.token")
    }

    /// A `kairos` command against this cluster with the admin token.
    pub fn cli(&self) -> Command {
        let mut cmd = kairos_cmd();
        cmd.current_dir(self.submit_dir());
        cmd.arg("--controllers").arg(self.addrs()).env("KAIROS_TOKEN_FILE", self.token_file());
        cmd.envs(self.cli_env.iter().map(|(k, v)| (k, v))).stdin(Stdio::null());
        cmd
    }

    /// A `kairos` command acting as `user` (the admin token with `--as`).
    pub fn cli_as(&self, user: &str) -> Command {
        let mut cmd = self.cli();
        cmd.args(["--as", user]);
        cmd
    }

    /// All controller addresses, comma-separated, as clients take them.
    pub fn addrs(&self) -> String {
        self.controllers.iter().map(|c| c.addr.as_str()).collect::<Vec<_>>().join(",")
    }

    pub fn peers(&self) -> String {
        self.controllers.iter().map(|c| format!("{}={}", c.id, c.addr)).collect::<Vec<_>>().join(",")
    }

    /// Why replica `index` may not answer: whether its process still runs, and its log's tail.
    fn silent_replica(&self, index: usize) -> String {
        let c = &self.controllers[index];
        let pid = c.child.as_ref().map(|ch| ch.id());
        // The process state letter (R, S, D, Z …) after the command name; none once reaped.
        let state =
            pid.and_then(|p| std::fs::read_to_string(format!("/proc/{p}/stat")).ok()).and_then(|st| {
                st.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next().map(String::from))
            });
        let log = std::fs::read_to_string(self.path(&format!("kairosd-{}.log", c.id))).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(15).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        format!("process {pid:?} state {state:?}; log tail:\n{}", tail.join("\n"))
    }

    fn log_file(&self, name: &str) -> Stdio {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path(name))
            .expect("daemon log file");
        Stdio::from(f)
    }

    /// The kairosd command line for replica `id` at `addr` (without starting it).
    pub fn controller_command(&self, id: u64, addr: &str) -> Command {
        let mut cmd = Command::new(bin("kairosd"));
        cmd.args(["--id", &id.to_string(), "--addr", addr, "--tick-ms", "200", "--heartbeat-ms", "300"])
            .args(["--node-timeout-ms", "5000"])
            .arg("--data-dir")
            .arg(self.path(&format!("controller-{id}")))
            .arg("--cluster-secret-file")
            .arg(self.path("cluster.secret"))
            .arg("--admin-token-file")
            .arg(self.path("admin.token"))
            .arg("--join-token-file")
            .arg(self.path("join.token"))
            .args(&self.controller_flags)
            // Static credentials for the cloud burst tests (moto); no instance metadata lookups.
            .env("AWS_ACCESS_KEY_ID", "testing")
            .env("AWS_SECRET_ACCESS_KEY", "testing")
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .envs(self.daemon_env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(self.log_file(&format!("kairosd-{id}.log")))
            .stderr(self.log_file(&format!("kairosd-{id}.log")));
        cmd
    }

    pub fn start_controller(&mut self, index: usize) {
        let (id, addr) = (self.controllers[index].id, self.controllers[index].addr.clone());
        let mut cmd = self.controller_command(id, &addr);
        if self.controllers.len() > 1 {
            cmd.args(["--peers", &self.peers()]);
        }
        if index == 0 {
            cmd.args(&self.first_controller_flags);
        }
        if let Some(m) = &self.controllers[index].metrics {
            cmd.args(["--metrics-addr", m]);
        }
        if let Some(h) = &self.controllers[index].http {
            cmd.args(["--http-addr", h]);
        }
        self.controllers[index].child = Some(cmd.spawn().expect("start kairosd"));
    }

    /// `agent_flags`, plus `--run-as agent` unless they choose: the tests run as root, where
    /// the agent's default is to run jobs as their submitters' Unix accounts.
    fn agent_flags_with_defaults(&self) -> Vec<String> {
        let mut flags = self.agent_flags.clone();
        if let Some(m) = &self.agent_metrics {
            flags.extend(["--metrics-addr".to_string(), m.clone()]);
        }
        if !flags.iter().any(|f| f == "--run-as") {
            flags.extend(["--run-as".to_string(), "agent".to_string()]);
        }
        flags
    }

    pub fn start_agent(&mut self) {
        let child = Command::new(bin("kairos-agent"))
            .args(["--controllers", &self.addrs(), "--addr", "127.0.0.1:0", "--name", "node-a"])
            .args(["--gpu-backend", "fake", "--fake-gpus", &self.gpus.to_string()])
            .arg("--join-token-file")
            .arg(self.path("join.token"))
            .args(self.agent_flags_with_defaults())
            .arg("--state-dir")
            .arg(self.path("agent"))
            .envs(self.daemon_env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(self.log_file("agent.log"))
            .stderr(self.log_file("agent.log"))
            .spawn()
            .expect("start kairos-agent");
        self.agent = Some(child);
    }

    /// Starts another agent (node) called `name` with `gpus` fake GPUs and waits until it is up.
    pub fn add_agent(&mut self, name: &str, gpus: u32) {
        self.add_agent_with(name, gpus, &[]);
    }

    /// `add_agent` with extra flags for this agent (e.g. `--label rack=r1`).
    pub fn add_agent_with(&mut self, name: &str, gpus: u32, extra: &[&str]) {
        let child = Command::new(bin("kairos-agent"))
            .args(["--controllers", &self.addrs(), "--addr", "127.0.0.1:0", "--name", name])
            .args(["--gpu-backend", "fake", "--fake-gpus", &gpus.to_string()])
            .arg("--join-token-file")
            .arg(self.path("join.token"))
            .args(self.agent_flags_with_defaults())
            .args(extra)
            .arg("--state-dir")
            .arg(self.path(&format!("agent-{name}")))
            .stdin(Stdio::null())
            .stdout(self.log_file(&format!("agent-{name}.log")))
            .stderr(self.log_file(&format!("agent-{name}.log")))
            .spawn()
            .expect("start kairos-agent");
        self.more_agents.push(child);
        wait_for(&format!("node {name} to be up"), || {
            let out = self.kairos(&["nodes", "--json"]);
            let nodes: Value = serde_json::from_slice(&out.stdout).ok()?;
            nodes.as_array()?.iter().any(|n| n["name"] == name && n["state"] == "UP").then_some(())
        });
    }

    pub fn wait_node_up(&self) {
        wait_for("the node to be up", || {
            let out = self.kairos(&["nodes", "--json"]);
            let nodes: Value = serde_json::from_slice(&out.stdout).ok()?;
            (nodes[0]["state"] == "UP").then_some(())
        });
    }

    /// SIGKILL of one replica.
    pub fn kill_controller(&mut self, index: usize) {
        if let Some(mut c) = self.controllers[index].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// `cluster status --json` as one replica sees it (None if it does not answer).
    pub fn status_of(&self, index: usize) -> Option<Value> {
        let out = kairos_cmd()
            .args(["--controllers", &self.controllers[index].addr, "cluster", "status", "--json"])
            .env("KAIROS_TOKEN_FILE", self.token_file())
            .envs(self.cli_env.iter().map(|(k, v)| (k, v)))
            .output()
            .ok()?;
        serde_json::from_slice(&out.stdout).ok()
    }

    /// The index of the replica that leads, once one does (as the leader itself reports).
    pub fn leader(&self) -> usize {
        wait_for("a leader", || {
            (0..self.controllers.len()).find(|i| {
                self.controllers[*i].child.is_some()
                    && self.status_of(*i).is_some_and(|s| s["leader"] == self.controllers[*i].id)
            })
        })
    }

    /// A replica other than the leader, once it knows the leader (right after an election a
    /// follower may not have heard from it yet and answers "no leader is elected").
    pub fn follower(&self) -> usize {
        let leader = self.leader();
        let follower = (0..self.controllers.len()).find(|i| *i != leader).expect("a second replica");
        wait_for("the follower to know the leader", || {
            self.status_of(follower).is_some_and(|s| s["leader"] == self.controllers[leader].id).then_some(())
        });
        follower
    }

    /// Waits until every running replica reports the same applied index and state digest.
    pub fn wait_converged(&self) -> Value {
        // What each replica said last, for the failure message: a stall names itself (no
        // leader, a commit index that does not move, one replica far behind).
        let deadline = Instant::now() + WAIT;
        loop {
            let statuses: Vec<(usize, Option<Value>)> = (0..self.controllers.len())
                .filter(|i| self.controllers[*i].child.is_some())
                .map(|i| (i, self.status_of(i)))
                .collect();
            if let Some(all) = statuses.iter().map(|(_, s)| s.clone()).collect::<Option<Vec<Value>>>() {
                let first = &all[0];
                if all.iter().all(|s| {
                    s["applied_index"] == first["applied_index"] && s["state_digest"] == first["state_digest"]
                }) {
                    return first.clone();
                }
            }
            if Instant::now() >= deadline {
                let last: Vec<String> = statuses
                    .iter()
                    .map(|(i, s)| match s {
                        Some(s) => format!(
                            "replica {}: term {} leader {} last log {} commit {} applied {}",
                            i + 1,
                            s["term"],
                            s["leader"],
                            s["last_log_index"],
                            s["commit_index"],
                            s["applied_index"]
                        ),
                        None => format!("replica {}: no status ({})", i + 1, self.silent_replica(*i)),
                    })
                    .collect();
                panic!("timed out waiting for replicas to converge; last seen:\n{}", last.join("\n"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn kill_agent(&mut self) {
        if let Some(mut a) = self.agent.take() {
            let _ = a.kill();
            let _ = a.wait();
        }
    }

    /// The address of controller `index`.
    pub fn controller_addr(&self, index: usize) -> String {
        self.controllers[index].addr.clone()
    }

    /// Runs the CLI against one controller only.
    pub fn kairos_at(&self, addr: &str, args: &[&str]) -> Output {
        let mut cmd = kairos_cmd();
        cmd.current_dir(self.submit_dir());
        cmd.arg("--controllers").arg(addr).env("KAIROS_TOKEN_FILE", self.token_file());
        cmd.envs(self.cli_env.iter().map(|(k, v)| (k, v))).stdin(Stdio::null());
        cmd.args(args).output().expect("run kairos")
    }

    /// Runs the CLI against this cluster.
    pub fn kairos(&self, args: &[&str]) -> Output {
        self.cli().args(args).output().expect("run kairos")
    }

    /// Runs the CLI and returns its stdout, panicking with its stderr on failure.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.kairos(args);
        assert!(out.status.success(), "kairos {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).expect("utf-8 output")
    }

    pub fn submit(&self, args: &[&str]) -> u64 {
        let mut full = vec!["submit"];
        full.extend_from_slice(args);
        let out = self.ok(&full);
        out.trim().parse().unwrap_or_else(|_| panic!("submit printed {out:?}, not a job id"))
    }

    pub fn job(&self, id: u64) -> Value {
        serde_json::from_str(&self.ok(&["show", &id.to_string(), "--json"])).expect("job JSON")
    }

    pub fn jobs(&self) -> Vec<Value> {
        let v: Value = serde_json::from_str(&self.ok(&["queue", "--all", "--json"])).expect("queue JSON");
        v.as_array().cloned().unwrap_or_default()
    }

    /// The job, or None while the cluster cannot answer (e.g. during an election).
    pub fn try_job(&self, id: u64) -> Option<Value> {
        let out = self.kairos(&["show", &id.to_string(), "--json"]);
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }

    /// Waits until the job is in a terminal state and returns it.
    pub fn wait_done(&self, id: u64) -> Value {
        wait_for(&format!("job {id} to end"), || {
            let job = self.try_job(id)?;
            let state = job["state"].as_str().unwrap_or("").to_string();
            (!["PENDING", "RUNNING", "PREEMPTING", "SUSPENDED"].contains(&state.as_str())).then_some(job)
        })
    }

    pub fn wait_state(&self, id: u64, state: &str) -> Value {
        wait_for(&format!("job {id} to be {state}"), || {
            let job = self.try_job(id)?;
            (job["state"] == state).then_some(job)
        })
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // KAIROS_E2E_KEEP=DIR keeps a failed test's logs and data (copied before it is removed).
        if let (true, Some(keep)) = (std::thread::panicking(), std::env::var_os("KAIROS_E2E_KEEP")) {
            let name = self.dir.path().file_name().unwrap_or_default();
            let _ =
                Command::new("cp").arg("-a").arg(self.dir.path()).arg(Path::new(&keep).join(name)).status();
        }
        // The agents first: on SIGTERM they stop every job's process group.
        if let Some(mut a) = self.agent.take() {
            stop_child(&mut a);
        }
        for mut a in self.more_agents.drain(..) {
            stop_child(&mut a);
        }
        for c in &mut self.controllers {
            if let Some(mut child) = c.child.take() {
                stop_child(&mut child);
            }
        }
    }
}

/// Reads a pid a job wrote to a file.
pub fn read_pid(path: &Path) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// examples/train.sh, the training-like job that checkpoints and resumes.
pub fn train_script() -> String {
    format!("{}/../../examples/train.sh", env!("CARGO_MANIFEST_DIR"))
}

/// A training job (`--qos training` and `flags`) of `steps` steps checkpointing every 5
/// (examples/train.sh), its steps written to `out`.
pub fn submit_training(c: &Cluster, flags: &[&str], steps: u32, out: &Path) -> u64 {
    let (env_steps, env_out) = (format!("STEPS={steps}"), format!("OUT={}", out.display()));
    let script = train_script();
    let mut args = vec!["--qos", "training"];
    args.extend_from_slice(flags);
    args.extend(["--env", &env_steps, "--env", "CHECKPOINT_EVERY=5", "--env", &env_out, "--", "sh", &script]);
    c.submit(&args)
}

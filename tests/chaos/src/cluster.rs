//! A kairos cluster spread over separate hosts (network namespaces): controllers on hosts
//! 0..C, agents on the next A hosts, and one host left for clients. Every process is a real
//! `kairosd` / `kairos-agent` (taken from the build's target directory), with its data and
//! logs in a temporary directory.
//!
//! Every controller binds `:7002` of its host and is dialled (by peers, agents and clients) at
//! `:7001`, where a fault proxy (`proxy`) runs inside the same host: `links[i]` shapes every
//! connection *to* controller i — Raft included — with delay, reordering and breaks, which the
//! kernel here (no netem) cannot do.
//!
//! Process faults: `kill` (SIGKILL), `restart` (same command line, data intact), `pause`
//! (SIGSTOP) and `resume` (SIGCONT). Network faults are `Net`'s and the links'. Dropping the
//! cluster stops every process it started and anything left in its namespaces, stops the
//! proxies, then removes the namespaces.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use std::sync::Arc;

use crate::netns::{in_namespace, Net, NetError};
use crate::proxy::Faults;

/// Port every controller is dialled at (its host's fault proxy).
pub const CONTROLLER_PORT: u16 = 7001;
/// Port every controller binds (behind the proxy).
pub const CONTROLLER_BIND_PORT: u16 = 7002;
/// Port of every agent's log service.
pub const AGENT_PORT: u16 = 7101;
/// The bootstrap admin token of chaos clusters.
pub const ADMIN_TOKEN: &str = "kairos-admin.chaos-0123456789abcdef";

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error(transparent)]
    Net(#[from] NetError),
    #[error("{0}")]
    Io(String),
}

fn io(what: &str) -> impl Fn(std::io::Error) -> ClusterError + '_ {
    move |e| ClusterError::Io(format!("{what}: {e}"))
}

/// Builds (or finds up to date) the daemons this crate's tests start, in the profile of the
/// running test binary, so `cargo test -p kairos-chaos` alone tests the current code.
pub fn build_daemons() -> Result<(), ClusterError> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let exe = std::env::current_exe().map_err(io("locating the test binary"))?;
    let release = exe.ancestors().nth(2).is_some_and(|d| d.ends_with("release"));
    let mut cmd = Command::new(cargo);
    // The whole workspace, as scripts/test.sh builds it: the same features, so a no-op there.
    cmd.args(["build", "--workspace", "--bins"]);
    if release {
        cmd.arg("--release");
    }
    let status = cmd.status().map_err(io("running cargo build"))?;
    if status.success() {
        Ok(())
    } else {
        Err(ClusterError::Io(format!("cargo build of the daemons failed: {status}")))
    }
}

/// Where `cargo build --bins` put the daemons: beside the directory of this test binary.
pub fn daemon(name: &str) -> Result<PathBuf, ClusterError> {
    let exe = std::env::current_exe().map_err(io("locating the test binary"))?;
    let dir = exe.parent().and_then(Path::parent).map(Path::to_path_buf).unwrap_or_default();
    let path = dir.join(name);
    if path.exists() {
        Ok(path)
    } else {
        Err(ClusterError::Io(format!("{} is missing: run `cargo build --bins` first", path.display())))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Controller,
    Agent,
}

struct Proc {
    role: Role,
    host: usize,
    program: PathBuf,
    args: Vec<String>,
    log: PathBuf,
    child: Option<Child>,
}

/// Sizes of a chaos cluster.
#[derive(Clone, Copy, Debug)]
pub struct Topology {
    pub controllers: usize,
    pub agents: usize,
    pub gpus_per_agent: u32,
}

/// A fault proxy running on a thread inside a controller's host.
struct ProxyThread {
    stop: Arc<tokio::sync::Notify>,
    handle: Option<std::thread::JoinHandle<Result<(), String>>>,
}

pub struct ChaosCluster {
    procs: Vec<Proc>,
    proxies: Vec<ProxyThread>,
    /// The faults of the links into each controller (index = controller).
    pub links: Vec<Arc<Faults>>,
    pub net: Net,
    pub dir: tempfile::TempDir,
    pub topology: Topology,
}

impl ChaosCluster {
    /// Creates the hosts and starts every process (it does not wait for a leader).
    pub fn start(prefix: &str, topology: Topology) -> Result<ChaosCluster, ClusterError> {
        let hosts = topology.controllers + topology.agents + 1;
        let net = Net::create(prefix, hosts)?;
        let dir = tempfile::Builder::new().prefix("kairos-chaos-").tempdir().map_err(io("temp dir"))?;
        for (file, content) in [
            ("cluster.secret", "chaos-cluster-secret-0123456789abcdef0123456789"),
            ("admin.token", ADMIN_TOKEN),
            ("join.token", "kairos-join.chaos-0123456789abcdef"),
        ] {
            std::fs::write(dir.path().join(file), content).map_err(io("secret file"))?;
        }
        let mut c =
            ChaosCluster { procs: Vec::new(), proxies: Vec::new(), links: Vec::new(), net, dir, topology };
        for i in 0..topology.controllers {
            let faults = Arc::new(Faults::default());
            let (front, back) = (c.controller_addr(i), format!("{}:{CONTROLLER_BIND_PORT}", c.net.addr(i)));
            let stop = Arc::new(tokio::sync::Notify::new());
            let (f, s) = (faults.clone(), stop.clone());
            let (bound_tx, bound_rx) = std::sync::mpsc::channel();
            let handle = in_namespace(&c.net.host(i), move || {
                crate::workload::runtime().block_on(async move {
                    let listener = match tokio::net::TcpListener::bind(&front).await {
                        Ok(l) => l,
                        Err(e) => {
                            let _ = bound_tx.send(Err(format!("binding {front}: {e}")));
                            return;
                        }
                    };
                    let _ = bound_tx.send(Ok(()));
                    tokio::select! {
                        _ = crate::proxy::run(listener, back, f, i as u64) => {}
                        _ = s.notified() => {}
                    }
                })
            });
            let bound = bound_rx
                .recv_timeout(Duration::from_secs(10))
                .map_err(|_| ClusterError::Io("a proxy did not start".into()))?;
            bound.map_err(ClusterError::Io)?;
            c.proxies.push(ProxyThread { stop, handle: Some(handle) });
            c.links.push(faults);
        }
        let (kairosd, agent) = (daemon("kairosd")?, daemon("kairos-agent")?);
        let peers: Vec<String> =
            (0..topology.controllers).map(|i| format!("{}={}", i + 1, c.controller_addr(i))).collect();
        let path = |f: &str| c.dir.path().join(f).display().to_string();
        for i in 0..topology.controllers {
            let args = vec![
                "--id".to_string(),
                (i + 1).to_string(),
                "--addr".into(),
                c.controller_addr(i),
                "--listen".into(),
                format!("{}:{CONTROLLER_BIND_PORT}", c.net.addr(i)),
                "--peers".into(),
                peers.join(","),
                "--data-dir".into(),
                path(&format!("controller-{}", i + 1)),
                "--cluster-secret-file".into(),
                path("cluster.secret"),
                "--admin-token-file".into(),
                path("admin.token"),
                "--join-token-file".into(),
                path("join.token"),
                "--tick-ms".into(),
                "200".into(),
                "--heartbeat-ms".into(),
                "300".into(),
                "--node-timeout-ms".into(),
                "5000".into(),
                "--raft-heartbeat-ms".into(),
                "100".into(),
                "--election-timeout-ms".into(),
                "400".into(),
            ];
            c.procs.push(Proc {
                role: Role::Controller,
                host: i,
                program: kairosd.clone(),
                args,
                log: c.dir.path().join(format!("kairosd-{}.log", i + 1)),
                child: None,
            });
        }
        let controllers: Vec<String> = (0..topology.controllers).map(|i| c.controller_addr(i)).collect();
        for a in 0..topology.agents {
            let host = topology.controllers + a;
            let args = vec![
                "--controllers".to_string(),
                controllers.join(","),
                "--addr".into(),
                format!("{}:{AGENT_PORT}", c.net.addr(host)),
                "--name".into(),
                format!("node-{a}"),
                "--gpu-backend".into(),
                "fake".into(),
                "--fake-gpus".into(),
                topology.gpus_per_agent.to_string(),
                "--state-dir".into(),
                path(&format!("agent-{a}")),
                "--join-token-file".into(),
                path("join.token"),
                "--process-log".into(),
                path(&format!("agent-{a}.processes.jsonl")),
                "--run-as".into(),
                "agent".into(),
            ];
            c.procs.push(Proc {
                role: Role::Agent,
                host,
                program: agent.clone(),
                args,
                log: c.dir.path().join(format!("agent-{a}.log")),
                child: None,
            });
        }
        for i in 0..c.procs.len() {
            c.spawn(i)?;
        }
        Ok(c)
    }

    fn spawn(&mut self, i: usize) -> Result<(), ClusterError> {
        let p = &self.procs[i];
        let log =
            std::fs::OpenOptions::new().create(true).append(true).open(&p.log).map_err(io("log file"))?;
        let err = log.try_clone().map_err(io("log file"))?;
        // nsenter enters the host's network namespace and execs the program: the child is the
        // daemon. (Not `ip netns exec`: it remounts /sys, which hides the cgroup hierarchy the
        // agent gives each run a cgroup in.)
        let child = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", self.net.host(p.host)))
            .arg("--")
            .arg(&p.program)
            .args(&p.args)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .map_err(io("starting a daemon"))?;
        self.procs[i].child = Some(child);
        Ok(())
    }

    pub fn controller_addr(&self, i: usize) -> String {
        format!("{}:{CONTROLLER_PORT}", self.net.addr(i))
    }

    pub fn controller_addrs(&self) -> Vec<String> {
        (0..self.topology.controllers).map(|i| self.controller_addr(i)).collect()
    }

    /// The host left for clients.
    pub fn client_host(&self) -> usize {
        self.topology.controllers + self.topology.agents
    }

    /// Process index of controller `i` / agent `a`.
    pub fn controller(&self, i: usize) -> usize {
        i
    }

    pub fn agent(&self, a: usize) -> usize {
        self.topology.controllers + a
    }

    /// The host process `i` runs on.
    pub fn host_of(&self, i: usize) -> usize {
        self.procs[i].host
    }

    pub fn role(&self, i: usize) -> Role {
        self.procs[i].role
    }

    fn signal(&self, i: usize, sig: i32) {
        if let Some(c) = &self.procs[i].child {
            // SAFETY: kill(2) on a pid this harness started; no memory is involved.
            unsafe {
                libc::kill(c.id() as i32, sig);
            }
        }
    }

    /// SIGKILL of process `i` (it stays down until `restart`).
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.procs[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts process `i` again with the same command line (its data and state intact).
    pub fn restart(&mut self, i: usize) -> Result<(), ClusterError> {
        self.kill(i);
        self.spawn(i)
    }

    /// SIGSTOP: the process freezes with its sockets open (a paused VM, a GC pause).
    pub fn pause(&self, i: usize) {
        self.signal(i, libc::SIGSTOP);
    }

    pub fn resume(&self, i: usize) {
        self.signal(i, libc::SIGCONT);
    }

    /// The agents' process logs, concatenated.
    pub fn process_logs(&self) -> String {
        (0..self.topology.agents)
            .map(|a| {
                std::fs::read_to_string(self.dir.path().join(format!("agent-{a}.processes.jsonl")))
                    .unwrap_or_default()
            })
            .collect()
    }

    /// Stops the agents gracefully (their runs end and are logged), then everything else.
    pub fn stop(&mut self) {
        for i in 0..self.procs.len() {
            if self.procs[i].role == Role::Agent {
                self.resume(i);
                self.signal(i, libc::SIGTERM);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        for p in self.procs.iter_mut().filter(|p| p.role == Role::Agent) {
            while let Some(c) = p.child.as_mut() {
                if !matches!(c.try_wait(), Ok(None)) || Instant::now() >= deadline {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        for i in 0..self.procs.len() {
            self.resume(i);
            self.kill(i);
        }
        for p in &mut self.proxies {
            p.stop.notify_one();
            if let Some(h) = p.handle.take() {
                let _ = h.join();
            }
        }
        // Whatever a killed agent left behind in its namespace.
        for h in 0..self.net.hosts() {
            let out = Command::new("ip").args(["netns", "pids", &self.net.host(h)]).output();
            let pids = out.map(|o| String::from_utf8_lossy(&o.stdout).to_string()).unwrap_or_default();
            for pid in pids.split_whitespace().filter_map(|p| p.parse::<i32>().ok()) {
                // SAFETY: kill(2) of a process inside a namespace this harness created.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
            }
        }
    }
}

impl Drop for ChaosCluster {
    fn drop(&mut self) {
        self.stop();
    }
}

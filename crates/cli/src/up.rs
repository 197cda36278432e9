//! `kairos up`: a local cluster in the foreground — one controller and one agent (fake GPUs
//! unless NVML finds real ones), data under `./kairos-data`. Ctrl-C or SIGTERM stops both; the
//! agent stops every job's process group before it exits, so nothing is left behind.
//!
//! A controller that dies is started again (after a pause that grows while it keeps dying
//! young): its state is in its log, and the agent keeps its runs under its lease meanwhile (the
//! lease is half the node timeout, 10 s by default), so running jobs outlive the crash. A
//! controller that keeps dying within `STABLE` of its start stops the cluster, as does the
//! agent's end.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

pub struct UpArgs {
    /// One address per controller replica.
    pub controllers: Vec<String>,
    pub agent_addr: String,
    pub data_dir: PathBuf,
    pub fake_gpus: String,
    pub node_name: String,
    /// The agent's `--fake-gpu-usage` file.
    pub fake_gpu_usage: Option<PathBuf>,
    /// The agent's `--run-as`.
    pub run_as: String,
    /// The agent's `--cpus` and `--memory` (MiB): the capacity it offers jobs, in place of the
    /// host's (enforcement stays clamped to the host's cores).
    pub cpus: Option<u32>,
    pub memory_mib: Option<u64>,
}

/// Finds a sibling binary of this executable (they are built together), else relies on PATH.
fn sibling(name: &str) -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join(name)))
        .filter(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from(name))
}

fn spawn(program: &Path, args: &[String]) -> anyhow::Result<Child> {
    let mut cmd = Command::new(program);
    cmd.args(args).stdin(Stdio::null());
    // SAFETY: prctl is async-signal-safe; this only asks the kernel to SIGTERM the child if
    // `kairos up` itself dies, so a killed `up` leaves no daemons behind.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn().with_context(|| format!("starting {}", program.display()))
}

fn stop(children: &mut [Daemon]) {
    for child in children.iter().filter_map(|d| d.child.as_ref()) {
        let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    for d in children.iter_mut() {
        let Some(child) = d.child.as_mut() else { continue };
        let name = &d.label;
        loop {
            match child.try_wait() {
                Ok(Some(_)) | Err(_) => break,
                Ok(None) if Instant::now() >= deadline => {
                    eprintln!("kairos: {name} did not stop in time; killing it");
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }
}

/// Creates `path` (owner-only) holding `prefix` and a fresh random secret, unless it exists.
fn ensure_secret(path: &Path, prefix: &str) -> anyhow::Result<()> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| anyhow::anyhow!("no random source: {e}"))?;
    kairos_proto::wire::write_private_new(path, &format!("{prefix}{}", hex::encode(bytes)))?;
    Ok(())
}

/// Adds this cluster to the CLI's contexts under a name of its own and makes it current
/// (`context::Config::add_local`): no other context, and no token file, is changed. Returns
/// the context's name, or why there is none (the cluster runs anyway).
fn add_context(controllers: &[String], admin_token: &Path) -> Result<String, String> {
    let token_file =
        std::path::absolute(admin_token).map_err(|e| format!("{}: {e}", admin_token.display()))?;
    let mut config = crate::context::Config::load().map_err(|e| e.to_string())?;
    let ctx = crate::context::Context {
        controllers: controllers.to_vec(),
        token_file: Some(token_file),
        ..Default::default()
    };
    let name = config.add_local(ctx);
    config.save().map_err(|e| e.to_string())?;
    Ok(name)
}

/// Every address must be free now: a replica that cannot bind would leave a cluster that
/// never elects a leader.
fn check_free(args: &UpArgs) -> anyhow::Result<()> {
    let mut wanted: Vec<String> = args.controllers.clone();
    wanted.push(args.agent_addr.clone());
    for a in args.controllers.iter().chain([&args.agent_addr]) {
        wanted.push(metrics_addr(a)?);
    }
    for a in &args.controllers {
        wanted.push(http_addr(a)?);
    }
    for a in &wanted {
        if let Err(e) = std::net::TcpListener::bind(a.as_str()) {
            bail!(
                "{a} cannot be used ({e}); stop what holds it or choose other ports (--addr, --agent-addr)"
            );
        }
    }
    Ok(())
}

fn data(args: &UpArgs, sub: &str) -> String {
    args.data_dir.join(sub).display().to_string()
}

/// The command line of controller `i` (id `i + 1`) at `addr`.
fn controller_argv(args: &UpArgs, i: usize, addr: &str, peers: &[String]) -> Vec<String> {
    let id = (i + 1).to_string();
    let dir = data(args, &format!("controller-{id}"));
    let mut argv = vec!["--id".to_string(), id, "--addr".into(), addr.to_string(), "--data-dir".into(), dir];
    argv.extend([
        "--cluster-secret-file".to_string(),
        data(args, "cluster.secret"),
        "--admin-token-file".into(),
        data(args, "admin.token"),
        "--join-token-file".into(),
        data(args, "join.token"),
    ]);
    if args.controllers.len() > 1 {
        argv.extend(["--peers".to_string(), peers.join(",")]);
    }
    argv
}

/// The agent's command line.
fn agent_argv(args: &UpArgs, metrics: String) -> Vec<String> {
    let mut argv = vec![
        "--metrics-addr".into(),
        metrics,
        "--controllers".into(),
        args.controllers.join(","),
        "--addr".into(),
        args.agent_addr.clone(),
        "--state-dir".into(),
        data(args, "agent"),
        "--name".into(),
        args.node_name.clone(),
        "--fake-gpus".into(),
        args.fake_gpus.clone(),
        "--join-token-file".into(),
        data(args, "join.token"),
        "--run-as".into(),
        args.run_as.clone(),
    ];
    if let Some(file) = &args.fake_gpu_usage {
        // Absolute: the agent runs in its own directory.
        let file = std::path::absolute(file).unwrap_or_else(|_| file.clone());
        argv.extend(["--fake-gpu-usage".to_string(), file.display().to_string()]);
    }
    if let Some(cpus) = args.cpus {
        argv.extend(["--cpus".to_string(), cpus.to_string()]);
    }
    if let Some(mib) = args.memory_mib {
        argv.extend(["--memory".to_string(), mib.to_string()]);
    }
    argv
}

/// Says what runs where, the context to use it by, and what to try.
fn announce(args: &UpArgs, metrics: &[String], web: &[String]) {
    println!(
        "kairos up: controllers {} (data under {}), agent \"{}\" (log service {})",
        args.controllers.join(","),
        args.data_dir.display(),
        args.node_name,
        args.agent_addr
    );
    println!("kairos up: Prometheus metrics at {}", metrics.join(", "));
    println!(
        "kairos up: web UI and JSON API at {} (log in with a token, e.g. the admin token below)",
        web.join(", ")
    );
    match add_context(&args.controllers, &args.data_dir.join("admin.token")) {
        Ok(name) => println!(
            "kairos up: context \"{name}\" (current; admin token {}); `kairos context list` shows the others",
            data(args, "admin.token")
        ),
        Err(why) => println!(
            "kairos up: no context ({why}); export KAIROS_CONTROLLERS={} KAIROS_TOKEN_FILE={}",
            args.controllers.join(","),
            data(args, "admin.token")
        ),
    }
    println!(
        "kairos up: try `kairos submit --gpus 2 -- sh -c 'echo $CUDA_VISIBLE_DEVICES'`, `kairos queue`; Ctrl-C stops the cluster"
    );
}

/// A controller that ran at least this long before it died is restarted at once (after
/// `RESTART_FIRST`); one that dies younger waits twice as long each time.
const STABLE: Duration = Duration::from_secs(30);
/// The pause before the first restart of a controller.
const RESTART_FIRST: Duration = Duration::from_millis(500);
/// The longest pause between restarts (well within the agent's lease of 10 s, so the first
/// few restarts keep the running jobs).
const RESTART_MAX: Duration = Duration::from_secs(8);
/// Deaths in a row, each within `STABLE` of its start, after which the cluster is stopped.
const YOUNG_DEATHS_MAX: u32 = 5;

/// One daemon of the local cluster: how to start it again, and its process while it runs.
struct Daemon {
    /// `kairosd 1` or `kairos-agent`, for messages.
    label: String,
    program: PathBuf,
    argv: Vec<String>,
    child: Option<Child>,
    started: Instant,
    /// Controllers are started again when they die; the agent's end stops the cluster.
    restart: bool,
    /// Deaths in a row within `STABLE` of the start.
    young_deaths: u32,
    /// When it is to be started again (it is dead meanwhile).
    restart_at: Option<Instant>,
}

impl Daemon {
    fn start(name: &'static str, label: String, argv: Vec<String>, restart: bool) -> anyhow::Result<Daemon> {
        let program = sibling(name);
        let child = spawn(&program, &argv)?;
        let started = Instant::now();
        Ok(Daemon {
            label,
            program,
            argv,
            child: Some(child),
            started,
            restart,
            young_deaths: 0,
            restart_at: None,
        })
    }
}

/// The pause before restarting a controller that died for the `young`-th time in a row
/// within `STABLE` of its start (0: it had run longer): `RESTART_FIRST`, doubling, at most
/// `RESTART_MAX`.
fn restart_pause(young: u32) -> Duration {
    RESTART_FIRST.saturating_mul(1 << young.saturating_sub(1).min(8)).min(RESTART_MAX)
}

/// Watches the daemons: a controller that dies is reported and started again after a pause
/// (`restart_pause`); returns why the cluster must stop — the agent is gone, or a controller
/// keeps dying young (or cannot be started again).
///
/// Runs on the main thread (in `run`'s own future, not a spawned task): a daemon started here
/// gets SIGTERM when the thread that started it ends (`PR_SET_PDEATHSIG`), so the thread must
/// be the one that lives as long as `kairos up`.
async fn supervise(children: &mut [Daemon]) -> String {
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = Instant::now();
        for d in children.iter_mut() {
            if let Some(child) = d.child.as_mut() {
                let Ok(Some(status)) = child.try_wait() else { continue };
                let pid = child.id();
                d.child = None;
                if !d.restart {
                    eprintln!("kairos up: {} (pid {pid}) exited: {status}", d.label);
                    return format!("{} exited unexpectedly", d.label);
                }
                d.young_deaths = if now.duration_since(d.started) < STABLE { d.young_deaths + 1 } else { 1 };
                if d.young_deaths > YOUNG_DEATHS_MAX {
                    eprintln!("kairos up: {} (pid {pid}) exited: {status}", d.label);
                    return format!(
                        "{} exited {} times in a row within {} s of its start",
                        d.label,
                        d.young_deaths,
                        STABLE.as_secs()
                    );
                }
                let pause = restart_pause(d.young_deaths);
                eprintln!(
                    "kairos up: {} (pid {pid}) exited: {status}; starting it again in {:.1} s (running jobs keep running meanwhile)",
                    d.label,
                    pause.as_secs_f64()
                );
                d.restart_at = Some(now + pause);
            } else if d.restart_at.is_some_and(|at| now >= at) {
                d.restart_at = None;
                match spawn(&d.program, &d.argv) {
                    Ok(child) => {
                        eprintln!("kairos up: {} started again (pid {})", d.label, child.id());
                        d.child = Some(child);
                        d.started = Instant::now();
                    }
                    Err(e) => return format!("{} could not be started again: {e:#}", d.label),
                }
            }
        }
    }
}

pub async fn run(args: UpArgs) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("listening for SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("listening for SIGINT")?;
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("creating {}", args.data_dir.display()))?;
    // One secret and two tokens for the whole local cluster, kept across restarts.
    ensure_secret(&args.data_dir.join("cluster.secret"), "")?;
    ensure_secret(&args.data_dir.join("admin.token"), "kairos-admin.")?;
    ensure_secret(&args.data_dir.join("join.token"), "kairos-join.")?;

    check_free(&args)?;
    let peers: Vec<String> =
        args.controllers.iter().enumerate().map(|(i, a)| format!("{}={a}", i + 1)).collect();
    let mut metrics = Vec::new();
    let mut web = Vec::new();
    let mut children: Vec<Daemon> = Vec::new();
    for (i, addr) in args.controllers.iter().enumerate() {
        let mut argv = controller_argv(&args, i, addr, &peers);
        let at = metrics_addr(addr)?;
        argv.extend(["--metrics-addr".to_string(), at.clone()]);
        metrics.push(format!("http://{at}/metrics (kairosd {})", i + 1));
        let http = http_addr(addr)?;
        argv.extend(["--http-addr".to_string(), http.clone()]);
        web.push(format!("http://{http}/"));
        match Daemon::start("kairosd", format!("kairosd {}", i + 1), argv, true) {
            Ok(d) => children.push(d),
            Err(e) => {
                stop(&mut children);
                return Err(e);
            }
        }
    }
    let agent_metrics = metrics_addr(&args.agent_addr)?;
    metrics.push(format!("http://{agent_metrics}/metrics (agent)"));
    let agent = Daemon::start("kairos-agent", "kairos-agent".into(), agent_argv(&args, agent_metrics), false);
    match agent {
        Ok(a) => children.push(a),
        Err(e) => {
            stop(&mut children);
            return Err(e);
        }
    }
    announce(&args, &metrics, &web);

    // A controller that dies is started again; the cluster stops when the agent is gone or a
    // controller keeps dying young.
    let exited = tokio::select! {
        _ = term.recv() => None,
        _ = int.recv() => None,
        why = supervise(&mut children) => Some(why),
    };
    println!("kairos up: stopping");
    stop(&mut children);
    if let Some(why) = exited {
        bail!("{why}; the cluster was stopped");
    }
    Ok(())
}

/// Where a daemon of `kairos up` serves its metrics: its own address, port + 2000 (7001 → 9001).
fn metrics_addr(addr: &str) -> anyhow::Result<String> {
    beside(addr, 2000, "metrics")
}

/// Where a controller of `kairos up` serves the web UI and JSON API: port + 1000 (7001 → 8001).
fn http_addr(addr: &str) -> anyhow::Result<String> {
    beside(addr, 1000, "web UI")
}

fn beside(addr: &str, offset: u16, what: &str) -> anyhow::Result<String> {
    let a: std::net::SocketAddr = addr.parse().map_err(|_| anyhow::anyhow!("\"{addr}\" is not HOST:PORT"))?;
    let port =
        a.port().checked_add(offset).ok_or_else(|| anyhow::anyhow!("{addr}: no room for a {what} port"))?;
    Ok(std::net::SocketAddr::new(a.ip(), port).to_string())
}

/// The CLI's default controller address (`--controllers`).
pub const DEFAULT_CONTROLLER: &str = "127.0.0.1:7001";

/// `kairos up --controllers`: a replica count (consecutive ports from `base`) or addresses.
pub fn up_controllers(controllers: &[String], base: &str) -> anyhow::Result<Vec<String>> {
    let default = controllers.len() == 1 && controllers[0] == DEFAULT_CONTROLLER;
    let count = match controllers {
        _ if default => 1,
        [n] if n.chars().all(|c| c.is_ascii_digit()) => n.parse::<u16>().unwrap_or(0),
        addrs => return Ok(addrs.to_vec()),
    };
    if !(1..=7).contains(&count) {
        anyhow::bail!("--controllers: a local cluster has 1 to 7 replicas");
    }
    let base: std::net::SocketAddr =
        base.parse().map_err(|_| anyhow::anyhow!("--addr \"{base}\" is not HOST:PORT"))?;
    (0..count)
        .map(|i| {
            let port =
                base.port().checked_add(i).ok_or_else(|| anyhow::anyhow!("--addr: port out of range"))?;
            Ok(std::net::SocketAddr::new(base.ip(), port).to_string())
        })
        .collect()
}

//! `kairos up`: a local cluster in the foreground — one controller and one agent (fake GPUs
//! unless NVML finds real ones), data under `./kairos-data`. Ctrl-C or SIGTERM stops both; the
//! agent stops every job's process group before it exits, so nothing is left behind.

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
    /// The agent's `--run-as`.
    pub run_as: String,
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

fn stop(children: &mut [(&str, Child)]) {
    for (_, child) in children.iter() {
        let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    for (name, child) in children.iter_mut() {
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
    vec![
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
    ]
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

/// Watches the daemons: a replica that dies is reported and the rest keep running (that is
/// what HA is for); returns once the agent or every replica is gone.
async fn watch_children(children: &mut [(&'static str, std::process::Child)]) -> &'static str {
    let mut reported = vec![false; children.len()];
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        for (i, (name, child)) in children.iter_mut().enumerate() {
            if !reported[i] {
                if let Ok(Some(status)) = child.try_wait() {
                    eprintln!("kairos up: {name} (pid {}) exited: {status}", child.id());
                    reported[i] = true;
                }
            }
        }
        let agent_gone = children.iter().zip(&reported).any(|((n, _), r)| *r && *n == "kairos-agent");
        let controllers_gone = children.iter().zip(&reported).all(|((n, _), r)| *r || *n != "kairosd");
        if agent_gone {
            return "kairos-agent";
        }
        if controllers_gone {
            return "every kairosd";
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
    let mut children = Vec::new();
    for (i, addr) in args.controllers.iter().enumerate() {
        let mut argv = controller_argv(&args, i, addr, &peers);
        let at = metrics_addr(addr)?;
        argv.extend(["--metrics-addr".to_string(), at.clone()]);
        metrics.push(format!("http://{at}/metrics (kairosd {})", i + 1));
        let http = http_addr(addr)?;
        argv.extend(["--http-addr".to_string(), http.clone()]);
        web.push(format!("http://{http}/"));
        match spawn(&sibling("kairosd"), &argv) {
            Ok(c) => children.push(("kairosd", c)),
            Err(e) => {
                stop(&mut children);
                return Err(e);
            }
        }
    }
    let agent_metrics = metrics_addr(&args.agent_addr)?;
    metrics.push(format!("http://{agent_metrics}/metrics (agent)"));
    let agent = spawn(&sibling("kairos-agent"), &agent_argv(&args, agent_metrics));
    match agent {
        Ok(a) => children.push(("kairos-agent", a)),
        Err(e) => {
            stop(&mut children);
            return Err(e);
        }
    }
    announce(&args, &metrics, &web);

    // A replica that dies is reported and the rest keep running (that is what HA is for); the
    // cluster stops when the agent or every replica is gone.
    let exited = tokio::select! {
        _ = term.recv() => None,
        _ = int.recv() => None,
        gone = watch_children(&mut children) => Some(gone),
    };
    println!("kairos up: stopping");
    stop(&mut children);
    if let Some(name) = exited {
        bail!("{name} exited unexpectedly; the cluster was stopped");
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

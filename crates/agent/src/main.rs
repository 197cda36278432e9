//! kairos-agent: registers this node with the controllers, heartbeats, follows its assignment
//! stream and runs jobs. Reconnects (to any listed controller, following leader hints) for as
//! long as it lives; on SIGTERM/SIGINT it stops every job's process group before exiting.

mod health_tasks;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Parser, ValueEnum};
use kairos_agent::account::{RunAs, UnixAccounts};
use kairos_agent::cgroup::Cgroups;
use kairos_agent::fence;
use kairos_agent::gpu::{FakeInventory, GpuInventory, NvmlInventory};
use kairos_agent::logs::Logs;
use kairos_agent::runner::Runner;
use kairos_agent::session::{self, ClientRx, Controllers, Credentials, KeptUp, Node, Session, TakeOver};
use kairos_proto::v1 as pb;
use kairos_proto::v1::agent_log_service_server::AgentLogServiceServer;
use tokio::sync::{mpsc, watch};

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Backend {
    /// NVML when the NVIDIA library loads, else fake GPUs.
    Auto,
    Nvml,
    Fake,
}

#[derive(Parser, Debug)]
#[command(name = "kairos-agent", version, about = "kairos node agent")]
struct Args {
    /// Controller addresses, HOST:PORT[,HOST:PORT...].
    #[arg(long, env = "KAIROS_CONTROLLERS", default_value = "127.0.0.1:7001", value_delimiter = ',')]
    controllers: Vec<String>,
    /// This node's name (default: the host name).
    #[arg(long)]
    name: Option<String>,
    /// Address of this agent's log service; the controller connects here for `kairos logs`.
    #[arg(long, default_value = "127.0.0.1:7101")]
    addr: String,
    /// Where job logs and working directories live.
    #[arg(long, default_value = "kairos-data/agent")]
    state_dir: PathBuf,
    #[arg(long, value_enum, default_value_t = Backend::Auto)]
    gpu_backend: Backend,
    /// Fake GPUs: COUNT or COUNTxMODEL, e.g. 8 or 8xH100.
    #[arg(long, default_value = "8")]
    fake_gpus: String,
    #[arg(long, default_value = "H100")]
    fake_gpu_model: String,
    #[arg(long, default_value_t = 81920)]
    fake_gpu_memory_mib: u64,
    /// Fake GPUs: present every GPU in MIG mode as COUNT instances of PROFILE, e.g. 7x1g.18gb
    /// (each scheduled as a GPU whose model is "MODEL MIG PROFILE").
    #[arg(long, value_name = "COUNTxPROFILE")]
    fake_mig: Option<String>,
    /// Fake GPUs: their NVLink islands as ranges of indices, e.g. 0-3,4-7 (default: groups of
    /// four). A multi-GPU job gets GPUs of one island when one has room.
    #[arg(long, value_name = "RANGES")]
    fake_gpu_topology: Option<String>,
    /// Fake GPUs: a file faults are injected through at run time, one per line appended:
    /// `GPU XID` (e.g. `3 79`), `GPU ecc`, `GPU pending` or `GPU lost`.
    #[arg(long, value_name = "FILE")]
    fake_gpu_faults: Option<PathBuf>,
    /// Fake GPUs: what they are doing, from this file (re-read when it changes): lines
    /// `GPU UTIL MEM_MIB` (GPU: the index offered, a MIG instance's own; UTIL in percent).
    /// Without it fake GPUs read idle.
    #[arg(long, value_name = "FILE")]
    fake_gpu_usage: Option<PathBuf>,
    /// How often each run's GPUs (utilisation, memory) and cgroup (CPU, memory) are sampled:
    /// its job's efficiency figures, `kairos top` and the idle GPU watch come from these.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_usage_interval)]
    usage_interval: Duration,
    /// Critical XIDs that do not make a GPU unhealthy (the application's errors), comma-separated.
    #[arg(long, value_name = "XIDS", default_value = "13,31,43,45,68,109")]
    gpu_ignored_xids: String,
    /// Run this program every --health-check-interval (like Slurm's HealthCheckProgram, e.g.
    /// NHC or `dcgmi diag -r 1`): a non-zero exit drains the node with the program's first
    /// output line as the reason; a later zero exit ends that drain.
    #[arg(long, value_name = "PATH")]
    health_check_program: Option<PathBuf>,
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = parse_interval)]
    health_check_interval: Duration,
    /// What a failed health check does besides draining: `drain` (runs go on) or `requeue`
    /// (runs are stopped with the checkpoint signal and requeued).
    #[arg(long, value_enum, default_value_t = HealthAction::Drain)]
    health_check_action: HealthAction,
    /// Node labels for partition selectors, KEY=VALUE (repeatable), e.g. rack=r2.
    #[arg(long = "label", value_parser = parse_label)]
    labels: Vec<(String, String)>,
    /// On a spot instance: the instance metadata service (IMDSv2) to watch for an interruption
    /// notice, e.g. http://169.254.169.254. A notice drains this node (jobs checkpoint, requeue).
    #[arg(long)]
    spot_imds: Option<String>,
    /// How often the spot notice is polled (ms).
    #[arg(long, default_value_t = 2000)]
    spot_poll_ms: u64,
    /// The cluster's join token (a file; the controller's <data-dir>/join.token by default there).
    #[arg(long, env = "KAIROS_JOIN_TOKEN_FILE")]
    join_token_file: Option<PathBuf>,
    #[command(flatten)]
    tls: kairos_proto::wire::TlsFiles,
    /// Append one JSON line per job process start and exit (job, attempt, GPUs, pid, time) here.
    #[arg(long)]
    process_log: Option<PathBuf>,
    /// Whom runs execute as: `submitter` (the Unix account of the job's user; needs root) or
    /// `agent` (this agent's user). Default: `submitter` when the agent runs as root.
    #[arg(long, value_enum)]
    run_as: Option<RunAs>,
    /// With `--run-as submitter`: a file mapping kairos users to Unix accounts, one
    /// `KAIROS_USER = UNIX_ACCOUNT` per line; unnamed users run as the account of their name.
    #[arg(long)]
    user_map: Option<PathBuf>,
    /// With `--run-as submitter`: the lowest uid a kairos user runs as by its name alone;
    /// system accounts below it (`sync`, `daemon`, …) only when the user map names them.
    #[arg(long, default_value_t = kairos_agent::account::MIN_UID_DEFAULT)]
    min_uid: u32,
    /// CPUs this node offers jobs (default: the host's cores), before --reserved-cpus.
    #[arg(long)]
    cpus: Option<u32>,
    /// Memory this node offers jobs, e.g. 64G (default: the host's MemTotal), before
    /// --reserved-memory.
    #[arg(long, value_parser = parse_size)]
    memory: Option<u64>,
    /// CPUs kept for the system and the agent (Slurm's CoreSpecCount): never granted to jobs;
    /// the highest-numbered cores.
    #[arg(long, default_value_t = 0)]
    reserved_cpus: u32,
    /// Memory kept for the system and the agent (Slurm's MemSpecLimit), e.g. 2G.
    #[arg(long, value_parser = parse_size, default_value = "0")]
    reserved_memory: u64,
    /// Most processes and threads one run may have (its cgroup's pids.max; 0: no limit).
    #[arg(long, default_value_t = 32768)]
    run_pids_max: u64,
    /// The cgroup v2 directory under which runs get their cgroups (default: the cgroup2 mount).
    #[arg(long)]
    cgroup_root: Option<PathBuf>,
    /// Cap on one run's log file (bytes); past it the log is truncated with a marker and the
    /// job goes on.
    #[arg(long, default_value_t = kairos_agent::isolation::LOG_MAX_BYTES_DEFAULT)]
    log_max_bytes: u64,
    /// Job directories (logs, checkpoints) of jobs this node no longer runs are removed after
    /// this many hours without a change.
    #[arg(long, default_value_t = 168)]
    job_dir_retention_hours: u64,
    /// How container jobs run: `builtin` (the agent enters the image itself, as enroot does for
    /// pyxis: no daemon or runtime process between it and the job; docs/containers.md), or
    /// `none` (this node refuses container jobs: their runs fail saying so).
    #[arg(long, value_enum, default_value_t = ContainerRuntime::Builtin)]
    container_runtime: ContainerRuntime,
    /// Where Container Device Interface specs are read from (`nvidia-ctk cdi generate`): what a
    /// container's GPUs need in it (device nodes, driver libraries); without a spec of kind
    /// nvidia.com/gpu, a container gets its GPUs' /dev/nvidia* nodes.
    #[arg(long, value_delimiter = ',', default_value = "/etc/cdi,/var/run/cdi")]
    cdi_spec_dirs: Vec<PathBuf>,
    /// Where container images are cached, unpacked (default: <state-dir>/images).
    #[arg(long)]
    image_cache: Option<PathBuf>,
    /// The image cache's bound (e.g. 50G): past it the least recently used images no run
    /// holds are removed.
    #[arg(long, value_parser = parse_size, default_value = "50G")]
    image_cache_max: u64,
    /// Read flags from this TOML file: keys are the long flags with underscores (data_dir = "…"),
    /// values as on the command line; a flag given on the command line wins.
    #[arg(long, value_name = "FILE.toml")]
    config: Option<PathBuf>,
    /// The address controllers reach this agent's log service at, when it differs from --addr
    /// (e.g. --addr 0.0.0.0:7101 --advertise-addr 10.0.0.5:7101).
    #[arg(long, value_name = "HOST:PORT")]
    advertise_addr: Option<String>,
    /// Serve Prometheus metrics at http://HOST:PORT/metrics.
    #[arg(long, value_name = "HOST:PORT")]
    metrics_addr: Option<String>,
    /// Keep dcgm-exporter's HPC job mapping here: a file per GPU index naming the jobs on it
    /// (point dcgm-exporter's --hpc-job-mapping-dir at the same directory).
    #[arg(long, value_name = "DIR")]
    hpc_job_mapping_dir: Option<PathBuf>,
    /// Log lines as text (colours only on a terminal) or as JSON objects.
    #[arg(long, value_enum, default_value_t = kairos_telemetry::logs::LogFormat::Text)]
    log_format: kairos_telemetry::logs::LogFormat,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum HealthAction {
    Drain,
    Requeue,
}

fn parse_interval(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("\"{s}\": {e} (e.g. 30s, 5m)"))?;
    if d < Duration::from_millis(100) {
        return Err(format!("\"{s}\" is shorter than 100ms"));
    }
    Ok(d)
}

fn parse_usage_interval(s: &str) -> Result<Duration, String> {
    let d = parse_interval(s)?;
    if d > Duration::from_secs(3600) {
        return Err(format!("\"{s}\" is longer than 1h"));
    }
    Ok(d)
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("\"{s}\" is not KEY=VALUE")),
    }
}

fn host_name() -> String {
    nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok()).unwrap_or_else(|| "node".into())
}

fn inventory(args: &Args, name: &str) -> anyhow::Result<Box<dyn GpuInventory>> {
    let fake = || -> anyhow::Result<Box<dyn GpuInventory>> {
        let mut inv =
            FakeInventory::parse(name, &args.fake_gpus, &args.fake_gpu_model, args.fake_gpu_memory_mib)?;
        inv.faults = args.fake_gpu_faults.clone();
        inv.link_groups = args
            .fake_gpu_topology
            .as_deref()
            .map(|t| kairos_agent::gpu::parse_fake_topology(t, inv.count))
            .transpose()?;
        inv.mig = args.fake_mig.as_deref().map(kairos_agent::gpu::FakeMig::parse).transpose()?;
        inv.usage = args.fake_gpu_usage.clone().map(kairos_agent::fake_usage::FakeUsageFile::new);
        Ok(Box::new(inv))
    };
    match args.gpu_backend {
        Backend::Fake => fake(),
        Backend::Nvml => Ok(Box::new(NvmlInventory::open()?)),
        Backend::Auto => match NvmlInventory::open() {
            Ok(nvml) => {
                tracing::info!(driver = ?nvml.driver_version(), "using NVML");
                Ok(Box::new(nvml))
            }
            Err(e) => {
                tracing::info!(reason = %e, fake = %args.fake_gpus, "NVML not available; using fake GPUs");
                fake()
            }
        },
    }
}

/// Waits for a spot interruption notice, then asks the controllers (until one accepts) to
/// drain this node.
async fn watch_spot(
    imds: kairos_agent::spot::Imds,
    every: Duration,
    node: String,
    creds: Credentials,
    mut client_rx: ClientRx,
) {
    let notice = kairos_agent::spot::wait_for_notice(&imds, every).await;
    tracing::warn!(%notice, "spot interruption notice; draining this node");
    let reason = format!("spot interruption notice {notice}");
    loop {
        let client = client_rx.borrow_and_update().clone();
        if let Some(mut c) = client {
            let req = creds.request(pb::DrainRequest {
                node_id: node.clone(),
                reason: reason.clone(),
                ..Default::default()
            });
            match c.drain(req).await {
                Ok(_) => return,
                Err(s) => tracing::warn!(status = %s, "drain request not taken; retrying"),
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The GPU health watcher (its faults delivered to the controllers) and the health-check
/// program, when one is configured.
fn watch_health(
    args: &Args,
    inv: &dyn GpuInventory,
    xids: kairos_agent::health::XidPolicy,
    node: &pb::NodeInfo,
    creds: &Credentials,
    client_rx: &ClientRx,
) -> Vec<tokio::task::AbortHandle> {
    let (fault_tx, fault_rx) = mpsc::unbounded_channel();
    inv.watch_health(node.gpus.clone(), xids, fault_tx);
    let faults = health_tasks::deliver_faults(node.name.clone(), creds.clone(), fault_rx, client_rx.clone());
    let mut tasks = vec![tokio::spawn(faults).abort_handle()];
    if let Some(program) = args.health_check_program.clone() {
        let check = health_tasks::HealthCheck {
            program,
            every: args.health_check_interval,
            requeue: args.health_check_action == HealthAction::Requeue,
        };
        let checks =
            health_tasks::health_check_loop(check, node.name.clone(), creds.clone(), client_rx.clone());
        tasks.push(tokio::spawn(checks).abort_handle());
    }
    tasks
}

async fn shutdown_signal() -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("listening for SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("listening for SIGINT")?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}

/// The watchdog mode of this binary (see `fence::spawn_watchdog`).
fn watchdog_main(args: &[String]) -> anyhow::Result<()> {
    let [state_dir, parent, cgroup_base, process_log, node] = args else {
        bail!("watchdog: STATE_DIR AGENT_PID CGROUP_BASE|- PROCESS_LOG|- NODE")
    };
    let parent: i32 = parent.parse().context("watchdog: AGENT_PID")?;
    // Out of the agent's session: a Ctrl-C meant for the agent must not stop the watchdog.
    if let Err(e) = nix::unistd::setsid() {
        // Already a session leader (started so by hand): it is out of the agent's session.
        eprintln!("kairos-agent watchdog: setsid: {e}");
    }
    let cgroups = (cgroup_base != "-").then(|| Cgroups::at(PathBuf::from(cgroup_base)));
    let process_log = match process_log.as_str() {
        "-" => Default::default(),
        path => kairos_agent::audit::ProcessLog::open(std::path::Path::new(path), node)
            .with_context(|| format!("watchdog: opening {path}"))?,
    };
    fence::watchdog(&fence::Watch {
        state_dir: std::path::Path::new(state_dir),
        cgroups: cgroups.as_ref(),
        parent,
        process_log,
    })
}

/// Sets `mode` on `dir` (created if missing).
fn dir_mode(dir: &std::path::Path, mode: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("setting the permissions of {}", dir.display()))
}

/// The command line, with `--config` files expanded (exits 2 on a bad one).
fn parse_args() -> Args {
    use clap::CommandFactory;
    match kairos_telemetry::config::expand(std::env::args_os().collect(), &Args::command()) {
        Ok(argv) => Args::parse_from(argv),
        Err(e) => {
            eprintln!("kairos-agent: --config: {e}");
            std::process::exit(2);
        }
    }
}

/// Creates and resolves `--state-dir`: the agent's own files (credential, lease, journal) are
/// out of jobs' reach; job directories below `jobs/` belong to their jobs' users, who may pass
/// through but not list.
fn prepare_state_dir(args: &Args, run_as: RunAs) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(&args.state_dir)
        .with_context(|| format!("creating {}", args.state_dir.display()))?;
    let state_dir = std::fs::canonicalize(&args.state_dir).context("resolving --state-dir")?;
    let traverse = if run_as == RunAs::Submitter { 0o711 } else { 0o700 };
    dir_mode(&state_dir, traverse)?;
    dir_mode(&state_dir.join("jobs"), traverse)?;
    dir_mode(&state_dir.join("live"), 0o700)?;
    use std::os::unix::fs::PermissionsExt;
    if run_as == RunAs::Submitter {
        // Jobs reach their directories by absolute path ($KAIROS_CHECKPOINT_DIR).
        for dir in state_dir.ancestors().skip(1) {
            if std::fs::metadata(dir).is_ok_and(|m| m.permissions().mode() & 0o001 == 0) {
                tracing::warn!(dir = %dir.display(), "jobs cannot pass through this directory to reach their job directories: put --state-dir where others may traverse (o+x)");
            }
        }
    }
    if let Some(path) = &args.join_token_file {
        if std::fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o077 != 0) {
            tracing::warn!(file = %path.display(), "the join token file is readable by other users: make it owner-only (chmod 600)");
        }
    }
    Ok(state_dir)
}

/// The address the controllers are told to reach the log service at: `--advertise-addr` (a
/// host name or an IP address, and a port), else the bound one.
fn advertised(args: &Args, bound: String) -> anyhow::Result<String> {
    let Some(a) = &args.advertise_addr else { return Ok(bound) };
    let port_ok =
        a.rsplit_once(':').is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
    if !port_ok {
        bail!("--advertise-addr \"{a}\" is not HOST:PORT");
    }
    Ok(a.clone())
}

/// The metrics endpoint at `--metrics-addr`, when asked for.
async fn serve_metrics(
    args: &Args,
    name: &str,
    runner: &Runner,
    inv: Arc<dyn GpuInventory>,
    gpus: usize,
) -> anyhow::Result<Option<tokio::task::JoinHandle<()>>> {
    let Some(at) = &args.metrics_addr else { return Ok(None) };
    let listener =
        kairos_telemetry::http::bind(at).await.with_context(|| format!("binding --metrics-addr {at}"))?;
    println!("kairos-agent {name} metrics at http://{}/metrics", listener.local_addr()?);
    let (runner, node_name) = (runner.clone(), name.to_string());
    let render = move || {
        kairos_agent::metrics::render(&kairos_agent::metrics::AgentFigures {
            node: node_name.clone(),
            runs: runner.running().len(),
            gpus,
            usage: inv.usage(),
            jobs: runner.usage().latest(),
        })
    };
    let served = kairos_telemetry::http::serve(listener, Arc::new(render));
    Ok(Some(tokio::spawn(async move {
        let _ = served.await;
    })))
}

/// The per-run limits this host enforces, leaving `reserved` cores to the system.
fn limiter_of(
    cgroups: Option<&kairos_agent::cgroup::Cgroups>,
    reserved: u32,
) -> kairos_agent::cgroup_limits::Limiter {
    match cgroups {
        Some(c) => {
            kairos_agent::cgroup::warn_without_favordynmods();
            kairos_agent::cgroup_limits::Limiter::detect(Some(c.base()))
        }
        None => kairos_agent::cgroup_limits::Limiter::none(),
    }
    .with_reserved_cores(reserved)
}

/// `--container-runtime`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum ContainerRuntime {
    Builtin,
    None,
}

/// The container image cache (`--image-cache`, `--image-cache-max`); None with
/// `--container-runtime none`.
fn image_cache(
    args: &Args,
    state_dir: &std::path::Path,
) -> anyhow::Result<Option<std::sync::Arc<kairos_agent::image::ImageCache>>> {
    if args.container_runtime == ContainerRuntime::None {
        return Ok(None);
    }
    let dir = args.image_cache.clone().unwrap_or_else(|| state_dir.join("images"));
    let cache = kairos_agent::image::ImageCache::new(&dir, args.image_cache_max.saturating_mul(1 << 20))
        .with_context(|| format!("opening the image cache {}", dir.display()))?;
    Ok(Some(std::sync::Arc::new(cache)))
}

/// A size flag (512M, 16G; MiB without a unit) in MiB.
fn parse_size(s: &str) -> Result<u64, String> {
    kairos_proto::units::parse_mem_mib(s)
}

/// The host's memory (MemTotal of /proc/meminfo) in MiB; 0 where it cannot be read.
fn host_memory_mib() -> u64 {
    let info = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let kib = info
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:")?.trim().strip_suffix("kB")?.trim().parse::<u64>().ok());
    kib.unwrap_or(0) / 1024
}

/// What the node is: its name, address, GPUs, CPUs, labels and how it runs jobs.
fn node_info(
    args: &Args,
    name: &str,
    addr: &str,
    gpus: Vec<pb::Gpu>,
    backend: &str,
    isolation: String,
) -> pb::NodeInfo {
    pb::NodeInfo {
        name: name.to_string(),
        addr: addr.to_string(),
        gpus,
        cpus: args
            .cpus
            .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get() as u32).unwrap_or(1))
            .saturating_sub(args.reserved_cpus),
        memory_mib: args.memory.unwrap_or_else(host_memory_mib).saturating_sub(args.reserved_memory),
        labels: args.labels.iter().cloned().collect(),
        gpu_backend: backend.to_string(),
        isolation,
    }
}

/// Whose account jobs run as (`--run-as`: the submitter's needs root) and how accounts are
/// resolved.
fn accounts_of(args: &Args) -> anyhow::Result<(RunAs, UnixAccounts)> {
    let root = nix::unistd::geteuid().is_root();
    let run_as = args.run_as.unwrap_or(if root { RunAs::Submitter } else { RunAs::Agent });
    if run_as == RunAs::Submitter && !root {
        bail!("--run-as submitter needs the agent to run as root (it switches to each job's Unix account)");
    }
    let mut accounts = UnixAccounts::new(run_as).with_min_uid(args.min_uid);
    if let Some(map) = &args.user_map {
        accounts = accounts.with_map_file(map)?;
    }
    Ok((run_as, accounts))
}

/// The node's credential (kept in the state directory), and the join token it starts from.
fn credentials(args: &Args, state_dir: &std::path::Path) -> anyhow::Result<Credentials> {
    let join = match &args.join_token_file {
        Some(path) => Some(Arc::from(
            kairos_proto::wire::read_credential_file(path)
                .with_context(|| "--join-token-file".to_string())?,
        )),
        None => None,
    };
    Ok(Credentials::load(join, state_dir.join("node.credential")))
}

/// The log service, on `listener`.
fn serve_logs(
    logs: Logs,
    listener: tokio::net::TcpListener,
    tls: Option<tonic::transport::ServerTlsConfig>,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let mut server = tonic::transport::Server::builder();
    if let Some(tls) = tls {
        server = server.tls_config(tls).context("TLS settings")?;
    }
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    let serving = server.add_service(AgentLogServiceServer::new(logs)).serve_with_incoming(incoming);
    Ok(tokio::spawn(async move {
        if let Err(e) = serving.await {
            tracing::warn!(error = %e, "the log service stopped");
        }
    }))
}

/// What `start` sets going and `shut_down` stops.
struct Agent {
    runner: Runner,
    node: Node,
    limiter: kairos_agent::cgroup_limits::Limiter,
    kept: KeptUp,
    tasks: Vec<tokio::task::AbortHandle>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some(fence::WATCHDOG_ARG) {
        return watchdog_main(&argv[2..]);
    }
    let args = parse_args();
    kairos_telemetry::logs::init(args.log_format, "info");
    let mut traces = kairos_telemetry::traces::init("kairos-agent");
    if args.controllers.is_empty() {
        bail!("--controllers: at least one address is required");
    }
    let (run_as, accounts) = accounts_of(&args)?;
    let name = args.name.clone().unwrap_or_else(host_name);
    let inv = inventory(&args, &name)?;
    let xids = kairos_agent::health::XidPolicy::parse(&args.gpu_ignored_xids)
        .map_err(|e| anyhow::anyhow!("--gpu-ignored-xids: {e}"))?;
    let gpus = inv.discover().context("discovering GPUs")?;
    let state_dir = prepare_state_dir(&args, run_as)?;
    let take = TakeOver {
        name: &name,
        state_dir: &state_dir,
        cgroup_root: args.cgroup_root.as_deref(),
        process_log: args.process_log.as_deref(),
    };
    let mut node = session::take_over(&take).await?;
    let (isolation, limiter) = isolation(&args, node.cgroups.clone(), accounts, &gpus, &state_dir)?;
    let (listener, addr) = listen(&args).await?;
    let info = node_info(&args, &name, &addr, gpus, inv.backend(), isolation.describe());
    let creds = credentials(&args, &state_dir)?;
    let tls = args.tls.clone();
    let (server_tls, client_tls) = (tls.server(false)?, tls.client()?);
    let (report_tx, report_rx) = mpsc::channel(1024);
    let runner = Runner::new(&name, &state_dir, report_tx)
        .with_process_log(std::mem::take(&mut node.process_log))
        .with_isolation(isolation)
        .with_lease(node.lease.clone());
    let retention = Duration::from_secs(args.job_dir_retention_hours.saturating_mul(3600));
    let kept = session::keep_up(&runner, &node.lease, retention, args.hpc_job_mapping_dir.clone());
    let (client_tx, client_rx) = watch::channel(None);
    let mut tasks = watch_controllers(&args, inv.as_ref(), xids, &info, &creds, client_rx, report_rx)?;
    let logs = Logs { runner: runner.clone(), credential: creds.shared_node() };
    tasks.push(serve_logs(logs, listener, server_tls)?.abort_handle());
    announce(&info, inv.backend());
    let gpu_count = info.gpus.len();
    let inv = Arc::<dyn GpuInventory>::from(inv);
    let sampler = kairos_agent::usage::sampler::run(
        runner.usage().clone(),
        Arc::clone(&inv),
        info.gpus.clone(),
        args.usage_interval,
        name.clone(),
        runner.reports(),
    );
    tasks.push(tokio::spawn(sampler).abort_handle());
    if let Some(m) = serve_metrics(&args, &name, &runner, inv, gpu_count).await? {
        tasks.push(m.abort_handle());
    }
    let s = Session { node: info, runner: runner.clone(), lease: node.lease.clone(), creds };
    let sessions =
        session::follow_controllers(Controllers::new(args.controllers.clone(), client_tls), s, client_tx);
    tokio::select! {
        r = shutdown_signal() => r?,
        _ = sessions => {}
    }
    shut_down(Agent { runner, node, limiter, kept, tasks }, args.hpc_job_mapping_dir.as_deref()).await;
    traces.shutdown();
    Ok(())
}

/// The per-run isolation this host gives (accounts, cgroups, limits, devices, images), and its
/// limiter.
fn isolation(
    args: &Args,
    cgroups: Option<Cgroups>,
    accounts: UnixAccounts,
    gpus: &[pb::Gpu],
    state_dir: &std::path::Path,
) -> anyhow::Result<(kairos_agent::isolation::Isolation, kairos_agent::cgroup_limits::Limiter)> {
    let limiter = limiter_of(cgroups.as_ref(), args.reserved_cpus);
    let isolation = kairos_agent::isolation::Isolation {
        accounts,
        cgroups,
        log_max_bytes: args.log_max_bytes.max(1024),
        limiter: limiter.clone(),
        pids_max: (args.run_pids_max > 0).then_some(args.run_pids_max),
        devices: kairos_agent::gpu::DeviceMap::of(gpus),
        images: image_cache(args, state_dir)?,
        cdi_dirs: args.cdi_spec_dirs.clone(),
    };
    Ok((isolation, limiter))
}

/// The log service's listener (`--addr`) and the address controllers reach it at.
async fn listen(args: &Args) -> anyhow::Result<(tokio::net::TcpListener, String)> {
    let listen: std::net::SocketAddr =
        args.addr.parse().with_context(|| format!("--addr \"{}\" is not HOST:PORT", args.addr))?;
    let listener =
        tokio::net::TcpListener::bind(listen).await.with_context(|| format!("binding {listen}"))?;
    let bound = listener.local_addr().context("reading the log service address")?.to_string();
    let addr = advertised(args, bound)?;
    Ok((listener, addr))
}

/// The tasks that tell the controllers what happens here: spot notices, GPU health and the
/// health-check program, run reports.
fn watch_controllers(
    args: &Args,
    inv: &dyn GpuInventory,
    xids: kairos_agent::health::XidPolicy,
    node: &pb::NodeInfo,
    creds: &Credentials,
    client_rx: ClientRx,
    reports: mpsc::Receiver<pb::StatusReport>,
) -> anyhow::Result<Vec<tokio::task::AbortHandle>> {
    let mut tasks = Vec::new();
    if let Some(imds) = args.spot_imds.as_deref().map(kairos_agent::spot::Imds::parse).transpose()? {
        let poll = Duration::from_millis(args.spot_poll_ms.max(100));
        let watch = watch_spot(imds, poll, node.name.clone(), creds.clone(), client_rx.clone());
        tasks.push(tokio::spawn(watch).abort_handle());
    }
    tasks.extend(watch_health(args, inv, xids, node, creds, &client_rx));
    tasks.push(tokio::spawn(session::deliver_reports(creds.clone(), reports, client_rx)).abort_handle());
    Ok(tasks)
}

/// Says what this agent is.
fn announce(node: &pb::NodeInfo, backend: &str) {
    let (name, addr) = (&node.name, &node.addr);
    println!(
        "kairos-agent {name} ({} {backend} GPUs, runs: {}) logs on {addr}",
        node.gpus.len(),
        node.isolation
    );
    tracing::info!(node = %name, gpus = node.gpus.len(), backend, %addr, "agent starting");
}

/// Stops every run, then the watchdog (nothing left for it), the cgroups and the tasks.
async fn shut_down(agent: Agent, job_map: Option<&std::path::Path>) {
    let Agent { runner, mut node, limiter, kept, tasks } = agent;
    tracing::info!("stopping all runs");
    kept.fencing.iter().for_each(tokio::task::AbortHandle::abort);
    runner.stop_all(Duration::from_secs(5)).await;
    node.lease.release();
    if let Err(e) = node.watchdog.kill() {
        tracing::warn!(error = %e, "cannot stop the fencing watchdog");
    }
    // Reaped so it leaves no zombie; how it ended does not matter now.
    let _ = node.watchdog.wait();
    if let Some(c) = &node.cgroups {
        c.remove_empty();
    }
    kairos_agent::cgroup_limits::remove_empty(&limiter);
    tasks.iter().chain(&kept.job_map).for_each(tokio::task::AbortHandle::abort);
    if let Some(dir) = job_map {
        if let Err(e) = kairos_agent::jobmap::write(dir, &[]) {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot empty the HPC job mapping");
        }
    }
}

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
use kairos_agent::fence::{self, Lease};
use kairos_agent::gpu::{FakeInventory, GpuInventory, NvmlInventory};
use kairos_agent::logs::Logs;
use kairos_agent::runner::Runner;
use kairos_proto::v1 as pb;
use kairos_proto::v1::agent_log_service_server::AgentLogServiceServer;
use kairos_proto::v1::agent_service_client::AgentServiceClient;
use tokio::sync::{mpsc, watch};
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

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
    /// Fake GPUs: a file faults are injected through at run time, one per line appended:
    /// `GPU XID` (e.g. `3 79`), `GPU ecc`, `GPU pending` or `GPU lost`.
    #[arg(long, value_name = "FILE")]
    fake_gpu_faults: Option<PathBuf>,
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
    /// TLS: the CA certificate (PEM) that signs the controllers' certificates; with it the agent
    /// talks to controllers over TLS only.
    #[arg(long)]
    ca: Option<PathBuf>,
    /// TLS: this agent's certificate (PEM): its log service is then served over TLS, and it is
    /// presented to controllers that require mutual TLS.
    #[arg(long, requires = "key")]
    cert: Option<PathBuf>,
    /// TLS: this agent's private key (PEM).
    #[arg(long, requires = "cert")]
    key: Option<PathBuf>,
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

/// The agent's credentials: the join token it registers with the first time, and the node
/// credential the controller hands back, which it presents on every later call (re-registering
/// after a restart included) and which the log service checks on every request. The node
/// credential is kept in an owner-only file of the state directory (`node.credential`): the
/// join token registers only a name nobody holds, so a restarted agent needs it.
#[derive(Clone, Default)]
pub struct Credentials {
    join: Option<Arc<str>>,
    node: Arc<std::sync::RwLock<Option<String>>>,
    file: Option<PathBuf>,
    prefer_join: Arc<std::sync::atomic::AtomicBool>,
}

impl Credentials {
    fn node(&self) -> Option<String> {
        self.node.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The credential a previous run of this agent kept, if any.
    fn load(join: Option<Arc<str>>, file: PathBuf) -> Credentials {
        let node = kairos_proto::wire::read_credential_file(&file).ok();
        Credentials {
            join,
            node: Arc::new(std::sync::RwLock::new(node)),
            file: Some(file),
            prefer_join: Arc::default(),
        }
    }

    /// Keeps the credential the controller handed back (in memory and in the file).
    fn remember(&self, credential: String) {
        if self.node().as_deref() == Some(credential.as_str()) {
            return;
        }
        if let Some(file) = &self.file {
            let _ = std::fs::remove_file(file);
            if let Err(e) = kairos_proto::wire::write_private_new(file, &credential) {
                tracing::warn!(error = %e.0, "cannot keep the node credential; a restart will need the name freed");
            }
        }
        *self.node.write().unwrap_or_else(|p| p.into_inner()) = Some(credential);
    }

    /// A registration with the join token (`with_join`) or the node credential was refused.
    /// A refusal is not proof: a just-elected leader may not have applied this node's
    /// registration yet. So the credential is kept (in memory and on disk) and the next
    /// registration tries the join token instead, the one after that the credential again,
    /// until one is taken; only a new registration replaces it.
    fn refused(&self, with_join: bool) {
        self.prefer_join.store(!with_join && self.join.is_some(), std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether the next registration presents the join token rather than the node credential.
    fn registers_with_join(&self) -> bool {
        self.node().is_none() || self.prefer_join.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// `msg` with this node's credential (the join token before registration, or while
    /// `registers_with_join` for a `Register`).
    fn request<T>(&self, msg: T) -> tonic::Request<T> {
        let mut req = tonic::Request::new(msg);
        if let Some(c) = self.node().as_deref().or(self.join.as_deref()) {
            kairos_proto::wire::set_bearer(req.metadata_mut(), c);
        }
        req
    }

    /// A registration request with the credential `registers_with_join` chooses.
    fn register_request(&self, msg: pb::RegisterRequest) -> tonic::Request<pb::RegisterRequest> {
        if self.registers_with_join() {
            let mut req = tonic::Request::new(msg);
            if let Some(j) = self.join.as_deref() {
                kairos_proto::wire::set_bearer(req.metadata_mut(), j);
            }
            req
        } else {
            self.request(msg)
        }
    }
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
        inv.mig = args.fake_mig.as_deref().map(kairos_agent::gpu::FakeMig::parse).transpose()?;
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

/// The controller addresses to try, preferred (leader hint) first.
struct Controllers {
    addrs: Vec<String>,
    next: usize,
    hint: Option<String>,
}

impl Controllers {
    async fn connect(&mut self, tls: Option<&ClientTlsConfig>) -> Option<(String, Channel)> {
        let n = self.addrs.len();
        let order: Vec<String> = self
            .hint
            .take()
            .into_iter()
            .chain((0..n).map(|i| self.addrs[(self.next + i) % n].clone()))
            .collect();
        self.next = self.next.wrapping_add(1);
        for addr in order {
            let Ok(endpoint) = Endpoint::from_shared(kairos_proto::wire::url(&addr, tls.is_some())) else {
                continue;
            };
            // A paused or cut-off controller accepts TCP connections and then says nothing:
            // every step towards it is bounded (the HTTP/2 handshake too, and each call until
            // its answer starts), so the agent moves on to the others.
            let mut endpoint = endpoint
                .connect_timeout(Duration::from_secs(2))
                .timeout(Duration::from_secs(5))
                .tcp_keepalive(Some(Duration::from_secs(10)));
            if let Some(tls) = tls {
                match endpoint.tls_config(tls.clone()) {
                    Ok(e) => endpoint = e,
                    Err(e) => {
                        tracing::warn!(error = %e, "TLS settings refused");
                        continue;
                    }
                }
            }
            if let Ok(Ok(channel)) = tokio::time::timeout(Duration::from_secs(3), endpoint.connect()).await {
                return Some((addr, channel));
            }
        }
        None
    }
}

fn leader_hint(status: &tonic::Status) -> Option<String> {
    status.metadata().get("kairos-leader").and_then(|v| v.to_str().ok()).map(str::to_string)
}

/// One connection to a controller: register, heartbeat, follow assignments until it breaks.
async fn session(
    channel: Channel,
    node: &pb::NodeInfo,
    runner: &Runner,
    lease: &Lease,
    creds: &Credentials,
    client_tx: &watch::Sender<Option<AgentServiceClient<Channel>>>,
) -> Result<(), tonic::Status> {
    let mut client = AgentServiceClient::new(channel);
    let with_join = creds.registers_with_join();
    let sent = fence::mono_ms();
    let reg = match client
        .register(creds.register_request(pb::RegisterRequest { node: Some(node.clone()) }))
        .await
    {
        Ok(reg) => reg.into_inner(),
        Err(s)
            if matches!(
                s.code(),
                tonic::Code::Unauthenticated | tonic::Code::NotFound | tonic::Code::FailedPrecondition
            ) =>
        {
            tracing::warn!(status = %s.message(), with_join, "registration refused; trying the other credential next");
            creds.refused(with_join);
            return Err(s);
        }
        Err(s) => return Err(s),
    };
    creds.prefer_join.store(false, std::sync::atomic::Ordering::SeqCst);
    tracing::info!(node = %reg.node_id, "registered");
    if reg.node_credential.is_empty() {
        return Err(tonic::Status::internal("the controller sent no node credential"));
    }
    creds.remember(reg.node_credential);
    let interval = Duration::from_millis(reg.heartbeat_interval_ms.clamp(100, 60_000));
    // A controller that hands out no lease (older version): a lease of ten intervals.
    let lease_ms = if reg.lease_ms > 0 { reg.lease_ms } else { 10 * interval.as_millis() as u64 };
    let fence_grace_ms = reg.fence_grace_ms;
    lease.renew(sent, lease_ms, fence_grace_ms);
    client_tx.send_replace(Some(client.clone()));
    let mut stream = client
        .assignments(creds.request(pb::AssignmentsRequest { node_id: reg.node_id.clone() }))
        .await?
        .into_inner();
    let mut heartbeat = tokio::time::interval(interval);
    loop {
        tokio::select! {
            msg = stream.message() => match msg? {
                Some(set) => runner.reconcile(&set),
                None => return Err(tonic::Status::unavailable("assignment stream ended")),
            },
            _ = heartbeat.tick() => {
                let running = runner.running().into_iter().map(|(job_id, attempt)| pb::RunRef { job_id, attempt }).collect();
                // A controller that stops answering (paused, partitioned) must not hold this
                // node: give up on it after two intervals and find the leader elsewhere.
                let call = client.heartbeat(creds.request(pb::HeartbeatRequest { node_id: reg.node_id.clone(), running }));
                let sent = fence::mono_ms();
                match tokio::time::timeout(interval * 2, call).await {
                    Ok(answer) => {
                        answer?;
                        lease.renew(sent, lease_ms, fence_grace_ms);
                        // Launches deferred while the lease had lapsed may go now.
                        runner.launch_ready();
                    }
                    Err(_) => return Err(tonic::Status::unavailable("heartbeat: the controller did not answer")),
                }
            }
        }
    }
}

/// Delivers run reports, each until a controller takes it.
async fn deliver_reports(
    creds: Credentials,
    mut rx: mpsc::Receiver<pb::StatusReport>,
    mut client_rx: watch::Receiver<Option<AgentServiceClient<Channel>>>,
) {
    while let Some(report) = rx.recv().await {
        health_tasks::until_taken("run report", &health_tasks::REFUSED, &mut client_rx, |mut c| {
            let req = creds.request(report.clone());
            async move { c.report_status(req).await.map(|_| ()) }
        })
        .await;
    }
}

/// Waits for a spot interruption notice, then asks the controllers (until one accepts) to
/// drain this node.
async fn watch_spot(
    imds: kairos_agent::spot::Imds,
    every: Duration,
    node: String,
    creds: Credentials,
    mut client_rx: watch::Receiver<Option<AgentServiceClient<Channel>>>,
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
    client_rx: &watch::Receiver<Option<AgentServiceClient<Channel>>>,
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
    let _ = nix::unistd::setsid();
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

/// Removes job directories untouched for `retention` whose job has no run on this node.
fn sweep_job_dirs(runner: &Runner, retention: Duration) {
    let Ok(entries) = std::fs::read_dir(kairos_agent::launch::jobs_dir(runner.state_dir())) else { return };
    let live: std::collections::BTreeSet<u64> = runner.running().into_iter().map(|(job, _)| job).collect();
    for e in entries.flatten() {
        let Some(job) = e.file_name().to_str().and_then(kairos_agent::launch::job_of_dir_name) else {
            continue;
        };
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|m| m.elapsed().ok())
            .is_some_and(|age| age > retention);
        if old && !live.contains(&job) {
            match std::fs::remove_dir_all(e.path()) {
                Ok(()) => tracing::info!(job, "job directory removed after its retention"),
                Err(err) => tracing::warn!(job, error = %err, "cannot remove an old job directory"),
            }
        }
    }
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

/// A cgroup per run where the node has cgroups to give; process groups otherwise (said loudly).
fn detect_cgroups(name: &str, state_dir: &std::path::Path, args: &Args) -> Option<Cgroups> {
    match Cgroups::detect(name, state_dir, args.cgroup_root.as_deref()) {
        Ok(c) => {
            tracing::info!(base = %c.base().display(), "a cgroup per run");
            Some(c)
        }
        Err(why) => {
            tracing::warn!(
                reason = %why,
                "NO CGROUP PER RUN: falling back to process groups; a job process that leaves its group (setsid, daemonize) escapes stop, kill and fencing"
            );
            None
        }
    }
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

/// Runs `step` every `every`, for the life of the agent.
fn every(every: Duration, mut step: impl FnMut() + Send + 'static) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            step();
            tokio::time::sleep(every).await;
        }
    })
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
        })
    };
    let served = kairos_telemetry::http::serve(listener, Arc::new(render));
    Ok(Some(tokio::spawn(async move {
        let _ = served.await;
    })))
}

/// Sessions with the controllers, one after another, for the life of the agent: a leader's
/// hint is followed at once; otherwise the next controller after a growing pause.
async fn follow_controllers(
    mut controllers: Controllers,
    client_tls: Option<ClientTlsConfig>,
    node: pb::NodeInfo,
    runner: Runner,
    lease: Lease,
    creds: Credentials,
    client_tx: watch::Sender<Option<AgentServiceClient<Channel>>>,
) {
    let mut backoff = Duration::from_millis(100);
    loop {
        match controllers.connect(client_tls.as_ref()).await {
            Some((addr, channel)) => {
                if let Err(status) = session(channel, &node, &runner, &lease, &creds, &client_tx).await {
                    client_tx.send_replace(None);
                    tracing::warn!(controller = %addr, status = %status.message(), "controller session ended");
                    if let Some(hint) = leader_hint(&status) {
                        controllers.hint = Some(hint);
                        continue;
                    }
                    if status.code() != tonic::Code::Unavailable {
                        backoff = Duration::from_millis(100);
                    }
                }
            }
            None => tracing::debug!("no controller reachable"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

/// The per-run limits this host enforces, leaving `reserved` cores to the system.
fn limiter_of(
    cgroups: Option<&kairos_agent::cgroup::Cgroups>,
    reserved: u32,
) -> kairos_agent::cgroup_limits::Limiter {
    match cgroups {
        Some(c) => kairos_agent::cgroup_limits::Limiter::detect(Some(c.base())),
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

/// What the agent holds of its node while it runs.
struct Node {
    cgroups: Option<Cgroups>,
    process_log: kairos_agent::audit::ProcessLog,
    lease: Lease,
    watchdog: std::process::Child,
}

/// Takes the node over from whatever a previous agent left: its watchdog stopped, its runs
/// killed, a new lease (nothing to enforce yet), this agent the jobs' subreaper, and a fencing
/// watchdog of its own.
async fn take_over(args: &Args, name: &str, state_dir: &std::path::Path) -> anyhow::Result<Node> {
    // Before anything of the node's is touched: a watchdog left by a previous agent goes first.
    fence::stop_previous_watchdog(state_dir);
    let cgroups = detect_cgroups(name, state_dir, args);
    // Before taking any work: nothing a previous (crashed) agent started may keep running.
    let process_log = match &args.process_log {
        Some(path) => kairos_agent::audit::ProcessLog::open(path, name)
            .with_context(|| format!("opening --process-log {}", path.display()))?,
        None => Default::default(),
    };
    let orphans = kairos_agent::journal::kill_orphans(state_dir, cgroups.as_ref(), &process_log).await;
    if orphans > 0 {
        tracing::warn!(orphans, "killed runs left by a previous agent");
    }
    // A new lease file (a previous agent's record is gone with it): nothing to enforce yet.
    let lease = Lease::new(fence::lease_path(state_dir));
    // What a job leaves behind is the agent's to reap, not PID 1's (`reaper`).
    match kairos_agent::reaper::become_subreaper() {
        Ok(()) => drop(tokio::spawn(kairos_agent::reaper::run())),
        Err(e) => {
            tracing::warn!(error = %e, "cannot become the jobs' child subreaper; their orphans go to PID 1")
        }
    }
    let watchdog = fence::spawn_watchdog(
        state_dir,
        cgroups.as_ref().map(Cgroups::base),
        args.process_log.as_deref(),
        name,
    )
    .context("starting the fencing watchdog")?;
    Ok(Node { cgroups, process_log, lease, watchdog })
}

/// The agent's periodic work: fencing (when the lease lapses, every run is stopped; the
/// watchdog kills what is left at the hard deadline, should this process be unable to), the
/// sweep of old job directories, and the HPC job mapping where asked for.
fn keep_up(
    args: &Args,
    runner: &Runner,
    lease: &Lease,
) -> (tokio::task::JoinHandle<()>, tokio::task::JoinHandle<()>, Vec<tokio::task::AbortHandle>) {
    let fencer = {
        let (runner, lease) = (runner.clone(), lease.clone());
        every(Duration::from_millis(100), move || {
            if lease.lapsed() {
                runner.fence(lease.grace());
            }
        })
    };
    let sweeper = {
        let runner = runner.clone();
        let retention = Duration::from_secs(args.job_dir_retention_hours.saturating_mul(3600));
        every(Duration::from_secs(600), move || sweep_job_dirs(&runner, retention))
    };
    let mut tasks = Vec::new();
    if let Some(dir) = args.hpc_job_mapping_dir.clone() {
        let runner = runner.clone();
        let write = move || {
            if let Err(e) = kairos_agent::jobmap::write(&dir, &runner.running_gpus()) {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot write the HPC job mapping");
            }
        };
        tasks.push(every(Duration::from_secs(1), write).abort_handle());
    }
    (fencer, sweeper, tasks)
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
    let Node { cgroups, process_log, lease, mut watchdog } = take_over(&args, &name, &state_dir).await?;
    let limiter = limiter_of(cgroups.as_ref(), args.reserved_cpus);
    let isolation = kairos_agent::isolation::Isolation {
        accounts,
        cgroups: cgroups.clone(),
        log_max_bytes: args.log_max_bytes.max(1024),
        limiter: limiter.clone(),
        pids_max: (args.run_pids_max > 0).then_some(args.run_pids_max),
        devices: kairos_agent::gpu::DeviceMap::of(&gpus),
        images: image_cache(&args, &state_dir)?,
        cdi_dirs: args.cdi_spec_dirs.clone(),
    };

    let listen: std::net::SocketAddr =
        args.addr.parse().with_context(|| format!("--addr \"{}\" is not HOST:PORT", args.addr))?;
    let listener =
        tokio::net::TcpListener::bind(listen).await.with_context(|| format!("binding {listen}"))?;
    let bound = listener.local_addr().context("reading the log service address")?.to_string();
    let addr = advertised(&args, bound)?;
    let node = node_info(&args, &name, &addr, gpus, inv.backend(), isolation.describe());
    let creds = credentials(&args, &state_dir)?;
    let tls =
        kairos_proto::wire::TlsFiles { ca: args.ca.clone(), cert: args.cert.clone(), key: args.key.clone() };
    let server_tls = tls.server(false)?;
    let client_tls = tls.client()?;
    let imds = args.spot_imds.as_deref().map(kairos_agent::spot::Imds::parse).transpose()?;
    let (report_tx, report_rx) = mpsc::channel(1024);
    let runner = Runner::new(&name, &state_dir, report_tx)
        .with_process_log(process_log)
        .with_isolation(isolation)
        .with_lease(lease.clone());
    let (fencer, sweeper, mut tasks) = keep_up(&args, &runner, &lease);
    let (client_tx, client_rx) = watch::channel(None);
    if let Some(imds) = imds {
        let poll = Duration::from_millis(args.spot_poll_ms.max(100));
        let watch = watch_spot(imds, poll, name.clone(), creds.clone(), client_rx.clone());
        tasks.push(tokio::spawn(watch).abort_handle());
    }
    tasks.extend(watch_health(&args, inv.as_ref(), xids, &node, &creds, &client_rx));
    tasks.push(tokio::spawn(deliver_reports(creds.clone(), report_rx, client_rx)).abort_handle());
    let logs = Logs { runner: runner.clone(), credential: creds.node.clone() };
    tasks.push(serve_logs(logs, listener, server_tls)?.abort_handle());
    let backend = inv.backend();
    println!(
        "kairos-agent {name} ({} {backend} GPUs, runs: {}) logs on {addr}",
        node.gpus.len(),
        node.isolation
    );
    tracing::info!(node = %name, gpus = node.gpus.len(), backend, %addr, "agent starting");
    let gpu_count = node.gpus.len();
    if let Some(m) =
        serve_metrics(&args, &name, &runner, Arc::<dyn GpuInventory>::from(inv), gpu_count).await?
    {
        tasks.push(m.abort_handle());
    }
    let controllers = Controllers { addrs: args.controllers.clone(), next: 0, hint: None };
    let sessions =
        follow_controllers(controllers, client_tls, node, runner.clone(), lease.clone(), creds, client_tx);
    tokio::select! {
        r = shutdown_signal() => r?,
        _ = sessions => {}
    }
    tracing::info!("stopping all runs");
    fencer.abort();
    sweeper.abort();
    runner.stop_all(Duration::from_secs(5)).await;
    lease.release();
    let _ = watchdog.kill();
    let _ = watchdog.wait();
    if let Some(c) = &cgroups {
        c.remove_empty();
    }
    kairos_agent::cgroup_limits::remove_empty(&limiter);
    tasks.iter().for_each(tokio::task::AbortHandle::abort);
    if let Some(dir) = &args.hpc_job_mapping_dir {
        let _ = kairos_agent::jobmap::write(dir, &[]);
    }
    traces.shutdown();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_credential_is_kept_and_alternates_with_the_join_token() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("node.credential");
        let creds = Credentials::load(Some(Arc::from("join-token-0123456789")), file.clone());
        assert!(creds.registers_with_join(), "no credential yet: the join token");
        creds.remember("node.0123456789abcdef0123".into());
        assert!(!creds.registers_with_join());
        // A just-elected leader refuses the credential: the join token next, then the
        // credential again; the credential is never thrown away.
        creds.refused(false);
        assert!(creds.registers_with_join());
        creds.refused(true);
        assert!(!creds.registers_with_join());
        assert!(file.exists());
        let reloaded = Credentials::load(None, file);
        assert_eq!(reloaded.node().as_deref(), Some("node.0123456789abcdef0123"));
    }
}

//! The daemon: kairosd's flags and wiring. It opens the replica, serves the job, agent, admin,
//! Raft, health and reflection services, and runs the leader and burst loops.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Parser;
use kairos_consensus::service::RaftRpc;
use kairos_consensus::{Replica, ReplicaConfig, ReplicaId};
use kairos_proto::v1::admin_service_server::AdminServiceServer;
use kairos_proto::v1::agent_service_server::AgentServiceServer;
use kairos_proto::v1::job_service_server::JobServiceServer;
use tokio::sync::Notify;

use crate::context::{user_gate, Ctx, Timing};
use crate::{
    admin, agents, auth, batch, burst, connlimit, forward, health, jobs, leader, memory, metrics, ratelimit,
};

/// Largest request a client may send (job specs are bounded far below this).
const API_MESSAGE_BYTES_MAX: usize = 4 * 1024 * 1024;

#[derive(Parser, Debug)]
#[command(name = "kairosd", version, about = "kairos controller replica")]
struct Args {
    /// This replica's id.
    #[arg(long, default_value_t = 1)]
    id: ReplicaId,
    /// Address to serve the API and Raft on: what peers, agents and clients dial.
    #[arg(long, default_value = "127.0.0.1:7001")]
    addr: String,
    /// Bind here instead of --addr, when what others dial (--addr) forwards to it: a NAT, a load
    /// balancer, a proxy in front of this replica.
    #[arg(long)]
    listen: Option<String>,
    /// Where the Raft log, vote and snapshots live.
    #[arg(long, default_value = "kairos-data/controller-1")]
    data_dir: PathBuf,
    /// Cluster members as ID=HOST:PORT,... (default: this replica alone). On first start the
    /// member with the lowest id initialises the cluster; the others wait for it.
    #[arg(long, value_delimiter = ',')]
    peers: Vec<String>,
    /// Start empty and wait to be added to an existing cluster (`kairos cluster add`).
    #[arg(long, conflicts_with = "peers")]
    join: bool,
    /// Start a new cluster from a backup (`kairos cluster snapshot save FILE`): given to the
    /// replica with the lowest id in --peers, on an empty --data-dir; the other replicas start
    /// empty and receive the restored state from it. A restart with the same flag and backup
    /// is allowed (nothing is restored twice).
    #[arg(long, value_name = "FILE", conflicts_with = "join")]
    restore_from: Option<PathBuf>,
    /// Snapshot and compact the log after this many entries.
    #[arg(long, default_value_t = 5000)]
    snapshot_logs: u64,
    /// Raft heartbeat period from the leader to followers (ms).
    #[arg(long, default_value_t = ReplicaConfig::HEARTBEAT_MS_DEFAULT)]
    raft_heartbeat_ms: u64,
    /// Raft election timeout (ms): a follower waits a random time in [T, 2T] without hearing
    /// from a leader before it stands for election. Lower is a faster failover; too low for the
    /// machine's scheduling and disk latency causes needless elections.
    #[arg(long, default_value_t = ReplicaConfig::ELECTION_TIMEOUT_MS_DEFAULT)]
    election_timeout_ms: u64,
    /// Agents heartbeat at this interval (ms).
    #[arg(long, default_value_t = 2000)]
    heartbeat_ms: u64,
    /// A node silent this long (ms) is declared down.
    #[arg(long, default_value_t = 20_000)]
    node_timeout_ms: u64,
    /// Period of the scheduling pass (ms) when no event wakes it.
    #[arg(long, default_value_t = 1000)]
    tick_ms: u64,
    /// Submits per second one user may make (token bucket; 0 = no limit).
    #[arg(long, default_value_t = 1000)]
    submit_rate_per_user: u32,
    /// Unfinished (pending, running, suspended) jobs one user may have; a submit past it is
    /// refused with RESOURCE_EXHAUSTED (like Slurm's MaxSubmitJobs).
    #[arg(long, default_value_t = 10_000)]
    max_jobs_per_user: u32,
    /// Finished jobs leave the live state this long after they ended (like Slurm's MinJobAge)
    /// and stay in the history (`kairos history`, `kairos show`).
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = humantime::parse_duration)]
    job_retention: Duration,
    /// The history keeps at most this many finished jobs (the oldest go first).
    #[arg(long, default_value_t = 100_000)]
    history_max_jobs: u32,
    /// The history drops jobs that ended longer ago than this.
    #[arg(long, value_name = "DURATION", default_value = "90d", value_parser = humantime::parse_duration)]
    history_retention: Duration,
    /// Unfinished jobs the whole cluster may hold.
    #[arg(long, default_value_t = 100_000)]
    max_jobs: u32,
    /// Open connections one IP address may hold (the gRPC port and --http-addr together);
    /// further ones are closed unread. Fitted under the descriptor limit: at most a quarter of
    /// the descriptors left for connections, less with peers (`connlimit::fit`).
    #[arg(long, default_value_t = connlimit::PER_ADDRESS_MAX)]
    max_connections_per_address: usize,
    /// Open connections in all (the gRPC port and --http-addr together). Fitted under the
    /// descriptor limit: kairosd raises its soft RLIMIT_NOFILE to the hard one at start and
    /// keeps 256 descriptors for its own files and connections; the bounds in force are logged.
    #[arg(long, default_value_t = connlimit::TOTAL_MAX)]
    max_connections: usize,
    /// A new connection that sends nothing for this long is closed.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    handshake_timeout: Duration,
    /// A connection that sends nothing for this long (not even the acknowledgement of the
    /// server's keepalive pings, sent every 20 s) is closed.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "75s")]
    idle_timeout: Duration,
    /// Submits one user may make in a burst above the rate.
    #[arg(long, default_value_t = 5000)]
    submit_burst_per_user: u32,
    /// This cluster's name: the `kairos:cluster` tag of its burst instances.
    #[arg(long, default_value = "kairos")]
    cluster_name: String,
    /// EC2 endpoint override for cloud burst (e.g. a moto server in tests); default: the AWS
    /// configuration chain's endpoint for the configured region.
    #[arg(long)]
    burst_endpoint: Option<String>,
    /// Period of the burst reconciler (ms).
    #[arg(long, default_value_t = 2000)]
    burst_interval_ms: u64,
    /// An instance tagged with this cluster that no launch intent knows is terminated after
    /// this long (ms).
    #[arg(long, default_value_t = 120_000)]
    burst_leak_grace_ms: u64,
    /// A launched instance the cloud no longer reports is considered gone after this long (ms).
    #[arg(long, default_value_t = 120_000)]
    burst_vanish_grace_ms: u64,
    /// The secret all controllers of the cluster share (32+ characters): peer and node
    /// credentials derive from it. Default: <data-dir>/cluster.secret, created with a random
    /// secret for a one-replica cluster (a multi-replica cluster must be given one).
    #[arg(long)]
    cluster_secret_file: Option<PathBuf>,
    /// The bootstrap admin token (`kairos token create` issues the others). Default:
    /// <data-dir>/admin.token, created (derived from the cluster secret) when missing.
    #[arg(long)]
    admin_token_file: Option<PathBuf>,
    /// The token agents register with. Default: <data-dir>/join.token, created likewise.
    #[arg(long)]
    join_token_file: Option<PathBuf>,
    #[command(flatten)]
    tls: kairos_proto::wire::TlsFiles,
    /// Require every client (peers, agents, users) to present a certificate signed by --ca.
    #[arg(long, requires = "ca")]
    mutual_tls: bool,
    /// Read flags from this TOML file: keys are the long flags with underscores (data_dir = "…"),
    /// values as on the command line; a flag given on the command line wins.
    #[arg(long, value_name = "FILE.toml")]
    config: Option<PathBuf>,
    /// Serve Prometheus metrics at http://HOST:PORT/metrics.
    #[arg(long, value_name = "HOST:PORT")]
    metrics_addr: Option<String>,
    /// Serve the JSON HTTP API (`/api/v1/…`, described at `/api/v1/openapi.json`) and the web UI
    /// at http://HOST:PORT/: the same calls, tokens, roles and limits as the gRPC API.
    #[arg(long, value_name = "HOST:PORT")]
    http_addr: Option<String>,
    /// The time a client of --http-addr has to send a whole request, head (at most 10 s of it)
    /// and body; past it the request is answered 408 and its connection closed.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = humantime::parse_duration)]
    http_request_timeout: Duration,
    /// Log lines as text (colours only on a terminal) or as JSON objects.
    #[arg(long, value_enum, default_value_t = kairos_telemetry::logs::LogFormat::Text)]
    log_format: kairos_telemetry::logs::LogFormat,
    /// Fault injection (tests only): exit right after a RunInstances succeeds, before its
    /// result is committed.
    #[arg(long, hide = true)]
    burst_test_crash_after_launch: bool,
}

/// The command line, with `--config FILE` expanded (a bad file is a command-line error: exit 2).
fn parse_args() -> Args {
    use clap::CommandFactory;
    match kairos_telemetry::config::expand(std::env::args_os().collect(), &Args::command()) {
        Ok(argv) => Args::parse_from(argv),
        Err(e) => {
            eprintln!("kairosd: --config: {e}");
            std::process::exit(2);
        }
    }
}

fn parse_peers(args: &Args) -> anyhow::Result<BTreeMap<ReplicaId, String>> {
    let mut members = BTreeMap::new();
    for p in &args.peers {
        let (id, addr) = p.split_once('=').with_context(|| format!("peer \"{p}\" is not ID=HOST:PORT"))?;
        let id: ReplicaId = id.parse().with_context(|| format!("peer id \"{id}\" is not a number"))?;
        members.insert(id, addr.to_string());
    }
    if members.is_empty() {
        members.insert(args.id, args.addr.clone());
    }
    match members.get(&args.id) {
        _ if args.id == 0 => bail!("--id 0 is reserved; replica ids start at 1"),
        Some(addr) if *addr == args.addr => Ok(members),
        Some(addr) => {
            bail!("--peers gives replica {} the address {addr}, but --addr is {}", args.id, args.addr)
        }
        None => bail!("--peers does not include this replica ({})", args.id),
    }
}

/// The IP addresses of the other replicas (as their addresses resolve now).
fn peer_ips(members: &BTreeMap<ReplicaId, String>, me: ReplicaId) -> Vec<std::net::IpAddr> {
    use std::net::ToSocketAddrs;
    members
        .iter()
        .filter(|(id, _)| **id != me)
        .flat_map(|(_, addr)| addr.to_socket_addrs().into_iter().flatten().map(|a| a.ip()))
        .collect()
}

/// The cluster secret, and the admin and join tokens (files, created with defaults as documented
/// on the flags).
fn load_auth(args: &Args, members: usize) -> anyhow::Result<(auth::Auth, String)> {
    use kairos_consensus::auth::{read_credential, write_private_new, ClusterKey};
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("creating {}", args.data_dir.display()))?;
    // It holds every job's environment, token digests and the cluster secret: owner-only.
    std::fs::set_permissions(&args.data_dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .with_context(|| format!("making {} owner-only", args.data_dir.display()))?;
    let (secret_path, create) = match &args.cluster_secret_file {
        Some(p) => (p.clone(), false),
        None if members > 1 || args.join => bail!(
            "a cluster of several replicas needs --cluster-secret-file (the same file on every replica)"
        ),
        None => (args.data_dir.join("cluster.secret"), true),
    };
    let key = ClusterKey::load(&secret_path, create)?;
    let token = |flag: &Option<PathBuf>, file: &str, prefix: &str| -> anyhow::Result<String> {
        let path = flag.clone().unwrap_or_else(|| args.data_dir.join(file));
        if flag.is_none() {
            write_private_new(&path, &format!("{prefix}.{}", key.derive(file)))?;
        }
        Ok(read_credential(&path, 16)?)
    };
    let admin = token(&args.admin_token_file, "admin.token", "kairos-admin")?;
    let join = token(&args.join_token_file, "join.token", "kairos-join")?;
    Ok((auth::Auth::new(key, &admin, &join), join))
}

/// Seeds this replica's empty data directory from a backup (`--restore-from`).
fn restore(
    args: &Args,
    members: &BTreeMap<ReplicaId, String>,
    file: &std::path::Path,
    key: &kairos_consensus::auth::ClusterKey,
) -> anyhow::Result<()> {
    let lowest = members.keys().next().copied().unwrap_or(args.id);
    if lowest != args.id {
        bail!(
            "--restore-from is given to the replica that starts the new cluster, the lowest id in --peers ({lowest}); \
             start the others empty"
        );
    }
    let bytes = std::fs::read(file).with_context(|| format!("--restore-from: reading {}", file.display()))?;
    let (header, seeded) = kairos_consensus::backup::seed(&args.data_dir, members, &bytes, key)
        .with_context(|| format!("--restore-from {}", file.display()))?;
    if seeded {
        tracing::info!(file = %file.display(), index = header.applied_index, "restored from a backup");
        println!(
            "kairosd {} restored the state of {} (applied index {}, taken at {} ms)",
            args.id,
            file.display(),
            header.applied_index,
            header.taken_at_ms
        );
    } else {
        tracing::info!(file = %file.display(), "already restored from this backup; starting as usual");
    }
    Ok(())
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot listen for SIGTERM");
            return std::future::pending().await;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// How long a stopping kairosd lets open calls (agents' assignment streams, followed logs)
/// finish before it exits anyway.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

/// The replica's settings, with the timing rules checked: agents hold a lease of half the
/// node timeout and must renew it more than once; elections outlast heartbeats.
fn replica_config(
    args: &Args,
    auth: &auth::Auth,
    peer_tls: Option<tonic::transport::ClientTlsConfig>,
) -> anyhow::Result<ReplicaConfig> {
    let config = ReplicaConfig {
        id: args.id,
        addr: args.addr.clone(),
        snapshot_logs: args.snapshot_logs,
        join: args.join,
        heartbeat_ms: args.raft_heartbeat_ms,
        election_timeout_ms: args.election_timeout_ms,
        key: auth.key.clone(),
        peer_tls,
    };
    if args.heartbeat_ms == 0 || args.node_timeout_ms < 4 * args.heartbeat_ms {
        bail!("--node-timeout-ms must be at least 4 × --heartbeat-ms: agents hold a lease of half the node timeout and must renew it more than once");
    }
    if config.heartbeat_ms == 0 || config.election_timeout_ms <= config.heartbeat_ms {
        bail!("--election-timeout-ms must be larger than --raft-heartbeat-ms (and both above 0)");
    }
    Ok(config)
}

/// What every service and loop of this replica shares.
fn context(
    args: &Args,
    replica: &Replica,
    auth: auth::Auth,
    agent_tls: Option<tonic::transport::ClientTlsConfig>,
) -> Ctx {
    let ms = |d: Duration| d.as_millis().min(i64::MAX as u128) as i64;
    Ctx {
        replica: replica.clone(),
        kick: Arc::new(Notify::new()),
        heartbeats: Arc::default(),
        batcher: batch::Batcher::start(replica.clone()),
        reasons: Arc::default(),
        auth: Arc::new(auth),
        agent_tls,
        retention: kairos_scheduler::history::Retention {
            job_ms: ms(args.job_retention),
            history_max_jobs: args.history_max_jobs,
            history_max_age_ms: ms(args.history_retention),
        },
        submit_limits: kairos_scheduler::quota::SubmitLimits {
            max_jobs_per_user: args.max_jobs_per_user,
            max_jobs: args.max_jobs,
            any_qos: false,
        },
        timing: Timing {
            heartbeat_interval: Duration::from_millis(args.heartbeat_ms),
            node_timeout: Duration::from_millis(args.node_timeout_ms),
            tick: Duration::from_millis(args.tick_ms),
        },
        metrics: Arc::default(),
    }
}

/// The metrics endpoint at `--metrics-addr`, when asked for.
async fn serve_metrics(args: &Args, ctx: &Ctx) -> anyhow::Result<Option<tokio::task::JoinHandle<()>>> {
    let Some(addr) = &args.metrics_addr else { return Ok(None) };
    let listener =
        kairos_telemetry::http::bind(addr).await.with_context(|| format!("binding --metrics-addr {addr}"))?;
    let at = listener.local_addr()?;
    tracing::info!(metrics = %format!("http://{at}/metrics"), "serving metrics");
    // The plain announcement only beside plain logs: `--log-format json` writes JSON only.
    if args.log_format == kairos_telemetry::logs::LogFormat::Text {
        println!("kairosd {} metrics at http://{at}/metrics", args.id);
    }
    let c = ctx.clone();
    let served =
        kairos_telemetry::http::serve(listener, Arc::new(move || metrics::render(&c.replica, &c.metrics)));
    Ok(Some(tokio::spawn(async move {
        let _ = served.await;
    })))
}

/// The JSON API and web UI at `--http-addr`, when asked for: a gateway to this replica's own
/// gRPC port (`listen`), dialled over loopback, or at `--addr` with TLS.
async fn serve_http(
    args: &Args,
    ctx: &Ctx,
    listen: std::net::SocketAddr,
    tls: Option<tonic::transport::ClientTlsConfig>,
    limit: connlimit::ConnLimit,
) -> anyhow::Result<Option<tokio::task::JoinHandle<()>>> {
    let Some(addr) = &args.http_addr else { return Ok(None) };
    if args.http_request_timeout < Duration::from_secs(1) {
        bail!("--http-request-timeout must be at least 1s");
    }
    let grpc_url = match (&tls, args.tls.cert.is_some()) {
        (Some(_), true) => kairos_proto::wire::url(&args.addr, true),
        (None, true) => {
            bail!("--http-addr with --cert needs --ca: the gateway verifies this replica's certificate")
        }
        _ => {
            let ip = match listen.ip() {
                ip if ip.is_unspecified() && ip.is_ipv4() => std::net::Ipv4Addr::LOCALHOST.into(),
                ip if ip.is_unspecified() => std::net::Ipv6Addr::LOCALHOST.into(),
                ip => ip,
            };
            kairos_proto::wire::url(&std::net::SocketAddr::new(ip, listen.port()).to_string(), false)
        }
    };
    let gateway = crate::gateway::Gateway::new(crate::gateway::Options {
        grpc_url,
        tls,
        key: ctx.auth.key.clone(),
        body_max: API_MESSAGE_BYTES_MAX,
        check: token_check(ctx),
        request_timeout: args.http_request_timeout,
    })?;
    let listener =
        tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding --http-addr {addr}"))?;
    let at = listener.local_addr()?;
    tracing::info!(http = %format!("http://{at}/"), "serving the web UI and JSON API");
    if args.log_format == kairos_telemetry::logs::LogFormat::Text {
        println!("kairosd {} web UI and JSON API at http://{at}/", args.id);
    }
    Ok(Some(tokio::spawn(crate::gateway::serve(listener, Arc::new(gateway), limit))))
}

/// The gateway's check of a token before it reads a body: the services' own (`Ctx::principal`),
/// made from the token alone; the user it names.
fn token_check(ctx: &Ctx) -> crate::gateway::TokenCheck {
    let ctx = ctx.clone();
    Arc::new(move |token: &str| {
        let mut metadata = tonic::metadata::MetadataMap::new();
        kairos_consensus::auth::set_bearer(&mut metadata, token);
        let request = tonic::Request::from_parts(metadata, Default::default(), ());
        ctx.principal(&request).map(|me| me.user)
    })
}

/// The connection bounds of both the gRPC port and --http-addr (one count for both), fitted
/// under the descriptor limit after raising it to the hard limit where allowed.
fn connection_limit(args: &Args, members: &BTreeMap<ReplicaId, String>) -> connlimit::ConnLimit {
    let nofile = match connlimit::raise_nofile() {
        Ok((before, after)) => {
            if after > before {
                tracing::info!(
                    before,
                    after,
                    "raised the soft descriptor limit (RLIMIT_NOFILE) to the hard one"
                );
            }
            after
        }
        Err(e) => {
            tracing::warn!(error = %e, "could not raise the descriptor limit (RLIMIT_NOFILE)");
            connlimit::nofile().unwrap_or(1024)
        }
    };
    let peers = members.len().saturating_sub(1);
    let asked = (args.max_connections_per_address, args.max_connections);
    let bounds = connlimit::fit(nofile, peers, asked.0, asked.1);
    if (bounds.per_address, bounds.total) != asked {
        tracing::warn!(
            nofile,
            per_address = bounds.per_address,
            total = bounds.total,
            "connection bounds lowered to fit the descriptor limit (raise LimitNOFILE / ulimit -n for more)"
        );
    } else {
        tracing::info!(nofile, per_address = bounds.per_address, total = bounds.total, "connection bounds");
    }
    connlimit::ConnLimit::new(bounds.per_address, bounds.total)
}

fn burst_options(args: &Args, join_token: String) -> burst::BurstOptions {
    burst::BurstOptions {
        cluster: args.cluster_name.clone(),
        endpoint: args.burst_endpoint.clone(),
        interval: Duration::from_millis(args.burst_interval_ms),
        leak_grace: Duration::from_millis(args.burst_leak_grace_ms),
        vanish_grace: Duration::from_millis(args.burst_vanish_grace_ms),
        crash_after_launch: args.burst_test_crash_after_launch,
        join_token,
    }
}

/// Passes what only the leader answers on to it, once the caller's headers pass the same
/// check the services make (`forward`).
fn forwarder(ctx: &Ctx) -> forward::Forwarder {
    let gate: forward::Gate = {
        let ctx = ctx.clone();
        Arc::new(move |headers: &http::HeaderMap| {
            let metadata = tonic::metadata::MetadataMap::from_headers(headers.clone());
            let request = tonic::Request::from_parts(metadata, Default::default(), ());
            ctx.principal(&request).map(|_| ())
        })
    };
    forward::Forwarder::new(
        ctx.replica.clone(),
        gate,
        ctx.agent_tls.clone(),
        API_MESSAGE_BYTES_MAX,
        ctx.metrics.clone(),
    )
}

/// The accepted connections the server serves: bounded per address and in all (the other
/// replicas never refused by the total), closed when silent past the handshake or idle
/// timeout; a failed accept (out of descriptors) backs off.
fn incoming(
    listener: tokio::net::TcpListener,
    args: &Args,
    members: &BTreeMap<ReplicaId, String>,
    limit: connlimit::ConnLimit,
) -> impl tokio_stream::Stream<Item = std::io::Result<connlimit::Counted>> {
    use tokio_stream::StreamExt;
    let limit = limit
        .with_timeouts(connlimit::Timeouts {
            handshake: args.handshake_timeout,
            idle: args.idle_timeout.max(connlimit::KEEPALIVE_INTERVAL * 2),
        })
        .with_peers(peer_ips(members, args.id));
    tonic::transport::server::TcpIncoming::from(listener)
        .with_nodelay(Some(true))
        .then(|conn| async move {
            if let Err(e) = &conn {
                // Out of descriptors (EMFILE) fails every accept until one closes.
                tracing::warn!(error = %e, "accepting a connection failed");
                tokio::time::sleep(connlimit::ACCEPT_BACKOFF).await;
            }
            conn
        })
        .filter_map(move |conn| match conn {
            Ok(stream) => limit.admit(stream).map(Ok),
            Err(e) => Some(Err(e)),
        })
}

/// Becomes true at SIGINT or SIGTERM.
fn stop_on_signal() -> tokio::sync::watch::Receiver<bool> {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!("stopping");
        let _ = stop_tx.send(true);
    });
    stop_rx
}

/// Serves the gRPC services (health, reflection, jobs, agents, admin, Raft) on `listener`
/// until SIGINT or SIGTERM, then lets open calls finish for a grace.
async fn serve(
    args: &Args,
    ctx: &Ctx,
    members: &BTreeMap<ReplicaId, String>,
    listener: tokio::net::TcpListener,
    limit: connlimit::ConnLimit,
    server_tls: Option<tonic::transport::ServerTlsConfig>,
    health_service: tonic_health::pb::health_server::HealthServer<
        impl tonic_health::pb::health_server::Health,
    >,
) -> anyhow::Result<()> {
    let forwarder = forwarder(ctx);
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(kairos_proto::v1::FILE_DESCRIPTOR_SET)
        .build_v1()
        .context("building the reflection service")?;

    let mut stop_rx = stop_on_signal();
    let mut stopping = stop_rx.clone();
    let mut server = tonic::transport::Server::builder()
        .max_concurrent_streams(Some(connlimit::STREAMS_MAX))
        // Pings make an idle but live client's connection speak (its acknowledgements), so the
        // idle timeout below closes only the silent ones.
        .http2_keepalive_interval(Some(connlimit::KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(connlimit::KEEPALIVE_INTERVAL));
    if let Some(tls) = server_tls {
        server = server.tls_config(tls).context("TLS settings")?;
    }
    let server = server
        .add_service(health_service)
        .add_service(reflection)
        // Every service but health and reflection checks its caller from the headers before a
        // body is decoded (the handlers check again, with the decoded request).
        // Followers pass what only the leader answers to it (`forward`).
        .add_service(
            forwarder.wrap(tonic::service::interceptor::InterceptedService::new(
                JobServiceServer::new(jobs::JobApi {
                    ctx: ctx.clone(),
                    limiter: Arc::new(ratelimit::SubmitLimiter::new(
                        args.submit_rate_per_user,
                        args.submit_burst_per_user,
                    )),
                })
                .max_decoding_message_size(API_MESSAGE_BYTES_MAX),
                user_gate(ctx.clone()),
            )),
        )
        .add_service(tonic::service::interceptor::InterceptedService::new(
            AgentServiceServer::new(agents::AgentApi::new(ctx.clone()))
                .max_decoding_message_size(API_MESSAGE_BYTES_MAX),
            auth::agent_gate(ctx.auth.clone()),
        ))
        .add_service(
            forwarder.wrap(tonic::service::interceptor::InterceptedService::new(
                AdminServiceServer::new(admin::AdminApi {
                    ctx: ctx.clone(),
                    burst_endpoint: args.burst_endpoint.clone(),
                })
                .max_decoding_message_size(API_MESSAGE_BYTES_MAX),
                user_gate(ctx.clone()),
            )),
        )
        .add_service(RaftRpc::server(
            ctx.replica.raft.clone(),
            members.keys().copied().collect(),
            ctx.auth.key.clone(),
            ctx.replica.contact.clone(),
        ))
        .serve_with_incoming_shutdown(incoming(listener, args, members, limit), async move {
            let _ = stop_rx.changed().await;
        });
    tokio::select! {
        served = server => served.context("serving gRPC")?,
        // Long-lived streams never end by themselves: after the grace, stop regardless.
        _ = async {
            let _ = stopping.changed().await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        } => tracing::warn!("open calls did not finish within the shutdown grace"),
    }

    Ok(())
}

/// Runs kairosd with the process's command line until it is told to stop.
pub async fn run() -> anyhow::Result<()> {
    // Everything kairosd creates (log segments, snapshots, metadata, backups it seeds from) is
    // its own alone: files 0600, directories 0700.
    // SAFETY: umask only sets this process's file mode creation mask.
    unsafe { libc::umask(0o077) };
    let args = parse_args();
    kairos_telemetry::logs::init(args.log_format, "info,openraft=warn");
    if !memory::no_huge_pages() {
        tracing::info!("transparent huge pages stay on (PR_SET_THP_DISABLE refused)");
    }
    let mut traces = kairos_telemetry::traces::init("kairosd");
    let members = parse_peers(&args)?;
    let (flag, bind) = match &args.listen {
        Some(l) => ("--listen", l),
        None => ("--addr", &args.addr),
    };
    let listen: std::net::SocketAddr =
        bind.parse().with_context(|| format!("{flag} \"{bind}\" is not HOST:PORT"))?;
    let listener =
        tokio::net::TcpListener::bind(listen).await.with_context(|| format!("binding {listen}"))?;

    let (auth, join_token) = load_auth(&args, members.len())?;
    let tls = args.tls.clone();
    let server_tls = tls.server(args.mutual_tls)?;
    let client_tls = tls.client()?;
    let config = replica_config(&args, &auth, client_tls.clone())?;
    // Fail-stop: any storage error ends this process, non-zero, with the error in its log.
    kairos_consensus::failstop::on_storage_error(|what| {
        tracing::error!(error = %what, "storage error: this replica stops (fail-stop)");
        eprintln!("kairosd: storage error, stopping: {what}");
        std::process::exit(3);
    });
    if let Some(file) = &args.restore_from {
        restore(&args, &members, file, &auth.key)?;
    }
    let replica = Replica::open(&config, &args.data_dir, &members)
        .await
        .with_context(|| format!("opening replica data in {}", args.data_dir.display()))?;
    let ctx = context(&args, &replica, auth, client_tls.clone());
    let metrics_task = serve_metrics(&args, &ctx).await?;
    let limit = connection_limit(&args, &members);
    let http_task = serve_http(&args, &ctx, listen, client_tls.clone(), limit.clone()).await?;
    let leader_task = tokio::spawn(leader::run(ctx.clone()));
    let watchdog_task = tokio::spawn(kairos_consensus::failover::run(replica.clone()));
    let burst_task = tokio::spawn(burst::run(ctx.clone(), burst_options(&args, join_token)));

    let (health, health_service) = tonic_health::server::health_reporter();
    let health_task = tokio::spawn(health::run(replica.clone(), health));
    tracing::info!(id = args.id, addr = %args.addr, data_dir = %args.data_dir.display(), "kairosd serving");
    if args.log_format == kairos_telemetry::logs::LogFormat::Text {
        println!("kairosd {} listening on {listen} (dialled as {})", args.id, args.addr);
    }
    serve(&args, &ctx, &members, listener, limit, server_tls, health_service).await?;

    tracing::info!("shutting down");
    leader_task.abort();
    watchdog_task.abort();
    burst_task.abort();
    health_task.abort();
    for t in [metrics_task, http_task].into_iter().flatten() {
        t.abort();
    }
    traces.shutdown();
    if let Err(e) = replica.raft.shutdown().await {
        tracing::warn!(error = %e, "raft shutdown");
    }
    Ok(())
}

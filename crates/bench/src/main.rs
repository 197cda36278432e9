//! kairos-bench: benchmarks against a fresh multi-replica cluster of real `kairosd` processes on
//! loopback (real sled files, fsync on). Each prints one JSON object on stdout.
//!
//! - `submit`: C concurrent gRPC clients submit jobs that stay pending (no agents) for S seconds;
//!   prints throughput and latency percentiles of acknowledged submits.
//! - `failover`: under a steady submit stream, SIGKILLs the leader each round and measures the
//!   gap from the kill to the first acknowledged submit.
//! - `entry-path`: a log entry's data path per submit (encode, decode, log record, apply) in one
//!   process, steady to a few percent where the cluster benches move by tens.
//! - `etcd-put`: the `submit` load against a running etcd cluster's `KV.Put` (`etcd`), for
//!   `scripts/bench-vs-etcd.sh`.
//!
//! Build in release first: `cargo build --release --bins`; kairosd is taken from beside this
//! binary.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use hdrhistogram::Histogram;
use kairos_proto::v1 as pb;
use kairos_proto::v1::admin_service_client::AdminServiceClient;
use kairos_proto::v1::job_service_client::JobServiceClient;
use serde_json::json;
use tonic::transport::{Channel, Endpoint};

mod cpu;
mod entry;
mod etcd;
mod floor;

#[derive(Parser)]
#[command(name = "kairos-bench", about = "kairos benchmarks (JSON on stdout)")]
struct Args {
    #[command(subcommand)]
    command: Bench,
}

/// The closed-loop load of `submit`, `etcd-put` and `grpc-floor`.
#[derive(clap::Args)]
struct LoadArgs {
    #[arg(long, default_value_t = 64)]
    clients: usize,
    /// HTTP/2 connections to each server, shared by the clients (default: one per client).
    #[arg(long)]
    conns: Option<usize>,
    #[arg(long, default_value_t = 10)]
    seconds: u64,
}

impl LoadArgs {
    /// Clients, connections per server, seconds (at least one client and connection).
    fn get(&self) -> (usize, usize, u64) {
        let clients = self.clients.max(1);
        (clients, self.conns.unwrap_or(clients).max(1), self.seconds)
    }
}

#[derive(Subcommand)]
enum Bench {
    /// Submit throughput and latency on a fresh cluster.
    Submit {
        #[arg(long, default_value_t = 3)]
        controllers: u64,
        #[command(flatten)]
        load: LoadArgs,
    },
    /// Urgent-job time to start under preemption: agents full of REQUEUE jobs (grace 0).
    Preempt {
        #[arg(long, default_value_t = 3)]
        controllers: u64,
        #[arg(long, default_value_t = 2)]
        agents: u32,
        #[arg(long, default_value_t = 8)]
        gpus_per_agent: u32,
        #[arg(long, default_value_t = 50)]
        rounds: usize,
    },
    /// Full scheduling passes of the pure core on a large synthetic cluster.
    Schedule {
        #[arg(long, default_value_t = 10_000)]
        nodes: u32,
        #[arg(long, default_value_t = 8)]
        gpus_per_node: u32,
        #[arg(long, default_value_t = 100_000)]
        pending: u32,
        #[arg(long, default_value_t = 50_000)]
        running: u32,
        #[arg(long, default_value_t = 10)]
        passes: usize,
        /// Pending one-GPU inference jobs ask a fraction of a GPU (100, 250 or 500 thousandths,
        /// as the trace's `gpu_milli`) instead of a whole one.
        #[arg(long)]
        fractions: bool,
    },
    /// The submit load (closed loop) as puts to a running etcd.
    EtcdPut {
        /// etcd client addresses, comma-separated (host:port).
        #[arg(long, value_delimiter = ',', required = true)]
        endpoints: Vec<String>,
        #[command(flatten)]
        load: LoadArgs,
        /// Bytes per value (default: about an encoded submit request).
        #[arg(long, default_value_t = 256)]
        value_bytes: usize,
        /// The members' process ids, comma-separated, to report their CPU time per put.
        #[arg(long, value_delimiter = ',')]
        pids: Vec<u32>,
    },
    /// The log entry's data path per submit, in one process: encode, decode, log record, apply.
    EntryPath {
        #[arg(long, default_value_t = 60_000)]
        submits: usize,
        /// Submits per log entry (the group commit's size under `submit`'s load).
        #[arg(long, default_value_t = 22)]
        per_entry: usize,
        /// Distinct users (one per client, as `submit`).
        #[arg(long, default_value_t = 64)]
        users: usize,
        /// Fairshare accounts in the policy (under the root, the users spread over them).
        #[arg(long, default_value_t = 1)]
        accounts: usize,
    },
    /// The submit load against a server that answers at once: the gRPC edge's own cost.
    GrpcFloor {
        #[command(flatten)]
        load: LoadArgs,
    },
    /// The server `grpc-floor` starts (in a process of its own).
    #[command(hide = true)]
    FloorServe {
        #[arg(long)]
        addr: String,
    },
    /// Leader-failover gap under a steady submit stream.
    Failover {
        #[arg(long, default_value_t = 3)]
        controllers: u64,
        #[arg(long, default_value_t = 10)]
        rounds: usize,
        /// Concurrent submitters during the test.
        #[arg(long, default_value_t = 4)]
        clients: usize,
    },
}

fn sibling(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("locating kairos-bench")?;
    let path = exe.parent().map(|d| d.join(name)).context("locating the binaries' directory")?;
    if !path.exists() {
        bail!("{} not found: run `cargo build --release --bins` first", path.display());
    }
    Ok(path)
}

fn free_addr() -> anyhow::Result<String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("binding an ephemeral port")?;
    Ok(l.local_addr()?.to_string())
}

/// A fresh cluster of kairosd processes; stopped on drop.
struct Cluster {
    dir: tempfile::TempDir,
    addrs: Vec<String>,
    children: Vec<Option<Child>>,
    kairosd: PathBuf,
}

impl Cluster {
    fn start(replicas: u64) -> anyhow::Result<Cluster> {
        let dir = tempfile::Builder::new().prefix("kairos-bench-").tempdir()?;
        let addrs = (0..replicas).map(|_| free_addr()).collect::<anyhow::Result<Vec<_>>>()?;
        for (file, content) in [
            ("cluster.secret", "bench-cluster-secret-0123456789abcdef0123456789"),
            ("admin.token", ADMIN_TOKEN),
            ("join.token", "kairos-join.bench-0123456789abcdef"),
        ] {
            std::fs::write(dir.path().join(file), content)?;
        }
        let mut c = Cluster { dir, addrs, children: Vec::new(), kairosd: sibling("kairosd")? };
        for i in 0..replicas as usize {
            let child = c.spawn(i)?;
            c.children.push(Some(child));
        }
        Ok(c)
    }

    fn spawn(&self, i: usize) -> anyhow::Result<Child> {
        let peers: Vec<String> =
            self.addrs.iter().enumerate().map(|(j, a)| format!("{}={a}", j + 1)).collect();
        let log = std::fs::File::create(self.dir.path().join(format!("kairosd-{}.log", i + 1)))?;
        let mut cmd = Command::new(&self.kairosd);
        cmd.args(["--id", &(i + 1).to_string(), "--addr", &self.addrs[i]])
            .arg("--data-dir")
            .arg(self.dir.path().join(format!("controller-{}", i + 1)))
            .arg("--cluster-secret-file")
            .arg(self.dir.path().join("cluster.secret"))
            .arg("--admin-token-file")
            .arg(self.dir.path().join("admin.token"))
            .arg("--join-token-file")
            .arg(self.dir.path().join("join.token"))
            // The submit benchmark leaves every job pending: its own state bounds, not the
            // defaults, keep it from refusing submits mid-run.
            .args(["--max-jobs-per-user", "4000000000", "--max-jobs", "4000000000"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        if self.addrs.len() > 1 {
            cmd.args(["--peers", &peers.join(",")]);
        }
        cmd.spawn().context("starting kairosd")
    }

    fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.children[i].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn restart(&mut self, i: usize) -> anyhow::Result<()> {
        let child = self.spawn(i)?;
        self.children[i] = Some(child);
        Ok(())
    }

    /// The leader's term (0 when no leader answers).
    async fn term(&self) -> u64 {
        let Ok(i) = self.leader(Duration::from_secs(5)).await else { return 0 };
        let Ok(ch) = connect(&self.addrs[i]).await else { return 0 };
        match AdminServiceClient::new(ch).cluster_status(pb::ClusterStatusRequest {}).await {
            Ok(s) => s.into_inner().term,
            Err(_) => 0,
        }
    }

    /// The index of the replica that reports itself leader.
    async fn leader(&self, within: Duration) -> anyhow::Result<usize> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            for (i, addr) in self.addrs.iter().enumerate() {
                if self.children[i].is_none() {
                    continue;
                }
                let Ok(ch) = connect(addr).await else { continue };
                if let Ok(s) = AdminServiceClient::new(ch).cluster_status(pb::ClusterStatusRequest {}).await {
                    let s = s.into_inner();
                    if s.leader == Some(s.id) {
                        return Ok(i);
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        bail!("no leader within {within:?}")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.children.len() {
            self.kill(i);
        }
    }
}

/// The benchmark cluster's bootstrap admin token (it acts as one user per submit client).
const ADMIN_TOKEN: &str = "kairos-admin.bench-0123456789abcdef";

fn with_token(mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
    kairos_proto::wire::set_bearer(req.metadata_mut(), ADMIN_TOKEN);
    Ok(req)
}

/// A channel whose every call carries the admin token.
type Conn = tonic::service::interceptor::InterceptedService<
    Channel,
    fn(tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status>,
>;

async fn connect(addr: &str) -> Result<Conn, tonic::transport::Error> {
    let channel = Endpoint::from_shared(format!("http://{addr}"))?
        .connect_timeout(Duration::from_millis(500))
        .connect()
        .await?;
    Ok(tonic::service::interceptor::InterceptedService::new(channel, with_token as _))
}

fn spec() -> pb::JobSpec {
    pb::JobSpec {
        name: "bench".into(),
        argv: vec!["true".into()],
        resources: Some(pb::Resources { gpus: 1, ..Default::default() }),
        ..Default::default()
    }
}

/// The load's HTTP/2 connections: `per_replica` to each replica, shared round-robin by the
/// clients (client `c` uses connection `c mod per_replica` of its target), each multiplexing its
/// clients' calls as gRPC clients sharing a channel do.
struct Pool {
    per_replica: usize,
    conns: Mutex<std::collections::HashMap<(usize, usize), Conn>>,
}

impl Pool {
    fn new(per_replica: usize) -> Pool {
        Pool { per_replica: per_replica.max(1), conns: Mutex::new(Default::default()) }
    }

    async fn get(
        &self,
        addrs: &[String],
        target: usize,
        client: usize,
    ) -> Result<Conn, tonic::transport::Error> {
        let key = (target, client % self.per_replica);
        if let Some(c) = self.conns.lock().ok().and_then(|m| m.get(&key).cloned()) {
            return Ok(c);
        }
        let c = connect(&addrs[target]).await?;
        if let Ok(mut m) = self.conns.lock() {
            return Ok(m.entry(key).or_insert(c).clone());
        }
        Ok(c)
    }

    fn forget(&self, target: usize, client: usize) {
        if let Ok(mut m) = self.conns.lock() {
            m.remove(&(target, client % self.per_replica));
        }
    }
}

/// One client: submits in a loop until `stop`, following leader hints, recording latencies of
/// acknowledged submits.
async fn client_loop(
    addrs: Vec<String>,
    pool: Arc<Pool>,
    client: usize,
    stop: Arc<AtomicBool>,
    hist: Arc<Mutex<Histogram<u64>>>,
    acked: Arc<AtomicU64>,
    last_ack: Arc<Mutex<Instant>>,
) {
    let mut target = client % addrs.len();
    let mut conn: Option<JobServiceClient<Conn>> = None;
    let mut seq = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let mut jobs = match conn.take() {
            Some(c) => c,
            None => match pool.get(&addrs, target, client).await {
                Ok(ch) => JobServiceClient::new(ch),
                Err(_) => {
                    pool.forget(target, client);
                    target = (target + 1) % addrs.len();
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        seq += 1;
        let mut req = tonic::Request::new(pb::SubmitRequest {
            spec: Some(spec()),
            request_id: format!("bench-{client}-{seq}"),
        });
        // One user per client: the per-user submit rate limit must not shape the measurement.
        if let Ok(user) = format!("bench-{client}").parse() {
            req.metadata_mut().insert("kairos-user", user);
        }
        let t0 = Instant::now();
        let result = tokio::time::timeout(Duration::from_secs(10), jobs.submit(req)).await;
        match result {
            Ok(Ok(answer)) => {
                let us = t0.elapsed().as_micros() as u64;
                if let Ok(mut h) = hist.lock() {
                    let _ = h.record(us.max(1));
                }
                acked.fetch_add(1, Ordering::Relaxed);
                if let Ok(mut t) = last_ack.lock() {
                    *t = Instant::now();
                }
                // A follower relayed it: go to the leader it names (as a client that saves the hop).
                let hint = answer.metadata().get("kairos-leader").and_then(|v| v.to_str().ok());
                match hint.and_then(|h| addrs.iter().position(|a| a == h)) {
                    Some(i) if i != target => target = i,
                    _ => conn = Some(jobs),
                }
            }
            Ok(Err(status)) => {
                let hint = status.metadata().get("kairos-leader").and_then(|v| v.to_str().ok());
                match hint.and_then(|h| addrs.iter().position(|a| a == h)) {
                    Some(i) if i != target => target = i,
                    _ => {
                        target = (target + 1) % addrs.len();
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
            Err(_) => {
                pool.forget(target, client);
                target = (target + 1) % addrs.len();
            }
        }
    }
}

struct Load {
    stop: Arc<AtomicBool>,
    hist: Arc<Mutex<Histogram<u64>>>,
    acked: Arc<AtomicU64>,
    last_ack: Arc<Mutex<Instant>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

fn start_load(addrs: &[String], clients: usize, conns: usize) -> anyhow::Result<Load> {
    let pool = Arc::new(Pool::new(conns));
    let hist = Arc::new(Mutex::new(Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?));
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicU64::new(0));
    let last_ack = Arc::new(Mutex::new(Instant::now()));
    let tasks = (0..clients)
        .map(|c| {
            tokio::spawn(client_loop(
                addrs.to_vec(),
                pool.clone(),
                c,
                stop.clone(),
                hist.clone(),
                acked.clone(),
                last_ack.clone(),
            ))
        })
        .collect();
    Ok(Load { stop, hist, acked, last_ack, tasks })
}

impl Load {
    async fn finish(self) -> Histogram<u64> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            let _ = t.await;
        }
        let h = self.hist.lock().map(|h| h.clone());
        h.unwrap_or_else(|_| Histogram::new(3).expect("histogram"))
    }
}

async fn bench_submit(
    controllers: u64,
    clients: usize,
    conns: usize,
    seconds: u64,
) -> anyhow::Result<serde_json::Value> {
    let cluster = Cluster::start(controllers)?;
    cluster.leader(Duration::from_secs(20)).await?;
    // Warm up connections and the leader, then measure.
    let warm = start_load(&cluster.addrs, clients, conns)?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    warm.finish().await;
    let term_before = cluster.term().await;
    // This process (the clients) first, then each replica.
    let mut pids = vec![std::process::id()];
    pids.extend(cluster.children.iter().map(|c| c.as_ref().map_or(0, |c| c.id())));
    let load = start_load(&cluster.addrs, clients, conns)?;
    let t0 = Instant::now();
    let cpu = cpu::Window::start(&pids);
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let acked = load.acked.clone();
    let hist = load.finish().await;
    let elapsed = t0.elapsed().as_secs_f64();
    let per_submit = cpu.per_op(hist.len());
    let leader = cluster.leader(Duration::from_secs(5)).await.ok();
    let term_after = cluster.term().await;
    let ms = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
    let replicas = &per_submit[1..];
    let followers: Vec<f64> =
        replicas.iter().enumerate().filter(|(i, _)| Some(*i) != leader).map(|(_, c)| *c).collect();
    Ok(json!({
        "bench": "submit",
        "controllers": controllers,
        "clients": clients,
        "connections_per_replica": conns,
        "seconds": seconds,
        "acknowledged": acked.load(Ordering::Relaxed),
        "submits_per_s": (hist.len() as f64 / elapsed).round(),
        "p50_ms": ms(0.50),
        "p99_ms": ms(0.99),
        "max_ms": hist.max() as f64 / 1000.0,
        "elections_during_run": term_after.saturating_sub(term_before),
        // CPU time (user + system) per acknowledged submit, in µs, over the measured window.
        "cpu_us_per_submit": {
            "clients": per_submit[0],
            "leader": leader.map(|l| replicas[l]),
            "followers": followers,
            "all": (per_submit.iter().sum::<f64>() * 10.0).round() / 10.0,
        },
    }))
}

async fn bench_failover(
    controllers: u64,
    rounds: usize,
    clients: usize,
) -> anyhow::Result<serde_json::Value> {
    let mut cluster = Cluster::start(controllers)?;
    cluster.leader(Duration::from_secs(20)).await?;
    let load = start_load(&cluster.addrs, clients, clients)?;
    let mut gaps_ms: Vec<f64> = Vec::new();
    let mut elections_ms: Vec<f64> = Vec::new();
    for _ in 0..rounds {
        // Steady state: every replica up, a leader, submits flowing.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let leader = cluster.leader(Duration::from_secs(20)).await?;
        let before = load.acked.load(Ordering::Relaxed);
        cluster.kill(leader);
        let killed = Instant::now();
        let others =
            cluster.addrs.iter().enumerate().filter(|(i, _)| *i != leader).map(|(_, a)| a.clone()).collect();
        // In parallel: when does a replica claim leadership (the election part of the gap)?
        let elected = tokio::spawn(time_to_leader(others, killed));
        let gap = first_ack_after(&load, before, killed).await?;
        gaps_ms.push(gap.as_secs_f64() * 1000.0);
        if let Ok(Ok(e)) = tokio::time::timeout(Duration::from_secs(5), elected).await {
            elections_ms.push(e.as_secs_f64() * 1000.0);
        }
        cluster.restart(leader)?;
    }
    load.finish().await;
    gaps_ms.sort_by(|a, b| a.total_cmp(b));
    let p50 = gaps_ms[gaps_ms.len() / 2];
    let max = gaps_ms.last().copied().unwrap_or(0.0);
    Ok(json!({
        "bench": "failover",
        "controllers": controllers,
        "rounds": rounds,
        "gap_ms_p50": p50.round(),
        "gap_ms_max": max.round(),
        "gaps_ms": gaps_ms.iter().map(|g| g.round()).collect::<Vec<_>>(),
        "elected_ms": elections_ms.iter().map(|g| g.round()).collect::<Vec<_>>(),
    }))
}

/// How long after `killed` one of the replicas at `addrs` says it leads (asked until one does).
async fn time_to_leader(addrs: Vec<String>, killed: Instant) -> Duration {
    loop {
        for addr in &addrs {
            if let Ok(ch) = connect(addr).await {
                if let Ok(s) = AdminServiceClient::new(ch).cluster_status(pb::ClusterStatusRequest {}).await {
                    let s = s.into_inner();
                    if s.leader == Some(s.id) {
                        return killed.elapsed();
                    }
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits (at most 30 s) for a submit acknowledged after `killed` (the load had acknowledged
/// `before` then): the gap from the kill to it.
async fn first_ack_after(load: &Load, before: u64, killed: Instant) -> anyhow::Result<Duration> {
    let deadline = killed + Duration::from_secs(30);
    loop {
        let after_kill = load.last_ack.lock().map(|t| *t > killed).unwrap_or(false);
        if after_kill && load.acked.load(Ordering::Relaxed) > before {
            return Ok(load.last_ack.lock().map(|t| t.duration_since(killed)).unwrap_or_default());
        }
        if Instant::now() > deadline {
            bail!("no submit acknowledged within 30s of killing the leader");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// A connected job client to whichever replica leads.
async fn leader_jobs(
    cluster: &Cluster,
) -> anyhow::Result<(JobServiceClient<Conn>, AdminServiceClient<Conn>)> {
    let i = cluster.leader(Duration::from_secs(20)).await?;
    let ch = connect(&cluster.addrs[i]).await?;
    Ok((JobServiceClient::new(ch.clone()), AdminServiceClient::new(ch)))
}

async fn wait_state(jobs: &mut JobServiceClient<Conn>, id: u64, state: pb::JobState) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let job = jobs.get_job(pb::GetJobRequest { job_id: id }).await?.into_inner();
        if job.state == state as i32 {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    bail!("job {id} did not reach {state:?}")
}

/// Starts `agents` fake-GPU agents of `gpus` GPUs each against the cluster.
fn start_agents(cluster: &Cluster, agents: u32, gpus: u32) -> anyhow::Result<Vec<std::process::Child>> {
    let agent_bin = sibling("kairos-agent")?;
    let mut children = Vec::new();
    for a in 0..agents {
        let log = std::fs::File::create(cluster.dir.path().join(format!("agent-{a}.log")))?;
        let child = Command::new(&agent_bin)
            .args([
                "--controllers",
                &cluster.addrs.join(","),
                "--addr",
                "127.0.0.1:0",
                "--name",
                &format!("node-{a}"),
            ])
            .args(["--gpu-backend", "fake", "--fake-gpus", &gpus.to_string(), "--run-as", "agent"])
            .arg("--join-token-file")
            .arg(cluster.dir.path().join("join.token"))
            .arg("--state-dir")
            .arg(cluster.dir.path().join(format!("agent-{a}")))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("starting kairos-agent")?;
        children.push(child);
    }
    Ok(children)
}

/// Waits (at most 30 s) until `agents` nodes are up.
async fn wait_agents_up(admin: &mut AdminServiceClient<Conn>, agents: u32) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let nodes = admin.list_nodes(pb::ListNodesRequest {}).await?.into_inner().nodes;
        if nodes.iter().filter(|n| n.state == pb::NodeState::Up as i32).count() == agents as usize {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("agents did not register");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// SIGTERM to each agent (it stops its jobs' process groups before exiting), SIGKILL after 10 s.
async fn stop_agents(children: Vec<std::process::Child>) {
    for mut c in children {
        // SAFETY: kill(2) on our own child.
        unsafe {
            libc::kill(c.id() as i32, libc::SIGTERM);
        }
        let _ = tokio::time::timeout(Duration::from_secs(10), async {
            while c.try_wait().ok().flatten().is_none() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        let _ = c.kill();
    }
}

async fn bench_preempt(
    controllers: u64,
    agents: u32,
    gpus: u32,
    rounds: usize,
) -> anyhow::Result<serde_json::Value> {
    let cluster = Cluster::start(controllers)?;
    let (mut jobs, mut admin) = leader_jobs(&cluster).await?;
    // REQUEUE victims with no grace: the measurement is the scheduler's path, not the job's.
    let mut policy = admin.get_policy(pb::GetPolicyRequest {}).await?.into_inner();
    for q in policy.qos.iter_mut().filter(|q| q.name == "training") {
        q.grace_s = 0;
    }
    admin.apply_policy(policy).await?;
    let children = start_agents(&cluster, agents, gpus)?;
    let result = async {
        wait_agents_up(&mut admin, agents).await?;
        let mut filler = 0usize;
        let mut running: Vec<u64> = Vec::new();
        let mut samples = Vec::new();
        let stamp = cluster.dir.path().join("urgent-start");
        for round in 0..rounds {
            // Refill: every GPU busy with a fresh training job (fresh, so anti-thrash never applies).
            while running.len() < (agents * gpus) as usize {
                filler += 1;
                let id = jobs.submit(training_job(filler)).await?.into_inner().job_id;
                wait_state(&mut jobs, id, pb::JobState::Running).await?;
                running.push(id);
            }
            samples.push(urgent_start_ms(&mut jobs, round, &stamp).await?);
            running = cancel_victims(&mut jobs, running).await?;
        }
        samples.sort_by(|a, b| a.total_cmp(b));
        let q = |p: f64| samples[((samples.len() as f64 - 1.0) * p).round() as usize];
        Ok(json!({
            "bench": "preempt",
            "controllers": controllers,
            "agents": agents,
            "gpus_per_agent": gpus,
            "rounds": rounds,
            "start_ms_p50": (q(0.5) * 10.0).round() / 10.0,
            "start_ms_p99": (q(0.99) * 10.0).round() / 10.0,
            "start_ms_max": (samples[samples.len() - 1] * 10.0).round() / 10.0,
        }))
    }
    .await;
    stop_agents(children).await;
    result
}

/// The preempt bench's filler: a one-GPU training job that sleeps for an hour.
fn training_job(i: usize) -> pb::SubmitRequest {
    pb::SubmitRequest {
        spec: Some(pb::JobSpec {
            name: format!("train-{i}"),
            argv: vec!["sleep".into(), "3600".into()],
            qos: "training".into(),
            resources: Some(pb::Resources { gpus: 1, ..Default::default() }),
            ..Default::default()
        }),
        request_id: String::new(),
    }
}

/// Submits an urgent two-GPU job (which must preempt) that writes its start time to `stamp`,
/// waits for it to complete: the milliseconds from its submit's acknowledgement to its start.
async fn urgent_start_ms(
    jobs: &mut JobServiceClient<Conn>,
    round: usize,
    stamp: &std::path::Path,
) -> anyhow::Result<f64> {
    let _ = std::fs::remove_file(stamp);
    let script = format!("date +%s%N > {}", stamp.display());
    let urgent = pb::SubmitRequest {
        spec: Some(pb::JobSpec {
            name: format!("urgent-{round}"),
            argv: vec!["sh".into(), "-c".into(), script],
            qos: "urgent".into(),
            resources: Some(pb::Resources { gpus: 2, ..Default::default() }),
            ..Default::default()
        }),
        request_id: String::new(),
    };
    let id = jobs.submit(urgent).await?.into_inner().job_id;
    let acked = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos();
    wait_state(jobs, id, pb::JobState::Completed).await?;
    let started: u128 = std::fs::read_to_string(stamp)?.trim().parse()?;
    Ok(started.saturating_sub(acked) as f64 / 1e6)
}

/// The victims went back to the queue: cancels them (the next round refills). The jobs of
/// `running` still running their first attempt.
async fn cancel_victims(jobs: &mut JobServiceClient<Conn>, running: Vec<u64>) -> anyhow::Result<Vec<u64>> {
    let mut still = Vec::new();
    for j in running {
        let job = jobs.get_job(pb::GetJobRequest { job_id: j }).await?.into_inner();
        if job.state == pb::JobState::Running as i32 && job.attempt == 0 {
            still.push(j);
        } else {
            let _ = jobs.cancel_job(pb::CancelJobRequest { job_id: j }).await;
        }
    }
    Ok(still)
}

fn rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kb: f64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    (kb / 1024.0).round()
}

/// Builds the state through the same commands a cluster applies, then times `plan`.
/// Node `n` of the schedule benchmark: `gpus` GPUs in link groups of 4, every fifth node A100s.
fn bench_node(n: u32, gpus: u32) -> kairos_scheduler::NodeInfo {
    let gpus = (0..gpus)
        .map(|i| kairos_scheduler::Gpu {
            index: i,
            uuid: format!("GPU-{n}-{i}"),
            model: if n.is_multiple_of(5) { "A100".into() } else { "H100".into() },
            memory_mib: 81920,
            link_group: i / 4,
            mig_parent: None,
        })
        .collect();
    kairos_scheduler::NodeInfo {
        name: format!("node-{n:05}"),
        addr: format!("10.0.{}.{}:7101", n / 256, n % 256),
        gpus,
        cpus: 128,
        memory_mib: 1 << 20,
        labels: Default::default(),
        gpu_backend: "fake".into(),
        isolation: String::new(),
    }
}

/// Running jobs for the schedule benchmark: placed GPU by GPU across the nodes with explicit
/// plans (under no QoS limit, so the setup is not refused by one); how many were placed.
fn place_running(
    state: &mut kairos_scheduler::ClusterState,
    nodes: u32,
    gpus_per_node: u32,
    running: u32,
    spec: &dyn Fn(u32, u32) -> kairos_scheduler::JobSpec,
    now: i64,
) -> u32 {
    use kairos_scheduler::{Command, Op, Placement, Plan};
    let mut apply = |op: Op| state.apply(&Command { skipped_ms: 0, now_ms: now, op });
    let mut placements = Vec::new();
    let (mut node, mut gpu) = (0u32, 0u32);
    let mut placed = 0u32;
    for i in 0..running {
        let want = [1, 1, 2, 1][(i % 4) as usize].min(gpus_per_node);
        if gpu + want > gpus_per_node {
            node += 1;
            gpu = 0;
        }
        if node >= nodes {
            break;
        }
        let mut sp = spec(i, want);
        sp.gpu_model = None;
        sp.qos = "premium".into();
        if let kairos_scheduler::Outcome::Submitted { job } =
            apply(Op::Submit { spec: sp, request_id: None, hold: false, limits: None })
        {
            placements.push(Placement::single(job, format!("node-{node:05}"), (gpu..gpu + want).collect()));
            placed += 1;
        }
        gpu += want;
        if placements.len() == 1000 {
            apply(Op::ApplyPlan { plan: Plan { placements: std::mem::take(&mut placements) } });
        }
    }
    apply(Op::ApplyPlan { plan: Plan { placements } });
    placed
}

/// Submits the schedule bench's `pending` jobs (ids after the `running` ones); with `fractions`,
/// one-GPU inference jobs ask 100, 250 or 500 thousandths. Returns how many asked a fraction.
fn submit_pending(
    state: &mut kairos_scheduler::ClusterState,
    running: u32,
    pending: u32,
    gpus_per_node: u32,
    fractions: bool,
    spec: &dyn Fn(u32, u32) -> kairos_scheduler::JobSpec,
    now: i64,
) -> anyhow::Result<u32> {
    use kairos_scheduler::{Command, Op, Profile};
    let mut fractional = 0u32;
    for i in 0..pending {
        let gpus = if i.is_multiple_of(16) {
            0
        } else {
            [1, 1, 2, 4, 8, 1, 2, 8][(i % 8) as usize].min(gpus_per_node)
        };
        let mut spec = spec(running + i, gpus);
        let fraction = fractions && gpus == 1 && spec.profile == Profile::Inference;
        if fraction {
            spec.gpu_milli = [100, 250, 500][(i % 3) as usize];
        }
        let outcome = state.apply(&Command {
            skipped_ms: 0,
            now_ms: now,
            op: Op::Submit { spec, request_id: None, hold: false, limits: None },
        });
        if fraction {
            anyhow::ensure!(
                matches!(outcome, kairos_scheduler::Outcome::Submitted { .. }),
                "a fractional inference job was refused: {outcome:?}"
            );
            fractional += 1;
        }
    }
    Ok(fractional)
}

/// Job `i` of the schedule benchmark, asking `gpus` GPUs: training, inference and batch in
/// turn, from 200 users, with time limits, every 17th on A100s.
fn schedule_job(i: u32, gpus: u32) -> kairos_scheduler::JobSpec {
    use kairos_scheduler::{JobSpec, Profile};
    let profiles =
        [("training", Profile::Training), ("inference", Profile::Inference), ("batch", Profile::Batch)];
    let (qos, profile) = profiles[(i % 3) as usize];
    let mut spec =
        JobSpec::new(&format!("job-{i}"), &format!("user-{}", i % 200), vec!["train.py".into()], gpus);
    spec.qos = qos.into();
    spec.profile = profile;
    spec.time_limit_s = Some(600 + u64::from(i % 3600));
    spec.gpu_model = i.is_multiple_of(17).then(|| "A100".to_string());
    // CPUs and memory beside the GPUs (nodes have 128 CPUs and 1 TiB): data-loading-heavy
    // jobs ask 16 CPUs per GPU, the rest 12; 64 GiB per GPU; every 16th pending job is
    // CPU-only (4 CPUs, 16 GiB).
    let gpus = spec.gpus;
    spec.cpus = if gpus == 0 { 4 } else { gpus * if i.is_multiple_of(7) { 16 } else { 12 } };
    spec.mem_mib = if gpus == 0 { 16 << 10 } else { u64::from(gpus) * (64 << 10) };
    spec
}

/// Fragmentation after applying one pass: free GPUs stranded on partly used nodes (free, on
/// whole nodes). Applying that pass's plan (what every replica does with it) is timed too (ms).
fn after_one_pass(state: &kairos_scheduler::ClusterState, now: i64) -> (u32, u32, f64) {
    use kairos_scheduler::{Command, Op};
    let mut after = state.clone();
    let plan = kairos_scheduler::plan(state).plan;
    let t0 = Instant::now();
    after.apply(&Command { skipped_ms: 0, now_ms: now, op: Op::ApplyPlan { plan } });
    let apply_ms = t0.elapsed().as_secs_f64() * 1000.0;
    let (free, whole) = after.fragmentation();
    (free, whole, apply_ms)
}

/// `passes` planning passes over `state`: each one's time (ms) and the last one's output.
fn timed_passes(
    state: &kairos_scheduler::ClusterState,
    passes: usize,
) -> (Vec<f64>, Option<kairos_scheduler::PlanOutput>) {
    let mut times = Vec::new();
    let mut last = None;
    for _ in 0..passes {
        let t0 = Instant::now();
        let out = kairos_scheduler::plan(state);
        times.push(t0.elapsed().as_secs_f64() * 1000.0);
        last = Some(out);
    }
    (times, last)
}

fn bench_schedule(
    nodes: u32,
    gpus_per_node: u32,
    pending: u32,
    running: u32,
    passes: usize,
    fractions: bool,
) -> anyhow::Result<serde_json::Value> {
    use kairos_scheduler::{ClusterState, Command, Op};
    let rss_before = rss_mb();
    let mut state = ClusterState::new();
    let now = 1_000_000i64;
    let apply = |state: &mut ClusterState, op: Op| state.apply(&Command { skipped_ms: 0, now_ms: now, op });
    for n in 0..nodes {
        apply(&mut state, Op::RegisterNode { info: bench_node(n, gpus_per_node) });
    }
    let placed = place_running(&mut state, nodes, gpus_per_node, running, &schedule_job, now);
    let fractional =
        submit_pending(&mut state, running, pending, gpus_per_node, fractions, &schedule_job, now)?;
    // The controller's memory for this state (before any copy of it), per job.
    let rss_state = rss_mb();
    let jobs = state.jobs.len().max(1) as f64;
    let bytes_per_job = ((rss_state - rss_before).max(0.0) * 1024.0 * 1024.0 / jobs).round();
    let (free, whole, apply_ms) = after_one_pass(&state, now);
    let (mut times, last) = timed_passes(&state, passes);
    times.sort_by(|a, b| a.total_cmp(b));
    let out = last.context("no pass ran")?;
    Ok(json!({
        "bench": "schedule",
        "nodes": nodes,
        "gpus_per_node": gpus_per_node,
        "cpus_per_node": 128,
        "memory_mib_per_node": 1 << 20,
        "running": placed,
        "pending": pending,
        "pending_fractions": fractional,
        "pass_ms_p50": (times[times.len() / 2] * 10.0).round() / 10.0,
        "pass_ms_max": (times[times.len() - 1] * 10.0).round() / 10.0,
        "placed": out.plan.placements.len(),
        "reservation": out.reservation.is_some(),
        "apply_plan_ms": (apply_ms * 10.0).round() / 10.0,
        "free_gpus_after_pass": free,
        "free_gpus_on_whole_nodes": whole,
        "rss_mb": rss_mb(),
        "state_rss_mb": rss_state,
        "bytes_per_job": bytes_per_job,
    }))
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let result = match args.command {
        Bench::Submit { controllers, load } => {
            let (clients, conns, seconds) = load.get();
            bench_submit(controllers, clients, conns, seconds).await
        }
        Bench::Preempt { controllers, agents, gpus_per_agent, rounds } => {
            bench_preempt(controllers, agents, gpus_per_agent, rounds.max(1)).await
        }
        Bench::Schedule { nodes, gpus_per_node, pending, running, passes, fractions } => {
            bench_schedule(nodes, gpus_per_node, pending, running, passes.max(1), fractions)
        }
        Bench::EtcdPut { endpoints, load, value_bytes, pids } => {
            let (clients, conns, seconds) = load.get();
            etcd::bench_etcd_put(endpoints, clients, conns, seconds, value_bytes, pids).await
        }
        Bench::EntryPath { submits, per_entry, users, accounts } => {
            entry::run(submits.max(1), per_entry, users, accounts)
        }
        Bench::GrpcFloor { load } => {
            let (clients, conns, seconds) = load.get();
            floor::bench(clients, conns, seconds).await
        }
        Bench::FloorServe { addr } => floor::serve(addr).await,
        Bench::Failover { controllers, rounds, clients } => {
            if controllers < 3 {
                eprintln!("kairos-bench: failover needs at least 3 controllers");
                std::process::exit(2);
            }
            bench_failover(controllers, rounds.max(1), clients.max(1)).await
        }
    };
    match result {
        Ok(v) => println!("{v}"),
        Err(e) => {
            eprintln!("kairos-bench: {e:#}");
            std::process::exit(1);
        }
    }
}

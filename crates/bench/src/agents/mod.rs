//! `kairos-bench agents`: N agents in this process — the agent's own session code (register,
//! heartbeat, lease, assignment stream, run reports, reconnect with its jittered backoff) over
//! real gRPC connections (a few shared per controller) to a real 3-replica cluster, with fake
//! runs that end on time (`fake`). Measures, in order: all agents UP from cold; a steady
//! state with runs and submits (leader CPU per second, heartbeat and submit latency, Raft
//! entries per second, each replica's memory at its start and end); `kill -9` of the leader
//! and every agent re-admitted by the next (no run fenced or killed); `kill_agents` agents
//! gone and judged DOWN.

mod fake;
mod pool;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use kairos_agent::fence::Lease;
use kairos_agent::session::{deliver_reports, follow_controllers, Credentials, Session};
use kairos_proto::v1 as pb;
use kairos_proto::v1::admin_service_client::AdminServiceClient;
use kairos_proto::v1::job_service_client::JobServiceClient;
use serde_json::json;
use tokio::sync::{mpsc, watch};

use crate::cluster::{connect, Cluster, Conn, JOIN_TOKEN};
use fake::{FakeRuns, Tally};
use pool::{Channels, Pooled};

/// What `kairos-bench agents` is asked.
#[derive(Clone, Debug)]
pub struct Options {
    pub nodes: usize,
    pub gpus: u32,
    pub controllers: u64,
    pub agents_per_connection: usize,
    pub steady_s: u64,
    pub submit_rate: u32,
    pub run_s: u64,
    pub fill: usize,
    pub kill_agents: usize,
    pub heartbeat_ms: u64,
    pub node_timeout_ms: u64,
    /// Fail unless: no run fenced, every agent re-admitted, no replica's memory grew.
    pub check: bool,
}

/// One harness agent: its runs, and its tasks (session, reports).
struct Agent {
    runs: FakeRuns,
    tasks: [tokio::task::AbortHandle; 2],
}

fn spawn_agent(i: usize, gpus: u32, channels: &Arc<Channels>, tally: &Arc<Tally>, epoch: Instant) -> Agent {
    let name = format!("sim-{i:05}");
    let lease = Lease::in_memory();
    let (report_tx, report_rx) = mpsc::channel(256);
    let runs = FakeRuns::new(name.clone(), lease.clone(), report_tx, tally.clone(), epoch);
    let creds = Credentials::in_memory(Some(Arc::from(JOIN_TOKEN)));
    let node = pb::NodeInfo {
        addr: format!("127.0.0.1:{}", 20_000 + i % 40_000),
        gpus: (0..gpus)
            .map(|k| pb::Gpu {
                index: k,
                uuid: format!("GPU-{name}-{k}"),
                model: "H100".into(),
                memory_mib: 81_920,
                link_group: k / 4,
                mig_parent: None,
            })
            .collect(),
        cpus: 64,
        memory_mib: 512 * 1024,
        name,
        ..Default::default()
    };
    let session = Session { node, runner: runs.clone(), lease, creds: creds.clone() };
    let (client_tx, client_rx) = watch::channel(None);
    let dial = Pooled::new(channels.clone(), i);
    let s = tokio::spawn(follow_controllers(dial, session, client_tx));
    let r = tokio::spawn(deliver_reports(creds, report_rx, client_rx));
    Agent { runs, tasks: [s.abort_handle(), r.abort_handle()] }
}

/// Raises this process's descriptor limit to the hard limit (thousands of connections).
fn raise_nofile() {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit read and write the struct they are given.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

/// A process's resident memory now and at its peak (MB), from /proc.
fn rss_mb(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| -> f64 {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<f64>().ok())
            .map_or(0.0, |kb| (kb / 1024.0 * 10.0).round() / 10.0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn percentile_ms(sorted_us: &[u32], p: f64) -> f64 {
    if sorted_us.is_empty() {
        return 0.0;
    }
    let i = ((sorted_us.len() as f64 * p).ceil() as usize).clamp(1, sorted_us.len()) - 1;
    (sorted_us[i] as f64 / 100.0).round() / 10.0
}

/// Waits until `done` holds, up to `within`; the time it took.
async fn until(within: Duration, what: &str, mut done: impl FnMut() -> bool) -> anyhow::Result<Duration> {
    let started = Instant::now();
    while !done() {
        if started.elapsed() > within {
            bail!("{what}: not within {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(started.elapsed())
}

async fn leader_clients(
    cluster: &Cluster,
) -> anyhow::Result<(usize, JobServiceClient<Conn>, AdminServiceClient<Conn>)> {
    let i = cluster.leader(Duration::from_secs(30)).await?;
    let ch = connect(&cluster.addrs[i]).await?;
    let admin = AdminServiceClient::new(ch.clone()).max_decoding_message_size(256 << 20);
    Ok((i, JobServiceClient::new(ch), admin))
}

fn job(i: usize, run_s: u64) -> pb::SubmitRequest {
    pb::SubmitRequest {
        spec: Some(pb::JobSpec {
            name: format!("scale-{i}"),
            argv: vec!["sleep".into(), run_s.to_string()],
            // No QoS limit holds them back (training has a 512-GPU group limit).
            qos: "batch".into(),
            resources: Some(pb::Resources { gpus: 1, ..Default::default() }),
            ..Default::default()
        }),
        request_id: String::new(),
    }
}

/// Submits `count` jobs, 32 at a time, within the per-user write rate (past its burst a
/// refused submit is sent again after the wait its answer names).
async fn fill(jobs: &JobServiceClient<Conn>, count: usize, run_s: u64) -> anyhow::Result<()> {
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..32 {
        let mut jobs = jobs.clone();
        tasks.spawn(async move {
            for i in (w..count).step_by(32) {
                loop {
                    match jobs.submit(job(i, run_s)).await {
                        Ok(_) => break,
                        // Only the rate limit clears with time; a job limit would not.
                        Err(s) => match retry_after(&s) {
                            Some(wait) => tokio::time::sleep(wait).await,
                            None => return Err(s.into()),
                        },
                    }
                }
            }
            anyhow::Ok(())
        });
    }
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    Ok(())
}

/// The wait a rate-limited answer names ("… retry in N ms"); None for any other refusal.
fn retry_after(refused: &tonic::Status) -> Option<Duration> {
    if refused.code() != tonic::Code::ResourceExhausted {
        return None;
    }
    let (_, tail) = refused.message().rsplit_once("retry in ")?;
    let ms: u64 = tail.trim_end_matches(" ms").parse().ok()?;
    Some(Duration::from_millis(ms.clamp(1, 1000)))
}

/// Submits at `rate` per second for `secs`; each submit's latency (µs), sorted.
async fn submit_at(
    jobs: &JobServiceClient<Conn>,
    rate: u32,
    secs: u64,
    run_s: u64,
) -> anyhow::Result<Vec<u32>> {
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(rate.max(1))));
    let end = Instant::now() + Duration::from_secs(secs);
    let mut inflight = tokio::task::JoinSet::new();
    let mut i = 0;
    while Instant::now() < end {
        tick.tick().await;
        let mut jobs = jobs.clone();
        i += 1;
        let req = job(1_000_000 + i, run_s);
        inflight.spawn(async move {
            let sent = Instant::now();
            jobs.submit(req).await.map(|_| sent.elapsed().as_micros().min(u32::MAX as u128) as u32)
        });
    }
    let mut took = Vec::new();
    while let Some(r) = inflight.join_next().await {
        took.push(r?.context("a submit under load")?);
    }
    took.sort_unstable();
    Ok(took)
}

async fn status(admin: &mut AdminServiceClient<Conn>) -> anyhow::Result<pb::ClusterStatusResponse> {
    Ok(admin.cluster_status(pb::ClusterStatusRequest {}).await?.into_inner())
}

/// Nodes the leader shows in `state`.
async fn nodes_in(admin: &mut AdminServiceClient<Conn>, state: pb::NodeState) -> anyhow::Result<Vec<String>> {
    let nodes = admin.list_nodes(pb::ListNodesRequest::default()).await?.into_inner().nodes;
    Ok(nodes.into_iter().filter(|n| n.state == state as i32).map(|n| n.name).collect())
}

pub async fn bench_agents(o: Options) -> anyhow::Result<serde_json::Value> {
    raise_nofile();
    let flags = vec![
        "--heartbeat-ms".to_string(),
        o.heartbeat_ms.to_string(),
        "--node-timeout-ms".to_string(),
        o.node_timeout_ms.to_string(),
    ];
    let mut cluster = Cluster::start_with(o.controllers, flags)?;
    let (_, _, mut admin) = leader_clients(&cluster).await?;
    let lease = Duration::from_millis(o.node_timeout_ms / 2);
    let epoch = Instant::now();
    let tally = Arc::new(Tally::default());
    let per_controller = Channels::per_controller(o.nodes, o.agents_per_connection);
    let (agents, all_runs, fencer) = spawn_fleet(&cluster, &o, per_controller, &tally, epoch)?;

    let all_up = cold_start(&all_runs, &mut admin, o.nodes).await?;

    // Runs on the nodes: `fill` jobs, started; then the steady state.
    let (mut leader, jobs, mut admin) = leader_clients(&cluster).await?;
    fill(&jobs, o.fill, o.run_s).await?;
    until(Duration::from_secs(120), "the fill's runs started", || {
        tally.started.load(Ordering::SeqCst) as usize >= o.fill
    })
    .await?;

    let steady = steady_state(&cluster, leader, &mut admin, &jobs, &tally, &o).await?;
    let mut peak: Vec<f64> = cluster.pids().iter().map(|p| rss_mb(*p).1).collect();

    // The leader killed: every agent re-admitted by the next one, no run fenced or killed.
    let (fenced_before, killed_before) =
        (tally.fenced.load(Ordering::SeqCst), tally.killed.load(Ordering::SeqCst));
    let kill_at = epoch.elapsed();
    cluster.kill(leader);
    let readmit =
        until(lease + Duration::from_secs(60), "every agent re-admitted after the leader's kill", || {
            all_runs.iter().all(|r| r.registered_at().is_some_and(|t| t > kill_at))
        })
        .await;
    let readmit_s = readmit.as_ref().map(|d| d.as_secs_f64()).ok();
    let fenced = tally.fenced.load(Ordering::SeqCst) - fenced_before;
    let killed = tally.killed.load(Ordering::SeqCst) - killed_before;

    // `kill_agents` agents gone: judged DOWN.
    let (new_leader, _, mut admin) = leader_clients(&cluster).await?;
    leader = new_leader;
    let first_gone = o.nodes - o.kill_agents.min(o.nodes);
    for a in &agents[first_gone..] {
        a.tasks.iter().for_each(tokio::task::AbortHandle::abort);
    }
    let down_detect_s =
        judge_down(&mut admin, first_gone..o.nodes, Duration::from_millis(o.node_timeout_ms) * 3).await?;
    for (i, p) in cluster.pids().iter().enumerate() {
        if *p != 0 {
            peak[i] = peak[i].max(rss_mb(*p).1);
        }
    }
    fencer.abort();
    for a in &agents {
        a.tasks.iter().for_each(tokio::task::AbortHandle::abort);
    }
    let kill = Kill { readmit_s, fenced, killed, down_detect_s, agents_killed: o.nodes - first_gone, leader };
    let report = report_of(&o, per_controller, all_up, &steady, &kill, &tally, peak);
    if o.check {
        check(&report, &steady.rss_before, &steady.rss_after)?;
    }
    Ok(report)
}

/// The harness's agents, their runs together, and the fence task that watches their leases.
type Fleet = (Vec<Agent>, Arc<Vec<FakeRuns>>, tokio::task::JoinHandle<()>);

fn spawn_fleet(
    cluster: &Cluster,
    o: &Options,
    per_controller: usize,
    tally: &Arc<Tally>,
    epoch: Instant,
) -> anyhow::Result<Fleet> {
    let channels = Channels::new(&cluster.addrs, per_controller)?;
    let agents: Vec<Agent> = (0..o.nodes).map(|i| spawn_agent(i, o.gpus, &channels, tally, epoch)).collect();
    let all_runs: Arc<Vec<FakeRuns>> = Arc::new(agents.iter().map(|a| a.runs.clone()).collect());
    let runs = all_runs.clone();
    let fencer = tokio::spawn(async move {
        loop {
            runs.iter().for_each(FakeRuns::fence_if_lapsed);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    Ok((agents, all_runs, fencer))
}

/// Cold: the time until every agent registered; then the leader must show every node UP.
async fn cold_start(
    all_runs: &[FakeRuns],
    admin: &mut AdminServiceClient<Conn>,
    nodes: usize,
) -> anyhow::Result<Duration> {
    let all_up = until(Duration::from_secs(300), "all agents registered", || {
        all_runs.iter().all(|r| r.registered_at().is_some())
    })
    .await?;
    let up = nodes_in(admin, pb::NodeState::Up).await?.len();
    if up != nodes {
        bail!("{up} of {nodes} nodes UP after every agent registered");
    }
    Ok(all_up)
}

/// What the leader's kill and the silent agents showed.
struct Kill {
    readmit_s: Option<f64>,
    fenced: u64,
    killed: u64,
    down_detect_s: Option<f64>,
    agents_killed: usize,
    /// The replica leading after the kill.
    leader: usize,
}

/// The bench's one JSON line.
fn report_of(
    o: &Options,
    per_controller: usize,
    all_up: Duration,
    steady: &Steady,
    kill: &Kill,
    tally: &Tally,
    peak: Vec<f64>,
) -> serde_json::Value {
    let round = |s: f64| (s * 100.0).round() / 100.0;
    let wall = steady.wall.as_secs_f64();
    json!({
        "bench": "agents",
        "nodes": o.nodes,
        "gpus_per_node": o.gpus,
        "controllers": o.controllers,
        "connections_per_controller": per_controller,
        "heartbeat_ms": o.heartbeat_ms,
        "node_timeout_ms": o.node_timeout_ms,
        "lease_ms": o.node_timeout_ms / 2,
        "all_up_s": round(all_up.as_secs_f64()),
        "steady_s": round(wall),
        "leader_cpu_ratio": (steady.cpu_us[steady.leader] / 1e6 / wall * 1000.0).round() / 1000.0,
        "replica_cpu_s": steady.cpu_us.iter().map(|us| (us / 1e4).round() / 100.0).collect::<Vec<f64>>(),
        "heartbeats_per_s": round(steady.heartbeats.len() as f64 / wall),
        "heartbeat_p50_ms": percentile_ms(&steady.heartbeats, 0.50),
        "heartbeat_p99_ms": percentile_ms(&steady.heartbeats, 0.99),
        "submits": steady.submits.len(),
        "submit_p50_ms": percentile_ms(&steady.submits, 0.50),
        "submit_p99_ms": percentile_ms(&steady.submits, 0.99),
        "raft_entries_per_s": round(steady.entries as f64 / wall),
        "readmit_after_leader_kill_s": kill.readmit_s.map(round),
        "runs_fenced": kill.fenced,
        "runs_killed_after_leader_kill": kill.killed,
        "runs_started": tally.started.load(Ordering::SeqCst),
        "runs_completed": tally.completed.load(Ordering::SeqCst),
        "reports_lost": tally.reports_lost.load(Ordering::SeqCst),
        "down_detect_s": kill.down_detect_s.map(round),
        "agents_killed": kill.agents_killed,
        "rss_mb": peak,
        "rss_steady_start_mb": steady.rss_before,
        "rss_steady_end_mb": steady.rss_after,
        "leader_after_kill": kill.leader,
    })
}

/// What the steady state measured.
struct Steady {
    /// The replica that led.
    leader: usize,
    wall: Duration,
    /// Each replica's CPU over the window (µs).
    cpu_us: Vec<f64>,
    /// Heartbeat and submit round trips (µs), sorted.
    heartbeats: Vec<u32>,
    submits: Vec<u32>,
    /// Log entries the leader appended meanwhile.
    entries: u64,
    rss_before: Vec<f64>,
    rss_after: Vec<f64>,
}

/// `o.steady_s` of steady state with `o.submit_rate` submits a second.
async fn steady_state(
    cluster: &Cluster,
    leader: usize,
    admin: &mut AdminServiceClient<Conn>,
    jobs: &JobServiceClient<Conn>,
    tally: &Tally,
    o: &Options,
) -> anyhow::Result<Steady> {
    let pids = cluster.pids();
    let rss_before: Vec<f64> = pids.iter().map(|p| rss_mb(*p).0).collect();
    let cpu = crate::cpu::Window::start(&pids);
    let entries_before = status(admin).await?.last_log_index;
    tally.heartbeats.lock().unwrap_or_else(|p| p.into_inner()).clear();
    tally.measuring.store(true, Ordering::SeqCst);
    let window = Instant::now();
    let submits = submit_at(jobs, o.submit_rate, o.steady_s, o.run_s).await?;
    let wall = window.elapsed();
    tally.measuring.store(false, Ordering::SeqCst);
    let cpu_us = cpu.per_op(1);
    let entries = status(admin).await?.last_log_index.saturating_sub(entries_before);
    let rss_after: Vec<f64> = pids.iter().map(|p| rss_mb(*p).0).collect();
    let mut heartbeats = std::mem::take(&mut *tally.heartbeats.lock().unwrap_or_else(|p| p.into_inner()));
    heartbeats.sort_unstable();
    Ok(Steady { leader, wall, cpu_us, heartbeats, submits, entries, rss_before, rss_after })
}

/// Seconds until the leader lists every agent of `gone` DOWN (None: not within `within`).
async fn judge_down(
    admin: &mut AdminServiceClient<Conn>,
    gone: std::ops::Range<usize>,
    within: Duration,
) -> anyhow::Result<Option<f64>> {
    let names: Vec<String> = gone.map(|i| format!("sim-{i:05}")).collect();
    let started = Instant::now();
    while started.elapsed() < within && !names.is_empty() {
        let down = nodes_in(admin, pb::NodeState::Down).await?;
        if names.iter().all(|g| down.contains(g)) {
            return Ok(Some(started.elapsed().as_secs_f64()));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(None)
}

/// The suite's assertions (`--check`): no run fenced or killed across the leader's kill, every
/// agent re-admitted, no replica's memory grew over the steady state (more than 10 % + 16 MB:
/// the jobs submitted meanwhile are new state).
fn check(report: &serde_json::Value, before: &[f64], after: &[f64]) -> anyhow::Result<()> {
    if report["readmit_after_leader_kill_s"].is_null() {
        bail!("not every agent was re-admitted after the leader's kill: {report}");
    }
    if report["runs_fenced"] != 0 || report["runs_killed_after_leader_kill"] != 0 {
        bail!("runs were fenced or killed across the leader's kill: {report}");
    }
    for (i, (b, a)) in before.iter().zip(after).enumerate() {
        if *a > b * 1.1 + 16.0 {
            bail!("replica {} grew from {b} MB to {a} MB over the steady state: {report}", i + 1);
        }
    }
    if report["down_detect_s"].is_null() && report["agents_killed"] != 0 {
        bail!("the killed agents were not judged DOWN: {report}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_and_the_checks_fail_on_what_they_guard() {
        let us: Vec<u32> = (1..=100).map(|i| i * 1000).collect();
        assert_eq!(percentile_ms(&us, 0.50), 50.0);
        assert_eq!(percentile_ms(&us, 0.99), 99.0);
        assert_eq!(percentile_ms(&[], 0.99), 0.0);
        let good = json!({"readmit_after_leader_kill_s": 1.5, "runs_fenced": 0,
            "runs_killed_after_leader_kill": 0, "down_detect_s": 6.0, "agents_killed": 10});
        assert!(check(&good, &[100.0], &[105.0]).is_ok());
        assert!(check(&good, &[100.0], &[200.0]).is_err(), "memory grew");
        let mut fenced = good.clone();
        fenced["runs_fenced"] = json!(1);
        assert!(check(&fenced, &[100.0], &[100.0]).is_err());
        let mut lost = good.clone();
        lost["readmit_after_leader_kill_s"] = serde_json::Value::Null;
        assert!(check(&lost, &[100.0], &[100.0]).is_err());
        let mut undetected = good;
        undetected["down_detect_s"] = serde_json::Value::Null;
        assert!(check(&undetected, &[100.0], &[100.0]).is_err());
    }

    #[test]
    fn only_the_rate_limit_is_waited_out() {
        let limited = tonic::Status::resource_exhausted(
            "submit rate limit: at most 1000 writes/s per user (…; bursts of 5000); retry in 3 ms",
        );
        assert_eq!(retry_after(&limited), Some(Duration::from_millis(3)));
        let job_limit =
            tonic::Status::resource_exhausted("user \"alice\" has 100 unfinished jobs (at most 100)");
        assert_eq!(retry_after(&job_limit), None);
        assert_eq!(retry_after(&tonic::Status::unavailable("retry in 3 ms")), None);
    }
}

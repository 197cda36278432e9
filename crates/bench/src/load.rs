//! `kairos-bench submit` and the load other benches run under: C clients submitting jobs that
//! stay pending in a closed loop (one request in flight each, following leader hints), over
//! shared HTTP/2 connections, their acknowledged submits' latencies recorded.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use kairos_proto::v1 as pb;
use kairos_proto::v1::job_service_client::JobServiceClient;
use serde_json::json;

use crate::cluster::{connect, Cluster, Conn};

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

pub(crate) struct Load {
    stop: Arc<AtomicBool>,
    hist: Arc<Mutex<Histogram<u64>>>,
    /// Submits acknowledged.
    pub(crate) acked: Arc<AtomicU64>,
    /// When the latest was.
    pub(crate) last_ack: Arc<Mutex<Instant>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

pub(crate) fn start_load(addrs: &[String], clients: usize, conns: usize) -> anyhow::Result<Load> {
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
    pub(crate) async fn finish(self) -> Histogram<u64> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            let _ = t.await;
        }
        let h = self.hist.lock().map(|h| h.clone());
        h.unwrap_or_else(|_| Histogram::new(3).expect("histogram"))
    }
}

pub(crate) async fn bench_submit(
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
    pids.extend(cluster.pids());
    let load = start_load(&cluster.addrs, clients, conns)?;
    let t0 = Instant::now();
    let cpu = crate::cpu::Window::start(&pids);
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

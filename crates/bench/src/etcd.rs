//! `kairos-bench etcd-put`: the same closed-loop load as `submit` — C clients, one HTTP/2
//! connection each (or `--conns` shared ones), one request in flight per client — against etcd's
//! v3 gRPC `KV.Put`, so the
//! two figures of `scripts/bench-vs-etcd.sh` are measured the same way. The two messages are
//! declared here (field numbers of etcd's `rpc.proto`); the reply's other fields are ignored.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use hdrhistogram::Histogram;
use serde_json::json;
use tonic::transport::{Channel, Endpoint};

/// etcdserverpb.PutRequest (key = 1, value = 2).
#[derive(Clone, PartialEq, prost::Message)]
struct PutRequest {
    #[prost(bytes = "vec", tag = "1")]
    key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    value: Vec<u8>,
}

/// etcdserverpb.PutResponse: only whether it came back matters.
#[derive(Clone, PartialEq, prost::Message)]
struct PutResponse {}

async fn put(channel: &Channel, key: Vec<u8>, value: Vec<u8>) -> Result<(), tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await.map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let path = tonic::codegen::http::uri::PathAndQuery::from_static("/etcdserverpb.KV/Put");
    let codec = tonic_prost::ProstCodec::<PutRequest, PutResponse>::default();
    grpc.unary(tonic::Request::new(PutRequest { key, value }), path, codec).await.map(|_| ())
}

async fn connect(addr: &str) -> anyhow::Result<Channel> {
    Ok(Endpoint::from_shared(format!("http://{addr}"))?
        .connect_timeout(Duration::from_millis(500))
        .connect()
        .await?)
}

/// Waits (at most 30 s) until the cluster at `endpoint` takes a put.
async fn wait_ready(endpoint: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ok = match connect(endpoint).await {
            Ok(ch) => put(&ch, b"bench/ready".to_vec(), b"1".to_vec()).await.is_ok(),
            Err(_) => false,
        };
        if ok {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "etcd at {endpoint} took no put within 30 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Puts of `value_bytes`-byte values under distinct keys from `clients` clients (client `c` on
/// endpoint `c mod n`, as etcd's own benchmark spreads them) for `seconds`, after a 1-s warm-up.
pub async fn bench_etcd_put(
    endpoints: Vec<String>,
    clients: usize,
    conns: usize,
    seconds: u64,
    value_bytes: usize,
    member_pids: Vec<u32>,
) -> anyhow::Result<serde_json::Value> {
    anyhow::ensure!(!endpoints.is_empty(), "--endpoints: at least one etcd client address");
    wait_ready(&endpoints[0]).await?;
    let n = endpoints.len();
    let channels = client_channels(&endpoints, clients, conns).await?;
    let warm_up = Load::start(&channels, value_bytes, false);
    tokio::time::sleep(Duration::from_secs(1)).await;
    warm_up.stop().await;
    let load = Load::start(&channels, value_bytes, true);
    let t0 = Instant::now();
    let mut pids = vec![std::process::id()];
    pids.extend(&member_pids);
    let cpu = crate::cpu::Window::start(&pids);
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let (acked, hist) = (load.acked.clone(), load.hist.clone());
    load.stop().await;
    let elapsed = t0.elapsed().as_secs_f64();
    let hist = hist.lock().map(|h| h.clone()).map_err(|_| anyhow::anyhow!("histogram lock poisoned"))?;
    let per_put = cpu.per_op(hist.len());
    let ms = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
    Ok(json!({
        "bench": "etcd-put",
        "endpoints": endpoints.len(),
        "clients": clients,
        "connections_per_endpoint": conns.min(clients.div_ceil(n)),
        "seconds": seconds,
        "value_bytes": value_bytes,
        "acknowledged": acked.load(Ordering::Relaxed),
        "puts_per_s": (hist.len() as f64 / elapsed).round(),
        "p50_ms": ms(0.50),
        "p99_ms": ms(0.99),
        "max_ms": hist.max() as f64 / 1000.0,
        // CPU time (user + system) per acknowledged put, in µs, over the measured window (the
        // members' only when their process ids were given).
        "cpu_us_per_put": {
            "clients": per_put[0],
            "members": &per_put[1..],
            "all": (per_put.iter().sum::<f64>() * 10.0).round() / 10.0,
        },
    }))
}

/// Each client's channel: `conns` connections to each endpoint (no more than its clients
/// need); client `c` goes to endpoint `c mod n` over that endpoint's connection
/// `(c / n) mod conns`.
async fn client_channels(endpoints: &[String], clients: usize, conns: usize) -> anyhow::Result<Vec<Channel>> {
    let n = endpoints.len();
    let mut pool = Vec::with_capacity(n * conns);
    for slot in 0..n * conns.min(clients.div_ceil(n)) {
        let addr = &endpoints[slot % n];
        pool.push(connect(addr).await.with_context(|| format!("connecting to {addr}"))?);
    }
    Ok((0..clients).map(|c| pool[c % pool.len()].clone()).collect())
}

/// The closed-loop load running: one task per client, putting until stopped.
struct Load {
    stop: Arc<AtomicBool>,
    /// Puts acknowledged.
    acked: Arc<AtomicU64>,
    /// Each acknowledged put's latency, in µs.
    hist: Arc<Mutex<Histogram<u64>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    /// Starts a client on each of `channels`; the keys of a `measure`d load differ from the
    /// warm-up's.
    fn start(channels: &[Channel], value_bytes: usize, measure: bool) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(AtomicU64::new(0));
        let hist = Arc::new(Mutex::new(Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("bounds")));
        let tasks = channels
            .iter()
            .enumerate()
            .map(|(c, ch)| {
                let (ch, stop, acked, hist) = (ch.clone(), stop.clone(), acked.clone(), hist.clone());
                let value = vec![b'x'; value_bytes];
                tokio::spawn(async move {
                    let mut seq = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        seq += 1;
                        let key = format!("bench/{}/{c}/{seq}", u8::from(measure)).into_bytes();
                        let t0 = Instant::now();
                        match tokio::time::timeout(Duration::from_secs(10), put(&ch, key, value.clone()))
                            .await
                        {
                            Ok(Ok(())) => {
                                if let Ok(mut h) = hist.lock() {
                                    let _ = h.record((t0.elapsed().as_micros() as u64).max(1));
                                }
                                acked.fetch_add(1, Ordering::Relaxed);
                            }
                            _ => tokio::time::sleep(Duration::from_millis(10)).await,
                        }
                    }
                })
            })
            .collect();
        Load { stop, acked, hist, tasks }
    }

    /// Stops the clients and waits for each to finish its put in flight.
    async fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

//! `kairos-bench failover`: under a steady submit stream, SIGKILLs the leader each round and
//! measures the gap from the kill to the first acknowledged submit (and to the election).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::bail;
use kairos_proto::v1 as pb;
use kairos_proto::v1::admin_service_client::AdminServiceClient;
use serde_json::json;

use crate::cluster::{connect, Cluster};
use crate::load::{start_load, Load};

pub(crate) async fn bench_failover(
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

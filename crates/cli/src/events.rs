//! `kairos events`: the cluster's event log (operators): nodes joining, draining, down, up and
//! removed, and policy changes with the token that made them and the what-if they confirmed.

use clap::Args;
use kairos_proto::v1 as pb;
use serde_json::json;

use crate::args::{now_ms, parse_when};
use crate::client::Client;
use crate::output::{print_json, table, time_json};

#[derive(Args, Debug)]
pub struct EventsArgs {
    /// Events at or after this time: a time ago (`2h`, `7d`), a date or an RFC 3339 time.
    /// Default: all kept.
    #[arg(long, short = 'S')]
    pub since: Option<String>,
}

/// What an event says beyond its kind and node.
fn detail(e: &pb::ClusterEvent) -> String {
    match e.kind.as_str() {
        "node joined" => format!("{} GPUs {}, {} CPUs, {} MiB", e.gpus, e.gpu_model, e.cpus, e.memory_mib),
        "policy applied" => format!(
            "by {} (token {}); what-if {}",
            e.user,
            e.token_id,
            if e.what_if_hash.is_empty() { "none" } else { &e.what_if_hash }
        ),
        _ => e.reason.clone(),
    }
}

pub async fn events(client: &Client, json: bool, args: EventsArgs) -> anyhow::Result<i32> {
    let since = match &args.since {
        Some(s) => parse_when(s, now_ms()).map_err(|e| anyhow::anyhow!("--since: {e}"))?,
        None => 0,
    };
    let events = client
        .admin(pb::ListClusterEventsRequest { since_ms: since }, |mut c, r| async move {
            c.list_cluster_events(r).await
        })
        .await?
        .into_inner()
        .events;
    if json {
        let out: Vec<serde_json::Value> = events
            .iter()
            .map(|e| {
                json!({
                    "time": time_json(e.time_ms),
                    "kind": e.kind,
                    "node": e.node,
                    "reason": e.reason,
                    "gpus": e.gpus,
                    "gpu_model": e.gpu_model,
                    "token_id": e.token_id,
                    "user": e.user,
                    "what_if_hash": e.what_if_hash,
                })
            })
            .collect();
        print_json(&serde_json::Value::Array(out));
        return Ok(0);
    }
    let rows: Vec<Vec<String>> = events
        .iter()
        .map(|e| {
            let when = time_json(e.time_ms).as_str().unwrap_or("-").to_string();
            vec![when, e.kind.clone(), if e.node.is_empty() { "-".into() } else { e.node.clone() }, detail(e)]
        })
        .collect();
    table(&["TIME", "EVENT", "NODE", "DETAIL"], &rows);
    Ok(0)
}

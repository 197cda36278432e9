//! `kairos partition`: partitions (their nodes, tiers and rules), edited one at a time on the
//! server.

use anyhow::Context;
use clap::Subcommand;
use kairos_proto::v1 as pb;

use crate::args::csv;
use crate::client::{CallError, Client};
use crate::output::{print_json, table};
use crate::policy::get_policy;
use crate::policy_file;

#[derive(Subcommand, Debug)]
pub enum PartitionCmd {
    /// Every partition: nodes, tier, QoS rules, max wall (* marks the default).
    List,
    /// Create a partition.
    Create {
        /// The partition's name.
        name: String,
        #[command(flatten)]
        flags: PartitionFlags,
    },
    /// Change the given settings of a partition.
    Update {
        /// The partition's name.
        name: String,
        #[command(flatten)]
        flags: PartitionFlags,
    },
    /// Delete a partition no unfinished job uses.
    Delete {
        /// The partition's name.
        name: String,
    },
}

#[derive(clap::Args, Debug)]
pub struct PartitionFlags {
    /// Nodes by name, comma-separated ("" = use the selector).
    #[arg(long)]
    nodes: Option<String>,
    /// Label selector KEY=VALUE[,KEY=VALUE] ("" = no selector).
    #[arg(long)]
    selector: Option<String>,
    /// Priority tier: jobs of a higher tier preempt those of a lower one.
    #[arg(long)]
    tier: Option<u32>,
    /// Allowed QoS, comma-separated ("" = all).
    #[arg(long)]
    allowed_qos: Option<String>,
    /// Default QoS ("" = none).
    #[arg(long)]
    default_qos: Option<String>,
    /// Max wall time, e.g. 72h ("" = none).
    #[arg(long)]
    max_wall: Option<String>,
}

impl PartitionFlags {
    fn apply_to(&self, p: &mut pb::Partition) -> anyhow::Result<()> {
        if let Some(n) = &self.nodes {
            p.nodes = csv(n);
        }
        if let Some(sel) = &self.selector {
            p.selector = csv(sel)
                .into_iter()
                .map(|kv| {
                    kv.split_once('=')
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .ok_or_else(|| anyhow::anyhow!("--selector: \"{kv}\" is not KEY=VALUE"))
                })
                .collect::<anyhow::Result<_>>()?;
        }
        if let Some(t) = self.tier {
            p.priority_tier = t;
        }
        if let Some(q) = &self.allowed_qos {
            p.allowed_qos = csv(q);
        }
        if let Some(q) = &self.default_qos {
            p.default_qos = q.clone();
        }
        if let Some(w) = &self.max_wall {
            p.max_wall_s = if w.is_empty() {
                None
            } else {
                Some(policy_file::parse_secs("--max-wall", w).map_err(anyhow::Error::msg)?)
            };
        }
        Ok(())
    }
}

async fn put_partition(
    client: &Client,
    partition: pb::Partition,
    mode: pb::PutMode,
) -> Result<pb::Partition, CallError> {
    let req = pb::PutPartitionRequest { partition: Some(partition), mode: mode as i32 };
    client.admin(req, |mut c, r| async move { c.put_partition(r).await }).await.map(|r| r.into_inner())
}

pub async fn partition_command(client: &Client, json: bool, command: PartitionCmd) -> anyhow::Result<i32> {
    match command {
        PartitionCmd::List => list(&get_policy(client).await?, json),
        PartitionCmd::Create { name, flags } => {
            let mut part = pb::Partition { name: name.clone(), priority_tier: 1, ..Default::default() };
            flags.apply_to(&mut part)?;
            put_partition(client, part, pb::PutMode::Create).await?;
            println!("partition \"{name}\" created");
        }
        PartitionCmd::Update { name, flags } => {
            let policy = get_policy(client).await?;
            let mut part = policy
                .partitions
                .into_iter()
                .find(|p| p.name == name)
                .context(format!("partition \"{name}\" not found"))?;
            flags.apply_to(&mut part)?;
            put_partition(client, part, pb::PutMode::Update).await?;
            println!("partition \"{name}\" updated");
        }
        PartitionCmd::Delete { name } => {
            let req = pb::DeletePartitionRequest { name: name.clone() };
            client.admin(req, |mut c, r| async move { c.delete_partition(r).await }).await?;
            println!("partition \"{name}\" deleted");
        }
    }
    Ok(0)
}

/// `kairos partition list`: the policy's partitions (the default one starred), a table or JSON.
fn list(policy: &pb::Policy, json: bool) {
    if json {
        let v: Vec<serde_json::Value> = policy
            .partitions
            .iter()
            .map(|p| {
                serde_json::json!({
                    "name": p.name, "default": p.name == policy.default_partition, "nodes": p.nodes,
                    "selector": p.selector, "priority_tier": p.priority_tier, "allowed_qos": p.allowed_qos,
                    "default_qos": (!p.default_qos.is_empty()).then(|| p.default_qos.clone()),
                    "max_wall_s": p.max_wall_s,
                })
            })
            .collect();
        print_json(&serde_json::Value::Array(v));
        return;
    }
    let rows: Vec<Vec<String>> =
        policy.partitions.iter().map(|p| row(p, &policy.default_partition)).collect();
    table(&["PARTITION", "NODES", "TIER", "QOS", "DEFAULT_QOS", "MAX_WALL"], &rows);
}

/// A partition's row: its nodes (by name, else by selector, else all).
fn row(p: &pb::Partition, default_partition: &str) -> Vec<String> {
    let mut sel: Vec<String> = p.selector.iter().map(|(k, v)| format!("{k}={v}")).collect();
    sel.sort();
    let nodes = if !p.nodes.is_empty() {
        p.nodes.join(",")
    } else if !sel.is_empty() {
        sel.join(",")
    } else {
        "all".into()
    };
    vec![
        format!("{}{}", p.name, if p.name == default_partition { "*" } else { "" }),
        nodes,
        p.priority_tier.to_string(),
        if p.allowed_qos.is_empty() { "all".into() } else { p.allowed_qos.join(",") },
        if p.default_qos.is_empty() { "-".into() } else { p.default_qos.clone() },
        p.max_wall_s.map(policy_file::format_secs).unwrap_or_else(|| "-".into()),
    ]
}

//! `kairos burst`: the cloud-burst configuration (show, apply, set) and status.

use std::path::PathBuf;

use clap::Subcommand;
use kairos_proto::v1 as pb;

use crate::burst_file;
use crate::client::{CallError, Client};
use crate::output::{self, table};

#[derive(Subcommand, Debug)]
pub enum BurstCmd {
    /// The burst configuration.
    Config {
        #[command(subcommand)]
        command: BurstConfigCmd,
    },
    /// Instances (type, state, age, node, jobs), GPUs, spend against the limits, last decisions.
    Status,
}

#[derive(Subcommand, Debug)]
pub enum BurstConfigCmd {
    /// Print the configuration as a TOML file (or JSON with --json).
    Show,
    /// Replace the whole configuration with a TOML file (validated whole).
    Apply {
        /// The configuration file (TOML, as `burst config show` writes it).
        file: PathBuf,
    },
    /// Change top-level settings: KEY=VALUE ... (e.g. enabled=true max_instances=4).
    Set {
        /// KEY=VALUE assignments.
        #[arg(required = true)]
        assignments: Vec<String>,
    },
}

async fn get_burst_config(client: &Client) -> Result<pb::BurstConfig, CallError> {
    client
        .admin(pb::GetBurstConfigRequest {}, |mut c, r| async move { c.get_burst_config(r).await })
        .await
        .map(|r| r.into_inner())
}

async fn set_burst_config(client: &Client, config: pb::BurstConfig) -> Result<pb::BurstConfig, CallError> {
    client
        .admin(config.clone(), |mut c, r| async move { c.set_burst_config(r).await })
        .await
        .map(|r| r.into_inner())
}

fn dollars(milli: u64) -> String {
    format!("${:.2}", milli as f64 / 1000.0)
}

/// `burst status --json`.
fn status_json(s: &pb::BurstStatusResponse) -> serde_json::Value {
    let instances: Vec<serde_json::Value> = s
        .instances
        .iter()
        .map(|i| {
            serde_json::json!({
                "intent": i.intent, "instance_type": i.instance_type, "gpus": i.gpus, "spot": i.spot,
                "price_milli": i.price_milli, "state": i.state, "instance_id": i.instance_id,
                "node": i.node, "jobs": i.jobs, "requested": output::time_json(i.requested_ms),
                "ended": output::time_json(i.ended_ms), "reason": i.reason,
            })
        })
        .collect();
    let decisions: Vec<serde_json::Value> = s
        .decisions
        .iter()
        .map(|d| serde_json::json!({"time": output::time_json(d.time_ms), "message": d.message}))
        .collect();
    serde_json::json!({
        "enabled": s.enabled, "live_instances": s.live_instances, "live_gpus": s.live_gpus,
        "hourly_spend_milli": s.hourly_spend_milli, "spent_milli": s.spent_milli,
        "max_instances": s.max_instances, "max_gpus": s.max_gpus,
        "max_hourly_spend_milli": s.max_hourly_spend_milli,
        "on_prem_used": s.on_prem_used, "on_prem_total": s.on_prem_total, "on_prem_free": s.on_prem_free,
        "forecast_window_s": s.forecast_window_s, "forecast_expected_gpus": s.forecast_expected_gpus,
        "instances": instances, "decisions": decisions,
    })
}

/// `burst status`: the totals against the limits, the instances, the latest decisions.
fn print_status(s: &pb::BurstStatusResponse) {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    let age = |from: i64| {
        if from == 0 {
            "-".to_string()
        } else {
            format!("{}s", (now_ms - from).max(0) / 1000)
        }
    };
    println!(
        "burst {}: {}/{} instances, {}/{} GPUs, {}/h of {}/h, {} spent; on-prem GPUs {}/{} allocated",
        if s.enabled { "enabled" } else { "disabled" },
        s.live_instances,
        s.max_instances,
        s.live_gpus,
        s.max_gpus,
        dollars(s.hourly_spend_milli),
        dollars(s.max_hourly_spend_milli),
        dollars(s.spent_milli),
        s.on_prem_used,
        s.on_prem_total
    );
    if s.forecast_window_s > 0 {
        println!(
            "forecast: {} burstable GPUs asked for over the last {}s, {} on-prem GPUs free",
            s.forecast_expected_gpus, s.forecast_window_s, s.on_prem_free
        );
    }
    let rows: Vec<Vec<String>> = s
        .instances
        .iter()
        .map(|i| {
            vec![
                i.intent.to_string(),
                i.instance_id.clone(),
                i.instance_type.clone(),
                if i.spot { "spot" } else { "on-demand" }.to_string(),
                i.state.clone(),
                age(i.requested_ms),
                if i.node.is_empty() { "-".into() } else { i.node.clone() },
                i.jobs.iter().map(u64::to_string).collect::<Vec<_>>().join(","),
                i.reason.clone(),
            ]
        })
        .collect();
    if !rows.is_empty() {
        table(&["INTENT", "INSTANCE", "TYPE", "MARKET", "STATE", "AGE", "NODE", "JOBS", "REASON"], &rows);
    }
    for d in s.decisions.iter().take(10) {
        println!("{}  {}", output::time_json(d.time_ms).as_str().unwrap_or("-"), d.message);
    }
}

pub async fn burst_command(client: &Client, json: bool, command: BurstCmd) -> anyhow::Result<i32> {
    match command {
        BurstCmd::Config { command: BurstConfigCmd::Show } => {
            let config = get_burst_config(client).await?;
            let file = burst_file::BurstFile::from_pb(&config);
            if json {
                println!("{}", serde_json::to_string_pretty(&file)?);
            } else {
                print!("{}", toml::to_string(&file)?);
            }
        }
        BurstCmd::Config { command: BurstConfigCmd::Apply { file } } => {
            let text = std::fs::read_to_string(&file)
                .map_err(|e| anyhow::anyhow!("reading {}: {e}", file.display()))?;
            let parsed = burst_file::BurstFile::parse(&text)
                .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
            let config = parsed.to_pb().map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
            let applied = set_burst_config(client, config).await?;
            println!(
                "burst configuration applied: {} ({} instance types)",
                if applied.enabled { "enabled" } else { "disabled" },
                applied.instance_types.len()
            );
        }
        BurstCmd::Config { command: BurstConfigCmd::Set { assignments } } => {
            let mut file = burst_file::BurstFile::from_pb(&get_burst_config(client).await?);
            for a in &assignments {
                file.set(a).map_err(anyhow::Error::msg)?;
            }
            let config = file.to_pb().map_err(anyhow::Error::msg)?;
            set_burst_config(client, config).await?;
            println!("burst configuration updated");
        }
        BurstCmd::Status => {
            let s = client
                .admin(pb::BurstStatusRequest {}, |mut c, r| async move { c.burst_status(r).await })
                .await?
                .into_inner();
            if json {
                println!("{}", serde_json::to_string_pretty(&status_json(&s))?);
            } else {
                print_status(&s);
            }
        }
    }
    Ok(0)
}

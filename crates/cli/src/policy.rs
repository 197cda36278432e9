//! `kairos policy`: the whole scheduling policy as one TOML file (apply, export).

use std::path::PathBuf;

use clap::Subcommand;
use kairos_proto::v1 as pb;

use crate::client::{CallError, Client};
use crate::policy_file;

#[derive(Subcommand, Debug)]
pub enum PolicyCmd {
    /// Replace the whole policy with a TOML file (validated whole; nothing half-applied).
    Apply {
        /// The policy file (TOML, as `policy export` writes it).
        file: PathBuf,
        /// Check the file as the controllers would (whole), apply nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Print the policy as TOML.
    Export,
    /// Read the measured history and print the policy with what it supports, per QoS: wall
    /// limits from run times, CPUs and memory per GPU from use, GPU sharing where inference
    /// jobs' memory fits a fraction (or a MIG profile the nodes offer), idle notices where GPUs
    /// sit idle; each with its evidence. The output is a policy file `apply` takes.
    Advise(crate::insight::advise::AdviseArgs),
}

pub async fn get_policy(client: &Client) -> Result<pb::Policy, CallError> {
    client
        .admin(pb::GetPolicyRequest {}, |mut c, r| async move { c.get_policy(r).await })
        .await
        .map(|r| r.into_inner())
}

pub async fn policy_command(client: &Client, command: PolicyCmd) -> anyhow::Result<i32> {
    match command {
        PolicyCmd::Advise(args) => return crate::insight::advise::advise(client, args).await,
        PolicyCmd::Apply { file, dry_run } => {
            let text = std::fs::read_to_string(&file)
                .map_err(|e| anyhow::anyhow!("reading {}: {e}", file.display()))?;
            let parsed = policy_file::PolicyFile::parse(&text)
                .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
            let policy = parsed.to_pb().map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
            if dry_run {
                let checked = kairos_convert::policy::policy_from_pb(policy.clone())
                    .map_err(|e| anyhow::anyhow!("{}: {}", file.display(), e.message()))?;
                checked.validate().map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
                // What it would change in the cluster's policy, where the caller may read it
                // (without a cluster in reach the check stands alone).
                let wait = std::time::Duration::from_secs(3);
                match tokio::time::timeout(wait, get_policy(client)).await {
                    Ok(Ok(current)) => {
                        for change in policy_file::changes(&current, &policy).map_err(anyhow::Error::msg)? {
                            println!("{change}");
                        }
                    }
                    _ => {
                        println!("(the cluster's policy could not be read: what would change is not listed)")
                    }
                }
                println!("policy valid: {} qos classes (dry run: nothing applied)", checked.qos.len());
                return Ok(0);
            }
            let applied = client
                .admin(policy.clone(), |mut c, r| async move { c.apply_policy(r).await })
                .await?
                .into_inner();
            println!("policy applied: {} qos classes", applied.qos.len());
        }
        PolicyCmd::Export => {
            let policy = get_policy(client).await?;
            print!("{}", policy_file::PolicyFile::from_pb(&policy).to_toml().map_err(anyhow::Error::msg)?);
        }
    }
    Ok(0)
}

//! `kairos policy`: the whole scheduling policy as one TOML file (apply, export), and advice
//! for it from measured usage (`advise`, in `insight`).

use std::path::PathBuf;

use clap::Subcommand;
use kairos_proto::v1 as pb;

use crate::client::{CallError, Client};
use crate::policy_file;

#[derive(Subcommand, Debug)]
pub enum PolicyCmd {
    /// Replace the whole policy with a TOML file (validated whole; nothing half-applied).
    Apply {
        /// The policy file (TOML, as `policy export` or `policy advise` writes it).
        file: PathBuf,
        /// Check the file (parse, convert, the policy's own rules) and print what it would
        /// change; apply nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Print the policy as TOML.
    Export,
    /// Propose policy changes from the jobs' measured usage: prints the current policy file with
    /// the advised settings changed (marked "# advised") and each class's evidence as comments,
    /// ready for `policy apply --dry-run FILE` and `policy apply FILE`.
    Advise(crate::insight::AdviseArgs),
}

pub async fn get_policy(client: &Client) -> Result<pb::Policy, CallError> {
    client
        .admin(pb::GetPolicyRequest {}, |mut c, r| async move { c.get_policy(r).await })
        .await
        .map(|r| r.into_inner())
}

/// `policy apply --dry-run`: the file checked here, and what it would change in the cluster's.
async fn dry_run(client: &Client, file: &std::path::Path, text: &str) -> anyhow::Result<i32> {
    let policy = policy_file::check(text).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    let current = get_policy(client).await?;
    let changes = policy_file::changes(&current, &policy).map_err(anyhow::Error::msg)?;
    for c in &changes {
        println!("{c}");
    }
    println!(
        "dry run: {} is a valid policy ({} qos classes, {} partitions); {} settings would change; nothing applied",
        file.display(),
        policy.qos.len(),
        policy.partitions.len(),
        changes.len()
    );
    Ok(0)
}

pub async fn policy_command(client: &Client, json: bool, command: PolicyCmd) -> anyhow::Result<i32> {
    match command {
        PolicyCmd::Advise(args) => return crate::insight::advise_command(client, json, args).await,
        PolicyCmd::Apply { file, dry_run: true } => {
            let text = std::fs::read_to_string(&file)
                .map_err(|e| anyhow::anyhow!("reading {}: {e}", file.display()))?;
            return dry_run(client, &file, &text).await;
        }
        PolicyCmd::Apply { file, dry_run: false } => {
            let text = std::fs::read_to_string(&file)
                .map_err(|e| anyhow::anyhow!("reading {}: {e}", file.display()))?;
            let parsed = policy_file::PolicyFile::parse(&text)
                .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
            let policy = parsed.to_pb().map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
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

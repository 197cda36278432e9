//! `kairos policy`: the whole scheduling policy as one TOML file (apply, export).

use std::path::PathBuf;

use clap::Subcommand;

use crate::client::Client;
use crate::policy_file;

#[derive(Subcommand, Debug)]
pub enum PolicyCmd {
    /// Replace the whole policy with a TOML file (validated whole; nothing half-applied).
    ///
    /// First it replays the last 7 days of the cluster's history under the current policy and
    /// under the file's (`policy what-if`), prints the comparison, and asks for confirmation;
    /// the audit event of the change records the comparison's SHA-256 and the token that made
    /// it (`kairos events`).
    Apply {
        /// The policy file (TOML, as `policy export` writes it).
        file: PathBuf,
        /// Check the file as the controllers would (whole), apply nothing.
        #[arg(long)]
        dry_run: bool,
        /// Apply without asking (the comparison is still printed and recorded).
        #[arg(long, short = 'y')]
        yes: bool,
        /// Skip the replay of the history (nothing to show, nothing recorded).
        #[arg(long)]
        no_what_if: bool,
        /// The window the comparison replays.
        #[arg(long, default_value = crate::whatif::DEFAULT_SINCE)]
        since: String,
    },
    /// Replay the cluster's own recent history under the current policy and under a proposed
    /// one, and show what would change: waits per QoS and per account, preemptions and the
    /// work they lost, utilisation, fairshare shares, burst spend, and the largest changes in
    /// words. The replay of the current policy is checked against what happened first (its
    /// fidelity). Runs here, never on a controller.
    WhatIf(crate::whatif::WhatIfArgs),
    /// Print the policy as TOML.
    Export,
    /// Turn Kueue ClusterQueues and Cohorts (YAML) into accounts with GPU guarantees.
    ///
    /// Each ClusterQueue becomes an account under its cohort's (`spec.cohort` or
    /// `spec.cohortName`; none: root), each Cohort one under its parent (`spec.parentName`;
    /// none: root). Their GPU quotas (`nvidia.com/gpu`, `amd.com/gpu`, summed over flavors)
    /// map: `nominalQuota` to the guarantee, `borrowingLimit` to `borrow_limit` (absent:
    /// unlimited), `lendingLimit` to `lend_limit` (absent: all); a cohort is guaranteed its
    /// own quota and its members' together. CPU, memory and pods quotas, flavors,
    /// `queueingStrategy`, `reclaimWithinCohort` and `withinClusterQueue` are noted, not
    /// mapped; LocalQueues, ResourceFlavors and WorkloadPriorityClasses are skipped. What
    /// kairos cannot honour (`fairSharing`, `admissionChecks`, `borrowWithinCohort`, a
    /// namespace selector, other kinds, names with '.') is refused by name, and nothing is
    /// applied. Existing accounts keep their users, QoS and shares; only their parent and
    /// guarantee change.
    Import {
        /// The Kueue objects (YAML, one or more documents, or a `kubectl get -o yaml` List).
        file: PathBuf,
        /// Print the accounts as a policy file fragment (TOML) and change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Read the measured history and print the policy with what it supports, per QoS: wall
    /// limits from run times, CPUs and memory per GPU from use, GPU sharing where inference
    /// jobs' memory fits a fraction (or a MIG profile the nodes offer), idle notices where GPUs
    /// sit idle; each with its evidence. The output is a policy file `apply` takes.
    Advise(crate::insight::advise::AdviseArgs),
}

/// Asks `question` on the terminal; whether the answer was yes (end of input: no).
fn confirmed(question: &str) -> anyhow::Result<bool> {
    use std::io::Write;
    print!("{question}");
    std::io::stdout().flush()?;
    let mut answer = String::new();
    std::io::stdin().read_line(&mut answer)?;
    Ok(matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes"))
}

pub use crate::client::get_policy;

pub async fn policy_command(client: &Client, json: bool, command: PolicyCmd) -> anyhow::Result<i32> {
    match command {
        PolicyCmd::Advise(args) => return crate::insight::advise::advise(client, args).await,
        PolicyCmd::WhatIf(args) => return crate::whatif::what_if(client, json, args).await,
        PolicyCmd::Import { file, dry_run } => {
            return crate::kueue_import::import(client, &file, dry_run).await
        }
        PolicyCmd::Apply { file, dry_run, yes, no_what_if, since } => {
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
            let checked = kairos_convert::policy::policy_from_pb(policy.clone())
                .map_err(|e| anyhow::anyhow!("{}: {}", file.display(), e.message()))?;
            checked.validate().map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
            let mut policy = policy;
            if !no_what_if {
                let (c, _) = crate::whatif::what_if_on_cluster(client, &checked, &since, None)
                    .await
                    .map_err(|e| anyhow::anyhow!("what-if: {e} (--no-what-if applies without it)"))?;
                print!("{}", crate::whatif::compare::text(&c));
                println!("summary sha256: {}", c.summary_sha256);
                policy.what_if_hash = c.summary_sha256;
            }
            if !yes && !confirmed(&format!("apply {}? [y/N] ", file.display()))? {
                println!("policy not applied (not confirmed; --yes applies without asking)");
                return Ok(1);
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

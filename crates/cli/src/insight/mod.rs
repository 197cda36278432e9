//! Measured usage (docs/usage.md): the figures derived from history records (`figures`), the
//! commands that show them — `eff`, `top`, `report usage` — and `policy advise` (`advise`, the
//! pure advice; `proposal`, the advice written into the policy file).

pub mod advise;
pub mod eff;
pub mod figures;
pub mod neat;
pub mod proposal;
pub mod records;
pub mod report;
pub mod top;

use std::path::PathBuf;

use kairos_proto::v1 as pb;
use serde_json::{json, Value};

use crate::client::Client;
use crate::policy_file::PolicyFile;

/// `kairos policy advise`'s flags.
#[derive(clap::Args, Debug)]
pub struct AdviseArgs {
    /// Jobs live at or after this time: a time ago (`30d`), a date or an RFC 3339 time.
    #[arg(long, short = 'S', default_value = "30d")]
    pub since: String,
    /// Write the proposed policy file here (instead of printing it) and print only the advice.
    #[arg(long, value_name = "FILE")]
    pub write: Option<PathBuf>,
}

fn advice_json(advice: &[advise::ClassAdvice]) -> Value {
    Value::Array(
        advice
            .iter()
            .map(|a| {
                json!({
                    "table": a.table,
                    "jobs": a.jobs,
                    "changes": a.changes.iter().map(|c| json!({
                        "key": c.setting.key(), "value": c.setting.text(), "was": c.was, "why": c.why,
                    })).collect::<Vec<_>>(),
                    "notes": a.notes,
                })
            })
            .collect(),
    )
}

/// `kairos policy advise`: the current policy with the advice applied and annotated, printed
/// (or written with `--write`); `--json` prints the advice alone.
pub async fn advise_command(client: &Client, json: bool, args: AdviseArgs) -> anyhow::Result<i32> {
    let now = records::now_ms();
    let (since, _) = records::window(Some(&args.since), None, 0, now)?;
    let policy =
        client.admin(pb::GetPolicyRequest {}, |mut c, r| async move { c.get_policy(r).await }).await?;
    let policy = policy.into_inner();
    let nodes =
        client.admin(pb::ListNodesRequest {}, |mut c, r| async move { c.list_nodes(r).await }).await?;
    let offers = advise::offers(&nodes.into_inner().nodes);
    let request = pb::ListHistoryRequest { since_ms: since, ..Default::default() };
    let history = records::all(client, request).await?;
    let advice = advise::advise(&history, &policy, &offers);
    if json {
        crate::output::print_json(&advice_json(&advice));
        return Ok(0);
    }
    let mut file = PolicyFile::from_pb(&policy);
    proposal::apply(&mut file, &advice);
    let preamble = proposal::preamble(&format!("since {}", args.since), history.len());
    let text = proposal::render(&file, &advice, &preamble).map_err(anyhow::Error::msg)?;
    match args.write {
        None => print!("{text}"),
        Some(path) => {
            std::fs::write(&path, &text).map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
            let changes: usize = advice.iter().map(|a| a.changes.len()).sum();
            println!("{}: the proposed policy ({changes} changes)", path.display());
            for a in &advice {
                for c in &a.changes {
                    println!(
                        "{}.{} = {} (was {}): {}",
                        a.table,
                        c.setting.key(),
                        c.setting.text(),
                        c.was,
                        c.why
                    );
                }
                for n in &a.notes {
                    println!("{}: {n}", a.table);
                }
            }
        }
    }
    Ok(0)
}

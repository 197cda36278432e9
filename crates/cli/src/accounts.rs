//! `kairos account` (the fairshare tree, edited one account at a time on the server) and
//! `kairos share` (shares, usage and fairshare factors, like sshare).

use anyhow::Context;
use clap::Subcommand;
use kairos_proto::v1 as pb;

use crate::args::csv;
use crate::client::{CallError, Client};
use crate::output::{print_json, print_list, table};
use crate::policy::get_policy;

#[derive(Subcommand, Debug)]
pub enum AccountCmd {
    /// List accounts (usage and fairshare factors: `kairos share`).
    List,
    /// Create an account.
    Create {
        /// The account's name.
        name: String,
        #[command(flatten)]
        flags: AccountFlags,
    },
    /// Change the given settings of an account.
    Update {
        /// The account's name.
        name: String,
        #[command(flatten)]
        flags: AccountFlags,
    },
    /// Delete an account no unfinished job uses.
    Delete {
        /// The account's name.
        name: String,
    },
}

#[derive(clap::Args, Debug)]
pub struct AccountFlags {
    /// Parent account ("" for a root account).
    #[arg(long)]
    parent: Option<String>,
    /// Its fairshare shares (relative to its siblings').
    #[arg(long)]
    shares: Option<u32>,
    /// Members, comma-separated ("" = open to every user).
    #[arg(long)]
    users: Option<String>,
    /// QoS its jobs may use, comma-separated ("" = as the parent allows; every QoS at the top).
    #[arg(long, value_name = "QOS,..")]
    allowed_qos: Option<String>,
    /// QoS its jobs get when they name none ("" = the parent's).
    #[arg(long, value_name = "QOS")]
    default_qos: Option<String>,
    /// Set --allowed-qos/--default-qos for this user's jobs under the account only (like
    /// Slurm's association), before the account's own.
    #[arg(long, value_name = "USER")]
    user: Option<String>,
    /// GPUs guaranteed to the team's jobs (with its children's, as a cohort): they start
    /// before any borrower, and take back what other teams borrowed of them by preempting
    /// those borrowers through their QoS's preempt mode (checkpoint and requeue within the
    /// grace). 0 with no limits: no guarantee.
    #[arg(long, value_name = "N")]
    guaranteed_gpus: Option<u32>,
    /// GPUs it may use beyond its guarantee, of other teams' idle share ("unlimited").
    #[arg(long, value_name = "N|unlimited", value_parser = limit)]
    borrow_limit: Option<Limit>,
    /// GPUs of its idle guarantee other teams may borrow ("all").
    #[arg(long, value_name = "N|all", value_parser = limit)]
    lend_limit: Option<Limit>,
}

/// A borrow or lend limit: a count, or none.
#[derive(Clone, Copy, Debug)]
pub struct Limit(Option<u32>);

fn limit(s: &str) -> Result<Limit, String> {
    match s {
        "unlimited" | "all" | "none" => Ok(Limit(None)),
        n => n.parse().map(|n| Limit(Some(n))).map_err(|_| format!("\"{n}\": a GPU count, or unlimited/all")),
    }
}

impl AccountFlags {
    fn apply_to(&self, a: &mut pb::Account) {
        if let Some(p) = &self.parent {
            a.parent = p.clone();
        }
        if let Some(sh) = self.shares {
            a.shares = sh;
        }
        if let Some(u) = &self.users {
            a.users = csv(u);
        }
        let (allowed, default) = match &self.user {
            None => (&mut a.allowed_qos, &mut a.default_qos),
            Some(user) => {
                if !a.user_qos.iter().any(|u| &u.user == user) {
                    a.user_qos.push(pb::UserQos { user: user.clone(), ..Default::default() });
                }
                let entry = a.user_qos.iter_mut().find(|u| &u.user == user).expect("just added");
                (&mut entry.allowed_qos, &mut entry.default_qos)
            }
        };
        if let Some(q) = &self.allowed_qos {
            *allowed = csv(q);
        }
        if let Some(q) = &self.default_qos {
            default.clone_from(q);
        }
        // A user entry that says nothing is no entry.
        a.user_qos.retain(|u| !u.allowed_qos.is_empty() || !u.default_qos.is_empty());
        if self.guaranteed_gpus.is_some() || self.borrow_limit.is_some() || self.lend_limit.is_some() {
            let g = a.guarantee.get_or_insert_with(Default::default);
            if let Some(n) = self.guaranteed_gpus {
                g.gpus = n;
            }
            if let Some(Limit(n)) = self.borrow_limit {
                g.borrow_limit = n;
            }
            if let Some(Limit(n)) = self.lend_limit {
                g.lend_limit = n;
            }
            if g.gpus == 0 && g.borrow_limit.is_none() && g.lend_limit.is_none() {
                a.guarantee = None;
            }
        }
    }
}

/// `a,b` or "(inherited)" for an empty QoS list; "-" for no default.
fn qos_cell(allowed: &[String], default: &str) -> String {
    let allowed = if allowed.is_empty() { "(inherited)".to_string() } else { allowed.join(",") };
    let default = if default.is_empty() { "-" } else { default };
    format!("{allowed} (default {default})")
}

/// "8 (borrow ≤ 4, lend ≤ 2)", or "-" without a guarantee.
fn guarantee_cell(g: Option<&pb::Guarantee>) -> String {
    let Some(g) = g else { return "-".into() };
    let mut s = g.gpus.to_string();
    let limits: Vec<String> = [("borrow", g.borrow_limit), ("lend", g.lend_limit)]
        .into_iter()
        .filter_map(|(what, n)| Some(format!("{what} ≤ {}", n?)))
        .collect();
    if !limits.is_empty() {
        s.push_str(&format!(" ({})", limits.join(", ")));
    }
    s
}

/// A warning (not a refusal: nodes come and go) when the teams at the top are guaranteed
/// more GPUs than the cluster's nodes have, or than its up nodes have.
async fn warn_over_cluster(client: &Client) {
    let (Ok(policy), Ok(nodes)) = (
        get_policy(client).await,
        client.admin(pb::ListNodesRequest {}, |mut c, r| async move { c.list_nodes(r).await }).await,
    ) else {
        return;
    };
    let guaranteed = |a: &pb::Account| a.guarantee.as_ref().map_or(0, |g| u64::from(g.gpus));
    let has_guaranteed_ancestor = |a: &pb::Account| {
        let mut at = a.parent.clone();
        for _ in 0..=policy.accounts.len() {
            let Some(p) = policy.accounts.iter().find(|x| x.name == at) else { return false };
            if p.guarantee.as_ref().is_some_and(|g| g.gpus > 0) {
                return true;
            }
            at = p.parent.clone();
        }
        false
    };
    let top: u64 = policy.accounts.iter().filter(|a| !has_guaranteed_ancestor(a)).map(guaranteed).sum();
    let nodes = nodes.into_inner().nodes;
    let gpus = |up: bool| -> u64 {
        let n = nodes.iter().filter(|n| !up || n.state == pb::NodeState::Up as i32);
        n.map(|n| n.info.as_ref().map_or(0, |i| i.gpus.len() as u64)).sum()
    };
    let (all, up) = (gpus(false), gpus(true));
    if top > up {
        eprintln!(
            "warning: teams are guaranteed {top} GPUs together; the cluster has {all} ({up} on up nodes): \
             not every guarantee can be honoured now"
        );
    }
}

async fn get_shares(client: &Client) -> Result<Vec<pb::AccountShare>, CallError> {
    let shares =
        client.admin(pb::GetSharesRequest {}, |mut c, r| async move { c.get_shares(r).await }).await?;
    Ok(shares.into_inner().accounts)
}

async fn put_account(
    client: &Client,
    account: pb::Account,
    mode: pb::PutMode,
) -> Result<pb::Account, CallError> {
    let req = pb::PutAccountRequest { account: Some(account), mode: mode as i32 };
    client.admin(req, |mut c, r| async move { c.put_account(r).await }).await.map(|r| r.into_inner())
}

pub async fn account_command(client: &Client, json: bool, command: AccountCmd) -> anyhow::Result<i32> {
    match command {
        AccountCmd::List => {
            let policy = get_policy(client).await?;
            let shares = get_shares(client).await?;
            let team =
                |a: &pb::Account| shares.iter().find(|s| s.name == a.name).cloned().unwrap_or_default();
            let parent = |a: &pb::Account| (!a.parent.is_empty()).then(|| a.parent.clone());
            print_list(
                json,
                &policy.accounts,
                |a| {
                    let user_qos: serde_json::Map<String, serde_json::Value> = a
                        .user_qos
                        .iter()
                        .map(|u| {
                            let default = (!u.default_qos.is_empty()).then(|| u.default_qos.clone());
                            (
                                u.user.clone(),
                                serde_json::json!({"allowed_qos": u.allowed_qos, "default_qos": default}),
                            )
                        })
                        .collect();
                    let default = (!a.default_qos.is_empty()).then(|| a.default_qos.clone());
                    let (g, t) = (a.guarantee.as_ref(), team(a));
                    serde_json::json!({"name": a.name, "parent": parent(a), "shares": a.shares, "users": a.users,
                        "allowed_qos": a.allowed_qos, "default_qos": default, "user_qos": user_qos,
                        "guaranteed_gpus": g.map(|g| g.gpus), "borrow_limit": g.and_then(|g| g.borrow_limit),
                        "lend_limit": g.and_then(|g| g.lend_limit), "gpus_in_use": t.gpus_in_use,
                        "gpus_borrowed": t.gpus_borrowed, "gpus_lent": t.gpus_lent})
                },
                &["ACCOUNT", "PARENT", "SHARES", "USERS", "QOS", "GUARANTEED", "IN USE", "BORROWED", "LENT"],
                |a| {
                    let users = if a.users.is_empty() { "(open)".into() } else { a.users.join(",") };
                    let mut qos = qos_cell(&a.allowed_qos, &a.default_qos);
                    for u in &a.user_qos {
                        qos.push_str(&format!("; {}: {}", u.user, qos_cell(&u.allowed_qos, &u.default_qos)));
                    }
                    vec![
                        a.name.clone(),
                        parent(a).unwrap_or_else(|| "-".into()),
                        a.shares.to_string(),
                        users,
                        qos,
                        guarantee_cell(a.guarantee.as_ref()),
                        team(a).gpus_in_use.to_string(),
                        team(a).gpus_borrowed.to_string(),
                        team(a).gpus_lent.to_string(),
                    ]
                },
            );
        }
        AccountCmd::Create { name, flags } => {
            let mut a = pb::Account { name: name.clone(), shares: 1, ..Default::default() };
            flags.apply_to(&mut a);
            put_account(client, a, pb::PutMode::Create).await?;
            println!("account \"{name}\" created");
            warn_over_cluster(client).await;
        }
        AccountCmd::Update { name, flags } => {
            // Only this account is read and written back: edits of other pieces are not lost.
            let policy = get_policy(client).await?;
            let mut a = policy
                .accounts
                .into_iter()
                .find(|a| a.name == name)
                .context(format!("account \"{name}\" not found"))?;
            flags.apply_to(&mut a);
            put_account(client, a, pb::PutMode::Update).await?;
            println!("account \"{name}\" updated");
            warn_over_cluster(client).await;
        }
        AccountCmd::Delete { name } => {
            let req = pb::DeleteAccountRequest { name: name.clone() };
            client.admin(req, |mut c, r| async move { c.delete_account(r).await }).await?;
            println!("account \"{name}\" deleted");
        }
    }
    Ok(0)
}

pub async fn share(client: &Client, json: bool) -> anyhow::Result<i32> {
    let accounts = get_shares(client).await?;
    if json {
        let v: Vec<serde_json::Value> = accounts
                .iter()
                .map(|a| {
                    serde_json::json!({
                        "account": a.name, "parent": if a.parent.is_empty() { serde_json::Value::Null } else { a.parent.clone().into() },
                        "shares": a.shares, "usage_gpu_s": (a.usage_gpu_s * 1000.0).round() / 1000.0,
                        "fairshare_factor": (a.fairshare_factor * 10_000.0).round() / 10_000.0,
                    })
                })
                .collect();
        print_json(&serde_json::Value::Array(v));
    } else {
        let rows: Vec<Vec<String>> = accounts
            .iter()
            .map(|a| {
                vec![
                    a.name.clone(),
                    if a.parent.is_empty() { "-".into() } else { a.parent.clone() },
                    a.shares.to_string(),
                    format!("{:.1}", a.usage_gpu_s),
                    format!("{:.4}", a.fairshare_factor),
                ]
            })
            .collect();
        table(&["ACCOUNT", "PARENT", "SHARES", "USAGE(GPU-s)", "FAIRSHARE"], &rows);
    }
    Ok(0)
}

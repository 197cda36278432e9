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
    }
}

/// `a,b` or "(inherited)" for an empty QoS list; "-" for no default.
fn qos_cell(allowed: &[String], default: &str) -> String {
    let allowed = if allowed.is_empty() { "(inherited)".to_string() } else { allowed.join(",") };
    let default = if default.is_empty() { "-" } else { default };
    format!("{allowed} (default {default})")
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
                    serde_json::json!({"name": a.name, "parent": parent(a), "shares": a.shares, "users": a.users,
                        "allowed_qos": a.allowed_qos, "default_qos": default, "user_qos": user_qos})
                },
                &["ACCOUNT", "PARENT", "SHARES", "USERS", "QOS"],
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
                    ]
                },
            );
        }
        AccountCmd::Create { name, flags } => {
            let mut a = pb::Account { name: name.clone(), shares: 1, ..Default::default() };
            flags.apply_to(&mut a);
            put_account(client, a, pb::PutMode::Create).await?;
            println!("account \"{name}\" created");
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
    let accounts = client
        .admin(pb::GetSharesRequest {}, |mut c, r| async move { c.get_shares(r).await })
        .await?
        .into_inner()
        .accounts;
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

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
    }
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
                |a| serde_json::json!({"name": a.name, "parent": parent(a), "shares": a.shares, "users": a.users}),
                &["ACCOUNT", "PARENT", "SHARES", "USERS"],
                |a| {
                    let users = if a.users.is_empty() { "(open)".into() } else { a.users.join(",") };
                    vec![a.name.clone(), parent(a).unwrap_or_else(|| "-".into()), a.shares.to_string(), users]
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

//! `kairos token`: API tokens (create, list, revoke; admins).

use clap::Subcommand;
use kairos_proto::v1 as pb;

use crate::args::{parse_time, request_id};
use crate::client::Client;
use crate::output::print_list;

#[derive(Subcommand, Debug)]
pub enum TokenCmd {
    /// Issue a token; prints it once (only its hash is stored).
    Create {
        /// The kairos user the token acts as.
        #[arg(long)]
        user: String,
        /// user, operator or admin.
        #[arg(long, default_value = "user")]
        role: String,
        /// Lifetime (e.g. 30d, 12h); default: until revoked.
        #[arg(long, value_parser = parse_time)]
        ttl: Option<u64>,
        /// What the token is for (shown by `token list`).
        #[arg(long, default_value = "")]
        description: String,
    },
    /// Tokens: id, user, role, creator, expiry, description (never the secret).
    List,
    /// Revoke a token by its id (or the whole token).
    Revoke {
        /// The token's id (or the whole token).
        id: String,
    },
}

pub async fn token_command(client: &Client, json: bool, command: TokenCmd) -> anyhow::Result<i32> {
    match command {
        TokenCmd::Create { user, role, ttl, description } => {
            // One request id for every retry of this create: at most one token results.
            let req = pb::CreateTokenRequest {
                user,
                role,
                ttl_s: ttl.unwrap_or(0),
                description,
                request_id: request_id(),
            };
            let created =
                client.admin(req, |mut c, r| async move { c.create_token(r).await }).await?.into_inner();
            if json {
                println!("{}", serde_json::json!({"id": created.id, "token": created.token}));
            } else {
                // The token alone on stdout (scripts capture it); its id, for `token revoke`, beside.
                println!("{}", created.token);
                eprintln!("token id {} (kairos token revoke {} ends it)", created.id, created.id);
            }
        }
        TokenCmd::List => {
            let tokens = client
                .admin(pb::ListTokensRequest {}, |mut c, r| async move { c.list_tokens(r).await })
                .await?
                .into_inner()
                .tokens;
            let json_of = |t: &pb::TokenInfo| {
                serde_json::json!({"id": t.id, "user": t.user, "role": t.role, "created_ms": t.created_ms,
                    "created_by": t.created_by, "expires_ms": t.expires_ms, "description": t.description})
            };
            let row = |t: &pb::TokenInfo| {
                let when = |ms: i64| match crate::output::time_json(ms) {
                    serde_json::Value::String(t) => t,
                    _ => "never".to_string(),
                };
                vec![
                    t.id.clone(),
                    t.user.clone(),
                    t.role.clone(),
                    when(t.created_ms),
                    t.created_by.clone(),
                    when(t.expires_ms),
                    t.description.clone(),
                ]
            };
            print_list(
                json,
                &tokens,
                json_of,
                &["ID", "USER", "ROLE", "CREATED", "CREATED_BY", "EXPIRES", "DESCRIPTION"],
                row,
            );
        }
        TokenCmd::Revoke { id } => {
            client
                .admin(pb::RevokeTokenRequest { id: id.clone() }, |mut c, r| async move {
                    c.revoke_token(r).await
                })
                .await?;
            println!("revoked");
        }
    }
    Ok(0)
}

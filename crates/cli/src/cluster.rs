//! `kairos cluster`: the controller replicas (status, add, remove) and backups.

use clap::Subcommand;
use kairos_proto::v1 as pb;
use kairos_proto::v1::admin_service_client::AdminServiceClient;

use crate::client::{CallError, Client};
use crate::output::{self, print_json, table};

#[derive(Subcommand, Debug)]
pub enum ClusterCmd {
    /// Replicas, leader, term and indices.
    Status,
    /// Add a replica (started with `kairosd --join`): a learner until caught up, then a voter.
    Add {
        /// The new replica's id (its `kairosd --id`).
        id: u64,
        /// Its Raft address, HOST:PORT.
        addr: String,
    },
    /// Remove a replica; removing the leader hands leadership over.
    Remove {
        /// The replica's id.
        id: u64,
    },
    /// Backups of the replicated state.
    Snapshot {
        #[command(subcommand)]
        action: SnapshotCmd,
    },
}

#[derive(Subcommand, Debug)]
pub enum SnapshotCmd {
    /// Save a consistent backup (from the leader, holding every acknowledged write) to FILE;
    /// `kairosd --restore-from FILE` starts a new cluster from it.
    Save {
        /// Where to write the backup (replaced atomically).
        file: std::path::PathBuf,
    },
}

/// A temporary name beside `file`: `.NAME.RANDOM.partial`.
fn partial_name(file: &std::path::Path) -> anyhow::Result<std::path::PathBuf> {
    let mut random = [0u8; 12];
    getrandom::fill(&mut random)
        .map_err(|e| CallError(format!("no randomness for a temporary name: {e}")))?;
    let name = file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    Ok(file.with_file_name(format!(".{name}.{}.partial", hex::encode(random))))
}

/// Streams the leader's backup into `file` (through a temporary file, fsync'd, renamed).
async fn save_snapshot(client: &Client, json: bool, file: &std::path::Path) -> anyhow::Result<i32> {
    use std::io::Write;
    use tokio_stream::StreamExt;
    let mut stream = client
        .admin(pb::SaveSnapshotRequest {}, |mut c, r| async move { c.save_snapshot(r).await })
        .await?
        .into_inner();
    // A backup holds every job's environment and the token digests: owner-only, and its
    // temporary file is new (never one someone placed, nor through a link) under a name no one
    // can guess.
    let tmp = partial_name(file)?;
    let mut out = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)
            .map_err(|e| CallError(format!("creating {}: {e}", tmp.display())))?
    };
    let written = async {
        let mut bytes = 0usize;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|s| CallError(format!("receiving the snapshot: {}", s.message())))?;
            bytes += chunk.data.len();
            out.write_all(&chunk.data).map_err(|e| CallError(format!("writing {}: {e}", tmp.display())))?;
        }
        out.sync_all().map_err(|e| CallError(format!("syncing {}: {e}", tmp.display())))?;
        std::fs::rename(&tmp, file).map_err(|e| CallError(format!("renaming to {}: {e}", file.display())))?;
        Ok::<usize, CallError>(bytes)
    }
    .await;
    let bytes = written.inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })?;
    let header = std::fs::read(file)
        .ok()
        .and_then(|b| {
            b.split(|c| *c == b'\n').next().and_then(|l| serde_json::from_slice::<serde_json::Value>(l).ok())
        })
        .unwrap_or_default();
    if json {
        print_json(
            &serde_json::json!({"file": file.display().to_string(), "bytes": bytes, "header": header}),
        );
    } else {
        println!("saved {bytes} bytes (applied index {}) to {}", header["applied_index"], file.display());
    }
    Ok(0)
}

pub async fn cluster_command(client: &Client, json: bool, command: ClusterCmd) -> anyhow::Result<i32> {
    if let ClusterCmd::Snapshot { action: SnapshotCmd::Save { file } } = &command {
        return save_snapshot(client, json, file).await;
    }
    let status = client
        .call(|ch| {
            let mut admin = AdminServiceClient::new(ch);
            let command = &command;
            async move {
                match command {
                    ClusterCmd::Status => {
                        admin.cluster_status(client.request(pb::ClusterStatusRequest {})).await
                    }
                    ClusterCmd::Add { id, addr } => {
                        let req = pb::AddReplicaRequest { id: *id, addr: addr.clone() };
                        admin.add_replica(client.request(req)).await
                    }
                    ClusterCmd::Remove { id } => {
                        admin.remove_replica(client.request(pb::RemoveReplicaRequest { id: *id })).await
                    }
                    ClusterCmd::Snapshot { .. } => unreachable!("handled above"),
                }
            }
        })
        .await?
        .into_inner();
    let j = output::cluster_json(&status);
    if json {
        print_json(&j);
    } else {
        println!(
            "leader: {} ({})  term: {}  commit index: {}  applied index: {}  digest: {}",
            j["leader"],
            status.leader_addr,
            status.term,
            status.commit_index,
            status.applied_index,
            status.state_digest
        );
        let rows: Vec<Vec<String>> = status
            .replicas
            .iter()
            .map(|r| {
                let reach = if r.reachable { "yes" } else { "no" };
                vec![r.id.to_string(), r.addr.clone(), r.role.clone(), reach.to_string()]
            })
            .collect();
        table(&["ID", "ADDR", "ROLE", "REACHABLE"], &rows);
    }
    Ok(0)
}

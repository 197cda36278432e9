//! `kairos cluster`: the controller replicas (status, add, remove).

use clap::Subcommand;
use kairos_proto::v1 as pb;
use kairos_proto::v1::admin_service_client::AdminServiceClient;

use crate::client::Client;
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
}

pub async fn cluster_command(client: &Client, json: bool, command: ClusterCmd) -> anyhow::Result<i32> {
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

//! Operators' node commands: list, drain, resume, remove, and GPU resets.

use clap::Subcommand;
use kairos_proto::v1 as pb;

use crate::client::Client;
use crate::output::{node_json, node_row, print_list, NODE_HEADER};

#[derive(Subcommand, Debug)]
pub enum NodeCmd {
    /// Forget a node that holds no job (down, or drained and idle); its credentials stop working.
    Remove {
        /// The node's name.
        name: String,
    },
    /// A draining node takes work again.
    Resume {
        /// The node's name.
        name: String,
    },
    /// Return an unhealthy GPU to service (after the GPU was reset or replaced).
    GpuReset {
        /// The node's name.
        name: String,
        /// The GPU's index on the node.
        gpu: u32,
    },
}

pub async fn list(client: &Client, json: bool) -> anyhow::Result<i32> {
    let nodes = client
        .admin(pb::ListNodesRequest {}, |mut c, r| async move { c.list_nodes(r).await })
        .await?
        .into_inner()
        .nodes;
    print_list(json, &nodes, node_json, &NODE_HEADER, node_row);
    Ok(0)
}

pub async fn drain(client: &Client, node: String, reason: String) -> anyhow::Result<i32> {
    client
        .admin(pb::DrainNodeRequest { node: node.clone(), reason: reason.clone() }, |mut c, r| async move {
            c.drain_node(r).await
        })
        .await?;
    println!("node {node} drains");
    Ok(0)
}

pub async fn node_command(client: &Client, command: NodeCmd) -> anyhow::Result<i32> {
    match command {
        NodeCmd::Remove { name } => {
            let req = pb::RemoveNodeRequest { node: name.clone() };
            client.admin(req, |mut c, r| async move { c.remove_node(r).await }).await?;
            println!("node {name} removed");
        }
        NodeCmd::Resume { name } => {
            let req = pb::ResumeNodeRequest { node: name.clone() };
            client.admin(req, |mut c, r| async move { c.resume_node(r).await }).await?;
            println!("node {name} resumes");
        }
        NodeCmd::GpuReset { name, gpu } => {
            let req = pb::ResetGpuRequest { node: name.clone(), gpu };
            client.admin(req, |mut c, r| async move { c.reset_gpu(r).await }).await?;
            println!("GPU {gpu} of node {name} is back in service");
        }
    }
    Ok(0)
}

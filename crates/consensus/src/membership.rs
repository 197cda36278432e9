//! Changing who the replicas are: add (as a learner, promoted to voter once caught up) and
//! remove. Both run on the leader; every request is checked against the current membership
//! first, so a conflicting or impossible change is refused with a reason and changes nothing.

use std::collections::BTreeSet;
use std::time::Duration;

use openraft::error::{ClientWriteError, RaftError};
use openraft::{BasicNode, ChangeMembers};
use thiserror::Error;

use crate::replica::Replica;
use crate::types::ReplicaId;

/// How long a new replica may take to catch up before it is promoted.
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Debug, Error)]
pub enum MembershipError {
    #[error("not the leader (leader: {leader_addr:?})")]
    NotLeader { leader_addr: Option<String> },
    #[error("replica {id} is already a member at {addr}")]
    IdTaken { id: ReplicaId, addr: String },
    #[error("address {addr} already belongs to replica {id}")]
    AddrTaken { id: ReplicaId, addr: String },
    #[error("replica {0} is not a member")]
    NotMember(ReplicaId),
    #[error("replica {0} is the last voter; a cluster cannot remove its last voter")]
    LastVoter(ReplicaId),
    #[error("address \"{0}\" is not HOST:PORT")]
    BadAddr(String),
    #[error("replica id 0 is reserved")]
    ZeroId,
    #[error("replica {0} did not catch up within {CATCH_UP_TIMEOUT:?}; it stays a learner")]
    CatchUpTimeout(ReplicaId),
    #[error("membership change failed: {0}")]
    Raft(String),
}

fn map_err(e: RaftError<ReplicaId, ClientWriteError<ReplicaId, BasicNode>>) -> MembershipError {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => {
            MembershipError::NotLeader { leader_addr: f.leader_node.map(|n| n.addr) }
        }
        other => MembershipError::Raft(other.to_string()),
    }
}

impl Replica {
    fn leader_check(&self) -> Result<(), MembershipError> {
        if self.is_leader() {
            return Ok(());
        }
        let status = self.status();
        Err(MembershipError::NotLeader { leader_addr: status.leader_addr })
    }

    /// Adds replica `id` at `addr`: first as a learner (it receives the log or a snapshot), then,
    /// once caught up, as a voter. Adding a replica that is already a voter at that address is a
    /// no-op.
    pub async fn add_replica(&self, id: ReplicaId, addr: &str) -> Result<(), MembershipError> {
        if id == 0 {
            return Err(MembershipError::ZeroId);
        }
        if addr.parse::<std::net::SocketAddr>().is_err() {
            return Err(MembershipError::BadAddr(addr.chars().take(128).collect()));
        }
        self.leader_check()?;
        let membership = self.raft.metrics().borrow().membership_config.clone();
        let voters: BTreeSet<ReplicaId> = membership.voter_ids().collect();
        for (member, node) in membership.nodes() {
            if *member == id && node.addr != addr {
                return Err(MembershipError::IdTaken { id, addr: node.addr.clone() });
            }
            if *member != id && node.addr == addr {
                return Err(MembershipError::AddrTaken { id: *member, addr: addr.to_string() });
            }
        }
        if voters.contains(&id) {
            return Ok(());
        }
        let add = self.raft.add_learner(id, BasicNode::new(addr), true);
        match tokio::time::timeout(CATCH_UP_TIMEOUT, add).await {
            Err(_) => return Err(MembershipError::CatchUpTimeout(id)),
            Ok(r) => r.map_err(map_err)?,
        };
        self.raft
            .change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), false)
            .await
            .map_err(map_err)?;
        tracing::info!(replica = id, %addr, "replica added as a voter");
        Ok(())
    }

    /// Removes replica `id` from the cluster. Removing the leader hands leadership to another
    /// voter once the change is committed.
    pub async fn remove_replica(&self, id: ReplicaId) -> Result<(), MembershipError> {
        self.leader_check()?;
        let membership = self.raft.metrics().borrow().membership_config.clone();
        let voters: BTreeSet<ReplicaId> = membership.voter_ids().collect();
        let is_node = membership.nodes().any(|(m, _)| *m == id);
        if !is_node {
            return Err(MembershipError::NotMember(id));
        }
        let change = if voters.contains(&id) {
            if voters.len() == 1 {
                return Err(MembershipError::LastVoter(id));
            }
            ChangeMembers::RemoveVoters(BTreeSet::from([id]))
        } else {
            ChangeMembers::RemoveNodes(BTreeSet::from([id]))
        };
        self.raft.change_membership(change, false).await.map_err(map_err)?;
        tracing::info!(replica = id, "replica removed");
        Ok(())
    }
}

//! What a replica reports to operators (`kairos cluster status`): its view of the
//! membership, the leader and each replica's role, its log, commit and apply indexes, and a
//! digest of its state to compare replicas by.

use std::collections::BTreeMap;

use kairos_scheduler::ClusterState;
use openraft::ServerState;

use crate::replica::Replica;
use crate::store;
use crate::types::ReplicaId;

impl Replica {
    /// A status summary for operators.
    pub fn status(&self) -> ReplicaStatus {
        let m = self.raft.metrics().borrow().clone();
        let (digest, applied_index) =
            self.read(|a| (state_digest(&a.state), a.last_applied.map(|l| l.index)));
        let members: BTreeMap<ReplicaId, String> =
            m.membership_config.nodes().map(|(id, n)| (*id, n.addr.clone())).collect();
        let voters: Vec<ReplicaId> = m.membership_config.voter_ids().collect();
        // A replica removed from the membership knows no current leader.
        let leader = m.current_leader.filter(|_| members.contains_key(&self.id));
        let replicas = members
            .iter()
            .map(|(id, addr)| {
                let role = if leader == Some(*id) {
                    "leader"
                } else if !voters.contains(id) {
                    "learner"
                } else if *id == self.id && m.state == ServerState::Candidate {
                    "candidate"
                } else {
                    "follower"
                };
                (*id, addr.clone(), role.to_string())
            })
            .collect();
        ReplicaStatus {
            id: self.id,
            leader,
            leader_addr: leader.and_then(|l| members.get(&l).cloned()),
            term: m.current_term,
            last_log_index: m.last_log_index.unwrap_or(0),
            commit_index: self.commit_index.load(std::sync::atomic::Ordering::Relaxed),
            applied_index: applied_index.unwrap_or(0),
            state_digest: digest,
            snapshot_index: m.snapshot.map(|l| l.index),
            replicas,
        }
    }
}

#[derive(Clone, Debug)]
pub struct ReplicaStatus {
    pub id: ReplicaId,
    pub leader: Option<ReplicaId>,
    pub leader_addr: Option<String>,
    pub term: u64,
    pub last_log_index: u64,
    pub commit_index: u64,
    pub applied_index: u64,
    pub state_digest: String,
    /// Last log index covered by this replica's snapshot (built or installed).
    pub snapshot_index: Option<u64>,
    /// (id, address, role)
    pub replicas: Vec<(ReplicaId, String, String)>,
}

/// A digest of the state: equal on replicas that applied the same log (FNV-1a 64 of the
/// snapshot encoding, which is deterministic because the state holds only ordered maps).
pub fn state_digest(state: &ClusterState) -> String {
    let bytes = store::encode_snapshot(state).unwrap_or_default();
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{hash:016x}")
}

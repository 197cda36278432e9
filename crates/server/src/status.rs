//! How the core's answers become gRPC statuses: a write that did not commit (`write_status`:
//! `UNAVAILABLE`, naming the leader where clients retry) and a rejection (`rejection_status`:
//! the precise code).

use kairos_consensus::WriteError;
use kairos_scheduler::Rejection;
use tonic::Status;

/// Metadata key carrying the leader's address on an `UNAVAILABLE` answer.
pub const LEADER_HEADER: &str = "kairos-leader";

/// `UNAVAILABLE` saying `why`, with the leader's address (message and `kairos-leader` metadata,
/// where clients retry) when known.
pub fn unavailable(why: &str, leader_addr: Option<String>) -> Status {
    let mut status = Status::unavailable(match &leader_addr {
        Some(addr) => format!("{why}; the leader is at {addr}"),
        None => why.to_string(),
    });
    if let Some(addr) = leader_addr.and_then(|a| a.parse().ok()) {
        status.metadata_mut().insert(LEADER_HEADER, addr);
    }
    status
}

pub fn write_status(e: WriteError) -> Status {
    match e {
        WriteError::NotLeader { leader_addr: Some(addr), .. } => unavailable("not the leader", Some(addr)),
        WriteError::NotLeader { leader_addr: None, .. } => {
            unavailable("no leader is elected (is a quorum of replicas up?)", None)
        }
        WriteError::Timeout(_) => Status::unavailable(e.to_string()),
        WriteError::Raft(m) => Status::unavailable(format!("replication failed: {m}")),
    }
}

pub fn rejection_status(r: Rejection) -> Status {
    match r {
        Rejection::NotFound(m) => Status::not_found(m),
        Rejection::Invalid(m) => Status::invalid_argument(m),
        Rejection::FailedPrecondition(m) => Status::failed_precondition(m),
        Rejection::ResourceExhausted(m) => Status::resource_exhausted(m),
        Rejection::PermissionDenied(m) => Status::permission_denied(m),
    }
}

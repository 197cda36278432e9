//! Fast failover when the leader's process is gone.
//!
//! Raft followers only notice a dead leader after their election timeout, and openraft adds the
//! leader lease on top. When the leader's *process* dies but its host stays up, its port refuses
//! connections at once; this watchdog sees that and starts an election right away instead of
//! waiting out the timers. To avoid split votes, surviving voters go in id order, each waiting a
//! stagger per rank and standing only if still no new leader is known.
//!
//! Safety does not depend on it: an election is always safe in Raft. A leader that is slow,
//! partitioned or on a dead host (no refusal, only silence) is left to the normal timers.

use std::time::Duration;

use openraft::ServerState;

use crate::replica::Replica;

/// How often a follower probes its leader's port.
const PROBE_INTERVAL: Duration = Duration::from_millis(40);
/// Consecutive refusals that count as "the leader process is gone".
const REFUSALS: u32 = 2;
/// Extra wait per rank among the surviving voters.
const STAGGER: Duration = Duration::from_millis(120);

/// Runs until the process ends.
pub async fn run(replica: Replica) {
    let mut refused = 0u32;
    let mut watched: Option<u64> = None;
    loop {
        tokio::time::sleep(PROBE_INTERVAL).await;
        let m = replica.raft.metrics().borrow().clone();
        let Some(leader) = m.current_leader.filter(|l| *l != replica.id) else {
            refused = 0;
            continue;
        };
        if m.state != ServerState::Follower || !m.membership_config.voter_ids().any(|v| v == replica.id) {
            refused = 0;
            continue;
        }
        if watched != Some(leader) {
            watched = Some(leader);
            refused = 0;
        }
        let Some(addr) =
            m.membership_config.nodes().find(|(id, _)| **id == leader).map(|(_, n)| n.addr.clone())
        else {
            continue;
        };
        let probe = tokio::time::timeout(PROBE_INTERVAL, tokio::net::TcpStream::connect(&addr)).await;
        match probe {
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => refused += 1,
            _ => refused = 0,
        }
        if refused < REFUSALS {
            continue;
        }
        refused = 0;
        // Voters other than the dead leader, lowest id first.
        let rank = m.membership_config.voter_ids().filter(|v| *v != leader && *v < replica.id).count() as u32;
        tokio::time::sleep(STAGGER * rank).await;
        let now = replica.raft.metrics().borrow().clone();
        if now.current_leader == Some(leader) && now.state == ServerState::Follower {
            tracing::info!(leader, "leader's port refuses connections; standing for election");
            if let Err(e) = replica.raft.trigger().elect().await {
                tracing::warn!(error = %e, "could not start an election");
            }
        }
    }
}

//! The voters' wall clocks, as the leader last heard them: every reply to a Raft RPC carries the
//! answering replica's wall clock (`WALL_HEADER`), and the network records it here with the time
//! it arrived on this replica's monotonic clock. `Replica::clock_ms` asks what a majority agrees
//! the time is (`kairos_scheduler::clock::agreed`) to catch the timeline up after an outage.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::types::ReplicaId;

/// Metadata key of a Raft reply carrying the answering replica's wall clock (ms since the epoch).
pub const WALL_HEADER: &str = "kairos-wall-ms";

/// How long a reading counts: a peer heard longer ago may be down, or its clock stepped since.
pub const READING_FRESH: Duration = Duration::from_secs(5);

/// The latest wall clock reading from each peer and when it arrived.
#[derive(Default)]
pub struct PeerClocks {
    readings: Mutex<BTreeMap<ReplicaId, (i64, Instant)>>,
}

impl PeerClocks {
    /// `peer` answered with its wall clock at `wall_ms`, now.
    pub fn record(&self, peer: ReplicaId, wall_ms: i64) {
        self.readings.lock().unwrap_or_else(|p| p.into_inner()).insert(peer, (wall_ms, Instant::now()));
    }

    /// The time a majority of `voters` agree has passed: `own_wall_ms` for `me`, and for each
    /// other voter heard within `READING_FRESH` its reading plus the time since it arrived (a
    /// reading is at most the reply's one-way delay old when it arrives, so this errs early).
    pub fn agreed(&self, me: ReplicaId, own_wall_ms: i64, voters: &BTreeSet<ReplicaId>) -> Option<i64> {
        let readings = self.readings.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let walls: Vec<i64> = voters
            .iter()
            .filter_map(|v| {
                if *v == me {
                    return Some(own_wall_ms);
                }
                let (wall, at) = readings.get(v)?;
                let age = now.saturating_duration_since(*at);
                (age <= READING_FRESH).then(|| wall.saturating_add(age.as_millis() as i64))
            })
            .collect();
        kairos_scheduler::clock::agreed(&walls, voters.len() / 2 + 1)
    }
}

/// This machine's wall clock, in ms since the epoch.
pub fn wall_now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_majority_counts_only_voters_heard_lately_and_ages_their_readings() {
        let clocks = PeerClocks::default();
        let voters: BTreeSet<ReplicaId> = [1, 2, 3].into();
        assert_eq!(clocks.agreed(1, 100_000, &voters), None, "only its own clock: no majority of three");
        clocks.record(2, 90_000);
        tokio::time::advance(Duration::from_millis(400)).await;
        assert_eq!(clocks.agreed(1, 100_000, &voters), Some(90_400), "the later two of {{100 000, 90 400}}");
        clocks.record(3, 99_000);
        assert_eq!(clocks.agreed(1, 100_000, &voters), Some(99_000));
        // A non-voter's reading does not count, and neither do stale ones.
        clocks.record(4, 500_000);
        assert_eq!(clocks.agreed(1, 100_000, &voters), Some(99_000));
        tokio::time::advance(READING_FRESH + Duration::from_millis(1)).await;
        assert_eq!(clocks.agreed(1, 100_000, &voters), None);
    }
}

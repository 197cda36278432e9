//! How stale may this replica's applied state be? Answers from local state that must not lag
//! the leader by more than a bound (is this token revoked?) ask `Replica::state_fresh`.
//!
//! - The leader's state is current while a quorum acknowledged it within the bound (a deposed
//!   leader stops counting as fresh once its followers stop answering).
//! - A follower records every `AppendEntries` it accepted from the leader, with the leader's
//!   commit index in it (`LeaderContact::record`, from the Raft service). Its state is fresh
//!   if, within the bound, it accepted one whose commit index it has applied: then it holds
//!   everything the leader had committed when that message was sent. A follower cut off from
//!   the leader, or lagging behind it, is not fresh.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The bound on staleness for a replica whose Raft heartbeat is `heartbeat`: four heartbeats,
/// at least two seconds.
pub fn staleness_bound(heartbeat: Duration) -> Duration {
    (heartbeat * 4).max(Duration::from_secs(2))
}

/// Appends this follower accepted from the leader: when, and the leader's commit index then.
#[derive(Debug, Default)]
pub struct LeaderContact {
    seen: Mutex<VecDeque<(Instant, u64)>>,
}

/// Most contacts remembered (older ones only matter while the newer are not applied yet).
const CONTACTS_MAX: usize = 256;

impl LeaderContact {
    /// An `AppendEntries` from the leader was accepted at `at`, carrying `leader_commit`.
    pub fn record(&self, at: Instant, leader_commit: u64) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if seen.len() == CONTACTS_MAX {
            seen.pop_front();
        }
        seen.push_back((at, leader_commit));
    }

    /// Whether an append was accepted since `now - bound`.
    pub fn heard_within(&self, now: Instant, bound: Duration) -> bool {
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.back().is_some_and(|(at, _)| now.saturating_duration_since(*at) <= bound)
    }

    /// Whether, since `now - bound`, an accepted append carried a commit index at most `applied`.
    pub fn fresh(&self, now: Instant, applied: u64, bound: Duration) -> bool {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        while seen.front().is_some_and(|(at, _)| now.saturating_duration_since(*at) > bound) {
            seen.pop_front();
        }
        seen.iter().any(|(_, commit)| *commit <= applied)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_follower_is_fresh_only_with_recent_contact_it_has_applied() {
        let c = LeaderContact::default();
        let t0 = Instant::now();
        let bound = Duration::from_secs(2);
        assert!(!c.fresh(t0, 100, bound), "no contact yet");
        c.record(t0, 50);
        assert!(c.fresh(t0 + Duration::from_millis(10), 50, bound));
        assert!(!c.fresh(t0 + Duration::from_millis(10), 49, bound), "the leader's commit not applied yet");
        c.record(t0 + Duration::from_secs(1), 60);
        // Behind the newest contact, but the older one (within the bound) is applied.
        assert!(c.fresh(t0 + Duration::from_secs(1), 55, bound));
        // Three seconds on: the first contact is too old, the second not applied.
        assert!(!c.fresh(t0 + Duration::from_secs(3), 55, bound));
        assert!(c.fresh(t0 + Duration::from_secs(3), 60, bound));
        assert!(!c.fresh(t0 + Duration::from_secs(10), 1000, bound), "cut off from the leader");
        // Heard from, whatever was applied; not once the bound has passed.
        let heard = LeaderContact::default();
        assert!(!heard.heard_within(t0, bound));
        heard.record(t0, 1_000);
        assert!(heard.heard_within(t0 + Duration::from_secs(2), bound));
        assert!(!heard.heard_within(t0 + Duration::from_secs(4), bound));
    }

    #[test]
    fn the_bound_is_four_heartbeats_and_at_least_two_seconds() {
        assert_eq!(staleness_bound(Duration::from_millis(50)), Duration::from_secs(2));
        assert_eq!(staleness_bound(Duration::from_secs(1)), Duration::from_secs(4));
    }
}

//! Fault kinds and the seeded fault schedule of one simulated run.

use crate::proxy::Rng;

/// Every kind of fault the simulation injects, by the name the runner reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum FaultKind {
    KillLeader,
    PauseLeader,
    Partition,
    AgentStall,
    AgentCrash,
    PowerLoss,
    DiskFull,
    TornWrite,
    ClockSkew,
    MembershipChange,
    SlowLinks,
    LostReplies,
    BitRot,
}

impl FaultKind {
    pub const ALL: [FaultKind; 13] = [
        FaultKind::KillLeader,
        FaultKind::PauseLeader,
        FaultKind::Partition,
        FaultKind::AgentStall,
        FaultKind::AgentCrash,
        FaultKind::PowerLoss,
        FaultKind::DiskFull,
        FaultKind::TornWrite,
        FaultKind::ClockSkew,
        FaultKind::MembershipChange,
        FaultKind::SlowLinks,
        FaultKind::LostReplies,
        FaultKind::BitRot,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::KillLeader => "kill_leader",
            FaultKind::PauseLeader => "pause_leader",
            FaultKind::Partition => "partition",
            FaultKind::AgentStall => "agent_stall",
            FaultKind::AgentCrash => "agent_crash",
            FaultKind::PowerLoss => "power_loss",
            FaultKind::DiskFull => "disk_full",
            FaultKind::TornWrite => "torn_write",
            FaultKind::ClockSkew => "clock_skew",
            FaultKind::MembershipChange => "membership_change",
            FaultKind::SlowLinks => "slow_links",
            FaultKind::LostReplies => "lost_replies",
            FaultKind::BitRot => "bit_rot",
        }
    }
}

/// One fault: what, when (ms after the start) and for how long.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    pub kind: FaultKind,
    pub at_ms: u64,
    pub hold_ms: u64,
    /// The fault's own random choices (which replica, which way, how much).
    pub pick: u64,
}

/// How long a fault of `kind` lasts: an agent stall outlasts the node timeout (so fencing and
/// NodeDown run), an agent crash usually does not.
fn hold_ms(kind: FaultKind, node_timeout_ms: u64, rng: &mut Rng) -> u64 {
    match kind {
        FaultKind::AgentStall => node_timeout_ms + 500 + rng.below(3_000),
        FaultKind::AgentCrash => 200 + rng.below(node_timeout_ms * 2),
        FaultKind::PowerLoss => 200 + rng.below(2_000),
        FaultKind::ClockSkew => 2_000 + rng.below(10_000),
        FaultKind::MembershipChange => 0,
        _ => 300 + rng.below(5_000),
    }
}

/// The faults of the schedule `seed` within `window_ms`: 5 to 14 of them at random times, each
/// of a random kind, overlapping as they fall.
pub fn schedule(seed: u64, window_ms: u64, node_timeout_ms: u64) -> Vec<Fault> {
    let mut rng = Rng::new(seed ^ 0x5eed_fa17);
    let count = 5 + rng.below(10);
    let mut faults: Vec<Fault> = (0..count)
        .map(|_| {
            let kind = FaultKind::ALL[rng.below(FaultKind::ALL.len() as u64) as usize];
            Fault {
                kind,
                at_ms: 1_000 + rng.below(window_ms.saturating_sub(1_000)),
                hold_ms: hold_ms(kind, node_timeout_ms, &mut rng),
                pick: rng.next_u64(),
            }
        })
        .collect();
    faults.sort_by_key(|f| f.at_ms);
    faults
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schedule_is_a_function_of_its_seed_and_draws_every_kind_over_many_seeds() {
        assert_eq!(schedule(7, 20_000, 3_000), schedule(7, 20_000, 3_000));
        assert_ne!(schedule(7, 20_000, 3_000), schedule(8, 20_000, 3_000));
        let mut seen = std::collections::BTreeSet::new();
        for seed in 0..100 {
            let s = schedule(seed, 20_000, 3_000);
            assert!((5..15).contains(&s.len()));
            assert!(s.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
            for f in s {
                assert!(f.at_ms >= 1_000 && f.at_ms < 20_000);
                if f.kind == FaultKind::AgentStall {
                    assert!(f.hold_ms > 3_000, "a stall outlasts the node timeout");
                }
                seen.insert(f.kind);
            }
        }
        assert_eq!(seen.len(), FaultKind::ALL.len());
    }
}

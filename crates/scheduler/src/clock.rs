//! The cluster's timeline: what time a leader stamps into the commands it proposes.
//!
//! Every command carries the proposing replica's time, and the state keeps the latest
//! (`ClusterState::now_ms`, never backwards). Taken straight from a replica's wall clock, one
//! replica minutes ahead would age every run at once — time limits fire early, checkpoints look
//! stale (the deterministic simulation's `clock_skew` found time limits enforced seconds into a
//! run) — and one behind would stop the cluster's time until its clock caught up.
//!
//! So a replica stamps `stamp(last, elapsed, wall)`: the last stamp it saw applied plus the time
//! elapsed since on its monotonic clock, following its wall clock only while the two agree
//! within `MAX_OFFSET_MS`. Beyond that the timeline moves towards the wall clock at most
//! `SLEW_PER_MILLE` of the elapsed time: a skewed replica changes durations by at most 1 %, and
//! the timeline converges on correct clocks.
//!
//! A whole-cluster outage also reads as every wall clock being ahead: no replica's monotonic
//! clock saw the time pass. Slewing at 1 % would take a month to catch up an 8-hour outage, and
//! every `--since`, time limit and fairshare decay would read the old time meanwhile. What tells
//! an outage from a skewed clock is agreement: the leader hears each voter's wall clock on the
//! replies to its appends (`kairos_consensus::peerclock`), and when a majority of the voters'
//! clocks — its own among them — all read later than the timeline by more than `MAX_OFFSET_MS`,
//! the timeline jumps to the earliest of that majority (`agreed`). One replica's clock, however
//! far off, is never a majority (of three or more), so it can only slew; a majority that agrees
//! is what the cluster has as the time. Forward only: the timeline never goes back.

/// How far a replica's wall clock may be from the timeline and still be followed.
pub const MAX_OFFSET_MS: i64 = 1_000;
/// Beyond `MAX_OFFSET_MS`, the most the timeline moves towards the wall clock, per mille of
/// the elapsed time.
pub const SLEW_PER_MILLE: i64 = 10;

/// A point on the timeline: the time, and how much the timeline has skipped in all to reach
/// it (`Command::skipped_ms`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stamp {
    pub now_ms: i64,
    pub skipped_ms: i64,
}

/// The time to stamp now: `last` is the latest stamp applied here, `elapsed_ms` the monotonic
/// time since it was applied (or loaded), `wall_ms` this replica's wall clock, `agreed_ms` the
/// time a majority of the voters' wall clocks agree has passed (`agreed`), when known. Never
/// before `last`. A jump to `agreed_ms` adds what it skipped to `skipped_ms`: the runs that
/// were running across it did not run that long as far as anyone saw, and a run placed while
/// the timeline lagged must not lose its lag from its time limit when the timeline catches up.
pub fn stamp(last: Stamp, elapsed_ms: i64, wall_ms: i64, agreed_ms: Option<i64>) -> Stamp {
    let elapsed = elapsed_ms.max(0);
    let mut base = last.now_ms.saturating_add(elapsed);
    let mut skipped_ms = last.skipped_ms;
    if let Some(agreed) = agreed_ms {
        let jump = agreed.saturating_sub(base);
        if jump > MAX_OFFSET_MS {
            base = agreed;
            skipped_ms = skipped_ms.saturating_add(jump);
        }
    }
    let offset = wall_ms.saturating_sub(base);
    let now_ms = if offset.abs() <= MAX_OFFSET_MS {
        wall_ms.max(last.now_ms)
    } else {
        let slew = elapsed * SLEW_PER_MILLE / 1000;
        base + offset.clamp(-slew, slew)
    };
    Stamp { now_ms, skipped_ms }
}

/// The latest time that at least `quorum` of `readings` (the voters' wall clocks, now) have
/// reached: the `quorum`-th latest reading. None with fewer readings than a quorum.
pub fn agreed(readings: &[i64], quorum: usize) -> Option<i64> {
    if quorum == 0 || readings.len() < quorum {
        return None;
    }
    let mut sorted = readings.to_vec();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    sorted.get(quorum - 1).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(now_ms: i64) -> Stamp {
        Stamp { now_ms, skipped_ms: 0 }
    }

    /// The time `stamp` gives, asserting it skipped nothing.
    fn unskipped(s: Stamp) -> i64 {
        assert_eq!(s.skipped_ms, 0, "{s:?}");
        s.now_ms
    }

    #[test]
    fn a_clock_minutes_off_moves_the_timeline_by_at_most_one_percent() {
        let t = 1_000_000;
        // Clocks that agree (within a second) are followed.
        assert_eq!(unskipped(stamp(at(t), 500, t + 700, None)), t + 700);
        assert_eq!(unskipped(stamp(at(t), 500, t - 300, None)), t, "never before the last stamp");
        // Ten minutes ahead: 5 s later it stamps 5.05 s later, not 10 minutes.
        assert_eq!(unskipped(stamp(at(t), 5_000, t + 600_000, None)), t + 5_050);
        // Ten minutes behind: time still moves, at 99 %.
        assert_eq!(unskipped(stamp(at(t), 5_000, t - 600_000, None)), t + 4_950);
        // Repeated stamps from a skewed leader run at most 1 % fast.
        let mut last = at(t);
        for _ in 0..100 {
            last = stamp(last, 100, last.now_ms + 600_000, None);
        }
        assert_eq!(unskipped(last), t + 100 * 101);
    }

    #[test]
    fn one_skewed_clock_of_three_only_slews_but_a_majority_after_an_outage_is_followed_at_once() {
        let t = 1_000_000;
        // The leader's clock 10 minutes ahead, the two followers right: the majority's time is
        // the timeline's, so the leader slews as before.
        let readings = [t + 5_000 + 600_000, t + 5_000, t + 5_010];
        let agreed_ms = agreed(&readings, 2);
        assert_eq!(agreed_ms, Some(t + 5_010));
        assert_eq!(unskipped(stamp(at(t), 5_000, t + 605_000, agreed_ms)), t + 5_050);
        // A follower 10 minutes ahead changes nothing either.
        let readings = [t + 5_000, t + 5_000 + 600_000, t + 5_000];
        assert_eq!(unskipped(stamp(at(t), 5_000, t + 5_000, agreed(&readings, 2))), t + 5_000);
        // A leader 10 minutes behind, followers right: time moves at the majority's pace.
        let readings = [t + 5_000 - 600_000, t + 5_000, t + 5_000];
        assert_eq!(unskipped(stamp(at(t), 5_000, t + 5_000 - 600_000, agreed(&readings, 2))), t + 4_950);

        // Every replica was down for a minute: the timeline is 60 s behind every clock, 2 s
        // after the restart. All three agree; one lagging clock of three does not stop it.
        // The jump is recorded as skipped time, on top of what was skipped before.
        let wall = t + 62_000;
        let jumped = Stamp { now_ms: wall, skipped_ms: 60_000 };
        assert_eq!(stamp(at(t), 2_000, wall, agreed(&[wall, wall + 30, wall - 40], 2)), jumped);
        assert_eq!(stamp(at(t), 2_000, wall, agreed(&[wall, wall - 600_000, wall + 20], 2)), jumped);
        let before = Stamp { now_ms: t, skipped_ms: 7 };
        assert_eq!(stamp(before, 2_000, wall, agreed(&[wall, wall], 2)).skipped_ms, 60_007);
        // The jump goes only as far as the majority agrees, and never backwards.
        let s = stamp(at(t), 2_000, wall + 900_000, agreed(&[wall + 900_000, wall, wall], 2));
        assert_eq!(s, Stamp { now_ms: wall + 20, skipped_ms: 60_000 });
        assert_eq!(unskipped(stamp(at(t), 0, t - 5_000, agreed(&[t - 5_000, t - 5_000], 2))), t);
        // Without a quorum of readings (followers not heard yet), the slew rule alone.
        assert_eq!(agreed(&[wall], 2), None);
        assert_eq!(unskipped(stamp(at(t), 2_000, wall, None)), t + 2_020);
        // A single-replica cluster has its own clock as the majority.
        assert_eq!(stamp(at(t), 2_000, wall, agreed(&[wall], 1)).now_ms, wall);
    }
}

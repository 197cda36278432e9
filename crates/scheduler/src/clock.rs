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
//! the timeline converges on correct clocks (after a whole-cluster outage, which also reads as
//! the wall clock being ahead, at the same 1 %).

/// How far a replica's wall clock may be from the timeline and still be followed.
pub const MAX_OFFSET_MS: i64 = 1_000;
/// Beyond `MAX_OFFSET_MS`, the most the timeline moves towards the wall clock, per mille of
/// the elapsed time.
pub const SLEW_PER_MILLE: i64 = 10;

/// The time to stamp now: `last_ms` is the latest stamp applied here, `elapsed_ms` the
/// monotonic time since it was applied (or loaded), `wall_ms` this replica's wall clock. Never
/// before `last_ms`.
pub fn stamp(last_ms: i64, elapsed_ms: i64, wall_ms: i64) -> i64 {
    let elapsed = elapsed_ms.max(0);
    let base = last_ms.saturating_add(elapsed);
    let offset = wall_ms.saturating_sub(base);
    if offset.abs() <= MAX_OFFSET_MS {
        return wall_ms.max(last_ms);
    }
    let slew = elapsed * SLEW_PER_MILLE / 1000;
    base + offset.clamp(-slew, slew)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clock_minutes_off_moves_the_timeline_by_at_most_one_percent() {
        let t = 1_000_000;
        // Clocks that agree (within a second) are followed.
        assert_eq!(stamp(t, 500, t + 700), t + 700);
        assert_eq!(stamp(t, 500, t - 300), t, "never before the last stamp");
        // Ten minutes ahead: 5 s later it stamps 5.05 s later, not 10 minutes.
        assert_eq!(stamp(t, 5_000, t + 600_000), t + 5_050);
        // Ten minutes behind: time still moves, at 99 %.
        assert_eq!(stamp(t, 5_000, t - 600_000), t + 4_950);
        // Repeated stamps from a skewed leader run at most 1 % fast.
        let mut last = t;
        for _ in 0..100 {
            last = stamp(last, 100, last + 600_000);
        }
        assert_eq!(last, t + 100 * 101);
    }
}

//! Idle GPUs (`Op::RunIdle`): a run's agent reports its GPUs idle below the threshold of the
//! job's idle GPU rule (its partition's, else its QoS's) for the rule's time, or busy again.
//! Apply decides what follows: an event and the job's mark always; then the rule's action —
//! requeue through the checkpoint path (`StopReason::Idle`, as the headroom's vacating does),
//! or cancel.

use super::ClusterState;
use crate::model::{JobId, StopReason};
use crate::policy::{IdleAction, IdleGpu};
use crate::state::Outcome;

/// The event kinds a job's history and `kairos show` carry.
pub const IDLE_EVENT: &str = "gpu idle";
pub const BUSY_EVENT: &str = "gpu busy";

impl ClusterState {
    /// Run (`job`, `attempt`) on `node` has had idle GPUs since `since_ms` (None: busy again).
    pub(super) fn run_idle(
        &mut self,
        job: JobId,
        attempt: u32,
        node: &str,
        since_ms: Option<i64>,
        now: i64,
    ) -> Outcome {
        let rule = self.jobs.get(&job).and_then(|j| self.policy.idle_gpu(&j.spec.qos, &j.spec.partition));
        let j = match self.current_run(job, attempt, node) {
            Ok(j) => j,
            Err(why) => return Outcome::Ignored(why),
        };
        let Some(since) = since_ms else {
            if j.gpu_idle_since.take().is_none() {
                return Outcome::Ignored(format!("job {job}'s GPUs were not idle"));
            }
            j.record(now, BUSY_EVENT, "GPUs busy again".into());
            return Outcome::RunUpdated { job, state: j.state };
        };
        let Some(rule) = rule else {
            return Outcome::Ignored(format!("no idle GPU rule applies to job {job}"));
        };
        if j.gpu_idle_since.is_some() {
            return Outcome::Ignored(format!("job {job}'s GPUs are already idle"));
        }
        let since = since.min(now);
        j.gpu_idle_since = Some(since);
        j.record(now, IDLE_EVENT, message(&rule, since));
        let state = j.state;
        match rule.action {
            IdleAction::Notify => Outcome::RunUpdated { job, state },
            IdleAction::Requeue => {
                if let Some(alloc) = j.allocation.as_mut().filter(|a| a.stop.is_none()) {
                    alloc.stop = Some(StopReason::Idle);
                }
                Outcome::RunUpdated { job, state }
            }
            IdleAction::Cancel => self.cancel_one(job, "the idle GPU policy", now),
        }
    }
}

/// "GPUs idle below 5 % since 2026-12-05 06:10:00 UTC; requeued through its checkpoint".
fn message(rule: &IdleGpu, since_ms: i64) -> String {
    let m = rule.below_milli;
    let pct = if m % 10 == 0 { format!("{}", m / 10) } else { format!("{}.{}", m / 10, m % 10) };
    let then = match rule.action {
        IdleAction::Notify => "",
        IdleAction::Requeue => "; requeued through its checkpoint",
        IdleAction::Cancel => "; cancelled",
    };
    format!("GPUs idle below {pct} % since {}{then}", utc(since_ms))
}

/// `ms` (Unix) as "YYYY-MM-DD HH:MM:SS UTC" (days to civil date: H. Hinnant's algorithm).
pub fn utc(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC", rem / 3600, rem % 3600 / 60, rem % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_milliseconds_read_as_utc() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(1_780_000_000_000), "2026-05-28 20:26:40 UTC");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00 UTC");
    }

    #[test]
    fn the_message_names_the_threshold_and_what_follows() {
        let rule = IdleGpu { after_s: 20, below_milli: 50, action: IdleAction::Requeue };
        assert_eq!(
            message(&rule, 0),
            "GPUs idle below 5 % since 1970-01-01 00:00:00 UTC; requeued through its checkpoint"
        );
        let rule = IdleGpu { below_milli: 25, action: IdleAction::Notify, ..rule };
        assert_eq!(message(&rule, 0), "GPUs idle below 2.5 % since 1970-01-01 00:00:00 UTC");
    }
}

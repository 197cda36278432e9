//! Per-user write rate limit at the API edge: a token bucket per user (refilled at `rate` per
//! second up to `burst`), shared by submits, holds, releases and cancels. A write beyond it is
//! refused with `RESOURCE_EXHAUSTED` before it costs a log entry. In memory, per replica: a leader change resets the buckets (generous to
//! users, never to the log). The bucket map is bounded: full (idle) buckets are dropped first.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use tonic::Status;

/// Most users tracked at once; beyond it, idle (full) buckets are forgotten.
const USERS_MAX: usize = 100_000;

pub struct SubmitLimiter {
    rate: f64,
    burst: f64,
    buckets: Mutex<HashMap<String, (f64, Instant)>>,
}

impl SubmitLimiter {
    /// `rate` submits per second and user, bursts up to `burst`; rate 0 = no limit.
    pub fn new(rate: u32, burst: u32) -> SubmitLimiter {
        SubmitLimiter { rate: f64::from(rate), burst: f64::from(burst.max(1)), buckets: Mutex::default() }
    }

    /// Takes one write (`what`: "submit", "cancel", …) for `user` at `now`, or says when to
    /// retry.
    pub fn take(&self, user: &str, now: Instant, what: &str) -> Result<(), Status> {
        if self.rate <= 0.0 {
            return Ok(());
        }
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if buckets.len() >= USERS_MAX && !buckets.contains_key(user) {
            let (rate, burst) = (self.rate, self.burst);
            buckets.retain(|_, (tokens, at)| {
                *tokens + now.saturating_duration_since(*at).as_secs_f64() * rate < burst
            });
        }
        // The user's bucket, looked up before any allocation (a known user costs none).
        let (tokens, at) = match buckets.get_mut(user) {
            Some(bucket) => bucket,
            None => buckets.entry(user.to_string()).or_insert((self.burst, now)),
        };
        *tokens = (*tokens + now.saturating_duration_since(*at).as_secs_f64() * self.rate).min(self.burst);
        *at = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            return Ok(());
        }
        let wait_ms = ((1.0 - *tokens) / self.rate * 1000.0).ceil() as u64;
        Err(Status::resource_exhausted(format!(
            "{what} rate limit: at most {} writes/s per user (submits, holds, releases, cancels; bursts of {}); retry in {wait_ms} ms",
            self.rate, self.burst
        )))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_burst_passes_then_the_rate_holds_per_user() {
        let l = SubmitLimiter::new(10, 3);
        let t0 = Instant::now();
        for _ in 0..3 {
            l.take("alice", t0, "submit").unwrap();
        }
        let e = l.take("alice", t0, "submit").unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
        assert!(e.message().contains("retry in 100 ms"), "{}", e.message());
        l.take("bob", t0, "submit").unwrap();
        // 100 ms later one more token is there, not two.
        let t1 = t0 + Duration::from_millis(100);
        l.take("alice", t1, "submit").unwrap();
        assert!(l.take("alice", t1, "submit").is_err());
        // No limit at rate 0.
        let open = SubmitLimiter::new(0, 0);
        for _ in 0..1000 {
            open.take("alice", t0, "submit").unwrap();
        }
    }
}

//! Which controller the agent talks to next: a leader's hint first, else the listed addresses
//! in turn; and how long it waits before trying again (jittered, so agents that lost the same
//! leader at the same instant do not come back in step; at least what a shedding leader asked).

use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

/// The controller addresses to try, preferred (leader hint) first.
#[derive(Clone, Debug)]
pub struct Controllers {
    addrs: Vec<String>,
    next: usize,
    hint: Option<String>,
    tls: Option<ClientTlsConfig>,
    /// The last connection made: a hint back to its controller (it shed the agent's
    /// registration) reuses it rather than dialling again.
    last: Option<(String, Channel)>,
}

/// How sessions reach a controller: the agent dials a connection of its own (`Controllers`);
/// the scale harness (`kairos-bench agents`) hands out connections its agents share.
pub trait Dial: Send {
    /// A channel to the next controller to try (the leader's hint first), or None.
    fn dial(&mut self) -> impl Future<Output = Option<(String, Channel)>> + Send;
    /// The next session tries `leader` first (once).
    fn follow(&mut self, leader: String);
}

impl Dial for Controllers {
    fn dial(&mut self) -> impl Future<Output = Option<(String, Channel)>> + Send {
        self.connect()
    }

    fn follow(&mut self, leader: String) {
        self.hint = Some(leader);
    }
}

impl Controllers {
    pub fn new(addrs: Vec<String>, tls: Option<ClientTlsConfig>) -> Controllers {
        Controllers { addrs, next: 0, hint: None, tls, last: None }
    }

    /// The addresses to try this time, in order: the hint (taken), then every listed address
    /// starting one further along than the last time.
    pub fn order(&mut self) -> Vec<String> {
        let n = self.addrs.len();
        let order =
            self.hint.take().into_iter().chain((0..n).map(|i| self.addrs[(self.next + i) % n].clone()));
        let order = order.collect();
        self.next = self.next.wrapping_add(1);
        order
    }

    /// A channel to the first controller of `order` that answers.
    pub async fn connect(&mut self) -> Option<(String, Channel)> {
        if let (Some(hint), Some((last, channel))) = (&self.hint, &self.last) {
            if hint == last {
                let again = (last.clone(), channel.clone());
                self.hint = None;
                return Some(again);
            }
        }
        let connected = self.dial_next().await;
        self.last.clone_from(&connected);
        connected
    }

    async fn dial_next(&mut self) -> Option<(String, Channel)> {
        for addr in self.order() {
            let Some(endpoint) = endpoint(&addr, self.tls.as_ref()) else { continue };
            if let Ok(Ok(channel)) = tokio::time::timeout(Duration::from_secs(3), endpoint.connect()).await {
                return Some((addr, channel));
            }
        }
        None
    }
}

/// The endpoint of `addr`. A paused or cut-off controller accepts TCP connections and then says
/// nothing: every step towards it is bounded (the HTTP/2 handshake too, and each call until its
/// answer starts), so the agent moves on to the others.
fn endpoint(addr: &str, tls: Option<&ClientTlsConfig>) -> Option<Endpoint> {
    let endpoint = Endpoint::from_shared(kairos_proto::wire::url(addr, tls.is_some())).ok()?;
    let endpoint = endpoint
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(5))
        .tcp_keepalive(Some(Duration::from_secs(10)));
    let Some(tls) = tls else { return Some(endpoint) };
    match endpoint.tls_config(tls.clone()) {
        Ok(e) => Some(e),
        Err(e) => {
            tracing::warn!(error = %e, "TLS settings refused");
            None
        }
    }
}

/// The leader a controller's refusal names (its `kairos-leader` header), if any.
pub fn leader_hint(status: &tonic::Status) -> Option<String> {
    status.metadata().get("kairos-leader").and_then(|v| v.to_str().ok()).map(str::to_string)
}

/// A random duration in [0, d) (spreads agents that would otherwise act in step).
pub fn random_below(d: Duration) -> Duration {
    Duration::from_micros(random_u64() % (d.as_micros() as u64).max(1))
}

/// 64 random bits from the standard library's per-map hashing keys (no crate, no syscall per
/// call): enough to spread agents, not for secrets.
fn random_u64() -> u64 {
    std::collections::hash_map::RandomState::new().build_hasher().finish()
}

/// How long a shedding leader asks its caller to wait (`kairos_proto::wire::RETRY_AFTER_HEADER`).
pub fn retry_after(status: &tonic::Status) -> Option<Duration> {
    let v = status.metadata().get(kairos_proto::wire::RETRY_AFTER_HEADER)?;
    let ms: u64 = v.to_str().ok()?.parse().ok()?;
    Some(Duration::from_millis(ms.min(Backoff::SHED_MAX.as_millis() as u64)))
}

/// The pause between sessions: a step of 100 ms, doubling to 2 s while controllers are
/// unreachable or unavailable, back to 100 ms once one answered anything else; each pause is
/// half its step plus a random part of the other half ("equal jitter"). A leader that sheds
/// (`Ended::Shed`) is given at least the pause it asked for, spread over up to twice that.
#[derive(Clone, Debug)]
pub struct Backoff {
    delay: Duration,
    /// xorshift64 state (never 0).
    rng: u64,
}

impl Default for Backoff {
    fn default() -> Backoff {
        Backoff::seeded(random_u64())
    }
}

/// How a session ended, as far as the next one is concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ended {
    /// No controller could be reached.
    Unreachable,
    /// The controller refused or broke off with `status`.
    Status(tonic::Code),
    /// The leader shed the call and asked for this pause first.
    Shed(Duration),
}

impl Ended {
    /// How a session that ended with `status` ended.
    pub fn of(status: &tonic::Status) -> Ended {
        match retry_after(status) {
            Some(after) => Ended::Shed(after),
            None => Ended::Status(status.code()),
        }
    }
}

impl Backoff {
    pub const FIRST: Duration = Duration::from_millis(100);
    pub const MAX: Duration = Duration::from_secs(2);
    /// The longest pause a shedding leader may ask for.
    pub const SHED_MAX: Duration = Duration::from_secs(10);

    /// A backoff whose jitter comes from `seed` (tests; `default` seeds it at random).
    pub fn seeded(seed: u64) -> Backoff {
        Backoff { delay: Backoff::FIRST, rng: seed | 1 }
    }

    /// How long to wait before the next session after one `ended` so.
    pub fn pause(&mut self, ended: &Ended) -> Duration {
        match ended {
            Ended::Shed(after) => return *after + self.jitter(*after),
            Ended::Status(code) if *code != tonic::Code::Unavailable => self.delay = Backoff::FIRST,
            _ => {}
        }
        let step = self.delay;
        self.delay = (self.delay * 2).min(Backoff::MAX);
        step / 2 + self.jitter(step / 2)
    }

    /// A random pause in [0, up_to].
    fn jitter(&mut self, up_to: Duration) -> Duration {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let span = up_to.as_micros() as u64 + 1;
        Duration::from_micros(self.rng % span)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addrs(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("c{i}:7001")).collect()
    }

    #[test]
    fn each_session_starts_one_controller_further_and_a_hint_goes_first_once() {
        let mut c = Controllers::new(addrs(3), None);
        assert_eq!(c.order(), ["c0:7001", "c1:7001", "c2:7001"]);
        assert_eq!(c.order(), ["c1:7001", "c2:7001", "c0:7001"]);
        c.follow("c2:7001".into());
        assert_eq!(c.order(), ["c2:7001", "c2:7001", "c0:7001", "c1:7001"]);
        assert_eq!(c.order(), ["c0:7001", "c1:7001", "c2:7001"], "the hint is used once");
        let mut none = Controllers::new(Vec::new(), None);
        assert!(none.order().is_empty());
        none.follow("c9:7001".into());
        assert_eq!(none.order(), ["c9:7001"]);
    }

    #[test]
    fn a_refusal_names_its_leader_in_its_header() {
        let mut status = tonic::Status::unavailable("not the leader");
        assert_eq!(leader_hint(&status), None);
        status.metadata_mut().insert("kairos-leader", "c1:7001".parse().unwrap());
        assert_eq!(leader_hint(&status).as_deref(), Some("c1:7001"));
    }

    /// Whether `pause` lies in [step / 2, step].
    fn within(pause: Duration, step_ms: u64) -> bool {
        let step = Duration::from_millis(step_ms);
        pause >= step / 2 && pause <= step
    }

    #[test]
    fn the_step_doubles_to_two_seconds_and_an_answer_other_than_unavailable_resets_it() {
        let mut b = Backoff::seeded(7);
        for step in [100, 200, 400, 800, 1600, 2000, 2000] {
            let p = b.pause(&Ended::Unreachable);
            assert!(within(p, step), "{p:?} for a step of {step} ms");
        }
        assert!(within(b.pause(&Ended::Status(tonic::Code::Unavailable)), 2000), "still unavailable");
        assert!(within(b.pause(&Ended::Status(tonic::Code::Unauthenticated)), 100));
        assert!(within(b.pause(&Ended::Unreachable), 200));
    }

    #[test]
    fn agents_that_lost_the_same_leader_at_once_come_back_spread_out() {
        // 1,000 agents, each with its own random seed, after the same failure: their pauses
        // cover the step's upper half rather than one instant.
        let pauses: Vec<Duration> =
            (0..1_000).map(|_| Backoff::default().pause(&Ended::Status(tonic::Code::Unavailable))).collect();
        let ms: std::collections::BTreeSet<u128> = pauses.iter().map(|p| p.as_millis()).collect();
        assert!(pauses.iter().all(|p| within(*p, 100)));
        assert!(ms.len() >= 40, "spread over {} distinct milliseconds of 51", ms.len());
    }

    #[test]
    fn a_shedding_leader_gets_at_least_the_pause_it_asked_for() {
        let mut status = tonic::Status::unavailable("shed");
        assert_eq!(Ended::of(&status), Ended::Status(tonic::Code::Unavailable));
        status.metadata_mut().insert(kairos_proto::wire::RETRY_AFTER_HEADER, "1500".parse().unwrap());
        assert_eq!(Ended::of(&status), Ended::Shed(Duration::from_millis(1500)));
        let mut b = Backoff::seeded(3);
        for _ in 0..100 {
            let p = b.pause(&Ended::of(&status));
            assert!(p >= Duration::from_millis(1500) && p <= Duration::from_millis(3000), "{p:?}");
        }
        status.metadata_mut().insert(kairos_proto::wire::RETRY_AFTER_HEADER, "999999".parse().unwrap());
        assert_eq!(Ended::of(&status), Ended::Shed(Backoff::SHED_MAX), "bounded");
        status.metadata_mut().insert(kairos_proto::wire::RETRY_AFTER_HEADER, "soon".parse().unwrap());
        assert_eq!(Ended::of(&status), Ended::Status(tonic::Code::Unavailable), "unreadable: ignored");
    }

    #[test]
    fn an_address_that_is_no_url_is_skipped() {
        assert!(endpoint("c0:7001", None).is_some());
        assert!(endpoint("not an address", None).is_none());
    }
}

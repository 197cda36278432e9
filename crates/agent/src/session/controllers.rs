//! Which controller the agent talks to next: a leader's hint first, else the listed addresses
//! in turn; and how long it waits before trying again.

use std::time::Duration;

use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

/// The controller addresses to try, preferred (leader hint) first.
#[derive(Clone, Debug)]
pub struct Controllers {
    addrs: Vec<String>,
    next: usize,
    hint: Option<String>,
}

impl Controllers {
    pub fn new(addrs: Vec<String>) -> Controllers {
        Controllers { addrs, next: 0, hint: None }
    }

    /// The next session tries `leader` first (once).
    pub fn follow(&mut self, leader: String) {
        self.hint = Some(leader);
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
    pub async fn connect(&mut self, tls: Option<&ClientTlsConfig>) -> Option<(String, Channel)> {
        for addr in self.order() {
            let Some(endpoint) = endpoint(&addr, tls) else { continue };
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

/// The pause between sessions: 100 ms, doubling to 2 s while controllers are unreachable or
/// unavailable; back to 100 ms once one answered anything else.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    delay: Duration,
}

impl Default for Backoff {
    fn default() -> Backoff {
        Backoff { delay: Backoff::FIRST }
    }
}

/// How a session ended, as far as the next one is concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ended {
    /// No controller could be reached.
    Unreachable,
    /// The controller refused or broke off with `status`.
    Status(tonic::Code),
}

impl Backoff {
    pub const FIRST: Duration = Duration::from_millis(100);
    pub const MAX: Duration = Duration::from_secs(2);

    /// How long to wait before the next session after one `ended` so.
    pub fn pause(&mut self, ended: &Ended) -> Duration {
        if matches!(ended, Ended::Status(code) if *code != tonic::Code::Unavailable) {
            self.delay = Backoff::FIRST;
        }
        let pause = self.delay;
        self.delay = (self.delay * 2).min(Backoff::MAX);
        pause
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
        let mut c = Controllers::new(addrs(3));
        assert_eq!(c.order(), ["c0:7001", "c1:7001", "c2:7001"]);
        assert_eq!(c.order(), ["c1:7001", "c2:7001", "c0:7001"]);
        c.follow("c2:7001".into());
        assert_eq!(c.order(), ["c2:7001", "c2:7001", "c0:7001", "c1:7001"]);
        assert_eq!(c.order(), ["c0:7001", "c1:7001", "c2:7001"], "the hint is used once");
        let mut none = Controllers::new(Vec::new());
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

    #[test]
    fn the_pause_doubles_to_two_seconds_and_an_answer_other_than_unavailable_resets_it() {
        let ms = Duration::from_millis;
        let mut b = Backoff::default();
        let pauses: Vec<Duration> = (0..7).map(|_| b.pause(&Ended::Unreachable)).collect();
        assert_eq!(pauses, [ms(100), ms(200), ms(400), ms(800), ms(1600), ms(2000), ms(2000)]);
        assert_eq!(b.pause(&Ended::Status(tonic::Code::Unavailable)), ms(2000), "still unavailable");
        assert_eq!(b.pause(&Ended::Status(tonic::Code::Unauthenticated)), ms(100));
        assert_eq!(b.pause(&Ended::Unreachable), ms(200));
    }

    #[test]
    fn an_address_that_is_no_url_is_skipped() {
        assert!(endpoint("c0:7001", None).is_some());
        assert!(endpoint("not an address", None).is_none());
    }
}

//! The agent's side of registration and heartbeats, one sequence whether the calls go over gRPC
//! (`session::grpc`) or are the deterministic simulation's modelled calls (`kairos-chaos`):
//! which credential a registration presents, when `sent` is read (before the call: the leader
//! sees it no earlier), what a refusal does to the credentials, and what lease an answer renews
//! (`fence::LeaseTerms::renewal`).

use std::future::Future;
use std::time::Duration;

use super::credentials::Credentials;
use crate::fence::{LeaseClock, LeaseTerms, Renewal};

/// What a controller's answer to a registration says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registration {
    pub node_id: String,
    /// The node credential to present from now on.
    pub credential: String,
    pub interval: Duration,
    pub terms: LeaseTerms,
}

/// A registration taken, and the lease it renewed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registered<T> {
    pub registration: Registration,
    pub renewal: Renewal<T>,
}

/// The controller as the session reaches it.
pub trait Controller {
    /// The clock the lease is counted on.
    type Time: LeaseClock;
    type Error: std::fmt::Display;

    fn now(&self) -> Self::Time;
    /// Registers presenting `credential` (the join token when `with_join`, else the node
    /// credential of an earlier registration; None: the agent has no join token).
    fn register(
        &mut self,
        with_join: bool,
        credential: Option<&str>,
    ) -> impl Future<Output = Result<Registration, Self::Error>>;
    /// Whether `error` refuses the credential presented (rather than failing the call).
    fn refuses_credential(error: &Self::Error) -> bool;
    fn heartbeat(&mut self) -> impl Future<Output = Result<(), Self::Error>>;
}

/// Registers: presents what `creds` chooses; a refusal of that credential makes the next
/// registration present the other; a registration taken keeps its credential and renews the
/// lease from when it was sent.
pub async fn register<C: Controller>(
    c: &mut C,
    creds: &Credentials,
) -> Result<Registered<C::Time>, C::Error> {
    let (with_join, credential) = creds.presented();
    let sent = c.now();
    match c.register(with_join, credential.as_deref()).await {
        Ok(registration) => {
            creds.taken(registration.credential.clone());
            let renewal = registration.terms.renewal(sent);
            Ok(Registered { registration, renewal })
        }
        Err(e) => {
            if C::refuses_credential(&e) {
                tracing::warn!(status = %e, with_join, "registration refused; trying the other credential next");
                creds.refused(with_join);
            }
            Err(e)
        }
    }
}

/// A heartbeat: an answer renews the lease from when it was sent.
pub async fn heartbeat<C: Controller>(c: &mut C, terms: LeaseTerms) -> Result<Renewal<C::Time>, C::Error> {
    let sent = c.now();
    c.heartbeat().await?;
    Ok(terms.renewal(sent))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// A controller on a clock of its own: each call takes 30 ms; it takes a registration only
    /// with the credential it holds (the join token before the first).
    struct Fake {
        clock: u64,
        holds: Option<String>,
        answers: bool,
        presented: Vec<Option<String>>,
    }

    #[derive(Debug)]
    enum Refusal {
        Credential,
        Unavailable,
    }

    impl std::fmt::Display for Refusal {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "{self:?}")
        }
    }

    const TERMS: LeaseTerms =
        LeaseTerms { lease: Duration::from_millis(5_000), grace: Duration::from_millis(1_000) };

    impl Controller for Fake {
        type Time = u64;
        type Error = Refusal;
        fn now(&self) -> u64 {
            self.clock
        }
        async fn register(
            &mut self,
            with_join: bool,
            credential: Option<&str>,
        ) -> Result<Registration, Refusal> {
            self.clock += 30;
            self.presented.push(credential.map(str::to_string));
            if !self.answers {
                return Err(Refusal::Unavailable);
            }
            let ok = match &self.holds {
                None => with_join && credential == Some("join"),
                Some(held) => !with_join && credential == Some(held.as_str()),
            };
            if !ok {
                return Err(Refusal::Credential);
            }
            let credential = self.holds.get_or_insert_with(|| "node-1".into()).clone();
            Ok(Registration {
                node_id: "n1".into(),
                credential,
                interval: Duration::from_secs(1),
                terms: TERMS,
            })
        }
        fn refuses_credential(error: &Refusal) -> bool {
            matches!(error, Refusal::Credential)
        }
        async fn heartbeat(&mut self) -> Result<(), Refusal> {
            self.clock += 30;
            if self.answers {
                Ok(())
            } else {
                Err(Refusal::Unavailable)
            }
        }
    }

    fn fake() -> Fake {
        Fake { clock: 1_000, holds: None, answers: true, presented: Vec::new() }
    }

    fn block_on<F: Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
    }

    #[test]
    fn a_registration_renews_the_lease_from_when_it_was_sent_and_keeps_the_credential() {
        let mut c = fake();
        let creds = Credentials::in_memory(Some(Arc::from("join")));
        let r = block_on(register(&mut c, &creds)).unwrap();
        assert_eq!(r.renewal, Renewal { valid_until: 6_000, hard_deadline: 7_000 }, "sent at 1000, not 1030");
        assert_eq!(creds.node().as_deref(), Some("node-1"));
        let r = block_on(heartbeat(&mut c, TERMS)).unwrap();
        assert_eq!(r.valid_until, 6_030);
        assert_eq!(c.presented, [Some("join".to_string())]);
    }

    #[test]
    fn a_refused_credential_makes_the_next_registration_present_the_other() {
        let mut c = fake();
        c.holds = Some("node-1".into());
        let creds = Credentials::in_memory(Some(Arc::from("join")));
        creds.taken("node-0".into()); // a stale credential
        assert!(block_on(register(&mut c, &creds)).is_err());
        assert!(block_on(register(&mut c, &creds)).is_err());
        assert_eq!(c.presented, [Some("node-0".to_string()), Some("join".to_string())]);
        assert!(block_on(register(&mut c, &creds)).is_err(), "the credential again, never thrown away");
        assert_eq!(c.presented[2].as_deref(), Some("node-0"));
    }

    #[test]
    fn an_unanswered_call_renews_nothing_and_leaves_the_credential_choice_alone() {
        let mut c = fake();
        c.answers = false;
        let creds = Credentials::in_memory(Some(Arc::from("join")));
        creds.taken("node-1".into());
        assert!(matches!(block_on(register(&mut c, &creds)), Err(Refusal::Unavailable)));
        assert!(!creds.registers_with_join(), "an unavailable controller refused no credential");
        assert!(block_on(heartbeat(&mut c, TERMS)).is_err());
    }
}

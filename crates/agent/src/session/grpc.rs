//! The session over gRPC: register, heartbeat and follow the assignment stream on one
//! connection; sessions one after another for the life of the agent; run reports delivered
//! until a controller takes them.

use std::time::Duration;

use kairos_proto::v1 as pb;
use kairos_proto::v1::agent_service_client::AgentServiceClient;
use tokio::sync::{mpsc, watch};
use tonic::transport::Channel;

use super::controllers::{leader_hint, Backoff, Dial, Ended};
use super::credentials::Credentials;
use super::step::{self, Controller, Registration};
use crate::fence::{self, Lease, LeaseTerms};
use crate::runner::Runner;

/// The client of the controller the agent is in session with (None: between sessions).
pub type Client = AgentServiceClient<Channel>;
/// Where the tasks that call the controller find the current client.
pub type ClientRx = watch::Receiver<Option<Client>>;

/// Codes with which a controller refuses a call for good (retrying cannot help; what still
/// matters is reported again).
pub const REFUSED: [tonic::Code; 3] =
    [tonic::Code::InvalidArgument, tonic::Code::NotFound, tonic::Code::PermissionDenied];

/// The runs a session carries out: the agent's `Runner`; the scale harness's fake runs
/// (`kairos-bench agents`), which drive the same session code against a real cluster.
pub trait Runs: Clone + Send + Sync + 'static {
    /// Runs with a live process, for heartbeats.
    fn running(&self) -> Vec<crate::decide::RunKey>;
    /// Makes the local runs match the controller's assignment set.
    fn reconcile(&self, set: &pb::AssignmentSet);
    /// Launches what may start now (the lease was renewed).
    fn launch_ready(&self);
    /// A controller took the node's registration (a session began).
    fn registered(&self) {}
    /// A heartbeat was answered `took` after it was sent.
    fn heartbeat_answered(&self, _took: Duration) {}
}

impl Runs for Runner {
    fn running(&self) -> Vec<crate::decide::RunKey> {
        Runner::running(self)
    }
    fn reconcile(&self, set: &pb::AssignmentSet) {
        Runner::reconcile(self, set)
    }
    fn launch_ready(&self) {
        Runner::launch_ready(self)
    }
}

/// What a session needs besides its connection.
#[derive(Clone)]
pub struct Session<R = Runner> {
    pub node: pb::NodeInfo,
    pub runner: R,
    pub lease: Lease,
    pub creds: Credentials,
}

/// One controller over gRPC, as `step` calls it.
struct Grpc<'a, R> {
    client: Client,
    session: &'a Session<R>,
    /// Registered: the node id and the heartbeat interval.
    registered: Option<(String, Duration)>,
    /// The session's heartbeat stream (`Heartbeats`), once opened.
    beats: Option<Beats>,
    /// The controller has no heartbeat stream (an older one): unary heartbeats.
    unary: bool,
}

/// A heartbeat stream: requests in, one answer each, in order.
struct Beats {
    tx: mpsc::Sender<pb::HeartbeatRequest>,
    answers: tonic::Streaming<pb::HeartbeatResponse>,
}

/// A registration's answer as the session reads it.
fn registration_of(reg: pb::RegisterResponse) -> Result<Registration, tonic::Status> {
    if reg.node_credential.is_empty() {
        return Err(tonic::Status::internal("the controller sent no node credential"));
    }
    let interval = Duration::from_millis(reg.heartbeat_interval_ms.clamp(100, 60_000));
    Ok(Registration {
        node_id: reg.node_id,
        credential: reg.node_credential,
        interval,
        terms: LeaseTerms::of_ms(reg.lease_ms, reg.fence_grace_ms, interval),
    })
}

impl<R: Runs> Controller for Grpc<'_, R> {
    type Time = u64;
    type Error = tonic::Status;

    fn now(&self) -> u64 {
        fence::mono_ms()
    }

    async fn register(
        &mut self,
        _with_join: bool,
        credential: Option<&str>,
    ) -> Result<Registration, tonic::Status> {
        let msg = pb::RegisterRequest { node: Some(self.session.node.clone()) };
        let reg = self.client.register(Credentials::register_request(credential, msg)).await?;
        let reg = registration_of(reg.into_inner())?;
        self.registered = Some((reg.node_id.clone(), reg.interval));
        Ok(reg)
    }

    fn refuses_credential(status: &tonic::Status) -> bool {
        use tonic::Code;
        matches!(status.code(), Code::Unauthenticated | Code::NotFound | Code::FailedPrecondition)
    }

    /// A controller that stops answering (paused, partitioned) must not hold this node: it is
    /// given up on after two intervals, and the leader found elsewhere.
    async fn heartbeat(&mut self) -> Result<(), tonic::Status> {
        let Some((node_id, interval)) = self.registered.clone() else {
            return Err(tonic::Status::failed_precondition("heartbeat before registration"));
        };
        let running = self.session.runner.running();
        let running = running.into_iter().map(|(job_id, attempt)| pb::RunRef { job_id, attempt }).collect();
        let beat = pb::HeartbeatRequest { node_id, running };
        match tokio::time::timeout(interval * 2, self.beat(beat)).await {
            Ok(answer) => answer,
            Err(_) => Err(tonic::Status::unavailable("heartbeat: the controller did not answer")),
        }
    }
}

impl<R: Runs> Grpc<'_, R> {
    /// One heartbeat on the session's stream (opened on the first), or unary where the
    /// controller has no stream.
    async fn beat(&mut self, beat: pb::HeartbeatRequest) -> Result<(), tonic::Status> {
        if self.beats.is_none() && !self.unary {
            let (tx, rx) = mpsc::channel(1);
            let request = self.session.creds.request(tokio_stream::wrappers::ReceiverStream::new(rx));
            match self.client.heartbeats(request).await {
                Ok(answers) => self.beats = Some(Beats { tx, answers: answers.into_inner() }),
                Err(status) if status.code() == tonic::Code::Unimplemented => self.unary = true,
                Err(status) => return Err(status),
            }
        }
        let Some(beats) = self.beats.as_mut() else {
            let req = self.session.creds.request(beat);
            return self.client.heartbeat(req).await.map(|_| ());
        };
        if beats.tx.send(beat).await.is_err() {
            return Err(tonic::Status::unavailable("heartbeat stream closed"));
        }
        match beats.answers.message().await {
            Ok(Some(_)) => Ok(()),
            Ok(None) => Err(tonic::Status::unavailable("heartbeat stream ended")),
            Err(status) => Err(status),
        }
    }
}

/// One connection to a controller: register, heartbeat, follow assignments until it breaks.
pub async fn session<R: Runs>(
    channel: Channel,
    s: &Session<R>,
    client_tx: &watch::Sender<Option<Client>>,
) -> tonic::Status {
    let mut grpc = Grpc {
        client: AgentServiceClient::new(channel),
        session: s,
        registered: None,
        beats: None,
        unary: false,
    };
    let registered = match step::register(&mut grpc, &s.creds).await {
        Ok(r) => r,
        Err(status) => return status,
    };
    let Registration { node_id, interval, terms, .. } = registered.registration;
    tracing::info!(node = %node_id, "registered");
    s.lease.renew(registered.renewal);
    s.runner.registered();
    client_tx.send_replace(Some(grpc.client.clone()));
    let request = s.creds.request(pb::AssignmentsRequest { node_id });
    let mut stream = match grpc.client.assignments(request).await {
        Ok(stream) => stream.into_inner(),
        Err(status) => return status,
    };
    // The first heartbeat at a random point of the interval's first half: agents that
    // registered together (after a leader change) do not heartbeat together ever after, and the
    // registration's lease still has a renewal to spare.
    let first = tokio::time::Instant::now() + super::controllers::random_below(interval / 2);
    let mut heartbeat = tokio::time::interval_at(first, interval);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            msg = stream.message() => match msg {
                Ok(Some(set)) => s.runner.reconcile(&set),
                Ok(None) => return tonic::Status::unavailable("assignment stream ended"),
                Err(status) => return status,
            },
            _ = heartbeat.tick() => {
                let sent = std::time::Instant::now();
                match step::heartbeat(&mut grpc, terms).await {
                    Ok(renewal) => {
                        s.runner.heartbeat_answered(sent.elapsed());
                        s.lease.renew(renewal);
                        // Launches deferred while the lease had lapsed may go now.
                        s.runner.launch_ready();
                    }
                    Err(status) => return status,
                }
            }
        }
    }
}

/// Sessions with the controllers, one after another, for the life of the agent: a leader's
/// hint is followed at once; otherwise the next controller after a growing, jittered pause, or
/// the pause a shedding leader asked for (`Backoff`).
pub async fn follow_controllers<R: Runs>(
    mut controllers: impl Dial,
    s: Session<R>,
    client_tx: watch::Sender<Option<Client>>,
) {
    let mut backoff = Backoff::default();
    loop {
        let ended = match controllers.dial().await {
            Some((addr, channel)) => {
                let status = session(channel, &s, &client_tx).await;
                client_tx.send_replace(None);
                tracing::warn!(controller = %addr, status = %status.message(), "controller session ended");
                if let Some(hint) = leader_hint(&status) {
                    controllers.follow(hint);
                    continue;
                }
                let ended = Ended::of(&status);
                if matches!(ended, Ended::Shed(_)) {
                    // The leader itself asked for the pause: back to it after.
                    controllers.follow(addr);
                }
                ended
            }
            None => {
                tracing::debug!("no controller reachable");
                Ended::Unreachable
            }
        };
        tokio::time::sleep(backoff.pause(&ended)).await;
    }
}

/// Makes one call to the controller the agent is connected to, retrying with capped backoff
/// until one takes it, or refuses it for good with one of `refused` (logged, dropped).
pub async fn until_taken<F, Fut>(what: &str, refused: &[tonic::Code], client_rx: &mut ClientRx, mut call: F)
where
    F: FnMut(Client) -> Fut,
    Fut: std::future::Future<Output = Result<(), tonic::Status>>,
{
    let mut delay = Duration::from_millis(100);
    loop {
        let client = client_rx.borrow_and_update().clone();
        let result = match client {
            Some(c) => call(c).await,
            None => Err(tonic::Status::unavailable("not connected")),
        };
        match result {
            Ok(()) => return,
            Err(s) if refused.contains(&s.code()) => {
                tracing::error!(status = %s, "controller refused a {what}");
                return;
            }
            Err(s) => {
                tracing::debug!(status = %s, "{what} not delivered; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(2));
            }
        }
    }
}

/// Delivers run reports, each until a controller takes it.
pub async fn deliver_reports(
    creds: Credentials,
    mut rx: mpsc::Receiver<pb::StatusReport>,
    mut client_rx: ClientRx,
) {
    while let Some(report) = rx.recv().await {
        until_taken("run report", &REFUSED, &mut client_rx, |mut c| {
            let req = creds.request(report.clone());
            async move { c.report_status(req).await.map(|_| ()) }
        })
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(lease_ms: u64, interval_ms: u64) -> pb::RegisterResponse {
        pb::RegisterResponse {
            node_id: "n1".into(),
            node_credential: "node.0123".into(),
            heartbeat_interval_ms: interval_ms,
            lease_ms,
            fence_grace_ms: 400,
        }
    }

    #[test]
    fn a_registration_answer_gives_the_interval_bounded_and_the_lease_terms() {
        let r = registration_of(answer(3_000, 1_000)).unwrap();
        assert_eq!(r.interval, Duration::from_secs(1));
        assert_eq!(r.terms, LeaseTerms { lease: Duration::from_secs(3), grace: Duration::from_millis(400) });
        let r = registration_of(answer(0, 5)).unwrap();
        assert_eq!(r.interval, Duration::from_millis(100), "no faster than 100 ms");
        assert_eq!(r.terms.lease, Duration::from_secs(1), "no lease granted: ten intervals");
        assert_eq!(registration_of(answer(0, 600_000)).unwrap().interval, Duration::from_secs(60));
        let blank = pb::RegisterResponse { node_credential: String::new(), ..answer(3_000, 1_000) };
        assert_eq!(registration_of(blank).unwrap_err().code(), tonic::Code::Internal);
    }

    #[test]
    fn refusals_of_the_credential_are_told_from_failures() {
        for code in [tonic::Code::Unauthenticated, tonic::Code::NotFound, tonic::Code::FailedPrecondition] {
            assert!(Grpc::<Runner>::refuses_credential(&tonic::Status::new(code, "")), "{code:?}");
        }
        for code in [tonic::Code::Unavailable, tonic::Code::Internal, tonic::Code::DeadlineExceeded] {
            assert!(!Grpc::<Runner>::refuses_credential(&tonic::Status::new(code, "")), "{code:?}");
        }
    }

    #[tokio::test]
    async fn a_report_is_retried_until_taken_and_dropped_when_refused_for_good() {
        let (_tx, mut rx) = watch::channel(None::<Client>);
        // Not connected: retried (here, cut short by the test's timeout).
        let calls = std::sync::atomic::AtomicU32::new(0);
        let waited = tokio::time::timeout(
            Duration::from_millis(50),
            until_taken("x", &REFUSED, &mut rx, |_| {
                calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                async { Ok(()) }
            }),
        )
        .await;
        assert!(waited.is_err(), "no client: nothing was delivered, and it kept trying");
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 0);
    }
}

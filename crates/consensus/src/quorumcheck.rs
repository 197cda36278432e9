//! Check quorum: a leader that no quorum of the voters has answered for `DEAF_AFTER_LEASES`
//! leases goes silent for as long, so the others can elect a leader that hears them.
//!
//! Raft deposes a leader only when it hears of a newer term. A leader that can still send but
//! hears no replies (a one-way partition: seen by the deterministic simulation, where a team's
//! reclaim waited out the whole 3 s partition) keeps resetting the followers' election timers
//! with its appends and heartbeats, yet commits nothing: the cluster stalls for as long as the
//! partition lasts. openraft 0.9 has no check-quorum step-down, so kairos does it at the
//! network: `run` sees `millis_since_quorum_ack` pass the limit and marks the term silent;
//! `Gated` then lets no append or snapshot of that term out (each call waits out its deadline,
//! as a lost message does, so openraft does not back off and speaks again on time). The
//! followers' timers run out and they elect among themselves; the silent replica follows once
//! it hears the newer term. Sending nothing is always safe in Raft (a lost message); what it
//! costs is one election when a leader's replies are merely late for that long, and one when a
//! voter that was down returns during a silence (it campaigns at a newer term).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{InstallSnapshotError, RPCError, RaftError, Timeout};
use openraft::network::{RPCOption, RPCTypes, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{BasicNode, ServerState, Vote};

use tokio::time::Instant;

use crate::types::{KairosRaft, NodeId, TypeConfig};

/// Leases (election timeouts) without a quorum's answer after which a leader goes silent, and
/// how long it then stays silent before it speaks again. Eight leases (1.2 s at the default
/// `--election-timeout-ms` 150) is well past a slow link's round trip, so a leader that is only
/// slow keeps leading; the silence is as long, and a follower calls an election once openraft's
/// leader lease and its own election timeout have passed since it last heard the leader (3–4
/// leases).
pub const DEAF_AFTER_LEASES: u32 = 8;
/// How often the leader looks at its last quorum acknowledgement.
const PROBE: Duration = Duration::from_millis(50);

/// The term this replica leads silently (0: none).
#[derive(Debug, Default)]
pub struct Silence(AtomicU64);

impl Silence {
    /// Whether messages sent with `vote` are held back.
    pub fn holds(&self, vote: &Vote<NodeId>) -> bool {
        let term = vote.leader_id().term;
        term != 0 && self.0.load(Ordering::SeqCst) == term
    }
}

/// Whether a leader that has spoken for `speaking_for` (led, or spoke again after a silence)
/// and last heard a quorum `since_ack` ago (`None`: not yet in this term) is deaf: it heard no
/// quorum within `after`.
pub fn deaf(speaking_for: Duration, since_ack: Option<Duration>, after: Duration) -> bool {
    speaking_for >= after && since_ack.is_none_or(|ack| ack >= after)
}

/// The leader's judgement over time: when it goes silent and when it speaks again.
///
/// The silence is bounded: a leader the others cannot replace (they lack a quorum without it,
/// or their votes do not reach it) would otherwise hold the cluster forever. When it speaks
/// again, a follower that campaigned meanwhile answers with its newer term, and the leader
/// steps down in the ordinary way; a leader that is heard again simply goes on.
#[derive(Debug)]
pub struct Judge {
    after: Duration,
    /// The term led and since when it has spoken.
    speaking: Option<(u64, Instant)>,
    /// The term held silent and since when.
    silent: Option<(u64, Instant)>,
}

impl Judge {
    pub fn new(after: Duration) -> Judge {
        Judge { after, speaking: None, silent: None }
    }

    /// A look at `now`: the term this replica leads (`None`: it does not, or it is the only
    /// voter) and how long ago a quorum last answered it. Returns the term to hold silent (0:
    /// none).
    pub fn look(&mut self, now: Instant, leads: Option<u64>, since_ack: Option<Duration>) -> u64 {
        let Some(term) = leads else {
            self.speaking = None;
            self.silent = None;
            return 0;
        };
        if let Some((t, at)) = self.silent {
            if t == term && now.duration_since(at) < self.after {
                return term;
            }
            // Speaks again (or leads a newer term): judged afresh from now.
            self.silent = None;
            self.speaking = Some((term, now));
        }
        let since = match self.speaking {
            Some((t, at)) if t == term => at,
            _ => self.speaking.insert((term, now)).1,
        };
        if deaf(now.duration_since(since), since_ack, self.after) {
            self.silent = Some((term, now));
            return term;
        }
        0
    }
}

/// Watches the replica of `raft`; holds its term silent while its `Judge` says so. Ends when
/// the Raft shuts down.
pub async fn run(raft: KairosRaft, silence: Arc<Silence>, after: Duration) {
    let mut judge = Judge::new(after);
    loop {
        tokio::time::sleep(PROBE).await;
        let metrics = raft.metrics();
        if metrics.has_changed().is_err() {
            return;
        }
        let (state, term, leads, since_ack) = {
            let m = metrics.borrow();
            // In a cluster of more than one voter.
            let leads = crate::types::leads(&m) && m.membership_config.voter_ids().nth(1).is_some();
            (m.state, m.current_term, leads, m.millis_since_quorum_ack)
        };
        if state == ServerState::Shutdown {
            return;
        }
        let leads = leads.then_some(term);
        let held = judge.look(Instant::now(), leads, since_ack.map(Duration::from_millis));
        let was = silence.0.swap(held, Ordering::SeqCst);
        if was == 0 && held != 0 {
            tracing::warn!(
                term,
                after_ms = after.as_millis() as u64,
                "no quorum answered this leader; it stops sending for a while so the others can elect one they reach"
            );
        } else if was != 0 && held == 0 && leads.is_some() {
            tracing::info!(term, "this leader speaks again after its silence");
        }
    }
}

/// A network factory whose connections hold back the silent term's appends and snapshots.
pub struct Gated<N> {
    inner: N,
    silence: Arc<Silence>,
    /// This replica, and the peer a connection calls (for the timeout a held call reports).
    from: NodeId,
    target: NodeId,
}

impl<N> Gated<N> {
    pub fn new(inner: N, silence: Arc<Silence>, from: NodeId) -> Gated<N> {
        Gated { inner, silence, from, target: from }
    }

    /// A held call: nothing is sent, and the caller hears nothing until the deadline, as when
    /// the message is lost. (An `Unreachable` would put openraft's stream to this peer into its
    /// back-off, and the leader would speak again late.)
    async fn held<E: std::error::Error>(
        &self,
        action: RPCTypes,
        option: &RPCOption,
    ) -> RPCError<NodeId, BasicNode, RaftError<NodeId, E>> {
        tokio::time::sleep(option.hard_ttl()).await;
        RPCError::Timeout(Timeout { action, id: self.from, target: self.target, timeout: option.hard_ttl() })
    }
}

impl<N: RaftNetworkFactory<TypeConfig>> RaftNetworkFactory<TypeConfig> for Gated<N> {
    type Network = Gated<N::Network>;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Self::Network {
        Gated {
            inner: self.inner.new_client(target, node).await,
            silence: self.silence.clone(),
            from: self.from,
            target,
        }
    }
}

type RpcResult<T, E> = Result<T, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>;

impl<C: RaftNetwork<TypeConfig>> RaftNetwork<TypeConfig> for Gated<C> {
    fn backoff(&self) -> openraft::network::Backoff {
        self.inner.backoff()
    }

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>, openraft::error::Infallible> {
        if self.silence.holds(&rpc.vote) {
            return Err(self.held(RPCTypes::AppendEntries, &option).await);
        }
        self.inner.append_entries(rpc, option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<NodeId>, InstallSnapshotError> {
        if self.silence.holds(&rpc.vote) {
            return Err(self.held(RPCTypes::InstallSnapshot, &option).await);
        }
        self.inner.install_snapshot(rpc, option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<NodeId>, openraft::error::Infallible> {
        self.inner.vote(rpc, option).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AFTER: Duration = Duration::from_millis(600);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_leader_is_deaf_only_when_no_quorum_answered_within_the_limit_since_it_began_leading() {
        // Answered recently: not deaf, however long it has led.
        assert!(!deaf(ms(10_000), Some(ms(40)), AFTER));
        assert!(!deaf(ms(10_000), Some(ms(599)), AFTER));
        // No answer for the limit: deaf.
        assert!(deaf(ms(10_000), Some(ms(600)), AFTER));
        // A new leader not yet answered is given the limit from when it began leading.
        assert!(!deaf(ms(300), None, AFTER));
        assert!(deaf(ms(600), None, AFTER));
        // An acknowledgement older than the leadership cannot be (it is of this term), but a
        // short leadership is never judged before the limit either way.
        assert!(!deaf(ms(100), Some(ms(5_000)), AFTER));
    }

    #[test]
    fn a_deaf_leader_is_silent_for_a_while_then_speaks_and_is_judged_afresh() {
        let t0 = Instant::now();
        let at = |n: u64| t0 + ms(n);
        let mut judge = Judge::new(AFTER);
        // Leads term 4 and is answered: speaks.
        assert_eq!(judge.look(at(0), Some(4), None), 0);
        assert_eq!(judge.look(at(500), Some(4), Some(ms(20))), 0);
        // No answer since 100 ms: still within the limit at 650, deaf at 700.
        assert_eq!(judge.look(at(650), Some(4), Some(ms(550))), 0);
        assert_eq!(judge.look(at(700), Some(4), Some(ms(600))), 4);
        // Silent for the limit, whatever it hears meanwhile.
        assert_eq!(judge.look(at(1_000), Some(4), Some(ms(900))), 4);
        assert_eq!(judge.look(at(1_299), Some(4), Some(ms(1_199))), 4);
        // Then it speaks again, and is given the limit afresh before a second silence.
        assert_eq!(judge.look(at(1_300), Some(4), Some(ms(1_200))), 0);
        assert_eq!(judge.look(at(1_850), Some(4), Some(ms(1_750))), 0);
        assert_eq!(judge.look(at(1_900), Some(4), Some(ms(1_800))), 4);
        // Deposed: nothing is held, and a later term starts a new judgement.
        assert_eq!(judge.look(at(2_000), None, None), 0);
        assert_eq!(judge.look(at(2_100), Some(6), None), 0);
        assert_eq!(judge.look(at(2_650), Some(6), None), 0);
        assert_eq!(judge.look(at(2_700), Some(6), None), 6, "a leader never answered in its term");
        // A single voter or a follower is never held.
        let mut alone = Judge::new(AFTER);
        assert_eq!(alone.look(at(0), None, None), 0);
        assert_eq!(alone.look(at(10_000), None, None), 0);
    }

    #[test]
    fn only_the_silent_terms_messages_are_held_back() {
        let silence = Silence::default();
        let vote = |term| Vote::new_committed(term, 1);
        assert!(!silence.holds(&vote(3)), "nothing is held before a term is silenced");
        silence.0.store(3, Ordering::SeqCst);
        assert!(silence.holds(&vote(3)));
        assert!(!silence.holds(&vote(4)), "a later term (the replica led again) sends");
        assert!(!silence.holds(&vote(2)));
    }

    /// A connection that counts what reaches it.
    #[derive(Default)]
    struct Counting {
        appends: u32,
        votes: u32,
    }

    impl RaftNetwork<TypeConfig> for Counting {
        async fn append_entries(
            &mut self,
            _rpc: AppendEntriesRequest<TypeConfig>,
            _option: RPCOption,
        ) -> RpcResult<AppendEntriesResponse<NodeId>, openraft::error::Infallible> {
            self.appends += 1;
            Ok(AppendEntriesResponse::Success)
        }

        async fn install_snapshot(
            &mut self,
            _rpc: InstallSnapshotRequest<TypeConfig>,
            _option: RPCOption,
        ) -> RpcResult<InstallSnapshotResponse<NodeId>, InstallSnapshotError> {
            unreachable!("no snapshot is sent in these tests")
        }

        async fn vote(
            &mut self,
            rpc: VoteRequest<NodeId>,
            _option: RPCOption,
        ) -> RpcResult<VoteResponse<NodeId>, openraft::error::Infallible> {
            self.votes += 1;
            Ok(VoteResponse::new(rpc.vote, None, true))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_silenced_term_sends_no_append_while_votes_and_other_terms_go_through() {
        let silence = Arc::new(Silence::default());
        let mut conn = Gated { inner: Counting::default(), silence: silence.clone(), from: 1, target: 2 };
        let option = RPCOption::new(ms(100));
        let append = |term| AppendEntriesRequest::<TypeConfig> {
            vote: Vote::new_committed(term, 1),
            prev_log_id: None,
            entries: vec![],
            leader_commit: None,
        };
        assert!(conn.append_entries(append(5), option.clone()).await.is_ok());
        silence.0.store(5, Ordering::SeqCst);
        let started = tokio::time::Instant::now();
        let refused = conn.append_entries(append(5), option.clone()).await;
        assert!(matches!(refused, Err(RPCError::Timeout(_))), "{refused:?}");
        assert!(started.elapsed() >= ms(100), "a held call waits out its deadline, as a lost one");
        assert!(conn.append_entries(append(6), option.clone()).await.is_ok());
        assert!(conn.vote(VoteRequest::new(Vote::new(6, 1), None), option).await.is_ok());
        assert_eq!((conn.inner.appends, conn.inner.votes), (2, 1), "the held append never reached the peer");
    }
}

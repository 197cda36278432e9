//! Interactive sessions, the controller's half (`JobService.Session`, see session.proto): the
//! caller's first message names a job and what to open (a command inside it, its terminal, a
//! tunnel to a port); the controller checks that the caller owns the job (or is an admin, and
//! then says so in its audit log), that the job runs now, issues a short-lived grant for that
//! run, user, kind and port (`kairos_proto::grant`, sealed with the node's credential) and
//! carries the stream to the job's node, whose agent verifies the grant before it starts
//! anything. Any replica serves a session (as logs); a broken stream is resumed by the client
//! at another with `SessionOpen.resume`. The stream lasts while the caller's token holds.

use kairos_proto::v1 as pb;
use kairos_scheduler::model::{Job, Profile};
use kairos_scheduler::tokens::Role;
use kairos_scheduler::JobState;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;
use tonic::{Status, Streaming};

use crate::auth::Principal;
use crate::jobs::JobApi;

/// How long a client has to send its `SessionOpen`.
const OPEN_WAIT: std::time::Duration = std::time::Duration::from_secs(10);
/// How often an open session checks its caller's token again.
const RECHECK: std::time::Duration = std::time::Duration::from_secs(2);
/// Rechecks in a row this replica may answer "only the leader can tell" (a follower cut off,
/// an expired token only the leader could judge) before the session ends here; the client
/// resumes it at a replica that can judge its token.
const UNSETTLED_MAX: u32 = 15;
/// Bounds checked before anything is opened.
const ARGV_MAX: usize = 256;
const ARGV_BYTES_MAX: usize = 64 * 1024;
pub const STDIN_CHUNK_MAX: usize = 64 * 1024;
const TERM_LEN_MAX: usize = 64;
const RESUME_LEN_MAX: usize = 128;

/// The first message of a stream, or why there is none.
async fn first_open(inbound: &mut Streaming<pb::SessionInput>) -> Result<pb::SessionOpen, Status> {
    let first = tokio::time::timeout(OPEN_WAIT, inbound.next())
        .await
        .map_err(|_| Status::deadline_exceeded("session: no SessionOpen within 10 s"))?;
    match first {
        Some(Ok(pb::SessionInput { input: Some(pb::session_input::Input::Open(open)) })) => Ok(open),
        Some(Ok(_)) => Err(Status::invalid_argument("session: the first message must be `open`")),
        Some(Err(e)) => Err(e),
        None => Err(Status::cancelled("session: the client closed the stream before opening")),
    }
}

/// What `open` asks, checked before anything is looked up or opened.
pub fn check_open(open: &pb::SessionOpen) -> Result<pb::SessionKind, Status> {
    if open.job_id == 0 {
        return Err(Status::invalid_argument("job_id: required"));
    }
    let kind = match pb::SessionKind::try_from(open.kind) {
        Ok(pb::SessionKind::Unspecified) | Err(_) => {
            return Err(Status::invalid_argument("kind: one of EXEC, ATTACH, FORWARD"))
        }
        Ok(kind) => kind,
    };
    let argv_bytes: usize = open.argv.iter().map(String::len).sum();
    match kind {
        pb::SessionKind::Exec if open.resume.is_empty() && open.argv.is_empty() => {
            return Err(Status::invalid_argument("argv: exec needs a command"))
        }
        pb::SessionKind::Exec if open.argv.len() > ARGV_MAX || argv_bytes > ARGV_BYTES_MAX => {
            return Err(Status::invalid_argument(format!(
                "argv: at most {ARGV_MAX} arguments and {ARGV_BYTES_MAX} bytes"
            )))
        }
        pb::SessionKind::Forward if open.port == 0 || open.port > 65_535 => {
            return Err(Status::invalid_argument("port: 1 to 65535"))
        }
        _ => {}
    }
    if open.argv.iter().any(|a| a.contains('\0')) {
        return Err(Status::invalid_argument("argv: an argument holds a NUL byte"));
    }
    if open.term.len() > TERM_LEN_MAX || !open.term.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Status::invalid_argument(format!("term: at most {TERM_LEN_MAX} printable characters")));
    }
    if open.resume.len() > RESUME_LEN_MAX || !open.resume.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Status::invalid_argument("resume: not a session id this cluster gave"));
    }
    if open.keep_alive_s > kairos_scheduler::model::KEEP_ALIVE_MAX_S {
        return Err(Status::invalid_argument("keep_alive_s: at most 86400"));
    }
    if let Some(size) = &open.size {
        if size.rows > 10_000 || size.cols > 10_000 {
            return Err(Status::invalid_argument("size: at most 10000 rows and columns"));
        }
    }
    Ok(kind)
}

/// Whether `me` may open a session on a job of `owner`: its owner, or an admin (operators,
/// who may cancel anyone's job, may not enter it).
fn may_enter(me: &Principal, owner: &str) -> bool {
    me.user == owner || me.role == Role::Admin
}

/// The run a session on `job` opens into: its attempt and node (rank 0's), if it runs now.
fn live_run(job: &Job, kind: pb::SessionKind) -> Result<(u32, String), Status> {
    let id = job.id;
    if job.state != JobState::Running || job.last_node.is_empty() {
        let state = format!("{:?}", job.state).to_uppercase();
        return Err(Status::failed_precondition(format!("job {id} is not running (it is {state})")));
    }
    if job.preempting() {
        return Err(Status::failed_precondition(format!("job {id} is being stopped")));
    }
    if kind == pb::SessionKind::Attach && job.spec.profile != Profile::Interactive {
        return Err(Status::failed_precondition(format!(
            "job {id} is not interactive: it has no terminal to attach to (`kairos exec {id} --pty -- bash` opens one)"
        )));
    }
    Ok((job.attempt, job.last_node.clone()))
}

impl JobApi {
    /// `JobService.Session`: checks, grants and carries a session to the job's agent.
    pub(crate) async fn open_session(
        &self,
        me: Principal,
        credentials: tonic::metadata::MetadataMap,
        mut inbound: Streaming<pb::SessionInput>,
    ) -> Result<ReceiverStream<Result<pb::SessionOutput, Status>>, Status> {
        let mut open = first_open(&mut inbound).await?;
        let kind = check_open(&open)?;
        self.ctx.readable()?;
        let id = open.job_id;
        let found = self.ctx.replica.read(|a| {
            let job =
                a.state.jobs.get(&id).ok_or_else(|| Status::not_found(format!("job {id} not found")))?;
            if !may_enter(&me, &job.spec.user) {
                return Err(Status::permission_denied(format!(
                    "job {id} belongs to another user: only its owner (or an admin) may open a session on it"
                )));
            }
            let (attempt, node_name) = live_run(job, kind)?;
            let node = a
                .state
                .nodes
                .get(&node_name)
                .ok_or_else(|| Status::unavailable(format!("node \"{node_name}\" is unknown")))?;
            Ok((attempt, job.submit_time_ms, job.spec.user.clone(), node.info.clone(), node.epoch))
        });
        let (attempt, submit_time_ms, user, node, epoch) = self.redirect_unknown(found)?;
        if me.user != user {
            tracing::warn!(
                target: "kairos::audit",
                admin = %me.user, token = %me.token_id, job = id, owner = %user, kind = ?kind,
                argv = ?open.argv, port = open.port,
                "an admin opened a session on another user's job"
            );
        }
        let mut grant = pb::SessionGrant {
            job_id: id,
            attempt,
            submit_time_ms,
            user,
            caller: me.user.clone(),
            kind: kind as i32,
            port: open.port,
            expires_ms: crate::context::now_ms() + kairos_proto::grant::GRANT_TTL_MS,
            mac: Vec::new(),
        };
        kairos_proto::grant::seal(&self.ctx.auth.key.node_credential(&node.name, epoch), &mut grant);
        open.grant = Some(grant);
        let (to_agent_tx, to_agent_rx) = tokio::sync::mpsc::channel(16);
        let first = pb::SessionInput { input: Some(pb::session_input::Input::Open(open)) };
        to_agent_tx.send(first).await.map_err(|_| Status::internal("session: the relay closed"))?;
        let (mut agent, req) =
            self.to_agent(&node, epoch, ReceiverStream::new(to_agent_rx), "a session").await?;
        let from_agent = agent.session(req).await?.into_inner();
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let input = tokio::spawn(relay_in(inbound, to_agent_tx, tx.clone()));
        let ctx = self.ctx.clone();
        tokio::spawn(async move {
            relay_out(from_agent, tx, ctx, credentials).await;
            // Nothing more reaches the agent once the session ended here (a revoked token
            // stops input as well as output).
            input.abort();
        });
        Ok(ReceiverStream::new(rx))
    }
}

/// The client's messages after its open, to the agent: a second `open` or an oversized chunk
/// ends the session with `INVALID_ARGUMENT`.
async fn relay_in(
    mut inbound: Streaming<pb::SessionInput>,
    to_agent: tokio::sync::mpsc::Sender<pb::SessionInput>,
    to_client: tokio::sync::mpsc::Sender<Result<pb::SessionOutput, Status>>,
) {
    use pb::session_input::Input;
    while let Some(msg) = inbound.next().await {
        let refused = match &msg {
            Err(_) => return,
            Ok(pb::SessionInput { input: Some(Input::Open(_)) }) => {
                Some(Status::invalid_argument("session: `open` only as the first message"))
            }
            Ok(pb::SessionInput { input: Some(Input::Stdin(c)) }) if c.data.len() > STDIN_CHUNK_MAX => {
                Some(Status::invalid_argument(format!("stdin: at most {STDIN_CHUNK_MAX} bytes a chunk")))
            }
            Ok(_) => None,
        };
        if let Some(status) = refused {
            let _ = to_client.send(Err(status)).await;
            return;
        }
        if let Ok(m) = msg {
            if to_agent.send(m).await.is_err() {
                return;
            }
        }
    }
}

/// The agent's messages to the client, while the caller's token holds: a revoked or expired
/// one ends the session within `RECHECK`.
async fn relay_out(
    mut from_agent: Streaming<pb::SessionOutput>,
    to_client: tokio::sync::mpsc::Sender<Result<pb::SessionOutput, Status>>,
    ctx: crate::context::Ctx,
    credentials: tonic::metadata::MetadataMap,
) {
    let mut recheck = tokio::time::interval(RECHECK);
    let mut unsettled = 0u32;
    recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            out = from_agent.next() => match out {
                Some(out) => if to_client.send(out).await.is_err() { return },
                None => return,
            },
            _ = to_client.closed() => return,
            _ = recheck.tick() => match ctx.recheck(&credentials) {
                Ok(()) => unsettled = 0,
                Err(s) if s.code() == tonic::Code::Unavailable && unsettled < UNSETTLED_MAX => unsettled += 1,
                Err(refused) => {
                    let _ = to_client.send(Err(refused)).await;
                    return;
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(kind: pb::SessionKind) -> pb::SessionOpen {
        pb::SessionOpen { job_id: 4, kind: kind as i32, argv: vec!["sh".into()], ..Default::default() }
    }

    #[test]
    fn opens_are_checked_before_anything_is_looked_up() {
        assert_eq!(check_open(&open(pb::SessionKind::Exec)).unwrap(), pb::SessionKind::Exec);
        let bad: [fn(&mut pb::SessionOpen); 8] = [
            |o| o.job_id = 0,
            |o| o.kind = 0,
            |o| o.kind = 9,
            |o| o.argv.clear(),
            |o| o.argv = vec!["x".into(); ARGV_MAX + 1],
            |o| o.term = "a b".into(),
            |o| o.keep_alive_s = 86_401,
            |o| o.argv = vec!["a\0b".into()],
        ];
        for change in bad {
            let mut o = open(pb::SessionKind::Exec);
            change(&mut o);
            assert_eq!(check_open(&o).unwrap_err().code(), tonic::Code::InvalidArgument, "{o:?}");
        }
        let mut f = open(pb::SessionKind::Forward);
        f.port = 0;
        assert_eq!(check_open(&f).unwrap_err().code(), tonic::Code::InvalidArgument);
        f.port = 70_000;
        assert_eq!(check_open(&f).unwrap_err().code(), tonic::Code::InvalidArgument);
        f.port = 8888;
        assert!(check_open(&f).is_ok());
    }

    #[test]
    fn only_the_owner_or_an_admin_enters_a_job() {
        let who = |user: &str, role| Principal { user: user.into(), role, token_id: "t".into() };
        assert!(may_enter(&who("alice", Role::User), "alice"));
        assert!(!may_enter(&who("bob", Role::User), "alice"));
        assert!(!may_enter(&who("ops", Role::Operator), "alice"));
        assert!(may_enter(&who("root", Role::Admin), "alice"));
    }
}

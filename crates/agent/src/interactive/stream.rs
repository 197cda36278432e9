//! One `AgentLogService.Session` stream: the first message (an `open` with a grant, within
//! `OPEN_WAIT`), the grant's checks, the session it opens or resumes, then the pump between
//! the stream and the session until the session ends, the client goes, or another stream
//! takes the session over.

use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use kairos_proto::v1 as pb;
use pb::session_input::Input;
use pb::session_output::Output;
use tokio::sync::mpsc;
use tonic::Status;

use super::ring::Read;
use super::session::{Session, Sink};
use super::{exec, forward, session_id, terminal_id, RunView, Runs, Sessions};
use crate::decide::RunKey;

/// How long the first message may take.
pub const OPEN_WAIT: Duration = Duration::from_secs(10);
/// How long an exec'd command may take to start.
const SPAWN_WAIT: Duration = Duration::from_secs(30);
/// The largest stdin chunk accepted.
pub const STDIN_MAX: usize = 64 * 1024;
/// The most output bytes in one message.
const OUT_CHUNK: usize = 64 * 1024;

/// What a stream needs of the agent.
#[derive(Clone)]
pub struct Ctx {
    pub sessions: Sessions,
    pub runs: Arc<dyn Runs>,
    /// This node's credential: the key grants are sealed with.
    pub credential: String,
    pub node: String,
}

type Out = mpsc::Sender<Result<pb::SessionOutput, Status>>;

fn kind_of(k: i32) -> pb::SessionKind {
    pb::SessionKind::try_from(k).unwrap_or(pb::SessionKind::Unspecified)
}

/// Serves one session stream: its output, once the open is accepted (the refusal otherwise,
/// with nothing started).
pub async fn serve<S>(
    ctx: Ctx,
    mut inbound: S,
) -> Result<mpsc::Receiver<Result<pb::SessionOutput, Status>>, Status>
where
    S: Stream<Item = Result<pb::SessionInput, Status>> + Send + Unpin + 'static,
{
    let first = tokio::time::timeout(OPEN_WAIT, inbound.next())
        .await
        .map_err(|_| Status::deadline_exceeded("no session open within 10 s"))?;
    let open = match first {
        Some(Ok(pb::SessionInput { input: Some(Input::Open(open)) })) => open,
        Some(Err(e)) => return Err(e),
        _ => return Err(Status::invalid_argument("a session stream starts with `open`")),
    };
    let (key, view) = check_grant(&ctx, &open, crate::usage::now_ms())?;
    let session = open_session(&ctx, &open, key, &view).await?;
    let (oldest, end) = session.output.span();
    let offset = open.output_offset.clamp(oldest, end);
    let lost = oldest.saturating_sub(open.output_offset);
    let generation = session.attach();
    let opened = pb::SessionOpened {
        session: session.id.clone(),
        node: ctx.node.clone(),
        output_offset: offset,
        input_seq: session.applied().await,
    };
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        let _ = tx.send(Ok(pb::SessionOutput { output: Some(Output::Opened(opened)) })).await;
        if lost > 0 {
            let note = format!("kairos: {lost} bytes of output were lost (older than this node keeps)\r\n");
            let _ = tx.send(Ok(pb::SessionOutput { output: Some(Output::Notice(note)) })).await;
        }
        pump(&session, inbound, &tx, offset, generation).await;
        session.detach(generation);
    });
    Ok(rx)
}

/// The grant's checks: sealed for this node and not expired, for this job and kind (and
/// port), for a run live here (or, resuming, known here) of that user and submit time; ATTACH
/// only to an interactive run.
pub fn check_grant(ctx: &Ctx, open: &pb::SessionOpen, now_ms: i64) -> Result<(RunKey, RunView), Status> {
    let denied = |why: String| Status::permission_denied(format!("session refused: {why}"));
    let grant = open.grant.as_ref().ok_or_else(|| denied("no grant".into()))?;
    kairos_proto::grant::verify(&ctx.credential, grant, now_ms).map_err(|e| denied(e.to_string()))?;
    if grant.job_id != open.job_id || grant.kind != open.kind {
        return Err(denied("the grant is for another job or kind of session".into()));
    }
    let kind = kind_of(open.kind);
    if kind == pb::SessionKind::Forward && grant.port != open.port {
        return Err(denied("the grant is for another port".into()));
    }
    if kind == pb::SessionKind::Unspecified {
        return Err(Status::invalid_argument("a session of no kind"));
    }
    let key = (grant.job_id, grant.attempt);
    let not_here = || {
        Status::failed_precondition(format!("job {} attempt {} is not running on this node", key.0, key.1))
    };
    // A session resumed may outlive its run a while (its stream learns how it ended).
    let resuming = !open.resume.is_empty();
    let view = ctx.runs.view(key).filter(|v| v.live || resuming).ok_or_else(not_here)?;
    if view.user != grant.user || view.submit_ms != grant.submit_time_ms {
        return Err(denied("the grant is for another user or job".into()));
    }
    if kind == pb::SessionKind::Attach && !view.interactive {
        return Err(Status::failed_precondition(format!(
            "job {} is not interactive: nothing to attach to",
            key.0
        )));
    }
    Ok((key, view))
}

/// The session `open` names (`resume`), the run's terminal (ATTACH), or a new one.
async fn open_session(
    ctx: &Ctx,
    open: &pb::SessionOpen,
    key: RunKey,
    view: &RunView,
) -> Result<Arc<Session>, Status> {
    let kind = kind_of(open.kind);
    let caller = open.grant.as_ref().map(|g| g.caller.as_str()).unwrap_or_default();
    if !open.resume.is_empty() {
        let s = ctx
            .sessions
            .get(&open.resume)
            .ok_or_else(|| Status::not_found(format!("no session {:?} on this node", open.resume)))?;
        if s.run != key || s.kind != kind {
            return Err(Status::permission_denied("the session resumed is of another job or kind"));
        }
        if s.kind != pb::SessionKind::Attach && s.caller != caller {
            return Err(Status::permission_denied("the session resumed is another caller's"));
        }
        tracing::info!(job = key.0, attempt = key.1, kind = kind.as_str_name(), caller, session = %s.id, "session resumed");
        return Ok(s);
    }
    let what = match kind {
        pb::SessionKind::Forward => format!("port {}", open.port),
        _ => open.argv.first().cloned().unwrap_or_default(),
    };
    let session = match kind {
        pb::SessionKind::Attach => {
            let s = ctx
                .sessions
                .get(&terminal_id(key))
                .ok_or_else(|| Status::failed_precondition("the job's terminal is gone"))?;
            if let Some(size) = &open.size {
                s.resize(size);
            }
            s
        }
        pb::SessionKind::Exec => {
            let _slot = ctx.sessions.room(key)?;
            let s = start_exec(open, key, view).await?;
            ctx.sessions.insert(s.clone());
            s
        }
        pb::SessionKind::Forward => {
            let _slot = ctx.sessions.room(key)?;
            let s = tunnel(open, key, view).await?;
            ctx.sessions.insert(s.clone());
            s
        }
        pb::SessionKind::Unspecified => return Err(Status::invalid_argument("a session of no kind")),
    };
    tracing::info!(job = key.0, attempt = key.1, kind = kind.as_str_name(), caller, what, session = %session.id, "session started");
    Ok(session)
}

/// EXEC: the command started (`exec::start`) off the runtime, bounded: the spawn waits until
/// the command is exec'd (its working directory entered, its namespaces joined).
async fn start_exec(open: &pb::SessionOpen, key: RunKey, view: &RunView) -> Result<Arc<Session>, Status> {
    exec::check_argv(&open.argv)?;
    if view.frozen {
        // A command joining a frozen cgroup would stop before its exec, and hold the spawn.
        return Err(Status::failed_precondition("the run is suspended or being stopped"));
    }
    let exec_ctx =
        view.exec.clone().ok_or_else(|| Status::failed_precondition("the run is not started yet"))?;
    let (o, id) = (open.clone(), (session_id()?, key));
    let mut started = tokio::task::spawn_blocking(move || exec::start(&exec_ctx, &o, id));
    match tokio::time::timeout(SPAWN_WAIT, &mut started).await {
        Ok(Ok(started)) => started,
        Ok(Err(e)) => Err(Status::internal(format!("starting the command: {e}"))),
        Err(_) => {
            // Started too late for its stream: it never runs on unheld.
            tokio::spawn(async move {
                if let Ok(Ok(late)) = started.await {
                    late.kill();
                }
            });
            Err(Status::deadline_exceeded("the command did not start within 30 s"))
        }
    }
}

/// FORWARD: a connection to the run's port (`forward::connect`), as a session whose input
/// goes to the socket and whose output is what the socket sends.
async fn tunnel(open: &pb::SessionOpen, key: RunKey, view: &RunView) -> Result<Arc<Session>, Status> {
    let port = u16::try_from(open.port).map_err(|_| Status::invalid_argument("ports are 1-65535"))?;
    let exec_ctx =
        view.exec.as_ref().ok_or_else(|| Status::failed_precondition("the run is not started yet"))?;
    let socket = forward::connect(&exec_ctx.forward_target(), port).await?;
    let (mut read, write) = socket.into_split();
    let keep_alive = Duration::from_secs(u64::from(match open.keep_alive_s {
        0 => 60,
        s => s.min(86_400),
    }));
    let on_idle = Box::new(|s: &Session| {
        s.finish(pb::SessionExit {
            code: -1,
            signal: 0,
            reason: "no client attached (the keep-alive ran out)".into(),
        });
        s.output.close();
    });
    let id = (session_id()?, key, pb::SessionKind::Forward);
    let session = Session::new(id, Sink::Writer(Box::new(write)), None, keep_alive, on_idle);
    let caller = open.grant.as_ref().map_or("", |g| g.caller.as_str());
    let session = Arc::new(session.with_caller(caller));
    let s = session.clone();
    tokio::spawn(async move {
        use tokio::io::AsyncReadExt;
        let mut exit = s.exit();
        let mut buf = vec![0u8; OUT_CHUNK];
        loop {
            tokio::select! {
                n = read.read(&mut buf) => match n {
                    Ok(n) if n > 0 => s.output.push(&buf[..n], false),
                    _ => break,
                },
                _ = exit.changed() => break,
            }
        }
        s.output.close();
        s.finish(pb::SessionExit { code: 0, signal: 0, reason: "the connection closed".into() });
    });
    Ok(session)
}

/// Carries output to the stream and the stream's input to the session, until the session
/// has ended (and all its output is sent), the client goes, or another stream takes over.
async fn pump<S>(session: &Session, mut inbound: S, tx: &Out, mut offset: u64, generation: u64)
where
    S: Stream<Item = Result<pb::SessionInput, Status>> + Unpin,
{
    let (mut grown, mut taken, mut exit) = (session.output.watch(), session.taken(), session.exit());
    loop {
        let ended = match session.output.read(offset, OUT_CHUNK) {
            Read::Chunks { chunks, .. } => {
                for c in chunks {
                    offset = c.offset + c.data.len() as u64;
                    let data = pb::SessionOutputChunk { offset: c.offset, data: c.data, stderr: c.stderr };
                    if tx.send(Ok(pb::SessionOutput { output: Some(Output::Data(data)) })).await.is_err() {
                        return;
                    }
                }
                continue;
            }
            Read::Nothing { ended } => ended,
        };
        let done = exit.borrow_and_update().clone().filter(|e| ended || !e.reason.is_empty());
        if let Some(e) = done {
            let _ = tx.send(Ok(pb::SessionOutput { output: Some(Output::Exit(e)) })).await;
            return;
        }
        tokio::select! {
            msg = inbound.next() => {
                let Some(Ok(input)) = msg else { return };
                if !batch(session, input, &mut inbound, tx).await {
                    return;
                }
            }
            _ = grown.changed() => {}
            _ = exit.changed() => {}
            _ = taken.changed() => {
                if *taken.borrow_and_update() != generation {
                    let note = "kairos: another client attached to this session\r\n".to_string();
                    let _ = tx.send(Ok(pb::SessionOutput { output: Some(Output::Notice(note)) })).await;
                    return;
                }
            }
        }
    }
}

/// `first` and every message already waiting behind it, handled in order; one
/// acknowledgement for the input among them. False when the stream is to end (it failed, the
/// client closed it, a message was refused: the refusal is sent).
async fn batch<S>(session: &Session, first: pb::SessionInput, inbound: &mut S, tx: &Out) -> bool
where
    S: Stream<Item = Result<pb::SessionInput, Status>> + Unpin,
{
    use futures::FutureExt;
    let mut acked = None;
    let mut next = Some(first);
    let mut go_on = true;
    while let Some(input) = next.take() {
        match handle(session, input).await {
            Ok(Some(seq)) => acked = Some(seq),
            Ok(None) => {}
            Err(e) => {
                let _ = tx.send(Err(e)).await;
                return false;
            }
        }
        match inbound.next().now_or_never() {
            Some(Some(Ok(input))) => next = Some(input),
            Some(_) => go_on = false,
            None => {}
        }
    }
    if let Some(seq) = acked {
        let ack = pb::SessionOutput { output: Some(Output::InputAcked(seq)) };
        go_on &= tx.send(Ok(ack)).await.is_ok();
    }
    go_on
}

/// One message of the client's: input applied (the last sequence number applied), a resize,
/// a signal.
async fn handle(session: &Session, input: pb::SessionInput) -> Result<Option<u64>, Status> {
    match input.input {
        Some(Input::Stdin(stdin)) => {
            if stdin.data.len() > STDIN_MAX {
                return Err(Status::invalid_argument(format!("a stdin chunk over {STDIN_MAX} bytes")));
            }
            session.apply(stdin).await.map(Some)
        }
        Some(Input::Resize(size)) => {
            session.resize(&size);
            Ok(None)
        }
        Some(Input::Signal(sig)) => session.signal(sig).map(|()| None),
        Some(Input::Ping(_)) | None => Ok(None),
        Some(Input::Open(_)) => Err(Status::invalid_argument("a session is opened once per stream")),
    }
}

//! The resumable session client: one `JobService.Session` stream at a time, opened again at
//! another controller when it breaks (a failover), with no output byte printed twice and no
//! input byte lost.
//!
//! `Ledger` is the bookkeeping, pure: the session's id, the output offset received (replayed
//! bytes below it are skipped), and the stdin chunks the agent has not yet acknowledged (sent
//! again on every new stream; the agent applies each sequence number once). `drive` runs a
//! session to its end: local events in (`Local`), output to the writers given.

use std::collections::VecDeque;
use std::time::Duration;

use kairos_proto::v1 as pb;
use kairos_proto::v1::job_service_client::JobServiceClient;
use pb::session_input::Input;
use pb::session_output::Output;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tonic::{Code, Status};

use crate::client::Client;

/// How long a broken session keeps trying to get its stream back.
pub const RESUME_WAIT: Duration = Duration::from_secs(30);
/// How long a session's first stream waits for a run just placed to start on its node.
const START_WAIT: Duration = Duration::from_secs(20);
/// How often the client says it is still there.
const PING_EVERY: Duration = Duration::from_secs(10);
/// Input messages queued for one stream.
const QUEUE: usize = 64;

/// What the local side has for the session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Local {
    /// Bytes for the session's stdin (or the tunnel).
    Stdin(Vec<u8>),
    /// The end of input.
    Eof,
    /// The local terminal's new size.
    Resize(pb::TerminalSize),
    /// A signal for the remote foreground process group.
    Signal(i32),
}

/// A session's resume state, kept across streams.
#[derive(Debug, Default)]
pub struct Ledger {
    /// The id to resume with (from `SessionOpened`).
    pub session: Option<String>,
    /// Output bytes received (and written) so far.
    pub offset: u64,
    /// The last stdin sequence number given out.
    seq: u64,
    /// Stdin sent but not yet acknowledged, in order.
    unacked: VecDeque<pb::SessionStdin>,
}

impl Ledger {
    /// The next stdin chunk, numbered and kept until acknowledged.
    pub fn stdin(&mut self, data: Vec<u8>, eof: bool) -> pb::SessionStdin {
        self.seq += 1;
        let chunk = pb::SessionStdin { seq: self.seq, data, eof };
        self.unacked.push_back(chunk.clone());
        chunk
    }

    /// The agent applied every chunk up to `seq`: they need not be sent again.
    pub fn acked(&mut self, seq: u64) {
        while self.unacked.front().is_some_and(|c| c.seq <= seq) {
            self.unacked.pop_front();
        }
    }

    /// The chunks a new stream sends again.
    pub fn unacked(&self) -> impl Iterator<Item = &pb::SessionStdin> {
        self.unacked.iter()
    }

    /// A stream opened: its session id; the bytes lost when the agent no longer holds output
    /// from our offset (its ring buffer moved on), which are then skipped.
    pub fn opened(&mut self, opened: &pb::SessionOpened) -> u64 {
        if !opened.session.is_empty() {
            self.session = Some(opened.session.clone());
        }
        self.acked(opened.input_seq);
        let lost = opened.output_offset.saturating_sub(self.offset);
        self.offset = self.offset.max(opened.output_offset);
        lost
    }

    /// The part of `chunk` not yet written (a replay may start below our offset), advancing
    /// the offset past it; bytes missing before it (the agent's buffer moved on) are skipped.
    pub fn take<'a>(&mut self, chunk: &'a pb::SessionOutputChunk) -> &'a [u8] {
        let end = chunk.offset.saturating_add(chunk.data.len() as u64);
        if end <= self.offset {
            return &[];
        }
        let skip = self.offset.saturating_sub(chunk.offset) as usize;
        self.offset = end;
        &chunk.data[skip..]
    }

    /// The first message of a stream: `base`, resuming this session once it has an id.
    pub fn open(&self, base: &pb::SessionOpen) -> pb::SessionOpen {
        let mut open = base.clone();
        if let Some(id) = &self.session {
            open.resume = id.clone();
            open.output_offset = self.offset;
        }
        open
    }
}

/// One stream: the sender of its input, the receiver of its output.
struct Stream {
    tx: mpsc::Sender<pb::SessionInput>,
    rx: tonic::Streaming<pb::SessionOutput>,
}

fn input(i: Input) -> pb::SessionInput {
    pb::SessionInput { input: Some(i) }
}

/// Why a stream could not be opened: no controller answered (`Err`), or one answered `Status`.
type Opened = Result<Result<Stream, Status>, crate::client::CallError>;

/// Opens a stream at whichever controller answers: the open message, then the unacknowledged
/// stdin again.
async fn open_stream(client: &Client, ledger: &Ledger, base: &pb::SessionOpen) -> Opened {
    let mut sender = None;
    let first: Vec<pb::SessionInput> = std::iter::once(input(Input::Open(ledger.open(base))))
        .chain(ledger.unacked().map(|c| input(Input::Stdin(c.clone()))))
        .collect();
    let reply = client
        .call(|ch| {
            let (tx, rx) = mpsc::channel(QUEUE.max(first.len() + 1));
            for m in &first {
                let _ = tx.try_send(m.clone());
            }
            sender = Some(tx);
            let req = client.request(tokio_stream::wrappers::ReceiverStream::new(rx));
            async move {
                match JobServiceClient::new(ch).session(req).await {
                    Ok(r) => Ok(Ok(r.into_inner())),
                    // Let the client follow leader hints and move past silent controllers.
                    Err(s) if s.code() == Code::Unavailable || s.message() == "Timeout expired" => Err(s),
                    Err(s) => Ok(Err(s)),
                }
            }
        })
        .await?;
    Ok(reply.and_then(|rx| match sender.take() {
        Some(tx) => Ok(Stream { tx, rx }),
        None => Err(Status::internal("no stream")),
    }))
}

/// The one-line message for a status that ends the session.
pub fn status_message(status: &Status) -> String {
    let msg = status.message().lines().next().unwrap_or("").to_string();
    match status.code() {
        Code::PermissionDenied
        | Code::NotFound
        | Code::InvalidArgument
        | Code::FailedPrecondition
        | Code::Unauthenticated => msg,
        code => format!("{msg} ({code:?})"),
    }
}

/// Whether the node answered that the run is not there yet: a job the controllers have just
/// placed (`kairos alloc` attaches at once) whose node has not started it. (The agent's words;
/// a job that is not running at all is refused by the controller, in others.)
fn not_started_yet(status: &Status) -> bool {
    status.code() == Code::FailedPrecondition
        && ["the run is not started yet", "is not running on this node"]
            .iter()
            .any(|m| status.message().contains(m))
}

/// Opens a session's first stream, waiting up to `START_WAIT` for a run just placed to start.
async fn open_first(client: &Client, ledger: &Ledger, base: &pb::SessionOpen) -> anyhow::Result<Stream> {
    let deadline = tokio::time::Instant::now() + START_WAIT;
    loop {
        match open_stream(client, ledger, base).await? {
            Ok(stream) => return Ok(stream),
            Err(s) if not_started_yet(&s) && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(250)).await
            }
            Err(s) => return Err(NeverOpened(status_message(&s)).into()),
        }
    }
}

/// A session refused at its first stream: nothing was started, nothing was written.
#[derive(Debug)]
pub struct NeverOpened(pub String);

impl std::fmt::Display for NeverOpened {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NeverOpened {}

/// Opens the stream again after a break, for up to `RESUME_WAIT`.
async fn reopen(client: &Client, ledger: &Ledger, base: &pb::SessionOpen) -> anyhow::Result<Stream> {
    let deadline = tokio::time::Instant::now() + RESUME_WAIT;
    let mut last = String::from("the stream broke");
    while tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        match open_stream(client, ledger, base).await {
            Ok(Ok(stream)) => return Ok(stream),
            Ok(Err(s)) if crate::client::resumable(&s) => last = status_message(&s),
            Ok(Err(s)) => anyhow::bail!("{}", status_message(&s)),
            Err(e) => last = e.to_string(),
        }
    }
    anyhow::bail!("lost the session; no controller took it back within {RESUME_WAIT:?} ({last})")
}

/// A command whose stream broke before it said which session it is may have started: opening
/// it again could run it twice, so that is an error (a terminal or a tunnel is opened again).
fn unresumable_before_opened(ledger: &Ledger, base: &pb::SessionOpen) -> anyhow::Result<()> {
    if ledger.session.is_none() && base.kind == pb::SessionKind::Exec as i32 {
        anyhow::bail!(
            "the stream broke before the session opened (the command may have started; not run again)"
        );
    }
    Ok(())
}

/// Where a session's output goes.
pub struct Sink<'a> {
    pub stdout: &'a mut (dyn AsyncWrite + Unpin + Send),
    pub stderr: &'a mut (dyn AsyncWrite + Unpin + Send),
}

/// Runs the session `base` opens until it exits: local events go in, output comes out, the
/// stream is opened again (resumed) when it breaks. Returns how the session ended.
pub async fn drive(
    client: &Client,
    base: pb::SessionOpen,
    mut local: mpsc::Receiver<Local>,
    mut sink: Sink<'_>,
) -> anyhow::Result<pb::SessionExit> {
    let mut ledger = Ledger::default();
    let mut base = base;
    let mut stream = open_first(client, &ledger, &base).await?;
    let mut ping = tokio::time::interval(PING_EVERY);
    let mut local_open = true;
    loop {
        tokio::select! {
            item = stream.rx.next() => match item {
                Some(Ok(out)) => {
                    if let Some(exit) = output(&mut ledger, out, &mut sink).await? {
                        return Ok(exit);
                    }
                }
                Some(Err(s)) if !crate::client::resumable(&s) => anyhow::bail!("{}", status_message(&s)),
                // Broken, or ended without an exit: resume elsewhere.
                _ => {
                    unresumable_before_opened(&ledger, &base)?;
                    stream = reopen(client, &ledger, &base).await?
                }
            },
            event = local.recv(), if local_open => match event {
                None => local_open = false,
                Some(event) => {
                    if let Local::Resize(size) = &event {
                        base.size = Some(*size);
                    }
                    let _ = stream.tx.send(local_input(&mut ledger, event)).await;
                }
            },
            _ = ping.tick() => {
                let _ = stream.tx.send(input(Input::Ping(true))).await;
            }
        }
    }
}

/// The input message for a local event (stdin numbered in the ledger).
fn local_input(ledger: &mut Ledger, event: Local) -> pb::SessionInput {
    input(match event {
        Local::Stdin(data) => Input::Stdin(ledger.stdin(data, false)),
        Local::Eof => Input::Stdin(ledger.stdin(Vec::new(), true)),
        Local::Resize(size) => Input::Resize(size),
        Local::Signal(n) => Input::Signal(n),
    })
}

/// Handles one output message; the exit when it is one.
async fn output(
    ledger: &mut Ledger,
    out: pb::SessionOutput,
    sink: &mut Sink<'_>,
) -> anyhow::Result<Option<pb::SessionExit>> {
    match out.output {
        Some(Output::Opened(o)) => {
            let lost = ledger.opened(&o);
            if lost > 0 {
                eprintln!(
                    "\r\nkairos: {lost} bytes of output were lost while the session was reconnecting\r"
                );
            }
        }
        Some(Output::Data(chunk)) => {
            let bytes = ledger.take(&chunk);
            if !bytes.is_empty() {
                write_out(sink, chunk.stderr, bytes).await?;
            }
        }
        Some(Output::InputAcked(seq)) => ledger.acked(seq),
        Some(Output::Exit(exit)) => return Ok(Some(exit)),
        Some(Output::Notice(line)) => eprintln!("\r\nkairos: {line}\r"),
        None => {}
    }
    Ok(None)
}

/// Writes output bytes where they belong, at once (a prompt has no newline).
async fn write_out(sink: &mut Sink<'_>, stderr: bool, bytes: &[u8]) -> anyhow::Result<()> {
    let to = if stderr { &mut *sink.stderr } else { &mut *sink.stdout };
    to.write_all(bytes).await?;
    to.flush().await?;
    Ok(())
}

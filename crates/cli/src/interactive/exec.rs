//! `kairos exec` (a command inside a running job, like `srun --overlap` or `kubectl exec`) and
//! `kairos attach` (an interactive job's own terminal): one session shown on the local
//! terminal, raw when the remote side is a terminal, or on the local pipes.

use kairos_proto::v1 as pb;
use tokio::signal::unix::{signal, SignalKind};

use super::stream::{self, Sink};
use super::terminal::{self, Forwarding, RawMode};
use crate::client::Client;

/// `kairos exec`'s job, options and command.
#[derive(clap::Args, Debug)]
pub struct ExecArgs {
    /// The job's id, or an array task as ARRAY_INDEX (e.g. 41_3); it must be running.
    #[arg(value_parser = crate::args::parse_job_ref)]
    pub id: (u64, Option<u32>),
    /// Run the command on a pseudo-terminal (a shell, top, vim): the local terminal goes raw,
    /// its size follows; Ctrl-C reaches the command as the terminal's interrupt. Without it
    /// stdin, stdout and stderr are pipes and Ctrl-C is forwarded as SIGINT.
    #[arg(long, short = 't')]
    pub pty: bool,
    /// How long the command may outlive a lost connection (the agent keeps it this long for
    /// the client to come back), e.g. 5m (default 60s, at most 24h).
    #[arg(long, value_name = "DURATION", value_parser = crate::args::parse_time)]
    pub keep_alive: Option<u64>,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

/// How a session is shown here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Display {
    /// Raw local terminal, sizes forwarded.
    Terminal,
    /// Local terminal left as it is, stdin forwarded, SIGINT/SIGTERM forwarded as signals.
    Pipes,
}

/// `kairos exec`: runs the command in job `args.id`; exits with its status.
pub async fn exec(client: &Client, args: ExecArgs) -> anyhow::Result<i32> {
    let job_id = crate::jobs::resolve(client, args.id).await?;
    let display = if args.pty && terminal::stdin_is_tty() { Display::Terminal } else { Display::Pipes };
    let open = pb::SessionOpen {
        job_id,
        kind: pb::SessionKind::Exec as i32,
        argv: args.command,
        pty: args.pty,
        size: args.pty.then(terminal::size).flatten(),
        term: if args.pty { term() } else { String::new() },
        keep_alive_s: args.keep_alive.map_or(0, |s| s.min(u64::from(u32::MAX)) as u32),
        ..Default::default()
    };
    run_session(client, open, display, "exec").await
}

/// The local TERM, when the controller will take it (printable, at most 64 characters); else
/// none (the agent's default, xterm).
fn term() -> String {
    let term = std::env::var("TERM").unwrap_or_default();
    let fits = term.len() <= 64 && term.bytes().all(|b| b.is_ascii_graphic());
    if fits {
        term
    } else {
        String::new()
    }
}

/// `kairos attach`: the interactive job's terminal, until it ends (its exit status) or the
/// user leaves.
pub async fn attach(client: &Client, id: (u64, Option<u32>)) -> anyhow::Result<i32> {
    let job_id = crate::jobs::resolve(client, id).await?;
    attach_job(client, job_id, default_display()).await
}

/// A terminal when stdin is one, else pipes.
pub fn default_display() -> Display {
    if terminal::stdin_is_tty() {
        Display::Terminal
    } else {
        Display::Pipes
    }
}

/// Attaches to job `job_id`'s terminal, shown as `display`.
pub async fn attach_job(client: &Client, job_id: u64, display: Display) -> anyhow::Result<i32> {
    let open = pb::SessionOpen {
        job_id,
        kind: pb::SessionKind::Attach as i32,
        size: terminal::size(),
        ..Default::default()
    };
    run_session(client, open, display, "attach").await
}

/// Runs one session shown as `display`; its exit status. `what` names the command in errors.
pub async fn run_session(
    client: &Client,
    open: pb::SessionOpen,
    display: Display,
    what: &str,
) -> anyhow::Result<i32> {
    let raw = display == Display::Terminal;
    let events = terminal::events(Forwarding { stdin: true, resize: raw, signals: !raw })?;
    // Raw mode is undone when this guard drops, however the session ends.
    let raw_guard = if raw { Some(RawMode::enter()?) } else { None };
    let (mut stdout, mut stderr) = (tokio::io::stdout(), tokio::io::stderr());
    let sink = Sink { stdout: &mut stdout, stderr: &mut stderr };
    // In raw mode Ctrl-C is a byte for the remote side; SIGTERM or SIGHUP here ends this client.
    let mut term = signal(SignalKind::terminate())?;
    let mut hup = signal(SignalKind::hangup())?;
    let ended = tokio::select! {
        r = stream::drive(client, open, events, sink) => r,
        _ = term.recv(), if raw => return Ok(128 + libc::SIGTERM),
        _ = hup.recv(), if raw => return Ok(128 + libc::SIGHUP),
    };
    let exit = ended.map_err(|e| match e.downcast_ref::<stream::NeverOpened>() {
        Some(refused) => stream::NeverOpened(format!("{what}: {refused}")).into(),
        None => anyhow::anyhow!("{what}: {e}"),
    })?;
    drop(raw_guard);
    if !exit.reason.is_empty() {
        eprintln!("kairos: {what}: {}", exit.reason);
    }
    Ok(super::exit_status(&exit))
}

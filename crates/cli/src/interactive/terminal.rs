//! The local terminal: raw mode while a remote terminal is attached (restored when the guard
//! drops: on return, on error and on unwinding), its size, and the local events a session
//! forwards: stdin read on a thread of its own, SIGWINCH as resizes, and (pipes) SIGINT and
//! SIGTERM as signals.

use std::io::{IsTerminal, Read};
use std::os::fd::AsFd;

use kairos_proto::v1 as pb;
use nix::sys::termios::{self, SetArg, Termios};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

use super::stream::Local;

/// Local events queued for a session.
const EVENTS: usize = 256;
/// A signal repeated within this ends the client.
const TWICE: std::time::Duration = std::time::Duration::from_secs(1);

/// The terminal's settings before raw mode, put back on drop.
pub struct RawMode {
    saved: Termios,
}

impl RawMode {
    /// Puts stdin's terminal in raw mode (no echo, no line editing, Ctrl-C a plain byte).
    pub fn enter() -> anyhow::Result<RawMode> {
        let stdin = std::io::stdin();
        let saved = termios::tcgetattr(stdin.as_fd())
            .map_err(|e| anyhow::anyhow!("reading the terminal's settings: {e}"))?;
        let mut raw = saved.clone();
        termios::cfmakeraw(&mut raw);
        termios::tcsetattr(stdin.as_fd(), SetArg::TCSADRAIN, &raw)
            .map_err(|e| anyhow::anyhow!("setting the terminal raw: {e}"))?;
        Ok(RawMode { saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = termios::tcsetattr(std::io::stdin().as_fd(), SetArg::TCSADRAIN, &self.saved);
    }
}

/// Whether stdin is a terminal (raw mode and sizes make sense only then).
pub fn stdin_is_tty() -> bool {
    std::io::stdin().is_terminal()
}

/// The local terminal's size (stdout's, else stdin's); None when neither is a terminal.
pub fn size() -> Option<pb::TerminalSize> {
    [libc::STDOUT_FILENO, libc::STDIN_FILENO].into_iter().find_map(|fd| {
        // SAFETY: TIOCGWINSZ writes a `winsize` into `ws`, which outlives the call.
        let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
        let rc = unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws) };
        (rc == 0 && ws.ws_row > 0 && ws.ws_col > 0)
            .then(|| pb::TerminalSize { rows: u32::from(ws.ws_row), cols: u32::from(ws.ws_col) })
    })
}

/// What the local side forwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Forwarding {
    /// Read stdin and forward it (numbered chunks, then EOF).
    pub stdin: bool,
    /// Forward SIGWINCH as resizes (the remote side is a terminal shown here).
    pub resize: bool,
    /// Forward SIGINT and SIGTERM as signals (the local terminal is not raw).
    pub signals: bool,
}

/// Starts the local event sources `what` asks for; their events arrive on the receiver.
pub fn events(what: Forwarding) -> anyhow::Result<mpsc::Receiver<Local>> {
    let (tx, rx) = mpsc::channel(EVENTS);
    if what.stdin {
        read_stdin(tx.clone())?;
    }
    if what.resize {
        let mut winch = signal(SignalKind::window_change())?;
        let tx = tx.clone();
        tokio::spawn(async move {
            while winch.recv().await.is_some() {
                if let Some(s) = size() {
                    if tx.send(Local::Resize(s)).await.is_err() {
                        return;
                    }
                }
            }
        });
    }
    if what.signals {
        forward_signals(tx)?;
    }
    Ok(rx)
}

/// Stdin, read on a thread of its own (reads block) into `Stdin` events, then `Eof`.
fn read_stdin(tx: mpsc::Sender<Local>) -> anyhow::Result<()> {
    std::thread::Builder::new().name("stdin".into()).spawn(move || {
        let mut stdin = std::io::stdin();
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let event = match stdin.read(&mut buf) {
                Ok(0) | Err(_) => Local::Eof,
                Ok(n) => Local::Stdin(buf[..n].to_vec()),
            };
            let eof = event == Local::Eof;
            if tx.blocking_send(event).is_err() || eof {
                return;
            }
        }
    })?;
    Ok(())
}

/// SIGINT, SIGTERM and SIGHUP arrive as `Signal` events for the remote side. The same signal
/// twice within `TWICE` also ends this client (as srun's double Ctrl-C): a remote command that
/// ignores it does not hold the CLI; the session ends after its keep-alive.
fn forward_signals(tx: mpsc::Sender<Local>) -> anyhow::Result<()> {
    for (kind, number) in [
        (SignalKind::interrupt(), libc::SIGINT),
        (SignalKind::terminate(), libc::SIGTERM),
        (SignalKind::hangup(), libc::SIGHUP),
    ] {
        let mut sig = signal(kind)?;
        let tx = tx.clone();
        tokio::spawn(async move {
            let mut last: Option<std::time::Instant> = None;
            while sig.recv().await.is_some() {
                if last.is_some_and(|t| t.elapsed() < TWICE) {
                    eprintln!(
                        "kairos: signal {number} twice: leaving the session (it ends after its keep-alive)"
                    );
                    // Pipes only: the local terminal was not changed, nothing to restore.
                    std::process::exit(128 + number);
                }
                last = Some(std::time::Instant::now());
                if tx.send(Local::Signal(number)).await.is_err() {
                    return;
                }
            }
        });
    }
    Ok(())
}

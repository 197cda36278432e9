//! EXEC: a new command inside a running run, without disturbing it. It runs as the run's
//! account, in the run's cgroups (written into before exec), with the run's environment and
//! working directory (entered as the user), in its own session and process group; inside the
//! run's container when it has one (the user's groups, no new privileges, the run's user, mount
//! and PID namespaces through a pidfd of the container's init, then the user, no capabilities,
//! then one more fork so the command is inside the PID namespace). On a terminal of its own
//! (`pty`), else on pipes (stderr chunks marked).

use std::ffi::CString;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kairos_proto::v1 as pb;
use nix::libc;
use tokio::io::{AsyncRead, AsyncReadExt};
use tonic::Status;

use super::forward::ForwardTarget;
use super::ring::Ring;
use super::session::{Session, Sink};
use super::terminal::{self, Pty, Tee};
use crate::account::UnixAccount;
use crate::decide::RunKey;

/// Most arguments of an exec'd command, and most bytes of them all.
pub const ARGV_MAX: usize = 256;
pub const ARGV_BYTES_MAX: usize = 64 * 1024;

/// How a command joins a run, kept from the run's launch.
#[derive(Clone, Debug, Default)]
pub struct ExecContext {
    pub account: Option<UnixAccount>,
    /// The run's whole environment (the account's allowlisted base, the image's, the job's).
    pub env: Vec<(String, String)>,
    pub workdir: PathBuf,
    pub fallback_workdir: Option<PathBuf>,
    /// The run's cgroup v2 directory and v1 limit directories.
    pub cgroup: Option<PathBuf>,
    pub limit_dirs: Vec<PathBuf>,
    /// The run's main process (its process group leader).
    pub main_pid: i32,
    /// In a container: the working directory inside.
    pub container_workdir: Option<String>,
    /// Set once the run's main process exited: no command joins the run after (held across
    /// each spawn, so none is half-way in when the runner kills what is left).
    pub closed: Arc<std::sync::Mutex<bool>>,
}

impl ExecContext {
    /// The run as a tunnel checks it (`forward::connect`).
    pub fn forward_target(&self) -> ForwardTarget {
        ForwardTarget {
            cgroup: self.cgroup.clone(),
            limit_dirs: self.limit_dirs.clone(),
            main_pid: self.main_pid,
        }
    }

    /// The run's main process exited: commands spawning now finish joining first; none joins
    /// after.
    pub fn close(&self) {
        *self.closed.lock().unwrap_or_else(|p| p.into_inner()) = true;
    }

    fn procs_files(&self) -> std::io::Result<Vec<OwnedFd>> {
        let dirs = self.cgroup.iter().chain(self.limit_dirs.iter());
        dirs.map(|d| std::fs::OpenOptions::new().write(true).open(d.join("cgroup.procs")).map(OwnedFd::from))
            .collect()
    }
}

/// Refuses a command past the bounds before anything starts.
pub fn check_argv(argv: &[String]) -> Result<(), Status> {
    let bytes: usize = argv.iter().map(|a| a.len() + 1).sum();
    match () {
        _ if argv.first().is_none_or(|a| a.is_empty()) => {
            Err(Status::invalid_argument("exec: an empty command"))
        }
        _ if argv.len() > ARGV_MAX => {
            Err(Status::invalid_argument(format!("exec: more than {ARGV_MAX} arguments")))
        }
        _ if bytes > ARGV_BYTES_MAX => {
            Err(Status::invalid_argument(format!("exec: the command is over {ARGV_BYTES_MAX} bytes")))
        }
        _ if argv.iter().any(|a| a.contains('\0')) => {
            Err(Status::invalid_argument("exec: an argument holds a NUL byte"))
        }
        _ => Ok(()),
    }
}

fn cstring(p: &Path) -> std::io::Result<CString> {
    CString::new(std::os::unix::ffi::OsStrExt::as_bytes(p.as_os_str()))
        .map_err(|_| std::io::Error::other("a working directory holds a NUL byte"))
}

/// What the exec'd child does between fork and exec, prepared before the fork.
struct Steps {
    procs: Vec<i32>,
    terminal: bool,
    ids: Option<(Vec<libc::gid_t>, libc::gid_t, libc::uid_t)>,
    workdir: CString,
    fallback: Option<CString>,
    /// A pidfd of the container's init: the namespaces to join.
    container: Option<i32>,
}

impl Steps {
    /// # Safety
    /// Only between fork and exec: system calls on prepared values.
    unsafe fn run(&self) -> std::io::Result<()> {
        crate::container_child::default_signals();
        let err = std::io::Error::last_os_error;
        for fd in &self.procs {
            if libc::write(*fd, b"0".as_ptr().cast(), 1) != 1 {
                return Err(err());
            }
        }
        match self.terminal {
            true => terminal::become_controlling()?,
            false if libc::setsid() < 0 => return Err(err()),
            false => {}
        }
        // The groups first: the container's user namespace denies setgroups.
        if let Some((groups, gid, _)) = &self.ids {
            if libc::setgroups(groups.len(), groups.as_ptr()) != 0 || libc::setgid(*gid) != 0 {
                return Err(err());
            }
        }
        match self.container {
            // Its namespaces are joined before the user is (see `enter_container`).
            Some(pidfd) => enter_container(pidfd, self.ids.as_ref().map(|(_, _, uid)| *uid))?,
            None => {
                if let Some((_, _, uid)) = &self.ids {
                    if libc::setuid(*uid) != 0 {
                        return Err(err());
                    }
                }
            }
        }
        if libc::chdir(self.workdir.as_ptr()) != 0 {
            match &self.fallback {
                Some(f) if libc::chdir(f.as_ptr()) == 0 => {}
                _ => return Err(err()),
            }
        }
        libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, libc::CLOSE_RANGE_CLOEXEC);
        Ok(())
    }
}

/// No new privileges; into the user, mount and PID namespaces of the process `pidfd` names; the
/// bounding and ambient sets emptied; then the user (`uid`, when given: its groups are set
/// already); the permitted and effective sets emptied; then a fork (the PID namespace holds
/// children only): this process waits and ends as the command did; the command's process goes
/// on.
///
/// The namespaces are joined with the agent's privileges, before the change of user: a setns
/// through a pidfd asks for ptrace read access to its target, and the container's init is
/// never dumpable (a copy of the agent that changed user and never exec'd), so the user's
/// process, without CAP_SYS_PTRACE, is refused (EPERM). Once in the container's user
/// namespace the process holds capabilities there only, none outside; the setuid there keeps
/// them (the namespace maps no root), and they are dropped before anything else runs: the
/// command's process is in the container's PID namespace as the user only.
///
/// # Safety
/// Only between fork and exec.
unsafe fn enter_container(pidfd: i32, uid: Option<libc::uid_t>) -> std::io::Result<()> {
    let err = std::io::Error::last_os_error;
    if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
        return Err(err());
    }
    if libc::setns(pidfd, libc::CLONE_NEWUSER | libc::CLONE_NEWNS | libc::CLONE_NEWPID) != 0 {
        return Err(err());
    }
    // The bounding set while CAP_SETPCAP is surely held in the namespace (whatever the setuid
    // keeps of it).
    for cap in 0..64 {
        libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0);
    }
    libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
    if let Some(uid) = uid {
        if libc::setuid(uid) != 0 {
            return Err(err());
        }
    }
    crate::container_child::drop_capabilities()?;
    let child = libc::fork();
    if child < 0 {
        return Err(err());
    }
    if child > 0 {
        relay(child);
    }
    Ok(())
}

/// The process outside the PID namespace: holds no descriptor (the spawn's error pipe among
/// them: the spawn returns once the command is exec'd, not when it ends), ignores the group's
/// signals (the command gets them), waits for the command and ends as it did. Its
/// capabilities are dropped already.
unsafe fn relay(child: libc::pid_t) -> ! {
    libc::syscall(libc::SYS_close_range, 0u32, u32::MAX, 0u32);
    for sig in [
        libc::SIGINT,
        libc::SIGQUIT,
        libc::SIGTERM,
        libc::SIGHUP,
        libc::SIGTSTP,
        libc::SIGTTIN,
        libc::SIGTTOU,
        libc::SIGWINCH,
    ] {
        libc::signal(sig, libc::SIG_IGN);
    }
    let mut status = 0;
    while libc::waitpid(child, &mut status, 0) < 0 && *libc::__errno_location() == libc::EINTR {}
    if libc::WIFSIGNALED(status) {
        let sig = libc::WTERMSIG(status);
        libc::signal(sig, libc::SIG_DFL);
        let no_core = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        libc::setrlimit(libc::RLIMIT_CORE, &no_core);
        libc::kill(libc::getpid(), sig);
        libc::_exit(128 + sig);
    }
    libc::_exit(libc::WEXITSTATUS(status))
}

/// A pidfd of the container's init (the run's main process's one child, PID 1 inside): the
/// main process is named by a pidfd first; the child found in its child list is opened, its
/// parent read (`PPid`) while it still lives (so the pid read was its), and the main process
/// must still live once that is done (its pid, and so its child list, was not reused).
fn container_init(main_pid: i32) -> std::io::Result<OwnedFd> {
    let main = pidfd(main_pid)?;
    let mut text = String::new();
    std::fs::File::open(format!("/proc/{main_pid}/task/{main_pid}/children"))?
        .take(4096)
        .read_to_string(&mut text)?;
    let init_pid: i32 = text
        .split_whitespace()
        .next()
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| std::io::Error::other("the run's container has no init"))?;
    let init = pidfd(init_pid)?;
    let mut status = String::new();
    std::fs::File::open(format!("/proc/{init_pid}/status"))?.take(16 * 1024).read_to_string(&mut status)?;
    let parent =
        status.lines().find_map(|l| l.strip_prefix("PPid:")).and_then(|p| p.trim().parse::<i32>().ok());
    match parent == Some(main_pid) && alive(&init) && alive(&main) {
        true => Ok(init),
        false => Err(std::io::Error::other("the run ended")),
    }
}

/// A pidfd of `pid` (close-on-exec).
fn pidfd(pid: i32) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open returns a new descriptor, owned at once.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Whether the process `pidfd` names lives (signal 0 through it).
fn alive(pidfd: &OwnedFd) -> bool {
    // SAFETY: signal 0 through a pidfd the caller owns: only whether it lives.
    unsafe {
        libc::syscall(libc::SYS_pidfd_send_signal, pidfd.as_raw_fd(), 0, std::ptr::null::<u8>(), 0) == 0
    }
}

/// The command's stdin, stdout and stderr: a new terminal of the client's size and TERM (the
/// agent's end, and the slave to hold until the spawn), else pipes.
fn stdio(
    cmd: &mut tokio::process::Command,
    open: &pb::SessionOpen,
) -> std::io::Result<(Option<Arc<Pty>>, Option<OwnedFd>)> {
    if !open.pty {
        use std::process::Stdio;
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        return Ok((None, None));
    }
    let size = open.size.unwrap_or(pb::TerminalSize { rows: 24, cols: 80 });
    let clamp = |v: u32| v.clamp(1, u32::from(u16::MAX)) as u16;
    let (pty, slave) = terminal::open(clamp(size.rows), clamp(size.cols))?;
    let term = if open.term.is_empty() { "xterm" } else { open.term.as_str() };
    let [i, o, e] = terminal::stdio_of(&slave)?;
    cmd.env("TERM", term).stdin(i).stdout(o).stderr(e);
    Ok((Some(Arc::new(pty)), Some(slave)))
}

/// The command of `open`, spawned into `ctx`'s run (see the module); its session, held by
/// nobody yet. Output and exit are recorded as they come.
pub fn start(
    ctx: &ExecContext,
    open: &pb::SessionOpen,
    (id, run): (String, RunKey),
) -> Result<Arc<Session>, Status> {
    check_argv(&open.argv)?;
    let keep_alive = std::time::Duration::from_secs(u64::from(match open.keep_alive_s {
        0 => 60,
        s => s.min(86_400),
    }));
    let failed = |e: std::io::Error| Status::failed_precondition(format!("exec {:?}: {e}", open.argv[0]));
    let mut cmd = tokio::process::Command::new(&open.argv[0]);
    cmd.args(&open.argv[1..]).env_clear().envs(ctx.env.iter().cloned()).kill_on_drop(false);
    let (pty, _slave) = stdio(&mut cmd, open).map_err(failed)?;
    let procs = ctx.procs_files().map_err(failed)?;
    let init =
        ctx.container_workdir.as_ref().map(|_| container_init(ctx.main_pid)).transpose().map_err(failed)?;
    let steps = Steps {
        procs: procs.iter().map(|f| f.as_raw_fd()).collect(),
        terminal: pty.is_some(),
        ids: ctx.account.as_ref().map(|a| (a.groups.clone(), a.gid, a.uid)),
        workdir: match &ctx.container_workdir {
            Some(w) => CString::new(w.as_str())
                .map_err(|_| Status::internal("the container's workdir holds a NUL"))?,
            None => cstring(&ctx.workdir).map_err(failed)?,
        },
        fallback: ctx
            .fallback_workdir
            .as_deref()
            .filter(|_| init.is_none())
            .map(cstring)
            .transpose()
            .map_err(failed)?,
        container: init.as_ref().map(|f| f.as_raw_fd()),
    };
    // SAFETY: between fork and exec the child only makes system calls on prepared values.
    unsafe { cmd.pre_exec(move || steps.run()) };
    let closed = ctx.closed.lock().unwrap_or_else(|p| p.into_inner());
    if *closed {
        return Err(Status::failed_precondition("the run's main process has exited"));
    }
    let mut child = crate::reaper::spawn(|| cmd.spawn(), tokio::process::Child::id).map_err(failed)?;
    drop((closed, cmd, procs, init));
    let sink = match (&pty, child.stdin.take()) {
        (Some(p), _) => Sink::Pty(p.clone()),
        (None, Some(stdin)) => Sink::Writer(Box::new(stdin)),
        (None, None) => Sink::Closed,
    };
    let on_idle = Box::new(|s: &Session| {
        s.kill();
        let reason = format!("no client attached for {} s (the keep-alive ran out)", s.keep_alive.as_secs());
        s.finish(pb::SessionExit { code: -1, signal: 0, reason });
    });
    let caller = open.grant.as_ref().map_or("", |g| g.caller.as_str());
    let session = Session::new((id, run, pb::SessionKind::Exec), sink, pty.clone(), keep_alive, on_idle);
    let session = Arc::new(session.with_caller(caller));
    if let Some(pid) = child.id() {
        session.set_pgid(pid as i32);
    }
    tokio::spawn(watch(session.clone(), child, pty));
    Ok(session)
}

/// Copies the command's output into the session, waits for it, records how it ended.
async fn watch(session: Arc<Session>, mut child: tokio::process::Child, pty: Option<Arc<Pty>>) {
    let ring = session.output.clone();
    let copiers: Vec<tokio::task::JoinHandle<()>> = match pty {
        Some(pty) => vec![tokio::spawn(drain(Tee { pty, ring: ring.clone() }))],
        None => {
            let out = child.stdout.take().map(|o| tokio::spawn(pipe(o, ring.clone(), false)));
            let err = child.stderr.take().map(|e| tokio::spawn(pipe(e, ring.clone(), true)));
            out.into_iter().chain(err).collect()
        }
    };
    // What the command's descendants still hold open ends with their process group, killed
    // while its leader is not reaped yet (the group's number is not reused before).
    let status = match exited(child.id()).await {
        Ok(()) => {
            session.leader_exited();
            child.wait().await
        }
        Err(e) => {
            // No pidfd (a kernel before 5.3): killed once reaped, as soon as can be.
            tracing::debug!(session = %session.id, error = %e, "no pidfd of a session's command");
            let status = child.wait().await;
            session.leader_exited();
            status
        }
    };
    for c in copiers {
        let _ = c.await;
    }
    ring.close();
    let exit = match status {
        Ok(s) => match (s.code(), s.signal()) {
            (Some(code), _) => pb::SessionExit { code, signal: 0, reason: String::new() },
            (None, Some(sig)) => pb::SessionExit { code: -1, signal: sig, reason: String::new() },
            _ => pb::SessionExit { code: -1, signal: 0, reason: "lost".into() },
        },
        Err(e) => pb::SessionExit { code: -1, signal: 0, reason: format!("waiting for the command: {e}") },
    };
    session.finish(exit);
}

/// Waits until the child `pid` has exited, leaving it to be reaped (a pidfd turns readable).
async fn exited(pid: Option<u32>) -> std::io::Result<()> {
    let pid = pid.ok_or_else(|| std::io::Error::other("the command was reaped already"))?;
    let fd = pidfd(pid as i32)?;
    // SAFETY: the descriptor is owned by the AsyncFd for its whole life.
    let fd = unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
        .map_err(std::io::Error::from)?;
    fd.readable().await.map(|_| ())
}

/// Reads a terminal to its end (the `Tee` keeps what it reads).
async fn drain(mut tee: Tee) {
    let mut buf = vec![0u8; 64 * 1024];
    while matches!(tee.read(&mut buf).await, Ok(n) if n > 0) {}
}

/// Copies one pipe of the command into the session's output.
async fn pipe(mut from: impl AsyncRead + Unpin, ring: Arc<Ring>, stderr: bool) {
    let mut buf = vec![0u8; 64 * 1024];
    while let Ok(n) = from.read(&mut buf).await {
        if n == 0 {
            return;
        }
        ring.push(&buf[..n], stderr);
    }
}

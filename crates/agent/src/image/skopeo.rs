//! Registry images: copied into an OCI layout by `skopeo`, run as the job's user (its ids, no
//! new privileges) with nothing of the agent's environment, in a process group of its own that
//! is killed whole at the pull's deadline and when it ends.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use super::{fail, PullError, Reader};

/// The search path skopeo runs with (nothing else of the agent's environment).
const SAFE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// How much of skopeo's errors is kept (the rest is read and dropped).
const STDERR_MAX: u64 = 64 << 10;

/// What runs skopeo: the program, and how long a pull may take (named when it is over).
pub(super) struct Skopeo<'a> {
    pub program: &'a Path,
    pub timeout: Duration,
}

impl Skopeo<'_> {
    /// Copies the registry image `remote` into the layout `pulled/layout` (tagged "pulled"), as
    /// `reader`, until `deadline`; `reference` names it in messages.
    pub fn copy(
        &self,
        remote: &str,
        reference: &str,
        pulled: &Path,
        reader: Option<&Reader>,
        deadline: Instant,
    ) -> Result<(), PullError> {
        // Recorded as the agent's own, so the orphan reaper never takes its exit status.
        let mut cmd = self.command(remote, pulled, reader);
        let mut child = match crate::reaper::spawn(|| cmd.spawn(), |c| Some(c.id())) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return fail(format!(
                    "{reference}: registry images are pulled with skopeo, which this node lacks"
                ))
            }
            Err(e) => return fail(format!("{reference}: running skopeo: {e}")),
            Ok(child) => child,
        };
        let errors = stderr_head(&mut child);
        let pgid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
        let kill_group = || {
            // The group is gone already when skopeo left nothing running: nothing to do then.
            let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
        };
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
                Ok(None) => {
                    kill_group();
                    // Reaped so that no zombie stays; killed already, its status says nothing.
                    let _ = child.wait();
                    return fail(format!(
                        "{reference}: skopeo did not finish within the pull's deadline ({} s)",
                        self.timeout.as_secs()
                    ));
                }
                Err(e) => return fail(format!("{reference}: waiting for skopeo: {e}")),
            }
        };
        // Whatever it left running goes with it.
        kill_group();
        if status.success() {
            return Ok(());
        }
        let why = errors.and_then(|rx| rx.recv_timeout(Duration::from_secs(2)).ok()).unwrap_or_default();
        let why = String::from_utf8_lossy(&why);
        fail(format!("{reference}: {} ({status})", why.trim().chars().take(300).collect::<String>()))
    }

    /// `skopeo copy docker://REMOTE oci:PULLED/layout:pulled`, to run as `reader` in `pulled`.
    fn command(&self, remote: &str, pulled: &Path, reader: Option<&Reader>) -> Command {
        use std::os::unix::process::CommandExt;
        let mut cmd = Command::new(self.program);
        cmd.args(["copy", "--quiet", &format!("docker://{remote}")])
            .arg(format!("oci:{}:pulled", pulled.join("layout").display()))
            .env_clear()
            .env("PATH", SAFE_PATH)
            .env("HOME", pulled)
            .env("TMPDIR", pulled)
            .current_dir(pulled)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .process_group(0);
        if let Some(r) = reader {
            let (uid, gid, groups) = (r.uid, r.gid, r.groups.clone());
            // SAFETY: only async-signal-safe system calls between fork and exec, on memory
            // made before the fork.
            unsafe {
                cmd.pre_exec(move || {
                    use nix::libc;
                    if libc::setgroups(groups.len(), groups.as_ptr()) != 0
                        || libc::setresgid(gid, gid, gid) != 0
                        || libc::setresuid(uid, uid, uid) != 0
                        || libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                    {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        cmd
    }
}

/// The first `STDERR_MAX` bytes of `child`'s errors (the rest read and dropped), gathered on a
/// thread of their own; None when its errors are not piped.
fn stderr_head(child: &mut Child) -> Option<Receiver<Vec<u8>>> {
    use std::io::Read;
    let mut stderr = child.stderr.take()?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut head = Vec::new();
        // A read error only shortens the message: what was read so far is still sent.
        let _ = (&mut stderr).take(STDERR_MAX).read_to_end(&mut head);
        // The rest is drained only so skopeo never blocks on a full pipe; its bytes are not kept.
        let _ = std::io::copy(&mut stderr, &mut std::io::sink());
        // The pull may have stopped waiting for the message: then nobody receives it.
        let _ = tx.send(head);
    });
    Some(rx)
}

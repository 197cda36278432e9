//! Pseudo-terminals: the master the agent keeps (non-blocking, read through the runtime's
//! reactor, close-on-exec so no child inherits it) and the slave a command gets as its stdin,
//! stdout and stderr and controlling terminal (`become_controlling`, between fork and exec).
//! EIO on the master once the last holder of the slave has closed it is the end of output.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use nix::libc;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, ReadBuf};

use super::ring::Ring;

/// The agent's end of a pseudo-terminal.
pub struct Pty {
    master: AsyncFd<OwnedFd>,
}

fn cvt(r: libc::c_int) -> std::io::Result<libc::c_int> {
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// A new pseudo-terminal: its master (non-blocking) and its slave, both close-on-exec from
/// the start (no concurrent spawn can inherit either), of `rows` × `cols`.
pub fn open(rows: u16, cols: u16) -> std::io::Result<(Pty, OwnedFd)> {
    let flags = libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC;
    // SAFETY: open of a NUL-terminated path; the descriptor is owned at once.
    let master =
        unsafe { OwnedFd::from_raw_fd(cvt(libc::open(c"/dev/ptmx".as_ptr(), flags | libc::O_NONBLOCK))?) };
    // SAFETY: unlockpt and TIOCGPTPEER on the master this function owns; the slave is owned at
    // once (opened through the master, never by a path a job could replace).
    let slave = unsafe {
        cvt(libc::unlockpt(master.as_raw_fd()))?;
        OwnedFd::from_raw_fd(cvt(libc::ioctl(master.as_raw_fd(), libc::TIOCGPTPEER, flags))?)
    };
    // SAFETY: the descriptor is owned by the `AsyncFd` and closed only when it is dropped.
    let master = unsafe { AsyncFd::register(master) }.map_err(std::io::Error::from)?;
    let pty = Pty { master };
    pty.resize(rows, cols)?;
    Ok((pty, slave))
}

impl Pty {
    /// Sets the terminal's size (the kernel sends the foreground group SIGWINCH).
    pub fn resize(&self, rows: u16, cols: u16) -> std::io::Result<()> {
        let size = libc::winsize { ws_row: rows.max(1), ws_col: cols.max(1), ws_xpixel: 0, ws_ypixel: 0 };
        // SAFETY: TIOCSWINSZ with a pointer to a local winsize.
        cvt(unsafe { libc::ioctl(self.master.as_raw_fd(), libc::TIOCSWINSZ, &size) }).map(|_| ())
    }

    /// `signal` to the terminal's foreground process group (where a typed Ctrl-C would go),
    /// as the kernel resolves it (`TIOCSIG`): no group number is read, so none reused is hit.
    pub fn signal(&self, signal: i32) -> std::io::Result<()> {
        // SAFETY: an ioctl with an integer argument on the master this value owns.
        cvt(unsafe { libc::ioctl(self.master.as_raw_fd(), libc::TIOCSIG, signal as libc::c_ulong) })
            .map(|_| ())
    }

    /// Writes all of `data` to the terminal (the command's input), waiting while it is full.
    pub async fn write_all(&self, mut data: &[u8]) -> std::io::Result<()> {
        while !data.is_empty() {
            let mut guard = self.master.writable().await?;
            // SAFETY: write from a live slice to the master.
            match guard.try_io(|fd| {
                let n = unsafe { libc::write(fd.as_raw_fd(), data.as_ptr().cast(), data.len()) };
                if n < 0 {
                    Err(std::io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            }) {
                Ok(Ok(n)) => data = &data[n..],
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
        Ok(())
    }

    fn poll_read(&self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<usize>> {
        loop {
            let mut guard = ready!(self.master.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            // SAFETY: read into the initialised, unfilled part of the buffer.
            let read = guard.try_io(|fd| {
                let n = unsafe { libc::read(fd.as_raw_fd(), unfilled.as_mut_ptr().cast(), unfilled.len()) };
                if n < 0 {
                    Err(std::io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            });
            match read {
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(n));
                }
                // Every holder of the slave has closed it: the end of output.
                Ok(Err(e)) if e.raw_os_error() == Some(libc::EIO) => return Poll::Ready(Ok(0)),
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

/// The terminal's output as a reader, each byte read also kept in `ring` (for the sessions
/// attached to it); the end of output closes the ring.
pub struct Tee {
    pub pty: Arc<Pty>,
    pub ring: Arc<Ring>,
}

impl AsyncRead for Tee {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        match ready!(self.pty.poll_read(cx, buf)) {
            Ok(0) => {
                self.ring.close();
                Poll::Ready(Ok(()))
            }
            Ok(_) => {
                self.ring.push(&buf.filled()[before..], false);
                Poll::Ready(Ok(()))
            }
            Err(e) => {
                self.ring.close();
                Poll::Ready(Err(e))
            }
        }
    }
}

/// In the child, between fork and exec, with the slave on stdin: a new session whose
/// controlling terminal it is (the child leads its own process group, as the runner's group
/// signals expect).
///
/// # Safety
/// Only between fork and exec (system calls only).
pub unsafe fn become_controlling() -> std::io::Result<()> {
    if libc::setsid() < 0 {
        return Err(std::io::Error::last_os_error());
    }
    cvt(libc::ioctl(0, libc::TIOCSCTTY, 0)).map(|_| ())
}

/// Three descriptors of `slave` for a command's stdin, stdout and stderr.
pub fn stdio_of(slave: &OwnedFd) -> std::io::Result<[std::process::Stdio; 3]> {
    Ok([slave.try_clone()?.into(), slave.try_clone()?.into(), slave.try_clone()?.into()])
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn a_pty_carries_bytes_both_ways_and_ends_with_eof_when_the_slave_closes() {
        let (pty, slave) = match open(24, 80) {
            Ok(p) => p,
            Err(e) => return eprintln!("skipped: no pseudo-terminals here ({e})"),
        };
        // SAFETY: fcntl on an owned descriptor.
        let flags = unsafe { libc::fcntl(slave.as_raw_fd(), libc::F_GETFD) };
        assert_eq!(flags & libc::FD_CLOEXEC, libc::FD_CLOEXEC, "the slave must not leak into children");
        let pty = Arc::new(pty);
        let ring = Arc::new(Ring::new(1024));
        // SAFETY: write of a static slice to the slave.
        let n = unsafe { libc::write(slave.as_raw_fd(), b"out".as_ptr().cast(), 3) };
        assert_eq!(n, 3);
        drop(slave);
        let mut tee = Tee { pty: pty.clone(), ring: ring.clone() };
        let mut all = Vec::new();
        tokio::time::timeout(std::time::Duration::from_secs(5), tee.read_to_end(&mut all))
            .await
            .expect("EOF in time")
            .expect("read");
        assert_eq!(all, b"out");
        assert_eq!(ring.end(), 3);
        assert!(ring.watch().borrow().1, "the ring is closed at the end of output");
    }
}

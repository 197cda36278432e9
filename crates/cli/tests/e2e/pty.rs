//! A terminal for end-to-end tests of interactive commands: runs a command on a real
//! pseudo-terminal (its session leader, the PTY its controlling terminal, as in a shell), lets
//! a test type keys, resize the window (the kernel sends SIGWINCH), and wait for output.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub struct Pty {
    master: std::fs::File,
    pub child: Child,
    /// Everything the command wrote so far, and how far `expect` has consumed it.
    out: Arc<Mutex<Vec<u8>>>,
    seen: usize,
}

fn winsize(rows: u16, cols: u16) -> libc::winsize {
    libc::winsize { ws_row: rows, ws_col: cols, ws_xpixel: 0, ws_ypixel: 0 }
}

impl Pty {
    /// Starts `cmd` on a new terminal of `rows` × `cols`.
    pub fn spawn(mut cmd: Command, rows: u16, cols: u16) -> Pty {
        let (mut master, mut slave) = (-1, -1);
        let size = winsize(rows, cols);
        // SAFETY: openpty writes the two descriptors; the name and termios pointers may be null.
        let rc =
            unsafe { libc::openpty(&mut master, &mut slave, std::ptr::null_mut(), std::ptr::null(), &size) };
        assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
        // SAFETY: both descriptors were just opened and are owned here alone.
        let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
        let io = |fd: &OwnedFd| Stdio::from(fd.try_clone().expect("dup the terminal"));
        cmd.stdin(io(&slave)).stdout(io(&slave)).stderr(io(&slave));
        // SAFETY: between fork and exec only async-signal-safe calls: a new session whose
        // controlling terminal is the PTY (stdin).
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().expect("spawn on the terminal");
        drop(slave);
        let master = std::fs::File::from(master);
        let out = Arc::new(Mutex::new(Vec::new()));
        let (mut reader, sink) = (master.try_clone().expect("dup the master"), out.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            // EIO once the command and its children closed the terminal.
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    return;
                }
                sink.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        Pty { master, child, out, seen: 0 }
    }

    /// Types `keys`.
    pub fn write(&mut self, keys: &str) {
        self.master.write_all(keys.as_bytes()).expect("type on the terminal");
    }

    /// Resizes the window (the command gets SIGWINCH).
    pub fn resize(&self, rows: u16, cols: u16) {
        let size = winsize(rows, cols);
        // SAFETY: TIOCSWINSZ reads one winsize from the pointer.
        let rc = unsafe { libc::ioctl(self.master.as_raw_fd(), libc::TIOCSWINSZ, &size) };
        assert_eq!(rc, 0, "TIOCSWINSZ: {}", std::io::Error::last_os_error());
    }

    /// Everything written so far, as text.
    pub fn output(&self) -> String {
        String::from_utf8_lossy(&self.out.lock().unwrap()).to_string()
    }

    /// Waits until the output after the last match holds `needle`; returns the text up to and
    /// including it and consumes it.
    pub fn expect(&mut self, needle: &str, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            {
                let out = self.out.lock().unwrap();
                let text = String::from_utf8_lossy(&out[self.seen..]).to_string();
                if let Some(at) = text.find(needle) {
                    let upto = &text[..at + needle.len()];
                    self.seen += upto.len();
                    return upto.to_string();
                }
            }
            assert!(
                Instant::now() < deadline,
                "no {needle:?} on the terminal within {within:?}; it shows: {:?}",
                String::from_utf8_lossy(&self.out.lock().unwrap()[self.seen..])
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for the command to exit.
    pub fn wait(&mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait for the command") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the command did not exit within {within:?}: {}",
                self.output()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Pty {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

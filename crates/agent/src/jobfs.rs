//! Paths a job controls, as the agent (often root) touches them.
//!
//! A job owns its directory (`<state-dir>/jobs/<job>/`), so between two of the agent's visits it
//! may put anything at a name the agent will use: a symbolic link, a hard link to a file it does
//! not own, a FIFO. Everything here is reached relative to a directory descriptor (`openat`),
//! never through a link (`O_NOFOLLOW`), never blocking (`O_NONBLOCK`: a FIFO fails at once or is
//! refused by its type), and ownership or modes are changed only on a descriptor whose `fstat`
//! says what it is:
//!
//! - a run's log is always a **new** inode (`O_CREAT|O_EXCL`): whatever held its name before is
//!   unlinked first, never opened — a hard link loses a name, its inode is untouched;
//! - a file that is read or appended to must be a regular file with one link, owned by the job
//!   directory's owner or the agent;
//! - a directory is created or opened with `O_DIRECTORY|O_NOFOLLOW`, and one that another account
//!   owns is refused rather than given to the job.
//!
//! The job's own code never runs here: the working directory is entered after the switch to the
//! job's account (`runner/spawn.rs`, in the child).

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::fcntl::OFlag;
use nix::sys::stat::{fstat, FileStat, Mode, SFlag};

/// A directory held open; names below it are resolved against the descriptor.
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
    path: PathBuf,
}

/// Who should own a file or directory: (uid, gid).
pub type Owner = (u32, u32);

fn errno(e: nix::Error) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

fn refused(path: &Path, why: &str) -> io::Error {
    io::Error::other(format!("{}: {why}", path.display()))
}

fn kind(stat: &FileStat) -> SFlag {
    SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT
}

/// Refuses a single path component that could leave the directory.
fn component(name: &str) -> io::Result<&str> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{name:?} is not a file name")));
    }
    Ok(name)
}

fn agent_uid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

impl Dir {
    /// Opens the directory `path` (created when missing, with its parents, as the agent's),
    /// refusing a link at its last component.
    pub fn create(path: &Path) -> io::Result<Dir> {
        if let Err(e) = std::fs::create_dir(path) {
            match e.kind() {
                io::ErrorKind::AlreadyExists => {}
                io::ErrorKind::NotFound => std::fs::create_dir_all(path)?,
                _ => return Err(e),
            }
        }
        Dir::open(path)
    }

    /// Opens the existing directory `path`, refusing a link at its last component.
    pub fn open(path: &Path) -> io::Result<Dir> {
        let fd = nix::fcntl::open(
            path,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| match e {
            nix::Error::ELOOP | nix::Error::ENOTDIR => refused(path, "not a directory (a link?)"),
            e => errno(e),
        })?;
        // SAFETY: `open` returned a new descriptor that nothing else owns.
        Ok(Dir { fd: unsafe { OwnedFd::from_raw_fd(fd) }, path: path.to_path_buf() })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn stat(&self) -> io::Result<FileStat> {
        fstat(self.fd.as_raw_fd()).map_err(errno)
    }

    /// The uid that owns this directory.
    pub fn owner(&self) -> io::Result<u32> {
        Ok(self.stat()?.st_uid)
    }

    fn openat(&self, name: &str, flags: OFlag, mode: u32) -> io::Result<OwnedFd> {
        let fd = nix::fcntl::openat(
            Some(self.fd.as_raw_fd()),
            component(name)?,
            flags | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(mode),
        )
        .map_err(|e| match e {
            nix::Error::ELOOP => refused(&self.path.join(name), "a symbolic link (refused)"),
            e => errno(e),
        })?;
        // SAFETY: `openat` returned a new descriptor that nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// The directory `name` below this one — created when missing — owned by `owner` (or left
    /// the agent's) with `mode`. A link or anything else there is refused, and so is a directory
    /// that an account other than `owner` and the agent owns (it is not this job's).
    pub fn subdir(&self, name: &str, owner: Option<Owner>, mode: u32) -> io::Result<Dir> {
        match nix::sys::stat::mkdirat(
            Some(self.fd.as_raw_fd()),
            component(name)?,
            Mode::from_bits_truncate(0o700),
        ) {
            Ok(()) | Err(nix::Error::EEXIST) => {}
            Err(e) => return Err(errno(e)),
        }
        let path = self.path.join(name);
        let fd = self.openat(name, OFlag::O_RDONLY | OFlag::O_DIRECTORY, 0).map_err(|e| {
            if e.raw_os_error() == Some(nix::libc::ENOTDIR) || e.kind() == io::ErrorKind::Other {
                refused(&path, "not a directory (a link?)")
            } else {
                e
            }
        })?;
        let dir = Dir { fd, path };
        let stat = dir.stat()?;
        if kind(&stat) != SFlag::S_IFDIR {
            return Err(refused(&dir.path, "not a directory"));
        }
        let expected = owner.map_or(agent_uid(), |o| o.0);
        if stat.st_uid != expected && stat.st_uid != agent_uid() {
            return Err(refused(&dir.path, &format!("owned by uid {}, not this job's account", stat.st_uid)));
        }
        if let Some((uid, gid)) = owner {
            nix::unistd::fchown(dir.fd.as_raw_fd(), Some(uid.into()), Some(gid.into())).map_err(errno)?;
        }
        nix::sys::stat::fchmod(dir.fd.as_raw_fd(), Mode::from_bits_truncate(mode)).map_err(errno)?;
        Ok(dir)
    }

    /// A new, empty file `name` opened for appending, owned by `owner` (or the agent) with mode
    /// 0600. Whatever held the name before is unlinked, never opened.
    pub fn create_fresh(&self, name: &str, owner: Option<Owner>) -> io::Result<File> {
        let flags = OFlag::O_WRONLY | OFlag::O_APPEND | OFlag::O_CREAT | OFlag::O_EXCL;
        // Bounded: a job that keeps putting something back at the name cannot spin the agent.
        let mut tries = 0;
        let fd = loop {
            tries += 1;
            match self.openat(name, flags, 0o600) {
                Ok(fd) => break fd,
                Err(e) if tries >= 3 => return Err(e),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists || e.kind() == io::ErrorKind::Other => {
                    // A file, a link (symbolic or hard), a FIFO: its name goes, nothing else. A
                    // directory there is the job's business; the run cannot log.
                    nix::unistd::unlinkat(
                        Some(self.fd.as_raw_fd()),
                        name,
                        nix::unistd::UnlinkatFlags::NoRemoveDir,
                    )
                    .map_err(|e| match e {
                        nix::Error::EISDIR => refused(&self.path.join(name), "a directory (refused)"),
                        e => errno(e),
                    })?;
                }
                Err(e) => return Err(e),
            }
        };
        if let Some((uid, gid)) = owner {
            nix::unistd::fchown(fd.as_raw_fd(), Some(uid.into()), Some(gid.into())).map_err(errno)?;
        }
        nix::sys::stat::fchmod(fd.as_raw_fd(), Mode::from_bits_truncate(0o600)).map_err(errno)?;
        Ok(regular(fd))
    }

    /// Opens the existing file `name` for reading (or appending, with `append`), only if it is
    /// a regular file with one link owned by this directory's owner or the agent.
    pub fn open_existing(&self, name: &str, append: bool) -> io::Result<File> {
        let flags = if append { OFlag::O_WRONLY | OFlag::O_APPEND } else { OFlag::O_RDONLY };
        let fd = self.openat(name, flags, 0)?;
        let stat = fstat(fd.as_fd().as_raw_fd()).map_err(errno)?;
        let path = self.path.join(name);
        if kind(&stat) != SFlag::S_IFREG {
            return Err(refused(&path, "not a regular file (refused)"));
        }
        if stat.st_nlink != 1 {
            return Err(refused(&path, "has other links (refused)"));
        }
        if stat.st_uid != self.owner()? && stat.st_uid != agent_uid() {
            return Err(refused(&path, &format!("owned by uid {} (refused)", stat.st_uid)));
        }
        Ok(regular(fd))
    }
}

/// A descriptor of a regular file as a `File`, blocking again (O_NONBLOCK means nothing for a
/// regular file, but the flag would follow the descriptor into anything it is handed to).
fn regular(fd: OwnedFd) -> File {
    let raw = fd.as_raw_fd();
    if let Ok(flags) = nix::fcntl::fcntl(raw, nix::fcntl::FcntlArg::F_GETFL) {
        let flags = OFlag::from_bits_truncate(flags) - OFlag::O_NONBLOCK;
        // O_NONBLOCK means nothing for a regular file: left set, the file still works.
        let _ = nix::fcntl::fcntl(raw, nix::fcntl::FcntlArg::F_SETFL(flags));
    }
    File::from(fd)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::unix::fs::MetadataExt;

    fn nobody() -> Owner {
        (65534, 65534)
    }

    fn root() -> bool {
        nix::unistd::geteuid().is_root()
    }

    #[test]
    fn a_hard_link_at_a_new_logs_name_loses_its_name_and_its_inode_is_untouched() {
        let tmp = tempfile::tempdir().unwrap();
        let precious = tmp.path().join("precious");
        std::fs::write(&precious, "precious\n").unwrap();
        std::fs::set_permissions(&precious, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
        let before = std::fs::metadata(&precious).unwrap();
        let dir = Dir::create(&tmp.path().join("job")).unwrap();
        std::fs::hard_link(&precious, dir.path().join("attempt-1.log")).unwrap();
        let owner = root().then(nobody);
        let mut log = dir.create_fresh("attempt-1.log", owner).unwrap();
        log.write_all(b"the job's output\n").unwrap();
        let after = std::fs::metadata(&precious).unwrap();
        assert_eq!(std::fs::read_to_string(&precious).unwrap(), "precious\n");
        assert_eq!((after.uid(), after.mode(), after.nlink()), (before.uid(), before.mode(), 1));
        let new = std::fs::metadata(dir.path().join("attempt-1.log")).unwrap();
        assert_ne!(new.ino(), before.ino());
        assert_eq!(new.mode() & 0o777, 0o600);
        if root() {
            assert_eq!(new.uid(), 65534);
        }
    }

    #[test]
    fn a_fifo_or_a_symlink_at_a_new_logs_name_never_blocks_nor_is_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = Dir::create(&tmp.path().join("job")).unwrap();
        nix::unistd::mkfifo(&dir.path().join("attempt-2.log"), Mode::from_bits_truncate(0o666)).unwrap();
        let target = tmp.path().join("target");
        std::fs::write(&target, "t\n").unwrap();
        std::os::unix::fs::symlink(&target, dir.path().join("attempt-3.log")).unwrap();
        // Bounded: an open that followed the FIFO would block this thread forever.
        let (tx, rx) = std::sync::mpsc::channel();
        let path = dir.path().to_path_buf();
        std::thread::spawn(move || {
            let dir = Dir::open(&path).unwrap();
            let two = dir.create_fresh("attempt-2.log", None).map(|_| ());
            let three = dir.create_fresh("attempt-3.log", None).map(|_| ());
            let _ = tx.send((two.is_ok(), three.is_ok()));
        });
        let got = rx.recv_timeout(std::time::Duration::from_secs(10)).expect("create_fresh blocked");
        assert_eq!(got, (true, true));
        assert!(std::fs::metadata(dir.path().join("attempt-2.log")).unwrap().is_file());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "t\n");
    }

    #[test]
    fn reading_refuses_fifos_links_and_files_of_other_accounts() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = Dir::create(&tmp.path().join("job")).unwrap();
        nix::unistd::mkfifo(&dir.path().join("fifo"), Mode::from_bits_truncate(0o666)).unwrap();
        let secret = tmp.path().join("secret");
        std::fs::write(&secret, "secret\n").unwrap();
        std::fs::hard_link(&secret, dir.path().join("hard")).unwrap();
        std::os::unix::fs::symlink(&secret, dir.path().join("soft")).unwrap();
        for name in ["fifo", "hard", "soft"] {
            let (tx, rx) = std::sync::mpsc::channel();
            let path = dir.path().to_path_buf();
            std::thread::spawn(move || {
                let _ = tx.send(
                    Dir::open(&path)
                        .unwrap()
                        .open_existing(name, false)
                        .map(|_| ())
                        .map_err(|e| e.to_string()),
                );
            });
            let got = rx.recv_timeout(std::time::Duration::from_secs(10)).expect("open_existing blocked");
            assert!(got.is_err(), "{name} was opened");
        }
        std::fs::write(dir.path().join("mine"), "ok\n").unwrap();
        let mut text = String::new();
        dir.open_existing("mine", false).unwrap().read_to_string(&mut text).unwrap();
        assert_eq!(text, "ok\n");
        if root() {
            // A regular file of one link another account owns, in a directory the agent owns.
            nix::unistd::chown(&dir.path().join("mine"), Some(65534.into()), None).unwrap();
            assert!(dir.open_existing("mine", false).is_err());
        }
    }

    #[test]
    fn a_subdir_is_never_a_link_nor_another_accounts() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = Dir::create(&tmp.path().join("job")).unwrap();
        let elsewhere = tmp.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, dir.path().join("checkpoint")).unwrap();
        let e = dir.subdir("checkpoint", None, 0o700).unwrap_err();
        assert!(e.to_string().contains("not a directory"), "{e}");
        let sub = dir.subdir("fresh", root().then(nobody), 0o700).unwrap();
        let meta = std::fs::metadata(sub.path()).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o700);
        if root() {
            assert_eq!(meta.uid(), 65534);
            // Someone else's directory is not given to another job's account.
            let e = dir.subdir("fresh", Some((65533, 65533)), 0o700).unwrap_err();
            assert!(e.to_string().contains("owned by uid 65534"), "{e}");
        }
        assert!(dir.subdir("..", None, 0o700).is_err());
    }
}

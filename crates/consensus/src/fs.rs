//! The file system beneath a replica's storage (the write-ahead log, its meta and commit
//! record, the snapshot): the operating system's (`OsFs`), or the deterministic simulation's
//! disk (`kairos-chaos`), so that the simulation's power cuts, torn writes and full disks hit
//! the production recovery code (`wal::Wal::open`, `store::LogStore::open`) and not a model
//! of it.
//!
//! Where the storage's blocking work runs is not the file system's business but an
//! executor's (`executor::Executor`), which the storage is given beside its file system.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// How a file is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// An existing file, read and written.
    Existing,
    /// A new file; an existing one is an error (`AlreadyExists`).
    New,
    /// Created when missing, kept as it is otherwise.
    Keep,
    /// Created when missing, emptied otherwise.
    Empty,
}

/// An open file: positioned reads and writes, and its sync.
pub trait FsFile: Send + Sync {
    fn write_at(&self, bytes: &[u8], offset: u64) -> io::Result<()>;
    /// Fills `bytes` from `offset` (`UnexpectedEof` past the end).
    fn read_at(&self, bytes: &mut [u8], offset: u64) -> io::Result<()>;
    fn size(&self) -> io::Result<u64>;
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Its data on disk (fdatasync).
    fn sync(&self) -> io::Result<()>;
    /// Starts writing a range to the disk and waits for it, best effort: keeps a large file
    /// from lying dirty in the page cache at once (the sync is what makes it durable).
    fn write_back(&self, _offset: u64, _len: u64) {}
}

/// The file calls storage makes.
pub trait Fs: Send + Sync {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    fn exists(&self, path: &Path) -> bool;
    /// The paths of the files in `dir`, in no particular order.
    fn list(&self, dir: &Path) -> io::Result<Vec<PathBuf>>;
    /// The whole of a file (`NotFound` when missing).
    fn read(&self, path: &Path) -> io::Result<Vec<u8>>;
    fn open(&self, path: &Path, mode: Mode) -> io::Result<Arc<dyn FsFile>>;
    fn remove(&self, path: &Path) -> io::Result<()>;
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// The directory's entries on disk (created, removed and renamed files).
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// Holds `dir` for this process while the returned guard lives (`WouldBlock`: another has it).
    fn lock(&self, dir: &Path) -> io::Result<Box<dyn Send + Sync>>;
}

/// The operating system's file system.
#[derive(Clone, Copy, Debug, Default)]
pub struct OsFs;

impl OsFs {
    pub fn shared() -> Arc<dyn Fs> {
        Arc::new(OsFs)
    }
}

impl FsFile for File {
    fn write_at(&self, bytes: &[u8], offset: u64) -> io::Result<()> {
        FileExt::write_all_at(self, bytes, offset)
    }

    fn read_at(&self, bytes: &mut [u8], offset: u64) -> io::Result<()> {
        FileExt::read_exact_at(self, bytes, offset)
    }

    fn size(&self) -> io::Result<u64> {
        Ok(self.metadata()?.len())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        File::set_len(self, len)
    }

    fn sync(&self) -> io::Result<()> {
        self.sync_data()
    }

    fn write_back(&self, offset: u64, len: u64) {
        use std::os::fd::AsRawFd;
        let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE
            | libc::SYNC_FILE_RANGE_WRITE
            | libc::SYNC_FILE_RANGE_WAIT_AFTER;
        // SAFETY: a range of a descriptor this file owns; best effort (a file system may not
        // support it).
        let _ = unsafe { libc::sync_file_range(self.as_raw_fd(), offset as i64, len as i64, flags) };
    }
}

impl Fs for OsFs {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        std::fs::create_dir_all(dir)
    }

    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        std::fs::read_dir(dir)?.map(|item| item.map(|i| i.path())).collect()
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        std::fs::read(path)
    }

    fn open(&self, path: &Path, mode: Mode) -> io::Result<Arc<dyn FsFile>> {
        let mut options = std::fs::OpenOptions::new();
        options.read(true).write(true);
        match mode {
            Mode::Existing => {}
            Mode::New => {
                options.create_new(true);
            }
            Mode::Keep => {
                options.create(true).truncate(false);
            }
            Mode::Empty => {
                options.create(true).truncate(true);
            }
        }
        Ok(Arc::new(options.open(path)?))
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }

    fn lock(&self, dir: &Path) -> io::Result<Box<dyn Send + Sync>> {
        use std::os::fd::AsRawFd;
        let file =
            std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(dir.join("LOCK"))?;
        // SAFETY: flock on a descriptor this function owns.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Box::new(file))
    }
}

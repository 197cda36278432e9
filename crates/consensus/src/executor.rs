//! Where the storage's blocking work runs: a write and its syncs, a snapshot's encoding, the
//! log's sync rounds. The operating system's executor (`Threads`) runs them on threads, off
//! the runtime's workers; the deterministic simulation's (`kairos-chaos`) on its one thread, in
//! virtual time. Storage is opened on a file system (`fs::Fs`) and an executor.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;

use crate::fs::FsFile;

/// Work that blocks (file writes, fsyncs, encoding).
pub type Work<T> = Box<dyn FnOnce() -> T + Send>;
/// A future the storage awaits.
pub type Pending<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Runs the storage's blocking work.
pub trait Executor: Send + Sync {
    /// Runs `work` (a write and its syncs) where it may block, and reports its result.
    fn blocking(&self, work: Work<io::Result<()>>) -> Pending<io::Result<()>>;
    /// Runs long CPU work (a snapshot's encoding) where it does not delay the replica's
    /// heartbeats; `work` reports through what it captures.
    fn background(&self, name: &str, work: Work<()>) -> io::Result<()>;
    /// Carries out a log's sync requests: each batch `queue` holds at a time goes to `round`.
    fn syncer(&self, queue: SyncQueue, round: Box<dyn FnMut(Vec<SyncJob>) + Send>) -> io::Result<()>;
}

/// Called once a sync request is on disk (or failed); runs where the syncs run.
pub type Done = Box<dyn FnOnce(io::Result<()>) + Send>;

/// One request to a log's sync thread: files to sync, whether their directory too, and whom
/// to tell.
pub struct SyncJob {
    pub(crate) files: Vec<Arc<dyn FsFile>>,
    pub(crate) dir: bool,
    pub(crate) done: Done,
}

/// The log's queue of sync requests.
pub type SyncQueue = tokio::sync::mpsc::UnboundedReceiver<SyncJob>;

/// The operating system's executor: blocking work on tokio's blocking pool, long work and the
/// sync rounds on threads of their own.
#[derive(Clone, Copy, Debug, Default)]
pub struct Threads;

impl Threads {
    pub fn shared() -> Arc<dyn Executor> {
        Arc::new(Threads)
    }
}

impl Executor for Threads {
    fn blocking(&self, work: Work<io::Result<()>>) -> Pending<io::Result<()>> {
        Box::pin(async move { tokio::task::spawn_blocking(work).await.map_err(io::Error::other)? })
    }

    /// A thread of its own at a lower CPU priority (nice 10, a per-thread attribute on Linux):
    /// encoding the snapshot of a large state takes a core for a second, and on a busy machine
    /// it must not delay heartbeats and appends into elections.
    fn background(&self, name: &str, work: Work<()>) -> io::Result<()> {
        let run = move || {
            // SAFETY: setpriority on the calling thread (who = 0), no memory involved.
            unsafe {
                libc::setpriority(libc::PRIO_PROCESS, 0, 10);
            }
            work()
        };
        std::thread::Builder::new().name(name.into()).spawn(run).map(|_| ())
    }

    fn syncer(&self, mut queue: SyncQueue, mut round: Box<dyn FnMut(Vec<SyncJob>) + Send>) -> io::Result<()> {
        // A thread of its own (at normal priority): fsyncs never hold up the runtime's workers.
        let run = move || {
            while let Some(first) = queue.blocking_recv() {
                let mut jobs = vec![first];
                while let Ok(job) = queue.try_recv() {
                    jobs.push(job);
                }
                round(jobs);
            }
        };
        std::thread::Builder::new().name("kairos-wal-sync".into()).spawn(run).map(|_| ())
    }
}

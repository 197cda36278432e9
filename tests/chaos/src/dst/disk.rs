//! The simulated disk: a small file system beneath the production storage
//! (`kairos_consensus::fs::Fs`, with an `executor::Executor` in virtual time), so the
//! replicas' real write-ahead log, meta and commit record (`store::LogStore`, `wal::Wal`) and
//! snapshots run on it, and the simulation's power cuts meet the production recovery code.
//!
//! Every file has what is on the platter (`durable`) and what reads see (`now`); a write, a
//! resize and a directory change (create, remove, rename) go to `now` at once and wait in the
//! page cache (`pending`, in order) until a sync of their file (or of their directory) puts
//! them on the platter. A crash loses the page cache — all of it, or (`survive`) a prefix of
//! it, with (`tear`) the next write half done. A full disk refuses writes and syncs (the
//! replica fails-stop, as `kairosd` exits on a storage error). Each opening of the disk is one
//! incarnation: a handle of an earlier one (a crashed replica's task still finishing a sync)
//! changes nothing. Syncs and meta writes take the disk's sync time, in virtual time.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kairos_consensus::executor::{Executor, Pending, SyncJob, SyncQueue, Work};
use kairos_consensus::fs::{Fs, FsFile, Mode};
use kairos_consensus::store::{LogStore, Snapshots, StateMachineStore};
use kairos_consensus::{wal, ConsensusError, ReplicaId};

/// The replica's data directory on its disk.
pub const DATA_DIR: &str = "/kairos";

#[derive(Clone, Debug, Default)]
struct Inode {
    durable: Vec<u8>,
    now: Vec<u8>,
}

/// A change waiting in the page cache.
#[derive(Clone, Debug)]
enum Change {
    Write {
        inode: u64,
        at: u64,
        bytes: Vec<u8>,
    },
    Resize {
        inode: u64,
        len: u64,
    },
    /// A directory entry: `path` names `inode`, or (None) nothing.
    Name {
        path: PathBuf,
        inode: Option<u64>,
    },
}

impl Change {
    fn inode(&self) -> Option<u64> {
        match self {
            Change::Write { inode, .. } | Change::Resize { inode, .. } => Some(*inode),
            Change::Name { .. } => None,
        }
    }
}

fn write_into(bytes: &mut Vec<u8>, at: u64, data: &[u8]) {
    let end = at as usize + data.len();
    if bytes.len() < end {
        bytes.resize(end, 0);
    }
    bytes[at as usize..end].copy_from_slice(data);
}

/// One replica's disk, shared by its incarnations.
#[derive(Debug, Default)]
pub struct DiskState {
    incarnation: u64,
    inodes: BTreeMap<u64, Inode>,
    next_inode: u64,
    /// The directory entries on the platter, and as they are now.
    durable_names: BTreeMap<PathBuf, u64>,
    names: BTreeMap<PathBuf, u64>,
    dirs: BTreeSet<PathBuf>,
    pending: Vec<Change>,
    /// How many of the pending changes were already pending at the previous sync: the kernel
    /// has written those back by the next (a lying disk writes back only those).
    lag: usize,
    pub full: bool,
    /// Opens whose recovery cut a torn tail off.
    pub torn_dropped: u64,
    /// Writes refused because the disk was full.
    pub refused: u64,
    /// Opens refused because the log was damaged below its commit record.
    pub damaged_refused: u64,
    /// Unsynced changes crashes lost.
    pub lost: u64,
}

impl DiskState {
    fn persist(&mut self, change: &Change) {
        match change {
            Change::Write { inode, at, bytes } => {
                if let Some(i) = self.inodes.get_mut(inode) {
                    write_into(&mut i.durable, *at, bytes);
                }
            }
            Change::Resize { inode, len } => {
                if let Some(i) = self.inodes.get_mut(inode) {
                    i.durable.resize(*len as usize, 0);
                }
            }
            Change::Name { path, inode: Some(inode) } => {
                self.durable_names.insert(path.clone(), *inode);
            }
            Change::Name { path, inode: None } => {
                self.durable_names.remove(path);
            }
        }
    }

    /// A sync: the pending changes `which` picks go on the platter (a lying disk's sync puts
    /// none there), and so do those pending since the previous sync (the kernel's writeback).
    fn flush(&mut self, lies: bool, which: impl Fn(&Change) -> bool) {
        let pending = std::mem::take(&mut self.pending);
        let old = self.lag.min(pending.len());
        for (n, change) in pending.into_iter().enumerate() {
            if n < old || (!lies && which(&change)) {
                self.persist(&change);
            } else {
                self.pending.push(change);
            }
        }
        self.lag = self.pending.len();
    }

    fn inode_of(&self, path: &Path) -> io::Result<u64> {
        self.names
            .get(path)
            .copied()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, path.display().to_string()))
    }

    fn name(&mut self, path: &Path, inode: Option<u64>) {
        match inode {
            Some(i) => self.names.insert(path.to_path_buf(), i),
            None => self.names.remove(path),
        };
        self.pending.push(Change::Name { path: path.to_path_buf(), inode });
    }

    /// The bytes of `path` on the platter.
    fn durable(&self, path: &Path) -> Option<&Vec<u8>> {
        self.durable_names.get(path).and_then(|i| self.inodes.get(i)).map(|i| &i.durable)
    }

    fn durable_mut(&mut self, path: &Path) -> Option<&mut Inode> {
        let inode = self.durable_names.get(path).copied()?;
        self.inodes.get_mut(&inode)
    }

    /// The log's segments on the platter, in order: (path, index of their first record).
    fn durable_segments(&self) -> Vec<(PathBuf, u64)> {
        let dir = Path::new(DATA_DIR).join(wal::DIR);
        let mut segments: Vec<(PathBuf, u64)> = self
            .durable_names
            .keys()
            .filter(|p| p.parent() == Some(dir.as_path()))
            .filter_map(|p| wal::segment_first(p).map(|first| (p.clone(), first)))
            .collect();
        segments.sort_by_key(|s| s.1);
        segments
    }

    /// The platter as it is: what reads see after a crash.
    fn reset_to_durable(&mut self) {
        self.names = self.durable_names.clone();
        let live: BTreeSet<u64> = self.names.values().copied().collect();
        self.inodes.retain(|i, _| live.contains(i));
        for inode in self.inodes.values_mut() {
            inode.now = inode.durable.clone();
        }
        self.pending.clear();
        self.lag = 0;
        self.incarnation += 1;
    }
}

/// A disk and how long a sync takes on it.
#[derive(Clone, Debug)]
pub struct Disk {
    pub state: Arc<Mutex<DiskState>>,
    pub sync_time: Duration,
    /// Log segments on it are this large (small: crashes meet logs of many segments).
    pub segment_bytes: u64,
    /// Broken on purpose (a test build): a sync is acknowledged before it is durable (a disk
    /// whose volatile cache lies).
    pub lies_about_syncs: bool,
    /// Broken on purpose (a test build): damage below the commit record is cut off at open, as
    /// the log's recovery did before it refused (committed entries are lost).
    pub cuts_damage: bool,
}

/// What a replica runs on: its log and state machine on the disk, opened for one incarnation.
pub struct Opened {
    pub log: LogStore,
    pub sm: StateMachineStore,
    pub applied: tokio::sync::watch::Receiver<u64>,
}

impl Disk {
    pub fn new(sync_time: Duration, segment_bytes: u64) -> Disk {
        Disk { state: Arc::default(), sync_time, segment_bytes, lies_about_syncs: false, cuts_damage: false }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, DiskState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A crash: the page cache is lost. With `survive` > 0, that many of the unsynced changes
    /// had reached the platter anyway; with `tear`, the next one (a write) did only in part.
    pub fn crash(&self, survive: usize, tear: bool) {
        let mut d = self.lock();
        let pending = std::mem::take(&mut d.pending);
        let survive = survive.min(pending.len());
        d.lost += (pending.len() - survive) as u64;
        for change in &pending[..survive] {
            d.persist(change);
        }
        if let (true, Some(Change::Write { inode, at, bytes })) = (tear, pending.get(survive)) {
            let half = Change::Write { inode: *inode, at: *at, bytes: bytes[..bytes.len() / 2].to_vec() };
            d.persist(&half);
        }
        d.reset_to_durable();
    }

    /// Unsynced changes now.
    pub fn unsynced(&self) -> usize {
        self.lock().pending.len()
    }

    /// Where the unsynced writes to log segments are among the unsynced changes.
    pub fn log_writes_in_flight(&self) -> Vec<usize> {
        let d = self.lock();
        let segments: BTreeSet<u64> =
            d.names.iter().filter(|(p, _)| wal::segment_first(p).is_some()).map(|(_, i)| *i).collect();
        let writes = d.pending.iter().enumerate();
        writes
            .filter(|(_, c)| matches!(c, Change::Write { inode, .. } if segments.contains(inode)))
            .map(|(n, _)| n)
            .collect()
    }

    /// Wipes the disk (a replica removed from the cluster and later added back empty).
    pub fn wipe(&self) {
        let mut d = self.lock();
        d.inodes.clear();
        d.durable_names.clear();
        d.dirs.clear();
        d.reset_to_durable();
    }

    /// Opens the disk for a new incarnation of its replica: the production storage's own
    /// recovery runs on it (a torn tail is cut off; damage at or below the commit record
    /// refuses the open and changes nothing, and the replica must be re-added empty).
    pub fn open(&self, id: ReplicaId) -> Result<Opened, String> {
        if self.cuts_damage {
            self.cut_at_damage();
        }
        let fs = self.incarnation();
        let dir = Path::new(DATA_DIR);
        let log = match LogStore::open_on(fs.clone(), self.executor(), dir, id, self.segment_bytes) {
            Ok(log) => log,
            Err(e) => {
                if matches!(e, ConsensusError::Damaged { .. }) {
                    self.lock().damaged_refused += 1;
                }
                return Err(e.to_string());
            }
        };
        if log.recovery().cut_bytes > 0 {
            self.lock().torn_dropped += 1;
        }
        let (applied_tx, applied) = tokio::sync::watch::channel(0);
        let sm = StateMachineStore::on(Snapshots::on(fs, self.executor(), dir), applied_tx)
            .map_err(|e| e.to_string())?;
        Ok(Opened { log, sm, applied })
    }

    /// Where the storage on this disk runs its blocking work: in virtual time, each sync taking
    /// the disk's sync time.
    fn executor(&self) -> Arc<dyn Executor> {
        Arc::new(SimExecutor { sync_time: self.sync_time })
    }

    /// A new incarnation's file system (what reads see: the platter).
    fn incarnation(&self) -> Arc<dyn Fs> {
        let mut d = self.lock();
        d.reset_to_durable();
        Arc::new(SimFs { disk: self.clone(), incarnation: d.incarnation })
    }

    /// The commit record's and the purge point's indexes on the platter.
    fn durable_marks(d: &DiskState) -> (u64, u64) {
        let log = Path::new(DATA_DIR).join(wal::DIR);
        let committed =
            d.durable(&log.join("committed")).and_then(|b| kairos_consensus::store::committed_index(b));
        let purged = d.durable(&log.join("meta")).and_then(|b| kairos_consensus::store::purged_index(b));
        (committed.unwrap_or(0), purged.unwrap_or(0))
    }

    /// Bit rot (the fault `bit_rot`): a committed entry of the log on the platter, after the
    /// purge point and other than the last one, chosen by `pick`, no longer passes its check.
    /// False when there is none.
    pub fn rot(&self, pick: u64) -> bool {
        let mut guard = self.lock();
        let d = &mut *guard;
        let (committed, purged) = Disk::durable_marks(d);
        let mut records: Vec<(PathBuf, u64, std::ops::Range<u64>)> = Vec::new();
        for (path, first) in d.durable_segments() {
            if let Some(bytes) = d.durable(&path) {
                records.extend(wal::records(bytes, first).0.into_iter().map(|(i, r)| (path.clone(), i, r)));
            }
        }
        records.pop();
        records.retain(|(_, i, _)| *i > purged && *i <= committed);
        let Some((path, _, span)) = records.get(pick as usize % records.len().max(1)).cloned() else {
            return false;
        };
        let Some(inode) = d.durable_mut(&path) else { return false };
        // The first byte of its payload: its checksum fails.
        let at = span.start as usize + 16;
        inode.durable[at] ^= 0x40;
        inode.now = inode.durable.clone();
        true
    }

    /// The broken recovery (`cuts_damage`): the log is cut at its first record that fails its
    /// check, whatever the commit record says, and the commit record goes.
    fn cut_at_damage(&self) {
        let mut guard = self.lock();
        let d = &mut *guard;
        let mut cut = false;
        for (path, first) in d.durable_segments() {
            let Some(inode) = d.durable_mut(&path) else { continue };
            if cut {
                d.durable_names.remove(&path);
                continue;
            }
            let (_, valid) = wal::records(&inode.durable, first);
            if valid > 0 && (valid as usize) < inode.durable.len() {
                inode.durable.truncate(valid as usize);
                cut = true;
            }
        }
        if cut {
            d.durable_names.remove(&Path::new(DATA_DIR).join(wal::DIR).join("committed"));
        }
        d.reset_to_durable();
    }
}

/// One incarnation's view of its disk.
struct SimFs {
    disk: Disk,
    incarnation: u64,
}

impl SimFs {
    /// The disk, when this incarnation may change it now (not crashed, not full).
    fn writable(&self) -> io::Result<std::sync::MutexGuard<'_, DiskState>> {
        writable(&self.disk, self.incarnation)
    }
}

fn writable(disk: &Disk, incarnation: u64) -> io::Result<std::sync::MutexGuard<'_, DiskState>> {
    let mut d = disk.lock();
    if d.incarnation != incarnation {
        return Err(io::Error::other("this incarnation crashed"));
    }
    if d.full {
        d.refused += 1;
        return Err(io::Error::other("No space left on device"));
    }
    Ok(d)
}

struct SimFile {
    disk: Disk,
    incarnation: u64,
    inode: u64,
}

impl FsFile for SimFile {
    fn write_at(&self, bytes: &[u8], offset: u64) -> io::Result<()> {
        let mut d = writable(&self.disk, self.incarnation)?;
        if let Some(i) = d.inodes.get_mut(&self.inode) {
            write_into(&mut i.now, offset, bytes);
        }
        d.pending.push(Change::Write { inode: self.inode, at: offset, bytes: bytes.to_vec() });
        Ok(())
    }

    fn read_at(&self, bytes: &mut [u8], offset: u64) -> io::Result<()> {
        let d = self.disk.lock();
        let now = d.inodes.get(&self.inode).map(|i| &i.now[..]).unwrap_or_default();
        let source = now
            .get(offset as usize..offset as usize + bytes.len())
            .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "read past the end"))?;
        bytes.copy_from_slice(source);
        Ok(())
    }

    fn size(&self) -> io::Result<u64> {
        Ok(self.disk.lock().inodes.get(&self.inode).map_or(0, |i| i.now.len() as u64))
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut d = writable(&self.disk, self.incarnation)?;
        if let Some(i) = d.inodes.get_mut(&self.inode) {
            i.now.resize(len as usize, 0);
        }
        d.pending.push(Change::Resize { inode: self.inode, len });
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        let mut d = writable(&self.disk, self.incarnation)?;
        d.flush(self.disk.lies_about_syncs, |c| c.inode() == Some(self.inode));
        Ok(())
    }
}

impl Fs for SimFs {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        let mut d = self.writable()?;
        d.dirs.extend(dir.ancestors().map(Path::to_path_buf));
        Ok(())
    }

    fn exists(&self, path: &Path) -> bool {
        let d = self.disk.lock();
        d.names.contains_key(path) || d.dirs.contains(path)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        let d = self.disk.lock();
        Ok(d.names.keys().filter(|p| p.parent() == Some(dir)).cloned().collect())
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        let d = self.disk.lock();
        let inode = d.inode_of(path)?;
        Ok(d.inodes.get(&inode).map(|i| i.now.clone()).unwrap_or_default())
    }

    fn open(&self, path: &Path, mode: Mode) -> io::Result<Arc<dyn FsFile>> {
        let mut d = self.writable()?;
        let inode = match (d.names.get(path).copied(), mode) {
            (Some(_), Mode::New) => {
                return Err(io::Error::new(io::ErrorKind::AlreadyExists, path.display().to_string()))
            }
            (None, Mode::Existing) => {
                return Err(io::Error::new(io::ErrorKind::NotFound, path.display().to_string()))
            }
            (Some(inode), _) => inode,
            (None, _) => {
                d.next_inode += 1;
                let inode = d.next_inode;
                d.inodes.insert(inode, Inode::default());
                d.name(path, Some(inode));
                inode
            }
        };
        drop(d);
        let file = SimFile { disk: self.disk.clone(), incarnation: self.incarnation, inode };
        if mode == Mode::Empty {
            file.set_len(0)?;
        }
        Ok(Arc::new(file))
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        let mut d = self.writable()?;
        d.inode_of(path)?;
        d.name(path, None);
        Ok(())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut d = self.writable()?;
        let inode = d.inode_of(from)?;
        d.name(to, Some(inode));
        d.name(from, None);
        Ok(())
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut d = self.writable()?;
        d.flush(
            self.disk.lies_about_syncs,
            |c| matches!(c, Change::Name { path, .. } if path.parent() == Some(dir)),
        );
        Ok(())
    }

    fn lock(&self, _dir: &Path) -> io::Result<Box<dyn Send + Sync>> {
        Ok(Box::new(()))
    }
}

/// The simulation's executor: on its one thread, in virtual time.
struct SimExecutor {
    sync_time: Duration,
}

impl Executor for SimExecutor {
    fn blocking(&self, work: Work<io::Result<()>>) -> Pending<io::Result<()>> {
        let sync_time = self.sync_time;
        Box::pin(async move {
            tokio::time::sleep(sync_time).await;
            work()
        })
    }

    fn background(&self, _name: &str, work: Work<()>) -> io::Result<()> {
        work();
        Ok(())
    }

    fn syncer(&self, mut queue: SyncQueue, mut round: Box<dyn FnMut(Vec<SyncJob>) + Send>) -> io::Result<()> {
        let sync_time = self.sync_time;
        tokio::spawn(async move {
            while let Some(first) = queue.recv().await {
                let mut jobs = vec![first];
                while let Ok(job) = queue.try_recv() {
                    jobs.push(job);
                }
                tokio::time::sleep(sync_time).await;
                round(jobs);
            }
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests;

//! Raft storage: the log and vote (`LogStore`, on the write-ahead log of `wal`), and the state
//! machine with its snapshots (`StateMachineStore`).
//!
//! Durability: an append is reported done only once its records are fsync'd (`wal`'s sync
//! thread, one fdatasync for every append queued meanwhile); a truncation, a purge and a vote
//! are durable before they return. The vote and the purge point live in `raft.log/meta`,
//! replaced atomically (temporary file, fsync, rename, directory fsync). The committed log id
//! is kept in `raft.log/committed` without an fsync of its own — a stale or missing one after a
//! crash is allowed (the tail is re-committed by the next leader) — so a restarted replica
//! re-applies its committed tail at once instead of waiting for a leader. It is written only
//! for entries already on disk (`Wal::durable_last`), so it is never ahead of the log a crash
//! leaves: one that is ahead of the recovered log means acknowledged entries are gone, and the
//! replica refuses to start (`Damaged`) rather than serve a log that lost committed writes. The state machine lives in memory; its durable form is the latest
//! snapshot plus the log after it.
//!
//! Snapshots are files in the data directory (`snapshot`, written to a temporary file,
//! fsync'd, renamed, directory fsync'd), encoded on a thread of their own at low CPU priority. The file is a JSON line of metadata followed by the
//! snapshot bytes.

// openraft's traits fix `StorageError` as the error type; its size is not ours to choose.
#![allow(clippy::result_large_err)]

use std::fmt::Debug;
use std::io::Cursor;
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use crate::executor::{Executor, Threads};
use crate::fs::{Fs, FsFile, Mode};

use kairos_scheduler::clock::Stamp;
use kairos_scheduler::ClusterState;
use openraft::storage::{LogFlushed, LogState, RaftLogStorage, RaftStateMachine, Snapshot};
use openraft::{
    Entry, EntryPayload, LogId, OptionalSend, RaftLogReader, RaftSnapshotBuilder, SnapshotMeta, StorageError,
    StorageIOError, StoredMembership, Vote,
};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::types::{ConsensusError, NodeId, Response, TypeConfig, SNAPSHOT_FORMAT_VERSION};

type StorageResult<T> = Result<T, StorageError<NodeId>>;

const SNAPSHOT_FILE: &str = "snapshot";
const SNAPSHOT_TMP: &str = "snapshot.tmp";
/// The sled database of kairosd versions before the write-ahead log (refused at open).
pub(crate) const SLED_DIR: &str = "raft.sled";
const META_FILE: &str = "meta";
const META_TMP: &str = "meta.tmp";
const COMMITTED_FILE: &str = "committed";

fn read_err(e: impl std::error::Error + 'static) -> StorageError<NodeId> {
    crate::failstop::storage_failed(&format!("reading: {e}"));
    StorageIOError::read(&e).into()
}

fn write_err(e: impl std::error::Error + 'static) -> StorageError<NodeId> {
    crate::failstop::storage_failed(&format!("writing: {e}"));
    StorageIOError::write(&e).into()
}

/// What must survive a crash besides the entries: the vote and the purge point.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct LogMeta {
    vote: Option<Vote<NodeId>>,
    last_purged: Option<LogId<NodeId>>,
}

/// Replaces `dir/name` with `bytes` atomically and durably: a temporary file `tmp` written in
/// pieces (each pushed to the disk before the next, `FsFile::write_back`), synced, renamed over
/// it, the directory synced.
fn replace_file(fs: &dyn Fs, dir: &Path, tmp: &str, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    const PIECE: usize = 4 << 20;
    let path = dir.join(tmp);
    let f = fs.open(&path, Mode::Empty)?;
    let mut at = 0u64;
    for piece in bytes.chunks(PIECE) {
        f.write_at(piece, at)?;
        f.write_back(at, piece.len() as u64);
        at += piece.len() as u64;
    }
    f.sync()?;
    fs.rename(&path, &dir.join(name))?;
    fs.sync_dir(dir)
}

/// Replaces `dir/meta` with `meta`, durably.
fn write_meta(fs: &dyn Fs, dir: &Path, meta: &LogMeta) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(meta).map_err(std::io::Error::other)?;
    replace_file(fs, dir, META_TMP, META_FILE, &bytes)
}

fn read_meta(fs: &dyn Fs, dir: &Path) -> Result<LogMeta, ConsensusError> {
    match fs.read(&dir.join(META_FILE)) {
        Ok(bytes) => Ok(serde_json::from_slice(&bytes)?),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(LogMeta::default()),
        Err(e) => Err(ConsensusError::Format(format!("reading the log's meta: {e}"))),
    }
}

/// The commit record, written only for entries on disk: a commit of entries still being synced
/// waits (`pending`) and is written once their sync completes (`synced`).
struct CommitRecord {
    file: Arc<dyn FsFile>,
    pending: Mutex<Option<LogId<NodeId>>>,
}

impl CommitRecord {
    fn pending(&self) -> std::sync::MutexGuard<'_, Option<LogId<NodeId>>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records `committed` now if the log is on disk through it (`durable`), or once it is.
    fn save(&self, committed: Option<LogId<NodeId>>, durable: Option<u64>) -> std::io::Result<()> {
        let mut pending = self.pending();
        if let Some(c) = committed.filter(|c| durable.is_none_or(|d| c.index > d)) {
            *pending = Some(c);
            return Ok(());
        }
        *pending = None;
        // No fsync of its own (see the module's description).
        self.file.write_at(&encode_committed(&committed), 0)
    }

    /// The log is on disk through `durable`: a commit waiting for that is written.
    fn synced(&self, durable: Option<u64>) {
        let mut pending = self.pending();
        if let Some(c) = pending.filter(|c| durable.is_some_and(|d| c.index <= d)) {
            *pending = None;
            if let Err(e) = self.file.write_at(&encode_committed(&Some(c)), 0) {
                tracing::warn!(error = %e, "cannot write the commit record");
            }
        }
    }
}

/// The commit record `file` holds (None: none, or torn).
fn read_committed_file(file: &dyn FsFile) -> std::io::Result<Option<LogId<NodeId>>> {
    let len = file.size()?;
    let mut bytes = vec![0u8; len.min(4096) as usize];
    file.read_at(&mut bytes, 0)?;
    Ok(decode_committed(&bytes))
}

/// The index a commit record's bytes name (None: none, or torn): for tools that look at a
/// log's files (the simulation's disk).
pub fn committed_index(bytes: &[u8]) -> Option<u64> {
    decode_committed(bytes).map(|c| c.index)
}

/// The purge point a log meta file's bytes name (None: none, or unreadable).
pub fn purged_index(bytes: &[u8]) -> Option<u64> {
    serde_json::from_slice::<LogMeta>(bytes).ok()?.last_purged.map(|p| p.index)
}

/// The committed log id as `committed` holds it: length, checksum, JSON (None when torn).
fn decode_committed(bytes: &[u8]) -> Option<LogId<NodeId>> {
    let len = u32::from_le_bytes(bytes.get(..4)?.try_into().ok()?) as usize;
    let crc = u32::from_le_bytes(bytes.get(4..8)?.try_into().ok()?);
    let body = bytes.get(8..8 + len)?;
    (crc32fast::hash(body) == crc).then(|| serde_json::from_slice(body).ok()).flatten()
}

fn encode_committed(committed: &Option<LogId<NodeId>>) -> Vec<u8> {
    let body = serde_json::to_vec(committed).unwrap_or_default();
    let mut out = Vec::with_capacity(body.len() + 8);
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

/// The latest entries as appended, decoded: the leader reads each entry back once per follower
/// it replicates to and once to apply it, a follower once to apply it — from here, not from
/// the disk and a JSON decode. Mirrors the log exactly (appends, truncations and purges go
/// through it); bounded by `CACHE_ENTRIES` and `CACHE_BYTES` (encoded size), oldest dropped.
#[derive(Default)]
struct EntryCache {
    entries: std::collections::VecDeque<(Entry<TypeConfig>, usize)>,
    bytes: usize,
}

const CACHE_ENTRIES: usize = 1024;
const CACHE_BYTES: usize = 16 << 20;

impl EntryCache {
    fn push(&mut self, entry: Entry<TypeConfig>, size: usize) {
        if self.entries.back().is_some_and(|(e, _)| e.log_id.index + 1 != entry.log_id.index) {
            self.clear();
        }
        self.entries.push_back((entry, size));
        self.bytes += size;
        while self.entries.len() > CACHE_ENTRIES || self.bytes > CACHE_BYTES {
            match self.entries.pop_front() {
                Some((_, size)) => self.bytes -= size,
                None => break,
            }
        }
    }

    fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
    }

    /// Drops the entries from `index` on.
    fn truncate(&mut self, index: u64) {
        while self.entries.back().is_some_and(|(e, _)| e.log_id.index >= index) {
            if let Some((_, size)) = self.entries.pop_back() {
                self.bytes -= size;
            }
        }
    }

    /// Drops the entries up to `index`.
    fn purge(&mut self, index: u64) {
        while self.entries.front().is_some_and(|(e, _)| e.log_id.index <= index) {
            if let Some((_, size)) = self.entries.pop_front() {
                self.bytes -= size;
            }
        }
    }

    /// The entries `start..end`, when all of them are here; only those that fit `budget`
    /// encoded bytes (the first always) when they are more.
    fn get(&self, start: u64, end: u64, budget: u64) -> Option<Vec<Entry<TypeConfig>>> {
        let first = self.entries.front()?.0.log_id.index;
        if start < first || start >= end || start - first >= self.entries.len() as u64 {
            return None;
        }
        let mut out = Vec::new();
        let mut used = 0u64;
        for (entry, size) in self.entries.range((start - first) as usize..) {
            if entry.log_id.index >= end {
                return Some(out);
            }
            used = used.saturating_add(*size as u64);
            if used > budget && !out.is_empty() {
                return Some(out);
            }
            out.push(entry.clone());
        }
        // Ran out before `end`: the rest is only on disk.
        (out.last().map(|e| e.log_id.index + 1) == Some(end)).then_some(out)
    }
}

/// The Raft log and vote on the write-ahead log.
#[derive(Clone)]
pub struct LogStore {
    fs: Arc<dyn Fs>,
    executor: Arc<dyn Executor>,
    wal: Arc<crate::wal::Wal>,
    recovery: crate::wal::Recovery,
    cache: Arc<Mutex<EntryCache>>,
    meta: Arc<Mutex<LogMeta>>,
    commit_record: Arc<CommitRecord>,
    /// The latest committed index openraft told us about, for status reports.
    committed: Arc<std::sync::atomic::AtomicU64>,
}

impl LogStore {
    /// Opens (creating when missing) the log of the replica whose data directory is
    /// `data_dir`, repairing what a crash left (`wal::Wal::open`).
    pub fn open(data_dir: &Path, id: NodeId) -> Result<Self, ConsensusError> {
        LogStore::open_on(
            crate::fs::OsFs::shared(),
            Threads::shared(),
            data_dir,
            id,
            crate::wal::SEGMENT_BYTES,
        )
    }

    /// `open` on the file system `fs`, running blocking work on `executor`, with log segments
    /// of `segment_bytes`.
    pub fn open_on(
        fs: Arc<dyn Fs>,
        executor: Arc<dyn Executor>,
        data_dir: &Path,
        id: NodeId,
        segment_bytes: u64,
    ) -> Result<Self, ConsensusError> {
        if fs.exists(&data_dir.join(SLED_DIR)) {
            return Err(ConsensusError::Format(format!(
                "{} holds the Raft log of an earlier kairosd (raft.sled), which this version does not \
                 read: start this replica empty with --join and add it back (kairos cluster remove {id}, \
                 then kairos cluster add {id} ADDR), or restore the cluster from a backup (--restore-from)",
                data_dir.display()
            )));
        }
        let dir = data_dir.join(crate::wal::DIR);
        let meta = read_meta(fs.as_ref(), &dir)?;
        // The commit record is never written ahead of what is on disk: the log's recovery may
        // not remove anything it covers (acknowledged entries would be lost).
        let committed = match fs.read(&dir.join(COMMITTED_FILE)) {
            Ok(bytes) => decode_committed(&bytes),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(ConsensusError::Format(format!("reading the commit record: {e}"))),
        };
        let purged = meta.last_purged.map(|l| l.index);
        let (wal, recovery) = crate::wal::Wal::open_on(
            fs.clone(),
            executor.clone(),
            &dir,
            segment_bytes,
            purged,
            committed.map(|c| c.index),
        )
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::WouldBlock => ConsensusError::DataDirInUse(data_dir.display().to_string()),
            std::io::ErrorKind::InvalidData => {
                ConsensusError::Damaged { dir: dir.display().to_string(), why: e.to_string(), id }
            }
            _ => ConsensusError::Format(format!("opening the log in {}: {e}", dir.display())),
        })?;
        if recovery != crate::wal::Recovery::default() {
            tracing::warn!(
                cut_bytes = recovery.cut_bytes,
                removed_segments = recovery.removed_segments,
                "the log ended in writes that never completed (a crash); they were cut off"
            );
        }
        let committed_file = fs
            .open(&dir.join(COMMITTED_FILE), Mode::Keep)
            .map_err(|e| ConsensusError::Format(format!("opening the commit record: {e}")))?;
        Ok(LogStore {
            fs,
            executor,
            wal: Arc::new(wal),
            recovery,
            cache: Arc::default(),
            meta: Arc::new(Mutex::new(meta)),
            commit_record: Arc::new(CommitRecord { file: committed_file, pending: Mutex::new(None) }),
            committed: Arc::default(),
        })
    }

    /// What opening the log repaired (a torn tail cut off, segments removed).
    pub fn recovery(&self) -> &crate::wal::Recovery {
        &self.recovery
    }

    /// A handle that always holds the latest known commit index.
    pub fn commit_index(&self) -> Arc<std::sync::atomic::AtomicU64> {
        self.committed.clone()
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, EntryCache> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn meta(&self) -> LogMeta {
        self.meta.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Changes the stored meta durably (where the file system blocks: two fsyncs).
    async fn update_meta(&self, change: impl FnOnce(&mut LogMeta)) -> StorageResult<()> {
        let mut meta = self.meta();
        change(&mut meta);
        let dir = self.wal.dir().to_path_buf();
        let written = meta.clone();
        let fs = self.fs.clone();
        self.executor
            .blocking(Box::new(move || write_meta(fs.as_ref(), &dir, &written)))
            .await
            .map_err(write_err)?;
        *self.meta.lock().unwrap_or_else(|p| p.into_inner()) = meta;
        Ok(())
    }

    /// Runs a log operation that reports through a `wal::Done` and waits for it.
    async fn durably(&self, op: impl FnOnce(crate::wal::Done) -> std::io::Result<()>) -> StorageResult<()> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        op(Box::new(move |r| {
            let _ = tx.send(r);
        }))
        .map_err(write_err)?;
        rx.await.map_err(|e| write_err(std::io::Error::other(e)))?.map_err(write_err)
    }
}

fn decode_entry(bytes: &[u8]) -> StorageResult<Entry<TypeConfig>> {
    serde_json::from_slice(bytes).map_err(read_err)
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> StorageResult<Vec<Entry<TypeConfig>>> {
        use std::ops::Bound;
        let start = match range.start_bound() {
            Bound::Included(i) => *i,
            Bound::Excluded(i) => i.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(i) => i.saturating_add(1),
            Bound::Excluded(i) => *i,
            Bound::Unbounded => u64::MAX,
        };
        self.entries_within(start, end, u64::MAX)
    }

    /// Replication's reads: at most `APPEND_BYTES_BUDGET` of entries (at least one). A follower
    /// far behind on large entries is sent what one append can carry within its deadline, not
    /// `max_payload_entries` entries read, decoded and encoded again on every retry (after a
    /// restart, with nothing cached, that alone outlasted the deadline: it never caught up).
    ///
    /// A start the log purged meanwhile (a snapshot compacted it while a follower lagged) gets
    /// nothing, not the entries after the purge point: openraft would send those after a
    /// `prev_log_id` they do not follow, and the follower panics on the gap (found by the
    /// simulation: `kairos-chaos --replay 4222573324348974750`). Empty, openraft sends a
    /// heartbeat, looks again, and sends a snapshot.
    async fn limited_get_log_entries(
        &mut self,
        start: u64,
        end: u64,
    ) -> StorageResult<Vec<Entry<TypeConfig>>> {
        if self.meta().last_purged.is_some_and(|p| start <= p.index) {
            return Ok(Vec::new());
        }
        self.entries_within(start, end, crate::network::APPEND_BYTES_BUDGET as u64)
    }
}

impl LogStore {
    /// The entries of `start..end` the log holds, stopping before the one that would take them
    /// past `budget` encoded bytes (the first always comes).
    fn entries_within(&self, start: u64, end: u64, budget: u64) -> StorageResult<Vec<Entry<TypeConfig>>> {
        // Purged entries may linger in a segment that also holds later ones: never served.
        let start = match self.meta().last_purged {
            Some(p) => start.max(p.index.saturating_add(1)),
            None => start,
        };
        let end = match self.wal.bounds() {
            Some((_, last)) => end.min(last.saturating_add(1)),
            None => return Ok(Vec::new()),
        };
        if let Some(entries) = self.cache().get(start, end, budget) {
            return Ok(entries);
        }
        let records = self.wal.read_within(start, end, budget).map_err(read_err)?;
        records.iter().map(|(_, bytes)| decode_entry(bytes)).collect()
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> StorageResult<LogState<TypeConfig>> {
        let last_purged = self.meta().last_purged;
        let last = match self.wal.bounds() {
            Some((_, last)) => match self.wal.read(last, last + 1).map_err(read_err)?.first() {
                Some((_, bytes)) => Some(decode_entry(bytes)?.log_id),
                None => last_purged,
            },
            None => last_purged,
        };
        // Entries at or below the purge point may linger in a segment: they do not count.
        let last = last.max(last_purged);
        Ok(LogState { last_purged_log_id: last_purged, last_log_id: last })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> StorageResult<()> {
        // Durable before the vote is acknowledged.
        let vote = *vote;
        self.update_meta(|m| m.vote = Some(vote)).await
    }

    async fn read_vote(&mut self) -> StorageResult<Option<Vote<NodeId>>> {
        Ok(self.meta().vote)
    }

    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> StorageResult<()> {
        if let Some(c) = committed {
            self.committed.fetch_max(c.index, std::sync::atomic::Ordering::Relaxed);
        }
        // Only for entries on disk (what a snapshot covers counts; see the module's description).
        let durable = self.wal.durable_last().max(self.meta().last_purged.map(|p| p.index));
        self.commit_record.save(committed, durable).map_err(write_err)
    }

    async fn read_committed(&mut self) -> StorageResult<Option<LogId<NodeId>>> {
        let committed = read_committed_file(self.commit_record.file.as_ref()).map_err(read_err)?;
        // `open` refused a record ahead of the log; one ahead now was written after it.
        let held = self.wal.bounds().map(|(_, last)| last).max(self.meta().last_purged.map(|p| p.index));
        Ok(committed.filter(|c| held.is_some_and(|last| c.index <= last)))
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> StorageResult<()>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut records = Vec::new();
        let mut cached = Vec::new();
        for entry in entries {
            let bytes = serde_json::to_vec(&entry).map_err(write_err)?;
            cached.push((entry.clone(), bytes.len()));
            records.push((entry.log_id.index, bytes));
        }
        // Readable now; appended once on disk (the sync thread calls back), and then a commit
        // that waited for these entries is recorded.
        let (wal, record) = (self.wal.clone(), self.commit_record.clone());
        let done = Box::new(move |result: std::io::Result<()>| {
            if result.is_ok() {
                record.synced(wal.durable_last());
            }
            callback.log_io_completed(result)
        });
        self.wal.append(&records, done).map_err(write_err)?;
        let mut cache = self.cache();
        for (entry, size) in cached {
            cache.push(entry, size);
        }
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> StorageResult<()> {
        self.cache().truncate(log_id.index);
        let wal = self.wal.clone();
        self.durably(|done| wal.truncate(log_id.index, done)).await
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> StorageResult<()> {
        // Record the purge point first: a crash in between leaves extra entries, never a hole.
        self.update_meta(|m| m.last_purged = Some(log_id)).await?;
        self.cache().purge(log_id.index);
        let wal = self.wal.clone();
        self.durably(|done| wal.purge(log_id.index, done)).await
    }
}

/// The applied state, shared with the server's read paths.
#[derive(Debug, Default)]
pub struct Applied {
    pub state: ClusterState,
    pub last_applied: Option<LogId<NodeId>>,
    pub membership: StoredMembership<NodeId, openraft::BasicNode>,
}

pub type SharedState = Arc<RwLock<Applied>>;

/// The persistent form of a snapshot. Versioned: a replica refuses a format it does not know.
#[derive(Serialize, Deserialize)]
struct SnapshotFile {
    format: u32,
    state: ClusterState,
}

struct StoredSnapshot {
    meta: SnapshotMeta<NodeId, openraft::BasicNode>,
    data: Vec<u8>,
}

impl StoredSnapshot {
    fn encode(&self) -> Result<Vec<u8>, serde_json::Error> {
        let mut out = serde_json::to_vec(&self.meta)?;
        out.push(b'\n');
        out.extend_from_slice(&self.data);
        Ok(out)
    }

    fn decode(bytes: &[u8]) -> Result<Self, ConsensusError> {
        let split = bytes
            .iter()
            .position(|b| *b == b'\n')
            .ok_or_else(|| ConsensusError::Format("snapshot file has no metadata line".into()))?;
        let meta = serde_json::from_slice(&bytes[..split])?;
        Ok(StoredSnapshot { meta, data: bytes[split + 1..].to_vec() })
    }
}

/// Where snapshots are kept: the file `snapshot` in the replica's data directory, replaced
/// whole, durably, before a write returns.
#[derive(Clone)]
pub struct Snapshots {
    fs: Arc<dyn Fs>,
    executor: Arc<dyn Executor>,
    dir: PathBuf,
}

impl Snapshots {
    /// Snapshots in `dir` on the file system `fs`, written and encoded on `executor`.
    pub fn on(fs: Arc<dyn Fs>, executor: Arc<dyn Executor>, dir: &Path) -> Snapshots {
        Snapshots { fs, executor, dir: dir.to_path_buf() }
    }

    fn read(&self) -> Result<Option<StoredSnapshot>, ConsensusError> {
        match self.fs.read(&self.dir.join(SNAPSHOT_FILE)) {
            Ok(bytes) => Ok(Some(StoredSnapshot::decode(&bytes)?)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(ConsensusError::Format(format!("reading the snapshot: {e}"))),
        }
    }

    /// Written in pieces, each pushed to the disk before the next is written, so a snapshot of
    /// tens of megabytes never lies dirty in the page cache at once: its final fsync would have
    /// every log fsync of the moment wait behind it (ext4 commits them in one journal
    /// transaction), stalling appends and heartbeats into elections.
    async fn write(&self, bytes: Vec<u8>) -> std::io::Result<()> {
        let (fs, dir) = (self.fs.clone(), self.dir.clone());
        self.executor
            .blocking(Box::new(move || replace_file(fs.as_ref(), &dir, SNAPSHOT_TMP, SNAPSHOT_FILE, &bytes)))
            .await
    }
}

/// The scheduling core as openraft's state machine, with snapshots kept as files.
#[derive(Clone)]
pub struct StateMachineStore {
    snapshots: Snapshots,
    shared: SharedState,
    applied_tx: watch::Sender<u64>,
    clock: ClockSeen,
}

/// The latest stamp this replica applied (`ClusterState::now_ms`) and when, on its monotonic
/// clock: what `Replica::clock_ms` extrapolates from (`kairos_scheduler::clock`).
pub type ClockSeen = Arc<std::sync::Mutex<Option<(Stamp, tokio::time::Instant)>>>;

fn saw(clock: &ClockSeen, state: &ClusterState) {
    let stamp = Stamp { now_ms: state.now_ms, skipped_ms: state.skipped_ms };
    let mut seen = clock.lock().unwrap_or_else(|p| p.into_inner());
    if stamp.now_ms > 0 && seen.is_none_or(|(t, _)| stamp != t) {
        *seen = Some((stamp, tokio::time::Instant::now()));
    }
}

impl StateMachineStore {
    /// Opens the store, loading the latest snapshot when there is one.
    pub fn new(dir: &std::path::Path, applied_tx: watch::Sender<u64>) -> Result<Self, ConsensusError> {
        Self::on(Snapshots::on(crate::fs::OsFs::shared(), Threads::shared(), dir), applied_tx)
    }

    /// Opens the store with its snapshots on `snapshots`.
    pub fn on(snapshots: Snapshots, applied_tx: watch::Sender<u64>) -> Result<Self, ConsensusError> {
        let mut applied = Applied { state: ClusterState::new(), ..Applied::default() };
        if let Some(stored) = snapshots.read()? {
            applied.state = decode_snapshot(&stored.data)?;
            applied.last_applied = stored.meta.last_log_id;
            applied.membership = stored.meta.last_membership.clone();
        }
        let index = applied.last_applied.map(|l| l.index).unwrap_or(0);
        applied_tx.send_replace(index);
        let clock = ClockSeen::default();
        saw(&clock, &applied.state);
        Ok(StateMachineStore { snapshots, shared: Arc::new(RwLock::new(applied)), applied_tx, clock })
    }

    pub fn shared(&self) -> SharedState {
        self.shared.clone()
    }

    pub fn clock(&self) -> ClockSeen {
        self.clock.clone()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Applied> {
        self.shared.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Applied> {
        self.shared.write().unwrap_or_else(|p| p.into_inner())
    }

    async fn save_snapshot(&self, stored: &StoredSnapshot) -> StorageResult<()> {
        let bytes = stored.encode().map_err(write_err)?;
        // A snapshot may let openraft purge the log behind it: it must be on disk first.
        self.snapshots.write(bytes).await.map_err(write_err)
    }
}

#[derive(Serialize)]
struct SnapshotFileRef<'a> {
    format: u32,
    state: &'a ClusterState,
}

pub(crate) fn encode_snapshot(state: &ClusterState) -> Result<Vec<u8>, serde_json::Error> {
    serde_json::to_vec(&SnapshotFileRef { format: SNAPSHOT_FORMAT_VERSION, state })
}

pub(crate) fn decode_snapshot(data: &[u8]) -> Result<ClusterState, ConsensusError> {
    let file: SnapshotFile = serde_json::from_slice(data)?;
    if file.format != SNAPSHOT_FORMAT_VERSION {
        return Err(ConsensusError::Format(format!("unknown snapshot format {}", file.format)));
    }
    Ok(file.state)
}

/// Whether `data_dir` holds a replica's storage (a log database or a snapshot).
pub(crate) fn holds_data(data_dir: &std::path::Path) -> bool {
    [crate::wal::DIR, SLED_DIR, SNAPSHOT_FILE].iter().any(|f| data_dir.join(f).exists())
}

/// Writes the storage of a replica that has applied the cluster's first entry (index 0, the
/// membership of `nodes`) onto `state` and compacted it into a snapshot: the snapshot file, and
/// the log's purge point and commit index at that entry (`backup::seed`).
pub(crate) fn seed(
    data_dir: &std::path::Path,
    nodes: std::collections::BTreeMap<NodeId, openraft::BasicNode>,
    state: &ClusterState,
) -> Result<(), ConsensusError> {
    let first = LogId::<NodeId>::default();
    let voters = nodes.keys().copied().collect();
    let membership = openraft::Membership::new(vec![voters], nodes);
    let meta = SnapshotMeta {
        last_log_id: Some(first),
        last_membership: StoredMembership::new(Some(first), membership),
        snapshot_id: "restored".into(),
    };
    let stored = StoredSnapshot { meta, data: encode_snapshot(state)? };
    let os = crate::fs::OsFs;
    replace_file(&os, data_dir, SNAPSHOT_TMP, SNAPSHOT_FILE, &stored.encode()?)
        .map_err(|e| ConsensusError::Format(format!("writing the snapshot: {e}")))?;
    let dir = data_dir.join(crate::wal::DIR);
    let fail = |e: std::io::Error| ConsensusError::Format(format!("writing the log's meta: {e}"));
    std::fs::create_dir_all(&dir).map_err(fail)?;
    write_meta(&os, &dir, &LogMeta { vote: None, last_purged: Some(first) }).map_err(fail)?;
    std::fs::write(dir.join(COMMITTED_FILE), encode_committed(&Some(first))).map_err(fail)?;
    std::fs::File::open(data_dir).and_then(|d| d.sync_all()).map_err(fail)
}

type AppliedCopy = (ClusterState, Option<LogId<NodeId>>, StoredMembership<NodeId, openraft::BasicNode>);

/// What a snapshot holds, copied under the lock (applies wait only for the copy, not for the
/// encoding).
fn copy_applied(applied: &Applied) -> AppliedCopy {
    (applied.state.clone(), applied.last_applied, applied.membership.clone())
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachineStore {
    async fn build_snapshot(&mut self) -> StorageResult<Snapshot<TypeConfig>> {
        // Encoded where the executor runs long work: a thread of its own at low CPU priority
        // (the simulation: inline, on its one thread under a paused clock).
        let shared = self.shared.clone();
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.snapshots
            .executor
            .background(
                "kairos-snapshot",
                Box::new(move || {
                    let began = std::time::Instant::now();
                    let (state, last_applied, membership) =
                        copy_applied(&shared.read().unwrap_or_else(|p| p.into_inner()));
                    let copied = began.elapsed();
                    let encoded = encode_snapshot(&state);
                    tracing::info!(
                        jobs = state.jobs.len(),
                        bytes = encoded.as_ref().map_or(0, Vec::len),
                        copy_ms = copied.as_millis() as u64,
                        encode_ms = (began.elapsed() - copied).as_millis() as u64,
                        "snapshot built"
                    );
                    let _ = tx.send(encoded.map(|data| (data, last_applied, membership)));
                }),
            )
            .map_err(write_err)?;
        let (data, last_applied, membership) =
            rx.await.map_err(|e| read_err(std::io::Error::other(e)))?.map_err(read_err)?;
        let snapshot_id = match last_applied {
            Some(l) => format!("{}-{}-{}", l.leader_id, l.index, data.len()),
            None => format!("empty-{}", data.len()),
        };
        let meta = SnapshotMeta { last_log_id: last_applied, last_membership: membership, snapshot_id };
        let stored = StoredSnapshot { meta: meta.clone(), data };
        self.save_snapshot(&stored).await?;
        Ok(Snapshot { meta, snapshot: Box::new(Cursor::new(stored.data)) })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = Self;

    async fn applied_state(
        &mut self,
    ) -> StorageResult<(Option<LogId<NodeId>>, StoredMembership<NodeId, openraft::BasicNode>)> {
        let applied = self.read();
        Ok((applied.last_applied, applied.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> StorageResult<Vec<Response>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut responses = Vec::new();
        let mut last = None;
        {
            let mut applied = self.write();
            for entry in entries {
                applied.last_applied = Some(entry.log_id);
                last = Some(entry.log_id.index);
                match entry.payload {
                    EntryPayload::Blank => responses.push(Response::default()),
                    EntryPayload::Normal(req) => {
                        // A committed entry we cannot understand is fatal: stop rather than diverge.
                        assert_eq!(
                            req.version,
                            crate::types::ENTRY_FORMAT_VERSION,
                            "log entry {} has unknown format version {}",
                            entry.log_id.index,
                            req.version
                        );
                        let outcomes = req.commands.iter().map(|c| applied.state.apply(c)).collect();
                        debug_assert_eq!(applied.state.check_invariants(), Ok(()));
                        responses.push(Response { outcomes });
                    }
                    EntryPayload::Membership(m) => {
                        applied.membership = StoredMembership::new(Some(entry.log_id), m);
                        responses.push(Response::default());
                    }
                }
            }
        }
        if let Some(index) = last {
            saw(&self.clock, &self.read().state);
            self.applied_tx.send_replace(index);
        }
        Ok(responses)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> StorageResult<Box<Cursor<Vec<u8>>>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, openraft::BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> StorageResult<()> {
        let data = snapshot.into_inner();
        let state =
            decode_snapshot(&data).map_err(|e| StorageIOError::read_snapshot(Some(meta.signature()), &e))?;
        let stored = StoredSnapshot { meta: meta.clone(), data };
        self.save_snapshot(&stored).await?;
        {
            let mut applied = self.write();
            applied.state = state;
            applied.last_applied = meta.last_log_id;
            applied.membership = meta.last_membership.clone();
        }
        saw(&self.clock, &self.read().state);
        self.applied_tx.send_replace(meta.last_log_id.map(|l| l.index).unwrap_or(0));
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> StorageResult<Option<Snapshot<TypeConfig>>> {
        match self.snapshots.read().map_err(read_err)? {
            Some(stored) => {
                Ok(Some(Snapshot { meta: stored.meta, snapshot: Box::new(Cursor::new(stored.data)) }))
            }
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Whatever lies in a snapshot file (corruption, a foreign file), decoding it is a clean
        /// error, never a panic.
        #[test]
        fn decoding_arbitrary_snapshot_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            if let Ok(stored) = StoredSnapshot::decode(&bytes) {
                let _ = decode_snapshot(&stored.data);
            }
            let _ = decode_snapshot(&bytes);
        }
    }

    #[test]
    fn a_snapshot_round_trips_and_a_foreign_format_is_refused() {
        let state = ClusterState::new();
        let data = encode_snapshot(&state).unwrap();
        assert_eq!(decode_snapshot(&data).unwrap(), state);
        let foreign = serde_json::to_vec(&serde_json::json!({"format": 99, "state": state})).unwrap();
        assert!(matches!(decode_snapshot(&foreign), Err(ConsensusError::Format(_))));
    }

    impl EntryCache {
        fn get_all(&self, start: u64, end: u64) -> Option<Vec<Entry<TypeConfig>>> {
            self.get(start, end, u64::MAX)
        }
    }

    #[test]
    fn the_entry_cache_serves_only_whole_ranges_it_holds_and_follows_truncation_and_purge() {
        let entry = |i: u64| Entry::<TypeConfig> {
            log_id: LogId::new(openraft::CommittedLeaderId::new(1, 1), i),
            payload: EntryPayload::Blank,
        };
        let indexes = |v: Option<Vec<Entry<TypeConfig>>>| {
            v.map(|v| v.iter().map(|e| e.log_id.index).collect::<Vec<_>>())
        };
        let mut cache = EntryCache::default();
        for i in 5..10 {
            cache.push(entry(i), 100);
        }
        assert_eq!(indexes(cache.get_all(6, 9)), Some(vec![6, 7, 8]));
        // Within a byte budget: the prefix that fits, the first entry always.
        assert_eq!(indexes(cache.get(5, 10, 250)), Some(vec![5, 6]));
        assert_eq!(indexes(cache.get(5, 10, 10)), Some(vec![5]));
        assert_eq!(indexes(cache.get(8, 12, 250)), None, "10 is not held: read from the disk");
        assert_eq!(indexes(cache.get(12, 14, 250)), None, "past the last entry");
        assert_eq!(indexes(cache.get_all(4, 9)), None, "entry 4 is not held");
        assert_eq!(indexes(cache.get_all(8, 11)), None, "entry 10 is not held");
        cache.truncate(8);
        assert_eq!(indexes(cache.get_all(5, 8)), Some(vec![5, 6, 7]));
        assert_eq!(indexes(cache.get_all(5, 9)), None);
        cache.purge(5);
        assert_eq!(indexes(cache.get_all(5, 7)), None);
        assert_eq!(cache.bytes, 200);
        // An entry that does not follow the last (a truncation it missed) empties the cache.
        cache.push(entry(20), 100);
        assert_eq!(indexes(cache.get_all(6, 7)), None);
        assert_eq!(indexes(cache.get_all(20, 21)), Some(vec![20]));
        // Bounded: the oldest go first.
        for i in 21..21 + CACHE_ENTRIES as u64 {
            cache.push(entry(i), 1);
        }
        assert_eq!(cache.entries.len(), CACHE_ENTRIES);
        assert_eq!(indexes(cache.get_all(20, 21)), None);
    }
}

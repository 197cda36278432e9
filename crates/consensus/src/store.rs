//! Raft storage: the log and vote in sled (`LogStore`), and the state machine with its
//! snapshots (`StateMachineStore`).
//!
//! Durability: every append, truncate, purge and vote is followed by a sled flush (fsync)
//! before openraft is told it is done, so a vote or an append is acknowledged only once it is on
//! disk. The state machine itself lives in memory; its durable form is the latest snapshot plus
//! the log after it. The committed log id is persisted too (without a flush of its own), so a
//! restarted replica re-applies its committed tail at once instead of waiting for a leader.
//!
//! Snapshots are files beside the sled database (`snapshot`, written to a temporary file,
//! fsync'd, renamed, directory fsync'd): a snapshot of a large state is tens of megabytes, and
//! flushing such a value through sled would stall the log's own flushes behind it. The file is a
//! JSON line of metadata followed by the snapshot bytes.
//!
//! Log entries are stored in chunks of a few KiB (`chunked`), keyed by big-endian (index, chunk),
//! so sled's order is the log's order and no entry becomes one of sled's unsafe blob files.

// openraft's traits fix `StorageError` as the error type; its size is not ours to choose.
#![allow(clippy::result_large_err)]

use std::fmt::Debug;
use std::io::Cursor;
use std::ops::RangeBounds;
use std::sync::{Arc, RwLock};

use kairos_scheduler::ClusterState;
use openraft::storage::{LogFlushed, LogState, RaftLogStorage, RaftStateMachine, Snapshot};
use openraft::{
    Entry, EntryPayload, LogId, OptionalSend, RaftLogReader, RaftSnapshotBuilder, SnapshotMeta, StorageError,
    StorageIOError, StoredMembership, Vote,
};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::{NodeId, Response, TypeConfig, SNAPSHOT_FORMAT_VERSION};

type StorageResult<T> = Result<T, StorageError<NodeId>>;

/// The log tree: entries in chunks (`chunked`).
const LOG_TREE: &str = "raft_log_chunks";
/// The log tree of earlier versions (one sled value per entry); moved into `LOG_TREE` at open.
const OLD_LOG_TREE: &str = "raft_log";
const KEY_VOTE: &[u8] = b"vote";
const KEY_COMMITTED: &[u8] = b"committed";
const KEY_LAST_PURGED: &[u8] = b"last_purged";
const SNAPSHOT_FILE: &str = "snapshot";
/// The sled database's directory under the data directory.
pub(crate) const SLED_DIR: &str = "raft.sled";
const META_TREE: &str = "raft_meta";
const SNAPSHOT_TMP: &str = "snapshot.tmp";

fn read_err(e: impl std::error::Error + 'static) -> StorageError<NodeId> {
    crate::failstop::storage_failed(&format!("reading: {e}"));
    StorageIOError::read(&e).into()
}

fn write_err(e: impl std::error::Error + 'static) -> StorageError<NodeId> {
    crate::failstop::storage_failed(&format!("writing: {e}"));
    StorageIOError::write(&e).into()
}

fn to_io(e: sled::Error) -> std::io::Error {
    std::io::Error::other(e)
}

/// The Raft log and vote in sled.
#[derive(Clone)]
pub struct LogStore {
    db: sled::Db,
    log: sled::Tree,
    meta: sled::Tree,
    /// The latest committed index openraft told us about, for status reports.
    committed: Arc<std::sync::atomic::AtomicU64>,
    /// Syncs what sled's flush leaves unsynced (its main file, large values' blob files).
    sled_sync: Arc<crate::sync::SledSync>,
}

impl LogStore {
    /// The log in `db`, the sled database at `sled_dir`.
    pub fn new(db: &sled::Db, sled_dir: &std::path::Path) -> Result<Self, crate::ConsensusError> {
        let store = LogStore {
            db: db.clone(),
            log: db.open_tree(LOG_TREE)?,
            meta: db.open_tree(META_TREE)?,
            committed: Arc::default(),
            sled_sync: Arc::new(crate::sync::SledSync::open(sled_dir).map_err(sled::Error::Io)?),
        };
        store.move_old_log()?;
        Ok(store)
    }

    /// Moves a log of an earlier version (one value per entry, 8-byte keys) into chunks.
    fn move_old_log(&self) -> Result<(), crate::ConsensusError> {
        if !self.db.tree_names().iter().any(|t| t.as_ref() == OLD_LOG_TREE.as_bytes()) {
            return Ok(());
        }
        let old = self.db.open_tree(OLD_LOG_TREE)?;
        let mut batch = sled::Batch::default();
        for item in old.iter() {
            let (k, v) = item?;
            let index: [u8; 8] = k.as_ref().try_into().map_err(|_| {
                crate::ConsensusError::Format(format!("old log key of {} bytes (not 8)", k.len()))
            })?;
            crate::chunked::insert(&mut batch, u64::from_be_bytes(index), &v);
        }
        self.log.apply_batch(batch)?;
        self.db.flush()?;
        self.sled_sync.after_flush().map_err(sled::Error::Io)?;
        old.clear()?;
        self.db.drop_tree(OLD_LOG_TREE)?;
        self.db.flush()?;
        Ok(())
    }

    /// sled's flush, then fsync of its main file and of the blob files it wrote: only then is
    /// a write durable.
    async fn flush(&self) -> std::io::Result<()> {
        self.db.flush_async().await.map_err(to_io)?;
        self.sled_sync.after_flush().map(|_| ())
    }

    /// A handle that always holds the latest known commit index.
    pub fn commit_index(&self) -> Arc<std::sync::atomic::AtomicU64> {
        self.committed.clone()
    }

    fn get_meta<T: for<'de> Deserialize<'de>>(&self, key: &[u8]) -> StorageResult<Option<T>> {
        match self.meta.get(key).map_err(read_err)? {
            Some(bytes) => Ok(Some(serde_json::from_slice(&bytes).map_err(read_err)?)),
            None => Ok(None),
        }
    }

    async fn put_meta<T: Serialize>(&self, key: &[u8], value: &T) -> StorageResult<()> {
        let bytes = serde_json::to_vec(value).map_err(write_err)?;
        self.meta.insert(key, bytes).map_err(write_err)?;
        self.flush().await.map_err(write_err)?;
        Ok(())
    }
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
        let chunks = crate::chunked::read_from(&self.log, start, |i| range.contains(&i)).map_err(read_err)?;
        chunks.iter().map(|(_, bytes)| serde_json::from_slice(bytes).map_err(read_err)).collect()
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> StorageResult<LogState<TypeConfig>> {
        let last_purged: Option<LogId<NodeId>> = self.get_meta(KEY_LAST_PURGED)?;
        let last = match crate::chunked::last(&self.log).map_err(read_err)? {
            Some((_, value)) => {
                let entry: Entry<TypeConfig> = serde_json::from_slice(&value).map_err(read_err)?;
                Some(entry.log_id)
            }
            None => last_purged,
        };
        Ok(LogState { last_purged_log_id: last_purged, last_log_id: last })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> StorageResult<()> {
        // Flushed before the vote is acknowledged.
        self.put_meta(KEY_VOTE, vote).await
    }

    async fn read_vote(&mut self) -> StorageResult<Option<Vote<NodeId>>> {
        self.get_meta(KEY_VOTE)
    }

    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> StorageResult<()> {
        // No flush of its own: a committed index that is a little stale after a crash is allowed
        // (the tail is re-committed by the next leader); it reaches disk with the next append.
        let bytes = serde_json::to_vec(&committed).map_err(write_err)?;
        self.meta.insert(KEY_COMMITTED, bytes).map_err(write_err)?;
        if let Some(c) = committed {
            self.committed.fetch_max(c.index, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(())
    }

    async fn read_committed(&mut self) -> StorageResult<Option<LogId<NodeId>>> {
        Ok(self.get_meta::<Option<LogId<NodeId>>>(KEY_COMMITTED)?.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> StorageResult<()>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut batch = sled::Batch::default();
        for entry in entries {
            let bytes = serde_json::to_vec(&entry).map_err(write_err)?;
            crate::chunked::insert(&mut batch, entry.log_id.index, &bytes);
        }
        self.log.apply_batch(batch).map_err(write_err)?;
        // The entries are readable now; they count as appended only once flushed.
        let result = self.flush().await;
        if let Err(e) = &result {
            crate::failstop::storage_failed(&format!("syncing the log: {e}"));
        }
        callback.log_io_completed(result);
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> StorageResult<()> {
        use std::ops::Bound;
        let mut batch = sled::Batch::default();
        let from = Bound::Included(crate::chunked::first_key(log_id.index));
        crate::chunked::remove_range(&self.log, &mut batch, (from, Bound::Unbounded)).map_err(write_err)?;
        self.log.apply_batch(batch).map_err(write_err)?;
        self.flush().await.map_err(write_err)?;
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> StorageResult<()> {
        // Record the purge point first: a crash in between leaves extra entries, never a hole.
        self.put_meta(KEY_LAST_PURGED, &log_id).await?;
        use std::ops::Bound;
        let mut batch = sled::Batch::default();
        let to = Bound::Excluded(crate::chunked::first_key(log_id.index.saturating_add(1)));
        crate::chunked::remove_range(&self.log, &mut batch, (Bound::Unbounded, to)).map_err(write_err)?;
        self.log.apply_batch(batch).map_err(write_err)?;
        self.flush().await.map_err(write_err)?;
        Ok(())
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

    fn decode(bytes: &[u8]) -> Result<Self, crate::ConsensusError> {
        let split = bytes
            .iter()
            .position(|b| *b == b'\n')
            .ok_or_else(|| crate::ConsensusError::Format("snapshot file has no metadata line".into()))?;
        let meta = serde_json::from_slice(&bytes[..split])?;
        Ok(StoredSnapshot { meta, data: bytes[split + 1..].to_vec() })
    }
}

/// Where snapshots are kept: a file in the replica's data directory, or (the deterministic
/// simulation's disk) memory that survives the simulated replica's crashes. Both replace the
/// snapshot whole, durably, before the write returns.
#[derive(Clone, Debug)]
pub enum SnapshotMedium {
    Dir(std::path::PathBuf),
    Memory(Arc<std::sync::Mutex<Option<Vec<u8>>>>),
}

impl SnapshotMedium {
    fn read(&self) -> Result<Option<StoredSnapshot>, crate::ConsensusError> {
        let bytes = match self {
            SnapshotMedium::Dir(dir) => match std::fs::read(dir.join(SNAPSHOT_FILE)) {
                Ok(bytes) => bytes,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(crate::ConsensusError::Format(format!("reading the snapshot: {e}"))),
            },
            SnapshotMedium::Memory(cell) => match cell.lock().unwrap_or_else(|p| p.into_inner()).clone() {
                Some(bytes) => bytes,
                None => return Ok(None),
            },
        };
        Ok(Some(StoredSnapshot::decode(&bytes)?))
    }

    async fn write(&self, bytes: Vec<u8>) -> std::io::Result<()> {
        match self {
            SnapshotMedium::Dir(dir) => {
                let dir = dir.clone();
                tokio::task::spawn_blocking(move || write_snapshot(&dir, &bytes))
                    .await
                    .map_err(std::io::Error::other)?
            }
            SnapshotMedium::Memory(cell) => {
                *cell.lock().unwrap_or_else(|p| p.into_inner()) = Some(bytes);
                Ok(())
            }
        }
    }
}

/// Replaces the snapshot file atomically and durably.
fn write_snapshot(dir: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = dir.join(SNAPSHOT_TMP);
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, dir.join(SNAPSHOT_FILE))?;
    std::fs::File::open(dir)?.sync_all()
}

/// The scheduling core as openraft's state machine, with snapshots kept as files.
#[derive(Clone)]
pub struct StateMachineStore {
    snapshots: SnapshotMedium,
    shared: SharedState,
    applied_tx: watch::Sender<u64>,
    clock: ClockSeen,
}

/// The latest stamp this replica applied (`ClusterState::now_ms`) and when, on its monotonic
/// clock: what `Replica::clock_ms` extrapolates from (`kairos_scheduler::clock`).
pub type ClockSeen = Arc<std::sync::Mutex<Option<(i64, tokio::time::Instant)>>>;

fn saw(clock: &ClockSeen, now_ms: i64) {
    let mut seen = clock.lock().unwrap_or_else(|p| p.into_inner());
    if now_ms > 0 && seen.is_none_or(|(t, _)| now_ms != t) {
        *seen = Some((now_ms, tokio::time::Instant::now()));
    }
}

impl StateMachineStore {
    /// Opens the store, loading the latest snapshot when there is one.
    pub fn new(dir: &std::path::Path, applied_tx: watch::Sender<u64>) -> Result<Self, crate::ConsensusError> {
        Self::on(SnapshotMedium::Dir(dir.to_path_buf()), applied_tx)
    }

    /// Opens the store with its snapshots on `snapshots`.
    pub fn on(
        snapshots: SnapshotMedium,
        applied_tx: watch::Sender<u64>,
    ) -> Result<Self, crate::ConsensusError> {
        let mut applied = Applied { state: ClusterState::new(), ..Applied::default() };
        if let Some(stored) = snapshots.read()? {
            applied.state = decode_snapshot(&stored.data)?;
            applied.last_applied = stored.meta.last_log_id;
            applied.membership = stored.meta.last_membership.clone();
        }
        let index = applied.last_applied.map(|l| l.index).unwrap_or(0);
        applied_tx.send_replace(index);
        let clock = ClockSeen::default();
        saw(&clock, applied.state.now_ms);
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

pub(crate) fn decode_snapshot(data: &[u8]) -> Result<ClusterState, crate::ConsensusError> {
    let file: SnapshotFile = serde_json::from_slice(data)?;
    if file.format != SNAPSHOT_FORMAT_VERSION {
        return Err(crate::ConsensusError::Format(format!("unknown snapshot format {}", file.format)));
    }
    Ok(file.state)
}

/// Whether `data_dir` holds a replica's storage (a log database or a snapshot).
pub(crate) fn holds_data(data_dir: &std::path::Path) -> bool {
    data_dir.join(SLED_DIR).exists() || data_dir.join(SNAPSHOT_FILE).exists()
}

/// Writes the storage of a replica that has applied the cluster's first entry (index 0, the
/// membership of `nodes`) onto `state` and compacted it into a snapshot: the snapshot file, and
/// the log's purge point and commit index at that entry (`backup::seed`).
pub(crate) fn seed(
    data_dir: &std::path::Path,
    nodes: std::collections::BTreeMap<NodeId, openraft::BasicNode>,
    state: &ClusterState,
) -> Result<(), crate::ConsensusError> {
    let first = LogId::<NodeId>::default();
    let voters = nodes.keys().copied().collect();
    let membership = openraft::Membership::new(vec![voters], nodes);
    let meta = SnapshotMeta {
        last_log_id: Some(first),
        last_membership: StoredMembership::new(Some(first), membership),
        snapshot_id: "restored".into(),
    };
    let stored = StoredSnapshot { meta, data: encode_snapshot(state)? };
    write_snapshot(data_dir, &stored.encode()?)
        .map_err(|e| crate::ConsensusError::Format(format!("writing the snapshot: {e}")))?;
    let db = sled::Config::new().path(data_dir.join(SLED_DIR)).open()?;
    let meta = db.open_tree(META_TREE)?;
    meta.insert(KEY_LAST_PURGED, serde_json::to_vec(&first)?)?;
    meta.insert(KEY_COMMITTED, serde_json::to_vec(&Some(first))?)?;
    db.flush()?;
    Ok(())
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachineStore {
    async fn build_snapshot(&mut self) -> StorageResult<Snapshot<TypeConfig>> {
        // Copy under the lock, encode outside it, so applies are not held up by the encoding.
        let (state, last_applied, membership) = {
            let applied = self.read();
            (applied.state.clone(), applied.last_applied, applied.membership.clone())
        };
        let data = encode_snapshot(&state).map_err(read_err)?;
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
                            crate::ENTRY_FORMAT_VERSION,
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
            saw(&self.clock, self.read().state.now_ms);
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
        saw(&self.clock, self.read().state.now_ms);
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
        assert!(matches!(decode_snapshot(&foreign), Err(crate::ConsensusError::Format(_))));
    }
}

//! The simulated disk: a replica's Raft log, vote, commit index and purge point, written like
//! the real store writes sled (`kairos_consensus::store::LogStore`): every append, truncate,
//! purge and vote is synced before openraft hears it is done, the commit index is not.
//!
//! What was written but not yet synced lives in a page cache (`pending`). A crash loses it —
//! all of it, or (a torn write) a prefix of it with the first lost entry half written, which the
//! log drops at open as a checksummed store drops a torn tail. A full disk refuses every write,
//! and the replica stops (fail-stop, as `kairosd` exits on a storage error). Each opening of the
//! disk is one incarnation: a handle of an earlier one (a crashed replica's task still finishing
//! a sync) changes nothing.

#![allow(clippy::result_large_err)]

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::ops::RangeBounds;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kairos_consensus::{ReplicaId, TypeConfig};
use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{Entry, LogId, OptionalSend, RaftLogReader, StorageError, StorageIOError, Vote};

type StorageResult<T> = Result<T, StorageError<ReplicaId>>;

#[derive(Clone, Debug, Default)]
struct Media {
    entries: BTreeMap<u64, Vec<u8>>,
    vote: Option<Vec<u8>>,
    committed: Option<Vec<u8>>,
    last_purged: Option<Vec<u8>>,
}

#[derive(Clone, Debug)]
enum Write {
    Put(u64, Vec<u8>),
    RemoveFrom(u64),
    RemoveTo(u64),
    Vote(Vec<u8>),
    Committed(Vec<u8>),
    LastPurged(Vec<u8>),
}

impl Media {
    /// The index the commit record names (0: none, or unreadable).
    fn committed_index(&self) -> u64 {
        self.committed
            .as_ref()
            .and_then(|b| serde_json::from_slice::<Option<LogId<ReplicaId>>>(b).ok())
            .flatten()
            .map_or(0, |l| l.index)
    }

    fn apply(&mut self, w: &Write) {
        match w {
            Write::Put(i, bytes) => {
                self.entries.insert(*i, bytes.clone());
            }
            Write::RemoveFrom(i) => {
                self.entries.split_off(i);
            }
            Write::RemoveTo(i) => {
                self.entries = self.entries.split_off(&(i + 1));
            }
            Write::Vote(b) => self.vote = Some(b.clone()),
            Write::Committed(b) => self.committed = Some(b.clone()),
            Write::LastPurged(b) => self.last_purged = Some(b.clone()),
        }
    }
}

/// One replica's disk, shared by its incarnations.
#[derive(Debug, Default)]
pub struct DiskState {
    incarnation: u64,
    durable: Media,
    pending: Vec<Write>,
    /// What reads see: durable plus pending.
    visible: Media,
    pub full: bool,
    /// Torn entries dropped at an open.
    pub torn_dropped: u64,
    /// Writes refused because the disk was full.
    pub refused: u64,
    /// Opens refused because the log was damaged below its commit record.
    pub damaged_refused: u64,
    /// Unsynced writes crashes lost.
    pub lost: u64,
}

/// A disk and how long a sync takes on it.
#[derive(Clone, Debug)]
pub struct Disk {
    pub state: Arc<Mutex<DiskState>>,
    pub sync_time: Duration,
    /// Broken on purpose (a test build): appends are acknowledged before they are synced.
    pub acks_before_sync: bool,
    /// Broken on purpose (a test build): damage below the commit record is cut off at open, as
    /// the log's recovery did before it refused (committed entries are lost).
    pub cuts_damage: bool,
}

impl Disk {
    pub fn new(sync_time: Duration) -> Disk {
        Disk { state: Arc::default(), sync_time, acks_before_sync: false, cuts_damage: false }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, DiskState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A crash: the page cache is lost. With `survive` > 0, that many of the unsynced writes
    /// had reached the platter anyway; with `tear`, the next one did only in part.
    pub fn crash(&self, survive: usize, tear: bool) {
        let mut d = self.lock();
        let pending = std::mem::take(&mut d.pending);
        let survive = survive.min(pending.len());
        d.lost += (pending.len() - survive) as u64;
        for w in &pending[..survive] {
            d.durable.apply(w);
        }
        if tear {
            if let Some(Write::Put(i, bytes)) = pending.get(survive) {
                let half = bytes[..bytes.len() / 2].to_vec();
                d.durable.apply(&Write::Put(*i, half));
            }
        }
        d.visible = d.durable.clone();
        d.incarnation += 1;
    }

    /// Unsynced writes now.
    pub fn unsynced(&self) -> usize {
        self.lock().pending.len()
    }

    /// Wipes the disk (a replica removed from the cluster and later added back empty).
    pub fn wipe(&self) {
        let mut d = self.lock();
        d.durable = Media::default();
        d.visible = Media::default();
        d.pending.clear();
        d.incarnation += 1;
    }

    /// Opens the disk for a new incarnation of its replica: a torn entry at the end of the log
    /// (and anything after it) is dropped. As the real log's recovery (`wal::Wal::open`), a bad
    /// entry at or below the commit record is damage, not a crash's tail: the open is refused
    /// and nothing is changed (the replica must be re-added empty).
    pub fn open(&self) -> Result<SimLog, String> {
        let mut d = self.lock();
        d.incarnation += 1;
        d.pending.clear();
        let committed = d.durable.committed_index();
        let torn: Vec<u64> = d
            .durable
            .entries
            .iter()
            .filter(|(_, b)| serde_json::from_slice::<Entry<TypeConfig>>(b).is_err())
            .map(|(i, _)| *i)
            .collect();
        if let Some(first) = torn.first().copied() {
            if first <= committed && !self.cuts_damage {
                d.damaged_refused += 1;
                return Err(format!(
                    "damaged: entry {first} fails its check, entries through {committed} are committed"
                ));
            }
            d.durable.entries.split_off(&first);
            d.torn_dropped += torn.len() as u64;
        }
        d.visible = d.durable.clone();
        Ok(SimLog {
            disk: self.clone(),
            incarnation: d.incarnation,
            committed: Arc::new(AtomicU64::new(committed)),
        })
    }

    /// Bit rot (the fault `bit_rot`): a committed entry of the durable log other than the last
    /// one, chosen by `pick`, no longer passes its check. False when there is none.
    pub fn rot(&self, pick: u64) -> bool {
        let mut d = self.lock();
        let committed = d.durable.committed_index();
        let last = d.durable.entries.keys().next_back().copied();
        let candidates: Vec<u64> =
            d.durable.entries.keys().copied().filter(|i| *i <= committed && Some(*i) != last).collect();
        let Some(victim) = candidates.get(pick as usize % candidates.len().max(1)).copied() else {
            return false;
        };
        if let Some(bytes) = d.durable.entries.get_mut(&victim) {
            bytes[0] ^= 0x40;
        }
        d.visible = d.durable.clone();
        true
    }
}

fn io_err(what: &str) -> std::io::Error {
    std::io::Error::other(what.to_string())
}

fn write_err(e: std::io::Error) -> StorageError<ReplicaId> {
    StorageIOError::write(&e).into()
}

fn read_err(e: impl std::error::Error + 'static) -> StorageError<ReplicaId> {
    StorageIOError::read(&e).into()
}

/// One incarnation's handle on its disk: openraft's log storage.
#[derive(Clone, Debug)]
pub struct SimLog {
    disk: Disk,
    incarnation: u64,
    committed: Arc<AtomicU64>,
}

impl SimLog {
    pub fn commit_index(&self) -> Arc<AtomicU64> {
        self.committed.clone()
    }

    /// The disk, when this incarnation may write to it now (not crashed, not full).
    fn writable(&self) -> std::io::Result<std::sync::MutexGuard<'_, DiskState>> {
        let mut d = self.disk.lock();
        if d.incarnation != self.incarnation {
            return Err(io_err("this incarnation crashed"));
        }
        if d.full {
            d.refused += 1;
            return Err(io_err("No space left on device"));
        }
        Ok(d)
    }

    /// Writes into the page cache (refused on a full disk or by a dead incarnation).
    fn write(&self, writes: Vec<Write>) -> std::io::Result<()> {
        let mut d = self.writable()?;
        for w in writes {
            d.visible.apply(&w);
            d.pending.push(w);
        }
        Ok(())
    }

    /// fsync: after the disk's sync time, everything written so far is durable.
    async fn sync(&self) -> std::io::Result<()> {
        tokio::time::sleep(self.disk.sync_time).await;
        let mut d = self.writable()?;
        let pending = std::mem::take(&mut d.pending);
        for w in &pending {
            d.durable.apply(w);
        }
        Ok(())
    }

    fn get<T: serde::de::DeserializeOwned>(
        &self,
        pick: impl Fn(&Media) -> Option<Vec<u8>>,
    ) -> StorageResult<Option<T>> {
        let bytes = pick(&self.disk.lock().visible);
        match bytes {
            Some(b) => Ok(Some(serde_json::from_slice(&b).map_err(read_err)?)),
            None => Ok(None),
        }
    }
}

impl RaftLogReader<TypeConfig> for SimLog {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> StorageResult<Vec<Entry<TypeConfig>>> {
        let bytes: Vec<Vec<u8>> =
            self.disk.lock().visible.entries.range(range).map(|(_, b)| b.clone()).collect();
        bytes.iter().map(|b| serde_json::from_slice(b).map_err(read_err)).collect()
    }

    /// Replication's reads, as `LogStore`'s: a start purged meanwhile gets nothing.
    async fn limited_get_log_entries(
        &mut self,
        start: u64,
        end: u64,
    ) -> StorageResult<Vec<Entry<TypeConfig>>> {
        let purged: Option<LogId<ReplicaId>> = self.get(|m| m.last_purged.clone())?;
        if purged.is_some_and(|p| start <= p.index) {
            return Ok(Vec::new());
        }
        self.try_get_log_entries(start..end).await
    }
}

impl RaftLogStorage<TypeConfig> for SimLog {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> StorageResult<LogState<TypeConfig>> {
        let last_purged: Option<LogId<ReplicaId>> = self.get(|m| m.last_purged.clone())?;
        let last_bytes = self.disk.lock().visible.entries.values().next_back().cloned();
        let last = match last_bytes {
            Some(b) => Some(serde_json::from_slice::<Entry<TypeConfig>>(&b).map_err(read_err)?.log_id),
            None => last_purged,
        };
        Ok(LogState { last_purged_log_id: last_purged, last_log_id: last })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<ReplicaId>) -> StorageResult<()> {
        let bytes = serde_json::to_vec(vote).map_err(read_err)?;
        self.write(vec![Write::Vote(bytes)]).map_err(write_err)?;
        self.sync().await.map_err(write_err)
    }

    async fn read_vote(&mut self) -> StorageResult<Option<Vote<ReplicaId>>> {
        self.get(|m| m.vote.clone())
    }

    async fn save_committed(&mut self, committed: Option<LogId<ReplicaId>>) -> StorageResult<()> {
        // Not synced of its own, as in the real store.
        let bytes = serde_json::to_vec(&committed).map_err(read_err)?;
        self.write(vec![Write::Committed(bytes)]).map_err(write_err)?;
        if let Some(c) = committed {
            self.committed.fetch_max(c.index, Ordering::Relaxed);
        }
        Ok(())
    }

    async fn read_committed(&mut self) -> StorageResult<Option<LogId<ReplicaId>>> {
        Ok(self.get::<Option<LogId<ReplicaId>>>(|m| m.committed.clone())?.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> StorageResult<()>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut writes = Vec::new();
        for e in entries {
            writes.push(Write::Put(e.log_id.index, serde_json::to_vec(&e).map_err(read_err)?));
        }
        self.write(writes).map_err(write_err)?;
        if self.disk.acks_before_sync {
            // The bug: done at once, synced by a background flush some time later.
            callback.log_io_completed(Ok(()));
            let log = self.clone();
            tokio::spawn(async move {
                tokio::time::sleep(log.disk.sync_time * 20).await;
                let _ = log.sync().await;
            });
            return Ok(());
        }
        // Readable now; appended only once synced. A crash before then never calls back.
        match self.sync().await {
            Ok(()) => callback.log_io_completed(Ok(())),
            Err(e) => {
                callback.log_io_completed(Err(io_err(&e.to_string())));
                return Err(write_err(e));
            }
        }
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<ReplicaId>) -> StorageResult<()> {
        self.write(vec![Write::RemoveFrom(log_id.index)]).map_err(write_err)?;
        self.sync().await.map_err(write_err)
    }

    async fn purge(&mut self, log_id: LogId<ReplicaId>) -> StorageResult<()> {
        let bytes = serde_json::to_vec(&log_id).map_err(read_err)?;
        self.write(vec![Write::LastPurged(bytes)]).map_err(write_err)?;
        self.sync().await.map_err(write_err)?;
        self.write(vec![Write::RemoveTo(log_id.index)]).map_err(write_err)?;
        self.sync().await.map_err(write_err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u64) -> Vec<u8> {
        let e: Entry<TypeConfig> = Entry {
            log_id: LogId::new(openraft::CommittedLeaderId::new(1, 0), index),
            payload: openraft::EntryPayload::Blank,
        };
        serde_json::to_vec(&e).expect("encodes")
    }

    #[tokio::test(start_paused = true)]
    async fn a_crash_loses_unsynced_writes_and_a_torn_entry_is_dropped_at_open() {
        let disk = Disk::new(Duration::from_millis(2));
        let log = disk.open().unwrap();
        log.write(vec![Write::Put(1, entry(1))]).unwrap();
        log.sync().await.unwrap();
        log.write(vec![Write::Put(2, entry(2)), Write::Put(3, entry(3))]).unwrap();
        assert_eq!(disk.unsynced(), 2);
        disk.crash(0, false);
        let mut log = disk.open().unwrap();
        let state = log.get_log_state().await.unwrap();
        assert_eq!(state.last_log_id.map(|l| l.index), Some(1), "unsynced entries are gone");
        // The stale handle of the crashed incarnation cannot write.
        log.write(vec![Write::Put(2, entry(2)), Write::Put(3, entry(3))]).unwrap();
        disk.crash(1, true);
        let mut reopened = disk.open().unwrap();
        let state = reopened.get_log_state().await.unwrap();
        assert_eq!(state.last_log_id.map(|l| l.index), Some(2), "one survived, the torn one dropped");
        assert_eq!(disk.lock().torn_dropped, 1);
        assert!(log.write(vec![Write::Put(9, entry(9))]).is_err(), "a dead incarnation writes nothing");
        disk.lock().full = true;
        assert!(reopened.write(vec![Write::Put(3, entry(3))]).is_err(), "a full disk refuses");
    }

    #[tokio::test(start_paused = true)]
    async fn bit_rot_below_the_commit_record_refuses_the_open_and_changes_nothing() {
        let disk = Disk::new(Duration::from_millis(2));
        let mut log = disk.open().unwrap();
        log.write((1..=4).map(|i| Write::Put(i, entry(i))).collect()).unwrap();
        log.sync().await.unwrap();
        log.save_committed(Some(LogId::new(openraft::CommittedLeaderId::new(1, 0), 3))).await.unwrap();
        log.sync().await.unwrap();
        disk.crash(0, false);
        assert!(disk.rot(1), "a committed entry to rot");
        let before = disk.lock().durable.entries.clone();
        let e = disk.open().expect_err("a damaged log was opened");
        assert!(e.contains("damaged") && e.contains("committed"), "{e}");
        assert_eq!(disk.lock().durable.entries, before, "the refused open changed the log");
        // The broken build cuts it off instead: committed entries are gone.
        let broken = Disk { cuts_damage: true, ..disk.clone() };
        let mut cut = broken.open().unwrap();
        let last = cut.get_log_state().await.unwrap().last_log_id.map(|l| l.index);
        assert!(last.is_some_and(|l| l < 3), "{last:?}");
    }
}

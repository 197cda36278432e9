//! The Raft log's files: an append-only, segmented write-ahead log with one fsync thread.
//!
//! ```text
//!   raft.log/
//!     LOCK                         flock'd while a kairosd holds the directory
//!     00000000000000000001.wal     segments, named by the index of their first record
//!     00000000000000052311.wal     (a new one once the last passes SEGMENT_BYTES)
//!
//!   segment = "KRSWAL01" record*
//!   record  = len:u32le crc:u32le index:u64le payload[len]     crc = crc32(index ‖ payload)
//! ```
//!
//! An append writes its records with one positioned write into the last segment (page cache)
//! and hands the file to the sync thread; the thread takes every request queued meanwhile,
//! fdatasyncs each file once (and the directory when a segment was created or removed), then
//! reports them done in order. So an append is acknowledged only once on disk, and concurrent
//! appends share one fsync. (It replaced sled, whose background I/O threads' hand-offs cost a
//! follower about 40 % of its CPU under a submit load, for a structure a log does not need.)
//!
//! A new segment is created only after the previous one is synced, so a segment with a later
//! one beside it is whole on disk: a crash can tear only the **last** segment's tail.
//!
//! Recovery (`open`): records are checked in order — length, checksum, consecutive index. In the
//! last segment the first one that fails ends the log: it and everything after it are cut off.
//! That is exactly what a power cut can leave (a torn or missing tail of writes never
//! acknowledged, since each acknowledgement waits for the sync of everything written before it).
//! A record that fails in any other segment is damage (a flipped bit, a bad sector), not a
//! crash: `open` refuses with `InvalidData` naming the segment and changes nothing, since
//! cutting there would drop acknowledged entries. A gap between segments (what an interrupted
//! truncation can leave) ends the log there; segments wholly at or below the purge point are
//! removed. Truncation removes later segments and cuts the containing one, durably, before it
//! returns.
//!
//! The log also knows how far it is on disk (`durable_last`): what `open` found, advanced as
//! each append's sync completes, pulled back by a truncation.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::executor::{Executor, Threads};
use crate::fs::{Fs, FsFile, Mode};

/// The log's directory under the data directory.
pub const DIR: &str = "raft.log";
/// First bytes of every segment: the format and its version.
const MAGIC: &[u8; 8] = b"KRSWAL01";
const HEADER: u64 = MAGIC.len() as u64;
const RECORD_HEAD: usize = 16;
/// A segment past this size gets no more records; the next append starts a new one (the
/// simulation's logs use small segments, so its crashes meet logs of many).
pub const SEGMENT_BYTES: u64 = 64 << 20;
/// Largest payload a record header may announce (larger is damage, not an entry).
const RECORD_BYTES_MAX: u64 = 1 << 30;

/// What `open` found and repaired.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Recovery {
    /// Bytes cut off the end of the log (a torn or unchecked tail).
    pub cut_bytes: u64,
    /// Segments removed: after the end of the log, or wholly purged.
    pub removed_segments: usize,
}

pub use crate::executor::{Done, SyncJob};

struct Segment {
    first: u64,
    path: PathBuf,
    file: Arc<dyn FsFile>,
    /// End offset of each record, in order (record `i` holds index `first + i`).
    ends: Vec<u64>,
}

impl Segment {
    fn len(&self) -> u64 {
        self.ends.last().copied().unwrap_or(HEADER)
    }

    fn count(&self) -> u64 {
        self.ends.len() as u64
    }

    /// The index the next record of this segment must have.
    fn next(&self) -> u64 {
        self.first + self.count()
    }

    fn start_of(&self, i: usize) -> u64 {
        if i == 0 {
            HEADER
        } else {
            self.ends[i - 1]
        }
    }
}

pub struct Wal {
    fs: Arc<dyn Fs>,
    dir: PathBuf,
    segment_bytes: u64,
    segments: Mutex<Vec<Segment>>,
    /// How far the log is on disk: (truncations so far, one past the last index synced).
    durable: Arc<Mutex<(u64, u64)>>,
    sync: tokio::sync::mpsc::UnboundedSender<SyncJob>,
    /// Held (flock'd) for the life of the log.
    _lock: Box<dyn Send + Sync>,
}

fn damaged(why: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why)
}

fn segment_name(first: u64) -> String {
    format!("{first:020}.wal")
}

/// The valid records of a segment's bytes: their end offsets and where the valid part ends.
fn scan(bytes: &[u8], first: u64) -> (Vec<u64>, u64) {
    let mut ends = Vec::new();
    let mut at = HEADER as usize;
    while bytes.len() - at >= RECORD_HEAD {
        let head = &bytes[at..at + RECORD_HEAD];
        let len = u64::from(u32::from_le_bytes([head[0], head[1], head[2], head[3]]));
        let crc = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
        let index = u64::from_le_bytes(head[8..16].try_into().unwrap_or_default());
        let end = at as u64 + RECORD_HEAD as u64 + len;
        if index != first + ends.len() as u64 || len > RECORD_BYTES_MAX || end > bytes.len() as u64 {
            break;
        }
        if checksum(&head[8..16], &bytes[at + RECORD_HEAD..end as usize]) != crc {
            break;
        }
        ends.push(end);
        at = end as usize;
    }
    (ends, at as u64)
}

fn checksum(index: &[u8], payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(index);
    h.update(payload);
    h.finalize()
}

/// Appends the record of entry `index` to `buf`.
fn encode_record(buf: &mut Vec<u8>, index: u64, payload: &[u8]) {
    let index = index.to_le_bytes();
    buf.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    buf.extend_from_slice(&checksum(&index, payload).to_le_bytes());
    buf.extend_from_slice(&index);
    buf.extend_from_slice(payload);
}

/// The records a segment's bytes hold, in order, as (index, byte range of the record), up to
/// the first that fails its check; and where the valid part ends. What recovery reads, for
/// tools that look at a log's files (the simulation's disk).
pub fn records(bytes: &[u8], first: u64) -> (Vec<(u64, std::ops::Range<u64>)>, u64) {
    if !bytes.starts_with(MAGIC) {
        return (Vec::new(), 0);
    }
    let (ends, valid) = scan(bytes, first);
    let mut start = HEADER;
    let spans = ends
        .iter()
        .enumerate()
        .map(|(i, end)| {
            let span = (first + i as u64, start..*end);
            start = *end;
            span
        })
        .collect();
    (spans, valid)
}

/// The index of the first record of a segment named `path` (None: not a segment).
pub fn segment_first(path: &Path) -> Option<u64> {
    path.file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_suffix(".wal"))
        .and_then(|n| n.parse().ok())
}

/// One line naming where acknowledged entries would be lost.
fn lost(path: &Path, from: u64, kept: Option<u64>) -> io::Error {
    damaged(format!(
        "{}: entries from {from} are missing or fail their check, but entries through {} are committed",
        path.display(),
        kept.unwrap_or_default()
    ))
}

/// The segments in `dir` by their first index, after removing those wholly at or below the
/// purge point (the next one starts at or before the entry after it): their entries are in the
/// snapshot, and one whose removal a crash undid must not pass for the log's end at the gap
/// after it.
fn segment_names(
    fs: &dyn Fs,
    dir: &Path,
    purged: Option<u64>,
    recovery: &mut Recovery,
) -> io::Result<Vec<(u64, PathBuf)>> {
    let mut names: Vec<(u64, PathBuf)> =
        fs.list(dir)?.into_iter().filter_map(|path| Some((segment_first(&path)?, path))).collect();
    names.sort();
    if let Some(purged) = purged {
        while names.len() >= 2 && names[1].0 <= purged.saturating_add(1) {
            let (_, path) = names.remove(0);
            fs.remove(&path)?;
            recovery.removed_segments += 1;
        }
    }
    Ok(names)
}

/// The segments checked in order: a gap or a cut tail ends the log (what follows is removed);
/// damage before the last segment, or any cut of an entry at or below `kept`, refuses.
fn recover_segments(
    fs: &dyn Fs,
    names: Vec<(u64, PathBuf)>,
    kept: Option<u64>,
    recovery: &mut Recovery,
) -> io::Result<Vec<Segment>> {
    let mut segments: Vec<Segment> = Vec::new();
    let mut ended = false;
    let count = names.len();
    for (position, (first, path)) in names.into_iter().enumerate() {
        let expected = segments.last().map(Segment::next);
        if let Some(e) = expected.filter(|e| !ended && *e != first && kept.is_some_and(|k| *e <= k)) {
            return Err(lost(&path, e, kept));
        }
        if ended || expected.is_some_and(|e| e != first) {
            // After the end of the log (a cut tail, or a gap): never acknowledged.
            fs.remove(&path)?;
            recovery.removed_segments += 1;
            ended = true;
            continue;
        }
        let (segment, cut) = recover_segment(fs, first, path, position + 1 == count, kept)?;
        recovery.cut_bytes += cut;
        ended = cut > 0;
        segments.push(segment);
    }
    Ok(segments)
}

/// One segment checked record by record; in the last, a torn tail is cut off (and how many
/// bytes were cut is returned); anywhere else a record that fails is damage.
fn recover_segment(
    fs: &dyn Fs,
    first: u64,
    path: PathBuf,
    last: bool,
    kept: Option<u64>,
) -> io::Result<(Segment, u64)> {
    let mut bytes = fs.read(&path)?;
    let file = fs.open(&path, Mode::Existing)?;
    if !bytes.starts_with(MAGIC) {
        if !MAGIC.starts_with(&bytes) || !last {
            return Err(damaged(format!("{} is not a kairos log segment", path.display())));
        }
        if kept.is_some_and(|k| first <= k) {
            return Err(lost(&path, first, kept));
        }
        // Created, its header torn: an empty segment.
        file.write_at(MAGIC, 0)?;
        file.set_len(HEADER)?;
        file.sync()?;
        bytes = MAGIC.to_vec();
    }
    let (ends, valid) = scan(&bytes, first);
    let mut cut = 0;
    if valid < bytes.len() as u64 {
        let bad = first + ends.len() as u64;
        if !last {
            return Err(damaged(format!(
                "segment {} fails its check at entry {bad} (byte {valid}) and later segments follow: damaged, not a crash's torn tail",
                path.display(),
            )));
        }
        if kept.is_some_and(|k| bad <= k) {
            return Err(lost(&path, bad, kept));
        }
        cut = bytes.len() as u64 - valid;
        file.set_len(valid)?;
        file.sync()?;
    }
    Ok((Segment { first, path, file, ends }, cut))
}

impl Wal {
    /// Opens (creating when missing) the log in `dir`, repairing a torn tail and dropping
    /// segments wholly at or below `purged` (the purge point). `WouldBlock` when another
    /// process holds it; `InvalidData` for a segment that is not one of ours, for damage before
    /// the last segment, and for any repair that would remove an entry at or below `committed`
    /// (the commit record: entries known to be on disk and acknowledged) — nothing is changed
    /// then.
    pub fn open(dir: &Path, purged: Option<u64>, committed: Option<u64>) -> io::Result<(Wal, Recovery)> {
        Wal::open_on(crate::fs::OsFs::shared(), Threads::shared(), dir, SEGMENT_BYTES, purged, committed)
    }

    /// `open` on the file system `fs`, syncing through `executor`, with segments of
    /// `segment_bytes`.
    pub fn open_on(
        fs: Arc<dyn Fs>,
        executor: Arc<dyn Executor>,
        dir: &Path,
        segment_bytes: u64,
        purged: Option<u64>,
        committed: Option<u64>,
    ) -> io::Result<(Wal, Recovery)> {
        // Entries at or below this were acknowledged: no repair may remove them.
        let kept = committed.filter(|c| purged.is_none_or(|p| c > &p));
        let created = !fs.exists(dir);
        fs.create_dir_all(dir)?;
        if created {
            if let Some(parent) = dir.parent() {
                fs.sync_dir(parent)?;
            }
        }
        let lock = fs.lock(dir)?;
        let mut recovery = Recovery::default();
        let names = segment_names(fs.as_ref(), dir, purged, &mut recovery)?;
        let mut segments = recover_segments(fs.as_ref(), names, kept, &mut recovery)?;
        let end = segments.iter().rev().find(|s| s.count() > 0).map(Segment::next);
        if let Some(k) = kept.filter(|k| end.is_none_or(|e| e <= *k)) {
            return Err(damaged(format!(
                "{}: the log ends at {} but entries through {k} are committed",
                dir.display(),
                end.map_or("nothing".to_string(), |e| (e - 1).to_string())
            )));
        }
        // The last segment too, when all it holds is purged.
        if let Some(purged) = purged {
            while segments.first().is_some_and(|s| s.next() <= purged + 1) {
                let s = segments.remove(0);
                fs.remove(&s.path)?;
                recovery.removed_segments += 1;
            }
        }
        if recovery != Recovery::default() {
            fs.sync_dir(dir)?;
        }
        // What a previous process wrote may still be only in the page cache: on disk from now.
        if let Some(s) = segments.last() {
            s.file.sync()?;
        }
        let durable_next = segments.iter().rev().find(|s| s.count() > 0).map_or(0, Segment::next);
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let (round_fs, round_dir) = (fs.clone(), dir.to_path_buf());
        executor.syncer(rx, Box::new(move |jobs| sync_round(round_fs.as_ref(), &round_dir, jobs)))?;
        Ok((
            Wal {
                fs,
                dir: dir.to_path_buf(),
                segment_bytes: segment_bytes.max(HEADER + 1),
                segments: Mutex::new(segments),
                durable: Arc::new(Mutex::new((0, durable_next))),
                sync: tx,
                _lock: lock,
            },
            recovery,
        ))
    }

    fn segments(&self) -> std::sync::MutexGuard<'_, Vec<Segment>> {
        self.segments.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn submit(&self, files: Vec<Arc<dyn FsFile>>, dir: bool, done: Done) {
        let job = SyncJob { files, dir, done };
        if let Err(tokio::sync::mpsc::error::SendError(job)) = self.sync.send(job) {
            (job.done)(Err(io::Error::other("the log's sync thread has stopped")));
        }
    }

    fn durable(&self) -> std::sync::MutexGuard<'_, (u64, u64)> {
        self.durable.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The last index known to be on disk (None: none).
    pub fn durable_last(&self) -> Option<u64> {
        self.durable().1.checked_sub(1)
    }

    /// The first and last index held (None when empty).
    pub fn bounds(&self) -> Option<(u64, u64)> {
        let segs = self.segments();
        let first = segs.iter().find(|s| s.count() > 0)?.first;
        let last = segs.iter().rev().find(|s| s.count() > 0).map(|s| s.next() - 1)?;
        Some((first, last))
    }

    /// Writes `records` (consecutive indexes, following the last) to the page cache at once and
    /// calls `done` once they are on disk.
    pub fn append(&self, records: &[(u64, Vec<u8>)], done: Done) -> io::Result<()> {
        let Some(last_index) = records.last().map(|r| r.0) else {
            self.submit(Vec::new(), false, done);
            return Ok(());
        };
        let done = self.marking_durable(last_index, done);
        let mut segs = self.segments();
        let mut files: Vec<Arc<dyn FsFile>> = Vec::new();
        let mut created = false;
        let mut i = 0;
        while i < records.len() {
            created |= self.make_room(&mut segs, records[i].0)?;
            let seg = segs.last_mut().ok_or_else(|| io::Error::other("no segment"))?;
            i += self.write_some(seg, &records[i..])?;
            if !files.iter().any(|f| Arc::ptr_eq(f, &seg.file)) {
                files.push(seg.file.clone());
            }
        }
        drop(segs);
        self.submit(files, created, done);
        Ok(())
    }

    /// `done`, which first moves the durable mark through `last_index` once the sync succeeded.
    /// Once synced, the log is on disk through the last record — unless a truncation came
    /// meanwhile (it pulled the mark back, and these records may be gone).
    fn marking_durable(&self, last_index: u64, done: Done) -> Done {
        let durable = self.durable.clone();
        let generation = self.durable().0;
        Box::new(move |result| {
            if result.is_ok() {
                let mut d = durable.lock().unwrap_or_else(|p| p.into_inner());
                if d.0 == generation {
                    d.1 = d.1.max(last_index + 1);
                }
            }
            done(result)
        })
    }

    /// Makes the last of `segs` the one the record `index` goes to: starts a new segment when
    /// there is none, the last is full, or `index` does not follow it (refused when it would
    /// overwrite). Whether a segment was created (its directory entry needs a sync).
    fn make_room(&self, segs: &mut Vec<Segment>, index: u64) -> io::Result<bool> {
        let need_new = match segs.last() {
            None => true,
            Some(s) if s.count() == 0 && s.next() != index => {
                // An empty segment left where the log now starts elsewhere.
                self.fs.remove(&s.path)?;
                segs.pop();
                true
            }
            Some(s) if s.next() > index => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("append of entry {index} over entry {} (truncate first)", s.next() - 1),
                ))
            }
            // openraft appends each entry after the last; a gap (only its conformance
            // suite makes one) starts a segment of its own. At open, a gap ends the log.
            Some(s) if s.next() < index => true,
            Some(s) => s.len() >= self.segment_bytes,
        };
        if need_new {
            // The previous segment whole on disk before the next exists: only the last
            // segment's tail can ever be torn (what `open` relies on).
            if let Some(previous) = segs.last() {
                previous.file.sync()?;
            }
            let path = self.dir.join(segment_name(index));
            let file = self.fs.open(&path, Mode::New)?;
            file.write_at(MAGIC, 0)?;
            segs.push(Segment { first: index, path, file, ends: Vec::new() });
        }
        Ok(need_new)
    }

    /// Writes the first of `records` (at least one) to `seg` in one write, as many as fit
    /// before it reaches the segment size. How many were written.
    fn write_some(&self, seg: &mut Segment, records: &[(u64, Vec<u8>)]) -> io::Result<usize> {
        let start = seg.len();
        let mut buf = Vec::new();
        let mut ends = Vec::new();
        let mut written = 0;
        while written < records.len() && start + (buf.len() as u64) < self.segment_bytes {
            encode_record(&mut buf, records[written].0, &records[written].1);
            ends.push(start + buf.len() as u64);
            written += 1;
        }
        seg.file.write_at(&buf, start)?;
        seg.ends.extend(ends);
        Ok(written)
    }

    /// The payloads of the entries in `from..to` that the log holds, in order.
    pub fn read(&self, from: u64, to: u64) -> io::Result<Vec<(u64, Vec<u8>)>> {
        self.read_within(from, to, u64::MAX)
    }

    /// `read`, stopping before the record that would take the records read past `budget` bytes
    /// (at least one record is read): the size is known from the index before anything is read.
    pub fn read_within(&self, from: u64, to: u64, budget: u64) -> io::Result<Vec<(u64, Vec<u8>)>> {
        let mut out = Vec::new();
        if from >= to {
            return Ok(out);
        }
        let mut left = budget;
        let segs = self.segments();
        for seg in segs.iter() {
            if seg.count() == 0 || seg.next() <= from || seg.first >= to {
                continue;
            }
            let lo = from.max(seg.first);
            let a = (lo - seg.first) as usize;
            let start = seg.start_of(a);
            let mut b = (to.min(seg.next()) - seg.first) as usize;
            // The records a..b that fit what is left of the budget (the first always, when
            // nothing was read yet).
            let fit = seg.ends[a..b].partition_point(|end| end - start <= left);
            let fit = if out.is_empty() { fit.max(1) } else { fit };
            b = a + fit;
            if fit == 0 {
                break;
            }
            let hi = seg.first + b as u64;
            let end = seg.ends[b - 1];
            left = left.saturating_sub(end - start);
            let mut bytes = vec![0u8; (end - start) as usize];
            seg.file.read_at(&mut bytes, start)?;
            let mut at = 0usize;
            for index in lo..hi {
                let head = bytes
                    .get(at..at + RECORD_HEAD)
                    .ok_or_else(|| damaged(format!("log entry {index} is cut short")))?;
                let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
                let crc = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
                let payload = bytes
                    .get(at + RECORD_HEAD..at + RECORD_HEAD + len)
                    .ok_or_else(|| damaged(format!("log entry {index} is cut short")))?;
                if head[8..16] != index.to_le_bytes() || checksum(&head[8..16], payload) != crc {
                    return Err(damaged(format!("log entry {index} fails its checksum")));
                }
                out.push((index, payload.to_vec()));
                at += RECORD_HEAD + len;
            }
            if hi < to.min(seg.next()) || left == 0 {
                break;
            }
        }
        Ok(out)
    }

    /// Removes the entries from `from` on, durably, before returning (`done` is called then).
    pub fn truncate(&self, from: u64, done: Done) -> io::Result<()> {
        {
            let mut d = self.durable();
            d.0 += 1;
            d.1 = d.1.min(from);
        }
        let mut segs = self.segments();
        let mut removed = false;
        while segs.last().is_some_and(|s| s.first >= from && !(s.first == from && s.count() == 0)) {
            if let Some(s) = segs.pop() {
                self.fs.remove(&s.path)?;
                removed = true;
            }
        }
        let mut files = Vec::new();
        if let Some(seg) = segs.last_mut() {
            if seg.next() > from {
                seg.ends.truncate((from - seg.first) as usize);
                seg.file.set_len(seg.len())?;
                files.push(seg.file.clone());
            }
        }
        drop(segs);
        self.submit(files, removed, done);
        Ok(())
    }

    /// Removes the segments whose entries are all at or below `upto` (what a snapshot covers);
    /// `done` is called once that is durable.
    pub fn purge(&self, upto: u64, done: Done) -> io::Result<()> {
        let mut segs = self.segments();
        let mut removed = false;
        while segs.first().is_some_and(|s| s.next() <= upto + 1) {
            let s = segs.remove(0);
            self.fs.remove(&s.path)?;
            removed = true;
        }
        drop(segs);
        self.submit(Vec::new(), removed, done);
        Ok(())
    }

    /// The directory holding the log.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// One round of the sync thread (`Executor::syncer` runs them): every request queued meanwhile,
/// each file synced once (and the directory when asked), then the requests reported done in
/// the order they came.
fn sync_round(fs: &dyn Fs, dir: &Path, jobs: Vec<SyncJob>) {
    let mut synced: Vec<&Arc<dyn FsFile>> = Vec::new();
    let mut result = Ok(());
    for job in &jobs {
        for f in &job.files {
            if result.is_ok() && !synced.iter().any(|s| Arc::ptr_eq(s, f)) {
                result = f.sync();
                synced.push(f);
            }
        }
    }
    if result.is_ok() && jobs.iter().any(|j| j.dir) {
        result = fs.sync_dir(dir);
    }
    let why = result.err().map(|e| e.to_string());
    if let Some(why) = &why {
        crate::failstop::storage_failed(&format!("syncing the log: {why}"));
    }
    for job in jobs {
        (job.done)(match &why {
            None => Ok(()),
            Some(why) => Err(io::Error::other(why.clone())),
        });
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;

    fn done_now() -> (Done, mpsc::Receiver<io::Result<()>>) {
        let (tx, rx) = mpsc::channel();
        (
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
            rx,
        )
    }

    fn append(wal: &Wal, from: u64, to: u64) {
        let records: Vec<(u64, Vec<u8>)> =
            (from..to).map(|i| (i, format!("entry {i}").into_bytes())).collect();
        let (done, rx) = done_now();
        wal.append(&records, done).unwrap();
        rx.recv().unwrap().unwrap();
    }

    fn indexes(wal: &Wal) -> Vec<u64> {
        wal.read(0, u64::MAX).unwrap().into_iter().map(|(i, _)| i).collect()
    }

    #[test]
    fn entries_are_read_back_after_reopening_and_truncation_and_purge_hold() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(DIR);
        {
            let (wal, rec) = Wal::open(&path, None, None).unwrap();
            assert_eq!(rec, Recovery::default());
            append(&wal, 1, 11);
            assert_eq!(wal.read(3, 5).unwrap(), vec![(3, b"entry 3".to_vec()), (4, b"entry 4".to_vec())]);
            let (done, rx) = done_now();
            wal.truncate(8, done).unwrap();
            rx.recv().unwrap().unwrap();
            assert_eq!(wal.bounds(), Some((1, 7)));
            append(&wal, 8, 9);
        }
        let (wal, rec) = Wal::open(&path, None, None).unwrap();
        assert_eq!(rec, Recovery::default());
        assert_eq!(indexes(&wal), (1..9).collect::<Vec<_>>());
        let e = wal.append(&[(5, b"x".to_vec())], Box::new(|_| {})).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        // A gap starts a segment; at open, a gap ends the log (only a truncation cut short
        // leaves one there).
        append(&wal, 20, 22);
        assert_eq!(indexes(&wal), (1..9).chain(20..22).collect::<Vec<_>>());
        drop(wal);
        let (wal, rec) = Wal::open(&path, None, None).unwrap();
        assert_eq!(rec.removed_segments, 1);
        assert_eq!(indexes(&wal), (1..9).collect::<Vec<_>>());
    }

    #[test]
    fn a_segment_a_purge_removed_before_a_crash_does_not_end_the_log_at_the_gap_after_it() {
        // A snapshot was installed (purge point 9, past the end of the log, whose old segment
        // was removed) and entries 10.. appended; the crash undid the removal.
        let dir = tempfile::tempdir().unwrap();
        for (first, to) in [(1u64, 4u64), (10, 13)] {
            let mut bytes = MAGIC.to_vec();
            for i in first..to {
                encode_record(&mut bytes, i, b"entry");
            }
            std::fs::write(dir.path().join(segment_name(first)), bytes).unwrap();
        }
        let (wal, rec) = Wal::open(dir.path(), Some(9), None).unwrap();
        assert_eq!(indexes(&wal), vec![10, 11, 12], "the acknowledged entries after the snapshot stay");
        assert_eq!(rec, Recovery { cut_bytes: 0, removed_segments: 1 });
    }

    #[test]
    fn a_read_within_a_budget_stops_before_the_record_that_would_pass_it() {
        let dir = tempfile::tempdir().unwrap();
        let (wal, _) = Wal::open(dir.path(), None, None).unwrap();
        append(&wal, 1, 4);
        // Two segments: a gap starts the second.
        append(&wal, 4, 4);
        append(&wal, 10, 13);
        // Each record is its payload ("entry N", 7 bytes; "entry 1N", 8) and a 16-byte head.
        let within = |from, to, budget| -> Vec<u64> {
            wal.read_within(from, to, budget).unwrap().into_iter().map(|(i, _)| i).collect()
        };
        assert_eq!(within(1, 4, 2 * 23), vec![1, 2]);
        assert_eq!(within(1, 4, 2 * 23 - 1), vec![1]);
        assert_eq!(within(2, 4, 1), vec![2], "the first record always comes");
        assert_eq!(within(1, 13, 3 * 23 + 24), vec![1, 2, 3, 10], "across segments");
        assert_eq!(within(1, 13, 3 * 23 + 23), vec![1, 2, 3]);
        assert_eq!(within(1, 13, u64::MAX), vec![1, 2, 3, 10, 11, 12]);
        assert_eq!(within(11, 12, 1), vec![11]);
    }

    #[test]
    fn a_second_process_cannot_open_the_same_log() {
        let dir = tempfile::tempdir().unwrap();
        let (_wal, _) = Wal::open(dir.path(), None, None).unwrap();
        // flock locks belong to the open file description: a second open conflicts.
        assert!(Wal::open(dir.path(), None, None).is_err());
    }

    #[test]
    fn a_torn_tail_is_cut_and_a_segment_after_a_gap_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let seg = dir.path().join(segment_name(1));
        {
            let (wal, _) = Wal::open(dir.path(), None, None).unwrap();
            append(&wal, 1, 6);
        }
        // Tear the last record: its last byte never reached the disk.
        let len = std::fs::metadata(&seg).unwrap().len();
        std::fs::OpenOptions::new().write(true).open(&seg).unwrap().set_len(len - 1).unwrap();
        let (wal, rec) = Wal::open(dir.path(), None, None).unwrap();
        assert_eq!(indexes(&wal), vec![1, 2, 3, 4]);
        assert_eq!(wal.durable_last(), Some(4));
        assert!(rec.cut_bytes > 0);
        drop(wal);
        // A segment that cannot follow (what an interrupted truncation leaves): after the end.
        let later = dir.path().join(segment_name(6));
        let mut bytes = MAGIC.to_vec();
        encode_record(&mut bytes, 6, b"never acknowledged");
        std::fs::write(&later, bytes).unwrap();
        let (wal, rec) = Wal::open(dir.path(), None, None).unwrap();
        assert_eq!(indexes(&wal), vec![1, 2, 3, 4]);
        assert_eq!(rec.removed_segments, 1);
        assert!(!later.exists());
        append(&wal, 5, 7);
        assert_eq!(indexes(&wal), (1..7).collect::<Vec<_>>());
    }

    #[test]
    fn a_flipped_bit_in_a_segment_before_the_last_is_damage_and_nothing_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let (wal, _) = Wal::open(dir.path(), None, None).unwrap();
        // Records of ~1 MiB: a segment takes 64 of them; three segments.
        let big = vec![7u8; 1 << 20];
        for i in 1..=130u64 {
            let (done, rx) = done_now();
            wal.append(&[(i, big.clone())], done).unwrap();
            rx.recv().unwrap().unwrap();
        }
        assert_eq!(wal.durable_last(), Some(130));
        drop(wal);
        let mut segs: Vec<PathBuf> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "wal"))
            .collect();
        segs.sort();
        assert_eq!(segs.len(), 3);
        let before: Vec<u64> = segs.iter().map(|p| std::fs::metadata(p).unwrap().len()).collect();
        // One flipped bit in the middle of the first segment.
        let mut bytes = std::fs::read(&segs[0]).unwrap();
        let at = bytes.len() / 2;
        bytes[at] ^= 0x10;
        std::fs::write(&segs[0], &bytes).unwrap();
        let e = Wal::open(dir.path(), None, None).err().unwrap();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
        let text = e.to_string();
        assert!(text.contains(&segs[0].display().to_string()) && text.contains("damaged"), "{text}");
        assert!(!text.contains('\n'), "{text}");
        // Nothing was cut or removed: the acknowledged entries are all still there to recover.
        let after: Vec<u64> =
            segs.iter().map(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)).collect();
        assert_eq!(before, after);
        // A torn header of a segment with a later one beside it is damage too.
        std::fs::write(&segs[0], &bytes[..at]).unwrap();
        std::fs::write(&segs[1], b"KRS").unwrap();
        assert_eq!(Wal::open(dir.path(), None, None).err().unwrap().kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn the_durable_mark_follows_syncs_and_a_truncation_pulls_it_back() {
        let dir = tempfile::tempdir().unwrap();
        let (wal, _) = Wal::open(dir.path(), None, None).unwrap();
        assert_eq!(wal.durable_last(), None);
        append(&wal, 1, 6);
        assert_eq!(wal.durable_last(), Some(5));
        let (done, rx) = done_now();
        wal.truncate(3, done).unwrap();
        rx.recv().unwrap().unwrap();
        assert_eq!(wal.durable_last(), Some(2));
        append(&wal, 3, 4);
        assert_eq!(wal.durable_last(), Some(3));
    }

    #[test]
    fn a_flipped_bit_ends_the_log_there_and_a_foreign_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let seg = dir.path().join(segment_name(1));
        {
            let (wal, _) = Wal::open(dir.path(), None, None).unwrap();
            append(&wal, 1, 4);
        }
        let mut bytes = std::fs::read(&seg).unwrap();
        let last = bytes.len() - 2;
        bytes[last] ^= 0x40;
        std::fs::write(&seg, &bytes).unwrap();
        let (wal, _) = Wal::open(dir.path(), None, None).unwrap();
        assert_eq!(indexes(&wal), vec![1, 2]);
        drop(wal);
        std::fs::write(&seg, b"{\"not\": \"a log\"}").unwrap();
        let e = Wal::open(dir.path(), None, None).err().unwrap();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
    }

    #[test]
    fn segments_roll_over_and_purged_ones_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let (wal, _) = Wal::open(dir.path(), None, None).unwrap();
        // Records of ~1 MiB: a segment takes 64 of them.
        let big = vec![7u8; 1 << 20];
        for i in 1..=70u64 {
            let (done, rx) = done_now();
            wal.append(&[(i, big.clone())], done).unwrap();
            rx.recv().unwrap().unwrap();
        }
        let count = || {
            std::fs::read_dir(dir.path())
                .unwrap()
                .filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|x| x == "wal"))
                .count()
        };
        assert_eq!(count(), 2);
        let (done, rx) = done_now();
        wal.purge(60, done).unwrap();
        rx.recv().unwrap().unwrap();
        assert_eq!(count(), 2, "the first segment still holds entries after 60");
        let (done, rx) = done_now();
        wal.purge(65, done).unwrap();
        rx.recv().unwrap().unwrap();
        assert_eq!(count(), 1);
        assert_eq!(wal.bounds().map(|b| b.1), Some(70));
        drop(wal);
        let (wal, rec) = Wal::open(dir.path(), Some(70), None).unwrap();
        assert_eq!(rec.removed_segments, 1, "wholly purged at open");
        assert_eq!(wal.bounds(), None);
        // After a purge past the end (a snapshot installed), the log restarts anywhere.
        append(&wal, 100, 102);
        assert_eq!(indexes(&wal), vec![100, 101]);
    }
}

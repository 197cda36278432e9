//! The simulated disk under the production log: crashes lose the page cache, a torn write is
//! cut off by the real recovery, damage refuses the open — and openraft's conformance suite
//! passes on it.

use std::path::Path;

use kairos_consensus::store::{LogStore, StateMachineStore};
use kairos_consensus::wal::Wal;
use kairos_consensus::TypeConfig;
use openraft::storage::RaftLogStorage;
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId};

use super::*;

/// Three entries a segment.
const SEGMENT: u64 = 300;

fn log_dir() -> std::path::PathBuf {
    Path::new(DATA_DIR).join(wal::DIR)
}

fn entry(index: u64) -> Vec<u8> {
    let e: Entry<TypeConfig> =
        Entry { log_id: LogId::new(CommittedLeaderId::new(1, 0), index), payload: EntryPayload::Blank };
    serde_json::to_vec(&e).expect("encodes")
}

/// Appends entry `index` and returns a receiver told once it is on disk.
fn append(wal: &Wal, index: u64) -> tokio::sync::oneshot::Receiver<io::Result<()>> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    wal.append(&[(index, entry(index))], Box::new(move |r| drop(tx.send(r)))).expect("appended");
    rx
}

/// The log on a new incarnation of `disk`.
fn open_wal(disk: &Disk, committed: Option<u64>) -> io::Result<(Wal, wal::Recovery)> {
    Wal::open_on(disk.incarnation(), disk.executor(), &log_dir(), SEGMENT, None, committed)
}

#[tokio::test(start_paused = true)]
async fn a_crash_loses_what_was_not_synced_and_the_real_recovery_cuts_a_torn_tail() {
    let disk = Disk::new(Duration::from_millis(2), SEGMENT);
    let (wal, _) = open_wal(&disk, None).unwrap();
    for i in 1..=10 {
        append(&wal, i).await.unwrap().unwrap();
    }
    let segments = disk.lock().durable_segments().len();
    assert!(segments >= 3, "small segments roll over: {segments}");
    // Written, never synced: a crash loses them.
    let _unsynced = (append(&wal, 11), append(&wal, 12));
    assert!(disk.unsynced() >= 2);
    disk.crash(0, false);
    let (wal, rec) = open_wal(&disk, Some(10)).unwrap();
    assert_eq!(wal.bounds(), Some((1, 10)), "unsynced entries are gone");
    assert_eq!(rec, wal::Recovery::default());
    // One survives, the next is torn: the recovery cuts it off.
    let _unsynced = (append(&wal, 11), append(&wal, 12));
    disk.crash(1, true);
    let (wal, rec) = open_wal(&disk, Some(10)).unwrap();
    assert_eq!(wal.bounds(), Some((1, 11)));
    assert!(rec.cut_bytes > 0, "{rec:?}");
    // A handle of a crashed incarnation changes nothing; a full disk refuses.
    let stale = disk.incarnation();
    let (wal, _) = open_wal(&disk, Some(10)).unwrap();
    assert!(stale.create_dir_all(Path::new("/elsewhere")).is_err(), "a dead incarnation writes");
    disk.lock().full = true;
    assert!(wal.append(&[(12, entry(12))], Box::new(|_| ())).is_err(), "a full disk took a write");
    assert_eq!(disk.lock().refused, 1);
}

#[tokio::test(start_paused = true)]
async fn a_rotted_record_in_a_middle_segment_is_damage_and_the_open_changes_nothing() {
    let disk = Disk::new(Duration::from_millis(2), SEGMENT);
    let (wal, _) = open_wal(&disk, None).unwrap();
    for i in 1..=12 {
        append(&wal, i).await.unwrap().unwrap();
    }
    drop(wal);
    // The commit record through 12, on the platter.
    let mut store =
        LogStore::open_on(disk.incarnation(), disk.executor(), Path::new(DATA_DIR), 1, SEGMENT).unwrap();
    store.save_committed(Some(LogId::new(CommittedLeaderId::new(1, 0), 12))).await.unwrap();
    drop(store);
    disk.crash(usize::MAX, false);
    // Entry 5, in the second of four segments.
    assert!(disk.rot(4), "a committed record to rot");
    let before = disk.lock().inodes.clone().into_iter().map(|(i, n)| (i, n.durable)).collect::<Vec<_>>();
    let e = disk.open(1).err().expect("a damaged log was opened");
    assert!(e.contains("fails its check at entry 5") && e.contains("later segments follow"), "{e}");
    assert_eq!(disk.lock().damaged_refused, 1);
    let after = disk.lock().inodes.clone().into_iter().map(|(i, n)| (i, n.durable)).collect::<Vec<_>>();
    assert_eq!(before, after, "the refused open changed the disk");
    // The broken build cuts it off instead: committed entries are gone.
    let broken = Disk { cuts_damage: true, ..disk.clone() };
    let mut opened = broken.open(1).expect("the broken recovery opens it");
    let last = opened.log.get_log_state().await.unwrap().last_log_id.map(|l| l.index);
    assert_eq!(last, Some(4), "cut at the rotted entry");
}

#[test]
fn a_lying_disk_acknowledges_syncs_it_has_not_made() {
    let mut d = DiskState::default();
    d.inodes.insert(1, Inode::default());
    let write = |at| Change::Write { inode: 1, at, bytes: vec![7] };
    d.pending = vec![write(0), write(1)];
    d.flush(true, |_| true);
    assert!(d.inodes[&1].durable.is_empty(), "the lying sync wrote nothing");
    d.flush(true, |_| true);
    assert_eq!(d.inodes[&1].durable, vec![7, 7], "written back by the next");
    d.pending = vec![write(2)];
    d.lag = 0;
    d.flush(false, |c| c.inode() == Some(1));
    assert_eq!(d.inodes[&1].durable.len(), 3, "an honest sync writes");
}

struct SimBuilder;

impl openraft::testing::StoreBuilder<TypeConfig, LogStore, StateMachineStore, ()> for SimBuilder {
    async fn build(&self) -> Result<((), LogStore, StateMachineStore), openraft::StorageError<u64>> {
        let disk = Disk::new(Duration::from_micros(50), SEGMENT);
        let opened = disk.open(1).expect("opens");
        Ok(((), opened.log, opened.sm))
    }
}

#[test]
fn the_production_stores_pass_openraft_conformance_suite_on_the_simulated_disk() {
    openraft::testing::Suite::test_all(SimBuilder).expect("conformance suite");
}

//! openraft's storage conformance suite against the write-ahead log and state machine stores,
//! restart durability of a one-member replica, and what damaged files do.

use std::collections::{BTreeMap, BTreeSet};

use kairos_consensus::auth::{set_bearer, ClusterKey};
use kairos_consensus::store::{LogStore, StateMachineStore};
use kairos_consensus::{Replica, ReplicaConfig, TypeConfig};
use kairos_scheduler::{Command, JobSpec, Op, Outcome};
use openraft::testing::{StoreBuilder, Suite};
use openraft::StorageError;
use tempfile::TempDir;

struct WalBuilder;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, TempDir> for WalBuilder {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachineStore), StorageError<u64>> {
        let dir = TempDir::new().expect("temp dir");
        let (tx, _rx) = tokio::sync::watch::channel(0);
        let log = LogStore::open(dir.path(), 1).expect("log store");
        let sm = StateMachineStore::new(dir.path(), tx).expect("state machine");
        Ok((dir, log, sm))
    }
}

#[test]
fn the_stores_pass_openraft_conformance_suite() {
    Suite::test_all(WalBuilder).expect("conformance suite");
}

fn spec(n: usize) -> JobSpec {
    let mut spec = JobSpec::new(&format!("job-{n}"), "alice", vec!["true".into()], 1);
    spec.qos = "batch".into();
    spec
}

async fn wait_leader(replica: &Replica) {
    for _ in 0..200 {
        if replica.is_leader() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    panic!("replica never became leader");
}

const SECRET: &str = "storage-test-cluster-secret-0123456789abcdef";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_restart_through_snapshot_and_log_tail() {
    let dir = TempDir::new().unwrap();
    let config = ReplicaConfig {
        id: 1,
        addr: "127.0.0.1:1".into(),
        snapshot_logs: 10,
        join: false,
        heartbeat_ms: 50,
        election_timeout_ms: 150,
        key: ClusterKey::new(SECRET),
        peer_tls: None,
    };
    let members = BTreeMap::from([(1, config.addr.clone())]);
    let mut acked = BTreeSet::new();
    let digest_before;
    {
        let replica = Replica::open(&config, dir.path(), &members).await.unwrap();
        wait_leader(&replica).await;
        for n in 0..25 {
            let outcomes = replica
                .write(vec![Command {
                    skipped_ms: 0,
                    now_ms: n as i64,
                    op: Op::Submit { spec: spec(n), request_id: None, hold: false, limits: None },
                }])
                .await
                .unwrap();
            match &outcomes[..] {
                [Outcome::Submitted { job }] => assert!(acked.insert(*job)),
                other => panic!("unexpected outcomes {other:?}"),
            }
        }
        // 25 entries with a threshold of 10: at least one snapshot was taken and the log compacted.
        let mut snap = None;
        for _ in 0..200 {
            snap = replica.raft.metrics().borrow().snapshot;
            if snap.is_some() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        }
        assert!(snap.is_some(), "no snapshot was built");
        digest_before = replica.status().state_digest;
        replica.raft.shutdown().await.unwrap();
    }
    // Reopen from the same directory: snapshot + log tail restore every acknowledged job.
    // The stopped instance's tasks release the log's lock shortly after shutdown.
    let mut reopened = None;
    for _ in 0..100 {
        match Replica::open(&config, dir.path(), &members).await {
            Ok(r) => {
                reopened = Some(r);
                break;
            }
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
        }
    }
    let replica = reopened.expect("reopening the data dir");
    // A second instance on the same data dir is refused with a clear error.
    match Replica::open(&config, dir.path(), &members).await {
        Err(e) => assert_eq!(
            e.to_string(),
            format!("data directory {} is in use by another kairosd", dir.path().display())
        ),
        Ok(_) => panic!("two replicas opened one data dir"),
    }
    wait_leader(&replica).await;
    let mut applied_all = false;
    for _ in 0..200 {
        applied_all = replica.read(|a| acked.iter().all(|id| a.state.jobs.contains_key(id)));
        if applied_all {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    assert!(applied_all, "acknowledged jobs missing after restart");
    assert_eq!(replica.read(|a| a.state.jobs.len()), 25);
    assert_eq!(replica.status().state_digest, digest_before);
    // Ids continue after the restart instead of being reused.
    let outcomes = replica
        .write(vec![Command {
            skipped_ms: 0,
            now_ms: 99,
            op: Op::Submit { spec: spec(99), request_id: None, hold: false, limits: None },
        }])
        .await
        .unwrap();
    assert_eq!(outcomes, vec![Outcome::Submitted { job: 26 }]);
    replica.raft.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raft_rpcs_are_served_only_to_members() {
    use kairos_consensus::service::RaftRpc;
    use kairos_proto::v1::raft_service_client::RaftServiceClient;
    use kairos_proto::v1::raft_service_server::RaftServiceServer;
    use kairos_proto::v1::RaftMessage;

    let dir = TempDir::new().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let config = ReplicaConfig {
        id: 1,
        addr: addr.clone(),
        snapshot_logs: 100,
        join: false,
        heartbeat_ms: 50,
        election_timeout_ms: 150,
        key: ClusterKey::new(SECRET),
        peer_tls: None,
    };
    let members = BTreeMap::from([(1, addr.clone())]);
    let replica = Replica::open(&config, dir.path(), &members).await.unwrap();
    wait_leader(&replica).await;
    let service = RaftServiceServer::new(RaftRpc::new(
        replica.raft.clone(),
        [1].into(),
        ClusterKey::new(SECRET),
        replica.contact.clone(),
    ));
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let mut client = RaftServiceClient::connect(format!("http://{addr}")).await.unwrap();
    let ours = ClusterKey::new(SECRET);
    let theirs = ClusterKey::new("another-cluster-secret-0123456789abcdef");
    let call = |from: Option<&str>, key: Option<&ClusterKey>| {
        let mut req = tonic::Request::new(RaftMessage { payload: b"{}".to_vec() });
        if let Some(f) = from {
            req.metadata_mut().insert("kairos-replica-from", f.parse().unwrap());
            if let Some(k) = key {
                set_bearer(req.metadata_mut(), &k.peer_credential(f.parse().unwrap()));
            }
        }
        req
    };
    let anonymous = client.vote(call(None, None)).await.unwrap_err();
    assert_eq!(anonymous.code(), tonic::Code::Unauthenticated);
    // Naming a member is not enough: the credential must come from this cluster's secret.
    let no_credential = client.vote(call(Some("1"), None)).await.unwrap_err();
    assert_eq!(no_credential.code(), tonic::Code::Unauthenticated);
    let other_cluster = client.vote(call(Some("1"), Some(&theirs))).await.unwrap_err();
    assert_eq!(other_cluster.code(), tonic::Code::Unauthenticated);
    assert!(other_cluster.message().contains("cluster secret"), "{}", other_cluster.message());
    // Replica 1's credential presented as replica 2's is refused too.
    let mut borrowed = call(Some("2"), None);
    set_bearer(borrowed.metadata_mut(), &ours.peer_credential(1));
    assert_eq!(client.vote(borrowed).await.unwrap_err().code(), tonic::Code::Unauthenticated);
    // A replica with the secret that is not a member is refused.
    let stranger = client.vote(call(Some("99"), Some(&ours))).await.unwrap_err();
    assert_eq!(stranger.code(), tonic::Code::PermissionDenied);
    assert!(stranger.message().contains("replica 99 is not a member"), "{}", stranger.message());
    // A member gets past the check (and then fails on the deliberately empty message).
    let member = client.vote(call(Some("1"), Some(&ours))).await.unwrap_err();
    assert_eq!(member.code(), tonic::Code::InvalidArgument);
    server.abort();
    replica.raft.shutdown().await.unwrap();
}

mod corrupt_disk {
    //! Whatever bytes the log's files hold (torn writes, a foreign program, bit rot), opening and
    //! reading the log ends in a repaired log or a clear error, never a panic or a silently
    //! wrong entry.
    use openraft::storage::{RaftLogReader, RaftLogStorage};
    use proptest::prelude::*;

    use super::*;

    fn entry(index: u64) -> openraft::Entry<TypeConfig> {
        openraft::Entry {
            log_id: openraft::LogId::new(openraft::CommittedLeaderId::new(1, 1), index),
            payload: openraft::EntryPayload::Blank,
        }
    }

    /// A data directory whose log holds entries 1..=3, and the path of its one segment.
    async fn written() -> (TempDir, std::path::PathBuf) {
        let dir = TempDir::new().expect("temp dir");
        {
            // As `LogStore::append` writes them (openraft's callback cannot be made here).
            let (wal, _) =
                kairos_consensus::wal::Wal::open(&dir.path().join("raft.log"), None, None).unwrap();
            let records: Vec<_> = (1..=3).map(|i| (i, serde_json::to_vec(&entry(i)).unwrap())).collect();
            let (tx, rx) = tokio::sync::oneshot::channel();
            wal.append(&records, Box::new(move |r| drop(tx.send(r)))).expect("append");
            rx.await.expect("synced").expect("on disk");
        }
        let seg = dir.path().join("raft.log").join(format!("{:020}.wal", 1));
        assert!(seg.exists());
        (dir, seg)
    }

    fn indexes(entries: &[openraft::Entry<TypeConfig>]) -> Vec<u64> {
        entries.iter().map(|e| e.log_id.index).collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

        #[test]
        fn garbage_in_the_log_or_its_metadata_is_repaired_or_refused_cleanly(
            garbage in proptest::collection::vec(any::<u8>(), 0..200),
            at in 0usize..400,
        ) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                let (dir, seg) = written().await;
                let mut bytes = std::fs::read(&seg).unwrap();
                let at = at.min(bytes.len());
                bytes.splice(at..(at + garbage.len()).min(bytes.len()), garbage.iter().copied());
                std::fs::write(&seg, &bytes).unwrap();
                // Either refused at open, or a prefix of what was written: never an entry changed.
                if let Ok(mut store) = LogStore::open(dir.path(), 1) {
                    let entries = store.try_get_log_entries(0..10).await.expect("a repaired log reads");
                    let got = indexes(&entries);
                    prop_assert_eq!(&got[..], &[1u64, 2, 3][..got.len()]);
                    prop_assert_eq!(entries, (1..=got.len() as u64).map(entry).collect::<Vec<_>>());
                }
                let (dir, _) = written().await;
                std::fs::write(dir.path().join("raft.log").join("meta"), &garbage).unwrap();
                std::fs::write(dir.path().join("raft.log").join("committed"), &garbage).unwrap();
                if let Ok(mut store) = LogStore::open(dir.path(), 1) {
                    let _ = store.read_vote().await;
                    let _ = store.read_committed().await;
                    let _ = store.get_log_state().await;
                }
                Ok(())
            })?;
        }
    }

    #[test]
    fn a_torn_last_entry_is_cut_off_and_the_log_goes_on_from_there() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let (dir, seg) = written().await;
            let len = std::fs::metadata(&seg).unwrap().len();
            std::fs::OpenOptions::new().write(true).open(&seg).unwrap().set_len(len - 3).unwrap();
            let mut store = LogStore::open(dir.path(), 1).expect("log store");
            assert_eq!(indexes(&store.try_get_log_entries(0..10).await.unwrap()), [1, 2]);
            assert_eq!(store.get_log_state().await.unwrap().last_log_id.map(|l| l.index), Some(2));
            // A commit record ahead of what survived is not believed.
            store.save_committed(Some(entry(3).log_id)).await.unwrap();
            assert_eq!(store.read_committed().await.unwrap(), None);
            store.save_committed(Some(entry(2).log_id)).await.unwrap();
            assert_eq!(store.read_committed().await.unwrap(), Some(entry(2).log_id));
        });
    }

    #[test]
    fn replication_never_gets_entries_after_a_purge_for_a_start_the_purge_took() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let (dir, _) = written().await;
            let mut store = LogStore::open(dir.path(), 1).expect("log store");
            store.purge(entry(2).log_id).await.unwrap();
            // Entries 3.. do not follow a prev_log_id of 0: nothing rather than a gap.
            assert!(store.limited_get_log_entries(1, 4).await.unwrap().is_empty());
            assert_eq!(indexes(&store.limited_get_log_entries(3, 4).await.unwrap()), [3]);
        });
    }

    #[test]
    fn a_commit_record_ahead_of_the_recovered_log_refuses_to_start() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let (dir, seg) = written().await;
            {
                let mut store = LogStore::open(dir.path(), 1).expect("log store");
                store.save_committed(Some(entry(3).log_id)).await.unwrap();
                assert_eq!(store.read_committed().await.unwrap(), Some(entry(3).log_id));
            }
            // Entry 3 was on disk and committed; now it fails its check (a bad disk, an edited
            // file): taken for a torn tail, it would be cut off.
            let mut bytes = std::fs::read(&seg).unwrap();
            let at = bytes.len() - 3;
            bytes[at] ^= 0x01;
            std::fs::write(&seg, &bytes).unwrap();
            match LogStore::open(dir.path(), 1) {
                Err(e @ kairos_consensus::ConsensusError::Damaged { .. }) => {
                    let msg = e.to_string();
                    assert!(msg.contains("entries from 3 are missing or fail their check, but entries through 3 are committed"), "{msg}");
                    assert!(msg.contains(&seg.display().to_string()), "{msg}");
                    assert!(msg.contains("kairos cluster remove 1") && !msg.contains('\n'), "{msg}");
                }
                Err(other) => panic!("{other}"),
                Ok(_) => panic!("a log that lost committed entries was opened"),
            }
            assert_eq!(std::fs::read(&seg).unwrap(), bytes, "the refused log was changed");
            // Cut off for real (nothing left to recover): refused too.
            std::fs::OpenOptions::new().write(true).open(&seg).unwrap().set_len(at as u64 - 20).unwrap();
            let e = LogStore::open(dir.path(), 1).err().expect("refused").to_string();
            assert!(e.contains("is damaged") && e.contains("committed"), "{e}");
        });
    }

    #[test]
    fn replication_reads_carry_what_one_append_can_and_other_reads_the_whole_range() {
        // After a restart nothing is cached: a follower far behind is sent at most the append
        // budget of entries read from the disk, not the whole range at every retry.
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let dir = TempDir::new().expect("temp dir");
            let records: Vec<_> = (1..=10_000).map(|i| (i, serde_json::to_vec(&entry(i)).unwrap())).collect();
            let total: usize = records.iter().map(|(_, r)| r.len()).sum();
            assert!(total > 2 * kairos_consensus::network::APPEND_BYTES_BUDGET);
            {
                let (wal, _) =
                    kairos_consensus::wal::Wal::open(&dir.path().join("raft.log"), None, None).unwrap();
                let (tx, rx) = tokio::sync::oneshot::channel();
                wal.append(&records, Box::new(move |r| drop(tx.send(r)))).expect("append");
                rx.await.expect("synced").expect("on disk");
            }
            let mut store = LogStore::open(dir.path(), 1).expect("log store");
            let limited = store.limited_get_log_entries(1, 10_001).await.unwrap();
            let bytes: usize = limited.iter().map(|e| serde_json::to_vec(e).unwrap().len()).sum();
            assert!(
                !limited.is_empty() && bytes <= kairos_consensus::network::APPEND_BYTES_BUDGET,
                "{bytes}"
            );
            assert!(limited.len() < 10_000);
            assert_eq!(indexes(&limited), (1..=limited.len() as u64).collect::<Vec<_>>());
            assert_eq!(store.try_get_log_entries(1..10_001).await.unwrap().len(), 10_000);
        });
    }

    #[test]
    fn a_data_directory_of_the_sled_era_and_a_foreign_segment_are_refused_clearly() {
        let dir = TempDir::new().unwrap();
        std::fs::create_dir_all(dir.path().join("raft.sled")).unwrap();
        let e = LogStore::open(dir.path(), 2).err().expect("refused").to_string();
        assert!(e.contains("earlier kairosd (raft.sled)"), "{e}");
        assert!(e.contains("kairos cluster remove 2"), "{e}");
        let dir = TempDir::new().unwrap();
        std::fs::create_dir_all(dir.path().join("raft.log")).unwrap();
        std::fs::write(dir.path().join("raft.log").join(format!("{:020}.wal", 1)), b"SQLite format 3\0")
            .unwrap();
        match LogStore::open(dir.path(), 2) {
            Err(e @ kairos_consensus::ConsensusError::Damaged { .. }) => {
                let msg = e.to_string();
                assert!(msg.contains("is damaged"), "{msg}");
                assert!(msg.contains("not a kairos log segment"), "{msg}");
            }
            Err(other) => panic!("{other}"),
            Ok(_) => panic!("a foreign file was taken for a log"),
        }
    }
}

//! Requests are bounded before they cost anything: credentials are checked from the headers
//! before a body is decoded.

use kairos_proto::v1 as pb;
use kairos_proto::v1::raft_service_client::RaftServiceClient;

use crate::harness::Cluster;

/// The peak resident memory of process `pid` (VmHWM), in MiB.
fn peak_rss_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmHWM");
    kib / 1024
}

#[test]
fn unauthenticated_60_mb_raft_messages_are_refused_before_they_are_read() {
    let c = Cluster::start(1);
    let pid = c.controllers[0].child.as_ref().unwrap().id();
    let before = peak_rss_mib(pid);
    let addr = format!("http://{}", c.controllers[0].addr);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let codes = rt.block_on(async {
        let calls = (0..6).map(|i| {
            let addr = addr.clone();
            async move {
                let mut raft =
                    RaftServiceClient::connect(addr).await.unwrap().max_encoding_message_size(usize::MAX);
                let payload = vec![b'x' + i as u8; 60 * 1024 * 1024];
                match raft.append_entries(pb::RaftMessage { payload }).await {
                    Ok(_) => tonic::Code::Ok,
                    Err(e) => e.code(),
                }
            }
        });
        futures::future::join_all(calls).await
    });
    assert!(codes.iter().all(|c| *c == tonic::Code::Unauthenticated), "{codes:?}");
    let peak = peak_rss_mib(pid);
    eprintln!("kairosd peak RSS: {before} MiB before, {peak} MiB after six unauthenticated 60 MB messages");
    assert!(peak < 150, "kairosd grew from {before} MiB to a peak of {peak} MiB");
    // And it still serves.
    c.ok(&["queue"]);
}

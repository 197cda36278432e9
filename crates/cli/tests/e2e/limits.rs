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

#[test]
fn a_users_unfinished_jobs_are_bounded_with_resource_exhausted() {
    let c = Cluster::start_with(1, 1, &["--max-jobs-per-user", "3", "--max-jobs", "5"]);
    for _ in 0..3 {
        let out = c.cli_as("alice").args(["submit", "--hold", "--", "true"]).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let out = c.cli_as("alice").args(["submit", "--hold", "--", "true"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("--max-jobs-per-user") && err.contains("3"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert_eq!(c.jobs().len(), 3, "a refused submit created a job");
    // Others still may, up to the cluster's bound.
    for _ in 0..2 {
        assert!(c.cli_as("bob").args(["submit", "--hold", "--", "true"]).output().unwrap().status.success());
    }
    let out = c.cli_as("carol").args(["submit", "--hold", "--", "true"]).output().unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--max-jobs)"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A finished job makes room.
    let first = c.jobs().iter().find(|j| j["user"] == "alice").unwrap()["id"].as_u64().unwrap();
    c.ok(&["cancel", &first.to_string()]);
    assert!(c.cli_as("alice").args(["submit", "--hold", "--", "true"]).output().unwrap().status.success());
}

/// Submits `n` held jobs (each with `env_bytes` of environment) over gRPC, 64 at a time.
fn submit_many(c: &Cluster, n: usize, env_bytes: usize) {
    let tag = env_bytes;
    use kairos_proto::v1::job_service_client::JobServiceClient;
    let token = std::fs::read_to_string(c.token_file()).unwrap().trim().to_string();
    let addr = format!("http://{}", c.controllers[0].addr);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = JobServiceClient::connect(addr).await.unwrap();
        for chunk in (0..n).collect::<Vec<_>>().chunks(64) {
            let calls = chunk.iter().map(|i| {
                let mut client = client.clone();
                let mut req = tonic::Request::new(pb::SubmitRequest {
                    spec: Some(pb::JobSpec {
                        name: format!("j{i}"),
                        argv: vec!["true".into()],
                        env: [("PAD".to_string(), "p".repeat(env_bytes))].into(),
                        hold: true,
                        resources: Some(pb::Resources { gpus: 1, ..Default::default() }),
                        ..Default::default()
                    }),
                    request_id: format!("many-{tag}-{i}"),
                });
                kairos_proto::wire::set_bearer(req.metadata_mut(), &token);
                async move { client.submit(req).await.map(|_| ()) }
            });
            for r in futures::future::join_all(calls).await {
                r.expect("submit");
            }
        }
    });
}

#[test]
fn queue_all_lists_every_job_across_pages_of_bounded_size() {
    let c = Cluster::start(1);
    submit_many(&c, 2_100, 8);
    let all: serde_json::Value = serde_json::from_str(&c.ok(&["queue", "--all", "--json"])).unwrap();
    let ids: Vec<u64> = all.as_array().unwrap().iter().map(|j| j["id"].as_u64().unwrap()).collect();
    assert_eq!(ids.len(), 2_100, "queue --all listed {} of 2100 jobs", ids.len());
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "pages overlap or skip");
    // Large jobs: one page would not fit a client's 4 MiB; pages are bounded by size too.
    submit_many(&c, 40, 100_000);
    let all: serde_json::Value = serde_json::from_str(&c.ok(&["queue", "--json"])).unwrap();
    assert_eq!(all.as_array().unwrap().len(), 2_140);
    let bad = c.kairos(&["queue"]);
    assert!(bad.status.success());
}

#[test]
fn connections_past_the_per_address_bound_are_closed_and_freed_ones_serve_again() {
    use std::io::Read;
    // One CLI call holds one connection; the agent holds its own.
    let c = Cluster::start_with(1, 1, &["--max-connections-per-address", "4"]);
    let addr = c.controllers[0].addr.clone();
    // Let the daemon notice that the harness's earlier CLI calls closed their connections.
    std::thread::sleep(std::time::Duration::from_millis(300));
    // Hold connections until the daemon closes the next one unread.
    let mut held = Vec::new();
    let refused = loop {
        assert!(held.len() < 8, "no connection was refused past the bound of 4");
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_millis(500))).unwrap();
        let mut buf = [0u8; 64];
        match s.read(&mut buf) {
            // Closed at once, unread: refused.
            Ok(0) => break s,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break s,
            // The server's HTTP/2 settings, or silence while it waits for ours: accepted.
            _ => held.push(s),
        }
    };
    drop(refused);
    // The agent holds the others (its stream and its calls).
    assert!((1..=4).contains(&held.len()), "{} connections accepted under a bound of 4", held.len());
    assert!(!c.kairos(&["queue"]).status.success(), "a call got through past the bound");
    held.clear();
    crate::harness::wait_for("the freed connections to serve calls again", || {
        c.kairos(&["queue"]).status.success().then_some(())
    });
}

#[test]
fn silent_connections_are_closed_at_the_handshake_timeout_and_cannot_starve_real_clients() {
    use std::io::Read;
    let c = Cluster::start_with(1, 1, &["--max-connections-per-address", "8", "--handshake-timeout", "1s"]);
    c.wait_node_up();
    let addr = c.controllers[0].addr.clone();
    // Sockets that connect and never speak, as many as the bound allows (the agent holds some).
    let silent: Vec<std::net::TcpStream> =
        (0..8).map(|_| std::net::TcpStream::connect(&addr).unwrap()).collect();
    let opened = std::time::Instant::now();
    // While they are held (never closed by the test), real calls succeed again within a few
    // handshake timeouts.
    crate::harness::wait_for("a call to get through the silent sockets", || {
        c.kairos(&["queue"]).status.success().then_some(())
    });
    assert!(opened.elapsed() < std::time::Duration::from_secs(15), "{:?}", opened.elapsed());
    // The server closed every silent one.
    for mut s in silent {
        s.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 256];
        let closed = loop {
            match s.read(&mut buf) {
                Ok(0) => break true,
                Ok(_) => continue, // the server's HTTP/2 settings
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break true,
                Err(_) => break false,
            }
        };
        assert!(closed, "a silent connection was kept open");
    }
}

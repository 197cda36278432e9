//! Authentication, authorization and TLS, end to end: tokens and roles through the CLI, agents'
//! join token and node credentials over raw gRPC, and a cluster that serves mutual TLS only.

use std::path::Path;
use std::process::{Command, Output};

use kairos_proto::v1 as pb;
use kairos_proto::v1::agent_log_service_client::AgentLogServiceClient;
use kairos_proto::v1::agent_service_client::AgentServiceClient;
use serde_json::Value;

use crate::harness::{wait_for, Cluster, Options};

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).to_string()
}

/// The CLI against `c` with exactly `token` (or none): no token file, no default token.
fn with_token(c: &Cluster, token: Option<&str>, args: &[&str]) -> Output {
    let mut cmd = crate::harness::kairos_cmd();
    cmd.arg("--controllers")
        .arg(c.addrs())
        .env("HOME", c.path("no-home"))
        .env_remove("XDG_CONFIG_HOME")
        .env_remove("KAIROS_TOKEN_FILE")
        .env_remove("KAIROS_TOKEN")
        .args(args);
    if let Some(t) = token {
        cmd.env("KAIROS_TOKEN", t);
    }
    cmd.output().expect("run kairos")
}

/// Expects a one-line failure with exit code 1 whose message contains `expected`.
fn refused(out: &Output, expected: &str) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(1), "expected a refusal, got {err:?}");
    assert!(err.contains(expected), "{err:?} lacks {expected:?}");
    assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err:?}");
}

fn logs_of(c: &Cluster) -> String {
    let mut all = String::new();
    for entry in std::fs::read_dir(c.dir.path()).unwrap().flatten() {
        if entry.path().extension().is_some_and(|e| e == "log") {
            all.push_str(&std::fs::read_to_string(entry.path()).unwrap_or_default());
        }
    }
    all
}

#[test]
fn tokens_roles_and_job_ownership_are_enforced() {
    let c = Cluster::start(1);
    // No token, a made-up token: UNAUTHENTICATED, and nothing is created.
    refused(&with_token(&c, None, &["submit", "--", "true"]), "no token");
    refused(&with_token(&c, None, &["queue"]), "Unauthenticated");
    refused(&with_token(&c, Some("kairos_0011223344556677_nope"), &["queue"]), "invalid, expired or revoked");
    assert!(c.jobs().is_empty());

    let create = |user: &str, role: &str| {
        c.ok(&["token", "create", "--user", user, "--role", role]).trim().to_string()
    };
    let (alice, bob, ops) = (create("alice", "user"), create("bob", "user"), create("ops", "operator"));
    assert!(alice.starts_with("kairos_") && alice != bob);
    refused(
        &c.kairos(&["token", "create", "--user", "eve", "--role", "root"]),
        "not user, operator or admin",
    );
    refused(&c.kairos(&["token", "create", "--user", "bad user"]), "user: 1-64 characters");

    let ok = |token: &str, args: &[&str]| {
        let out = with_token(&c, Some(token), args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        String::from_utf8(out.stdout).unwrap()
    };
    let job: u64 = ok(&alice, &["submit", "--hold", "--", "true"]).trim().parse().unwrap();
    let id = job.to_string();
    let shown: Value = serde_json::from_str(&ok(&alice, &["show", &id, "--json"])).unwrap();
    assert_eq!(shown["user"], "alice");

    // Bob can neither see nor touch Alice's job, nor act as her.
    refused(&with_token(&c, Some(&bob), &["show", &id]), "belongs to another user (PermissionDenied)");
    refused(&with_token(&c, Some(&bob), &["cancel", &id]), "PermissionDenied");
    refused(&with_token(&c, Some(&bob), &["release", &id]), "PermissionDenied");
    refused(&with_token(&c, Some(&bob), &["logs", &id]), "PermissionDenied");
    refused(&with_token(&c, Some(&bob), &["--as", "alice", "show", &id]), "needs the admin role");
    let bobs_queue: Value = serde_json::from_str(&ok(&bob, &["queue", "--all", "--json"])).unwrap();
    assert_eq!(bobs_queue.as_array().map(Vec::len), Some(0), "{bobs_queue}");
    // Users and operators change no policy, burst settings, tokens or membership.
    for token in [&bob, &ops] {
        refused(
            &with_token(&c, Some(token), &["qos", "update", "training", "--priority", "1"]),
            "PermissionDenied",
        );
        refused(
            &with_token(&c, Some(token), &["burst", "config", "set", "max_instances=9"]),
            "needs the admin role",
        );
        refused(&with_token(&c, Some(token), &["token", "create", "--user", "x"]), "needs the admin role");
        refused(&with_token(&c, Some(token), &["cluster", "remove", "1"]), "needs the admin role");
    }
    refused(&with_token(&c, Some(&bob), &["drain", "node-a"]), "needs the operator role");
    assert_eq!(c.job(job)["state"], "PENDING", "a refused call changed the job");

    // The operator sees and cancels anyone's job.
    let seen: Value = serde_json::from_str(&ok(&ops, &["show", &id, "--json"])).unwrap();
    assert_eq!(seen["id"], job);
    ok(&ops, &["cancel", &id]);
    assert_eq!(c.job(job)["state"], "CANCELLED");

    // Admins list tokens (no secrets) and revoke them; a revoked token is refused at once.
    let listed = c.ok(&["token", "list", "--json"]);
    let tokens: Value = serde_json::from_str(&listed).unwrap();
    assert_eq!(tokens.as_array().map(Vec::len), Some(3), "{tokens}");
    for t in [&alice, &bob, &ops] {
        let secret = t.rsplit('_').next().unwrap();
        assert!(!listed.contains(secret), "token list shows a secret");
    }
    let bob_id = tokens.as_array().unwrap().iter().find(|t| t["user"] == "bob").unwrap()["id"].clone();
    c.ok(&["token", "revoke", bob_id.as_str().unwrap()]);
    refused(&with_token(&c, Some(&bob), &["queue"]), "Unauthenticated");
    ok(&alice, &["queue"]);

    // Operators drain nodes.
    ok(&ops, &["drain", "node-a", "--reason", "maintenance"]);
    wait_for("node-a to drain", || {
        let nodes: Value = serde_json::from_str(&c.ok(&["nodes", "--json"])).ok()?;
        (nodes[0]["state"] == "DRAINING").then_some(())
    });

    // No credential ever reaches a log.
    let logs = logs_of(&c);
    let admin = std::fs::read_to_string(c.token_file()).unwrap();
    let join = std::fs::read_to_string(c.path("join.token")).unwrap();
    for secret in [alice.as_str(), bob.as_str(), ops.as_str(), admin.trim(), join.trim()] {
        let tail = &secret[secret.len() - 24..];
        assert!(!logs.contains(tail), "a token is in the logs");
    }
}

pub(crate) async fn agent_client(c: &Cluster) -> AgentServiceClient<tonic::transport::Channel> {
    AgentServiceClient::connect(format!("http://{}", c.controllers[0].addr)).await.unwrap()
}

pub(crate) fn with_bearer<T>(msg: T, credential: &str) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    kairos_proto::wire::set_bearer(req.metadata_mut(), credential);
    req
}

pub(crate) fn node(name: &str) -> pb::NodeInfo {
    pb::NodeInfo {
        name: name.into(),
        addr: "127.0.0.1:9".into(),
        gpus: vec![pb::Gpu {
            index: 0,
            uuid: format!("GPU-{name}"),
            model: "H100".into(),
            memory_mib: 1024,
            link_group: 0,
            mig_parent: None,
        }],
        cpus: 1,
        ..Default::default()
    }
}

#[test]
fn agents_join_with_the_join_token_and_act_only_as_their_own_node() {
    let c = Cluster::start(1);
    let join = std::fs::read_to_string(c.path("join.token")).unwrap().trim().to_string();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut agents = agent_client(&c).await;
        // A bad or missing join token, or a user's admin token, registers nothing.
        let admin = std::fs::read_to_string(c.token_file()).unwrap().trim().to_string();
        for cred in [None, Some("kairos-join.wrong-0123456789"), Some(admin.as_str())] {
            let req = match cred {
                Some(t) => with_bearer(pb::RegisterRequest { node: Some(node("intruder")) }, t),
                None => tonic::Request::new(pb::RegisterRequest { node: Some(node("intruder")) }),
            };
            let e = agents.register(req).await.unwrap_err();
            assert_eq!(e.code(), tonic::Code::Unauthenticated, "{cred:?}: {e:?}");
        }
        // The join token registers a node and hands back that node's credential.
        let reg = agents
            .register(with_bearer(pb::RegisterRequest { node: Some(node("node-x")) }, &join))
            .await
            .unwrap()
            .into_inner();
        let x = reg.node_credential;
        assert!(!x.is_empty());
        let hb = |node: &str| pb::HeartbeatRequest { node_id: node.into(), running: vec![] };
        agents.heartbeat(with_bearer(hb("node-x"), &x)).await.unwrap();
        // node-x's credential (or the join token) does not speak for node-a.
        for cred in [x.as_str(), join.as_str()] {
            let e = agents.heartbeat(with_bearer(hb("node-a"), cred)).await.unwrap_err();
            assert_eq!(e.code(), tonic::Code::Unauthenticated);
            let drain =
                pb::DrainRequest { node_id: "node-a".into(), reason: "forged".into(), ..Default::default() };
            let e = agents.drain(with_bearer(drain, cred)).await.unwrap_err();
            assert_eq!(e.code(), tonic::Code::Unauthenticated);
            let report =
                pb::StatusReport { node_id: "node-a".into(), job_id: 1, attempt: 0, ..Default::default() };
            let e = agents.report_status(with_bearer(report, cred)).await.unwrap_err();
            assert_eq!(e.code(), tonic::Code::Unauthenticated);
        }
        // An agent's log service serves only controllers.
        let nodes = c.ok(&["nodes", "--json"]);
        let nodes: Value = serde_json::from_str(&nodes).unwrap();
        let a = nodes.as_array().unwrap().iter().find(|n| n["name"] == "node-a").unwrap();
        let addr = a["addr"].as_str().unwrap();
        let mut logs = AgentLogServiceClient::connect(format!("http://{addr}")).await.unwrap();
        for req in
            [tonic::Request::new(pb::LogsRequest::default()), with_bearer(pb::LogsRequest::default(), &x)]
        {
            match logs.read_logs(req).await {
                Ok(_) => panic!("the log service served a caller without the node credential"),
                Err(e) => assert_eq!(e.code(), tonic::Code::Unauthenticated),
            }
        }
    });
    assert!(!c.jobs().iter().any(|j| j["state"] == "CANCELLED"), "a forged call changed a job");
    let nodes = c.ok(&["nodes", "--json"]);
    assert!(!nodes.contains("intruder") && !nodes.contains("DRAINING"), "{nodes}");

    // A real agent with a wrong join token never joins, and says why.
    let mut bad = Command::new(crate::harness::bin("kairos-agent"));
    let wrong = c.path("wrong.token");
    std::fs::write(&wrong, "kairos-join.not-the-right-one").unwrap();
    let log = std::fs::File::create(c.path("bad-agent.log")).unwrap();
    let mut child = bad
        .args(["--controllers", &c.addrs(), "--addr", "127.0.0.1:0", "--name", "node-bad"])
        .args(["--gpu-backend", "fake", "--fake-gpus", "1", "--join-token-file"])
        .arg(&wrong)
        .arg("--state-dir")
        .arg(c.path("agent-bad"))
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    wait_for("the agent to report the refusal", || {
        std::fs::read_to_string(c.path("bad-agent.log")).ok()?.contains("invalid join token").then_some(())
    });
    crate::harness::stop_child(&mut child);
    assert!(!c.ok(&["nodes", "--json"]).contains("node-bad"));
}

/// A CA, and one certificate it signs for 127.0.0.1 (servers and clients alike).
fn write_pki(dir: &Path) {
    use rcgen::{
        BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    };
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().unwrap();
    let mut leaf = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
    let cert = leaf.signed_by(&key, &issuer).unwrap();
    std::fs::write(dir.join("ca.pem"), ca_cert.pem()).unwrap();
    std::fs::write(dir.join("cert.pem"), cert.pem()).unwrap();
    std::fs::write(dir.join("key.pem"), key.serialize_pem()).unwrap();
}

#[test]
fn a_mutual_tls_cluster_serves_tls_only_and_plaintext_clients_fail_cleanly() {
    let pki = tempfile::tempdir().unwrap();
    write_pki(pki.path());
    let file = |f: &str| pki.path().join(f).display().to_string();
    let tls = vec![
        "--ca".to_string(),
        file("ca.pem"),
        "--cert".into(),
        file("cert.pem"),
        "--key".into(),
        file("key.pem"),
    ];
    let mut controller_flags = tls.clone();
    controller_flags.push("--mutual-tls".into());
    let c = Cluster::start_opts(
        3,
        1,
        Options {
            controller_flags,
            agent_flags: tls,
            cli_env: vec![
                ("KAIROS_CA".into(), file("ca.pem")),
                ("KAIROS_CERT".into(), file("cert.pem")),
                ("KAIROS_KEY".into(), file("key.pem")),
            ],
            ..Options::default()
        },
    );
    // Raft, agent and client traffic all run over TLS: a job goes through and its logs come
    // back from the agent's TLS log service.
    let id = c.submit(&["--", "sh", "-c", "echo over-tls"]);
    assert_eq!(c.wait_done(id)["state"], "COMPLETED");
    assert_eq!(c.ok(&["logs", &id.to_string()]), "over-tls\n");
    let status = c.wait_converged();
    assert_eq!(status["replicas"].as_array().map(Vec::len), Some(3));

    let token = c.token_file();
    let run = |env: &[(&str, String)]| {
        crate::harness::kairos_cmd()
            .args(["--controllers", &c.controllers[0].addr, "queue"])
            .env("KAIROS_TOKEN_FILE", &token)
            .env_remove("KAIROS_CA")
            .env_remove("KAIROS_CERT")
            .env_remove("KAIROS_KEY")
            .envs(env.iter().map(|(k, v)| (*k, v)))
            .output()
            .unwrap()
    };
    // Plaintext against TLS: a clear one-line failure, no hang.
    let out = run(&[]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.contains("does it serve TLS? (--ca)"), "{err:?}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err:?}");
    // TLS without a client certificate against mutual TLS: refused too.
    let out = run(&[("KAIROS_CA", file("ca.pem"))]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stderr(&out).trim_end().lines().count(), 1, "{}", stderr(&out));
    // With the certificate: served.
    let out = run(&[
        ("KAIROS_CA", file("ca.pem")),
        ("KAIROS_CERT", file("cert.pem")),
        ("KAIROS_KEY", file("key.pem")),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn a_token_expires_on_an_idle_cluster() {
    let c = Cluster::start(1);
    let token = c.ok(&["token", "create", "--user", "alice", "--ttl", "2s"]).trim().to_string();
    assert!(with_token(&c, Some(&token), &["queue"]).status.success());
    // Nothing is written meanwhile: the replicated clock stands still, the wall clock does not.
    std::thread::sleep(std::time::Duration::from_millis(2500));
    refused(&with_token(&c, Some(&token), &["queue"]), "invalid, expired or revoked");
}

/// The CLI against replica `i` alone, with exactly `token`.
fn at_replica(c: &Cluster, i: usize, token: &str, args: &[&str]) -> Output {
    crate::harness::kairos_cmd()
        .arg("--controllers")
        .arg(&c.controllers[i].addr)
        .env("HOME", c.path("no-home"))
        .env_remove("XDG_CONFIG_HOME")
        .env_remove("KAIROS_TOKEN_FILE")
        .env("KAIROS_TOKEN", token)
        .args(args)
        .output()
        .expect("run kairos")
}

#[test]
fn every_replica_honours_a_new_token_at_once_and_a_revocation_and_a_cut_off_one_vouches_for_none() {
    let mut c = Cluster::start_with(3, 1, &[]);
    let leader = c.leader();
    let followers: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
    // A new token works at once through every replica, also those that have not applied it.
    let alice = c.ok(&["token", "create", "--user", "alice"]).trim().to_string();
    for i in 0..3 {
        let out = at_replica(&c, i, &alice, &["queue"]);
        assert!(out.status.success(), "replica {}: {}", i + 1, stderr(&out));
    }
    // Revoked: refused through every replica.
    let tokens: Value = serde_json::from_str(&c.ok(&["token", "list", "--json"])).unwrap();
    let id = tokens.as_array().unwrap().iter().find(|t| t["user"] == "alice").unwrap()["id"].clone();
    c.ok(&["token", "revoke", id.as_str().unwrap()]);
    for i in 0..3 {
        refused(&at_replica(&c, i, &alice, &["queue"]), "invalid, expired or revoked");
    }
    // A follower cut off from the leader cannot know of revocations: once the staleness bound
    // (2 s) has passed it vouches for no issued token, while the bootstrap admin still reads.
    let bob = c.ok(&["token", "create", "--user", "bob"]).trim().to_string();
    let alone = followers[0];
    assert!(at_replica(&c, alone, &bob, &["queue"]).status.success());
    c.kill_controller(leader);
    c.kill_controller(followers[1]);
    std::thread::sleep(std::time::Duration::from_millis(2500));
    let out = at_replica(&c, alone, &bob, &["queue"]);
    assert!(!out.status.success(), "an isolated follower accepted a token it cannot vouch for");
    assert!(stderr(&out).contains("cannot vouch for tokens"), "{}", stderr(&out));
    let admin = std::fs::read_to_string(c.token_file()).unwrap();
    let out = at_replica(&c, alone, admin.trim(), &["queue"]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn a_retried_token_create_answers_the_same_token_and_creates_no_second() {
    use kairos_proto::v1::admin_service_client::AdminServiceClient;
    let c = Cluster::start_with(3, 1, &[]);
    let admin = std::fs::read_to_string(c.token_file()).unwrap().trim().to_string();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let create_with = |i: usize, request_id: &str, role: &str, ttl_s: u64| {
        let mut req = tonic::Request::new(pb::CreateTokenRequest {
            user: "carol".into(),
            role: role.into(),
            request_id: request_id.into(),
            ttl_s,
            ..Default::default()
        });
        kairos_proto::wire::set_bearer(req.metadata_mut(), &admin);
        let addr = format!("http://{}", c.controllers[i].addr);
        rt.block_on(async move { AdminServiceClient::connect(addr).await.unwrap().create_token(req).await })
    };
    let create = |i: usize, request_id: &str| create_with(i, request_id, "user", 0);
    let leader = c.leader();
    let first = create(leader, "retry-me").expect("create").into_inner();
    // The retry (the answer was lost, say): the same token.
    let again = create(leader, "retry-me").expect("retried create").into_inner();
    assert_eq!((&first.id, &first.token), (&again.id, &again.token));
    let tokens: Value = serde_json::from_str(&c.ok(&["token", "list", "--json"])).unwrap();
    let carols = tokens.as_array().unwrap().iter().filter(|t| t["user"] == "carol").count();
    assert_eq!(carols, 1, "{tokens}");
    assert!(with_token(&c, Some(&first.token), &["queue"]).status.success());
    // The same request id asking for something else (a lifetime, a role) is not answered with
    // the first, never-expiring token.
    for (role, ttl) in [("user", 60), ("admin", 0)] {
        let e = create_with(leader, "retry-me", role, ttl)
            .expect_err("another token's settings under a used request id");
        assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
        assert!(e.message().contains("other settings"), "{e:?}");
    }
    // Another request id is another token; a revoked token's create retried stays revoked.
    let other = create(leader, "another").expect("create").into_inner();
    assert_ne!(other.id, first.id);
    c.ok(&["token", "revoke", &first.id]);
    let late = create(leader, "retry-me").expect_err("a revoked token came back");
    assert_eq!(late.code(), tonic::Code::FailedPrecondition, "{late:?}");
    refused(&with_token(&c, Some(&first.token), &["queue"]), "invalid, expired or revoked");
}

#[test]
fn a_revoked_token_ends_the_streams_it_opened() {
    let c = Cluster::start(1);
    c.wait_node_up();
    let created: Value =
        serde_json::from_str(&c.ok(&["token", "create", "--user", "dora", "--json"])).unwrap();
    let token = created["token"].as_str().unwrap().to_string();
    let out =
        with_token(&c, Some(&token), &["submit", "--", "sh", "-c", "while :; do echo tick; sleep 0.2; done"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    c.wait_state(id.parse().unwrap(), "RUNNING");
    let spawn = |args: &[&str]| {
        crate::harness::kairos_cmd()
            .arg("--controllers")
            .arg(c.addrs())
            .env("HOME", c.path("no-home"))
            .env_remove("XDG_CONFIG_HOME")
            .env_remove("KAIROS_TOKEN_FILE")
            .env("KAIROS_TOKEN", &token)
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run kairos")
    };
    let mut follow = spawn(&["logs", "--follow", &id]);
    let mut wait = spawn(&["wait", &id]);
    // An interactive session too (`exec` into the job): input and output stop with the token.
    let mut exec = spawn(&["exec", &id, "--", "sleep", "100"]);
    std::thread::sleep(std::time::Duration::from_secs(1));
    assert!(
        follow.try_wait().unwrap().is_none()
            && wait.try_wait().unwrap().is_none()
            && exec.try_wait().unwrap().is_none(),
        "a stream ended early"
    );
    c.ok(&["token", "revoke", created["id"].as_str().unwrap()]);
    let revoked = std::time::Instant::now();
    for (name, child) in [("logs --follow", &mut follow), ("wait", &mut wait), ("exec", &mut exec)] {
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if revoked.elapsed() > std::time::Duration::from_secs(15) {
                let _ = child.kill();
                panic!("{name} outlived its token's revocation");
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        };
        assert!(!status.success(), "{name} ended successfully");
        let mut err = String::new();
        std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
        assert!(err.contains("revoked"), "{name}: {err}");
    }
    c.ok(&["cancel", &id]);
}

#[test]
fn token_create_names_the_id_and_token_list_shows_times_people_read() {
    let c = Cluster::start(1);
    let out = c.kairos(&["token", "create", "--user", "alice", "--ttl", "1h"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let token = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(token.starts_with("kairos_") && !token.contains(' '), "stdout is the token alone: {token}");
    let id = token.trim_start_matches("kairos_").split('_').next().unwrap().to_string();
    assert!(stderr(&out).contains(&format!("token id {id}")), "{}", stderr(&out));
    let list = c.ok(&["token", "list"]);
    let row = list.lines().find(|l| l.starts_with(&id)).unwrap_or_else(|| panic!("{list}"));
    assert!(list.lines().next().unwrap().contains("EXPIRES"), "{list}");
    // RFC 3339 times, not epoch milliseconds.
    assert!(row.matches('T').count() >= 2 && row.contains('Z'), "{row}");
    assert!(
        !row.split_whitespace().any(|w| w.len() >= 13 && w.chars().all(|ch| ch.is_ascii_digit())),
        "{row}"
    );
}

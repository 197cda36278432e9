//! Any replica serves any call: a plain gRPC client (no redirect code) talking to one follower
//! only submits, reads its own writes, cancels and creates tokens; the health service says
//! NOT_SERVING on a replica that cannot reach a quorum.

use kairos_proto::v1 as pb;
use kairos_proto::v1::admin_service_client::AdminServiceClient;
use kairos_proto::v1::job_service_client::JobServiceClient;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

use crate::harness::{wait_for, Cluster};

fn with_token<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut req = tonic::Request::new(message);
    kairos_proto::wire::set_bearer(req.metadata_mut(), token);
    req
}

#[test]
fn a_client_that_only_knows_a_follower_gets_every_write_and_reads_its_own_writes() {
    let c = Cluster::start_with(3, 2, &[]);
    let follower = c.follower();
    let leader = c.leader();
    let token = std::fs::read_to_string(c.token_file()).unwrap().trim().to_string();
    let addr = format!("http://{}", c.controllers[follower].addr);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(addr).unwrap().connect().await.unwrap();
        let mut jobs = JobServiceClient::new(channel.clone());
        let mut ids = Vec::new();
        for i in 0..20 {
            let spec = pb::JobSpec {
                name: format!("via-follower-{i}"),
                argv: vec!["true".into()],
                hold: true,
                resources: Some(pb::Resources { gpus: 1, ..Default::default() }),
                ..Default::default()
            };
            let answer = jobs
                .submit(with_token(
                    pb::SubmitRequest { spec: Some(spec), request_id: format!("f-{i}") },
                    &token,
                ))
                .await
                .unwrap_or_else(|s| panic!("submit {i} through a follower: {s:?}"));
            // The relayed answer names the leader, so a client may save the hop next time.
            let hint =
                answer.metadata().get("kairos-leader").and_then(|v| v.to_str().ok()).map(str::to_string);
            assert_eq!(hint.as_deref(), Some(c.controllers[leader].addr.as_str()), "submit {i}");
            let id = answer.into_inner().job_id;
            // Read at once, through the same follower: the job is there (served by the follower
            // once applied, else by the leader on its behalf) — never "not found".
            let job = jobs
                .get_job(with_token(pb::GetJobRequest { job_id: id }, &token))
                .await
                .unwrap_or_else(|s| panic!("reading job {id} back: {s:?}"))
                .into_inner();
            assert_eq!(job.spec.map(|s| s.name), Some(format!("via-follower-{i}")));
            ids.push(id);
            // A listing through the follower right after the submit holds it too.
            let listed = jobs
                .list_jobs(with_token(pb::ListJobsRequest { all: true, ..Default::default() }, &token))
                .await
                .expect("listing through a follower")
                .into_inner();
            assert!(
                listed.jobs.iter().any(|j| j.id == id),
                "job {id} missing from a listing right after its submit"
            );
        }
        // A retried submit (same request id) through the follower is the same job.
        let again = jobs
            .submit(with_token(
                pb::SubmitRequest {
                    spec: Some(pb::JobSpec {
                        name: "via-follower-0".into(),
                        argv: vec!["true".into()],
                        hold: true,
                        resources: Some(pb::Resources { gpus: 1, ..Default::default() }),
                        ..Default::default()
                    }),
                    request_id: "f-0".into(),
                },
                &token,
            ))
            .await
            .unwrap();
        assert_eq!(again.into_inner().job_id, ids[0]);
        let cancelled = jobs
            .cancel_job(with_token(pb::CancelJobRequest { job_id: ids[0] }, &token))
            .await
            .expect("cancel through a follower")
            .into_inner();
        assert_eq!(cancelled.state(), pb::JobState::Cancelled);
        // An admin write too.
        let mut admin = AdminServiceClient::new(channel);
        let created = admin
            .create_token(with_token(
                pb::CreateTokenRequest { user: "carol".into(), role: "user".into(), ..Default::default() },
                &token,
            ))
            .await
            .expect("token create through a follower")
            .into_inner();
        assert!(created.token.starts_with("kairos_"), "{created:?}");
        // And the new token works at once, through the follower (which may not have applied it).
        let mine = jobs
            .list_jobs(with_token(pb::ListJobsRequest::default(), &created.token))
            .await
            .expect("the new token through the follower");
        assert!(mine.into_inner().jobs.is_empty(), "carol has no jobs");
    });
    // Every write is in the replicated state, once.
    let all: serde_json::Value = serde_json::from_str(&c.ok(&["queue", "--all", "--json"])).unwrap();
    let names: Vec<&str> = all.as_array().unwrap().iter().map(|j| j["name"].as_str().unwrap()).collect();
    assert_eq!(names.len(), 20, "{names:?}");
    assert!(all[0]["state"] == "CANCELLED", "{}", all[0]);
}

fn health(rt: &tokio::runtime::Runtime, addr: &str) -> Option<ServingStatus> {
    rt.block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .ok()?
            .connect_timeout(std::time::Duration::from_secs(1))
            .timeout(std::time::Duration::from_secs(2))
            .connect()
            .await
            .ok()?;
        let answer =
            HealthClient::new(channel).check(HealthCheckRequest { service: String::new() }).await.ok()?;
        Some(answer.into_inner().status())
    })
}

#[test]
fn health_is_not_serving_on_a_replica_that_cannot_reach_a_quorum() {
    let mut c = Cluster::start_with(3, 1, &[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    for i in 0..3 {
        let addr = c.controllers[i].addr.clone();
        wait_for("every replica to report SERVING", || {
            (health(&rt, &addr) == Some(ServingStatus::Serving)).then_some(())
        });
    }
    // Two of three gone: the last one (whichever role it had) has no quorum.
    let leader = c.leader();
    let survivor = (0..3).find(|i| *i != leader).unwrap();
    for i in (0..3).filter(|i| *i != survivor) {
        c.kill_controller(i);
    }
    let addr = c.controllers[survivor].addr.clone();
    wait_for("the cut-off replica to report NOT_SERVING", || {
        (health(&rt, &addr) == Some(ServingStatus::NotServing)).then_some(())
    });
    // A quorum again: SERVING again.
    let back = (0..3).find(|i| *i != survivor).unwrap();
    c.start_controller(back);
    wait_for("the replica to report SERVING with a quorum back", || {
        (health(&rt, &addr) == Some(ServingStatus::Serving)).then_some(())
    });
}

/// Peak resident memory of a process (KiB).
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn a_follower_refuses_unauthenticated_calls_before_reading_their_bodies() {
    let c = Cluster::start_with(3, 1, &[]);
    let follower = c.follower();
    let pid = c.controllers[follower].child.as_ref().unwrap().id();
    let before = peak_rss_kib(pid);
    let addr = format!("http://{}", c.controllers[follower].addr);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let codes = rt.block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(addr).unwrap().connect().await.unwrap();
        // 48 submits of 3.5 MiB each (under the 4 MiB message limit), no token, all at once.
        let calls = (0..48).map(|i| {
            let mut jobs = JobServiceClient::new(channel.clone()).max_encoding_message_size(8 << 20);
            let spec = pb::JobSpec {
                argv: vec!["true".into(), "x".repeat(3_500_000)],
                resources: Some(pb::Resources { gpus: 1, ..Default::default() }),
                ..Default::default()
            };
            async move {
                jobs.submit(pb::SubmitRequest { spec: Some(spec), request_id: format!("anon-{i}") })
                    .await
                    .map(|_| ())
                    .unwrap_err()
                    .code()
            }
        });
        futures::future::join_all(calls).await
    });
    assert!(codes.iter().all(|c| *c == tonic::Code::Unauthenticated), "{codes:?}");
    // 168 MiB were sent; the follower kept none of it.
    let grown_mib = (peak_rss_kib(pid).saturating_sub(before)) / 1024;
    assert!(grown_mib < 40, "the follower's peak memory grew {grown_mib} MiB");
}

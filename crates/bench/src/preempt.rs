//! `kairos-bench preempt`: every GPU busy with training jobs, an urgent job that must preempt
//! them; measures from its submit's acknowledgement to its start, through real agents.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use kairos_proto::v1 as pb;
use kairos_proto::v1::admin_service_client::AdminServiceClient;
use kairos_proto::v1::job_service_client::JobServiceClient;
use serde_json::json;

use crate::cluster::{connect, sibling, Cluster, Conn};

/// A connected job client to whichever replica leads.
async fn leader_jobs(
    cluster: &Cluster,
) -> anyhow::Result<(JobServiceClient<Conn>, AdminServiceClient<Conn>)> {
    let i = cluster.leader(Duration::from_secs(20)).await?;
    let ch = connect(&cluster.addrs[i]).await?;
    Ok((JobServiceClient::new(ch.clone()), AdminServiceClient::new(ch)))
}

pub(crate) async fn wait_state(
    jobs: &mut JobServiceClient<Conn>,
    id: u64,
    state: pb::JobState,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let job = jobs.get_job(pb::GetJobRequest { job_id: id }).await?.into_inner();
        if job.state == state as i32 {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    bail!("job {id} did not reach {state:?}")
}

/// Starts `agents` fake-GPU agents of `gpus` GPUs each against the cluster.
pub(crate) fn start_agents(
    cluster: &Cluster,
    agents: u32,
    gpus: u32,
) -> anyhow::Result<Vec<std::process::Child>> {
    let agent_bin = sibling("kairos-agent")?;
    let mut children = Vec::new();
    for a in 0..agents {
        let log = std::fs::File::create(cluster.dir.path().join(format!("agent-{a}.log")))?;
        let child = Command::new(&agent_bin)
            .args([
                "--controllers",
                &cluster.addrs.join(","),
                "--addr",
                "127.0.0.1:0",
                "--name",
                &format!("node-{a}"),
            ])
            .args(["--gpu-backend", "fake", "--fake-gpus", &gpus.to_string(), "--run-as", "agent"])
            .arg("--join-token-file")
            .arg(cluster.dir.path().join("join.token"))
            .arg("--state-dir")
            .arg(cluster.dir.path().join(format!("agent-{a}")))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("starting kairos-agent")?;
        children.push(child);
    }
    Ok(children)
}

/// Waits (at most 30 s) until `agents` nodes are up.
pub(crate) async fn wait_agents_up(admin: &mut AdminServiceClient<Conn>, agents: u32) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let nodes = admin.list_nodes(pb::ListNodesRequest {}).await?.into_inner().nodes;
        if nodes.iter().filter(|n| n.state == pb::NodeState::Up as i32).count() == agents as usize {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("agents did not register");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// SIGTERM to each agent (it stops its jobs' process groups before exiting), SIGKILL after 10 s.
pub(crate) async fn stop_agents(children: Vec<std::process::Child>) {
    for mut c in children {
        // SAFETY: kill(2) on our own child.
        unsafe {
            libc::kill(c.id() as i32, libc::SIGTERM);
        }
        let _ = tokio::time::timeout(Duration::from_secs(10), async {
            while c.try_wait().ok().flatten().is_none() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        let _ = c.kill();
    }
}

pub(crate) async fn bench_preempt(
    controllers: u64,
    agents: u32,
    gpus: u32,
    rounds: usize,
) -> anyhow::Result<serde_json::Value> {
    let cluster = Cluster::start(controllers)?;
    let (mut jobs, mut admin) = leader_jobs(&cluster).await?;
    // REQUEUE victims with no grace: the measurement is the scheduler's path, not the job's.
    let mut policy = admin.get_policy(pb::GetPolicyRequest {}).await?.into_inner();
    for q in policy.qos.iter_mut().filter(|q| q.name == "training") {
        q.grace_s = 0;
    }
    admin.apply_policy(policy).await?;
    let children = start_agents(&cluster, agents, gpus)?;
    let result = async {
        wait_agents_up(&mut admin, agents).await?;
        let mut filler = 0usize;
        let mut running: Vec<u64> = Vec::new();
        let mut samples = Vec::new();
        let stamp = cluster.dir.path().join("urgent-start");
        for round in 0..rounds {
            // Refill: every GPU busy with a fresh training job (fresh, so anti-thrash never applies).
            while running.len() < (agents * gpus) as usize {
                filler += 1;
                let id = jobs.submit(training_job(filler)).await?.into_inner().job_id;
                wait_state(&mut jobs, id, pb::JobState::Running).await?;
                running.push(id);
            }
            samples.push(urgent_start_ms(&mut jobs, round, &stamp).await?);
            running = cancel_victims(&mut jobs, running).await?;
        }
        samples.sort_by(|a, b| a.total_cmp(b));
        let q = |p: f64| samples[((samples.len() as f64 - 1.0) * p).round() as usize];
        Ok(json!({
            "bench": "preempt",
            "controllers": controllers,
            "agents": agents,
            "gpus_per_agent": gpus,
            "rounds": rounds,
            "start_ms_p50": (q(0.5) * 10.0).round() / 10.0,
            "start_ms_p99": (q(0.99) * 10.0).round() / 10.0,
            "start_ms_max": (samples[samples.len() - 1] * 10.0).round() / 10.0,
        }))
    }
    .await;
    stop_agents(children).await;
    result
}

/// The preempt bench's filler: a one-GPU training job that sleeps for an hour.
fn training_job(i: usize) -> pb::SubmitRequest {
    pb::SubmitRequest {
        spec: Some(pb::JobSpec {
            name: format!("train-{i}"),
            argv: vec!["sleep".into(), "3600".into()],
            qos: "training".into(),
            resources: Some(pb::Resources { gpus: 1, ..Default::default() }),
            ..Default::default()
        }),
        request_id: String::new(),
    }
}

/// Submits an urgent two-GPU job (which must preempt) that writes its start time to `stamp`,
/// waits for it to complete: the milliseconds from its submit's acknowledgement to its start.
async fn urgent_start_ms(
    jobs: &mut JobServiceClient<Conn>,
    round: usize,
    stamp: &std::path::Path,
) -> anyhow::Result<f64> {
    let _ = std::fs::remove_file(stamp);
    let script = format!("date +%s%N > {}", stamp.display());
    let urgent = pb::SubmitRequest {
        spec: Some(pb::JobSpec {
            name: format!("urgent-{round}"),
            argv: vec!["sh".into(), "-c".into(), script],
            qos: "urgent".into(),
            resources: Some(pb::Resources { gpus: 2, ..Default::default() }),
            ..Default::default()
        }),
        request_id: String::new(),
    };
    let id = jobs.submit(urgent).await?.into_inner().job_id;
    let acked = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos();
    wait_state(jobs, id, pb::JobState::Completed).await?;
    let started: u128 = std::fs::read_to_string(stamp)?.trim().parse()?;
    Ok(started.saturating_sub(acked) as f64 / 1e6)
}

/// The victims went back to the queue: cancels them (the next round refills). The jobs of
/// `running` still running their first attempt.
async fn cancel_victims(jobs: &mut JobServiceClient<Conn>, running: Vec<u64>) -> anyhow::Result<Vec<u64>> {
    let mut still = Vec::new();
    for j in running {
        let job = jobs.get_job(pb::GetJobRequest { job_id: j }).await?.into_inner();
        if job.state == pb::JobState::Running as i32 && job.attempt == 0 {
            still.push(j);
        } else {
            let _ = jobs.cancel_job(pb::CancelJobRequest { job_id: j }).await;
        }
    }
    Ok(still)
}

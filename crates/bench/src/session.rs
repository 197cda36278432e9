//! `kairos-bench session`: what an interactive session costs, through a real controller and a
//! real agent on loopback (`JobService.Session` → `AgentLogService.Session`): bytes per second
//! through a port-forward tunnel (a job's TCP server sending a large stream) and through `exec`
//! (`head -c` of a large file, as `cat` would), and keystroke echo on a terminal (one byte typed,
//! until the terminal's echo of it comes back).

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use kairos_proto::v1 as pb;
use kairos_proto::v1::job_service_client::JobServiceClient;
use pb::session_input::Input;
use pb::session_output::Output;
use serde_json::json;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;

use crate::cluster::{connect, free_addr, Cluster, Conn};
use crate::preempt::{start_agents, stop_agents, wait_agents_up, wait_state};

/// A session's two ends: what the bench sends, what comes back.
struct Session {
    tx: mpsc::Sender<pb::SessionInput>,
    rx: tonic::Streaming<pb::SessionOutput>,
}

async fn open(jobs: &mut JobServiceClient<Conn>, open: pb::SessionOpen) -> anyhow::Result<Session> {
    let (tx, rx) = mpsc::channel(64);
    tx.send(pb::SessionInput { input: Some(Input::Open(open)) }).await?;
    let mut rx = jobs.session(ReceiverStream::new(rx)).await?.into_inner();
    match rx.next().await {
        Some(Ok(pb::SessionOutput { output: Some(Output::Opened(_)) })) => Ok(Session { tx, rx }),
        other => bail!("the session did not open: {other:?}"),
    }
}

/// Reads the session to its exit: the output bytes and the seconds from the first to the last.
async fn drain(s: &mut Session) -> anyhow::Result<(u64, f64)> {
    let (mut bytes, mut first) = (0u64, None);
    let mut last = Instant::now();
    while let Some(msg) = s.rx.next().await {
        match msg?.output {
            Some(Output::Data(d)) => {
                first.get_or_insert_with(Instant::now);
                bytes += d.data.len() as u64;
                last = Instant::now();
            }
            Some(Output::Exit(_)) => break,
            _ => {}
        }
    }
    Ok((bytes, first.map_or(0.0, |f| last.duration_since(f).as_secs_f64())))
}

fn mb_s((bytes, secs): (u64, f64)) -> f64 {
    ((bytes as f64 / 1e6 / secs.max(1e-9)) * 10.0).round() / 10.0
}

/// A job that serves `bytes` to each connection on `port`, then closes it.
fn server_job(port: u16, bytes: u64) -> pb::SubmitRequest {
    let chunks = bytes / 65_536;
    let script = format!(
        "import socket\ns = socket.socket()\ns.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
         s.bind(('127.0.0.1', {port}))\ns.listen()\nbuf = b'x' * 65536\nwhile True:\n    c, _ = s.accept()\n\
         \x20   for _ in range({chunks}):\n        c.sendall(buf)\n    c.close()\n"
    );
    pb::SubmitRequest {
        spec: Some(pb::JobSpec {
            name: "session-bench".into(),
            argv: vec!["python3".into(), "-c".into(), script],
            resources: Some(pb::Resources { gpus: 1, ..Default::default() }),
            ..Default::default()
        }),
        request_id: String::new(),
    }
}

/// Keystroke echo: one byte typed on an exec terminal running `cat`, until its echo returns.
async fn echo_ms(jobs: &mut JobServiceClient<Conn>, id: u64, keys: usize) -> anyhow::Result<Vec<f64>> {
    let mut s = open(
        jobs,
        pb::SessionOpen {
            job_id: id,
            kind: pb::SessionKind::Exec as i32,
            argv: vec!["cat".into()],
            pty: true,
            size: Some(pb::TerminalSize { rows: 24, cols: 80 }),
            ..Default::default()
        },
    )
    .await?;
    let mut samples = Vec::with_capacity(keys);
    for seq in 1..=keys as u64 {
        let sent = Instant::now();
        let data = vec![b'a' + (seq % 26) as u8];
        s.tx.send(pb::SessionInput { input: Some(Input::Stdin(pb::SessionStdin { seq, data, eof: false })) })
            .await?;
        loop {
            match tokio::time::timeout(Duration::from_secs(5), s.rx.next()).await {
                Ok(Some(Ok(pb::SessionOutput { output: Some(Output::Data(_)) }))) => break,
                Ok(Some(Ok(_))) => continue,
                other => bail!("no echo of keystroke {seq}: {other:?}"),
            }
        }
        samples.push(sent.elapsed().as_secs_f64() * 1e3);
    }
    let _ = s.tx.send(pb::SessionInput { input: Some(Input::Signal(9)) }).await;
    Ok(samples)
}

pub(crate) async fn bench_session(mb: u64, keys: usize) -> anyhow::Result<serde_json::Value> {
    let cluster = Cluster::start(1)?;
    let ch = connect(&cluster.addrs[cluster.leader(Duration::from_secs(20)).await?]).await?;
    let (mut jobs, mut admin) = (
        JobServiceClient::new(ch.clone()),
        kairos_proto::v1::admin_service_client::AdminServiceClient::new(ch),
    );
    let agents = start_agents(&cluster, 1, 1)?;
    let result = async {
        wait_agents_up(&mut admin, 1).await?;
        let port: u16 = free_addr()?.rsplit(':').next().unwrap_or_default().parse().context("a port")?;
        let id = jobs.submit(server_job(port, mb * 1_000_000)).await?.into_inner().job_id;
        wait_state(&mut jobs, id, pb::JobState::Running).await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let forward = pb::SessionOpen {
            job_id: id,
            kind: pb::SessionKind::Forward as i32,
            port: u32::from(port),
            ..Default::default()
        };
        let tunnel = mb_s(drain(&mut open(&mut jobs, forward).await?).await?);
        let cat = pb::SessionOpen {
            job_id: id,
            kind: pb::SessionKind::Exec as i32,
            argv: vec!["head".into(), "-c".into(), (mb * 1_000_000).to_string(), "/dev/zero".into()],
            ..Default::default()
        };
        let exec = mb_s(drain(&mut open(&mut jobs, cat).await?).await?);
        let mut echo = echo_ms(&mut jobs, id, keys).await?;
        echo.sort_by(|a, b| a.total_cmp(b));
        let q = |p: f64| (echo[((echo.len() as f64 - 1.0) * p).round() as usize] * 100.0).round() / 100.0;
        let _ = jobs.cancel_job(pb::CancelJobRequest { job_id: id }).await;
        Ok(json!({
            "bench": "session",
            "mb": mb,
            "forward_mb_s": tunnel,
            "exec_output_mb_s": exec,
            "keys": keys,
            "echo_ms_p50": q(0.5),
            "echo_ms_p99": q(0.99),
        }))
    }
    .await;
    stop_agents(agents).await;
    result
}

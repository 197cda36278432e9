//! `kairos port-forward` (kubectl port-forward): a local TCP listener whose every connection is
//! one FORWARD session to a port the job listens on, on its node; bytes pumped both ways,
//! the local side's shut write half sent as EOF. No port is opened on the node or the
//! controllers: the bytes ride the session streams.

use std::sync::Arc;

use kairos_proto::v1 as pb;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use super::stream::{self, Local, Sink};
use crate::client::Client;

/// How often a forward checks that its job still runs.
const JOB_CHECK: std::time::Duration = std::time::Duration::from_secs(5);

/// `kairos port-forward`'s job, ports and address.
#[derive(clap::Args, Debug)]
pub struct PortForwardArgs {
    /// The job's id, or an array task as ARRAY_INDEX (e.g. 41_3); it must be running.
    #[arg(value_parser = crate::args::parse_job_ref)]
    pub id: (u64, Option<u32>),
    /// [LOCAL:]REMOTE: the job's port REMOTE, served here at LOCAL (default: the same port;
    /// `:REMOTE` picks a free one), e.g. 8888 or 9000:8888.
    #[arg(value_name = "[LOCAL:]REMOTE", value_parser = parse_ports)]
    pub ports: (u16, u16),
    /// The local address to listen on (another than loopback lets other machines in).
    #[arg(long, default_value = "127.0.0.1")]
    pub address: String,
}

/// `[LOCAL:]REMOTE` as (local, remote): ports 1-65535; LOCAL empty (`:8888`) is 0, a free one.
pub fn parse_ports(s: &str) -> Result<(u16, u16), String> {
    let port = |p: &str| -> Result<u16, String> {
        match p.parse::<u16>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!(
                "\"{p}\" is not a port (1-65535) in \"{s}\"; use [LOCAL:]REMOTE, e.g. 8888 or 9000:8888"
            )),
        }
    };
    match s.split_once(':') {
        None => port(s).map(|p| (p, p)),
        Some(("", remote)) => Ok((0, port(remote)?)),
        Some((local, remote)) => Ok((port(local)?, port(remote)?)),
    }
}

/// `kairos port-forward`: forwards until Ctrl-C or the job ends.
pub async fn port_forward(client: &Client, args: PortForwardArgs) -> anyhow::Result<i32> {
    let job_id = crate::jobs::resolve(client, args.id).await?;
    running(client, job_id).await?;
    let (local, remote) = args.ports;
    let listener = listen(&args.address, local).await?;
    let client = Arc::new(client.traced(None));
    tokio::select! {
        r = serve(client.clone(), job_id, listener, remote) => r.map(|()| 0),
        r = until_ended(&client, job_id) => r.map(|()| {
            eprintln!("kairos: job {job_id} has ended; port-forward stops");
            0
        }),
        _ = tokio::signal::ctrl_c() => Ok(0),
    }
}

/// Binds `address:port`, saying where.
pub async fn listen(address: &str, port: u16) -> anyhow::Result<TcpListener> {
    let listener = TcpListener::bind((address, port))
        .await
        .map_err(|e| anyhow::anyhow!("port-forward: listening on {address}:{port}: {e}"))?;
    Ok(listener)
}

/// Fails unless job `id` is running.
async fn running(client: &Client, id: u64) -> anyhow::Result<()> {
    let job = get_job(client, id).await?;
    if job.state != pb::JobState::Running as i32 {
        anyhow::bail!("job {id} is not running ({})", crate::output::job_state_name(job.state));
    }
    Ok(())
}

async fn get_job(client: &Client, id: u64) -> anyhow::Result<pb::Job> {
    let req = pb::GetJobRequest { job_id: id };
    Ok(client.jobs(req, |mut c, r| async move { c.get_job(r).await }).await?.into_inner())
}

/// Returns once job `id` no longer runs (checked every `JOB_CHECK`; a failed check is skipped).
pub async fn until_ended(client: &Client, id: u64) -> anyhow::Result<()> {
    loop {
        tokio::time::sleep(JOB_CHECK).await;
        if let Ok(job) = get_job(client, id).await {
            if job.state != pb::JobState::Running as i32 {
                return Ok(());
            }
        }
    }
}

/// Accepts connections on `listener`, each tunnelled to port `remote` of job `job_id`.
pub async fn serve(
    client: Arc<Client>,
    job_id: u64,
    listener: TcpListener,
    remote: u16,
) -> anyhow::Result<()> {
    let here = listener.local_addr()?;
    println!("Forwarding from {here} -> {remote}");
    loop {
        let (socket, peer) = listener.accept().await?;
        let client = client.clone();
        tokio::spawn(async move {
            if let Err(e) = tunnel(&client, job_id, remote, socket).await {
                eprintln!("kairos: port-forward: connection from {peer}: {e}");
            }
        });
    }
}

/// One connection: a FORWARD session pumping bytes both ways until it ends.
async fn tunnel(client: &Client, job_id: u64, port: u16, socket: TcpStream) -> anyhow::Result<()> {
    let (mut rd, mut wr) = socket.into_split();
    let (tx, rx) = mpsc::channel(64);
    let reader = tokio::spawn(async move {
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            let event = match rd.read(&mut buf).await {
                Ok(0) | Err(_) => Local::Eof,
                Ok(n) => Local::Stdin(buf[..n].to_vec()),
            };
            let eof = event == Local::Eof;
            if tx.send(event).await.is_err() || eof {
                return;
            }
        }
    });
    let open = pb::SessionOpen {
        job_id,
        kind: pb::SessionKind::Forward as i32,
        port: u32::from(port),
        ..Default::default()
    };
    let mut discard = tokio::io::sink();
    let ended = stream::drive(client, open, rx, Sink { stdout: &mut wr, stderr: &mut discard }).await;
    reader.abort();
    let _ = wr.shutdown().await;
    let exit = ended?;
    if exit.code != 0 && !exit.reason.is_empty() {
        anyhow::bail!("{}", exit.reason);
    }
    Ok(())
}

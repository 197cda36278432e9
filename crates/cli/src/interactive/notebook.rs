//! `kairos notebook`: JupyterLab in an interactive job, reached through a port-forward. The
//! job runs `jupyter lab --no-browser --ip=127.0.0.1 --port=PORT --ServerApp.token=TOKEN`
//! with a random token the CLI makes (given in the job's environment as JUPYTER_TOKEN, not on
//! its command line); the CLI stays attached to the job's terminal (Jupyter's log, on stderr,
//! which also keeps the job alive), forwards a local port to it and prints the URL. Ctrl-C
//! cancels the job.

use std::sync::Arc;

use kairos_proto::v1 as pb;

use super::stream::{self, Sink};
use crate::client::Client;

/// `kairos notebook`'s flags: `kairos submit`'s resource flags and the ports.
#[derive(clap::Args, Debug)]
pub struct NotebookArgs {
    #[command(flatten)]
    pub submit: crate::jobs::SubmitArgs,
    /// The port Jupyter listens on, on the job's node (loopback only).
    #[arg(long, default_value_t = 8888, value_parser = clap::value_parser!(u16).range(1..))]
    pub port: u16,
    /// The local port the notebook is served at (default: --port).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub local_port: Option<u16>,
}

/// The job's command: Jupyter on loopback at `port`, its token from JUPYTER_TOKEN.
pub fn jupyter_argv(port: u16) -> Vec<String> {
    let launch = format!(
        "exec jupyter lab --no-browser --ip=127.0.0.1 --port={port} --ServerApp.token=\"$JUPYTER_TOKEN\""
    );
    vec!["/bin/sh".into(), "-c".into(), launch]
}

/// A random token (128 bits, hex).
fn token() -> anyhow::Result<String> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| anyhow::anyhow!("no random source: {e}"))?;
    Ok(hex::encode(bytes))
}

/// `kairos notebook`: runs until Jupyter exits (its status) or Ctrl-C (the job cancelled, 0).
pub async fn notebook(client: &Client, args: NotebookArgs) -> anyhow::Result<i32> {
    let NotebookArgs { mut submit, port, local_port } = args;
    if !submit.command.is_empty() {
        anyhow::bail!("notebook runs Jupyter itself: give no command (use `kairos alloc` for one)");
    }
    let token = token()?;
    submit.command = jupyter_argv(port);
    submit.env.push(("JUPYTER_TOKEN".into(), token.clone()));
    if submit.name.is_empty() {
        submit.name = "notebook".into();
    }
    let spec = super::alloc::interactive_spec(submit, None, "notebook")?;
    let id = super::alloc::submit(client, spec).await?;
    if super::alloc::started(client, id).await?.is_none() {
        return Ok(130);
    }
    let listener = super::forward::listen("127.0.0.1", local_port.unwrap_or(port)).await?;
    let here = listener.local_addr()?;
    let shared = Arc::new(client.traced(None));
    eprintln!("kairos: job {id} runs Jupyter; it may take a few seconds to answer");
    println!("http://127.0.0.1:{}/lab?token={token}", here.port());
    tokio::select! {
        r = super::forward::serve(shared, id, listener, port) => r.map(|()| 0),
        r = jupyter_log(client, id) => r,
        _ = tokio::signal::ctrl_c() => {
            let req = pb::CancelJobRequest { job_id: id };
            client.jobs(req, |mut c, r| async move { c.cancel_job(r).await }).await?;
            eprintln!("kairos: notebook stopped (job {id} cancelled)");
            Ok(0)
        }
    }
}

/// The job's terminal (Jupyter's log) on stderr until it ends; its exit status.
async fn jupyter_log(client: &Client, id: u64) -> anyhow::Result<i32> {
    let open = pb::SessionOpen { job_id: id, kind: pb::SessionKind::Attach as i32, ..Default::default() };
    // No local input: the receiver ends at once.
    let (_, none) = tokio::sync::mpsc::channel(1);
    let (mut out, mut err) = (tokio::io::stderr(), tokio::io::stderr());
    let exit = stream::drive(client, open, none, Sink { stdout: &mut out, stderr: &mut err })
        .await
        .map_err(|e| anyhow::anyhow!("notebook: {e}"))?;
    if !exit.reason.is_empty() {
        eprintln!("kairos: notebook: {}", exit.reason);
    }
    Ok(super::exit_status(&exit))
}

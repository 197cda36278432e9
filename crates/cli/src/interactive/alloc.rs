//! `kairos alloc` (salloc: an interactive job, its terminal attached here) and `kairos run`
//! (srun: the same for one command, its output streamed): submit with `kairos submit`'s
//! resource flags and profile INTERACTIVE, say why it waits while it is pending (Ctrl-C then
//! cancels it), attach once it runs; the exit status is its command's.

use kairos_proto::v1 as pb;
use tokio_stream::StreamExt;

use super::exec::{attach_job, default_display, Display};
use crate::client::Client;
use crate::jobs::SubmitArgs;

/// What an allocation without a command runs: the user's login shell (the agent gives the
/// run the account's SHELL), for a prompt.
pub const LOGIN_SHELL: [&str; 3] = ["/bin/sh", "-c", "exec \"${SHELL:-/bin/sh}\" -l"];

/// `kairos alloc`'s flags: `kairos submit`'s resource flags, the keep-alive, the command.
#[derive(clap::Args, Debug)]
pub struct AllocArgs {
    #[command(flatten)]
    pub submit: SubmitArgs,
    /// How long the job lives with no client attached to its terminal (a lost connection, a
    /// closed laptop), e.g. 30m; then it gets SIGHUP (default 60s, at most 24h).
    #[arg(long, value_name = "DURATION", value_parser = crate::args::parse_time)]
    pub keep_alive: Option<u64>,
}

/// `kairos run`'s flags: `kairos submit`'s resource flags, `--pty`, the command.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub submit: SubmitArgs,
    /// Show the job's terminal here as a terminal (raw, its size following this one's), for
    /// full-screen programs; without it output is streamed and Ctrl-C is sent as SIGINT.
    #[arg(long)]
    pub pty: bool,
}

/// The interactive job `args` ask for: profile INTERACTIVE, the keep-alive, the command or a
/// login shell; named `default_name` when neither a name nor a command says otherwise.
pub fn interactive_spec(
    mut args: SubmitArgs,
    keep_alive: Option<u64>,
    default_name: &str,
) -> anyhow::Result<pb::JobSpec> {
    if args.manifest.is_some() || args.array.is_some() {
        anyhow::bail!("an interactive job takes neither -f nor --array (use `kairos submit`)");
    }
    if args.profile.is_some() {
        anyhow::bail!("--profile: an interactive job's profile is interactive");
    }
    if args.command.is_empty() {
        args.command = LOGIN_SHELL.iter().map(|s| s.to_string()).collect();
        if args.name.is_empty() {
            args.name = default_name.to_string();
        }
    }
    let mut spec = crate::jobs::job_spec(args)?;
    spec.profile = pb::Profile::Interactive as i32;
    spec.keep_alive_s = keep_alive.map_or(0, |s| s.min(u64::from(u32::MAX)) as u32);
    Ok(spec)
}

/// `kairos alloc`.
pub async fn alloc(client: &Client, args: AllocArgs) -> anyhow::Result<i32> {
    let spec = interactive_spec(args.submit, args.keep_alive, "interactive")?;
    allocate_and_attach(client, spec, default_display()).await
}

/// `kairos run`.
pub async fn run(client: &Client, args: RunArgs) -> anyhow::Result<i32> {
    if args.submit.command.is_empty() {
        anyhow::bail!("run: give the command after --, e.g. kairos run -G 1 -- nvidia-smi");
    }
    let display = if args.pty { default_display() } else { Display::Pipes };
    let spec = interactive_spec(args.submit, None, "run")?;
    allocate_and_attach(client, spec, display).await
}

/// Submits `spec`, waits for it to run, attaches.
async fn allocate_and_attach(client: &Client, spec: pb::JobSpec, display: Display) -> anyhow::Result<i32> {
    let id = submit(client, spec).await?;
    match started(client, id).await? {
        Some(job) => eprintln!("kairos: job {id} running on {}", job.node),
        None => return Ok(130),
    }
    match attach_job(client, id, display).await {
        Err(e) if e.downcast_ref::<super::stream::NeverOpened>().is_some() => {
            ended_first(client, id, e).await
        }
        other => other,
    }
}

/// The job ended before its terminal could be attached (a command quicker than the attach):
/// its output from the log, its exit status as `kairos wait` gives it. Else the refusal.
async fn ended_first(client: &Client, id: u64, refused: anyhow::Error) -> anyhow::Result<i32> {
    let req = pb::GetJobRequest { job_id: id };
    let job = client.jobs(req, |mut c, r| async move { c.get_job(r).await }).await?.into_inner();
    let live =
        [pb::JobState::Pending, pb::JobState::Running, pb::JobState::Suspended, pb::JobState::Preempting];
    if live.iter().any(|s| *s as i32 == job.state) {
        return Err(refused);
    }
    crate::jobs::logs(client, id, false, None).await?;
    Ok(crate::jobs::wait_code(&job))
}

/// Submits `spec`; its job id.
pub async fn submit(client: &Client, spec: pb::JobSpec) -> anyhow::Result<u64> {
    // Retries (leader changes) reuse this id, so the job is submitted once.
    let req = pb::SubmitRequest { spec: Some(spec), request_id: crate::args::request_id() };
    let resp = client.jobs(req, |mut c, r| async move { c.submit(r).await }).await?;
    Ok(resp.into_inner().job_id)
}

/// Waits until job `id` runs (the job), saying why it waits; Ctrl-C cancels it (None). A job
/// that ends first is an error that says how it ended.
pub async fn started(client: &Client, id: u64) -> anyhow::Result<Option<pb::Job>> {
    tokio::select! {
        job = wait_running(client, id) => job.map(Some),
        _ = tokio::signal::ctrl_c() => {
            let req = pb::CancelJobRequest { job_id: id };
            client.jobs(req, |mut c, r| async move { c.cancel_job(r).await }).await?;
            eprintln!("kairos: job {id} cancelled");
            Ok(None)
        }
    }
}

/// Watches job `id` until it runs, printing each new reason it waits; the watch is opened
/// again (another controller) when it breaks, for up to `REACH_WAIT` without one.
async fn wait_running(client: &Client, id: u64) -> anyhow::Result<pb::Job> {
    let mut said = String::new();
    let mut lost_since: Option<std::time::Instant> = None;
    loop {
        let req = pb::WatchJobRequest { job_id: id };
        match client.jobs(req, |mut c, r| async move { c.watch_job(r).await }).await {
            Ok(stream) => {
                lost_since = None;
                let mut stream = stream.into_inner();
                while let Some(item) = stream.next().await {
                    match item {
                        Ok(job) => {
                            if let Some(job) = progress(job, &mut said)? {
                                return Ok(job);
                            }
                        }
                        Err(s) if crate::client::resumable(&s) => break,
                        Err(s) => anyhow::bail!("watching job {id}: {}", s.message()),
                    }
                }
            }
            Err(e) => {
                let since = *lost_since.get_or_insert_with(std::time::Instant::now);
                if since.elapsed() >= crate::client::REACH_WAIT {
                    return Err(crate::client::Unreachable(format!("watching job {id}: {e}")).into());
                }
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// One update of a job being waited for: the job once it runs, an error once it has ended;
/// else its waiting line, printed when it changed.
fn progress(job: pb::Job, said: &mut String) -> anyhow::Result<Option<pb::Job>> {
    match pb::JobState::try_from(job.state) {
        Ok(pb::JobState::Running) => Ok(Some(job)),
        Ok(pb::JobState::Pending | pb::JobState::Suspended | pb::JobState::Unspecified) => {
            let line = waiting_line(&job);
            if line != *said {
                eprintln!("{line}");
                *said = line;
            }
            Ok(None)
        }
        _ => {
            let why = if job.reason.is_empty() { String::new() } else { format!(": {}", job.reason) };
            let state = crate::output::job_state_name(job.state);
            anyhow::bail!("job {} ended {state} before it started{why}", job.id)
        }
    }
}

/// `kairos: job N queued; waiting (REASON, expected start TIME)`.
pub fn waiting_line(job: &pb::Job) -> String {
    let reason = if job.reason.is_empty() { "Priority" } else { job.reason.as_str() };
    let start = match (job.expected_start_ms, job.start_reason.as_str()) {
        (ms, _) if ms > 0 => format!("expected start {}", crate::output::local_time(ms)),
        (_, "") => "no start estimate yet".to_string(),
        (_, why) => format!("no start estimate: {why}"),
    };
    format!("kairos: job {} queued; waiting ({reason}, {start})", job.id)
}

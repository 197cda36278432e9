//! Users' job commands: submit, queue, show, cancel, hold/release, logs, wait, and
//! checkpoint-done (run inside a job).

use std::io::Write;

use anyhow::Context;
use clap::ValueEnum;
use kairos_proto::v1 as pb;
use tokio_stream::StreamExt;

use crate::args::{parse_env, parse_gpus, parse_min_gpus, parse_time, request_id};
use crate::client::{CallError, Client};
use crate::output::{self, job_json, job_row, print_job_details, print_json, print_list, JOB_HEADER};

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum ProfileArg {
    Training,
    Inference,
    Batch,
}

/// `kairos submit`'s flags and command. As with sbatch, the job runs in the directory it was
/// submitted from (where its node can enter it; else in its own directory, saying so on its
/// stderr), or `-D DIR`, and takes the submitter's environment (`--export`; never kairos's own
/// variables, the credentials among them); a container job runs in its image's environment and
/// workdir instead.
#[derive(clap::Args, Debug)]
pub struct SubmitArgs {
    /// GPUs the job needs on each node (0: a CPU-only job, 1 CPU unless -c says more).
    #[arg(long, short = 'G', alias = "gpus-per-node", default_value_t = 1, allow_negative_numbers = true, value_parser = parse_gpus)]
    pub gpus: u32,
    /// CPUs per task (Slurm's -c); a node's run gets CPUs per task × tasks per node, as a
    /// cpuset of that many cores.
    #[arg(long, short = 'c', value_parser = parse_gpus)]
    pub cpus_per_task: Option<u32>,
    /// Memory per node, e.g. 256M, 16G (MiB without a unit): the run's limit, no swap; over it
    /// the job ends OUT_OF_MEMORY.
    #[arg(long, value_parser = parse_size)]
    pub mem: Option<u64>,
    /// Memory per GPU (× GPUs per node).
    #[arg(long, value_parser = parse_size, conflicts_with_all = ["mem", "mem_per_cpu"])]
    pub mem_per_gpu: Option<u64>,
    /// Memory per CPU (× CPUs per node).
    #[arg(long, value_parser = parse_size, conflicts_with_all = ["mem", "mem_per_gpu"])]
    pub mem_per_cpu: Option<u64>,
    /// Slurm tasks in all (with -c, their CPUs are counted; kairos starts one process per node,
    /// which starts the tasks itself, e.g. torchrun or srun-less MPI).
    #[arg(long, short = 'n', value_parser = parse_gpus)]
    pub ntasks: Option<u32>,
    /// Slurm tasks per node (default: --ntasks spread over the nodes).
    #[arg(long, value_parser = parse_gpus)]
    pub ntasks_per_node: Option<u32>,
    /// GPUs per Slurm task (× tasks per node = GPUs per node).
    #[arg(long, value_parser = parse_gpus, conflicts_with = "gpus")]
    pub gpus_per_task: Option<u32>,
    /// Gang job: run one task on each of this many nodes, all or nothing (torchrun-style
    /// RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in the environment).
    #[arg(long, short = 'N', default_value_t = 1, allow_negative_numbers = true, value_parser = parse_gpus)]
    pub nodes: u32,
    /// Job name (default: the command's file name).
    #[arg(long, short = 'J', default_value = "")]
    pub name: String,
    /// Wall-clock limit: 90s, 30m, 2h, 1h30m, HH:MM:SS, or whole minutes.
    #[arg(long, short = 't', value_parser = parse_time)]
    pub time: Option<u64>,
    /// QoS class (default: the partition's, else the profile's default QoS).
    #[arg(long, short = 'q')]
    pub qos: Option<String>,
    /// What kind of work it is: training, inference or batch (picks the default QoS).
    #[arg(long, value_enum)]
    pub profile: Option<ProfileArg>,
    /// Extra environment variables, KEY=VALUE (repeatable).
    #[arg(long = "env", value_parser = parse_env)]
    pub env: Vec<(String, String)>,
    /// Working directory of the job on its node (default: the directory it is submitted from).
    #[arg(long, short = 'D')]
    pub workdir: Option<String>,
    /// The submitter's environment the job takes, sbatch's: ALL (the default for a bare job;
    /// never KAIROS_* or SLURM_* variables), NONE (the default for a container job), or
    /// NAME[,NAME=VALUE...]; --env adds to it.
    #[arg(long, value_name = "ALL|NONE|NAME[,NAME=VALUE...]")]
    pub export: Option<String>,
    /// Requeue the job (next attempt) if its node fails, instead of ending it NODE_FAIL.
    #[arg(long)]
    pub requeue: bool,
    /// Start only after these jobs completed successfully (repeatable or comma-separated); an
    /// array's id stands for every task of it (any task failing: never).
    #[arg(long = "after-ok", value_delimiter = ',')]
    pub after_ok: Vec<u64>,
    /// Start only after these jobs ended, however they ended (Slurm's afterany).
    #[arg(long = "after-any", value_delimiter = ',')]
    pub after_any: Vec<u64>,
    /// Start only after these jobs ended and one of them (a task, for an array) did not
    /// complete (Slurm's afternotok).
    #[arg(long = "after-not-ok", value_delimiter = ',')]
    pub after_not_ok: Vec<u64>,
    /// Slurm's form of the above: afterok:ID[:ID...][,afterany:ID...][,afternotok:ID...].
    #[arg(long, short = 'd', value_name = "TYPE:ID[:ID...][,...]")]
    pub dependency: Option<String>,
    /// Submit held: the job waits until `kairos release`.
    #[arg(long)]
    pub hold: bool,
    /// Only GPUs of this model, e.g. H100 or A100; a set as A|B (any of them).
    #[arg(long)]
    pub gpu_model: Option<String>,
    /// Place the tasks inside one domain of a topology level (`kairos topology show`), e.g.
    /// rack=required (wait, with reason Topology, rather than spread) or rack=preferred (the
    /// fewest racks free now). Gangs on a cluster with named levels prefer the lowest that fits.
    #[arg(long, value_name = "LEVEL[=required|preferred]", value_parser = parse_topology)]
    pub topology: Option<pb::TopologyRequest>,
    /// A fraction of one GPU (e.g. 0.25), shared with other fractions on that GPU, where the
    /// QoS allows sharing (inference by default; training never).
    #[arg(long, value_name = "FRACTION", value_parser = parse_fraction, conflicts_with_all = ["gpus", "gpus_per_task", "min_gpus"])]
    pub gpu_fraction: Option<u32>,
    /// Fairshare account (default: your default account).
    #[arg(long, short = 'A')]
    pub account: Option<String>,
    /// Partition (default: the cluster's default partition).
    #[arg(long, short = 'p')]
    pub partition: Option<String>,
    /// Run in this reservation (`kairos reservation list`): only on its nodes or GPUs, while
    /// its window is open (it waits until then); you, your account or QoS must be on its
    /// access list.
    #[arg(long, value_name = "NAME")]
    pub reservation: Option<String>,
    /// Elastic job: the fewest GPUs it can run on. Preemption shrinks it (restart on fewer
    /// GPUs, KAIROS_GPUS says how many) instead of stopping it; it grows back later.
    #[arg(long, allow_negative_numbers = true, value_parser = parse_min_gpus)]
    pub min_gpus: Option<u32>,
    /// Elastic gang: the fewest nodes it can run on. Preemption releases whole nodes of it
    /// (restart on fewer, WORLD_SIZE says how many) instead of stopping it; it grows back.
    #[arg(long, allow_negative_numbers = true, value_parser = parse_min_gpus)]
    pub min_nodes: Option<u32>,
    /// The job tolerates SIGSTOP/SIGCONT: a SUSPEND-mode QoS pauses it instead of stopping it.
    #[arg(long)]
    pub suspendable: bool,
    /// Signal that asks the job to checkpoint before a requeue or resize, sent first with the grace ending at the checkpoint report; without one a preempted job gets SIGTERM at once and SIGKILL when its grace ends (as Slurm).
    #[arg(long)]
    pub checkpoint_signal: Option<String>,
    /// How long the job gets to checkpoint and exit (default and maximum: the QoS grace).
    #[arg(long, value_parser = parse_time)]
    pub checkpoint_grace: Option<u64>,
    /// A job array: one job per index, Slurm's form (`0-31:2,40%4`; `%N`: at most N at once).
    #[arg(long, short = 'a', value_parser = crate::args::parse_array)]
    pub array: Option<(Vec<u32>, Option<u32>)>,
    /// Send the job's output to this file on the node, appending (sbatch's patterns: %j job id,
    /// %A array id, %a task, %x name, %u user, %N node, %% a %); stderr too unless -e.
    #[arg(long, short = 'o', value_name = "PATTERN")]
    pub output: Option<String>,
    /// Send the job's stderr to this file on the node (patterns as -o).
    #[arg(long, short = 'e', value_name = "PATTERN")]
    pub error: Option<String>,
    /// Run inside this container image: oci:/PATH[:TAG] (an OCI image layout on the nodes),
    /// oci-archive:/PATH.tar[:TAG], or a registry reference (docker://registry/name:tag) the
    /// node pulls; the run keeps its user, cgroup, limits, GPUs and signals.
    #[arg(long, value_name = "IMAGE")]
    pub container_image: Option<String>,
    /// Host paths bound into the container: SRC:DST or SRC:DST:ro (comma-separated, repeatable).
    #[arg(long, value_name = "SRC:DST[:ro]", value_delimiter = ',')]
    pub container_mounts: Vec<String>,
    /// The working directory inside the container (default: the job's directory, bound in).
    #[arg(long, value_name = "DIR", conflicts_with = "workdir")]
    pub container_workdir: Option<String>,
    /// Submit the Kubernetes manifests in this file instead (batch/v1 Jobs, v1 Pods, pod
    /// groups; see `kairos submit --help` and docs/containers.md); one job id per line.
    #[arg(short = 'f', long = "filename", value_name = "FILE.yaml")]
    pub manifest: Option<std::path::PathBuf>,
    /// The command and its arguments, after `--`.
    #[arg(last = true)]
    pub command: Vec<String>,
}

/// What one node's run of a job holds, from Slurm's spelling of it.
#[derive(Debug, PartialEq, Eq)]
pub struct Shape {
    pub gpus: u32,
    pub cpus: u32,
    pub mem_mib: u64,
    /// Nodes implied by --ntasks over --ntasks-per-node (None: -N decides).
    pub nodes: Option<u32>,
}

/// `--gpu-fraction`: a fraction of one GPU (0 < F < 1, in thousandths) as thousandths.
fn parse_fraction(s: &str) -> Result<u32, String> {
    let f: f64 = s.parse().map_err(|_| format!("\"{s}\" is not a fraction such as 0.25"))?;
    let milli = (f * 1000.0).round();
    if !(1.0..=999.0).contains(&milli) {
        return Err(format!("{s}: a GPU fraction is between 0.001 and 0.999 (a whole GPU is --gpus 1)"));
    }
    Ok(milli as u32)
}

/// Resolves Slurm's task, CPU and memory options into per-node GPUs, CPUs and memory (kairos
/// starts one process per node): tasks per node = --ntasks-per-node, else --ntasks over the
/// nodes; CPUs = -c × tasks per node; memory = --mem, or per GPU/CPU times those.
pub fn shape_of(a: &SubmitArgs) -> Result<Shape, String> {
    let nodes = match (a.ntasks, a.ntasks_per_node) {
        (Some(n), Some(per)) if per > 0 && a.nodes <= 1 => Some(n.div_ceil(per)),
        _ => None,
    };
    let node_count = nodes.unwrap_or(a.nodes).max(1);
    let per_node = match (a.ntasks_per_node, a.ntasks) {
        (Some(per), _) => per.max(1),
        (None, Some(n)) => n.div_ceil(node_count).max(1),
        (None, None) => 1,
    };
    let gpus = match a.gpus_per_task {
        Some(g) => g.checked_mul(per_node).ok_or("--gpus-per-task: too many GPUs")?,
        None => a.gpus,
    };
    let cpus = match a.cpus_per_task {
        Some(c) => c.checked_mul(per_node).ok_or("--cpus-per-task: too many CPUs")?,
        None if a.ntasks.is_some() || a.ntasks_per_node.is_some() => per_node,
        None => 0,
    };
    let cpus = if gpus == 0 { cpus.max(1) } else { cpus };
    let mem_mib = match (a.mem, a.mem_per_gpu, a.mem_per_cpu) {
        (Some(m), _, _) => m,
        (_, Some(m), _) => m.saturating_mul(u64::from(gpus)),
        (_, _, Some(m)) => m.saturating_mul(u64::from(cpus.max(1))),
        _ => 0,
    };
    Ok(Shape { gpus, cpus, mem_mib, nodes })
}

/// A size flag (256M, 16G; MiB without a unit) in MiB.
pub fn parse_size(s: &str) -> Result<u64, String> {
    kairos_proto::units::parse_mem_mib(s)
}

/// `--container-image`, `--container-mounts`, `--container-workdir` as the spec's container.
fn container_spec(
    image: Option<String>,
    mounts: Vec<String>,
    workdir: Option<String>,
) -> anyhow::Result<Option<pb::ContainerSpec>> {
    match image {
        None if !mounts.is_empty() || workdir.is_some() => {
            anyhow::bail!("--container-mounts and --container-workdir need --container-image")
        }
        None => Ok(None),
        Some(image) => Ok(Some(pb::ContainerSpec { image, mounts, workdir: workdir.unwrap_or_default() })),
    }
}

/// sbatch's defaults: the environment the job takes (`export`, ALL for a bare job, NONE for a
/// container's, then `env`), and the submit directory where no workdir was given (a
/// container's is its own).
fn sbatch_defaults(
    export: Option<String>,
    env: Vec<(String, String)>,
    no_workdir: bool,
    container: bool,
) -> anyhow::Result<(std::collections::BTreeMap<String, String>, Option<String>)> {
    let export = export.or_else(|| container.then(|| "NONE".to_string()));
    let submitter: std::collections::BTreeMap<String, String> = std::env::vars().collect();
    let mut environment: std::collections::BTreeMap<String, String> =
        crate::args::export_env(export.as_deref(), &submitter)
            .map_err(|e| anyhow::anyhow!("--export: {e}"))?
            .into_iter()
            .collect();
    environment.extend(env);
    let submit_dir = (no_workdir && !container)
        .then(|| std::env::current_dir().map(|d| d.display().to_string()))
        .transpose()
        .context("the current directory (the job's working directory; or give -D DIR)")?;
    Ok((environment, submit_dir))
}

/// Submits a job; prints its id (the job with --json).
pub async fn submit(client: &Client, json: bool, args: SubmitArgs) -> anyhow::Result<i32> {
    if let Some(path) = &args.manifest {
        if !args.command.is_empty() {
            anyhow::bail!("-f takes its commands from the manifest: give no command after --");
        }
        return submit_manifest(client, json, path).await;
    }
    let spec = job_spec(args)?;
    send(client, json, spec).await
}

/// The job `args` ask for (a command's, not a manifest's).
pub(crate) fn job_spec(args: SubmitArgs) -> anyhow::Result<pb::JobSpec> {
    let shape = shape_of(&args).map_err(|e| anyhow::anyhow!(e))?;
    let resources = resources_of(&args, &shape);
    let checkpoint = checkpoint_of(&args);
    let profile = profile_of(args.profile);
    let SubmitArgs {
        name,
        time,
        qos,
        env,
        workdir,
        export,
        requeue,
        after_ok,
        after_any,
        after_not_ok,
        dependency,
        hold,
        suspendable,
        account,
        partition,
        reservation,
        array,
        output,
        error,
        command,
        container_image,
        container_mounts,
        container_workdir,
        ..
    } = args;
    let container = container_spec(container_image, container_mounts, container_workdir)?;
    let (environment, submit_dir) = sbatch_defaults(export, env, workdir.is_none(), container.is_some())?;
    let workdir_is_submit_dir = submit_dir.is_some();
    let deps = crate::args::Dependencies { after_ok, after_any, after_not_ok };
    let deps = deps.with(dependency.as_deref()).map_err(|e| anyhow::anyhow!(e))?;
    let name = if name.is_empty() {
        command.first().map(|c| c.rsplit('/').next().unwrap_or(c).to_string()).unwrap_or_default()
    } else {
        name
    };
    let command = crate::redirect::redirected(command, output.as_deref(), error.as_deref(), &name);
    Ok(pb::JobSpec {
        name,
        argv: command,
        env: environment.into_iter().collect(),
        workdir: workdir.or(submit_dir).unwrap_or_default(),
        workdir_is_submit_dir,
        qos: qos.unwrap_or_default(),
        profile: profile as i32,
        resources: Some(resources),
        suspendable,
        checkpoint,
        time_limit_s: time.unwrap_or(0),
        requeue: requeue.then_some(true),
        after_ok: deps.after_ok,
        after_any: deps.after_any,
        after_not_ok: deps.after_not_ok,
        hold,
        account: account.unwrap_or_default(),
        partition: partition.unwrap_or_default(),
        array_indices: array.as_ref().map(|(i, _)| i.clone()).unwrap_or_default(),
        array_max_running: array.and_then(|(_, n)| n).unwrap_or(0),
        container,
        reservation: reservation.unwrap_or_default(),
        ..Default::default()
    })
}

/// What one node's run needs: the resolved shape, or one GPU's fraction; the GPU model and
/// an elastic job's least.
fn resources_of(a: &SubmitArgs, shape: &Shape) -> pb::Resources {
    pb::Resources {
        gpus: if a.gpu_fraction.is_some() { 1 } else { shape.gpus },
        gpu_milli: a.gpu_fraction.unwrap_or(0),
        tasks: shape.nodes.unwrap_or(a.nodes),
        cpus: shape.cpus,
        memory_mib: shape.mem_mib,
        gpu_model: a.gpu_model.clone().unwrap_or_default(),
        min_gpus: a.min_gpus.unwrap_or(0),
        min_tasks: a.min_nodes.unwrap_or(0),
        topology: a.topology.clone(),
    }
}

/// `--topology LEVEL[=required|preferred]`.
fn parse_topology(text: &str) -> Result<pb::TopologyRequest, String> {
    let ask = kairos_scheduler::topology::TopologyAsk::parse(text)?;
    Ok(kairos_convert::topology::ask_to_pb(&ask))
}

/// `--checkpoint-signal` and `--checkpoint-grace`, when either is given.
fn checkpoint_of(a: &SubmitArgs) -> Option<pb::CheckpointSpec> {
    (a.checkpoint_signal.is_some() || a.checkpoint_grace.is_some()).then(|| pb::CheckpointSpec {
        signal: a.checkpoint_signal.clone().unwrap_or_default(),
        grace_s: a.checkpoint_grace.unwrap_or(0).min(u64::from(u32::MAX)) as u32,
        dir: String::new(),
    })
}

fn profile_of(profile: Option<ProfileArg>) -> pb::Profile {
    match profile {
        None => pb::Profile::Unspecified,
        Some(ProfileArg::Training) => pb::Profile::Training,
        Some(ProfileArg::Inference) => pb::Profile::Inference,
        Some(ProfileArg::Batch) => pb::Profile::Batch,
    }
}

/// `kairos submit -f FILE.yaml`: every job the manifests ask for, or none (all are checked
/// before the first is sent).
async fn submit_manifest(client: &Client, json: bool, path: &std::path::Path) -> anyhow::Result<i32> {
    let size = std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?.len();
    if size > crate::manifest::MANIFEST_BYTES_MAX {
        anyhow::bail!(
            "{}: {size} bytes, past the {} a manifest may have",
            path.display(),
            crate::manifest::MANIFEST_BYTES_MAX
        );
    }
    let yaml = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let policy = crate::policy::get_policy(client).await?;
    let specs =
        crate::manifest::specs(&yaml, &policy).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    for spec in specs {
        send(client, json, spec).await?;
    }
    Ok(0)
}

/// Submits `spec`; prints its id (the job with --json).
async fn send(client: &Client, json: bool, spec: pb::JobSpec) -> anyhow::Result<i32> {
    // One trace per job starts here (exported when OTEL_EXPORTER_OTLP_ENDPOINT is set).
    let trace = kairos_telemetry::traces::start("kairos submit", &Default::default(), Vec::new());
    let traced = client.traced(kairos_telemetry::traces::traceparent(&trace));
    // Retries (leader changes) reuse this id, so a submit is never applied twice.
    let request_id = request_id();
    let resp = traced
        .jobs(
            pb::SubmitRequest { spec: Some(spec.clone()), request_id: request_id.clone() },
            |mut c, r| async move { c.submit(r).await },
        )
        .await;
    kairos_telemetry::traces::end(&trace);
    let resp = resp?.into_inner();
    match (json, resp.job) {
        (true, Some(job)) => print_json(&job_json(&job)),
        _ => println!("{}", resp.job_id),
    }
    Ok(0)
}

/// `kairos queue`'s filters and columns.
#[derive(clap::Args, Debug)]
pub struct QueueArgs {
    /// Finished jobs too.
    #[arg(long)]
    pub all: bool,
    /// Only this user's jobs.
    #[arg(long, conflicts_with = "me")]
    pub user: Option<String>,
    /// Only your own jobs.
    #[arg(long)]
    pub me: bool,
    /// Only jobs in these states, comma-separated (e.g. PENDING,RUNNING; finished ones included).
    #[arg(long, value_delimiter = ',')]
    pub state: Vec<String>,
    /// Only jobs of this partition.
    #[arg(long)]
    pub partition: Option<String>,
    /// Only jobs of this QoS.
    #[arg(long)]
    pub qos: Option<String>,
    /// Only jobs with this name.
    #[arg(long)]
    pub name: Option<String>,
    /// Columns, comma-separated, of ID, NAME, USER, QOS, STATE, GPUS, NODE, REASON (table output).
    #[arg(long, value_delimiter = ',')]
    pub format: Vec<String>,
    /// Pending jobs only, with when each is expected to start (START_TIME, local time; N/A
    /// for none) and why then (START_REASON), like squeue's --start: from the scheduler's
    /// time limits of the jobs ahead and reservations' windows, if nothing else changes.
    #[arg(long, conflicts_with_all = ["format", "all"])]
    pub start: bool,
}

/// The state name as the CLI prints it, to the API's value.
pub fn state_of(name: &str) -> Option<pb::JobState> {
    let all = [
        pb::JobState::Pending,
        pb::JobState::Running,
        pb::JobState::Completed,
        pb::JobState::Failed,
        pb::JobState::Cancelled,
        pb::JobState::Timeout,
        pb::JobState::NodeFail,
        pb::JobState::Preempting,
        pb::JobState::Suspended,
        pb::JobState::OutOfMemory,
    ];
    all.into_iter().find(|s| output::job_state_name(*s as i32).eq_ignore_ascii_case(name.trim()))
}

/// `--state` names as the API's values.
fn states_of(names: &[String]) -> anyhow::Result<Vec<i32>> {
    names
        .iter()
        .map(|s| {
            state_of(s).map(|s| s as i32).ok_or_else(|| anyhow::anyhow!("--state: unknown state \"{s}\""))
        })
        .collect()
}

/// Every job `request` selects, page after page, so the list is whole however long it is.
async fn list_all(client: &Client, request: pb::ListJobsRequest) -> anyhow::Result<Vec<pb::Job>> {
    let mut jobs = Vec::new();
    let mut page_token = String::new();
    loop {
        let req = pb::ListJobsRequest { page_token: page_token.clone(), ..request.clone() };
        let page = client.jobs(req, |mut c, r| async move { c.list_jobs(r).await }).await?.into_inner();
        jobs.extend(page.jobs);
        if page.next_page_token.is_empty() {
            return Ok(jobs);
        }
        page_token = page.next_page_token;
    }
}

/// Lists jobs (pending and running, or those `args` select), every page.
pub async fn queue(client: &Client, json: bool, args: QueueArgs) -> anyhow::Result<i32> {
    let states = states_of(&args.state)?;
    let columns = args
        .format
        .iter()
        .map(|c| {
            JOB_HEADER.iter().position(|h| h.eq_ignore_ascii_case(c.trim())).ok_or_else(|| {
                anyhow::anyhow!("--format: unknown column \"{c}\" (use {})", JOB_HEADER.join(","))
            })
        })
        .collect::<anyhow::Result<Vec<usize>>>()?;
    let states = if args.start && states.is_empty() { vec![pb::JobState::Pending as i32] } else { states };
    let request = pb::ListJobsRequest {
        all: args.all,
        states,
        user: args.user.unwrap_or_default(),
        mine: args.me,
        partition: args.partition.unwrap_or_default(),
        qos: args.qos.unwrap_or_default(),
        name: args.name.unwrap_or_default(),
        ..Default::default()
    };
    let mut jobs = list_all(client, request).await?;
    if args.start {
        jobs.retain(|j| j.state == pb::JobState::Pending as i32);
    }
    if !json {
        jobs = output::fold_pending_tasks(jobs);
    }
    if args.start && !json {
        print_list(false, &jobs, job_json, &output::START_HEADER, output::start_row);
    } else if columns.is_empty() || json {
        print_list(json, &jobs, job_json, &JOB_HEADER, job_row);
    } else {
        let header: Vec<&str> = columns.iter().map(|i| JOB_HEADER[*i]).collect();
        let pick = |j: &pb::Job| {
            let row = job_row(j);
            columns.iter().map(|i| row[*i].clone()).collect::<Vec<String>>()
        };
        print_list(false, &jobs, job_json, &header, pick);
    }
    Ok(0)
}

/// The job id of task `index` of array `array`.
async fn array_task(client: &Client, array: u64, index: u32) -> anyhow::Result<u64> {
    array_tasks(client, array)
        .await?
        .into_iter()
        .find(|(i, _)| *i == index)
        .map(|(_, id)| id)
        .ok_or_else(|| anyhow::anyhow!("array {array} has no task {index}"))
}

/// Every task of array `array` as (index, job id), in id order.
async fn array_tasks(client: &Client, array: u64) -> anyhow::Result<Vec<(u32, u64)>> {
    let head = get_job(client, array).await?;
    if head.array_job_id != array {
        anyhow::bail!("job {array} is not a job array");
    }
    // Tasks have consecutive ids from the array's.
    let mut tasks = Vec::new();
    let mut page_token = String::new();
    loop {
        let req = pb::ListJobsRequest {
            all: true,
            page_token: if page_token.is_empty() { (array - 1).to_string() } else { page_token.clone() },
            limit: head.array_task_count.max(1),
            ..Default::default()
        };
        let page = client.jobs(req, |mut c, r| async move { c.list_jobs(r).await }).await?.into_inner();
        tasks.extend(page.jobs.iter().filter(|j| j.array_job_id == array).map(|j| (j.array_task_id, j.id)));
        let past = page.jobs.last().is_none_or(|j| j.id >= array + u64::from(head.array_task_count));
        if page.next_page_token.is_empty() || past {
            return Ok(tasks);
        }
        page_token = page.next_page_token;
    }
}

/// The job a reference names: a job id, or `ARRAY_INDEX` for one task of an array.
pub async fn resolve(client: &Client, target: (u64, Option<u32>)) -> anyhow::Result<u64> {
    match target {
        (id, None) => Ok(id),
        (array, Some(index)) => array_task(client, array, index).await,
    }
}

async fn get_job(client: &Client, id: u64) -> Result<pb::Job, CallError> {
    client
        .jobs(pb::GetJobRequest { job_id: id }, |mut c, r| async move { c.get_job(r).await })
        .await
        .map(|r| r.into_inner())
}

pub async fn show(client: &Client, json: bool, id: u64) -> anyhow::Result<i32> {
    let job = get_job(client, id).await?;
    if json {
        print_json(&job_json(&job));
    } else {
        print_job_details(&job);
    }
    Ok(0)
}

/// `kairos cancel`'s ids and scancel's filters.
#[derive(clap::Args, Debug)]
pub struct CancelArgs {
    /// Job ids, or array tasks as ARRAY_INDEX (e.g. 41_3).
    #[arg(value_parser = crate::args::parse_job_ref)]
    pub ids: Vec<(u64, Option<u32>)>,
    /// Only (or every unfinished job) of this user.
    #[arg(long, short = 'u')]
    pub user: Option<String>,
    /// Only (or every) job in these states, comma-separated (PENDING, RUNNING, SUSPENDED).
    #[arg(long, short = 't', value_delimiter = ',')]
    pub state: Vec<String>,
    /// Only (or every unfinished) job with this name.
    #[arg(long, short = 'n')]
    pub name: Option<String>,
}

/// Cancels the jobs `args` names; exits 1 when one of them could not be cancelled (each said).
pub async fn cancel(client: &Client, json: bool, args: CancelArgs) -> anyhow::Result<i32> {
    let filtered = args.user.is_some() || !args.state.is_empty() || args.name.is_some();
    if args.ids.is_empty() && !filtered {
        anyhow::bail!("give job ids, or -u USER, --state or --name to cancel every job that matches");
    }
    let mut ids = Vec::new();
    for target in &args.ids {
        ids.push(resolve(client, *target).await?);
    }
    if filtered {
        let states = states_of(&args.state)?;
        let request = pb::ListJobsRequest {
            states,
            user: args.user.clone().unwrap_or_default(),
            name: args.name.clone().unwrap_or_default(),
            ..Default::default()
        };
        let listed = list_all(client, request).await?;
        let matching: Vec<u64> = listed.iter().filter(|j| !terminal(j.state)).map(|j| j.id).collect();
        ids = if ids.is_empty() {
            matching
        } else {
            ids.into_iter().filter(|i| matching.contains(i)).collect()
        };
    }
    let mut failed = 0;
    for id in ids {
        let reply = client
            .jobs(pb::CancelJobRequest { job_id: id }, |mut c, r| async move { c.cancel_job(r).await })
            .await;
        match reply.map(tonic::Response::into_inner) {
            Ok(job) if json => print_json(&job_json(&job)),
            Ok(job) if job.state == pb::JobState::Running as i32 => {
                println!("job {id}: cancel requested; its processes are being stopped")
            }
            Ok(_) => println!("job {id}: cancelled"),
            Err(e) => {
                eprintln!("kairos: job {id}: {e}");
                failed += 1;
            }
        }
    }
    Ok(i32::from(failed > 0))
}

fn terminal(state: i32) -> bool {
    ![pb::JobState::Pending as i32, pb::JobState::Running as i32, pb::JobState::Suspended as i32]
        .contains(&state)
}

/// Holds (`hold`) or releases a pending job.
pub async fn hold(client: &Client, json: bool, id: u64, hold: bool) -> anyhow::Result<i32> {
    let req = pb::HoldJobRequest { job_id: id };
    let job = client
        .jobs(req, |mut c, r| async move {
            if hold {
                c.hold_job(r).await
            } else {
                c.release_job(r).await
            }
        })
        .await?
        .into_inner();
    if json {
        print_json(&job_json(&job));
    } else {
        println!("job {id}: {}", if hold { "held" } else { "released" });
    }
    Ok(0)
}

pub async fn logs(client: &Client, id: u64, follow: bool, attempt: Option<u32>) -> anyhow::Result<i32> {
    let mut out = std::io::stdout().lock();
    // Bytes printed so far: a stream opened again (another replica, after a failover) starts
    // there, so no line is printed twice or skipped.
    let mut offset = 0u64;
    let mut lost_since: Option<std::time::Instant> = None;
    let mut opened_once = false;
    loop {
        let req = pb::LogsRequest { job_id: id, follow, offset, read_attempt: attempt, ..Default::default() };
        let mut stream = match client.jobs(req, |mut c, r| async move { c.stream_logs(r).await }).await {
            Ok(s) => s.into_inner(),
            Err(e) if !opened_once || !follow => return Err(e.into()),
            Err(e) => {
                give_up_after_reach_wait(&mut lost_since, &format!("following the logs of job {id}"), &e)?;
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                continue;
            }
        };
        opened_once = true;
        lost_since = None;
        let mut broken = false;
        while let Some(chunk) = stream.next().await {
            match chunk {
                Ok(chunk) => {
                    out.write_all(&chunk.data)?;
                    out.flush()?;
                    offset += chunk.data.len() as u64;
                }
                Err(s) if follow && crate::client::resumable(&s) => {
                    broken = true;
                    break;
                }
                Err(s) => return Err(CallError(format!("reading logs of job {id}: {}", s.message())).into()),
            }
        }
        if !broken {
            if offset == 0 {
                output_elsewhere_hint(client, id).await;
            }
            return Ok(0);
        }
    }
}

/// A batch job with `-o`/`-e` writes its output to its own files, not to the log: say where,
/// rather than print nothing.
async fn output_elsewhere_hint(client: &Client, id: u64) {
    let Ok(job) = get_job(client, id).await else { return };
    let Some(spec) = job.spec.as_ref() else { return };
    if let [sh, c, redirect, ..] = spec.argv.as_slice() {
        if sh == "/bin/sh" && c == "-c" && redirect.starts_with("exec >>") {
            let to = redirect.trim_start_matches("exec ").split(';').next().unwrap_or_default();
            eprintln!(
                "kairos: job {id} sends its output to its -o/-e files ({to}, in {}), not to this log",
                if spec.workdir.is_empty() { "its job directory" } else { spec.workdir.as_str() }
            );
        }
    }
}

/// Ends a watching command with `Unreachable` once no controller answered for `REACH_WAIT`.
fn give_up_after_reach_wait(
    lost_since: &mut Option<std::time::Instant>,
    what: &str,
    last: &CallError,
) -> anyhow::Result<()> {
    let since = *lost_since.get_or_insert_with(std::time::Instant::now);
    if since.elapsed() >= crate::client::REACH_WAIT {
        return Err(crate::client::Unreachable(format!(
            "{what}: no controller answered for {:?} ({last})",
            crate::client::REACH_WAIT
        ))
        .into());
    }
    Ok(())
}

/// Waits for a job, or for every task of an array (by its id): the exit status is the largest
/// of its tasks' (`wait_code`).
pub async fn wait(client: &Client, json: bool, target: (u64, Option<u32>)) -> anyhow::Result<i32> {
    let id = resolve(client, target).await?;
    let head = get_job(client, id).await?;
    if target.1.is_some() || head.array_job_id != id {
        let job = wait_one(client, id).await?;
        if json {
            print_json(&job_json(&job));
        } else {
            println!("job {}: {}", output::job_label(&job), output::job_state_name(job.state));
        }
        return Ok(wait_code(&job));
    }
    let mut ended = Vec::new();
    for (_, task) in array_tasks(client, id).await? {
        ended.push(wait_one(client, task).await?);
    }
    if json {
        print_json(&serde_json::Value::Array(ended.iter().map(job_json).collect()));
    } else {
        for job in &ended {
            println!("job {}: {}", output::job_label(job), output::job_state_name(job.state));
        }
    }
    Ok(ended.iter().map(wait_code).max().unwrap_or(0))
}

/// Watches job `id` until it ends, opening the watch again (another replica) when a stream
/// breaks; `Unreachable` once no controller answered for `REACH_WAIT`.
async fn wait_one(client: &Client, id: u64) -> anyhow::Result<pb::Job> {
    let mut lost_since: Option<std::time::Instant> = None;
    let mut opened_once = false;
    loop {
        let req = pb::WatchJobRequest { job_id: id };
        match client.jobs(req, |mut c, r| async move { c.watch_job(r).await }).await {
            Ok(stream) => {
                opened_once = true;
                lost_since = None;
                let mut stream = stream.into_inner();
                let mut last = None;
                while let Some(item) = stream.next().await {
                    match item {
                        Ok(job) => last = Some(job),
                        Err(s) if crate::client::resumable(&s) => break,
                        Err(s) => return Err(CallError(format!("watching job {id}: {}", s.message())).into()),
                    }
                }
                if let Some(job) = last.filter(ended) {
                    return Ok(job);
                }
            }
            Err(e) if !opened_once => return Err(e.into()),
            Err(e) => give_up_after_reach_wait(&mut lost_since, &format!("watching job {id}"), &e)?,
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// Whether the job has ended (what `wait` waits for).
fn ended(job: &pb::Job) -> bool {
    !matches!(
        pb::JobState::try_from(job.state),
        Ok(pb::JobState::Pending
            | pb::JobState::Running
            | pb::JobState::Preempting
            | pb::JobState::Suspended
            | pb::JobState::Unspecified)
            | Err(_)
    )
}

/// `kairos wait`'s exit status for a job that ended: 0 when it completed, its exit code when it
/// failed with one, 128 + N when signal N killed it, 124 on a time limit, 125 when cancelled,
/// 123 when its node failed or its run was lost, 122 when it ran out of memory. (1 is also
/// kairos's own failure.)
pub(crate) fn wait_code(job: &pb::Job) -> i32 {
    match pb::JobState::try_from(job.state) {
        Ok(pb::JobState::Completed) => 0,
        Ok(pb::JobState::Failed) if job.signal > 0 => 128 + job.signal.min(127),
        Ok(pb::JobState::Failed) => job.exit_code.unwrap_or(1).clamp(1, 255),
        Ok(pb::JobState::Timeout) => 124,
        Ok(pb::JobState::Cancelled) => 125,
        Ok(pb::JobState::OutOfMemory) => 122,
        _ => 123,
    }
}

/// Inside a job: marks a checkpoint as just written.
pub fn checkpoint_done() -> anyhow::Result<i32> {
    let dir = std::env::var("KAIROS_CHECKPOINT_DIR").map_err(|_| {
        anyhow::anyhow!("checkpoint-done: not inside a kairos job (KAIROS_CHECKPOINT_DIR is unset)")
    })?;
    let marker = std::path::Path::new(&dir).join(".kairos-checkpoint");
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&marker)
        .and_then(|f| f.set_modified(std::time::SystemTime::now()))
        .map_err(|e| anyhow::anyhow!("checkpoint-done: touching {}: {e}", marker.display()))?;
    Ok(0)
}

//! kairos: the command-line client. Its flags, output and exit codes are a contract that users'
//! scripts rely on: exit 0 on success; on any error a one-line message on stderr and exit 1
//! (2 for a command line that does not parse).
//!
//! One module per command family (`jobs`, `nodes`, `cluster`, `tokens`, `qos`, `accounts`,
//! `partitions`, `policy`, `burst`, `priority`, `up`); this file parses the command line and
//! dispatches. Every call goes through `client::Client` (leader redirects, retries, token).

mod accounts;
mod args;
mod batch;
mod burst;
mod burst_file;
mod client;
mod cluster;
mod context;
mod events;
mod history;
mod insight;
mod interactive;
mod jobs;
mod kueue_import;
mod manifest;
mod nodes;
mod output;
mod partitions;
mod policy;
mod policy_file;
mod priority;
mod qos;
mod redirect;
mod reservations;
mod sim;
mod tokens;
mod topology;
mod up;
mod whatif;

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};

use crate::client::Client;

#[derive(Parser, Debug)]
#[command(name = "kairos", version, about = "kairos GPU cluster scheduler client")]
struct Cli {
    /// Controller addresses, HOST:PORT[,HOST:PORT...] (default: the context's, else
    /// 127.0.0.1:7001).
    #[arg(long, global = true, env = "KAIROS_CONTROLLERS", value_delimiter = ',')]
    controllers: Option<Vec<String>>,
    /// The context to use (default: the current one; `kairos context list`).
    #[arg(long, global = true, env = "KAIROS_CONTEXT")]
    context: Option<String>,
    /// Print JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
    /// File holding the API token (default: KAIROS_TOKEN, else the context's token file, else
    /// ~/.config/kairos/token).
    #[arg(long, global = true, env = "KAIROS_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// Act as another user (admins only; the call gets that user's rights).
    #[arg(long = "as", global = true, value_name = "USER")]
    act_as: Option<String>,
    /// TLS: the CA certificate (PEM) that signs the controllers' certificates; with it the
    /// client talks TLS only.
    #[arg(long, global = true, env = "KAIROS_CA")]
    ca: Option<PathBuf>,
    /// TLS: a client certificate (PEM) for controllers that require mutual TLS.
    #[arg(long, global = true, env = "KAIROS_CERT", requires = "key")]
    cert: Option<PathBuf>,
    /// TLS: the client certificate's private key (PEM).
    #[arg(long, global = true, env = "KAIROS_KEY", requires = "cert")]
    key: Option<PathBuf>,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum ReportCmd {
    /// Per account, user, QoS or partition (like sreport, with efficiency): jobs, GPU-hours
    /// held and busy, idle share, GPU memory p95 over the GPU's, CPU and memory efficiency,
    /// preemptions and GPU-hours they lost, waits p50/p99; a TOTAL row. Its records are the
    /// ones `kairos history` lists for the same window.
    Usage(insight::report::ReportArgs),
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Submit a job; prints its id.
    Submit(Box<jobs::SubmitArgs>),
    /// An interactive job (like salloc): submit it with `submit`'s resource flags, wait for it
    /// (Ctrl-C cancels), then attach to its terminal (a login shell, or CMD after --); exits
    /// with its status.
    Alloc(Box<interactive::alloc::AllocArgs>),
    /// Run one command as an interactive job (like srun), its output streamed here; exits
    /// with its status.
    Run(Box<interactive::alloc::RunArgs>),
    /// Run a command inside a running job (like srun --overlap, kubectl exec): its cgroup,
    /// GPUs and environment; -t for a terminal. Exits with its status.
    Exec(interactive::exec::ExecArgs),
    /// Attach to an interactive job's terminal (again, from anywhere).
    Attach {
        /// The job's id, or an array task as ARRAY_INDEX (e.g. 41_3).
        #[arg(value_parser = args::parse_job_ref)]
        id: (u64, Option<u32>),
    },
    /// Forward a local port to a port a running job listens on (like kubectl port-forward).
    PortForward(interactive::forward::PortForwardArgs),
    /// JupyterLab in an interactive job, forwarded here: prints the URL to open.
    Notebook(Box<interactive::notebook::NotebookArgs>),
    /// Replay a job trace through the production scheduling core, in virtual time (no cluster
    /// needed): waits per class, utilisation, preemptions, redone work.
    Sim(sim::SimArgs),
    /// Submit a batch script like sbatch: options from its #SBATCH (or #KAIROS) lines, those
    /// before SCRIPT overriding them; prints the job's (or array's) id.
    #[command(disable_help_flag = true)]
    Batch(batch::BatchArgs),
    /// List pending and running jobs (all jobs with --all), every page of them.
    Queue(jobs::QueueArgs),
    /// Accounting, like sacct: jobs live in a time window (default: the last day), finished
    /// ones too — also those past the controllers' --job-retention, kept in the history.
    History(history::HistoryArgs),
    /// The cluster's event log (operators): nodes joining, draining, down, up and removed, and
    /// policy changes with the token that made them and the hash of the what-if they confirmed.
    Events(events::EventsArgs),
    /// What a job used against what it asked for (like seff): GPUs, GPU memory, CPUs, memory,
    /// wall time, with what it could ask for instead.
    Eff {
        /// The job's id, or an array task as ARRAY_INDEX (e.g. 41_3).
        #[arg(value_parser = args::parse_job_ref)]
        id: (u64, Option<u32>),
    },
    /// A running job's usage as its node measures it, refreshed: per GPU its utilisation and
    /// memory with their history, CPU cores and memory.
    Top(insight::top::TopArgs),
    /// Reports over the history.
    Report {
        #[command(subcommand)]
        command: ReportCmd,
    },
    /// Show one job (also one only the history still holds).
    Show {
        /// The job's id, or an array task as ARRAY_INDEX (e.g. 41_3).
        #[arg(value_parser = args::parse_job_ref)]
        id: (u64, Option<u32>),
    },
    /// Cancel jobs, like scancel: by id (an array's id cancels every task of it, ID_N only task
    /// N), or every unfinished job of -u USER / in --state / named --name (with ids: those of
    /// them that match).
    Cancel(jobs::CancelArgs),
    /// Keep a pending job from starting.
    Hold {
        /// The job's id, or an array task as ARRAY_INDEX (e.g. 41_3).
        #[arg(value_parser = args::parse_job_ref)]
        id: (u64, Option<u32>),
    },
    /// Let a held job start.
    Release {
        /// The job's id, or an array task as ARRAY_INDEX (e.g. 41_3).
        #[arg(value_parser = args::parse_job_ref)]
        id: (u64, Option<u32>),
    },
    /// Print a job's output.
    Logs {
        /// The job's id, or an array task as ARRAY_INDEX (e.g. 41_3).
        #[arg(value_parser = args::parse_job_ref)]
        id: (u64, Option<u32>),
        /// Keep printing until the job ends.
        #[arg(long, short)]
        follow: bool,
        /// The log of attempt N (0 = the first run; default: the current attempt), e.g. the
        /// run before a requeue.
        #[arg(long, value_name = "N")]
        attempt: Option<u32>,
    },
    /// Wait until a job ends; exits with its outcome: 0 completed, the job's exit code when it
    /// failed, 128+N when signal N killed it, 124 timeout, 125 cancelled, 123 node failure.
    Wait {
        /// The job's id (an array's id waits for every task; the status is the largest of
        /// theirs), or an array task as ARRAY_INDEX (e.g. 41_3).
        #[arg(value_parser = args::parse_job_ref)]
        id: (u64, Option<u32>),
    },
    /// List GPU nodes (`--topology`: as the tree of topology domains, with free GPUs in each).
    Nodes {
        /// The nodes as the tree of topology domains (highest level first), with the free
        /// GPUs of each domain and node.
        #[arg(long)]
        topology: bool,
    },
    /// Drain a node (operators): nothing new is placed there; its jobs get the checkpoint
    /// signal and are requeued.
    Drain {
        /// The node's name.
        node: String,
        /// Why (shown with the node).
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// One node (operators): `remove NAME` forgets a node that holds no job, so another agent
    /// may register the name with the join token; `resume NAME` ends a drain; `gpu-reset NAME
    /// GPU` returns an unhealthy GPU to service.
    Node {
        #[command(subcommand)]
        command: nodes::NodeCmd,
    },
    /// API tokens (admins): create, list, revoke.
    Token {
        #[command(subcommand)]
        command: tokens::TokenCmd,
    },
    /// The controller cluster.
    Cluster {
        #[command(subcommand)]
        command: cluster::ClusterCmd,
    },
    /// Pending jobs' priorities and their factors (like sprio).
    Priority {
        /// Only this job (default: every pending job).
        id: Option<u64>,
    },
    /// Accounts' shares, usage and fairshare factor (like sshare).
    Share,
    /// Inside a job: report that a checkpoint has just been written (preemption then spares the
    /// work before it).
    CheckpointDone,
    /// Recent preemptions: who preempted whom, how, and the work lost.
    Preemptions {
        /// Only those in the last DURATION (e.g. 1h).
        #[arg(long, value_parser = args::parse_time)]
        since: Option<u64>,
    },
    /// QoS classes: list, show, create, update, delete.
    Qos {
        #[command(subcommand)]
        command: qos::QosCmd,
    },
    /// Partitions: their nodes, tiers and rules.
    Partition {
        #[command(subcommand)]
        command: partitions::PartitionCmd,
    },
    /// Reservations: nodes or a GPU count held for a time window (that may repeat) for an
    /// access list, like Slurm's (operators create, update, delete; everyone lists).
    Reservation {
        #[command(subcommand)]
        command: reservations::ReservationCmd,
    },
    /// Fairshare accounts: the tree, shares and members.
    Account {
        #[command(subcommand)]
        command: accounts::AccountCmd,
    },
    /// The whole scheduling policy as a TOML file.
    Policy {
        #[command(subcommand)]
        command: policy::PolicyCmd,
    },
    /// The topology above the nodes (racks, blocks, NVLink domains): `apply FILE`
    /// (operators), `show`. Gangs are placed inside one domain (`submit --topology`).
    Topology {
        #[command(subcommand)]
        command: topology::TopologyCmd,
    },
    /// Cloud burst: configuration (admin) and status.
    Burst {
        #[command(subcommand)]
        command: burst::BurstCmd,
    },
    /// Named clusters to talk to, like kubeconfig's (~/.config/kairos/config.toml).
    Context {
        #[command(subcommand)]
        command: context::ContextCmd,
    },
    /// Print a shell completion script (e.g. `kairos completions bash > /etc/bash_completion.d/kairos`).
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Write man pages (kairos.1 and one per command, e.g. kairos-submit.1) into DIR.
    Man {
        /// Where to write them (created if missing).
        dir: PathBuf,
    },
    /// Start a local cluster in the foreground: controller replicas and one agent.
    ///
    /// `--controllers N` starts N replicas on consecutive ports from `--addr`;
    /// `--controllers A,B,C` starts one replica at each address.
    Up {
        /// Address of the first controller replica (with `--controllers N`).
        #[arg(long, default_value = "127.0.0.1:7001")]
        addr: String,
        /// The agent's log-service address.
        #[arg(long, default_value = "127.0.0.1:7101")]
        agent_addr: String,
        /// Where the local cluster keeps its data (kept across restarts).
        #[arg(long, default_value = "kairos-data")]
        data_dir: PathBuf,
        /// Fake GPUs for the agent when NVML is absent: COUNT or COUNTxMODEL.
        #[arg(long, default_value = "8")]
        fake_gpus: String,
        /// The agent's node name.
        #[arg(long, default_value = "local")]
        node_name: String,
        /// Fake GPUs' usage from this file (lines `GPU UTIL MEM_MIB`, re-read as it changes),
        /// to model busy and idle GPUs (`kairos-agent --fake-gpu-usage`).
        #[arg(long, value_name = "FILE")]
        fake_gpu_usage: Option<PathBuf>,
        /// Whom the agent runs jobs as: `agent` (whoever runs `kairos up`) or `submitter` (each
        /// job as the Unix account of its kairos user; needs root).
        #[arg(long, default_value = "agent", value_parser = ["agent", "submitter"])]
        run_as: String,
        /// CPUs the agent offers jobs (default: the host's cores), e.g. 16 to run a cluster's
        /// scripts on a laptop; a job's cpuset is still at most the host's cores.
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        cpus: Option<u32>,
        /// Memory the agent offers jobs, e.g. 64G (default: the host's); a job's memory limit
        /// is what it asked for.
        #[arg(long, value_name = "SIZE", value_parser = kairos_proto::units::parse_mem_mib)]
        memory: Option<u64>,
    },
}

/// `kairos batch`: its help (the sbatch options it takes), or the script submitted.
async fn batch(client: &Client, json: bool, args: batch::BatchArgs) -> anyhow::Result<i32> {
    if matches!(args.args.first().map(String::as_str), Some("--help" | "-h")) {
        print!("{}", batch::help());
        return Ok(0);
    }
    let env = std::env::vars().collect();
    let submit = batch::submit_args(&args.args, &env).map_err(|e| anyhow::anyhow!("{e}"))?;
    jobs::submit(client, json, submit).await
}

async fn run(cli: Cli) -> anyhow::Result<i32> {
    let client = client_for(&cli)?;
    let (client, json) = (&client, cli.json);
    match cli.command {
        Cmd::Submit(args) => jobs::submit(client, json, *args).await,
        Cmd::Alloc(args) => interactive::alloc::alloc(client, *args).await,
        Cmd::Run(args) => interactive::alloc::run(client, *args).await,
        Cmd::Exec(args) => interactive::exec::exec(client, args).await,
        Cmd::Attach { id } => interactive::exec::attach(client, id).await,
        Cmd::PortForward(args) => interactive::forward::port_forward(client, args).await,
        Cmd::Notebook(args) => interactive::notebook::notebook(client, *args).await,
        Cmd::Queue(args) => jobs::queue(client, json, args).await,
        Cmd::Show { id } => jobs::show(client, json, jobs::resolve(client, id).await?).await,
        Cmd::History(args) => history::history(client, json, args).await,
        Cmd::Events(args) => events::events(client, json, args).await,
        Cmd::Eff { id } => insight::eff::eff(client, json, jobs::resolve(client, id).await?).await,
        Cmd::Top(args) => insight::top::top(client, json, args).await,
        Cmd::Report { command: ReportCmd::Usage(args) } => insight::report::report(client, json, args).await,
        Cmd::Cancel(args) => jobs::cancel(client, json, args).await,
        Cmd::Batch(args) => batch(client, json, args).await,
        Cmd::Hold { id } => jobs::hold(client, json, jobs::resolve(client, id).await?, true).await,
        Cmd::Release { id } => jobs::hold(client, json, jobs::resolve(client, id).await?, false).await,
        Cmd::Logs { id, follow, attempt } => {
            jobs::logs(client, jobs::resolve(client, id).await?, follow, attempt).await
        }
        Cmd::Wait { id } => jobs::wait(client, json, id).await,
        Cmd::CheckpointDone => jobs::checkpoint_done(),
        Cmd::Nodes { topology: false } => nodes::list(client, json).await,
        Cmd::Nodes { topology: true } => topology::tree(client, json).await,
        Cmd::Drain { node, reason } => nodes::drain(client, node, reason).await,
        Cmd::Node { command } => nodes::node_command(client, command).await,
        Cmd::Token { command } => tokens::token_command(client, json, command).await,
        Cmd::Cluster { command } => cluster::cluster_command(client, json, command).await,
        Cmd::Priority { id } => priority::priority(client, json, id).await,
        Cmd::Preemptions { since } => priority::preemptions(client, json, since).await,
        Cmd::Share => accounts::share(client, json).await,
        Cmd::Qos { command } => qos::qos_command(client, command, json).await,
        Cmd::Account { command } => accounts::account_command(client, json, command).await,
        Cmd::Reservation { command } => reservations::reservation_command(client, json, command).await,
        Cmd::Partition { command } => partitions::partition_command(client, json, command).await,
        Cmd::Policy { command } => policy::policy_command(client, json, command).await,
        Cmd::Topology { command } => topology::command(client, json, command).await,
        Cmd::Burst { command } => burst::burst_command(client, json, command).await,
        Cmd::Context { command } => context::context_command(json, command),
        Cmd::Sim(args) => sim::sim(json, args),
        Cmd::Completions { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(shell, &mut Cli::command(), "kairos", &mut std::io::stdout());
            Ok(0)
        }
        Cmd::Man { dir } => man_pages(&dir),
        Cmd::Up {
            addr,
            agent_addr,
            data_dir,
            fake_gpus,
            node_name,
            fake_gpu_usage,
            run_as,
            cpus,
            memory,
        } => {
            let controllers = up::up_controllers(&local_controllers(cli.controllers.as_ref()), &addr)?;
            let memory_mib = memory;
            let args = up::UpArgs {
                controllers,
                agent_addr,
                data_dir,
                fake_gpus,
                node_name,
                fake_gpu_usage,
                run_as,
                cpus,
                memory_mib,
            };
            up::run(args).await?;
            Ok(0)
        }
    }
}

/// The client the command talks to the controllers with. Flags and the environment first,
/// then the context (`context`), then the defaults.
fn client_for(cli: &Cli) -> anyhow::Result<Client> {
    let local = matches!(
        cli.command,
        Cmd::Up { .. }
            | Cmd::CheckpointDone
            | Cmd::Completions { .. }
            | Cmd::Man { .. }
            | Cmd::Sim(_)
            | Cmd::Context { .. }
    );
    let config = if local { context::Config::default() } else { context::Config::load()? };
    // A context's credentials go only with its own addresses (`Config::resolve`).
    // Commands that call no controller read no context (nor KAIROS_CONTEXT, set for the others).
    let named = if local { None } else { cli.context.as_deref() };
    let resolved = config.resolve(named, cli.controllers.as_deref(), up::DEFAULT_CONTROLLER)?;
    let (ctx_name, ctx) = resolved.context.unwrap_or_default();
    let tls = kairos_proto::wire::TlsFiles {
        ca: cli.ca.clone().or(ctx.ca),
        cert: cli.cert.clone().or(ctx.cert),
        key: cli.key.clone().or(ctx.key),
    }
    .client()
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    let ctx_token = ctx.token_file.as_deref().map(|f| (ctx_name.as_str(), f));
    let token = if local { None } else { client::load_token(cli.token_file.as_deref(), ctx_token)? };
    Ok(Client::new(resolved.controllers, token, cli.act_as.clone(), tls))
}

/// The controllers `kairos up` starts: a local cluster takes its addresses from its own flags
/// only (KAIROS_CONTROLLERS points the CLI at another cluster, and must not decide where this
/// one binds), else the default.
fn local_controllers(flag: Option<&Vec<String>>) -> Vec<String> {
    let given = std::env::args().any(|a| a == "--controllers" || a.starts_with("--controllers="));
    match (flag, given) {
        (Some(c), true) => c.clone(),
        _ => vec![up::DEFAULT_CONTROLLER.to_string()],
    }
}

/// `kairos man DIR`: the man pages written to `dir`.
fn man_pages(dir: &std::path::Path) -> anyhow::Result<i32> {
    use clap::CommandFactory;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    clap_mangen::generate_to(Cli::command(), dir)
        .with_context(|| format!("writing man pages to {}", dir.display()))?;
    println!("man pages written to {}", dir.display());
    Ok(0)
}

/// A reader that stops reading (`kairos queue --all | head -1`) ends the output: the CLI exits 0
/// quietly, as coreutils' tools do, instead of panicking on the closed pipe (Rust ignores
/// SIGPIPE, so `print!` meets `EPIPE`).
fn quiet_on_closed_pipe() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or_default();
        // `print!`'s "failed printing to stdout: Broken pipe", clap_complete's "failed to write
        // completion file: … BrokenPipe …".
        if message.starts_with("failed")
            && (message.contains("Broken pipe") || message.contains("BrokenPipe"))
        {
            std::process::exit(0);
        }
        default(info)
    }));
}

/// The command line as parsed: `Cli`, with the global (connection, TLS, output) options listed
/// once, in `kairos --help`: every subcommand gets them hidden (clap then does not propagate
/// its own, shown, copies), so they are still accepted before or after any subcommand.
fn command() -> clap::Command {
    use clap::CommandFactory;
    let cmd = Cli::command();
    let globals: Vec<clap::Arg> = cmd.get_arguments().filter(|a| a.is_global_set()).cloned().collect();
    fn hide_in(cmd: clap::Command, globals: &[clap::Arg]) -> clap::Command {
        let names: Vec<String> = cmd.get_subcommands().map(|c| c.get_name().to_string()).collect();
        names.into_iter().fold(cmd, |cmd, name| {
            cmd.mut_subcommand(name, |sub| {
                let sub = globals.iter().fold(sub, |sub, g| sub.arg(g.clone().hide(true)));
                hide_in(sub, globals)
            })
        })
    }
    hide_in(cmd, &globals)
}

fn parse_cli(argv: impl IntoIterator<Item = std::ffi::OsString>) -> Result<Cli, clap::Error> {
    use clap::FromArgMatches;
    Cli::from_arg_matches(&command().try_get_matches_from(argv)?)
}

#[tokio::main]
async fn main() {
    quiet_on_closed_pipe();
    let cli = match parse_cli(std::env::args_os()) {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(
                e.kind(),
                ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                let _ = e.print();
                std::process::exit(if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                    2
                } else {
                    0
                });
            }
            // One line: clap's first line, without its usage block.
            let rendered = e.render().to_string();
            let line =
                rendered.lines().next().unwrap_or("invalid command line").trim_start_matches("error: ");
            eprintln!("kairos: {line}");
            std::process::exit(2);
        }
    };
    let mut traces = kairos_telemetry::traces::init("kairos");
    let result = run(cli).await;
    traces.shutdown();
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("kairos: {}", e.to_string().lines().next().unwrap_or("error"));
            if e.downcast_ref::<client::Unreachable>().is_some() {
                std::process::exit(client::EXIT_UNREACHABLE);
            }
            std::process::exit(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Every flag and argument of every command says what it is for.
    #[test]
    fn every_argument_of_every_command_has_help_text() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{path} {id}"));
                }
            }
            for sub in cmd.get_subcommands() {
                if sub.get_about().is_none() && sub.get_name() != "help" {
                    missing.push(format!("{path} {} (command)", sub.get_name()));
                }
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut missing = Vec::new();
        walk(&super::Cli::command(), "kairos", &mut missing);
        assert!(missing.is_empty(), "without help text: {missing:#?}");
    }

    #[test]
    fn submit_takes_sbatchs_short_flags() {
        use clap::Parser;
        super::Cli::command().debug_assert();
        let argv = [
            "kairos", "submit", "-t", "10m", "-G", "2", "-J", "train", "-q", "batch", "-p", "big", "-A",
            "vision", "-N", "2", "-D", "/work", "--", "true",
        ];
        let cli = super::Cli::try_parse_from(argv).expect("sbatch's short flags parse");
        let super::Cmd::Submit(a) = cli.command else { panic!("not a submit") };
        assert_eq!(
            (a.time, a.gpus, a.name.as_str(), a.qos.as_deref()),
            (Some(600), 2, "train", Some("batch"))
        );
        assert_eq!((a.partition.as_deref(), a.account.as_deref(), a.nodes), (Some("big"), Some("vision"), 2));
        assert_eq!((a.workdir.as_deref(), a.command.as_slice()), (Some("/work"), &["true".to_string()][..]));
    }
}

//! kairos: the command-line client. Its flags, output and exit codes are a contract that users'
//! scripts rely on: exit 0 on success; on any error a one-line message on stderr and exit 1
//! (2 for a command line that does not parse).

mod burst_file;
mod client;
mod output;
mod policy_file;
mod up;

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use kairos_proto::v1 as pb;
use kairos_proto::v1::admin_service_client::AdminServiceClient;
use tokio_stream::StreamExt;

use crate::client::{CallError, Client};
use crate::output::{
    job_json, job_row, node_json, node_row, print_job_details, table, JOB_HEADER, NODE_HEADER,
};

#[derive(Parser, Debug)]
#[command(name = "kairos", version, about = "kairos GPU cluster scheduler client")]
struct Cli {
    /// Controller addresses, HOST:PORT[,HOST:PORT...].
    #[arg(
        long,
        global = true,
        env = "KAIROS_CONTROLLERS",
        default_value = "127.0.0.1:7001",
        value_delimiter = ','
    )]
    controllers: Vec<String>,
    /// Print JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
    /// File holding the API token (default: KAIROS_TOKEN, else ~/.config/kairos/token).
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

#[derive(Clone, Copy, Debug, ValueEnum)]
enum ProfileArg {
    Training,
    Inference,
    Batch,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Submit a job; prints its id.
    Submit {
        /// GPUs the job needs on each node.
        #[arg(long, alias = "gpus-per-node", default_value_t = 1, allow_negative_numbers = true, value_parser = parse_gpus)]
        gpus: u32,
        /// Gang job: run one task on each of this many nodes, all or nothing (torchrun-style
        /// RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in the environment).
        #[arg(long, default_value_t = 1, allow_negative_numbers = true, value_parser = parse_gpus)]
        nodes: u32,
        #[arg(long, default_value = "")]
        name: String,
        /// Wall-clock limit: 90s, 30m, 2h, 1h30m, HH:MM:SS, or whole minutes.
        #[arg(long, value_parser = parse_time)]
        time: Option<u64>,
        #[arg(long)]
        qos: Option<String>,
        #[arg(long, value_enum)]
        profile: Option<ProfileArg>,
        /// Extra environment variables, KEY=VALUE (repeatable).
        #[arg(long = "env", value_parser = parse_env)]
        env: Vec<(String, String)>,
        /// Working directory of the job on its node.
        #[arg(long)]
        workdir: Option<String>,
        /// Requeue the job (next attempt) if its node fails, instead of ending it NODE_FAIL.
        #[arg(long)]
        requeue: bool,
        /// Start only after these jobs completed successfully (repeatable or comma-separated).
        #[arg(long = "after-ok", value_delimiter = ',')]
        after_ok: Vec<u64>,
        /// Submit held: the job waits until `kairos release`.
        #[arg(long)]
        hold: bool,
        /// Only GPUs of this model, e.g. H100 or A100.
        #[arg(long)]
        gpu_model: Option<String>,
        /// Fairshare account (default: your default account).
        #[arg(long)]
        account: Option<String>,
        /// Partition (default: the cluster's default partition).
        #[arg(long)]
        partition: Option<String>,
        /// Elastic job: the fewest GPUs it can run on. Preemption shrinks it (restart on fewer
        /// GPUs, KAIROS_GPUS says how many) instead of stopping it; it grows back later.
        #[arg(long, allow_negative_numbers = true, value_parser = parse_min_gpus)]
        min_gpus: Option<u32>,
        /// Elastic gang: the fewest nodes it can run on. Preemption releases whole nodes of it
        /// (restart on fewer, WORLD_SIZE says how many) instead of stopping it; it grows back.
        #[arg(long, allow_negative_numbers = true, value_parser = parse_min_gpus)]
        min_nodes: Option<u32>,
        /// The job tolerates SIGSTOP/SIGCONT: a SUSPEND-mode QoS pauses it instead of stopping it.
        #[arg(long)]
        suspendable: bool,
        /// Signal that asks the job to checkpoint before a requeue or resize (default SIGUSR1).
        #[arg(long)]
        checkpoint_signal: Option<String>,
        /// How long the job gets to checkpoint and exit (default and maximum: the QoS grace).
        #[arg(long, value_parser = parse_time)]
        checkpoint_grace: Option<u64>,
        /// The command and its arguments, after `--`.
        #[arg(last = true)]
        command: Vec<String>,
    },
    /// List pending and running jobs (all jobs with --all).
    Queue {
        #[arg(long)]
        all: bool,
    },
    /// Show one job.
    Show { id: u64 },
    /// Cancel a job.
    Cancel { id: u64 },
    /// Keep a pending job from starting.
    Hold { id: u64 },
    /// Let a held job start.
    Release { id: u64 },
    /// Print a job's output.
    Logs {
        id: u64,
        /// Keep printing until the job ends.
        #[arg(long, short)]
        follow: bool,
    },
    /// Wait until a job ends; exits 0 if it completed, 1 otherwise.
    Wait { id: u64 },
    /// List GPU nodes.
    Nodes,
    /// Drain a node (operators): nothing new is placed there; its jobs get the checkpoint
    /// signal and are requeued.
    Drain {
        node: String,
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// One node (operators): `remove NAME` forgets a node that holds no job, so another agent
    /// may register the name with the join token.
    Node {
        #[command(subcommand)]
        command: NodeCmd,
    },
    /// API tokens (admins): create, list, revoke.
    Token {
        #[command(subcommand)]
        command: TokenCmd,
    },
    /// The controller cluster.
    Cluster {
        #[command(subcommand)]
        command: ClusterCmd,
    },
    /// Pending jobs' priorities and their factors (like sprio).
    Priority { id: Option<u64> },
    /// Accounts' shares, usage and fairshare factor (like sshare).
    Share,
    /// Inside a job: report that a checkpoint has just been written (preemption then spares the
    /// work before it).
    CheckpointDone,
    /// Recent preemptions: who preempted whom, how, and the work lost.
    Preemptions {
        /// Only those in the last DURATION (e.g. 1h).
        #[arg(long, value_parser = parse_time)]
        since: Option<u64>,
    },
    /// QoS classes: list, show, create, update, delete.
    Qos {
        #[command(subcommand)]
        command: QosCmd,
    },
    /// Partitions: their nodes, tiers and rules.
    Partition {
        #[command(subcommand)]
        command: PartitionCmd,
    },
    /// Fairshare accounts: the tree, shares and members.
    Account {
        #[command(subcommand)]
        command: AccountCmd,
    },
    /// The whole scheduling policy as a TOML file.
    Policy {
        #[command(subcommand)]
        command: PolicyCmd,
    },
    /// Cloud burst: configuration (admin) and status.
    Burst {
        #[command(subcommand)]
        command: BurstCmd,
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
        #[arg(long, default_value = "kairos-data")]
        data_dir: PathBuf,
        /// Fake GPUs for the agent when NVML is absent: COUNT or COUNTxMODEL.
        #[arg(long, default_value = "8")]
        fake_gpus: String,
        #[arg(long, default_value = "local")]
        node_name: String,
        /// Whom the agent runs jobs as: `agent` (whoever runs `kairos up`) or `submitter` (each
        /// job as the Unix account of its kairos user; needs root).
        #[arg(long, default_value = "agent", value_parser = ["agent", "submitter"])]
        run_as: String,
    },
}

#[derive(Subcommand, Debug)]
enum NodeCmd {
    /// Forget a node that holds no job (down, or drained and idle); its credentials stop working.
    Remove { name: String },
}

#[derive(Subcommand, Debug)]
enum TokenCmd {
    /// Issue a token; prints it once (only its hash is stored).
    Create {
        #[arg(long)]
        user: String,
        /// user, operator or admin.
        #[arg(long, default_value = "user")]
        role: String,
        /// Lifetime (e.g. 30d, 12h); default: until revoked.
        #[arg(long, value_parser = parse_time)]
        ttl: Option<u64>,
        #[arg(long, default_value = "")]
        description: String,
    },
    List,
    /// Revoke a token by its id (or the whole token).
    Revoke {
        id: String,
    },
}

#[derive(Subcommand, Debug)]
enum QosCmd {
    List,
    Show {
        name: String,
    },
    /// Create a QoS (needs --priority and --max-wall).
    Create {
        name: String,
        #[command(flatten)]
        flags: QosFlags,
    },
    /// Change the given settings of a QoS.
    Update {
        name: String,
        #[command(flatten)]
        flags: QosFlags,
    },
    /// Delete a QoS that no unfinished job uses.
    Delete {
        name: String,
    },
}

#[derive(Subcommand, Debug)]
enum BurstCmd {
    /// The burst configuration.
    Config {
        #[command(subcommand)]
        command: BurstConfigCmd,
    },
    /// Instances (type, state, age, node, jobs), GPUs, spend against the limits, last decisions.
    Status,
}

#[derive(Subcommand, Debug)]
enum BurstConfigCmd {
    /// Print the configuration as a TOML file (or JSON with --json).
    Show,
    /// Replace the whole configuration with a TOML file (validated whole).
    Apply { file: PathBuf },
    /// Change top-level settings: KEY=VALUE ... (e.g. enabled=true max_instances=4).
    Set {
        #[arg(required = true)]
        assignments: Vec<String>,
    },
}

#[derive(clap::Args, Debug, Default)]
struct QosFlags {
    #[arg(long, allow_negative_numbers = true)]
    priority: Option<i64>,
    /// QoS classes this one may preempt, comma-separated ("" for none).
    #[arg(long)]
    preempt: Option<String>,
    /// off | cancel | requeue | suspend
    #[arg(long)]
    preempt_mode: Option<String>,
    /// Grace between the stop signal and SIGKILL when preempted (e.g. 5m).
    #[arg(long)]
    grace: Option<String>,
    /// Minimum run time before a job may be preempted.
    #[arg(long)]
    preempt_exempt: Option<String>,
    #[arg(long)]
    max_wall: Option<String>,
    /// GPUs of all running jobs together ("none" for no limit).
    #[arg(long)]
    grp_gpus: Option<String>,
    /// GPUs per user ("none" for no limit).
    #[arg(long)]
    user_gpus: Option<String>,
    /// Running jobs per user ("none" for no limit).
    #[arg(long)]
    user_jobs: Option<String>,
    #[arg(long)]
    burstable: Option<bool>,
}

#[derive(Subcommand, Debug)]
enum AccountCmd {
    /// List accounts (usage and fairshare factors: `kairos share`).
    List,
    /// Create an account.
    Create {
        name: String,
        #[command(flatten)]
        flags: AccountFlags,
    },
    /// Change the given settings of an account.
    Update {
        name: String,
        #[command(flatten)]
        flags: AccountFlags,
    },
    /// Delete an account no unfinished job uses.
    Delete { name: String },
}

#[derive(clap::Args, Debug)]
struct AccountFlags {
    /// Parent account ("" for a root account).
    #[arg(long)]
    parent: Option<String>,
    #[arg(long)]
    shares: Option<u32>,
    /// Members, comma-separated ("" = open to every user).
    #[arg(long)]
    users: Option<String>,
}

#[derive(Subcommand, Debug)]
enum PartitionCmd {
    List,
    /// Create a partition.
    Create {
        name: String,
        #[command(flatten)]
        flags: PartitionFlags,
    },
    /// Change the given settings of a partition.
    Update {
        name: String,
        #[command(flatten)]
        flags: PartitionFlags,
    },
    /// Delete a partition no unfinished job uses.
    Delete {
        name: String,
    },
}

#[derive(clap::Args, Debug)]
struct PartitionFlags {
    /// Nodes by name, comma-separated ("" = use the selector).
    #[arg(long)]
    nodes: Option<String>,
    /// Label selector KEY=VALUE[,KEY=VALUE] ("" = no selector).
    #[arg(long)]
    selector: Option<String>,
    #[arg(long)]
    tier: Option<u32>,
    /// Allowed QoS, comma-separated ("" = all).
    #[arg(long)]
    allowed_qos: Option<String>,
    /// Default QoS ("" = none).
    #[arg(long)]
    default_qos: Option<String>,
    /// Max wall time, e.g. 72h ("" = none).
    #[arg(long)]
    max_wall: Option<String>,
}

fn csv(s: &str) -> Vec<String> {
    s.split(',').map(str::trim).filter(|x| !x.is_empty()).map(String::from).collect()
}

impl AccountFlags {
    fn apply_to(&self, a: &mut pb::Account) {
        if let Some(p) = &self.parent {
            a.parent = p.clone();
        }
        if let Some(sh) = self.shares {
            a.shares = sh;
        }
        if let Some(u) = &self.users {
            a.users = csv(u);
        }
    }
}

impl PartitionFlags {
    fn apply_to(&self, p: &mut pb::Partition) -> anyhow::Result<()> {
        if let Some(n) = &self.nodes {
            p.nodes = csv(n);
        }
        if let Some(sel) = &self.selector {
            p.selector = csv(sel)
                .into_iter()
                .map(|kv| {
                    kv.split_once('=')
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .ok_or_else(|| anyhow::anyhow!("--selector: \"{kv}\" is not KEY=VALUE"))
                })
                .collect::<anyhow::Result<_>>()?;
        }
        if let Some(t) = self.tier {
            p.priority_tier = t;
        }
        if let Some(q) = &self.allowed_qos {
            p.allowed_qos = csv(q);
        }
        if let Some(q) = &self.default_qos {
            p.default_qos = q.clone();
        }
        if let Some(w) = &self.max_wall {
            p.max_wall_s = if w.is_empty() {
                None
            } else {
                Some(policy_file::parse_secs("--max-wall", w).map_err(anyhow::Error::msg)?)
            };
        }
        Ok(())
    }
}

#[derive(Subcommand, Debug)]
enum PolicyCmd {
    /// Replace the whole policy with a TOML file (validated whole; nothing half-applied).
    Apply { file: PathBuf },
    /// Print the policy as TOML.
    Export,
}

#[derive(Subcommand, Debug)]
enum ClusterCmd {
    /// Replicas, leader, term and indices.
    Status,
    /// Add a replica (started with `kairosd --join`): a learner until caught up, then a voter.
    Add { id: u64, addr: String },
    /// Remove a replica; removing the leader hands leadership over.
    Remove { id: u64 },
}

/// Parses a wall-clock limit into seconds.
fn parse_time(s: &str) -> Result<u64, String> {
    let err = || format!("cannot parse \"{s}\" as a duration (use e.g. 90s, 30m, 2h, 1h30m, 1:30:00)");
    let secs = if s.contains(':') {
        let parts: Vec<&str> = s.split(':').collect();
        if parts.len() > 3 || parts.iter().any(|p| p.is_empty() || !p.chars().all(|c| c.is_ascii_digit())) {
            return Err(err());
        }
        parts
            .iter()
            .try_fold(0u64, |acc, p| Some(acc.checked_mul(60)? + p.parse::<u64>().ok()?))
            .ok_or_else(err)?
    } else if !s.is_empty() && s.chars().all(|c| c.is_ascii_digit()) {
        s.parse::<u64>().ok().and_then(|m| m.checked_mul(60)).ok_or_else(err)?
    } else {
        humantime::parse_duration(s).map_err(|_| err())?.as_secs()
    };
    if secs == 0 {
        return Err(format!("\"{s}\" is zero; a time limit must be at least one second"));
    }
    Ok(secs)
}

fn parse_gpus(s: &str) -> Result<u32, String> {
    match s.parse::<i64>() {
        Ok(n) if n < 0 => Err(format!("{n} is negative; a job needs at least 1 GPU")),
        Ok(n) => u32::try_from(n).map_err(|_| format!("{n} is too large")),
        Err(_) => Err(format!("\"{s}\" is not a whole number")),
    }
}

fn parse_min_gpus(s: &str) -> Result<u32, String> {
    match parse_gpus(s)? {
        0 => Err("an elastic job runs on at least 1 GPU".to_string()),
        n => Ok(n),
    }
}

fn parse_env(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("\"{s}\" is not KEY=VALUE"))
}

fn parse_limit(field: &str, v: &str) -> anyhow::Result<Option<u32>> {
    if v == "none" {
        return Ok(None);
    }
    v.parse::<u32>()
        .map(Some)
        .map_err(|_| anyhow::anyhow!("--{field}: \"{v}\" is not a whole number or \"none\""))
}

impl QosFlags {
    /// Applies the given flags to `q`.
    fn apply_to(&self, q: &mut pb::Qos) -> anyhow::Result<()> {
        use policy_file::{parse_mode, parse_secs};
        if let Some(p) = self.priority {
            q.priority = p;
        }
        if let Some(p) = &self.preempt {
            q.preempt = p.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect();
        }
        if let Some(m) = &self.preempt_mode {
            q.preempt_mode = parse_mode(m).map_err(|e| anyhow::anyhow!("--preempt-mode: {e}"))? as i32;
        }
        if let Some(g) = &self.grace {
            q.grace_s = parse_secs("--grace", g).map_err(anyhow::Error::msg)?;
        }
        if let Some(g) = &self.preempt_exempt {
            q.preempt_exempt_s = parse_secs("--preempt-exempt", g).map_err(anyhow::Error::msg)?;
        }
        if let Some(w) = &self.max_wall {
            q.max_wall_s = parse_secs("--max-wall", w).map_err(anyhow::Error::msg)?;
        }
        if let Some(v) = &self.grp_gpus {
            q.grp_gpus = parse_limit("grp-gpus", v)?;
        }
        if let Some(v) = &self.user_gpus {
            q.user_gpus = parse_limit("user-gpus", v)?;
        }
        if let Some(v) = &self.user_jobs {
            q.user_jobs = parse_limit("user-jobs", v)?;
        }
        if let Some(b) = self.burstable {
            q.burstable = b;
        }
        Ok(())
    }
}

fn qos_row(q: &pb::Qos) -> Vec<String> {
    let limit = |l: Option<u32>| l.map(|v| v.to_string()).unwrap_or_else(|| "-".into());
    vec![
        q.name.clone(),
        q.priority.to_string(),
        if q.preempt.is_empty() { "-".into() } else { q.preempt.join(",") },
        policy_file::mode_name(q.preempt_mode).into(),
        policy_file::format_secs(q.grace_s),
        policy_file::format_secs(q.max_wall_s),
        limit(q.grp_gpus),
        limit(q.user_gpus),
        limit(q.user_jobs),
        q.burstable.to_string(),
    ]
}

fn qos_json(q: &pb::Qos) -> serde_json::Value {
    serde_json::json!({
        "name": q.name,
        "priority": q.priority,
        "preempt": q.preempt,
        "preempt_mode": policy_file::mode_name(q.preempt_mode),
        "grace_s": q.grace_s,
        "preempt_exempt_s": q.preempt_exempt_s,
        "max_wall_s": q.max_wall_s,
        "grp_gpus": q.grp_gpus,
        "user_gpus": q.user_gpus,
        "user_jobs": q.user_jobs,
        "burstable": q.burstable,
    })
}

async fn get_policy(client: &Client) -> Result<pb::Policy, CallError> {
    client
        .admin(pb::GetPolicyRequest {}, |mut c, r| async move { c.get_policy(r).await })
        .await
        .map(|r| r.into_inner())
}

async fn put_account(
    client: &Client,
    account: pb::Account,
    mode: pb::PutMode,
) -> Result<pb::Account, CallError> {
    let req = pb::PutAccountRequest { account: Some(account), mode: mode as i32 };
    client.admin(req, |mut c, r| async move { c.put_account(r).await }).await.map(|r| r.into_inner())
}

async fn put_partition(
    client: &Client,
    partition: pb::Partition,
    mode: pb::PutMode,
) -> Result<pb::Partition, CallError> {
    let req = pb::PutPartitionRequest { partition: Some(partition), mode: mode as i32 };
    client.admin(req, |mut c, r| async move { c.put_partition(r).await }).await.map(|r| r.into_inner())
}

async fn put_qos(client: &Client, qos: pb::Qos, mode: pb::PutMode) -> Result<pb::Qos, CallError> {
    client
        .admin(pb::PutQosRequest { qos: Some(qos.clone()), mode: mode as i32 }, |mut c, r| async move {
            c.put_qos(r).await
        })
        .await
        .map(|r| r.into_inner())
}

async fn qos_command(client: &Client, command: QosCmd, json: bool) -> anyhow::Result<i32> {
    let show = |q: &pb::Qos| {
        if json {
            print_json(&qos_json(q));
        } else {
            table(&QOS_HEADER, &[qos_row(q)]);
        }
    };
    match command {
        QosCmd::List => {
            let policy = get_policy(client).await?;
            print_list(json, &policy.qos, qos_json, &QOS_HEADER, qos_row);
        }
        QosCmd::Show { name } => {
            let policy = get_policy(client).await?;
            let q = policy
                .qos
                .iter()
                .find(|q| q.name == name)
                .ok_or_else(|| CallError(format!("qos \"{name}\" not found")))?;
            show(q);
        }
        QosCmd::Create { name, flags } => {
            if flags.priority.is_none() || flags.max_wall.is_none() {
                anyhow::bail!("qos create: --priority and --max-wall are required");
            }
            let mut q = pb::Qos { name, preempt_mode: pb::PreemptMode::Off as i32, ..Default::default() };
            flags.apply_to(&mut q)?;
            show(&put_qos(client, q, pb::PutMode::Create).await?);
        }
        QosCmd::Update { name, flags } => {
            let policy = get_policy(client).await?;
            let mut q = policy
                .qos
                .into_iter()
                .find(|q| q.name == name)
                .ok_or_else(|| CallError(format!("qos \"{name}\" not found")))?;
            flags.apply_to(&mut q)?;
            show(&put_qos(client, q, pb::PutMode::Update).await?);
        }
        QosCmd::Delete { name } => {
            client
                .admin(pb::DeleteQosRequest { name: name.clone() }, |mut c, r| async move {
                    c.delete_qos(r).await
                })
                .await?;
            println!("qos \"{name}\" deleted");
        }
    }
    Ok(0)
}

async fn policy_command(client: &Client, command: PolicyCmd) -> anyhow::Result<i32> {
    match command {
        PolicyCmd::Apply { file } => {
            let text = std::fs::read_to_string(&file)
                .map_err(|e| anyhow::anyhow!("reading {}: {e}", file.display()))?;
            let parsed = policy_file::PolicyFile::parse(&text)
                .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
            let policy = parsed.to_pb().map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
            let applied = client
                .admin(policy.clone(), |mut c, r| async move { c.apply_policy(r).await })
                .await?
                .into_inner();
            println!("policy applied: {} qos classes", applied.qos.len());
        }
        PolicyCmd::Export => {
            let policy = get_policy(client).await?;
            print!("{}", policy_file::PolicyFile::from_pb(&policy).to_toml().map_err(anyhow::Error::msg)?);
        }
    }
    Ok(0)
}

async fn get_burst_config(client: &Client) -> Result<pb::BurstConfig, CallError> {
    client
        .admin(pb::GetBurstConfigRequest {}, |mut c, r| async move { c.get_burst_config(r).await })
        .await
        .map(|r| r.into_inner())
}

async fn set_burst_config(client: &Client, config: pb::BurstConfig) -> Result<pb::BurstConfig, CallError> {
    client
        .admin(config.clone(), |mut c, r| async move { c.set_burst_config(r).await })
        .await
        .map(|r| r.into_inner())
}

fn dollars(milli: u64) -> String {
    format!("${:.2}", milli as f64 / 1000.0)
}

async fn burst_command(client: &Client, json: bool, command: BurstCmd) -> anyhow::Result<i32> {
    match command {
        BurstCmd::Config { command: BurstConfigCmd::Show } => {
            let config = get_burst_config(client).await?;
            let file = burst_file::BurstFile::from_pb(&config);
            if json {
                println!("{}", serde_json::to_string_pretty(&file)?);
            } else {
                print!("{}", toml::to_string(&file)?);
            }
        }
        BurstCmd::Config { command: BurstConfigCmd::Apply { file } } => {
            let text = std::fs::read_to_string(&file)
                .map_err(|e| anyhow::anyhow!("reading {}: {e}", file.display()))?;
            let parsed = burst_file::BurstFile::parse(&text)
                .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
            let config = parsed.to_pb().map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
            let applied = set_burst_config(client, config).await?;
            println!(
                "burst configuration applied: {} ({} instance types)",
                if applied.enabled { "enabled" } else { "disabled" },
                applied.instance_types.len()
            );
        }
        BurstCmd::Config { command: BurstConfigCmd::Set { assignments } } => {
            let mut file = burst_file::BurstFile::from_pb(&get_burst_config(client).await?);
            for a in &assignments {
                file.set(a).map_err(anyhow::Error::msg)?;
            }
            let config = file.to_pb().map_err(anyhow::Error::msg)?;
            set_burst_config(client, config).await?;
            println!("burst configuration updated");
        }
        BurstCmd::Status => {
            let s = client
                .admin(pb::BurstStatusRequest {}, |mut c, r| async move { c.burst_status(r).await })
                .await?
                .into_inner();
            let now_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as i64)
                .unwrap_or(0);
            let age = |from: i64| {
                if from == 0 {
                    "-".to_string()
                } else {
                    format!("{}s", (now_ms - from).max(0) / 1000)
                }
            };
            if json {
                let instances: Vec<serde_json::Value> = s
                    .instances
                    .iter()
                    .map(|i| {
                        serde_json::json!({
                            "intent": i.intent, "instance_type": i.instance_type, "gpus": i.gpus, "spot": i.spot,
                            "price_milli": i.price_milli, "state": i.state, "instance_id": i.instance_id,
                            "node": i.node, "jobs": i.jobs, "requested": output::time_json(i.requested_ms),
                            "ended": output::time_json(i.ended_ms), "reason": i.reason,
                        })
                    })
                    .collect();
                let decisions: Vec<serde_json::Value> = s
                    .decisions
                    .iter()
                    .map(|d| serde_json::json!({"time": output::time_json(d.time_ms), "message": d.message}))
                    .collect();
                let out = serde_json::json!({
                    "enabled": s.enabled, "live_instances": s.live_instances, "live_gpus": s.live_gpus,
                    "hourly_spend_milli": s.hourly_spend_milli, "spent_milli": s.spent_milli,
                    "max_instances": s.max_instances, "max_gpus": s.max_gpus,
                    "max_hourly_spend_milli": s.max_hourly_spend_milli,
                    "on_prem_used": s.on_prem_used, "on_prem_total": s.on_prem_total,
                    "instances": instances, "decisions": decisions,
                });
                println!("{}", serde_json::to_string_pretty(&out)?);
                return Ok(0);
            }
            println!(
                "burst {}: {}/{} instances, {}/{} GPUs, {}/h of {}/h, {} spent; on-prem GPUs {}/{} allocated",
                if s.enabled { "enabled" } else { "disabled" },
                s.live_instances,
                s.max_instances,
                s.live_gpus,
                s.max_gpus,
                dollars(s.hourly_spend_milli),
                dollars(s.max_hourly_spend_milli),
                dollars(s.spent_milli),
                s.on_prem_used,
                s.on_prem_total
            );
            let rows: Vec<Vec<String>> = s
                .instances
                .iter()
                .map(|i| {
                    vec![
                        i.intent.to_string(),
                        i.instance_id.clone(),
                        i.instance_type.clone(),
                        if i.spot { "spot" } else { "on-demand" }.to_string(),
                        i.state.clone(),
                        age(i.requested_ms),
                        if i.node.is_empty() { "-".into() } else { i.node.clone() },
                        i.jobs.iter().map(u64::to_string).collect::<Vec<_>>().join(","),
                        i.reason.clone(),
                    ]
                })
                .collect();
            if !rows.is_empty() {
                table(
                    &["INTENT", "INSTANCE", "TYPE", "MARKET", "STATE", "AGE", "NODE", "JOBS", "REASON"],
                    &rows,
                );
            }
            for d in s.decisions.iter().take(10) {
                println!("{}  {}", output::time_json(d.time_ms).as_str().unwrap_or("-"), d.message);
            }
        }
    }
    Ok(0)
}

const QOS_HEADER: [&str; 10] = [
    "NAME",
    "PRIORITY",
    "PREEMPT",
    "MODE",
    "GRACE",
    "MAX_WALL",
    "GRP_GPUS",
    "USER_GPUS",
    "USER_JOBS",
    "BURSTABLE",
];

/// `kairos up --controllers`: a replica count (consecutive ports from `base`) or addresses.
fn up_controllers(controllers: &[String], base: &str) -> anyhow::Result<Vec<String>> {
    let default = controllers.len() == 1 && controllers[0] == "127.0.0.1:7001";
    let count = match controllers {
        _ if default => 1,
        [n] if n.chars().all(|c| c.is_ascii_digit()) => n.parse::<u16>().unwrap_or(0),
        addrs => return Ok(addrs.to_vec()),
    };
    if !(1..=7).contains(&count) {
        anyhow::bail!("--controllers: a local cluster has 1 to 7 replicas");
    }
    let base: std::net::SocketAddr =
        base.parse().map_err(|_| anyhow::anyhow!("--addr \"{base}\" is not HOST:PORT"))?;
    (0..count)
        .map(|i| {
            let port =
                base.port().checked_add(i).ok_or_else(|| anyhow::anyhow!("--addr: port out of range"))?;
            Ok(std::net::SocketAddr::new(base.ip(), port).to_string())
        })
        .collect()
}

/// A practically unique id for one `kairos submit` or `token create` invocation.
fn request_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let random = std::collections::hash_map::RandomState::new().build_hasher().finish();
    format!("cli-{}-{nanos:x}-{random:016x}", std::process::id())
}

fn print_json(v: &serde_json::Value) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

/// Prints a listing: a JSON array with `--json`, else a table.
fn print_list<T>(
    json: bool,
    items: &[T],
    to_json: impl Fn(&T) -> serde_json::Value,
    header: &[&str],
    to_row: impl Fn(&T) -> Vec<String>,
) {
    if json {
        print_json(&serde_json::Value::Array(items.iter().map(to_json).collect()));
    } else {
        table(header, &items.iter().map(to_row).collect::<Vec<_>>());
    }
}

async fn get_job(client: &Client, id: u64) -> Result<pb::Job, CallError> {
    client
        .jobs(pb::GetJobRequest { job_id: id }, |mut c, r| async move { c.get_job(r).await })
        .await
        .map(|r| r.into_inner())
}

async fn token_command(client: &Client, json: bool, command: TokenCmd) -> anyhow::Result<i32> {
    match command {
        TokenCmd::Create { user, role, ttl, description } => {
            // One request id for every retry of this create: at most one token results.
            let req = pb::CreateTokenRequest {
                user,
                role,
                ttl_s: ttl.unwrap_or(0),
                description,
                request_id: request_id(),
            };
            let created =
                client.admin(req, |mut c, r| async move { c.create_token(r).await }).await?.into_inner();
            if json {
                println!("{}", serde_json::json!({"id": created.id, "token": created.token}));
            } else {
                println!("{}", created.token);
            }
        }
        TokenCmd::List => {
            let tokens = client
                .admin(pb::ListTokensRequest {}, |mut c, r| async move { c.list_tokens(r).await })
                .await?
                .into_inner()
                .tokens;
            let json_of = |t: &pb::TokenInfo| {
                serde_json::json!({"id": t.id, "user": t.user, "role": t.role, "created_ms": t.created_ms,
                    "created_by": t.created_by, "expires_ms": t.expires_ms, "description": t.description})
            };
            let row = |t: &pb::TokenInfo| {
                let expires = if t.expires_ms == 0 { "never".to_string() } else { t.expires_ms.to_string() };
                vec![
                    t.id.clone(),
                    t.user.clone(),
                    t.role.clone(),
                    t.created_by.clone(),
                    expires,
                    t.description.clone(),
                ]
            };
            print_list(
                json,
                &tokens,
                json_of,
                &["ID", "USER", "ROLE", "CREATED_BY", "EXPIRES_MS", "DESCRIPTION"],
                row,
            );
        }
        TokenCmd::Revoke { id } => {
            client
                .admin(pb::RevokeTokenRequest { id: id.clone() }, |mut c, r| async move {
                    c.revoke_token(r).await
                })
                .await?;
            println!("revoked");
        }
    }
    Ok(0)
}

async fn run(cli: Cli) -> anyhow::Result<i32> {
    let tls =
        kairos_proto::wire::TlsFiles { ca: cli.ca.clone(), cert: cli.cert.clone(), key: cli.key.clone() }
            .client()
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    let token = match &cli.command {
        Cmd::Up { .. } | Cmd::CheckpointDone => None,
        _ => client::load_token(cli.token_file.as_deref())?,
    };
    let client = Client::new(cli.controllers.clone(), token, cli.act_as.clone(), tls);
    let client = &client;
    match cli.command {
        Cmd::Submit {
            gpus,
            nodes,
            name,
            time,
            qos,
            profile,
            env,
            workdir,
            requeue,
            after_ok,
            hold,
            gpu_model,
            account,
            partition,
            min_gpus,
            min_nodes,
            suspendable,
            checkpoint_signal,
            checkpoint_grace,
            command,
        } => {
            let profile = match profile {
                None => pb::Profile::Unspecified,
                Some(ProfileArg::Training) => pb::Profile::Training,
                Some(ProfileArg::Inference) => pb::Profile::Inference,
                Some(ProfileArg::Batch) => pb::Profile::Batch,
            };
            let name = if name.is_empty() {
                command.first().map(|c| c.rsplit('/').next().unwrap_or(c).to_string()).unwrap_or_default()
            } else {
                name
            };
            let spec = pb::JobSpec {
                name,
                argv: command,
                env: env.into_iter().collect(),
                workdir: workdir.unwrap_or_default(),
                qos: qos.unwrap_or_default(),
                profile: profile as i32,
                resources: Some(pb::Resources {
                    gpus,
                    tasks: nodes,
                    gpu_model: gpu_model.unwrap_or_default(),
                    min_gpus: min_gpus.unwrap_or(0),
                    min_tasks: min_nodes.unwrap_or(0),
                    ..Default::default()
                }),
                suspendable,
                checkpoint: (checkpoint_signal.is_some() || checkpoint_grace.is_some()).then(|| {
                    pb::CheckpointSpec {
                        signal: checkpoint_signal.unwrap_or_default(),
                        grace_s: checkpoint_grace.unwrap_or(0).min(u64::from(u32::MAX)) as u32,
                        dir: String::new(),
                    }
                }),
                time_limit_s: time.unwrap_or(0),
                requeue: requeue.then_some(true),
                after_ok,
                hold,
                account: account.unwrap_or_default(),
                partition: partition.unwrap_or_default(),
                ..Default::default()
            };
            // Retries (leader changes) reuse this id, so a submit is never applied twice.
            let request_id = request_id();
            let resp = client
                .jobs(
                    pb::SubmitRequest { spec: Some(spec.clone()), request_id: request_id.clone() },
                    |mut c, r| async move { c.submit(r).await },
                )
                .await?
                .into_inner();
            match (cli.json, resp.job) {
                (true, Some(job)) => print_json(&job_json(&job)),
                _ => println!("{}", resp.job_id),
            }
        }
        Cmd::Queue { all } => {
            // Every page, so the list is whole however long it is.
            let mut jobs = Vec::new();
            let mut page_token = String::new();
            loop {
                let page = client
                    .jobs(
                        pb::ListJobsRequest { all, page_token: page_token.clone(), ..Default::default() },
                        |mut c, r| async move { c.list_jobs(r).await },
                    )
                    .await?
                    .into_inner();
                jobs.extend(page.jobs);
                if page.next_page_token.is_empty() {
                    break;
                }
                page_token = page.next_page_token;
            }
            print_list(cli.json, &jobs, job_json, &JOB_HEADER, job_row);
        }
        Cmd::Show { id } => {
            let job = get_job(client, id).await?;
            if cli.json {
                print_json(&job_json(&job));
            } else {
                print_job_details(&job);
            }
        }
        Cmd::Cancel { id } => {
            let job = client
                .jobs(pb::CancelJobRequest { job_id: id }, |mut c, r| async move { c.cancel_job(r).await })
                .await?
                .into_inner();
            if cli.json {
                print_json(&job_json(&job));
            } else if job.state == pb::JobState::Running as i32 {
                println!("job {id}: cancel requested; its processes are being stopped");
            } else {
                println!("job {id}: cancelled");
            }
        }
        Cmd::Hold { id } | Cmd::Release { id } => {
            let hold = matches!(cli.command, Cmd::Hold { .. });
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
            if cli.json {
                print_json(&job_json(&job));
            } else {
                println!("job {id}: {}", if hold { "held" } else { "released" });
            }
        }
        Cmd::Logs { id, follow } => {
            let mut stream = client
                .jobs(pb::LogsRequest { job_id: id, follow, ..Default::default() }, |mut c, r| async move {
                    c.stream_logs(r).await
                })
                .await?
                .into_inner();
            let mut out = std::io::stdout().lock();
            while let Some(chunk) = stream.next().await {
                let chunk =
                    chunk.map_err(|s| CallError(format!("reading logs of job {id}: {}", s.message())))?;
                out.write_all(&chunk.data)?;
            }
            out.flush()?;
        }
        Cmd::Wait { id } => {
            let mut stream = client
                .jobs(pb::WatchJobRequest { job_id: id }, |mut c, r| async move { c.watch_job(r).await })
                .await?
                .into_inner();
            let mut last = None;
            while let Some(job) = stream.next().await {
                last = Some(job.map_err(|s| CallError(format!("watching job {id}: {}", s.message())))?);
            }
            let job = last.ok_or_else(|| CallError(format!("watching job {id}: stream ended early")))?;
            let state = output::job_state_name(job.state);
            if cli.json {
                print_json(&job_json(&job));
            } else {
                println!("job {id}: {state}");
            }
            if state != "COMPLETED" {
                return Ok(1);
            }
        }
        Cmd::Nodes => {
            let nodes = client
                .admin(pb::ListNodesRequest {}, |mut c, r| async move { c.list_nodes(r).await })
                .await?
                .into_inner()
                .nodes;
            print_list(cli.json, &nodes, node_json, &NODE_HEADER, node_row);
        }
        Cmd::Drain { node, reason } => {
            client
                .admin(
                    pb::DrainNodeRequest { node: node.clone(), reason: reason.clone() },
                    |mut c, r| async move { c.drain_node(r).await },
                )
                .await?;
            println!("node {node} drains");
        }
        Cmd::Node { command: NodeCmd::Remove { name } } => {
            client
                .admin(pb::RemoveNodeRequest { node: name.clone() }, |mut c, r| async move {
                    c.remove_node(r).await
                })
                .await?;
            println!("node {name} removed");
        }
        Cmd::Token { command } => return token_command(client, cli.json, command).await,
        Cmd::Cluster { command } => {
            let status = client
                .call(|ch| {
                    let mut admin = AdminServiceClient::new(ch);
                    let command = &command;
                    async move {
                        match command {
                            ClusterCmd::Status => {
                                admin.cluster_status(client.request(pb::ClusterStatusRequest {})).await
                            }
                            ClusterCmd::Add { id, addr } => {
                                let req = pb::AddReplicaRequest { id: *id, addr: addr.clone() };
                                admin.add_replica(client.request(req)).await
                            }
                            ClusterCmd::Remove { id } => {
                                admin
                                    .remove_replica(client.request(pb::RemoveReplicaRequest { id: *id }))
                                    .await
                            }
                        }
                    }
                })
                .await?
                .into_inner();
            let j = output::cluster_json(&status);
            if cli.json {
                print_json(&j);
            } else {
                println!(
                    "leader: {} ({})  term: {}  commit index: {}  applied index: {}  digest: {}",
                    j["leader"],
                    status.leader_addr,
                    status.term,
                    status.commit_index,
                    status.applied_index,
                    status.state_digest
                );
                let rows: Vec<Vec<String>> = status
                    .replicas
                    .iter()
                    .map(|r| vec![r.id.to_string(), r.addr.clone(), r.role.clone()])
                    .collect();
                table(&["ID", "ADDR", "ROLE"], &rows);
            }
        }
        Cmd::Priority { id } => {
            let req = pb::GetPrioritiesRequest { job_id: id.unwrap_or(0) };
            let resp =
                client.admin(req, |mut c, r| async move { c.get_priorities(r).await }).await?.into_inner();
            let mut jobs = resp.jobs;
            jobs.sort_by_key(|j| (std::cmp::Reverse(j.priority), j.job_id));
            let round = |x: f64| (x * 10_000.0).round() / 10_000.0;
            if cli.json {
                let v: Vec<serde_json::Value> = jobs
                    .iter()
                    .map(|j| {
                        serde_json::json!({
                            "id": j.job_id, "user": j.user, "account": j.account, "qos": j.qos,
                            "priority": j.priority, "qos_factor": round(j.qos_factor),
                            "age_factor": round(j.age_factor), "fairshare_factor": round(j.fairshare_factor),
                            "job_size_factor": round(j.job_size_factor),
                        })
                    })
                    .collect();
                print_json(&serde_json::Value::Array(v));
            } else {
                let w = resp.weights.unwrap_or_default();
                println!(
                    "weights: qos {} age {} fairshare {} job size {}",
                    w.qos, w.age, w.fairshare, w.job_size
                );
                let rows: Vec<Vec<String>> = jobs
                    .iter()
                    .map(|j| {
                        vec![
                            j.job_id.to_string(),
                            j.user.clone(),
                            j.account.clone(),
                            j.qos.clone(),
                            j.priority.to_string(),
                            format!("{:.4}", j.qos_factor),
                            format!("{:.4}", j.age_factor),
                            format!("{:.4}", j.fairshare_factor),
                            format!("{:.4}", j.job_size_factor),
                        ]
                    })
                    .collect();
                table(
                    &["ID", "USER", "ACCOUNT", "QOS", "PRIORITY", "QOS", "AGE", "FAIRSHARE", "SIZE"],
                    &rows,
                );
            }
        }
        Cmd::CheckpointDone => {
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
        }
        Cmd::Preemptions { since } => {
            let now_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as i64)
                .unwrap_or(0);
            let since_ms = since.map(|s| now_ms - (s as i64) * 1000).unwrap_or(0);
            let list = client
                .admin(pb::ListPreemptionsRequest { since_ms }, |mut c, r| async move {
                    c.list_preemptions(r).await
                })
                .await?
                .into_inner()
                .preemptions;
            print_list(
                cli.json,
                &list,
                |r| {
                    serde_json::json!({
                        "time": output::time_json(r.time_ms), "preemptor": r.preemptor, "victim": r.victim,
                        "mode": r.mode, "node": r.node, "gpu_s_lost": r.gpu_s_lost,
                    })
                },
                &["TIME", "PREEMPTOR", "VICTIM", "MODE", "NODE", "GPU-S LOST"],
                |r| {
                    vec![
                        output::time_json(r.time_ms).as_str().unwrap_or("-").to_string(),
                        r.preemptor.to_string(),
                        r.victim.to_string(),
                        r.mode.clone(),
                        r.node.clone(),
                        r.gpu_s_lost.to_string(),
                    ]
                },
            );
        }
        Cmd::Share => {
            let accounts = client
                .admin(pb::GetSharesRequest {}, |mut c, r| async move { c.get_shares(r).await })
                .await?
                .into_inner()
                .accounts;
            if cli.json {
                let v: Vec<serde_json::Value> = accounts
                    .iter()
                    .map(|a| {
                        serde_json::json!({
                            "account": a.name, "parent": if a.parent.is_empty() { serde_json::Value::Null } else { a.parent.clone().into() },
                            "shares": a.shares, "usage_gpu_s": (a.usage_gpu_s * 1000.0).round() / 1000.0,
                            "fairshare_factor": (a.fairshare_factor * 10_000.0).round() / 10_000.0,
                        })
                    })
                    .collect();
                print_json(&serde_json::Value::Array(v));
            } else {
                let rows: Vec<Vec<String>> = accounts
                    .iter()
                    .map(|a| {
                        vec![
                            a.name.clone(),
                            if a.parent.is_empty() { "-".into() } else { a.parent.clone() },
                            a.shares.to_string(),
                            format!("{:.1}", a.usage_gpu_s),
                            format!("{:.4}", a.fairshare_factor),
                        ]
                    })
                    .collect();
                table(&["ACCOUNT", "PARENT", "SHARES", "USAGE(GPU-s)", "FAIRSHARE"], &rows);
            }
        }
        Cmd::Qos { command } => return qos_command(client, command, cli.json).await,
        Cmd::Account { command: AccountCmd::Create { name, flags } } => {
            let mut a = pb::Account { name: name.clone(), shares: 1, ..Default::default() };
            flags.apply_to(&mut a);
            put_account(client, a, pb::PutMode::Create).await?;
            println!("account \"{name}\" created");
        }
        Cmd::Account { command: AccountCmd::Update { name, flags } } => {
            // Only this account is read and written back: edits of other pieces are not lost.
            let policy = get_policy(client).await?;
            let mut a = policy
                .accounts
                .into_iter()
                .find(|a| a.name == name)
                .context(format!("account \"{name}\" not found"))?;
            flags.apply_to(&mut a);
            put_account(client, a, pb::PutMode::Update).await?;
            println!("account \"{name}\" updated");
        }
        Cmd::Account { command: AccountCmd::Delete { name } } => {
            let req = pb::DeleteAccountRequest { name: name.clone() };
            client.admin(req, |mut c, r| async move { c.delete_account(r).await }).await?;
            println!("account \"{name}\" deleted");
        }
        Cmd::Partition { command: PartitionCmd::Create { name, flags } } => {
            let mut part = pb::Partition { name: name.clone(), priority_tier: 1, ..Default::default() };
            flags.apply_to(&mut part)?;
            put_partition(client, part, pb::PutMode::Create).await?;
            println!("partition \"{name}\" created");
        }
        Cmd::Partition { command: PartitionCmd::Update { name, flags } } => {
            let policy = get_policy(client).await?;
            let mut part = policy
                .partitions
                .into_iter()
                .find(|p| p.name == name)
                .context(format!("partition \"{name}\" not found"))?;
            flags.apply_to(&mut part)?;
            put_partition(client, part, pb::PutMode::Update).await?;
            println!("partition \"{name}\" updated");
        }
        Cmd::Partition { command: PartitionCmd::Delete { name } } => {
            let req = pb::DeletePartitionRequest { name: name.clone() };
            client.admin(req, |mut c, r| async move { c.delete_partition(r).await }).await?;
            println!("partition \"{name}\" deleted");
        }
        Cmd::Account { command: AccountCmd::List } => {
            let policy = get_policy(client).await?;
            let parent = |a: &pb::Account| (!a.parent.is_empty()).then(|| a.parent.clone());
            print_list(
                cli.json,
                &policy.accounts,
                |a| serde_json::json!({"name": a.name, "parent": parent(a), "shares": a.shares, "users": a.users}),
                &["ACCOUNT", "PARENT", "SHARES", "USERS"],
                |a| {
                    let users = if a.users.is_empty() { "(open)".into() } else { a.users.join(",") };
                    vec![a.name.clone(), parent(a).unwrap_or_else(|| "-".into()), a.shares.to_string(), users]
                },
            );
        }
        Cmd::Partition { command: PartitionCmd::List } => {
            let policy = get_policy(client).await?;
            if cli.json {
                let v: Vec<serde_json::Value> = policy
                    .partitions
                    .iter()
                    .map(|p| {
                        serde_json::json!({
                            "name": p.name, "default": p.name == policy.default_partition, "nodes": p.nodes,
                            "selector": p.selector, "priority_tier": p.priority_tier, "allowed_qos": p.allowed_qos,
                            "default_qos": (!p.default_qos.is_empty()).then(|| p.default_qos.clone()),
                            "max_wall_s": p.max_wall_s,
                        })
                    })
                    .collect();
                print_json(&serde_json::Value::Array(v));
            } else {
                let rows: Vec<Vec<String>> = policy
                    .partitions
                    .iter()
                    .map(|p| {
                        let mut sel: Vec<String> =
                            p.selector.iter().map(|(k, v)| format!("{k}={v}")).collect();
                        sel.sort();
                        let nodes = if !p.nodes.is_empty() {
                            p.nodes.join(",")
                        } else if !sel.is_empty() {
                            sel.join(",")
                        } else {
                            "all".into()
                        };
                        vec![
                            format!(
                                "{}{}",
                                p.name,
                                if p.name == policy.default_partition { "*" } else { "" }
                            ),
                            nodes,
                            p.priority_tier.to_string(),
                            if p.allowed_qos.is_empty() { "all".into() } else { p.allowed_qos.join(",") },
                            if p.default_qos.is_empty() { "-".into() } else { p.default_qos.clone() },
                            p.max_wall_s.map(policy_file::format_secs).unwrap_or_else(|| "-".into()),
                        ]
                    })
                    .collect();
                table(&["PARTITION", "NODES", "TIER", "QOS", "DEFAULT_QOS", "MAX_WALL"], &rows);
            }
        }
        Cmd::Policy { command } => return policy_command(client, command).await,
        Cmd::Burst { command } => return burst_command(client, cli.json, command).await,
        Cmd::Up { addr, agent_addr, data_dir, fake_gpus, node_name, run_as } => {
            let controllers = up_controllers(&cli.controllers, &addr)?;
            up::run(up::UpArgs { controllers, agent_addr, data_dir, fake_gpus, node_name, run_as }).await?;
        }
    }
    Ok(0)
}

#[tokio::main]
async fn main() {
    let cli = match Cli::try_parse() {
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
    match run(cli).await {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("kairos: {}", e.to_string().lines().next().unwrap_or("error"));
            std::process::exit(1);
        }
    }
}

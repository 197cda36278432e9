//! `kairos qos`: QoS classes (list, show, create, update, delete), edited one at a time on the
//! server (`PutQos`/`DeleteQos`).

use clap::Subcommand;
use kairos_proto::v1 as pb;

use crate::client::{CallError, Client};
use crate::output::{print_json, print_list, table};
use crate::policy::get_policy;
use crate::policy_file;

#[derive(Subcommand, Debug)]
pub enum QosCmd {
    /// Every QoS class and its settings.
    List,
    /// One QoS class.
    Show {
        /// The QoS's name.
        name: String,
    },
    /// Create a QoS (needs --priority and --max-wall).
    Create {
        /// The QoS's name.
        name: String,
        #[command(flatten)]
        flags: QosFlags,
    },
    /// Change the given settings of a QoS.
    Update {
        /// The QoS's name.
        name: String,
        #[command(flatten)]
        flags: QosFlags,
    },
    /// Delete a QoS that no unfinished job uses.
    Delete {
        /// The QoS's name.
        name: String,
    },
}

#[derive(clap::Args, Debug, Default)]
pub struct QosFlags {
    /// Priority (higher first; the priority's QoS factor).
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
    /// Longest time limit of its jobs (e.g. 72h); a job without --time gets it.
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
    /// Its jobs may run on cloud burst nodes (true or false).
    #[arg(long)]
    burstable: Option<bool>,
    /// GPUs kept idle for its jobs (inference headroom); jobs of QoS without headroom may not
    /// start if they would leave fewer free.
    #[arg(long)]
    headroom_gpus: Option<u32>,
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
        if let Some(h) = self.headroom_gpus {
            q.headroom_gpus = h;
        }
        Ok(())
    }
}

pub(crate) fn qos_row(q: &pb::Qos) -> Vec<String> {
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
        q.headroom_gpus.to_string(),
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
        "headroom_gpus": q.headroom_gpus,
    })
}

async fn put_qos(client: &Client, qos: pb::Qos, mode: pb::PutMode) -> Result<pb::Qos, CallError> {
    client
        .admin(pb::PutQosRequest { qos: Some(qos.clone()), mode: mode as i32 }, |mut c, r| async move {
            c.put_qos(r).await
        })
        .await
        .map(|r| r.into_inner())
}

pub async fn qos_command(client: &Client, command: QosCmd, json: bool) -> anyhow::Result<i32> {
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

pub(crate) const QOS_HEADER: [&str; 11] = [
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
    "HEADROOM",
];

//! The policy file format of `kairos policy apply|export` (TOML), and QoS flags of
//! `kairos qos create|update`.
//!
//! ```toml
//! [submit_rules]            # profile -> default QoS
//! training = "training"
//! inference = "inference"
//! batch = "batch"
//!
//! [priority_classes]        # Kubernetes priorityClassName -> QoS (`kairos submit -f`)
//! high-priority = "urgent"
//!
//! [weights]               # multifactor priority; omitted keys keep the defaults
//! qos = 10000
//! age = 1000
//! fairshare = 5000
//! job_size = 500
//! age_max = "7days"
//! fairshare_half_life = "7days"
//!
//! [accounts.root]           # the fairshare account tree
//! shares = 1
//! [accounts.vision]
//! parent = "root"
//! shares = 2
//! users = ["alice", "bob"]  # empty = open to every user
//! allowed_qos = ["training", "inference"]  # empty = as the parent allows
//! default_qos = "training"  # optional; else the parent's
//! [accounts.vision.user_qos.alice]   # one user's jobs under this account
//! allowed_qos = ["training", "inference", "urgent"]
//!
//! default_partition = "default"   # (top level, before any table)
//! [partitions.default]      # nodes = [..] by name, or a label selector; neither = all nodes
//! priority_tier = 1
//! [partitions.big]
//! selector = { rack = "r2" }
//! priority_tier = 5
//! allowed_qos = ["training"]
//! default_qos = "training"
//! max_wall = "72h"
//!
//! [qos.inference]
//! priority = 200
//! preempt = []              # QoS whose jobs this one may preempt
//! preempt_mode = "off"      # off | cancel | requeue | suspend
//! grace = "0s"
//! preempt_exempt = "0s"
//! max_wall = "2h"
//! grp_gpus = 64             # optional
//! user_gpus = 8             # optional
//! user_jobs = 4             # optional
//! burstable = true
//! headroom_gpus = 2         # optional: GPUs kept idle for this QoS's jobs
//! gpu_sharing = true        # optional: its jobs may ask for GPU fractions (--gpu-fraction)
//! ```
//!
//! Unknown keys are errors, so a typo never silently drops a setting.

use std::collections::BTreeMap;
use std::time::Duration;

use kairos_proto::v1 as pb;
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyFile {
    #[serde(default)]
    pub submit_rules: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub priority_classes: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weights: Option<WeightsEntry>,
    #[serde(default)]
    pub qos: BTreeMap<String, QosEntry>,
    #[serde(default)]
    pub accounts: BTreeMap<String, AccountEntry>,
    /// Partition of jobs that name none (default "default").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_partition: Option<String>,
    #[serde(default)]
    pub partitions: BTreeMap<String, PartitionEntry>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartitionEntry {
    #[serde(default)]
    pub nodes: Vec<String>,
    #[serde(default)]
    pub selector: BTreeMap<String, String>,
    #[serde(default = "one")]
    pub priority_tier: u32,
    #[serde(default)]
    pub allowed_qos: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_qos: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_wall: Option<String>,
    /// CPUs per GPU and memory per GPU (e.g. "32G") a job asking none gets; the most CPUs
    /// and memory one node's run may ask.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub def_cpus_per_gpu: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub def_mem_per_gpu: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cpus_per_node: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_mem_per_node: Option<String>,
    /// Idle GPUs of runs here (instead of their QoS's rule).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_gpu: Option<IdleGpuEntry>,
}

/// An idle GPU rule as the file writes it.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdleGpuEntry {
    /// How long every GPU of a run stays below `below` before it counts as idle ("30m").
    pub after: String,
    /// Utilisation threshold, a share of 1 (0.05 = 5 %).
    pub below: f64,
    pub action: String,
}

impl IdleGpuEntry {
    fn to_pb(&self, at: &str) -> Result<pb::IdleGpu, String> {
        let after_s = parse_secs(&format!("{at}.idle_gpu.after"), &self.after)?;
        if !(self.below > 0.0 && self.below <= 1.0) {
            return Err(format!("{at}.idle_gpu.below: {} is not a share between 0.001 and 1", self.below));
        }
        if !["notify", "requeue", "cancel"].contains(&self.action.as_str()) {
            return Err(format!(
                "{at}.idle_gpu.action: \"{}\" is not notify, requeue or cancel",
                self.action
            ));
        }
        let below_milli = (self.below * 1000.0).round() as u32;
        Ok(pb::IdleGpu { after_s, below_milli: below_milli.max(1), action: self.action.clone() })
    }

    fn of(r: &pb::IdleGpu) -> IdleGpuEntry {
        IdleGpuEntry {
            after: format_secs(r.after_s),
            below: f64::from(r.below_milli) / 1000.0,
            action: r.action.clone(),
        }
    }
}

/// Multifactor priority weights; omitted ones keep the shipped defaults.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WeightsEntry {
    /// What a run's time is charged at per resource, relative to one GPU (TRESBillingWeights):
    /// `billing = { gpu = 1.0, cpu = 0.05, mem_gb = 0.01 }`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub billing: Option<BillingEntry>,
    pub qos: Option<u32>,
    pub age: Option<u32>,
    pub fairshare: Option<u32>,
    pub job_size: Option<u32>,
    pub partition: Option<u32>,
    pub age_max: Option<String>,
    pub fairshare_half_life: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BillingEntry {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_gb: Option<f64>,
}

impl BillingEntry {
    /// In thousandths (GPUs 1.0 where the file is silent, the rest 0).
    fn to_pb(&self) -> Result<pb::BillingWeights, String> {
        let milli = |key: &str, v: Option<f64>, default: f64| {
            let v = v.unwrap_or(default);
            if !(0.0..=1_000_000.0).contains(&v) {
                return Err(format!("weights.billing.{key}: {v} is not between 0 and 1000000"));
            }
            Ok((v * 1000.0).round() as u32)
        };
        Ok(pb::BillingWeights {
            gpu_milli: milli("gpu", self.gpu, 1.0)?,
            cpu_milli: milli("cpu", self.cpu, 0.0)?,
            mem_gb_milli: milli("mem_gb", self.mem_gb, 0.0)?,
        })
    }

    fn of(b: &pb::BillingWeights) -> BillingEntry {
        let f = |m: u32| f64::from(m) / 1000.0;
        BillingEntry { gpu: Some(f(b.gpu_milli)), cpu: Some(f(b.cpu_milli)), mem_gb: Some(f(b.mem_gb_milli)) }
    }
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccountEntry {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    #[serde(default = "one")]
    pub shares: u32,
    #[serde(default)]
    pub users: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_qos: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_qos: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub user_qos: BTreeMap<String, UserQosEntry>,
    /// The team's guarantee (`guaranteed = { gpus = 8 }`), what it may borrow beyond it and
    /// lend of it (unset: unlimited, all).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guaranteed: Option<GuaranteedEntry>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub borrow_limit: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lend_limit: Option<u32>,
}

/// What a team is guaranteed: GPUs (CPUs, memory and per-model guarantees are not kept yet,
/// and are refused by name).
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GuaranteedEntry {
    pub gpus: u32,
}

/// Which QoS one user's jobs under an account may use, and their default.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserQosEntry {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_qos: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_qos: Option<String>,
}

fn one() -> u32 {
    1
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QosEntry {
    pub priority: i64,
    #[serde(default)]
    pub preempt: Vec<String>,
    #[serde(default = "off")]
    pub preempt_mode: String,
    #[serde(default = "zero")]
    pub grace: String,
    #[serde(default = "zero")]
    pub preempt_exempt: String,
    pub max_wall: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grp_gpus: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_gpus: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_jobs: Option<u32>,
    #[serde(default)]
    pub burstable: bool,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub headroom_gpus: u32,
    /// Its jobs may ask for a fraction of a GPU (`--gpu-fraction`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub gpu_sharing: bool,
    /// CPUs per GPU and memory per GPU (e.g. "32G") a job asking none gets; the most CPUs
    /// and memory one node's run may ask.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub def_cpus_per_gpu: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub def_mem_per_gpu: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cpus_per_node: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_mem_per_node: Option<String>,
    /// What happens to a run whose GPUs stay idle: `{ after = "30m", below = 0.05, action =
    /// "notify" | "requeue" | "cancel" }` (an inference QoS may only notify).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_gpu: Option<IdleGpuEntry>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn off() -> String {
    "off".into()
}

fn zero() -> String {
    "0s".into()
}

pub fn parse_mode(s: &str) -> Result<pb::PreemptMode, String> {
    match s.to_ascii_lowercase().as_str() {
        "off" => Ok(pb::PreemptMode::Off),
        "cancel" => Ok(pb::PreemptMode::Cancel),
        "requeue" => Ok(pb::PreemptMode::Requeue),
        "suspend" => Ok(pb::PreemptMode::Suspend),
        _ => Err(format!("preempt mode \"{s}\" is not one of off, cancel, requeue, suspend")),
    }
}

pub fn mode_name(mode: i32) -> &'static str {
    match pb::PreemptMode::try_from(mode) {
        Ok(pb::PreemptMode::Cancel) => "cancel",
        Ok(pb::PreemptMode::Requeue) => "requeue",
        Ok(pb::PreemptMode::Suspend) => "suspend",
        _ => "off",
    }
}

/// Parses a duration such as `90s`, `5m`, `2h`, `0s` into seconds.
pub fn parse_secs(field: &str, s: &str) -> Result<u64, String> {
    if s.trim() == "0" {
        return Ok(0);
    }
    humantime::parse_duration(s)
        .map(|d| d.as_secs())
        .map_err(|_| format!("{field}: cannot parse \"{s}\" as a duration (e.g. 0s, 90s, 5m, 2h)"))
}

pub fn format_secs(secs: u64) -> String {
    if secs == 0 {
        return "0s".into();
    }
    humantime::format_duration(Duration::from_secs(secs)).to_string().replace(' ', "")
}

/// A TOML error on one line. toml's message is "TOML parse error at line L, column C", a source
/// excerpt, then the reason: keep the first and the last line.
pub fn one_line(e: toml::de::Error) -> String {
    let text = e.to_string();
    let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    match (lines.first(), lines.last()) {
        (Some(first), Some(last)) if lines.len() > 1 => format!("{first}: {last}"),
        _ => text.trim().to_string(),
    }
}

/// The settings that differ between two policies, as `key: old → new` lines (keys dotted as
/// the file's tables, e.g. `qos.training.max_wall`), for `policy apply --dry-run`.
pub fn changes(from: &pb::Policy, to: &pb::Policy) -> Result<Vec<String>, String> {
    let flat = |p: &pb::Policy| -> Result<BTreeMap<String, String>, String> {
        let value = toml::Value::try_from(PolicyFile::from_pb(p)).map_err(|e| e.to_string())?;
        let mut out = BTreeMap::new();
        flatten("", &value, &mut out);
        Ok(out)
    };
    let (a, b) = (flat(from)?, flat(to)?);
    let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    let none = String::from("(unset)");
    Ok(keys
        .into_iter()
        .filter(|k| a.get(*k) != b.get(*k))
        .map(|k| format!("{k}: {} → {}", a.get(k).unwrap_or(&none), b.get(k).unwrap_or(&none)))
        .collect())
}

fn flatten(at: &str, v: &toml::Value, out: &mut BTreeMap<String, String>) {
    match v {
        toml::Value::Table(t) => {
            for (k, v) in t {
                let key = if at.is_empty() { k.clone() } else { format!("{at}.{k}") };
                flatten(&key, v, out);
            }
        }
        other => {
            out.insert(at.to_string(), other.to_string());
        }
    }
}

impl PolicyFile {
    /// A size as the policy file writes it (MiB, "M").
    fn mib_text(m: u64) -> String {
        format!("{m}M")
    }

    /// A QoS's or partition's resource defaults from the file's keys (None when it sets none).
    fn resources_to_pb(
        at: &str,
        def_cpus_per_gpu: Option<u32>,
        def_mem_per_gpu: &Option<String>,
        max_cpus_per_node: Option<u32>,
        max_mem_per_node: &Option<String>,
    ) -> Result<Option<pb::ResourceDefaults>, String> {
        let size = |key: &str, v: &Option<String>| {
            v.as_deref()
                .map(|v| kairos_proto::units::parse_mem_mib(v).map_err(|e| format!("{at}.{key}: {e}")))
                .transpose()
        };
        let r = pb::ResourceDefaults {
            def_cpus_per_gpu,
            def_mem_per_gpu_mib: size("def_mem_per_gpu", def_mem_per_gpu)?,
            max_cpus_per_node,
            max_mem_per_node_mib: size("max_mem_per_node", max_mem_per_node)?,
        };
        Ok((r != pb::ResourceDefaults::default()).then_some(r))
    }

    /// Parses a policy file; errors name the line and column.
    pub fn parse(text: &str) -> Result<PolicyFile, String> {
        toml::from_str(text).map_err(one_line)
    }

    /// The priority weights the file sets (shipped defaults where it is silent).
    fn weights_to_pb(&self) -> Result<Option<pb::PriorityWeights>, String> {
        Ok(match &self.weights {
            None => None,
            Some(w) => {
                // Defaults as shipped (7 days for both periods) where the file is silent.
                let week = 7 * 24 * 3600;
                Some(pb::PriorityWeights {
                    qos: w.qos.unwrap_or(10_000),
                    age: w.age.unwrap_or(1_000),
                    fairshare: w.fairshare.unwrap_or(5_000),
                    job_size: w.job_size.unwrap_or(500),
                    partition: w.partition.unwrap_or(1_000),
                    age_max_s: w
                        .age_max
                        .as_deref()
                        .map(|v| parse_secs("weights.age_max", v))
                        .transpose()?
                        .unwrap_or(week),
                    fairshare_half_life_s: w
                        .fairshare_half_life
                        .as_deref()
                        .map(|v| parse_secs("weights.fairshare_half_life", v))
                        .transpose()?
                        .unwrap_or(week),
                    billing: w.billing.as_ref().map(BillingEntry::to_pb).transpose()?,
                })
            }
        })
    }

    pub fn to_pb(&self) -> Result<pb::Policy, String> {
        let qos = self.qos.iter().map(|(name, q)| q.to_pb(name)).collect::<Result<_, _>>()?;
        let accounts = self.accounts.iter().map(|(name, a)| a.to_pb(name)).collect();
        let weights = self.weights_to_pb()?;
        let partitions = self.partitions.iter().map(|(name, p)| p.to_pb(name)).collect::<Result<_, _>>()?;
        Ok(pb::Policy {
            qos,
            submit_rules: self.submit_rules.clone().into_iter().collect(),
            accounts,
            weights,
            partitions,
            default_partition: self.default_partition.clone().unwrap_or_default(),
            priority_classes: self.priority_classes.clone().into_iter().collect(),
            what_if_hash: String::new(),
        })
    }

    pub fn from_pb(p: &pb::Policy) -> PolicyFile {
        let weights = p.weights.as_ref().map(|w| WeightsEntry {
            billing: w.billing.as_ref().map(BillingEntry::of),
            qos: Some(w.qos),
            age: Some(w.age),
            fairshare: Some(w.fairshare),
            job_size: Some(w.job_size),
            partition: Some(w.partition),
            age_max: Some(format_secs(w.age_max_s)),
            fairshare_half_life: Some(format_secs(w.fairshare_half_life_s)),
        });
        PolicyFile {
            submit_rules: p.submit_rules.clone().into_iter().collect(),
            priority_classes: p.priority_classes.clone().into_iter().collect(),
            weights,
            qos: p.qos.iter().map(|q| (q.name.clone(), QosEntry::of(q))).collect(),
            accounts: p.accounts.iter().map(|a| (a.name.clone(), AccountEntry::of(a))).collect(),
            default_partition: (!p.default_partition.is_empty()).then(|| p.default_partition.clone()),
            partitions: p
                .partitions
                .iter()
                .map(|part| (part.name.clone(), PartitionEntry::of(part)))
                .collect(),
        }
    }

    pub fn to_toml(&self) -> Result<String, String> {
        toml::to_string(self).map_err(|e| format!("writing the policy as TOML: {e}"))
    }
}

impl QosEntry {
    /// The QoS class `name` as the wire has it (durations parsed, each error naming its field).
    fn to_pb(&self, name: &str) -> Result<pb::Qos, String> {
        let field = |f: &str| format!("qos.{name}.{f}");
        Ok(pb::Qos {
            name: name.to_string(),
            priority: self.priority,
            preempt: self.preempt.clone(),
            preempt_mode: parse_mode(&self.preempt_mode)
                .map_err(|e| format!("{}: {e}", field("preempt_mode")))? as i32,
            grace_s: parse_secs(&field("grace"), &self.grace)?,
            preempt_exempt_s: parse_secs(&field("preempt_exempt"), &self.preempt_exempt)?,
            max_wall_s: parse_secs(&field("max_wall"), &self.max_wall)?,
            grp_gpus: self.grp_gpus,
            user_gpus: self.user_gpus,
            user_jobs: self.user_jobs,
            burstable: self.burstable,
            headroom_gpus: self.headroom_gpus,
            gpu_sharing: self.gpu_sharing,
            idle_gpu: self.idle_gpu.as_ref().map(|r| r.to_pb(&format!("qos.{name}"))).transpose()?,
            resources: PolicyFile::resources_to_pb(
                &format!("qos.{name}"),
                self.def_cpus_per_gpu,
                &self.def_mem_per_gpu,
                self.max_cpus_per_node,
                &self.max_mem_per_node,
            )?,
        })
    }

    /// The wire's QoS class as the file writes it.
    fn of(q: &pb::Qos) -> QosEntry {
        QosEntry {
            priority: q.priority,
            preempt: q.preempt.clone(),
            preempt_mode: mode_name(q.preempt_mode).to_string(),
            grace: format_secs(q.grace_s),
            preempt_exempt: format_secs(q.preempt_exempt_s),
            max_wall: format_secs(q.max_wall_s),
            grp_gpus: q.grp_gpus,
            user_gpus: q.user_gpus,
            user_jobs: q.user_jobs,
            burstable: q.burstable,
            headroom_gpus: q.headroom_gpus,
            gpu_sharing: q.gpu_sharing,
            def_cpus_per_gpu: q.resources.and_then(|r| r.def_cpus_per_gpu),
            def_mem_per_gpu: q.resources.and_then(|r| r.def_mem_per_gpu_mib).map(PolicyFile::mib_text),
            max_cpus_per_node: q.resources.and_then(|r| r.max_cpus_per_node),
            max_mem_per_node: q.resources.and_then(|r| r.max_mem_per_node_mib).map(PolicyFile::mib_text),
            idle_gpu: q.idle_gpu.as_ref().map(IdleGpuEntry::of),
        }
    }
}

impl AccountEntry {
    /// The account `name` as the wire has it.
    fn to_pb(&self, name: &str) -> pb::Account {
        pb::Account {
            name: name.to_string(),
            parent: self.parent.clone().unwrap_or_default(),
            shares: self.shares,
            users: self.users.clone(),
            allowed_qos: self.allowed_qos.clone(),
            default_qos: self.default_qos.clone().unwrap_or_default(),
            user_qos: self
                .user_qos
                .iter()
                .map(|(user, u)| pb::UserQos {
                    user: user.clone(),
                    allowed_qos: u.allowed_qos.clone(),
                    default_qos: u.default_qos.clone().unwrap_or_default(),
                })
                .collect(),
            guarantee: self.guarantee_to_pb(),
        }
    }

    /// Its guarantee on the wire: limits without a guarantee are a guarantee of none.
    fn guarantee_to_pb(&self) -> Option<pb::Guarantee> {
        if self.guaranteed.is_none() && self.borrow_limit.is_none() && self.lend_limit.is_none() {
            return None;
        }
        Some(pb::Guarantee {
            gpus: self.guaranteed.as_ref().map_or(0, |g| g.gpus),
            borrow_limit: self.borrow_limit,
            lend_limit: self.lend_limit,
        })
    }

    /// The wire's account as the file writes it.
    fn of(a: &pb::Account) -> AccountEntry {
        AccountEntry {
            parent: (!a.parent.is_empty()).then(|| a.parent.clone()),
            shares: a.shares,
            users: a.users.clone(),
            allowed_qos: a.allowed_qos.clone(),
            default_qos: (!a.default_qos.is_empty()).then(|| a.default_qos.clone()),
            user_qos: a
                .user_qos
                .iter()
                .map(|u| {
                    let entry = UserQosEntry {
                        allowed_qos: u.allowed_qos.clone(),
                        default_qos: (!u.default_qos.is_empty()).then(|| u.default_qos.clone()),
                    };
                    (u.user.clone(), entry)
                })
                .collect(),
            guaranteed: a.guarantee.as_ref().map(|g| GuaranteedEntry { gpus: g.gpus }),
            borrow_limit: a.guarantee.as_ref().and_then(|g| g.borrow_limit),
            lend_limit: a.guarantee.as_ref().and_then(|g| g.lend_limit),
        }
    }
}

impl PartitionEntry {
    /// The partition `name` as the wire has it (its wall limit parsed).
    fn to_pb(&self, name: &str) -> Result<pb::Partition, String> {
        let max_wall_s = match &self.max_wall {
            None => None,
            Some(w) => Some(parse_secs(&format!("partitions.{name}.max_wall"), w)?),
        };
        Ok(pb::Partition {
            name: name.to_string(),
            nodes: self.nodes.clone(),
            selector: self.selector.clone().into_iter().collect(),
            priority_tier: self.priority_tier,
            allowed_qos: self.allowed_qos.clone(),
            default_qos: self.default_qos.clone().unwrap_or_default(),
            max_wall_s,
            idle_gpu: self.idle_gpu.as_ref().map(|r| r.to_pb(&format!("partitions.{name}"))).transpose()?,
            resources: PolicyFile::resources_to_pb(
                &format!("partitions.{name}"),
                self.def_cpus_per_gpu,
                &self.def_mem_per_gpu,
                self.max_cpus_per_node,
                &self.max_mem_per_node,
            )?,
        })
    }

    /// The wire's partition as the file writes it.
    fn of(part: &pb::Partition) -> PartitionEntry {
        PartitionEntry {
            nodes: part.nodes.clone(),
            selector: part.selector.clone().into_iter().collect(),
            priority_tier: part.priority_tier,
            allowed_qos: part.allowed_qos.clone(),
            default_qos: (!part.default_qos.is_empty()).then(|| part.default_qos.clone()),
            max_wall: part.max_wall_s.map(format_secs),
            def_cpus_per_gpu: part.resources.and_then(|r| r.def_cpus_per_gpu),
            def_mem_per_gpu: part.resources.and_then(|r| r.def_mem_per_gpu_mib).map(PolicyFile::mib_text),
            max_cpus_per_node: part.resources.and_then(|r| r.max_cpus_per_node),
            max_mem_per_node: part.resources.and_then(|r| r.max_mem_per_node_mib).map(PolicyFile::mib_text),
            idle_gpu: part.idle_gpu.as_ref().map(IdleGpuEntry::of),
        }
    }
}

/// A policy file (`kairos policy apply` format) as the core's policy, validated.
pub fn load(path: &std::path::Path) -> anyhow::Result<kairos_scheduler::policy::Policy> {
    let text =
        std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
    load_text(&text, path)
}

/// Policy file text (read from `path`, which errors name) as the core's policy, validated.
pub fn load_text(text: &str, path: &std::path::Path) -> anyhow::Result<kairos_scheduler::policy::Policy> {
    let fail = |e: String| anyhow::anyhow!("{}: {e}", path.display());
    let pb = PolicyFile::parse(text).map_err(fail)?.to_pb().map_err(fail)?;
    let policy = kairos_convert::policy::policy_from_pb(pb).map_err(|s| fail(s.message().to_string()))?;
    policy.validate().map_err(|e| fail(e.to_string()))?;
    Ok(policy)
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = r#"
[submit_rules]
training = "training"
inference = "inference"
batch = "batch"

[qos.inference]
priority = 200
max_wall = "2h"
grp_gpus = 64
burstable = true
headroom_gpus = 2

[qos.training]
priority = 100
preempt_mode = "requeue"
grace = "5m"
max_wall = "48h"
def_cpus_per_gpu = 12
def_mem_per_gpu = "64G"

[qos.batch]
priority = 10
preempt_mode = "requeue"
max_wall = "1day"
"#;

    #[test]
    fn round_trips_through_protobuf_and_back() {
        let file = PolicyFile::parse(EXAMPLE).unwrap();
        let pb = file.to_pb().unwrap();
        assert_eq!(pb.qos.len(), 3);
        let training = pb.qos.iter().find(|q| q.name == "training").unwrap();
        assert_eq!((training.grace_s, training.max_wall_s), (300, 48 * 3600));
        let inference = pb.qos.iter().find(|q| q.name == "inference").unwrap();
        assert_eq!((inference.headroom_gpus, training.headroom_gpus), (2, 0));
        let res = training.resources.unwrap();
        assert_eq!(
            (res.def_cpus_per_gpu, res.def_mem_per_gpu_mib, res.max_cpus_per_node),
            (Some(12), Some(64 << 10), None)
        );
        assert_eq!(inference.resources, None);
        let again = PolicyFile::parse(&PolicyFile::from_pb(&pb).to_toml().unwrap()).unwrap();
        assert_eq!(again.to_pb().unwrap(), pb);
    }

    #[test]
    fn billing_weights_are_thousandths_and_round_trip() {
        let text = "[weights]\nbilling = { cpu = 0.05, mem_gb = 0.01 }\n";
        let pb = PolicyFile::parse(text).unwrap().to_pb().unwrap();
        let b = pb.weights.as_ref().unwrap().billing.unwrap();
        assert_eq!((b.gpu_milli, b.cpu_milli, b.mem_gb_milli), (1000, 50, 10), "GPUs 1.0 unless said");
        let again = PolicyFile::parse(&PolicyFile::from_pb(&pb).to_toml().unwrap()).unwrap();
        assert_eq!(again.to_pb().unwrap(), pb);
        let bad = PolicyFile::parse("[weights]\nbilling = { cpu = -1 }\n").unwrap().to_pb().unwrap_err();
        assert!(bad.starts_with("weights.billing.cpu"), "{bad}");
        let bad =
            PolicyFile::parse("[partitions.p]\nmax_mem_per_node = \"lots\"\n").unwrap().to_pb().unwrap_err();
        assert!(bad.starts_with("partitions.p.max_mem_per_node"), "{bad}");
    }

    #[test]
    fn a_dry_run_lists_the_settings_that_would_change() {
        let before = PolicyFile::parse(EXAMPLE).unwrap().to_pb().unwrap();
        let text = EXAMPLE.replace(
            "max_wall = \"2h\"",
            "max_wall = \"30m\"\nidle_gpu = { after = \"30m\", below = 0.05, action = \"notify\" }",
        );
        let after = PolicyFile::parse(&text).unwrap().to_pb().unwrap();
        assert_eq!(
            changes(&before, &after).unwrap(),
            [
                "qos.inference.idle_gpu.action: (unset) → \"notify\"",
                "qos.inference.idle_gpu.after: (unset) → \"30m\"",
                "qos.inference.idle_gpu.below: (unset) → 0.05",
                "qos.inference.max_wall: \"2h\" → \"30m\"",
            ]
        );
        assert_eq!(changes(&after, &after).unwrap(), Vec::<String>::new());
    }

    #[test]
    fn errors_name_the_line_and_column_or_the_field() {
        let err = PolicyFile::parse("[qos.batch]\npriority = \"high\"\nmax_wall = \"1h\"\n").unwrap_err();
        assert!(err.contains("line 2") && err.contains("column"), "{err}");
        let err = PolicyFile::parse("[qos.batch]\npriority = 1\nmax_wall = \"1h\"\ncolour = \"red\"\n")
            .unwrap_err();
        assert!(err.contains("unknown field") && err.contains("line 4"), "{err}");
        let file = PolicyFile::parse("[qos.batch]\npriority = 1\nmax_wall = \"soon\"\n").unwrap();
        assert_eq!(
            file.to_pb().unwrap_err(),
            "qos.batch.max_wall: cannot parse \"soon\" as a duration (e.g. 0s, 90s, 5m, 2h)"
        );
    }
}

//! Scheduling policy objects, replicated with the rest of the state: QoS classes and the submit
//! rules that map a job's profile to a default QoS.
//!
//! A policy is validated as a whole before it replaces the current one, so a bad update changes
//! nothing. The defaults shipped on a new cluster come from the source articles (SPEC "Defaults
//! shipped").

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::model::Profile;

/// Longest name of a policy object.
pub const POLICY_NAME_LEN_MAX: usize = 64;
/// Most QoS classes one cluster may define.
pub const QOS_COUNT_MAX: usize = 256;
pub const QOS_PRIORITY_MAX: i64 = 1_000_000;
/// Longest wall time any QoS may allow (one year).
pub const MAX_WALL_S_MAX: u64 = 365 * 24 * 3600;

const HOUR_S: u64 = 3600;

pub use crate::model::PreemptMode;

/// A quality-of-service class (Slurm semantics).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Qos {
    pub name: String,
    pub priority: i64,
    /// QoS classes whose running jobs this QoS's jobs may preempt.
    pub preempt: BTreeSet<String>,
    /// How this QoS's own jobs are preempted.
    pub preempt_mode: PreemptMode,
    /// Time between the checkpoint/stop signal and SIGKILL when preempted.
    pub grace_s: u64,
    /// A job runs at least this long before it may be preempted.
    pub preempt_exempt_s: u64,
    /// Longest wall time a job may ask for, and the default time limit.
    pub max_wall_s: u64,
    /// All running jobs of this QoS together hold at most this many GPUs.
    pub grp_gpus: Option<u32>,
    /// One user's running jobs of this QoS hold at most this many GPUs.
    pub user_gpus: Option<u32>,
    /// One user runs at most this many jobs of this QoS at once.
    pub user_jobs: Option<u32>,
    /// Jobs of this QoS may run on cloud burst capacity.
    pub burstable: bool,
    /// GPUs kept idle for jobs of this QoS (inference headroom): a job of a QoS without
    /// headroom may not start if it would leave fewer GPUs free than all QoS's headrooms
    /// together (unless it asks more than the cluster has outside them: it could never start);
    /// jobs of a QoS with headroom may use any of it.
    #[serde(default)]
    pub headroom_gpus: u32,
    /// CPU and memory defaults and maxima of its jobs (a partition's win over these).
    #[serde(default, skip_serializing_if = "ResourceDefaults::is_empty")]
    pub resources: ResourceDefaults,
    /// Its jobs may hold a fraction of a GPU (`JobSpec::gpu_milli`); training never does.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub gpu_sharing: bool,
    /// What happens to a run of it whose GPUs stay idle (none: nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_gpu: Option<IdleGpu>,
}

/// Idle GPUs: a run whose every GPU stays below `below_milli` thousandths utilisation for
/// `after_s` (as its agent measures it) gets an event and a mark, and then `action`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdleGpu {
    pub after_s: u64,
    pub below_milli: u32,
    pub action: IdleAction,
}

/// What is done with an idle run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IdleAction {
    /// The event and the mark only.
    Notify,
    /// Stopped through the checkpoint path and requeued (as a preemption that requeues).
    Requeue,
    /// Cancelled.
    Cancel,
}

impl IdleAction {
    pub fn as_str(self) -> &'static str {
        match self {
            IdleAction::Notify => "notify",
            IdleAction::Requeue => "requeue",
            IdleAction::Cancel => "cancel",
        }
    }

    pub fn parse(s: &str) -> Option<IdleAction> {
        match s {
            "notify" => Some(IdleAction::Notify),
            "requeue" => Some(IdleAction::Requeue),
            "cancel" => Some(IdleAction::Cancel),
            _ => None,
        }
    }
}

impl IdleGpu {
    /// The longest an idle watch may wait.
    pub const AFTER_MAX_S: u64 = 30 * 24 * 3600;

    fn check(&self, what: &str) -> Result<(), PolicyError> {
        if self.after_s == 0 || self.after_s > Self::AFTER_MAX_S || !(1..=1000).contains(&self.below_milli) {
            return Err(PolicyError::BadIdleGpu(what.to_string()));
        }
        Ok(())
    }
}

/// What a job gets when it asks for no CPUs or memory, and the most it may ask per node
/// (Slurm's DefCpuPerGPU, DefMemPerGPU, MaxCPUsPerNode, MaxMemPerNode).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceDefaults {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub def_cpus_per_gpu: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub def_mem_per_gpu_mib: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cpus_per_node: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_mem_per_node_mib: Option<u64>,
}

impl ResourceDefaults {
    pub fn is_empty(&self) -> bool {
        *self == ResourceDefaults::default()
    }

    fn check(&self, what: &str) -> Result<(), PolicyError> {
        let zero = self.def_cpus_per_gpu == Some(0)
            || self.max_cpus_per_node == Some(0)
            || self.def_mem_per_gpu_mib == Some(0)
            || self.max_mem_per_node_mib == Some(0);
        if zero {
            return Err(PolicyError::BadResourceDefaults(what.to_string()));
        }
        Ok(())
    }

    /// Each setting of `self`, else of `fallback`.
    pub fn or(&self, fallback: &ResourceDefaults) -> ResourceDefaults {
        ResourceDefaults {
            def_cpus_per_gpu: self.def_cpus_per_gpu.or(fallback.def_cpus_per_gpu),
            def_mem_per_gpu_mib: self.def_mem_per_gpu_mib.or(fallback.def_mem_per_gpu_mib),
            max_cpus_per_node: self.max_cpus_per_node.or(fallback.max_cpus_per_node),
            max_mem_per_node_mib: self.max_mem_per_node_mib.or(fallback.max_mem_per_node_mib),
        }
    }
}

impl Qos {
    fn named(name: &str, priority: i64, max_wall_s: u64) -> Qos {
        Qos {
            name: name.to_string(),
            priority,
            preempt: BTreeSet::new(),
            preempt_mode: PreemptMode::Off,
            grace_s: 0,
            preempt_exempt_s: 0,
            max_wall_s,
            grp_gpus: None,
            user_gpus: None,
            user_jobs: None,
            burstable: false,
            headroom_gpus: 0,
            resources: ResourceDefaults::default(),
            gpu_sharing: false,
            idle_gpu: None,
        }
    }
}

/// A fairshare account: a node of the account tree.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Account {
    pub name: String,
    pub parent: Option<String>,
    /// Fairshare shares relative to its siblings.
    pub shares: u32,
    /// Users who may submit under it; empty = open to every user.
    pub users: BTreeSet<String>,
    /// The QoS its jobs may use and the one they get when they name none; an empty list (and
    /// no default) is inherited from the parent account (`Policy::qos_access`).
    #[serde(default, skip_serializing_if = "QosAccess::is_empty")]
    pub qos: QosAccess,
    /// The same for one user's jobs under this account (Slurm's association), before the
    /// account's own.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub user_qos: BTreeMap<String, QosAccess>,
    /// GPUs guaranteed to its jobs (with its children's, as a cohort), and how much it may
    /// borrow beyond them and lend of them (`crate::guarantee`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guarantee: Option<Guarantee>,
}

/// A team's guaranteed share (Kueue's `nominalQuota`, KAI's deserved quota): jobs of the
/// account (and its children) within it start before any borrower and take back, through the
/// borrowers' preempt mode, what others borrowed of it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Guarantee {
    pub gpus: u32,
    /// GPUs it may use beyond its guarantee, of others' idle share (None: unlimited).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub borrow_limit: Option<u32>,
    /// GPUs of its idle guarantee others may borrow (None: all of it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lend_limit: Option<u32>,
}

/// Which QoS an account (or a user in it) may use, and its default.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QosAccess {
    /// Empty = as the parent says (every QoS at the top).
    #[serde(default)]
    pub allowed: BTreeSet<String>,
    #[serde(default)]
    pub default: Option<String>,
}

impl QosAccess {
    pub fn is_empty(&self) -> bool {
        self.allowed.is_empty() && self.default.is_none()
    }
}

/// What `Policy::qos_access` finds for a user in an account.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EffectiveQos {
    /// None = every QoS.
    pub allowed: Option<BTreeSet<String>>,
    pub default: Option<String>,
}

impl EffectiveQos {
    pub fn allows(&self, qos: &str) -> bool {
        self.allowed.as_ref().is_none_or(|a| a.contains(qos))
    }
}

/// One named piece of the policy that can be put or deleted on its own (`Op::PutPolicyItem`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PolicyItem {
    Account(Account),
    Partition(Partition),
}

/// Which kind of named policy piece (`Op::DeletePolicyItem`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PolicyKind {
    Qos,
    Account,
    Partition,
}

impl PolicyKind {
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyKind::Qos => "qos",
            PolicyKind::Account => "account",
            PolicyKind::Partition => "partition",
        }
    }
}

impl PolicyItem {
    pub fn kind(&self) -> PolicyKind {
        match self {
            PolicyItem::Account(_) => PolicyKind::Account,
            PolicyItem::Partition(_) => PolicyKind::Partition,
        }
    }

    pub fn name(&self) -> &str {
        match self {
            PolicyItem::Account(a) => &a.name,
            PolicyItem::Partition(p) => &p.name,
        }
    }
}

impl Policy {
    /// Whether a piece of `kind` named `name` exists.
    pub fn has(&self, kind: PolicyKind, name: &str) -> bool {
        match kind {
            PolicyKind::Qos => self.qos.contains_key(name),
            PolicyKind::Account => self.accounts.contains_key(name),
            PolicyKind::Partition => self.partitions.contains_key(name),
        }
    }

    /// Inserts or replaces `item`.
    pub fn put(&mut self, item: &PolicyItem) {
        match item {
            PolicyItem::Account(a) => {
                self.accounts.insert(a.name.clone(), a.clone());
            }
            PolicyItem::Partition(p) => {
                self.partitions.insert(p.name.clone(), p.clone());
            }
        }
    }

    /// Removes the piece of `kind` named `name`.
    pub fn remove(&mut self, kind: PolicyKind, name: &str) {
        match kind {
            PolicyKind::Qos => {
                self.qos.remove(name);
            }
            PolicyKind::Account => {
                self.accounts.remove(name);
            }
            PolicyKind::Partition => {
                self.partitions.remove(name);
            }
        }
    }
}

/// A partition: a set of nodes with its own rules.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Partition {
    pub name: String,
    /// Nodes by name; empty = every node whose labels match `selector`.
    pub nodes: BTreeSet<String>,
    /// Label selector (all must match); with no `nodes` and no selector, every node.
    pub selector: BTreeMap<String, String>,
    /// Higher tiers go first (a priority factor) and, later, may preempt lower tiers.
    pub priority_tier: u32,
    /// QoS classes allowed here; empty = all.
    pub allowed_qos: BTreeSet<String>,
    /// The QoS a job here gets when it names none (before the profile's submit rule).
    pub default_qos: Option<String>,
    /// Longest wall time a job may run here (jobs asking more wait: PartitionTimeLimit).
    pub max_wall_s: Option<u64>,
    /// CPU and memory defaults and maxima of jobs here (before their QoS's).
    #[serde(default, skip_serializing_if = "ResourceDefaults::is_empty")]
    pub resources: ResourceDefaults,
    /// Idle GPUs of runs here: this instead of their QoS's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_gpu: Option<IdleGpu>,
}

impl Partition {
    /// Whether the node named `name` with `labels` belongs to this partition.
    pub fn contains(&self, name: &str, labels: &BTreeMap<String, String>) -> bool {
        if !self.nodes.is_empty() {
            return self.nodes.contains(name);
        }
        self.selector.iter().all(|(k, v)| labels.get(k) == Some(v))
    }

    /// Every node belongs (the common case: the planner's fast path).
    pub fn is_everything(&self) -> bool {
        self.nodes.is_empty() && self.selector.is_empty()
    }
}

/// The partition every cluster starts with: every node.
pub const DEFAULT_PARTITION: &str = "default";

/// The account every cluster starts with, open to every user.
pub const ROOT_ACCOUNT: &str = "root";

/// The whole replicated policy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    pub qos: BTreeMap<String, Qos>,
    /// Submit rules: the QoS a job of each profile gets when the user names none.
    pub profile_qos: BTreeMap<Profile, String>,
    #[serde(default = "default_accounts")]
    pub accounts: BTreeMap<String, Account>,
    #[serde(default)]
    pub weights: PriorityWeights,
    #[serde(default = "default_partitions")]
    pub partitions: BTreeMap<String, Partition>,
    /// The partition of jobs that name none.
    #[serde(default = "default_partition_name")]
    pub default_partition: String,
    /// Kubernetes priority classes and the QoS each stands for (`kairos submit -f`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub priority_classes: BTreeMap<String, String>,
}

fn default_partitions() -> BTreeMap<String, Partition> {
    let all = Partition {
        name: DEFAULT_PARTITION.into(),
        nodes: BTreeSet::new(),
        selector: BTreeMap::new(),
        priority_tier: 1,
        allowed_qos: BTreeSet::new(),
        default_qos: None,
        max_wall_s: None,
        resources: ResourceDefaults::default(),
        idle_gpu: None,
    };
    [(all.name.clone(), all)].into()
}

fn default_partition_name() -> String {
    DEFAULT_PARTITION.into()
}

/// A root account open to every user and every QoS (a stored policy from before QoS access).
fn default_accounts() -> BTreeMap<String, Account> {
    default_accounts_for(&BTreeMap::new(), &BTreeMap::new())
}

/// The account tree of a policy that gives none: one root account, open to every user, that
/// allows every QoS of `qos` that preempts nothing or that a submit rule (`profile_qos`) names
/// — the everyday classes, the shipped `inference` (which preempts training) among them. Any
/// other QoS that preempts (the shipped `urgent`) is left to operators and to the accounts they
/// give it. (No such QoS, or only such: no list, every QoS.)
pub fn default_accounts_for(
    qos: &BTreeMap<String, Qos>,
    profile_qos: &BTreeMap<Profile, String>,
) -> BTreeMap<String, Account> {
    let everyday: BTreeSet<String> = qos
        .values()
        .filter(|q| q.preempt.is_empty() || profile_qos.values().any(|p| *p == q.name))
        .map(|q| q.name.clone())
        .collect();
    let allowed = if everyday.len() == qos.len() { BTreeSet::new() } else { everyday };
    let root = Account {
        name: ROOT_ACCOUNT.into(),
        parent: None,
        shares: 1,
        users: BTreeSet::new(),
        qos: QosAccess { allowed, default: None },
        user_qos: BTreeMap::new(),
        guarantee: None,
    };
    [(root.name.clone(), root)].into()
}

impl Default for Policy {
    /// The policy shipped on a new cluster — the one definition: kairosd starts with it,
    /// `kairos sim` replays under it unless given another, docs/policy.md shows it. Inference
    /// starts at once by preempting training (and batch), which requeue from their checkpoint
    /// within their grace; the inference QoS's group limit bounds how much it can take.
    fn default() -> Policy {
        let mut inference = Qos::named("inference", 200, 2 * HOUR_S);
        inference.grp_gpus = Some(64);
        inference.burstable = true;
        inference.gpu_sharing = true;
        inference.preempt = ["training".to_string(), "batch".to_string()].into();
        let mut training = Qos::named("training", 100, 48 * HOUR_S);
        training.grp_gpus = Some(512);
        training.preempt_mode = PreemptMode::Requeue;
        training.grace_s = 300;
        let mut urgent = Qos::named("urgent", 300, 4 * HOUR_S);
        urgent.preempt = ["training".to_string(), "batch".to_string()].into();
        let mut batch = Qos::named("batch", 10, 24 * HOUR_S);
        batch.preempt_mode = PreemptMode::Requeue;
        let premium = Qos::named("premium", 250, 48 * HOUR_S);
        // `kairos alloc`: a person waits at the terminal, so it goes before training and batch;
        // a short wall keeps a forgotten session from holding GPUs for long, and a few sessions
        // per user at most.
        let mut interactive = Qos::named("interactive", 150, 4 * HOUR_S);
        interactive.user_jobs = Some(4);
        let qos: BTreeMap<String, Qos> = [inference, training, urgent, batch, premium, interactive]
            .into_iter()
            .map(|q| (q.name.clone(), q))
            .collect();
        let profile_qos = [
            (Profile::Training, "training".to_string()),
            (Profile::Inference, "inference".to_string()),
            (Profile::Batch, "batch".to_string()),
            (Profile::Interactive, "interactive".to_string()),
        ]
        .into();
        let accounts = default_accounts_for(&qos, &profile_qos);
        Policy {
            qos,
            profile_qos,
            accounts,
            weights: PriorityWeights::default(),
            partitions: default_partitions(),
            default_partition: default_partition_name(),
            priority_classes: BTreeMap::new(),
        }
    }
}

/// Why a policy is not acceptable.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PolicyError {
    #[error("qos name \"{0}\": use 1-{POLICY_NAME_LEN_MAX} characters of [a-z0-9_-]")]
    BadName(String),
    #[error("qos \"{0}\": the map key and the name differ")]
    NameMismatch(String),
    #[error("qos: at most {QOS_COUNT_MAX} classes")]
    TooMany,
    #[error("qos \"{name}\": priority {priority} is outside 0..={QOS_PRIORITY_MAX}")]
    BadPriority { name: String, priority: i64 },
    #[error("qos \"{0}\": max_wall must be between 1 s and one year")]
    BadMaxWall(String),
    #[error("qos \"{name}\": {field} must be at least 1 when set")]
    ZeroLimit { name: String, field: &'static str },
    #[error("{0}: idle_gpu needs after between 1 s and 30 days and below between 0.001 and 1")]
    BadIdleGpu(String),
    #[error("qos \"{0}\" serves inference (its profile's default, headroom or GPU sharing): idle_gpu may only notify")]
    InferenceIdleAction(String),
    #[error("qos \"{0}\" preempts itself")]
    PreemptsItself(String),
    #[error("qos \"{name}\" preempts unknown qos \"{target}\"")]
    UnknownPreemptTarget { name: String, target: String },
    #[error("qos \"{0}\" preempts a qos that (directly or not) preempts it back")]
    PreemptCycle(String),
    #[error("qos \"{name}\" preempts \"{target}\", whose preempt mode is off")]
    PreemptsUnpreemptable { name: String, target: String },
    #[error("submit rule for profile {profile}: unknown qos \"{qos}\"")]
    UnknownProfileQos { profile: &'static str, qos: String },
    #[error("priority_classes: class \"{class}\" names QoS \"{qos}\", which does not exist")]
    UnknownPriorityClassQos { class: String, qos: String },
    #[error("priority_classes: \"{0}\" is not a priority class name (1-253 characters of [a-z0-9.-])")]
    BadPriorityClass(String),
    #[error("submit rules: profile {0} has no default qos")]
    MissingProfileQos(&'static str),
    #[error("account name \"{0}\": use 1-{POLICY_NAME_LEN_MAX} characters of [a-z0-9_-]")]
    BadAccountName(String),
    #[error("account \"{name}\": parent \"{parent}\" does not exist")]
    UnknownParent { name: String, parent: String },
    #[error("account \"{0}\" is its own ancestor")]
    AccountCycle(String),
    #[error("account \"{name}\": lend limit {lend} is more than its guarantee of {gpus} GPUs")]
    LendOverGuarantee { name: String, lend: u32, gpus: u32 },
    #[error("account \"{name}\": its children are guaranteed {children} GPUs, more than its {gpus}")]
    ChildrenOverGuarantee { name: String, children: u64, gpus: u32 },
    #[error("account \"{0}\": shares must be at least 1")]
    ZeroShares(String),
    #[error("accounts: at least one account is needed")]
    NoAccounts,
    #[error(
        "weights: age_max and fairshare_half_life must be at least 1 s, and neither every weight nor every billing weight 0"
    )]
    BadWeights,
    #[error("partition name \"{0}\": use 1-{POLICY_NAME_LEN_MAX} characters of [a-z0-9_-]")]
    BadPartitionName(String),
    #[error("partition \"{name}\": unknown qos \"{qos}\"")]
    PartitionUnknownQos { name: String, qos: String },
    #[error("partition \"{name}\": default qos \"{qos}\" is not among its allowed qos")]
    PartitionDefaultNotAllowed { name: String, qos: String },
    #[error("account \"{name}\": qos \"{qos}\" is not a defined qos")]
    AccountUnknownQos { name: String, qos: String },
    #[error("account \"{name}\": default qos \"{qos}\" is not among the qos it allows")]
    AccountDefaultNotAllowed { name: String, qos: String },
    #[error("partition \"{0}\": max_wall must be between 1 s and one year")]
    PartitionBadMaxWall(String),
    #[error("default_partition: unknown partition \"{0}\"")]
    UnknownDefaultPartition(String),
    #[error("{0}: def_cpus_per_gpu, def_mem_per_gpu, max_cpus_per_node and max_mem_per_node must be at least 1 when set")]
    BadResourceDefaults(String),
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= POLICY_NAME_LEN_MAX
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
}

impl Policy {
    pub fn qos(&self, name: &str) -> Option<&Qos> {
        self.qos.get(name)
    }

    /// The QoS a job of `profile` gets when it names none (an interactive job, where the
    /// policy has no rule for it — one stored before interactive jobs —, a batch job's).
    pub fn default_qos(&self, profile: Profile) -> Option<&Qos> {
        let rule = match self.profile_qos.get(&profile) {
            None if profile == Profile::Interactive => self.profile_qos.get(&Profile::Batch),
            rule => rule,
        };
        rule.and_then(|n| self.qos.get(n))
    }

    /// Checks the whole policy.
    /// Whether QoS `name` serves inference: the inference profile's default, or it keeps
    /// headroom or shares GPUs (an inference job's GPUs idle between requests is its work).
    pub fn serves_inference(&self, name: &str) -> bool {
        self.profile_qos.get(&Profile::Inference).is_some_and(|q| q == name)
            || self.qos.get(name).is_some_and(|q| q.headroom_gpus > 0 || q.gpu_sharing)
    }

    /// What idle GPUs of a job of `qos` in `partition` bring: the partition's rule, else the
    /// QoS's.
    pub fn idle_gpu(&self, qos: &str, partition: &str) -> Option<IdleGpu> {
        self.partitions
            .get(partition)
            .and_then(|p| p.idle_gpu)
            .or_else(|| self.qos.get(qos).and_then(|q| q.idle_gpu))
    }

    pub fn validate(&self) -> Result<(), PolicyError> {
        if self.qos.len() > QOS_COUNT_MAX {
            return Err(PolicyError::TooMany);
        }
        for (key, q) in &self.qos {
            self.validate_qos(key, q)?;
        }
        if let Some(name) = self.preempt_cycle() {
            return Err(PolicyError::PreemptCycle(name));
        }
        self.validate_accounts()?;
        self.validate_partitions()?;
        let w = &self.weights;
        if w.age_max_s == 0
            || w.fairshare_half_life_s == 0
            || (w.qos | w.age | w.fairshare | w.job_size | w.partition) == 0
            || (w.billing.gpu_milli | w.billing.cpu_milli | w.billing.mem_gb_milli) == 0
        {
            return Err(PolicyError::BadWeights);
        }
        for profile in [Profile::Training, Profile::Inference, Profile::Batch, Profile::Interactive] {
            match self.profile_qos.get(&profile) {
                // Interactive jobs fall back to the batch rule (`default_qos`).
                None if profile == Profile::Interactive => {}
                None => return Err(PolicyError::MissingProfileQos(profile.as_str())),
                Some(q) if !self.qos.contains_key(q) => {
                    return Err(PolicyError::UnknownProfileQos { profile: profile.as_str(), qos: q.clone() })
                }
                Some(_) => {}
            }
        }
        for (class, qos) in &self.priority_classes {
            let valid = !class.is_empty()
                && class.len() <= 253
                && class
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-');
            if !valid {
                return Err(PolicyError::BadPriorityClass(class.chars().take(253).collect()));
            }
            if !self.qos.contains_key(qos) {
                return Err(PolicyError::UnknownPriorityClassQos { class: class.clone(), qos: qos.clone() });
            }
        }
        Ok(())
    }

    /// One QoS: its name (and key), priority, wall limit, limits and preemption targets.
    fn validate_qos(&self, key: &str, q: &Qos) -> Result<(), PolicyError> {
        if !valid_name(&q.name) {
            return Err(PolicyError::BadName(q.name.chars().take(POLICY_NAME_LEN_MAX + 1).collect()));
        }
        if *key != q.name {
            return Err(PolicyError::NameMismatch(q.name.clone()));
        }
        if !(0..=QOS_PRIORITY_MAX).contains(&q.priority) {
            return Err(PolicyError::BadPriority { name: q.name.clone(), priority: q.priority });
        }
        if q.max_wall_s == 0 || q.max_wall_s > MAX_WALL_S_MAX {
            return Err(PolicyError::BadMaxWall(q.name.clone()));
        }
        for (field, value) in
            [("grp_gpus", q.grp_gpus), ("user_gpus", q.user_gpus), ("user_jobs", q.user_jobs)]
        {
            if value == Some(0) {
                return Err(PolicyError::ZeroLimit { name: q.name.clone(), field });
            }
        }
        if let Some(idle) = &q.idle_gpu {
            idle.check(&format!("qos \"{}\"", q.name))?;
            if idle.action != IdleAction::Notify && self.serves_inference(&q.name) {
                return Err(PolicyError::InferenceIdleAction(q.name.clone()));
            }
        }
        for target in &q.preempt {
            if *target == q.name {
                return Err(PolicyError::PreemptsItself(q.name.clone()));
            }
            let Some(t) = self.qos.get(target) else {
                return Err(PolicyError::UnknownPreemptTarget {
                    name: q.name.clone(),
                    target: target.clone(),
                });
            };
            if t.preempt_mode == PreemptMode::Off {
                return Err(PolicyError::PreemptsUnpreemptable {
                    name: q.name.clone(),
                    target: target.clone(),
                });
            }
        }
        Ok(())
    }

    fn validate_partitions(&self) -> Result<(), PolicyError> {
        for (key, p) in &self.partitions {
            if !valid_name(&p.name) || *key != p.name {
                return Err(PolicyError::BadPartitionName(
                    p.name.chars().take(POLICY_NAME_LEN_MAX + 1).collect(),
                ));
            }
            for q in p.allowed_qos.iter().chain(p.default_qos.iter()) {
                if !self.qos.contains_key(q) {
                    return Err(PolicyError::PartitionUnknownQos { name: p.name.clone(), qos: q.clone() });
                }
            }
            if let Some(d) = &p.default_qos {
                if !p.allowed_qos.is_empty() && !p.allowed_qos.contains(d) {
                    return Err(PolicyError::PartitionDefaultNotAllowed {
                        name: p.name.clone(),
                        qos: d.clone(),
                    });
                }
            }
            if p.max_wall_s.is_some_and(|w| w == 0 || w > MAX_WALL_S_MAX) {
                return Err(PolicyError::PartitionBadMaxWall(p.name.clone()));
            }
            p.resources.check(&format!("partition \"{}\"", p.name))?;
            if let Some(idle) = &p.idle_gpu {
                idle.check(&format!("partition \"{}\"", p.name))?;
            }
        }
        for q in self.qos.values() {
            q.resources.check(&format!("qos \"{}\"", q.name))?;
        }
        if !self.partitions.contains_key(&self.default_partition) {
            return Err(PolicyError::UnknownDefaultPartition(self.default_partition.clone()));
        }
        Ok(())
    }

    fn validate_accounts(&self) -> Result<(), PolicyError> {
        if self.accounts.is_empty() {
            return Err(PolicyError::NoAccounts);
        }
        for (key, a) in &self.accounts {
            if !valid_name(&a.name) || *key != a.name {
                return Err(PolicyError::BadAccountName(
                    a.name.chars().take(POLICY_NAME_LEN_MAX + 1).collect(),
                ));
            }
            if a.shares == 0 {
                return Err(PolicyError::ZeroShares(a.name.clone()));
            }
            if let Some(p) = &a.parent {
                if !self.accounts.contains_key(p) {
                    return Err(PolicyError::UnknownParent { name: a.name.clone(), parent: p.clone() });
                }
            }
            // Walk up: a chain longer than the number of accounts is a cycle.
            let mut at = a.parent.clone();
            for _ in 0..=self.accounts.len() {
                match at {
                    None => break,
                    Some(p) if p == a.name => return Err(PolicyError::AccountCycle(a.name.clone())),
                    Some(p) => at = self.accounts.get(&p).and_then(|x| x.parent.clone()),
                }
            }
            if at.is_some() {
                return Err(PolicyError::AccountCycle(a.name.clone()));
            }
            for access in std::iter::once(&a.qos).chain(a.user_qos.values()) {
                for q in access.allowed.iter().chain(access.default.iter()) {
                    if !self.qos.contains_key(q) {
                        return Err(PolicyError::AccountUnknownQos { name: a.name.clone(), qos: q.clone() });
                    }
                }
            }
            for user in a.user_qos.keys() {
                self.qos_access(user, &a.name)
                    .default
                    .map_or(Ok(()), |d| self.default_allowed(a, user, d))?;
            }
            self.qos_access("", &a.name).default.map_or(Ok(()), |d| self.default_allowed(a, "", d))?;
        }
        self.validate_guarantees()
    }

    /// A lend limit within its guarantee; children's guarantees together within their
    /// parent's (a parent without one does not bound them).
    fn validate_guarantees(&self) -> Result<(), PolicyError> {
        let mut children: BTreeMap<&str, u64> = BTreeMap::new();
        for a in self.accounts.values() {
            let Some(g) = &a.guarantee else { continue };
            if let Some(lend) = g.lend_limit.filter(|l| *l > g.gpus) {
                return Err(PolicyError::LendOverGuarantee { name: a.name.clone(), lend, gpus: g.gpus });
            }
            if let Some(p) = &a.parent {
                *children.entry(p.as_str()).or_default() += u64::from(g.gpus);
            }
        }
        for (parent, sum) in children {
            let Some(g) = self.accounts.get(parent).and_then(|p| p.guarantee.as_ref()) else { continue };
            if sum > u64::from(g.gpus) {
                let name = parent.to_string();
                return Err(PolicyError::ChildrenOverGuarantee { name, children: sum, gpus: g.gpus });
            }
        }
        Ok(())
    }

    /// The effective default of `user` in `account` must be among what it may use.
    fn default_allowed(&self, account: &Account, user: &str, default: String) -> Result<(), PolicyError> {
        if self.qos_access(user, &account.name).allows(&default) {
            return Ok(());
        }
        Err(PolicyError::AccountDefaultNotAllowed { name: account.name.clone(), qos: default })
    }

    /// The QoS `user` may use under `account`, and its default: for each, the nearest that says
    /// — the user's entry in the account, the account, then each ancestor up the tree. Nothing
    /// said anywhere = every QoS, no default of its own.
    pub fn qos_access(&self, user: &str, account: &str) -> EffectiveQos {
        let mut found = EffectiveQos::default();
        for name in self.ancestors(account) {
            let Some(a) = self.accounts.get(name) else { continue };
            let said = a.user_qos.get(user).into_iter().chain(std::iter::once(&a.qos));
            for access in said {
                if found.allowed.is_none() && !access.allowed.is_empty() {
                    found.allowed = Some(access.allowed.clone());
                }
                if found.default.is_none() {
                    found.default.clone_from(&access.default);
                }
            }
        }
        found
    }

    /// The account a job of `user` gets when it names `requested` ("" = the user's default:
    /// the first account listing the user, else an open root account).
    pub fn resolve_account(&self, user: &str, requested: &str) -> Result<String, String> {
        if !requested.is_empty() {
            let a = self
                .accounts
                .get(requested)
                .ok_or_else(|| format!("account: unknown account \"{requested}\""))?;
            if !a.users.is_empty() && !a.users.contains(user) {
                return Err(format!("account: user \"{user}\" does not belong to account \"{requested}\""));
            }
            return Ok(a.name.clone());
        }
        if let Some(a) = self.accounts.values().find(|a| a.users.contains(user)) {
            return Ok(a.name.clone());
        }
        self.accounts
            .values()
            .find(|a| a.parent.is_none() && a.users.is_empty())
            .map(|a| a.name.clone())
            .ok_or_else(|| format!("account: user \"{user}\" belongs to no account"))
    }

    /// Some account has a team guarantee (`crate::guarantee`).
    pub fn has_guarantees(&self) -> bool {
        self.accounts.values().any(|a| a.guarantee.is_some())
    }

    /// `account` and its ancestors, nearest first.
    pub fn account_chain(&self, account: &str) -> Vec<String> {
        self.ancestors(account).map(str::to_string).collect()
    }

    /// `account_chain` without copying the names (every submit's apply walks it).
    fn ancestors<'a>(&'a self, account: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        std::iter::successors(Some(account), |name| {
            self.accounts.get(*name).and_then(|a| a.parent.as_deref())
        })
        .take(self.accounts.len() + 1)
    }

    /// A QoS on a cycle of the preempt graph, if there is one (deterministic: first by name).
    fn preempt_cycle(&self) -> Option<String> {
        // Depth-first search with colours; the graph is small (≤ QOS_COUNT_MAX nodes).
        #[derive(Clone, Copy, PartialEq)]
        enum Mark {
            Open,
            Done,
        }
        fn visit(p: &Policy, q: &str, marks: &mut BTreeMap<String, Mark>) -> bool {
            match marks.get(q) {
                Some(Mark::Open) => return true,
                Some(Mark::Done) => return false,
                None => {}
            }
            marks.insert(q.to_string(), Mark::Open);
            let targets =
                p.qos.get(q).map(|x| x.preempt.iter().cloned().collect::<Vec<_>>()).unwrap_or_default();
            for t in targets {
                if visit(p, &t, marks) {
                    return true;
                }
            }
            marks.insert(q.to_string(), Mark::Done);
            false
        }
        let mut marks = BTreeMap::new();
        self.qos.keys().find(|q| visit(self, q, &mut marks)).cloned()
    }
}

/// Weights of the priority factors and the parameters of age and fairshare.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PriorityWeights {
    pub qos: u32,
    pub age: u32,
    pub fairshare: u32,
    pub job_size: u32,
    /// Weight of the partition's priority tier.
    #[serde(default)]
    pub partition: u32,
    /// Age stops counting after this long.
    pub age_max_s: u64,
    /// Usage halves every this long.
    pub fairshare_half_life_s: u64,
    /// What a run's time is charged at, per resource (Slurm's TRESBillingWeights).
    #[serde(default)]
    pub billing: BillingWeights,
}

/// Fairshare charge per resource, in thousandths of a GPU's (fixed point, as all replicated
/// state): a run is charged `(gpus·gpu + cpus·cpu + GiB·mem_gb) / 1000` GPU-ms per ms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BillingWeights {
    pub gpu_milli: u32,
    #[serde(default)]
    pub cpu_milli: u32,
    #[serde(default)]
    pub mem_gb_milli: u32,
}

impl Default for BillingWeights {
    /// GPUs only (one GPU-ms per GPU and ms), as before billing weights existed.
    fn default() -> Self {
        BillingWeights { gpu_milli: 1000, cpu_milli: 0, mem_gb_milli: 0 }
    }
}

impl BillingWeights {
    /// A run's charge per ms, in thousandths of a GPU: `gpus` GPUs, `cpus` CPUs and `mem_mib` MiB.
    pub fn milli_per_ms(&self, gpus: u32, cpus: u32, mem_mib: u64) -> u128 {
        u128::from(gpus) * u128::from(self.gpu_milli)
            + u128::from(cpus) * u128::from(self.cpu_milli)
            + u128::from(mem_mib) * u128::from(self.mem_gb_milli) / 1024
    }
}

impl Default for PriorityWeights {
    fn default() -> Self {
        PriorityWeights {
            qos: 10_000,
            age: 1_000,
            fairshare: 5_000,
            job_size: 500,
            partition: 1_000,
            age_max_s: 7 * 24 * 3600,
            fairshare_half_life_s: 7 * 24 * 3600,
            billing: BillingWeights::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_follow_the_articles() {
        let p = Policy::default();
        p.validate().unwrap();
        assert_eq!(p.qos["inference"].priority, 200);
        assert_eq!(p.qos["inference"].grp_gpus, Some(64));
        assert_eq!(p.qos["inference"].max_wall_s, 2 * 3600);
        assert_eq!(p.qos["inference"].preempt_mode, PreemptMode::Off);
        assert!(p.qos["inference"].burstable);
        // The headline: inference preempts training (and batch), which requeue within their grace.
        assert!(
            p.qos["inference"].preempt.contains("training") && p.qos["inference"].preempt.contains("batch")
        );
        assert_eq!(p.qos["training"].grace_s, 300);
        // Users get the everyday classes, inference included; urgent is the operators' to give.
        let allowed = &p.accounts[ROOT_ACCOUNT].qos.allowed;
        let names: Vec<&str> = allowed.iter().map(String::as_str).collect();
        assert_eq!(names, ["batch", "inference", "interactive", "premium", "training"]);
        assert_eq!(p.default_qos(Profile::Interactive).unwrap().name, "interactive");
        assert_eq!(p.qos["training"].priority, 100);
        assert_eq!(p.qos["training"].grp_gpus, Some(512));
        assert_eq!(p.qos["training"].preempt_mode, PreemptMode::Requeue);
        assert!(p.qos["urgent"].preempt.contains("training") && p.qos["urgent"].preempt.contains("batch"));
        assert_eq!(p.qos["premium"].preempt_mode, PreemptMode::Off);
        assert!(p.qos["batch"].priority < p.qos["training"].priority);
        assert_eq!(p.default_qos(Profile::Inference).unwrap().name, "inference");
    }

    #[test]
    fn bad_policies_are_refused_with_a_reason() {
        let mut p = Policy::default();
        p.qos.get_mut("urgent").unwrap().preempt.insert("urgent".into());
        assert_eq!(p.validate(), Err(PolicyError::PreemptsItself("urgent".into())));

        let mut p = Policy::default();
        p.qos.get_mut("batch").unwrap().preempt.insert("training".into());
        p.qos.get_mut("training").unwrap().preempt.insert("batch".into());
        assert!(matches!(p.validate(), Err(PolicyError::PreemptCycle(_))));

        let mut p = Policy::default();
        p.qos.get_mut("urgent").unwrap().preempt.insert("premium".into());
        assert!(matches!(p.validate(), Err(PolicyError::PreemptsUnpreemptable { .. })));

        let mut p = Policy::default();
        p.qos.get_mut("urgent").unwrap().preempt.insert("gold".into());
        assert!(matches!(p.validate(), Err(PolicyError::UnknownPreemptTarget { .. })));

        let mut p = Policy::default();
        p.qos.get_mut("batch").unwrap().priority = -1;
        assert!(matches!(p.validate(), Err(PolicyError::BadPriority { .. })));

        let mut p = Policy::default();
        p.qos.get_mut("batch").unwrap().grp_gpus = Some(0);
        assert!(matches!(p.validate(), Err(PolicyError::ZeroLimit { .. })));

        let mut p = Policy::default();
        p.profile_qos.insert(Profile::Batch, "gold".into());
        assert!(matches!(p.validate(), Err(PolicyError::UnknownProfileQos { .. })));

        let mut p = Policy::default();
        p.priority_classes.insert("high-priority".into(), "urgent".into());
        assert_eq!(p.validate(), Ok(()));
        p.priority_classes.insert("low-priority".into(), "gold".into());
        assert!(matches!(p.validate(), Err(PolicyError::UnknownPriorityClassQos { .. })));
        let mut p = Policy::default();
        p.priority_classes.insert("High Priority".into(), "urgent".into());
        assert!(matches!(p.validate(), Err(PolicyError::BadPriorityClass(_))));

        let mut p = Policy::default();
        let mut q = p.qos["batch"].clone();
        q.name = "Bad Name".into();
        p.qos.insert(q.name.clone(), q);
        assert!(matches!(p.validate(), Err(PolicyError::BadName(_))));
    }
}

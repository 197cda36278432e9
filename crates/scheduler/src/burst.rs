//! Cloud burst, replicated part: the operator's burst configuration, every launch intent and
//! the instance it became, and what was spent.
//!
//! Launch intents are committed *before* any cloud API call (`Op::BurstLaunch`), so a leader
//! that dies mid-call leaves a record its successor finds and finishes (adopting the instance by
//! its `kairos:intent` tag rather than launching again). Apply re-checks every limit on each
//! launch: live instances, their GPUs and their hourly price never exceed the configuration,
//! whatever a (possibly stale) leader proposed.
//!
//! ```text
//!   Requested ──BurstLaunched──▶ Launched ──BurstTerminate──▶ Terminating ──BurstGone──▶ Gone
//!       │                           │                                                   ▲
//!       └──BurstLaunchFailed────────┴───────────────BurstGone (vanished) ───────────────┘
//! ```
//!
//! Money is integer thousandths of a US dollar ("milli-dollars"); time is milliseconds.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};

/// A node started by burst carries this label, valued with its intent id.
pub const BURST_LABEL: &str = "kairos.io/burst-intent";
/// Most decisions kept for `kairos burst status`.
pub const DECISIONS_MAX: usize = 50;
/// Most instance types in a configuration.
pub const INSTANCE_TYPES_MAX: usize = 32;
/// A (type, market) that answered with a capacity error is not asked again for this long.
pub const CAPACITY_BACKOFF_MS: i64 = 60_000;
/// Ended instances kept for status (the oldest are forgotten first).
pub const ENDED_KEPT: usize = 200;

/// A cloud instance type the operator allows, with its GPUs and price.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceType {
    pub name: String,
    pub gpus: u32,
    pub gpu_model: String,
    /// On-demand price per hour, milli-dollars.
    pub hourly_price_milli: u64,
    /// Spot price per hour (an estimate for planning and limits), milli-dollars; None = the
    /// on-demand price.
    #[serde(default)]
    pub spot_price_milli: Option<u64>,
    /// Its CPUs and memory (MiB) for jobs; 0: not stated (then they bind nothing).
    #[serde(default)]
    pub cpus: u32,
    #[serde(default)]
    pub memory_mib: u64,
}

impl InstanceType {
    /// What one task's CPUs and memory find on it (all it has; unstated ones bind nothing).
    pub fn cpu_mem(&self) -> crate::model::CpuMem {
        crate::model::CpuMem {
            cpus: if self.cpus == 0 { u32::MAX } else { self.cpus },
            mem_mib: if self.memory_mib == 0 { u64::MAX } else { self.memory_mib },
        }
    }

    pub fn price_milli(&self, spot: bool) -> u64 {
        if spot {
            self.spot_price_milli.unwrap_or(self.hourly_price_milli)
        } else {
            self.hourly_price_milli
        }
    }
}

/// The operator's burst configuration (admin only; replicated).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BurstConfig {
    pub enabled: bool,
    pub region: String,
    /// Subnets to launch into (round-robin by intent); empty = the launch template's.
    pub subnets: Vec<String>,
    /// Launch template name (or id, "lt-…").
    pub launch_template: String,
    pub instance_types: Vec<InstanceType>,
    pub spot_allowed: bool,
    /// When spot capacity is not available, launch on-demand instead.
    pub on_demand_fallback: bool,
    pub max_instances: u32,
    pub max_gpus: u32,
    pub max_hourly_spend_milli: u64,
    /// Burstable jobs must have waited this long before burst launches for them.
    pub min_wait_s: u64,
    /// A cloud node without jobs this long is terminated.
    pub idle_timeout_s: u64,
    /// An instance whose agent has not registered after this long is terminated.
    pub boot_timeout_s: u64,
    /// Burst only when at least this percentage of on-prem GPUs is allocated.
    pub saturation_pct: u32,
    /// QoS classes whose jobs may burst; empty = the QoS classes marked `burstable`.
    pub qos: BTreeSet<String>,
    /// Launch ahead for the burstable GPUs the last this-many seconds asked for, taken as what
    /// the next ones bring, beyond free on-prem GPUs and idle cloud ones (0: no forecast).
    #[serde(default)]
    pub forecast_window_s: u64,
    /// Warm pool: while on-prem is saturated, keep this many instances idle (counted in the
    /// limits; 0: none).
    #[serde(default)]
    pub min_idle_instances: u32,
}

impl Default for BurstConfig {
    /// Disabled, with conservative limits: nothing is launched until an operator configures it.
    fn default() -> Self {
        BurstConfig {
            enabled: false,
            region: "us-east-1".into(),
            subnets: Vec::new(),
            launch_template: String::new(),
            instance_types: Vec::new(),
            spot_allowed: false,
            on_demand_fallback: true,
            max_instances: 0,
            max_gpus: 0,
            max_hourly_spend_milli: 0,
            min_wait_s: 120,
            idle_timeout_s: 600,
            boot_timeout_s: 900,
            saturation_pct: 90,
            qos: BTreeSet::new(),
            forecast_window_s: 0,
            min_idle_instances: 0,
        }
    }
}

impl BurstConfig {
    /// Checks the configuration whole; the message names the field.
    pub fn validate(&self) -> Result<(), String> {
        let name_ok = |s: &str, max: usize| {
            !s.is_empty()
                && s.len() <= max
                && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_.:/".contains(c))
        };
        if !name_ok(&self.region, 32) {
            return Err("region: 1-32 characters of [A-Za-z0-9-_.:/]".into());
        }
        if self.subnets.len() > 16 || self.subnets.iter().any(|s| !name_ok(s, 64)) {
            return Err("subnets: at most 16 subnet ids".into());
        }
        if !self.launch_template.is_empty() && !name_ok(&self.launch_template, 128) {
            return Err("launch_template: 1-128 characters of [A-Za-z0-9-_.:/]".into());
        }
        if self.instance_types.len() > INSTANCE_TYPES_MAX {
            return Err(format!("instance_types: at most {INSTANCE_TYPES_MAX}"));
        }
        let mut seen = BTreeSet::new();
        for t in &self.instance_types {
            if !name_ok(&t.name, 64) || !seen.insert(&t.name) {
                return Err(format!(
                    "instance_types: bad or duplicate name \"{}\"",
                    t.name.chars().take(64).collect::<String>()
                ));
            }
            if t.gpus == 0 || t.gpus > 64 {
                return Err(format!("instance_types.{}: gpus must be 1 to 64", t.name));
            }
            if t.gpu_model.is_empty() || t.gpu_model.len() > 64 {
                return Err(format!("instance_types.{}: gpu_model must be 1 to 64 characters", t.name));
            }
            if t.hourly_price_milli == 0 || t.spot_price_milli == Some(0) {
                return Err(format!("instance_types.{}: prices must be above 0", t.name));
            }
        }
        if self.enabled {
            if self.instance_types.is_empty() {
                return Err("instance_types: burst is enabled but no instance type is allowed".into());
            }
            if self.launch_template.is_empty() {
                return Err("launch_template: required when burst is enabled".into());
            }
        }
        if self.saturation_pct > 100 {
            return Err("saturation_pct: 0 to 100".into());
        }
        if self.idle_timeout_s == 0 || self.boot_timeout_s == 0 {
            return Err("idle_timeout and boot_timeout must be at least 1 s".into());
        }
        if self.min_idle_instances > self.max_instances {
            return Err("min_idle_instances: at most max_instances".into());
        }
        if self.forecast_window_s > 86_400 {
            return Err("forecast_window: at most 24h".into());
        }
        if self.qos.len() > 32 || self.qos.iter().any(|q| !name_ok(q, 64)) {
            return Err("qos: at most 32 QoS names".into());
        }
        Ok(())
    }

    pub fn instance_type(&self, name: &str) -> Option<&InstanceType> {
        self.instance_types.iter().find(|t| t.name == name)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum InstanceState {
    /// Committed, not yet confirmed by the cloud (the API call may be in flight).
    Requested,
    /// The cloud returned (or the reconciler found) its instance id.
    Launched,
    /// Asked to terminate; retried until the cloud confirms.
    Terminating,
    /// Terminated, vanished, or never launched.
    Gone,
}

impl InstanceState {
    pub fn as_str(self) -> &'static str {
        match self {
            InstanceState::Requested => "requested",
            InstanceState::Launched => "launched",
            InstanceState::Terminating => "terminating",
            InstanceState::Gone => "gone",
        }
    }
}

/// One launch intent and the instance it became.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BurstInstance {
    pub intent: u64,
    pub instance_type: String,
    pub gpus: u32,
    pub gpu_model: String,
    pub spot: bool,
    pub price_milli: u64,
    pub subnet: Option<String>,
    pub state: InstanceState,
    pub instance_id: Option<String>,
    pub requested_ms: i64,
    pub launched_ms: Option<i64>,
    pub ended_ms: Option<i64>,
    /// Why it was launched, or why it ended.
    pub reason: String,
    /// Since when its node has run nothing (None while busy or not yet registered).
    #[serde(default)]
    pub idle_since_ms: Option<i64>,
    /// When its node registered.
    #[serde(default)]
    pub joined_ms: Option<i64>,
}

impl BurstInstance {
    /// The node its agent registers as.
    pub fn node_name(&self) -> String {
        node_name(self.intent)
    }

    /// Live = counts against the limits (everything not Gone).
    pub fn is_live(&self) -> bool {
        self.state != InstanceState::Gone
    }

    /// What it has cost up to `now`, milli-dollars (from the launch request: a requested
    /// instance may already be billed).
    pub fn cost_milli(&self, now: i64) -> u64 {
        let end = self.ended_ms.unwrap_or(now);
        let ms = end.saturating_sub(self.requested_ms).max(0) as u128;
        (u128::from(self.price_milli) * ms / 3_600_000) as u64
    }
}

/// The node name of intent `intent`'s instance.
pub fn node_name(intent: u64) -> String {
    format!("burst-{intent}")
}

/// One instance to launch, as proposed by the policy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchRequest {
    pub instance_type: String,
    pub spot: bool,
}

/// All of burst's replicated state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BurstState {
    pub config: BurstConfig,
    pub next_intent: u64,
    pub instances: BTreeMap<u64, BurstInstance>,
    /// Cost of instances already forgotten, milli-dollars.
    pub forgotten_cost_milli: u64,
    /// (type, spot) → no launch of it before this time (capacity errors).
    pub backoff: BTreeMap<(String, bool), i64>,
    /// The latest decisions with their reasons, oldest first.
    pub decisions: VecDeque<(i64, String)>,
}

/// What the live instances hold against the limits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Footprint {
    pub instances: u32,
    pub gpus: u32,
    pub hourly_milli: u64,
}

impl BurstState {
    pub fn live(&self) -> impl Iterator<Item = &BurstInstance> {
        self.instances.values().filter(|i| i.is_live())
    }

    pub fn footprint(&self) -> Footprint {
        self.live().fold(Footprint::default(), |f, i| Footprint {
            instances: f.instances + 1,
            gpus: f.gpus + i.gpus,
            hourly_milli: f.hourly_milli + i.price_milli,
        })
    }

    /// Whether `extra` more stays within every limit.
    pub fn fits(&self, now: Footprint, extra: Footprint) -> bool {
        let c = &self.config;
        now.instances + extra.instances <= c.max_instances
            && now.gpus + extra.gpus <= c.max_gpus
            && now.hourly_milli + extra.hourly_milli <= c.max_hourly_spend_milli
    }

    /// Total spend so far, milli-dollars.
    pub fn spent_milli(&self, now: i64) -> u64 {
        self.forgotten_cost_milli + self.instances.values().map(|i| i.cost_milli(now)).sum::<u64>()
    }

    pub fn note(&mut self, now: i64, decision: String) {
        if self.decisions.len() >= DECISIONS_MAX {
            self.decisions.pop_front();
        }
        self.decisions.push_back((now, decision));
    }

    /// The intent whose node is `node`, if `node` is a burst node.
    pub fn intent_of_node(&self, node: &str) -> Option<u64> {
        node.strip_prefix("burst-")?.parse().ok().filter(|i| self.instances.contains_key(i))
    }

    /// Forgets the oldest ended instances beyond `ENDED_KEPT` (their cost is kept).
    pub(crate) fn trim(&mut self, now: i64) {
        let ended: Vec<u64> = self.instances.values().filter(|i| !i.is_live()).map(|i| i.intent).collect();
        for id in ended.iter().take(ended.len().saturating_sub(ENDED_KEPT)) {
            if let Some(i) = self.instances.remove(id) {
                self.forgotten_cost_milli += i.cost_milli(now);
            }
        }
    }
}

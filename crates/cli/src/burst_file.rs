//! The burst configuration file of `kairos burst config apply|show` (TOML), and `set KEY=VALUE`.
//!
//! ```toml
//! enabled = true
//! region = "us-east-1"
//! launch_template = "kairos-burst"     # name, or an id "lt-…"
//! subnets = ["subnet-0abc"]            # optional; round-robin
//! spot_allowed = true
//! on_demand_fallback = true            # spot capacity gone: launch on-demand instead
//! max_instances = 4
//! max_gpus = 32
//! max_hourly_spend = 120.0             # US dollars per hour, all live instances together
//! min_wait = "2m"                      # burstable jobs wait this long before a launch
//! idle_timeout = "10m"                 # an idle cloud node is terminated after this
//! boot_timeout = "15m"                 # an instance whose agent never joined, after this
//! saturation_pct = 90                  # burst only when on-prem GPUs are this allocated
//! qos = ["inference"]                  # may burst; empty = QoS marked burstable
//! forecast_window = "10m"              # launch ahead for what the last 10m of burstable jobs
//!                                      # asked beyond on-prem room ("0s": no forecast)
//! min_idle_instances = 1               # warm pool kept idle while on-prem is saturated
//!
//! [[instance_types]]
//! name = "g5.12xlarge"
//! gpus = 4
//! gpu_model = "A10G"
//! hourly_price = 5.672                 # on-demand, US dollars per hour
//! spot_price = 2.1                     # optional estimate
//!
//! [sim]                                # only `kairos sim --burst` reads it: the simulated cloud
//! boot_min = "3m"                      # launch to a joined agent, uniform in [min, max]
//! boot_max = "6m"
//! spot_interruptions_per_hour = 0.01   # per spot instance
//! capacity_errors = { "g5.12xlarge" = 0.1 }   # chance a launch finds no capacity
//! ```
//!
//! Unknown keys are errors; durations are humantime ("90s", "10m", "2h").

use kairos_proto::v1 as pb;
use serde::{Deserialize, Serialize};

use crate::policy_file::{format_secs, parse_secs};

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BurstFile {
    #[serde(default)]
    pub enabled: bool,
    #[serde(default = "default_region")]
    pub region: String,
    #[serde(default)]
    pub launch_template: String,
    #[serde(default)]
    pub subnets: Vec<String>,
    #[serde(default)]
    pub spot_allowed: bool,
    #[serde(default = "yes")]
    pub on_demand_fallback: bool,
    #[serde(default)]
    pub max_instances: u32,
    #[serde(default)]
    pub max_gpus: u32,
    #[serde(default)]
    pub max_hourly_spend: f64,
    #[serde(default = "two_minutes")]
    pub min_wait: String,
    #[serde(default = "ten_minutes")]
    pub idle_timeout: String,
    #[serde(default = "fifteen_minutes")]
    pub boot_timeout: String,
    #[serde(default = "ninety")]
    pub saturation_pct: u32,
    #[serde(default)]
    pub qos: Vec<String>,
    #[serde(default = "zero_seconds")]
    pub forecast_window: String,
    #[serde(default)]
    pub min_idle_instances: u32,
    #[serde(default)]
    pub instance_types: Vec<InstanceTypeFile>,
    /// The simulated cloud of `kairos sim --burst` (`kairos burst config apply` ignores it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sim: Option<SimCloudFile>,
}

/// The `[sim]` table: how the simulated cloud behaves (`kairos_sim::cloud::CloudModel`; what is
/// left out keeps its default).
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimCloudFile {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_min: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_max: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spot_interruptions_per_hour: Option<f64>,
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub capacity_errors: std::collections::BTreeMap<String, f64>,
    /// The reconciler's period (kairosd's `--burst-interval-ms`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstanceTypeFile {
    pub name: String,
    pub gpus: u32,
    pub gpu_model: String,
    pub hourly_price: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spot_price: Option<f64>,
    /// CPUs and memory ("192G") it offers jobs; unset: not counted when choosing it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<String>,
}

fn default_region() -> String {
    "us-east-1".into()
}
fn yes() -> bool {
    true
}
fn two_minutes() -> String {
    "2m".into()
}
fn zero_seconds() -> String {
    "0s".into()
}
fn ten_minutes() -> String {
    "10m".into()
}
fn fifteen_minutes() -> String {
    "15m".into()
}
fn ninety() -> u32 {
    90
}

/// Dollars to milli-dollars, refusing negative, non-finite or absurd amounts.
fn milli(field: &str, dollars: f64) -> Result<u64, String> {
    if !dollars.is_finite() || !(0.0..=1_000_000.0).contains(&dollars) {
        return Err(format!("{field}: {dollars} is not an amount of US dollars between 0 and 1000000"));
    }
    Ok((dollars * 1000.0).round() as u64)
}

fn dollars(milli: u64) -> f64 {
    milli as f64 / 1000.0
}

impl BurstFile {
    /// Parses a burst file; errors name the line and column.
    pub fn parse(text: &str) -> Result<BurstFile, String> {
        toml::from_str(text).map_err(crate::policy_file::one_line)
    }

    pub fn to_pb(&self) -> Result<pb::BurstConfig, String> {
        let mut types = Vec::new();
        for t in &self.instance_types {
            types.push(pb::BurstInstanceType {
                name: t.name.clone(),
                gpus: t.gpus,
                gpu_model: t.gpu_model.clone(),
                hourly_price_milli: milli(
                    &format!("instance_types.{}.hourly_price", t.name),
                    t.hourly_price,
                )?,
                spot_price_milli: match t.spot_price {
                    Some(p) => milli(&format!("instance_types.{}.spot_price", t.name), p)?,
                    None => 0,
                },
                cpus: t.cpus.unwrap_or(0),
                memory_mib: t
                    .memory
                    .as_deref()
                    .map(|m| {
                        kairos_proto::units::parse_mem_mib(m)
                            .map_err(|e| format!("instance_types.{}.memory: {e}", t.name))
                    })
                    .transpose()?
                    .unwrap_or(0),
            });
        }
        Ok(pb::BurstConfig {
            enabled: self.enabled,
            region: self.region.clone(),
            subnets: self.subnets.clone(),
            launch_template: self.launch_template.clone(),
            instance_types: types,
            spot_allowed: self.spot_allowed,
            on_demand_fallback: self.on_demand_fallback,
            max_instances: self.max_instances,
            max_gpus: self.max_gpus,
            max_hourly_spend_milli: milli("max_hourly_spend", self.max_hourly_spend)?,
            min_wait_s: parse_secs("min_wait", &self.min_wait)?,
            idle_timeout_s: parse_secs("idle_timeout", &self.idle_timeout)?,
            boot_timeout_s: parse_secs("boot_timeout", &self.boot_timeout)?,
            saturation_pct: self.saturation_pct,
            qos: self.qos.clone(),
            forecast_window_s: parse_secs("forecast_window", &self.forecast_window)?,
            min_idle_instances: self.min_idle_instances,
        })
    }

    /// The simulated cloud this file describes (its `[sim]` table over the defaults).
    pub fn cloud_model(&self) -> Result<kairos_sim::cloud::CloudModel, String> {
        let mut m = kairos_sim::cloud::CloudModel::default();
        let Some(f) = &self.sim else { return Ok(m) };
        let ms = |field: &str, v: &Option<String>, default: i64| -> Result<i64, String> {
            v.as_deref().map_or(Ok(default), |v| Ok(parse_secs(field, v)?.min(1 << 40) as i64 * 1000))
        };
        m.boot_min_ms = ms("sim.boot_min", &f.boot_min, m.boot_min_ms)?;
        m.boot_max_ms = ms("sim.boot_max", &f.boot_max, m.boot_max_ms)?;
        m.interval_ms = ms("sim.interval", &f.interval, m.interval_ms)?;
        m.spot_interruptions_per_hour =
            f.spot_interruptions_per_hour.unwrap_or(m.spot_interruptions_per_hour);
        m.capacity_errors = f.capacity_errors.clone();
        if let Some(t) = m.capacity_errors.keys().find(|t| !self.instance_types.iter().any(|i| &i.name == *t))
        {
            return Err(format!("sim.capacity_errors: \"{t}\" is not one of the instance_types"));
        }
        m.validate()?;
        Ok(m)
    }

    pub fn from_pb(c: &pb::BurstConfig) -> BurstFile {
        BurstFile {
            enabled: c.enabled,
            region: c.region.clone(),
            launch_template: c.launch_template.clone(),
            subnets: c.subnets.clone(),
            spot_allowed: c.spot_allowed,
            on_demand_fallback: c.on_demand_fallback,
            max_instances: c.max_instances,
            max_gpus: c.max_gpus,
            max_hourly_spend: dollars(c.max_hourly_spend_milli),
            min_wait: format_secs(c.min_wait_s),
            idle_timeout: format_secs(c.idle_timeout_s),
            boot_timeout: format_secs(c.boot_timeout_s),
            saturation_pct: c.saturation_pct,
            qos: c.qos.clone(),
            forecast_window: format_secs(c.forecast_window_s),
            min_idle_instances: c.min_idle_instances,
            instance_types: c
                .instance_types
                .iter()
                .map(|t| InstanceTypeFile {
                    name: t.name.clone(),
                    gpus: t.gpus,
                    gpu_model: t.gpu_model.clone(),
                    hourly_price: dollars(t.hourly_price_milli),
                    spot_price: (t.spot_price_milli != 0).then(|| dollars(t.spot_price_milli)),
                    cpus: (t.cpus != 0).then_some(t.cpus),
                    memory: (t.memory_mib != 0).then(|| format!("{}M", t.memory_mib)),
                })
                .collect(),
            sim: None,
        }
    }

    /// Applies one `KEY=VALUE` of `kairos burst config set` (top-level keys only).
    pub fn set(&mut self, assignment: &str) -> Result<(), String> {
        let (key, value) =
            assignment.split_once('=').ok_or_else(|| format!("\"{assignment}\" is not KEY=VALUE"))?;
        let bool_of = |v: &str| v.parse::<bool>().map_err(|_| format!("{key}: \"{v}\" is not true or false"));
        let u32_of = |v: &str| v.parse::<u32>().map_err(|_| format!("{key}: \"{v}\" is not a whole number"));
        let list_of =
            |v: &str| v.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_string).collect();
        match key.trim() {
            "enabled" => self.enabled = bool_of(value)?,
            "region" => self.region = value.to_string(),
            "launch_template" => self.launch_template = value.to_string(),
            "subnets" => self.subnets = list_of(value),
            "spot_allowed" => self.spot_allowed = bool_of(value)?,
            "on_demand_fallback" => self.on_demand_fallback = bool_of(value)?,
            "max_instances" => self.max_instances = u32_of(value)?,
            "max_gpus" => self.max_gpus = u32_of(value)?,
            "max_hourly_spend" => {
                self.max_hourly_spend =
                    value.parse().map_err(|_| format!("{key}: \"{value}\" is not an amount of dollars"))?
            }
            "min_wait" => self.min_wait = value.to_string(),
            "idle_timeout" => self.idle_timeout = value.to_string(),
            "boot_timeout" => self.boot_timeout = value.to_string(),
            "saturation_pct" => self.saturation_pct = u32_of(value)?,
            "qos" => self.qos = list_of(value),
            "forecast_window" => self.forecast_window = value.to_string(),
            "min_idle_instances" => self.min_idle_instances = u32_of(value)?,
            other => {
                return Err(format!(
                    "unknown key \"{other}\" (instance types are set with `kairos burst config apply FILE`)"
                ))
            }
        }
        Ok(())
    }
}

/// A burst file (`kairos burst config apply` format) as the core's configuration and the
/// simulated cloud of its `[sim]` table, checked under `policy` (`kairos sim --burst`, `kairos
/// policy what-if --burst`).
pub fn setup_of(
    path: &std::path::Path,
    policy: &kairos_scheduler::policy::Policy,
) -> anyhow::Result<kairos_sim::cloud::BurstSetup> {
    let text =
        std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
    let fail = |e: String| anyhow::anyhow!("{}: {e}", path.display());
    let file = BurstFile::parse(&text).map_err(fail)?;
    let config = kairos_convert::burst::burst_config_from_pb(file.to_pb().map_err(fail)?);
    let setup = kairos_sim::cloud::BurstSetup { config, model: file.cloud_model().map_err(fail)? };
    setup.check(policy).map_err(fail)?;
    Ok(setup)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn the_example_config_parses_and_round_trips() {
        let text = include_str!("../../../deploy/burst.example.toml");
        let parsed = BurstFile::parse(text).unwrap();
        let config = parsed.to_pb().unwrap();
        assert_eq!((config.max_hourly_spend_milli, config.instance_types.len()), (40_000, 2));
        let again = BurstFile::from_pb(&config).to_pb().unwrap();
        assert_eq!(again, config);
    }

    proptest! {
        /// Any text is a config or a clean error; any amounts convert or fail cleanly.
        #[test]
        fn any_text_and_any_amounts_fail_cleanly(text in any::<String>(), price in any::<f64>(), spend in any::<f64>()) {
            let _ = BurstFile::parse(&text);
            let mut file = BurstFile::parse("").unwrap();
            file.max_hourly_spend = spend;
            file.instance_types.push(InstanceTypeFile {
                name: "t".into(), gpus: 1, gpu_model: "A10G".into(), hourly_price: price, spot_price: Some(price), cpus: None, memory: None,
            });
            if let Ok(config) = file.to_pb() {
                prop_assert!(spend >= 0.0 && price >= 0.0 && config.max_hourly_spend_milli <= 1_000_000_000);
            }
        }

        #[test]
        fn any_text_is_a_policy_or_a_clean_error(text in any::<String>()) {
            if let Ok(parsed) = crate::policy_file::PolicyFile::parse(&text) {
                let _ = parsed.to_pb();
            }
        }
    }
}

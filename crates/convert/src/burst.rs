//! Conversions between the scheduling core's burst configuration and `kairos.v1` messages:
//! one mapping for the controller (`kairos burst config apply`) and the CLI
//! (`kairos sim --burst`, which reads the same file).

use kairos_proto::v1 as pb;
use kairos_scheduler::burst::{BurstConfig, InstanceType};

pub fn burst_config_to_pb(c: &BurstConfig) -> pb::BurstConfig {
    pb::BurstConfig {
        enabled: c.enabled,
        region: c.region.clone(),
        subnets: c.subnets.clone(),
        launch_template: c.launch_template.clone(),
        instance_types: c
            .instance_types
            .iter()
            .map(|t| pb::BurstInstanceType {
                name: t.name.clone(),
                gpus: t.gpus,
                gpu_model: t.gpu_model.clone(),
                hourly_price_milli: t.hourly_price_milli,
                spot_price_milli: t.spot_price_milli.unwrap_or(0),
                cpus: t.cpus,
                memory_mib: t.memory_mib,
            })
            .collect(),
        spot_allowed: c.spot_allowed,
        on_demand_fallback: c.on_demand_fallback,
        max_instances: c.max_instances,
        max_gpus: c.max_gpus,
        max_hourly_spend_milli: c.max_hourly_spend_milli,
        min_wait_s: c.min_wait_s,
        idle_timeout_s: c.idle_timeout_s,
        boot_timeout_s: c.boot_timeout_s,
        saturation_pct: c.saturation_pct,
        qos: c.qos.iter().cloned().collect(),
        forecast_window_s: c.forecast_window_s,
        min_idle_instances: c.min_idle_instances,
    }
}

/// The domain configuration; validation happens on apply (`BurstConfig::validate`).
pub fn burst_config_from_pb(c: pb::BurstConfig) -> BurstConfig {
    BurstConfig {
        enabled: c.enabled,
        region: c.region,
        subnets: c.subnets,
        launch_template: c.launch_template,
        instance_types: c
            .instance_types
            .into_iter()
            .map(|t| InstanceType {
                name: t.name,
                gpus: t.gpus,
                gpu_model: t.gpu_model,
                hourly_price_milli: t.hourly_price_milli,
                spot_price_milli: (t.spot_price_milli != 0).then_some(t.spot_price_milli),
                cpus: t.cpus,
                memory_mib: t.memory_mib,
            })
            .collect(),
        spot_allowed: c.spot_allowed,
        on_demand_fallback: c.on_demand_fallback,
        max_instances: c.max_instances,
        max_gpus: c.max_gpus,
        max_hourly_spend_milli: c.max_hourly_spend_milli,
        min_wait_s: c.min_wait_s,
        idle_timeout_s: c.idle_timeout_s,
        boot_timeout_s: c.boot_timeout_s,
        saturation_pct: c.saturation_pct,
        qos: c.qos.into_iter().collect(),
        forecast_window_s: c.forecast_window_s,
        min_idle_instances: c.min_idle_instances,
    }
}

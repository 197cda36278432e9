//! Conversions between the burst configuration and status types and their protobuf forms.

use kairos_proto::v1 as pb;
use kairos_scheduler::burst::{BurstConfig, InstanceType};
use kairos_scheduler::ClusterState;

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
    }
}

pub fn burst_status(state: &ClusterState, now: i64) -> pb::BurstStatusResponse {
    let b = &state.burst;
    let footprint = b.footprint();
    let (on_prem_used, on_prem_total) = kairos_burst::decision::on_prem_usage(state);
    let instances = b
        .instances
        .values()
        .rev()
        .map(|i| {
            let node = i.node_name();
            let joined = state.nodes.contains_key(&node);
            pb::BurstInstance {
                intent: i.intent,
                instance_type: i.instance_type.clone(),
                gpus: i.gpus,
                spot: i.spot,
                price_milli: i.price_milli,
                state: i.state.as_str().to_string(),
                instance_id: i.instance_id.clone().unwrap_or_default(),
                node: if joined { node.clone() } else { String::new() },
                requested_ms: i.requested_ms,
                launched_ms: i.launched_ms.unwrap_or(0),
                ended_ms: i.ended_ms.unwrap_or(0),
                reason: i.reason.clone(),
                jobs: if i.is_live() {
                    state.jobs_on(&node).iter().map(|j| j.id).collect()
                } else {
                    Vec::new()
                },
                idle_since_ms: i.idle_since_ms.unwrap_or(0),
            }
        })
        .collect();
    pb::BurstStatusResponse {
        enabled: b.config.enabled,
        instances,
        live_instances: footprint.instances,
        live_gpus: footprint.gpus,
        hourly_spend_milli: footprint.hourly_milli,
        spent_milli: b.spent_milli(now),
        max_instances: b.config.max_instances,
        max_gpus: b.config.max_gpus,
        max_hourly_spend_milli: b.config.max_hourly_spend_milli,
        decisions: b
            .decisions
            .iter()
            .rev()
            .map(|(t, m)| pb::BurstDecision { time_ms: *t, message: m.clone() })
            .collect(),
        on_prem_used,
        on_prem_total,
    }
}

//! The burst status as its protobuf form (the configuration's conversions are
//! `kairos_proto::burst`'s, shared with the CLI's simulator).

use kairos_proto::v1 as pb;
use kairos_scheduler::ClusterState;

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

//! The burst status as its protobuf form (the configuration's conversions are `burst`'s,
//! shared with the CLI's simulator); the on-prem usage and forecast come from `kairos_burst`.

use kairos_proto::v1 as pb;
use kairos_scheduler::ClusterState;

pub fn burst_status(state: &ClusterState, now: i64) -> pb::BurstStatusResponse {
    let b = &state.burst;
    let footprint = b.footprint();
    let (on_prem_used, on_prem_total) = kairos_burst::decision::on_prem_usage(state);
    // (The outlook scans recent jobs: only when a forecast is configured.)
    let (forecast_expected_gpus, on_prem_free) = if b.config.forecast_window_s > 0 {
        let o = kairos_burst::forecast::outlook(state, now);
        (o.expected, o.headroom)
    } else {
        (0, kairos_burst::forecast::headroom(state))
    };
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
        forecast_window_s: b.config.forecast_window_s,
        forecast_expected_gpus,
        on_prem_free,
    }
}

#[cfg(test)]
mod tests {
    use kairos_scheduler::burst::BurstConfig;
    use kairos_scheduler::{ClusterState, Command, Gpu, JobSpec, NodeInfo, Op, Profile};

    fn apply(s: &mut ClusterState, now: i64, op: Op) {
        s.apply(&Command { skipped_ms: 0, now_ms: now, op });
    }

    #[test]
    fn the_status_shows_the_forecast_against_the_free_on_prem_gpus() {
        let mut s = ClusterState::new();
        let gpu = |index| Gpu {
            index,
            uuid: format!("GPU-{index}"),
            model: "A10G".into(),
            memory_mib: 1,
            link_group: 0,
            mig_parent: None,
        };
        let info = NodeInfo {
            name: "n0".into(),
            addr: "n0:1".into(),
            gpus: (0..3).map(gpu).collect(),
            cpus: 8,
            memory_mib: 1 << 14,
            labels: Default::default(),
            gpu_backend: "fake".into(),
            isolation: String::new(),
        };
        apply(&mut s, 0, Op::RegisterNode { info });
        let config = BurstConfig {
            forecast_window_s: 600,
            qos: ["inference".to_string()].into(),
            ..BurstConfig::default()
        };
        apply(&mut s, 0, Op::SetBurstConfig { config });
        for gpus in [1, 2] {
            let mut spec = JobSpec::new("i", "bob", vec!["true".into()], gpus);
            spec.profile = Profile::Inference;
            apply(&mut s, 1_000, Op::Submit { spec, request_id: None, hold: false, limits: None });
        }
        let status = super::burst_status(&s, 2_000);
        assert_eq!(
            (status.forecast_window_s, status.forecast_expected_gpus, status.on_prem_free),
            (600, 3, 3)
        );
        // Past the window, nothing is expected.
        assert_eq!(super::burst_status(&s, 602_000).forecast_expected_gpus, 0);
    }
}

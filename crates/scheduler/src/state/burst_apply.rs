//! Applying the burst commands (`Op::SetBurstConfig`, `Op::BurstLaunch`, …) to the state.
//! Every limit is re-checked here, so no proposal — stale, duplicated or forged — can take
//! the live instances, their GPUs or their hourly price above the configuration.

use crate::burst::{
    BurstConfig, BurstInstance, Footprint, InstanceState, InstanceType, LaunchRequest, BURST_LABEL,
};
use crate::model::{Job, NodeInfo, NodeState};
use crate::state::{ClusterState, Outcome, Rejection};

/// Most launches one command may carry.
pub const LAUNCHES_PER_COMMAND_MAX: usize = 16;

fn reject(m: String) -> Outcome {
    Outcome::Rejected(Rejection::FailedPrecondition(m))
}

impl ClusterState {
    /// Whether `job` may run on cloud burst capacity: its QoS is one the burst configuration
    /// names, or (when it names none) a QoS marked `burstable`.
    pub fn may_burst(&self, job: &Job) -> bool {
        let qos = &self.burst.config.qos;
        if qos.is_empty() {
            self.policy.qos(&job.spec.qos).is_some_and(|q| q.burstable)
        } else {
            qos.contains(&job.spec.qos)
        }
    }

    /// Whether `job` may be placed on a node with these labels (cloud nodes take only
    /// burstable jobs).
    pub fn node_admits(&self, job: &Job, labels: &std::collections::BTreeMap<String, String>) -> bool {
        !labels.contains_key(BURST_LABEL) || self.may_burst(job)
    }

    /// A node claiming to be a burst instance must be one the cluster launched and not ended.
    pub(crate) fn check_burst_node(&self, info: &NodeInfo) -> Result<(), String> {
        let Some(label) = info.labels.get(BURST_LABEL) else { return Ok(()) };
        let intent: Option<u64> = label.parse().ok();
        let known = intent.and_then(|i| self.burst.instances.get(&i));
        match known {
            Some(i) if i.is_live() && i.state != InstanceState::Terminating && info.name == i.node_name() => {
                Ok(())
            }
            _ => Err(format!(
                "node \"{}\": {BURST_LABEL}={} is not a live burst instance of this cluster",
                info.name,
                label.chars().take(32).collect::<String>()
            )),
        }
    }

    pub(crate) fn set_burst_config(&mut self, config: &BurstConfig, now: i64) -> Outcome {
        if let Err(e) = config.validate() {
            return Outcome::Rejected(Rejection::Invalid(format!("burst config: {e}")));
        }
        if let Some(q) = config.qos.iter().find(|q| !self.policy.qos.contains_key(*q)) {
            return Outcome::Rejected(Rejection::Invalid(format!("burst config: qos: unknown qos \"{q}\"")));
        }
        self.burst.config = config.clone();
        let state = if config.enabled { "enabled" } else { "disabled" };
        self.burst.note(now, format!("configuration changed (burst {state})"));
        Outcome::PolicyChanged
    }

    /// A note in the burst log (bounded).
    pub(crate) fn burst_note(&mut self, message: &str, now: i64) -> Outcome {
        self.burst.note(now, message.chars().take(256).collect());
        Outcome::Burst { intents: Vec::new() }
    }

    pub(crate) fn burst_launch(&mut self, launches: &[LaunchRequest], reason: &str, now: i64) -> Outcome {
        let config = &self.burst.config;
        if !config.enabled {
            return reject("burst is disabled".into());
        }
        if launches.is_empty() || launches.len() > LAUNCHES_PER_COMMAND_MAX {
            return reject(format!("a launch carries 1 to {LAUNCHES_PER_COMMAND_MAX} instances"));
        }
        let mut footprint = self.burst.footprint();
        let mut planned = Vec::with_capacity(launches.len());
        for l in launches {
            let Some(t) = config.instance_type(&l.instance_type) else {
                return reject(format!("instance type \"{}\" is not allowed", l.instance_type));
            };
            if l.spot && !config.spot_allowed {
                return reject("spot instances are not allowed".into());
            }
            if self.burst.backoff.get(&(t.name.clone(), l.spot)).is_some_and(|until| now < *until) {
                return reject(format!("instance type \"{}\" is backing off after a capacity error", t.name));
            }
            let extra = Footprint { instances: 1, gpus: t.gpus, hourly_milli: t.price_milli(l.spot) };
            if !self.burst.fits(footprint, extra) {
                return reject(format!(
                    "launching {} would exceed a burst limit (instances {}/{}, GPUs {}/{}, spend {}/{} m$/h)",
                    t.name,
                    footprint.instances + 1,
                    config.max_instances,
                    footprint.gpus + t.gpus,
                    config.max_gpus,
                    footprint.hourly_milli + extra.hourly_milli,
                    config.max_hourly_spend_milli
                ));
            }
            footprint = Footprint {
                instances: footprint.instances + 1,
                gpus: footprint.gpus + t.gpus,
                hourly_milli: footprint.hourly_milli + extra.hourly_milli,
            };
            planned.push((t.clone(), l.spot));
        }
        let intents =
            planned.into_iter().map(|(t, spot)| self.record_launch(&t, spot, reason, now)).collect();
        Outcome::Burst { intents }
    }

    /// Records one launch intent (its subnet taken round-robin) and notes it: the next intent id.
    fn record_launch(&mut self, t: &InstanceType, spot: bool, reason: &str, now: i64) -> u64 {
        self.burst.next_intent += 1;
        let intent = self.burst.next_intent;
        let subnets = &self.burst.config.subnets;
        let subnet = (!subnets.is_empty()).then(|| subnets[(intent as usize) % subnets.len()].clone());
        let instance = BurstInstance {
            intent,
            instance_type: t.name.clone(),
            gpus: t.gpus,
            gpu_model: t.gpu_model.clone(),
            spot,
            price_milli: t.price_milli(spot),
            subnet,
            state: InstanceState::Requested,
            instance_id: None,
            requested_ms: now,
            launched_ms: None,
            ended_ms: None,
            reason: reason.chars().take(256).collect(),
            idle_since_ms: None,
            joined_ms: None,
        };
        let market = if spot { "spot" } else { "on-demand" };
        self.burst.note(now, format!("launch intent {intent}: {} {market} ({})", t.name, instance.reason));
        self.burst.instances.insert(intent, instance);
        intent
    }

    pub(crate) fn burst_launched(&mut self, intent: u64, instance_id: &str, now: i64) -> Outcome {
        if instance_id.is_empty() || instance_id.len() > 64 {
            return Outcome::Rejected(Rejection::Invalid("instance_id: 1 to 64 characters".into()));
        }
        let Some(i) = self.burst.instances.get_mut(&intent) else {
            return Outcome::Rejected(Rejection::NotFound(format!("burst intent {intent} not found")));
        };
        match (i.state, i.instance_id.as_deref()) {
            (InstanceState::Requested, _) => {
                i.state = InstanceState::Launched;
                i.launched_ms = Some(now);
            }
            // Terminated before the launch was confirmed: keep terminating, now by id.
            (InstanceState::Terminating, None) => {}
            (_, Some(id)) if id == instance_id => {
                return Outcome::Ignored(format!("intent {intent} already launched"))
            }
            (state, _) => {
                return Outcome::Ignored(format!("intent {intent} is {}, not requested", state.as_str()))
            }
        }
        i.instance_id = Some(instance_id.to_string());
        let msg = format!("intent {intent}: instance {instance_id} launched");
        self.burst.note(now, msg);
        Outcome::Burst { intents: vec![intent] }
    }

    pub(crate) fn burst_launch_failed(
        &mut self,
        intent: u64,
        reason: &str,
        capacity: bool,
        now: i64,
    ) -> Outcome {
        let Some(i) = self.burst.instances.get_mut(&intent) else {
            return Outcome::Rejected(Rejection::NotFound(format!("burst intent {intent} not found")));
        };
        if i.state != InstanceState::Requested {
            return Outcome::Ignored(format!("intent {intent} is {}, not requested", i.state.as_str()));
        }
        i.state = InstanceState::Gone;
        i.ended_ms = Some(now);
        i.reason = reason.chars().take(256).collect();
        let key = (i.instance_type.clone(), i.spot);
        let msg = format!("intent {intent}: launch failed: {}", i.reason);
        if capacity {
            self.burst.backoff.insert(key, now + crate::burst::CAPACITY_BACKOFF_MS);
        }
        self.burst.note(now, msg);
        self.burst.trim(now);
        Outcome::Burst { intents: vec![intent] }
    }

    pub(crate) fn burst_terminate(&mut self, intent: u64, reason: &str, now: i64) -> Outcome {
        let Some(i) = self.burst.instances.get_mut(&intent) else {
            return Outcome::Rejected(Rejection::NotFound(format!("burst intent {intent} not found")));
        };
        if !matches!(i.state, InstanceState::Requested | InstanceState::Launched) {
            return Outcome::Ignored(format!("intent {intent} is {}", i.state.as_str()));
        }
        i.state = InstanceState::Terminating;
        i.reason = reason.chars().take(256).collect();
        let node = i.node_name();
        let msg = format!("intent {intent}: terminating ({})", i.reason);
        self.burst.note(now, msg);
        // Nothing new starts there.
        if let Some(n) = self.nodes.get_mut(&node).filter(|n| n.state == NodeState::Up) {
            n.state = NodeState::Draining;
            n.reason = "burst instance terminating".into();
        }
        Outcome::Burst { intents: vec![intent] }
    }

    pub(crate) fn burst_gone(&mut self, intent: u64, reason: &str, now: i64) -> Outcome {
        let Some(i) = self.burst.instances.get_mut(&intent) else {
            return Outcome::Rejected(Rejection::NotFound(format!("burst intent {intent} not found")));
        };
        if i.state == InstanceState::Gone {
            return Outcome::Ignored(format!("intent {intent} already gone"));
        }
        i.state = InstanceState::Gone;
        i.ended_ms = Some(now);
        i.reason = reason.chars().take(256).collect();
        let node = i.node_name();
        let msg = format!("intent {intent}: gone ({})", i.reason);
        self.burst.note(now, msg);
        if self.nodes.get(&node).is_some_and(|n| n.state != NodeState::Down) {
            self.node_down(&node, &format!("burst instance gone: {reason}"), now);
        }
        self.burst.trim(now);
        Outcome::Burst { intents: vec![intent] }
    }

    /// Keeps each live burst instance's join time and idle-since time current (run after
    /// every command while burst instances exist; O(live instances)).
    pub(crate) fn track_burst_nodes(&mut self, now: i64) {
        let suspended_nodes: std::collections::BTreeSet<String> = self
            .suspended
            .iter()
            .filter_map(|id| self.jobs.get(id)?.allocation.as_ref().map(|a| a.node.clone()))
            .collect();
        for i in self.burst.instances.values_mut().filter(|i| i.is_live()) {
            let Some(n) = self.nodes.get(&i.node_name()).filter(|n| n.state != NodeState::Down) else {
                i.idle_since_ms = None;
                continue;
            };
            i.joined_ms.get_or_insert(now);
            let idle =
                n.allocated.is_empty() && n.claimed.is_empty() && !suspended_nodes.contains(&n.info.name);
            if idle {
                i.idle_since_ms.get_or_insert(now);
            } else {
                i.idle_since_ms = None;
            }
        }
    }
}

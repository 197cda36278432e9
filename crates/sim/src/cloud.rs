//! The cloud of `kairos sim --burst`: instances that take minutes to boot and join, spot
//! instances the cloud takes back, launches that fail for capacity — in virtual time, drawn
//! from the seed.
//!
//! The decisions are production's: the burst policy (`kairos_burst::decide`) and one round of
//! the leader's reconciler (`kairos_burst::reconcile::round`) run against `SimCloud`, an
//! implementation of the same `Cloud` trait EC2 implements, and their commands go through
//! `ClusterState::apply`, which re-checks every limit. The replay (the engine) turns what
//! the cloud did into events: an instance's agent joins after its boot time; a spot instance gets
//! the two-minute notice (the agent drains its node) and is reclaimed.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::future::Future;
use std::task::{Context, Poll, Waker};

use kairos_burst::provider::{Cloud, CloudError, CloudInstance, LaunchSpec, TypeInfo};
use kairos_scheduler::burst::BurstConfig;
use kairos_scheduler::seeded::SplitMix64;
use serde::Serialize;

/// A spot interruption notice comes this long before the cloud reclaims the instance (EC2's two
/// minutes).
pub const SPOT_NOTICE_MS: i64 = 120_000;

/// How the simulated cloud behaves (the `[sim]` table of a `kairos sim --burst` file).
#[derive(Clone, Debug, PartialEq)]
pub struct CloudModel {
    /// From RunInstances to a joined agent: uniform in [boot_min_ms, boot_max_ms]. Default 3–6
    /// minutes: EC2 reports a GPU instance running within about a minute, and its first boot
    /// then loads the NVIDIA driver and runs the user-data that installs and starts the agent;
    /// cluster autoscalers see 3–6 minutes for a GPU node to become ready.
    pub boot_min_ms: i64,
    pub boot_max_ms: i64,
    /// Spot interruptions per instance-hour (exponential). Default 0.01: an assumption, and a
    /// pessimistic one — the worst band of EC2's Spot Instance Advisor is "over 20 % of
    /// instances interrupted in a month", about 0.0003 an hour.
    pub spot_interruptions_per_hour: f64,
    /// The chance a launch of a type answers InsufficientInstanceCapacity (by type name; the
    /// rest never do).
    pub capacity_errors: BTreeMap<String, f64>,
    /// The reconciler's period (kairosd's `--burst-interval-ms`, 2 s).
    pub interval_ms: i64,
    /// A launched instance the cloud no longer lists is gone after this long (kairosd's
    /// `--burst-vanish-grace-ms`, 2 minutes).
    pub vanish_grace_ms: i64,
}

impl Default for CloudModel {
    fn default() -> Self {
        CloudModel {
            boot_min_ms: 180_000,
            boot_max_ms: 360_000,
            spot_interruptions_per_hour: 0.01,
            capacity_errors: BTreeMap::new(),
            interval_ms: 2_000,
            vanish_grace_ms: 120_000,
        }
    }
}

impl CloudModel {
    pub fn validate(&self) -> Result<(), String> {
        if self.boot_min_ms < 0 || self.boot_max_ms < self.boot_min_ms {
            return Err("sim.boot_min must be at most sim.boot_max".into());
        }
        let rate = self.spot_interruptions_per_hour;
        if !(rate.is_finite() && rate >= 0.0) {
            return Err(format!("sim.spot_interruptions_per_hour: {rate} is not a rate (0 or more)"));
        }
        if let Some((t, p)) = self.capacity_errors.iter().find(|(_, p)| !(0.0..=1.0).contains(*p)) {
            return Err(format!("sim.capacity_errors.{t}: {p} is not a probability (0 to 1)"));
        }
        if self.interval_ms < 100 || self.vanish_grace_ms < 0 {
            return Err("sim.interval must be at least 100 ms".into());
        }
        Ok(())
    }
}

/// A burst configuration and the cloud it meets.
#[derive(Clone, Debug, PartialEq)]
pub struct BurstSetup {
    pub config: BurstConfig,
    pub model: CloudModel,
}

impl BurstSetup {
    /// Whether the configuration holds under `policy` (what `kairos burst config apply` would
    /// answer, e.g. an unknown QoS), and the model is sound.
    pub fn check(&self, policy: &kairos_scheduler::policy::Policy) -> Result<(), String> {
        use kairos_scheduler::{ClusterState, Command, Op, Outcome};
        self.model.validate()?;
        let mut state = ClusterState::new();
        state.apply(&Command {
            skipped_ms: 0,
            now_ms: 0,
            op: Op::SetPolicy { policy: policy.clone(), audit: None },
        });
        let op = Op::SetBurstConfig { config: self.config.clone() };
        match state.apply(&Command { skipped_ms: 0, now_ms: 0, op }) {
            Outcome::Rejected(r) => Err(r.to_string()),
            _ => Ok(()),
        }
    }
}

/// What the burst part of a replay measured (`kairos sim --burst`). JSON keys are an interface.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct BurstReport {
    /// Instances the cloud started.
    pub instances_launched: u64,
    /// Launches the cloud refused (capacity).
    pub launch_failures: u64,
    pub spot_interruptions: u64,
    /// Billed time of every instance (from its launch request to its end), hours.
    pub instance_hours: f64,
    /// Time instances sat joined with nothing running, hours.
    pub idle_instance_hours: f64,
    /// Time instances were billed before their agent joined, hours.
    pub boot_instance_hours: f64,
    pub spend_usd: f64,
    /// Spend per day of the arrival window (while the offered load is offered).
    pub spend_per_day_usd: f64,
    /// Jobs that ran (at least once) on a cloud instance.
    pub cloud_jobs: u64,
    /// GPU time of runs on cloud instances, hours.
    pub cloud_gpu_hours: f64,
}

/// One instance of the simulated cloud.
#[derive(Clone, Debug)]
struct Instance {
    intent: Option<u64>,
    instance_type: String,
    alive: bool,
}

/// An instance the cloud started in the last round: when its agent joins and (spot) when it
/// gets its interruption notice, both after the launch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Started {
    pub intent: u64,
    pub boot_ms: i64,
    pub notice_after_ms: Option<i64>,
}

/// The simulated cloud (`Cloud`): deterministic for its seed.
pub struct SimCloud {
    model: CloudModel,
    inner: RefCell<Inner>,
}

struct Inner {
    rng: SplitMix64,
    next_id: u64,
    instances: BTreeMap<String, Instance>,
    started: Vec<Started>,
}

impl SimCloud {
    pub fn new(model: CloudModel, seed: u64) -> SimCloud {
        let inner = Inner {
            rng: SplitMix64::new(seed ^ 0xC10D_C10D_C10D_C10D),
            next_id: 0,
            instances: BTreeMap::new(),
            started: Vec::new(),
        };
        SimCloud { model, inner: RefCell::new(inner) }
    }

    /// The instances started since the last call.
    pub fn take_started(&self) -> Vec<Started> {
        std::mem::take(&mut self.inner.borrow_mut().started)
    }

    /// Whether intent `intent`'s instance is running.
    pub fn is_alive(&self, intent: u64) -> bool {
        self.inner.borrow().instances.values().any(|i| i.intent == Some(intent) && i.alive)
    }

    /// The cloud takes intent `intent`'s instance back (a spot reclaim).
    pub fn reclaim(&self, intent: u64) {
        for i in self.inner.borrow_mut().instances.values_mut().filter(|i| i.intent == Some(intent)) {
            i.alive = false;
        }
    }
}

/// A uniform draw in [0, 1).
fn unit(rng: &mut SplitMix64) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

impl Cloud for SimCloud {
    async fn launch(&self, spec: &LaunchSpec) -> Result<String, CloudError> {
        let mut inner = self.inner.borrow_mut();
        let p = self.model.capacity_errors.get(&spec.instance_type).copied().unwrap_or(0.0);
        if unit(&mut inner.rng) < p {
            return Err(CloudError::Capacity(format!(
                "InsufficientInstanceCapacity: no {} capacity (simulated)",
                spec.instance_type
            )));
        }
        inner.next_id += 1;
        let id = format!("i-sim{:013x}", inner.next_id);
        let span = (self.model.boot_max_ms - self.model.boot_min_ms) as f64;
        let boot_ms = self.model.boot_min_ms + (unit(&mut inner.rng) * span) as i64;
        let rate = self.model.spot_interruptions_per_hour;
        let notice_after_ms = (spec.spot && rate > 0.0).then(|| {
            let u = unit(&mut inner.rng);
            let hours = -(1.0 - u).ln() / rate;
            (hours * 3_600_000.0).min(1e15) as i64
        });
        inner.started.push(Started { intent: spec.intent, boot_ms, notice_after_ms });
        let instance =
            Instance { intent: Some(spec.intent), instance_type: spec.instance_type.clone(), alive: true };
        inner.instances.insert(id.clone(), instance);
        Ok(id)
    }

    async fn list(&self, _cluster: &str) -> Result<Vec<CloudInstance>, CloudError> {
        let inner = self.inner.borrow();
        Ok(inner
            .instances
            .iter()
            .map(|(id, i)| CloudInstance {
                id: id.clone(),
                intent: i.intent,
                state: if i.alive { "running" } else { "terminated" }.into(),
                instance_type: i.instance_type.clone(),
            })
            .collect())
    }

    async fn terminate(&self, ids: &[String]) -> Result<(), CloudError> {
        let mut inner = self.inner.borrow_mut();
        for id in ids {
            if let Some(i) = inner.instances.get_mut(id) {
                i.alive = false;
            }
        }
        Ok(())
    }

    async fn instance_types(&self, names: &[String]) -> Result<Vec<TypeInfo>, CloudError> {
        Err(CloudError::Invalid(format!("the simulated cloud does not describe instance types ({names:?})")))
    }
}

/// Runs a future that never waits (the simulated cloud answers at once) to its end.
pub fn at_once<F: Future>(future: F) -> Option<F::Output> {
    let mut future = std::pin::pin!(future);
    match future.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => Some(v),
        Poll::Pending => None,
    }
}

/// A cloud node's time: joined, running nothing since `idle_since`.
#[derive(Clone, Debug, Default)]
pub struct NodeTrack {
    pub running: u32,
    pub idle_since: Option<i64>,
    pub idle_ms: i64,
}

impl NodeTrack {
    pub fn joined(now: i64) -> NodeTrack {
        NodeTrack { running: 0, idle_since: Some(now), idle_ms: 0 }
    }

    pub fn start(&mut self, now: i64) {
        if let Some(since) = self.idle_since.take() {
            self.idle_ms += now - since;
        }
        self.running += 1;
    }

    pub fn stop(&mut self, now: i64) {
        self.running = self.running.saturating_sub(1);
        if self.running == 0 {
            self.idle_since.get_or_insert(now);
        }
    }

    /// The node is gone: its open idle time ends now.
    pub fn close(&mut self, now: i64) {
        if let Some(since) = self.idle_since.take() {
            self.idle_ms += now - since;
        }
        self.running = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(intent: u64, instance_type: &str, spot: bool) -> LaunchSpec {
        LaunchSpec {
            cluster: "sim".into(),
            intent,
            instance_type: instance_type.into(),
            spot,
            subnet: None,
            launch_template: "lt".into(),
            user_data: String::new(),
            max_price_milli: None,
        }
    }

    #[test]
    fn launches_draw_boot_times_capacity_errors_and_spot_notices_from_the_seed() {
        let mut model = CloudModel::default();
        model.capacity_errors.insert("scarce".into(), 1.0);
        model.spot_interruptions_per_hour = 1.0;
        let run = |seed| {
            let cloud = SimCloud::new(model.clone(), seed);
            let a = at_once(cloud.launch(&spec(1, "g5", true))).unwrap();
            let b = at_once(cloud.launch(&spec(2, "g5", false))).unwrap();
            let c = at_once(cloud.launch(&spec(3, "scarce", false))).unwrap();
            (a, b, c.is_err(), cloud.take_started())
        };
        let (a, b, scarce_failed, started) = run(7);
        assert!(a.is_ok() && b.is_ok() && scarce_failed);
        assert_eq!(started.len(), 2);
        assert!(started.iter().all(|s| (180_000..=360_000).contains(&s.boot_ms)), "{started:?}");
        assert!(started[0].notice_after_ms.is_some_and(|n| n > 0) && started[1].notice_after_ms.is_none());
        assert_eq!(run(7).3, started, "same seed, same draws");
        assert_ne!(run(8).3, started, "another seed, other draws");
    }

    #[test]
    fn spot_notices_come_at_the_configured_rate() {
        let model = CloudModel { spot_interruptions_per_hour: 2.0, ..CloudModel::default() };
        let cloud = SimCloud::new(model, 3);
        for i in 0..4000 {
            at_once(cloud.launch(&spec(i, "g5", true))).unwrap().unwrap();
        }
        let started = cloud.take_started();
        let mean_h = started.iter().filter_map(|s| s.notice_after_ms).sum::<i64>() as f64
            / started.len() as f64
            / 3_600_000.0;
        assert!((mean_h - 0.5).abs() < 0.05, "mean time to a notice {mean_h} h, not 1/rate");
    }

    #[test]
    fn terminated_and_reclaimed_instances_are_listed_as_not_alive() {
        let cloud = SimCloud::new(CloudModel::default(), 1);
        let a = at_once(cloud.launch(&spec(1, "g5", false))).unwrap().unwrap();
        at_once(cloud.launch(&spec(2, "g5", true))).unwrap().unwrap();
        at_once(cloud.terminate(std::slice::from_ref(&a))).unwrap().unwrap();
        cloud.reclaim(2);
        let listed = at_once(cloud.list("sim")).unwrap().unwrap();
        assert!(listed.iter().all(|i| !i.is_alive()), "{listed:?}");
        assert_eq!((listed.len(), cloud.is_alive(1), cloud.is_alive(2)), (2, false, false));
    }

    #[test]
    fn a_node_track_counts_idle_time_only_while_nothing_runs() {
        let mut t = NodeTrack::joined(0);
        t.start(1_000);
        t.start(2_000);
        t.stop(5_000);
        t.stop(6_000);
        t.close(10_000);
        assert_eq!(t.idle_ms, 1_000 + 4_000);
    }

    #[test]
    fn a_bad_model_is_refused_naming_the_field() {
        let mut m = CloudModel { boot_min_ms: 10, boot_max_ms: 5, ..CloudModel::default() };
        assert!(m.validate().unwrap_err().contains("boot_min"));
        m = CloudModel { spot_interruptions_per_hour: -1.0, ..CloudModel::default() };
        assert!(m.validate().unwrap_err().contains("spot_interruptions_per_hour"));
        m = CloudModel::default();
        m.capacity_errors.insert("t".into(), 1.5);
        assert!(m.validate().unwrap_err().contains("capacity_errors.t"));
    }
}

//! The replay's cloud (`kairos sim --burst`): every `interval` the leader's burst round — the
//! production policy (`kairos_burst::decide`) and reconciler round (`reconcile::round`) against
//! the simulated cloud (`crate::cloud::SimCloud`) — and what the cloud's instances then do: join
//! after their boot time, get a spot notice, are reclaimed.

use std::collections::{BTreeMap, BTreeSet};

use kairos_burst::reconcile::{self, Memory, Settings};
use kairos_scheduler::burst::{node_name, BURST_LABEL};
use kairos_scheduler::model::JobId;
use kairos_scheduler::{Op, Outcome};

use super::{Event, Sim};
use crate::cloud::{at_once, BurstReport, BurstSetup, NodeTrack, SimCloud, SPOT_NOTICE_MS};

/// An instance's billed time: requested, joined, ended.
#[derive(Clone, Copy, Debug, Default)]
struct Span {
    requested_ms: i64,
    joined_ms: Option<i64>,
    ended_ms: Option<i64>,
}

/// The cloud side of a replay.
pub(super) struct CloudSide {
    interval_ms: i64,
    cloud: SimCloud,
    memory: Memory,
    settings: Settings,
    /// Joined cloud nodes by name.
    nodes: BTreeMap<String, NodeTrack>,
    spans: BTreeMap<u64, Span>,
    /// Runs on cloud nodes: (job, attempt) → (node, start, GPUs).
    runs: BTreeMap<(JobId, u32), (String, i64, u32)>,
    jobs: BTreeSet<JobId>,
    gpu_ms: f64,
    launched: u64,
    failures: u64,
    interruptions: u64,
    /// When the next round is due; None while rounds sleep (nothing live, nothing to launch for).
    next_round: Option<i64>,
    /// Spot instances noticed (an agent that joins after its notice drains its node at once).
    noticed: BTreeSet<u64>,
}

impl CloudSide {
    pub(super) fn new(setup: &BurstSetup, seed: u64) -> CloudSide {
        CloudSide {
            interval_ms: setup.model.interval_ms.max(100),
            cloud: SimCloud::new(setup.model.clone(), seed),
            memory: Memory::default(),
            settings: Settings {
                cluster: "sim".into(),
                controllers: vec!["sim:1".into()],
                leak_grace_ms: 120_000,
                vanish_grace_ms: setup.model.vanish_grace_ms,
                join_token: String::new(),
            },
            nodes: BTreeMap::new(),
            spans: BTreeMap::new(),
            runs: BTreeMap::new(),
            jobs: BTreeSet::new(),
            gpu_ms: 0.0,
            launched: 0,
            failures: 0,
            interruptions: 0,
            next_round: None,
            noticed: BTreeSet::new(),
        }
    }

    pub(super) fn is_cloud_node(&self, node: &str) -> bool {
        self.nodes.contains_key(node)
    }

    /// A run starts on cloud node `node`.
    pub(super) fn run_started(&mut self, now: i64, node: &str, job: JobId, attempt: u32, gpus: u32) {
        if let Some(t) = self.nodes.get_mut(node) {
            t.start(now);
            self.runs.insert((job, attempt), (node.to_string(), now, gpus));
            self.jobs.insert(job);
        }
    }

    /// A run on a cloud node ends.
    pub(super) fn run_ended(&mut self, now: i64, job: JobId, attempt: u32) {
        if let Some((node, start, gpus)) = self.runs.remove(&(job, attempt)) {
            self.gpu_ms += ((now - start) * i64::from(gpus)) as f64;
            if let Some(t) = self.nodes.get_mut(&node) {
                t.stop(now);
            }
        }
    }

    /// Cloud node `node` is gone (reclaimed, terminated, down): its runs and idle time end.
    fn node_gone(&mut self, now: i64, node: &str) {
        let ended: Vec<(JobId, u32)> =
            self.runs.iter().filter(|(_, (n, _, _))| n == node).map(|(k, _)| *k).collect();
        for (job, attempt) in ended {
            self.run_ended(now, job, attempt);
        }
        if let Some(t) = self.nodes.get_mut(node) {
            t.close(now);
        }
    }

    /// What the cloud cost and did, up to `end_ms` (the replay's last event); spend per day is
    /// over the arrival window `window_ms` (when the offered load is offered).
    pub(super) fn report(&self, spent_milli: u64, end_ms: i64, window_ms: i64) -> BurstReport {
        let hours = |ms: i64| ms.max(0) as f64 / 3_600_000.0;
        let billed: i64 = self.spans.values().map(|s| s.ended_ms.unwrap_or(end_ms) - s.requested_ms).sum();
        let booting: i64 =
            self.spans.values().map(|s| s.joined_ms.or(s.ended_ms).unwrap_or(end_ms) - s.requested_ms).sum();
        let idle: i64 = self.nodes.values().map(|t| t.idle_ms + t.idle_since.map_or(0, |s| end_ms - s)).sum();
        let spend = spent_milli as f64 / 1000.0;
        BurstReport {
            instances_launched: self.launched,
            launch_failures: self.failures,
            spot_interruptions: self.interruptions,
            instance_hours: hours(billed),
            idle_instance_hours: hours(idle),
            boot_instance_hours: hours(booting),
            spend_usd: spend,
            spend_per_day_usd: spend * 86_400_000.0 / window_ms.max(1) as f64,
            cloud_jobs: self.jobs.len() as u64,
            cloud_gpu_hours: self.gpu_ms / 3_600_000.0,
        }
    }
}

impl Sim<'_> {
    /// The leader's burst round at `now`: decide, reconcile against the simulated cloud, apply
    /// the commands; then the next round, while anything may still change. Whether it acted.
    pub(super) fn burst_round(&mut self, now: i64) -> bool {
        let Some(side) = self.cloud.as_mut() else { return false };
        side.next_round = None;
        let decision = kairos_burst::decide(&self.state, now);
        let burst = self.state.burst.clone();
        let round = reconcile::round(&side.cloud, &burst, &decision, &side.settings, &mut side.memory, now);
        // The simulated cloud answers at once, so the round never waits.
        let (ops, _) = at_once(round).unwrap_or_default();
        let started = side.cloud.take_started();
        side.launched += started.len() as u64;
        for started in started {
            self.push(now + started.boot_ms, Event::Join { intent: started.intent });
            if let Some(after) = started.notice_after_ms {
                self.push(now.saturating_add(after), Event::SpotNotice { intent: started.intent });
            }
        }
        let acted = !ops.is_empty();
        for op in ops {
            self.burst_op(now, op);
        }
        if self.burst_goes_on(now) {
            self.wake_burst(now);
        }
        acted
    }

    /// Schedules the next round one interval on, unless one is due. Rounds sleep while nothing
    /// lives and nothing waits to burst (`burst_goes_on`); any event that changed the state wakes
    /// them, so a sleeping round never misses work and a long quiet replay costs no rounds.
    pub(super) fn wake_burst(&mut self, now: i64) {
        let Some(side) = self.cloud.as_mut().filter(|c| c.next_round.is_none()) else { return };
        let at = now + side.interval_ms;
        side.next_round = Some(at);
        self.push(at, Event::BurstRound);
    }

    /// One command of a burst round, applied, with what it does to the cloud's nodes.
    fn burst_op(&mut self, now: i64, op: Op) {
        let gone = match &op {
            Op::BurstGone { intent, .. } => Some(*intent),
            Op::BurstLaunchFailed { .. } => {
                if let Some(side) = self.cloud.as_mut() {
                    side.failures += 1;
                }
                None
            }
            _ => None,
        };
        let outcome = self.apply_and_follow(now, op);
        let Some(side) = self.cloud.as_mut() else { return };
        if let Some(intent) = gone {
            side.node_gone(now, &node_name(intent));
        }
        if let Outcome::Burst { intents } = outcome {
            for intent in intents {
                let Some(i) = self.state.burst.instances.get(&intent) else { continue };
                let span = side.spans.entry(intent).or_default();
                span.requested_ms = i.requested_ms;
                span.ended_ms = i.ended_ms;
            }
        }
    }

    /// Rounds go on while instances live or the policy would launch for work that only has to
    /// wait longer; otherwise they sleep until an event wakes them.
    fn burst_goes_on(&self, now: i64) -> bool {
        if self.state.burst.live().next().is_some() {
            return true;
        }
        let later = now.saturating_add(self.state.burst.config.min_wait_s.min(1 << 40) as i64 * 1000 + 1);
        !kairos_burst::decide(&self.state, later).launches.is_empty()
    }

    /// A cloud event about an instance the cloud no longer runs (a spot notice drawn for after
    /// its end): it must not move the replay's clock.
    pub(super) fn is_stale(&self, event: Event) -> bool {
        match event {
            Event::SpotNotice { intent } | Event::Reclaim { intent } => {
                self.cloud.as_ref().is_some_and(|c| !c.cloud.is_alive(intent))
            }
            _ => false,
        }
    }

    /// Intent `intent`'s instance has booted: its agent registers its node.
    pub(super) fn burst_join(&mut self, now: i64, intent: u64) -> bool {
        if !self.cloud.as_ref().is_some_and(|c| c.cloud.is_alive(intent)) {
            return false;
        }
        let Some(i) = self.state.burst.instances.get(&intent) else { return false };
        let Some(t) = self.state.burst.config.instance_type(&i.instance_type).cloned() else { return false };
        let name = node_name(intent);
        let labels = [(BURST_LABEL.to_string(), intent.to_string())].into();
        let info = super::node_info(&name, t.gpus, &t.gpu_model, t.cpus, t.memory_mib, labels);
        if matches!(self.apply(now, Op::RegisterNode { info }), Outcome::Rejected(_)) {
            return false;
        }
        let Some(side) = self.cloud.as_mut() else { return false };
        side.nodes.insert(name.clone(), NodeTrack::joined(now));
        side.spans.entry(intent).or_default().joined_ms = Some(now);
        if side.noticed.contains(&intent) {
            self.apply(
                now,
                Op::DrainNode { node: name, reason: "spot interruption notice".into(), keep_runs: false },
            );
        }
        true
    }

    /// A spot instance's interruption notice: its agent drains the node (runs get the checkpoint
    /// signal and requeue); the cloud reclaims it two minutes later.
    pub(super) fn spot_notice(&mut self, now: i64, intent: u64) -> bool {
        let Some(side) = self.cloud.as_mut() else { return false };
        if !side.cloud.is_alive(intent) {
            return false;
        }
        side.interruptions += 1;
        side.noticed.insert(intent);
        self.push(now + SPOT_NOTICE_MS, Event::Reclaim { intent });
        let node = node_name(intent);
        if !self.state.nodes.contains_key(&node) {
            return false;
        }
        let op = Op::DrainNode { node, reason: "spot interruption notice".into(), keep_runs: false };
        self.apply_and_follow(now, op);
        true
    }

    /// The cloud takes a spot instance back: the machine and its runs are gone (the reconciler
    /// notices after its vanish grace).
    pub(super) fn reclaim(&mut self, now: i64, intent: u64) -> bool {
        let Some(side) = self.cloud.as_mut() else { return false };
        side.cloud.reclaim(intent);
        side.node_gone(now, &node_name(intent));
        false
    }
}

#[cfg(test)]
mod tests {
    use kairos_scheduler::burst::{BurstConfig, InstanceType};
    use kairos_scheduler::policy::Policy;

    use crate::cloud::{BurstSetup, CloudModel};
    use crate::engine::{replay_policy, simulate, SimConfig};
    use crate::trace::{TraceJob, TraceNode};
    use crate::Report;

    /// One on-prem GPU held by a long training run that inference may not preempt; five
    /// one-GPU inference jobs of 10 minutes arrive at 10 s.
    fn scenario() -> (Vec<TraceNode>, Vec<TraceJob>, Policy) {
        let nodes =
            vec![TraceNode { name: "n0".into(), gpus: 1, model: "T4".into(), ..TraceNode::default() }];
        let job = |name: &str, submit_s: i64, duration_s: i64, inference: bool| TraceJob {
            name: name.into(),
            submit_ms: submit_s * 1000,
            duration_ms: duration_s * 1000,
            gpus: 1,
            inference,
            ..TraceJob::default()
        };
        let mut jobs = vec![job("train", 0, 20_000, false)];
        jobs.extend((0..5).map(|i| job(&format!("i{i}"), 10, 600, true)));
        let mut policy = replay_policy();
        if let Some(q) = policy.qos.get_mut("inference") {
            q.preempt.clear();
        }
        (nodes, jobs, policy)
    }

    fn setup(max_instances: u32, spot: bool, model: CloudModel) -> BurstSetup {
        let config = BurstConfig {
            enabled: true,
            launch_template: "lt".into(),
            instance_types: vec![InstanceType {
                name: "g5.xlarge".into(),
                gpus: 1,
                gpu_model: "A10G".into(),
                hourly_price_milli: 1_000,
                spot_price_milli: Some(400),
                cpus: 0,
                memory_mib: 0,
            }],
            spot_allowed: spot,
            max_instances,
            max_gpus: max_instances,
            max_hourly_spend_milli: u64::from(max_instances) * 1_000,
            min_wait_s: 60,
            idle_timeout_s: 300,
            qos: ["inference".to_string()].into(),
            ..BurstConfig::default()
        };
        BurstSetup { config, model }
    }

    fn fixed_boot(ms: i64) -> CloudModel {
        CloudModel { boot_min_ms: ms, boot_max_ms: ms, ..CloudModel::default() }
    }

    fn run(burst: Option<BurstSetup>) -> Report {
        let (nodes, jobs, policy) = scenario();
        simulate(&nodes, &jobs, &policy, &SimConfig { burst, ..SimConfig::default() })
    }

    #[test]
    fn burst_runs_waiting_inference_in_the_cloud_within_its_limits_and_pays_for_the_time() {
        let without = run(None);
        assert!(without.burst.is_none());
        assert!(
            without.inference.wait_s.max >= 19_000.0,
            "inference waits for the training GPU: {without:?}"
        );
        let with = run(Some(setup(2, false, fixed_boot(100_000))));
        let b = with.burst.clone().expect("a burst report");
        assert_eq!(with.unfinished, 0);
        // The limit holds: two instances, however many jobs wait; they run all five jobs.
        assert_eq!((b.instances_launched, b.cloud_jobs), (2, 5), "{b:?}");
        // The first start: min_wait 60 s after arrival, a round to commit the intent, a round to
        // launch, 100 s of boot — never before.
        // Two at a time: the five start in three waves, 600 s apart (no relaunch between them).
        let w = &with.inference.wait_s;
        assert!((760.0..775.0).contains(&w.p50) && (1_360.0..1_375.0).contains(&w.max), "{with:?}");
        // Spend is the billed hours at the on-demand price; idle and boot time are part of them.
        assert!((b.spend_usd - b.instance_hours).abs() < 0.01, "{b:?}");
        assert!(b.idle_instance_hours >= 2.0 * 300.0 / 3600.0 - 0.01, "idle until the timeout: {b:?}");
        assert!((b.boot_instance_hours - 2.0 * 102.0 / 3600.0).abs() < 0.01, "{b:?}");
        assert!((b.cloud_gpu_hours - 5.0 * 600.0 / 3600.0).abs() < 0.01, "{b:?}");
        // Same seed, same replay.
        assert_eq!(run(Some(setup(2, false, fixed_boot(100_000)))), with);
    }

    #[test]
    fn spot_instances_the_cloud_takes_back_drain_and_their_jobs_finish_elsewhere() {
        let model = CloudModel { spot_interruptions_per_hour: 3.0, ..fixed_boot(60_000) };
        let with = run(Some(setup(2, true, model)));
        let b = with.burst.clone().expect("a burst report");
        assert!(b.spot_interruptions >= 1 && b.instances_launched > 2, "{b:?}");
        assert_eq!(with.unfinished, 0, "every job finishes: {with:?}");
        // Spot is billed at its price.
        assert!((b.spend_usd - 0.4 * b.instance_hours).abs() < 0.01, "{b:?}");
    }

    #[test]
    fn a_spot_notice_drawn_for_after_its_instance_ended_does_not_move_the_clock() {
        // Two GPUs: one held long, one free early — a partly used node, so the time-weighted
        // fragmentation shows any time added at the end of the replay.
        let (mut nodes, mut jobs, policy) = scenario();
        nodes[0].gpus = 2;
        jobs.push(TraceJob { name: "short".into(), duration_ms: 1_000_000, gpus: 1, ..TraceJob::default() });
        let replay = |spot: bool| {
            let model = CloudModel { spot_interruptions_per_hour: 1e-4, ..fixed_boot(60_000) };
            let config = SimConfig { burst: Some(setup(2, spot, model)), ..SimConfig::default() };
            simulate(&nodes, &jobs, &policy, &config)
        };
        let (spot, on_demand) = (replay(true), replay(false));
        assert_eq!(spot.burst.as_ref().map(|b| b.spot_interruptions), Some(0), "{spot:?}");
        assert!(on_demand.fragmentation > 0.0, "{on_demand:?}");
        assert_eq!(
            (spot.fragmentation, spot.inference.clone()),
            (on_demand.fragmentation, on_demand.inference)
        );
    }

    #[test]
    fn a_cloud_without_capacity_launches_nothing_and_the_replay_still_ends() {
        let mut model = fixed_boot(60_000);
        model.capacity_errors.insert("g5.xlarge".into(), 1.0);
        let with = run(Some(setup(2, false, model)));
        let b = with.burst.clone().expect("a burst report");
        assert_eq!((b.instances_launched, b.cloud_jobs, b.spend_usd), (0, 0, 0.0), "{b:?}");
        assert!(b.launch_failures >= 2, "{b:?}");
        assert_eq!(with.unfinished, 0);
        assert!(with.inference.wait_s.max >= 19_000.0, "{with:?}");
    }

    #[test]
    fn the_forecast_starts_instances_before_min_wait_and_keeps_them_for_the_next_wave() {
        // Two waves of two 10-minute inference jobs, at 10 s and at 1,200 s: after the first,
        // the instances sit idle past idle_timeout (300 s) before the second comes.
        let (nodes, mut jobs, policy) = scenario();
        jobs.truncate(3);
        for (i, j) in jobs.clone().iter().skip(1).enumerate() {
            jobs.push(TraceJob { name: format!("late{i}"), submit_ms: 1_200_000, ..j.clone() });
        }
        let replay = |forecast_window_s: u64| {
            let mut burst = setup(2, false, fixed_boot(100_000));
            burst.config.forecast_window_s = forecast_window_s;
            simulate(&nodes, &jobs, &policy, &SimConfig { burst: Some(burst), ..SimConfig::default() })
        };
        let (without, with) = (replay(0), replay(1_800));
        assert_eq!((without.unfinished, with.unfinished), (0, 0));
        // Without: each wave waits min_wait (60 s) and a boot (100 s); the instances of the
        // first were terminated idle, so the second launches again.
        let (w, b) = (&without.inference.wait_s, without.burst.clone().unwrap());
        assert!(w.p50 >= 160.0 && w.max < 175.0 && b.instances_launched == 4, "{without:?}");
        // With: the first wave waits only the boot; the second finds the instances kept, the
        // forecast still expecting work within its window, and starts at once.
        let (w, b) = (&with.inference.wait_s, with.burst.clone().unwrap());
        assert!(w.p50 < 5.0 && (100.0..110.0).contains(&w.max) && b.instances_launched == 2, "{with:?}");
    }

    #[test]
    fn a_disabled_configuration_changes_nothing() {
        let mut off = setup(2, false, fixed_boot(60_000));
        off.config.enabled = false;
        let with = run(Some(off));
        let mut without = run(None);
        assert_eq!(with.burst.as_ref().map(|b| b.instances_launched), Some(0));
        without.burst = with.burst.clone();
        assert_eq!(with, without);
    }
}

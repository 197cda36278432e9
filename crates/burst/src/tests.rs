//! Policy and reconciler tests: a real `ClusterState` driven by commands, and a fake cloud
//! that records every call.

use std::sync::Mutex;

use kairos_scheduler::burst::{BurstConfig, InstanceState, InstanceType, BURST_LABEL};
use kairos_scheduler::{ClusterState, Command, JobSpec, NodeInfo, Op, Outcome, Profile};

use crate::decision::decide;
use crate::provider::{Cloud, CloudError, CloudInstance, LaunchSpec};
use crate::reconcile::{round, Memory, Settings};

/// A fake H100 node (`kairos_scheduler::testing`) with one CPU, 1 MiB and these labels.
pub(crate) fn node(name: &str, gpus: u32, labels: &[(&str, &str)]) -> NodeInfo {
    let labels = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    NodeInfo { cpus: 1, memory_mib: 1, labels, ..kairos_scheduler::testing::node_info(name, gpus) }
}

pub(crate) fn apply(s: &mut ClusterState, now: i64, op: Op) -> Outcome {
    s.apply(&Command { skipped_ms: 0, now_ms: now, op })
}

pub(crate) fn config() -> BurstConfig {
    BurstConfig {
        enabled: true,
        launch_template: "kairos-burst".into(),
        instance_types: vec![
            InstanceType {
                name: "g.big".into(),
                gpus: 8,
                gpu_model: "A100".into(),
                hourly_price_milli: 32_000,
                spot_price_milli: Some(12_000),
                cpus: 0,
                memory_mib: 0,
            },
            InstanceType {
                name: "g.small".into(),
                gpus: 1,
                gpu_model: "A10G".into(),
                hourly_price_milli: 1_000,
                spot_price_milli: None,
                cpus: 0,
                memory_mib: 0,
            },
            InstanceType {
                name: "g.four".into(),
                gpus: 4,
                gpu_model: "A10G".into(),
                hourly_price_milli: 5_000,
                spot_price_milli: None,
                cpus: 0,
                memory_mib: 0,
            },
        ],
        max_instances: 3,
        max_gpus: 12,
        max_hourly_spend_milli: 20_000,
        min_wait_s: 60,
        idle_timeout_s: 300,
        boot_timeout_s: 600,
        ..BurstConfig::default()
    }
}

/// One on-prem node of 4 GPUs, full of training; `inference` jobs of `gpus` GPUs submitted at 0.
pub(crate) fn saturated(inference: &[u32]) -> ClusterState {
    let mut s = ClusterState::new();
    apply(&mut s, 0, Op::RegisterNode { info: node("onprem", 4, &[]) });
    assert_eq!(apply(&mut s, 0, Op::SetBurstConfig { config: config() }), Outcome::PolicyChanged);
    let mut train = JobSpec::new("t", "alice", vec!["true".into()], 4);
    train.profile = Profile::Training;
    submit(&mut s, train);
    let plan = kairos_scheduler::plan(&s).plan;
    apply(&mut s, 0, Op::ApplyPlan { plan });
    for g in inference {
        let mut spec = JobSpec::new("i", "bob", vec!["true".into()], *g);
        spec.profile = Profile::Inference;
        submit(&mut s, spec);
    }
    s
}

pub(crate) fn submit(s: &mut ClusterState, spec: JobSpec) -> u64 {
    match apply(s, 0, Op::Submit { spec, request_id: None, hold: false, limits: None }) {
        Outcome::Submitted { job } => job,
        other => panic!("{other:?}"),
    }
}

#[test]
fn bursts_only_past_min_wait_and_picks_the_cheapest_type_per_gpu_that_fits() {
    let s = saturated(&[1, 1, 3]);
    assert!(decide(&s, 59_000).launches.is_empty(), "min_wait not reached");
    let d = decide(&s, 60_000);
    // The 3-GPU job: g.four (1.25 $/GPU-h) beats g.big (4) and g.small cannot hold it; one
    // 1-GPU job fits in its spare GPU, the other gets a g.small.
    let types: Vec<(&str, bool)> = d.launches.iter().map(|l| (l.instance_type.as_str(), l.spot)).collect();
    assert_eq!(types, vec![("g.four", false), ("g.small", false)], "{d:?}");
    // A model constraint is honoured.
    let mut s = saturated(&[]);
    let mut spec = JobSpec::new("i", "bob", vec!["true".into()], 2);
    spec.profile = Profile::Inference;
    spec.gpu_model = Some("A100".into());
    submit(&mut s, spec);
    let d = decide(&s, 60_000);
    assert!(d.launches.is_empty(), "g.big on-demand (32 $/h) is over the 20 $/h limit");
    assert!(d.held_back.unwrap().contains("limit reached"));
    let mut cfg = config();
    cfg.spot_allowed = true;
    apply(&mut s, 0, Op::SetBurstConfig { config: cfg });
    let d = decide(&s, 60_000);
    let types: Vec<(&str, bool)> = d.launches.iter().map(|l| (l.instance_type.as_str(), l.spot)).collect();
    assert_eq!(types, vec![("g.big", true)], "spot at 12 $/h fits");
}

#[test]
fn a_job_bursts_only_to_a_type_with_its_cpus_and_memory() {
    // g.small has 1 GPU but only 8 CPUs; g.four 48 CPUs and 192 GiB.
    let mut cfg = config();
    cfg.instance_types[1].cpus = 8;
    cfg.instance_types[2].cpus = 48;
    cfg.instance_types[2].memory_mib = 192 << 10;
    cfg.instance_types[0].memory_mib = 128 << 10;
    let mut s = saturated(&[]);
    apply(&mut s, 0, Op::SetBurstConfig { config: cfg });
    let mut spec = JobSpec::new("i", "bob", vec!["true".into()], 1);
    spec.profile = Profile::Inference;
    spec.cpus = 16;
    submit(&mut s, spec.clone());
    let d = decide(&s, 60_000);
    let types: Vec<&str> = d.launches.iter().map(|l| l.instance_type.as_str()).collect();
    assert_eq!(types, vec!["g.four"], "the cheap 1-GPU type lacks the CPUs: {d:?}");
    // A second such job fits in the coming g.four's spare GPUs and CPUs; one needing more
    // memory than any type has is refused at submit, saying so.
    submit(&mut s, spec.clone());
    spec.mem_mib = 256 << 10;
    let refused = apply(&mut s, 0, Op::Submit { spec, request_id: None, hold: false, limits: None });
    assert!(matches!(&refused, Outcome::Rejected(r) if r.to_string().contains("262144 MiB")), "{refused:?}");
    let d = decide(&s, 60_000);
    assert_eq!(d.launches.len(), 1, "{d:?}");
}

#[test]
fn nothing_bursts_below_saturation_or_for_training() {
    let mut s = ClusterState::new();
    apply(&mut s, 0, Op::RegisterNode { info: node("onprem", 4, &[]) });
    apply(&mut s, 0, Op::SetBurstConfig { config: config() });
    let mut spec = JobSpec::new("i", "bob", vec!["true".into()], 2);
    spec.profile = Profile::Inference;
    submit(&mut s, spec);
    // Larger than any on-prem node, yet accepted: a burst instance type can hold it.
    let mut spec = JobSpec::new("i", "bob", vec!["true".into()], 8);
    spec.profile = Profile::Inference;
    submit(&mut s, spec);
    let d = decide(&s, 100_000);
    assert!(d.launches.is_empty());
    assert!(d.held_back.unwrap().contains("only 0% allocated"), "below the 90% threshold");
    let s = {
        let mut s = saturated(&[]);
        let mut t = JobSpec::new("t2", "alice", vec!["true".into()], 1);
        t.profile = Profile::Training;
        submit(&mut s, t);
        s
    };
    assert!(decide(&s, 100_000).launches.is_empty(), "training never bursts by default");
}

#[test]
fn limits_cap_the_launches_and_apply_refuses_a_proposal_beyond_them() {
    // Twelve 4-GPU jobs: max_gpus 12 allows three g.four at most.
    let mut s = saturated(&[4; 12]);
    let d = decide(&s, 60_000);
    assert_eq!(d.launches.len(), 3, "{d:?}");
    assert!(d.held_back.as_deref().unwrap_or("").contains("limit reached"), "{d:?}");
    let out = apply(&mut s, 60_000, Op::BurstLaunch { launches: d.launches.clone(), reason: "t".into() });
    assert!(matches!(out, Outcome::Burst { ref intents } if intents.len() == 3), "{out:?}");
    // A stale or forged proposal for one more is refused whole.
    let out =
        apply(&mut s, 60_001, Op::BurstLaunch { launches: d.launches[..1].to_vec(), reason: "t".into() });
    assert!(matches!(out, Outcome::Rejected(_)), "{out:?}");
    assert_eq!(s.burst.footprint().gpus, 12);
    assert!(decide(&s, 60_002).launches.is_empty(), "capacity on its way covers the demand it can");
}

#[test]
fn idle_and_never_joined_instances_are_terminated_and_only_launched_nodes_may_join() {
    let mut s = saturated(&[1]);
    let d = decide(&s, 60_000);
    apply(&mut s, 60_000, Op::BurstLaunch { launches: d.launches, reason: "t".into() });
    apply(&mut s, 60_001, Op::BurstLaunched { intent: 1, instance_id: "i-1".into() });
    // A node pretending to be another intent is refused; the real one joins.
    let fake = node("burst-7", 1, &[(BURST_LABEL, "7")]);
    assert!(matches!(apply(&mut s, 60_002, Op::RegisterNode { info: fake }), Outcome::Rejected(_)));
    let real = node("burst-1", 1, &[(BURST_LABEL, "1")]);
    assert!(matches!(apply(&mut s, 70_000, Op::RegisterNode { info: real }), Outcome::NodeRegistered { .. }));
    // The inference job runs there (only burstable jobs may), then ends; the node idles.
    let plan = kairos_scheduler::plan(&s).plan;
    assert_eq!(plan.placements.len(), 1);
    assert_eq!(plan.placements[0].node, "burst-1");
    apply(&mut s, 70_001, Op::ApplyPlan { plan });
    apply(
        &mut s,
        80_000,
        Op::JobExited {
            job: 2,
            attempt: 0,
            node: "burst-1".into(),
            exit: kairos_scheduler::RunExit::Code(0),
        },
    );
    assert_eq!(s.burst.instances[&1].idle_since_ms, Some(80_000));
    assert!(decide(&s, 379_999).terminate.is_empty());
    assert_eq!(decide(&s, 380_000).terminate.len(), 1, "idle_timeout reached");
    // An instance whose agent never joins is terminated after boot_timeout.
    let mut s = saturated(&[1]);
    let d = decide(&s, 60_000);
    apply(&mut s, 60_000, Op::BurstLaunch { launches: d.launches, reason: "t".into() });
    assert!(decide(&s, 659_999).terminate.is_empty());
    assert!(decide(&s, 660_000).terminate[0].1.contains("did not join"));
}

/// A cloud in memory: records launches, can run out of capacity for a type.
#[derive(Default)]
struct FakeCloud {
    instances: Mutex<Vec<CloudInstance>>,
    launches: Mutex<Vec<LaunchSpec>>,
    no_capacity: Mutex<Vec<String>>,
}

impl Cloud for FakeCloud {
    async fn launch(&self, spec: &LaunchSpec) -> Result<String, CloudError> {
        if self.no_capacity.lock().unwrap().contains(&spec.instance_type) {
            return Err(CloudError::Capacity("InsufficientInstanceCapacity".into()));
        }
        self.launches.lock().unwrap().push(spec.clone());
        let mut all = self.instances.lock().unwrap();
        let id = format!("i-{}", all.len() + 1);
        all.push(CloudInstance {
            id: id.clone(),
            intent: Some(spec.intent),
            state: "running".into(),
            instance_type: spec.instance_type.clone(),
        });
        Ok(id)
    }
    async fn list(&self, _cluster: &str) -> Result<Vec<CloudInstance>, CloudError> {
        Ok(self.instances.lock().unwrap().clone())
    }
    async fn terminate(&self, ids: &[String]) -> Result<(), CloudError> {
        for i in self.instances.lock().unwrap().iter_mut().filter(|i| ids.contains(&i.id)) {
            i.state = "terminated".into();
        }
        Ok(())
    }
    async fn instance_types(&self, _names: &[String]) -> Result<Vec<crate::provider::TypeInfo>, CloudError> {
        Ok(Vec::new())
    }
}

fn settings() -> Settings {
    Settings {
        cluster: "c1".into(),
        controllers: vec!["10.0.0.1:7001".into()],
        leak_grace_ms: 10_000,
        vanish_grace_ms: 30_000,
        join_token: "kairos-join.it's-secret".into(),
    }
}

async fn run_round(
    cloud: &FakeCloud,
    s: &mut ClusterState,
    memory: &mut Memory,
    now: i64,
) -> crate::reconcile::Report {
    let decision = decide(s, now);
    let (ops, report) = round(cloud, &s.burst, &decision, &settings(), memory, now).await;
    for op in ops {
        apply(s, now, op);
    }
    report
}

#[tokio::test]
async fn intents_are_committed_then_launched_once_and_a_new_leader_adopts_instead_of_relaunching() {
    let cloud = FakeCloud::default();
    let mut s = saturated(&[4]);
    let mut memory = Memory::default();
    // Round 1 commits the intent only; round 2 launches it.
    run_round(&cloud, &mut s, &mut memory, 60_000).await;
    assert_eq!(s.burst.instances[&1].state, InstanceState::Requested);
    assert!(cloud.launches.lock().unwrap().is_empty());
    let r = run_round(&cloud, &mut s, &mut memory, 61_000).await;
    assert_eq!(r.launched, vec![(1, "i-1".to_string())]);
    let spec = cloud.launches.lock().unwrap()[0].clone();
    assert_eq!(spec.client_token(), "kairos-c1-1");
    let ud = &spec.user_data;
    assert!(ud.contains("name = \"burst-1\"") && ud.contains("controllers = \"10.0.0.1:7001\""), "{ud}");
    assert!(ud.contains(r"printf '%s\n' 'kairos-join.it'\''s-secret' > /etc/kairos/join.token"));
    assert!(ud.contains("join_token_file = \"/etc/kairos/join.token\""));
    // The advertised address comes from the instance metadata; the unit restarts the agent.
    assert!(
        ud.contains("advertise_addr = \"$ip:7101\"") && ud.contains("latest/meta-data/local-ipv4"),
        "{ud}"
    );
    assert!(
        ud.contains(crate::reconcile::AGENT_UNIT)
            && ud.contains("systemctl enable --now kairos-agent.service")
    );
    // The leader died after RunInstances but before committing: its successor sees the intent
    // still Requested, finds the instance by tag and adopts it.
    let mut lost = s.clone();
    lost.burst.instances.get_mut(&1).unwrap().state = InstanceState::Requested;
    lost.burst.instances.get_mut(&1).unwrap().instance_id = None;
    let r = run_round(&cloud, &mut lost, &mut Memory::default(), 62_000).await;
    assert_eq!(r.adopted, vec![(1, "i-1".to_string())]);
    assert_eq!(cloud.launches.lock().unwrap().len(), 1, "never launched twice");
    assert_eq!(lost.burst.instances[&1].instance_id.as_deref(), Some("i-1"));
}

#[tokio::test]
async fn leaks_are_terminated_after_a_grace_and_capacity_errors_fall_back() {
    let cloud = FakeCloud::default();
    let mut s = saturated(&[]);
    let mut memory = Memory::default();
    cloud.instances.lock().unwrap().push(CloudInstance {
        id: "i-leak".into(),
        intent: Some(99),
        state: "running".into(),
        instance_type: "g.big".into(),
    });
    assert!(run_round(&cloud, &mut s, &mut memory, 0).await.leaks.is_empty(), "within the grace");
    let r = run_round(&cloud, &mut s, &mut memory, 10_000).await;
    assert_eq!(r.leaks, vec!["i-leak".to_string()]);
    assert_eq!(cloud.instances.lock().unwrap()[0].state, "terminated");
    // g.four has no capacity: the launch fails, that type backs off, the next decision picks
    // another type that fits.
    let mut s = saturated(&[4]);
    cloud.no_capacity.lock().unwrap().push("g.four".into());
    let mut cfg = config();
    cfg.max_hourly_spend_milli = 40_000;
    apply(&mut s, 0, Op::SetBurstConfig { config: cfg });
    run_round(&cloud, &mut s, &mut memory, 60_000).await;
    run_round(&cloud, &mut s, &mut memory, 60_500).await;
    assert_eq!(s.burst.instances[&1].state, InstanceState::Gone);
    run_round(&cloud, &mut s, &mut memory, 61_000).await;
    assert_eq!(s.burst.instances[&2].instance_type, "g.big");
}

#[tokio::test]
async fn why_burst_holds_back_is_noted_once_for_the_status() {
    let cloud = FakeCloud::default();
    let mut s = saturated(&[4; 12]);
    let mut memory = Memory::default();
    run_round(&cloud, &mut s, &mut memory, 60_000).await;
    let noted = |s: &ClusterState| {
        s.burst.decisions.iter().filter(|(_, m)| m.starts_with("held back: limit reached")).count()
    };
    assert_eq!(noted(&s), 1, "{:?}", s.burst.decisions);
    run_round(&cloud, &mut s, &mut memory, 61_000).await;
    run_round(&cloud, &mut s, &mut memory, 62_000).await;
    assert_eq!(noted(&s), 1, "not again while nothing changed: {:?}", s.burst.decisions);
}

#[tokio::test]
async fn a_spot_launch_is_capped_at_the_price_it_was_planned_with() {
    let cloud = FakeCloud::default();
    let mut s = saturated(&[8]);
    let mut cfg = config();
    cfg.spot_allowed = true;
    assert_eq!(apply(&mut s, 0, Op::SetBurstConfig { config: cfg }), Outcome::PolicyChanged);
    let mut memory = Memory::default();
    run_round(&cloud, &mut s, &mut memory, 60_000).await;
    run_round(&cloud, &mut s, &mut memory, 61_000).await;
    let spec = cloud.launches.lock().unwrap()[0].clone();
    assert!(spec.spot, "{spec:?}");
    // The 12 $/h spot price the limits were checked with is the most the instance may cost.
    assert_eq!(spec.max_price_milli, Some(12_000));
    assert_eq!(s.burst.instances[&1].price_milli, 12_000);
}

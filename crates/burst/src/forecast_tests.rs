//! The policy's look-ahead, warm pool and scale-down hysteresis, on a real `ClusterState`.

use kairos_scheduler::burst::{BurstConfig, BURST_LABEL};
use kairos_scheduler::{ClusterState, JobSpec, Op, Outcome, Profile, RunExit};

use crate::decision::decide;
use crate::tests::{apply, config, node, saturated, submit};

fn set(s: &mut ClusterState, cfg: BurstConfig) {
    assert_eq!(apply(s, 0, Op::SetBurstConfig { config: cfg }), Outcome::PolicyChanged);
}

fn inference(s: &mut ClusterState, gpus: u32) -> u64 {
    let mut spec = JobSpec::new("i", "bob", vec!["true".into()], gpus);
    spec.profile = Profile::Inference;
    submit(s, spec)
}

/// Launches what `decide` proposes at `now`, confirms them and lets their agents join.
fn launch_and_join(s: &mut ClusterState, now: i64) -> Vec<u64> {
    let d = decide(s, now);
    let Outcome::Burst { intents } =
        apply(s, now, Op::BurstLaunch { launches: d.launches, reason: "t".into() })
    else {
        panic!("launch refused")
    };
    for &i in &intents {
        let gpus = s.burst.instances[&i].gpus;
        apply(s, now, Op::BurstLaunched { intent: i, instance_id: format!("i-{i}") });
        let info = node(&format!("burst-{i}"), gpus, &[(BURST_LABEL, &i.to_string())]);
        assert!(matches!(apply(s, now, Op::RegisterNode { info }), Outcome::NodeRegistered { .. }));
    }
    intents
}

#[test]
fn the_forecast_launches_before_min_wait_and_only_beyond_free_on_prem_gpus() {
    let forecast = BurstConfig { forecast_window_s: 600, ..config() };
    // Saturated: two 1-GPU inference jobs just came and no on-prem GPU is free.
    let mut s = saturated(&[1, 1]);
    assert!(decide(&s, 1_000).launches.is_empty(), "without a forecast, min_wait (60 s) gates");
    set(&mut s, forecast.clone());
    let d = decide(&s, 1_000);
    let types: Vec<&str> = d.launches.iter().map(|l| l.instance_type.as_str()).collect();
    assert_eq!(types, ["g.small", "g.small"], "the cheapest per GPU that fits the largest job: {d:?}");
    assert!(d.launch_reason.contains("forecast: 2 burstable GPUs expected over 600s"), "{d:?}");
    // Once they are on their way, the forecast is covered: nothing more.
    launch_and_join(&mut s, 1_000);
    assert!(decide(&s, 2_000).launches.is_empty());
    // Free on-prem GPUs absorb the forecast: a half-empty cluster (threshold 0 so it counts as
    // saturated) with 2 expected GPUs and 4 free launches nothing; with 6 expected, 2 GPUs' worth.
    let mut s = ClusterState::new();
    apply(&mut s, 0, Op::RegisterNode { info: node("onprem", 4, &[]) });
    set(&mut s, BurstConfig { saturation_pct: 0, ..forecast });
    inference(&mut s, 1);
    inference(&mut s, 1);
    assert!(decide(&s, 1_000).launches.is_empty());
    for _ in 0..4 {
        inference(&mut s, 1);
    }
    assert_eq!(decide(&s, 1_000).launches.len(), 2);
    // The window ends: jobs older than it are not expected again (the waiting ones still are
    // served, by min_wait's rule, which a pass would have placed here anyway).
    let d = decide(&s, 601_000);
    assert!(!d.launch_reason.contains("forecast"), "{d:?}");
}

#[test]
fn the_warm_pool_stays_idle_while_saturated_within_the_limits_and_goes_after() {
    let pool = BurstConfig { min_idle_instances: 1, ..config() };
    assert!(BurstConfig { min_idle_instances: 4, ..config() }
        .validate()
        .unwrap_err()
        .contains("min_idle_instances"));
    let mut s = saturated(&[]);
    set(&mut s, pool.clone());
    let d = decide(&s, 0);
    assert!(d.launch_reason.contains("warm pool: 0 of 1 instances idle"), "{d:?}");
    let intents = launch_and_join(&mut s, 0);
    assert_eq!(intents, [1]);
    // Idle far past idle_timeout (300 s), it is kept, and no second one is launched.
    let d = decide(&s, 3_600_000);
    assert!(d.launches.is_empty() && d.terminate.is_empty(), "{d:?}");
    // A job takes the warm instance: the pool is empty again, so another one is launched.
    inference(&mut s, 1);
    let plan = kairos_scheduler::plan(&s).plan;
    assert_eq!(plan.placements[0].node, "burst-1", "the job takes the warm instance");
    apply(&mut s, 3_600_000, Op::ApplyPlan { plan });
    assert_eq!(decide(&s, 3_600_001).launches.len(), 1);
    // The pool counts against the limits like any instance: no room, no warm instance.
    set(&mut s, BurstConfig { max_hourly_spend_milli: 1_500, ..pool });
    let d = decide(&s, 3_600_001);
    assert!(d.launches.is_empty() && d.held_back.unwrap().contains("limit reached"));
    // Not saturated any more (the training job ends): the idle instance goes after idle_timeout.
    apply(
        &mut s,
        3_600_002,
        Op::JobExited { job: 1, attempt: 0, node: "onprem".into(), exit: RunExit::Code(0) },
    );
    apply(
        &mut s,
        3_600_003,
        Op::JobExited { job: 2, attempt: 0, node: "burst-1".into(), exit: RunExit::Code(0) },
    );
    assert!(decide(&s, 3_600_003 + 299_999).terminate.is_empty());
    assert_eq!(decide(&s, 3_600_003 + 300_000).terminate, [(1, "idle for 300s".to_string())]);
}

#[test]
fn idle_instances_stay_while_the_forecast_expects_work_and_never_go_in_a_launching_decision() {
    let mut s = saturated(&[1]);
    set(&mut s, BurstConfig { forecast_window_s: 600, ..config() });
    launch_and_join(&mut s, 1_000);
    let plan = kairos_scheduler::plan(&s).plan;
    apply(&mut s, 1_000, Op::ApplyPlan { plan });
    apply(
        &mut s,
        80_000,
        Op::JobExited { job: 2, attempt: 0, node: "burst-1".into(), exit: RunExit::Code(0) },
    );
    // Idle past idle_timeout at 380 s, but the job that came at 0 is expected again until
    // the window (600 s) passes.
    assert!(decide(&s, 380_000).terminate.is_empty());
    assert_eq!(decide(&s, 600_000).terminate.len(), 1);
    // Without a forecast: a decision that launches terminates nothing, the next one does.
    set(&mut s, config());
    let mut spec = JobSpec::new("i", "bob", vec!["true".into()], 3);
    spec.profile = Profile::Inference;
    submit(&mut s, spec);
    let d = decide(&s, 600_000);
    assert_eq!((d.launches.len(), d.terminate.len()), (1, 0), "{d:?}");
    apply(&mut s, 600_000, Op::BurstLaunch { launches: d.launches, reason: "t".into() });
    assert_eq!(decide(&s, 600_001).terminate.len(), 1);
}

#[test]
fn instances_launched_ahead_fit_one_real_job_not_a_mix_of_several() {
    // One type has the CPUs, the other the GPUs and memory; no type has all three.
    let mut cfg = BurstConfig { forecast_window_s: 600, max_instances: 3, ..config() };
    cfg.instance_types = vec![
        kairos_scheduler::burst::InstanceType {
            cpus: 64,
            memory_mib: 16 << 10,
            ..cfg.instance_types[1].clone()
        },
        kairos_scheduler::burst::InstanceType {
            cpus: 8,
            memory_mib: 512 << 10,
            ..cfg.instance_types[2].clone()
        },
    ];
    let mut s = saturated(&[]);
    set(&mut s, cfg);
    let mut cpu_heavy = JobSpec::new("i", "bob", vec!["true".into()], 1);
    cpu_heavy.profile = Profile::Inference;
    cpu_heavy.cpus = 48;
    submit(&mut s, cpu_heavy);
    let mut big = JobSpec::new("i", "bob", vec!["true".into()], 4);
    big.profile = Profile::Inference;
    big.mem_mib = 300 << 10;
    submit(&mut s, big);
    let d = decide(&s, 1_000);
    assert!(!d.launches.is_empty() && d.launches.iter().all(|l| l.instance_type == "g.four"), "{d:?}");
}

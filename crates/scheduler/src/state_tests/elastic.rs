//! Elastic jobs and gangs: shrinking for a preemptor, growing back.

use super::*;

#[test]
fn an_elastic_job_shrinks_for_a_preemptor_and_grows_back_afterwards() {
    let mut s = cluster(4);
    let mut sp = spec(4, "training");
    sp.min_gpus = Some(2);
    let elastic = start(&mut s, sp, 0);
    let urgent = submitted(s.apply(&cmd(
        60_000,
        Op::Submit { spec: spec(2, "urgent"), request_id: None, hold: false, limits: None },
    )));
    let p = preempt(&mut s, 60_000);
    assert_eq!(p.victims, vec![elastic]);
    assert_eq!(
        s.jobs[&elastic].allocation.as_ref().unwrap().stop,
        Some(StopReason::Resize { by: Some(urgent) })
    );
    assert_eq!(s.preemptions.back().unwrap().action(), "shrink");
    let kept: Vec<u32> = (0..4).filter(|g| !p.gpus.contains(g)).collect();
    // The victim checkpoints and exits; it comes back on the GPUs it kept, the urgent job on
    // the others, both in the next pass.
    s.apply(&cmd(
        61_000,
        Op::JobExited { job: elastic, attempt: 0, node: "n1".into(), exit: RunExit::Code(0) },
    ));
    let j = &s.jobs[&elastic];
    assert_eq!((j.state, j.attempt, j.gpus()), (JobState::Pending, 1, 2));
    s.check_invariants().unwrap();
    let Outcome::PlanApplied { accepted, .. } = run_plan(&mut s, 61_001) else { panic!() };
    assert_eq!(accepted, vec![urgent, elastic], "by priority");
    assert_eq!(s.jobs[&elastic].allocation.as_ref().unwrap().gpus, kept);
    s.apply(&cmd(61_002, Op::JobStarted { job: elastic, attempt: 1, node: "n1".into() }));
    assert!(plan(&s).grow.is_empty(), "nothing is free");
    // The urgent job ends: the elastic job grows back to its full size (one more restart).
    s.apply(&cmd(
        90_000,
        Op::JobExited { job: urgent, attempt: 0, node: "n1".into(), exit: RunExit::Code(0) },
    ));
    let grow = plan(&s).grow;
    assert_eq!(
        grow.iter().map(|g| (g.job, g.attempt, g.gpus.clone())).collect::<Vec<_>>(),
        vec![(elastic, 1, vec![0, 1, 2, 3])]
    );
    let (job, attempt, gpus) = (grow[0].job, grow[0].attempt, grow[0].gpus.clone());
    // While a job waits for resources, nothing grows.
    let mut busy = s.clone();
    busy.apply(&cmd(
        90_000,
        Op::Submit { spec: spec(4, "batch"), request_id: None, hold: false, limits: None },
    ));
    assert!(plan(&busy).grow.is_empty());
    assert!(matches!(
        s.apply(&cmd(90_001, Op::Resize { job, attempt, gpus: gpus.clone(), more: Vec::new() })),
        Outcome::RunUpdated { .. }
    ));
    assert!(
        matches!(
            s.apply(&cmd(90_002, Op::Resize { job, attempt, gpus, more: Vec::new() })),
            Outcome::Rejected(_)
        ),
        "once"
    );
    s.check_invariants().unwrap();
    // The freed GPUs are claimed for it while it restarts.
    let other = submitted(s.apply(&cmd(
        90_003,
        Op::Submit { spec: spec(2, "batch"), request_id: None, hold: false, limits: None },
    )));
    let Outcome::PlanApplied { accepted, .. } = run_plan(&mut s, 90_004) else { panic!() };
    assert!(accepted.is_empty());
    s.apply(&cmd(
        91_000,
        Op::JobExited { job: elastic, attempt: 1, node: "n1".into(), exit: RunExit::Code(0) },
    ));
    let Outcome::PlanApplied { accepted, .. } = run_plan(&mut s, 91_001) else { panic!() };
    assert_eq!(accepted, vec![elastic]);
    let j = &s.jobs[&elastic];
    assert_eq!((j.attempt, j.gpus(), j.allocation.as_ref().unwrap().gpus.len()), (2, 4, 4));
    assert_eq!(plan(&s).pending.get(&other), Some(&PendingReason::Resources));
    s.check_invariants().unwrap();
}

#[test]
fn growing_back_respects_qos_limits() {
    let mut s = cluster(4);
    let mut policy = s.policy.clone();
    policy.qos.get_mut("training").unwrap().user_gpus = Some(3);
    s.apply(&cmd(0, Op::SetPolicy { policy, audit: None }));
    let mut sp = spec(3, "training");
    sp.min_gpus = Some(1);
    let elastic = start(&mut s, sp, 0);
    // Pretend an earlier shrink: it runs on 2 GPUs, one more would be within the limit...
    let mut shrunk = s.clone();
    shrunk.jobs.get_mut(&elastic).unwrap().width = Some(2);
    let a = shrunk.jobs.get_mut(&elastic).unwrap().allocation.as_mut().unwrap();
    let dropped = a.gpus.pop().unwrap();
    shrunk.nodes.get_mut("n1").unwrap().allocated.remove(&dropped);
    shrunk.check_invariants().unwrap();
    assert_eq!(plan(&shrunk).grow.len(), 1);
    // ...but not once the limit is lower than that.
    let mut policy = shrunk.policy.clone();
    policy.qos.get_mut("training").unwrap().user_gpus = Some(2);
    shrunk.apply(&cmd(1, Op::SetPolicy { policy, audit: None }));
    assert!(plan(&shrunk).grow.is_empty());
    let gpus = vec![0, 1, 2];
    assert!(matches!(
        shrunk.apply(&cmd(2, Op::Resize { job: elastic, attempt: 0, gpus, more: Vec::new() })),
        Outcome::Rejected(_)
    ));
}

#[test]
fn bad_elastic_and_checkpoint_specs_are_rejected_and_change_nothing() {
    use crate::validate::ValidationError;
    let mut s = cluster(4);
    let mut sp = spec(2, "training");
    sp.min_gpus = Some(3);
    assert_eq!(crate::validate_spec(&sp), Err(ValidationError::BadMinGpus { min: 3, gpus: 2 }));
    sp.min_gpus = Some(0);
    assert!(crate::validate_spec(&sp).is_err());
    sp.min_gpus = Some(1);
    sp.tasks = 2;
    assert_eq!(crate::validate_spec(&sp), Err(ValidationError::ElasticGang));
    let mut sp = spec(2, "training");
    sp.checkpoint_signal = Some("SIGKILL".into());
    assert!(matches!(crate::validate_spec(&sp), Err(ValidationError::BadCheckpointSignal(_))));
    assert_eq!(crate::validate::checkpoint_signal("usr2"), Ok("SIGUSR2"));
    assert!(crate::validate::checkpoint_signal("SIGBOGUS").is_err());
    // The QoS grace is the most a job may ask for.
    let mut sp = spec(2, "training");
    sp.checkpoint_grace_s = Some(301);
    let before = s.clone();
    let out = s.apply(&cmd(5, Op::Submit { spec: sp.clone(), request_id: None, hold: false, limits: None }));
    assert!(
        matches!(&out, Outcome::Rejected(Rejection::Invalid(m)) if m.contains("checkpoint.grace_s")),
        "{out:?}"
    );
    assert_eq!(s.jobs, before.jobs);
    sp.checkpoint_grace_s = Some(300);
    submitted(s.apply(&cmd(6, Op::Submit { spec: sp, request_id: None, hold: false, limits: None })));
}

#[test]
fn an_elastic_gang_releases_a_node_for_a_preemptor_and_grows_back_onto_a_free_one() {
    let mut s = ClusterState::new();
    for n in ["n1", "n2", "n3"] {
        s.apply(&cmd(1, Op::RegisterNode { info: node_info(n, 2) }));
    }
    let mut sp = spec(2, "training");
    sp.tasks = 3;
    sp.min_tasks = Some(2);
    let gang =
        submitted(s.apply(&cmd(2, Op::Submit { spec: sp, request_id: None, hold: false, limits: None })));
    run_plan(&mut s, 2);
    let nodes: Vec<String> =
        s.jobs[&gang].allocation.as_ref().unwrap().tasks().map(|(_, n, _)| n.to_string()).collect();
    for n in &nodes {
        s.apply(&cmd(3, Op::JobStarted { job: gang, attempt: 0, node: n.clone() }));
    }
    let urgent = submitted(s.apply(&cmd(
        60_000,
        Op::Submit { spec: spec(2, "urgent"), request_id: None, hold: false, limits: None },
    )));
    let p = preempt(&mut s, 60_000);
    assert_eq!(p.victims, vec![gang]);
    assert_eq!(
        s.jobs[&gang].allocation.as_ref().unwrap().stop,
        Some(StopReason::Resize { by: Some(urgent) })
    );
    assert_eq!(s.preemptions.back().unwrap().action(), "shrink");
    // Every rank checkpoints and exits; the gang comes back on the two nodes it kept.
    for n in &nodes {
        s.apply(&cmd(
            61_000,
            Op::JobExited { job: gang, attempt: 0, node: n.clone(), exit: RunExit::Code(0) },
        ));
    }
    let j = &s.jobs[&gang];
    assert_eq!((j.state, j.attempt, j.tasks()), (JobState::Pending, 1, 2));
    s.check_invariants().unwrap();
    let Outcome::PlanApplied { accepted, .. } = run_plan(&mut s, 61_001) else { panic!() };
    assert_eq!(accepted, vec![urgent, gang]);
    let kept: Vec<&str> = s.jobs[&gang].allocation.as_ref().unwrap().tasks().map(|(_, n, _)| n).collect();
    assert!(!kept.contains(&p.node.as_str()) && kept.len() == 2, "{kept:?} / {}", p.node);
    s.check_invariants().unwrap();
    // Below its minimum it is not preempted again.
    let _ = submitted(s.apply(&cmd(
        62_000,
        Op::Submit { spec: spec(2, "urgent"), request_id: None, hold: false, limits: None },
    )));
    assert!(plan(&s).preemption.is_none(), "2 nodes is its minimum");
    s.apply(&cmd(62_001, Op::Cancel { job: urgent + 1, by: "a".into() }));
    // The urgent job ends: the gang grows back onto the freed node.
    s.apply(&cmd(
        90_000,
        Op::JobExited { job: urgent, attempt: 0, node: p.node.clone(), exit: RunExit::Code(0) },
    ));
    let grow = plan(&s).grow;
    assert_eq!(grow.len(), 1);
    assert_eq!(grow[0].more.len(), 2, "{grow:?}");
    let g = grow[0].clone();
    let op = Op::Resize { job: g.job, attempt: g.attempt, gpus: g.gpus, more: g.more };
    assert!(matches!(s.apply(&cmd(90_001, op.clone())), Outcome::RunUpdated { .. }));
    assert!(matches!(s.apply(&cmd(90_002, op)), Outcome::Rejected(_)), "once");
    s.check_invariants().unwrap();
    let ranks: Vec<String> =
        s.jobs[&gang].allocation.as_ref().unwrap().tasks().map(|(_, n, _)| n.to_string()).collect();
    for n in &ranks {
        s.apply(&cmd(
            91_000,
            Op::JobExited { job: gang, attempt: 1, node: n.clone(), exit: RunExit::Code(0) },
        ));
    }
    let Outcome::PlanApplied { accepted, .. } = run_plan(&mut s, 91_001) else { panic!() };
    assert_eq!(accepted, vec![gang]);
    let j = &s.jobs[&gang];
    assert_eq!((j.attempt, j.tasks(), j.allocation.as_ref().unwrap().task_count()), (2, 3, 3));
    s.check_invariants().unwrap();
}

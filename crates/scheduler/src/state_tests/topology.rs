//! Topology-aware placement: required and preferred asks, the `Topology` reason, apply's
//! re-check, a cluster's default for gangs, and backfill around a gang's one-rack reservation.

use std::collections::{BTreeMap, BTreeSet};

use super::*;
use crate::topology::{Topology, TopologyAsk};

/// Two racks of three 8-GPU nodes: n1–n3 in r1, n4–n6 in r2.
fn racks() -> ClusterState {
    let mut s = ClusterState::new();
    for i in 1..=6 {
        let mut info = node_info(&format!("n{i}"), 8);
        info.labels.insert("rack".into(), if i <= 3 { "r1" } else { "r2" }.into());
        s.apply(&cmd(1, Op::RegisterNode { info }));
    }
    s
}

fn gang(s: &mut ClusterState, tasks: u32, gpus: u32, topology: Option<&str>) -> u64 {
    let mut sp = spec(gpus, "batch");
    sp.tasks = tasks;
    sp.time_limit_s = Some(3600);
    sp.topology = topology.map(|t| Box::new(TopologyAsk::parse(t).unwrap()));
    submitted(s.apply(&cmd(2, Op::Submit { spec: sp, request_id: None, hold: false, limits: None })))
}

fn one_node_job(s: &mut ClusterState, gpus: u32, limit_s: u64) -> u64 {
    let mut sp = spec(gpus, "inference");
    sp.time_limit_s = Some(limit_s);
    submitted(s.apply(&cmd(2, Op::Submit { spec: sp, request_id: None, hold: false, limits: None })))
}

/// A job holding all of `node`'s GPUs (placed there by hand).
fn occupy(s: &mut ClusterState, node: &str) -> u64 {
    let job = one_node_job(s, 8, 600);
    let p = Placement::single(job, node.into(), (0..8).collect());
    s.apply(&cmd(3, Op::ApplyPlan { plan: Plan { placements: vec![p] } }));
    assert_eq!(s.jobs[&job].state, JobState::Running);
    job
}

fn nodes_of(s: &ClusterState, job: u64) -> Vec<String> {
    s.jobs[&job]
        .allocation
        .as_ref()
        .map(|a| a.tasks().map(|(_, n, _)| n.to_string()).collect())
        .unwrap_or_default()
}

fn rack_of(node: &str) -> &'static str {
    if node.trim_start_matches('n').parse::<u32>().unwrap() <= 3 {
        "r1"
    } else {
        "r2"
    }
}

fn allocated_event(s: &ClusterState, job: u64) -> String {
    s.jobs[&job]
        .events
        .iter()
        .rev()
        .find(|e| e.kind == "allocated")
        .map(|e| e.message.clone())
        .unwrap_or_default()
}

#[test]
fn a_required_gang_lands_in_one_rack_waits_naming_the_largest_and_starts_when_a_node_frees() {
    let mut s = racks();
    // One node of each rack busy: no rack has three free.
    let busy_a = occupy(&mut s, "n1");
    occupy(&mut s, "n4");
    let g = gang(&mut s, 3, 8, Some("rack=required"));
    let out = plan(&s);
    assert!(out.plan.placements.iter().all(|p| p.job != g));
    let reason = out.pending[&g].to_string();
    assert!(reason.starts_with("Topology: no rack has 3 nodes free for it (the most: rack r"), "{reason}");
    assert!(reason.ends_with(", 2)"), "{reason}");
    // A node of the first job's rack frees: the gang starts inside that rack.
    let node = nodes_of(&s, busy_a)[0].clone();
    s.apply(&cmd(4, Op::JobStarted { job: busy_a, attempt: 0, node: node.clone() }));
    s.apply(&cmd(5, Op::JobExited { job: busy_a, attempt: 0, node: node.clone(), exit: RunExit::Code(0) }));
    run_plan(&mut s, 6);
    let placed = nodes_of(&s, g);
    assert_eq!(placed.len(), 3);
    assert!(placed.iter().all(|n| rack_of(n) == rack_of(&node)), "{placed:?}");
    assert!(
        allocated_event(&s, g).ends_with(&format!("; rack {}", rack_of(&node))),
        "{}",
        allocated_event(&s, g)
    );
    assert_eq!((s.gang_spread.placed, s.gang_spread.spread), (1, 0));
}

#[test]
fn a_preferred_gang_starts_at_once_across_racks_and_says_so() {
    let mut s = racks();
    occupy(&mut s, "n2");
    occupy(&mut s, "n5");
    let g = gang(&mut s, 3, 8, Some("rack=preferred"));
    run_plan(&mut s, 4);
    let racks: BTreeSet<&str> = nodes_of(&s, g).iter().map(|n| rack_of(n)).collect();
    assert_eq!(racks.len(), 2);
    assert!(allocated_event(&s, g).contains("racks r1, r2 (preferred"), "{}", allocated_event(&s, g));
    // Three nodes fit one rack: two racks is one more than needed.
    assert_eq!((s.gang_spread.placed, s.gang_spread.spread), (1, 1));
}

/// A plan placing 2-task gang `job` on n1 (rack r1) and n4 (rack r2).
fn across_racks(job: u64) -> Plan {
    let whole = || (0..8).collect();
    let more = vec![crate::model::TaskPlacement { node: "n4".into(), gpus: whole() }];
    Plan { placements: vec![Placement { job, node: "n1".into(), gpus: whole(), more }] }
}

#[test]
fn apply_refuses_a_plan_that_spreads_a_required_gang() {
    let mut s = racks();
    let g = gang(&mut s, 2, 8, Some("rack=required"));
    match s.apply(&cmd(3, Op::ApplyPlan { plan: across_racks(g) })) {
        Outcome::PlanApplied { accepted, rejected } => {
            assert!(accepted.is_empty());
            assert!(rejected[0].1.contains("span 2 racks"), "{rejected:?}");
        }
        other => panic!("{other:?}"),
    }
    // The same plan for a preferred gang is accepted.
    let p = gang(&mut s, 2, 8, Some("rack"));
    let out = s.apply(&cmd(3, Op::ApplyPlan { plan: across_racks(p) }));
    assert!(matches!(out, Outcome::PlanApplied { ref accepted, .. } if accepted == &[p]), "{out:?}");
}

#[test]
fn with_named_levels_a_gang_goes_into_the_fullest_rack_that_holds_it() {
    let mut s = racks();
    let levels = Topology { levels: vec!["rack".into()], ..Default::default() };
    assert_eq!(s.apply(&cmd(2, Op::SetTopology { topology: levels })), Outcome::TopologyChanged);
    // r1 keeps two nodes free, r2 three: a 2-node gang takes r1's two, not half of r2.
    one_node_job(&mut s, 8, 600);
    run_plan(&mut s, 3);
    let g = gang(&mut s, 2, 8, None);
    run_plan(&mut s, 4);
    let racks: BTreeSet<&str> = nodes_of(&s, g).iter().map(|n| rack_of(n)).collect();
    assert_eq!(racks.len(), 1, "{:?}", nodes_of(&s, g));
    // And with the busy node in r1 (the first, tightest), r1's other two hold the gang.
    assert_eq!(racks.into_iter().next(), Some("r1"));
}

#[test]
fn a_bad_topology_or_ask_is_refused_and_changes_nothing() {
    let mut s = racks();
    let mut t = Topology { levels: vec!["rack".into(), "block".into()], ..Default::default() };
    let place = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs.iter().map(|(l, d)| (l.to_string(), d.to_string())).collect()
    };
    t.nodes.insert("n1".into(), place(&[("rack", "r1"), ("block", "b1")]));
    t.nodes.insert("n2".into(), place(&[("rack", "r1"), ("block", "b2")]));
    assert!(matches!(
        s.apply(&cmd(2, Op::SetTopology { topology: t })),
        Outcome::Rejected(Rejection::Invalid(_))
    ));
    assert!(s.topology.is_empty());
    let mut sp = spec(8, "batch");
    sp.topology =
        Some(Box::new(TopologyAsk { max_domains: 0, ..TopologyAsk::parse("rack=required").unwrap() }));
    let out = s.apply(&cmd(2, Op::Submit { spec: sp, request_id: None, hold: false, limits: None }));
    assert!(matches!(out, Outcome::Rejected(Rejection::Invalid(_))), "{out:?}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// With a required-topology gang at the top waiting, the reservation lies inside one rack,
    /// and every 1-GPU job started beside it either ends before the reserved start or touches
    /// none of the reserved GPUs.
    #[test]
    fn backfill_never_takes_a_waiting_gangs_rack_gpus_past_its_start(
        rack_sizes in proptest::collection::vec(2usize..5, 2..4),
        busy in proptest::collection::vec((0usize..16, 1u32..5, 60u64..7200), 1..12),
        smalls in proptest::collection::vec(60u64..7200, 1..24),
    ) {
        let mut s = ClusterState::new();
        let mut names = Vec::new();
        for (r, size) in rack_sizes.iter().enumerate() {
            for k in 0..*size {
                let name = format!("r{r}n{k}");
                let mut info = node_info(&name, 4);
                info.labels.insert("rack".into(), format!("r{r}"));
                s.apply(&cmd(1, Op::RegisterNode { info }));
                names.push(name);
            }
        }
        // Jobs already running on some nodes, with their own time limits.
        for (node, gpus, limit) in busy {
            let job = one_node_job(&mut s, gpus, limit);
            let at = &names[node % names.len()];
            let free: Vec<u32> = (0..4).filter(|g| !s.nodes[at].allocated.contains_key(g)).take(gpus as usize).collect();
            if free.len() == gpus as usize {
                let p = Placement::single(job, at.clone(), free);
                s.apply(&cmd(2, Op::ApplyPlan { plan: Plan { placements: vec![p] } }));
            } else {
                s.apply(&cmd(2, Op::Cancel { job, by: "alice".into() }));
            }
        }
        // The gang asks for more nodes than any rack has free: it must wait for a reservation.
        let largest = *rack_sizes.iter().max().unwrap() as u32;
        let g = gang(&mut s, largest, 4, Some("rack=required"));
        let mut small_ids = Vec::new();
        for limit in &smalls {
            let mut sp = spec(1, "batch");
            sp.time_limit_s = Some(*limit);
            small_ids.push(submitted(s.apply(&cmd(3, Op::Submit { spec: sp, request_id: None, hold: false, limits: None }))));
        }
        let out = plan(&s);
        if out.plan.placements.iter().any(|p| p.job == g) {
            return Ok(());
        }
        let Some(res) = out.reservation.clone().filter(|r| r.job == g) else { return Ok(()) };
        let reserved: BTreeSet<(String, u32)> = std::iter::once((res.node.clone(), &res.gpus))
            .chain(res.more.iter().map(|t| (t.node.clone(), &t.gpus)))
            .flat_map(|(n, gs)| gs.iter().map(move |g| (n.clone(), *g)))
            .collect();
        let racks: BTreeSet<&str> = reserved.iter().map(|(n, _)| &n[..2]).collect();
        prop_assert_eq!(racks.len(), 1, "reservation spans racks: {:?}", reserved);
        for p in out.plan.placements.iter().filter(|p| small_ids.contains(&p.job)) {
            let ends = s.now_ms + s.jobs[&p.job].spec.time_limit_s.unwrap() as i64 * 1000;
            let touches = p.gpus.iter().any(|g| reserved.contains(&(p.node.clone(), *g)));
            prop_assert!(!touches || ends <= res.start_ms, "job {} on {} {:?} ends {} after {}", p.job, p.node, p.gpus, ends, res.start_ms);
        }
    }
}

#[test]
fn a_gang_no_rack_could_ever_hold_is_named_never_available_and_holds_nothing_back() {
    let mut s = racks();
    // Racks of three: four nodes in one rack, or a level no node has, never come.
    let wide = gang(&mut s, 4, 8, Some("rack=required"));
    let typo = gang(&mut s, 2, 8, Some("rakc=required"));
    let small = one_node_job(&mut s, 1, 60);
    let out = plan(&s);
    let reason = out.pending[&wide].to_string();
    assert!(
        reason.starts_with("ReqNodeNotAvail: no rack has 4 nodes for it (the largest: rack r1, 3)"),
        "{reason}"
    );
    assert_eq!(out.pending[&typo].to_string(), "ReqNodeNotAvail: no node it may use has a rakc");
    assert!(
        out.plan.placements.iter().any(|p| p.job == small),
        "the job behind them starts: {:?}",
        out.pending
    );
}

#[test]
fn a_single_task_with_a_required_ask_may_run_on_a_node_of_no_domain() {
    let mut s = ClusterState::new();
    s.apply(&cmd(1, Op::RegisterNode { info: node_info("bare", 8) }));
    let mut sp = spec(2, "batch");
    sp.topology = Some(Box::new(TopologyAsk::parse("rack=required").unwrap()));
    let job =
        submitted(s.apply(&cmd(2, Op::Submit { spec: sp, request_id: None, hold: false, limits: None })));
    run_plan(&mut s, 3);
    assert_eq!(s.jobs[&job].state, JobState::Running, "one node is one place");
}

//! Team guarantees: borrowing idle GPUs, reclaim through the borrowers' preempt mode, never a
//! team below its guarantee, borrow and lend limits.

use super::*;
use crate::policy::Guarantee;

/// Accounts a (alice) and b (bob), each guaranteed `gpus`.
fn teams(s: &mut ClusterState, gpus: u32, borrow_limit: Option<u32>, lend_limit: Option<u32>) {
    let mut policy = two_accounts();
    for a in ["a", "b"] {
        policy.accounts.get_mut(a).unwrap().guarantee = Some(Guarantee { gpus, borrow_limit, lend_limit });
    }
    assert_eq!(s.apply(&cmd(1, Op::SetPolicy { policy, audit: None })), Outcome::PolicyChanged);
}

fn job_of(user: &str, gpus: u32) -> crate::model::JobSpec {
    let mut sp = spec(gpus, "training");
    sp.user = user.into();
    sp.account = if user == "alice" { "a" } else { "b" }.into();
    sp
}

fn submit(s: &mut ClusterState, sp: crate::model::JobSpec, now: i64) -> u64 {
    submitted(s.apply(&cmd(now, Op::Submit { spec: sp, request_id: None, hold: false, limits: None })))
}

fn borrowing(s: &ClusterState, id: u64) -> bool {
    s.jobs[&id].allocation.as_ref().expect("running").borrowing
}

/// Two 4-GPU nodes; a guaranteed 4, b guaranteed 4; a runs four 2-GPU jobs (two borrowing).
fn a_borrows_half() -> (ClusterState, Vec<u64>) {
    let mut s = ClusterState::new();
    s.apply(&cmd(1, Op::RegisterNode { info: node_info("n1", 4) }));
    s.apply(&cmd(1, Op::RegisterNode { info: node_info("n2", 4) }));
    teams(&mut s, 4, None, None);
    let ids: Vec<u64> = (0..4).map(|i| start(&mut s, job_of("alice", 2), 1000 + i)).collect();
    (s, ids)
}

#[test]
fn a_team_borrows_idle_gpus_and_gives_back_exactly_what_it_borrowed() {
    let (mut s, a_jobs) = a_borrows_half();
    let marks: Vec<bool> = a_jobs.iter().map(|id| borrowing(&s, *id)).collect();
    assert_eq!(marks, [false, false, true, true], "the first two within the guarantee, the rest borrow");
    let event = s.jobs[&a_jobs[3]].events.iter().find(|e| e.kind == "allocated").unwrap().message.clone();
    assert!(event.contains("borrowing: account a holds 8 GPUs, 4 guaranteed"), "{event}");
    // The jobs are past their exempt time; b asks for its guarantee, two jobs of 2.
    let t = 10 * 60_000;
    let b1 = submit(&mut s, job_of("bob", 2), t);
    let b2 = submit(&mut s, job_of("bob", 2), t);
    let first = preempt(&mut s, t);
    assert_eq!(first.preemptor, b1);
    // The second preemption comes with the next pass, while the first victim still stops.
    let second = preempt(&mut s, t + 1);
    assert_eq!(second.preemptor, b2);
    let mut victims: Vec<u64> = first.victims.iter().chain(&second.victims).copied().collect();
    victims.sort_unstable();
    assert_eq!(victims, vec![a_jobs[2], a_jobs[3]], "exactly the two borrowers");
    // A third b job would be beyond b's guarantee: it reclaims nothing more.
    submit(&mut s, job_of("bob", 2), t + 2);
    assert!(plan(&s).preemption.is_none(), "a keeps its guarantee");
    let records: Vec<(Option<&str>, u32)> =
        s.preemptions.iter().map(|r| (r.reclaimed_for.as_deref(), r.reclaimed_gpus)).collect();
    assert_eq!(records, [(Some("b"), 2), (Some("b"), 2)]);
    // The victims stop (their checkpoints done), requeue; b's jobs start on the claims.
    for (i, v) in victims.iter().enumerate() {
        let node = s.jobs[v].allocation.as_ref().unwrap().node.clone();
        let exit = RunExit::Signal(15);
        s.apply(&cmd(t + 10 + i as i64, Op::JobExited { job: *v, attempt: 0, node, exit }));
        assert_eq!(s.jobs[v].state, JobState::Pending);
    }
    let Outcome::PlanApplied { accepted, .. } = run_plan(&mut s, t + 20) else { panic!() };
    assert_eq!(accepted, vec![b1, b2]);
    assert!(!borrowing(&s, b1) && !borrowing(&s, b2));
    let a_gpus: u32 =
        a_jobs.iter().filter(|id| s.jobs[id].state == JobState::Running).map(|id| s.jobs[id].gpus()).sum();
    assert_eq!(a_gpus, 4, "a keeps 4 GPUs");
    s.check_invariants().unwrap();
}

#[test]
fn guaranteed_jobs_queue_before_borrowers_and_a_borrow_limit_caps_a_team() {
    let mut s = ClusterState::new();
    s.apply(&cmd(1, Op::RegisterNode { info: node_info("n1", 8) }));
    teams(&mut s, 2, Some(2), None);
    // a: 4 GPUs (2 guaranteed + 2 borrowed) reach its borrow limit.
    start(&mut s, job_of("alice", 4), 1000);
    let over = submit(&mut s, job_of("alice", 1), 2000);
    let out = plan(&s);
    assert_eq!(out.pending[&over], PendingReason::AccountBorrowLimit("a".into()));
    // A forged plan over the borrow limit is refused by apply.
    let forged = Plan { placements: vec![Placement::single(over, "n1".into(), vec![4])] };
    let Outcome::PlanApplied { accepted, .. } = s.apply(&cmd(2001, Op::ApplyPlan { plan: forged })) else {
        panic!()
    };
    assert!(accepted.is_empty());
    // b's guaranteed job goes before a borrower of a that is older and asks as much.
    let _ = s.apply(&cmd(2002, Op::Cancel { job: over, by: "alice".into() }));
    let mut policy = s.policy.clone();
    policy.accounts.get_mut("a").unwrap().guarantee.as_mut().unwrap().borrow_limit = None;
    s.apply(&cmd(2003, Op::SetPolicy { policy, audit: None }));
    let a_borrow = submit(&mut s, job_of("alice", 4), 3000);
    let b_job = submit(&mut s, job_of("bob", 2), 3001);
    let Outcome::PlanApplied { accepted, .. } = run_plan(&mut s, 3002) else { panic!() };
    assert_eq!(accepted, vec![b_job], "b first; a's 4 more do not fit beside it");
    assert_eq!(plan(&s).pending[&a_borrow], PendingReason::Resources);
    s.check_invariants().unwrap();
}

#[test]
fn a_lend_limit_keeps_idle_guaranteed_gpus_for_their_team() {
    let mut s = ClusterState::new();
    s.apply(&cmd(1, Op::RegisterNode { info: node_info("n1", 8) }));
    // Each lends at most 1 of its idle 4.
    teams(&mut s, 4, None, Some(1));
    start(&mut s, job_of("alice", 4), 1000);
    // a's 4 are its own; one more borrows b's: b keeps 3 of its idle 4.
    let borrow = submit(&mut s, job_of("alice", 2), 2000);
    assert_eq!(plan(&s).pending[&borrow], PendingReason::LendLimit);
    let one = submit(&mut s, job_of("alice", 1), 2001);
    let Outcome::PlanApplied { accepted, .. } = run_plan(&mut s, 2002) else { panic!() };
    assert_eq!(accepted, vec![one]);
    // b's own job takes its 3 at once.
    let b_job = submit(&mut s, job_of("bob", 3), 2003);
    let Outcome::PlanApplied { accepted, .. } = run_plan(&mut s, 2004) else { panic!() };
    assert_eq!(accepted, vec![b_job]);
}

#[test]
fn another_teams_preemption_never_takes_a_team_below_its_guarantee() {
    let (mut s, a_jobs) = a_borrows_half();
    // a's borrowers end: a holds exactly its guarantee.
    for id in &a_jobs[2..] {
        let node = s.jobs[id].allocation.as_ref().unwrap().node.clone();
        let exit = RunExit::Code(0);
        s.apply(&cmd(5000, Op::JobExited { job: *id, attempt: 0, node, exit }));
    }
    // An urgent job of b may preempt training by QoS — but not a's guaranteed jobs.
    let mut urgent = job_of("bob", 4);
    urgent.qos = "urgent".into();
    let t = 10 * 60_000;
    let u = submit(&mut s, urgent, t);
    // Four GPUs are free (n2): it starts there without preempting anything.
    let Outcome::PlanApplied { accepted, .. } = run_plan(&mut s, t) else { panic!() };
    assert_eq!(accepted, vec![u]);
    let mut more = job_of("bob", 2);
    more.qos = "urgent".into();
    let m = submit(&mut s, more, t + 1);
    assert!(plan(&s).preemption.is_none(), "a holds no more than its guarantee");
    // A forged preemption of a guaranteed job by another team is refused by apply.
    let victim = a_jobs[0];
    let node = s.jobs[&victim].allocation.as_ref().unwrap().node.clone();
    let gpus = s.jobs[&victim].allocation.as_ref().unwrap().gpus.clone();
    let op = Op::Preempt { preemptor: m, node, victims: vec![victim], gpus };
    let out = s.apply(&cmd(t + 2, op));
    assert!(
        matches!(&out, Outcome::Rejected(Rejection::FailedPrecondition(m)) if m.contains("guarantee")),
        "{out:?}"
    );
    assert_eq!(s.jobs[&victim].state, JobState::Running);
}

#[test]
fn the_headroom_is_never_refilled_below_a_teams_guarantee() {
    let mut s = ClusterState::new();
    s.apply(&cmd(1, Op::RegisterNode { info: node_info("n1", 4) }));
    teams(&mut s, 4, None, None);
    let mut policy = s.policy.clone();
    policy.qos.get_mut("inference").unwrap().headroom_gpus = 2;
    s.apply(&cmd(2, Op::SetPolicy { policy, audit: None }));
    // a's training took the whole node (the headroom's 2 too, before it was set): its guarantee.
    let mut policy = s.policy.clone();
    policy.qos.get_mut("inference").unwrap().headroom_gpus = 0;
    s.apply(&cmd(3, Op::SetPolicy { policy: policy.clone(), audit: None }));
    let ids: Vec<u64> = (0..2).map(|i| start(&mut s, job_of("alice", 2), 1000 + i)).collect();
    policy.qos.get_mut("inference").unwrap().headroom_gpus = 2;
    s.apply(&cmd(4000, Op::SetPolicy { policy, audit: None }));
    let t = 10 * 60_000;
    assert!(s.headroom_shortfall() > 0);
    assert!(plan(&s).vacate.is_empty(), "a holds no more than its guarantee");
    let out = s.apply(&cmd(t, Op::Vacate { victims: vec![ids[0]] }));
    assert!(
        matches!(&out, Outcome::Rejected(Rejection::FailedPrecondition(m)) if m.contains("guarantee")),
        "{out:?}"
    );
}

#[test]
fn a_cpu_only_job_reclaims_nothing_and_an_ancestor_s_borrow_limit_binds_its_children() {
    let (mut s, _) = a_borrows_half();
    let mut cpu = job_of("bob", 0);
    cpu.cpus = 8;
    let id = submit(&mut s, cpu, 10 * 60_000);
    assert!(!crate::state::reclaims(&s.guarantees(), &s.jobs[&id]), "a CPU-only job takes back no GPU");
    // A parent guaranteed 4 that may not borrow bounds its child, guaranteed 2 or not.
    let mut s = ClusterState::new();
    s.apply(&cmd(1, Op::RegisterNode { info: node_info("n1", 8) }));
    let mut policy = two_accounts();
    policy.accounts.get_mut("a").unwrap().guarantee =
        Some(Guarantee { gpus: 4, borrow_limit: Some(0), lend_limit: None });
    let mut child = policy.accounts["b"].clone();
    child.name = "a1".into();
    child.parent = Some("a".into());
    child.guarantee = Some(Guarantee { gpus: 2, borrow_limit: None, lend_limit: None });
    policy.accounts.insert("a1".into(), child);
    s.apply(&cmd(1, Op::SetPolicy { policy, audit: None }));
    start(&mut s, job_of("alice", 4), 1000);
    let mut sp = job_of("bob", 2);
    sp.account = "a1".into();
    let j = submit(&mut s, sp, 2000);
    assert_eq!(plan(&s).pending[&j], PendingReason::AccountBorrowLimit("a".into()));
}

mod world {
    use super::*;
    use crate::testing::teams::{check_caps, check_preemption, run, world, OwedWatch, World};

    proptest! {
        #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

        /// Random clusters, teams and job streams through the real proposer and apply: no team
        /// is preempted below its guarantee by another, no team stays owed past the grace
        /// plus two rounds while others' borrowers hold GPUs it could take, no cap is passed.
        #[test]
        fn guarantees_are_honoured_within_the_bound(w in world()) {
            if let Err(e) = run(&w) {
                prop_assert!(false, "{e}");
            }
        }
    }

    /// The worlds reclaim: over a fixed set of generated worlds, some preemptions were
    /// reclaims (else the property above would hold vacuously).
    #[test]
    fn the_generated_worlds_reclaim() {
        use proptest::strategy::ValueTree;
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        let strategy = world();
        let mut reclaims = 0;
        for _ in 0..64 {
            let w = strategy.new_tree(&mut runner).expect("a world").current();
            let s = run(&w).expect("no violation");
            reclaims += s.preemptions.iter().filter(|r| r.reclaimed_for.is_some()).count();
        }
        assert!(reclaims > 0, "no world reclaimed a GPU");
    }

    /// Each checker fed its violation.
    #[test]
    fn the_checkers_catch_their_violations() {
        let (mut s, a_jobs) = a_borrows_half();
        // a's borrowers end: taking any of a's jobs for b leaves a below its guarantee.
        for id in &a_jobs[2..] {
            let node = s.jobs[id].allocation.as_ref().unwrap().node.clone();
            s.apply(&cmd(5000, Op::JobExited { job: *id, attempt: 0, node, exit: RunExit::Code(0) }));
        }
        let b = submit(&mut s, job_of("bob", 2), 6000);
        assert!(check_preemption(&s, Some(b), &[a_jobs[0]]).unwrap_err().contains("leaving a 2 of its 4"));
        // A cap: a's borrow limit set below what it holds.
        let mut policy = s.policy.clone();
        let g = policy.accounts.get_mut("a").unwrap().guarantee.as_mut().unwrap();
        g.gpus = 2;
        g.borrow_limit = Some(1);
        s.policy = policy;
        assert!(check_caps(&s).unwrap_err().contains("team a holds 4 GPUs"));
        // Owed: b waits within its guarantee while a borrows runs b could take, round after round.
        let (mut s, _) = a_borrows_half();
        submit(&mut s, job_of("bob", 2), 10 * 60_000);
        let mut watch = OwedWatch::new(6000);
        let late = (0..20).find_map(|round| watch.observe(&s, round * 1000).err()).expect("a violation");
        assert!(late.contains("team b owed GPUs since 0 ms, still at 7000 ms"), "{late}");
        // A world is a world: one job that fits runs without a violation.
        let w = World {
            nodes: vec![2],
            teams: vec![(Some(1), None), (None, None)],
            jobs: vec![(0, 0, 2, false)],
        };
        assert!(run(&w).is_ok());
    }
}

//! Reservations: backfill into the gap before a window, the runs on its resources stopped when
//! it opens, only its access list inside it, GPU counts bound to the GPUs that stop fewest runs,
//! repeating windows, and apply refusing every plan that breaks one of these.

use super::*;
use crate::reservation::{Repeat, Reservation};

/// Applies everything the leader proposes at `now` (tick, time limits, the plan), then
/// reports every placed run started.
fn step(s: &mut ClusterState, now: i64) {
    let ops = crate::propose::propose(s, now, &Default::default(), 30);
    for op in ops {
        s.apply(&cmd(now, op));
    }
    let placed: Vec<(u64, u32, String)> = s
        .jobs
        .values()
        .filter(|j| j.state == JobState::Pending)
        .filter_map(|j| j.allocation.as_ref().map(|a| (j.id, j.attempt, a.node.clone())))
        .collect();
    for (job, attempt, node) in placed {
        s.apply(&cmd(now, Op::JobStarted { job, attempt, node }));
    }
}

fn submit(s: &mut ClusterState, sp: crate::model::JobSpec, now: i64) -> Outcome {
    s.apply(&cmd(now, Op::Submit { spec: sp, request_id: None, hold: false, limits: None }))
}

fn job(gpus: u32, limit_s: Option<u64>, user: &str) -> crate::model::JobSpec {
    let mut sp = spec(gpus, "training");
    sp.time_limit_s = limit_s;
    sp.user = user.into();
    sp.account = if user == "bob" { "b" } else { "a" }.into();
    sp
}

fn node_of(s: &ClusterState, id: u64) -> Option<String> {
    s.jobs[&id].allocation.as_ref().map(|a| a.node.clone())
}

fn put(s: &mut ClusterState, r: Reservation, now: i64) -> Outcome {
    s.apply(&cmd(now, Op::PutReservation { reservation: r, must_exist: Some(false) }))
}

/// Nodes n1 and n2 of 4 GPUs, accounts a (alice) and b (bob).
fn two_nodes() -> ClusterState {
    let mut s = ClusterState::new();
    s.apply(&cmd(1, Op::RegisterNode { info: node_info("n1", 4) }));
    s.apply(&cmd(1, Op::RegisterNode { info: node_info("n2", 4) }));
    assert_eq!(
        s.apply(&cmd(1, Op::SetPolicy { policy: two_accounts(), audit: None })),
        Outcome::PolicyChanged
    );
    s
}

fn maint_n1(start: i64, end: i64) -> Reservation {
    Reservation {
        name: "maint".into(),
        nodes: vec!["n1".into()],
        start_ms: start,
        end_ms: end,
        maint: true,
        ..Default::default()
    }
}

#[test]
fn a_maintenance_window_backfills_the_gap_stops_what_runs_and_frees_the_node_after() {
    let mut s = two_nodes();
    // A run without a time limit was on n1 before the reservation was made.
    let caught = submitted(submit(&mut s, job(1, None, "alice"), 500));
    step(&mut s, 500);
    assert_eq!(node_of(&s, caught).as_deref(), Some("n1"));
    let caught_gpu = s.jobs[&caught].allocation.as_ref().unwrap().gpus[0];
    assert_eq!(
        put(&mut s, maint_n1(20_000, 50_000), 1_000),
        Outcome::ReservationChanged { name: "maint".into() }
    );
    // A job that would still run at 20 s never goes to n1; one that ends before does.
    let long = submitted(submit(&mut s, job(4, Some(60), "alice"), 1_000));
    step(&mut s, 1_000);
    assert_eq!(node_of(&s, long).as_deref(), Some("n2"));
    let short = submitted(submit(&mut s, job(3, Some(10), "alice"), 1_000));
    let waits = submitted(submit(&mut s, job(2, Some(60), "alice"), 1_000));
    let nolimit = submitted(submit(&mut s, job(2, None, "alice"), 1_000));
    step(&mut s, 1_000);
    assert_eq!(node_of(&s, short).as_deref(), Some("n1"));
    assert_eq!(node_of(&s, waits), None);
    assert_eq!(node_of(&s, nolimit), None, "no time limit: it would run into the window");
    // Apply refuses the same start if a stale plan proposes it.
    s.apply(&cmd(2_000, Op::JobExited { job: short, attempt: 0, node: "n1".into(), exit: RunExit::Code(0) }));
    let free: Vec<u32> = (0..4).filter(|g| *g != caught_gpu).take(2).collect();
    let forged = Plan { placements: vec![Placement::single(waits, "n1".into(), free)] };
    match s.apply(&cmd(2_000, Op::ApplyPlan { plan: forged })) {
        Outcome::PlanApplied { accepted, rejected } => {
            assert!(accepted.is_empty());
            assert!(rejected[0].1.contains("when reservation \"maint\" opens"), "{rejected:?}");
        }
        other => panic!("{other:?}"),
    }
    assert!(s.maint_of("n1").is_none());
    assert!(!s.reservations_due(19_999));
    assert!(s.reservations_due(20_000));
    // When the window opens the run on n1 is stopped (checkpoint, requeue).
    step(&mut s, 20_000);
    assert_eq!(s.maint_of("n1"), Some("maint"));
    let stop = s.jobs[&caught].allocation.as_ref().and_then(|a| a.stop);
    assert_eq!(stop, Some(StopReason::ReservationOpened), "the run on the reserved node is stopped");
    s.apply(&cmd(
        20_500,
        Op::JobExited { job: caught, attempt: 0, node: "n1".into(), exit: RunExit::Signal(15) },
    ));
    assert_eq!(s.jobs[&caught].state, JobState::Pending, "requeued");
    step(&mut s, 21_000);
    assert_eq!(node_of(&s, caught), None, "nothing outside the reservation starts on n1 in the window");
    // After the window n1 is schedulable again.
    step(&mut s, 50_000);
    assert!(s.maint_of("n1").is_none());
    assert!(s.reservations.is_empty(), "a one-off reservation ends with its window");
    step(&mut s, 50_001);
    let on_n1: Vec<u64> =
        [caught, waits, nolimit].into_iter().filter(|j| node_of(&s, *j).as_deref() == Some("n1")).collect();
    assert_eq!(on_n1.len(), 2, "two of the waiting jobs fill n1 again");
}

#[test]
fn a_gpu_count_reservation_binds_free_gpus_first_and_admits_only_its_access_list() {
    let mut s = two_nodes();
    // b runs 3 GPUs on n1; n2 is free.
    let b_run = start_job(&mut s, job(3, None, "bob"), 1_000);
    let r = Reservation {
        name: "demo".into(),
        gpus: 2,
        start_ms: 10_000,
        end_ms: 60_000,
        accounts: vec!["a".into()],
        ..Default::default()
    };
    assert_eq!(put(&mut s, r, 1_000), Outcome::ReservationChanged { name: "demo".into() });
    // Bob may not name it; alice may, and waits until it opens.
    let mut theirs = job(1, Some(30), "bob");
    theirs.reservation = Some("demo".into());
    assert!(matches!(submit(&mut s, theirs, 2_000), Outcome::Rejected(Rejection::PermissionDenied(_))));
    let mut mine = job(2, Some(30), "alice");
    mine.reservation = Some("demo".into());
    let mine = submitted(submit(&mut s, mine, 2_000));
    step(&mut s, 2_000);
    assert_eq!(node_of(&s, mine), None);
    let why = plan(&s).pending[&mine].to_string();
    assert!(why.starts_with("Reservation: reservation \"demo\" opens in 8 s"), "{why}");
    step(&mut s, 10_000);
    let bound = s.reservations["demo"].bound.clone();
    assert_eq!(bound.len(), 1);
    assert_eq!(bound[0].node, "n2", "free GPUs are bound before any run is stopped");
    assert!(s.jobs[&b_run].allocation.as_ref().unwrap().stop.is_none(), "b's run is untouched");
    // Apply refuses a forged start of a non-member on a bound GPU.
    let sneaky = submitted(submit(&mut s, job(1, Some(30), "bob"), 10_000));
    let forged = Plan { placements: vec![Placement::single(sneaky, "n2".into(), vec![bound[0].gpus[0]])] };
    match s.apply(&cmd(10_000, Op::ApplyPlan { plan: forged })) {
        Outcome::PlanApplied { rejected, .. } => {
            assert!(rejected[0].1.contains("held by reservation"), "{rejected:?}")
        }
        other => panic!("{other:?}"),
    }
    step(&mut s, 10_001);
    let a = s.jobs[&mine].allocation.as_ref().expect("started in the window");
    assert_eq!((a.node.as_str(), &a.gpus), ("n2", &bound[0].gpus));
    let sn = s.jobs[&sneaky].allocation.as_ref().expect("bob's small job runs outside it");
    assert!(sn.node != "n2" || !bound[0].gpus.contains(&sn.gpus[0]));
    // Bob's 3-GPU job would fit n2 only with the reserved GPUs: it waits.
    let big = submitted(submit(&mut s, job(3, Some(30), "bob"), 11_000));
    step(&mut s, 11_000);
    assert_eq!(node_of(&s, big), None);
}

fn start_job(s: &mut ClusterState, sp: crate::model::JobSpec, now: i64) -> u64 {
    let id = submitted(submit(s, sp, now));
    step(s, now);
    assert!(node_of(s, id).is_some());
    id
}

#[test]
fn overlapping_windows_unknown_names_and_past_windows_are_refused_and_change_nothing() {
    let mut s = two_nodes();
    put(&mut s, maint_n1(20_000, 50_000), 1_000);
    let before = s.reservations.clone();
    let overlapping = Reservation { name: "other".into(), ..maint_n1(40_000, 90_000) };
    assert!(matches!(put(&mut s, overlapping, 1_000), Outcome::Rejected(Rejection::FailedPrecondition(_))));
    let unknown = Reservation { name: "x".into(), nodes: vec!["n9".into()], ..maint_n1(60_000, 90_000) };
    assert!(matches!(put(&mut s, unknown, 1_000), Outcome::Rejected(Rejection::NotFound(_))));
    let past = Reservation { name: "p".into(), nodes: vec!["n2".into()], ..maint_n1(100, 500) };
    assert!(matches!(put(&mut s, past, 1_000), Outcome::Rejected(Rejection::Invalid(_))));
    let too_many = Reservation { name: "g".into(), nodes: vec![], gpus: 9, ..maint_n1(60_000, 90_000) };
    assert!(matches!(put(&mut s, too_many, 1_000), Outcome::Rejected(Rejection::FailedPrecondition(_))));
    assert_eq!(s.reservations, before);
    let again = maint_n1(1, 2);
    assert!(
        matches!(put(&mut s, again, 1_000), Outcome::Rejected(Rejection::FailedPrecondition(_))),
        "exists"
    );
    let mut unnamed = job(1, None, "alice");
    unnamed.reservation = Some("nope".into());
    assert!(matches!(submit(&mut s, unnamed, 1_000), Outcome::Rejected(Rejection::NotFound(_))));
    assert!(matches!(
        s.apply(&cmd(1_000, Op::DeleteReservation { name: "maint".into() })),
        Outcome::ReservationChanged { .. }
    ));
    assert!(s.reservations.is_empty());
}

#[test]
fn a_daily_window_opens_closes_and_opens_again_the_next_day() {
    let day = crate::reservation::DAY_MS;
    let mut s = two_nodes();
    let r = Reservation { repeat: Repeat::Daily, ..maint_n1(20_000, 50_000) };
    put(&mut s, r, 1_000);
    step(&mut s, 20_000);
    assert_eq!(s.reservations["maint"].opened_ms, Some(20_000));
    step(&mut s, 50_000);
    assert_eq!(s.reservations["maint"].opened_ms, None);
    assert!(s.maint_of("n1").is_none());
    assert!(!s.reservations_due(day));
    step(&mut s, day + 20_000);
    assert_eq!(s.reservations["maint"].opened_ms, Some(day + 20_000));
    assert_eq!(s.maint_of("n1"), Some("maint"));
}

#[test]
fn the_invariant_checker_catches_a_run_left_on_an_open_window_and_a_member_outside_it() {
    let mut s = two_nodes();
    let caught = start_job(&mut s, job(1, None, "alice"), 500);
    assert_eq!(node_of(&s, caught).as_deref(), Some("n1"));
    put(&mut s, maint_n1(20_000, 50_000), 1_000);
    step(&mut s, 20_000);
    assert!(s.check_invariants().is_ok());
    // Had the opening not stopped it, the run would break the window.
    let mut broken = s.clone();
    broken.jobs.get_mut(&caught).unwrap().allocation.as_mut().unwrap().stop = None;
    let err = broken.check_invariants().unwrap_err();
    assert!(err.contains("runs on reservation maint's resources in its window"), "{err}");
    // A job of the reservation running on n2 is outside it.
    // A member with no limit of its own (its QoS's 48 h) would outlive the window: refused.
    let mut member = job(1, None, "alice");
    member.reservation = Some("maint".into());
    let late = submitted(submit(&mut s, member.clone(), 21_000));
    step(&mut s, 21_000);
    assert_eq!(node_of(&s, late), None);
    let why = plan(&s).pending[&late].to_string();
    assert!(why.contains("ends after reservation \"maint\"'s window closes"), "{why}");
    member.time_limit_s = Some(20);
    let m = submitted(submit(&mut s, member, 21_000));
    step(&mut s, 21_000);
    assert_eq!(node_of(&s, m).as_deref(), Some("n1"), "its member starts in the window");
    let mut outside = s.clone();
    outside.reservations.get_mut("maint").unwrap().nodes = vec!["n2".into()];
    let err = outside.check_invariants().unwrap_err();
    assert!(err.contains(&format!("job {m} of reservation maint runs outside it")), "{err}");
}

#[test]
fn a_suspended_run_is_stopped_when_a_window_opens_and_an_elastic_one_never_grows_into_one() {
    // A suspended victim on n1 is stopped by the window's opening: it never resumes inside it.
    let mut s = cluster(4);
    let mut policy = s.policy.clone();
    policy.qos.get_mut("batch").unwrap().preempt_mode = crate::policy::PreemptMode::Suspend;
    s.apply(&cmd(0, Op::SetPolicy { policy, audit: None }));
    let mut sp = spec(4, "batch");
    sp.suspendable = true;
    let victim = start(&mut s, sp, 0);
    let urgent = submitted(submit(&mut s, spec(2, "urgent"), 50_000));
    preempt(&mut s, 50_000);
    step(&mut s, 50_001);
    assert_eq!(s.jobs[&victim].state, JobState::Suspended);
    put(&mut s, maint_n1(100_000, 200_000), 60_000);
    match s.apply(&cmd(100_000, Op::ReservationTick)) {
        Outcome::ReservationsTicked { stopped, .. } => assert!(stopped.contains(&victim), "{stopped:?}"),
        other => panic!("{other:?}"),
    }
    s.apply(&cmd(
        101_000,
        Op::JobExited { job: urgent, attempt: 0, node: "n1".into(), exit: RunExit::Signal(15) },
    ));
    assert_ne!(s.jobs[&victim].state, JobState::Running, "it does not resume in the window");
    assert!(s.check_invariants().is_ok());

    // A shrunk elastic job is not grown back on a node whose window opens before its restart
    // (a resize restarts the run, by its full limit) would end.
    let mut s = cluster(4);
    let mut sp = spec(4, "training");
    sp.min_gpus = Some(2);
    sp.time_limit_s = Some(100);
    let elastic = start(&mut s, sp, 0);
    let urgent = submitted(submit(&mut s, spec(2, "urgent"), 60_000));
    preempt(&mut s, 60_000);
    s.apply(&cmd(
        61_000,
        Op::JobExited { job: elastic, attempt: 0, node: "n1".into(), exit: RunExit::Code(0) },
    ));
    step(&mut s, 61_001);
    s.apply(&cmd(
        70_000,
        Op::JobExited { job: urgent, attempt: 0, node: "n1".into(), exit: RunExit::Code(0) },
    ));
    assert_eq!(s.jobs[&elastic].gpus(), 2, "shrunk");
    assert!(!plan(&s).grow.is_empty(), "with no window it grows back");
    put(&mut s, maint_n1(120_000, 200_000), 70_000);
    assert!(plan(&s).grow.is_empty(), "a restart of 100 s would run into the window at 120 s");
}

//! EASY backfill against virtual time: jobs (single-node and gangs) run exactly their time
//! limit, the cluster is driven pass by pass, and the top blocked job must start no later than
//! its reservation — and so no later than it would without backfill.

use std::collections::BTreeMap;

use proptest::prelude::*;

use crate::model::{JobId, JobState};
use crate::planner::{plan_with, PlanConfig};
use crate::state::{ClusterState, Command, Op, RunExit};
use crate::testing::{node_info, spec};

/// Runs `jobs` (GPUs per task, tasks, limit in seconds) on nodes of `nodes` GPUs; returns each
/// job's start time and every (job, reserved start) the planner announced.
fn simulate(
    nodes: &[u32],
    jobs: &[(u32, u32, u64)],
    backfill: bool,
) -> (BTreeMap<JobId, i64>, Vec<(JobId, i64)>) {
    let mut s = ClusterState::new();
    let mut now = 0i64;
    // Submit order decides: no job-size or age factor in these scenarios.
    let mut policy = s.policy.clone();
    policy.weights.job_size = 0;
    policy.weights.age = 0;
    s.apply(&Command { skipped_ms: 0, now_ms: now, op: Op::SetPolicy { policy, audit: None } });
    for (i, gpus) in nodes.iter().enumerate() {
        s.apply(&Command {
            skipped_ms: 0,
            now_ms: now,
            op: Op::RegisterNode { info: node_info(&format!("n{i}"), *gpus) },
        });
    }
    for (gpus, tasks, limit) in jobs {
        let mut sp = spec(*gpus, "batch");
        sp.tasks = *tasks;
        sp.time_limit_s = Some(*limit);
        s.apply(&Command {
            skipped_ms: 0,
            now_ms: now,
            op: Op::Submit { spec: sp, request_id: None, hold: false, limits: None },
        });
    }
    let mut starts = BTreeMap::new();
    let mut reservations = Vec::new();
    for _ in 0..10_000 {
        let out = plan_with(&s, PlanConfig { backfill, ..Default::default() });
        if let Some(r) = &out.reservation {
            reservations.push((r.job, r.start_ms));
        }
        s.apply(&Command { skipped_ms: 0, now_ms: now, op: Op::ApplyPlan { plan: out.plan.clone() } });
        for p in &out.plan.placements {
            s.apply(&Command {
                skipped_ms: 0,
                now_ms: now,
                op: Op::JobStarted { job: p.job, attempt: 0, node: p.node.clone() },
            });
            starts.insert(p.job, now);
        }
        // Advance to the next job end.
        let next = s
            .jobs
            .values()
            .filter(|j| j.state == JobState::Running)
            .map(|j| j.start_time_ms.unwrap() + j.spec.time_limit_s.unwrap() as i64 * 1000)
            .min();
        let Some(next) = next else { break };
        now = next;
        let ending: Vec<(JobId, String)> = s
            .jobs
            .values()
            .filter(|j| j.state == JobState::Running)
            .filter(|j| j.start_time_ms.unwrap() + j.spec.time_limit_s.unwrap() as i64 * 1000 <= now)
            .flat_map(|j| j.allocation.as_ref().unwrap().tasks().map(|(_, n, _)| (j.id, n.to_string())))
            .collect();
        for (job, node) in ending {
            s.apply(&Command {
                skipped_ms: 0,
                now_ms: now,
                op: Op::JobExited { job, attempt: 0, node, exit: RunExit::Code(0) },
            });
        }
        s.check_invariants().unwrap();
    }
    (starts, reservations)
}

#[test]
fn a_short_job_backfills_around_a_blocked_wide_job() {
    // One 4-GPU node: a 3-GPU job runs 100 s; a 4-GPU job waits for it; a 1-GPU job of 50 s
    // fits in the gap and ends before the wide job's reservation.
    let (starts, reservations) = simulate(&[4], &[(3, 1, 100), (4, 1, 100), (1, 1, 50)], true);
    assert_eq!(starts[&3], 0, "the short job backfilled");
    assert_eq!(starts[&2], 100_000, "the wide job was not delayed");
    assert_eq!(reservations[0], (2, 100_000));
    // A 1-GPU job longer than the gap may not start before the wide job.
    let (starts, _) = simulate(&[4], &[(3, 1, 100), (4, 1, 100), (1, 1, 500)], true);
    assert_eq!(starts[&2], 100_000);
    assert!(starts[&3] >= 100_000, "a long job would have delayed the reservation");
}

#[test]
fn small_jobs_backfill_around_a_blocked_gang_without_delaying_it() {
    // Two 4-GPU nodes: 2-GPU jobs of 100 s on both; a gang of 2 × 4 GPUs waits for them; short
    // 1-GPU jobs fit in the gap. Before gangs had reservations, nothing ran behind a blocked
    // gang: the short jobs waited until the gang had ended (t = 200 s).
    let jobs = [(2, 1, 100), (2, 1, 100), (4, 2, 100), (1, 1, 50), (1, 1, 50), (1, 1, 500)];
    let (starts, reservations) = simulate(&[4, 4], &jobs, true);
    assert_eq!(reservations[0], (3, 100_000), "the gang's reservation");
    assert_eq!(starts[&3], 100_000, "the gang was not delayed");
    assert_eq!((starts[&4], starts[&5]), (0, 0), "the short jobs backfilled");
    assert!(starts[&6] >= 200_000, "a long job would have delayed the gang: {}", starts[&6]);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn backfill_never_delays_the_reserved_job(
        nodes in proptest::collection::vec(1u32..9, 1..4),
        jobs in proptest::collection::vec((1u32..9, 1u32..4, 1u64..50), 1..25),
    ) {
        // Each job fits the cluster: a gang of t tasks asks at most what the t-th largest node has.
        let mut sizes = nodes.clone();
        sizes.sort_unstable_by(|a, b| b.cmp(a));
        let jobs: Vec<(u32, u32, u64)> = jobs
            .into_iter()
            .map(|(g, t, l)| {
                let t = t.min(sizes.len() as u32);
                (g.min(sizes[t as usize - 1]), t, l)
            })
            .collect();
        let (with, reservations) = simulate(&nodes, &jobs, true);
        let (without, _) = simulate(&nodes, &jobs, false);
        prop_assert_eq!(with.len(), jobs.len(), "every job ran with backfill");
        prop_assert_eq!(without.len(), jobs.len(), "every job ran without backfill");
        // Each job's first reservation is kept: it starts no later than announced ...
        let mut first: BTreeMap<JobId, i64> = BTreeMap::new();
        for (job, at) in reservations {
            first.entry(job).or_insert(at);
        }
        for (job, at) in &first {
            prop_assert!(with[job] <= *at, "job {} reserved for {} started at {}", job, at, with[job]);
        }
        // ... and the first blocked job starts no later than without backfill.
        if let Some((job, _)) = first.iter().next() {
            prop_assert!(with[job] <= without[job], "job {} starts at {} with backfill, {} without", job, with[job], without[job]);
        }
    }
}

#[test]
fn a_job_held_back_by_the_reservation_is_told_whose_it_is_and_how_short_a_limit_would_start_it() {
    use crate::reasons::PendingReason;
    let mut s = ClusterState::new();
    let mut policy = s.policy.clone();
    policy.weights.job_size = 0;
    policy.weights.age = 0;
    let cmd = |op| Command { skipped_ms: 0, now_ms: 0, op };
    s.apply(&cmd(Op::SetPolicy { policy, audit: None }));
    s.apply(&cmd(Op::RegisterNode { info: node_info("n0", 4) }));
    let submit = |s: &mut ClusterState, gpus: u32, limit: u64| {
        let mut sp = spec(gpus, "batch");
        sp.time_limit_s = Some(limit);
        s.apply(&cmd(Op::Submit { spec: sp, request_id: None, hold: false, limits: None }));
        s.next_job_id - 1
    };
    // 3 GPUs busy for 100 s; a 4-GPU job waits for them (it holds the reservation); a 1-GPU
    // job of an hour could use the idle GPU but would delay it.
    let running = submit(&mut s, 3, 100);
    let out = plan_with(&s, PlanConfig { backfill: true, ..Default::default() });
    s.apply(&cmd(Op::ApplyPlan { plan: out.plan }));
    s.apply(&cmd(Op::JobStarted { job: running, attempt: 0, node: "n0".into() }));
    let big = submit(&mut s, 4, 600);
    let long = submit(&mut s, 1, 3600);
    let out = plan_with(&s, PlanConfig { backfill: true, ..Default::default() });
    assert_eq!(out.reservation.as_ref().map(|r| r.job), Some(big));
    let reason = out.pending.get(&long).cloned();
    assert_eq!(reason, Some(PendingReason::PriorityHeld { job: big, start_in_s: 100 }), "{:?}", out.pending);
    assert!(reason.unwrap().to_string().starts_with("Priority: the free GPUs are held for job"));
    // A job that would not fit the free GPUs at all is plain Priority.
    let wide = submit(&mut s, 2, 3600);
    let out = plan_with(&s, PlanConfig { backfill: true, ..Default::default() });
    assert_eq!(out.pending.get(&wide), Some(&PendingReason::Priority));
}

//! The property-test driver: random command sequences (`Step`, strategies `step` and
//! `preemption_step`) turned into commands against a real state (`drive`), with every invariant
//! and QoS limit checked after every command. Used by this crate's property tests and, with the
//! `testing` feature, by other crates' tests.

use proptest::prelude::*;

use crate::model::JobState;
use crate::planner::{plan, PlanOutput};
use crate::state::{ClusterState, Command, Op, Outcome, Placement, Plan, RunExit};
use crate::testing::{node_info_model, spec};

/// An abstract step of the property tests; indices are resolved against the current state.
#[derive(Clone, Debug)]
pub enum Step {
    Register {
        node: u8,
        gpus: u32,
    },
    Submit {
        gpus: u32,
        qos: u8,
        rid: Option<u8>,
        /// Picks the constraints (dependency, model, partition, gang, elastic, suspendable).
        flags: u8,
    },
    Cancel {
        job: u8,
    },
    Plan,
    /// A plan computed now but applied after a few more steps.
    SavePlan,
    ApplySaved,
    /// A hand-made placement, often invalid.
    Forge {
        job: u8,
        node: u8,
        gpus: Vec<u32>,
    },
    Started {
        job: u8,
    },
    Exited {
        job: u8,
        code: i32,
    },
    NodeDown {
        node: u8,
    },
    /// A GPU of a node fails (uuid empty: any), or is reset.
    GpuFault {
        node: u8,
        gpu: u32,
    },
    GpuReset {
        node: u8,
        gpu: u32,
    },
    TimeLimit {
        job: u8,
    },
    Hold {
        job: u8,
        held: bool,
    },
    RankExited {
        job: u8,
        rank: u8,
        code: i32,
    },
    /// Applies the planner's preemption, if it proposes one.
    Preempt,
    /// Applies the planner's first grow-back, if it proposes one.
    Grow,
    /// Applies the planner's headroom refill, if it proposes one.
    Vacate,
    /// A hand-made headroom refill, often invalid.
    ForgeVacate {
        jobs: Vec<u8>,
    },
    /// Cancels every pending job (so that nothing waits and elastic jobs may grow back).
    Drain,
    Tick {
        ms: u32,
    },
    /// Purges these jobs (forged: finished or not) with no retention and a 3-record history.
    Purge {
        jobs: Vec<u8>,
    },
}

pub fn step() -> impl Strategy<Value = Step> {
    // Weighted so that runs start, fill the nodes and get preempted often enough to matter.
    prop_oneof![
        1 => (0u8..3, 1u32..9).prop_map(|(node, gpus)| Step::Register { node, gpus }),
        4 => (1u32..10, 0u8..5, proptest::option::of(0u8..4), any::<u8>())
            .prop_map(|(gpus, qos, rid, flags)| Step::Submit { gpus, qos, rid, flags }),
        1 => (0u8..24).prop_map(|job| Step::Cancel { job }),
        3 => Just(Step::Plan),
        1 => Just(Step::SavePlan),
        1 => Just(Step::ApplySaved),
        1 => (0u8..24, 0u8..3, proptest::collection::vec(0u32..9, 0..4))
            .prop_map(|(job, node, gpus)| Step::Forge { job, node, gpus }),
        4 => (0u8..24).prop_map(|job| Step::Started { job }),
        2 => (0u8..24, 0i32..3).prop_map(|(job, code)| Step::Exited { job, code }),
        1 => (0u8..3).prop_map(|node| Step::NodeDown { node }),
        1 => (0u8..3, 0u32..9).prop_map(|(node, gpu)| Step::GpuFault { node, gpu }),
        1 => (0u8..3, 0u32..9).prop_map(|(node, gpu)| Step::GpuReset { node, gpu }),
        1 => (0u8..24).prop_map(|job| Step::TimeLimit { job }),
        1 => (0u8..24, any::<bool>()).prop_map(|(job, held)| Step::Hold { job, held }),
        1 => (0u8..24, 0u8..3, 0i32..2).prop_map(|(job, rank, code)| Step::RankExited { job, rank, code }),
        3 => Just(Step::Preempt),
        2 => Just(Step::Grow),
        2 => Just(Step::Vacate),
        1 => proptest::collection::vec(0u8..24, 0..3).prop_map(|jobs| Step::ForgeVacate { jobs }),
        1 => (0u32..100_000).prop_map(|ms| Step::Tick { ms }),
        1 => proptest::collection::vec(0u8..24, 0..4).prop_map(|jobs| Step::Purge { jobs }),
    ]
}

/// Steps that keep the nodes full of training and batch work and preempt it often: suspend,
/// shrink, grow back and stop, interleaved with exits, cancels and node failures.
pub fn preemption_step() -> impl Strategy<Value = Step> {
    prop_oneof![
        5 => (1u32..5, prop_oneof![Just(0u8), Just(3u8), Just(4u8)], any::<u8>())
            .prop_map(|(gpus, qos, flags)| Step::Submit { gpus, qos, rid: None, flags }),
        4 => Just(Step::Plan),
        3 => (0u8..24).prop_map(|job| Step::Started { job }),
        4 => Just(Step::Preempt),
        2 => Just(Step::Grow),
        2 => Just(Step::Vacate),
        1 => Just(Step::Drain),
        2 => (0u8..24, 0i32..2).prop_map(|(job, code)| Step::Exited { job, code }),
        1 => (0u8..24).prop_map(|job| Step::Cancel { job }),
        1 => (0u8..3).prop_map(|node| Step::NodeDown { node }),
        1 => (0u8..3, 0u32..4).prop_map(|(node, gpu)| Step::GpuFault { node, gpu }),
        1 => (0u8..3, 0u32..4).prop_map(|(node, gpu)| Step::GpuReset { node, gpu }),
        1 => (0u8..3, 4u32..7).prop_map(|(node, gpus)| Step::Register { node, gpus }),
        1 => (0u32..100_000).prop_map(|ms| Step::Tick { ms }),
    ]
}

const QOS: [&str; 5] = ["urgent", "premium", "inference", "training", "batch"];

/// Turns abstract steps into concrete commands, applying them as it goes.
pub fn drive(steps: &[Step]) -> (ClusterState, Vec<Command>) {
    let mut s = ClusterState::new();
    let mut log = Vec::new();
    // Tight limits, so the generated streams hit them.
    let mut policy = s.policy.clone();
    policy.qos.get_mut("batch").unwrap().preempt_mode = crate::policy::PreemptMode::Suspend;
    // Urgent work keeps a GPU idle: other work stays out of it and is stopped to refill it.
    policy.qos.get_mut("urgent").unwrap().headroom_gpus = 1;
    for (name, q) in policy.qos.iter_mut() {
        q.grp_gpus = Some(if name == "batch" { 6 } else { 9 });
        q.user_gpus = Some(5);
        q.user_jobs = Some(3);
    }
    policy.partitions.insert(
        "p2".into(),
        crate::policy::Partition {
            name: "p2".into(),
            nodes: ["n2".to_string()].into(),
            selector: Default::default(),
            priority_tier: 3,
            allowed_qos: Default::default(),
            default_qos: None,
            max_wall_s: None,
            resources: Default::default(),
            idle_gpu: None,
        },
    );
    let c = Command { skipped_ms: 0, now_ms: 0, op: Op::SetPolicy { policy, audit: None } };
    assert_eq!(s.apply(&c), Outcome::PolicyChanged);
    log.push(c);
    // Start with nodes, so that runs fill them and preemption gets exercised.
    for (node, gpus, model) in [("n0", 6, "H100"), ("n1", 4, "A100"), ("n2", 4, "H100")] {
        let c = Command {
            skipped_ms: 0,
            now_ms: 0,
            op: Op::RegisterNode { info: node_info_model(node, gpus, model) },
        };
        s.apply(&c);
        log.push(c);
    }
    let mut now = 0i64;
    let mut saved = Plan::default();
    for step in steps {
        let job_id = |j: &u8| u64::from(*j) + 1;
        let node_name = |n: &u8| format!("n{n}");
        let op = match step {
            Step::Register { node, gpus } => {
                let model = if *node == 1 { "A100" } else { "H100" };
                Some(Op::RegisterNode { info: node_info_model(&node_name(node), *gpus, model) })
            }
            Step::Hold { job, held } => Some(if *held {
                Op::Hold { job: job_id(job), by: "bob".into() }
            } else {
                Op::Release { job: job_id(job), by: "bob".into() }
            }),
            Step::Submit { gpus, qos, rid, flags } => {
                let mut sp = spec(*gpus, QOS[*qos as usize]);
                sp.time_limit_s = Some(60);
                sp.requeue = gpus % 2 == 0;
                sp.user = if (flags / 128 + qos) % 2 == 0 { "alice".into() } else { "bob".into() };
                // Each constraint on about one job in eight, independently of its size.
                if flags % 8 == 1 {
                    sp.gpu_model = Some("a100".into());
                }
                if (flags / 8) % 8 == 2 {
                    sp.partition = "p2".into();
                }
                if (flags / 64) == 3 {
                    sp.tasks = 2;
                    sp.gpus = 2;
                    // Half the gangs are elastic down to one node.
                    sp.min_tasks = (flags % 2 == 0).then_some(1);
                } else if flags % 4 == 0 && sp.gpus > 1 {
                    sp.min_gpus = Some(sp.gpus / 2);
                }
                sp.suspendable = flags % 3 == 1;
                // CPUs and memory that bind (nodes have 64 CPUs, 512 GiB): 0 to 48 CPUs, 0 to
                // 384 GiB; one job in sixteen is CPU-only.
                sp.cpus = 16 * u32::from(flags % 4);
                sp.mem_mib = u64::from(flags % 7 / 2) * (128 << 10);
                if flags % 16 == 7 && sp.tasks == 1 && sp.array.is_none() {
                    sp.gpus = 0;
                    sp.min_gpus = None;
                    sp.cpus = sp.cpus.max(8);
                }
                if flags % 16 == 5 && s.next_job_id > 1 {
                    sp.after_ok = vec![s.next_job_id - 1];
                }
                if flags % 16 == 9 {
                    sp.array = Some(Box::new(crate::model::ArraySpec {
                        indices: vec![0, 1, 2],
                        max_running: Some(1),
                        id: 0,
                        index: 0,
                        count: 0,
                    }));
                }
                // Inference jobs of one task ask for a fraction now and then (0.25 to 0.75).
                if QOS[*qos as usize] == "inference" && flags % 5 == 2 && sp.tasks == 1 && sp.gpus >= 1 {
                    sp.gpus = 1;
                    sp.min_gpus = None;
                    sp.gpu_milli = 250 * u32::from(1 + flags % 3);
                }
                Some(Op::Submit {
                    spec: sp,
                    request_id: rid.map(|r| format!("r{r}")),
                    hold: false,
                    limits: None,
                })
            }
            Step::Cancel { job } => Some(Op::Cancel { job: job_id(job), by: "bob".into() }),
            Step::Purge { jobs } => Some(Op::PurgeJobs {
                jobs: jobs.iter().map(job_id).collect(),
                retention: crate::state::history::Retention {
                    job_ms: 0,
                    history_max_jobs: 3,
                    history_max_age_ms: 1_000_000,
                },
            }),
            Step::Plan => {
                let out = plan(&s);
                // The index apply keeps must plan exactly as one built from scratch.
                let mut unindexed = s.clone();
                unindexed.job_index = Default::default();
                assert_eq!(plan(&unindexed), out, "a plan from the kept job index differs from a fresh one");
                // The leader's pass leaves the reasons out, and only them.
                let leader = crate::planner::plan_with(&s, crate::planner::PlanConfig::LEADER);
                assert!(leader.pending.is_empty(), "the leader's pass built reasons");
                assert_eq!(
                    leader,
                    PlanOutput { pending: Default::default(), ..out.clone() },
                    "the leader's pass planned differently from the full one"
                );
                if let Some(kept) = s.job_index.pending_may_act(&s.jobs, &s.policy) {
                    assert_eq!(
                        kept,
                        crate::propose::pending_may_act(&s),
                        "the kept index misjudges the pending jobs"
                    );
                }
                Some(Op::ApplyPlan { plan: out.plan })
            }
            Step::SavePlan => {
                saved = plan(&s).plan;
                None
            }
            Step::ApplySaved => Some(Op::ApplyPlan { plan: saved.clone() }),
            Step::Preempt => plan(&s).preemption.map(|p| Op::Preempt {
                preemptor: p.preemptor,
                node: p.node,
                victims: p.victims,
                gpus: p.gpus,
            }),
            Step::Vacate => {
                Some(plan(&s).vacate).filter(|v| !v.is_empty()).map(|victims| Op::Vacate { victims })
            }
            Step::ForgeVacate { jobs } => Some(Op::Vacate { victims: jobs.iter().map(job_id).collect() }),
            Step::Grow => plan(&s).grow.first().map(|g| Op::Resize {
                job: g.job,
                attempt: g.attempt,
                gpus: g.gpus.clone(),
                more: g.more.clone(),
            }),
            Step::Drain => {
                let pending: Vec<u64> =
                    s.jobs.values().filter(|j| j.state == JobState::Pending).map(|j| j.id).collect();
                for job in pending {
                    let c = Command { skipped_ms: 0, now_ms: now, op: Op::Cancel { job, by: "ops".into() } };
                    s.apply(&c);
                    log.push(c);
                }
                None
            }
            Step::Forge { job, node, gpus } => {
                // Even-sized forgeries also claim a second task on the next node (gang forgery).
                let more = if gpus.len() % 2 == 0 {
                    vec![crate::model::TaskPlacement {
                        node: node_name(&((node + 1) % 3)),
                        gpus: gpus.clone(),
                    }]
                } else {
                    Vec::new()
                };
                let placement =
                    Placement { job: job_id(job), node: node_name(node), gpus: gpus.clone(), more };
                Some(Op::ApplyPlan { plan: Plan { placements: vec![placement] } })
            }
            Step::RankExited { job, rank, code } => {
                let id = job_id(job);
                s.jobs.get(&id).and_then(|j| {
                    let a = j.allocation.as_ref()?;
                    let (_, node, _) = a.tasks().nth(*rank as usize % a.task_count() as usize)?;
                    Some(Op::JobExited {
                        job: id,
                        attempt: j.attempt,
                        node: node.to_string(),
                        exit: RunExit::Code(*code),
                    })
                })
            }
            Step::Started { job } | Step::Exited { job, .. } => {
                let id = job_id(job);
                s.jobs.get(&id).and_then(|j| j.allocation.as_ref().map(|a| (j.attempt, a.node.clone()))).map(
                    |(attempt, node)| match step {
                        Step::Exited { code, .. } => {
                            Op::JobExited { job: id, attempt, node, exit: RunExit::Code(*code) }
                        }
                        _ => Op::JobStarted { job: id, attempt, node },
                    },
                )
            }
            Step::NodeDown { node } => Some(Op::NodeDown { node: node_name(node), reason: "test".into() }),
            Step::GpuFault { node, gpu } => Some(Op::GpuFault {
                node: node_name(node),
                gpu: *gpu,
                uuid: String::new(),
                reason: "XID 79".into(),
            }),
            Step::GpuReset { node, gpu } => Some(Op::GpuReset { node: node_name(node), gpu: *gpu }),
            Step::TimeLimit { job } => Some(Op::EnforceTimeLimit { job: job_id(job), attempt: 0 }),
            Step::Tick { ms } => {
                now += i64::from(*ms);
                None
            }
        };
        if let Some(op) = op {
            let c = Command { skipped_ms: 0, now_ms: now, op };
            s.apply(&c);
            log.push(c);
            if let Err(e) = s.check_invariants() {
                panic!("invariant broken after {step:?}: {e}");
            }
            check_limits(&s);
        }
    }
    (s, log)
}

/// Policy invariants of the running jobs: QoS limits, dependencies, GPU models.
pub fn check_limits(s: &ClusterState) {
    use std::collections::BTreeMap;
    let mut qos_gpus: BTreeMap<&str, u32> = BTreeMap::new();
    let mut user_gpus: BTreeMap<(&str, &str), u32> = BTreeMap::new();
    let mut user_jobs: BTreeMap<(&str, &str), u32> = BTreeMap::new();
    for j in s.jobs.values().filter(|j| matches!(j.state, JobState::Running | JobState::Suspended)) {
        // Every running (or suspended) job met its dependencies and runs on GPUs of its model.
        // Judged as the state judges them: a dependency may have been purged into the history.
        for dep in &j.spec.after_ok {
            assert_eq!(s.job_state(*dep), Some(JobState::Completed), "job {} started before job {dep}", j.id);
        }
        let alloc = j.allocation.as_ref().unwrap();
        if j.spec.partition == "p2" {
            assert_eq!(alloc.node, "n2", "job {} ran outside its partition", j.id);
        }
        for (_, node, gpus) in alloc.tasks().filter(|(rank, _, _)| !alloc.exits.contains_key(rank)) {
            for g in gpus {
                let model = &s.nodes[node].info.gpus.iter().find(|x| x.index == *g).unwrap().model;
                assert!(
                    crate::model::model_matches(j.spec.gpu_model.as_deref(), model),
                    "job {} on a {model}",
                    j.id
                );
            }
        }
        *qos_gpus.entry(&j.spec.qos).or_default() += j.total_gpus();
        *user_gpus.entry((&j.spec.qos, &j.spec.user)).or_default() += j.total_gpus();
        *user_jobs.entry((&j.spec.qos, &j.spec.user)).or_default() += 1;
    }
    for (qos, used) in qos_gpus {
        assert!(used <= s.policy.qos[qos].grp_gpus.unwrap_or(u32::MAX), "qos {qos} holds {used} GPUs");
    }
    // No node hands out more CPUs or memory than it has (its capacity never shrinks here).
    for (name, node) in &s.nodes {
        let (used, cap) = (node.used(), node.capacity());
        assert!(used.fits(cap), "node {name} holds {used:?} of {cap:?}");
    }
    for ((qos, user), used) in user_gpus {
        assert!(used <= s.policy.qos[qos].user_gpus.unwrap_or(u32::MAX), "{user} holds {used} GPUs of {qos}");
    }
    for ((qos, user), used) in user_jobs {
        assert!(used <= s.policy.qos[qos].user_jobs.unwrap_or(u32::MAX), "{user} runs {used} jobs of {qos}");
    }
}

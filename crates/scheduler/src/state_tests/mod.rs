//! Tests of `ClusterState::apply`: unit cases and the property tests of its invariants.

use proptest::prelude::*;

use crate::model::{JobState, NodeState, StopReason};
use crate::planner::plan;
use crate::reasons::PendingReason;
use crate::state::{ClusterState, Command, Op, Outcome, Placement, Plan, Rejection, RunExit};
use crate::testing::{node_info, node_info_model, spec};

mod arrays;
mod elastic;
mod estimates;
mod events;
mod fits;
mod fractions;
mod gpu_health;
mod guarantees;
mod headroom;
mod idle;
mod interactive;
mod preempt;
mod props;
mod reservations;
mod resources;
mod runs;
mod submit;
mod topology;

fn cmd(now_ms: i64, op: Op) -> Command {
    Command { skipped_ms: 0, now_ms, op }
}

fn submitted(out: Outcome) -> u64 {
    match out {
        Outcome::Submitted { job } => job,
        other => panic!("expected a submit, got {other:?}"),
    }
}

fn cluster(gpus: u32) -> ClusterState {
    let mut s = ClusterState::new();
    s.apply(&cmd(1, Op::RegisterNode { info: node_info("n1", gpus) }));
    s
}

fn run_plan(s: &mut ClusterState, now: i64) -> Outcome {
    let p = plan(s).plan;
    s.apply(&cmd(now, Op::ApplyPlan { plan: p }))
}

fn two_accounts() -> crate::policy::Policy {
    use crate::policy::Account;
    let mut policy = crate::policy::Policy::default();
    for (name, user) in [("a", "alice"), ("b", "bob")] {
        let account = Account {
            name: name.into(),
            parent: Some("root".into()),
            shares: 1,
            users: [user.to_string()].into(),
            qos: Default::default(),
            user_qos: Default::default(),
            guarantee: None,
        };
        policy.accounts.insert(name.into(), account);
    }
    policy
}

fn with_partition(mut policy: crate::policy::Policy) -> crate::policy::Policy {
    let part = crate::policy::Partition {
        name: "big".into(),
        nodes: Default::default(),
        selector: [("rack".to_string(), "r2".to_string())].into(),
        priority_tier: 5,
        allowed_qos: ["training".to_string(), "batch".to_string()].into(),
        default_qos: Some("training".into()),
        max_wall_s: Some(3600),
        resources: Default::default(),
        idle_gpu: None,
    };
    policy.partitions.insert(part.name.clone(), part);
    policy
}

/// Submits `sp` at `now`, plans, and reports it started; returns its id.
fn start(s: &mut ClusterState, sp: crate::model::JobSpec, now: i64) -> u64 {
    let id =
        submitted(s.apply(&cmd(now, Op::Submit { spec: sp, request_id: None, hold: false, limits: None })));
    run_plan(s, now);
    let node = s.jobs[&id].allocation.as_ref().expect("placed").node.clone();
    s.apply(&cmd(now, Op::JobStarted { job: id, attempt: s.jobs[&id].attempt, node }));
    id
}

/// Applies the planner's preemption at `now`.
fn preempt(s: &mut ClusterState, now: i64) -> crate::planner::PreemptPlan {
    let p = plan(s).preemption.expect("a preemption");
    let op = Op::Preempt {
        preemptor: p.preemptor,
        node: p.node.clone(),
        victims: p.victims.clone(),
        gpus: p.gpus.clone(),
    };
    assert!(matches!(s.apply(&cmd(now, op)), Outcome::Preempted { .. }));
    s.check_invariants().unwrap();
    p
}

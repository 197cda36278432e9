//! Leader-only work: the scheduling pass, time limits and node liveness.
//!
//! Runs on every replica but acts only while this replica leads. Each pass reads the applied
//! state, computes (pure) what should change and proposes it as one log entry; the state
//! machine re-validates all of it on apply, so a pass computed on a stale state is harmless.
//!
//! ```text
//!   kick (submit, exit, node join) ─┐
//!   tick ───────────────────────────┴─▶ pass: NodeDown*, EnforceTimeLimit*, Preempt?, ApplyPlan, Resize* ─▶ Raft
//! ```
//!
//! Heartbeats live in memory only. A replica that just became leader has none, so it gives
//! every node a full timeout of grace before judging it: a failover never causes mass NodeDown.

use std::time::Instant;

use kairos_scheduler::{plan, Command, NodeState, Op};

use crate::context::{now_ms, Ctx};

pub async fn run(ctx: Ctx) {
    let mut leader_since: Option<Instant> = None;
    loop {
        tokio::select! {
            _ = ctx.kick.notified() => {}
            _ = tokio::time::sleep(ctx.timing.tick) => {}
        }
        if !ctx.replica.is_leader() {
            leader_since = None;
            continue;
        }
        let since = *leader_since.get_or_insert_with(Instant::now);
        let ops = pass(&ctx, since);
        if ops.is_empty() {
            continue;
        }
        let now = now_ms();
        let commands: Vec<Command> = ops.into_iter().map(|op| Command { now_ms: now, op }).collect();
        let count = commands.len();
        match ctx.replica.write(commands).await {
            Ok(outcomes) => tracing::debug!(count, ?outcomes, "scheduling pass committed"),
            Err(e) => tracing::warn!(error = %e, "scheduling pass not committed"),
        }
    }
}

/// What this pass proposes.
fn pass(ctx: &Ctx, leader_since: Instant) -> Vec<Op> {
    let now = now_ms();
    let timeout = ctx.timing.node_timeout;
    let heartbeats = ctx.heartbeats.lock().unwrap_or_else(|p| p.into_inner()).clone();
    ctx.replica.read(|a| {
        let mut ops = Vec::new();
        if leader_since.elapsed() >= timeout {
            for (name, node) in &a.state.nodes {
                let silent = match heartbeats.get(name) {
                    Some((seen, _)) => seen.elapsed() >= timeout,
                    None => true,
                };
                if node.state != NodeState::Down && silent {
                    tracing::warn!(node = %name, "node missed heartbeats; marking it down");
                    ops.push(Op::NodeDown {
                        node: name.clone(),
                        reason: format!("no heartbeat for {}s", timeout.as_secs()),
                    });
                }
            }
        }
        for (job, attempt) in a.state.expired_runs(now) {
            ops.push(Op::EnforceTimeLimit { job, attempt });
        }
        // Without a free GPU nothing can be placed, but preemption can still make room.
        let preempting = a.state.jobs.values().any(|j| {
            j.state == kairos_scheduler::JobState::Pending
                && (j.claim.is_some()
                    || a.state.policy.qos(&j.spec.qos).is_some_and(|q| !q.preempt.is_empty()))
        });
        if a.state.has_free_gpus() || preempting {
            let out = plan(&a.state);
            if let Some(p) = out.preemption {
                ops.push(Op::Preempt {
                    preemptor: p.preemptor,
                    node: p.node,
                    victims: p.victims,
                    gpus: p.gpus,
                });
            }
            if !out.plan.placements.is_empty() {
                ops.push(Op::ApplyPlan { plan: out.plan });
            }
            for g in out.grow {
                ops.push(Op::Resize { job: g.job, attempt: g.attempt, gpus: g.gpus, more: g.more });
            }
        }
        ops
    })
}

//! Leader-only work: the scheduling pass, time limits and node liveness.
//!
//! Runs on every replica but acts only while this replica leads. Each pass gathers which nodes
//! fell silent, asks the core what should change (`kairos_scheduler::propose`, pure) and
//! proposes it as one log entry; the state machine re-validates all of it on apply, so a pass
//! computed on a stale state is harmless.
//!
//! ```text
//!   kick (submit, exit, node join) ─┐
//!   tick ───────────────────────────┴─▶ pass: NodeDown*, EnforceTimeLimit*, Preempt?, ApplyPlan, Resize* ─▶ Raft
//!   every propose::PURGE_EVERY ─────────▶ PurgeJobs? (finished jobs past --job-retention → history)
//! ```
//!
//! Heartbeats live in memory only. A replica that just became leader has none, so it gives
//! every node a full timeout of grace before judging it: a failover never causes mass NodeDown.

use std::time::Instant;

use kairos_scheduler::propose::{Leadership, Tick};
use kairos_scheduler::{Command, Op};

use crate::agents::Desk;
use crate::context::Ctx;

pub async fn run(ctx: Ctx) {
    let mut leadership = Leadership::default();
    loop {
        tokio::select! {
            _ = ctx.kick.notified() => {}
            _ = tokio::time::sleep(ctx.timing.tick) => {}
        }
        let (started, pass_began) = (Instant::now(), std::time::SystemTime::now());
        // The tick is the core's (`Leadership::tick`), as the simulation's leader loop takes it.
        let tick = Tick {
            now: started,
            now_ms: ctx.cluster_now(),
            node_timeout: ctx.timing.node_timeout,
            retention: &ctx.retention,
        };
        let Some((_, ops)) = leadership.tick(&Desk(&ctx), tick) else { continue };
        ctx.metrics.pass(started.elapsed().as_secs_f64());
        for op in &ops {
            if let Op::NodeDown { node, .. } = op {
                tracing::warn!(node = %node, "node missed heartbeats; marking it down");
            }
        }
        if ops.is_empty() {
            continue;
        }
        let commands: Vec<Command> = ctx.stamped(ops);
        let count = commands.len();
        match ctx.replica.write(commands).await {
            Ok(outcomes) => {
                trace_placements(&ctx, &outcomes, pass_began);
                tracing::debug!(count, ?outcomes, "scheduling pass committed")
            }
            Err(e) => tracing::warn!(error = %e, "scheduling pass not committed"),
        }
    }
}

/// A `schedule` span in the trace of every job this pass placed, from the pass's start to its
/// commit.
fn trace_placements(ctx: &Ctx, outcomes: &[kairos_scheduler::Outcome], began: std::time::SystemTime) {
    use kairos_telemetry::traces;
    for outcome in outcomes {
        let kairos_scheduler::Outcome::PlanApplied { accepted, .. } = outcome else { continue };
        let traced: Vec<(u64, String, String)> = ctx.replica.read(|a| {
            accepted
                .iter()
                .filter_map(|id| {
                    let job = a.state.jobs.get(id)?;
                    let node = job.allocation.as_ref().map(|al| al.node.clone()).unwrap_or_default();
                    Some((*id, job.spec.traceparent.as_deref()?.to_string(), node))
                })
                .collect()
        });
        for (id, tp, node) in traced {
            let attributes = vec![
                opentelemetry::KeyValue::new("kairos.job_id", id as i64),
                opentelemetry::KeyValue::new("kairos.node", node),
            ];
            let span = traces::start_at("schedule", &traces::context_of(&tp), began, attributes);
            traces::end(&span);
        }
    }
}

//! The simulated client: submits jobs with request ids (retrying a submit whose answer it did
//! not get, as a careful client does), cancels some of those it got acknowledged, and records
//! each operation and how it was answered (the history the checkers judge).

use std::sync::Arc;
use std::time::Duration;

use kairos_consensus::ReplicaId;
use kairos_scheduler::{JobId, JobSpec, Op, Outcome};

use super::World;
use crate::Operation;

/// Tries per operation before the client gives up on it (its outcome then unknown).
const TRIES: usize = 6;

/// The teams jobs are submitted under, each guaranteed this many GPUs of the cluster.
pub const TEAMS: [&str; 2] = ["ta", "tb"];

/// The shipped policy with the two teams: each guaranteed three eighths of the cluster, so
/// each borrows from the other and reclaim runs across the faults.
fn team_policy(gpus: u32) -> kairos_scheduler::policy::Policy {
    let mut p = kairos_scheduler::policy::Policy::default();
    for team in TEAMS {
        let mut a = p.accounts["root"].clone();
        a.name = team.into();
        a.parent = Some("root".into());
        a.guarantee = Some(kairos_scheduler::policy::Guarantee {
            gpus: gpus * 3 / 8,
            borrow_limit: None,
            lend_limit: None,
        });
        p.accounts.insert(team.into(), a);
    }
    p
}

fn spec(name: &str, gpus: u32, qos: &str) -> JobSpec {
    let mut spec = JobSpec::new(name, "alice", vec!["train".into()], gpus);
    spec.qos = qos.into();
    spec.requeue = qos == "training";
    // Batch jobs have a limit some of their runs exceed (`World::run_time`: 1–10 s).
    spec.time_limit_s = (qos == "batch").then_some(6);
    spec
}

/// Runs the workload: `jobs` submits spread over the fault window, then returns.
pub async fn run(w: Arc<World>) {
    let mut via: ReplicaId = 1;
    let mut acked: Vec<JobId> = Vec::new();
    // The teams first (retried until a leader takes it: every submit names a team).
    let gpus = w.cfg.gpus_per_node * w.cfg.nodes as u32;
    let policy = Op::SetPolicy { policy: team_policy(gpus), audit: None };
    for _ in 0..TRIES * 10 {
        if w.write(&mut via, vec![policy.clone()]).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100 + w.draw(300))).await;
    }
    for i in 0..w.cfg.jobs {
        tokio::time::sleep(Duration::from_millis(
            100 + w.draw(w.cfg.window.as_millis() as u64 * 2 / w.cfg.jobs as u64),
        ))
        .await;
        let request_id = format!("s{}-{i}", w.seed);
        let qos = ["training", "training", "batch", "urgent"][w.draw(4) as usize];
        let gpus = [1, 1, 2, 4][w.draw(4) as usize].min(w.cfg.gpus_per_node);
        let mut spec = spec(&request_id, gpus, qos);
        spec.account = TEAMS[w.draw(2) as usize].into();
        let op = Op::Submit { spec, request_id: Some(request_id.clone()), hold: false, limits: None };
        let mut answer = None;
        for _ in 0..TRIES {
            match w.write(&mut via, vec![op.clone()]).await {
                Ok(outcomes) => {
                    if let Some(Outcome::Submitted { job }) = outcomes.first() {
                        answer = Some(*job);
                    }
                    break;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100 + w.draw(300))).await,
            }
        }
        w.record(Operation::Submit { request_id, acked: answer });
        if let Some(job) = answer {
            acked.push(job);
        }
        // Now and then, cancel a job acknowledged earlier.
        if !acked.is_empty() && w.draw(5) == 0 {
            let job = acked[w.draw(acked.len() as u64) as usize];
            let mut ok = false;
            for _ in 0..TRIES {
                match w.write(&mut via, vec![Op::Cancel { job, by: "alice".into() }]).await {
                    Ok(outcomes) => {
                        ok = matches!(outcomes.first(), Some(Outcome::Cancelled { .. }));
                        break;
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(100 + w.draw(300))).await,
                }
            }
            w.record(Operation::Cancel { job, acked: ok });
        }
    }
}

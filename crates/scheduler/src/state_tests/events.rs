//! The cluster's event log and the replay facts of history records.

use super::*;
use crate::events::{ClusterEventKind, PolicyAudit, CLUSTER_EVENTS_MAX};
use crate::history::{HoldWindow, JobRecord, RunWindow};

fn kinds(s: &ClusterState) -> Vec<(i64, String, &'static str)> {
    s.events.iter().map(|e| (e.time_ms, e.node.clone(), e.kind.name())).collect()
}

#[test]
fn node_changes_and_policy_changes_are_logged_once_each() {
    let mut s = cluster(4);
    s.apply(&cmd(2, Op::RegisterNode { info: node_info("n1", 4) }));
    s.apply(&cmd(3, Op::DrainNode { node: "n1".into(), reason: "maintenance".into(), keep_runs: false }));
    s.apply(&cmd(4, Op::DrainNode { node: "n1".into(), reason: "again".into(), keep_runs: false }));
    s.apply(&cmd(5, Op::ResumeNode { node: "n1".into(), only_reason: None }));
    s.apply(&cmd(6, Op::NodeDown { node: "n1".into(), reason: "no heartbeat".into() }));
    s.apply(&cmd(7, Op::RegisterNode { info: node_info("n1", 2) }));
    s.apply(&cmd(8, Op::RemoveNode { node: "n1".into() }));
    s.apply(&cmd(9, Op::RemoveNode { node: "n1".into() }));
    let audit = PolicyAudit { token_id: "t1".into(), user: "ops".into(), what_if: "ab".into() };
    let mut bad = s.policy.clone();
    bad.profile_qos.insert(crate::model::Profile::Training, "nope".into());
    assert!(matches!(
        s.apply(&cmd(10, Op::SetPolicy { policy: bad, audit: Some(audit.clone()) })),
        Outcome::Rejected(_)
    ));
    let policy = s.policy.clone();
    s.apply(&cmd(11, Op::SetPolicy { policy, audit: Some(audit.clone()) }));
    let n = |t: i64, k: &'static str| (t, "n1".to_string(), k);
    assert_eq!(
        kinds(&s),
        vec![
            n(1, "node joined"),
            n(3, "node draining"),
            n(5, "node up"),
            n(6, "node down"),
            n(7, "node joined"),
            n(7, "node up"),
            n(8, "node removed"),
            (11, String::new(), "policy applied"),
        ],
        "a second drain, a re-registration of the same shape and a refused change log nothing"
    );
    let events: Vec<_> = s.events.iter().collect();
    assert!(
        matches!(&events[1].kind, ClusterEventKind::NodeDraining { reason } if reason.contains("maintenance"))
    );
    assert!(matches!(&events[4].kind, ClusterEventKind::NodeJoined { shape } if shape.gpus == 2));
    assert!(matches!(&events[7].kind, ClusterEventKind::PolicyApplied { audit: a } if *a == audit));
    // Bounded: the oldest go first.
    for i in 0..CLUSTER_EVENTS_MAX as i64 {
        s.apply(&cmd(100 + i, Op::SetPolicy { policy: s.policy.clone(), audit: None }));
    }
    assert_eq!(s.events.len(), CLUSTER_EVENTS_MAX);
    assert_eq!(s.events.iter().next().map(|e| e.time_ms), Some(100));
}

#[test]
fn a_record_keeps_each_run_its_preemption_its_checkpoint_and_holds() {
    let mut s = cluster(2);
    let mut sp = spec(2, "training");
    sp.requeue = true;
    sp.gpu_model = Some("A100|H100".into());
    let id =
        submitted(s.apply(&cmd(10, Op::Submit { spec: sp, request_id: None, hold: true, limits: None })));
    s.apply(&cmd(20, Op::Release { job: id, by: "alice".into() }));
    run_plan(&mut s, 30);
    s.apply(&cmd(40, Op::JobStarted { job: id, attempt: 0, node: "n1".into() }));
    let urgent = submitted(s.apply(&cmd(
        50,
        Op::Submit { spec: spec(2, "inference"), request_id: None, hold: false, limits: None },
    )));
    let _ = urgent;
    preempt(&mut s, 60);
    s.apply(&cmd(65, Op::Checkpointed { job: id, attempt: 0, node: "n1".into() }));
    s.apply(&cmd(70, Op::JobExited { job: id, attempt: 0, node: "n1".into(), exit: RunExit::Signal(15) }));
    let live = JobRecord::of(&s.jobs[&id], 0);
    assert_eq!(
        live.replay.runs,
        vec![RunWindow { start_ms: 40, end_ms: 70, preempted_ms: 60, checkpointed: true }]
    );
    assert_eq!(live.replay.holds, vec![HoldWindow { held_ms: 10, released_ms: 20 }]);
    assert_eq!(live.replay.gpu_model.as_deref(), Some("A100|H100"));
    assert!(live.replay.requeue);
    s.apply(&cmd(80, Op::Cancel { job: urgent, by: "bob".into() }));
    // The inference job was never started: cancelling it frees its claim; the training job
    // runs again and completes.
    run_plan(&mut s, 90);
    s.apply(&cmd(100, Op::JobStarted { job: id, attempt: 1, node: "n1".into() }));
    s.apply(&cmd(150, Op::JobExited { job: id, attempt: 1, node: "n1".into(), exit: RunExit::Code(0) }));
    let done = JobRecord::of(&s.jobs[&id], 0);
    assert_eq!(done.replay.runs.len(), 2);
    assert_eq!(done.replay.runs[1], RunWindow { start_ms: 100, end_ms: 150, ..RunWindow::default() });
    // It travels through the log's serde and back.
    let text = serde_json::to_string(&done).unwrap();
    assert_eq!(serde_json::from_str::<JobRecord>(&text).unwrap(), done);
}

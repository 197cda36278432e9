//! The cluster's history as a replayable trace (`kairos history --export-trace`): the window's
//! job records, the nodes and their recorded changes, in `kairos_sim::history`'s form. Pure:
//! `build` takes what the controllers answered.

use std::collections::{BTreeMap, BTreeSet};

use kairos_proto::v1 as pb;
use kairos_sim::history::{
    ArrayTask, HistoryJob, HistoryTrace, NodeChange, NodeEvent, NodeShape, Recorded, Window,
};

use crate::client::Client;
use crate::output::job_state_name;

/// How long a job with no run, or one still running, is taken to need when nothing else tells
/// (its time limit when it has one).
const UNKNOWN_WORK_MS: i64 = 3_600_000;

/// A preempted run stops this long after the signal when the record does not say.
const STOP_MS_DEFAULT: i64 = 5_000;

/// Fetches the window [since, until] (Unix ms; until 0: now) and builds its trace.
pub async fn fetch(client: &Client, since: i64, until: i64, now: i64) -> anyhow::Result<HistoryTrace> {
    let request = pb::ListHistoryRequest { since_ms: since, until_ms: until, ..Default::default() };
    let records = crate::insight::records(client, request).await?;
    let nodes = client
        .admin(pb::ListNodesRequest {}, |mut c, r| async move { c.list_nodes(r).await })
        .await?
        .into_inner()
        .nodes;
    let events = client
        .admin(pb::ListClusterEventsRequest { since_ms: 0 }, |mut c, r| async move {
            c.list_cluster_events(r).await
        })
        .await?
        .into_inner()
        .events;
    let policy = crate::client::get_policy(client).await?;
    let policy_toml =
        crate::policy_file::PolicyFile::from_pb(&policy).to_toml().map_err(anyhow::Error::msg)?;
    let window =
        Window { from_ms: since, to_ms: if until == 0 { now } else { until }, exported_ms: now, policy_toml };
    Ok(build(window, &records, &nodes, &events, &policy))
}

/// The trace of `records` on `nodes` with their `events`, under `policy` (what tells a job's
/// own time limit from its QoS's).
pub fn build(
    window: Window,
    records: &[pb::JobRecord],
    nodes: &[pb::Node],
    events: &[pb::ClusterEvent],
    policy: &pb::Policy,
) -> HistoryTrace {
    let qos_wall: BTreeMap<&str, u64> = policy.qos.iter().map(|q| (q.name.as_str(), q.max_wall_s)).collect();
    let mut jobs: Vec<HistoryJob> = records
        .iter()
        .filter(|r| r.submit_time_ms <= window.to_ms)
        .map(|r| job(r, &qos_wall, &window))
        .collect();
    jobs.sort_by_key(|j| (j.submit_ms, j.id));
    let mut trace = HistoryTrace { window, nodes: Vec::new(), node_events: Vec::new(), jobs };
    let origin = trace.origin_ms();
    (trace.nodes, trace.node_events) = node_history(origin, trace.window.to_ms, nodes, events);
    trace
}

fn shape_of_node(n: &pb::Node) -> NodeShape {
    let info = n.info.clone().unwrap_or_default();
    NodeShape {
        name: n.name.clone(),
        gpus: info.gpus.len() as u32,
        gpu_model: info.gpus.first().map(|g| g.model.clone()).unwrap_or_default(),
        cpus: info.cpus,
        memory_mib: info.memory_mib,
        labels: info.labels.into_iter().collect(),
    }
}

fn shape_of_event(e: &pb::ClusterEvent) -> NodeShape {
    NodeShape {
        name: e.node.clone(),
        gpus: e.gpus,
        gpu_model: e.gpu_model.clone(),
        cpus: e.cpus,
        memory_mib: e.memory_mib,
        labels: e.labels.clone().into_iter().collect(),
    }
}

fn change_of(e: &pb::ClusterEvent) -> Option<NodeChange> {
    Some(match e.kind.as_str() {
        "node joined" => NodeChange::Joined { shape: shape_of_event(e) },
        "node draining" => NodeChange::Draining { reason: e.reason.clone() },
        "node down" => NodeChange::Down { reason: e.reason.clone() },
        "node up" => NodeChange::Up,
        "node removed" => NodeChange::Removed,
        _ => return None,
    })
}

/// The nodes when the replay begins (`origin`), and their changes up to `to`. A node with no
/// recorded change before `origin` whose first change is not a join existed from the start, as
/// it is now.
fn node_history(
    origin: i64,
    to: i64,
    nodes: &[pb::Node],
    events: &[pb::ClusterEvent],
) -> (Vec<NodeShape>, Vec<NodeEvent>) {
    let mut at_origin: BTreeMap<String, (NodeShape, Option<NodeChange>)> = BTreeMap::new();
    let mut seen: BTreeSet<&str> = BTreeSet::new();
    let mut later = Vec::new();
    for e in events {
        let Some(change) = change_of(e) else { continue };
        if e.time_ms > to {
            continue;
        }
        if e.time_ms > origin {
            if seen.insert(&e.node) && !matches!(change, NodeChange::Joined { .. }) {
                // It existed before its first change: as it is now (or as that change's
                // join would have said).
                if let Some(n) = nodes.iter().find(|n| n.name == e.node) {
                    at_origin.insert(e.node.clone(), (shape_of_node(n), None));
                }
            }
            later.push(NodeEvent { at_ms: e.time_ms, node: e.node.clone(), change });
            continue;
        }
        seen.insert(&e.node);
        match change {
            NodeChange::Joined { shape } => {
                at_origin.insert(e.node.clone(), (shape, None));
            }
            NodeChange::Removed => {
                at_origin.remove(&e.node);
            }
            NodeChange::Up => {
                at_origin.entry(e.node.clone()).and_modify(|n| n.1 = None);
            }
            state => {
                at_origin.entry(e.node.clone()).and_modify(|n| n.1 = Some(state));
            }
        }
    }
    for n in nodes.iter().filter(|n| !seen.contains(n.name.as_str())) {
        at_origin.insert(n.name.clone(), (shape_of_node(n), None));
    }
    let mut initial_events = Vec::new();
    let shapes = at_origin
        .into_iter()
        .map(|(name, (shape, state))| {
            if let Some(change) = state {
                initial_events.push(NodeEvent { at_ms: origin, node: name.clone(), change });
            }
            NodeShape { name, ..shape }
        })
        .collect();
    initial_events.extend(later);
    (shapes, initial_events)
}

/// One job as the replay needs it.
fn job(r: &pb::JobRecord, qos_wall: &BTreeMap<&str, u64>, window: &Window) -> HistoryJob {
    let state = job_state_name(r.state).to_string();
    let terminal = r.end_time_ms > 0;
    let mut runs = r.runs.clone();
    if runs.is_empty() && r.start_time_ms > 0 {
        runs.push(pb::RunWindow { start_ms: r.start_time_ms, end_ms: r.end_time_ms, ..Default::default() });
    }
    let checkpoint_on_signal = runs.iter().any(|w| w.checkpointed);
    let work_ms = work_ms(r, &runs, terminal, window.to_ms);
    let mut stops: Vec<i64> = runs
        .iter()
        .filter(|w| w.preempted_ms > 0 && w.end_ms > 0)
        .map(|w| w.end_ms - w.preempted_ms)
        .collect();
    stops.sort_unstable();
    let own_limit = (r.time_limit_s > 0 && qos_wall.get(r.qos.as_str()) != Some(&r.time_limit_s))
        .then_some(r.time_limit_s);
    let cancelled = r.state == pb::JobState::Cancelled as i32;
    HistoryJob {
        id: r.id,
        name: r.name.clone(),
        user: r.user.clone(),
        account: r.account.clone(),
        partition: r.partition.clone(),
        qos: r.qos.clone(),
        profile: crate::output::profile_name(r.profile).to_string(),
        submit_ms: r.submit_time_ms,
        work_ms: work_ms.max(1),
        gpus: if r.gpus_per_task > 0 { r.gpus_per_task } else { r.gpus / r.tasks.max(1) },
        tasks: r.tasks.max(1),
        gpu_milli: r.gpu_milli,
        gpu_model: Some(r.gpu_model.clone()).filter(|m| !m.is_empty()),
        cpus: r.req_cpus,
        mem_mib: r.req_memory_mib,
        time_limit_s: own_limit,
        after_ok: r.after_ok.clone(),
        after_any: r.after_any.clone(),
        after_not_ok: r.after_not_ok.clone(),
        array: (r.array_job_id != 0).then_some(ArrayTask {
            id: r.array_job_id,
            index: r.array_task_id,
            count: r.array_task_count,
            limit: r.array_max_running,
        }),
        requeue: r.requeue,
        checkpoint_on_signal,
        stop_ms: stops.get(stops.len() / 2).copied().unwrap_or(STOP_MS_DEFAULT).max(0),
        holds: r.holds.iter().map(|h| (h.held_ms, h.released_ms)).collect(),
        cancel_ms: cancelled.then_some(r.end_time_ms).filter(|t| *t > 0),
        exit_code: r.exit_code.unwrap_or(0),
        recorded: Recorded {
            state,
            starts: runs.iter().map(|w| w.start_ms).collect(),
            end_ms: terminal.then_some(r.end_time_ms),
            preemptions: r.preemptions,
        },
    }
}

/// The run time job `r` needed (ms): each run's useful time — the last one's all (so far, up to
/// `to`, for one still running; none when it was requeued after it), an earlier one's only when
/// it saved its work on the signal — and, for a job that has not run to its end, its time limit
/// (or an hour) still to come.
fn work_ms(r: &pb::JobRecord, runs: &[pb::RunWindow], terminal: bool, to: i64) -> i64 {
    let last = runs.len().saturating_sub(1);
    let still_runs = runs.last().is_some_and(|w| w.end_ms == 0);
    let requeued_after_last = !terminal && !still_runs && !runs.is_empty();
    let mut work_ms: i64 = runs
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let end = if w.end_ms > 0 { w.end_ms } else { to.max(w.start_ms) };
            let useful = (i == last && !requeued_after_last) || (w.preempted_ms > 0 && w.checkpointed);
            if useful {
                (end - w.start_ms).max(0)
            } else {
                0
            }
        })
        .sum();
    if runs.is_empty() || requeued_after_last {
        work_ms += if r.time_limit_s > 0 { r.time_limit_s as i64 * 1000 } else { UNKNOWN_WORK_MS };
    }
    work_ms
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, gpus: u32) -> pb::Node {
        let gpu = |i| pb::Gpu { index: i, model: "fake".into(), ..Default::default() };
        pb::Node {
            name: name.into(),
            info: Some(pb::NodeInfo {
                name: name.into(),
                gpus: (0..gpus).map(gpu).collect(),
                cpus: 8,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn event(t: i64, node: &str, kind: &str) -> pb::ClusterEvent {
        pb::ClusterEvent {
            time_ms: t,
            node: node.into(),
            kind: kind.into(),
            gpus: 2,
            gpu_model: "fake".into(),
            ..Default::default()
        }
    }

    #[test]
    fn runs_become_the_work_a_job_needed_and_nodes_their_changes() {
        let policy = pb::Policy {
            qos: vec![pb::Qos { name: "training".into(), max_wall_s: 3600, ..Default::default() }],
            ..Default::default()
        };
        // Preempted without a checkpoint at 20 s (its 10 s redone), then ran 30 s.
        let preempted = pb::JobRecord {
            id: 1,
            qos: "training".into(),
            state: pb::JobState::Completed as i32,
            gpus: 4,
            gpus_per_task: 2,
            tasks: 2,
            submit_time_ms: 1_000,
            end_time_ms: 70_000,
            time_limit_s: 3600,
            preemptions: 1,
            runs: vec![
                pb::RunWindow { start_ms: 10_000, end_ms: 22_000, preempted_ms: 20_000, checkpointed: false },
                pb::RunWindow { start_ms: 40_000, end_ms: 70_000, ..Default::default() },
            ],
            ..Default::default()
        };
        // Saved its work on the signal: both runs count; its own limit is kept.
        let saved = pb::JobRecord {
            id: 2,
            qos: "training".into(),
            time_limit_s: 600,
            runs: vec![
                pb::RunWindow { start_ms: 10_000, end_ms: 22_000, preempted_ms: 20_000, checkpointed: true },
                pb::RunWindow { start_ms: 40_000, end_ms: 50_000, ..Default::default() },
            ],
            state: pb::JobState::Completed as i32,
            end_time_ms: 50_000,
            ..preempted.clone()
        };
        let cancelled = pb::JobRecord {
            id: 3,
            state: pb::JobState::Cancelled as i32,
            submit_time_ms: 500,
            end_time_ms: 9_000,
            runs: vec![],
            ..preempted.clone()
        };
        let window = Window { from_ms: 5_000, to_ms: 100_000, ..Default::default() };
        let nodes = [node("n1", 4), node("n2", 2)];
        let events = [
            event(100, "n3", "node joined"),
            event(200, "n3", "node removed"),
            event(300, "n2", "node joined"),
            event(30_000, "n1", "node draining"),
            event(60_000, "n1", "node up"),
            event(80_000, "n4", "node joined"),
        ];
        let t = build(window, &[preempted, saved, cancelled], &nodes, &events, &policy);
        let j: Vec<_> =
            t.jobs.iter().map(|j| (j.id, j.work_ms, j.time_limit_s, j.stop_ms, j.cancel_ms)).collect();
        assert_eq!(
            j,
            vec![
                (3, 3_600_000, None, 5_000, Some(9_000)),
                (1, 30_000, None, 2_000, None),
                (2, 22_000, Some(600), 2_000, None)
            ]
        );
        assert_eq!((t.jobs[1].gpus, t.jobs[1].tasks, t.jobs[1].recorded.starts.len()), (2, 2, 2));
        assert!(t.jobs[2].checkpoint_on_signal && !t.jobs[1].checkpoint_on_signal);
        assert_eq!(t.origin_ms(), 500);
        let names: Vec<_> = t.nodes.iter().map(|n| (n.name.as_str(), n.gpus)).collect();
        assert_eq!(names, vec![("n1", 4), ("n2", 2)], "n3 left before the origin; n4 joins later");
        let later: Vec<_> = t.node_events.iter().map(|e| (e.at_ms, e.node.as_str())).collect();
        assert_eq!(later, vec![(30_000, "n1"), (60_000, "n1"), (80_000, "n4")]);
        assert_eq!(HistoryTrace::parse("t", &t.to_jsonl()).unwrap(), t);
    }
}

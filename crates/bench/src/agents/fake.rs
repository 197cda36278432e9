//! The harness's agents: the agent's own session code (`kairos_agent::session`) carrying out
//! fake runs — a run "starts" when its assignment arrives (while the lease is valid, as the
//! agent's runner launches), ends on time (`sleep N` ends after N seconds), stops when told
//! to, and is fenced when the lease lapses — with the reports a real agent sends.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kairos_agent::decide::RunKey;
use kairos_agent::fence::Lease;
use kairos_agent::session::Runs;
use kairos_proto::v1 as pb;
use tokio::sync::mpsc;

/// What every fake agent counts, together.
#[derive(Default)]
pub struct Tally {
    pub started: AtomicU64,
    pub completed: AtomicU64,
    /// Runs the controller told to stop, or dropped from the set while they ran.
    pub killed: AtomicU64,
    /// Runs stopped because the agent's lease lapsed.
    pub fenced: AtomicU64,
    /// Reports that did not fit the agent's queue.
    pub reports_lost: AtomicU64,
    /// Heartbeat round trips (µs) while `measuring`.
    pub heartbeats: Mutex<Vec<u32>>,
    pub measuring: std::sync::atomic::AtomicBool,
}

/// One fake agent's runs.
#[derive(Clone)]
pub struct FakeRuns(Arc<Inner>);

struct Inner {
    node: String,
    lease: Lease,
    reports: mpsc::Sender<pb::StatusReport>,
    tally: Arc<Tally>,
    /// Live runs, and assigned runs waiting for a valid lease.
    runs: Mutex<HashMap<RunKey, Run>>,
    /// When a registration was last taken (ms since `epoch`; 0: never).
    registered_ms: AtomicU64,
    epoch: Instant,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Run {
    /// Assigned; waits for a valid lease.
    Waiting(Duration),
    Live,
    Ended,
}

impl FakeRuns {
    pub fn new(
        node: String,
        lease: Lease,
        reports: mpsc::Sender<pb::StatusReport>,
        tally: Arc<Tally>,
        epoch: Instant,
    ) -> FakeRuns {
        FakeRuns(Arc::new(Inner {
            node,
            lease,
            reports,
            tally,
            runs: Mutex::default(),
            registered_ms: AtomicU64::new(0),
            epoch,
        }))
    }

    /// When a controller last took this agent's registration (since the harness's epoch).
    pub fn registered_at(&self) -> Option<Duration> {
        match self.0.registered_ms.load(Ordering::SeqCst) {
            0 => None,
            ms => Some(Duration::from_millis(ms)),
        }
    }

    /// Stops every live run if the lease has lapsed (the agent's fence task).
    pub fn fence_if_lapsed(&self) {
        if !self.0.lease.lapsed() {
            return;
        }
        let mut runs = self.lock();
        for (key, run) in runs.iter_mut().filter(|(_, r)| **r == Run::Live) {
            *run = Run::Ended;
            self.0.tally.fenced.fetch_add(1, Ordering::SeqCst);
            self.report(*key, pb::RunStatus::Exited, 9);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<RunKey, Run>> {
        self.0.runs.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn report(&self, (job_id, attempt): RunKey, status: pb::RunStatus, signal: i32) {
        let report = pb::StatusReport {
            node_id: self.0.node.clone(),
            job_id,
            attempt,
            status: status as i32,
            signal,
            ..Default::default()
        };
        if self.0.reports.try_send(report).is_err() {
            self.0.tally.reports_lost.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Starts `key` now: it ends by itself after `runs_for`.
    fn start(&self, key: RunKey, runs_for: Duration) {
        self.0.tally.started.fetch_add(1, Ordering::SeqCst);
        self.report(key, pb::RunStatus::Started, 0);
        let me = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(runs_for).await;
            let ended = {
                let mut runs = me.lock();
                match runs.get_mut(&key) {
                    Some(r @ Run::Live) => {
                        *r = Run::Ended;
                        true
                    }
                    _ => false,
                }
            };
            if ended {
                me.0.tally.completed.fetch_add(1, Ordering::SeqCst);
                me.report(key, pb::RunStatus::Exited, 0);
            }
        });
    }
}

/// How long a fake run runs: `sleep N` N seconds, anything else a minute.
fn runs_for(argv: &[String]) -> Duration {
    match argv {
        [cmd, secs] if cmd == "sleep" => Duration::from_secs(secs.parse().unwrap_or(60)),
        _ => Duration::from_secs(60),
    }
}

impl Runs for FakeRuns {
    fn running(&self) -> Vec<RunKey> {
        self.lock().iter().filter(|(_, r)| **r == Run::Live).map(|(k, _)| *k).collect()
    }

    fn reconcile(&self, set: &pb::AssignmentSet) {
        let assigned: HashMap<RunKey, &pb::Assignment> =
            set.runs.iter().map(|a| ((a.job_id, a.attempt), a)).collect();
        let mut stopped = Vec::new();
        {
            let mut runs = self.lock();
            // Runs the controller no longer lists: a live one is stopped (the real runner kills
            // it); ended ones are forgotten.
            runs.retain(|key, run| {
                if assigned.contains_key(key) {
                    return true;
                }
                if *run == Run::Live {
                    stopped.push(*key);
                }
                false
            });
            for (key, a) in &assigned {
                match runs.get(key).copied() {
                    None if !a.kill && !a.started => {
                        runs.insert(*key, Run::Waiting(runs_for(&a.argv)));
                    }
                    Some(Run::Live) if a.kill => {
                        runs.insert(*key, Run::Ended);
                        stopped.push(*key);
                    }
                    _ => {}
                }
            }
        }
        for key in stopped {
            self.0.tally.killed.fetch_add(1, Ordering::SeqCst);
            self.report(key, pb::RunStatus::Exited, 15);
        }
        self.launch_ready();
    }

    fn launch_ready(&self) {
        if !self.0.lease.valid() {
            return;
        }
        let mut start = Vec::new();
        {
            let mut runs = self.lock();
            for (key, run) in runs.iter_mut() {
                if let Run::Waiting(d) = *run {
                    *run = Run::Live;
                    start.push((*key, d));
                }
            }
        }
        for (key, d) in start {
            self.start(key, d);
        }
    }

    fn registered(&self) {
        let ms = self.0.epoch.elapsed().as_millis().max(1) as u64;
        self.0.registered_ms.store(ms, Ordering::SeqCst);
    }

    fn heartbeat_answered(&self, took: Duration) {
        if self.0.tally.measuring.load(Ordering::Relaxed) {
            let us = took.as_micros().min(u32::MAX as u128) as u32;
            self.0.tally.heartbeats.lock().unwrap_or_else(|p| p.into_inner()).push(us);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assignment(job: u64, argv: &[&str], kill: bool) -> pb::Assignment {
        pb::Assignment {
            job_id: job,
            argv: argv.iter().map(|s| s.to_string()).collect(),
            kill,
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn a_fake_run_starts_with_a_valid_lease_ends_on_time_and_is_fenced_when_the_lease_lapses() {
        let (tx, mut rx) = mpsc::channel(16);
        let tally = Arc::new(Tally::default());
        let lease = Lease::in_memory();
        let runs = FakeRuns::new("n1".into(), lease.clone(), tx, tally.clone(), Instant::now());
        let set = |runs: Vec<pb::Assignment>| pb::AssignmentSet { runs, applied_index: 1 };
        runs.reconcile(&set(vec![assignment(1, &["sleep", "1"], false)]));
        assert!(runs.running().is_empty(), "no lease yet: nothing starts");
        let now = kairos_agent::fence::mono_ms();
        lease.renew(kairos_agent::fence::Renewal { valid_until: now + 60_000, hard_deadline: now + 61_000 });
        runs.launch_ready();
        assert_eq!(runs.running(), vec![(1, 0)]);
        assert_eq!(rx.recv().await.unwrap().status, pb::RunStatus::Started as i32);
        let exit = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.unwrap().unwrap();
        assert_eq!((exit.status, exit.signal), (pb::RunStatus::Exited as i32, 0));
        assert_eq!(tally.completed.load(Ordering::SeqCst), 1);
        // Told to stop: a kill; dropped from the set while live: a kill too.
        runs.reconcile(&set(vec![assignment(2, &["sleep", "50"], false), assignment(3, &["x"], false)]));
        runs.reconcile(&set(vec![assignment(2, &["sleep", "50"], true)]));
        assert_eq!(tally.killed.load(Ordering::SeqCst), 2);
        runs.reconcile(&set(vec![assignment(4, &["sleep", "50"], false)]));
        assert_eq!(tally.fenced.load(Ordering::SeqCst), 0);
        runs.fence_if_lapsed();
        assert_eq!(tally.fenced.load(Ordering::SeqCst), 0, "the lease is valid");
        let lapsed = Lease::in_memory();
        let now = kairos_agent::fence::mono_ms();
        lapsed.renew(kairos_agent::fence::Renewal { valid_until: now.saturating_sub(1), hard_deadline: now });
        let (tx, _rx) = mpsc::channel(16);
        let fenced = FakeRuns::new("n2".into(), lease, tx, tally.clone(), Instant::now());
        fenced.reconcile(&set(vec![assignment(5, &["sleep", "50"], false)]));
        assert_eq!(fenced.running().len(), 1);
        let f2 = FakeRuns(Arc::new(Inner {
            node: "n3".into(),
            lease: lapsed,
            reports: mpsc::channel(4).0,
            tally: tally.clone(),
            runs: Mutex::new([((6, 0), Run::Live)].into()),
            registered_ms: AtomicU64::new(0),
            epoch: Instant::now(),
        }));
        f2.fence_if_lapsed();
        assert_eq!(tally.fenced.load(Ordering::SeqCst), 1, "a lapsed lease stops the live run");
        assert!(f2.running().is_empty());
    }
}

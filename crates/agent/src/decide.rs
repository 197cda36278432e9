//! The agent's decisions, pure: from the runs the controller assigns this node (`assigned_of`)
//! and the runs the node has, what to do — freeze or thaw, report, stop, kill, forget, launch. The runner
//! (`runner::Runner`) carries the actions out on processes and cgroups; the deterministic
//! simulation's agent (`kairos-chaos`) on modelled processes. No IO, no clock.

use std::collections::{BTreeMap, BTreeSet};

/// A run: (job id, attempt).
pub type RunKey = (u64, u32);

/// One run the controller assigns this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assigned {
    pub key: RunKey,
    pub gpus: Vec<u32>,
    /// A fraction of its one GPU, in thousandths (0: its GPUs whole).
    pub milli: u32,
    /// The controller has heard it started.
    pub started: bool,
    /// It must stop: (signal, grace before SIGKILL in seconds).
    pub stop: Option<(String, u32)>,
    /// It must be frozen (SUSPEND preemption).
    pub suspend: bool,
}

/// One run the node has (launching, running, or ended and not yet forgotten).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Local {
    pub gpus: Vec<u32>,
    /// A fraction of its one GPU, in thousandths (0: its GPUs whole).
    pub milli: u32,
    /// Its processes exist (it is not still being launched).
    pub spawned: bool,
    pub ended: bool,
    /// A stop or kill is under way.
    pub stopping: bool,
    pub suspended: bool,
}

/// Why a run the controller lists is reported lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lost {
    /// Told to stop before it was ever launched here.
    StoppedBeforeStart,
    /// The controller heard it started, and this node has no process for it.
    NoProcess,
}

/// What to do with one run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Freeze (true) or thaw (false) it.
    Freeze(RunKey, bool),
    /// Tell the controller it started (its earlier report was lost).
    ReportStarted(RunKey),
    /// Tell the controller how it ended.
    ReportExit(RunKey),
    /// Tell the controller a run this node does not have is lost.
    ReportLost(RunKey, Lost),
    /// Send `signal`, then SIGKILL after `grace_s`.
    Stop { key: RunKey, signal: String, grace_s: u32 },
    /// Kill it at once: the controller no longer assigns it.
    Kill(RunKey),
    /// Forget an ended run the controller no longer assigns.
    Forget(RunKey),
}

/// The controller's assignments as `decide` reads them — one mapping for the runner and for
/// the deterministic simulation's agent (which reads what the server would send,
/// `kairos_server::assignments::assignments_for`): a `kill` is a stop with its signal and grace.
pub fn assigned_of(runs: &[kairos_proto::v1::Assignment]) -> Vec<Assigned> {
    runs.iter()
        .map(|a| Assigned {
            key: (a.job_id, a.attempt),
            gpus: a.gpu_ids.clone(),
            milli: a.gpu_milli,
            started: a.started,
            stop: a.kill.then(|| (a.kill_signal.clone(), a.kill_grace_s)),
            suspend: a.suspend,
        })
        .collect()
}

/// The actions that make the node's runs match `assigned` (launches aside: `launches`, once
/// these are carried out). Freezes and thaws come first, so a launch never shares a GPU with a
/// process that still computes.
pub fn reconcile(assigned: &[Assigned], local: &BTreeMap<RunKey, Local>) -> Vec<Action> {
    let mut actions = Vec::new();
    let listed: BTreeSet<RunKey> = assigned.iter().map(|a| a.key).collect();
    for a in assigned {
        let Some(run) = local.get(&a.key) else {
            if a.stop.is_some() {
                actions.push(Action::ReportLost(a.key, Lost::StoppedBeforeStart));
            } else if a.started {
                actions.push(Action::ReportLost(a.key, Lost::NoProcess));
            }
            // Otherwise it is launched, once it may be.
            continue;
        };
        if !run.ended && a.stop.is_none() && a.suspend != run.suspended {
            actions.push(Action::Freeze(a.key, a.suspend));
        }
        if run.ended {
            actions.push(Action::ReportExit(a.key));
        } else if let Some((signal, grace_s)) = a.stop.as_ref().filter(|_| !run.stopping) {
            actions.push(Action::Stop { key: a.key, signal: signal.clone(), grace_s: *grace_s });
        } else if !a.started && run.spawned {
            // The "started" report was lost (a failover): said again once the process exists.
            actions.push(Action::ReportStarted(a.key));
        }
    }
    for (key, run) in local.iter().filter(|(key, _)| !listed.contains(key)) {
        if run.ended {
            actions.push(Action::Forget(*key));
        } else if run.spawned {
            actions.push(Action::Kill(*key));
        }
    }
    actions
}

/// The assigned runs to launch now, in order: with a valid lease, those not started, not told
/// to stop and not here yet, none of whose GPUs a run of this node still holds (one being
/// killed included; a frozen run lends its GPUs, one still launching does not) — or, for a fraction, whose GPU has its share
/// free beside the fractions still there. The others wait for a later call.
pub fn launches(assigned: &[Assigned], local: &BTreeMap<RunKey, Local>, leased: bool) -> Vec<RunKey> {
    if !leased {
        return Vec::new();
    }
    // GPU -> thousandths held (a whole GPU: all of them).
    let mut busy: BTreeMap<u32, u32> = BTreeMap::new();
    let hold = |busy: &mut BTreeMap<u32, u32>, gpus: &[u32], milli: u32| {
        for g in gpus {
            *busy.entry(*g).or_insert(0) += if milli == 0 { WHOLE } else { milli };
        }
    };
    // A suspended run lends its GPUs only once its processes exist (frozen): one suspended
    // while it still launches would compute beside the run it lent them to.
    let holds_none = |r: &Local| r.ended || (r.suspended && r.spawned);
    for r in local.values().filter(|r| !holds_none(r)) {
        hold(&mut busy, &r.gpus, r.milli);
    }
    let mut out = Vec::new();
    for a in assigned {
        let want = if a.milli == 0 { WHOLE } else { a.milli };
        if a.stop.is_some()
            || a.started
            || local.contains_key(&a.key)
            || a.gpus.iter().any(|g| busy.get(g).copied().unwrap_or(0) + want > WHOLE)
        {
            continue;
        }
        hold(&mut busy, &a.gpus, a.milli);
        out.push(a.key);
    }
    out
}

/// Thousandths of a whole GPU.
const WHOLE: u32 = 1000;

#[cfg(test)]
mod tests {
    use super::*;

    fn assigned(job: u64, gpus: &[u32]) -> Assigned {
        Assigned { key: (job, 0), gpus: gpus.to_vec(), milli: 0, started: false, stop: None, suspend: false }
    }

    #[test]
    fn an_assignment_told_to_stop_is_read_with_its_signal_and_grace_and_a_running_one_without() {
        let wire = |kill| kairos_proto::v1::Assignment {
            job_id: 4,
            attempt: 2,
            gpu_ids: vec![1, 3],
            gpu_milli: 250,
            started: true,
            kill,
            kill_signal: "SIGUSR1".into(),
            kill_grace_s: 30,
            suspend: !kill,
            ..Default::default()
        };
        let read = assigned_of(&[wire(true), wire(false)]);
        let stop = Some(("SIGUSR1".to_string(), 30));
        let told =
            Assigned { key: (4, 2), gpus: vec![1, 3], milli: 250, started: true, stop, suspend: false };
        assert_eq!(read[0], told);
        assert_eq!(read[1], Assigned { stop: None, suspend: true, ..told });
    }

    #[test]
    fn fractions_share_a_gpu_up_to_a_whole_one_and_never_beside_a_whole_run() {
        let frac = |job, milli| Assigned { milli, ..assigned(job, &[0]) };
        let set = vec![frac(1, 500), frac(2, 250), frac(3, 500), frac(4, 250), assigned(5, &[0])];
        assert_eq!(launches(&set, &BTreeMap::new(), true), vec![(1, 0), (2, 0), (4, 0)]);
        let mut local = BTreeMap::new();
        local.insert((9, 0), running(&[0]));
        assert_eq!(launches(&set, &local, true), Vec::<RunKey>::new(), "a whole run still holds GPU 0");
        local.insert((9, 0), Local { milli: 750, ..running(&[0]) });
        assert_eq!(launches(&set, &local, true), vec![(2, 0)]);
    }

    fn running(gpus: &[u32]) -> Local {
        Local { gpus: gpus.to_vec(), spawned: true, ..Local::default() }
    }

    #[test]
    fn a_run_whose_gpu_is_still_held_waits_and_a_frozen_run_lends_its_gpus() {
        let set = vec![assigned(1, &[0]), assigned(2, &[0]), assigned(3, &[1])];
        let mut local = BTreeMap::new();
        assert_eq!(launches(&set, &local, true), vec![(1, 0), (3, 0)], "two runs never share GPU 0");
        assert_eq!(launches(&set, &local, false), Vec::<RunKey>::new(), "no lease, no launch");
        local.insert((9, 0), Local { stopping: true, ..running(&[1]) });
        assert_eq!(launches(&set, &local, true), vec![(1, 0)], "a run being killed still holds GPU 1");
        local.insert((9, 0), Local { suspended: true, ..running(&[1]) });
        assert_eq!(launches(&set, &local, true), vec![(1, 0), (3, 0)]);
        // Suspended while it still launches: nothing to freeze yet, so it keeps GPU 1.
        local.insert((9, 0), Local { suspended: true, spawned: false, ..running(&[1]) });
        assert_eq!(launches(&set, &local, true), vec![(1, 0)], "a launching run lends nothing");
    }

    #[test]
    fn stops_reports_and_kills_follow_the_assignment() {
        let mut stop = assigned(1, &[0]);
        stop.stop = Some(("SIGUSR1".into(), 30));
        let mut gone = assigned(2, &[1]);
        gone.started = true;
        let mut lost_start = assigned(3, &[2]);
        lost_start.started = false;
        let mut freeze = assigned(4, &[3]);
        freeze.suspend = true;
        freeze.started = true;
        let set = vec![stop.clone(), gone, lost_start, freeze];
        let mut local = BTreeMap::new();
        local.insert((1, 0), running(&[0]));
        local.insert((3, 0), running(&[2]));
        local.insert((4, 0), running(&[3]));
        local.insert((7, 0), running(&[5]));
        local.insert((8, 0), Local { ended: true, ..running(&[6]) });
        local.insert((6, 0), Local { spawned: false, ..Local::default() });
        let actions = reconcile(&set, &local);
        assert_eq!(
            actions,
            vec![
                Action::Stop { key: (1, 0), signal: "SIGUSR1".into(), grace_s: 30 },
                Action::ReportLost((2, 0), Lost::NoProcess),
                Action::ReportStarted((3, 0)),
                Action::Freeze((4, 0), true),
                // A run still being launched is neither killed nor forgotten.
                Action::Kill((7, 0)),
                Action::Forget((8, 0)),
            ]
        );
        // Once stopping, not stopped again; once ended, its exit is reported.
        local.insert((1, 0), Local { stopping: true, ..running(&[0]) });
        assert!(!reconcile(&[stop.clone()], &local).iter().any(|a| matches!(a, Action::Stop { .. })));
        local.insert((1, 0), Local { ended: true, ..running(&[0]) });
        assert_eq!(reconcile(&[stop.clone()], &local)[0], Action::ReportExit((1, 0)));
        assert_eq!(
            reconcile(&[stop], &BTreeMap::new()),
            vec![Action::ReportLost((1, 0), Lost::StoppedBeforeStart)]
        );
    }
}

//! Tests of the runner: real child processes, process groups, cgroups where the host has them.

use super::*;
use crate::account::{RunAs, UnixAccounts};
use crate::cgroup::Cgroups;
use crate::journal::{journal_dir, kill_orphans};
use crate::launch::{job_dir, log_path};
use std::os::unix::fs::PermissionsExt;

pub(super) fn assignment(job: u64, argv: &[&str], started: bool, kill: bool) -> pb::Assignment {
    pb::Assignment {
        job_id: job,
        attempt: 0,
        argv: argv.iter().map(|s| s.to_string()).collect(),
        env: Default::default(),
        workdir: String::new(),
        workdir_is_submit_dir: false,
        gpu_ids: vec![3, 5],
        started,
        kill,
        kill_grace_s: 1,
        rank: 0,
        world_size: 1,
        master_addr: String::new(),
        master_port: 29500,
        kill_signal: "SIGTERM".into(),
        suspend: false,
        checkpoint_signal: "SIGUSR1".into(),
        user: "alice".into(),
        traceparent: String::new(),
        submit_time_ms: 0,
        cpus: 0,
        memory_mib: 0,
        gpu_milli: 0,
        container: None,
        idle_watch: None,
        interactive: false,
        keep_alive_s: 0,
    }
}

pub(super) async fn next(rx: &mut mpsc::Receiver<pb::StatusReport>) -> pb::StatusReport {
    tokio::time::timeout(Duration::from_secs(20), rx.recv()).await.expect("a report in time").expect("open")
}

/// The next report about `job`, past any about other runs (launches run off the caller's task,
/// so a run's start and another's end may come in either order).
pub(super) async fn next_of(rx: &mut mpsc::Receiver<pb::StatusReport>, job: u64) -> pb::StatusReport {
    loop {
        let report = next(rx).await;
        if report.job_id == job {
            return report;
        }
    }
}

pub(super) fn set(runs: Vec<pb::Assignment>) -> pb::AssignmentSet {
    pb::AssignmentSet { runs, applied_index: 1 }
}

#[tokio::test]
async fn launches_once_reports_exit_and_never_relaunches() {
    let dir = tempfile::tempdir().unwrap();
    let (tx, mut rx) = mpsc::channel(16);
    let runner = Runner::new("n1", dir.path(), tx);
    let a = assignment(
        7,
        &["sh", "-c", "echo $CUDA_VISIBLE_DEVICES $CUDA_DEVICE_ORDER $KAIROS_JOB_ID; exit 4"],
        false,
        false,
    );
    runner.reconcile(&set(vec![a.clone()]));
    let started = next(&mut rx).await;
    assert_eq!((started.job_id, started.status), (7, pb::RunStatus::Started as i32));
    let exited = next(&mut rx).await;
    assert_eq!((exited.status, exited.exit_code), (pb::RunStatus::Exited as i32, 4));
    let log = std::fs::read_to_string(log_path(dir.path(), 7, 0, 0)).unwrap();
    // CUDA numbers GPUs as NVML (and these indices) do only in PCI bus order.
    assert_eq!(log, "3,5 PCI_BUS_ID 7\n");
    // The same set again (the controller has not applied the exit yet): the exit is
    // reported again, and the run is not launched a second time.
    runner.reconcile(&set(vec![a]));
    let again = next(&mut rx).await;
    assert_eq!((again.status, again.exit_code), (pb::RunStatus::Exited as i32, 4));
    assert_eq!(std::fs::read_to_string(log_path(dir.path(), 7, 0, 0)).unwrap(), "3,5 PCI_BUS_ID 7\n");
}

#[tokio::test]
async fn a_started_run_this_agent_lacks_is_lost_not_relaunched() {
    let dir = tempfile::tempdir().unwrap();
    let (tx, mut rx) = mpsc::channel(16);
    let runner = Runner::new("n1", dir.path(), tx);
    runner.reconcile(&set(vec![assignment(9, &["true"], true, false)]));
    let r = next(&mut rx).await;
    assert_eq!((r.job_id, r.status), (9, pb::RunStatus::Lost as i32));
    assert!(!log_path(dir.path(), 9, 0, 0).exists(), "the run was launched");
}

#[tokio::test]
async fn kill_stops_the_group_and_unassigned_runs_are_killed() {
    let dir = tempfile::tempdir().unwrap();
    let (tx, mut rx) = mpsc::channel(16);
    let runner = Runner::new("n1", dir.path(), tx);
    let a = assignment(1, &["sleep", "300"], false, false);
    let b = pb::Assignment { gpu_ids: vec![6], ..assignment(2, &["sleep", "300"], false, false) };
    runner.reconcile(&set(vec![a.clone(), b]));
    next(&mut rx).await;
    next(&mut rx).await;
    assert_eq!(runner.running().len(), 2);
    // Job 1 is to be killed; job 2 is no longer assigned at all.
    runner.reconcile(&set(vec![pb::Assignment { kill: true, ..a }]));
    let mut exits = [next(&mut rx).await, next(&mut rx).await];
    exits.sort_by_key(|r| r.job_id);
    assert_eq!(exits.iter().map(|r| (r.job_id, r.signal)).collect::<Vec<_>>(), vec![(1, 15), (2, 9)]);
    assert!(runner.running().is_empty());
}

#[tokio::test]
async fn a_run_that_ended_unreaped_is_logged_as_ended_when_the_agent_restarts() {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    // A process that exits and stays a zombie (nobody reaps it), as an orphan under a
    // PID 1 that never reaps would.
    let mut child = std::process::Command::new("true").process_group(0).spawn().unwrap();
    let pgid = child.id() as i32;
    std::fs::create_dir_all(journal_dir(dir.path())).unwrap();
    std::fs::write(journal_dir(dir.path()).join("9-2"), format!("{pgid} 0\n")).unwrap();
    let zombie = (0..100).any(|_| {
        std::thread::sleep(Duration::from_millis(20));
        std::fs::read_to_string(format!("/proc/{pgid}/stat")).is_ok_and(|s| s.contains(") Z "))
    });
    assert!(zombie, "the child did not become a zombie");
    assert!(!group_alive(pgid), "a zombie counted as a live run");
    let path = dir.path().join("processes.jsonl");
    let log = crate::audit::ProcessLog::open(&path, "n1").unwrap();
    assert_eq!(kill_orphans(dir.path(), None, &log).await, 0);
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains(r#""job":9,"attempt":2"#) && text.contains("ended unwatched"), "{text}");
    child.wait().unwrap();
}

#[tokio::test]
async fn a_restarted_agent_kills_the_runs_its_predecessor_left_behind() {
    let dir = tempfile::tempdir().unwrap();
    let (tx, mut rx) = mpsc::channel(16);
    let runner = Runner::new("n1", dir.path(), tx);
    runner.reconcile(&set(vec![assignment(4, &["sh", "-c", "sleep 300 & exec sleep 300"], false, false)]));
    next(&mut rx).await;
    let pgid = {
        let runs = runner.lock();
        runs[&(4, 0)].pgid.unwrap()
    };
    assert!(group_alive(pgid));
    // The agent "crashes": its runner is gone but the processes live on.
    drop(runner);
    assert_eq!(kill_orphans(dir.path(), None, &Default::default()).await, 1);
    assert!(!group_alive(pgid), "the orphaned group survived");
    assert_eq!(kill_orphans(dir.path(), None, &Default::default()).await, 0, "the journal was cleared");
}

#[tokio::test]
async fn a_planted_journal_entry_cannot_kill_a_foreign_group() {
    let dir = tempfile::tempdir().unwrap();
    // A foreign group whose leader is gone and whose survivor is not a kairos run.
    use std::os::unix::process::CommandExt;
    let mut leader = std::process::Command::new("sh")
        .args(["-c", "sleep 300 >/dev/null 2>&1 & echo $!"])
        .stdout(std::process::Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    let pgid = leader.id() as i32;
    let _ = leader.wait();
    assert!(group_alive(pgid));
    // A job (same uid as the agent) plants a journal entry naming it.
    std::fs::create_dir_all(journal_dir(dir.path())).unwrap();
    std::fs::write(journal_dir(dir.path()).join("7-0"), format!("{pgid} 0\n")).unwrap();
    assert_eq!(kill_orphans(dir.path(), None, &Default::default()).await, 0);
    assert!(group_alive(pgid), "a foreign group was killed");
    signal_group(pgid, Signal::SIGKILL);
}

#[tokio::test]
async fn a_touched_checkpoint_marker_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let (tx, mut rx) = mpsc::channel(16);
    let runner = Runner::new("n1", dir.path(), tx);
    let script = "sleep 0.7; touch $KAIROS_CHECKPOINT_DIR/.kairos-checkpoint; sleep 300";
    runner.reconcile(&set(vec![assignment(5, &["sh", "-c", script], false, false)]));
    assert_eq!(next(&mut rx).await.status, pb::RunStatus::Started as i32);
    let r = next(&mut rx).await;
    assert_eq!((r.job_id, r.status), (5, pb::RunStatus::Checkpointed as i32));
    runner.stop_all(Duration::from_secs(1)).await;
}

/// The scheduling state of process `pid` ('T' = stopped), from /proc.
fn proc_state(pid: i32) -> char {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next()).unwrap_or('?')
}

/// Waits (bounded, generously: a loaded machine may keep a process in D state a while)
/// until `pid` is stopped, or running/sleeping.
async fn wait_for_state(pid: i32, stopped: bool) {
    for _ in 0..600 {
        let state = proc_state(pid);
        if (stopped && state == 'T') || (!stopped && matches!(state, 'S' | 'R')) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("process {pid} is in state {} (wanted stopped = {stopped})", proc_state(pid));
}

#[tokio::test]
async fn suspend_stops_the_group_resume_continues_it_and_a_kill_still_lands() {
    let dir = tempfile::tempdir().unwrap();
    let (tx, mut rx) = mpsc::channel(16);
    let runner = Runner::new("n1", dir.path(), tx);
    let a = assignment(6, &["sh", "-c", "exec sleep 300"], false, false);
    runner.reconcile(&set(vec![a.clone()]));
    assert_eq!(next(&mut rx).await.status, pb::RunStatus::Started as i32);
    let pid = runner.lock()[&(6, 0)].pgid.unwrap();
    wait_for_state(pid, false).await;
    let suspended = pb::Assignment { started: true, suspend: true, ..a.clone() };
    runner.reconcile(&set(vec![suspended.clone()]));
    wait_for_state(pid, true).await;
    runner.reconcile(&set(vec![pb::Assignment { suspend: false, ..suspended.clone() }]));
    wait_for_state(pid, false).await;
    // Cancelled while suspended: the stop signal is delivered (continued after it), not
    // left pending until the SIGKILL after the grace.
    runner.reconcile(&set(vec![suspended.clone()]));
    wait_for_state(pid, true).await;
    let killed = pb::Assignment { kill: true, kill_grace_s: 30, ..suspended };
    runner.reconcile(&set(vec![killed]));
    let r = next(&mut rx).await;
    assert_eq!((r.job_id, r.status, r.signal), (6, pb::RunStatus::Exited as i32, 15));
}

#[tokio::test]
async fn a_run_suspended_while_it_launches_is_frozen_once_it_has_started() {
    let dir = tempfile::tempdir().unwrap();
    let (tx, mut rx) = mpsc::channel(16);
    let runner = Runner::new("n1", dir.path(), tx);
    let a = assignment(13, &["sh", "-c", "exec sleep 300"], false, false);
    // The launch runs off this task: the suspension most likely finds it still launching.
    runner.reconcile(&set(vec![a.clone()]));
    let suspended = pb::Assignment { started: true, suspend: true, ..a };
    // The run it is suspended for, on the same GPUs, starts only once it is frozen.
    let urgent = assignment(14, &["sh", "-c", "exec sleep 300"], false, false);
    runner.reconcile(&set(vec![suspended.clone(), urgent.clone()]));
    let mut started = Vec::new();
    for _ in 0..2 {
        let r = next(&mut rx).await;
        assert_eq!(r.status, pb::RunStatus::Started as i32);
        if r.job_id == 14 {
            // Launched from the suspended run's own spawn (nothing else calls for a launch
            // here): that run existed, frozen, first.
            assert!(runner.lock()[&(13, 0)].pgid.is_some(), "the preempted run exists");
        }
        started.push(r.job_id);
    }
    assert_eq!(started.iter().filter(|j| **j == 14).count(), 1, "{started:?}");
    let pid = runner.lock()[&(13, 0)].pgid.unwrap();
    wait_for_state(pid, true).await;
    assert!(runner.lock()[&(13, 0)].suspended, "the run is known suspended");
    let urgent = pb::Assignment { started: true, kill: true, ..urgent };
    runner.reconcile(&set(vec![pb::Assignment { kill: true, ..suspended }, urgent]));
    let mut exited: Vec<u64> = Vec::new();
    for _ in 0..2 {
        let r = next(&mut rx).await;
        assert_eq!(r.status, pb::RunStatus::Exited as i32);
        exited.push(r.job_id);
    }
    exited.sort();
    assert_eq!(exited, vec![13, 14]);
}

#[tokio::test]
async fn a_shutdown_during_a_launch_stops_the_run_once_it_exists_and_launches_nothing_more() {
    let dir = tempfile::tempdir().unwrap();
    let (tx, mut rx) = mpsc::channel(16);
    let runner = Runner::new("n1", dir.path(), tx);
    runner.reconcile(&set(vec![assignment(14, &["sleep", "300"], false, false)]));
    runner.stop_all(Duration::from_secs(1)).await;
    assert!(runner.running().is_empty(), "a run outlived the shutdown: {:?}", runner.running());
    assert_eq!(next_of(&mut rx, 14).await.status, pb::RunStatus::Started as i32);
    assert_eq!(next_of(&mut rx, 14).await.status, pb::RunStatus::Exited as i32);
    runner.reconcile(&set(vec![assignment(15, &["sleep", "300"], false, false)]));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!runner.lock().contains_key(&(15, 0)), "a run launched after the shutdown began");
}

#[tokio::test]
async fn a_run_the_set_drops_while_it_launches_is_killed_once_it_exists() {
    let dir = tempfile::tempdir().unwrap();
    let (tx, mut rx) = mpsc::channel(16);
    let runner = Runner::new("n1", dir.path(), tx);
    runner.reconcile(&set(vec![assignment(16, &["sleep", "300"], false, false)]));
    runner.reconcile(&set(Vec::new()));
    assert_eq!(next_of(&mut rx, 16).await.status, pb::RunStatus::Started as i32);
    assert_eq!(next_of(&mut rx, 16).await.status, pb::RunStatus::Exited as i32);
}

#[tokio::test]
async fn a_command_that_cannot_start_is_reported_lost_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let (tx, mut rx) = mpsc::channel(16);
    let runner = Runner::new("n1", dir.path(), tx);
    runner.reconcile(&set(vec![assignment(3, &["/no/such/program"], false, false)]));
    let r = next(&mut rx).await;
    assert_eq!(r.status, pb::RunStatus::Lost as i32);
    assert!(r.message.contains("/no/such/program"), "{}", r.message);
}

#[tokio::test]
async fn an_assignment_the_launch_step_refuses_is_reported_lost_once_and_never_spawned() {
    let dir = tempfile::tempdir().unwrap();
    let (tx, mut rx) = mpsc::channel(16);
    let runner = Runner::new("n1", dir.path(), tx);
    runner.reconcile(&set(vec![assignment(4, &[], false, false)]));
    // A second pass (a run's end, a lease renewal) finds it already refused.
    runner.launch_ready();
    let r = next(&mut rx).await;
    assert_eq!((r.job_id, r.status), (4, pb::RunStatus::Lost as i32));
    assert_eq!(r.message, "empty command");
    assert!(runner.finished((4, 0)));
    assert!(tokio::time::timeout(Duration::from_millis(300), rx.recv()).await.is_err(), "reported twice");
}

/// Whether `pid` still runs (a zombie or a vanished pid does not).
fn pid_runs(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(")").and_then(|(_, rest)| rest.trim_start().chars().next()))
        .is_some_and(|state| state != 'Z' && state != 'X')
}

/// Removes a test's cgroups, waiting (bounded) for runs that are still being torn down: a
/// single `remove_empty` right after an exit report could find a run cgroup not yet empty and
/// leave the base behind (one was found on this host after a suite run).
fn remove_cgroups(cg: &Cgroups) {
    let until = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        cg.remove_empty();
        if !cg.base().exists() || std::time::Instant::now() > until {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!cg.base().exists(), "the test's cgroups were left behind: {}", cg.base().display());
}

/// This host's cgroups for a runner in `dir` (the tests run as root where CI runs them; the
/// cgroup v2 hierarchy is writable there).
fn cgroups(dir: &Path) -> Cgroups {
    Cgroups::detect("runner-test", dir, None).expect("a usable cgroup v2 hierarchy (run the tests as root)")
}

#[tokio::test]
async fn a_launch_waits_until_every_process_of_its_gpus_previous_run_has_ended() {
    let dir = tempfile::tempdir().unwrap();
    let (tx, mut rx) = mpsc::channel(16);
    let runner = Runner::new("n1", dir.path(), tx);
    // Job 1 ignores SIGTERM and leaves a child behind in its group; job 2 gets GPU 3 as soon as
    // the controller gives job 1 up.
    let a = pb::Assignment {
        gpu_ids: vec![3],
        ..assignment(1, &["sh", "-c", "trap '' TERM; sleep 300 & sleep 300"], false, false)
    };
    runner.reconcile(&set(vec![a.clone()]));
    assert_eq!(next(&mut rx).await.status, pb::RunStatus::Started as i32);
    let b = pb::Assignment { gpu_ids: vec![3], ..assignment(2, &["sleep", "300"], false, false) };
    runner
        .reconcile(&set(vec![pb::Assignment { started: true, kill: true, kill_grace_s: 1, ..a }, b.clone()]));
    // Job 2 waits: GPU 3 is still held by job 1, which is stopping.
    assert!(runner.lock().get(&(2, 0)).is_none(), "launched on a GPU whose run is still alive");
    let first = next(&mut rx).await;
    assert_eq!((first.job_id, first.status), (1, pb::RunStatus::Exited as i32), "job 1 ends first");
    let second = next(&mut rx).await;
    assert_eq!((second.job_id, second.status), (2, pb::RunStatus::Started as i32));
    runner.stop_all(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn without_a_valid_lease_nothing_launches_and_a_lapse_stops_runs_as_lost() {
    let dir = tempfile::tempdir().unwrap();
    let (tx, mut rx) = mpsc::channel(16);
    let lease = Lease::new(dir.path().join("lease"));
    let runner = Runner::new("n1", dir.path(), tx).with_lease(lease.clone());
    let a = assignment(1, &["sleep", "300"], false, false);
    runner.reconcile(&set(vec![a]));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(runner.running().is_empty(), "launched without a lease");
    // A lease of 700 ms: the run starts, then the lease lapses and fencing stops it.
    lease.renew(crate::fence::LeaseTerms::of_ms(700, 200, Duration::ZERO).renewal(crate::fence::mono_ms()));
    runner.launch_ready();
    assert_eq!(next(&mut rx).await.status, pb::RunStatus::Started as i32);
    while !lease.lapsed() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    runner.fence(lease.grace());
    let r = next(&mut rx).await;
    assert_eq!((r.job_id, r.status), (1, pb::RunStatus::Lost as i32));
    assert!(r.message.contains("lease"), "{}", r.message);
}

#[tokio::test]
async fn a_setsid_child_is_killed_with_its_run_before_the_exit_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let (tx, mut rx) = mpsc::channel(16);
    let cg = cgroups(dir.path());
    let runner = Runner::new("n1", dir.path(), tx)
        .with_isolation(Isolation { cgroups: Some(cg.clone()), ..Default::default() });
    let pidfile = dir.path().join("escaped.pid");
    let script = format!("setsid sh -c 'echo $$ > {}; exec sleep 987' & wait; sleep 300", pidfile.display());
    let a = assignment(8, &["sh", "-c", &script], false, false);
    runner.reconcile(&set(vec![a.clone()]));
    assert_eq!(next(&mut rx).await.status, pb::RunStatus::Started as i32);
    let escaped: i32 = loop {
        if let Some(pid) = std::fs::read_to_string(&pidfile).ok().and_then(|s| s.trim().parse().ok()) {
            break pid;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(pid_runs(escaped));
    // The escaped process is in another session and process group, but in the run's cgroup.
    assert!(cg.runs().iter().any(|(k, r)| *k == (8, 0) && r.pids().contains(&escaped)));
    runner.reconcile(&set(vec![pb::Assignment { started: true, kill: true, ..a }]));
    let r = next(&mut rx).await;
    assert_eq!((r.job_id, r.status), (8, pb::RunStatus::Exited as i32));
    assert!(!pid_runs(escaped), "the setsid child outlived the reported exit");
    assert!(cg.runs().is_empty(), "the run's cgroup was left behind");
    remove_cgroups(&cg);
}

#[tokio::test]
async fn a_frozen_run_is_thawed_to_handle_its_stop_signal() {
    let dir = tempfile::tempdir().unwrap();
    let (tx, mut rx) = mpsc::channel(16);
    let cg = cgroups(dir.path());
    let runner = Runner::new("n1", dir.path(), tx)
        .with_isolation(Isolation { cgroups: Some(cg.clone()), ..Default::default() });
    let a = assignment(9, &["sh", "-c", "exec sleep 300"], false, false);
    runner.reconcile(&set(vec![a.clone()]));
    assert_eq!(next(&mut rx).await.status, pb::RunStatus::Started as i32);
    let suspended = pb::Assignment { started: true, suspend: true, ..a };
    runner.reconcile(&set(vec![suspended.clone()]));
    let frozen = std::fs::read_to_string(cg.runs()[0].1.dir().join("cgroup.freeze")).unwrap();
    assert_eq!(frozen.trim(), "1");
    runner.reconcile(&set(vec![pb::Assignment { kill: true, kill_grace_s: 30, ..suspended }]));
    let r = next(&mut rx).await;
    assert_eq!((r.job_id, r.status, r.signal), (9, pb::RunStatus::Exited as i32, 15));
    remove_cgroups(&cg);
}

#[tokio::test]
async fn a_log_is_capped_with_a_marker_and_the_job_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let (tx, mut rx) = mpsc::channel(16);
    let runner = Runner::new("n1", dir.path(), tx)
        .with_isolation(Isolation { log_max_bytes: 4096, ..Default::default() });
    let script = "head -c 100000 /dev/zero | tr '\\0' x; echo; echo still-running >&2; exit 3";
    runner.reconcile(&set(vec![assignment(4, &["sh", "-c", script], false, false)]));
    assert_eq!(next(&mut rx).await.status, pb::RunStatus::Started as i32);
    let note = next(&mut rx).await;
    assert_eq!(note.status, pb::RunStatus::LogTruncated as i32, "{note:?}");
    let r = next(&mut rx).await;
    assert_eq!((r.status, r.exit_code), (pb::RunStatus::Exited as i32, 3), "the job did not go on");
    let log = std::fs::read_to_string(log_path(dir.path(), 4, 0, 0)).unwrap();
    assert!(log.len() < 4096 + 200, "{} bytes", log.len());
    assert!(log.contains("log truncated at 4096 bytes"), "{}", &log[log.len().saturating_sub(200)..]);
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(log_path(dir.path(), 4, 0, 0)).unwrap().permissions().mode();
    assert_eq!(mode & 0o077, 0, "the log is readable by others: {mode:o}");
}

#[tokio::test]
async fn a_run_gets_an_allowlisted_environment_not_the_agents() {
    // SAFETY: this test's own variable; no other test reads it.
    unsafe { std::env::set_var("KAIROS_AGENT_SECRET_FOR_TEST", "s3cret") };
    let dir = tempfile::tempdir().unwrap();
    let (tx, mut rx) = mpsc::channel(16);
    let runner = Runner::new("n1", dir.path(), tx);
    let mut a = assignment(
        5,
        &["sh", "-c", "echo secret=${KAIROS_AGENT_SECRET_FOR_TEST:-none} mine=$MINE"],
        false,
        false,
    );
    a.env.insert("MINE".into(), "yes".into());
    runner.reconcile(&set(vec![a]));
    next(&mut rx).await;
    next(&mut rx).await;
    let log = std::fs::read_to_string(log_path(dir.path(), 5, 0, 0)).unwrap();
    assert_eq!(log, "secret=none mine=yes\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_launch_passes_start_a_run_once() {
    let dir = tempfile::tempdir().unwrap();
    let (tx, _rx) = mpsc::channel(64);
    let path = dir.path().join("processes.jsonl");
    let log = crate::audit::ProcessLog::open(&path, "n1").unwrap();
    let runner = Runner::new("n1", dir.path(), tx).with_process_log(log);
    *runner.last_set.lock().unwrap() = Some(set(vec![assignment(12, &["sleep", "300"], false, false)]));
    // A new set, a run's end and a lease renewal may all call this at once.
    let passes: Vec<_> = (0..8)
        .map(|_| {
            let r = runner.clone();
            tokio::task::spawn_blocking(move || r.launch_ready())
        })
        .collect();
    for p in passes {
        p.await.unwrap();
    }
    // The passes only dispatch launches (they run on blocking threads): wait until none is in
    // flight, bounded, before counting.
    let in_flight = || {
        let runs = runner.lock();
        runs.is_empty() || runs.values().any(|r| r.pgid.is_none() && r.exit.is_none())
    };
    for _ in 0..400 {
        if !in_flight() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let starts =
        std::fs::read_to_string(&path).unwrap().lines().filter(|l| l.contains(r#""event":"start""#)).count();
    assert_eq!(starts, 1, "one run launched {starts} times");
    runner.stop_all(Duration::from_secs(1)).await;
}

pub(super) fn root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// A runner whose runs execute as the Unix account `nobody` when the test runs as root (as CI
/// does), in a state directory such an account can pass through.
pub(super) fn runner_as_nobody(dir: &Path, tx: mpsc::Sender<pb::StatusReport>) -> Runner {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711)).unwrap();
    let map = dir.join("users.map");
    std::fs::write(&map, "alice = nobody\n").unwrap();
    let run_as = if root() { RunAs::Submitter } else { RunAs::Agent };
    let accounts = UnixAccounts::new(run_as).with_map_file(&map).unwrap();
    Runner::new("n1", dir, tx).with_isolation(Isolation { accounts, ..Default::default() })
}

#[tokio::test]
async fn links_and_fifos_a_job_leaves_in_its_directory_are_never_followed_nor_waited_on() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let (tx, mut rx) = mpsc::channel(16);
    let runner = runner_as_nobody(dir.path(), tx);
    // A previous attempt of job 7 (its user owns the job directory) left a symbolic link, a
    // hard link to a root-owned 0666 file and a FIFO where the agent will create the next
    // attempts' logs.
    let target = dir.path().join("precious");
    std::fs::write(&target, "precious\n").unwrap();
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o666)).unwrap();
    let before = std::fs::metadata(&target).unwrap();
    let jd = job_dir(dir.path(), 7, 0);
    std::fs::create_dir_all(&jd).unwrap();
    std::os::unix::fs::symlink(&target, jd.join("attempt-1.log")).unwrap();
    std::fs::hard_link(&target, jd.join("attempt-2.log")).unwrap();
    nix::unistd::mkfifo(&jd.join("attempt-3.log"), nix::sys::stat::Mode::from_bits_truncate(0o666)).unwrap();
    for attempt in 1..=3 {
        let a = pb::Assignment { attempt, ..assignment(7, &["echo", "written"], false, false) };
        // Bounded: a reconcile that opened the FIFO would block forever.
        let r = runner.clone();
        tokio::time::timeout(
            Duration::from_secs(10),
            tokio::task::spawn_blocking(move || r.reconcile(&set(vec![a]))),
        )
        .await
        .expect("reconcile blocked on what the job left")
        .unwrap();
        let started = next(&mut rx).await;
        assert_eq!(
            (started.attempt, started.status),
            (attempt, pb::RunStatus::Started as i32),
            "{started:?}"
        );
        let exited = next(&mut rx).await;
        assert_eq!((exited.status, exited.exit_code), (pb::RunStatus::Exited as i32, 0), "{exited:?}");
        let log = log_path(dir.path(), 7, 0, attempt);
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "written\n");
        let meta = std::fs::symlink_metadata(&log).unwrap();
        assert!(meta.is_file() && meta.nlink() == 1 && meta.mode() & 0o777 == 0o600, "{meta:?}");
        if root() {
            assert_eq!(meta.uid(), 65534, "the log is not the job user's");
        }
    }
    let after = std::fs::metadata(&target).unwrap();
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "precious\n");
    assert_eq!((after.uid(), after.gid(), after.mode()), (before.uid(), before.gid(), before.mode()));
    // A link in place of the checkpoint directory: refused, the target untouched.
    let elsewhere = dir.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::create_dir_all(job_dir(dir.path(), 8, 0)).unwrap();
    std::os::unix::fs::symlink(&elsewhere, job_dir(dir.path(), 8, 0).join("checkpoint")).unwrap();
    runner.reconcile(&set(vec![assignment(8, &["true"], false, false)]));
    let r = next(&mut rx).await;
    assert_eq!((r.job_id, r.status), (8, pb::RunStatus::Lost as i32), "{r:?}");
    assert!(r.message.contains("not a directory"), "{}", r.message);
    assert_ne!(
        std::fs::metadata(&elsewhere).unwrap().permissions().mode() & 0o777,
        0o700,
        "chmod followed the link"
    );
}

#[tokio::test]
async fn a_working_directory_is_entered_as_the_jobs_user_not_as_root() {
    if !root() {
        // Without root every run is the agent's own user: there is no one else to enter as.
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (tx, mut rx) = mpsc::channel(16);
    let runner = runner_as_nobody(dir.path(), tx);
    // Bob's home is his alone; a project below it is world-readable, as projects often are.
    let home = dir.path().join("bob");
    std::fs::create_dir_all(home.join("project")).unwrap();
    std::fs::write(home.join("project/secret"), "bob's secret\n").unwrap();
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::set_permissions(home.join("project"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let a = pb::Assignment {
        workdir: home.join("project").display().to_string(),
        ..assignment(9, &["cat", "secret"], false, false)
    };
    runner.reconcile(&set(vec![a]));
    let r = next(&mut rx).await;
    assert_eq!(
        (r.job_id, r.status),
        (9, pb::RunStatus::Lost as i32),
        "the job started in bob's project: {r:?}"
    );
    assert!(r.message.contains("Permission denied") && r.message.contains("as nobody"), "{}", r.message);
    let log = std::fs::read_to_string(log_path(dir.path(), 9, 0, 0)).unwrap_or_default();
    assert!(!log.contains("secret\n") || log.contains("kairos-agent"), "{log}");
    assert!(!log.contains("bob's secret"), "{log}");
    // The job's own directory (the default) is entered as the job's user.
    runner.reconcile(&set(vec![assignment(10, &["sh", "-c", "pwd; id -u"], false, false)]));
    assert_eq!(next(&mut rx).await.status, pb::RunStatus::Started as i32);
    let exited = next(&mut rx).await;
    assert_eq!((exited.job_id, exited.exit_code), (10, 0), "{exited:?}");
    let out = std::fs::read_to_string(log_path(dir.path(), 10, 0, 0)).unwrap();
    assert_eq!(out, format!("{}\n65534\n", job_dir(dir.path(), 10, 0).display()));
    // The submit directory (sbatch's default) the user cannot enter: the job's own, said so.
    let a = pb::Assignment {
        workdir: home.join("project").display().to_string(),
        workdir_is_submit_dir: true,
        ..assignment(11, &["pwd"], false, false)
    };
    runner.reconcile(&set(vec![a]));
    assert_eq!(next(&mut rx).await.status, pb::RunStatus::Started as i32);
    assert_eq!(next(&mut rx).await.exit_code, 0);
    let out = std::fs::read_to_string(log_path(dir.path(), 11, 0, 0)).unwrap();
    assert!(out.contains("cannot enter the submit directory"), "{out}");
    assert!(out.ends_with(&format!("{}\n", job_dir(dir.path(), 11, 0).display())), "{out}");
}

#[tokio::test]
async fn a_job_id_issued_again_never_finds_an_earlier_jobs_directory() {
    let dir = tempfile::tempdir().unwrap();
    let (tx, mut rx) = mpsc::channel(16);
    let runner = Runner::new("n1", dir.path(), tx);
    // Job 9 of an earlier cluster (or before a restore) ran here and left its log.
    let old = pb::Assignment {
        submit_time_ms: 1_000,
        ..assignment(9, &["echo", "bob's old output"], false, false)
    };
    runner.reconcile(&set(vec![old]));
    assert_eq!(next(&mut rx).await.status, pb::RunStatus::Started as i32);
    assert_eq!(next(&mut rx).await.exit_code, 0);
    runner.reconcile(&set(vec![]));
    // The id is issued again to another job.
    let new =
        pb::Assignment { submit_time_ms: 2_000, ..assignment(9, &["cat", "attempt-0.log"], false, false) };
    runner.reconcile(&set(vec![new]));
    assert_eq!(next(&mut rx).await.status, pb::RunStatus::Started as i32);
    assert_eq!(next(&mut rx).await.exit_code, 0);
    let log = std::fs::read_to_string(log_path(dir.path(), 9, 2_000, 0)).unwrap();
    assert!(!log.contains("bob's old output"), "{log}");
    assert_eq!(std::fs::read_to_string(log_path(dir.path(), 9, 1_000, 0)).unwrap(), "bob's old output\n");
}

#[tokio::test]
async fn a_run_whose_cgroup_outlived_it_unjournaled_is_logged_as_ended_before_new_work() {
    // The previous agent died after creating the run's cgroup and starting it, before it could
    // journal it; the run has ended since. Its end must be in the process log before the next
    // agent starts anything, or the audit trail shows it running forever.
    let dir = tempfile::tempdir().unwrap();
    let cg = cgroups(dir.path());
    let run = cg.create((7, 0)).unwrap();
    let path = dir.path().join("processes.jsonl");
    let log = crate::audit::ProcessLog::open(&path, "n1").unwrap();
    log.start(7, 0, &[2], None);
    assert_eq!(kill_orphans(dir.path(), Some(&cg), &log).await, 0);
    let text = std::fs::read_to_string(&path).unwrap();
    let ended: Vec<&str> =
        text.lines().filter(|l| l.contains(r#""job":7"#) && l.contains("ended unwatched")).collect();
    assert_eq!(ended.len(), 1, "{text}");
    // Logged once: its cgroup is gone, so the next restart does not log it again.
    assert!(!run.dir().exists(), "the ended run's cgroup was kept");
    assert_eq!(kill_orphans(dir.path(), Some(&cg), &log).await, 0);
    let again = std::fs::read_to_string(&path).unwrap();
    assert_eq!(again.lines().filter(|l| l.contains("ended unwatched")).count(), 1, "{again}");
    remove_cgroups(&cg);
}

/// A fake inventory whose GPUs read as `util` percent.
struct Busy(u32);

impl crate::gpu::GpuInventory for Busy {
    fn backend(&self) -> &'static str {
        "test"
    }
    fn discover(&self) -> Result<Vec<pb::Gpu>, crate::gpu::InventoryError> {
        Ok((0..8).map(|index| pb::Gpu { index, memory_mib: 1000, ..Default::default() }).collect())
    }
    fn usage(&self) -> Vec<crate::gpu::GpuUsage> {
        let gpus = self.discover().unwrap_or_default();
        gpus.iter()
            .map(|g| crate::gpu::GpuUsage {
                index: g.index,
                uuid: String::new(),
                utilization: f64::from(self.0) / 100.0,
                memory_used_bytes: 300 << 20,
                memory_total_bytes: 1000 << 20,
            })
            .collect()
    }
    fn watch_health(
        &self,
        _: Vec<pb::Gpu>,
        _: crate::health::XidPolicy,
        _: tokio::sync::mpsc::UnboundedSender<crate::health::GpuFault>,
    ) {
    }
}

#[tokio::test]
async fn a_sampled_run_reports_its_usage_at_exit_and_its_idle_gpus_while_it_runs() {
    let dir = tempfile::tempdir().unwrap();
    let (tx, mut rx) = mpsc::channel(16);
    let runner = Runner::new("n1", dir.path(), tx.clone());
    let inv: std::sync::Arc<dyn crate::gpu::GpuInventory> = std::sync::Arc::new(Busy(2));
    let gpus = inv.discover().unwrap();
    let sampler = crate::usage::sampler::run(
        runner.usage().clone(),
        inv,
        gpus,
        Duration::from_millis(100),
        "n1".into(),
        tx,
    );
    let sampler = tokio::spawn(sampler);
    let mut a = assignment(9, &["sleep", "1.5"], false, false);
    a.idle_watch = Some(pb::IdleWatch { after_s: 1, below_milli: 50 });
    runner.reconcile(&set(vec![a]));
    assert_eq!(next(&mut rx).await.status, pb::RunStatus::Started as i32);
    let idle = next(&mut rx).await;
    assert_eq!((idle.job_id, idle.status), (9, pb::RunStatus::Idle as i32));
    assert!(idle.idle_since_ms > 0);
    let series = runner.usage().series((9, 0), crate::usage::now_ms()).expect("a live series");
    assert!(series.running && !series.samples.is_empty() && series.samples[0].gpus.len() == 2, "{series:?}");
    let exited = next(&mut rx).await;
    assert_eq!(exited.status, pb::RunStatus::Exited as i32);
    let u = exited.usage.expect("the run's aggregates");
    assert!(u.wall_ms >= 1400 && u.samples >= 5, "{u:?}");
    assert_eq!((u.gpu_util_max_pct, u.gpu_mem_max_mib, u.gpu_mem_device_mib), (2, 300, 1000));
    // Two GPUs for the whole run at 2 %.
    assert!(u.gpu_ms >= 2 * 1200 && (19..=20).contains(&(u.gpu_busy_ms * 1000 / u.gpu_ms)), "{u:?}");
    // The ended run's series is still served.
    assert!(!runner.usage().series((9, 0), crate::usage::now_ms()).unwrap().running);
    sampler.abort();
}

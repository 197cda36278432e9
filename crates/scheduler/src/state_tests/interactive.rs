//! Interactive jobs (`kairos alloc`): their own QoS by default, one task on one terminal, and a
//! session that ends however its user ends it is COMPLETED with that exit code.

use super::*;
use crate::model::Profile;

fn interactive(gpus: u32) -> crate::model::JobSpec {
    let mut sp = spec(gpus, "");
    sp.profile = Profile::Interactive;
    sp.keep_alive_s = 30;
    sp
}

fn start(s: &mut ClusterState, sp: crate::model::JobSpec) -> u64 {
    let id =
        submitted(s.apply(&cmd(2, Op::Submit { spec: sp, request_id: None, hold: false, limits: None })));
    run_plan(s, 3);
    let node = s.jobs[&id].allocation.as_ref().expect("placed").node.clone();
    s.apply(&cmd(4, Op::JobStarted { job: id, attempt: 0, node }));
    id
}

#[test]
fn a_session_ended_with_exit_3_is_completed_with_exit_code_3_and_a_batch_job_so_ended_failed() {
    let mut s = cluster(2);
    let id = start(&mut s, interactive(1));
    assert_eq!(s.jobs[&id].spec.qos, "interactive", "the shipped policy's rule for the profile");
    let exit = RunExit::Code(3);
    s.apply(&cmd(5, Op::JobExited { job: id, attempt: 0, node: "n1".into(), exit }));
    let j = &s.jobs[&id];
    assert_eq!((j.state, j.exit_code), (JobState::Completed, Some(3)));
    let batch = start(&mut s, spec(1, "batch"));
    s.apply(&cmd(6, Op::JobExited { job: batch, attempt: 0, node: "n1".into(), exit: RunExit::Code(3) }));
    assert_eq!(s.jobs[&batch].state, JobState::Failed);
}

#[test]
fn interactive_jobs_are_single_task_and_only_they_keep_alive() {
    let mut s = cluster(2);
    let bad: [fn(&mut crate::model::JobSpec); 5] = [
        |sp| sp.tasks = 2,
        |sp| sp.retries = 1,
        |sp| sp.min_gpus = Some(1),
        |sp| sp.keep_alive_s = crate::model::KEEP_ALIVE_MAX_S + 1,
        |sp| sp.profile = Profile::Batch,
    ];
    for change in bad {
        let mut sp = interactive(1);
        change(&mut sp);
        let before = s.jobs.len();
        let out = s.apply(&cmd(2, Op::Submit { spec: sp, request_id: None, hold: false, limits: None }));
        assert!(matches!(out, Outcome::Rejected(_)), "{out:?}");
        assert_eq!(s.jobs.len(), before);
    }
}

#[test]
fn a_policy_without_an_interactive_rule_gives_interactive_jobs_the_batch_rule() {
    let mut policy = crate::policy::Policy::default();
    policy.profile_qos.remove(&Profile::Interactive);
    assert_eq!(policy.validate(), Ok(()));
    assert_eq!(policy.default_qos(Profile::Interactive).map(|q| q.name.as_str()), Some("batch"));
    policy.profile_qos.insert(Profile::Interactive, "nope".into());
    assert!(policy.validate().is_err(), "a rule naming no QoS is refused");
}

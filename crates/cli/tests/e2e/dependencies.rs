//! Dependencies on job arrays, end to end (issue 50): an array's id stands for every task of it,
//! as in Slurm — for `--after-ok`, `#SBATCH --dependency`, `kairos wait` and the Python client's
//! `wait`.

use serde_json::Value;

use crate::harness::{python, Cluster};

/// A job's time (RFC 3339 in UTC with milliseconds: ordered as text).
fn at<'a>(job: &'a Value, key: &str) -> &'a str {
    job[key].as_str().unwrap_or_else(|| panic!("{key} in {job}"))
}

#[test]
fn a_dependency_on_an_array_waits_for_its_last_task_and_afterok_never_starts_after_a_failure() {
    let c = Cluster::start(2);
    // Three tasks one at a time; the Python client waits for the array meanwhile.
    let arr = c.submit(&["--gpus", "1", "--array", "0-2%1", "-t", "2m", "--", "sleep", "1"]);
    let after = c.submit(&["--gpus", "1", "--after-ok", &arr.to_string(), "--", "echo", "x"]);
    let script = format!(
        "import sys, time\nfrom kairos_client import Client\n\
         c = Client(['{addr}'], token=open('{token}').read().strip())\n\
         j = c.wait({arr}, timeout=60)\n\
         t = time.time()\n\
         now = time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(t)) + '.%03dZ' % (int(t * 1000) % 1000)\n\
         print(now, j.id, j.state)\n",
        addr = c.controllers[0].addr,
        token = c.token_file().display(),
    );
    let waiter = std::process::Command::new(python()).args(["-c", &script]).output().unwrap();
    let said = String::from_utf8_lossy(&waiter.stdout).to_string();
    assert!(waiter.status.success(), "{said}{}", String::from_utf8_lossy(&waiter.stderr));
    let done = c.wait_done(after);
    assert_eq!(done["state"], "COMPLETED", "{done}");
    let last = c.wait_done(arr + 2);
    assert_eq!(last["state"], "COMPLETED", "{last}");
    // The dependent started only after the last task ended.
    assert!(at(&done, "start_time") >= at(&last, "end_time"), "{done}\n{last}");
    // The Python client's wait(array) returned only when every task had ended.
    let mut words = said.split_whitespace();
    let returned = words.next().expect("a time");
    assert!(returned >= at(&last, "end_time"), "wait returned at {returned}: {last}");
    assert_eq!(words.nth(1), Some("COMPLETED"), "{said}");

    // One task fails: afterok never starts (DependencyNeverSatisfied), afternotok does; Slurm's
    // spelling is taken, and what kairos lacks is refused by name.
    let failing =
        c.submit(&["--array", "0-2%1", "-c", "1", "--", "sh", "-c", "exit $((SLURM_ARRAY_TASK_ID == 1))"]);
    let ok = c.submit(&["-c", "1", "-d", &format!("afterok:{failing}"), "--", "true"]);
    let not_ok = c.submit(&["-c", "1", "--dependency", &format!("afternotok:{failing}"), "--", "true"]);
    assert_eq!(c.wait_done(not_ok)["state"], "COMPLETED");
    let waiting = c.job(ok);
    assert_eq!(waiting["state"], "PENDING", "{waiting}");
    assert!(
        waiting["reason"].as_str().unwrap_or_default().starts_with("DependencyNeverSatisfied"),
        "{waiting}"
    );
    let out = c.kairos(&["submit", "-d", &format!("aftercorr:{failing}"), "--", "true"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("aftercorr is not supported"), "{err}");
    c.ok(&["cancel", &ok.to_string()]);
}

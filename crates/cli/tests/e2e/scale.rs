//! A thousand agents: `kairos-bench agents` (the agent's own session code with fake runs, over
//! shared gRPC connections) against a real 3-replica cluster at the production heartbeat and
//! node timeout. `--check` makes the harness fail unless no run was fenced or killed across
//! the leader's `kill -9`, every agent was re-admitted by the next leader, and no replica's
//! memory grew over the steady state; this test reads its JSON and asserts the same again.

use std::process::Command;
use std::time::Duration;

use crate::harness::bin;

#[test]
fn a_thousand_agents_survive_the_leaders_kill_with_no_run_fenced() {
    let out = Command::new("timeout")
        .arg("170")
        .arg(bin("kairos-bench"))
        .args(["agents", "--nodes", "1000", "--gpus", "8", "--steady-s", "30", "--submit-rate", "10"])
        .args(["--kill-agents", "0", "--run-s", "600", "--check"])
        .output()
        .expect("running kairos-bench agents");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "kairos-bench agents failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON line");
    assert_eq!(report["nodes"], 1000);
    assert_eq!(report["runs_fenced"], 0, "{report}");
    assert_eq!(report["runs_killed_after_leader_kill"], 0, "{report}");
    let readmit = report["readmit_after_leader_kill_s"].as_f64().expect("every agent re-admitted");
    let lease = Duration::from_millis(report["lease_ms"].as_u64().unwrap());
    assert!(readmit < (lease + Duration::from_secs(10)).as_secs_f64(), "{report}");
    assert!(report["runs_started"].as_u64().unwrap() >= 1000, "the fill ran: {report}");
    let (before, after) = (&report["rss_steady_start_mb"], &report["rss_steady_end_mb"]);
    for i in 0..3 {
        let (b, a) = (before[i].as_f64().unwrap(), after[i].as_f64().unwrap());
        assert!(a <= b * 1.1 + 16.0, "replica {} grew from {b} to {a} MB: {report}", i + 1);
    }
}

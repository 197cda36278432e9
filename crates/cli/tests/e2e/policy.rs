//! Scheduling policy through the CLI on a real cluster.

use crate::harness::{wait_for, Cluster};

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).to_string()
}

#[test]
fn policy_apply_round_trips_and_limits_show_as_pending_reasons() {
    let c = Cluster::start(4);
    let file = c.path("policy.toml");
    std::fs::write(
        &file,
        r#"
[submit_rules]
training = "training"
inference = "inference"
batch = "small"

[qos.small]
priority = 20
preempt_mode = "requeue"
max_wall = "1h"
user_jobs = 1

[qos.training]
priority = 100
preempt_mode = "requeue"
grace = "5m"
max_wall = "48h"
grp_gpus = 512

[qos.inference]
priority = 200
max_wall = "2h"
grp_gpus = 64
burstable = true
"#,
    )
    .unwrap();
    assert!(c.ok(&["policy", "apply", "--yes", file.to_str().unwrap()]).contains("3 qos classes"));
    // Applying the same file again is a no-op that succeeds.
    c.ok(&["policy", "apply", "--yes", file.to_str().unwrap()]);
    let small: serde_json::Value = serde_json::from_str(&c.ok(&["qos", "show", "small", "--json"])).unwrap();
    assert_eq!(small["priority"], 20);
    assert_eq!(small["user_jobs"], 1);
    assert_eq!(small["max_wall_s"], 3600);
    assert_eq!(small["preempt_mode"], "requeue");
    // Export gives back what was applied (apply of the export is the identity).
    let exported = c.ok(&["policy", "export"]);
    let again = c.path("exported.toml");
    std::fs::write(&again, &exported).unwrap();
    c.ok(&["policy", "apply", "--yes", again.to_str().unwrap()]);
    assert_eq!(c.ok(&["policy", "export"]), exported);

    // A job without QoS gets the profile's default (batch → small); the second of one user
    // waits on the per-user job limit while GPUs are free.
    let first = c.submit(&["--", "sleep", "30"]);
    let second = c.submit(&["--", "sleep", "30"]);
    c.wait_state(first, "RUNNING");
    let job = wait_for("the limit reason", || {
        let j = c.job(second);
        (j["reason"] == "QosUserJobLimit").then_some(j)
    });
    assert_eq!(job["qos"], "small");
    assert_eq!(job["state"], "PENDING");
    // Deleting a QoS in use is refused; the limit lifts when the first job ends.
    let out = c.kairos(&["qos", "delete", "small"]);
    assert!(stderr(&out).contains("is the default of profile batch"), "{}", stderr(&out));
    c.ok(&["cancel", &first.to_string()]);
    c.wait_state(second, "RUNNING");
    c.ok(&["cancel", &second.to_string()]);
}

#[test]
fn bad_policy_input_is_refused_and_changes_nothing() {
    let c = Cluster::start(1);
    let before = c.ok(&["policy", "export"]);
    let cases: &[(&str, &str)] = &[
        ("[qos.batch]\npriority = \"high\"\nmax_wall = \"1h\"\n", "line 2, column 12"),
        ("[qos.batch]\npriority = 1\nmax_wall = \"1h\"\ncolour = 1\n", "unknown field"),
        (
            "[submit_rules]\ntraining = \"a\"\ninference = \"a\"\nbatch = \"a\"\n[qos.a]\npriority = 1\nmax_wall = \"1h\"\npreempt = [\"a\"]\npreempt_mode = \"requeue\"\n",
            "qos \"a\" preempts itself",
        ),
        (
            "[submit_rules]\ntraining = \"a\"\ninference = \"a\"\nbatch = \"b\"\n[qos.a]\npriority = 1\nmax_wall = \"1h\"\npreempt = [\"b\"]\npreempt_mode = \"requeue\"\n[qos.b]\npriority = 1\nmax_wall = \"1h\"\npreempt = [\"a\"]\npreempt_mode = \"requeue\"\n",
            "preempts it back",
        ),
        (
            "[submit_rules]\ntraining = \"a\"\ninference = \"a\"\nbatch = \"gold\"\n[qos.a]\npriority = 1\nmax_wall = \"1h\"\n",
            "unknown qos \"gold\"",
        ),
        (
            "[submit_rules]\ntraining = \"a\"\ninference = \"a\"\nbatch = \"a\"\n[qos.a]\npriority = -5\nmax_wall = \"1h\"\n",
            "priority -5",
        ),
    ];
    for (i, (text, expected)) in cases.iter().enumerate() {
        let file = c.path(&format!("bad-{i}.toml"));
        std::fs::write(&file, text).unwrap();
        let out = c.kairos(&["policy", "apply", "--yes", file.to_str().unwrap()]);
        assert!(!out.status.success(), "case {i} was applied");
        let err = stderr(&out);
        assert_eq!(err.trim_end().lines().count(), 1, "case {i}: {err:?}");
        assert!(err.contains(expected), "case {i}: {err:?} lacks {expected:?}");
    }
    for (args, expected) in [
        (vec!["qos", "show", "gold"], "qos \"gold\" not found"),
        (vec!["qos", "delete", "gold"], "qos \"gold\" not found"),
        (vec!["qos", "create", "batch", "--priority", "1", "--max-wall", "1h"], "already exists"),
        (vec!["qos", "update", "urgent", "--preempt", "premium"], "whose preempt mode is off"),
        (vec!["qos", "update", "batch", "--grp-gpus", "0"], "grp_gpus must be at least 1"),
        (vec!["submit", "--qos", "gold", "--", "true"], "unknown qos \"gold\""),
    ] {
        let out = c.kairos(&args);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(stderr(&out).contains(expected), "{args:?}: {}", stderr(&out));
    }
    assert_eq!(c.ok(&["policy", "export"]), before, "refused input changed the policy");
}

#[test]
fn after_ok_waits_for_its_parent_and_hold_release_work() {
    let c = Cluster::start(4);
    let marker = c.path("parent-done");
    let parent = c.submit(&["--", "sh", "-c", &format!("sleep 1; touch {}", marker.display())]);
    let check = format!("test -e {}", marker.display());
    let child = c.submit(&["--after-ok", &parent.to_string(), "--", "sh", "-c", &check]);
    // While the parent runs, the child waits on it.
    let waiting = c.job(child);
    if waiting["state"] == "PENDING" {
        assert_eq!(waiting["reason"], "Dependency", "{waiting}");
    }
    let job = c.wait_done(child);
    assert_eq!(job["state"], "COMPLETED", "the child ran before its parent finished: {job}");
    assert_eq!(job["after_ok"][0], parent);

    // Held at submit: waits with JobHeldUser until released.
    let held = c.submit(&["--hold", "--", "true"]);
    let job = wait_for("the hold reason", || {
        let j = c.job(held);
        (j["reason"] == "JobHeldUser").then_some(j)
    });
    assert_eq!(job["held"], true);
    c.ok(&["release", &held.to_string()]);
    assert_eq!(c.wait_done(held)["state"], "COMPLETED");
    let out = c.kairos(&["hold", &held.to_string()]);
    assert!(stderr(&out).contains("only pending jobs can be held"), "{}", stderr(&out));

    // A GPU model no registered node has is refused at submit, naming the models there are;
    // unknown parents are refused too.
    let out = c.kairos(&["submit", "--gpu-model", "A100", "--", "true"]);
    assert!(
        !out.status.success() && stderr(&out).contains("no node has a GPU of model \"A100\""),
        "{}",
        stderr(&out)
    );
    let out = c.kairos(&["submit", "--after-ok", "4242", "--", "true"]);
    assert!(stderr(&out).contains("after_ok: job 4242 not found"), "{}", stderr(&out));
    let h100 = c.submit(&["--gpu-model", "h100", "--", "true"]);
    assert_eq!(c.wait_done(h100)["state"], "COMPLETED");
}

#[test]
fn fairshare_orders_users_by_past_usage_and_priority_share_explain_it() {
    let c = Cluster::start(1);
    let file = c.path("accounts.toml");
    std::fs::write(
        &file,
        r#"
[submit_rules]
training = "batch"
inference = "batch"
batch = "batch"

[weights]
age = 0
job_size = 0

[qos.batch]
priority = 10
max_wall = "1h"

[accounts.root]
shares = 1

[accounts.a]
parent = "root"
shares = 1
users = ["alice"]

[accounts.b]
parent = "root"
shares = 1
users = ["bob"]
"#,
    )
    .unwrap();
    c.ok(&["policy", "apply", "--yes", file.to_str().unwrap()]);
    let as_user = |user: &str, args: &[&str]| {
        let out = c.cli_as(user).args(args).output().unwrap();
        assert!(out.status.success(), "{user} {args:?}: {}", stderr(&out));
        String::from_utf8(out.stdout).unwrap()
    };
    // Alice's account uses the GPU for a while.
    let used: u64 = as_user("alice", &["submit", "--", "sleep", "2"]).trim().parse().unwrap();
    assert_eq!(c.wait_done(used)["account"], "a");
    // A blocker keeps the GPU busy; then Alice and Bob submit, Alice first.
    let blocker = c.submit(&["--", "sleep", "30"]);
    c.wait_state(blocker, "RUNNING");
    let alice: u64 = as_user("alice", &["submit", "--", "true"]).trim().parse().unwrap();
    let bob: u64 = as_user("bob", &["submit", "--", "true"]).trim().parse().unwrap();
    let prio: serde_json::Value = serde_json::from_str(&c.ok(&["priority", "--json"])).unwrap();
    let of = |id: u64| prio.as_array().unwrap().iter().find(|j| j["id"] == id).cloned().unwrap();
    assert!(of(bob)["priority"].as_i64() > of(alice)["priority"].as_i64(), "{prio}");
    assert!(of(bob)["fairshare_factor"].as_f64() > of(alice)["fairshare_factor"].as_f64(), "{prio}");
    let share: serde_json::Value = serde_json::from_str(&c.ok(&["share", "--json"])).unwrap();
    let acct = |n: &str| share.as_array().unwrap().iter().find(|a| a["account"] == n).cloned().unwrap();
    assert!(acct("a")["usage_gpu_s"].as_f64().unwrap() > 1.0, "{share}");
    assert_eq!(acct("b")["usage_gpu_s"].as_f64(), Some(0.0));
    // The GPU frees up: Bob's job goes first although Alice submitted first.
    c.ok(&["cancel", &blocker.to_string()]);
    let bob_job = c.wait_done(bob);
    let alice_job = c.wait_done(alice);
    assert!(bob_job["start_time"].as_str() <= alice_job["start_time"].as_str(), "{bob_job} {alice_job}");
    // Submitting under an account one does not belong to is refused.
    let out = c.cli_as("bob").args(["submit", "--account", "a", "--", "true"]).output().unwrap();
    assert!(stderr(&out).contains("does not belong to account \"a\""), "{}", stderr(&out));
}

#[test]
fn partitions_confine_jobs_and_round_trip_through_the_policy_file() {
    let c = Cluster::start(2);
    let mut policy = c.ok(&["policy", "export"]);
    assert!(policy.starts_with("default_partition = \"default\""), "{policy}");
    policy.push_str(
        r#"
[partitions.named]
nodes = ["node-a"]
priority_tier = 3
max_wall = "1h"

[partitions.rack9]
selector = { rack = "r9" }
"#,
    );
    let file = c.path("partitions.toml");
    std::fs::write(&file, &policy).unwrap();
    c.ok(&["policy", "apply", "--yes", file.to_str().unwrap()]);
    let parts: serde_json::Value = serde_json::from_str(&c.ok(&["partition", "list", "--json"])).unwrap();
    let names: Vec<&str> = parts.as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert_eq!(names, vec!["default", "named", "rack9"]);
    let exported = c.ok(&["policy", "export"]);
    assert!(exported.contains("[partitions.rack9]") && exported.contains("r9"), "{exported}");

    let ok = c.submit(&["--partition", "named", "--time", "10m", "--", "true"]);
    let job = c.wait_done(ok);
    assert_eq!((job["state"].as_str(), job["partition"].as_str()), (Some("COMPLETED"), Some("named")));
    let nowhere = c.submit(&["--partition", "rack9", "--", "true"]);
    let job = c.job(nowhere);
    assert_eq!(job["reason"], "ReqNodeNotAvail: no up node in partition \"rack9\" has GPUs", "{job}");
    let too_long = c.submit(&["--partition", "named", "--time", "2h", "--", "true"]);
    assert_eq!(c.job(too_long)["reason"], "PartitionTimeLimit");
    let out = c.kairos(&["submit", "--partition", "gold", "--", "true"]);
    assert!(stderr(&out).contains("unknown partition \"gold\""), "{}", stderr(&out));
    // A partition in use cannot disappear.
    std::fs::write(&file, c.ok(&["policy", "export"]).replace("partitions.rack9", "partitions.rack8"))
        .unwrap();
    let out = c.kairos(&["policy", "apply", "--yes", file.to_str().unwrap()]);
    assert!(stderr(&out).contains("partition \"rack9\" is in use"), "{}", stderr(&out));
}

#[test]
fn accounts_and_partitions_are_managed_from_the_cli() {
    let c = Cluster::start(1);
    c.ok(&["account", "create", "vision", "--parent", "root", "--shares", "3", "--users", "alice,bob"]);
    c.ok(&["account", "update", "vision", "--shares", "5"]);
    let accounts: serde_json::Value = serde_json::from_str(&c.ok(&["account", "list", "--json"])).unwrap();
    let vision = accounts.as_array().unwrap().iter().find(|a| a["name"] == "vision").cloned().unwrap();
    assert_eq!((vision["shares"].as_u64(), vision["parent"].as_str()), (Some(5), Some("root")));
    assert_eq!(vision["users"], serde_json::json!(["alice", "bob"]));
    for (args, expected) in [
        (vec!["account", "create", "vision"], "already exists"),
        (vec!["account", "update", "nope", "--shares", "1"], "account \"nope\" not found"),
        (vec!["account", "create", "orphan", "--parent", "ghost"], "parent \"ghost\" does not exist"),
        (vec!["account", "update", "vision", "--shares", "0"], "shares must be at least 1"),
        (vec!["partition", "create", "bad", "--default-qos", "gold"], "unknown qos \"gold\""),
        (vec!["partition", "delete", "nope"], "partition \"nope\" not found"),
    ] {
        let out = c.kairos(&args);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(stderr(&out).contains(expected), "{args:?}: {}", stderr(&out));
    }
    c.ok(&["partition", "create", "fast", "--nodes", "node-a", "--tier", "4", "--max-wall", "2h"]);
    let job = c.submit(&["--partition", "fast", "--", "true"]);
    assert_eq!(c.wait_done(job)["state"], "COMPLETED");
    c.ok(&["partition", "delete", "fast"]);
    c.ok(&["account", "delete", "vision"]);
    let parts: serde_json::Value = serde_json::from_str(&c.ok(&["partition", "list", "--json"])).unwrap();
    assert_eq!(parts.as_array().unwrap().len(), 1);
}

#[test]
fn urgent_is_refused_to_a_user_without_it_naming_the_allowed_qos_and_works_for_an_account_given_it() {
    let c = Cluster::start(1);
    let submit_as = |user: &str, args: &[&str]| c.cli_as(user).arg("submit").args(args).output().unwrap();
    let out = submit_as("alice", &["--qos", "urgent", "--", "true"]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("qos \"urgent\" is not allowed for user \"alice\" in account \"root\" (allowed: batch, inference, interactive, premium, training)"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(c.jobs().is_empty(), "a refused submit leaves no job");
    // An account given urgent (with training as its default), alice a member.
    c.ok(&["account", "create", "oncall", "--parent", "root", "--users", "alice"]);
    c.ok(&["account", "update", "oncall", "--allowed-qos", "urgent,training", "--default-qos", "training"]);
    let out = submit_as("alice", &["--account", "oncall", "--qos", "urgent", "--", "true"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let job: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert_eq!(c.wait_done(job)["qos"], "urgent");
    let out = submit_as("alice", &["--account", "oncall", "--hold", "--", "true"]);
    let job: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert_eq!(c.job(job)["qos"], "training", "the account's default");
    // Inference is not among oncall's: refused there, naming what it allows.
    let err = stderr(&submit_as("alice", &["--account", "oncall", "--qos", "inference", "--", "true"]));
    assert!(err.contains("(allowed: training, urgent)"), "{err}");
    // One user alone (bob, in root) may be given urgent, as Slurm's association.
    c.ok(&["account", "update", "root", "--user", "bob", "--allowed-qos", "urgent"]);
    assert!(submit_as("bob", &["--qos", "urgent", "--hold", "--", "true"]).status.success());
    assert!(!submit_as("carol", &["--qos", "urgent", "--hold", "--", "true"]).status.success());
    // The policy file carries all of it, and the listing shows it.
    let exported = c.ok(&["policy", "export"]);
    assert!(exported.contains("[accounts.root.user_qos.bob]"), "{exported}");
    assert!(exported.contains("default_qos = \"training\""), "{exported}");
    let accounts: serde_json::Value = serde_json::from_str(&c.ok(&["account", "list", "--json"])).unwrap();
    let oncall = accounts.as_array().unwrap().iter().find(|a| a["name"] == "oncall").cloned().unwrap();
    assert_eq!(oncall["allowed_qos"], serde_json::json!(["training", "urgent"]));
    assert_eq!(oncall["default_qos"], "training");
    // A default the account does not allow is refused.
    let out = c.kairos(&["account", "update", "oncall", "--default-qos", "batch"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("default qos \"batch\" is not among the qos it allows"),
        "{}",
        stderr(&out)
    );
}

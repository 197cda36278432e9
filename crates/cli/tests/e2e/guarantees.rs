//! Team guarantees end to end: one team borrows the other's idle GPUs, the other takes them
//! back by checkpointing exactly the borrowers, which resume from their checkpoints later.

use crate::harness::{submit_training, wait_for, Cluster};

#[test]
fn a_team_takes_back_its_guarantee_from_the_borrowers_which_resume_from_their_checkpoints() {
    let c = Cluster::start_with(1, 8, &[]);
    for a in ["a", "b"] {
        c.ok(&["account", "create", a, "--parent", "root", "--guaranteed-gpus", "4"]);
    }
    let steps = |i: usize| c.path(&format!("a{i}.steps"));
    let a_jobs: Vec<u64> =
        (0..4).map(|i| submit_training(&c, &["--account", "a", "--gpus", "2"], 400, &steps(i))).collect();
    for id in &a_jobs {
        c.wait_state(*id, "RUNNING");
    }
    // All four run; two within a's guarantee, two borrowing b's idle GPUs.
    let borrowing: Vec<u64> = a_jobs.iter().copied().filter(|id| c.job(*id)["borrowing"] == true).collect();
    assert_eq!(borrowing.len(), 2, "{borrowing:?}");
    let queue = c.ok(&["queue"]);
    assert_eq!(queue.matches("borrowing").count(), 2, "{queue}");
    let list: serde_json::Value = serde_json::from_str(&c.ok(&["account", "list", "--json"])).unwrap();
    let a = list.as_array().unwrap().iter().find(|x| x["name"] == "a").unwrap().clone();
    assert_eq!(
        (a["guaranteed_gpus"].as_u64(), a["gpus_in_use"].as_u64(), a["gpus_borrowed"].as_u64()),
        (Some(4), Some(8), Some(4)),
        "{a}"
    );
    let b = list.as_array().unwrap().iter().find(|x| x["name"] == "b").unwrap().clone();
    assert_eq!(b["gpus_lent"], 4, "{b}");
    // Let the borrowers make progress past a checkpoint, then b asks for its guarantee.
    wait_for("training progress", || {
        borrowing
            .iter()
            .all(|id| {
                let i = a_jobs.iter().position(|x| x == id).unwrap();
                std::fs::read_to_string(steps(i)).unwrap_or_default().lines().count() >= 8
            })
            .then_some(())
    });
    let b_jobs: Vec<u64> = (0..2)
        .map(|_| c.submit(&["--account", "b", "--gpus", "2", "--qos", "training", "--", "sleep", "3"]))
        .collect();
    for id in &b_jobs {
        c.wait_state(*id, "RUNNING");
    }
    // Exactly a's two borrowers were taken, for b; a keeps its 4 GPUs.
    let list: serde_json::Value = serde_json::from_str(&c.ok(&["preemptions", "--json"])).unwrap();
    let mut victims: Vec<u64> =
        list.as_array().unwrap().iter().map(|r| r["victim"].as_u64().unwrap()).collect();
    victims.sort_unstable();
    assert_eq!(victims, borrowing, "{list}");
    for r in list.as_array().unwrap() {
        assert_eq!(
            (r["mode"].as_str(), r["reclaimed_for"].as_str(), r["reclaimed_gpus"].as_u64()),
            (Some("requeue"), Some("b"), Some(2)),
            "{r}"
        );
    }
    let table = c.ok(&["preemptions"]);
    assert!(table.contains("reclaimed for account b"), "{table}");
    let running: Vec<u64> = a_jobs.iter().copied().filter(|id| c.job(*id)["state"] == "RUNNING").collect();
    assert_eq!(running.len(), 2, "a keeps its guarantee: {running:?}");
    assert!(running.iter().all(|id| !borrowing.contains(id)));
    // When b is done, the requeued borrowers resume from their checkpoints: no step is lost
    // or repeated.
    for id in &b_jobs {
        assert_eq!(c.wait_done(*id)["state"], "COMPLETED");
    }
    for id in &borrowing {
        wait_for("the borrower's second attempt", || {
            let j = c.try_job(*id)?;
            (j["attempt"] == 1 && j["state"] == "RUNNING").then_some(())
        });
        let log = c.ok(&["logs", &id.to_string()]);
        assert!(
            log.starts_with("attempt 1 resumes at step ") && !log.starts_with("attempt 1 resumes at step 0"),
            "{log}"
        );
    }
    for id in &a_jobs {
        c.ok(&["cancel", &id.to_string()]);
    }
    for id in &borrowing {
        let i = a_jobs.iter().position(|x| x == id).unwrap();
        let got: Vec<u32> = std::fs::read_to_string(steps(i))
            .unwrap()
            .lines()
            .map(|l| l.trim_start_matches("step ").parse().unwrap())
            .collect();
        let want: Vec<u32> = (1..=got.len() as u32).collect();
        assert_eq!(got, want, "steps lost or repeated across the reclaim");
    }
    // Guarantees past the cluster's GPUs are taken, with a warning (nodes come and go).
    let out = c.kairos(&["account", "create", "c", "--parent", "root", "--guaranteed-gpus", "4"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && err.contains("teams are guaranteed 12 GPUs together; the cluster has 8"),
        "{err}"
    );
    // Children's guarantees past their parent's are refused, and change nothing.
    let out = c.kairos(&["account", "create", "c1", "--parent", "c", "--guaranteed-gpus", "5"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("children are guaranteed 5 GPUs, more than its 4"),
        "{err}"
    );
}

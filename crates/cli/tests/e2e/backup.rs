//! Backup and restore: a snapshot saved from one cluster starts a new cluster with the same
//! jobs, policy and tokens; every replica of the new cluster holds the restored state.

use std::os::unix::fs::PermissionsExt;

use crate::harness::{bin, wait_for, Cluster, Options};

/// `path` and, for a directory, everything below it: no permission for group or others.
fn assert_owner_only(path: &std::path::Path) {
    let meta = std::fs::symlink_metadata(path).unwrap();
    assert_eq!(meta.permissions().mode() & 0o077, 0, "{} is {:o}", path.display(), meta.permissions().mode());
    if meta.is_dir() {
        for entry in std::fs::read_dir(path).unwrap() {
            assert_owner_only(&entry.unwrap().path());
        }
    }
}

#[test]
fn a_snapshot_saved_from_one_cluster_restores_into_a_new_one_with_the_same_jobs() {
    // Snapshots taken often: their files are checked too.
    let old = Cluster::start_with(3, 2, &["--snapshot-logs", "5"]);
    let done = old.submit(&["--", "sh", "-c", "exit 4"]);
    assert_eq!(old.wait_done(done)["exit_code"], 4);
    let held: Vec<u64> =
        (0..3).map(|i| old.submit(&["--hold", "--name", &format!("held-{i}"), "--", "true"])).collect();
    old.ok(&["qos", "create", "gold", "--priority", "500", "--max-wall", "1h"]);
    let created: serde_json::Value =
        serde_json::from_str(&old.ok(&["token", "create", "--user", "dora", "--json"])).unwrap();
    let token = created["token"].as_str().unwrap().to_string();
    assert!(token.starts_with("kairos_"), "{token}");
    // Saved through whichever replica the CLI reaches (followers pass the call to the leader).
    let keep = tempfile::tempdir().unwrap();
    let file = keep.path().join("backup.kairos");
    // A link where the CLI once put its temporary file is not followed (nor is any name one
    // can guess: the temporary file's name is random).
    let target = keep.path().join("target");
    std::fs::write(&target, "untouched").unwrap();
    std::os::unix::fs::symlink(&target, keep.path().join("backup.partial")).unwrap();
    let out = old.kairos(&["cluster", "snapshot", "save", file.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "untouched");
    let left: Vec<_> = std::fs::read_dir(keep.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".partial") && n != "backup.partial")
        .collect();
    assert!(left.is_empty(), "{left:?}");
    // A backup, the data directories and everything in them are their owner's alone.
    assert_owner_only(&file);
    for id in 1..=3 {
        assert_owner_only(&old.path(&format!("controller-{id}")));
    }
    let saved: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(saved["header"]["applied_index"].as_u64().unwrap() > 0, "{saved}");
    let before = old.ok(&["queue", "--all", "--json"]);
    // The node keeps its credential across the controllers' loss (its state directory).
    let credential = keep.path().join("node.credential");
    std::fs::copy(old.path("agent/node.credential"), &credential).unwrap();
    drop(old);

    let mut new = Cluster::start_opts(
        3,
        2,
        Options {
            first_controller_flags: vec!["--restore-from".into(), file.display().to_string()],
            no_agent: true,
            ..Options::default()
        },
    );
    // The node's agent comes back with its credential (same cluster secret): it registers again
    // under its restored record. (Started only now: an agent without it cannot take over the
    // restored node, and once the restored record has gone down for lack of heartbeats — a
    // slow start under load — nothing would bring it up.)
    std::fs::create_dir_all(new.path("agent")).unwrap();
    std::fs::copy(&credential, new.path("agent/node.credential")).unwrap();
    new.start_agent();
    new.wait_node_up();
    // The same jobs (ids, states, exit codes), the same policy, the same tokens.
    let jobs = |c: &Cluster| -> Vec<(u64, String, serde_json::Value)> {
        let v: serde_json::Value = serde_json::from_str(&c.ok(&["queue", "--all", "--json"])).unwrap();
        v.as_array()
            .unwrap()
            .iter()
            .map(|j| {
                (j["id"].as_u64().unwrap(), j["state"].as_str().unwrap().to_string(), j["exit_code"].clone())
            })
            .collect()
    };
    let was: serde_json::Value = serde_json::from_str(&before).unwrap();
    let was: Vec<(u64, String, serde_json::Value)> = was
        .as_array()
        .unwrap()
        .iter()
        .map(|j| {
            (j["id"].as_u64().unwrap(), j["state"].as_str().unwrap().to_string(), j["exit_code"].clone())
        })
        .collect();
    assert_eq!(jobs(&new), was);
    assert!(new.ok(&["qos", "list"]).contains("gold"));
    let mine = crate::harness::kairos_cmd()
        .args(["--controllers", &new.addrs(), "queue"])
        .env("KAIROS_TOKEN", &token)
        .env_remove("KAIROS_TOKEN_FILE")
        .output()
        .unwrap();
    assert!(mine.status.success(), "the restored token: {}", String::from_utf8_lossy(&mine.stderr));
    // Every replica holds the restored state (the empty ones received it as a snapshot).
    let status = new.wait_converged();
    assert_eq!(status["replicas"].as_array().unwrap().len(), 3, "{status}");
    // The new cluster goes on: ids continue, a restored held job runs on the new node.
    let next = new.submit(&["--", "true"]);
    assert_eq!(next, held[2] + 1);
    new.ok(&["release", &held[0].to_string()]);
    assert_eq!(new.wait_done(held[0])["state"], "COMPLETED");

    // A restart of the restoring replica with the same flag restores nothing twice.
    new.kill_controller(0);
    new.start_controller(0);
    new.wait_converged();
    wait_for("the restarted replica to answer", || {
        let out = new.kairos_at(&new.controllers[0].addr, &["show", &next.to_string()]);
        out.status.success().then_some(())
    });
    assert_eq!(new.jobs().len(), was.len() + 1);

    // A data directory that holds data is refused, and so is a damaged backup.
    let refused = std::process::Command::new(bin("kairosd"))
        .args(["--restore-from", file.to_str().unwrap(), "--addr", "127.0.0.1:1", "--cluster-secret-file"])
        .arg(new.path("cluster.secret"))
        .arg("--data-dir")
        .arg(new.path("controller-2"))
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("already holds a replica's data"), "{err}");
    let mut bytes = std::fs::read(&file).unwrap();
    bytes.truncate(bytes.len() - 10);
    let damaged = new.path("damaged.kairos");
    std::fs::write(&damaged, &bytes).unwrap();
    let refused = std::process::Command::new(bin("kairosd"))
        .args(["--restore-from", damaged.to_str().unwrap(), "--addr", "127.0.0.1:1", "--cluster-secret-file"])
        .arg(new.path("cluster.secret"))
        .arg("--data-dir")
        .arg(new.path("fresh"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && err.contains("truncated"), "{err}");
    assert!(!new.path("fresh").join("raft.sled").exists(), "a refused restore wrote nothing");
}

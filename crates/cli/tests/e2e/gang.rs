//! Gang jobs across two real agents.

use crate::harness::Cluster;

#[test]
fn a_gang_runs_one_task_per_node_with_torchrun_variables_or_fails_whole() {
    let mut c = Cluster::start(2);
    c.add_agent("node-b", 2);
    let dir = c.path("ranks");
    std::fs::create_dir_all(&dir).unwrap();
    let script = format!(
        "echo \"$RANK $WORLD_SIZE $MASTER_ADDR $MASTER_PORT $CUDA_VISIBLE_DEVICES\" > {}/rank-$RANK",
        dir.display()
    );
    let id = c.submit(&["--nodes", "2", "--gpus-per-node", "2", "--", "sh", "-c", &script]);
    let job = c.wait_done(id);
    assert_eq!(job["state"], "COMPLETED", "{job}");
    let tasks = job["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 2, "{job}");
    assert_ne!(tasks[0]["node"], tasks[1]["node"]);
    let read = |r: u32| std::fs::read_to_string(dir.join(format!("rank-{r}"))).unwrap();
    let (r0, r1) = (read(0), read(1));
    let f0: Vec<&str> = r0.split_whitespace().collect();
    let f1: Vec<&str> = r1.split_whitespace().collect();
    assert_eq!((f0[0], f0[1]), ("0", "2"), "{r0}");
    assert_eq!((f1[0], f1[1]), ("1", "2"), "{r1}");
    assert_eq!(f0[2..4], f1[2..4], "both ranks agree on MASTER_ADDR and MASTER_PORT");
    assert_eq!((f0[4], f1[4]), ("0,1", "0,1"));

    // More nodes than the cluster has: waits with a reason.
    let wide = c.submit(&["--nodes", "3", "--", "true"]);
    let reason = c.job(wide)["reason"].as_str().unwrap().to_string();
    assert!(reason.starts_with("ReqNodeNotAvail: only 2 up nodes"), "{reason}");
    c.ok(&["cancel", &wide.to_string()]);

    // Rank 1 fails: rank 0 is stopped and the job ends FAILED with rank 1's code.
    let id = c.submit(&["--nodes", "2", "--", "sh", "-c", "[ \"$RANK\" = 1 ] && exit 5; exec sleep 300"]);
    let job = c.wait_done(id);
    assert_eq!(job["state"], "FAILED", "{job}");
    assert_eq!(job["exit_code"], 5);
    assert!(job["reason"].as_str().unwrap().contains("rank 1"), "{job}");
}

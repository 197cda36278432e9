//! The Python side against a real three-replica cluster: a plain grpcio client (stubs generated
//! from proto/) that knows only a follower gets every submit through, and `kairos_client`
//! submits, waits, reads logs, lists and cancels, failing over past a dead address
//! (clients/python/tests/check_cluster.py; scripts/test.sh installs the package).

use crate::harness::{free_addr, python, Cluster};

#[test]
fn python_client_and_plain_grpcio_work_against_a_real_cluster_through_a_follower() {
    let c = Cluster::start_with(3, 2, &[]);
    let follower = c.follower();
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../clients/python/tests/check_cluster.py");
    let out = std::process::Command::new(python())
        .arg(script)
        .args([
            "--addresses",
            &c.addrs(),
            "--follower",
            &c.controllers[follower].addr,
            "--dead",
            &free_addr(),
        ])
        .arg("--token-file")
        .arg(c.token_file())
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "check_cluster.py failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("plain grpcio through the follower: 25 submits, all listed"), "{stdout}");
    assert!(stdout.trim_end().ends_with("ok"), "{stdout}");
}

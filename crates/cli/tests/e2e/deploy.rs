//! Deployment: replicas and an agent started from config files, an agent bound to 0.0.0.0 that
//! advertises another address, reachability in `cluster status`, `kairos up` on a taken port.

use std::process::{Child, Command, Stdio};

use serde_json::Value;

use crate::harness::{bin, free_addr, stop_child, wait_for};

struct Daemons(Vec<Child>);

impl Drop for Daemons {
    fn drop(&mut self) {
        for c in &mut self.0 {
            stop_child(c);
        }
    }
}

#[test]
fn replicas_and_an_agent_start_from_config_files_and_the_agent_serves_logs_at_its_advertised_address() {
    let dir = tempfile::tempdir().unwrap();
    let path = |s: &str| dir.path().join(s).display().to_string();
    for (file, content) in [
        ("cluster.secret", "deploy-cluster-secret-0123456789abcdef0123456789"),
        ("admin.token", "kairos-admin.deploy-0123456789abcdef"),
        ("join.token", "kairos-join.deploy-0123456789abcdef"),
    ] {
        std::fs::write(path(file), content).unwrap();
        std::fs::set_permissions(path(file), std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    }
    let addrs: Vec<String> = (0..3).map(|_| free_addr()).collect();
    let peers: Vec<String> = addrs.iter().enumerate().map(|(i, a)| format!("{}={a}", i + 1)).collect();
    let mut daemons = Daemons(Vec::new());
    for (i, addr) in addrs.iter().enumerate() {
        let id = i + 1;
        let config = format!(
            "id = {id}\naddr = \"{addr}\"\ndata_dir = \"{}\"\npeers = \"{}\"\ncluster_secret_file = \"{}\"\nadmin_token_file = \"{}\"\njoin_token_file = \"{}\"\nheartbeat_ms = 300\nnode_timeout_ms = 5000\n",
            path(&format!("c{id}")),
            peers.join(","),
            path("cluster.secret"),
            path("admin.token"),
            path("join.token"),
        );
        std::fs::write(path(&format!("kairosd-{id}.toml")), config).unwrap();
        // Only --config on the command line.
        daemons.0.push(
            Command::new(bin("kairosd"))
                .args(["--config", &path(&format!("kairosd-{id}.toml"))])
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(path(&format!("kairosd-{id}.log"))).unwrap())
                .spawn()
                .unwrap(),
        );
    }
    // The agent binds every interface and advertises loopback.
    let port = free_addr().rsplit(':').next().unwrap().to_string();
    let agent_config = format!(
        "controllers = \"{}\"\nname = \"deploy-node\"\naddr = \"0.0.0.0:{port}\"\nadvertise_addr = \"127.0.0.1:{port}\"\nstate_dir = \"{}\"\ngpu_backend = \"fake\"\nfake_gpus = \"2\"\njoin_token_file = \"{}\"\nrun_as = \"agent\"\nlabel = [\"rack=r1\"]\n",
        addrs.join(","),
        path("agent"),
        path("join.token"),
    );
    std::fs::write(path("agent.toml"), agent_config).unwrap();
    daemons.0.push(
        Command::new(bin("kairos-agent"))
            .args(["--config", &path("agent.toml")])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(path("agent.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    let cli = |args: &[&str]| {
        crate::harness::kairos_cmd()
            .args(["--controllers", &addrs.join(",")])
            .args(args)
            .env("KAIROS_TOKEN_FILE", path("admin.token"))
            .output()
            .unwrap()
    };
    let node: Value = wait_for("the agent's node to be up", || {
        let out = cli(&["nodes", "--json"]);
        let v: Value = serde_json::from_slice(&out.stdout).ok()?;
        v.as_array()?.iter().find(|n| n["name"] == "deploy-node" && n["state"] == "UP").cloned()
    });
    assert_eq!(node["addr"], format!("127.0.0.1:{port}"), "{node}");
    assert_eq!(node["labels"]["rack"], "r1", "{node}");
    let out = cli(&["submit", "--", "echo", "from the advertised agent"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert_eq!(cli(&["wait", &id]).status.code(), Some(0));
    let logs = cli(&["logs", &id]);
    assert_eq!(String::from_utf8_lossy(&logs.stdout), "from the advertised agent\n");
    // Every replica is reachable; a killed one is not.
    let status = |cli: &dyn Fn(&[&str]) -> std::process::Output| -> Value {
        serde_json::from_slice(&cli(&["cluster", "status", "--json"]).stdout).unwrap()
    };
    let s = status(&cli);
    assert!(s["replicas"].as_array().unwrap().iter().all(|r| r["reachable"] == true), "{s}");
    let leader = s["leader"].as_u64().unwrap() as usize;
    let victim = (1..=3).find(|i| *i != leader).unwrap();
    let mut killed = daemons.0.remove(victim - 1);
    let _ = killed.kill();
    let _ = killed.wait();
    let s = status(&cli);
    for r in s["replicas"].as_array().unwrap() {
        assert_eq!(r["reachable"], r["id"].as_u64().unwrap() as usize != victim, "{s}");
    }
}

#[test]
fn a_config_file_with_an_unknown_key_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("k.toml");
    std::fs::write(&file, "data_dir = \"x\"\ncolour = \"red\"\n").unwrap();
    let out = Command::new(bin("kairosd")).arg("--config").arg(&file).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown key \"colour\"") && err.lines().count() == 1, "{err}");
}

#[test]
fn kairos_up_refuses_a_taken_port_at_once() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let started = std::time::Instant::now();
    let out = crate::harness::kairos_cmd()
        .args(["up", "--addr", &addr, "--agent-addr", &free_addr(), "--data-dir"])
        .arg(dir.path())
        .env("HOME", dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains(&addr), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
}

#[test]
fn the_example_config_files_hold_only_known_keys() {
    for (daemon, file) in [("kairosd", "kairosd.example.toml"), ("kairos-agent", "kairos-agent.example.toml")]
    {
        let path = format!("{}/../../deploy/{file}", env!("CARGO_MANIFEST_DIR"));
        let out = Command::new(bin(daemon)).args(["--config", &path, "--help"]).output().unwrap();
        assert!(out.status.success(), "{file}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

/// `systemd-analyze verify` of a unit file in a scratch root holding systemd's own units and
/// an executable at every path the unit starts: (success, what it printed).
fn verify_unit(name: &str, content: &str) -> (bool, String) {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("usr/lib")).unwrap();
    let copied =
        Command::new("cp").args(["-r", "/usr/lib/systemd"]).arg(root.path().join("usr/lib/")).status();
    assert!(copied.unwrap().success(), "copying /usr/lib/systemd");
    std::fs::create_dir_all(root.path().join("usr/local/bin")).unwrap();
    for exe in ["kairosd", "kairos-agent"] {
        let path = root.path().join("usr/local/bin").join(exe);
        std::fs::write(&path, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    }
    let units = root.path().join("etc/systemd/system");
    std::fs::create_dir_all(&units).unwrap();
    std::fs::write(units.join(name), content).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(format!("--root={}", root.path().display()))
        .arg(format!("/etc/systemd/system/{name}"))
        .output()
        .expect("systemd-analyze (Debian package systemd; scripts/test.sh installs it)");
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), said)
}

#[test]
fn the_systemd_units_pass_systemd_analyze_verify_and_burst_nodes_install_the_agents() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/systemd");
    for name in ["kairosd.service", "kairos-agent.service"] {
        let content = std::fs::read_to_string(dir.join(name)).unwrap();
        let (ok, said) = verify_unit(name, &content);
        assert!(ok && said.trim().is_empty(), "{name}: systemd-analyze verify: {said}");
        assert!(content.contains("--config /etc/kairos/"), "{name} starts from its config file");
    }
    // The checker fails a broken unit: an unknown key, a bad value, a missing executable.
    let agent = std::fs::read_to_string(dir.join("kairos-agent.service")).unwrap();
    for broken in [
        agent.replace("Restart=always", "Restart=sometimes"),
        agent.replace("[Service]", "[Service]\nRestartEvery=2"),
        agent.replace("/usr/local/bin/kairos-agent", "/usr/local/bin/kairos-agentd"),
    ] {
        let (ok, said) = verify_unit("kairos-agent.service", &broken);
        assert!(!ok || !said.trim().is_empty(), "a broken unit passed: {broken}");
    }
    // Burst nodes install exactly this unit.
    assert_eq!(kairos_burst::reconcile::AGENT_UNIT, agent);
}

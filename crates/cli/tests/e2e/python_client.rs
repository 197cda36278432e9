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

/// Every path under `dir`, sorted.
fn tree(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            out.push(p.strip_prefix(dir).unwrap().display().to_string());
            if e.file_type().unwrap().is_dir() {
                stack.push(p);
            }
        }
    }
    out.sort();
    out
}

fn run_ok(cmd: &mut std::process::Command) -> std::process::Output {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A fresh environment with only the wheel installed: a venv (its dependencies, grpcio and
/// protobuf, reached through a .pth to the test Python's), or where Python has no venv module a
/// --target directory. Returns the interpreter and the environment variables to run it with.
fn fresh_install(
    wheel: &std::path::Path,
    at: &std::path::Path,
) -> (std::path::PathBuf, Vec<(String, String)>) {
    let deps = run_ok(std::process::Command::new(python()).args([
        "-c",
        "import grpc, google.protobuf, os; print(os.path.dirname(os.path.dirname(grpc.__file__)))",
    ]));
    let deps = String::from_utf8_lossy(&deps.stdout).trim().to_string();
    let venv = at.join("venv");
    let made = std::process::Command::new(python()).args(["-m", "venv"]).arg(&venv).output().unwrap();
    if made.status.success() {
        let py = venv.join("bin/python");
        let site = run_ok(
            std::process::Command::new(&py)
                .args(["-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]),
        );
        let site = std::path::PathBuf::from(String::from_utf8_lossy(&site.stdout).trim());
        run_ok(
            std::process::Command::new(&py)
                .args(["-m", "pip", "install", "-q", "--no-deps", "--no-index"])
                .arg(wheel),
        );
        // After the wheel: pip would take the suite's kairos_client, on the .pth's path, for it.
        std::fs::write(site.join("test-deps.pth"), format!("{deps}\n")).unwrap();
        (py, Vec::new())
    } else {
        let target = at.join("site");
        run_ok(
            std::process::Command::new(python())
                .args(["-m", "pip", "install", "-q", "--no-deps", "--target"])
                .arg(&target)
                .arg(wheel),
        );
        (python().into(), vec![("PYTHONPATH".into(), format!("{}:{deps}", target.display()))])
    }
}

#[test]
fn the_package_builds_without_touching_its_tree_and_a_wheel_built_once_runs_the_example_anywhere() {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap();
    let package = repo.join("clients/python");
    let scratch = tempfile::tempdir().unwrap();
    let before = tree(&package);
    // `pip install ./clients/python` from the repository root (into a scratch target: the
    // test Python's own environment is the suite's).
    run_ok(
        std::process::Command::new(python())
            .current_dir(&repo)
            .args(["-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps", "--target"])
            .arg(scratch.path().join("installed"))
            .arg("./clients/python"),
    );
    let wheels = scratch.path().join("wheels");
    run_ok(
        std::process::Command::new(python())
            .current_dir(&repo)
            .args(["-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps", "-w"])
            .arg(&wheels)
            .arg("./clients/python"),
    );
    assert_eq!(tree(&package), before, "building wrote into clients/python");
    let wheel = std::fs::read_dir(&wheels)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .unwrap();
    let (py, env) = fresh_install(&wheel, scratch.path());
    let home = scratch.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let example = package.join("examples/submit_and_wait.py");

    let mut c = Cluster::start_with(3, 2, &[]);
    // The leader first: the client talks to it until it is killed.
    let leader = c.leader();
    let mut addrs = vec![c.controllers[leader].addr.clone()];
    addrs.extend((0..3).filter(|i| *i != leader).map(|i| c.controllers[i].addr.clone()));
    let token_file = c.token_file();
    let example_cmd = |args: &[&str], controllers: &str| {
        let mut cmd = std::process::Command::new(&py);
        cmd.current_dir(scratch.path())
            .arg(&example)
            .args(args)
            .env("HOME", &home)
            .env_remove("XDG_CONFIG_HOME")
            .env_remove("KAIROS_TOKEN")
            .env_remove("KAIROS_CONTEXT")
            .env("KAIROS_CONTROLLERS", controllers)
            .env("KAIROS_TOKEN_FILE", &token_file)
            .envs(env.iter().map(|(k, v)| (k, v)));
        cmd
    };
    // The installed package is the wheel's, not the source tree's nor the suite's.
    let which = run_ok(
        std::process::Command::new(&py)
            .current_dir(scratch.path())
            .envs(env.iter().map(|(k, v)| (k, v)))
            .args(["-c", "import kairos_client; print(kairos_client.__file__)"]),
    );
    let which = String::from_utf8_lossy(&which.stdout).to_string();
    assert!(which.starts_with(&scratch.path().display().to_string()), "{which}");

    let out =
        example_cmd(&["--", "sh", "-c", "echo from the wheel; exit 3"], &addrs.join(",")).output().unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "from the wheel\n");

    // The leader it talks to is killed while it waits: it finishes with the job's outcome.
    let mark = scratch.path().join("running");
    let job = format!("touch {}; sleep 3; echo after the failover", mark.display());
    let waiting = example_cmd(&["--", "sh", "-c", &job], &addrs.join(","))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    crate::harness::wait_for("the job to run", || mark.exists().then_some(()));
    c.kill_controller(leader);
    let out = waiting.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "after the failover\n");

    // No controller at all: a clear error, fast, with its own exit code.
    let started = std::time::Instant::now();
    let out = example_cmd(&["--", "true"], &free_addr()).output().unwrap();
    assert_eq!(out.status.code(), Some(69), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no controller answered at"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(10));

    // Without the variables, the CLI's current context is the cluster.
    let config = home.join(".config/kairos");
    std::fs::create_dir_all(&config).unwrap();
    let live: Vec<String> =
        (0..3).filter(|i| *i != leader).map(|i| format!("\"{}\"", c.controllers[i].addr)).collect();
    std::fs::write(
        config.join("config.toml"),
        format!(
            "current = \"here\"\n[contexts.here]\ncontrollers = [{}]\ntoken_file = \"{}\"\n",
            live.join(", "),
            c.token_file().display()
        ),
    )
    .unwrap();
    let probe = "from kairos_client import Client\nc = Client()\nprint(len(c.list(all=True)), c.addresses)\n\
                 try:\n    Client(context='nope')\nexcept ValueError as e:\n    print(e)\n";
    let out = run_ok(
        std::process::Command::new(&py)
            .current_dir(scratch.path())
            .args(["-c", probe])
            .env("HOME", &home)
            .env_remove("XDG_CONFIG_HOME")
            .env_remove("KAIROS_CONTROLLERS")
            .env_remove("KAIROS_TOKEN_FILE")
            .env_remove("KAIROS_TOKEN")
            .env_remove("KAIROS_CONTEXT")
            .envs(env.iter().map(|(k, v)| (k, v))),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("2 ["), "{text}");
    assert!(text.contains("context \"nope\" not found (known: here)"), "{text}");
}

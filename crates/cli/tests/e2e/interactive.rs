//! Interactive sessions end to end (issue 57), driven through a real terminal (`pty`): `kairos
//! alloc` gives a shell inside the job (its GPU, its cgroup) that follows window resizes, where
//! Ctrl-C interrupts a command and `exit 3` ends the job COMPLETED with exit code 3; `kairos exec`
//! enters a running batch job (and a container job's image root), never another user's;
//! `kairos port-forward` reaches a server the job runs; a leader kill during a session loses no
//! keystroke or output line, and a client that disappears ends its allocation.

use std::time::{Duration, Instant};

use serde_json::Value;

use std::os::unix::fs::PermissionsExt;

use crate::containers::busybox_image_with;
use crate::harness::{free_addr, wait_for, wait_for_within, Cluster, Options};
use crate::isolation::{submit_as, submitter_cluster_mapping, Users};
use crate::pty::Pty;
use crate::web::{create_token, http};

const T: Duration = Duration::from_secs(20);

/// The one job in `state` of this cluster.
fn the_job_in(c: &Cluster, state: &str) -> Value {
    wait_for(&format!("a job {state}"), || c.jobs().into_iter().find(|j| j["state"] == state))
}

fn id_of(job: &Value) -> u64 {
    job["id"].as_u64().expect("a job id")
}

#[test]
fn alloc_gives_a_shell_in_the_job_that_follows_resizes_survives_ctrl_c_and_exit_3_completes_it() {
    let c = Cluster::start(2);
    let mut cmd = c.cli();
    cmd.args(["alloc", "--gpus", "1", "-t", "5m"]);
    let mut t = Pty::spawn(cmd, 24, 80);
    let job = the_job_in(&c, "RUNNING");
    let id = id_of(&job);
    assert_eq!((job["profile"].as_str(), job["qos"].as_str()), (Some("interactive"), Some("interactive")));
    let gpu = &job["gpu_ids"][0];
    // The job's GPU and cgroup: the shell runs inside the run.
    t.write("echo GPU=${CUDA_VISIBLE_DEVICES}.\n");
    t.expect(&format!("GPU={gpu}."), T);
    t.write("cat /proc/self/cgroup\n");
    t.expect(&format!("run-{id}-0"), T);
    // The window's size follows the client's.
    t.write("stty size\n");
    t.expect("24 80", T);
    t.resize(40, 120);
    std::thread::sleep(Duration::from_millis(300));
    t.write("stty size\n");
    t.expect("40 120", T);
    // Ctrl-C interrupts the foreground command, not the session.
    t.write("sleep 100\n");
    std::thread::sleep(Duration::from_millis(500));
    let interrupted = Instant::now();
    t.write("\x03");
    t.write("echo alive-$((40+2))\n");
    t.expect("alive-42", T);
    assert!(interrupted.elapsed() < Duration::from_secs(10), "the sleep was not interrupted");
    assert_eq!(c.job(id)["state"], "RUNNING");
    // Leaving the shell ends the job: COMPLETED, with the shell's exit code, which is the CLI's.
    t.write("exit 3\n");
    assert_eq!(t.wait(T).code(), Some(3), "{}", t.output());
    let done = c.wait_done(id);
    assert_eq!((done["state"].as_str(), done["exit_code"].as_i64()), (Some("COMPLETED"), Some(3)), "{done}");
}

#[test]
fn exec_enters_a_running_job_as_it_is_but_never_another_users_job() {
    let c = Cluster::start(2);
    let id = c.submit(&[
        "--gpus",
        "1",
        "--",
        "sh",
        "-c",
        "cat /proc/self/cgroup; echo gpus=$CUDA_VISIBLE_DEVICES; sleep 1000",
    ]);
    c.wait_state(id, "RUNNING");
    let log = wait_for("the job's log", || {
        let log = c.ok(&["logs", &id.to_string()]);
        log.contains("gpus=").then_some(log)
    });
    let own_cgroup: Vec<&str> = log.lines().take_while(|l| !l.starts_with("gpus=")).collect();
    let gpus = log.lines().find(|l| l.starts_with("gpus=")).unwrap();
    let out = c
        .cli()
        .args([
            "exec",
            &id.to_string(),
            "--",
            "sh",
            "-c",
            "cat /proc/self/cgroup; echo gpus=$CUDA_VISIBLE_DEVICES; exit 7",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(7),
        "the command's exit code is the CLI's: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cgroup: Vec<&str> = text.lines().take_while(|l| !l.starts_with("gpus=")).collect();
    assert_eq!(cgroup, own_cgroup, "exec runs in the job's cgroup");
    assert!(cgroup.iter().any(|l| l.contains(&format!("run-{id}-0"))), "{cgroup:?}");
    assert!(text.contains(gpus), "the job's GPUs: {text}");
    // Input reaches it and stderr stays stderr.
    let mut child = c
        .cli()
        .args(["exec", &id.to_string(), "--", "sh", "-c", "read x; echo got-$x; echo oops >&2"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(b"hello\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "got-hello\n");
    assert!(String::from_utf8_lossy(&out.stderr).contains("oops"));
    // The job goes on undisturbed.
    assert_eq!(c.job(id)["state"], "RUNNING");
    // Another user may not enter it.
    let out = c.cli_as("bob").args(["exec", &id.to_string(), "--", "true"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("another user"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    // Nor anyone a job that is not running.
    c.ok(&["cancel", &id.to_string()]);
    c.wait_done(id);
    let out = c.cli().args(["exec", &id.to_string(), "--", "true"]).output().unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("not running"));
}

/// `GET path` of the HTTP server at `addr`: its status and body (None: no answer).
fn get(addr: &str, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes()).ok()?;
    let mut answer = String::new();
    s.read_to_string(&mut answer).ok()?;
    let status = answer.split(' ').nth(1)?.parse().ok()?;
    Some((status, answer.split_once("\r\n\r\n")?.1.to_string()))
}

fn port_of(addr: &str) -> String {
    addr.rsplit(':').next().unwrap().to_string()
}

#[test]
fn port_forward_and_the_web_ui_reach_the_server_a_job_runs_for_its_owner_only() {
    let c = Cluster::start_opts(1, 1, Options { http: true, ..Options::default() });
    let web = c.controllers[0].http.clone().unwrap();
    let admin = std::fs::read_to_string(c.token_file()).unwrap().trim().to_string();
    let (alice, bob) = (create_token(&web, &admin, "alice"), create_token(&web, &admin, "bob"));
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("index.html"), "hello from the job\n").unwrap();
    let port = port_of(&free_addr());
    let server = ["-m", "http.server", "--bind", "127.0.0.1", &port];
    let mut args = vec!["-D", dir.path().to_str().unwrap(), "--", "python3"];
    args.extend(server);
    let id = submit_as(&c, "alice", &args);
    c.wait_state(id, "RUNNING");
    // `kairos port-forward JOB LOCAL:REMOTE`: the page on a local port.
    let local = port_of(&free_addr());
    let mut pf = c
        .cli_as("alice")
        .args(["port-forward", &id.to_string(), &format!("{local}:{port}")])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let page = wait_for_within("the page through the tunnel", T, || {
        get(&format!("127.0.0.1:{local}"), "/").filter(|(status, _)| *status == 200)
    });
    assert_eq!(page.1, "hello from the job\n");
    // A second connection through the same forward.
    assert_eq!(get(&format!("127.0.0.1:{local}"), "/index.html").map(|r| r.0), Some(200));
    let _ = pf.kill();
    let _ = pf.wait();
    // The web UI, after login, for the job's owner only.
    let login = |token: &str| {
        let r = http(&web, "POST", "/ui/login", &[], &serde_json::json!({ "token": token }).to_string());
        assert_eq!(r.status, 200, "{}", r.body);
        let cookie = r.header("set-cookie").into_iter().find(|c| c.starts_with("kairos_session=")).unwrap();
        cookie.split(';').next().unwrap().to_string()
    };
    let path = format!("/jobs/{id}/port/{port}/");
    let page = http(&web, "GET", &path, &[("Cookie", &login(&alice))], "");
    assert_eq!((page.status, page.body.as_str()), (200, "hello from the job\n"));
    assert!(page.header("content-security-policy").iter().any(|p| p.starts_with("sandbox")), "sandboxed");
    let stranger = http(&web, "GET", &path, &[("Cookie", &login(&bob))], "");
    assert_eq!(stranger.status, 403, "{}", stranger.body);
    assert!(!stranger.body.contains("hello from the job"));
    assert_eq!(http(&web, "GET", &path, &[], "").status, 401);
    // A port the job does not listen on is not reached, whoever listens there.
    let other =
        http(&web, "GET", &format!("/jobs/{id}/port/{}/", port_of(&web)), &[("Cookie", &login(&alice))], "");
    assert_eq!(other.status, 502, "the gateway's own port is not the job's: {}", other.body);
}

#[test]
fn exec_into_a_container_job_sees_the_image_root_as_the_job_s_user() {
    let users = Users::create(&["ki-alice".into()]);
    let (c, map) = submitter_cluster_mapping("alice = ki-alice\n");
    std::fs::set_permissions(map.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let image = busybox_image_with(map.path(), |_| {});
    let id = submit_as(&c, "alice", &["--container-image", &image, "--", "sleep", "1000"]);
    c.wait_state(id, "RUNNING");
    let probe = "cat /etc/kairos-image; echo uid=$(id -u); [ -e /usr/bin/python3 ] || echo no-host-python";
    let out = c.cli_as("alice").args(["exec", &id.to_string(), "--", "sh", "-c", probe]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("kairos test image") && text.contains("no-host-python"), "{text}");
    assert!(text.contains(&format!("uid={}", users.uid("ki-alice"))), "{text}");
    assert_eq!(c.job(id)["state"], "RUNNING");
    c.ok(&["cancel", &id.to_string()]);
    c.wait_done(id);
}

#[test]
fn a_session_loses_no_keystroke_or_line_across_a_leader_kill_and_a_vanished_client_ends_its_allocation() {
    let mut c = Cluster::start_with(3, 1, &[]);
    c.wait_converged();
    let leader = c.leader();
    // The session goes through the leader (the first address the client tries).
    let mut addrs = vec![c.controller_addr(leader)];
    addrs.extend((0..3).filter(|i| *i != leader).map(|i| c.controller_addr(i)));
    let mut cmd = c.cli();
    cmd.args(["--controllers", &addrs.join(","), "alloc", "--keep-alive", "5s", "--"]).args([
        "sh",
        "-c",
        "stty -echo; while read l; do echo out-$l; done",
    ]);
    let mut t = Pty::spawn(cmd, 24, 80);
    let id = id_of(&the_job_in(&c, "RUNNING"));
    t.write("0\n");
    t.expect("out-0\r\n", T);
    for i in 1..=120 {
        t.write(&format!("{i}\n"));
        if i == 40 {
            c.kill_controller(leader);
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    t.expect("out-120\r\n", Duration::from_secs(40));
    let out = t.output();
    let lines: Vec<&str> = out.split("\r\n").filter(|l| l.starts_with("out-")).collect();
    let want: Vec<String> = (0..=120).map(|i| format!("out-{i}")).collect();
    assert_eq!(lines, want, "every keystroke and every line exactly once, in order");
    // The client vanishes: the allocation ends within its keep-alive (5 s) and 5 s more.
    let killed = Instant::now();
    t.child.kill().unwrap();
    let done = wait_for_within("the allocation to end", Duration::from_secs(20), || {
        let j = c.try_job(id)?;
        (j["state"] != "RUNNING").then_some(j)
    });
    assert!(killed.elapsed() < Duration::from_secs(10), "ended {:?} after the client", killed.elapsed());
    assert_ne!(done["state"], "PENDING", "{done}");
}

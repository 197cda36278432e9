//! Job isolation and node trust, end to end and as an attacker would try them: jobs of two real
//! Unix users on one node, a setsid'd child at cancel, a job's stolen join token against a
//! registered node, and an agent paused for longer than the node timeout.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::process::Command;
use std::time::{Duration, Instant};

use kairos_proto::v1 as pb;
use serde_json::Value;

use crate::harness::{alive, read_pid, signal, wait_for, Cluster, Options};
use crate::security::{agent_client, node, with_bearer};

/// Unix accounts made for one test and removed (with their homes) when it ends.
pub(crate) struct Users(Vec<String>);

impl Users {
    pub(crate) fn create(names: &[String]) -> Users {
        // SAFETY: geteuid has no preconditions.
        assert_eq!(
            unsafe { libc::geteuid() },
            0,
            "the isolation tests create Unix users: run them as root (CI does)"
        );
        let users = Users(Vec::new());
        let mut users = users;
        for name in names {
            let _ = Command::new("userdel").args(["-r", name]).output();
            let out =
                Command::new("useradd").args(["-m", "-s", "/bin/sh", name]).output().expect("run useradd");
            assert!(out.status.success(), "useradd {name}: {}", String::from_utf8_lossy(&out.stderr));
            users.0.push(name.clone());
        }
        users
    }

    pub(crate) fn uid(&self, name: &str) -> u32 {
        let out = Command::new("id").args(["-u", name]).output().expect("run id");
        String::from_utf8_lossy(&out.stdout).trim().parse().expect("a uid")
    }
}

impl Drop for Users {
    fn drop(&mut self) {
        for name in &self.0 {
            // Their jobs are gone with the cluster (dropped first); -f in case one lingers.
            let _ = Command::new("pkill").args(["-KILL", "-u", name]).output();
            let _ = Command::new("userdel").args(["-r", "-f", name]).output();
        }
    }
}

/// A cluster whose agent runs each job as its submitter, kairos users alice and bob mapped to
/// the Unix accounts `a` and `b` (the map lives in the returned directory).
pub(crate) fn submitter_cluster(a: &str, b: &str) -> (Cluster, tempfile::TempDir) {
    submitter_cluster_mapping(&format!("alice = {a}\nbob = {b}\n"))
}

/// A cluster whose agent runs each job as its submitter, through the user map `map`.
pub(crate) fn submitter_cluster_mapping(map: &str) -> (Cluster, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("users.map");
    std::fs::write(&path, map).unwrap();
    let flags =
        vec!["--run-as".to_string(), "submitter".into(), "--user-map".into(), path.display().to_string()];
    let c = Cluster::start_opts(1, 2, Options { agent_flags: flags, ..Default::default() });
    // Jobs must reach their own directories under the cluster's (root's) test directory.
    std::fs::set_permissions(c.dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    (c, dir)
}

pub(crate) fn submit_as(c: &Cluster, user: &str, args: &[&str]) -> u64 {
    let out = c.cli_as(user).arg("submit").args(args).output().expect("run kairos");
    assert!(out.status.success(), "submit as {user}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().parse().expect("a job id")
}

/// The pid of the sleeping main process of `job`'s run as Unix user `uid` (read as root from
/// /proc; other tests' clusters have jobs with the same id, not with this uid).
fn job_pid(job: u64, uid: u32) -> Option<u32> {
    let want = format!("KAIROS_JOB_ID={job}");
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        if std::fs::metadata(e.path()).ok()?.uid() != uid {
            return None;
        }
        let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
        (comm.trim() == "sleep" && env.split(|b| *b == 0).any(|v| v == want.as_bytes())).then_some(pid)
    })
}

#[test]
fn jobs_run_as_their_submitters_and_cannot_reach_each_other_or_kairos_credentials() {
    let tag = std::process::id() % 100_000;
    let (ua, ub) = (format!("kt{tag}a"), format!("kt{tag}b"));
    let users = Users::create(&[ua.clone(), ub.clone()]);
    let (c, _map) = submitter_cluster(&ua, &ub);
    c.wait_node_up();
    let nodes = c.ok(&["nodes", "--json"]);
    assert!(nodes.contains("cgroup2,submitter"), "{nodes}");

    // Alice's job: who it runs as, then a long sleep holding a secret in its environment.
    let alice = submit_as(
        &c,
        "alice",
        &[
            "--env",
            "ALICE_SECRET=hunter2",
            "--",
            "sh",
            "-c",
            "id -u; echo HOME=$HOME; echo agent=${KAIROS_JOIN_TOKEN_FILE:-none}; exec sleep 300",
        ],
    );
    c.wait_state(alice, "RUNNING");
    let pid = wait_for("alice's job process", || job_pid(alice, users.uid(&ua)));
    let log = wait_for("alice's log", || {
        let l = c.ok(&["logs", &alice.to_string()]);
        l.contains("agent=").then_some(l)
    });
    assert!(log.starts_with(&format!("{}\n", users.uid(&ua))), "alice's job ran as someone else: {log}");
    assert!(log.contains(&format!("HOME=/home/{ua}")) && log.contains("agent=none"), "{log}");
    // Her job directory and log are hers alone.
    let job_dir = c.job_dir("agent", alice);
    let meta = std::fs::metadata(&job_dir).unwrap();
    assert_eq!((meta.uid(), meta.mode() & 0o077), (users.uid(&ua), 0), "job dir {:o}", meta.mode());
    let log_file = job_dir.join("attempt-0.log");
    assert_eq!(std::fs::metadata(&log_file).unwrap().mode() & 0o077, 0);

    // Bob's job tries everything a curious neighbour would.
    let targets = [
        format!("/proc/{pid}/environ"),
        log_file.display().to_string(),
        c.path("agent/node.credential").display().to_string(),
        c.path("join.token").display().to_string(),
        c.path("admin.token").display().to_string(),
        c.path("cluster.secret").display().to_string(),
        c.path("controller-1/admin.token").display().to_string(),
    ];
    let mut script = String::new();
    for t in &targets {
        script.push_str(&format!(
            "if cat '{t}' >/dev/null 2>&1; then echo 'READ {t}'; else echo 'denied {t}'; fi\n"
        ));
    }
    script.push_str(&format!(
        "if ls '{}' >/dev/null 2>&1; then echo 'LISTED jobs'; else echo 'denied listing'; fi\n",
        c.path("agent/jobs").display()
    ));
    script.push_str(&format!(
        "if kill -9 {pid} 2>/dev/null; then echo 'KILLED alice'; else echo 'denied kill'; fi\n"
    ));
    let bob = submit_as(&c, "bob", &["--", "sh", "-c", &script]);
    let done = c.wait_done(bob);
    assert_eq!(done["state"], "COMPLETED", "{done}");
    let out = c.ok(&["logs", &bob.to_string()]);
    assert!(
        !out.contains("READ") && !out.contains("KILLED") && !out.contains("LISTED"),
        "bob reached alice or kairos secrets:\n{out}"
    );
    assert_eq!(out.matches("denied").count(), targets.len() + 2, "{out}");
    assert!(
        alive(pid),
        "alice's job was killed: {}\n{}",
        c.job(alice),
        std::fs::read_to_string(c.path("agent.log")).unwrap_or_default()
    );
    assert_eq!(c.job(alice)["state"], "RUNNING");

    // A kairos user with no Unix account on the node: the run fails at launch, never as root.
    let orphan = submit_as(&c, "carol", &["--", "sh", "-c", "id -u"]);
    let job = c.wait_done(orphan);
    assert_ne!(job["state"], "COMPLETED", "{job}");
    assert!(job.to_string().contains("no Unix account"), "{job}");
    c.ok(&["cancel", &alice.to_string()]);
    c.wait_done(alice);
    drop(c);
    drop(users);
}

#[test]
fn a_cancelled_jobs_setsid_child_is_dead_before_the_job_reads_cancelled() {
    let c = Cluster::start(1);
    let pidfile = c.path("escaped.pid");
    let script = format!("setsid sleep 987 & echo $! > {}; exec sleep 300", pidfile.display());
    let id = c.submit(&["--", "sh", "-c", &script]);
    c.wait_state(id, "RUNNING");
    let escaped = wait_for("the setsid child", || read_pid(&pidfile));
    assert!(alive(escaped));
    c.ok(&["cancel", &id.to_string()]);
    // The first time the job reads CANCELLED, the escaped child is already gone.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let job = c.try_job(id);
        if job.as_ref().is_some_and(|j| j["state"] == "CANCELLED") {
            assert!(!alive(escaped), "the setsid child outlived its cancelled job");
            break;
        }
        assert!(Instant::now() < deadline, "the job never read CANCELLED");
        std::thread::sleep(Duration::from_millis(20));
    }
    let nodes: Value = serde_json::from_str(&c.ok(&["nodes", "--json"])).unwrap();
    assert!(nodes.to_string().contains("cgroup2"), "{nodes}");
}

#[test]
fn a_join_token_cannot_take_a_registered_node_until_an_operator_removes_it() {
    let mut c = Cluster::start(1);
    c.wait_node_up();
    let join = std::fs::read_to_string(c.path("join.token")).unwrap().trim().to_string();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let register = |c: &Cluster, cred: &str| {
        let req = with_bearer(pb::RegisterRequest { node: Some(node("node-a")) }, cred);
        rt.block_on(async { agent_client(c).await.register(req).await })
    };
    // What a job that stole the join token would try: take over node-a.
    let e = register(&c, &join).unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("kairos node remove node-a"), "{e:?}");
    // The real agent is untouched, and after a restart it re-registers with its own credential.
    let credential = std::fs::read_to_string(c.path("agent/node.credential")).unwrap().trim().to_string();
    assert_eq!(std::fs::metadata(c.path("agent/node.credential")).unwrap().mode() & 0o077, 0);
    c.kill_agent();
    c.start_agent();
    let id = c.submit(&["--", "true"]);
    assert_eq!(c.wait_done(id)["state"], "COMPLETED");
    // Removing a node is refused while it holds a job, and for a user.
    let busy = c.submit(&["--", "sleep", "300"]);
    c.wait_state(busy, "RUNNING");
    let out = c.kairos(&["node", "remove", "node-a"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("still holds jobs"));
    let out = c.cli_as("mallory").args(["node", "remove", "node-a"]).output().unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("operator"));
    c.ok(&["cancel", &busy.to_string()]);
    c.wait_done(busy);
    // Once removed, the name is free for the join token, and the old credential is void.
    c.kill_agent();
    c.ok(&["node", "remove", "node-a"]);
    let reg = register(&c, &join).expect("the join token registers a removed name").into_inner();
    assert_ne!(reg.node_credential, credential);
    let hb = pb::HeartbeatRequest { node_id: "node-a".into(), running: vec![] };
    let e = rt
        .block_on(async { agent_client(&c).await.heartbeat(with_bearer(hb, &credential)).await })
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated);
}

#[test]
fn an_agent_paused_past_the_node_timeout_never_overlaps_its_jobs_attempts() {
    let c = Cluster::start(1);
    c.wait_node_up();
    // The job records "ATTEMPT NANOS" every 50 ms from two processes, one of them setsid'd out
    // of the run's process group: its own timestamps judge whether two attempts overlapped.
    let ticks = c.path("ticks");
    let ticker = c.path("ticker.sh");
    std::fs::write(
        &ticker,
        format!(
            "while :; do echo \"$KAIROS_RESTART_COUNT $(date +%s%N)\" >> {}; sleep 0.05; done\n",
            ticks.display()
        ),
    )
    .unwrap();
    let t = ticker.display().to_string();
    let id = c.submit(&["--requeue", "--", "sh", "-c", &format!("setsid sh {t} & exec sh {t}")]);
    c.wait_state(id, "RUNNING");
    wait_for("ticks of attempt 0", || std::fs::read_to_string(&ticks).ok().filter(|s| s.starts_with("0 ")));
    let agent = c.agent.as_ref().unwrap().id();
    let paused_at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    // Longer than the node timeout (5 s): the leader requeues the job meanwhile.
    signal(agent, libc::SIGSTOP);
    std::thread::sleep(Duration::from_secs(9));
    signal(agent, libc::SIGCONT);
    let job = wait_for("attempt 1 to run", || {
        let j = c.try_job(id)?;
        let text = std::fs::read_to_string(&ticks).ok()?;
        (j["attempt"].as_u64() >= Some(1)
            && j["state"] == "RUNNING"
            && text.lines().filter(|l| l.starts_with("1 ")).count() > 5)
            .then_some(j)
    });
    assert!(job.to_string().contains("down"), "the node was never declared down: {job}");
    c.ok(&["cancel", &id.to_string()]);
    c.wait_done(id);
    let text = std::fs::read_to_string(&ticks).unwrap();
    let stamps = |attempt: &str| -> Vec<u128> {
        text.lines()
            .filter_map(|l| l.split_once(' '))
            .filter(|(a, _)| *a == attempt)
            .filter_map(|(_, t)| t.parse().ok())
            .collect()
    };
    let (zero, one) = (stamps("0"), stamps("1"));
    let last_zero = zero.iter().max().copied().unwrap();
    let first_one = one.iter().min().copied().unwrap();
    assert!(
        last_zero < first_one,
        "attempt 0 ticked {} ms after attempt 1 started",
        (last_zero - first_one) / 1_000_000
    );
    // The watchdog stopped attempt 0 while the agent was paused, before the leader gave the
    // job up (a node timeout, 5 s, after the last heartbeat).
    assert!(
        last_zero < paused_at + 5_000_000_000,
        "attempt 0 ran {} ms into the pause",
        (last_zero - paused_at) / 1_000_000
    );
}

/// `kairos logs ID` run with a bound: a CLI call that hangs fails the test instead.
fn logs_within(c: &Cluster, job: u64, bound: Duration) -> std::process::Output {
    let mut child = c
        .cli()
        .args(["logs", &job.to_string()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run kairos logs");
    let deadline = Instant::now() + bound;
    while child.try_wait().expect("poll kairos logs").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("kairos logs {job} hung for {bound:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().expect("kairos logs output")
}

#[test]
fn links_and_fifos_a_job_plants_for_the_root_agent_change_nothing_and_stall_nothing() {
    let tag = std::process::id() % 100_000;
    let (ua, ub) = (format!("kp{tag}a"), format!("kp{tag}b"));
    let users = Users::create(&[ua.clone(), ub.clone()]);
    let (c, _map) = submitter_cluster(&ua, &ub);
    c.wait_node_up();
    // A root-owned file alice may write (0666): she can hard-link it (fs.protected_hardlinks
    // allows a link to a file one may read and write).
    let precious = c.path("precious");
    std::fs::write(&precious, "root's\n").unwrap();
    std::fs::set_permissions(&precious, std::fs::Permissions::from_mode(0o666)).unwrap();
    let before = std::fs::metadata(&precious).unwrap();
    // Alice's training job: its first attempt plants a hard link at the next attempt's log and
    // a FIFO at the one after; its second replaces its own log with a FIFO.
    let script = format!(
        "cd \"$KAIROS_CHECKPOINT_DIR/..\"; echo attempt $KAIROS_RESTART_COUNT; \
         if [ $KAIROS_RESTART_COUNT = 0 ]; then ln {p} attempt-1.log && mkfifo attempt-2.log && echo planted; fi; \
         if [ $KAIROS_RESTART_COUNT = 1 ]; then rm attempt-1.log && mkfifo attempt-1.log && echo fifo; fi; \
         trap 'exit 0' USR1 TERM; while :; do sleep 0.1; done",
        p = precious.display()
    );
    let alice = submit_as(&c, "alice", &["--qos", "training", "--", "sh", "-c", &script]);
    c.wait_state(alice, "RUNNING");
    wait_for("alice's plants", || c.ok(&["logs", &alice.to_string()]).contains("planted").then_some(()));
    let job_dir = c.job_dir("agent", alice);
    // Preempted: attempt 1 starts over the hard link.
    c.ok(&["account", "update", "root", "--user", "bob", "--allowed-qos", "urgent,training,inference,batch"]);
    let urgent = submit_as(&c, "bob", &["--qos", "urgent", "--gpus", "2", "--", "true"]);
    assert_eq!(c.wait_done(urgent)["state"], "COMPLETED");
    wait_for("alice's second attempt", || {
        let j = c.try_job(alice)?;
        (j["attempt"] == 1 && j["state"] == "RUNNING").then_some(())
    });
    let after = std::fs::metadata(&precious).unwrap();
    assert_eq!(
        (after.uid(), after.gid(), after.mode(), after.nlink()),
        (before.uid(), before.gid(), before.mode(), 1),
        "the agent changed the linked file"
    );
    assert_eq!(std::fs::read_to_string(&precious).unwrap(), "root's\n");
    let log1 = std::fs::symlink_metadata(job_dir.join("attempt-1.log")).unwrap();
    assert_ne!(log1.ino(), before.ino());
    // Its own log became a FIFO: reading it fails at once and never ties up the agent.
    wait_for("alice's FIFO", || {
        std::fs::symlink_metadata(job_dir.join("attempt-1.log"))
            .ok()
            .filter(|m| std::os::unix::fs::FileTypeExt::is_fifo(&m.file_type()))
    });
    for _ in 0..3 {
        let out = logs_within(&c, alice, Duration::from_secs(20));
        assert!(!out.status.success(), "a FIFO was served as a log");
        assert!(String::from_utf8_lossy(&out.stderr).contains("not a regular file"), "{out:?}");
    }
    // Preempted again: attempt 2 starts over the FIFO, and bob's job beside it completes.
    c.ok(&["account", "update", "root", "--user", "bob", "--allowed-qos", "urgent,training,inference,batch"]);
    let urgent = submit_as(&c, "bob", &["--qos", "urgent", "--gpus", "2", "--", "true"]);
    assert_eq!(c.wait_done(urgent)["state"], "COMPLETED");
    wait_for("alice's third attempt", || {
        let j = c.try_job(alice)?;
        (j["attempt"] == 2 && j["state"] == "RUNNING").then_some(())
    });
    let log2 = logs_within(&c, alice, Duration::from_secs(20));
    assert!(String::from_utf8_lossy(&log2.stdout).contains("attempt 2"), "{log2:?}");
    let bob = submit_as(&c, "bob", &["--", "sh", "-c", "echo bob done"]);
    let done = c.wait_done(bob);
    assert_eq!(done["state"], "COMPLETED", "{done}");
    let nodes = c.ok(&["nodes", "--json"]);
    assert!(!nodes.contains("DOWN") && !nodes.contains("\"down\""), "{nodes}");
    c.ok(&["cancel", &alice.to_string()]);
    c.wait_done(alice);
    drop(c);
    drop(users);
}

//! Tests of sessions against real runs: an interactive run on a real terminal attached and
//! resumed, commands exec'd into a run, the keep-alive, and grants refused before anything
//! starts. Driven through `interactive::stream::serve` (the gRPC service's body, without gRPC).

use std::sync::Arc;

use kairos_proto::v1 as pb;
use pb::session_input::Input;
use pb::session_output::Output;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use super::tests::{assignment, next, next_of, root, runner_as_nobody, set};
use super::*;
use crate::interactive::stream::{serve, Ctx};

const CRED: &str = "node.test-credential";

fn ctx(runner: &Runner) -> Ctx {
    Ctx {
        sessions: runner.sessions().clone(),
        runs: Arc::new(runner.clone()),
        credential: CRED.into(),
        node: "n1".into(),
    }
}

fn grant(job: u64, kind: pb::SessionKind) -> pb::SessionGrant {
    let mut g = pb::SessionGrant {
        job_id: job,
        attempt: 0,
        submit_time_ms: 0,
        user: "alice".into(),
        caller: "alice".into(),
        kind: kind as i32,
        port: 0,
        expires_ms: crate::usage::now_ms() + kairos_proto::grant::GRANT_TTL_MS,
        mac: Vec::new(),
    };
    kairos_proto::grant::seal(CRED, &mut g);
    g
}

fn open(job: u64, kind: pb::SessionKind, argv: &[&str]) -> pb::SessionOpen {
    pb::SessionOpen {
        job_id: job,
        kind: kind as i32,
        argv: argv.iter().map(|s| s.to_string()).collect(),
        grant: Some(grant(job, kind)),
        ..Default::default()
    }
}

/// A client's end of a session stream.
struct Client {
    input: mpsc::Sender<Result<pb::SessionInput, Status>>,
    output: mpsc::Receiver<Result<pb::SessionOutput, Status>>,
    /// The output so far, and where it ends.
    seen: Vec<u8>,
    offset: u64,
    exit: Option<pb::SessionExit>,
    opened: Option<pb::SessionOpened>,
    acked: u64,
}

async fn connect(runner: &Runner, open: pb::SessionOpen) -> Result<Client, Status> {
    let (input, rx) = mpsc::channel(16);
    let offset = open.output_offset;
    input.send(Ok(pb::SessionInput { input: Some(Input::Open(open)) })).await.expect("open sent");
    let output = serve(ctx(runner), ReceiverStream::new(rx)).await?;
    let mut c = Client { input, output, seen: Vec::new(), offset, exit: None, opened: None, acked: 0 };
    c.until(|c| c.opened.is_some()).await;
    Ok(c)
}

impl Client {
    async fn send(&self, input: Input) {
        self.input.send(Ok(pb::SessionInput { input: Some(input) })).await.expect("input sent");
    }

    async fn stdin(&self, seq: u64, data: &str) {
        self.send(Input::Stdin(pb::SessionStdin { seq, data: data.as_bytes().to_vec(), eof: false })).await;
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.seen).into_owned()
    }

    /// Reads output until `done` holds (bounded).
    async fn until(&mut self, done: impl Fn(&Client) -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while !done(self) {
            let msg = tokio::time::timeout_at(deadline, self.output.recv()).await;
            let msg = msg.unwrap_or_else(|_| panic!("timed out; output so far {:?}", self.text()));
            match msg.map(|m| m.map(|o| o.output)) {
                Some(Ok(Some(Output::Opened(o)))) => self.opened = Some(o),
                Some(Ok(Some(Output::Data(d)))) => {
                    assert_eq!(d.offset, self.offset, "output is contiguous");
                    self.offset += d.data.len() as u64;
                    self.seen.extend_from_slice(&d.data);
                }
                Some(Ok(Some(Output::InputAcked(seq)))) => self.acked = seq,
                Some(Ok(Some(Output::Exit(e)))) => self.exit = Some(e),
                Some(Ok(_)) => {}
                Some(Err(e)) => panic!("the stream failed: {e}"),
                None => panic!("the stream ended; output so far {:?}", self.text()),
            }
        }
    }
}

fn interactive(job: u64, argv: &[&str], keep_alive_s: u32) -> pb::Assignment {
    pb::Assignment { interactive: true, keep_alive_s, ..assignment(job, argv, false, false) }
}

#[tokio::test]
async fn an_interactive_run_on_a_terminal_takes_input_from_an_attached_session_and_its_exit_ends_it() {
    let dir = tempfile::tempdir().unwrap();
    let (tx, mut rx) = mpsc::channel(16);
    let runner = Runner::new("n1", dir.path(), tx);
    runner.reconcile(&set(vec![interactive(1, &["sh", "-c", "read x; echo got:$x; exit 3"], 600)]));
    assert_eq!(next(&mut rx).await.status, pb::RunStatus::Started as i32);
    let mut c = connect(&runner, open(1, pb::SessionKind::Attach, &[])).await.expect("attached");
    assert_eq!(c.opened.as_ref().map(|o| o.session.as_str()), Some("job-1-0"));
    c.stdin(1, "hi\n").await;
    c.until(|c| c.exit.is_some()).await;
    assert!(c.text().contains("got:hi"), "{:?}", c.text());
    assert_eq!(c.acked, 1);
    assert_eq!(c.exit.as_ref().map(|e| e.code), Some(3));
    let exited = next(&mut rx).await;
    assert_eq!((exited.status, exited.exit_code), (pb::RunStatus::Exited as i32, 3));
    // The terminal's output went to the run's log too.
    let log = std::fs::read_to_string(crate::launch::log_path(dir.path(), 1, 0, 0)).unwrap();
    assert!(log.contains("got:hi"), "{log:?}");
}

#[tokio::test]
async fn a_resumed_session_replays_output_from_its_offset_and_applies_each_input_once() {
    let dir = tempfile::tempdir().unwrap();
    let (tx, mut rx) = mpsc::channel(16);
    let runner = Runner::new("n1", dir.path(), tx);
    let script = "stty -echo; read x; echo got:$x; read y; echo two:$y; read z; echo three:$z";
    runner.reconcile(&set(vec![interactive(2, &["sh", "-c", script], 600)]));
    assert_eq!(next(&mut rx).await.status, pb::RunStatus::Started as i32);
    let mut first = connect(&runner, open(2, pb::SessionKind::Attach, &[])).await.expect("attached");
    first.stdin(1, "a\n").await;
    first.until(|c| c.text().contains("got:a") && c.acked == 1).await;
    let id = first.opened.clone().unwrap().session;
    let mid = first.offset;
    drop(first);
    // From the start: the whole output again; seq 1 again is not applied a second time.
    let resume = |offset| pb::SessionOpen {
        resume: id.clone(),
        output_offset: offset,
        ..open(2, pb::SessionKind::Attach, &[])
    };
    let mut again = connect(&runner, resume(0)).await.expect("resumed");
    assert_eq!(again.opened.as_ref().map(|o| (o.output_offset, o.input_seq)), Some((0, 1)));
    again.stdin(1, "a\n").await;
    again.stdin(2, "b\n").await;
    again.until(|c| c.text().contains("two:b")).await;
    assert!(again.text().contains("got:a"), "replayed from 0: {:?}", again.text());
    assert!(!again.text().contains("two:a"), "seq 1 applied twice: {:?}", again.text());
    // A third stream, from where the first left off, takes the session over.
    let mut third = connect(&runner, resume(mid)).await.expect("resumed");
    third.stdin(3, "c\n").await;
    third.until(|c| c.exit.is_some()).await;
    assert!(
        !third.text().contains("got:a") && third.text().contains("two:b") && third.text().contains("three:c"),
        "{:?}",
        third.text()
    );
    let taken = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match again.output.recv().await {
                Some(Ok(pb::SessionOutput { output: Some(Output::Notice(_)) })) | None => return,
                _ => {}
            }
        }
    });
    assert!(taken.await.is_ok(), "the stream taken over ends");
    assert_eq!(next(&mut rx).await.exit_code, 0);
    // The run has ended: its session still tells a resumed stream how, a while.
    let mut late = connect(&runner, resume(third.offset)).await.expect("resumed after the end");
    late.until(|c| c.exit.is_some()).await;
    assert_eq!((late.seen.len(), late.exit.map(|e| e.code)), (0, Some(0)));
    let unknown = pb::SessionOpen { resume: "s-no-such".into(), ..open(2, pb::SessionKind::Attach, &[]) };
    let refused = connect(&runner, unknown).await.err().map(|e| e.code());
    assert_eq!(refused, Some(tonic::Code::NotFound));
    let fresh = connect(&runner, open(2, pb::SessionKind::Attach, &[])).await.err().map(|e| e.code());
    assert_eq!(fresh, Some(tonic::Code::FailedPrecondition), "a new attach to an ended run");
}

#[tokio::test]
async fn an_exec_joins_the_runs_cgroup_and_environment_and_its_terminal_resizes() {
    let dir = tempfile::tempdir().unwrap();
    let (tx, mut rx) = mpsc::channel(16);
    let cgroups = crate::cgroup::Cgroups::detect("session-test", dir.path(), None).ok();
    if cgroups.is_none() {
        eprintln!("no cgroup v2 here: the exec's cgroup is not checked");
    }
    let isolation = Isolation { cgroups, ..Default::default() };
    let runner = Runner::new("n1", dir.path(), tx).with_isolation(isolation);
    runner.reconcile(&set(vec![assignment(3, &["sleep", "60"], false, false)]));
    assert_eq!(next(&mut rx).await.status, pb::RunStatus::Started as i32);
    let argv = ["sh", "-c", "echo gpus=$CUDA_VISIBLE_DEVICES; cat /proc/self/cgroup; echo oops >&2; exit 5"];
    let mut c = connect(&runner, open(3, pb::SessionKind::Exec, &argv)).await.expect("exec");
    c.until(|c| c.exit.is_some()).await;
    assert!(c.text().contains("gpus=3,5"), "{:?}", c.text());
    assert_eq!(c.exit.as_ref().map(|e| e.code), Some(5));
    if let Some(cg) = runner.lock().get(&(3, 0)).and_then(|r| r.cgroup.clone()) {
        let name = cg.dir().file_name().unwrap().to_string_lossy().into_owned();
        assert!(c.text().contains(&name), "not in the run's cgroup {name}: {:?}", c.text());
    }
    // On a terminal of its own: the size asked for, then the size a resize sets.
    let tty = pb::SessionOpen {
        pty: true,
        size: Some(pb::TerminalSize { rows: 33, cols: 101 }),
        ..open(3, pb::SessionKind::Exec, &["sh", "-c", "stty size; read x; stty size"])
    };
    let mut t = connect(&runner, tty).await.expect("exec on a terminal");
    t.until(|c| c.text().contains("33 101")).await;
    t.send(Input::Resize(pb::TerminalSize { rows: 40, cols: 120 })).await;
    t.stdin(1, "\n").await;
    t.until(|c| c.exit.is_some()).await;
    assert!(t.text().contains("40 120"), "{:?}", t.text());
    // A command still running when the run ends ends with it.
    let mut long = connect(&runner, open(3, pb::SessionKind::Exec, &["sleep", "60"])).await.expect("exec");
    runner.reconcile(&set(vec![pb::Assignment {
        started: true,
        kill: true,
        ..assignment(3, &["sleep", "60"], false, false)
    }]));
    long.until(|c| c.exit.is_some()).await;
    let end = long.exit.clone().unwrap();
    assert!(end.reason == "the job ended" || end.signal != 0, "{end:?}");
    runner.stop_all(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn an_interactive_run_nobody_attaches_to_is_hung_up_after_its_keep_alive() {
    let dir = tempfile::tempdir().unwrap();
    let (tx, mut rx) = mpsc::channel(16);
    let runner = Runner::new("n1", dir.path(), tx);
    let script = "trap 'echo hup; exit 7' HUP; while :; do sleep 0.1; done";
    runner.reconcile(&set(vec![interactive(4, &["sh", "-c", script], 1)]));
    assert_eq!(next(&mut rx).await.status, pb::RunStatus::Started as i32);
    let since = std::time::Instant::now();
    let exited = next(&mut rx).await;
    let took = since.elapsed();
    assert_eq!(exited.status, pb::RunStatus::Exited as i32);
    assert!(took < Duration::from_secs(5), "ended {took:?} after the start, keep-alive 1 s");
    assert!(exited.exit_code == 7 || exited.signal == 1, "SIGHUP ended it: {exited:?}");
}

#[tokio::test]
async fn bad_grants_are_refused_and_start_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (tx, mut rx) = mpsc::channel(16);
    let runner = Runner::new("n1", dir.path(), tx);
    runner.reconcile(&set(vec![assignment(5, &["sleep", "60"], false, false)]));
    assert_eq!(next(&mut rx).await.status, pb::RunStatus::Started as i32);
    let marker = dir.path().join("started");
    let touch = marker.display().to_string();
    let exec = || open(5, pb::SessionKind::Exec, &["touch", &touch]);
    let resealed = |change: fn(&mut pb::SessionGrant)| {
        let mut o = exec();
        let g = o.grant.as_mut().unwrap();
        change(g);
        kairos_proto::grant::seal(CRED, g);
        o
    };
    let cases: Vec<(&str, pb::SessionOpen, tonic::Code)> = vec![
        (
            "bad MAC",
            {
                let mut o = exec();
                o.grant.as_mut().unwrap().mac[0] ^= 1;
                o
            },
            tonic::Code::PermissionDenied,
        ),
        ("no grant", pb::SessionOpen { grant: None, ..exec() }, tonic::Code::PermissionDenied),
        ("expired", resealed(|g| g.expires_ms = crate::usage::now_ms() - 1), tonic::Code::PermissionDenied),
        ("other job", pb::SessionOpen { job_id: 6, ..exec() }, tonic::Code::PermissionDenied),
        ("other attempt", resealed(|g| g.attempt = 1), tonic::Code::FailedPrecondition),
        ("other user", resealed(|g| g.user = "bob".into()), tonic::Code::PermissionDenied),
        ("other submit time", resealed(|g| g.submit_time_ms = 1), tonic::Code::PermissionDenied),
        (
            "other kind",
            pb::SessionOpen { kind: pb::SessionKind::Attach as i32, ..exec() },
            tonic::Code::PermissionDenied,
        ),
        ("attach to a batch run", open(5, pb::SessionKind::Attach, &[]), tonic::Code::FailedPrecondition),
        ("argv too long", open(5, pb::SessionKind::Exec, &vec!["x"; 300]), tonic::Code::InvalidArgument),
    ];
    for (what, o, code) in cases {
        match connect(&runner, o).await {
            Ok(_) => panic!("{what}: accepted"),
            Err(e) => assert_eq!(e.code(), code, "{what}: {e}"),
        }
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!marker.exists(), "a refused session started its command");
    assert!(runner.sessions().of_run((5, 0)).is_empty());
    // The same open with a good grant does start it.
    let mut ok = connect(&runner, exec()).await.expect("a good grant");
    ok.until(|c| c.exit.is_some()).await;
    assert!(marker.exists());
    runner.stop_all(Duration::from_secs(1)).await;
}

/// An OCI layout under `dir` with one image (tagged `t`): busybox as /bin/sh, /bin/cat and
/// /bin/sleep, and an /etc/os-release of its own. Its reference.
fn busybox_layout(dir: &Path) -> String {
    use sha2::Digest;
    use std::io::Write;
    let busybox = std::fs::read("/bin/busybox").expect("busybox");
    let mut tar = tar::Builder::new(Vec::new());
    let files: [(&str, &[u8]); 4] = [
        ("bin/sh", &busybox),
        ("bin/cat", &busybox),
        ("bin/sleep", &busybox),
        ("etc/os-release", b"ID=kairos-exec-test\n"),
    ];
    for (path, content) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(content.len() as u64);
        h.set_mode(0o755);
        h.set_cksum();
        tar.append_data(&mut h, path, content).unwrap();
    }
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar.into_inner().unwrap()).unwrap();
    let layer = gz.finish().unwrap();
    let put = |bytes: &[u8]| {
        let hex: String = sha2::Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect();
        std::fs::create_dir_all(dir.join("blobs/sha256")).unwrap();
        std::fs::write(dir.join("blobs/sha256").join(&hex), bytes).unwrap();
        format!("sha256:{hex}")
    };
    let config = put(br#"{"architecture":"amd64","os":"linux","config":{"Env":["PATH=/bin"]},"rootfs":{"type":"layers","diff_ids":[]}}"#);
    let manifest = serde_json::to_vec(&serde_json::json!({"schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config, "size": 0},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": put(&layer), "size": layer.len()}]}))
    .unwrap();
    let index = serde_json::json!({"schemaVersion": 2, "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": put(&manifest), "size": manifest.len(), "annotations": {"org.opencontainers.image.ref.name": "t"}}]});
    std::fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    std::fs::write(dir.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
    format!("oci:{}:t", dir.display())
}

/// As root (as CI runs), the run is `nobody`'s, as an agent with `--run-as submitter` has it:
/// the container's init is then not dumpable, and the exec joins its namespaces all the same.
#[tokio::test]
async fn an_exec_into_a_container_run_sees_the_images_root_and_the_runs_pid_namespace_as_its_user() {
    use crate::account::{RunAs, UnixAccounts};
    if !std::path::Path::new("/bin/busybox").exists() {
        return eprintln!("skipped: no /bin/busybox to make an image of");
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o711)).unwrap();
    let (tx, mut rx) = mpsc::channel(16);
    let image = busybox_layout(&dir.path().join("layout"));
    let cache = crate::image::ImageCache::new(&dir.path().join("cache"), 1 << 30).unwrap();
    let map = dir.path().join("users.map");
    std::fs::write(&map, "alice = nobody\n").unwrap();
    let run_as = if root() { RunAs::Submitter } else { RunAs::Agent };
    let accounts = UnixAccounts::new(run_as).with_map_file(&map).unwrap();
    let isolation = Isolation { images: Some(Arc::new(cache)), accounts, ..Default::default() };
    let runner = Runner::new("n1", dir.path(), tx).with_isolation(isolation);
    let a = pb::Assignment {
        container: Some(pb::ContainerSpec { image, ..Default::default() }),
        ..assignment(8, &["sleep", "60"], false, false)
    };
    runner.reconcile(&set(vec![a]));
    let started = loop {
        let r = next(&mut rx).await;
        if r.status != pb::RunStatus::Image as i32 {
            break r;
        }
    };
    if started.status != pb::RunStatus::Started as i32 {
        return eprintln!("skipped: containers cannot run here: {}", started.message);
    }
    let argv = ["sh", "-c", "cat /etc/os-release; echo pid=$$; cat /proc/1/comm /proc/self/status"];
    let mut c = connect(&runner, open(8, pb::SessionKind::Exec, &argv)).await.expect("exec");
    c.until(|c| c.exit.is_some()).await;
    let text = c.text();
    assert_eq!(c.exit.as_ref().map(|e| e.code), Some(0), "{text:?}");
    assert!(text.contains("ID=kairos-exec-test"), "not the image's root: {text:?}");
    assert!(text.contains("kairos-init"), "not in the run's PID namespace: {text:?}");
    let field = |name: &str| {
        let line = text.lines().find(|l| l.starts_with(&format!("{name}:"))).expect(name);
        line.split_whitespace().skip(1).collect::<Vec<_>>().join(" ")
    };
    let uid = if root() { 65534 } else { nix::unistd::geteuid().as_raw() };
    assert_eq!(field("Uid"), format!("{uid} {uid} {uid} {uid}"), "not the run's user");
    for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(field(set), "0000000000000000", "{set}: a capability left");
    }
    assert_eq!(field("NoNewPrivs"), "1");
    // A long command: its open returns once it is exec'd, not when it ends, and holds up no
    // other spawn meanwhile.
    let since = std::time::Instant::now();
    let long = connect(&runner, open(8, pb::SessionKind::Exec, &["sleep", "5"])).await.expect("exec");
    let took = since.elapsed();
    assert!(took < Duration::from_secs(3), "the open waited {took:?} for a 5 s command");
    let since = std::time::Instant::now();
    let mut quick = connect(&runner, open(8, pb::SessionKind::Exec, &["cat", "/etc/os-release"])).await;
    quick.as_mut().expect("a second exec").until(|c| c.exit.is_some()).await;
    let took = since.elapsed();
    assert!(took < Duration::from_secs(3), "a second exec waited {took:?} for the first's command");
    drop(long);
    runner.stop_all(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn a_forward_tunnels_to_the_port_the_run_listens_on_and_ends_when_the_connection_closes() {
    if !std::path::Path::new("/bin/busybox").exists() {
        return eprintln!("skipped: no /bin/busybox for a listener");
    }
    let dir = tempfile::tempdir().unwrap();
    let (tx, mut rx) = mpsc::channel(16);
    let runner = Runner::new("n1", dir.path(), tx);
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen = ["/bin/busybox", "nc", "-l", "-p", &port.to_string(), "-e", "/bin/cat"];
    runner.reconcile(&set(vec![assignment(9, &listen, false, false)]));
    assert_eq!(next(&mut rx).await.status, pb::RunStatus::Started as i32);
    let forward = || {
        let mut o = open(9, pb::SessionKind::Forward, &[]);
        o.port = u32::from(port);
        let g = o.grant.as_mut().unwrap();
        g.port = u32::from(port);
        kairos_proto::grant::seal(CRED, g);
        o
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut c = loop {
        match connect(&runner, forward()).await {
            Ok(c) => break c,
            Err(e) if std::time::Instant::now() < deadline => {
                assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("the run's port never opened: {e}"),
        }
    };
    c.stdin(1, "ping\n").await;
    c.until(|c| c.text() == "ping\n").await;
    c.send(Input::Stdin(pb::SessionStdin { seq: 2, data: Vec::new(), eof: true })).await;
    c.until(|c| c.exit.is_some()).await;
    assert_eq!(c.exit.map(|e| (e.code, e.reason)), Some((0, "the connection closed".to_string())));
    // A closed tunnel is forgotten at once (it holds no slot, and is not resumed).
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    while !runner.sessions().of_run((9, 0)).is_empty() {
        assert!(std::time::Instant::now() < deadline, "a closed tunnel is still held");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A grant for another port opens nothing.
    let mut other = forward();
    other.port += 1;
    assert_eq!(connect(&runner, other).await.err().map(|e| e.code()), Some(tonic::Code::PermissionDenied));
    runner.stop_all(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn an_exec_runs_as_the_runs_account_in_its_working_directory() {
    let dir = tempfile::tempdir().unwrap();
    let (tx, mut rx) = mpsc::channel(16);
    let runner = runner_as_nobody(dir.path(), tx);
    runner.reconcile(&set(vec![assignment(10, &["sleep", "60"], false, false)]));
    assert_eq!(next(&mut rx).await.status, pb::RunStatus::Started as i32);
    let mut c =
        connect(&runner, open(10, pb::SessionKind::Exec, &["sh", "-c", "id -u; pwd"])).await.expect("exec");
    c.until(|c| c.exit.is_some()).await;
    let uid = if root() { 65534 } else { nix::unistd::geteuid().as_raw() };
    let job_dir = crate::launch::job_dir(dir.path(), 10, 0);
    assert_eq!(c.text(), format!("{uid}\n{}\n", job_dir.display()));
    runner.stop_all(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn no_exec_opens_in_a_suspended_run_nor_once_its_main_process_exited() {
    let dir = tempfile::tempdir().unwrap();
    let (tx, mut rx) = mpsc::channel(16);
    let runner = Runner::new("n1", dir.path(), tx);
    let frozen = pb::Assignment { suspend: true, ..assignment(11, &["sleep", "60"], false, false) };
    runner.reconcile(&set(vec![frozen.clone()]));
    assert_eq!(next(&mut rx).await.status, pb::RunStatus::Started as i32);
    runner.reconcile(&set(vec![pb::Assignment { started: true, ..frozen }]));
    let refused = connect(&runner, open(11, pb::SessionKind::Exec, &["true"])).await.err().map(|e| e.code());
    assert_eq!(refused, Some(tonic::Code::FailedPrecondition), "an exec into a suspended run");
    // The main process exits at once; a process it left outside its group holds its output
    // open, so the run has not ended yet.
    let script = "setsid sleep 3 & exit 0";
    runner.reconcile(&set(vec![assignment(12, &["sh", "-c", script], false, false)]));
    assert_eq!(next_of(&mut rx, 12).await.status, pb::RunStatus::Started as i32);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !runner.lock().get(&(12, 0)).is_some_and(|r| r.main_exited) {
        assert!(std::time::Instant::now() < deadline, "the main process never exited");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!runner.finished((12, 0)), "the run ended before the exec was tried");
    let view = crate::interactive::Runs::view(&runner, (12, 0)).map(|v| v.live);
    assert_eq!(view, Some(false), "a run whose main process exited is shown live");
    let late =
        connect(&runner, open(12, pb::SessionKind::Exec, &["sleep", "60"])).await.err().map(|e| e.code());
    assert_eq!(late, Some(tonic::Code::FailedPrecondition), "an exec after the main process exited");
    assert!(runner.sessions().of_run((12, 0)).is_empty());
    runner.stop_all(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn session_ids_are_random_resumed_by_their_caller_only_and_a_run_holds_a_bounded_number() {
    let dir = tempfile::tempdir().unwrap();
    let (tx, mut rx) = mpsc::channel(16);
    let runner = Runner::new("n1", dir.path(), tx);
    runner.reconcile(&set(vec![assignment(13, &["sleep", "60"], false, false)]));
    assert_eq!(next(&mut rx).await.status, pb::RunStatus::Started as i32);
    // A signal on a terminal goes to its foreground group (the kernel's, `TIOCSIG`).
    let script = "trap 'echo int; exit 4' INT; echo ready; while :; do sleep 0.1; done";
    let tty = pb::SessionOpen { pty: true, ..open(13, pb::SessionKind::Exec, &["sh", "-c", script]) };
    let mut t = connect(&runner, tty).await.expect("exec on a terminal");
    t.until(|c| c.text().contains("ready")).await;
    t.send(Input::Signal(nix::libc::SIGINT)).await;
    t.until(|c| c.exit.is_some()).await;
    assert_eq!(t.exit.as_ref().map(|e| e.code), Some(4), "{:?}", t.text());
    let id = t.opened.clone().unwrap().session;
    let hex = id.strip_prefix("s-").unwrap_or_default();
    assert!(hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
    assert!(!id.contains("-13-"), "the id names its job: {id}");
    let resume = |caller: &str| {
        let mut o = pb::SessionOpen { resume: id.clone(), ..open(13, pb::SessionKind::Exec, &[]) };
        let g = o.grant.as_mut().unwrap();
        g.caller = caller.into();
        kairos_proto::grant::seal(CRED, g);
        o
    };
    let refused = connect(&runner, resume("mallory")).await.err().map(|e| e.code());
    assert_eq!(refused, Some(tonic::Code::PermissionDenied), "another caller resumed it");
    let mut again = connect(&runner, resume("alice")).await.expect("its caller resumes it");
    again.until(|c| c.exit.is_some()).await;
    assert_eq!(again.exit.map(|e| e.code), Some(4));
    // The ended session holds no slot: a run's whole share is still open to it, and no more.
    let mut held = Vec::new();
    for _ in 0..crate::interactive::SESSIONS_PER_RUN_MAX {
        held.push(connect(&runner, open(13, pb::SessionKind::Exec, &["sleep", "60"])).await.expect("exec"));
    }
    let over = connect(&runner, open(13, pb::SessionKind::Exec, &["true"])).await.err().map(|e| e.code());
    assert_eq!(over, Some(tonic::Code::ResourceExhausted), "a run past its share of sessions");
    drop(held);
    runner.stop_all(Duration::from_secs(1)).await;
}

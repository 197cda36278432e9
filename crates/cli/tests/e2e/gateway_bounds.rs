//! What strangers can hold of kairosd (issue 49): the HTTP gateway checks a token before it
//! reads a body and gives a whole request a deadline, one user cannot take every stream slot,
//! and the connection bounds fit under the descriptor limit, so kairosd under `ulimit -n 1024`
//! keeps answering while a client holds far more connections than that.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::{wait_for, Cluster, Options};

/// The gateway's default deadline for a whole request (`--http-request-timeout`).
const REQUEST_DEADLINE: Duration = Duration::from_secs(30);
/// The gateway's stream slots, and one user's share of them.
const STREAMS_MAX: usize = 512;
const STREAMS_PER_USER: usize = 64;

/// kairosd's resident memory in bytes (`VmRSS`).
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("kairosd's /proc status");
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok())
        .expect("VmRSS in /proc/PID/status");
    kb * 1024
}

fn kairosd_pid(c: &Cluster) -> u32 {
    c.controllers[0].child.as_ref().expect("kairosd runs").id()
}

fn admin_token(c: &Cluster) -> String {
    std::fs::read_to_string(c.token_file()).expect("admin token").trim().to_string()
}

/// The status code and the rest of a whole answer on its own connection.
fn http(addr: &str, method: &str, path: &str, token: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw).to_string();
    (status_of(&text).unwrap_or_else(|| panic!("no status line in {text:?}")), text)
}

fn status_of(head: &str) -> Option<u16> {
    head.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()
}

fn json_body(answer: &str) -> Value {
    let body = answer.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {answer}"))
}

fn create_token(addr: &str, admin: &str, user: &str) -> String {
    let body = serde_json::json!({"user": user, "role": "user"}).to_string();
    let (status, answer) = http(addr, "POST", "/api/v1/tokens", admin, &body);
    assert_eq!(status, 200, "{answer}");
    json_body(&answer)["token"].as_str().expect("a token").to_string()
}

fn submit(addr: &str, token: &str, argv: &[&str]) -> u64 {
    let body = serde_json::json!({"spec": {"argv": argv, "resources": {"gpus": 1}}}).to_string();
    let (status, answer) = http(addr, "POST", "/api/v1/jobs", token, &body);
    assert_eq!(status, 200, "{answer}");
    json_body(&answer)["job_id"].as_u64().expect("a job id")
}

/// Whether the peer has closed `s` (EOF or reset) within `within`; bytes before are skipped.
fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        s.set_read_timeout(Some(left.min(Duration::from_secs(1)))).unwrap();
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                continue
            }
            Err(_) => return true,
        }
    }
}

#[test]
fn unauthenticated_slow_bodies_are_closed_unread_within_the_deadline_and_hold_no_memory() {
    const BODY: usize = 4 * 1024 * 1024;
    let c = Cluster::start_opts(1, 1, Options { http: true, ..Options::default() });
    let addr = c.controllers[0].http.clone().expect("--http-addr");
    let admin = admin_token(&c);
    // Warm the gateway up (its channel, the descriptors) before the baseline.
    assert_eq!(http(&addr, "GET", "/api/v1/whoami", &admin, "").0, 200);
    let pid = kairosd_pid(&c);
    let start_rss = rss(pid);

    // 40 connections, each declaring a 4 MiB body with a bogus token and sending all of it but
    // one byte, slowly (64 KiB every 50 ms), then holding the connection open.
    let started = Instant::now();
    let attackers: Vec<std::thread::JoinHandle<(bool, Duration, String)>> = (0..40)
        .map(|_| {
            let addr = addr.clone();
            std::thread::spawn(move || {
                let mut s = TcpStream::connect(&addr).expect("connecting to the gateway");
                s.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
                let head = format!(
                    "POST /api/v1/jobs HTTP/1.1\r\nHost: {addr}\r\n\
                     Authorization: Bearer kairos_00112233aabbccdd_bogus\r\n\
                     Content-Type: application/json\r\nContent-Length: {BODY}\r\n\r\n"
                );
                let began = Instant::now();
                let mut refused_early = s.write_all(head.as_bytes()).is_err();
                let chunk = vec![b' '; 64 * 1024];
                let mut sent = 0;
                while !refused_early && sent < BODY - 1 {
                    let n = chunk.len().min(BODY - 1 - sent);
                    match s.write_all(&chunk[..n]) {
                        Ok(()) => sent += n,
                        Err(_) => refused_early = true,
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                // What the gateway answered, if it came before the close.
                let mut answer = vec![0u8; 512];
                s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
                let n = s.read(&mut answer).unwrap_or(0);
                let answer = String::from_utf8_lossy(&answer[..n]).to_string();
                let closed = refused_early
                    || closed_within(
                        &mut s,
                        (REQUEST_DEADLINE + Duration::from_secs(5)).saturating_sub(began.elapsed()),
                    );
                (closed, began.elapsed(), answer)
            })
        })
        .collect();
    let mut peak = start_rss;
    while attackers.iter().any(|a| !a.is_finished()) {
        peak = peak.max(rss(pid));
        std::thread::sleep(Duration::from_millis(100));
    }
    let results: Vec<(bool, Duration, String)> = attackers.into_iter().map(|a| a.join().unwrap()).collect();
    for (closed, took, answer) in &results {
        assert!(closed, "a connection with a bogus token was kept open past the request deadline ({took:?})");
        assert!(*took <= REQUEST_DEADLINE + Duration::from_secs(5), "closed only after {took:?}");
        // The refusal, when it was read before the close, is 401: the token was checked first.
        if let Some(status) = status_of(answer) {
            assert_eq!(status, 401, "{answer}");
        }
    }
    assert!(
        results.iter().any(|(_, _, a)| status_of(a) == Some(401)),
        "no connection read a 401: {:?}",
        results.iter().map(|r| &r.2).collect::<Vec<_>>()
    );
    let grew = peak.saturating_sub(start_rss);
    assert!(
        grew < 50 * 1024 * 1024,
        "kairosd grew by {} MB (from {} MB) while 40 strangers sent bodies",
        grew >> 20,
        start_rss >> 20
    );
    // kairosd still serves.
    assert_eq!(http(&addr, "GET", "/api/v1/whoami", &admin, "").0, 200);
    eprintln!("40 bogus 4 MiB bodies: all closed within {:?}; RSS grew {} KB", started.elapsed(), grew >> 10);
}

#[test]
fn a_request_trickled_past_the_deadline_is_cut_off_even_with_a_valid_token() {
    let flags = vec!["--http-request-timeout".to_string(), "3s".to_string()];
    let c = Cluster::start_opts(1, 1, Options { http: true, controller_flags: flags, ..Options::default() });
    let addr = c.controllers[0].http.clone().expect("--http-addr");
    let admin = admin_token(&c);
    let mut s = TcpStream::connect(&addr).unwrap();
    let head = format!(
        "POST /api/v1/jobs HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {admin}\r\n\
         Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
    );
    s.write_all(head.as_bytes()).unwrap();
    let began = Instant::now();
    // One byte every 100 ms, until the gateway closes the connection (or 20 s pass).
    let mut writer = s.try_clone().unwrap();
    let trickle = std::thread::spawn(move || {
        let until = Instant::now() + Duration::from_secs(20);
        while Instant::now() < until && writer.write_all(b" ").is_ok() {
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
        }
    }
    let took = began.elapsed();
    let answer = String::from_utf8_lossy(&answer).to_string();
    let _ = s.shutdown(std::net::Shutdown::Both);
    trickle.join().unwrap();
    assert_eq!(status_of(&answer), Some(408), "{answer:?} after {took:?}");
    assert!(json_body(&answer)["error"]["message"].as_str().unwrap_or("").contains("whole"), "{answer}");
    assert!(took >= Duration::from_millis(1500) && took < Duration::from_secs(8), "cut off after {took:?}");
    // An honest request still goes through.
    assert_eq!(http(&addr, "GET", "/api/v1/whoami", &admin, "").0, 200);
}

/// Opens `GET path` as a stream and reads its head: the status and the open connection.
fn open_stream(addr: &str, path: &str, token: &str) -> (u16, String, TcpStream) {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\n\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => head.extend_from_slice(&buf[..n]),
            Err(e) => panic!("reading a stream's head: {e}"),
        }
    }
    let head = String::from_utf8_lossy(&head).to_string();
    (status_of(&head).unwrap_or_else(|| panic!("no status in {head:?}")), head, s)
}

#[test]
fn a_user_holding_streams_cannot_take_every_slot_and_another_user_still_opens_one() {
    let c = Cluster::start_opts(1, 1, Options { http: true, ..Options::default() });
    let addr = c.controllers[0].http.clone().expect("--http-addr");
    let admin = admin_token(&c);
    let alice = create_token(&addr, &admin, "alice");
    let bob = create_token(&addr, &admin, "bob");
    // Jobs that do not end while the test runs, so their event streams stay open.
    let alices = submit(&addr, &alice, &["sleep", "600"]);
    let bobs = submit(&addr, &bob, &["sleep", "600"]);

    // Alice opens event streams until the gateway refuses one.
    let mut held = Vec::new();
    let mut first_head: Option<String> = None;
    let refusal = loop {
        assert!(held.len() < STREAMS_MAX, "alice holds every one of the {STREAMS_MAX} stream slots");
        let (status, head, s) = open_stream(&addr, &format!("/api/v1/jobs/{alices}/events"), &alice);
        match status {
            200 => {
                first_head.get_or_insert(head);
                held.push(s);
            }
            _ => {
                let mut rest = String::new();
                let mut s = s;
                let _ = s.read_to_string(&mut rest);
                break (status, format!("{head}{rest}"));
            }
        }
    };
    assert_eq!(refusal.0, 429, "{}", refusal.1);
    assert!(refusal.1.contains("RESOURCE_EXHAUSTED") && refusal.1.contains("alice"), "{}", refusal.1);
    assert_eq!(held.len(), STREAMS_PER_USER, "alice's share");
    // Her streams are live: the first carries her job's state (the head's read may have taken
    // the event's start).
    let mut seen = first_head.unwrap_or_default();
    while !seen.contains("JOB_STATE_") {
        let mut more = [0u8; 4096];
        let n = held[0].read(&mut more).expect("an event");
        assert!(n > 0, "the stream ended: {seen:?}");
        seen.push_str(&String::from_utf8_lossy(&more[..n]));
    }

    // Bob still gets a stream while alice holds hers.
    let (status, head, _bobs_stream) = open_stream(&addr, &format!("/api/v1/jobs/{bobs}/events"), &bob);
    assert_eq!(status, 200, "{head}");
    // Alice's own refusal stands while she holds her share.
    let (status, head, _) = open_stream(&addr, &format!("/api/v1/jobs/{alices}/logs?follow=true"), &alice);
    assert_eq!(status, 429, "{head}");
    drop(held);
}

/// Raises this test process's own soft descriptor limit to its hard one (it holds more than
/// 1,100 sockets).
fn raise_own_nofile() -> u64 {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit read and write the struct given.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        lim.rlim_cur = lim.rlim_max;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
    }
    lim.rlim_cur
}

/// One HTTP/2 client that says hello and then pings every second, from `from`: whether the
/// server answered it (accepted) is set in `accepted`; the task ends when the server closes.
async fn talking_connection(
    from: std::net::SocketAddr,
    to: std::net::SocketAddr,
    accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(socket) = tokio::net::TcpSocket::new_v4() else { return };
    if socket.bind(from).is_err() {
        return;
    }
    let Ok(Ok(stream)) = tokio::time::timeout(Duration::from_secs(10), socket.connect(to)).await else {
        return;
    };
    let (mut rd, mut wr) = stream.into_split();
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    const SETTINGS: [u8; 9] = [0, 0, 0, 4, 0, 0, 0, 0, 0];
    const SETTINGS_ACK: [u8; 9] = [0, 0, 0, 4, 1, 0, 0, 0, 0];
    const PING: [u8; 17] = [0, 0, 8, 6, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8];
    if wr.write_all(PREFACE).await.is_err() || wr.write_all(&SETTINGS).await.is_err() {
        return;
    }
    let heard = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let heard = heard.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 1024];
            while let Ok(n) = rd.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                if !heard.swap(true, std::sync::atomic::Ordering::SeqCst) {
                    accepted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            }
        })
    };
    let mut acked = false;
    while !reader.is_finished() {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if !acked && heard.load(std::sync::atomic::Ordering::SeqCst) {
            acked = wr.write_all(&SETTINGS_ACK).await.is_ok();
        }
        if wr.write_all(&PING).await.is_err() {
            break;
        }
    }
}

/// `kairos nodes` against `c`, given at most `within`; whether it answered.
fn nodes_answers(c: &Cluster, within: Duration) -> Result<String, String> {
    let mut child = c
        .cli()
        .arg("nodes")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kairos nodes");
    let deadline = Instant::now() + within;
    loop {
        if let Ok(Some(_)) = child.try_wait() {
            let out = child.wait_with_output().expect("kairos nodes' output");
            let text = String::from_utf8_lossy(&out.stdout).to_string();
            return match out.status.success() {
                true => Ok(text),
                false => Err(String::from_utf8_lossy(&out.stderr).to_string()),
            };
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("no answer within {within:?}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn kairosd_under_ulimit_1024_keeps_answering_with_1100_talking_connections_open() {
    use std::os::unix::process::CommandExt;
    const CONNECTIONS: usize = 1100;
    let own = raise_own_nofile();
    assert!(
        own >= 2 * CONNECTIONS as u64,
        "this test needs {} descriptors of its own; the limit is {own}",
        2 * CONNECTIONS
    );
    let mut c = Cluster::start_opts(1, 1, Options::default());
    // Restart the replica under `ulimit -n 1024` (soft and hard: it cannot raise it).
    c.kill_controller(0);
    let addr = c.controllers[0].addr.clone();
    let mut cmd = c.controller_command(1, &addr);
    // SAFETY: only setrlimit between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let lim = libc::rlimit { rlim_cur: 1024, rlim_max: 1024 };
            match libc::setrlimit(libc::RLIMIT_NOFILE, &lim) {
                0 => Ok(()),
                _ => Err(std::io::Error::last_os_error()),
            }
        });
    }
    c.controllers[0].child = Some(cmd.spawn().expect("start kairosd under ulimit -n 1024"));
    let pid = kairosd_pid(&c);
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("kairosd's limits");
    let open_files = limits.lines().find(|l| l.starts_with("Max open files")).unwrap_or("").to_string();
    assert_eq!(open_files.split_whitespace().nth(3), Some("1024"), "{open_files}");
    wait_for("kairosd to answer under ulimit -n 1024", || nodes_answers(&c, Duration::from_secs(10)).ok());

    // 1,100 HTTP/2 connections from another address that say hello and ping every second.
    let to: std::net::SocketAddr = addr.parse().expect("kairosd's address");
    let from: std::net::SocketAddr = "127.0.0.2:0".parse().unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let tasks: Vec<tokio::task::JoinHandle<()>> =
        (0..CONNECTIONS).map(|_| runtime.spawn(talking_connection(from, to, accepted.clone()))).collect();
    // Let them connect and talk a while: without fitted bounds the daemon runs out of
    // descriptors here and stops accepting anyone.
    std::thread::sleep(Duration::from_secs(4));
    let talking = tasks.iter().filter(|t| !t.is_finished()).count();
    let answered = accepted.load(std::sync::atomic::Ordering::SeqCst);
    assert!(answered >= 100, "only {answered} of the connections were ever served");
    for round in 0..5 {
        match nodes_answers(&c, Duration::from_secs(10)) {
            Ok(out) => assert!(out.contains("node-a"), "{out}"),
            Err(e) => panic!(
                "round {round}: `kairos nodes` failed with {talking} connections open ({answered} served): {e}"
            ),
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    let pid_alive = crate::harness::alive(pid);
    for t in &tasks {
        t.abort();
    }
    runtime.shutdown_timeout(Duration::from_secs(5));
    assert!(pid_alive, "kairosd died");
    eprintln!("{CONNECTIONS} talking connections: {answered} served, {talking} still open after 4 s");
}

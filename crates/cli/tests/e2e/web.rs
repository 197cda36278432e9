//! The JSON HTTP API and the web UI (`kairosd --http-addr`): plain HTTP/1.1 over loopback
//! against a three-replica cluster, and headless Chromium against a real `kairos up`
//! (tests/web/check_ui.py; scripts/test.sh installs chromium, chromedriver and Selenium).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::Value;

use crate::harness::{free_addr, python, wait_for, Cluster, Options};

/// An HTTP answer.
pub(crate) struct Reply {
    pub(crate) status: u16,
    headers: Vec<(String, String)>,
    pub(crate) body: String,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    pub(crate) fn header(&self, name: &str) -> Vec<&str> {
        self.headers.iter().filter(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str()).collect()
    }
}

/// One request on its own connection; the whole answer (a chunked one decoded).
pub(crate) fn http(addr: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Reply {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if !body.is_empty() || method == "POST" || method == "PUT" {
        req.push_str(&format!("Content-Type: application/json\r\nContent-Length: {}\r\n", body.len()));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    parse(&raw)
}

fn parse(raw: &[u8]) -> Reply {
    let text = String::from_utf8_lossy(raw).to_string();
    let (head, rest) = text.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no HTTP head in {text:?}"));
    let mut lines = head.lines();
    let status = lines.next().and_then(|l| l.split(' ').nth(1)).and_then(|s| s.parse().ok()).unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let chunked = headers.iter().any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
    let body = if chunked { dechunk(rest) } else { rest.to_string() };
    Reply { status, headers, body }
}

fn dechunk(mut rest: &str) -> String {
    let mut out = String::new();
    while let Some((size, after)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || after.len() < n {
            break;
        }
        out.push_str(&after[..n]);
        rest = after[n..].strip_prefix("\r\n").unwrap_or(&after[n..]);
    }
    out
}

pub(crate) fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

/// Submits `argv` as the token's user through `addr`; the job's id.
fn submit(addr: &str, token: &str, argv: &[&str]) -> u64 {
    let body = serde_json::json!({"spec": {"argv": argv, "resources": {"gpus": 1}}}).to_string();
    let r = http(addr, "POST", "/api/v1/jobs", &[("Authorization", &bearer(token))], &body);
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["job_id"].as_u64().unwrap()
}

pub(crate) fn create_token(addr: &str, admin: &str, user: &str) -> String {
    let body = serde_json::json!({"user": user, "role": "user"}).to_string();
    let r = http(addr, "POST", "/api/v1/tokens", &[("Authorization", &bearer(admin))], &body);
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["token"].as_str().unwrap().to_string()
}

#[test]
fn the_json_api_answers_as_grpc_does_through_any_replica_and_refuses_bad_calls_unread() {
    let c = Cluster::start_opts(3, 2, Options { http: true, ..Options::default() });
    let leader = c.leader();
    let follower = c.follower();
    let via = |i: usize| c.controllers[i].http.clone().unwrap();
    let (lead, foll) = (via(leader), via(follower));
    let admin = std::fs::read_to_string(c.token_file()).unwrap().trim().to_string();

    // Tokens made and jobs submitted through a follower (both are writes the leader makes).
    let alice = create_token(&foll, &admin, "alice");
    let bob = create_token(&foll, &admin, "bob");
    let id = submit(&foll, &alice, &["sh", "-c", "echo hello-web"]);
    for addr in [&lead, &foll] {
        wait_for("the job listed by both replicas", || {
            let r = http(addr, "GET", "/api/v1/jobs?all=true", &[("Authorization", &bearer(&alice))], "");
            assert_eq!(r.status, 200, "{}", r.body);
            r.json()["jobs"].as_array().unwrap().iter().any(|j| j["id"] == id).then_some(())
        });
    }
    // The job's changes as server-sent events, until it ends; then its log.
    let events =
        http(&foll, "GET", &format!("/api/v1/jobs/{id}/events"), &[("Authorization", &bearer(&alice))], "");
    assert_eq!(events.header("content-type"), ["text/event-stream"]);
    assert!(events.body.starts_with("data: {"), "{}", events.body);
    assert!(events.body.contains("\"state\":\"JOB_STATE_COMPLETED\""), "{}", events.body);
    let logs =
        http(&lead, "GET", &format!("/api/v1/jobs/{id}/logs"), &[("Authorization", &bearer(&alice))], "");
    assert_eq!((logs.status, logs.body.as_str()), (200, "hello-web\n"));

    // Refusals: JSON errors with the gRPC code's meaning.
    let no_token = http(&foll, "GET", "/api/v1/jobs", &[], "");
    assert_eq!((no_token.status, &no_token.json()["error"]["code"]), (401, &Value::from("UNAUTHENTICATED")));
    let bad_token =
        http(&foll, "GET", "/api/v1/jobs", &[("Authorization", "Bearer kairos_00112233aabbccdd_x")], "");
    assert_eq!(bad_token.status, 401, "{}", bad_token.body);
    let others = http(&foll, "GET", &format!("/api/v1/jobs/{id}"), &[("Authorization", &bearer(&bob))], "");
    assert_eq!((others.status, &others.json()["error"]["code"]), (403, &Value::from("PERMISSION_DENIED")));
    let user_admin = http(&lead, "GET", "/api/v1/tokens", &[("Authorization", &bearer(&alice))], "");
    assert_eq!(user_admin.status, 403, "{}", user_admin.body);
    let unknown = http(&lead, "GET", "/api/v1/jobs?colour=red", &[("Authorization", &bearer(&alice))], "");
    assert_eq!(unknown.status, 400);
    assert!(unknown.json()["error"]["message"].as_str().unwrap().contains("colour"), "{}", unknown.body);
    assert_eq!(http(&lead, "GET", "/api/v1/nothing", &[("Authorization", &bearer(&alice))], "").status, 404);
    let twice =
        http(&lead, "GET", &format!("/api/v1/jobs/{id}?job_id=9"), &[("Authorization", &bearer(&alice))], "");
    assert_eq!(twice.status, 400, "{}", twice.body);

    // A body larger than the bound is refused from its declared length: the answer comes
    // though not one byte of the body was sent.
    let mut s = TcpStream::connect(&foll).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let head = format!(
        "POST /api/v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {alice}\r\nContent-Type: application/json\r\nContent-Length: 50000000\r\n\r\n"
    );
    s.write_all(head.as_bytes()).unwrap();
    let mut buf = [0u8; 4096];
    let n = s.read(&mut buf).expect("an answer before the body");
    let early = parse(&buf[..n]);
    assert_eq!(early.status, 413, "{}", early.body);
    let before = http(&lead, "GET", "/api/v1/jobs?all=true", &[("Authorization", &bearer(&alice))], "");
    assert_eq!(before.json()["jobs"].as_array().unwrap().len(), 1, "a refused submit changed nothing");

    // The web login: an HttpOnly cookie, and changes under it need the CSRF header.
    let login = http(&foll, "POST", "/ui/login", &[], &serde_json::json!({"token": alice}).to_string());
    assert_eq!((login.status, &login.json()["user"]), (200, &Value::from("alice")), "{}", login.body);
    let cookies = login.header("set-cookie");
    assert!(cookies.iter().any(|c| c.starts_with("kairos_session=")
        && c.contains("HttpOnly")
        && c.contains("SameSite=Strict")));
    let csrf = cookies
        .iter()
        .find_map(|c| c.strip_prefix("kairos_csrf="))
        .and_then(|c| c.split(';').next())
        .unwrap()
        .to_string();
    let jar = format!("kairos_session={alice}; kairos_csrf={csrf}");
    let read = http(&lead, "GET", "/api/v1/whoami", &[("Cookie", &jar)], "");
    assert_eq!((read.status, &read.json()["user"]), (200, &Value::from("alice")));
    let body = serde_json::json!({"spec": {"argv": ["true"]}}).to_string();
    let forged = http(&lead, "POST", "/api/v1/jobs", &[("Cookie", &jar)], &body);
    assert_eq!(forged.status, 403, "{}", forged.body);
    let from_page = http(&lead, "POST", "/api/v1/jobs", &[("Cookie", &jar), ("X-CSRF-Token", &csrf)], &body);
    assert_eq!(from_page.status, 200, "{}", from_page.body);
    let bad_login = http(&lead, "POST", "/ui/login", &[], r#"{"token": "kairos_00112233aabbccdd_x"}"#);
    assert!(bad_login.status == 401 && bad_login.header("set-cookie").is_empty(), "{}", bad_login.body);
    let logout = http(&lead, "POST", "/ui/logout", &[("Cookie", &jar)], "");
    assert!(logout.header("set-cookie").iter().all(|c| c.contains("Max-Age=0")));

    // The OpenAPI document validates, and describes the routes served.
    let doc = http(&foll, "GET", "/api/v1/openapi.json", &[], "");
    assert_eq!(doc.status, 200);
    let spec = c.path("openapi.json");
    std::fs::write(&spec, &doc.body).unwrap();
    let check = "import json, sys\nfrom openapi_spec_validator import validate\nd = json.load(open(sys.argv[1]))\nvalidate(d)\nprint(len(d['paths']))";
    let out = std::process::Command::new(python()).args(["-c", check]).arg(&spec).output().unwrap();
    assert!(
        out.status.success(),
        "the OpenAPI document does not validate: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let paths: usize = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert!(
        paths >= 20 && doc.json()["paths"]["/api/v1/jobs/{job_id}/cancel"]["post"].is_object(),
        "{paths}"
    );
}

/// A running `kairos up`, stopped (SIGTERM, which stops its daemons) when dropped.
struct Up {
    child: std::process::Child,
}

impl Drop for Up {
    fn drop(&mut self) {
        crate::harness::stop_child(&mut self.child);
    }
}

/// A controller and an agent address whose `kairos up` neighbours (+1000, +2000) are free too.
fn up_addrs() -> (String, String) {
    let free = |a: &str, off: u16| {
        let sa: std::net::SocketAddr = a.parse().unwrap();
        std::net::TcpListener::bind(("127.0.0.1", sa.port() + off)).is_ok()
    };
    loop {
        let (c, a) = (free_addr(), free_addr());
        if [&c, &a].iter().all(|x| free(x, 1000) && free(x, 2000)) {
            return (c, a);
        }
    }
}

#[test]
fn the_web_ui_in_headless_chromium_against_kairos_up() {
    for tool in ["/usr/bin/chromium", "/usr/bin/chromedriver"] {
        assert!(std::path::Path::new(tool).exists(), "{tool} is missing: scripts/test.sh installs it");
    }
    let dir = tempfile::Builder::new().prefix("kairos-web-").tempdir().unwrap();
    let (addr, agent) = up_addrs();
    let log = std::fs::File::create(dir.path().join("up.log")).unwrap();
    let child = crate::harness::kairos_cmd()
        .args(["up", "--addr", &addr, "--agent-addr", &agent, "--data-dir"])
        .arg(dir.path().join("data"))
        .env("HOME", dir.path())
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let _up = Up { child };
    let port: u16 = addr.rsplit(':').next().unwrap().parse().unwrap();
    let web = format!("127.0.0.1:{}", port + 1000);
    let token_file = dir.path().join("data/admin.token");
    wait_for("kairos up's node to register", || {
        let token = std::fs::read_to_string(&token_file).ok()?;
        let r = TcpStream::connect(&web)
            .ok()
            .map(|_| http(&web, "GET", "/api/v1/nodes", &[("Authorization", &bearer(token.trim()))], ""))?;
        (r.status == 200 && r.body.contains("NODE_STATE_UP")).then_some(())
    });
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/web/check_ui.py");
    let mut cmd = std::process::Command::new(python());
    cmd.arg(script).args(["--url", &format!("http://{web}")]).arg("--admin-token-file").arg(&token_file);
    if let Some(shots) = std::env::var_os("KAIROS_UI_SCREENSHOTS") {
        cmd.arg("--screenshots").arg(shots);
    }
    let out = cmd.output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let up_log = std::fs::read_to_string(dir.path().join("up.log")).unwrap_or_default();
    assert!(out.status.success(), "check_ui.py failed:\n{stdout}\n{stderr}\nkairos up:\n{up_log}");
    for line in [
        "the login page shows the command, no backticks",
        "the jobs table lists a submitted job within 2 s",
        "the folded array's row shows its tasks' states in words",
        "page shows its preemption by job",
        "shows a running job's elapsed time",
        "ends it CANCELLED",
        "shows its exit code (0) and elapsed time",
        "alice gets a 403 page for bob's job",
        "no operator action to a user",
        "bob sees no preemption of other users' jobs",
        "logout clears the session cookie",
        "the GPU grid groups nodes under their rack",
        "a pending job shows its expected start and why",
        "shows MAINT in the GPU grid",
    ] {
        assert!(stdout.contains(line), "missing \"{line}\" in:\n{stdout}");
    }
    assert!(stdout.trim_end().ends_with("ok"), "{stdout}");
}

#[test]
fn the_history_page_in_headless_chromium_lists_jobs_past_the_retention() {
    for tool in ["/usr/bin/chromium", "/usr/bin/chromedriver"] {
        assert!(std::path::Path::new(tool).exists(), "{tool} is missing: scripts/test.sh installs it");
    }
    // Finished jobs leave the live state a second after they end; the history keeps them.
    let options = Options {
        http: true,
        controller_flags: vec!["--job-retention".into(), "1s".into()],
        ..Options::default()
    };
    let c = Cluster::start_opts(1, 4, options);
    let web = c.controllers[0].http.clone().unwrap();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/web/check_ui.py");
    let mut cmd = std::process::Command::new(python());
    cmd.arg(script)
        .args(["--url", &format!("http://{web}"), "--history"])
        .arg("--admin-token-file")
        .arg(c.token_file());
    if let Some(shots) = std::env::var_os("KAIROS_UI_SCREENSHOTS") {
        cmd.arg("--screenshots").arg(shots);
    }
    let out = cmd.output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "check_ui.py --history failed:\n{stdout}\n{stderr}");
    for line in [
        "left the live state (the Jobs view no longer lists them)",
        "the History page lists job",
        "FAILED, exit code 3",
        "sorts the History page",
    ] {
        assert!(stdout.contains(line), "missing \"{line}\" in:\n{stdout}");
    }
    assert!(stdout.trim_end().ends_with("ok"), "{stdout}");
}

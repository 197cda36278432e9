//! Observability: every daemon's /metrics passes promtool, a real Prometheus scrapes them and
//! the cluster-wide sums are right across a failover, every Grafana panel query evaluates, and
//! `--log-format json` writes only JSON lines.

use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::{bin, free_addr, wait_for, Cluster, Options};

/// One HTTP GET on loopback: (status code, body).
pub(crate) fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    let raw = String::from_utf8_lossy(&raw).to_string();
    let (head, body) = raw.split_once("\r\n\r\n")?;
    let code = head.split(' ').nth(1)?.parse().ok()?;
    // Prometheus answers small bodies whole; a chunked one is not expected from either server.
    Some((code, body.to_string()))
}

fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A real Prometheus (Debian's package) scraping `targets` every second; killed on drop.
struct Prometheus {
    child: Child,
    addr: String,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(targets: &[String]) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        let list = targets.iter().map(|t| format!("'{t}'")).collect::<Vec<_>>().join(", ");
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: kairos\n    static_configs:\n      - targets: [{list}]\n"
        );
        std::fs::write(dir.path().join("prometheus.yml"), config).unwrap();
        let addr = free_addr();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", dir.path().join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("prometheus.log")).unwrap())
            .spawn()
            .expect("prometheus (Debian package `prometheus`; scripts/test.sh installs it)");
        let p = Prometheus { child, addr, _dir: dir };
        wait_for("prometheus to be ready", || http_get(&p.addr, "/-/ready").filter(|(c, _)| *c == 200));
        p
    }

    /// An instant query's result vector (panics when Prometheus refuses the query).
    fn query(&self, expr: &str) -> Vec<Value> {
        let (code, body) = http_get(&self.addr, &format!("/api/v1/query?query={}", url_encode(expr)))
            .unwrap_or_else(|| panic!("no answer to {expr}"));
        let v: Value = serde_json::from_str(&body).unwrap_or_else(|_| panic!("{expr}: {body}"));
        assert_eq!((code, v["status"].as_str()), (200, Some("success")), "{expr}: {body}");
        v["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    /// The single value of a query that returns one series, if it does.
    fn scalar(&self, expr: &str) -> Option<f64> {
        let r = self.query(expr);
        r.first()?["value"][1].as_str()?.parse().ok()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `promtool check metrics` on one scrape of `addr`.
fn promtool_check(addr: &str) {
    let (code, text) = http_get(addr, "/metrics").expect("a scrape");
    assert_eq!(code, 200, "{text}");
    let mut p = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian package `prometheus`)");
    p.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = p.wait_with_output().unwrap();
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool check metrics on {addr}: {}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn prometheus_scrapes_every_daemon_and_the_cluster_sums_hold_across_a_failover() {
    let mut c = Cluster::start_opts(3, 2, Options { metrics: true, ..Options::default() });
    let mut targets: Vec<String> = c.controllers.iter().filter_map(|r| r.metrics.clone()).collect();
    targets.push(c.agent_metrics.clone().unwrap());
    for t in &targets {
        promtool_check(t);
    }
    // Known label values are there from the start, at 0.
    let (_, text) = http_get(&targets[0], "/metrics").unwrap();
    for series in [
        "kairos_preemptions_total{mode=\"requeue\"} 0",
        "kairos_preemptions_total{mode=\"vacate\"} 0",
        "kairos_gangs_spread_total 0",
        "kairos_submits_total{outcome=\"rate_limited\"} 0",
        "kairos_burst_instances{state=\"launched\"} 0",
    ] {
        assert!(text.contains(series), "{series} missing:\n{text}");
    }
    let prom = Prometheus::start(&targets);
    let id = c.submit(&["--gpus", "2", "--", "sleep", "60"]);
    wait_for("the job to run", || (c.job(id)["state"] == "RUNNING").then_some(()));
    wait_for("sum(kairos_gpus{state=\"allocated\"}) to be 2", || {
        (prom.scalar("sum(kairos_gpus{state=\"allocated\"})") == Some(2.0)).then_some(())
    });
    assert_eq!(prom.scalar("sum(kairos_raft_is_leader)"), Some(1.0));
    wait_for("the agent to report its run", || {
        (prom.scalar("sum(kairos_agent_runs)") == Some(1.0)).then_some(())
    });
    wait_for("the accepted submit to be counted", || {
        (prom.scalar("sum(kairos_submits_total{outcome=\"accepted\"})") >= Some(1.0)).then_some(())
    });

    // Every Grafana panel's query evaluates; the job and GPU panels have data.
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/grafana/kairos.json"))
            .unwrap(),
    )
    .unwrap();
    let panels = dashboard["panels"].as_array().unwrap();
    assert!(panels.len() >= 8, "{} panels", panels.len());
    for panel in panels {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            let result = prom.query(expr);
            let title = panel["title"].as_str().unwrap();
            if expr.contains("kairos_jobs") || expr.contains("kairos_gpus") {
                assert!(!result.is_empty(), "panel \"{title}\" has no data: {expr}");
            }
        }
    }

    // The leader dies: one leader again within a few scrapes (its series go stale).
    let leader = c.leader();
    c.kill_controller(leader);
    let started = Instant::now();
    wait_for("sum(kairos_raft_is_leader) to be 1 again without the old leader", || {
        let leaders = prom.scalar("sum(kairos_raft_is_leader)");
        let replicas = prom.scalar("count(kairos_raft_is_leader)");
        (leaders == Some(1.0) && replicas == Some(2.0)).then_some(())
    });
    assert!(started.elapsed() < Duration::from_secs(20), "took {:?}", started.elapsed());
    wait_for("the new leader to report the 2 allocated GPUs", || {
        (prom.scalar("sum(kairos_gpus{state=\"allocated\"})") == Some(2.0)).then_some(())
    });
    c.ok(&["cancel", &id.to_string()]);
}

#[test]
fn kairosd_log_format_json_writes_only_json_lines() {
    let dir = tempfile::tempdir().unwrap();
    let addr = free_addr();
    let stderr = dir.path().join("stderr.log");
    let stdout = dir.path().join("stdout.log");
    let mut kairosd = Command::new(bin("kairosd"))
        .args(["--id", "1", "--addr", &addr, "--log-format", "json", "--metrics-addr", &free_addr()])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .stdout(std::fs::File::create(&stdout).unwrap())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .unwrap();
    let cli = |args: &[&str]| {
        crate::harness::kairos_cmd()
            .args(["--controllers", &addr])
            .args(args)
            .env("KAIROS_TOKEN_FILE", dir.path().join("data/admin.token"))
            .output()
            .unwrap()
    };
    wait_for("kairosd to answer", || cli(&["cluster", "status"]).status.success().then_some(()));
    assert!(cli(&["submit", "--", "true"]).status.success());
    assert!(!cli(&["submit", "-c", "100000", "--", "true"]).status.success());
    crate::harness::stop_child(&mut kairosd);
    // Nothing plain on stdout either (the metrics address is in the JSON log).
    let out = std::fs::read_to_string(&stdout).unwrap();
    for line in out.lines() {
        serde_json::from_str::<Value>(line).unwrap_or_else(|e| panic!("not JSON on stdout ({e}): {line}"));
    }
    let text = std::fs::read_to_string(&stderr).unwrap();
    assert!(text.contains("serving metrics"), "{text}");
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines.len() >= 2, "too few log lines to mean anything: {text}");
    for line in lines {
        let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(v["level"].is_string() && v["timestamp"].is_string(), "{line}");
    }
}

/// Spans an OTLP receiver got: (service.name, trace id, span name).
type Received = std::sync::Arc<std::sync::Mutex<Vec<(String, Vec<u8>, String)>>>;

/// The OTLP trace service (opentelemetry-proto's, served with tonic), recording every span.
struct Receiver(Received);

#[tonic::async_trait]
impl opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest>,
    ) -> Result<
        tonic::Response<opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse>,
        tonic::Status,
    > {
        use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
        for rs in request.into_inner().resource_spans {
            let service = rs
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
                    Any::StringValue(s) => Some(s.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            for span in rs.scope_spans.into_iter().flat_map(|s| s.spans) {
                self.0.lock().unwrap().push((service.clone(), span.trace_id, span.name));
            }
        }
        Ok(tonic::Response::new(Default::default()))
    }
}

#[test]
fn one_trace_holds_the_cli_the_controller_and_the_agent_and_the_job_joins_it() {
    use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::TraceServiceServer;
    let received: Received = Default::default();
    let otlp = free_addr();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let listener = rt.block_on(tokio::net::TcpListener::bind(&otlp)).unwrap();
    rt.spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(Receiver(received.clone())))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    let env = vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT".to_string(), format!("http://{otlp}")),
        ("OTEL_BSP_SCHEDULE_DELAY".to_string(), "100".to_string()),
    ];
    let c =
        Cluster::start_opts(1, 1, Options { daemon_env: env.clone(), cli_env: env, ..Options::default() });
    let id = c.submit(&["--", "sh", "-c", "echo $TRACEPARENT"]);
    assert_eq!(c.wait_done(id)["state"], "COMPLETED");
    let out = c.ok(&["logs", &id.to_string()]);
    // 00-<trace id>-<span id>-<flags>
    let fields: Vec<&str> = out.trim().split('-').collect();
    assert_eq!(fields.len(), 4, "the job's TRACEPARENT: {out:?}");
    let trace: Vec<u8> =
        (0..16).map(|i| u8::from_str_radix(&fields[1][2 * i..2 * i + 2], 16).unwrap()).collect();
    let want = [
        ("kairos", "kairos submit"),
        ("kairosd", "submit"),
        ("kairosd", "commit"),
        ("kairosd", "schedule"),
        ("kairos-agent", "launch"),
    ];
    let got = wait_for("every service's span of the job's trace", || {
        let spans = received.lock().unwrap().clone();
        let of_job: Vec<(String, String)> =
            spans.into_iter().filter(|(_, t, _)| *t == trace).map(|(s, _, n)| (s, n)).collect();
        want.iter().all(|(s, n)| of_job.iter().any(|(gs, gn)| gs == s && gn == n)).then_some(of_job)
    });
    assert!(got.len() >= want.len(), "{got:?}");
    rt.shutdown_background();
}

#[test]
fn the_agent_keeps_dcgm_exporters_job_mapping() {
    let map = tempfile::tempdir().unwrap();
    let dir = map.path().display().to_string();
    let c = Cluster::start_opts(
        1,
        4,
        Options { agent_flags: vec!["--hpc-job-mapping-dir".into(), dir.clone()], ..Options::default() },
    );
    let id = c.submit(&["--gpus", "2", "--", "sleep", "60"]);
    wait_for("the job to run", || (c.job(id)["state"] == "RUNNING").then_some(()));
    let gpus: Vec<u64> =
        c.job(id)["gpu_ids"].as_array().unwrap().iter().map(|g| g.as_u64().unwrap()).collect();
    assert_eq!(gpus.len(), 2);
    let files = || {
        let mut names: Vec<String> = std::fs::read_dir(map.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    };
    wait_for("a mapping file per GPU of the job", || {
        let want: Vec<String> = gpus.iter().map(u64::to_string).collect();
        (files() == want).then_some(())
    });
    for g in &gpus {
        assert_eq!(std::fs::read_to_string(map.path().join(g.to_string())).unwrap(), format!("{id}\n"));
    }
    c.ok(&["cancel", &id.to_string()]);
    wait_for("the files to go with the job", || files().is_empty().then_some(()));
}

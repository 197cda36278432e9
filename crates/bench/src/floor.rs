//! `kairos-bench grpc-floor`: what the submit load costs with nothing behind the API edge — the
//! same clients (`client_loop`, the same requests and connections) against a process that
//! answers each `Submit` at once with a job like kairosd's answer, without authentication,
//! consensus, disk or state. Its CPU time per call is the floor any server behind a unary gRPC
//! edge (tonic, HTTP/2 over loopback TCP) pays on this machine; `submit`'s figures above it are
//! what kairos adds.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use kairos_proto::v1 as pb;
use kairos_proto::v1::job_service_server::{JobService, JobServiceServer};
use serde_json::json;
use tonic::{Request, Response, Status};

/// Answers submits at once; every other call is `UNIMPLEMENTED`.
#[derive(Default)]
struct Floor {
    next: AtomicU64,
}

fn unimplemented<T>() -> Result<Response<T>, Status> {
    Err(Status::unimplemented("the gRPC floor answers Submit only"))
}

type Empty<T> = tokio_stream::Empty<Result<T, Status>>;

#[tonic::async_trait]
impl JobService for Floor {
    async fn submit(
        &self,
        request: Request<pb::SubmitRequest>,
    ) -> Result<Response<pb::SubmitResponse>, Status> {
        let spec = request.into_inner().spec;
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let job = pb::Job {
            id,
            user: "bench".into(),
            spec,
            qos: "normal".into(),
            priority: 1000,
            submit_time_ms: 1,
            events: vec![pb::JobEvent {
                time_ms: 1,
                kind: "submitted".into(),
                message: "by \"bench\", qos \"normal\"".into(),
            }],
            ..Default::default()
        };
        Ok(Response::new(pb::SubmitResponse { job_id: id, job: Some(job) }))
    }
    async fn get_job(&self, _: Request<pb::GetJobRequest>) -> Result<Response<pb::Job>, Status> {
        unimplemented()
    }
    async fn who_am_i(&self, _: Request<pb::WhoAmIRequest>) -> Result<Response<pb::WhoAmIResponse>, Status> {
        unimplemented()
    }
    async fn list_jobs(
        &self,
        _: Request<pb::ListJobsRequest>,
    ) -> Result<Response<pb::ListJobsResponse>, Status> {
        unimplemented()
    }
    async fn cancel_job(&self, _: Request<pb::CancelJobRequest>) -> Result<Response<pb::Job>, Status> {
        unimplemented()
    }
    type WatchJobStream = Empty<pb::Job>;
    async fn watch_job(
        &self,
        _: Request<pb::WatchJobRequest>,
    ) -> Result<Response<Self::WatchJobStream>, Status> {
        unimplemented()
    }
    type StreamLogsStream = Empty<pb::LogChunk>;
    type SessionStream = Empty<pb::SessionOutput>;
    async fn session(
        &self,
        _: Request<tonic::Streaming<pb::SessionInput>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        unimplemented()
    }
    async fn stream_logs(
        &self,
        _: Request<pb::LogsRequest>,
    ) -> Result<Response<Self::StreamLogsStream>, Status> {
        unimplemented()
    }
    async fn hold_job(&self, _: Request<pb::HoldJobRequest>) -> Result<Response<pb::Job>, Status> {
        unimplemented()
    }
    async fn release_job(&self, _: Request<pb::HoldJobRequest>) -> Result<Response<pb::Job>, Status> {
        unimplemented()
    }
    async fn list_history(
        &self,
        _: Request<pb::ListHistoryRequest>,
    ) -> Result<Response<pb::ListHistoryResponse>, Status> {
        unimplemented()
    }
    async fn job_usage(&self, _: Request<pb::JobUsageRequest>) -> Result<Response<pb::UsageSeries>, Status> {
        unimplemented()
    }
}

/// The floor server (`kairos-bench floor-serve`), until killed.
pub async fn serve(addr: String) -> anyhow::Result<serde_json::Value> {
    let addr = addr.parse().with_context(|| format!("--addr {addr}"))?;
    tonic::transport::Server::builder()
        .add_service(JobServiceServer::new(Floor::default()))
        .serve(addr)
        .await
        .context("serving")?;
    Ok(json!({}))
}

/// The submit load against a floor server in a process of its own.
pub async fn bench(clients: usize, conns: usize, seconds: u64) -> anyhow::Result<serde_json::Value> {
    let addr = crate::cluster::free_addr()?;
    let exe = std::env::current_exe().context("locating kairos-bench")?;
    let child = std::process::Command::new(exe)
        .args(["floor-serve", "--addr", &addr])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .spawn()
        .context("starting the floor server")?;
    struct Killed(std::process::Child);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let server = Killed(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    while crate::cluster::connect(&addr).await.is_err() {
        anyhow::ensure!(Instant::now() < deadline, "the floor server did not listen within 10 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let addrs = vec![addr];
    let warm = crate::load::start_load(&addrs, clients, conns)?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    warm.finish().await;
    let load = crate::load::start_load(&addrs, clients, conns)?;
    let t0 = Instant::now();
    let cpu = crate::cpu::Window::start(&[std::process::id(), server.0.id()]);
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let hist = load.finish().await;
    let elapsed = t0.elapsed().as_secs_f64();
    let per_call = cpu.per_op(hist.len());
    let ms = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
    Ok(json!({
        "bench": "grpc-floor",
        "clients": clients,
        "connections": conns,
        "seconds": seconds,
        "calls_per_s": (hist.len() as f64 / elapsed).round(),
        "p50_ms": ms(0.50),
        "p99_ms": ms(0.99),
        // CPU time (user + system) per answered call, in µs, over the measured window.
        "cpu_us_per_call": {
            "clients": per_call[0],
            "server": per_call[1],
            "all": (per_call.iter().sum::<f64>() * 10.0).round() / 10.0,
        },
    }))
}

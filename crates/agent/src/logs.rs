//! The agent's log service: streams a run's log file, optionally following it until the run
//! ends; serves its runs' usage series and interactive sessions (`interactive::stream`).

use std::pin::Pin;
use std::time::Duration;

use futures::Stream;
use kairos_proto::v1 as pb;
use kairos_proto::v1::agent_log_service_server::AgentLogService;
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::jobfs::Dir;
use crate::launch::{job_dir, log_name};
use crate::runner::Runner;

const CHUNK_BYTES: usize = 64 * 1024;

pub struct Logs {
    pub runner: Runner,
    /// This node's credential once registered: only a controller (which derives the same
    /// credential from the cluster secret) may read logs.
    pub credential: std::sync::Arc<std::sync::RwLock<Option<String>>>,
}

impl Logs {
    fn check_caller(&self, metadata: &tonic::metadata::MetadataMap) -> Result<(), Status> {
        let mine = self.credential.read().unwrap_or_else(|p| p.into_inner()).clone();
        let Some(mine) = mine else {
            return Err(Status::unavailable("this agent has not registered yet"));
        };
        match kairos_proto::wire::bearer(metadata) {
            Some(c) if kairos_proto::wire::ct_eq(c, &mine) => Ok(()),
            _ => Err(Status::unauthenticated("logs are served to the controllers only")),
        }
    }
}

/// How long `logs --follow` waits for the log of a run that is placed but not launched yet.
const LAUNCH_WAIT: Duration = Duration::from_secs(10);

#[tonic::async_trait]
impl AgentLogService for Logs {
    type ReadLogsStream = Pin<Box<dyn Stream<Item = Result<pb::LogChunk, Status>> + Send>>;
    type SessionStream = Pin<Box<dyn Stream<Item = Result<pb::SessionOutput, Status>> + Send>>;

    async fn session(
        &self,
        request: Request<tonic::Streaming<pb::SessionInput>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        self.check_caller(request.metadata())?;
        let credential = self.credential.read().unwrap_or_else(|p| p.into_inner()).clone();
        let credential =
            credential.ok_or_else(|| Status::unavailable("this agent has not registered yet"))?;
        let ctx = crate::interactive::stream::Ctx {
            sessions: self.runner.sessions().clone(),
            runs: std::sync::Arc::new(self.runner.clone()),
            credential,
            node: self.runner.node().to_string(),
        };
        let rx = crate::interactive::stream::serve(ctx, request.into_inner()).await?;
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn read_usage(
        &self,
        request: Request<pb::UsageRequest>,
    ) -> Result<Response<pb::UsageSeries>, Status> {
        self.check_caller(request.metadata())?;
        let req = request.into_inner();
        let key = (req.job_id, req.attempt);
        let mut series = self.runner.usage().series(key, crate::usage::now_ms()).ok_or_else(|| {
            Status::not_found(format!(
                "no usage of job {} attempt {} on this node (not run here, or ended too long ago)",
                req.job_id, req.attempt
            ))
        })?;
        series.node = self.runner.node().to_string();
        Ok(Response::new(series))
    }

    async fn read_logs(
        &self,
        request: Request<pb::LogsRequest>,
    ) -> Result<Response<Self::ReadLogsStream>, Status> {
        self.check_caller(request.metadata())?;
        let req = request.into_inner();
        let dir = job_dir(self.runner.state_dir(), req.job_id, req.submit_time_ms);
        // A followed run may be placed and not launched yet (its log appears at launch): wait
        // for it a bounded while.
        let waiting_since = std::time::Instant::now();
        let file = loop {
            // Never through a link a job may have put in place of its log or directory, never
            // blocking on a FIFO, never a file of another account (`jobfs`).
            let opened = Dir::open(&dir).and_then(|d| d.open_existing(&log_name(req.attempt), false));
            match opened {
                Ok(f) => break f,
                Err(e)
                    if req.follow
                        && e.kind() == std::io::ErrorKind::NotFound
                        && waiting_since.elapsed() < LAUNCH_WAIT =>
                {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(Status::not_found(format!(
                        "no log for job {} attempt {} on this node: {e}",
                        req.job_id, req.attempt
                    )))
                }
                Err(e) => {
                    return Err(Status::failed_precondition(format!(
                        "the log of job {} attempt {} cannot be served: {e}",
                        req.job_id, req.attempt
                    )))
                }
            }
        };
        let mut file = tokio::fs::File::from_std(file);
        file.seek(std::io::SeekFrom::Start(req.offset))
            .await
            .map_err(|e| Status::internal(format!("seeking the log: {e}")))?;
        let runner = self.runner.clone();
        let key = (req.job_id, req.attempt);
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::spawn(async move {
            let mut buf = vec![0u8; CHUNK_BYTES];
            loop {
                // Check before reading, so the bytes written before the run ended are all sent.
                let done = !req.follow || runner.finished(key);
                match file.read(&mut buf).await {
                    Ok(0) if done => return,
                    Ok(0) => tokio::time::sleep(Duration::from_millis(200)).await,
                    Ok(n) => {
                        if tx.send(Ok(pb::LogChunk { data: buf[..n].to_vec() })).await.is_err() {
                            return;
                        }
                    }
                    Err(e) => {
                        // The reader may be gone already: then there is no one to tell.
                        let _ = tx.send(Err(Status::internal(format!("reading the log: {e}")))).await;
                        return;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

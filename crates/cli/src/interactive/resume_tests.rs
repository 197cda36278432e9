//! The session client against a fake controller whose first stream breaks (UNAVAILABLE, as
//! a failover does) after some output and an unacknowledged stdin chunk: the second stream
//! resumes the session at the offset held, sends the chunk again, and nothing is written
//! twice.

use std::sync::{Arc, Mutex};

use kairos_proto::v1 as pb;
use kairos_proto::v1::job_service_server::{JobService, JobServiceServer};
use pb::session_input::Input;
use pb::session_output::Output;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;
use tonic::{Request, Response, Status, Streaming};

use super::stream::{drive, Local, Sink};

/// What the fake saw: each stream's open, and the stdin sequence numbers each received.
#[derive(Default)]
struct Seen {
    opens: Vec<pb::SessionOpen>,
    stdin: Vec<Vec<u64>>,
}

#[derive(Default, Clone)]
struct Fake {
    seen: Arc<Mutex<Seen>>,
}

fn out(o: Output) -> Result<pb::SessionOutput, Status> {
    Ok(pb::SessionOutput { output: Some(o) })
}

fn data(offset: u64, bytes: &[u8]) -> Result<pb::SessionOutput, Status> {
    out(Output::Data(pb::SessionOutputChunk { offset, data: bytes.to_vec(), stderr: false }))
}

impl Fake {
    /// One stream: the first breaks after "hello " and stdin 1; the second replays from 3
    /// (the client must skip "lo "), acknowledges, and exits 3.
    async fn pump(
        self,
        mut inbound: Streaming<pb::SessionInput>,
        tx: mpsc::Sender<Result<pb::SessionOutput, Status>>,
    ) {
        let Some(Ok(pb::SessionInput { input: Some(Input::Open(open)) })) = inbound.next().await else {
            return;
        };
        let n = {
            let mut seen = self.seen.lock().expect("lock");
            seen.opens.push(open);
            seen.stdin.push(Vec::new());
            seen.opens.len()
        };
        let opened = pb::SessionOpened {
            session: "s1".into(),
            node: "n1".into(),
            output_offset: if n == 1 { 0 } else { 3 },
            input_seq: 0,
        };
        let _ = tx.send(out(Output::Opened(opened))).await;
        if n == 1 {
            let _ = tx.send(data(0, b"hello ")).await;
        } else {
            let _ = tx.send(data(3, b"lo world")).await;
        }
        while let Some(Ok(msg)) = inbound.next().await {
            if let Some(Input::Stdin(s)) = msg.input {
                self.seen.lock().expect("lock").stdin[n - 1].push(s.seq);
                if n == 1 {
                    let _ = tx.send(Err(Status::unavailable("controller going away"))).await;
                    return;
                }
                let _ = tx.send(out(Output::InputAcked(s.seq))).await;
                let _ = tx
                    .send(out(Output::Exit(pb::SessionExit { code: 3, signal: 0, reason: String::new() })))
                    .await;
                return;
            }
        }
    }
}

fn unimplemented<T>() -> Result<Response<T>, Status> {
    Err(Status::unimplemented("the fake answers Session only"))
}

type Empty<T> = tokio_stream::Empty<Result<T, Status>>;

#[tonic::async_trait]
impl JobService for Fake {
    type SessionStream = ReceiverStream<Result<pb::SessionOutput, Status>>;
    async fn session(
        &self,
        request: Request<Streaming<pb::SessionInput>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(self.clone().pump(request.into_inner(), tx));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
    async fn submit(&self, _: Request<pb::SubmitRequest>) -> Result<Response<pb::SubmitResponse>, Status> {
        unimplemented()
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

#[tokio::test]
async fn a_broken_stream_resumes_at_the_offset_held_and_resends_unacked_stdin() {
    let fake = Fake::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let addr = listener.local_addr().expect("its address").to_string();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(JobServiceServer::new(fake.clone()))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    let client = crate::client::Client::new(vec![addr], None, None, None);
    let (tx, rx) = mpsc::channel(4);
    tx.send(Local::Stdin(b"a".to_vec())).await.expect("queued");
    let open = pb::SessionOpen {
        job_id: 9,
        kind: pb::SessionKind::Exec as i32,
        argv: vec!["cat".into()],
        ..Default::default()
    };
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let exit = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        drive(&client, open, rx, Sink { stdout: &mut stdout, stderr: &mut stderr }),
    )
    .await
    .expect("the session ends")
    .expect("the session resumes");
    assert_eq!((exit.code, super::exit_status(&exit)), (3, 3));
    assert_eq!(String::from_utf8_lossy(&stdout), "hello world", "no byte twice, none lost");
    let seen = fake.seen.lock().expect("lock");
    assert_eq!(seen.opens.len(), 2, "one resumed stream");
    assert_eq!((seen.opens[0].resume.as_str(), seen.opens[0].output_offset), ("", 0));
    assert_eq!((seen.opens[1].resume.as_str(), seen.opens[1].output_offset), ("s1", 6));
    assert_eq!(seen.opens[1].argv, ["cat"], "the resumed open is the same session's");
    assert_eq!(seen.stdin, [vec![1], vec![1]], "the unacknowledged chunk sent again, same number");
    drop(tx);
}

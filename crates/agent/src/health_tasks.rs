//! The agent's health tasks that talk to the controller: GPU faults delivered until taken, and
//! the operator's health-check program (Slurm's `HealthCheckProgram`), whose failure drains the
//! node with the program's first line and whose success ends that drain.

use std::path::PathBuf;
use std::time::Duration;

use kairos_agent::health::GpuFault;
use kairos_agent::session::{until_taken, ClientRx, Credentials, REFUSED};
use kairos_proto::v1 as pb;
use tokio::sync::mpsc;

/// Longest reason a health-check program's output gives.
const CHECK_REASON_MAX: usize = 200;

/// Delivers every GPU fault until a controller takes it.
pub async fn deliver_faults(
    node: String,
    creds: Credentials,
    mut rx: mpsc::UnboundedReceiver<GpuFault>,
    mut client_rx: ClientRx,
) {
    while let Some(f) = rx.recv().await {
        let report =
            pb::GpuFaultReport { node_id: node.clone(), gpu: f.index, uuid: f.uuid, reason: f.reason };
        // A GPU replaced since (another UUID at its index) is refused FAILED_PRECONDITION.
        let refused = [REFUSED.as_slice(), &[tonic::Code::FailedPrecondition]].concat();
        until_taken("GPU fault report", &refused, &mut client_rx, |mut c| {
            let req = creds.request(report.clone());
            async move { c.report_gpu_fault(req).await.map(|_| ()) }
        })
        .await;
    }
}

/// How the health-check program is run.
pub struct HealthCheck {
    pub program: PathBuf,
    pub every: Duration,
    /// A failure also stops and requeues the node's runs.
    pub requeue: bool,
}

/// What one run of the program said: None when it passed, else why not.
async fn run_check(program: &std::path::Path, timeout: Duration) -> Option<String> {
    let mut cmd = tokio::process::Command::new(program);
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    // Recorded as the agent's own: the orphan reaper must not take its exit status (it did,
    // now and then: "could not run: No child processes").
    let child = match kairos_agent::reaper::spawn(|| cmd.spawn(), tokio::process::Child::id) {
        Ok(child) => child,
        Err(e) => return Some(format!("{} could not run: {e}", program.display())),
    };
    let output = match tokio::time::timeout(timeout, child.wait_with_output()).await {
        Err(_) => return Some(format!("{} did not finish within {}s", program.display(), timeout.as_secs())),
        Ok(Err(e)) => return Some(format!("{} could not run: {e}", program.display())),
        Ok(Ok(o)) => o,
    };
    if output.status.success() {
        return None;
    }
    let first = |b: &[u8]| {
        String::from_utf8_lossy(b).lines().map(str::trim).find(|l| !l.is_empty()).map(str::to_string)
    };
    let line = first(&output.stdout)
        .or_else(|| first(&output.stderr))
        .unwrap_or_else(|| format!("{} failed ({})", program.display(), output.status));
    Some(line.chars().take(CHECK_REASON_MAX).collect())
}

/// Runs the program every `check.every` for the life of the agent, and tells the controller:
/// a failure drains the node (the controller ignores a drain it already has), a pass ends a
/// drain the health check caused (and only such a drain).
pub async fn health_check_loop(
    check: HealthCheck,
    node: String,
    creds: Credentials,
    mut client_rx: ClientRx,
) {
    let timeout = check.every.clamp(Duration::from_secs(1), Duration::from_secs(300));
    loop {
        let verdict = run_check(&check.program, timeout).await;
        match &verdict {
            Some(why) => tracing::warn!(reason = %why, "health check failed"),
            None => tracing::debug!("health check passed"),
        }
        // Told once a controller answers; the next run tells again anyway.
        for _ in 0..50 {
            let client = client_rx.borrow_and_update().clone();
            let Some(mut c) = client else {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            };
            let told = match &verdict {
                Some(why) => {
                    let req = pb::DrainRequest {
                        node_id: node.clone(),
                        reason: why.clone(),
                        health_check: true,
                        requeue: check.requeue,
                    };
                    c.drain(creds.request(req)).await.map(|_| ())
                }
                None => c
                    .health_check_passed(
                        creds.request(pb::HealthCheckPassedRequest { node_id: node.clone() }),
                    )
                    .await
                    .map(|_| ()),
            };
            match told {
                Ok(()) => break,
                Err(s) => {
                    tracing::debug!(status = %s, "health check result not delivered; retrying");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
        tokio::time::sleep(check.every).await;
    }
}

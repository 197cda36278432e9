//! A run's output into its log file, bounded.

use std::sync::{Arc, Mutex};

/// Copies a run's output into its log file, up to `max` bytes in all (shared by stdout and
/// stderr); past that it writes one marker, keeps reading (so the job never blocks on a full
/// pipe) and drops the rest.
pub(super) async fn copy_output(
    mut from: impl tokio::io::AsyncRead + Unpin,
    to: Arc<Mutex<std::fs::File>>,
    written: Arc<std::sync::atomic::AtomicU64>,
    max: u64,
    truncated: impl Fn(),
) {
    use std::io::Write;
    use std::sync::atomic::Ordering;
    use tokio::io::AsyncReadExt;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let mut file = to.lock().unwrap_or_else(|p| p.into_inner());
        let before = written.load(Ordering::Relaxed);
        if before >= max {
            continue;
        }
        let take = (n as u64).min(max - before) as usize;
        let mut result = file.write_all(&buf[..take]);
        written.store(before + take as u64, Ordering::Relaxed);
        if before + take as u64 >= max {
            result = result.and_then(|()| {
                file.write_all(
                    format!("\n[kairos-agent: log truncated at {max} bytes; the job goes on]\n").as_bytes(),
                )
            });
            truncated();
        }
        if let Err(e) = result {
            tracing::warn!(error = %e, "cannot write a run's log");
        }
    }
}

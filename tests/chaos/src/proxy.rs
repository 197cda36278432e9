//! A fault-injecting TCP proxy between two hosts of a chaos cluster. The kernel here has no
//! `netem`, so delay, loss-like stalls and partitions between kairos processes are made by
//! routing each link through one of these.
//!
//! Faults apply per direction and can change while connections are open:
//! - `delay_ms`: every chunk is held this long before it is forwarded;
//! - `blocked`: a partition — new connections are refused (closed at once) and chunks on open
//!   connections are dropped, which, on a TCP stream, stalls and then breaks it; one-way
//!   partitions block only one direction;
//! - `reorder`: chunks are held back at random (seeded) so that later writes of *other*
//!   connections overtake them (a single TCP stream itself never reorders).
//!
//! Randomness comes from a seeded generator, so a fault schedule reproduces from its seed.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The faults of one direction of a link.
#[derive(Debug, Default)]
pub struct Direction {
    pub delay_ms: AtomicU64,
    pub blocked: AtomicBool,
    /// Per mille of chunks held back by up to `delay_ms` more (reordering across connections).
    pub reorder_per_mille: AtomicU64,
}

/// Faults of a link: client → server (`forward`) and server → client (`backward`).
#[derive(Debug, Default)]
pub struct Faults {
    pub forward: Direction,
    pub backward: Direction,
    /// Chunks forwarded, both ways (for the summary).
    pub chunks: AtomicU64,
}

impl Faults {
    /// Partitions the link both ways (`true`) or heals it.
    pub fn partition(&self, on: bool) {
        self.forward.blocked.store(on, Ordering::SeqCst);
        self.backward.blocked.store(on, Ordering::SeqCst);
    }
}

/// The project's one seeded generator: faults are scheduled reproducibly from a seed.
pub type Rng = kairos_scheduler::seeded::SplitMix64;

/// Proxies every connection accepted on `listener` to `target` under `faults`, until the task
/// is dropped. `seed` drives the random choices.
pub async fn run(listener: TcpListener, target: String, faults: Arc<Faults>, seed: u64) {
    let mut rng = Rng::new(seed);
    loop {
        let Ok((client, _)) = listener.accept().await else { return };
        if faults.forward.blocked.load(Ordering::SeqCst) {
            drop(client); // refused: the partition is in place
            continue;
        }
        let Ok(server) = TcpStream::connect(&target).await else { continue };
        // Forward small writes at once (gRPC, Raft heartbeats): no Nagle delay added by the proxy.
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        let (cr, cw) = client.into_split();
        let (sr, sw) = server.into_split();
        let (f1, f2) = (faults.clone(), faults.clone());
        let (s1, s2) = (rng.next_u64(), rng.next_u64());
        tokio::spawn(pump(cr, sw, f1, true, s1));
        tokio::spawn(pump(sr, cw, f2, false, s2));
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    faults: Arc<Faults>,
    forward: bool,
    seed: u64,
) {
    let mut rng = Rng::new(seed);
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let dir = if forward { &faults.forward } else { &faults.backward };
        if dir.blocked.load(Ordering::SeqCst) {
            // Dropping bytes mid-stream breaks the stream: close it, like a partition would.
            break;
        }
        let mut delay = dir.delay_ms.load(Ordering::SeqCst);
        if rng.below(1000) < dir.reorder_per_mille.load(Ordering::SeqCst) {
            delay += rng.below(delay.max(1) + 1);
        }
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
        faults.chunks.fetch_add(1, Ordering::Relaxed);
    }
    let _ = to.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server and a proxy in front of it; returns the proxy's address.
    async fn echo_behind_proxy(faults: Arc<Faults>) -> String {
        let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = echo.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = echo.accept().await else { return };
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        let proxy = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = proxy.local_addr().unwrap().to_string();
        tokio::spawn(run(proxy, target, faults, 7));
        addr
    }

    async fn roundtrip(addr: &str, msg: &[u8]) -> std::io::Result<Vec<u8>> {
        let mut s = TcpStream::connect(addr).await?;
        s.write_all(msg).await?;
        let mut got = vec![0u8; msg.len()];
        tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut got))
            .await
            .map_err(|_| std::io::Error::other("timed out"))??;
        Ok(got)
    }

    #[tokio::test]
    async fn forwards_then_partitions_then_heals() {
        let faults = Arc::new(Faults::default());
        let addr = echo_behind_proxy(faults.clone()).await;
        assert_eq!(roundtrip(&addr, b"hello").await.unwrap(), b"hello");
        faults.partition(true);
        assert!(roundtrip(&addr, b"hello").await.is_err(), "a partitioned link carried data");
        faults.partition(false);
        assert_eq!(roundtrip(&addr, b"again").await.unwrap(), b"again");
        assert!(faults.chunks.load(Ordering::Relaxed) >= 4);
    }

    #[tokio::test]
    async fn a_one_way_partition_lets_requests_in_but_no_answers_out() {
        let faults = Arc::new(Faults::default());
        let addr = echo_behind_proxy(faults.clone()).await;
        faults.backward.blocked.store(true, Ordering::SeqCst);
        assert!(roundtrip(&addr, b"ping").await.is_err());
    }

    #[tokio::test]
    async fn delay_holds_data_at_least_that_long() {
        let faults = Arc::new(Faults::default());
        faults.forward.delay_ms.store(150, Ordering::SeqCst);
        let addr = echo_behind_proxy(faults.clone()).await;
        let t0 = std::time::Instant::now();
        assert_eq!(roundtrip(&addr, b"slow").await.unwrap(), b"slow");
        // A lower bound only: never flaky on a slow machine.
        assert!(t0.elapsed() >= Duration::from_millis(150));
    }

    #[test]
    fn the_generator_reproduces_from_its_seed() {
        let (mut a, mut b, mut c) = (Rng::new(1), Rng::new(1), Rng::new(2));
        let xs: Vec<u64> = (0..5).map(|_| a.next_u64()).collect();
        assert_eq!(xs, (0..5).map(|_| b.next_u64()).collect::<Vec<_>>());
        assert_ne!(xs, (0..5).map(|_| c.next_u64()).collect::<Vec<_>>());
        assert!((0..100).all(|_| a.below(10) < 10));
    }
}

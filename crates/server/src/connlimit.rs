//! Bounds on connections, so one client (or one misbehaving peer) cannot exhaust the daemon's
//! sockets and memory by opening connections: at most `PER_ADDRESS_MAX` open connections from
//! one IP address and `TOTAL_MAX` in all; a connection past either bound is closed at once,
//! before a byte of it is read. Each connection carries at most `STREAMS_MAX` concurrent calls
//! (HTTP/2 `SETTINGS_MAX_CONCURRENT_STREAMS`, set where the server is built).
//!
//! A connection also has to speak: one that sends nothing within the handshake timeout of its
//! accept, or nothing (not even the acknowledgement of the server's HTTP/2 keepalive pings)
//! for the idle timeout, is closed, so silent sockets cannot hold the places of real clients.
//! IPv6 addresses are counted per /64 (what one host is usually given). Connections from the
//! other replicas' addresses count against their address's bound but are never refused by the
//! total one, so clients filling the daemon cannot cut the Raft peers off. An accept that fails
//! (out of file descriptors) waits a moment before the next, instead of spinning a core.
//!
//! The bounds are fitted under the process's descriptor limit (`fit`): at start kairosd raises
//! its soft `RLIMIT_NOFILE` to the hard one (`raise_nofile`), keeps `FD_RESERVE` descriptors
//! for its own files and outgoing connections, and lets connections have the rest, one address
//! at most a share of it; so connections are refused by the bounds — cheaply, and only those
//! past them — before accepts start failing for want of descriptors and every client with them.

use std::collections::HashMap;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use std::future::Future;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// Open connections one IP address may hold (an agent, a replica or a CLI holds one; a NAT in
/// front of many agents holds one per agent).
pub const PER_ADDRESS_MAX: usize = 4096;
/// Open connections in all (past this, the process's file limit is the next wall anyway).
pub const TOTAL_MAX: usize = 65_536;
/// Concurrent calls (HTTP/2 streams) on one connection.
pub const STREAMS_MAX: u32 = 1024;
/// How long a new connection may stay silent.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the server pings an HTTP/2 connection (the client's acknowledgement is traffic).
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(20);
/// How long an established connection may send nothing at all: several keepalive rounds.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(75);
/// The pause after a failed accept.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);
/// Descriptors never given to accepted connections: the WAL's segments, snapshots and backups
/// being written, the listeners, the connections kairosd makes itself (to the leader, to
/// agents' log services, the gateway's own channel, the cloud API), the runtime's own.
pub const FD_RESERVE: u64 = 256;
/// Of the descriptors left for connections, one address may hold at most this fraction.
pub const ADDRESS_SHARE_DIVISOR: u64 = 4;

/// The connection bounds in force.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    pub per_address: usize,
    pub total: usize,
}

/// The bounds asked for (`per_address`, `total`), fitted under `nofile` descriptors with
/// `peers` other replicas (whose connections the total never refuses):
/// - connections may have `nofile - FD_RESERVE` (half of `nofile` when that is less);
/// - one address at most `room / (ADDRESS_SHARE_DIVISOR + peers)` of them, so that one client
///   cannot fill the room and the peers' addresses, each at its own bound past the total, still
///   fit;
/// - the total at most what is left after the peers' bounds.
///
/// Each is at least 1. With `ulimit -n 1024` and one replica: 192 per address, 768 in all.
pub fn fit(nofile: u64, peers: usize, per_address: usize, total: usize) -> Bounds {
    let room = nofile.saturating_sub(FD_RESERVE).max(nofile / 2).max(1);
    let peers = peers as u64;
    let cap = |asked: usize, room: u64| usize::try_from(room).map_or(asked, |r| asked.min(r)).max(1);
    let per_address = cap(per_address, (room / (ADDRESS_SHARE_DIVISOR + peers)).max(1));
    let total_room = room.saturating_sub((per_address as u64).saturating_mul(peers)).max(1);
    let total = cap(total, total_room);
    Bounds { per_address: per_address.min(total), total }
}

/// The descriptor limit before and after raising the soft `RLIMIT_NOFILE` to the hard one
/// (`RLIM_INFINITY` reads as `u64::MAX`). Where raising is refused, the limit stays as it was.
pub fn raise_nofile() -> std::io::Result<(u64, u64)> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let before = lim.rlim_cur;
    if lim.rlim_cur >= lim.rlim_max {
        return Ok((before, before));
    }
    let raised = libc::rlimit { rlim_cur: lim.rlim_max, rlim_max: lim.rlim_max };
    // SAFETY: setrlimit reads the struct it is given.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((before, lim.rlim_max))
}

/// The soft `RLIMIT_NOFILE` now.
pub fn nofile() -> std::io::Result<u64> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(lim.rlim_cur)
}

/// Bounds on how long a connection may be silent.
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    pub handshake: Duration,
    pub idle: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts { handshake: HANDSHAKE_TIMEOUT, idle: IDLE_TIMEOUT }
    }
}

/// The address connections are counted under: an IPv4 address, or an IPv6 address's /64.
fn counted_as(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let mut segments = v6.segments();
                segments[4..].fill(0);
                IpAddr::V6(std::net::Ipv6Addr::from(segments))
            }
        },
        v4 => v4,
    }
}

#[derive(Default)]
struct Counts {
    total: usize,
    by_addr: HashMap<IpAddr, usize>,
}

/// Counts open connections; `admit` hands out a counted connection or refuses.
#[derive(Clone)]
pub struct ConnLimit {
    counts: Arc<Mutex<Counts>>,
    per_address: usize,
    total: usize,
    timeouts: Timeouts,
    /// The other replicas' addresses (as counted).
    peers: std::collections::HashSet<IpAddr>,
}

impl ConnLimit {
    pub fn new(per_address: usize, total: usize) -> ConnLimit {
        ConnLimit {
            counts: Arc::default(),
            per_address,
            total,
            timeouts: Timeouts::default(),
            peers: Default::default(),
        }
    }

    /// Connections from `peers` (the other replicas) are never refused by the total bound.
    pub fn with_peers(mut self, peers: impl IntoIterator<Item = IpAddr>) -> ConnLimit {
        self.peers = peers.into_iter().map(counted_as).collect();
        self
    }

    /// Connections silent past `timeouts` are closed.
    pub fn with_timeouts(mut self, timeouts: Timeouts) -> ConnLimit {
        self.timeouts = timeouts;
        self
    }

    /// A slot for a connection from `addr`, released when the slot is dropped; None past a bound.
    pub fn slot(&self, addr: IpAddr) -> Option<Slot> {
        let addr = counted_as(addr);
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let mine = c.by_addr.get(&addr).copied().unwrap_or(0);
        if mine >= self.per_address || (c.total >= self.total && !self.peers.contains(&addr)) {
            return None;
        }
        c.total += 1;
        *c.by_addr.entry(addr).or_default() += 1;
        Some(Slot { counts: self.counts.clone(), addr })
    }

    /// The connection, counted; None (the socket is closed) past a bound.
    pub fn admit(&self, stream: TcpStream) -> Option<Counted> {
        let addr = stream.peer_addr().ok()?.ip();
        match self.slot(addr) {
            Some(slot) => Some(Counted {
                stream,
                _slot: slot,
                timeouts: self.timeouts,
                spoken: false,
                silence: Box::pin(tokio::time::sleep(self.timeouts.handshake)),
            }),
            None => {
                tracing::warn!(%addr, "connection refused: too many open connections");
                None
            }
        }
    }

    /// Open connections (all, from `addr`).
    #[cfg(test)]
    pub fn open(&self, addr: IpAddr) -> (usize, usize) {
        let c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        (c.total, c.by_addr.get(&addr).copied().unwrap_or(0))
    }
}

/// One counted connection's place.
pub struct Slot {
    counts: Arc<Mutex<Counts>>,
    addr: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        c.total = c.total.saturating_sub(1);
        if let Some(n) = c.by_addr.get_mut(&self.addr) {
            *n -= 1;
            if *n == 0 {
                c.by_addr.remove(&self.addr);
            }
        }
    }
}

/// A TCP connection holding its slot until it closes, closed when it stays silent too long.
pub struct Counted {
    stream: TcpStream,
    _slot: Slot,
    timeouts: Timeouts,
    /// Whether it has sent anything yet (the handshake timeout applies until then).
    spoken: bool,
    /// When its silence ends it.
    silence: Pin<Box<tokio::time::Sleep>>,
}

impl Connected for Counted {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.stream.connect_info()
    }
}

impl AsyncRead for Counted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.stream).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    self.spoken = true;
                    let until = tokio::time::Instant::now() + self.timeouts.idle;
                    self.silence.as_mut().reset(until);
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => match self.silence.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    let what = if self.spoken { "idle" } else { "silent since it was accepted" };
                    tracing::debug!(peer = ?self.stream.peer_addr().ok(), "closing a connection {what}");
                    Poll::Ready(Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("connection {what} past its timeout"),
                    )))
                }
                Poll::Pending => Poll::Pending,
            },
            other => other,
        }
    }
}

impl AsyncWrite for Counted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_past_either_bound_are_refused_and_a_closed_one_frees_its_place() {
        let limit = ConnLimit::new(2, 3);
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let a1 = limit.slot(a).expect("first");
        let _a2 = limit.slot(a).expect("second");
        assert!(limit.slot(a).is_none(), "a third from one address");
        let _b1 = limit.slot(b).expect("another address");
        assert!(limit.slot(b).is_none(), "past the total");
        assert_eq!(limit.open(a), (3, 2));
        drop(a1);
        assert_eq!(limit.open(a), (2, 1));
        assert!(limit.slot(b).is_some(), "a closed connection frees its place");
    }

    #[test]
    fn bounds_fit_under_the_descriptor_limit_with_room_for_the_daemons_own_files_and_peers() {
        // `ulimit -n 1024`, one replica: 768 connections, 192 from one address.
        assert_eq!(fit(1024, 0, PER_ADDRESS_MAX, TOTAL_MAX), Bounds { per_address: 192, total: 768 });
        // Three replicas: two peers' addresses may each hold their bound past the total.
        let b = fit(1024, 2, PER_ADDRESS_MAX, TOTAL_MAX);
        assert_eq!(b, Bounds { per_address: 128, total: 512 });
        assert!(b.total + 2 * b.per_address + FD_RESERVE as usize <= 1024, "{b:?}");
        // A large limit leaves the defaults as they are; an unlimited one too.
        for nofile in [1 << 20, u64::MAX] {
            assert_eq!(
                fit(nofile, 2, PER_ADDRESS_MAX, TOTAL_MAX),
                Bounds { per_address: PER_ADDRESS_MAX, total: TOTAL_MAX }
            );
        }
        // The systemd unit's 65536: the total makes room for the peers.
        let b = fit(65_536, 2, PER_ADDRESS_MAX, TOTAL_MAX);
        assert_eq!(b.per_address, PER_ADDRESS_MAX);
        assert!(b.total + 2 * b.per_address + FD_RESERVE as usize <= 65_536, "{b:?}");
        // Smaller bounds asked for are kept; tiny limits still leave something.
        assert_eq!(fit(1024, 0, 4, 10), Bounds { per_address: 4, total: 10 });
        assert_eq!(fit(100, 0, PER_ADDRESS_MAX, TOTAL_MAX), Bounds { per_address: 12, total: 50 });
        assert_eq!(fit(0, 9, 0, 0), Bounds { per_address: 1, total: 1 });
        // The per-address bound never exceeds the total.
        assert_eq!(fit(1 << 20, 0, 100, 10), Bounds { per_address: 10, total: 10 });
    }

    #[test]
    fn the_soft_descriptor_limit_is_raised_to_the_hard_one() {
        let (before, after) = raise_nofile().unwrap();
        assert!(after >= before);
        assert_eq!(nofile().unwrap(), after);
        // Raising again changes nothing.
        assert_eq!(raise_nofile().unwrap(), (after, after));
    }

    #[test]
    fn clients_filling_the_total_cannot_keep_a_peer_out() {
        let peer: IpAddr = "10.0.0.9".parse().unwrap();
        let limit = ConnLimit::new(2, 3).with_peers([peer]);
        let clients: Vec<Slot> =
            (1..=3).map(|i| limit.slot(format!("10.0.1.{i}").parse().unwrap()).unwrap()).collect();
        assert!(limit.slot("10.0.1.9".parse().unwrap()).is_none(), "past the total");
        let _p1 = limit.slot(peer).expect("a peer past the total");
        let _p2 = limit.slot(peer).expect("a second");
        assert!(limit.slot(peer).is_none(), "a peer's address keeps its own bound");
        drop(clients);
    }

    #[test]
    fn ipv6_addresses_are_counted_per_64_and_mapped_ipv4_as_ipv4() {
        let limit = ConnLimit::new(1, 10);
        let _a = limit.slot("2001:db8:1:2::1".parse().unwrap()).expect("first of the /64");
        assert!(limit.slot("2001:db8:1:2:ffff::9".parse().unwrap()).is_none(), "same /64");
        assert!(limit.slot("2001:db8:1:3::1".parse().unwrap()).is_some(), "another /64");
        let _v4 = limit.slot("10.0.0.1".parse().unwrap()).expect("v4");
        assert!(limit.slot("::ffff:10.0.0.1".parse().unwrap()).is_none(), "mapped v4 is the same host");
    }

    #[tokio::test]
    async fn a_silent_connection_is_closed_at_its_handshake_timeout_and_a_talking_one_at_its_idle_timeout() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let timeouts = Timeouts { handshake: Duration::from_millis(200), idle: Duration::from_millis(600) };
        let limit = ConnLimit::new(10, 10).with_timeouts(timeouts);
        // Silent: closed after the handshake timeout, and its place is free again.
        let _silent = TcpStream::connect(addr).await.unwrap();
        let mut conn = limit.admit(listener.accept().await.unwrap().0).unwrap();
        let started = std::time::Instant::now();
        let mut buf = [0u8; 16];
        let e = tokio::time::timeout(Duration::from_secs(5), conn.read(&mut buf)).await.unwrap().unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
        assert!(started.elapsed() >= Duration::from_millis(200), "{:?}", started.elapsed());
        drop(conn);
        assert_eq!(limit.open("127.0.0.1".parse().unwrap()), (0, 0));
        // Talking: each byte moves the deadline to the idle timeout.
        let mut talker = TcpStream::connect(addr).await.unwrap();
        let mut conn = limit.admit(listener.accept().await.unwrap().0).unwrap();
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_millis(150)).await;
            talker.write_all(b"x").await.unwrap();
            assert_eq!(conn.read(&mut buf).await.unwrap(), 1);
        }
        let quiet = std::time::Instant::now();
        let e = tokio::time::timeout(Duration::from_secs(5), conn.read(&mut buf)).await.unwrap().unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
        assert!(quiet.elapsed() >= Duration::from_millis(600), "{:?}", quiet.elapsed());
    }

    #[tokio::test]
    async fn a_refused_connection_is_closed_before_anything_is_read() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let limit = ConnLimit::new(1, 10);
        let _c1 = TcpStream::connect(addr).await.unwrap();
        let first = limit.admit(listener.accept().await.unwrap().0);
        assert!(first.is_some());
        let mut c2 = TcpStream::connect(addr).await.unwrap();
        assert!(limit.admit(listener.accept().await.unwrap().0).is_none());
        let mut buf = [0u8; 1];
        let n = tokio::io::AsyncReadExt::read(&mut c2, &mut buf).await.unwrap_or(0);
        assert_eq!(n, 0, "the refused connection stays open");
    }
}

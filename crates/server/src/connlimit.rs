//! Bounds on connections, so one client (or one misbehaving peer) cannot exhaust the daemon's
//! sockets and memory by opening connections: at most `PER_ADDRESS_MAX` open connections from
//! one IP address and `TOTAL_MAX` in all; a connection past either bound is closed at once,
//! before a byte of it is read. Each connection carries at most `STREAMS_MAX` concurrent calls
//! (HTTP/2 `SETTINGS_MAX_CONCURRENT_STREAMS`, set where the server is built).

use std::collections::HashMap;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

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
}

impl ConnLimit {
    pub fn new(per_address: usize, total: usize) -> ConnLimit {
        ConnLimit { counts: Arc::default(), per_address, total }
    }

    /// A slot for a connection from `addr`, released when the slot is dropped; None past a bound.
    pub fn slot(&self, addr: IpAddr) -> Option<Slot> {
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let mine = c.by_addr.get(&addr).copied().unwrap_or(0);
        if mine >= self.per_address || c.total >= self.total {
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
            Some(slot) => Some(Counted { stream, _slot: slot }),
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

/// A TCP connection holding its slot until it closes.
pub struct Counted {
    stream: TcpStream,
    _slot: Slot,
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
        Pin::new(&mut self.stream).poll_read(cx, buf)
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

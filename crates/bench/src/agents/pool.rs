//! Connections the harness's agents share: a few per controller (HTTP/2 carries each agent's
//! calls and assignment stream as streams of one connection), dialled as the agent dials its
//! own (`kairos_agent::session::Dial`): the leader's hint first, then the controllers in turn.

use std::sync::Arc;
use std::time::Duration;

use kairos_agent::session::Dial;
use tonic::transport::{Channel, Endpoint};

/// Lazily connected channels: `per_controller` to each controller address.
pub struct Channels {
    addrs: Vec<String>,
    channels: Vec<Vec<Channel>>,
}

impl Channels {
    pub fn new(addrs: &[String], per_controller: usize) -> anyhow::Result<Arc<Channels>> {
        let mut channels = Vec::new();
        for addr in addrs {
            let mut of_addr = Vec::new();
            for _ in 0..per_controller.max(1) {
                let endpoint = Endpoint::from_shared(format!("http://{addr}"))?
                    .connect_timeout(Duration::from_secs(2))
                    .timeout(Duration::from_secs(5))
                    .tcp_keepalive(Some(Duration::from_secs(10)));
                of_addr.push(endpoint.connect_lazy());
            }
            channels.push(of_addr);
        }
        Ok(Arc::new(Channels { addrs: addrs.to_vec(), channels }))
    }

    /// The shared connections this many agents use per controller.
    pub fn per_controller(agents: usize, agents_per_connection: usize) -> usize {
        agents.div_ceil(agents_per_connection.max(1)).max(1)
    }
}

/// One agent's way to the controllers: its slot among the shared connections.
pub struct Pooled {
    channels: Arc<Channels>,
    slot: usize,
    next: usize,
    hint: Option<String>,
}

impl Pooled {
    pub fn new(channels: Arc<Channels>, agent: usize) -> Pooled {
        let n = channels.addrs.len().max(1);
        Pooled { slot: agent, next: agent % n, hint: None, channels }
    }

    fn channel(&self, addr: &str) -> Option<Channel> {
        let i = self.channels.addrs.iter().position(|a| a == addr)?;
        let of_addr = &self.channels.channels[i];
        Some(of_addr[self.slot % of_addr.len()].clone())
    }
}

impl Dial for Pooled {
    async fn dial(&mut self) -> Option<(String, Channel)> {
        let n = self.channels.addrs.len();
        let addr = match self.hint.take() {
            Some(hint) => hint,
            None if n > 0 => {
                let addr = self.channels.addrs[self.next % n].clone();
                self.next = self.next.wrapping_add(1);
                addr
            }
            None => return None,
        };
        let channel = self.channel(&addr)?;
        Some((addr, channel))
    }

    fn follow(&mut self, leader: String) {
        self.hint = Some(leader);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn agents_share_connections_and_follow_a_hint_once() {
        let addrs = vec!["127.0.0.1:1".to_string(), "127.0.0.1:2".to_string()];
        assert_eq!(Channels::per_controller(10_000, 100), 100);
        assert_eq!(Channels::per_controller(1, 100), 1);
        let ch = Channels::new(&addrs, 2).unwrap();
        let mut p = Pooled::new(ch, 3);
        let first = p.dial().await.unwrap().0;
        let second = p.dial().await.unwrap().0;
        assert_ne!(first, second, "the controllers in turn");
        p.follow("127.0.0.1:2".into());
        assert_eq!(p.dial().await.unwrap().0, "127.0.0.1:2");
        p.follow("10.0.0.9:1".into());
        assert!(p.dial().await.is_none(), "a hint to an unknown controller: nothing to dial");
    }
}

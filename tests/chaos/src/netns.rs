//! Separate "hosts" for chaos runs: each host is a network namespace with its own address,
//! connected through a bridge that lives in a namespace of its own (the machine's own network
//! is never touched). Needs root and iproute2 (scripts/test.sh installs it).
//!
//! ```text
//!   ns <p>-h0 (eth0 10.213.0.1) ─veth─┐
//!   ns <p>-h1 (eth0 10.213.0.2) ─veth─┼─ br0 in ns <p>-sw
//!   ns <p>-h2 (eth0 10.213.0.3) ─veth─┘
//! ```
//!
//! Faults: `isolate(i)` takes host i's link down (a two-way partition of that host);
//! `drop_from(i, j)` drops what host i receives from host j (one-way). Everything is removed
//! when the `Net` is dropped, also when a test fails.

use std::process::{Command, Output};

use thiserror::Error;

#[derive(Debug, Error)]
pub enum NetError {
    #[error("`{cmd}` failed: {stderr}")]
    Command { cmd: String, stderr: String },
    #[error("running `{cmd}`: {source}")]
    Spawn { cmd: String, source: std::io::Error },
}

fn ip(args: &[&str]) -> Result<Output, NetError> {
    run("ip", args)
}

fn run(program: &str, args: &[&str]) -> Result<Output, NetError> {
    let cmd = format!("{program} {}", args.join(" "));
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|source| NetError::Spawn { cmd: cmd.clone(), source })?;
    if !out.status.success() {
        return Err(NetError::Command {
            cmd,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(out)
}

/// A set of hosts on one bridge.
pub struct Net {
    prefix: String,
    hosts: usize,
    created: Vec<String>,
}

impl Net {
    /// Creates `hosts` namespaces named `<prefix>-h<i>` on a bridge. `prefix`: a few letters or
    /// digits, unique per concurrent test (interface names are limited to 15 characters).
    pub fn create(prefix: &str, hosts: usize) -> Result<Net, NetError> {
        let mut net = Net { prefix: prefix.to_string(), hosts, created: Vec::new() };
        let sw = net.switch();
        ip(&["netns", "add", &sw])?;
        net.created.push(sw.clone());
        ip(&["-n", &sw, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &sw, "link", "set", "br0", "up"])?;
        for i in 0..hosts {
            let ns = net.host(i);
            ip(&["netns", "add", &ns])?;
            net.created.push(ns.clone());
            let (inner, outer) = (format!("{}h{i}a", net.prefix), format!("{}h{i}b", net.prefix));
            ip(&["link", "add", &inner, "netns", &ns, "type", "veth", "peer", "name", &outer, "netns", &sw])?;
            ip(&["-n", &ns, "link", "set", &inner, "name", "eth0"])?;
            ip(&["-n", &ns, "addr", "add", &format!("{}/24", net.addr(i)), "dev", "eth0"])?;
            ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
            ip(&["-n", &sw, "link", "set", &outer, "master", "br0"])?;
            ip(&["-n", &sw, "link", "set", &outer, "up"])?;
        }
        Ok(net)
    }

    fn switch(&self) -> String {
        format!("{}-sw", self.prefix)
    }

    /// The namespace of host `i`.
    pub fn host(&self, i: usize) -> String {
        format!("{}-h{i}", self.prefix)
    }

    /// Host `i`'s address.
    pub fn addr(&self, i: usize) -> String {
        format!("10.213.0.{}", i + 1)
    }

    pub fn hosts(&self) -> usize {
        self.hosts
    }

    /// A command that runs `program` inside host `i`.
    pub fn command(&self, i: usize, program: &str) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.host(i), program]);
        cmd
    }

    /// Takes host `i`'s link down (`true`) or up again: a two-way partition of that host.
    pub fn isolate(&self, i: usize, on: bool) -> Result<(), NetError> {
        let port = format!("{}h{i}b", self.prefix);
        ip(&["-n", &self.switch(), "link", "set", &port, if on { "down" } else { "up" }])?;
        Ok(())
    }

    /// Host `i` drops everything it receives from host `j` (`true`), or no longer does: a
    /// one-way partition.
    pub fn drop_from(&self, i: usize, j: usize, on: bool) -> Result<(), NetError> {
        let src = self.addr(j);
        let action = if on { "-A" } else { "-D" };
        run("ip", &["netns", "exec", &self.host(i), "iptables", action, "INPUT", "-s", &src, "-j", "DROP"])?;
        Ok(())
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        // Processes still inside keep a namespace's network alive: the tests stop them first.
        for ns in self.created.iter().rev() {
            let _ = ip(&["netns", "del", ns]);
        }
    }
}

/// Runs `f` on a thread inside network namespace `ns` (this process's other threads stay where
/// they are) and returns its result.
pub fn in_namespace<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::thread::JoinHandle<Result<T, String>> {
    let path = format!("/var/run/netns/{ns}");
    std::thread::spawn(move || {
        let file = std::fs::File::open(&path).map_err(|e| format!("opening {path}: {e}"))?;
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(|e| format!("entering {path}: {e}"))?;
        Ok(f())
    })
}

/// The namespaces whose names start with `prefix` (to check that a run cleaned up).
pub fn namespaces_with(prefix: &str) -> Vec<String> {
    let out =
        ip(&["netns", "list"]).map(|o| String::from_utf8_lossy(&o.stdout).to_string()).unwrap_or_default();
    out.lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(prefix))
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use std::process::Stdio;
    use std::time::Duration;

    use super::*;

    /// Kills its process when dropped (also when the test fails), before the namespaces go.
    struct Guard(std::process::Child);

    impl Drop for Guard {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// A TCP echo server inside host `i` on port 7000 (python3 is on the machine).
    fn echo_server(net: &Net, i: usize) -> Guard {
        let code = "import socket\ns=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
                    s.bind(('0.0.0.0', 7000)); s.listen()\nwhile True:\n    c,_=s.accept(); c.sendall(c.recv(64)); c.close()\n";
        let child = net
            .command(i, "python3")
            .args(["-c", code])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        Guard(child)
    }

    /// Whether host `from` reaches host `to`'s echo server (bounded by a 2 s timeout).
    fn reaches(net: &Net, from: usize, to: usize) -> bool {
        let code = format!(
            "import socket,sys\ntry:\n    c=socket.create_connection(('{}', 7000), timeout=2); c.sendall(b'hi')\n    \
             sys.exit(0 if c.recv(2)==b'hi' else 1)\nexcept Exception:\n    sys.exit(1)\n",
            net.addr(to)
        );
        net.command(from, "python3").args(["-c", &code]).status().is_ok_and(|s| s.success())
    }

    #[test]
    fn hosts_reach_each_other_until_partitioned_and_everything_is_removed() {
        assert_eq!(nix_uid(), 0, "the chaos harness needs root (CI runs as root)");
        let prefix = format!("kc{}", std::process::id() % 100_000);
        {
            let net = Net::create(&prefix, 3).expect("create the hosts");
            let server = echo_server(&net, 1);
            // The server needs a moment to bind: poll, bounded.
            let up = (0..50).any(|_| {
                std::thread::sleep(Duration::from_millis(100));
                reaches(&net, 0, 1)
            });
            assert!(up, "host 0 never reached host 1");
            net.isolate(1, true).unwrap();
            assert!(!reaches(&net, 0, 1), "an isolated host was reached");
            net.isolate(1, false).unwrap();
            assert!((0..50).any(|_| reaches(&net, 0, 1)), "healing did not restore the link");
            net.drop_from(1, 2, true).unwrap();
            assert!(!reaches(&net, 2, 1), "a one-way partition let data through");
            assert!(reaches(&net, 0, 1), "the one-way partition cut a third host off");
            net.drop_from(1, 2, false).unwrap();
            assert!(reaches(&net, 2, 1));
            drop(server);
            assert_eq!(namespaces_with(&prefix).len(), 4);
        }
        assert!(namespaces_with(&prefix).is_empty(), "namespaces left behind");
    }

    fn nix_uid() -> u32 {
        // /proc/self/status "Uid: real effective ..."
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| s.lines().find(|l| l.starts_with("Uid:"))?.split_whitespace().nth(2)?.parse().ok())
            .unwrap_or(u32::MAX)
    }
}

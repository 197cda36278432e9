//! A FORWARD session's far end: a TCP connection to a port the job listens on.
//!
//! The tunnel must not become a way into someone else's ports (another user's job, the agent's
//! own endpoints): before any connection is attempted, the port must have a socket in LISTEN
//! (`/proc/net/tcp`, `/proc/net/tcp6`) whose inode is an open descriptor of a process of the
//! run (`/proc/<pid>/fd/*` → `socket:[INODE]`). The run's processes are those of its cgroup
//! (v2 directory and its children, v1 limit directories), or, on a node without cgroups, those
//! whose process group or session is the run's leader's. Runs share the node's network
//! namespace (containers unshare only users, mounts and pids: `container_child`), so the
//! agent's own `/proc/net` is the run's and the connection is made from the agent. Every
//! `/proc` read is bounded and made off the runtime under a deadline.

use std::collections::HashSet;
use std::io::Read;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::net::TcpStream;
use tonic::Status;

/// How long the `/proc` scan may take.
const SCAN_DEADLINE: Duration = Duration::from_secs(3);
/// How long the connection to the job's port may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The most of `/proc/net/tcp{,6}` read (about 27,000 sockets each); a listener past it is
/// not found, and the port refused.
const NET_TABLE_BYTES_MAX: u64 = 4 << 20;
/// The most of a `cgroup.procs` or `/proc/<pid>/stat` read.
const SMALL_FILE_BYTES_MAX: u64 = 1 << 20;
/// The most processes of a run looked at, and descriptors of one process.
const PIDS_MAX: usize = 16_384;
const FDS_PER_PID_MAX: usize = 65_536;
/// The most `/proc` entries (stats, descriptor links) one scan reads.
const SCAN_READS_MAX: usize = 200_000;
/// How deep below the run's v2 cgroup its nested cgroups are looked for.
const CGROUP_DEPTH_MAX: usize = 4;
/// The TCP state LISTEN in `/proc/net/tcp`.
const TCP_LISTEN: &str = "0A";

/// The run a FORWARD session tunnels into.
#[derive(Clone, Debug, Default)]
pub struct ForwardTarget {
    /// The run's cgroup v2 directory, if it has one.
    pub cgroup: Option<PathBuf>,
    /// The run's v1 limit directories (each with a `cgroup.procs`), if any.
    pub limit_dirs: Vec<PathBuf>,
    /// The run's leader (its process group and session id on a node without cgroups).
    pub main_pid: i32,
}

/// What a scan may still spend: it stops once its deadline passes or its reads run out (the
/// thread it runs on is not cancelled with the wait for it).
struct Budget {
    deadline: std::time::Instant,
    reads: std::cell::Cell<usize>,
}

impl Budget {
    fn new(within: Duration) -> Budget {
        Budget { deadline: std::time::Instant::now() + within, reads: std::cell::Cell::new(SCAN_READS_MAX) }
    }

    /// Takes one read; false once the budget is spent.
    fn take(&self) -> bool {
        let left = self.reads.get();
        if left == 0 || std::time::Instant::now() >= self.deadline {
            return false;
        }
        self.reads.set(left - 1);
        true
    }
}

/// One listening socket of the node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Listener {
    addr: IpAddr,
    port: u16,
    inode: u64,
}

/// A connection to `port`, on the address the run listens on, once a process of the run is
/// found holding its listening socket: `FAILED_PRECONDITION` (no connection attempted) when
/// none is, `INVALID_ARGUMENT` for port 0, `UNAVAILABLE` when the connection fails.
pub async fn connect(target: &ForwardTarget, port: u16) -> Result<TcpStream, Status> {
    if port == 0 {
        return Err(Status::invalid_argument("port 0 cannot be forwarded (ports are 1-65535)"));
    }
    let scan_target = target.clone();
    let scan =
        tokio::task::spawn_blocking(move || owned_listener(&scan_target, port, &Budget::new(SCAN_DEADLINE)));
    let found = match tokio::time::timeout(SCAN_DEADLINE, scan).await {
        Err(_) => return Err(Status::unavailable("looking up the job's listening sockets took too long")),
        Ok(Err(e)) => return Err(Status::internal(format!("looking up the job's listening sockets: {e}"))),
        Ok(Ok(found)) => found,
    };
    let Some(addr) = found else {
        return Err(Status::failed_precondition(format!(
            "the job does not listen on port {port} (only a port a process of the job listens on is forwarded)"
        )));
    };
    let addr = SocketAddr::new(dial_address(addr), port);
    match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
        Err(_) => {
            Err(Status::unavailable(format!("connecting to port {port} took over {CONNECT_TIMEOUT:?}")))
        }
        Ok(Err(e)) => Err(Status::unavailable(format!("connecting to port {port}: {e}"))),
        Ok(Ok(stream)) => {
            // Interactive traffic: no coalescing delay (a failure only costs latency).
            let _ = stream.set_nodelay(true);
            Ok(stream)
        }
    }
}

/// The address of a listener on `port` that a process of `target` holds, if any (blocking).
fn owned_listener(target: &ForwardTarget, port: u16, budget: &Budget) -> Option<IpAddr> {
    let listeners: Vec<Listener> = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|p| read_bounded(Path::new(p), NET_TABLE_BYTES_MAX))
        .flat_map(|table| parse_listeners(&table))
        .filter(|l| l.port == port)
        .collect();
    if listeners.is_empty() {
        return None;
    }
    let wanted: HashSet<u64> = listeners.iter().map(|l| l.inode).collect();
    let held = run_pids(target, budget).into_iter().find_map(|pid| held_socket(pid, &wanted, budget))?;
    listeners.into_iter().find(|l| l.inode == held).map(|l| l.addr)
}

/// Where to connect for a listener on `addr`: the wildcard is reached on loopback, an
/// IPv4-mapped address as IPv4.
fn dial_address(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V4(a) if a.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(a) if a.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        IpAddr::V6(a) => match a.to_ipv4_mapped() {
            Some(v4) => dial_address(IpAddr::V4(v4)),
            None => IpAddr::V6(a),
        },
        a => a,
    }
}

/// At most `max` bytes of `path` as text (None when it cannot be read).
fn read_bounded(path: &Path, max: u64) -> Option<String> {
    let mut text = String::new();
    std::fs::File::open(path).ok()?.take(max).read_to_string(&mut text).ok()?;
    Some(text)
}

/// The LISTEN sockets of a `/proc/net/tcp` or `/proc/net/tcp6` table (malformed lines skipped).
fn parse_listeners(table: &str) -> Vec<Listener> {
    table.lines().skip(1).filter_map(parse_line).collect()
}

/// `sl local rem st tx:rx tr:when retr uid timeout inode …` → a listener, if its state is LISTEN.
fn parse_line(line: &str) -> Option<Listener> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    if fields.get(3) != Some(&TCP_LISTEN) {
        return None;
    }
    let (addr, port) = fields.get(1)?.split_once(':')?;
    let inode: u64 = fields.get(9)?.parse().ok()?;
    if inode == 0 {
        return None;
    }
    Some(Listener { addr: parse_addr(addr)?, port: u16::from_str_radix(port, 16).ok()?, inode })
}

/// A kernel address: 8 hex digits (IPv4) or 32 (IPv6), each 32-bit word in the host's order.
fn parse_addr(hex: &str) -> Option<IpAddr> {
    let word = |i: usize| -> Option<[u8; 4]> {
        let w = u32::from_str_radix(hex.get(i * 8..i * 8 + 8)?, 16).ok()?;
        Some(w.to_ne_bytes())
    };
    match hex.len() {
        8 => Some(IpAddr::V4(Ipv4Addr::from(word(0)?))),
        32 => {
            let mut octets = [0u8; 16];
            for i in 0..4 {
                octets[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            Some(IpAddr::V6(Ipv6Addr::from(octets)))
        }
        _ => None,
    }
}

/// The run's processes: its cgroups' members, or without cgroups its process group and
/// session (the leader included), at most `PIDS_MAX`.
fn run_pids(target: &ForwardTarget, budget: &Budget) -> Vec<i32> {
    let mut dirs: Vec<PathBuf> = target.limit_dirs.clone();
    if let Some(v2) = &target.cgroup {
        collect_cgroups(v2, CGROUP_DEPTH_MAX, &mut dirs, budget);
    }
    let mut pids: Vec<i32> = match dirs.is_empty() {
        true => group_pids(target.main_pid, budget),
        false => dirs.iter().flat_map(|d| cgroup_pids(d)).collect(),
    };
    pids.sort_unstable();
    pids.dedup();
    pids.truncate(PIDS_MAX);
    pids
}

/// `dir` and its child cgroups down to `depth` levels.
fn collect_cgroups(dir: &Path, depth: usize, into: &mut Vec<PathBuf>, budget: &Budget) {
    into.push(dir.to_path_buf());
    if depth == 0 || into.len() >= PIDS_MAX {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten().take(PIDS_MAX) {
        if !budget.take() {
            return;
        }
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            collect_cgroups(&entry.path(), depth - 1, into, budget);
        }
    }
}

/// The pids in `dir/cgroup.procs`.
fn cgroup_pids(dir: &Path) -> Vec<i32> {
    read_bounded(&dir.join("cgroup.procs"), SMALL_FILE_BYTES_MAX)
        .map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

/// The processes whose process group or session is `leader` (and the leader itself).
fn group_pids(leader: i32, budget: &Budget) -> Vec<i32> {
    if leader <= 0 {
        return Vec::new();
    }
    let Ok(entries) = std::fs::read_dir("/proc") else { return vec![leader] };
    let mut pids = vec![leader];
    for entry in entries.flatten() {
        if !budget.take() {
            break;
        }
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        let stat = read_bounded(&entry.path().join("stat"), SMALL_FILE_BYTES_MAX);
        if stat.as_deref().and_then(group_and_session).is_some_and(|(g, s)| g == leader || s == leader) {
            pids.push(pid);
            if pids.len() >= PIDS_MAX {
                break;
            }
        }
    }
    pids
}

/// The process group and session of a `/proc/<pid>/stat` line (the fields after the command's
/// closing parenthesis: state, ppid, pgrp, session).
fn group_and_session(stat: &str) -> Option<(i32, i32)> {
    let after = &stat[stat.rfind(')')? + 1..];
    let mut fields = after.split_whitespace().skip(2);
    Some((fields.next()?.parse().ok()?, fields.next()?.parse().ok()?))
}

/// The first inode of `wanted` among `pid`'s socket descriptors.
fn held_socket(pid: i32, wanted: &HashSet<u64>, budget: &Budget) -> Option<u64> {
    if !budget.take() {
        return None;
    }
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
    fds.flatten().take(FDS_PER_PID_MAX).take_while(|_| budget.take()).find_map(|fd| {
        let link = std::fs::read_link(fd.path()).ok()?;
        let inode = socket_inode(link.to_str()?)?;
        wanted.contains(&inode).then_some(inode)
    })
}

/// `socket:[12345]` → 12345.
fn socket_inode(link: &str) -> Option<u64> {
    link.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A target whose v2 cgroup lists exactly `pids`.
    fn cgroup_of(pids: &[u32]) -> (tempfile::TempDir, ForwardTarget) {
        let dir = tempfile::tempdir().unwrap();
        let procs: String = pids.iter().map(|p| format!("{p}\n")).collect();
        std::fs::write(dir.path().join("cgroup.procs"), procs).unwrap();
        let target = ForwardTarget { cgroup: Some(dir.path().to_path_buf()), ..Default::default() };
        (dir, target)
    }

    #[test]
    fn the_kernel_tables_parse_to_their_listeners() {
        let v4 = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   \
            0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 4242 1 0 100 0 0 10 0\n   \
            1: 0100007F:1F91 0100007F:D431 01 00000000:00000000 00:00000000 00000000  1000        0 4343 1 0 100 0 0 10 0\n   \
            2: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 0 1 0 100 0 0 10 0\n";
        let got = parse_listeners(v4);
        // The established socket and the one without an inode are not listeners.
        assert_eq!(got, [Listener { addr: IpAddr::V4(Ipv4Addr::LOCALHOST), port: 8080, inode: 4242 }]);
        let v6 = "  sl  local_address                         remote_address                        st\n   \
            0: 00000000000000000000000001000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 77 1\n   \
            1: 0000000000000000FFFF00000100007F:0050 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 78 1\n";
        let got = parse_listeners(v6);
        assert_eq!(got[0], Listener { addr: IpAddr::V6(Ipv6Addr::LOCALHOST), port: 8080, inode: 77 });
        assert_eq!(dial_address(got[1].addr), IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert_eq!(got[1].port, 80);
        assert_eq!(dial_address(IpAddr::V4(Ipv4Addr::UNSPECIFIED)), IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert_eq!(dial_address(IpAddr::V6(Ipv6Addr::UNSPECIFIED)), IpAddr::V6(Ipv6Addr::LOCALHOST));
        assert_eq!(socket_inode("socket:[991]"), Some(991));
        assert_eq!(socket_inode("pipe:[991]"), None);
        assert_eq!(group_and_session("12 (a) b) S 1 34 56 0"), Some((34, 56)));
    }

    #[test]
    fn a_scan_stops_once_its_deadline_or_its_reads_are_spent() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (_dir, ours) = cgroup_of(&[std::process::id()]);
        assert!(owned_listener(&ours, port, &Budget::new(Duration::from_secs(3))).is_some());
        assert_eq!(owned_listener(&ours, port, &Budget::new(Duration::ZERO)), None, "past its deadline");
        let spent = Budget::new(Duration::from_secs(3));
        spent.reads.set(0);
        assert_eq!(owned_listener(&ours, port, &spent), None, "out of reads");
        let pids = group_pids(std::process::id() as i32, &Budget::new(Duration::ZERO));
        assert_eq!(pids, vec![std::process::id() as i32], "only the leader, nothing of /proc read");
    }

    #[tokio::test]
    async fn a_port_the_run_listens_on_is_connected_and_no_other() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let echo = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 4];
            conn.read_exact(&mut buf).await.unwrap();
            conn.write_all(&buf).await.unwrap();
        });
        // This process holds the listener: as the run's, the port is reached.
        let (_dir, ours) = cgroup_of(&[std::process::id()]);
        let mut conn = connect(&ours, port).await.unwrap();
        conn.write_all(b"ping").await.unwrap();
        let mut back = [0u8; 4];
        conn.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"ping");
        echo.await.unwrap();

        // Another run (a process that holds no such socket) is refused before any connection.
        let other = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
        other.set_nonblocking(true).unwrap();
        let other_port = other.local_addr().unwrap().port();
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let (_dir2, theirs) = cgroup_of(&[child.id()]);
        let refused = connect(&theirs, other_port).await.unwrap_err();
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(refused.code(), tonic::Code::FailedPrecondition, "{refused:?}");
        assert!(refused.message().contains(&format!("port {other_port}")), "{refused:?}");
        let accepted = other.accept().map(|_| ()).map_err(|e| e.kind());
        assert_eq!(accepted, Err(std::io::ErrorKind::WouldBlock), "a refused port was connected to");

        // A port nobody listens on, and port 0, are refused even for this process.
        let gone = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let gone_port = gone.local_addr().unwrap().port();
        drop(gone);
        assert_eq!(connect(&ours, gone_port).await.unwrap_err().code(), tonic::Code::FailedPrecondition);
        assert_eq!(connect(&ours, 0).await.unwrap_err().code(), tonic::Code::InvalidArgument);
    }

    #[tokio::test]
    async fn without_cgroups_the_runs_process_group_is_the_run() {
        let listener = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let ours = ForwardTarget { main_pid: nix::unistd::getpgrp().as_raw(), ..Default::default() };
        assert!(connect(&ours, port).await.is_ok());
        // A leader of another group (a child in a group of its own) holds nothing here.
        let mut child = std::process::Command::new("sleep");
        child.arg("30");
        std::os::unix::process::CommandExt::process_group(&mut child, 0);
        let mut child = child.spawn().unwrap_or_else(|e| panic!("sleep: {e}"));
        let theirs = ForwardTarget { main_pid: child.id() as i32, ..Default::default() };
        let refused = connect(&theirs, port).await.unwrap_err();
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(refused.code(), tonic::Code::FailedPrecondition, "{refused:?}");
    }
}

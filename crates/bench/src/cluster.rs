//! The cluster the cluster benches run against: fresh `kairosd` processes on loopback (taken
//! from beside this binary), each replica killed and restarted at will, and connections that
//! carry the admin token.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use kairos_proto::v1 as pb;
use kairos_proto::v1::admin_service_client::AdminServiceClient;
use tonic::transport::{Channel, Endpoint};

pub(crate) fn sibling(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("locating kairos-bench")?;
    let path = exe.parent().map(|d| d.join(name)).context("locating the binaries' directory")?;
    if !path.exists() {
        bail!("{} not found: run `cargo build --release --bins` first", path.display());
    }
    Ok(path)
}

pub(crate) fn free_addr() -> anyhow::Result<String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("binding an ephemeral port")?;
    Ok(l.local_addr()?.to_string())
}

/// A fresh cluster of kairosd processes; stopped on drop.
pub(crate) struct Cluster {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) addrs: Vec<String>,
    children: Vec<Option<Child>>,
    kairosd: PathBuf,
    /// Flags every replica is started with besides the cluster's own.
    extra: Vec<String>,
}

impl Cluster {
    pub(crate) fn start(replicas: u64) -> anyhow::Result<Cluster> {
        Cluster::start_with(replicas, Vec::new())
    }

    /// A cluster whose replicas are also given `extra` flags.
    pub(crate) fn start_with(replicas: u64, extra: Vec<String>) -> anyhow::Result<Cluster> {
        let dir = tempfile::Builder::new().prefix("kairos-bench-").tempdir()?;
        let addrs = (0..replicas).map(|_| free_addr()).collect::<anyhow::Result<Vec<_>>>()?;
        for (file, content) in [
            ("cluster.secret", "bench-cluster-secret-0123456789abcdef0123456789"),
            ("admin.token", ADMIN_TOKEN),
            ("join.token", JOIN_TOKEN),
        ] {
            std::fs::write(dir.path().join(file), content)?;
        }
        let mut c = Cluster { dir, addrs, children: Vec::new(), kairosd: sibling("kairosd")?, extra };
        for i in 0..replicas as usize {
            let child = c.spawn(i)?;
            c.children.push(Some(child));
        }
        Ok(c)
    }

    fn spawn(&self, i: usize) -> anyhow::Result<Child> {
        let peers: Vec<String> =
            self.addrs.iter().enumerate().map(|(j, a)| format!("{}={a}", j + 1)).collect();
        let log = std::fs::File::create(self.dir.path().join(format!("kairosd-{}.log", i + 1)))?;
        let mut cmd = Command::new(&self.kairosd);
        cmd.args(["--id", &(i + 1).to_string(), "--addr", &self.addrs[i]])
            .arg("--data-dir")
            .arg(self.dir.path().join(format!("controller-{}", i + 1)))
            .arg("--cluster-secret-file")
            .arg(self.dir.path().join("cluster.secret"))
            .arg("--admin-token-file")
            .arg(self.dir.path().join("admin.token"))
            .arg("--join-token-file")
            .arg(self.dir.path().join("join.token"))
            // The submit benchmark leaves every job pending: its own state bounds, not the
            // defaults, keep it from refusing submits mid-run.
            .args(["--max-jobs-per-user", "4000000000", "--max-jobs", "4000000000"])
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        if self.addrs.len() > 1 {
            cmd.args(["--peers", &peers.join(",")]);
        }
        cmd.spawn().context("starting kairosd")
    }

    /// The replicas' process ids, in order (0 for one stopped).
    pub(crate) fn pids(&self) -> Vec<u32> {
        self.children.iter().map(|c| c.as_ref().map_or(0, |c| c.id())).collect()
    }

    pub(crate) fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.children[i].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub(crate) fn restart(&mut self, i: usize) -> anyhow::Result<()> {
        let child = self.spawn(i)?;
        self.children[i] = Some(child);
        Ok(())
    }

    /// The leader's term (0 when no leader answers).
    pub(crate) async fn term(&self) -> u64 {
        let Ok(i) = self.leader(Duration::from_secs(5)).await else { return 0 };
        let Ok(ch) = connect(&self.addrs[i]).await else { return 0 };
        match AdminServiceClient::new(ch).cluster_status(pb::ClusterStatusRequest {}).await {
            Ok(s) => s.into_inner().term,
            Err(_) => 0,
        }
    }

    /// The index of the replica that reports itself leader.
    pub(crate) async fn leader(&self, within: Duration) -> anyhow::Result<usize> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            for (i, addr) in self.addrs.iter().enumerate() {
                if self.children[i].is_none() {
                    continue;
                }
                let Ok(ch) = connect(addr).await else { continue };
                if let Ok(s) = AdminServiceClient::new(ch).cluster_status(pb::ClusterStatusRequest {}).await {
                    let s = s.into_inner();
                    if s.leader == Some(s.id) {
                        return Ok(i);
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        bail!("no leader within {within:?}")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.children.len() {
            self.kill(i);
        }
        // KAIROS_BENCH_KEEP=1 keeps the replicas' and agents' logs and data for a look after.
        if std::env::var_os("KAIROS_BENCH_KEEP").is_some() {
            self.dir.disable_cleanup(true);
            eprintln!("kept {}", self.dir.path().display());
        }
    }
}

/// The benchmark cluster's join token.
pub(crate) const JOIN_TOKEN: &str = "kairos-join.bench-0123456789abcdef";

/// The benchmark cluster's bootstrap admin token (it acts as one user per submit client).
const ADMIN_TOKEN: &str = "kairos-admin.bench-0123456789abcdef";

fn with_token(mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
    kairos_proto::wire::set_bearer(req.metadata_mut(), ADMIN_TOKEN);
    Ok(req)
}

/// A channel whose every call carries the admin token.
pub(crate) type Conn = tonic::service::interceptor::InterceptedService<
    Channel,
    fn(tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status>,
>;

pub(crate) async fn connect(addr: &str) -> Result<Conn, tonic::transport::Error> {
    let channel = Endpoint::from_shared(format!("http://{addr}"))?
        .connect_timeout(Duration::from_millis(500))
        .connect()
        .await?;
    Ok(tonic::service::interceptor::InterceptedService::new(channel, with_token as _))
}

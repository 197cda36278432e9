//! Power cuts: every replica's data lives on `kairos-lazyfs`, a FUSE filesystem that keeps each
//! write in memory until the file is fsync'd and loses what was not synced when it is killed (a
//! power cut), or writes back all but a torn last write. Acknowledged submits flow from several
//! clients while power is cut under one replica, then under all three; they restart, every
//! replica starts, and no acknowledged submit is missing.

use std::collections::BTreeSet;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::harness::{bin, signal, wait_for, Cluster};

/// A replica's disk: `kairos-lazyfs` over a backing directory, mounted where the replica keeps
/// its data.
struct LazyDisk {
    backing: PathBuf,
    mount: PathBuf,
    fs: Option<Child>,
}

impl LazyDisk {
    /// Moves what is in `dir` onto a lazy disk mounted at `dir`.
    fn under(dir: &Path) -> LazyDisk {
        // SAFETY: geteuid has no preconditions.
        assert_eq!(unsafe { libc::geteuid() }, 0, "mounting FUSE filesystems needs root (CI runs as root)");
        let backing = dir.with_extension("disk");
        // A replica killed while still starting (a loaded machine) may not have made its
        // directory yet: it then starts from an empty one on the lazy disk.
        std::fs::create_dir_all(dir).expect("the data directory");
        std::fs::rename(dir, &backing).expect("move the data to the backing directory");
        std::fs::create_dir_all(dir).unwrap();
        let mut disk = LazyDisk { backing, mount: dir.to_path_buf(), fs: None };
        disk.power_on();
        disk
    }

    fn power_on(&mut self) {
        assert!(self.fs.is_none(), "{} is already mounted", self.mount.display());
        let mut child = Command::new(bin("kairos-lazyfs"))
            .arg(&self.backing)
            .arg(&self.mount)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start kairos-lazyfs");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "mounted", "kairos-lazyfs did not mount {}", self.mount.display());
        self.fs = Some(child);
    }

    /// Power cut: the filesystem dies with whatever was not synced (`torn`: after writing back
    /// all of it but half of the last write).
    fn cut(&mut self, torn: bool) {
        let Some(mut fs) = self.fs.take() else { return };
        if torn {
            signal(fs.id(), libc::SIGUSR1);
        } else {
            let _ = fs.kill();
        }
        let _ = fs.wait();
        let out = Command::new("umount").arg("-l").arg(&self.mount).output().expect("umount");
        assert!(out.status.success(), "umount: {}", String::from_utf8_lossy(&out.stderr));
    }
}

impl Drop for LazyDisk {
    fn drop(&mut self) {
        if let Some(mut fs) = self.fs.take() {
            let _ = fs.kill();
            let _ = fs.wait();
            let _ = Command::new("umount").arg("-l").arg(&self.mount).output();
        }
    }
}

/// Clients submitting held jobs (every third with 40 KB of environment, so group-commit entries
/// outgrow sled's log segments) until stopped; the ids of acknowledged submits.
struct Load {
    stop: Arc<AtomicBool>,
    acknowledged: Arc<Mutex<BTreeSet<u64>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    fn start(c: &Cluster, clients: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let acknowledged = Arc::new(Mutex::new(BTreeSet::new()));
        let big = format!("BIG={}", "x".repeat(40_000));
        let threads = (0..clients)
            .map(|n| {
                let (stop, acknowledged, big) = (stop.clone(), acknowledged.clone(), big.clone());
                let cli = c.cli();
                std::thread::spawn(move || {
                    let mut i = 0usize;
                    while !stop.load(Ordering::SeqCst) {
                        i += 1;
                        let mut cmd = Command::new(cli.get_program());
                        cmd.args(cli.get_args()).stdin(Stdio::null());
                        for (k, v) in cli.get_envs() {
                            if let Some(v) = v {
                                cmd.env(k, v);
                            }
                        }
                        cmd.args(["submit", "--hold", "--name", &format!("c{n}-{i}")]);
                        if (i + n).is_multiple_of(3) {
                            cmd.args(["--env", &big]);
                        }
                        let Ok(out) = cmd.args(["--", "true"]).output() else { continue };
                        if out.status.success() {
                            if let Ok(id) = String::from_utf8_lossy(&out.stdout).trim().parse() {
                                acknowledged.lock().unwrap().insert(id);
                            }
                        } else {
                            std::thread::sleep(Duration::from_millis(50));
                        }
                    }
                })
            })
            .collect();
        Load { stop, acknowledged, threads }
    }

    fn count(&self) -> usize {
        self.acknowledged.lock().unwrap().len()
    }

    /// Waits until `more` further submits were acknowledged.
    fn wait_more(&self, more: usize) {
        let target = self.count() + more;
        wait_for(&format!("{target} acknowledged submits"), || (self.count() >= target).then_some(()));
    }

    fn stop(mut self) -> BTreeSet<u64> {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            t.join().unwrap();
        }
        self.acknowledged.lock().unwrap().clone()
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Every acknowledged job is in the queue the cluster serves.
fn assert_all_present(c: &Cluster, acknowledged: &BTreeSet<u64>) {
    let listed: BTreeSet<u64> = c.jobs().iter().filter_map(|j| j["id"].as_u64()).collect();
    let missing: Vec<_> = acknowledged.difference(&listed).collect();
    assert!(
        missing.is_empty(),
        "{} of {} acknowledged submits are missing after the power cut: {missing:?}",
        missing.len(),
        acknowledged.len()
    );
}

/// Power back on under the replicas `which`, and start them.
fn restart(c: &mut Cluster, disks: &mut [LazyDisk], which: &[usize]) {
    for &i in which {
        disks[i].power_on();
    }
    start_replicas(c, which);
}

fn start_replicas(c: &mut Cluster, which: &[usize]) {
    for &i in which {
        c.start_controller(i);
    }
    c.leader();
    wait_for("the cluster to serve", || c.kairos(&["queue"]).status.success().then_some(()));
}

/// Every replica runs (none panicked or refused to start) and they agree: the replica that lost
/// the most catches up with the others.
fn assert_replicas_up(c: &mut Cluster) {
    c.wait_converged();
    for (i, r) in c.controllers.iter_mut().enumerate() {
        let status = r.child.as_mut().and_then(|ch| ch.try_wait().ok().flatten());
        assert!(status.is_none(), "replica {} exited after the power cut: {status:?}", i + 1);
    }
}

fn power_cut_run(torn: bool) {
    let mut c = Cluster::start_with(3, 1, &[]);
    for i in 0..3 {
        c.kill_controller(i);
    }
    let mut disks: Vec<LazyDisk> =
        (1..=3).map(|id| LazyDisk::under(&c.path(&format!("controller-{id}")))).collect();
    start_replicas(&mut c, &[0, 1, 2]);

    // Power cut under the leader while submits flow; it comes back and catches up.
    let load = Load::start(&c, 4);
    load.wait_more(150);
    let leader = c.leader();
    c.kill_controller(leader);
    disks[leader].cut(torn);
    load.wait_more(50);
    restart(&mut c, &mut disks, &[leader]);
    load.wait_more(150);

    // Power cut under all three at once.
    for i in 0..3 {
        c.kill_controller(i);
    }
    for d in &mut disks {
        d.cut(torn);
    }
    let acknowledged = load.stop();
    restart(&mut c, &mut disks, &[0, 1, 2]);
    assert_replicas_up(&mut c);
    assert_all_present(&c, &acknowledged);
    eprintln!(
        "{} acknowledged submits survived two power cuts (torn write-back: {torn})",
        acknowledged.len()
    );
}

#[test]
fn acknowledged_submits_survive_power_cuts_under_one_replica_and_under_all_three() {
    power_cut_run(false);
}

#[test]
fn a_torn_last_write_at_a_power_cut_recovers_without_losing_acknowledged_submits() {
    power_cut_run(true);
}

//! `kairos-lazyfs BACKING MOUNTPOINT`: mounts a filesystem over `BACKING` at `MOUNTPOINT` that
//! keeps every write in memory until the file is fsync'd, like a page cache that is never
//! written back on its own (the approach of Jepsen's LazyFS). Prints `mounted` once it serves.
//!
//! - SIGKILL is a power cut: every unsynced write is lost.
//! - SIGUSR1 is a power cut during write-back: the unsynced writes reach the disk in order up to
//!   the last one, which is torn (only its first half lands); then it exits.
//! - SIGTERM or SIGINT is a clean shutdown: everything is written back, then it unmounts.
//!
//! After a power cut the mount is left dead; `umount -l MOUNTPOINT` clears it.

mod fs;
mod overlay;

use anyhow::{bail, Context};
use nix::sys::signal::{SigSet, Signal};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [backing, mountpoint] = args.as_slice() else {
        bail!("usage: kairos-lazyfs BACKING MOUNTPOINT");
    };
    // The signals are taken with sigwait on this thread; every thread started after inherits the mask.
    let mut signals = SigSet::empty();
    for s in [Signal::SIGUSR1, Signal::SIGTERM, Signal::SIGINT] {
        signals.add(s);
    }
    signals.thread_block().context("blocking signals")?;
    let fs = fs::LazyFs::new(backing.as_ref()).with_context(|| format!("backing {backing}"))?;
    let mut config = fuser::Config::default();
    config.mount_options = vec![fuser::MountOption::FSName("kairos-lazyfs".into())];
    let session = fuser::spawn_mount(fs.clone(), mountpoint, &config)
        .with_context(|| format!("mounting {mountpoint}"))?;
    println!("mounted");
    if signals.wait().context("waiting for signals")? == Signal::SIGUSR1 {
        let n = fs.torn_write_back().context("torn write-back")?;
        eprintln!("kairos-lazyfs: power cut; {n} unsynced changes written back, the last torn");
        std::process::exit(0);
    }
    fs.write_back_all().context("write-back")?;
    drop(session);
    Ok(())
}

//! CPU time of processes over a measured window, from `/proc/PID/stat` (user + system, in clock
//! ticks), so a benchmark can say what each operation cost every process, not only how many
//! operations the machine managed.

use std::time::Duration;

/// User + system CPU time `pid` has used so far (its threads included); `None` once it is gone.
pub fn used(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces; the fields after its closing parenthesis are
    // state (3), …, utime (14), stime (15).
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    // SAFETY: sysconf only reads a configuration value.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = u64::try_from(hz).ok().filter(|h| *h > 0)?;
    Some(Duration::from_micros((utime + stime) * 1_000_000 / hz))
}

/// CPU time used by `pids` between `start` and now, each in microseconds per operation.
pub struct Window {
    start: Vec<Option<Duration>>,
    pids: Vec<u32>,
}

impl Window {
    pub fn start(pids: &[u32]) -> Window {
        Window { start: pids.iter().map(|p| used(*p)).collect(), pids: pids.to_vec() }
    }

    /// Each process's CPU per operation over the window (µs; 0 where it could not be read).
    pub fn per_op(&self, ops: u64) -> Vec<f64> {
        self.pids
            .iter()
            .zip(&self.start)
            .map(|(pid, start)| match (start, used(*pid)) {
                (Some(a), Some(b)) if ops > 0 => {
                    (b.saturating_sub(*a).as_micros() as f64 / ops as f64 * 10.0).round() / 10.0
                }
                _ => 0.0,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This process's CPU time from the kernel's own clock (not /proc), the reference.
    fn cpu_clock() -> Duration {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: clock_gettime writes into the timespec it is given.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
        assert_eq!(rc, 0);
        Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
    }

    #[test]
    fn a_busy_process_shows_the_cpu_it_burnt_and_a_missing_one_none() {
        let me = std::process::id();
        let before = used(me).expect("own stat");
        // Burn 300 ms of CPU by the kernel's clock, however long a busy machine takes to give
        // it (wall time would measure the machine's load, not this process).
        let (c0, deadline) = (cpu_clock(), std::time::Instant::now() + Duration::from_secs(60));
        let mut x = 0u64;
        while cpu_clock() - c0 < Duration::from_millis(300) && std::time::Instant::now() < deadline {
            for _ in 0..10_000 {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
        }
        let after = used(me).expect("own stat");
        // /proc counts in clock ticks (10 ms), updated as they pass.
        assert!(after - before >= Duration::from_millis(200), "{before:?} -> {after:?}");
        assert_eq!(used(u32::MAX), None);
        let w = Window::start(&[me, u32::MAX]);
        let per = w.per_op(0);
        assert_eq!(per, vec![0.0, 0.0]);
    }
}

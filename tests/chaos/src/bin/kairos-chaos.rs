//! `kairos-chaos`: runs seeded fault schedules against the simulated control plane
//! (`kairos_chaos::dst`) and prints one JSON line with what they found.
//!
//! ```text
//! kairos-chaos --schedules N [--seed S] [--threads T]   N schedules drawn from S
//! kairos-chaos --replay SEED                            one schedule alone, in detail
//! ```
//! Exits 1 when any schedule broke a promise (each failing seed is printed with the command
//! that reruns it alone), 2 on bad arguments.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use kairos_chaos::dst::{faults, run_schedule, Config, Observed, ScheduleReport};

struct Args {
    schedules: usize,
    seed: Option<u64>,
    threads: usize,
    replay: Option<u64>,
}

fn parse(mut argv: impl Iterator<Item = String>) -> Result<Args, String> {
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let mut args = Args { schedules: 100, seed: None, threads, replay: None };
    while let Some(flag) = argv.next() {
        let mut value = |name: &str| -> Result<u64, String> {
            let v = argv.next().ok_or_else(|| format!("{name} needs a value"))?;
            v.parse().map_err(|_| format!("{name}: \"{v}\" is not a non-negative integer"))
        };
        match flag.as_str() {
            "--schedules" => args.schedules = value("--schedules")? as usize,
            "--seed" => args.seed = Some(value("--seed")?),
            "--threads" => args.threads = (value("--threads")? as usize).max(1),
            "--replay" => args.replay = Some(value("--replay")?),
            "-h" | "--help" => {
                return Err(
                    "usage: kairos-chaos --schedules N [--seed S] [--threads T] | --replay SEED".into()
                )
            }
            other => return Err(format!("unknown argument \"{other}\" (see --help)")),
        }
    }
    if args.schedules == 0 && args.replay.is_none() {
        return Err("--schedules must be at least 1".into());
    }
    Ok(args)
}

/// The seed of schedule `i` of a run seeded `seed`.
fn schedule_seed(seed: u64, i: usize) -> u64 {
    let mut z = seed.wrapping_add((i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn fresh_seed() -> u64 {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    (nanos as u64) ^ u64::from(std::process::id()).rotate_left(32)
}

fn replay(seed: u64) -> i32 {
    let cfg = Config::for_seed(seed);
    let plan = faults::schedule(seed, cfg.window.as_millis() as u64, cfg.node_timeout.as_millis() as u64);
    for f in &plan {
        eprintln!("fault {} at {} ms for {} ms (pick {:#x})", f.kind.name(), f.at_ms, f.hold_ms, f.pick);
    }
    let report = run_schedule(seed, &cfg);
    for v in &report.violations {
        eprintln!("violation: {v}");
    }
    println!(
        "{}",
        serde_json::json!({
            "seed": seed,
            "faults": report.faults.iter().map(|k| k.name()).collect::<Vec<_>>(),
            "operations": report.operations,
            "acknowledged": report.acknowledged,
            "processes": report.processes,
            "violations": report.violations.iter().map(|v| v.to_string()).collect::<Vec<_>>(),
            "simulated_ms": report.simulated_ms,
            "fingerprint": report.fingerprint,
            "replicas": cfg.replicas,
            "observed": report.observed,
        })
    );
    i32::from(!report.violations.is_empty())
}

fn main() {
    let args = match parse(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("kairos-chaos: {e}");
            std::process::exit(2);
        }
    };
    if let Some(seed) = args.replay {
        std::process::exit(replay(seed));
    }
    let seed = args.seed.unwrap_or_else(fresh_seed);
    eprintln!("kairos-chaos: seed {seed}, {} schedules on {} threads", args.schedules, args.threads);
    let started = std::time::Instant::now();
    let next = AtomicUsize::new(0);
    let reports: Mutex<Vec<ScheduleReport>> = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..args.threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= args.schedules {
                    return;
                }
                let seed = schedule_seed(seed, i);
                let report = run_schedule(seed, &Config::for_seed(seed));
                for v in &report.violations {
                    eprintln!(
                        "schedule {}: {v} (rerun alone: kairos-chaos --replay {})",
                        report.seed, report.seed
                    );
                }
                reports.lock().unwrap_or_else(|p| p.into_inner()).push(report);
            });
        }
    });
    let reports = reports.into_inner().unwrap_or_else(|p| p.into_inner());
    let kinds: BTreeSet<&str> = reports.iter().flat_map(|r| r.faults.iter().map(|k| k.name())).collect();
    let mut failing: Vec<u64> = reports.iter().filter(|r| !r.violations.is_empty()).map(|r| r.seed).collect();
    failing.sort_unstable();
    let violations: usize = reports.iter().map(|r| r.violations.len()).sum();
    // Every schedule's fingerprint, in seed order: equal on every rerun of the same seed.
    let mut prints: Vec<(u64, &str)> = reports.iter().map(|r| (r.seed, r.fingerprint.as_str())).collect();
    prints.sort_unstable();
    let fingerprint = kairos_chaos::fnv64(format!("{prints:?}").as_bytes());
    println!(
        "{}",
        serde_json::json!({
            "seed": seed,
            "schedules": reports.len(),
            "faults": reports.iter().map(|r| r.faults.len()).sum::<usize>(),
            "fault_kinds": kinds,
            "acknowledged": reports.iter().map(|r| r.acknowledged).sum::<usize>(),
            "operations": reports.iter().map(|r| r.operations).sum::<usize>(),
            "processes": reports.iter().map(|r| r.processes).sum::<usize>(),
            "violations": violations,
            "seconds": (started.elapsed().as_secs_f64() * 10.0).round() / 10.0,
            "simulated_seconds": reports.iter().map(|r| r.simulated_ms).sum::<i64>() / 1000,
            "failing_seeds": failing,
            "fingerprint": format!("{fingerprint:016x}"),
            "observed": reports.iter().fold(Observed::default(), |mut o, r| {
                o.add(&r.observed);
                o
            }),
        })
    );
    std::process::exit(i32::from(violations > 0));
}

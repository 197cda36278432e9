//! The chaos suite: every fault kind in its own scenario, then all of them mixed, each on a
//! fresh cluster of separate hosts with the workload running; every checker must pass. Prints
//! the summary table at the end.
//!
//! `KAIROS_CHAOS_SEED=N` reruns a schedule; `KAIROS_CHAOS_SOAK=SECONDS` runs instead one long
//! mixed scenario of that length (soak mode). Needs root (CI runs as root) and `cargo build
//! --bins` first (scripts/test.sh does both).

use std::time::Duration;

use kairos_chaos::cluster::Topology;
use kairos_chaos::netns::namespaces_with;
use kairos_chaos::scenario::{self, Fault, Scenario};
use kairos_chaos::summary_table;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

#[test]
fn chaos_suite() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "the chaos suite needs root (CI runs as root)");
    kairos_chaos::cluster::build_daemons().expect("building kairosd and kairos-agent");
    let seed = env_u64("KAIROS_CHAOS_SEED").unwrap_or(20_261_130);
    let topology = Topology { controllers: 3, agents: 2, gpus_per_agent: 4 };
    let scenario = |name: &str, seed: u64, faults: Vec<Fault>, secs: u64| Scenario {
        name: name.to_string(),
        seed,
        faults,
        workload: Duration::from_secs(secs),
        topology,
        leader_bound: Duration::from_secs(10),
        drain_bound: Duration::from_secs(90),
    };
    let scenarios: Vec<Scenario> = match env_u64("KAIROS_CHAOS_SOAK") {
        Some(secs) => vec![scenario("soak (all faults)", seed, Fault::ALL.to_vec(), secs)],
        None => Fault::ALL
            .iter()
            .enumerate()
            .map(|(i, f)| scenario(f.name(), seed + i as u64, vec![*f], 10))
            .chain([scenario("mixed (all faults)", seed + 100, Fault::ALL.to_vec(), 24)])
            .collect(),
    };
    let prefix_base = format!("kq{}", std::process::id() % 1000);
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    for (i, s) in scenarios.iter().enumerate() {
        let prefix = format!("{prefix_base}{i}");
        let outcome = scenario::run(&prefix, s).unwrap_or_else(|e| panic!("scenario {:?}: {e}", s.name));
        assert!(namespaces_with(&prefix).is_empty(), "scenario {:?} left namespaces behind", s.name);
        if !outcome.violations.is_empty() {
            failures.push(format!(
                "{} (seed {}): {:?}; logs in {}",
                s.name,
                s.seed,
                outcome.violations.iter().map(ToString::to_string).collect::<Vec<_>>(),
                outcome.dir.map(|d| d.display().to_string()).unwrap_or_default()
            ));
        }
        rows.push(outcome.summary);
    }
    // Straight to stderr, past the test harness's output capture: the table belongs in the CI
    // log also when the suite passes.
    let table = format!("\nchaos suite summary\n{}\n", summary_table(&rows));
    let _ = std::io::Write::write_all(&mut std::io::stderr(), table.as_bytes());
    assert!(failures.is_empty(), "invariants violated:\n{}", failures.join("\n"));
    assert!(
        rows.iter().all(|r| r.acknowledged > 0 && r.faults > 0),
        "a scenario did no work or injected nothing"
    );
    // The workload must really exercise preemption (urgent jobs over training on full GPUs).
    assert!(rows.iter().map(|r| r.preempted).sum::<usize>() > 0, "no job was preempted in any scenario");
}

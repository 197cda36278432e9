//! How closely the replay of a history under the policy that ran reproduces what happened:
//! each job's replayed first start against its recorded one, and the preemptions. A what-if
//! is only as good as this: `kairos policy what-if` prints it first, and says so when it is
//! poor.

use serde::Serialize;

use crate::engine::HistoryReplay;
use crate::history::HistoryTrace;
use crate::report::percentile;

/// A start this close to the recorded one counts as reproduced (s).
pub const WITHIN_S: f64 = 2.0;

/// Fidelity is poor past these: a p90 start error of a minute, or a tenth of the jobs missed.
pub const POOR_P90_S: f64 = 60.0;
pub const POOR_MISSED_SHARE: f64 = 0.1;

/// A job the replay did not reproduce, and the likely why.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Miss {
    pub id: u64,
    pub name: String,
    /// Unix ms; None: it never started there.
    pub recorded_start_ms: Option<i64>,
    pub replayed_start_ms: Option<i64>,
    pub why: String,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Fidelity {
    /// Jobs whose recorded first start was compared.
    pub compared: usize,
    /// |replayed − recorded| first start, seconds.
    pub start_error_p50_s: f64,
    pub start_error_p90_s: f64,
    pub start_error_max_s: f64,
    /// Jobs started within `WITHIN_S` of the record (and jobs that never started in either).
    pub reproduced: usize,
    pub recorded_preemptions: u64,
    pub replayed_preemptions: u64,
    pub poor: bool,
    /// Every job not reproduced, worst first.
    pub not_reproduced: Vec<Miss>,
}

impl Fidelity {
    /// One line: `fidelity: 41/42 starts within 2 s (p50 0.1 s, p90 0.4 s); preemptions 3 as
    /// recorded 3`, with `POOR` first when it is.
    pub fn summary(&self) -> String {
        format!(
            "{}fidelity: {}/{} starts within {WITHIN_S:.0} s of the record (error p50 {:.1} s, p90 {:.1} s, max {:.1} s); \
             preemptions {} replayed, {} recorded",
            if self.poor { "POOR " } else { "" },
            self.reproduced,
            self.compared,
            self.start_error_p50_s,
            self.start_error_p90_s,
            self.start_error_max_s,
            self.replayed_preemptions,
            self.recorded_preemptions
        )
    }
}

/// Compares `replay` (under the policy that ran) with what `trace` recorded.
pub fn fidelity(trace: &HistoryTrace, replay: &HistoryReplay) -> Fidelity {
    let mut errors = Vec::new();
    let mut misses = Vec::new();
    let mut reproduced = 0;
    for (i, job) in trace.jobs.iter().enumerate() {
        let recorded = job.recorded.starts.first().copied();
        let replayed = replay.starts.get(i).copied().flatten();
        let miss = |why: String| Miss {
            id: job.id,
            name: job.name.clone(),
            recorded_start_ms: recorded,
            replayed_start_ms: replayed,
            why,
        };
        match (recorded, replayed) {
            (None, None) => reproduced += 1,
            (Some(_), None) => {
                misses.push(miss(format!("did not start in the replay ({})", job.recorded.state)))
            }
            (None, Some(_)) => misses.push(miss(format!(
                "started in the replay but never on the cluster ({})",
                job.recorded.state
            ))),
            (Some(r), Some(p)) => {
                let error = (p - r).abs() as f64 / 1000.0;
                errors.push(error);
                if error <= WITHIN_S {
                    reproduced += 1;
                } else {
                    misses.push(miss(why_late(trace, i, r, p)));
                }
            }
        }
    }
    errors.sort_by(f64::total_cmp);
    misses.sort_by_key(|m| std::cmp::Reverse(miss_error_ms(m)));
    let compared = trace.jobs.len();
    let p90 = percentile(&errors, 0.9);
    Fidelity {
        compared,
        start_error_p50_s: percentile(&errors, 0.5),
        start_error_p90_s: p90,
        start_error_max_s: errors.last().copied().unwrap_or(0.0),
        reproduced,
        recorded_preemptions: trace.jobs.iter().map(|j| u64::from(j.recorded.preemptions)).sum(),
        replayed_preemptions: replay.preemptions,
        poor: p90 > POOR_P90_S || misses.len() as f64 > POOR_MISSED_SHARE * compared.max(1) as f64,
        not_reproduced: misses,
    }
}

fn miss_error_ms(m: &Miss) -> i64 {
    match (m.recorded_start_ms, m.replayed_start_ms) {
        (Some(r), Some(p)) => (p - r).abs(),
        _ => i64::MAX,
    }
}

/// Why job `i` started at `replayed` rather than at `recorded` (Unix ms), as far as the trace
/// tells.
fn why_late(trace: &HistoryTrace, i: usize, recorded: i64, replayed: i64) -> String {
    let job = &trace.jobs[i];
    let by = format!(
        "started {:.1} s {} than recorded",
        (replayed - recorded).abs() as f64 / 1000.0,
        if replayed > recorded { "later" } else { "earlier" }
    );
    let (from, to) = (job.submit_ms, recorded.max(replayed));
    let cause = if job.submit_ms < trace.window.from_ms {
        Some("submitted before the window".to_string())
    } else if !job.holds.is_empty() {
        Some("held and released by hand".to_string())
    } else {
        let changed = trace.node_events.iter().find(|e| (from..=to).contains(&e.at_ms));
        changed.map(|e| format!("node {} changed while it waited", e.node))
    };
    match cause {
        Some(c) => format!("{by}: {c}"),
        None => by,
    }
}

//! Start estimates in the replay (`SimConfig::estimates`): after every pass that followed a
//! change (a submit, an exit, a start, a preemption, …; with `SimConfig::estimate_every_ms`, at
//! most once in that time and that long after a change at the latest) the replay asks the core
//! for the estimates `kairos queue --start` shows (`plan_with` with `ESTIMATES_MAX`), and
//! records each waiting job's estimated start at its submit and whenever it changes; at the
//! job's first start the record is set against the actual start
//! (`crate::report::EstimateReport`).

use std::collections::{BTreeMap, HashMap};

use kairos_scheduler::model::JobId;
use kairos_scheduler::planner::{plan_with, PlanConfig, ESTIMATES_MAX};
use kairos_scheduler::ClusterState;

use crate::report::{EstimateReport, EstimateSample};

/// The waiting jobs' estimates, and those of the jobs that started.
pub(super) struct EstimateSide {
    /// Jobs submitted that have not started yet: their submit time, and whether they were
    /// still waiting after the pass at their submit.
    waiting: BTreeMap<JobId, (i64, bool)>,
    /// Jobs submitted since the last pass.
    fresh: Vec<JobId>,
    /// Per waiting job: (when, the estimated start; None: no estimate) at its submit and at
    /// every change.
    records: HashMap<JobId, Vec<(i64, Option<i64>)>>,
    /// Jobs that started, with their records.
    samples: Vec<EstimateSample>,
    /// Planning passes made for estimates.
    passes: u64,
    /// At most one observation in this many ms (0: after every change).
    every_ms: i64,
    /// A change not observed yet; the last observation.
    due: bool,
    last_ms: Option<i64>,
    /// When an `Event::Estimate` is scheduled.
    pub(super) scheduled: Option<i64>,
}

impl EstimateSide {
    pub(super) fn new(every_ms: i64) -> EstimateSide {
        EstimateSide {
            waiting: BTreeMap::new(),
            fresh: Vec::new(),
            records: HashMap::new(),
            samples: Vec::new(),
            passes: 0,
            every_ms: every_ms.max(0),
            due: false,
            last_ms: None,
            scheduled: None,
        }
    }

    pub(super) fn submitted(&mut self, job: JobId, now: i64) {
        self.waiting.insert(job, (now, false));
        self.fresh.push(job);
    }

    /// After a pass: the jobs submitted before it that it did not start have waited; `changed`:
    /// the state changed since the last observation.
    pub(super) fn passed(&mut self, changed: bool) {
        for job in self.fresh.drain(..) {
            if let Some(w) = self.waiting.get_mut(&job) {
                w.1 = true;
            }
        }
        self.due |= changed;
    }

    /// When the estimates should next be observed, if a change waits for it.
    pub(super) fn due_at(&self) -> Option<i64> {
        self.due.then(|| self.last_ms.map_or(i64::MIN, |l| l.saturating_add(self.every_ms)))
    }

    /// The job's first start: its record is done.
    pub(super) fn started(&mut self, job: JobId, now: i64) {
        if let Some((submit_ms, waited)) = self.waiting.remove(&job) {
            let records = self.records.remove(&job).unwrap_or_default();
            self.samples.push(EstimateSample { submit_ms, start_ms: now, waited, records });
        }
    }

    /// The job ended without starting (cancelled): nothing to measure.
    pub(super) fn gone(&mut self, job: JobId) {
        self.waiting.remove(&job);
        self.records.remove(&job);
    }

    /// The estimates of the state as it is after the pass at `now`: each waiting job's that
    /// differs from the last one recorded (or is its first) is recorded.
    pub(super) fn observe(&mut self, state: &ClusterState, now: i64) {
        // With nothing waiting there is nothing to plan: that costs nothing, so it does not
        // count against `every_ms`.
        self.due = false;
        if self.waiting.is_empty() {
            return;
        }
        self.last_ms = Some(now);
        self.passes += 1;
        let out = plan_with(state, PlanConfig { estimates: ESTIMATES_MAX, ..Default::default() });
        for job in self.waiting.keys() {
            let start = out.estimates.get(job).and_then(|e| e.start_ms);
            let records = self.records.entry(*job).or_default();
            if records.last().is_none_or(|r| r.1 != start) {
                records.push((now, start));
            }
        }
    }

    pub(super) fn report(&self) -> EstimateReport {
        EstimateReport { passes: self.passes, ..EstimateReport::of(&self.samples) }
    }
}

#[cfg(test)]
mod tests {
    use crate::engine::{simulate, Sim, SimConfig};
    use crate::report::{EstimateReport, EstimateSample};
    use crate::trace::{TraceJob, TraceNode};
    use kairos_scheduler::policy::Policy;

    fn one_gpu() -> Vec<TraceNode> {
        vec![TraceNode { name: "n0".into(), gpus: 1, model: "T4".into(), ..TraceNode::default() }]
    }

    fn job(name: &str, submit_s: i64, duration_s: i64) -> TraceJob {
        TraceJob {
            name: name.into(),
            submit_ms: submit_s * 1000,
            duration_ms: duration_s * 1000,
            gpus: 1,
            ..TraceJob::default()
        }
    }

    /// One GPU, three jobs in a row: a runs 0–100 s, b (at 10 s) and c (at 20 s) wait for it.
    fn queue() -> Vec<TraceJob> {
        vec![job("a", 0, 100), job("b", 10, 50), job("c", 20, 30)]
    }

    fn estimates(factor: f64) -> EstimateReport {
        let config = SimConfig { estimates: true, time_limit_factor: factor, ..SimConfig::default() };
        simulate(&one_gpu(), &queue(), &Policy::default(), &config).estimates.expect("recorded")
    }

    /// Limits that are the run times and nothing else arriving: every estimate is the start.
    #[test]
    fn with_exact_limits_and_nothing_else_changing_every_estimate_is_exact() {
        let e = estimates(1.0);
        assert_eq!((e.jobs_waited, e.jobs_estimated, e.estimated_at_submit, e.not_estimated), (2, 2, 2, 0));
        assert_eq!((e.error_p50_s, e.error_p90_s, e.within_10pct), (0.0, 0.0, 1.0), "{e:?}");
        assert_eq!((e.last_error_p50_s, e.last_within_10pct, e.started_early), (0.0, 1.0, 0.0), "{e:?}");
        assert_eq!(e.changes_mean, 0.0, "{e:?}");
        assert!(e.passes >= 3, "{e:?}");
    }

    /// Limits twice the run times: b is estimated at a's limit (200 s) and starts at 100 s; c at
    /// b's (200 + 100 s), then at 100 s, when b starts, at 200 s; it starts at 150 s.
    #[test]
    fn with_limits_twice_the_run_times_estimates_are_late_by_what_the_limits_overstate() {
        let e = estimates(2.0);
        assert_eq!((e.jobs_waited, e.jobs_estimated, e.not_estimated), (2, 2, 0), "{e:?}");
        assert_eq!((e.error_p50_s, e.error_p90_s, e.within_10pct), (100.0, 150.0, 0.0), "{e:?}");
        assert_eq!(
            (e.last_error_p50_s, e.last_error_p90_s, e.last_within_10pct),
            (50.0, 100.0, 0.0),
            "{e:?}"
        );
        assert_eq!((e.started_early, e.changes_mean), (1.0, 0.5), "{e:?}");
    }

    /// At most one observation in 15 s: c, submitted 10 s after b's was observed, is first
    /// estimated 15 s after it; in 1000 s, c starts before it is ever observed. Recording the
    /// estimates changes nothing else in the replay.
    #[test]
    fn throttled_estimates_come_later_or_not_at_all_and_recording_changes_nothing_else() {
        let run = |estimates: bool, every_ms: i64| {
            let config = SimConfig {
                estimates,
                estimate_every_ms: every_ms,
                time_limit_factor: 1.0,
                ..SimConfig::default()
            };
            simulate(&one_gpu(), &queue(), &Policy::default(), &config)
        };
        let e = run(true, 15_000).estimates.unwrap();
        assert_eq!((e.jobs_waited, e.jobs_estimated, e.estimated_at_submit, e.not_estimated), (2, 2, 1, 0));
        assert_eq!((e.error_p90_s, e.within_10pct), (0.0, 1.0), "{e:?}");
        let e = run(true, 1_000_000).estimates.unwrap();
        assert_eq!((e.jobs_waited, e.jobs_estimated, e.not_estimated, e.passes), (2, 1, 1, 1), "{e:?}");
        let without = run(false, 0);
        assert!(without.estimates.is_none());
        for every_ms in [0, 15_000, 1_000_000] {
            let with = run(true, every_ms);
            assert_eq!(crate::report::Report { estimates: None, ..with }, without, "every {every_ms} ms");
        }
    }

    #[test]
    fn time_limits_are_the_run_time_times_the_factor_rounded_up_and_capped_by_the_qos_wall() {
        let jobs = vec![
            TraceJob { duration_ms: 61_500, ..job("t", 0, 0) },
            TraceJob { inference: true, ..job("i", 0, 3 * 3600) },
            job("zero", 0, 0),
        ];
        let limits = |factor: f64| {
            let config = SimConfig { time_limit_factor: factor, ..SimConfig::default() };
            let sim = Sim::new(&one_gpu(), &jobs, &Policy::default(), &config, None);
            (0..jobs.len()).map(|i| sim.spec(i).time_limit_s.unwrap()).collect::<Vec<_>>()
        };
        // Inference may run 2 h under the shipped policy.
        assert_eq!(limits(2.0), [123, 7200, 1]);
        assert_eq!(limits(1.5), [93, 7200, 1]);
        assert_eq!(limits(0.5), [31, 5400, 1]);
    }

    /// The checker: a wrong estimate counts as an error, one within a tenth of the wait does
    /// not; a job that waited without an estimate is not estimated; one that never waited is
    /// left out.
    #[test]
    fn a_wrong_estimate_is_counted_as_an_error_and_the_last_one_is_measured_too() {
        let s = |submit_s: i64, start_s: i64, records: &[(i64, Option<i64>)]| EstimateSample {
            submit_ms: submit_s * 1000,
            start_ms: start_s * 1000,
            waited: true,
            records: records.iter().map(|(at, e)| (at * 1000, e.map(|e| e * 1000))).collect(),
        };
        let samples = [
            // Right at submit (error 0).
            s(0, 100, &[(0, Some(100))]),
            // Wrong at submit (300 s for 100 s: error 200 s), right later (105 s: within 10 s).
            s(0, 100, &[(0, Some(300)), (50, Some(105))]),
            // Early: estimated 150 s, started at 250 s (error 100 s of a 250 s wait).
            s(0, 250, &[(0, Some(150))]),
            // No estimate at submit (beyond the 64), one later: not at submit.
            s(0, 400, &[(0, None), (300, Some(400))]),
            // Waited with no estimate at all, or started before the next observation.
            s(0, 50, &[(0, None)]),
            s(0, 30, &[]),
            // Never waited: not counted.
            EstimateSample { waited: false, ..s(7, 7, &[]) },
        ];
        let e = EstimateReport::of(&samples);
        assert_eq!(
            (e.jobs_waited, e.jobs_estimated, e.estimated_at_submit, e.not_estimated, e.not_estimated_share),
            (6, 4, 3, 2, 0.333),
            "{e:?}"
        );
        // First errors 0, 200, 100, 0: p50 0, p90 200; within: the two exact ones.
        assert_eq!((e.error_p50_s, e.error_p90_s, e.within_10pct), (0.0, 200.0, 0.5), "{e:?}");
        // Later than the start: only the 300 s estimate.
        assert_eq!(e.started_early, 0.25, "{e:?}");
        // Last errors 0, 5, 100, 0: within 0, 5 (of 10), 0.
        assert_eq!(
            (e.last_error_p50_s, e.last_error_p90_s, e.last_within_10pct),
            (0.0, 100.0, 0.75),
            "{e:?}"
        );
        assert_eq!(e.changes_mean, 0.5, "{e:?}");
        // A wait of 0: within when off by at most a second.
        let zero = |estimate_ms: i64| EstimateSample {
            submit_ms: 0,
            start_ms: 0,
            waited: true,
            records: vec![(0, Some(estimate_ms))],
        };
        assert_eq!(EstimateReport::of(&[zero(1000)]).within_10pct, 1.0);
        assert_eq!(EstimateReport::of(&[zero(1001)]).within_10pct, 0.0);
        // An empty replay: all zeros, no division by zero.
        assert_eq!(EstimateReport::of(&[]), EstimateReport::default());
    }
}

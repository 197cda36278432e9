//! What a replay measured: per class waits, completion and slowdown; utilisation, preemptions,
//! redone work, fragmentation and makespan. JSON keys are an interface (`kairos sim --json`).

use std::collections::BTreeMap;

use serde::Serialize;

/// Waits and completions of one class of jobs (inference or training), in seconds.
#[derive(Debug, Default)]
pub struct Class {
    waits: Vec<f64>,
    completions: Vec<f64>,
    slowdowns: Vec<f64>,
}

impl Class {
    pub fn add(&mut self, wait_s: f64, completion_s: f64, duration_s: f64) {
        self.waits.push(wait_s);
        self.completions.push(completion_s);
        self.slowdowns.push(completion_s / duration_s.max(1.0));
    }

    pub fn summary(mut self) -> ClassSummary {
        self.waits.sort_by(f64::total_cmp);
        let pct = |p: f64| percentile(&self.waits, p);
        let mean = |v: &[f64]| if v.is_empty() { 0.0 } else { v.iter().sum::<f64>() / v.len() as f64 };
        ClassSummary {
            jobs: self.waits.len(),
            wait_s: Waits {
                p50: pct(0.5),
                p90: pct(0.9),
                p99: pct(0.99),
                max: self.waits.last().copied().unwrap_or(0.0),
            },
            completion_s: mean(&self.completions),
            slowdown: mean(&self.slowdowns),
        }
    }
}

/// The `p` quantile (nearest rank) of ascending `sorted`; 0 when empty.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Waits {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ClassSummary {
    /// Jobs of the class that finished.
    pub jobs: usize,
    /// From arrival to first start.
    pub wait_s: Waits,
    /// Mean time from arrival to end.
    pub completion_s: f64,
    /// Mean of completion time / run time.
    pub slowdown: f64,
}

/// The jobs of one QoS or one account: their waits, and the preemptions they suffered.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Group {
    #[serde(flatten)]
    pub summary: ClassSummary,
    /// Times its running jobs were preempted, and the GPU-hours of work that threw away.
    pub preempted: u64,
    pub lost_gpu_hours: f64,
}

/// A job the replay did not finish, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Unfinished {
    pub name: String,
    /// `inference` or `training`.
    pub class: &'static str,
    /// No node could ever hold it (else it was still waiting when the replay ended).
    pub never_placeable: bool,
    /// Never placeable: the constraint no node meets — `gpu_model`, `gpus` (more than any node
    /// has), `gpu_fraction` (its QoS shares no GPUs), `cpus`, `memory`, or `refused` (refused at
    /// submit for another reason, in `reason`). Waiting: what it waits behind, the planner's
    /// pending reason (`Priority`, `Resources`, `QosGrpGpuLimit`, …).
    pub constraint: String,
    /// In words, with the figures (the model sets asked and the nodes', sizes, …).
    pub reason: String,
}

/// Unfinished jobs per class, then per kind and reason: `{"training": {"never placeable: 8
/// GPUs; …": 3}}`.
pub type UnfinishedBy = BTreeMap<String, BTreeMap<String, usize>>;

/// Counts `jobs` per class and reason.
pub fn by_class(jobs: &[Unfinished]) -> UnfinishedBy {
    let mut by = UnfinishedBy::new();
    for j in jobs {
        *by.entry(j.class.to_string()).or_default().entry(j.group()).or_default() += 1;
    }
    by
}

impl Unfinished {
    /// The line it is counted under: the constraint and what it asks (one line per model set
    /// or size), or what it waits behind.
    fn group(&self) -> String {
        if self.never_placeable {
            format!("never placeable: {}", self.reason)
        } else {
            format!("waiting: {}", self.constraint)
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Report {
    /// Jobs in the trace (with GPUs).
    pub jobs: usize,
    /// Jobs that never finished: each is in `unfinished_jobs`, counted in `unfinished_by`.
    pub unfinished: usize,
    /// Per class, how many unfinished jobs for each reason.
    pub unfinished_by: UnfinishedBy,
    /// Every unfinished job, by class and name, with why.
    pub unfinished_jobs: Vec<Unfinished>,
    /// Jobs stopped at their time limit (the QoS's max wall, when their run is longer): they
    /// ended TIMEOUT, counted as finished, their work cut short.
    pub timed_out: usize,
    pub gpus: u32,
    /// GPU time asked / (GPUs × the arrival window): above 1 the cluster cannot keep up.
    pub offered_load: f64,
    /// The arrival compression the replay used (1: the trace's own times).
    pub load: f64,
    /// From the first arrival to the last.
    pub arrival_window_s: f64,
    pub inference: ClassSummary,
    pub training: ClassSummary,
    /// Jobs that ask for a whole node of the largest size (also counted in their class).
    pub whole_node: ClassSummary,
    /// GPU time allocated between the first and the last arrival / (GPUs × that time).
    pub utilization: f64,
    /// CPU and memory time held by runs in that window / (all nodes' CPUs or memory × that
    /// time); None when the trace does not say the nodes' CPUs and memory.
    pub cpu_utilization: Option<f64>,
    pub memory_utilization: Option<f64>,
    pub preemptions: u64,
    /// Work preemption threw away (done since the victim's last checkpoint), GPU-hours.
    pub redone_gpu_hours: f64,
    /// Time-averaged share of the free GPUs that sit on partly used nodes.
    pub fragmentation: f64,
    /// From the first arrival to the last end.
    pub makespan_s: f64,
    /// Per QoS and per account (QoS and account after the policy's defaults).
    pub by_qos: BTreeMap<String, Group>,
    pub by_account: BTreeMap<String, Group>,
    /// Each account's share of the decayed GPU usage (fairshare) when the replay ended.
    pub shares: BTreeMap<String, f64>,
    /// What cloud burst launched, cost and ran (`kairos sim --burst`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub burst: Option<crate::cloud::BurstReport>,
    /// Gangs against the topology (`kairos sim --cluster BxNxG`, `--topology`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gangs: Option<GangReport>,
    /// The start estimates against the actual starts (a replay that records them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub estimates: Option<EstimateReport>,
    /// Team guarantees, per guaranteed account (a policy with guarantees).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub teams: Vec<TeamFigures>,
}

/// How good the start estimates were (`kairos sim`, `SimConfig::estimates`): each job that
/// waited (still pending after the pass at its submit) and then started, its estimates
/// (`kairos queue --start`'s) set against its actual first start. Error: |actual start −
/// estimated start|; within 10 %: an error of at most a tenth of the job's wait (submit to
/// start; a wait of 0: at most 1 s).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct EstimateReport {
    /// Jobs that waited and started.
    pub jobs_waited: usize,
    /// Of them, those that had an estimated start while they waited …
    pub jobs_estimated: usize,
    /// … of which from their submit on.
    pub estimated_at_submit: usize,
    /// Those that never had one (beyond the 64 jobs a pass estimates, a pending reason the
    /// pass gives no estimate for, or started before the estimates were next observed), and
    /// their share of the jobs that waited.
    pub not_estimated: usize,
    pub not_estimated_share: f64,
    /// The first estimate's error (s): p50, p90, and the share within 10 % of the wait.
    pub error_p50_s: f64,
    pub error_p90_s: f64,
    pub within_10pct: f64,
    /// The share of first estimates later than the actual start (the job started early).
    pub started_early: f64,
    /// The same for the last estimate made before the start.
    pub last_error_p50_s: f64,
    pub last_error_p90_s: f64,
    pub last_within_10pct: f64,
    /// How many times an estimated job's estimate changed while it waited, on average.
    pub changes_mean: f64,
    /// Planning passes the replay made for the estimates.
    pub passes: u64,
}

/// One job's estimates (`EstimateReport::of`): its submit and first start (ms), whether it
/// waited (was still pending after the pass at its submit), and (when, estimated start; None:
/// no estimate) at its submit and at every change until it started.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EstimateSample {
    pub submit_ms: i64,
    pub start_ms: i64,
    pub waited: bool,
    pub records: Vec<(i64, Option<i64>)>,
}

impl EstimateReport {
    /// The figures of the jobs that started (`samples`; `passes` is left 0).
    pub fn of(samples: &[EstimateSample]) -> EstimateReport {
        let waited: Vec<&EstimateSample> = samples.iter().filter(|s| s.waited).collect();
        let error = |s: &EstimateSample, estimate: i64| {
            let error_ms = (s.start_ms - estimate).abs();
            let wait_ms = (s.start_ms - s.submit_ms).max(0);
            let within = if wait_ms == 0 { error_ms <= 1000 } else { error_ms * 10 <= wait_ms };
            (error_ms as f64 / 1000.0, within, estimate > s.start_ms)
        };
        let (mut first, mut last) = (Vec::new(), Vec::new());
        let (mut at_submit, mut changes) = (0, 0);
        for s in &waited {
            let mut estimates = s.records.iter().filter_map(|(at, e)| Some((*at, (*e)?)));
            let Some((at, estimate)) = estimates.next() else { continue };
            at_submit += usize::from(at == s.submit_ms);
            changes += s.records.len().saturating_sub(1);
            first.push(error(s, estimate));
            let (_, latest) = estimates.next_back().unwrap_or((at, estimate));
            last.push(error(s, latest));
        }
        let estimated = first.len();
        let share = |n: usize, of: usize| round3(n as f64 / of.max(1) as f64);
        let figures = |errors: &[(f64, bool, bool)]| {
            let mut e: Vec<f64> = errors.iter().map(|x| x.0).collect();
            e.sort_by(f64::total_cmp);
            let within = errors.iter().filter(|x| x.1).count();
            (round3(percentile(&e, 0.5)), round3(percentile(&e, 0.9)), share(within, errors.len()))
        };
        let (error_p50_s, error_p90_s, within_10pct) = figures(&first);
        let (last_error_p50_s, last_error_p90_s, last_within_10pct) = figures(&last);
        EstimateReport {
            jobs_waited: waited.len(),
            jobs_estimated: estimated,
            estimated_at_submit: at_submit,
            not_estimated: waited.len() - estimated,
            not_estimated_share: share(waited.len() - estimated, waited.len()),
            error_p50_s,
            error_p90_s,
            within_10pct,
            started_early: share(first.iter().filter(|x| x.2).count(), estimated),
            last_error_p50_s,
            last_error_p90_s,
            last_within_10pct,
            changes_mean: round3(changes as f64 / estimated.max(1) as f64),
            passes: 0,
        }
    }
}

/// One team's guarantee over a replay: GPU-hours it was entitled to (the smaller of its
/// guarantee and its demand) and held of them, how long it waited while owed (a waiting job
/// fit what was left of its guarantee), and the GPU-hours it lent and borrowed.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TeamFigures {
    pub account: String,
    pub guaranteed_gpus: u64,
    pub entitled_gpu_hours: f64,
    pub honoured_gpu_hours: f64,
    /// honoured / entitled (1 when it was never entitled to anything).
    pub honoured: f64,
    /// Owed while another team's borrowers held runs reclaim could take (what reclaim ends).
    pub owed_waits: usize,
    pub owed_wait_p50_s: f64,
    pub owed_wait_p99_s: f64,
    pub owed_wait_max_s: f64,
    /// Every owed wait, also those only unpreemptible borrowers or fragmentation prolonged.
    pub owed_any_waits: usize,
    pub owed_any_wait_p99_s: f64,
    pub owed_any_wait_max_s: f64,
    pub lent_gpu_hours: f64,
    pub borrowed_gpu_hours: f64,
}

/// How gangs were placed against a topology level: how many spanned more of its domains than
/// they had to (ceil(tasks / the largest domain's nodes)), and how long gangs waited.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct GangReport {
    pub level: String,
    pub gangs: usize,
    /// Gangs placed across more domains than the minimum, at their first start.
    pub spread: usize,
    pub spread_share: f64,
    pub wait_p50_s: f64,
    pub wait_p99_s: f64,
}

impl GangReport {
    /// From each gang's first start: (domains it got, the fewest it could, its wait in s).
    pub fn of(level: &str, starts: &[(usize, usize, f64)]) -> GangReport {
        let spread = starts.iter().filter(|(got, least, _)| got > least).count();
        let mut waits: Vec<f64> = starts.iter().map(|s| s.2).collect();
        waits.sort_by(f64::total_cmp);
        GangReport {
            level: level.to_string(),
            gangs: starts.len(),
            spread,
            spread_share: round3(spread as f64 / starts.len().max(1) as f64),
            wait_p50_s: round3(percentile(&waits, 0.5)),
            wait_p99_s: round3(percentile(&waits, 0.99)),
        }
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

impl Report {
    /// Figures at millisecond (and 1e-3) precision, so output is stable to read and compare.
    pub fn rounded(mut self) -> Report {
        let groups = self.by_qos.values_mut().chain(self.by_account.values_mut());
        for c in [&mut self.inference, &mut self.training, &mut self.whole_node].into_iter().chain(
            groups.map(|g| {
                g.lost_gpu_hours = round3(g.lost_gpu_hours);
                &mut g.summary
            }),
        ) {
            c.wait_s = Waits {
                p50: round3(c.wait_s.p50),
                p90: round3(c.wait_s.p90),
                p99: round3(c.wait_s.p99),
                max: round3(c.wait_s.max),
            };
            c.completion_s = round3(c.completion_s);
            c.slowdown = round3(c.slowdown);
        }
        self.utilization = round3(self.utilization);
        self.cpu_utilization = self.cpu_utilization.map(round3);
        self.memory_utilization = self.memory_utilization.map(round3);
        self.offered_load = round3(self.offered_load);
        self.load = round3(self.load);
        self.arrival_window_s = round3(self.arrival_window_s);
        self.redone_gpu_hours = round3(self.redone_gpu_hours);
        self.fragmentation = round3(self.fragmentation);
        self.makespan_s = round3(self.makespan_s);
        if let Some(b) = &mut self.burst {
            for x in [
                &mut b.instance_hours,
                &mut b.idle_instance_hours,
                &mut b.boot_instance_hours,
                &mut b.spend_usd,
                &mut b.spend_per_day_usd,
                &mut b.cloud_gpu_hours,
            ] {
                *x = round3(*x);
            }
        }
        self
    }

    /// A table of several reports side by side (one column each, named).
    pub fn table(named: &[(String, Report)]) -> String {
        let mut rows = rows();
        if named.iter().any(|(_, r)| r.burst.is_some()) {
            rows.extend(burst_rows());
        }
        if named.iter().any(|(_, r)| r.gangs.is_some()) {
            rows.extend(gang_rows());
        }
        if named.iter().any(|(_, r)| r.estimates.is_some()) {
            rows.extend(estimate_rows());
        }
        let mut rows: Vec<(String, Cell)> = rows.into_iter().map(|(l, f)| (l.to_string(), f)).collect();
        rows.extend(team_rows(named));
        let mut cells: Vec<Vec<String>> =
            vec![std::iter::once(String::new()).chain(named.iter().map(|(n, _)| n.clone())).collect()];
        for (label, f) in &rows {
            cells.push(std::iter::once(label.clone()).chain(named.iter().map(|(_, r)| f(r))).collect());
        }
        aligned(&cells)
    }
}

/// The table's rows every report has.
fn rows() -> Vec<(&'static str, Cell)> {
    vec![
        ("jobs", Box::new(|r: &Report| format!("{} ({} unfinished)", r.jobs, r.unfinished))),
        ("unfinished inference", Box::new(|r: &Report| unfinished(r, "inference"))),
        ("unfinished training", Box::new(|r: &Report| unfinished(r, "training"))),
        ("timed out (stopped at the time limit)", Box::new(|r: &Report| r.timed_out.to_string())),
        ("offered load", Box::new(|r: &Report| format!("{:.2}", r.offered_load))),
        (
            "arrival window (s) / compression",
            Box::new(|r: &Report| format!("{:.0} / {:.3}", r.arrival_window_s, r.load)),
        ),
        ("inference wait p50 / p99 / max (s)", Box::new(|r: &Report| waits(&r.inference))),
        ("training wait p50 / p99 / max (s)", Box::new(|r: &Report| waits(&r.training))),
        (
            "whole-node jobs: count, wait p50 / p99 / max (s)",
            Box::new(|r: &Report| format!("{}: {}", r.whole_node.jobs, waits(&r.whole_node))),
        ),
        (
            "inference / training slowdown",
            Box::new(|r: &Report| format!("{:.2} / {:.2}", r.inference.slowdown, r.training.slowdown)),
        ),
        ("GPU utilization", Box::new(|r: &Report| format!("{:.3}", r.utilization))),
        (
            "CPU utilization",
            Box::new(|r: &Report| r.cpu_utilization.map_or("-".into(), |u| format!("{u:.3}"))),
        ),
        (
            "memory utilization",
            Box::new(|r: &Report| r.memory_utilization.map_or("-".into(), |u| format!("{u:.3}"))),
        ),
        ("preemptions", Box::new(|r: &Report| r.preemptions.to_string())),
        ("redone GPU-hours", Box::new(|r: &Report| format!("{:.1}", r.redone_gpu_hours))),
        ("fragmentation", Box::new(|r: &Report| format!("{:.3}", r.fragmentation))),
        ("makespan (s)", Box::new(|r: &Report| format!("{:.0}", r.makespan_s))),
    ]
}

/// Per team of any report: its guarantee honoured, owed waits, and lending.
fn team_rows(named: &[(String, Report)]) -> Vec<(String, Cell)> {
    let mut names: Vec<String> =
        named.iter().flat_map(|(_, r)| r.teams.iter().map(|t| t.account.clone())).collect();
    names.sort();
    names.dedup();
    let mut rows: Vec<(String, Cell)> = Vec::new();
    for name in names {
        let cell = |f: fn(&TeamFigures) -> String| -> Cell {
            let name = name.clone();
            Box::new(move |r: &Report| r.teams.iter().find(|t| t.account == name).map_or("-".into(), f))
        };
        rows.push((
            format!("team {name} ({} GPUs): guaranteed GPU-h honoured", named_guarantee(named, &name)),
            cell(|t| {
                format!(
                    "{:.1} of {:.1} ({:.1} %)",
                    t.honoured_gpu_hours,
                    t.entitled_gpu_hours,
                    t.honoured * 100.0
                )
            }),
        ));
        rows.push((
            format!("team {name}: owed, reclaimable: waits, p50 / p99 / max (s)"),
            cell(|t| {
                format!(
                    "{}: {:.1} / {:.1} / {:.1}",
                    t.owed_waits, t.owed_wait_p50_s, t.owed_wait_p99_s, t.owed_wait_max_s
                )
            }),
        ));
        rows.push((
            format!("team {name}: owed, any: waits, p99 / max (s)"),
            cell(|t| {
                format!("{}: {:.1} / {:.1}", t.owed_any_waits, t.owed_any_wait_p99_s, t.owed_any_wait_max_s)
            }),
        ));
        rows.push((
            format!("team {name}: GPU-h lent / borrowed"),
            cell(|t| format!("{:.1} / {:.1}", t.lent_gpu_hours, t.borrowed_gpu_hours)),
        ));
    }
    rows
}

/// The guarantee of team `name` in the first report that has it.
fn named_guarantee(named: &[(String, Report)], name: &str) -> u64 {
    named.iter().flat_map(|(_, r)| &r.teams).find(|t| t.account == name).map_or(0, |t| t.guaranteed_gpus)
}

/// The rows of the gangs' figures against the topology.
fn gang_rows() -> Vec<(&'static str, Cell)> {
    let gangs = |f: fn(&GangReport) -> String| -> Cell {
        Box::new(move |r: &Report| r.gangs.as_ref().map_or("-".into(), f))
    };
    vec![
        (
            "gangs: spread past the fewest domains",
            gangs(|g| {
                format!("{} of {} ({:.1} %) per {}", g.spread, g.gangs, g.spread_share * 100.0, g.level)
            }),
        ),
        ("gang wait p50 / p99 (s)", gangs(|g| format!("{:.0} / {:.0}", g.wait_p50_s, g.wait_p99_s))),
    ]
}

/// The rows of the start estimates' figures.
fn estimate_rows() -> Vec<(&'static str, Cell)> {
    let estimates = |f: fn(&EstimateReport) -> String| -> Cell {
        Box::new(move |r: &Report| r.estimates.as_ref().map_or("-".into(), f))
    };
    // Errors only where some job was estimated.
    let errors = |f: fn(&EstimateReport) -> String| -> Cell {
        Box::new(move |r: &Report| {
            r.estimates.as_ref().filter(|e| e.jobs_estimated > 0).map_or("-".into(), f)
        })
    };
    vec![
        (
            "start estimates: jobs waited / estimated (at submit)",
            estimates(|e| format!("{} / {} ({})", e.jobs_waited, e.jobs_estimated, e.estimated_at_submit)),
        ),
        (
            "start estimates: not estimated (64 a pass)",
            estimates(|e| format!("{} ({:.1} %)", e.not_estimated, e.not_estimated_share * 100.0)),
        ),
        (
            "first estimate: error p50 / p90 (s), within 10 %",
            errors(|e| {
                format!("{:.0} / {:.0}, {:.1} %", e.error_p50_s, e.error_p90_s, e.within_10pct * 100.0)
            }),
        ),
        ("first estimate: later than the start", errors(|e| format!("{:.1} %", e.started_early * 100.0))),
        (
            "last estimate: error p50 / p90 (s), within 10 %",
            errors(|e| {
                format!(
                    "{:.0} / {:.0}, {:.1} %",
                    e.last_error_p50_s,
                    e.last_error_p90_s,
                    e.last_within_10pct * 100.0
                )
            }),
        ),
    ]
}

/// The rows of the cloud's figures (for runs that burst; `-` for a report without them).
fn burst_rows() -> Vec<(&'static str, Cell)> {
    let burst = |f: fn(&crate::cloud::BurstReport) -> String| -> Cell {
        Box::new(move |r: &Report| r.burst.as_ref().map_or("-".into(), f))
    };
    vec![
        (
            "cloud: launched / capacity errors / spot interruptions",
            burst(|b| format!("{} / {} / {}", b.instances_launched, b.launch_failures, b.spot_interruptions)),
        ),
        (
            "cloud: instance-hours (idle / booting)",
            burst(|b| {
                format!(
                    "{:.1} ({:.1} / {:.1})",
                    b.instance_hours, b.idle_instance_hours, b.boot_instance_hours
                )
            }),
        ),
        ("cloud: spend $ (per day)", burst(|b| format!("{:.2} ({:.2})", b.spend_usd, b.spend_per_day_usd))),
        ("cloud: jobs / GPU-hours", burst(|b| format!("{} / {:.1}", b.cloud_jobs, b.cloud_gpu_hours))),
    ]
}

/// Rows of cells as text, each column as wide as its widest cell, two spaces apart.
fn aligned(cells: &[Vec<String>]) -> String {
    let widths: Vec<usize> =
        (0..cells[0].len()).map(|c| cells.iter().map(|r| r[c].chars().count()).max().unwrap_or(0)).collect();
    cells
        .iter()
        .map(|r| {
            r.iter()
                .enumerate()
                .map(|(c, s)| format!("{s:<w$}", w = widths[c]))
                .collect::<Vec<_>>()
                .join("  ")
                .trim_end()
                .to_string()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// How one row of the table shows a report.
type Cell = Box<dyn Fn(&Report) -> String>;

fn waits(c: &ClassSummary) -> String {
    format!("{:.1} / {:.1} / {:.1}", c.wait_s.p50, c.wait_s.p99, c.wait_s.max)
}

/// A class's unfinished jobs by reason, largest count first: `3 never placeable: 8 GPUs; … |
/// 1 waiting: Priority`, or `0`.
fn unfinished(r: &Report, class: &str) -> String {
    let Some(by) = r.unfinished_by.get(class) else { return "0".into() };
    let mut groups: Vec<(&String, &usize)> = by.iter().collect();
    groups.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    groups.iter().map(|(why, n)| format!("{n} {why}")).collect::<Vec<_>>().join(" | ")
}

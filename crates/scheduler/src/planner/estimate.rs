//! Start estimates (Slurm's `squeue --start`), from the pass itself: the top blocked job's is
//! its reservation; each job behind it that does not fit gets the earliest start `earliest`
//! finds on the timeline of expected ends (time limits), reservations' windows and the
//! estimates made before it in the pass, whose GPUs hold from their start to their time limit
//! (no gaps: conservative). Backfilled jobs may still delay the jobs behind the top one: their
//! estimates are what would happen if nothing else changed.

use super::*;

/// The most jobs one pass estimates (each costs a look at every node).
pub const ESTIMATES_MAX: usize = 64;

/// A waiting job's expected start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Estimate {
    /// Unix ms; None: no estimate (`why` says why).
    pub start_ms: Option<i64>,
    /// What it waits for, e.g. "after job 812 ends (time limit) on n3".
    pub why: String,
}

/// What frees the last resource a job waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Cause {
    Now,
    /// A running job's time limit.
    Ends(JobId),
    /// A job this pass starts.
    Placed,
    /// A job estimated before it in this pass.
    Estimated(JobId),
    /// A reservation's window on the node ends (at this time).
    Window(i64),
}

impl<'s> Planning<'s> {
    /// The top blocked job's estimate is its reservation; its GPUs then hold for the
    /// estimates behind it.
    pub(super) fn estimate_reserved(&mut self, job: &Job) {
        let Some(res) = self.out.reservation.clone() else { return };
        if self.estimates_left == 0 {
            return;
        }
        self.estimates_left -= 1;
        let node = self.pass.nodes.iter().position(|n| n.name == res.node);
        let tasks: Vec<(usize, Vec<GpuIndex>)> = std::iter::once((res.node.as_str(), &res.gpus))
            .chain(res.more.iter().map(|t| (t.node.as_str(), &t.gpus)))
            .filter_map(|(n, g)| Some((self.pass.nodes.iter().position(|f| f.name == n)?, g.clone())))
            .collect();
        let estimate = self.worded(job, res.start_ms, res.why, node.unwrap_or(0), &tasks);
        self.out.estimates.insert(job.id, estimate);
    }

    /// A job behind the blocked one that does not fit now: its earliest start.
    pub(super) fn estimate(&mut self, job: &'s Job, tasks: usize) {
        if self.estimates_left == 0 || self.out.estimates.contains_key(&job.id) {
            return;
        }
        self.estimates_left -= 1;
        let estimate = match self.pass.earliest(job, tasks) {
            Some((start, options)) => {
                let last = options.iter().max_by_key(|o| o.0).map(|o| (o.1, o.3)).unwrap_or((0, Cause::Now));
                let held: Vec<(usize, Vec<GpuIndex>)> = options.into_iter().map(|o| (o.1, o.2)).collect();
                self.worded(job, start, last.1, last.0, &held)
            }
            None => Estimate {
                start_ms: None,
                why: "no node it may use will have its GPUs, CPUs and memory free together".into(),
            },
        };
        self.out.estimates.insert(job.id, estimate);
    }

    /// The estimate of `job` starting at `start` on `held` because of `cause` on the node at
    /// `pos`, in words; the GPUs it would take hold until its time limit for later estimates.
    fn worded(
        &mut self,
        job: &Job,
        start: i64,
        cause: Cause,
        pos: usize,
        held: &[(usize, Vec<GpuIndex>)],
    ) -> Estimate {
        let state = self.state;
        let horizon = (crate::validate::TIME_LIMIT_S_MAX as i64).saturating_mul(1000) / 2;
        let node = self.pass.nodes.get(pos).map_or("", |n| n.name);
        if start.saturating_sub(state.now_ms) >= horizon {
            let why = match cause {
                Cause::Ends(j) | Cause::Estimated(j) => format!("job {j} on {node} has no time limit"),
                _ => format!("it would start after jobs without a time limit end on {node}"),
            };
            return Estimate { start_ms: None, why };
        }
        let until = start.saturating_add(state.time_limit_ms(job));
        for (p, gpus) in held {
            let promised = self.pass.promised.entry(*p).or_default();
            promised.extend(gpus.iter().map(|g| (until, *g, job.id)));
        }
        let why = match cause {
            Cause::Now => "its resources are free; it waits its turn".to_string(),
            Cause::Ends(j) => format!("after job {j} ends (time limit) on {node}"),
            Cause::Placed => format!("after a job starting now ends (time limit) on {node}"),
            Cause::Estimated(j) => format!("after job {j}, expected to start before it, ends on {node}"),
            Cause::Window(at) => {
                // The reservation whose window on this node ends then.
                let ends_then = |r: &&crate::reservation::Reservation| {
                    r.holds_on(node).is_some() && r.window_at(state.now_ms).is_some_and(|w| w.1 == at)
                };
                let name = state.reservations.values().find(ends_then).map_or("", |r| &r.name);
                format!("after reservation {name}'s window ends on {node}")
            }
        };
        Estimate { start_ms: Some(start), why }
    }
}

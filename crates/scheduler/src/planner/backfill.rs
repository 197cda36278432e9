//! EASY backfill: the first job that does not fit gets a reservation (the nodes and GPUs where
//! it can start earliest, from the expected ends of what runs and what this pass placed); the
//! jobs behind it start only where they do not touch it or end before it starts.

use super::estimate::Cause;
use super::*;

/// Guaranteed jobs behind the blocked one that may look for a reclaim in one pass.
const RECLAIM_TRIES_MAX: usize = 8;

/// The most waiting jobs per pass whose reason names the job the free GPUs are held for (each
/// costs one more search).
const HELD_HINTS_MAX: usize = 64;

impl<'a> Pass<'a> {
    /// When each GPU of `model` that is busy on the node at `pos` is expected to be free, and
    /// the job that holds it till then: the running jobs' expected ends (not before now), the
    /// ends of this pass's placements, and the GPUs earlier estimates hold (`promised`).
    pub(super) fn busy_until(&self, pos: usize, model: Option<&str>) -> Vec<(i64, GpuIndex, Cause)> {
        let (state, n) = (self.state, self.nodes[pos].node);
        let now = state.now_ms;
        let running = n.usable_gpus().filter(|g| !n.claimed.contains_key(&g.index)).filter_map(|g| {
            let job = n.allocated.get(&g.index)?;
            let end = state.jobs.get(job).map(|j| state.expected_end_ms(j)).unwrap_or(now);
            Some((end.max(now), g.index, g.model.as_str(), Cause::Ends(*job)))
        });
        let placed =
            self.placed_until.get(&pos).into_iter().flatten().map(|(e, g, m)| (*e, *g, *m, Cause::Placed));
        let promised = self.promised.get(&pos).into_iter().flatten().filter_map(|(e, g, job)| {
            let model_of = n.info.gpus.iter().find(|x| x.index == *g)?.model.as_str();
            Some((*e, *g, model_of, Cause::Estimated(*job)))
        });
        let mut ends: Vec<(GpuIndex, i64, Cause)> = running
            .chain(placed)
            .chain(promised)
            .filter(|(_, _, m, _)| model_matches(model, m))
            .map(|(e, g, _, c)| (g, e, c))
            .collect();
        // A GPU listed twice (a victim's promised to a preemptor; an estimate's): the later end holds.
        ends.sort_unstable_by_key(|e| std::cmp::Reverse((e.0, e.1)));
        ends.dedup_by_key(|(g, _, _)| *g);
        ends.into_iter().map(|(g, e, c)| (e, g, c)).collect()
    }

    /// When the CPUs and memory held on the node at `pos` are expected to be free: the running
    /// tasks' expected ends (not before now) and the ends of this pass's placements.
    pub(super) fn cpu_mem_until(&self, pos: usize) -> impl Iterator<Item = (i64, CpuMem, Cause)> + '_ {
        let (state, n) = (self.state, self.nodes[pos].node);
        let now = state.now_ms;
        let running = n.held.iter().map(move |(id, cpu_mem)| {
            let end = state.jobs.get(id).map(|j| state.expected_end_ms(j)).unwrap_or(now);
            (end.max(now), *cpu_mem, Cause::Ends(*id))
        });
        running
            .chain(self.placed_cpu_mem.get(&pos).into_iter().flatten().map(|(e, c)| (*e, *c, Cause::Placed)))
    }

    /// The earliest time `count` GPUs of `model` and `want` CPUs and memory are free on the
    /// node at `pos` for a job running `limit_ms`, which GPUs, and what frees the last of them:
    /// before the window that closes the node if it ends by then, else once the window ends.
    pub(super) fn earliest_on(
        &self,
        pos: usize,
        count: usize,
        want: CpuMem,
        model: Option<&str>,
        limit_ms: i64,
    ) -> Option<(i64, Vec<GpuIndex>, Cause)> {
        let node = &self.nodes[pos];
        let now = self.state.now_ms;
        let promised = self.promised.get(&pos);
        let is_promised = |g: &GpuIndex| promised.is_some_and(|p| p.iter().any(|(_, x, _)| x == g));
        let mut gpus: Vec<GpuIndex> =
            node.usable(model, true).into_iter().map(|(i, _)| i).filter(|g| !is_promised(g)).collect();
        let (mut free, mut at, mut cause) = (node.free_cpu_mem, now, Cause::Now);
        let ask = TaskAsk { gpus: count, cpu_mem: want };
        let fit = |gpus: &Vec<GpuIndex>, free| fits(&NodeFree { gpus: gpus.len(), cpu_mem: free }, &ask);
        if fit(&gpus, free).is_err() {
            // Each running task's end frees its GPUs and its CPUs and memory.
            let mut ends: Vec<(i64, Option<GpuIndex>, CpuMem, Cause)> = self
                .busy_until(pos, model)
                .into_iter()
                .map(|(e, g, c)| (e, Some(g), CpuMem::default(), c))
                .collect();
            ends.extend(self.cpu_mem_until(pos).map(|(e, s, c)| (e, None, s, c)));
            ends.sort_by_key(|(e, g, _, _)| (*e, *g));
            for (end, gpu, cpu_mem, why) in ends {
                gpus.extend(gpu);
                free = free.plus(cpu_mem);
                (at, cause) = (end, why);
                if fit(&gpus, free).is_ok() {
                    break;
                }
            }
        }
        if fit(&gpus, free).is_ok() && at.saturating_add(limit_ms) <= node.closes_ms {
            gpus.truncate(count);
            return Some((at, gpus, cause));
        }
        if node.closes_ms == i64::MAX {
            return None;
        }
        // After the window: the node is whole again (what runs in it is taken to end with it),
        // if the job ends before the reservation's next window.
        let after = node.reopens_ms.max(now);
        if after.saturating_add(limit_ms) > node.next_closes_ms {
            return None;
        }
        let all: Vec<GpuIndex> =
            node.node.usable_gpus().filter(|g| model_matches(model, &g.model)).map(|g| g.index).collect();
        fit(&all, node.node.capacity()).ok()?;
        Some((after, all.into_iter().take(count).collect(), Cause::Window(after)))
    }

    /// The earliest time at which `job` could start, and where, from expected ends: per node the
    /// time it has the job's GPUs free; a gang of `tasks` takes the nodes free soonest and
    /// starts when the last of them is. With what frees the last of them.
    pub(super) fn earliest(&self, job: &'a Job, tasks: usize) -> Option<(i64, Vec<super::topo::ResOption>)> {
        let count = job.gpus() as usize;
        let want = job.spec.cpu_mem();
        let model = job.spec.gpu_model.as_deref();
        let part = self.state.partition_of(job);
        let cloud_ok = self.state.may_burst(job);
        let limit = self.state.time_limit_ms(job);
        let mut options: Vec<super::topo::ResOption> = Vec::new();
        for (pos, node) in self.nodes.iter().enumerate() {
            if !node.admits(part, cloud_ok, i64::MIN) || !want.fits(node.node.capacity()) {
                continue;
            }
            if let Some((at, gpus, cause)) = self.earliest_on(pos, count, want, model, limit) {
                options.push((at, pos, gpus, cause));
            }
        }
        if let Some(want) = self.topo_want(job).filter(|w| w.required && tasks > 1) {
            options = self.reserve_in_domains(options, tasks, &want);
        }
        if options.len() < tasks.max(1) {
            return None;
        }
        options.sort_unstable();
        options.truncate(tasks.max(1));
        let start_ms = options.iter().map(|o| o.0).max()?;
        Some((start_ms, options))
    }

    /// The top blocked job's reservation (EASY backfill): where `earliest` found, held.
    pub(super) fn reserve(&mut self, job: &'a Job, tasks: usize) -> Option<Reservation> {
        let (start_ms, options) = self.earliest(job, tasks)?;
        let want = job.spec.cpu_mem();
        let why = options.iter().max_by_key(|o| o.0).map(|o| o.3).unwrap_or(Cause::Now);
        let mut held = Vec::with_capacity(options.len());
        for (_, pos, gpus, _) in options {
            let node = &mut self.nodes[pos];
            self.by_free.remove(&node.key(pos));
            node.reserved = gpus.clone();
            node.reserved_cpu_mem = want;
            self.by_free.insert(node.key(pos));
            self.reserved_nodes.push(pos);
            held.push(TaskPlacement { node: node.name.to_string(), gpus });
        }
        let first = held.remove(0);
        Some(Reservation { job: job.id, node: first.node, gpus: first.gpus, more: held, start_ms, why })
    }
}

impl<'s> Planning<'s> {
    /// Why a job that does not fit behind the reservation waits: `PriorityHeld` where free GPUs
    /// would take it were it to end before the reserved job starts, else `Priority`.
    pub(super) fn held_for(&mut self, q: &Queued<'s>) -> PendingReason {
        let Some(res) = self.out.reservation.as_ref().filter(|_| self.held_hints < HELD_HINTS_MAX) else {
            return PendingReason::Priority;
        };
        self.held_hints += 1;
        let now = self.state.now_ms;
        let mut ask = Ask::of(q, 0, false, now.saturating_add(1), Some(res));
        ask.topo = self.state.jobs.get(&q.id).and_then(|j| self.pass.topo_want(j));
        let fits =
            if ask.tasks > 1 { self.pass.find_gang(&ask).is_some() } else { self.pass.find(&ask).is_some() };
        if fits && res.start_ms > now {
            let start_in_s = u64::try_from(res.start_ms - now).unwrap_or(0) / 1000;
            return PendingReason::PriorityHeld { job: res.job, start_in_s };
        }
        PendingReason::Priority
    }

    /// Whether `job` may reclaim: within its team's guarantee as the pass found it (what apply
    /// judges the preemption against: it is applied before the pass's placements). Also
    /// requiring it within with what the pass started (so the same pass's starts of its team
    /// cannot carry it past its guarantee) was measured and made owed waits longer (p99 25 s
    /// against 1 s in the simulation guide's replay); a team briefly over its guarantee that
    /// way is reclaimed from by the others.
    fn may_reclaim(&self, job: &Job) -> bool {
        crate::state::reclaims(&self.guarantees_now, job)
    }

    /// A job within its team's guarantee that does not fit, behind the blocked job: it may
    /// still reclaim what other teams borrowed (one preemption a pass, as for the first),
    /// away from the reservation's nodes so the top blocked job keeps its promise.
    /// At most `RECLAIM_TRIES_MAX` such jobs are tried a pass, and none while no team borrows.
    pub(super) fn reclaim_behind(&mut self, job: &'s Job, tasks: usize) -> bool {
        let g = &self.guarantees_now;
        if !g.active() || tasks > 1 || self.out.preemption.is_some() || !g.borrowed_anywhere() {
            return false;
        }
        if self.reclaim_tries >= RECLAIM_TRIES_MAX || !self.may_reclaim(job) {
            return false;
        }
        self.reclaim_tries += 1;
        let Some(p) = self.pass.preempt_for(job, g, &self.pass.reserved_nodes, true) else { return false };
        if let Some(pos) = self.pass.nodes.iter().position(|n| n.name == p.node) {
            self.pass.promise(pos, &p.gpus);
        }
        self.out.preemption = Some(p);
        true
    }

    /// The first job that does not fit: it gets a preemption when its QoS may preempt, else the
    /// reservation (EASY backfill); the jobs behind it only backfill from now on.
    pub(super) fn block(
        &mut self,
        job: &'s Job,
        tasks: usize,
        over_headroom: bool,
        q: &Queued,
    ) -> PendingReason {
        self.waiting = true;
        let preempt = (tasks == 1 && !over_headroom && self.out.preemption.is_none())
            .then(|| self.pass.preempt_for(job, &self.guarantees_now, &[], self.may_reclaim(job)))
            .flatten();
        if let Some(p) = preempt {
            // The GPUs it will use are kept from the jobs behind it in this pass: the free ones
            // taken, the victims' never free for a reservation.
            if let Some(pos) = self.pass.nodes.iter().position(|n| n.name == p.node) {
                self.pass.promise(pos, &p.gpus);
            }
            self.out.preemption = Some(p);
            // With backfill the reservation goes to the next job that cannot start, so a big
            // job behind a preemptor is not left to be starved by small ones.
            self.blocked = !self.config.backfill;
        } else {
            self.blocked = true;
            if self.config.backfill {
                self.out.reservation = self.pass.reserve(job, tasks);
                self.estimate_reserved(job);
                // A gang nothing could be reserved for is protected by backfilling nothing.
                self.strict = self.out.reservation.is_none() && tasks > 1;
            }
        }
        if over_headroom {
            PendingReason::Headroom
        } else {
            self.short_of(q)
        }
    }
}

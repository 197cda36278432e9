//! Placement of one job that passed the checks: a fraction, a gang or a single task on the
//! best node; a job that fits nowhere blocks (preemption or reservation) and is told why.

use super::*;

impl<'s> Planning<'s> {
    /// Places the job on free GPUs (backfilling around the reservation); when none fit, the
    /// first such job gets a preemption or the reservation.
    pub(super) fn place(&mut self, q: &Queued<'s>) -> Result<(), PendingReason> {
        let over_headroom = self.over_headroom(q);
        // Only now is the job itself read: to place it (a few thousand per pass at most).
        let Some(job) = self.state.jobs.get(&q.id) else { return Ok(()) };
        let tasks = q.tasks as usize;
        let ends_ms = self.state.now_ms.saturating_add(q.limit_ms);
        let cloud_ok = self.pass.has_cloud && self.state.may_burst(job);
        let res = self.out.reservation.as_ref();
        let mut ask = Ask::of(q, job.spec.gpu_milli, cloud_ok, ends_ms, res);
        ask.topo = self.pass.topo_want(job);
        if job.spec.gpu_milli > 0 {
            // A fraction that does not fit waits without holding back anything behind it.
            let milli = job.spec.gpu_milli;
            let (pos, gpu) =
                self.pass.find_fraction(&ask).filter(|_| !over_headroom).ok_or(PendingReason::Resources)?;
            self.pass.take_fraction(pos, gpu, milli, q.cpu_mem, ends_ms);
            self.count_started(q);
            let node = self.pass.nodes[pos].name.to_string();
            self.out.plan.placements.push(Placement { job: q.id, node, gpus: vec![gpu], more: Vec::new() });
            return Ok(());
        }
        let found = if over_headroom {
            None
        } else if tasks > 1 {
            self.pass.find_gang(&ask)
        } else {
            self.pass.find(&ask).map(|t| vec![t])
        };
        match found {
            Some(placed) => {
                self.start(q, placed, ends_ms);
                Ok(())
            }
            None if !self.blocked => {
                let topology = if over_headroom { None } else { self.topology_short(&ask) };
                let short = self.block(job, tasks, over_headroom, q);
                if topology.is_some() && self.out.reservation.is_none() {
                    // No domain will ever hold it (no reservation was possible): nothing
                    // behind it is kept from backfilling for it.
                    self.strict = false;
                }
                Err(topology.unwrap_or(short))
            }
            None if over_headroom => Err(PendingReason::Headroom),
            None => match self.topology_never(&ask) {
                Some(never) => Err(never),
                None if self.reclaim_behind(job, tasks) => Err(self.short_of(q)),
                None => {
                    self.estimate(job, tasks);
                    Err(self.held_for(q))
                }
            },
        }
    }

    /// Counts a starting job under its QoS limits and its array's task limit.
    pub(super) fn count_started(&mut self, q: &Queued) {
        if let Some(key) = q.usage {
            self.usage.add_at(key, q.total_gpus);
        }
        if let Some((array, _)) = q.array {
            *self.array_running.entry(array).or_insert(0) += 1;
        }
        if self.guarantees.active() && !q.claimed {
            self.guarantees.add(q.account, u64::from(q.total_gpus));
        }
    }

    /// Starts the job on the GPUs found (one entry per task).
    pub(super) fn start(&mut self, q: &Queued, placed: Vec<(usize, Vec<GpuIndex>)>, ends_ms: i64) {
        for (pos, gpus) in &placed {
            self.pass.take_task(*pos, gpus, q.cpu_mem, ends_ms);
        }
        self.count_started(q);
        let nodes = &self.pass.nodes;
        let mut tasks = placed.into_iter().map(|(pos, gpus)| (nodes[pos].name.to_string(), gpus));
        let Some((node, gpus)) = tasks.next() else { return };
        let more = tasks.map(|(node, gpus)| TaskPlacement { node, gpus }).collect();
        self.out.plan.placements.push(Placement { job: q.id, node, gpus, more });
    }

    /// For a gang whose required topology kept it from nodes enough to hold it: `Topology`.
    fn topology_short(&self, ask: &Ask) -> Option<PendingReason> {
        if let Some(never) = self.topology_never(ask) {
            return Some(never);
        }
        let want = ask.topo.as_ref().filter(|w| w.required && ask.tasks > 1)?;
        let candidates = self.pass.gang_candidates(ask);
        if candidates.len() < ask.tasks {
            return None;
        }
        let (level, largest) = self.pass.largest_domain(&candidates, want)?;
        let largest = largest.map(|(d, n)| (d, n as u32));
        Some(PendingReason::Topology { level, tasks: ask.tasks as u32, largest })
    }

    /// For a gang with a required topology that no domain (nor `max_domains` of them) could
    /// ever hold: `ReqNodeNotAvail` naming the largest, as for a gang wider than the cluster.
    fn topology_never(&self, ask: &Ask) -> Option<PendingReason> {
        let want = ask.topo.as_ref().filter(|w| w.required && ask.tasks > 1)?;
        let (level, largest) = self.pass.largest_domain_ever(ask, want)?;
        let most = largest.as_ref().map_or(0, |(_, n)| *n);
        if most.saturating_mul(want.max_domains) < ask.tasks {
            let why = match largest {
                Some((d, n)) => {
                    format!("no {level} has {} nodes for it (the largest: {level} {d}, {n})", ask.tasks)
                }
                None => format!("no node it may use has a {level}"),
            };
            return Some(PendingReason::ReqNodeNotAvail(why));
        }
        None
    }

    /// Which resource a job that fits nowhere lacks: GPUs (plain `Resources`, as Slurm says),
    /// or — where some node has its GPUs free — CPUs or memory.
    pub(super) fn short_of(&self, q: &Queued) -> PendingReason {
        if q.cpu_mem == CpuMem::default() {
            return PendingReason::Resources;
        }
        let part = q.part;
        let gpus_free = self.pass.nodes.iter().filter(|n| {
            part.is_none_or(|p| p.contains(n.name, n.labels))
                && n.usable_count(q.model, true) >= q.gpus as usize
        });
        match gpus_free.map(|n| q.cpu_mem.short_of(n.free_cpu_mem)).min() {
            Some(Some(what)) => PendingReason::ResourcesShort(what),
            _ => PendingReason::Resources,
        }
    }
}

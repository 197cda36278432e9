//! The checks sequence each pending job goes through, in order (`Planning::consider`): admitted
//! (held, dependencies, QoS and array limits), a claim, could it ever fit on an Up node, not
//! held back; then placement (`place`). The first check that fails is why it waits.

use super::*;

/// The most GPUs (of a model) one Up node (of a partition) has, per pair asked, for one pass.
pub(super) struct Largest<'s> {
    pub(super) state: &'s ClusterState,
    /// Without a model or partition constraint, from the pass's own node table.
    pub(super) any: u32,
    /// The most CPUs and the most memory one Up node has to grant.
    pub(super) cpu_mem: CpuMem,
    pub(super) by: Vec<(Option<String>, String, u32)>,
}

impl<'s> Largest<'s> {
    pub(super) fn new(state: &'s ClusterState, pass: &Pass) -> Largest<'s> {
        let any = pass.nodes.iter().map(|n| n.node.healthy_gpus().count() as u32).max().unwrap_or(0);
        let cpu_mem = pass.nodes.iter().fold(CpuMem::default(), |m, n| {
            let c = n.node.capacity();
            CpuMem { cpus: m.cpus.max(c.cpus), mem_mib: m.mem_mib.max(c.mem_mib) }
        });
        Largest { state, any, cpu_mem, by: Vec::new() }
    }

    fn up(&mut self, model: Option<&str>, part: Option<&Partition>) -> u32 {
        if model.is_none() && part.is_none_or(Partition::is_everything) {
            return self.any;
        }
        let part_name = part.map(|p| p.name.as_str()).unwrap_or("");
        let same_model = |k: &Option<String>| match (k, model) {
            (None, None) => true,
            (Some(a), Some(b)) => a.eq_ignore_ascii_case(b),
            _ => false,
        };
        if let Some((_, _, n)) = self.by.iter().find(|(m, p, _)| same_model(m) && p == part_name) {
            return *n;
        }
        let up = self.state.nodes.values().filter(|n| n.state == NodeState::Up);
        let inside = up.filter(|n| part.is_none_or(|p| p.contains(&n.info.name, &n.info.labels)));
        let count = |n: &Node| match model {
            None => n.healthy_gpus().count() as u32,
            Some(_) => n.healthy_gpus().filter(|g| model_matches(model, &g.model)).count() as u32,
        };
        let n = inside.map(count).max().unwrap_or(0);
        self.by.push((model.map(str::to_string), part_name.to_string(), n));
        n
    }
}

/// One planning pass over the queue: what it decided so far, and what holds jobs back.
pub(super) struct Planning<'s> {
    pub(super) state: &'s ClusterState,
    pub(super) config: PlanConfig,
    pub(super) pass: Pass<'s>,
    pub(super) largest: Largest<'s>,
    pub(super) usage: crate::limits::Usage,
    pub(super) array_running: std::collections::HashMap<JobId, u32, crate::limits::Fixed>,
    /// Team guarantees and what each team holds, counting the jobs this pass starts; and as
    /// the pass found them (a preemption is applied before the pass's placements, so its
    /// victims and preemptor are judged on what runs now).
    pub(super) guarantees: crate::guarantee::Guarantees,
    pub(super) guarantees_now: crate::guarantee::Guarantees,
    /// Guaranteed jobs behind the blocked one that looked for a reclaim this pass.
    pub(super) reclaim_tries: usize,
    pub(super) headroom: usize,
    pub(super) out: PlanOutput,
    /// Some job waits for resources (then no elastic job grows back).
    pub(super) waiting: bool,
    /// The reservation holder (or, without backfill, the first job that does not fit) is
    /// found: the jobs behind it only backfill.
    pub(super) blocked: bool,
    /// A gang nothing could be reserved for: no job behind it may start.
    pub(super) strict: bool,
    /// Jobs told which job holds the free GPUs (`held_for`), at most `HELD_HINTS_MAX` a pass.
    pub(super) held_hints: usize,
    /// Start estimates this pass may still make (`estimate`).
    pub(super) estimates_left: usize,
}

impl<'s> Planning<'s> {
    /// One pending job through the checks, in order; the first that fails is why it waits.
    pub(super) fn consider(&mut self, q: &Queued<'s>) -> Result<(), PendingReason> {
        self.admitted(q)?;
        if let Some(claim) = self.claim_of(q) {
            return self.start_claimed(q, claim);
        }
        if q.in_reservation {
            return self.place_in_window(q);
        }
        self.could_ever_fit(q)?;
        self.not_held_back(q)?;
        self.place(q)
    }

    /// Held jobs, unmet dependencies, QoS limits, array task limits and a team's borrow and
    /// lend limits: the job waits without holding back the jobs behind it.
    pub(super) fn admitted(&self, q: &Queued) -> Result<(), PendingReason> {
        if let Some(reason) = &q.waits {
            return Err(PendingReason::clone(reason));
        }
        if let (Some(key), Some(qos)) = (q.usage, q.qos) {
            self.usage.admits_at(key, qos, q.total_gpus)?;
        }
        match q.array {
            Some((array, limit)) if self.array_running.get(&array).copied().unwrap_or(0) >= limit => {
                return Err(PendingReason::JobArrayTaskLimit);
            }
            _ => {}
        }
        self.within_team_limits(q)
    }

    /// A borrower stays within its team's borrow limit and leaves other teams' unlent idle
    /// guarantees free (a preemptor with a claim already holds what it starts on).
    fn within_team_limits(&self, q: &Queued) -> Result<(), PendingReason> {
        let g = &self.guarantees;
        let total = u64::from(q.total_gpus);
        if !g.active() || q.claimed {
            return Ok(());
        }
        // Every guarantee of its chain bounds what it may borrow (an ancestor's too).
        g.borrow_check(q.account, total)?;
        if g.within(q.account, total) {
            return Ok(());
        }
        let (free, kept) = (self.pass.free_total as u64, g.kept_from(q.account));
        if kept > 0 && free >= total && free < kept + total {
            return Err(PendingReason::LendLimit);
        }
        Ok(())
    }

    /// The GPUs a preemptor (or a resized job) was promised, when it has a claim.
    pub(super) fn claim_of(&self, q: &Queued) -> Option<&'s crate::model::Claim> {
        let state = self.state;
        q.claimed.then(|| state.jobs.get(&q.id).and_then(|j| j.claim.as_ref())).flatten()
    }

    /// A claimed job starts exactly on its claimed GPUs, once they are all free.
    pub(super) fn start_claimed(
        &mut self,
        q: &Queued,
        claim: &crate::model::Claim,
    ) -> Result<(), PendingReason> {
        let state = self.state;
        let free = claim.tasks().all(|(node, gpus)| {
            state.nodes.get(node).is_some_and(|n| {
                n.state == NodeState::Up
                    && gpus.iter().all(|g| !n.allocated.contains_key(g) && n.usable(*g))
                    && self
                        .pass
                        .nodes
                        .iter()
                        .find(|f| f.name == node)
                        .is_some_and(|f| q.cpu_mem.fits(f.free_cpu_mem))
            })
        });
        if !free || self.out.plan.placements.len() >= PLAN_PLACEMENTS_MAX {
            return Err(PendingReason::Preempting);
        }
        self.count_started(q);
        for (node, _) in claim.tasks() {
            if let Some(pos) = self.pass.nodes.iter().position(|f| f.name == node) {
                self.pass.take_task(pos, &[], q.cpu_mem, i64::MAX);
            }
        }
        let placement = Placement {
            job: q.id,
            node: claim.node.clone(),
            gpus: claim.gpus.clone(),
            more: claim.more.clone(),
        };
        self.out.plan.placements.push(placement);
        Ok(())
    }

    /// Its partition's time limit, and whether any Up node (enough of them, for a gang) could
    /// ever hold it: a job that never could waits without holding back the others.
    pub(super) fn could_ever_fit(&mut self, q: &Queued) -> Result<(), PendingReason> {
        let (part, model) = (q.part, q.model);
        if over_wall(part, q.limit_ms) {
            return Err(PendingReason::PartitionTimeLimit);
        }
        let largest_up = self.largest.up(model, part);
        if let Some(what) = q.cpu_mem.short_of(self.largest.cpu_mem) {
            let (cpus, mem) = (q.cpu_mem.cpus, q.cpu_mem.mem_mib);
            let why = if what == "CPUs" {
                format!("no up node has {cpus} CPUs to grant")
            } else {
                format!("no up node has {mem} MiB of memory to grant")
            };
            return Err(PendingReason::ReqNodeNotAvail(why));
        }
        if q.gpus > largest_up {
            let of = model.map(|m| format!(" {m}")).unwrap_or_default();
            let within = part
                .filter(|p| !p.is_everything())
                .map(|p| format!(" in partition \"{}\"", p.name))
                .unwrap_or_default();
            let why = if largest_up == 0 {
                format!("no up node{within} has{of} GPUs")
            } else {
                format!("no up node{within} has {}{of} GPUs", q.gpus)
            };
            return Err(PendingReason::ReqNodeNotAvail(why));
        }
        let tasks = q.tasks as usize;
        if tasks > 1 {
            let total = largest_gang(self.state, q.gpus as usize, model, part);
            if total < tasks {
                let of = model.map(|m| format!("{m} ")).unwrap_or_default();
                let why = format!("only {total} up nodes have {} {of}GPUs; the job needs {tasks}", q.gpus);
                return Err(PendingReason::ReqNodeNotAvail(why));
            }
        }
        Ok(())
    }

    /// A full plan, or a blocked job ahead without backfill (or a gang nothing could be
    /// reserved for): it waits its turn.
    pub(super) fn not_held_back(&self, _q: &Queued) -> Result<(), PendingReason> {
        let full = self.out.plan.placements.len() >= PLAN_PLACEMENTS_MAX;
        if full || (self.blocked && (!self.config.backfill || self.strict)) {
            return Err(PendingReason::Priority);
        }
        Ok(())
    }

    /// Inference headroom: a job of a QoS without one leaves the headrooms' GPUs free — unless
    /// it could then never start (it needs more than the cluster keeps outside them). Held
    /// out, it is blocked like a job that does not fit (the first one gets the reservation, so
    /// big jobs are not starved by small ones behind the headroom).
    pub(super) fn over_headroom(&self, q: &Queued) -> bool {
        let total = q.total_gpus as usize;
        self.headroom > 0
            && q.qos.is_none_or(|qos| qos.headroom_gpus == 0)
            && self.pass.free_total < self.headroom + total
            && total + self.headroom <= self.pass.gpus_total
    }
}

/// How many Up nodes (in `part`) have at least `count` GPUs of `model` at all.
pub(super) fn largest_gang(
    state: &ClusterState,
    count: usize,
    model: Option<&str>,
    part: Option<&Partition>,
) -> usize {
    let up = state.nodes.values().filter(|n| n.state == NodeState::Up);
    up.filter(|n| part.is_none_or(|p| p.contains(&n.info.name, &n.info.labels)))
        .filter(|n| n.healthy_gpus().filter(|g| model_matches(model, &g.model)).count() >= count)
        .count()
}

//! Preemption: the cheapest set of running victims whose GPUs (and CPUs and memory) let the
//! top blocked job start now, and the runs to stop so the QoS headrooms have their idle GPUs.

use super::*;
use crate::guarantee::Guarantees;

/// A running job that could be stopped on a node: (its team's GPUs beyond its guarantee, most
/// first; whether it started within its guarantee; its cost alone, its priority, id, when it
/// frees its GPUs, the work it loses, the GPUs it gives, the CPUs and memory it gives).
type Victim = (std::cmp::Reverse<u64>, bool, u128, i64, JobId, u64, u128, Vec<GpuIndex>, CpuMem);

impl<'a> Pass<'a> {
    /// The cheapest preemption that lets `job` start now, in GPU-ms (`preemption_cost`): per
    /// node, victims its QoS may preempt, cheapest first (work lost — weighted by recent
    /// preemptions — plus the GPUs idle until they free; suspendable victims cost nothing),
    /// until enough GPUs are free; across nodes, the least total — the victims' lost work plus
    /// the preemptor's GPUs idle until the slowest victim is gone — then the fewest victims.
    /// With team guarantees, victims of the teams furthest over their guarantee go first, and
    /// no team of another is taken below its guarantee.
    /// Nodes at `avoid` (positions) are left alone (the reservation's).
    /// `may_reclaim`: the pass (with what it started) still counts `job` within its guarantee.
    pub(super) fn preempt_for(
        &self,
        job: &Job,
        g: &Guarantees,
        avoid: &[usize],
        may_reclaim: bool,
    ) -> Option<PreemptPlan> {
        let state = self.state;
        if !state.may_preempt(job, g, may_reclaim) {
            return None;
        }
        let ask = TaskAsk { gpus: job.gpus() as usize, cpu_mem: job.spec.cpu_mem() };
        let mut best: Option<((u128, usize, &str), PreemptPlan)> = None;
        let cloud_ok = state.may_burst(job);
        let ends_ms = state.now_ms.saturating_add(state.time_limit_ms(job));
        for (pos, node) in self.nodes.iter().enumerate() {
            // An open reservation's resources are taken from no one: its members use them.
            if node.in_window
                || avoid.contains(&pos)
                || !node.admits(state.partition_of(job), cloud_ok, ends_ms)
            {
                continue;
            }
            let Some((cost, plan)) = self.preempt_on(job, node, &ask, (g, may_reclaim)) else { continue };
            let key = (cost, plan.victims.len(), node.name);
            if best.as_ref().is_none_or(|(k, _)| key < *k) {
                best = Some((key, plan));
            }
        }
        best.map(|(_, p)| p)
    }

    /// The cheapest victims on `node` that let `job` (asking `ask`) start there now, with
    /// their cost: their lost work plus the preemptor's GPUs idle until the slowest is gone.
    fn preempt_on(
        &self,
        job: &Job,
        node: &FreeNode,
        ask: &TaskAsk,
        (g, may_reclaim): (&Guarantees, bool),
    ) -> Option<(u128, PreemptPlan)> {
        let state = self.state;
        let model = job.spec.gpu_model.as_deref();
        let mut gpus: Vec<GpuIndex> = node.usable(model, true).into_iter().map(|(i, _)| i).collect();
        let n = state.nodes.get(node.name)?;
        if !ask.cpu_mem.fits(n.capacity()) {
            return None;
        }
        let mut free = node.free_cpu_mem;
        let mut victims = Vec::new();
        let (mut lost, mut slowest) = (0u128, 0u64);
        let mut taken_from = BTreeMap::new();
        for (_, _, _, _, id, free_ms, lost_gpu_ms, freed, cpu_mem) in
            self.victims_on(job, node, n, ask, (g, may_reclaim))
        {
            if fits(&NodeFree { gpus: gpus.len(), cpu_mem: free }, ask).is_ok() {
                break;
            }
            let Some(victim) = state.jobs.get(&id) else { continue };
            let gives = state.gives_up(victim, freed.len().min(ask.gpus) as u32);
            if !g.take(&mut taken_from, &victim.spec.account, &job.spec.account, gives) {
                continue;
            }
            lost += lost_gpu_ms;
            slowest = slowest.max(free_ms);
            victims.push(id);
            gpus.extend(freed);
            free = free.plus(cpu_mem);
        }
        if fits(&NodeFree { gpus: gpus.len(), cpu_mem: free }, ask).is_err() || victims.is_empty() {
            return None;
        }
        gpus.truncate(ask.gpus);
        // What each victim gives once the GPUs are chosen (apply judges it the same way):
        // one that gives neither GPUs nor needed CPUs/memory is spared.
        let mut free = node.free_cpu_mem;
        victims.retain(|v| {
            let Some(victim) = state.jobs.get(v) else { return false };
            let taken = gpus.iter().filter(|g| n.allocated.get(g) == Some(v)).count() as u32;
            let freed = state.freed_by(victim, taken, n.held.get(v).copied().unwrap_or_default());
            free = free.plus(freed);
            taken > 0 || freed != CpuMem::default()
        });
        if !ask.cpu_mem.fits(free) || victims.is_empty() {
            return None;
        }
        let cost = lost + ask.gpus as u128 * u128::from(slowest);
        Some((cost, PreemptPlan { preemptor: job.id, node: node.name.to_string(), victims, gpus }))
    }

    /// The running jobs on `node` that `job` may preempt and that would give it something
    /// it needs (GPUs of its model, or the CPUs and memory it lacks), cheapest first.
    fn victims_on(
        &self,
        job: &Job,
        node: &FreeNode,
        n: &Node,
        ask: &TaskAsk,
        (g, may_reclaim): (&Guarantees, bool),
    ) -> Vec<Victim> {
        let (state, now) = (self.state, self.state.now_ms);
        let model = job.spec.gpu_model.as_deref();
        let (need, want) = (ask.gpus, ask.cpu_mem);
        let (name, free) = (node.name, node.free_cpu_mem);
        let mut candidates: Vec<Victim> = state
            .jobs_on(name)
            .into_iter()
            .filter(|v| state.preemptible(job, v, now, g, may_reclaim).is_ok())
            .filter_map(|v| {
                let a = v.allocation.as_ref()?;
                // The victim's task on this node (an elastic gang gives it up whole).
                let (_, _, task_gpus) = a.tasks().find(|(_, n, _)| *n == name)?;
                let mut matching: Vec<GpuIndex> = task_gpus
                    .iter()
                    .copied()
                    .filter(|g| n.info.gpus.iter().any(|x| x.index == *g && model_matches(model, &x.model)))
                    .filter(|g| !n.claimed.contains_key(g) && n.usable(*g))
                    .collect();
                // An elastic job gives only what it can spare above its minimum (it shrinks).
                if v.spec.is_elastic() {
                    let spare = v.gpus().saturating_sub(v.spec.min_gpus.unwrap_or(0)) as usize;
                    matching.drain(..matching.len().saturating_sub(spare));
                }
                let taken = matching.len().min(need) as u32;
                let held = n.held.get(&v.id).copied().unwrap_or_default();
                let freed = state.freed_by(v, taken, held);
                // A victim is worth stopping for the GPUs it frees, or for the CPUs and
                // memory it frees when those are what the preemptor lacks.
                if matching.is_empty() && (want.fits(free) || freed == CpuMem::default()) {
                    return None;
                }
                let cost = state.preemption_cost(v, taken, now);
                let alone = cost.lost_gpu_ms + need as u128 * u128::from(cost.free_ms);
                let over = if g.active() { g.over(&v.spec.account) } else { 0 };
                Some((
                    std::cmp::Reverse(over),
                    !a.borrowing,
                    alone,
                    v.priority,
                    v.id,
                    cost.free_ms,
                    cost.lost_gpu_ms,
                    matching,
                    freed,
                ))
            })
            .collect();
        candidates.sort();
        candidates
    }
}

/// The running jobs to stop so the headrooms get `shortfall` GPUs back: the ones that may be
/// stopped for them (`ClusterState::vacatable`), cheapest first by what stopping them costs
/// (`preemption_cost`: lost work, then time to free), until enough GPUs are freed.
pub(super) fn vacate_for(state: &ClusterState, shortfall: usize) -> Vec<JobId> {
    if shortfall == 0 {
        return Vec::new();
    }
    let now = state.now_ms;
    let up = state.nodes.values().filter(|n| n.state == NodeState::Up);
    let holders: BTreeSet<JobId> = up.flat_map(|n| n.allocated.values().copied()).collect();
    let up_gpus = state.up_gpus();
    let mut candidates: Vec<(u128, u64, i64, JobId, usize)> = holders
        .into_iter()
        .filter_map(|id| state.jobs.get(&id))
        .filter(|j| state.vacatable(j, now, up_gpus).is_ok())
        .map(|j| {
            let cost = state.preemption_cost(j, j.total_gpus(), now);
            (cost.lost_gpu_ms, cost.free_ms, j.priority, j.id, j.total_gpus() as usize)
        })
        .collect();
    candidates.sort_unstable();
    let mut victims = Vec::new();
    let mut freed = 0;
    // No team is taken below its guarantee for the headroom (apply judges it the same way).
    let (teams, mut taken) = (state.guarantees(), BTreeMap::new());
    for (_, _, _, id, gpus) in candidates {
        if freed >= shortfall {
            break;
        }
        let Some(account) = state.jobs.get(&id).map(|j| j.spec.account.as_str()) else { continue };
        if !teams.take(&mut taken, account, "", gpus as u64) {
            continue;
        }
        victims.push(id);
        freed += gpus;
    }
    victims
}

//! The planner: from a state snapshot, which pending jobs start where, and why the rest wait.
//!
//! Pure: the same state gives the same plan; "now" is the state's own clock. Jobs are taken by
//! priority, then submit order. Held jobs, jobs with unmet dependencies, jobs over a QoS limit
//! and jobs no Up node could ever hold wait without holding back the jobs behind them.
//!
//! **EASY backfill**: the first job that does not fit gets a reservation — the node and GPUs
//! where it can start earliest (a gang: the nodes, one per task, whose GPUs are all free
//! soonest), and that time, computed from the running (and just placed) jobs' time limits. A
//! lower-priority job may then start only where it does not touch the reserved GPUs, or if its
//! own time limit ends before the reservation starts. So backfill never
//! delays the top blocked job past its reservation (property-tested with virtual time).
//!
//! Placement is inside one node: the node whose free GPUs fit most tightly (packing keeps whole
//! nodes free for large jobs), and within it GPUs of one link group when possible. Nodes are
//! indexed by free-GPU count, so a pass over 100k jobs and 10k nodes stays cheap.
//!
//! ```text
//!   &ClusterState ──▶ plan ──▶ PlanOutput { plan (proposed through Raft), pending reasons }
//! ```

use std::collections::{BTreeMap, BTreeSet};

use crate::fit::{fits, NodeFree, TaskAsk};
use crate::model::TaskPlacement;
use crate::model::{model_matches, CpuMem, Gpu, GpuIndex, Job, JobId, JobState, Node, NodeState};
use crate::policy::Partition;
use crate::queue::{scan, Queued};
use crate::state::brief::JobIndex;
use crate::state::{over_wall, ClusterState, Placement, Plan, PLAN_PLACEMENTS_MAX};

mod fraction;
mod never;

pub use crate::reasons::PendingReason;
pub use never::{never_placeable, Unplaceable};

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PlanOutput {
    pub plan: Plan,
    /// Every pending job that is not in the plan, with its reason.
    pub pending: BTreeMap<JobId, PendingReason>,
    /// The top blocked job's reservation (EASY backfill), if any.
    pub reservation: Option<Reservation>,
    /// Running jobs to preempt so the top blocked job can start, if its QoS may.
    pub preemption: Option<PreemptPlan>,
    /// Shrunk elastic jobs to grow back onto free GPUs of their node, or shrunk elastic gangs
    /// onto free nodes (only when no job waits for resources).
    pub grow: Vec<GrowPlan>,
    /// Running jobs to stop so the QoS headrooms have their idle GPUs again (`Op::Vacate`),
    /// cheapest first; the last one makes up the shortfall.
    pub vacate: Vec<JobId>,
}

/// Growing one running elastic job back (proposed as `Op::Resize`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrowPlan {
    pub job: JobId,
    pub attempt: u32,
    /// Rank 0's GPUs after growing (a single-node job's whole new set).
    pub gpus: Vec<GpuIndex>,
    /// Gangs: ranks 1.. after growing (the current ones, then the new nodes).
    pub more: Vec<TaskPlacement>,
}

/// A proposed preemption: stop `victims` on `node` and give `gpus` there to `preemptor`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreemptPlan {
    pub preemptor: JobId,
    pub node: String,
    pub victims: Vec<JobId>,
    pub gpus: Vec<GpuIndex>,
}

/// Free GPUs of one Up node during planning.
struct FreeNode<'a> {
    name: &'a str,
    labels: &'a BTreeMap<String, String>,
    node: &'a Node,
    /// Each free GPU, ascending by index (inline up to 8, one pointer each: no allocation and
    /// little copying per node per pass for the usual node sizes).
    free: smallvec::SmallVec<[&'a Gpu; 8]>,
    /// GPUs the reservation holds on this node (free now or freed by then).
    reserved: Vec<GpuIndex>,
    /// CPUs and memory no job holds (less what this pass placed).
    free_cpu_mem: CpuMem,
    /// CPUs and memory the reservation holds on this node: a job that may not touch the
    /// reservation leaves this much of the free share alone.
    reserved_share: CpuMem,
    /// A cloud burst node: only burstable jobs may use it.
    cloud: bool,
}

impl FreeNode<'_> {
    /// What one task of `model` may take here (`fit::fits` judges it): the usable free GPUs,
    /// and the CPUs and memory beside what is held (and, unless `may_use_reserved`, beside
    /// the reservation's share too).
    fn free_for(&self, model: Option<&str>, may_use_reserved: bool) -> NodeFree {
        NodeFree {
            gpus: self.usable_count(model, may_use_reserved),
            cpu_mem: self.cpu_mem_for(may_use_reserved),
        }
    }

    /// The CPUs and memory beside what is held (and, unless `may_use_reserved`, beside the
    /// reservation's share).
    fn cpu_mem_for(&self, may_use_reserved: bool) -> CpuMem {
        if may_use_reserved {
            self.free_cpu_mem
        } else {
            self.free_cpu_mem.minus(self.reserved_share)
        }
    }

    /// How many free GPUs a job of `model` could use (no allocation; the hot path).
    fn usable_count(&self, model: Option<&str>, may_use_reserved: bool) -> usize {
        self.free
            .iter()
            .filter(|g| {
                model_matches(model, &g.model) && (may_use_reserved || !self.reserved.contains(&g.index))
            })
            .count()
    }

    /// Free GPUs usable by a job of `model`, excluding reserved ones unless `may_use_reserved`.
    fn usable(&self, model: Option<&str>, may_use_reserved: bool) -> Vec<(GpuIndex, u32)> {
        self.free
            .iter()
            .filter(|g| {
                model_matches(model, &g.model) && (may_use_reserved || !self.reserved.contains(&g.index))
            })
            .map(|g| (g.index, g.link_group))
            .collect()
    }

    /// The count the index files this node under: free GPUs outside the reservation.
    fn indexed_free(&self) -> usize {
        self.free.iter().filter(|g| !self.reserved.contains(&g.index)).count()
    }

    /// Where the pass's index files the node at `pos`.
    fn key(&self, pos: usize) -> FreeKey {
        (self.indexed_free(), std::cmp::Reverse(self.free_cpu_mem.cpus), pos)
    }
}

/// A node's place in the pass's index: (free GPUs outside the reservation, its free CPUs,
/// most first, its position).
type FreeKey = (usize, std::cmp::Reverse<u32>, usize);

/// A placement candidate: (usable GPUs, node position, the usable GPUs with their link groups).
type Candidate = (usize, usize, Vec<(GpuIndex, u32)>);

/// Where and when the top blocked job will start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reservation {
    pub job: JobId,
    pub node: String,
    pub gpus: Vec<GpuIndex>,
    /// A gang's other tasks: the nodes and GPUs held for ranks 1.. .
    pub more: Vec<TaskPlacement>,
    pub start_ms: i64,
}

/// Planner settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanConfig {
    /// EASY backfill on (else the first blocked job holds back everything behind it).
    pub backfill: bool,
}

impl Default for PlanConfig {
    fn default() -> Self {
        PlanConfig { backfill: true }
    }
}

/// Computes a plan for the current state with the default settings.
pub fn plan(state: &ClusterState) -> PlanOutput {
    plan_with(state, PlanConfig::default())
}

struct Pass<'a> {
    state: &'a ClusterState,
    nodes: Vec<FreeNode<'a>>,
    /// (free GPUs outside the reservation, most free CPUs first, node position): best fit is
    /// the first entry ≥ need whose CPUs suffice — within one free-GPU count, the first entry
    /// says whether any node of that count has the CPUs.
    by_free: BTreeSet<FreeKey>,
    /// Expected end of each GPU placed in this pass: node position → (end, gpu, model). The
    /// GPUs busy before the pass are read from the state only when a reservation needs them.
    placed_until: BTreeMap<usize, Vec<(i64, GpuIndex, &'a str)>>,
    /// Expected end of each task placed in this pass, with the CPUs and memory it holds.
    placed_share: BTreeMap<usize, Vec<(i64, CpuMem)>>,
    /// Some Up node is a cloud burst node (the index fast path must then filter).
    has_cloud: bool,
    /// Per GPU model constraint seen in this pass: the positions of the nodes with a GPU it matches.
    model_nodes: Vec<(Option<&'a str>, Vec<usize>)>,
    /// Positions of the nodes the reservation holds GPUs on.
    reserved_nodes: Vec<usize>,
    /// Free GPUs on all Up nodes (the QoS headrooms are kept out of these), and all their GPUs.
    free_total: usize,
    gpus_total: usize,
    /// Thousandths of a GPU given to fractions in this pass, by (node position, GPU).
    fractions: BTreeMap<(usize, GpuIndex), u32>,
}

impl<'a> Pass<'a> {
    fn new(state: &'a ClusterState) -> Pass<'a> {
        let mut nodes = Vec::with_capacity(state.nodes.len());
        for (name, n) in state.nodes.iter().filter(|(_, n)| n.state == NodeState::Up) {
            let free = if n.claimed.is_empty()
                && n.allocated.is_empty()
                && n.faults.is_empty()
                && n.shared.is_empty()
            {
                n.info.gpus.iter().collect()
            } else {
                n.usable_gpus()
                    .filter(|g| !n.claimed.contains_key(&g.index) && !n.allocated.contains_key(&g.index))
                    .collect()
            };
            let cloud = n.info.labels.contains_key(crate::burst::BURST_LABEL);
            nodes.push(FreeNode {
                name,
                labels: &n.info.labels,
                node: n,
                free,
                reserved: Vec::new(),
                free_cpu_mem: n.free_cpu_mem(),
                reserved_share: CpuMem::default(),
                cloud,
            });
        }
        // Sorted first, so building the set (which sorts its input) costs one linear pass.
        let mut keys: Vec<FreeKey> = nodes.iter().enumerate().map(|(pos, n)| n.key(pos)).collect();
        keys.sort_unstable();
        let by_free = keys.into_iter().collect();
        let has_cloud = nodes.iter().any(|n| n.cloud);
        let free_total = nodes.iter().map(|n| n.free.len()).sum();
        let gpus_total = nodes.iter().map(|n| n.node.info.gpus.len()).sum();
        Pass {
            state,
            nodes,
            by_free,
            placed_until: BTreeMap::new(),
            placed_share: BTreeMap::new(),
            has_cloud,
            model_nodes: Vec::new(),
            reserved_nodes: Vec::new(),
            free_total,
            gpus_total,
            fractions: BTreeMap::new(),
        }
    }

    /// Picks the best-fitting node and GPUs for `count` GPUs of `model` now. `ends_ms` is when
    /// the job would end: it may use reserved GPUs only if it ends before the reservation.
    /// Which entry of `model_nodes` lists the nodes with a GPU matching `model` (built on first use).
    fn nodes_with(&mut self, model: Option<&'a str>) -> usize {
        if let Some(i) = self.model_nodes.iter().position(|(m, _)| *m == model) {
            return i;
        }
        let matching = self
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.node.info.gpus.iter().any(|g| model_matches(model, &g.model)));
        self.model_nodes.push((model, matching.map(|(pos, _)| pos).collect()));
        self.model_nodes.len() - 1
    }

    #[allow(clippy::too_many_arguments)]
    fn find(
        &mut self,
        count: usize,
        share: CpuMem,
        model: Option<&'a str>,
        part: Option<&Partition>,
        cloud_ok: bool,
        ends_ms: i64,
        res: Option<&Reservation>,
    ) -> Option<(usize, Vec<GpuIndex>)> {
        let may_use_reserved = res.is_none_or(|r| ends_ms <= r.start_ms);
        let fast =
            model.is_none() && part.is_none_or(Partition::is_everything) && (cloud_ok || !self.has_cloud);
        let candidates = if fast { 0 } else { self.nodes_with(model) };
        let ask = TaskAsk { gpus: count, cpu_mem: share };
        let mut best: Option<Candidate> = None;
        let consider = |pos: usize, best: &mut Option<Candidate>| {
            let node = &self.nodes[pos];
            if part.is_some_and(|p| !p.contains(node.name, node.labels)) || (node.cloud && !cloud_ok) {
                return;
            }
            let may = may_use_reserved || node.reserved.is_empty();
            let free = node.free_for(model, may);
            // The first node of the fewest usable GPUs wins (in the index's order, or by position).
            if fits(&free, &ask).is_err() || best.as_ref().is_some_and(|(bn, _, _)| free.gpus >= *bn) {
                return;
            }
            *best = Some((free.gpus, pos, node.usable(model, may)));
        };
        if fast {
            // Best fit without a model or partition constraint: the first indexed node with enough free GPUs.
            // Nodes names are in BTreeMap order, so position order is name order (deterministic).
            let mut seen = 0;
            let mut from = (count, std::cmp::Reverse(u32::MAX), 0);
            'buckets: while let Some(&(free, _, _)) = self.by_free.range(from..).next() {
                for &(free_now, std::cmp::Reverse(cpus), pos) in
                    self.by_free.range((free, std::cmp::Reverse(u32::MAX), 0)..)
                {
                    // Entries with as many free GPUs as the best found or more cannot fit tighter.
                    if best.as_ref().is_some_and(|(n, _, _)| free_now >= *n) || seen > 64 {
                        break 'buckets;
                    }
                    if free_now != free || cpus < share.cpus {
                        // No node of this free-GPU count has the CPUs: the next count.
                        break;
                    }
                    consider(pos, &mut best);
                    seen += 1;
                }
                from = (free + 1, std::cmp::Reverse(u32::MAX), 0);
            }
            if res.is_some() && may_use_reserved {
                for &pos in &self.reserved_nodes {
                    consider(pos, &mut best);
                }
            }
        } else {
            for &pos in &self.model_nodes[candidates].1 {
                consider(pos, &mut best);
            }
        }
        best.map(|(_, pos, usable)| (pos, pick_gpus(&usable, count)))
    }

    fn take(&mut self, pos: usize, gpus: &[GpuIndex], until_ms: i64) {
        self.take_task(pos, gpus, CpuMem::default(), until_ms);
    }

    /// Takes one task's GPUs and CPUs/memory on the node at `pos` until `until_ms`.
    fn take_task(&mut self, pos: usize, gpus: &[GpuIndex], share: CpuMem, until_ms: i64) {
        let key = self.nodes[pos].key(pos);
        if share != CpuMem::default() {
            let node = &mut self.nodes[pos];
            node.free_cpu_mem = node.free_cpu_mem.minus(share);
            self.placed_share.entry(pos).or_default().push((until_ms, share));
        }
        let node = &mut self.nodes[pos];
        self.by_free.remove(&key);
        let taken: Vec<(GpuIndex, &'a str)> = node
            .free
            .iter()
            .filter(|g| gpus.contains(&g.index))
            .map(|g| (g.index, g.model.as_str()))
            .collect();
        let before = node.free.len();
        node.free.retain(|g| !gpus.contains(&g.index));
        self.free_total -= before - node.free.len();
        self.by_free.insert(node.key(pos));
        let busy = self.placed_until.entry(pos).or_default();
        for (gpu, model) in taken {
            busy.push((until_ms, gpu, model));
        }
    }

    /// Keeps `gpus` of the node at `pos` for a preemptor: free ones are taken, and none of them
    /// is counted as freed when a reservation is computed.
    fn promise(&mut self, pos: usize, gpus: &[GpuIndex]) {
        let free: Vec<GpuIndex> =
            gpus.iter().copied().filter(|g| self.nodes[pos].free.iter().any(|f| f.index == *g)).collect();
        self.take(pos, &free, i64::MAX);
        let node = self.nodes[pos].node;
        let busy = self.placed_until.entry(pos).or_default();
        for g in node.info.gpus.iter().filter(|g| gpus.contains(&g.index) && !free.contains(&g.index)) {
            busy.push((i64::MAX, g.index, g.model.as_str()));
        }
    }

    /// `tasks` distinct nodes with `count` usable GPUs each, tightest first (all or nothing).
    #[allow(clippy::too_many_arguments)]
    fn find_gang(
        &self,
        tasks: usize,
        count: usize,
        share: CpuMem,
        model: Option<&str>,
        part: Option<&Partition>,
        cloud_ok: bool,
        ends_ms: i64,
        res: Option<&Reservation>,
    ) -> Option<Vec<(usize, Vec<GpuIndex>)>> {
        let may_use_reserved = res.is_none_or(|r| ends_ms <= r.start_ms);
        let mut candidates: Vec<(usize, usize)> = self
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| part.is_none_or(|p| p.contains(n.name, n.labels)) && (cloud_ok || !n.cloud))
            .map(|(pos, n)| (n.free_for(model, may_use_reserved || n.reserved.is_empty()), pos))
            .filter(|(free, _)| fits(free, &TaskAsk { gpus: count, cpu_mem: share }).is_ok())
            .map(|(free, pos)| (free.gpus, pos))
            .collect();
        if candidates.len() < tasks {
            return None;
        }
        candidates.sort_unstable();
        let chosen = candidates.into_iter().take(tasks).map(|(_, pos)| {
            let n = &self.nodes[pos];
            (pos, pick_gpus(&n.usable(model, may_use_reserved || n.reserved.is_empty()), count))
        });
        Some(chosen.collect())
    }

    /// The cheapest preemption that lets `job` start now, in GPU-ms (`preemption_cost`): per
    /// node, victims its QoS may preempt, cheapest first (work lost — weighted by recent
    /// preemptions — plus the GPUs idle until they free; suspendable victims cost nothing),
    /// until enough GPUs are free; across nodes, the least total — the victims' lost work plus
    /// the preemptor's GPUs idle until the slowest victim is gone — then the fewest victims.
    fn preempt_for(&self, job: &Job) -> Option<PreemptPlan> {
        let state = self.state;
        let now = state.now_ms;
        if !state.may_preempt(job) {
            return None;
        }
        let need = job.gpus() as usize;
        let want = job.spec.cpu_mem();
        let ask = TaskAsk { gpus: need, cpu_mem: want };
        let model = job.spec.gpu_model.as_deref();
        let mut best: Option<((u128, usize, &str), PreemptPlan)> = None;
        let need_gpus = need as u128;
        let cloud_ok = state.may_burst(job);
        for node in &self.nodes {
            if state.partition_of(job).is_some_and(|p| !p.contains(node.name, node.labels))
                || (node.cloud && !cloud_ok)
            {
                continue;
            }
            let mut gpus: Vec<GpuIndex> = node.usable(model, true).into_iter().map(|(i, _)| i).collect();
            let Some(n) = state.nodes.get(node.name) else { continue };
            if !want.fits(n.capacity()) {
                continue;
            }
            let mut free = node.free_cpu_mem;
            type Candidate = (u128, i64, JobId, u64, u128, Vec<GpuIndex>, CpuMem);
            let mut candidates: Vec<Candidate> = state
                .jobs_on(node.name)
                .into_iter()
                .filter(|v| state.preemptible(job, v, now).is_ok())
                .filter_map(|v| {
                    let a = v.allocation.as_ref()?;
                    // The victim's task on this node (an elastic gang gives it up whole).
                    let (_, _, task_gpus) = a.tasks().find(|(_, n, _)| *n == node.name)?;
                    let mut matching: Vec<GpuIndex> = task_gpus
                        .iter()
                        .copied()
                        .filter(|g| {
                            n.info.gpus.iter().any(|x| x.index == *g && model_matches(model, &x.model))
                        })
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
                    let alone = cost.lost_gpu_ms + need_gpus * u128::from(cost.free_ms);
                    Some((alone, v.priority, v.id, cost.free_ms, cost.lost_gpu_ms, matching, freed))
                })
                .collect();
            candidates.sort();
            let mut victims = Vec::new();
            let (mut lost, mut slowest) = (0u128, 0u64);
            for (_, _, id, free_ms, lost_gpu_ms, freed, share) in candidates {
                if fits(&NodeFree { gpus: gpus.len(), cpu_mem: free }, &ask).is_ok() {
                    break;
                }
                lost += lost_gpu_ms;
                slowest = slowest.max(free_ms);
                victims.push(id);
                gpus.extend(freed);
                free = free.plus(share);
            }
            if fits(&NodeFree { gpus: gpus.len(), cpu_mem: free }, &ask).is_err() || victims.is_empty() {
                continue;
            }
            gpus.truncate(need);
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
            if !want.fits(free) || victims.is_empty() {
                continue;
            }
            let key = (lost + need_gpus * u128::from(slowest), victims.len(), node.name);
            if best.as_ref().is_none_or(|(k, _)| key < *k) {
                let plan = PreemptPlan { preemptor: job.id, node: node.name.to_string(), victims, gpus };
                best = Some((key, plan));
            }
        }
        best.map(|(_, p)| p)
    }

    /// Shrunk elastic jobs that can take free GPUs of their own node back (up to their full
    /// size), in id order; the GPUs are taken from this pass.
    fn grow_back(&mut self, elastic: &[&'a Job]) -> Vec<GrowPlan> {
        let state = self.state;
        let mut out = Vec::new();
        for &job in elastic {
            let Some(a) = job.allocation.as_ref() else { continue };
            if job.state != JobState::Running || a.stop.is_some() {
                continue;
            }
            if job.spec.is_elastic_gang() && job.tasks() < job.spec.tasks {
                if let Some(g) = self.grow_gang(job, a) {
                    out.push(g);
                }
                continue;
            }
            let shrunk = job.gpus() < job.spec.gpus && job.spec.is_elastic();
            if !shrunk || !a.more.is_empty() {
                continue;
            }
            let Some(pos) = self.nodes.iter().position(|n| n.name == a.node) else { continue };
            let usable = self.nodes[pos].usable(job.spec.gpu_model.as_deref(), false);
            let extra = pick_gpus(&usable, usable.len().min((job.spec.gpus - job.gpus()) as usize));
            if extra.is_empty() || !state.may_grow(job, job.gpus() + extra.len() as u32, 1) {
                continue;
            }
            self.take(pos, &extra, state.expected_end_ms(job));
            let mut gpus = a.gpus.clone();
            gpus.extend(extra);
            gpus.sort_unstable();
            out.push(GrowPlan { job: job.id, attempt: job.attempt, gpus, more: Vec::new() });
        }
        out
    }

    /// More nodes for a shrunk elastic gang: free nodes it does not use, tightest first.
    fn grow_gang(&mut self, job: &Job, a: &crate::model::Allocation) -> Option<GrowPlan> {
        let state = self.state;
        let (count, model) = (job.gpus() as usize, job.spec.gpu_model.as_deref());
        let part = state.partition_of(job);
        let cloud_ok = state.may_burst(job);
        let mut candidates: Vec<(usize, usize)> = self
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| a.rank_on(n.name).is_none())
            .filter(|(_, n)| part.is_none_or(|p| p.contains(n.name, n.labels)) && (cloud_ok || !n.cloud))
            .map(|(pos, n)| (NodeFree { gpus: n.usable_count(model, false), cpu_mem: n.free_cpu_mem }, pos))
            .filter(|(free, _)| fits(free, &TaskAsk { gpus: count, cpu_mem: job.spec.cpu_mem() }).is_ok())
            .map(|(free, pos)| (free.gpus, pos))
            .collect();
        candidates.sort_unstable();
        let want = (job.spec.tasks - job.tasks()) as usize;
        let chosen: Vec<usize> = candidates.into_iter().take(want).map(|(_, pos)| pos).collect();
        if chosen.is_empty() || !state.may_grow(job, job.gpus(), job.tasks() + chosen.len() as u32) {
            return None;
        }
        let mut more = a.more.clone();
        for pos in chosen {
            let gpus = pick_gpus(&self.nodes[pos].usable(model, false), count);
            self.take_task(pos, &gpus, job.spec.cpu_mem(), state.expected_end_ms(job));
            more.push(TaskPlacement { node: self.nodes[pos].name.to_string(), gpus });
        }
        Some(GrowPlan { job: job.id, attempt: job.attempt, gpus: a.gpus.clone(), more })
    }

    /// When each GPU of `model` that is busy on the node at `pos` is expected to be free: the
    /// running jobs' expected ends (not before now) and the ends of this pass's placements.
    fn busy_until(&self, pos: usize, model: Option<&str>) -> Vec<(i64, GpuIndex)> {
        let (state, n) = (self.state, self.nodes[pos].node);
        let now = state.now_ms;
        let running = n.usable_gpus().filter(|g| !n.claimed.contains_key(&g.index)).filter_map(|g| {
            let job = n.allocated.get(&g.index)?;
            let end = state.jobs.get(job).map(|j| state.expected_end_ms(j)).unwrap_or(now);
            Some((end.max(now), g.index, g.model.as_str()))
        });
        let placed = self.placed_until.get(&pos).into_iter().flatten().copied();
        let mut ends: Vec<(GpuIndex, i64)> = running
            .chain(placed)
            .filter(|(_, _, m)| model_matches(model, m))
            .map(|(e, g, _)| (g, e))
            .collect();
        // A victim's GPU promised to a preemptor in this pass is listed twice: the later end holds.
        ends.sort_unstable_by(|a, b| b.cmp(a));
        ends.dedup_by_key(|(g, _)| *g);
        ends.into_iter().map(|(g, e)| (e, g)).collect()
    }

    /// When the CPUs and memory held on the node at `pos` are expected to be free: the running
    /// tasks' expected ends (not before now) and the ends of this pass's placements.
    fn shares_until(&self, pos: usize) -> impl Iterator<Item = (i64, CpuMem)> + '_ {
        let (state, n) = (self.state, self.nodes[pos].node);
        let now = state.now_ms;
        let running = n.held.iter().map(move |(id, share)| {
            let end = state.jobs.get(id).map(|j| state.expected_end_ms(j)).unwrap_or(now);
            (end.max(now), *share)
        });
        running.chain(self.placed_share.get(&pos).into_iter().flatten().copied())
    }

    /// The earliest time at which `job` could start, and where, from expected ends: per node the
    /// time it has the job's GPUs free; a gang of `tasks` takes the nodes free soonest and
    /// starts when the last of them is.
    fn reserve(&mut self, job: &Job, tasks: usize) -> Option<Reservation> {
        let now = self.state.now_ms;
        let count = job.gpus() as usize;
        let want = job.spec.cpu_mem();
        let model = job.spec.gpu_model.as_deref();
        let part = self.state.partition_of(job);
        let cloud_ok = self.state.may_burst(job);
        let mut options: Vec<(i64, usize, Vec<GpuIndex>)> = Vec::new();
        for (pos, node) in self.nodes.iter().enumerate() {
            if part.is_some_and(|p| !p.contains(node.name, node.labels))
                || (node.cloud && !cloud_ok)
                || !want.fits(node.node.capacity())
            {
                continue;
            }
            let mut gpus: Vec<GpuIndex> = node.usable(model, true).into_iter().map(|(i, _)| i).collect();
            let mut free = node.free_cpu_mem;
            let mut at = now;
            let ask = TaskAsk { gpus: count, cpu_mem: want };
            let fit = |gpus: &Vec<GpuIndex>, free| fits(&NodeFree { gpus: gpus.len(), cpu_mem: free }, &ask);
            if fit(&gpus, free).is_err() {
                // Each running task's end frees its GPUs and its CPUs and memory.
                let mut ends: Vec<(i64, Option<GpuIndex>, CpuMem)> = self
                    .busy_until(pos, model)
                    .into_iter()
                    .map(|(e, g)| (e, Some(g), CpuMem::default()))
                    .collect();
                ends.extend(self.shares_until(pos).map(|(e, s)| (e, None, s)));
                ends.sort();
                for (end, gpu, share) in ends {
                    gpus.extend(gpu);
                    free = free.plus(share);
                    at = end;
                    if fit(&gpus, free).is_ok() {
                        break;
                    }
                }
            }
            if fit(&gpus, free).is_err() {
                continue;
            }
            gpus.truncate(count);
            options.push((at, pos, gpus));
        }
        if options.len() < tasks.max(1) {
            return None;
        }
        options.sort_unstable();
        options.truncate(tasks.max(1));
        let start_ms = options.iter().map(|(at, _, _)| *at).max()?;
        let mut held = Vec::with_capacity(options.len());
        for (_, pos, gpus) in options {
            let node = &mut self.nodes[pos];
            self.by_free.remove(&node.key(pos));
            node.reserved = gpus.clone();
            node.reserved_share = want;
            self.by_free.insert(node.key(pos));
            self.reserved_nodes.push(pos);
            held.push(TaskPlacement { node: node.name.to_string(), gpus });
        }
        let first = held.remove(0);
        Some(Reservation { job: job.id, node: first.node, gpus: first.gpus, more: held, start_ms })
    }
}

/// Computes a plan for the current state: each pending job, by priority, goes through the
/// checks of `Planning::consider` (Nomad's feasibility checks, then placement): the first that
/// fails records its pending reason.
pub fn plan_with(state: &ClusterState, config: PlanConfig) -> PlanOutput {
    // A fresh job index when apply kept none (declared first: the pass outlives nothing of it).
    let built;
    let index = match state.job_index.current(&state.jobs) {
        Some(index) => index,
        None => {
            built = JobIndex::build(&state.jobs);
            &built
        }
    };
    let mut scan = scan(state, index);
    let headroom = state.headroom_gpus();
    // Nothing waits, nothing may grow back, no headroom to refill: no node table to build.
    if scan.len() == 0 && scan.elastic.is_empty() && headroom == 0 {
        return PlanOutput::default();
    }
    let pass = Pass::new(state);
    let largest = Largest::new(state, &pass);
    let mut p = Planning {
        state,
        config,
        pass,
        largest,
        usage: std::mem::take(&mut scan.usage),
        array_running: std::mem::take(&mut scan.array_running),
        headroom,
        out: PlanOutput::default(),
        waiting: false,
        blocked: false,
        held_hints: 0,
        strict: false,
    };
    // Reasons are kept by queue entry (entries are in id order), so the map is built in one
    // ordered sweep at the end: far cheaper than 100k inserts, and no sort.
    let mut reasons: Vec<Option<PendingReason>> = vec![None; scan.len()];
    for (entry, q) in scan.queue() {
        reasons[entry] = p.consider(q).err();
    }
    if !p.waiting {
        p.out.grow = p.pass.grow_back(&scan.elastic);
    }
    if headroom > 0 && p.out.preemption.is_none() {
        let shortfall = headroom.saturating_sub(p.pass.free_total + state.headroom_freeing());
        p.out.vacate = vacate_for(state, shortfall);
    }
    let mut out = p.out;
    out.pending = scan.ids().zip(reasons).filter_map(|(id, r)| Some((id, r?))).collect();
    out
}

/// The most GPUs (of a model) one Up node (of a partition) has, per pair asked, for one pass.
struct Largest<'s> {
    state: &'s ClusterState,
    /// Without a model or partition constraint, from the pass's own node table.
    any: u32,
    /// The most CPUs and the most memory one Up node has to grant.
    share: CpuMem,
    by: Vec<(Option<String>, String, u32)>,
}

impl<'s> Largest<'s> {
    fn new(state: &'s ClusterState, pass: &Pass) -> Largest<'s> {
        let any = pass.nodes.iter().map(|n| n.node.healthy_gpus().count() as u32).max().unwrap_or(0);
        let share = pass.nodes.iter().fold(CpuMem::default(), |m, n| {
            let c = n.node.capacity();
            CpuMem { cpus: m.cpus.max(c.cpus), mem_mib: m.mem_mib.max(c.mem_mib) }
        });
        Largest { state, any, share, by: Vec::new() }
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
struct Planning<'s> {
    state: &'s ClusterState,
    config: PlanConfig,
    pass: Pass<'s>,
    largest: Largest<'s>,
    usage: crate::limits::Usage,
    array_running: std::collections::HashMap<JobId, u32, crate::limits::Fixed>,
    headroom: usize,
    out: PlanOutput,
    /// Some job waits for resources (then no elastic job grows back).
    waiting: bool,
    /// The reservation holder (or, without backfill, the first job that does not fit) is
    /// found: the jobs behind it only backfill.
    blocked: bool,
    /// A gang nothing could be reserved for: no job behind it may start.
    strict: bool,
    /// Jobs told which job holds the free GPUs (`held_for`), at most `HELD_HINTS_MAX` a pass.
    held_hints: usize,
}

/// The most waiting jobs per pass whose reason names the job the free GPUs are held for (each
/// costs one more search).
const HELD_HINTS_MAX: usize = 64;

impl<'s> Planning<'s> {
    /// One pending job through the checks, in order; the first that fails is why it waits.
    fn consider(&mut self, q: &Queued<'s>) -> Result<(), PendingReason> {
        self.admitted(q)?;
        if let Some(claim) = self.claim_of(q) {
            return self.start_claimed(q, claim);
        }
        self.could_ever_fit(q)?;
        self.not_held_back(q)?;
        self.place(q)
    }

    /// Held jobs, unmet dependencies, QoS limits and array task limits: the job waits without
    /// holding back the jobs behind it.
    fn admitted(&self, q: &Queued) -> Result<(), PendingReason> {
        if let Some(reason) = &q.waits {
            return Err(PendingReason::clone(reason));
        }
        if let (Some(key), Some(qos)) = (q.usage, q.qos) {
            self.usage.admits_at(key, qos, q.total_gpus)?;
        }
        match q.array {
            Some((array, limit)) if self.array_running.get(&array).copied().unwrap_or(0) >= limit => {
                Err(PendingReason::JobArrayTaskLimit)
            }
            _ => Ok(()),
        }
    }

    /// The GPUs a preemptor (or a resized job) was promised, when it has a claim.
    fn claim_of(&self, q: &Queued) -> Option<&'s crate::model::Claim> {
        let state = self.state;
        q.claimed.then(|| state.jobs.get(&q.id).and_then(|j| j.claim.as_ref())).flatten()
    }

    /// A claimed job starts exactly on its claimed GPUs, once they are all free.
    fn start_claimed(&mut self, q: &Queued, claim: &crate::model::Claim) -> Result<(), PendingReason> {
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
                        .is_some_and(|f| q.share.fits(f.free_cpu_mem))
            })
        });
        if !free || self.out.plan.placements.len() >= PLAN_PLACEMENTS_MAX {
            return Err(PendingReason::Preempting);
        }
        self.count_started(q);
        for (node, _) in claim.tasks() {
            if let Some(pos) = self.pass.nodes.iter().position(|f| f.name == node) {
                self.pass.take_task(pos, &[], q.share, i64::MAX);
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
    fn could_ever_fit(&mut self, q: &Queued) -> Result<(), PendingReason> {
        let (part, model) = (q.part, q.model);
        if over_wall(part, q.limit_ms) {
            return Err(PendingReason::PartitionTimeLimit);
        }
        let largest_up = self.largest.up(model, part);
        if let Some(what) = q.share.short_of(self.largest.share) {
            let (cpus, mem) = (q.share.cpus, q.share.mem_mib);
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
    fn not_held_back(&self, _q: &Queued) -> Result<(), PendingReason> {
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
    fn over_headroom(&self, q: &Queued) -> bool {
        let total = q.total_gpus as usize;
        self.headroom > 0
            && q.qos.is_none_or(|qos| qos.headroom_gpus == 0)
            && self.pass.free_total < self.headroom + total
            && total + self.headroom <= self.pass.gpus_total
    }

    /// Places the job on free GPUs (backfilling around the reservation); when none fit, the
    /// first such job gets a preemption or the reservation.
    fn place(&mut self, q: &Queued<'s>) -> Result<(), PendingReason> {
        let over_headroom = self.over_headroom(q);
        // Only now is the job itself read: to place it (a few thousand per pass at most).
        let Some(job) = self.state.jobs.get(&q.id) else { return Ok(()) };
        let (tasks, gpus, model, part) = (q.tasks as usize, q.gpus as usize, q.model, q.part);
        let ends_ms = self.state.now_ms.saturating_add(q.limit_ms);
        let cloud_ok = self.pass.has_cloud && self.state.may_burst(job);
        let res = self.out.reservation.as_ref();
        if job.spec.gpu_milli > 0 {
            // A fraction that does not fit waits without holding back anything behind it.
            let milli = job.spec.gpu_milli;
            let (pos, gpu) = self
                .pass
                .find_fraction(milli, q.share, model, part, cloud_ok, ends_ms, res)
                .filter(|_| !over_headroom)
                .ok_or(PendingReason::Resources)?;
            self.pass.take_fraction(pos, gpu, milli, q.share, ends_ms);
            self.count_started(q);
            let node = self.pass.nodes[pos].name.to_string();
            self.out.plan.placements.push(Placement { job: q.id, node, gpus: vec![gpu], more: Vec::new() });
            return Ok(());
        }
        let found = if over_headroom {
            None
        } else if tasks > 1 {
            self.pass.find_gang(tasks, gpus, q.share, model, part, cloud_ok, ends_ms, res)
        } else {
            self.pass.find(gpus, q.share, model, part, cloud_ok, ends_ms, res).map(|t| vec![t])
        };
        match found {
            Some(placed) => {
                self.start(q, placed, ends_ms);
                Ok(())
            }
            None if !self.blocked => Err(self.block(job, tasks, over_headroom, q)),
            None if over_headroom => Err(PendingReason::Headroom),
            None => Err(self.held_for(q)),
        }
    }

    /// Why a job that does not fit behind the reservation waits: `PriorityHeld` where free GPUs
    /// would take it were it to end before the reserved job starts, else `Priority`.
    fn held_for(&mut self, q: &Queued<'s>) -> PendingReason {
        let Some(res) = self.out.reservation.as_ref().filter(|_| self.held_hints < HELD_HINTS_MAX) else {
            return PendingReason::Priority;
        };
        self.held_hints += 1;
        let now = self.state.now_ms;
        let (tasks, gpus) = (q.tasks as usize, q.gpus as usize);
        let soon = now.saturating_add(1);
        let fits = if tasks > 1 {
            self.pass.find_gang(tasks, gpus, q.share, q.model, q.part, false, soon, Some(res)).is_some()
        } else {
            self.pass.find(gpus, q.share, q.model, q.part, false, soon, Some(res)).is_some()
        };
        if fits && res.start_ms > now {
            let start_in_s = u64::try_from(res.start_ms - now).unwrap_or(0) / 1000;
            return PendingReason::PriorityHeld { job: res.job, start_in_s };
        }
        PendingReason::Priority
    }

    /// Counts a starting job under its QoS limits and its array's task limit.
    fn count_started(&mut self, q: &Queued) {
        if let Some(key) = q.usage {
            self.usage.add_at(key, q.total_gpus);
        }
        if let Some((array, _)) = q.array {
            *self.array_running.entry(array).or_insert(0) += 1;
        }
    }

    /// Starts the job on the GPUs found (one entry per task).
    fn start(&mut self, q: &Queued, placed: Vec<(usize, Vec<GpuIndex>)>, ends_ms: i64) {
        for (pos, gpus) in &placed {
            self.pass.take_task(*pos, gpus, q.share, ends_ms);
        }
        self.count_started(q);
        let nodes = &self.pass.nodes;
        let mut tasks = placed.into_iter().map(|(pos, gpus)| (nodes[pos].name.to_string(), gpus));
        let Some((node, gpus)) = tasks.next() else { return };
        let more = tasks.map(|(node, gpus)| TaskPlacement { node, gpus }).collect();
        self.out.plan.placements.push(Placement { job: q.id, node, gpus, more });
    }

    /// The first job that does not fit: it gets a preemption when its QoS may preempt, else the
    /// reservation (EASY backfill); the jobs behind it only backfill from now on.
    fn block(&mut self, job: &Job, tasks: usize, over_headroom: bool, q: &Queued) -> PendingReason {
        self.waiting = true;
        let preempt = (tasks == 1 && !over_headroom && self.out.preemption.is_none())
            .then(|| self.pass.preempt_for(job))
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

    /// Which resource a job that fits nowhere lacks: GPUs (plain `Resources`, as Slurm says),
    /// or — where some node has its GPUs free — CPUs or memory.
    fn short_of(&self, q: &Queued) -> PendingReason {
        if q.share == CpuMem::default() {
            return PendingReason::Resources;
        }
        let part = q.part;
        let gpus_free = self.pass.nodes.iter().filter(|n| {
            part.is_none_or(|p| p.contains(n.name, n.labels))
                && n.usable_count(q.model, true) >= q.gpus as usize
        });
        match gpus_free.map(|n| q.share.short_of(n.free_cpu_mem)).min() {
            Some(Some(what)) => PendingReason::ResourcesShort(what),
            _ => PendingReason::Resources,
        }
    }
}

/// The running jobs to stop so the headrooms get `shortfall` GPUs back: the ones that may be
/// stopped for them (`ClusterState::vacatable`), cheapest first by what stopping them costs
/// (`preemption_cost`: lost work, then time to free), until enough GPUs are freed.
fn vacate_for(state: &ClusterState, shortfall: usize) -> Vec<JobId> {
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
    for (_, _, _, id, gpus) in candidates {
        if freed >= shortfall {
            break;
        }
        victims.push(id);
        freed += gpus;
    }
    victims
}

/// How many Up nodes (in `part`) have at least `count` GPUs of `model` at all.
fn largest_gang(state: &ClusterState, count: usize, model: Option<&str>, part: Option<&Partition>) -> usize {
    let up = state.nodes.values().filter(|n| n.state == NodeState::Up);
    up.filter(|n| part.is_none_or(|p| p.contains(&n.info.name, &n.info.labels)))
        .filter(|n| n.healthy_gpus().filter(|g| model_matches(model, &g.model)).count() >= count)
        .count()
}

/// Chooses `count` GPUs from `free`: all from the tightest-fitting link group when one can hold
/// them, else the lowest indices.
fn pick_gpus(free: &[(GpuIndex, u32)], count: usize) -> Vec<GpuIndex> {
    let mut groups: BTreeMap<u32, Vec<GpuIndex>> = BTreeMap::new();
    for (index, group) in free {
        groups.entry(*group).or_default().push(*index);
    }
    let best = groups.values().filter(|g| g.len() >= count).min_by_key(|g| g.len());
    match best {
        Some(group) => group[..count].to_vec(),
        None => free.iter().take(count).map(|(i, _)| *i).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Command, Op, Outcome};
    use crate::testing::{node_info, spec};

    fn state_with(nodes: &[(&str, u32)]) -> ClusterState {
        let mut s = ClusterState::new();
        for (name, gpus) in nodes {
            s.apply(&Command {
                skipped_ms: 0,
                now_ms: 1,
                op: Op::RegisterNode { info: node_info(name, *gpus) },
            });
        }
        s
    }

    fn submit(s: &mut ClusterState, gpus: u32, qos: &str) -> JobId {
        match s.apply(&Command {
            skipped_ms: 0,
            now_ms: 2,
            op: Op::Submit { spec: spec(gpus, qos), request_id: None, hold: false, limits: None },
        }) {
            Outcome::Submitted { job } => job,
            other => panic!("submit failed: {other:?}"),
        }
    }

    #[test]
    fn higher_priority_goes_first_then_submit_order() {
        let mut s = state_with(&[("a", 2)]);
        let low = submit(&mut s, 1, "batch");
        let high = submit(&mut s, 1, "inference");
        let high2 = submit(&mut s, 1, "inference");
        let out = plan(&s);
        let jobs: Vec<JobId> = out.plan.placements.iter().map(|p| p.job).collect();
        assert_eq!(jobs, vec![high, high2]);
        assert_eq!(out.pending.get(&low), Some(&PendingReason::Resources));
    }

    #[test]
    fn blocked_job_blocks_lower_ones_but_impossible_one_does_not() {
        let mut s = state_with(&[("a", 4)]);
        let first = submit(&mut s, 3, "batch");
        let big = submit(&mut s, 4, "batch");
        let small = submit(&mut s, 1, "batch");
        // Node "a" loses its GPUs' availability: mark it down so only "b" (2 GPUs) is up.
        s.apply(&Command { skipped_ms: 0, now_ms: 3, op: Op::RegisterNode { info: node_info("b", 2) } });
        s.apply(&Command {
            skipped_ms: 0,
            now_ms: 3,
            op: Op::NodeDown { node: "a".into(), reason: "test".into() },
        });
        let out = plan(&s);
        assert!(matches!(out.pending.get(&first), Some(PendingReason::ReqNodeNotAvail(_))));
        assert!(matches!(out.pending.get(&big), Some(PendingReason::ReqNodeNotAvail(_))));
        assert_eq!(out.plan.placements, vec![Placement::single(small, "b".into(), vec![0])]);

        let mut s = state_with(&[("a", 4)]);
        let first = submit(&mut s, 3, "batch");
        let second = submit(&mut s, 2, "batch");
        let third = submit(&mut s, 1, "batch");
        // Without backfill the blocked job holds back everything behind it.
        let out = plan_with(&s, PlanConfig { backfill: false });
        assert_eq!(out.plan.placements.len(), 1);
        assert_eq!(out.plan.placements[0].job, first);
        assert_eq!(out.pending.get(&second), Some(&PendingReason::Resources));
        assert_eq!(out.pending.get(&third), Some(&PendingReason::Priority));
        // With backfill the third job may use the reserved GPU: its limit ends no later than
        // the reservation starts (all have the same 24 h limit).
        let out = plan(&s);
        let placed: Vec<JobId> = out.plan.placements.iter().map(|p| p.job).collect();
        assert_eq!(placed, vec![first, third]);
        let r = out.reservation.unwrap();
        assert_eq!((r.job, r.node.as_str(), r.start_ms), (second, "a", s.now_ms + 24 * 3600 * 1000));
    }

    #[test]
    fn packs_onto_the_tightest_node_and_keeps_link_groups() {
        let mut s = state_with(&[("a", 8), ("b", 8)]);
        let j1 = submit(&mut s, 6, "batch");
        let out = plan(&s);
        assert_eq!(
            s.apply(&Command { skipped_ms: 0, now_ms: 3, op: Op::ApplyPlan { plan: out.plan } }),
            Outcome::PlanApplied { accepted: vec![j1], rejected: vec![] }
        );
        let j2 = submit(&mut s, 2, "batch");
        let out = plan(&s);
        // "a" has 2 free GPUs left: the 2-GPU job goes there, keeping "b" whole.
        assert_eq!(out.plan.placements, vec![Placement::single(j2, "a".into(), vec![6, 7])]);
        // Packing kept node "b" whole: no free GPU is stranded on a partly used node.
        assert_eq!(s.fragmentation(), (10, 8));
        // Four GPUs on an empty 8-GPU node with link groups of 4 come from one group.
        let j3 = submit(&mut s, 4, "batch");
        let mut out = plan(&s);
        out.plan.placements.retain(|p| p.job == j3);
        assert_eq!(out.plan.placements, vec![Placement::single(j3, "b".into(), vec![0, 1, 2, 3])]);
    }

    #[test]
    fn a_whole_node_job_behind_a_preemptor_still_gets_the_reservation() {
        let mut s = state_with(&[("a", 8), ("b", 8), ("c", 8)]);
        let run = |s: &mut ClusterState, gpus: u32, limit_s: u64, node: &str, qos: &str| {
            let mut sp = spec(gpus, qos);
            sp.time_limit_s = Some(limit_s);
            let Outcome::Submitted { job } = s.apply(&Command {
                skipped_ms: 0,
                now_ms: 2,
                op: Op::Submit { spec: sp, request_id: None, hold: false, limits: None },
            }) else {
                panic!("submit failed")
            };
            let plan = Plan { placements: vec![Placement::single(job, node.into(), (0..gpus).collect())] };
            s.apply(&Command { skipped_ms: 0, now_ms: 2, op: Op::ApplyPlan { plan } });
            s.apply(&Command {
                skipped_ms: 0,
                now_ms: 2,
                op: Op::JobStarted { job, attempt: 0, node: node.into() },
            });
            assert_eq!(s.jobs[&job].state, JobState::Running);
        };
        // Only "a" runs preemptible work (inference is never preempted).
        run(&mut s, 8, 3600, "a", "training");
        run(&mut s, 6, 3600, "b", "inference");
        run(&mut s, 6, 7200, "c", "inference");
        let urgent = submit(&mut s, 8, "urgent");
        let mut whole = spec(8, "training");
        whole.time_limit_s = Some(3600);
        let Outcome::Submitted { job: whole } = s.apply(&Command {
            skipped_ms: 0,
            now_ms: 3,
            op: Op::Submit { spec: whole, request_id: None, hold: false, limits: None },
        }) else {
            panic!("submit failed")
        };
        let small = submit(&mut s, 1, "training");
        let out = plan(&s);
        assert_eq!(out.preemption.as_ref().map(|p| (p.preemptor, p.node.as_str())), Some((urgent, "a")));
        // The 8-GPU job waiting behind the preemptor holds node "b" (free soonest) ...
        let r = out.reservation.expect("a reservation for the whole-node job");
        assert_eq!((r.job, r.node.as_str(), r.gpus.len()), (whole, "b", 8));
        assert_eq!(out.pending.get(&whole), Some(&PendingReason::Resources));
        // ... so the long small job keeps off it (before, it was packed onto "b").
        assert_eq!(
            out.plan.placements.iter().map(|p| (p.job, p.node.as_str())).collect::<Vec<_>>(),
            vec![(small, "c")]
        );
    }

    #[test]
    fn training_leaves_the_inference_headroom_free_and_inference_takes_it() {
        let mut s = state_with(&[("a", 4), ("b", 4)]);
        let mut policy = s.policy.clone();
        policy.qos.get_mut("inference").expect("inference qos").headroom_gpus = 2;
        s.apply(&Command { skipped_ms: 0, now_ms: 2, op: Op::SetPolicy { policy } });
        let big = submit(&mut s, 4, "training");
        let second = submit(&mut s, 3, "training");
        let small = submit(&mut s, 1, "training");
        let out = plan(&s);
        // 8 GPUs, 2 kept idle: the 4-GPU job fits (4 left), the 3-GPU one would leave 1.
        let placed: Vec<JobId> = out.plan.placements.iter().map(|p| p.job).collect();
        assert_eq!(placed, vec![big, small], "the 1-GPU job leaves 3 free");
        assert_eq!(out.pending.get(&second), Some(&PendingReason::Headroom));
        s.apply(&Command { skipped_ms: 0, now_ms: 3, op: Op::ApplyPlan { plan: out.plan } });
        // A job that could never start outside the headroom (7 > 8 - 2) is not held by it.
        let mut t = state_with(&[("a", 8)]);
        let mut policy = t.policy.clone();
        policy.qos.get_mut("inference").expect("inference qos").headroom_gpus = 2;
        t.apply(&Command { skipped_ms: 0, now_ms: 2, op: Op::SetPolicy { policy } });
        let (whole, six) = (submit(&mut t, 8, "training"), submit(&mut t, 6, "training"));
        let out = plan(&t);
        assert_eq!(out.plan.placements.iter().map(|p| p.job).collect::<Vec<_>>(), vec![whole]);
        assert_eq!(
            out.pending.get(&six),
            Some(&PendingReason::Headroom),
            "6 + 2 fit in 8: it waits for them"
        );
        // Inference may use the headroom.
        let inf = submit(&mut s, 2, "inference");
        let out = plan(&s);
        assert_eq!(out.plan.placements.iter().map(|p| p.job).collect::<Vec<_>>(), vec![inf]);
        assert_eq!(out.pending.get(&second), Some(&PendingReason::Headroom));
        // Without headroom the 3-GPU job starts in the GPUs the inference job has not taken.
        let mut policy = s.policy.clone();
        policy.qos.get_mut("inference").expect("inference qos").headroom_gpus = 0;
        s.apply(&Command { skipped_ms: 0, now_ms: 4, op: Op::SetPolicy { policy } });
        s.apply(&Command { skipped_ms: 0, now_ms: 4, op: Op::Cancel { job: inf, by: "alice".into() } });
        let out = plan(&s);
        assert_eq!(out.plan.placements.iter().map(|p| p.job).collect::<Vec<_>>(), vec![second]);
    }

    #[test]
    fn a_task_takes_exactly_what_is_free_and_not_one_more() {
        // Node "a": 4 GPUs, 8 CPUs, 16 GiB; a running job holds 1 GPU, 1 CPU and 1 GiB.
        let mut s = ClusterState::new();
        let mut info = node_info("a", 4);
        (info.cpus, info.memory_mib) = (8, 16 << 10);
        s.apply(&Command { skipped_ms: 0, now_ms: 1, op: Op::RegisterNode { info } });
        let with = |s: &mut ClusterState, gpus, cpus, mem_mib| {
            let mut sp = spec(gpus, "batch");
            (sp.cpus, sp.mem_mib) = (cpus, mem_mib);
            let op = Op::Submit { spec: sp, request_id: None, hold: false, limits: None };
            match s.apply(&Command { skipped_ms: 0, now_ms: 2, op }) {
                Outcome::Submitted { job } => job,
                other => panic!("submit failed: {other:?}"),
            }
        };
        with(&mut s, 1, 1, 1 << 10);
        let plan_first = plan(&s).plan;
        s.apply(&Command { skipped_ms: 0, now_ms: 2, op: Op::ApplyPlan { plan: plan_first } });
        for (gpus, cpus, mem, fits) in [
            (3, 7, 15 << 10, true),
            (4, 7, 15 << 10, false),
            (3, 8, 15 << 10, false),
            (3, 7, (15 << 10) + 1, false),
        ] {
            let mut t = s.clone();
            let job = with(&mut t, gpus, cpus, mem);
            let out = plan(&t);
            let placed = out.plan.placements.iter().any(|p| p.job == job);
            assert_eq!(placed, fits, "{gpus} GPUs, {cpus} CPUs, {mem} MiB: {out:?}");
        }
    }

    #[test]
    fn pick_gpus_prefers_one_group() {
        let free = [(1, 0), (2, 0), (4, 1), (5, 1), (6, 1)];
        assert_eq!(pick_gpus(&free, 2), vec![1, 2]);
        assert_eq!(pick_gpus(&free, 3), vec![4, 5, 6]);
        assert_eq!(pick_gpus(&free, 4), vec![1, 2, 4, 5]);
    }
}

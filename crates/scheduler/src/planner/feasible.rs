//! Feasibility (Nomad's feasibility checks): what one Up node has free during a pass, and
//! whether a task may go there — its partition, the cloud, the usable GPUs of its model, the
//! CPUs and memory beside the reservation's. The verdict on quantities is `fit::fits`.

use super::*;

/// Free GPUs of one Up node during planning.
pub(super) struct FreeNode<'a> {
    pub(super) name: &'a str,
    pub(super) labels: &'a BTreeMap<String, String>,
    pub(super) node: &'a Node,
    /// Each free GPU, ascending by index (inline up to 8, one pointer each: no allocation and
    /// little copying per node per pass for the usual node sizes).
    pub(super) free: smallvec::SmallVec<[&'a Gpu; 8]>,
    /// GPUs the reservation holds on this node (free now or freed by then).
    pub(super) reserved: Vec<GpuIndex>,
    /// CPUs and memory no job holds (less what this pass placed).
    pub(super) free_cpu_mem: CpuMem,
    /// CPUs and memory the reservation holds on this node: a job that may not touch the
    /// reservation leaves this much of its free CPUs and memory alone.
    pub(super) reserved_cpu_mem: CpuMem,
    /// A cloud burst node: only burstable jobs may use it.
    pub(super) cloud: bool,
    /// A reservation's window holds the node from then (`windows`): only a job that ends by
    /// then may start here (i64::MAX: none does; an open window: now).
    pub(super) closes_ms: i64,
    /// When the window that closes it ends, and when that reservation's next window opens.
    pub(super) reopens_ms: i64,
    pub(super) next_closes_ms: i64,
    /// An open window holds resources here (no preemption takes them).
    pub(super) in_window: bool,
}

impl FreeNode<'_> {
    /// Whether a task of a job in `part` (and, unless `cloud_ok`, not bursting) that ends at
    /// `ends_ms` may go here.
    pub(super) fn admits(&self, part: Option<&Partition>, cloud_ok: bool, ends_ms: i64) -> bool {
        part.is_none_or(|p| p.contains(self.name, self.labels))
            && (cloud_ok || !self.cloud)
            && ends_ms <= self.closes_ms
    }

    /// What one task of `model` may take here (`fit::fits` judges it): the usable free GPUs,
    /// and the CPUs and memory beside what is held (and, unless `may_use_reserved`, beside
    /// the reservation's CPUs and memory too).
    pub(super) fn free_for(&self, model: Option<&str>, may_use_reserved: bool) -> NodeFree {
        NodeFree {
            gpus: self.usable_count(model, may_use_reserved),
            cpu_mem: self.cpu_mem_for(may_use_reserved),
        }
    }

    /// The CPUs and memory beside what is held (and, unless `may_use_reserved`, beside the
    /// reservation's CPUs and memory).
    pub(super) fn cpu_mem_for(&self, may_use_reserved: bool) -> CpuMem {
        if may_use_reserved {
            self.free_cpu_mem
        } else {
            self.free_cpu_mem.minus(self.reserved_cpu_mem)
        }
    }

    /// How many free GPUs a job of `model` could use (no allocation; the hot path).
    pub(super) fn usable_count(&self, model: Option<&str>, may_use_reserved: bool) -> usize {
        self.free
            .iter()
            .filter(|g| {
                model_matches(model, &g.model) && (may_use_reserved || !self.reserved.contains(&g.index))
            })
            .count()
    }

    /// Free GPUs usable by a job of `model`, excluding reserved ones unless `may_use_reserved`.
    pub(super) fn usable(&self, model: Option<&str>, may_use_reserved: bool) -> Vec<(GpuIndex, u32)> {
        self.free
            .iter()
            .filter(|g| {
                model_matches(model, &g.model) && (may_use_reserved || !self.reserved.contains(&g.index))
            })
            .map(|g| (g.index, g.link_group))
            .collect()
    }

    /// The count the index files this node under: free GPUs outside the reservation.
    pub(super) fn indexed_free(&self) -> usize {
        // Nothing reserved (every node as a pass begins): no GPU record read, at 10k nodes a
        // tenth of the node table's cost.
        if self.reserved.is_empty() {
            return self.free.len();
        }
        self.free.iter().filter(|g| !self.reserved.contains(&g.index)).count()
    }

    /// Where the pass's index files the node at `pos`.
    pub(super) fn key(&self, pos: usize) -> FreeKey {
        (self.indexed_free(), std::cmp::Reverse(self.free_cpu_mem.cpus), pos)
    }
}
/// What one job asks of the nodes in a pass (`find`, `find_gang`, `find_fraction` look for it).
pub(super) struct Ask<'m, 'r> {
    /// Tasks, one node each.
    pub(super) tasks: usize,
    /// Whole GPUs per task (a fraction asks for `milli` of one GPU instead).
    pub(super) gpus: usize,
    pub(super) milli: u32,
    pub(super) cpu_mem: CpuMem,
    pub(super) model: Option<&'m str>,
    pub(super) part: Option<&'m Partition>,
    /// It may go onto cloud burst nodes.
    pub(super) cloud_ok: bool,
    /// When it would end: it may use reserved GPUs only if it ends before the reservation.
    pub(super) ends_ms: i64,
    pub(super) res: Option<&'r Reservation>,
    /// The topology a gang's nodes go by (`topo`).
    pub(super) topo: Option<super::topo::TopoWant<'m>>,
}

impl<'m, 'r> Ask<'m, 'r> {
    /// A queued job's ask (its tasks, GPUs, CPUs and memory, model and partition).
    pub(super) fn of(
        q: &Queued<'m>,
        milli: u32,
        cloud_ok: bool,
        ends_ms: i64,
        res: Option<&'r Reservation>,
    ) -> Ask<'m, 'r> {
        let (tasks, gpus, cpu_mem) = (q.tasks as usize, q.gpus as usize, q.cpu_mem);
        Ask { tasks, gpus, milli, cpu_mem, model: q.model, part: q.part, cloud_ok, ends_ms, res, topo: None }
    }

    pub(super) fn may_use_reserved(&self) -> bool {
        self.res.is_none_or(|r| self.ends_ms <= r.start_ms)
    }

    /// One task's GPUs, CPUs and memory, for `fit::fits`.
    pub(super) fn task(&self) -> TaskAsk {
        TaskAsk { gpus: self.gpus, cpu_mem: self.cpu_mem }
    }
}

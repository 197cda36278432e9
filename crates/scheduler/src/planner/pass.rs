//! One pass's node table: each Up node's free GPUs, CPUs and memory, indexed by free-GPU count,
//! and what the pass takes from it (placements, a preemptor's promised GPUs) with when it frees.

use super::*;

/// A node's place in the pass's index: (free GPUs outside the reservation, its free CPUs,
/// most first, its position).
pub(super) type FreeKey = (usize, std::cmp::Reverse<u32>, usize);

pub(super) struct Pass<'a> {
    pub(super) state: &'a ClusterState,
    pub(super) nodes: Vec<FreeNode<'a>>,
    /// (free GPUs outside the reservation, most free CPUs first, node position): best fit is
    /// the first entry ≥ need whose CPUs suffice — within one free-GPU count, the first entry
    /// says whether any node of that count has the CPUs.
    pub(super) by_free: BTreeSet<FreeKey>,
    /// Expected end of each GPU placed in this pass: node position → (end, gpu, model). The
    /// GPUs busy before the pass are read from the state only when a reservation needs them.
    pub(super) placed_until: BTreeMap<usize, Vec<(i64, GpuIndex, &'a str)>>,
    /// Expected end of each task placed in this pass, with the CPUs and memory it holds.
    pub(super) placed_cpu_mem: BTreeMap<usize, Vec<(i64, CpuMem)>>,
    /// Some Up node is a cloud burst node (the index fast path must then filter).
    pub(super) has_cloud: bool,
    /// Per GPU model constraint seen in this pass: the positions of the nodes with a GPU it matches.
    pub(super) model_nodes: Vec<(Option<&'a str>, Vec<usize>)>,
    /// Positions of the nodes the reservation holds GPUs on.
    pub(super) reserved_nodes: Vec<usize>,
    /// Free GPUs on all Up nodes (the QoS headrooms are kept out of these), and all their GPUs.
    pub(super) free_total: usize,
    pub(super) gpus_total: usize,
    /// Thousandths of a GPU given to fractions in this pass, by (node position, GPU).
    pub(super) fractions: BTreeMap<(usize, GpuIndex), u32>,
    /// With named topology levels: each node's domain at the lowest level (by position; none:
    /// `u32::MAX`) and each domain's free GPUs, so a task that fits several nodes equally
    /// goes into the fullest domain and keeps whole domains free for gangs.
    pub(super) node_domain: Vec<u32>,
    pub(super) domain_free: Vec<usize>,
    /// GPUs earlier estimates of this pass hold: node position → (until, GPU, job).
    pub(super) promised: BTreeMap<usize, Vec<(i64, GpuIndex, JobId)>>,
    /// Reservations' windows: what open ones keep for their jobs (`windows`).
    pub(super) windows: Vec<super::windows::WindowPool<'a>>,
}

impl<'a> Pass<'a> {
    pub(super) fn new(state: &'a ClusterState) -> Pass<'a> {
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
                reserved_cpu_mem: CpuMem::default(),
                cloud,
                closes_ms: i64::MAX,
                reopens_ms: i64::MIN,
                next_closes_ms: i64::MAX,
                in_window: false,
            });
        }
        let windows = super::windows::carve(state, &mut nodes);
        // Sorted first, so building the set (which sorts its input) costs one linear pass.
        let mut keys: Vec<FreeKey> = nodes.iter().enumerate().map(|(pos, n)| n.key(pos)).collect();
        keys.sort_unstable();
        let by_free = keys.into_iter().collect();
        let has_cloud = nodes.iter().any(|n| n.cloud);
        let free_total = nodes.iter().map(|n| n.free.len()).sum();
        let gpus_total = nodes.iter().map(|n| n.node.info.gpus.len()).sum();
        let (node_domain, domain_free) = domains_of(state, &nodes);
        Pass {
            state,
            nodes,
            by_free,
            placed_until: BTreeMap::new(),
            placed_cpu_mem: BTreeMap::new(),
            has_cloud,
            model_nodes: Vec::new(),
            reserved_nodes: Vec::new(),
            free_total,
            gpus_total,
            fractions: BTreeMap::new(),
            node_domain,
            domain_free,
            promised: BTreeMap::new(),
            windows,
        }
    }

    /// Free GPUs in the domain of the node at `pos` (0 without a topology: no preference).
    pub(super) fn domain_score(&self, pos: usize) -> usize {
        match self.node_domain.get(pos) {
            Some(&d) if d != u32::MAX => self.domain_free[d as usize],
            _ => 0,
        }
    }

    pub(super) fn take(&mut self, pos: usize, gpus: &[GpuIndex], until_ms: i64) {
        self.take_task(pos, gpus, CpuMem::default(), until_ms);
    }

    /// Takes one task's GPUs and CPUs/memory on the node at `pos` until `until_ms`.
    pub(super) fn take_task(&mut self, pos: usize, gpus: &[GpuIndex], cpu_mem: CpuMem, until_ms: i64) {
        let key = self.nodes[pos].key(pos);
        if cpu_mem != CpuMem::default() {
            let node = &mut self.nodes[pos];
            node.free_cpu_mem = node.free_cpu_mem.minus(cpu_mem);
            self.placed_cpu_mem.entry(pos).or_default().push((until_ms, cpu_mem));
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
        let taken_count = before - node.free.len();
        self.free_total -= taken_count;
        if let Some(&d) = self.node_domain.get(pos).filter(|d| **d != u32::MAX) {
            self.domain_free[d as usize] -= taken_count.min(self.domain_free[d as usize]);
        }
        self.by_free.insert(node.key(pos));
        let busy = self.placed_until.entry(pos).or_default();
        for (gpu, model) in taken {
            busy.push((until_ms, gpu, model));
        }
    }

    /// Keeps `gpus` of the node at `pos` for a preemptor: free ones are taken, and none of them
    /// is counted as freed when a reservation is computed.
    pub(super) fn promise(&mut self, pos: usize, gpus: &[GpuIndex]) {
        let free: Vec<GpuIndex> =
            gpus.iter().copied().filter(|g| self.nodes[pos].free.iter().any(|f| f.index == *g)).collect();
        self.take(pos, &free, i64::MAX);
        let node = self.nodes[pos].node;
        let busy = self.placed_until.entry(pos).or_default();
        for g in node.info.gpus.iter().filter(|g| gpus.contains(&g.index) && !free.contains(&g.index)) {
            busy.push((i64::MAX, g.index, g.model.as_str()));
        }
    }
}

/// Each node's domain at the cluster's lowest named topology level, and each domain's free
/// GPUs (both empty on a cluster that names no level).
fn domains_of(state: &ClusterState, nodes: &[FreeNode]) -> (Vec<u32>, Vec<usize>) {
    let Some(level) = state.topology.levels.first() else { return (Vec::new(), Vec::new()) };
    let mut index: BTreeMap<&str, u32> = BTreeMap::new();
    let mut free: Vec<usize> = Vec::new();
    let node_domain = nodes
        .iter()
        .map(|n| match state.topology.domain(n.name, n.labels, level) {
            Some(d) => {
                let next = index.len() as u32;
                let i = *index.entry(d).or_insert(next);
                if i as usize == free.len() {
                    free.push(0);
                }
                free[i as usize] += n.free.len();
                i
            }
            None => u32::MAX,
        })
        .collect();
    (node_domain, free)
}

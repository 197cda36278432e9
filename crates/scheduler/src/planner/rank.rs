//! Ranking (Nomad's rankers): of the nodes a task fits on, the best — the one whose free GPUs
//! fit most tightly (packing keeps whole nodes free for large jobs), found through the
//! free-GPU index — and within it GPUs of one link group when possible.

use super::*;

/// How many more nodes as tight as the best found the fast path weighs by their topology
/// domain (each one costs a fit check, for every job tried in a pass).
const TIES: usize = 8;

/// A placement candidate: (usable GPUs, node position); its GPUs are listed only for the one
/// chosen.
pub(super) type Candidate = (usize, usize);

impl<'a> Pass<'a> {
    /// Which entry of `model_nodes` lists the nodes with a GPU matching `model` (built on first use).
    pub(super) fn nodes_with(&mut self, model: Option<&'a str>) -> usize {
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

    /// Picks the best-fitting node and GPUs for one task of `ask` now (it may use reserved GPUs
    /// only if it ends before the reservation).
    pub(super) fn find(&mut self, ask: &Ask<'a, '_>) -> Option<(usize, Vec<GpuIndex>)> {
        let (count, cpu_mem, model, part, cloud_ok, res) =
            (ask.gpus, ask.cpu_mem, ask.model, ask.part, ask.cloud_ok, ask.res);
        let may_use_reserved = ask.may_use_reserved();
        let fast =
            model.is_none() && part.is_none_or(Partition::is_everything) && (cloud_ok || !self.has_cloud);
        let candidates = if fast { 0 } else { self.nodes_with(model) };
        let task = ask.task();
        let topo = !self.domain_free.is_empty();
        let mut best: Option<Candidate> = None;
        let consider = |pos: usize, best: &mut Option<Candidate>| {
            let node = &self.nodes[pos];
            if !node.admits(part, cloud_ok, ask.ends_ms) {
                return;
            }
            let may = may_use_reserved || node.reserved.is_empty();
            let free = node.free_for(model, may);
            // The first node of the fewest usable GPUs wins (in the index's order, or by position);
            // between equals, the one in the fullest topology domain.
            let better = |(bn, bpos): &Candidate| {
                free.gpus < *bn || (free.gpus == *bn && self.domain_score(pos) < self.domain_score(*bpos))
            };
            if fits(&free, &task).is_err() || best.as_ref().is_some_and(|b| !better(b)) {
                return;
            }
            *best = Some((free.gpus, pos));
        };
        if fast {
            // Best fit without a model or partition constraint: the first indexed node with enough free GPUs.
            // Nodes names are in BTreeMap order, so position order is name order (deterministic).
            let (mut seen, mut ties) = (0, 0);
            let mut from = (count, std::cmp::Reverse(u32::MAX), 0);
            'buckets: while let Some(&(free, _, _)) = self.by_free.range(from..).next() {
                for &(free_now, std::cmp::Reverse(cpus), pos) in
                    self.by_free.range((free, std::cmp::Reverse(u32::MAX), 0)..)
                {
                    // Entries with more free GPUs than the best found cannot fit tighter (nor, with
                    // no topology, those with as many).
                    let past = |n: usize| free_now > n || (free_now == n && (!topo || ties >= TIES));
                    if best.as_ref().is_some_and(|(n, _)| past(*n)) || seen > 64 {
                        break 'buckets;
                    }
                    ties += usize::from(best.is_some());
                    if free_now != free || cpus < cpu_mem.cpus {
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
            let free = |pos: usize| self.nodes[pos].free.len();
            best = best_of(&self.model_nodes[candidates].1, free, (count, topo), consider);
        }
        best.map(|(_, pos)| {
            let node = &self.nodes[pos];
            let may = may_use_reserved || node.reserved.is_empty();
            (pos, pick_gpus(&node.usable(model, may), count))
        })
    }
}

/// The best candidate among `positions` (in order) for a task of `count` GPUs, `consider`
/// keeping the best so far; `free(pos)` is a node's free GPUs, a bound on its usable ones.
fn best_of(
    positions: &[usize],
    free: impl Fn(usize) -> usize,
    (count, topo): (usize, bool),
    consider: impl Fn(usize, &mut Option<Candidate>),
) -> Option<Candidate> {
    let mut best = None;
    for &pos in positions {
        // Fewer free GPUs than asked never fits.
        if free(pos) < count {
            continue;
        }
        consider(pos, &mut best);
        // No node fits tighter than exactly (and without a topology none ties better).
        if !topo && best.is_some_and(|(n, _)| n == count) {
            break;
        }
    }
    best
}

/// Chooses `count` GPUs from `free`: all from the tightest-fitting link group when one can hold
/// them, else the lowest indices.
pub(super) fn pick_gpus(free: &[(GpuIndex, u32)], count: usize) -> Vec<GpuIndex> {
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

//! GPU fractions in a planning pass: a job asking for a fraction of one GPU goes onto the
//! fullest shared GPU it still fits on (packing fractions together, as FGD does, so whole GPUs
//! stay whole for jobs that need them), else onto a free GPU, which it then shares. Fractions
//! never span GPUs, never preempt and never hold a reservation.

use super::*;
use crate::fit::fraction_fits;

impl Pass<'_> {
    /// The node position and GPU for a fraction of `ask.milli` with one task's CPUs and memory.
    pub(super) fn find_fraction(&self, ask: &Ask) -> Option<(usize, GpuIndex)> {
        let (milli, model) = (ask.milli, ask.model);
        let may_use_reserved = ask.may_use_reserved();
        // (thousandths already used on the GPU, most first; position; GPU).
        let mut best: Option<(u32, usize, GpuIndex)> = None;
        for (pos, node) in self.nodes.iter().enumerate() {
            if !node.admits(ask.part, ask.cloud_ok, ask.ends_ms) {
                continue;
            }
            let may = may_use_reserved || node.reserved.is_empty();
            let free = NodeFree { gpus: 0, cpu_mem: node.cpu_mem_for(may) };
            if fits(&free, &TaskAsk { gpus: 0, cpu_mem: ask.cpu_mem }).is_err() {
                continue;
            }
            let n = node.node;
            let shared = n.shared.keys().filter_map(|g| {
                let gpu = n.info.gpus.iter().find(|x| x.index == *g)?;
                let used = n.shared_milli(*g) + self.fractions.get(&(pos, *g)).copied().unwrap_or(0);
                (n.healthy(*g) && model_matches(model, &gpu.model) && fraction_fits(used, milli).is_ok())
                    .then_some((used, *g))
            });
            // GPUs this pass already began to share here.
            let begun = self.fractions.iter().filter(|((p, g), _)| *p == pos && !n.shared.contains_key(g));
            let begun = begun
                .filter(|(_, used)| fraction_fits(**used, milli).is_ok())
                .map(|((_, g), used)| (*used, *g));
            let whole = node.usable(model, may).into_iter().next().map(|(g, _)| (0, g));
            for (used, gpu) in shared.chain(begun).chain(whole) {
                if best.is_none_or(|(b, _, _)| used > b) {
                    best = Some((used, pos, gpu));
                }
            }
        }
        best.map(|(_, pos, gpu)| (pos, gpu))
    }

    /// Places a fraction: a free GPU it lands on is taken out of the free GPUs for the rest of
    /// the pass (it is shared from now on), and the task's CPUs and memory are taken.
    pub(super) fn take_fraction(
        &mut self,
        pos: usize,
        gpu: GpuIndex,
        milli: u32,
        cpu_mem: CpuMem,
        until_ms: i64,
    ) {
        self.take_task(pos, &[gpu], cpu_mem, until_ms);
        *self.fractions.entry((pos, gpu)).or_insert(0) += milli;
    }
}

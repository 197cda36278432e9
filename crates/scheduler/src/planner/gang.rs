//! Gangs: a job of several tasks is placed whole, one task per distinct node, tightest nodes
//! first, or not at all.

use super::*;

impl<'a> Pass<'a> {
    /// `ask.tasks` distinct nodes with `ask.gpus` usable GPUs each, tightest first (all or nothing).
    pub(super) fn find_gang(&self, ask: &Ask) -> Option<Vec<(usize, Vec<GpuIndex>)>> {
        let (tasks, count, model) = (ask.tasks, ask.gpus, ask.model);
        let may_use_reserved = ask.may_use_reserved();
        let mut candidates: Vec<(usize, usize)> = self
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.admits(ask.part, ask.cloud_ok))
            .map(|(pos, n)| (n.free_for(model, may_use_reserved || n.reserved.is_empty()), pos))
            .filter(|(free, _)| fits(free, &ask.task()).is_ok())
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
}

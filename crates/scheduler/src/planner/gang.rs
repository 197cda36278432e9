//! Gangs: a job of several tasks is placed whole, one task per distinct node, tightest nodes
//! first — inside one topology domain when it asks or the cluster names levels (`topo`) — or
//! not at all.

use super::*;

impl<'a> Pass<'a> {
    /// `ask.tasks` distinct nodes with `ask.gpus` usable GPUs each, tightest first (all or nothing).
    pub(super) fn find_gang(&self, ask: &Ask) -> Option<Vec<(usize, Vec<GpuIndex>)>> {
        let candidates = self.gang_candidates(ask);
        if candidates.len() < ask.tasks {
            return None;
        }
        let positions: Vec<usize> = match &ask.topo {
            Some(want) => self.choose_in_domains(&candidates, ask.tasks, want)?,
            None => candidates.iter().take(ask.tasks).map(|c| c.1).collect(),
        };
        let may_use_reserved = ask.may_use_reserved();
        let chosen = positions.into_iter().map(|pos| {
            let n = &self.nodes[pos];
            (pos, pick_gpus(&n.usable(ask.model, may_use_reserved || n.reserved.is_empty()), ask.gpus))
        });
        Some(chosen.collect())
    }

    /// The nodes one task of the gang fits on now: (usable GPUs, position), tightest first.
    pub(super) fn gang_candidates(&self, ask: &Ask) -> Vec<(usize, usize)> {
        let model = ask.model;
        let may_use_reserved = ask.may_use_reserved();
        let mut candidates: Vec<(usize, usize)> = self
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.admits(ask.part, ask.cloud_ok, ask.ends_ms))
            .map(|(pos, n)| (n.free_for(model, may_use_reserved || n.reserved.is_empty()), pos))
            .filter(|(free, _)| fits(free, &ask.task()).is_ok())
            .map(|(free, pos)| (free.gpus, pos))
            .collect();
        candidates.sort_unstable();
        candidates
    }
}

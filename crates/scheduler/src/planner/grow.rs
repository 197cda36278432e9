//! Growth: shrunk elastic jobs take free GPUs of their own node back, and shrunk elastic
//! gangs take free nodes, when no job waits for resources.

use super::*;

impl<'a> Pass<'a> {
    /// Shrunk elastic jobs that can take free GPUs of their own node back (up to their full
    /// size), in id order; the GPUs are taken from this pass.
    pub(super) fn grow_back(&mut self, elastic: &[&'a Job]) -> Vec<GrowPlan> {
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
            // A resize restarts the run: it must end before a window closes its node.
            let ends = state.now_ms.saturating_add(state.time_limit_ms(job));
            if ends > self.nodes[pos].closes_ms {
                continue;
            }
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
    pub(super) fn grow_gang(&mut self, job: &Job, a: &crate::model::Allocation) -> Option<GrowPlan> {
        let state = self.state;
        let (count, model) = (job.gpus() as usize, job.spec.gpu_model.as_deref());
        let part = state.partition_of(job);
        let cloud_ok = state.may_burst(job);
        let mut candidates: Vec<(usize, usize)> = self
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| a.rank_on(n.name).is_none())
            .filter(|(_, n)| n.admits(part, cloud_ok, state.now_ms.saturating_add(state.time_limit_ms(job))))
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
}

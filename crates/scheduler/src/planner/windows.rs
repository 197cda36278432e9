//! Reservations in a pass (`crate::reservation`): an open window's free GPUs (a listed node's
//! CPUs and memory too) are taken out of the pass's free resources and kept for the jobs that
//! run in it (`place_in_window`); a node whose window is still to come takes only jobs that end
//! before it opens (`FreeNode::closes_ms`, checked by `FreeNode::admits`).

use super::*;

/// What one reservation's window keeps in this pass.
pub(super) struct WindowPool<'a> {
    pub(super) name: &'a str,
    pub(super) start_ms: i64,
    pub(super) end_ms: i64,
    /// The window is open and its opening was carried out (its GPUs bound).
    pub(super) open: bool,
    /// Per node it holds: (position, its free GPUs kept for the window, the CPUs and memory
    /// they come with, whether the node is held whole).
    pub(super) slots: Vec<(usize, Vec<&'a Gpu>, CpuMem, bool)>,
}

/// Takes the open windows' resources out of `nodes` and marks the nodes of upcoming windows.
pub(super) fn carve<'a>(state: &'a ClusterState, nodes: &mut [FreeNode<'a>]) -> Vec<WindowPool<'a>> {
    if state.reservations.is_empty() {
        return Vec::new();
    }
    let now = state.now_ms;
    let mut pools = Vec::new();
    // Windows sharing a node (both allowing overlap) each keep what was free before either.
    let before: Vec<smallvec::SmallVec<[&'a Gpu; 8]>> = nodes.iter().map(|n| n.free.clone()).collect();
    for r in state.reservations.values() {
        let Some((start, end)) = r.window_at(now) else { continue };
        let open = start <= now;
        let next = r.window_at(end).map_or(i64::MAX, |w| w.0);
        let mut pool = WindowPool {
            name: &r.name,
            start_ms: start,
            end_ms: end,
            open: open && r.opened_ms == Some(start),
            slots: Vec::new(),
        };
        for (pos, node) in nodes.iter_mut().enumerate() {
            let Some(held) = r.holds_on(node.name) else { continue };
            if !open {
                // Only listed nodes are known ahead (a GPU count is bound when it opens).
                if node.closes_ms > start {
                    (node.closes_ms, node.reopens_ms, node.next_closes_ms) = (start, end, next);
                }
                continue;
            }
            let whole = held.is_none();
            node.in_window = true;
            let kept: Vec<&Gpu> =
                before[pos].iter().copied().filter(|g| held.is_none_or(|h| h.contains(&g.index))).collect();
            node.free.retain(|g| held.is_some_and(|h| !h.contains(&g.index)));
            let cpu_mem = node.node.free_cpu_mem();
            if whole {
                node.free_cpu_mem = CpuMem::default();
                node.closes_ms = i64::MIN;
                node.reopens_ms = node.reopens_ms.max(end);
                node.next_closes_ms = node.next_closes_ms.min(next);
            }
            pool.slots.push((pos, kept, cpu_mem, whole));
        }
        pools.push(pool);
    }
    pools
}

impl<'s> Planning<'s> {
    /// A job that runs in a reservation: onto its open window's resources (one slot per
    /// task), or it waits with the window's reason. It never blocks the jobs behind it.
    pub(super) fn place_in_window(&mut self, q: &Queued<'s>) -> Result<(), PendingReason> {
        let state = self.state;
        let Some(job) = state.jobs.get(&q.id) else { return Ok(()) };
        let name = job.spec.reservation.as_deref().unwrap_or_default();
        let Some(w) = self.pass.windows.iter().position(|w| w.name == name) else {
            return Err(PendingReason::Reservation(format!(
                "reservation \"{name}\" does not exist (deleted or ended)"
            )));
        };
        let pool = &self.pass.windows[w];
        if !pool.open {
            if self.estimates_left > 0 {
                self.estimates_left -= 1;
                let why = format!("when reservation {name} opens");
                self.out.estimates.insert(q.id, Estimate { start_ms: Some(pool.start_ms), why });
            }
            let in_s = (pool.start_ms - state.now_ms).max(0) / 1000;
            return Err(PendingReason::Reservation(format!("reservation \"{name}\" opens in {in_s} s")));
        }
        if self.out.plan.placements.len() >= PLAN_PLACEMENTS_MAX {
            return Err(PendingReason::Priority);
        }
        let ends_ms = state.now_ms.saturating_add(q.limit_ms);
        if ends_ms > pool.end_ms {
            let why = format!("its time limit ends after reservation \"{name}\"'s window closes");
            return Err(PendingReason::Reservation(why));
        }
        if !state.reservations.get(name).is_some_and(|r| state.member(r, job)) {
            return Err(PendingReason::Reservation(format!("not on reservation \"{name}\"'s access list")));
        }
        let (count, model) = (q.gpus as usize, q.model);
        let usable = |gpus: &[&Gpu]| gpus.iter().filter(|g| model_matches(model, &g.model)).count();
        // Tightest slots first, one per task.
        let mut fitting: Vec<(usize, usize)> = pool
            .slots
            .iter()
            .enumerate()
            .filter(|(_, (pos, gpus, cpu_mem, _))| {
                let node = &self.pass.nodes[*pos];
                let in_part = q.part.is_none_or(|p| p.contains(node.name, node.labels));
                in_part && usable(gpus) >= count && q.cpu_mem.fits(*cpu_mem)
            })
            .map(|(i, (_, gpus, _, _))| (usable(gpus), i))
            .collect();
        fitting.sort_unstable();
        if fitting.len() < q.tasks as usize {
            return Err(PendingReason::Reservation(format!(
                "reservation \"{name}\"'s free resources do not fit it now"
            )));
        }
        let placed: Vec<(usize, Vec<GpuIndex>)> = fitting
            .into_iter()
            .take(q.tasks as usize)
            .map(|(_, i)| self.pass.take_from_window(w, i, (count, model, q.cpu_mem), ends_ms))
            .collect();
        self.count_started(q);
        let nodes = &self.pass.nodes;
        let mut tasks = placed.into_iter().map(|(pos, gpus)| (nodes[pos].name.to_string(), gpus));
        let (node, gpus) = tasks.next().expect("at least one task");
        let more = tasks.map(|(node, gpus)| TaskPlacement { node, gpus }).collect();
        self.out.plan.placements.push(Placement { job: q.id, node, gpus, more });
        Ok(())
    }
}

impl<'a> Pass<'a> {
    /// Takes `count` GPUs of `model` and `cpu_mem` from slot `i` of window `w` until `ends_ms`:
    /// the node position and the GPUs.
    fn take_from_window(
        &mut self,
        w: usize,
        i: usize,
        (count, model, cpu_mem): (usize, Option<&str>, CpuMem),
        ends_ms: i64,
    ) -> (usize, Vec<GpuIndex>) {
        let (pos, gpus, held, whole) = &mut self.windows[w].slots[i];
        let free: Vec<(GpuIndex, u32)> =
            gpus.iter().filter(|g| model_matches(model, &g.model)).map(|g| (g.index, g.link_group)).collect();
        let picked = rank::pick_gpus(&free, count);
        gpus.retain(|g| !picked.contains(&g.index));
        *held = held.minus(cpu_mem);
        let (pos, whole) = (*pos, *whole);
        if !whole {
            // A bound GPU count shares the node's CPUs and memory with the rest.
            self.take_task(pos, &[], cpu_mem, ends_ms);
        }
        let node = self.nodes[pos].node;
        let busy = self.placed_until.entry(pos).or_default();
        busy.extend(
            node.info
                .gpus
                .iter()
                .filter(|g| picked.contains(&g.index))
                .map(|g| (ends_ms, g.index, g.model.as_str())),
        );
        (pos, picked)
    }
}

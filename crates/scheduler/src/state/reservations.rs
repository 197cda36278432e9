//! Reservations in the replicated state (`crate::reservation`): put and delete, validated
//! against the nodes, the policy and the other reservations; the tick that opens and closes
//! windows (binding GPU counts, stopping the runs on reserved resources); and the checks apply
//! makes of every start and submit (`window_refuses`, `check_reservation`).

use super::*;
use crate::reservation::{Repeat, Reservation, RESERVATIONS_MAX};

impl ClusterState {
    fn note_reservation(&mut self, name: &str, what: String, now: i64) {
        let kind = events::ClusterEventKind::Reservation { name: name.to_string(), what };
        self.events.push(events::ClusterEvent { time_ms: now, node: String::new(), kind });
    }

    /// `Op::PutReservation`: validated whole; an update keeps what its open window's opening
    /// decided while its resources and window stay the same.
    pub(super) fn put_reservation(&mut self, r: &Reservation, must_exist: Option<bool>, now: i64) -> Outcome {
        let old = self.reservations.get(&r.name);
        match (must_exist, old.is_some()) {
            (Some(true), false) => {
                return Outcome::Rejected(Rejection::NotFound(format!(
                    "reservation \"{}\" not found",
                    r.name
                )))
            }
            (Some(false), true) => {
                return Outcome::Rejected(Rejection::FailedPrecondition(format!(
                    "reservation \"{}\" already exists",
                    r.name
                )))
            }
            _ => {}
        }
        if let Err(e) = r.validate() {
            return Outcome::Rejected(Rejection::Invalid(e.to_string()));
        }
        if old.is_none() && self.reservations.len() >= RESERVATIONS_MAX {
            return Outcome::Rejected(Rejection::ResourceExhausted(format!(
                "the cluster keeps at most {RESERVATIONS_MAX} reservations"
            )));
        }
        if let Err(why) = self.check_reservation_refs(r) {
            return Outcome::Rejected(why);
        }
        if r.repeat == Repeat::Once && r.end_ms <= now {
            return Outcome::Rejected(Rejection::Invalid("the window has already ended".into()));
        }
        let others = self.reservations.values().filter(|o| o.name != r.name);
        if let Some(why) = others.filter_map(|o| r.overlaps(o, now)).next() {
            return Outcome::Rejected(Rejection::FailedPrecondition(why));
        }
        let mut new = r.clone();
        new.opened_ms = None;
        new.bound.clear();
        if let Some(old) = old {
            let same = old.nodes == r.nodes
                && old.gpus == r.gpus
                && old.ignore_jobs == r.ignore_jobs
                && old.overlap == r.overlap
                && old.partition == r.partition
                && old.gpu_model == r.gpu_model
                && old.window_at(now) == r.window_at(now);
            if same {
                new.opened_ms = old.opened_ms;
                new.bound = old.bound.clone();
            }
            // The creator stays the creator (the event log says who updated it).
            if !old.created_by.is_empty() {
                new.created_by = old.created_by.clone();
            }
        }
        let what = if old.is_some() { "updated" } else { "created" };
        self.note_reservation(
            &r.name,
            format!("{what} by {}", display_or(&r.created_by, "an operator")),
            now,
        );
        self.reservations.insert(r.name.clone(), new);
        Outcome::ReservationChanged { name: r.name.clone() }
    }

    /// Names a reservation refers to must exist; a GPU count must fit the GPUs it may bind.
    fn check_reservation_refs(&self, r: &Reservation) -> Result<(), Rejection> {
        if let Some(n) = r.nodes.iter().find(|n| !self.nodes.contains_key(*n)) {
            return Err(Rejection::NotFound(format!("node \"{n}\" not found")));
        }
        if let Some(a) = r.accounts.iter().find(|a| !self.policy.accounts.contains_key(*a)) {
            return Err(Rejection::NotFound(format!("account \"{a}\" not found")));
        }
        if !r.qos.is_empty() && !self.policy.qos.contains_key(&r.qos) {
            return Err(Rejection::NotFound(format!("qos \"{}\" not found", r.qos)));
        }
        let part = if r.partition.is_empty() {
            None
        } else {
            let p = self.policy.partitions.get(&r.partition);
            Some(p.ok_or_else(|| Rejection::NotFound(format!("partition \"{}\" not found", r.partition)))?)
        };
        if r.gpus > 0 {
            let model = r.gpu_model.as_deref();
            let have: usize = self
                .nodes
                .values()
                .filter(|n| part.is_none_or(|p| p.contains(&n.info.name, &n.info.labels)))
                .map(|n| n.info.gpus.iter().filter(|g| crate::model::model_matches(model, &g.model)).count())
                .sum();
            if r.gpus as usize > have {
                return Err(Rejection::FailedPrecondition(format!(
                    "{} GPUs asked, the nodes it may bind have {have}",
                    r.gpus
                )));
            }
        }
        Ok(())
    }

    /// `Op::DeleteReservation`: the jobs that name it wait with a reason; runs keep running.
    pub(super) fn delete_reservation(&mut self, name: &str, now: i64) -> Outcome {
        if self.reservations.remove(name).is_none() {
            return Outcome::Rejected(Rejection::NotFound(format!("reservation \"{name}\" not found")));
        }
        self.note_reservation(name, "deleted".into(), now);
        Outcome::ReservationChanged { name: name.to_string() }
    }

    /// Whether a reservation's window opened or closed (or a one-off one ended) without its
    /// tick yet: the leader then proposes `Op::ReservationTick`.
    pub fn reservations_due(&self, now: i64) -> bool {
        self.reservations.values().any(|r| {
            let open = r.open_at(now).map(|(s, _)| s);
            open != r.opened_ms || (r.repeat == Repeat::Once && r.end_ms <= now)
        })
    }

    /// `Op::ReservationTick`.
    pub(super) fn reservation_tick(&mut self, now: i64) -> Outcome {
        let (mut opened, mut closed, mut stopped) = (Vec::new(), Vec::new(), Vec::new());
        let names: Vec<String> = self.reservations.keys().cloned().collect();
        for name in names {
            let r = &self.reservations[&name];
            let open = r.open_at(now);
            if let Some((start, end)) = open.filter(|(s, _)| r.opened_ms != Some(*s)) {
                stopped.extend(self.open_window(&name, start, end, now));
                opened.push(name.clone());
            } else if open.is_none() && r.opened_ms.is_some() {
                let r = self.reservations.get_mut(&name).expect("listed");
                r.opened_ms = None;
                r.bound.clear();
                self.note_reservation(&name, "window closed".into(), now);
                closed.push(name.clone());
            }
            let r = &self.reservations[&name];
            if r.repeat == Repeat::Once && r.end_ms <= now {
                self.reservations.remove(&name);
                self.note_reservation(&name, "ended".into(), now);
            }
        }
        if opened.is_empty() && closed.is_empty() {
            return Outcome::Ignored("no reservation window opened or closed".into());
        }
        Outcome::ReservationsTicked { opened, closed, stopped }
    }

    /// Opens the window [`start`, `end`) of reservation `name`: binds a GPU count, stops the
    /// runs on its resources that do not run in it (unless `ignore_jobs`). The stopped runs.
    fn open_window(&mut self, name: &str, start: i64, end: i64, now: i64) -> Vec<JobId> {
        let mut r = self.reservations[name].clone();
        if !r.by_nodes() {
            r.bound = self.bind_gpus(&r);
        }
        let victims: Vec<JobId> = if r.ignore_jobs { Vec::new() } else { self.runs_on(&r) };
        // Preemptors and resized runs waiting for GPUs it now holds plan again elsewhere.
        let claimers: BTreeSet<JobId> = r
            .held_nodes()
            .filter_map(|node| Some((node, self.nodes.get(node)?)))
            .flat_map(|(node, n)| {
                let held = r.holds_on(node).flatten();
                n.claimed.iter().filter(move |(g, _)| held.is_none_or(|h| h.contains(g))).map(|(_, j)| *j)
            })
            .filter(|j| !self.jobs.get(j).is_some_and(|j| self.member(&r, j)))
            .collect();
        for c in claimers {
            self.drop_claim(c);
        }
        for id in &victims {
            let Some(job) = self.jobs.get_mut(id) else { continue };
            let Some(alloc) = job.allocation.as_mut() else { continue };
            alloc.stop = Some(StopReason::ReservationOpened);
            job.record(
                now,
                "reservation",
                format!("reservation \"{name}\" opens: checkpoint, stop and requeue"),
            );
            self.drop_claim(*id);
        }
        let held: Vec<String> = if r.by_nodes() {
            r.nodes.clone()
        } else {
            r.bound.iter().map(|t| format!("{}{:?}", t.node, t.gpus)).collect()
        };
        let bound_gpus: usize = r.bound.iter().map(|t| t.gpus.len()).sum();
        let short = if !r.by_nodes() && bound_gpus < r.gpus as usize {
            format!(" (only {bound_gpus} of {} GPUs could be bound)", r.gpus)
        } else {
            String::new()
        };
        let what = format!(
            "window opened until {end} (Unix ms): {}{short}{}; {} runs stopped",
            held.join(", "),
            if r.maint { ", maintenance" } else { "" },
            victims.len()
        );
        r.opened_ms = Some(start);
        self.reservations.insert(name.to_string(), r);
        self.note_reservation(name, what, now);
        victims
    }

    /// The runs to stop when `r`'s window opens: those on its resources that do not run in it
    /// (nor in a reservation sharing them, both allowing overlap), and its own runs outside
    /// them (it was moved); running or suspended, not already stopping.
    fn runs_on(&self, r: &Reservation) -> Vec<JobId> {
        let mut ids = BTreeSet::new();
        for node in r.held_nodes() {
            ids.extend(self.jobs_on(node).iter().map(|j| j.id));
        }
        ids.extend(self.jobs.values().filter(|j| self.member(r, j)).map(|j| j.id));
        ids.into_iter()
            .filter(|id| {
                self.jobs.get(id).is_some_and(|j| {
                    matches!(j.state, JobState::Running | JobState::Suspended)
                        && j.allocation.as_ref().is_some_and(|a| a.stop.is_none())
                        && self.breaks_window(r, j)
                })
            })
            .collect()
    }

    /// Whether `job` is `r`'s: it names it and is on its access list.
    pub(crate) fn member(&self, r: &Reservation, job: &Job) -> bool {
        job.spec.reservation.as_deref() == Some(r.name.as_str())
            && r.admits(&job.spec.user, &job.spec.account, &job.spec.qos)
    }

    /// Whether `job`'s run breaks `r`'s open window: a member with a task outside it, or a
    /// non-member on its resources (unless a member of another reservation holding them
    /// too, both allowing overlap).
    pub(crate) fn breaks_window(&self, r: &Reservation, job: &Job) -> bool {
        let Some(a) = job.allocation.as_ref() else { return false };
        let member = self.member(r, job);
        a.tasks().any(|(_, node, gpus)| {
            let touches = match r.holds_on(node) {
                Some(None) => true,
                Some(Some(held)) => gpus.iter().any(|g| held.contains(g)),
                None => false,
            };
            if member {
                return !matches!(r.holds_on(node), Some(None))
                    && !r.holds_on(node).flatten().is_some_and(|held| gpus.iter().all(|g| held.contains(g)));
            }
            touches && !self.shares(r, job, node)
        })
    }

    /// Whether `job` runs in another reservation holding `node` too, both allowing overlap.
    fn shares(&self, r: &Reservation, job: &Job, node: &str) -> bool {
        let Some(o) = job.spec.reservation.as_deref().and_then(|n| self.reservations.get(n)) else {
            return false;
        };
        o.name != r.name && r.overlap && o.overlap && o.holds_on(node).is_some() && self.member(o, job)
    }

    /// The GPUs a GPU-count reservation takes when its window opens: healthy GPUs of its
    /// partition and model on Up nodes, no other open reservation's, those whose taking stops
    /// the fewest runs first (free ones, then runs that ignore or are in it, then the runs
    /// with the fewest GPUs), packed onto as few nodes as the order allows.
    fn bind_gpus(&self, r: &Reservation) -> Vec<TaskPlacement> {
        let part = self.policy.partitions.get(&r.partition).filter(|_| !r.partition.is_empty());
        let model = r.gpu_model.as_deref();
        let now = self.now_ms;
        let taken_elsewhere = |node: &str, g: GpuIndex| {
            self.reservations.values().any(|o| {
                o.name != r.name
                    && o.open_at(now).is_some()
                    && o.holds_on(node).is_some_and(|h| h.is_none_or(|gs| gs.contains(&g)))
            })
        };
        // (cost, node free GPUs descending, node, gpu)
        let mut candidates: Vec<(u32, std::cmp::Reverse<usize>, &str, GpuIndex)> = Vec::new();
        for (name, n) in self.nodes.iter().filter(|(_, n)| n.state == NodeState::Up) {
            if part.is_some_and(|p| !p.contains(&n.info.name, &n.info.labels)) {
                continue;
            }
            let free = n.usable_gpus().filter(|g| !n.allocated.contains_key(&g.index)).count();
            for g in n.usable_gpus().filter(|g| crate::model::model_matches(model, &g.model)) {
                if n.claimed.contains_key(&g.index)
                    || n.shared.contains_key(&g.index)
                    || taken_elsewhere(name, g.index)
                {
                    continue;
                }
                let cost = match n.allocated.get(&g.index).and_then(|j| self.jobs.get(j)) {
                    None => 0,
                    Some(j) if self.member(r, j) => 0,
                    Some(_) if r.ignore_jobs => 1,
                    Some(j) => 2 + j.total_gpus(),
                };
                candidates.push((cost, std::cmp::Reverse(free), name.as_str(), g.index));
            }
        }
        candidates.sort_unstable();
        let mut bound: Vec<TaskPlacement> = Vec::new();
        for (_, _, node, gpu) in candidates.into_iter().take(r.gpus as usize) {
            match bound.iter_mut().find(|t| t.node == node) {
                Some(t) => t.gpus.push(gpu),
                None => bound.push(TaskPlacement { node: node.to_string(), gpus: vec![gpu] }),
            }
        }
        for t in &mut bound {
            t.gpus.sort_unstable();
        }
        bound.sort_by(|a, b| a.node.cmp(&b.node));
        bound
    }

    /// The reservation a submitted job names must exist and admit it.
    pub(super) fn check_reservation(
        &self,
        spec: &JobSpec,
        account: &str,
        qos: &str,
    ) -> Result<(), Rejection> {
        let Some(name) = spec.reservation.as_deref() else { return Ok(()) };
        let Some(r) = self.reservations.get(name) else {
            let name: String = name.chars().take(64).collect();
            return Err(Rejection::NotFound(format!("reservation \"{name}\" not found")));
        };
        if spec.gpu_milli > 0 {
            return Err(Rejection::Invalid("a fraction of a GPU cannot run in a reservation".into()));
        }
        if !r.admits(&spec.user, account, qos) {
            return Err(Rejection::PermissionDenied(format!(
                "user \"{}\" (account \"{account}\", qos \"{qos}\") is not on reservation \"{name}\"'s access list",
                spec.user
            )));
        }
        Ok(())
    }

    /// Why a task of `job` may not be granted `gpus` of `node` now (`check_grant`: every start,
    /// preemption and resize): a job in a reservation runs only on its resources while its
    /// window is open, ending by its end; any other job never on an open window's resources
    /// (unless both reservations allow overlap and it is the other's), and on an upcoming
    /// window's nodes only if it ends before the window opens.
    pub fn window_refuses(&self, job: &Job, node: &str, gpus: &[GpuIndex]) -> Option<String> {
        if self.reservations.is_empty() {
            return None;
        }
        let now = self.now_ms;
        // A grant starts a run (a resize restarts it): it ends by its full limit from now.
        let ends = now.saturating_add(self.time_limit_ms(job));
        if let Some(name) = job.spec.reservation.as_deref() {
            let Some(r) = self.reservations.get(name) else {
                return Some(format!("reservation \"{name}\" does not exist"));
            };
            if !self.member(r, job) {
                return Some(format!("job {} is not on reservation \"{name}\"'s access list", job.id));
            }
            let Some((start, end)) = r.open_at(now) else {
                return Some(format!("reservation \"{name}\"'s window is not open"));
            };
            if r.opened_ms != Some(start) {
                return Some(format!("reservation \"{name}\"'s window is not open"));
            }
            let inside = match r.holds_on(node) {
                Some(None) => true,
                Some(Some(held)) => gpus.iter().all(|g| held.contains(g)),
                None => false,
            };
            if !inside {
                return Some(format!("node {node} {gpus:?} is not reservation \"{name}\"'s"));
            }
            if ends > end {
                return Some(format!("job {} would run past reservation \"{name}\"'s window", job.id));
            }
            return None;
        }
        for r in self.reservations.values() {
            let Some((start, _)) = r.window_at(now) else { continue };
            let touches = match r.holds_on(node) {
                Some(None) => true,
                Some(Some(held)) => gpus.iter().any(|g| held.contains(g)),
                None => false,
            };
            if !touches {
                continue;
            }
            if start <= now {
                return Some(format!("node {node} is held by reservation \"{}\"", r.name));
            }
            if ends > start {
                return Some(format!(
                    "job {} would still run on node {node} when reservation \"{}\" opens",
                    job.id, r.name
                ));
            }
        }
        None
    }

    /// The open maintenance reservation holding `node`, if any (it shows as MAINT).
    pub fn maint_of(&self, node: &str) -> Option<&str> {
        let now = self.now_ms;
        self.reservations
            .values()
            .find(|r| r.maint && r.open_at(now).is_some() && r.holds_on(node).is_some())
            .map(|r| r.name.as_str())
    }
}

fn display_or<'a>(s: &'a str, default: &'a str) -> &'a str {
    if s.is_empty() {
        default
    } else {
        s
    }
}

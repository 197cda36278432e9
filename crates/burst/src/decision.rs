//! The burst policy: pure and deterministic. Input: the cluster state (with the burst
//! configuration and instances) and "now"; output: what to launch and what to terminate, each
//! with its reason. No IO, no clock, no randomness: the same input gives the same decision.
//!
//! Launch when (1) burst is enabled, (2) on-prem GPUs are at least `saturation_pct` allocated,
//! and (3) one of:
//! - burstable jobs have waited at least `min_wait`, beyond what the cloud capacity already up
//!   or on its way can take (each is packed onto a planned instance with room, else a new one);
//! - the forecast (`forecast_window` > 0, `crate::forecast`) expects more burstable GPUs over
//!   the next window than free on-prem GPUs and idle cloud GPUs take: the
//!   instances boot before the jobs come, instead of after they waited;
//! - fewer than `min_idle_instances` instances sit idle (the warm pool, for latency targets
//!   shorter than a boot; paid for, and counted in the limits like any instance).
//!
//! A new instance is of the cheapest type per GPU that fits (GPU count, model, CPUs, memory) —
//! spot first where allowed, on-demand as the fallback — as long as every limit (instances,
//! GPUs, hourly spend) holds. Terminate an instance whose agent never joined within
//! `boot_timeout`, idle ones once burst is off, and ones idle for `idle_timeout` — but, with
//! hysteresis, never in a decision that launches, never the warm pool while on-prem is
//! saturated, and never one the forecast still expects work for.

use kairos_scheduler::burst::{
    BurstInstance, BurstState, Footprint, InstanceState, InstanceType, LaunchRequest, BURST_LABEL,
};

use crate::forecast::{self, Outlook};
use kairos_scheduler::model::{model_matches, CpuMem};
use kairos_scheduler::{ClusterState, Job, JobState, NodeState};

/// Most instances one decision launches.
pub const LAUNCHES_MAX: usize = kairos_scheduler::burst_apply::LAUNCHES_PER_COMMAND_MAX;

/// What the policy wants done now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Decision {
    pub launches: Vec<LaunchRequest>,
    /// Why these launches (empty when none).
    pub launch_reason: String,
    /// (intent, reason) to terminate.
    pub terminate: Vec<(u64, String)>,
    /// Why nothing (more) was launched, when burstable work still waits.
    pub held_back: Option<String>,
}

/// On-prem GPU use: (allocated or claimed, total) over Up nodes that are not burst nodes.
pub fn on_prem_usage(state: &ClusterState) -> (u64, u64) {
    state
        .nodes
        .values()
        .filter(|n| n.state == NodeState::Up && !n.info.labels.contains_key(BURST_LABEL))
        .fold((0, 0), |(used, total), n| {
            let busy = n
                .info
                .gpus
                .iter()
                .filter(|g| n.allocated.contains_key(&g.index) || n.claimed.contains_key(&g.index));
            (used + busy.count() as u64, total + n.info.gpus.len() as u64)
        })
}

/// A cloud instance being planned (or one up / on its way), with room left.
#[derive(Clone, Debug)]
struct Slot {
    /// The live instance (None: one this decision launches).
    intent: Option<u64>,
    gpus: u32,
    gpu_model: String,
    free: u32,
    /// CPUs and memory not yet spoken for.
    share: CpuMem,
}

/// Live instances to terminate whatever else holds: their agent never joined within the boot
/// timeout, or they are idle and burst is disabled.
fn unwanted(state: &ClusterState, now: i64) -> Vec<(u64, String)> {
    let cfg = &state.burst.config;
    let mut out = Vec::new();
    for i in state.burst.live().filter(|i| i.state != InstanceState::Terminating) {
        let node = state.nodes.get(&i.node_name()).filter(|n| n.state != NodeState::Down);
        match (node, i.idle_since_ms) {
            (None, _) if now - i.requested_ms >= secs(cfg.boot_timeout_s) => {
                out.push((i.intent, format!("its agent did not join within {}s", cfg.boot_timeout_s)));
            }
            (Some(_), Some(since)) if !cfg.enabled => {
                out.push((i.intent, format!("burst is disabled (idle since {since})")));
            }
            _ => {}
        }
    }
    out
}

/// Joined instances idle for at least `idle_timeout`, longest idle first.
fn idle_due(state: &ClusterState, now: i64) -> Vec<(i64, &BurstInstance)> {
    let timeout = secs(state.burst.config.idle_timeout_s);
    let mut idle: Vec<(i64, &BurstInstance)> = state
        .burst
        .live()
        .filter(|i| i.state != InstanceState::Terminating)
        .filter(|i| state.nodes.get(&i.node_name()).is_some_and(|n| n.state != NodeState::Down))
        .filter_map(|i| i.idle_since_ms.filter(|since| now - since >= timeout).map(|since| (since, i)))
        .collect();
    idle.sort_by_key(|(since, i)| (*since, i.intent));
    idle
}

fn idle_reason(now: i64, since: i64) -> String {
    format!("idle for {}s", (now - since) / 1000)
}

/// Capacity already there or coming: free GPUs of live cloud nodes, whole instances not joined.
fn cloud_capacity(state: &ClusterState) -> Vec<Slot> {
    let live = state.burst.live().filter(|i| i.state != InstanceState::Terminating);
    live.map(|i| {
        let of_type = || {
            let t = state.burst.config.instance_types.iter().find(|t| t.name == i.instance_type);
            t.map_or(CpuMem { cpus: u32::MAX, mem_mib: u64::MAX }, |t| t.cpu_mem())
        };
        let (free, share) = match state.nodes.get(&i.node_name()) {
            Some(n) if n.state == NodeState::Up => (
                n.info
                    .gpus
                    .iter()
                    .filter(|g| !n.allocated.contains_key(&g.index) && !n.claimed.contains_key(&g.index))
                    .count() as u32,
                n.free_cpu_mem(),
            ),
            Some(_) => (0, CpuMem::default()),
            None => (i.gpus, of_type()),
        };
        Slot { intent: Some(i.intent), gpus: i.gpus, gpu_model: i.gpu_model.clone(), free, share }
    })
    .collect()
}

pub fn decide(state: &ClusterState, now: i64) -> Decision {
    let cfg = &state.burst.config;
    let mut d = Decision { terminate: unwanted(state, now), ..Decision::default() };
    if !cfg.enabled {
        return d;
    }
    let (used, total) = on_prem_usage(state);
    // No on-prem GPU at all counts as saturated: the cloud is the only capacity.
    let pct = (used * 100).checked_div(total).unwrap_or(100);
    if pct < u64::from(cfg.saturation_pct) {
        // (Not saturated: the pending jobs are not even looked at, so this costs O(nodes).)
        d.terminate
            .extend(idle_due(state, now).into_iter().map(|(since, i)| (i.intent, idle_reason(now, since))));
        d.held_back =
            Some(format!("on-prem GPUs are only {pct}% allocated (burst threshold {}%)", cfg.saturation_pct));
        return d;
    }
    let mut draft = Draft::new(state, now, d);
    let waiting = waiting_jobs(state, now);
    for job in &waiting {
        draft.serve(job);
    }
    if !draft.d.launches.is_empty() {
        draft.reasons.push(format!(
            "{} burstable jobs waited over {}s with on-prem GPUs {pct}% allocated ({} fit capacity already up or coming)",
            waiting.len(),
            cfg.min_wait_s,
            draft.served
        ));
    }
    // (Only a forecast or a warm pool needs the outlook, an O(jobs) scan.)
    let outlook = if cfg.forecast_window_s > 0 || cfg.min_idle_instances > 0 {
        forecast::outlook(state, now)
    } else {
        Outlook::default()
    };
    if cfg.forecast_window_s > 0 {
        draft.ahead(&outlook);
    }
    draft.warm_pool(&outlook);
    draft.scale_down(&outlook);
    let mut d = draft.d;
    d.launch_reason = draft.reasons.join("; ");
    d
}

/// A decision being drafted: the cloud capacity up, coming and planned, and what is decided so
/// far.
struct Draft<'a> {
    state: &'a ClusterState,
    now: i64,
    slots: Vec<Slot>,
    footprint: Footprint,
    /// Waiting jobs that fit capacity already up or coming.
    served: usize,
    reasons: Vec<String>,
    d: Decision,
}

impl<'a> Draft<'a> {
    fn new(state: &'a ClusterState, now: i64, d: Decision) -> Self {
        let (slots, footprint) = (cloud_capacity(state), state.burst.footprint());
        Draft { state, now, slots, footprint, served: 0, reasons: Vec::new(), d }
    }

    /// Places a waiting job on capacity up, coming or planned, else plans an instance for it.
    fn serve(&mut self, job: &Job) {
        let (need, want, model) = (job.gpus(), job.spec.cpu_mem(), job.spec.gpu_model.as_deref());
        let fits = |s: &Slot| s.free >= need && want.fits(s.share) && model_matches(model, &s.gpu_model);
        if let Some(s) = self.slots.iter_mut().find(|s| fits(s)) {
            s.free -= need;
            s.share = s.share.minus(want);
            self.served += 1;
            return;
        }
        if cheapest(&self.state.burst, need, want, model, self.now, None).is_none() {
            let share = if want == CpuMem::default() {
                String::new()
            } else {
                format!(" (with {} CPUs and {} MiB)", want.cpus, want.mem_mib)
            };
            self.d.held_back = Some(format!(
                "job {} needs {need}{} GPUs: no allowed instance type fits{share} (or all are backing off)",
                job.id,
                model.map(|m| format!(" {m}")).unwrap_or_default(),
            ));
            return;
        }
        if self.launch(need, want, model) {
            let s = self.slots.last_mut().expect("launch adds a slot");
            s.free -= need;
            s.share = s.share.minus(want);
        }
    }

    /// Plans one instance of the cheapest type that fits `need` GPUs of `model` with `want`,
    /// within every limit; false (with the reason held back) when none may be launched.
    fn launch(&mut self, need: u32, want: CpuMem, model: Option<&str>) -> bool {
        if self.d.launches.len() >= LAUNCHES_MAX {
            self.d.held_back = Some(format!("at most {LAUNCHES_MAX} launches per decision"));
            return false;
        }
        let burst = &self.state.burst;
        let Some((t, spot)) = cheapest(burst, need, want, model, self.now, Some(self.footprint)) else {
            let (f, cfg) = (self.footprint, &burst.config);
            self.d.held_back = Some(format!(
                "limit reached: {} instances / {} GPUs / {} m$/h live or planned (max {} / {} / {})",
                f.instances,
                f.gpus,
                f.hourly_milli,
                cfg.max_instances,
                cfg.max_gpus,
                cfg.max_hourly_spend_milli
            ));
            return false;
        };
        self.footprint = Footprint {
            instances: self.footprint.instances + 1,
            gpus: self.footprint.gpus + t.gpus,
            hourly_milli: self.footprint.hourly_milli + t.price_milli(spot),
        };
        let (gpu_model, share) = (t.gpu_model.clone(), t.cpu_mem());
        self.slots.push(Slot { intent: None, gpus: t.gpus, gpu_model, free: t.gpus, share });
        self.d.launches.push(LaunchRequest { instance_type: t.name.clone(), spot });
        true
    }

    /// Free cloud GPUs up, coming or planned that no waiting job is packed onto.
    fn spare_gpus(&self) -> u64 {
        self.slots.iter().map(|s| u64::from(s.free)).sum()
    }

    /// Launches for the forecast's shortfall, instances that fit its largest job.
    fn ahead(&mut self, o: &Outlook) {
        let before = self.d.launches.len();
        let spare = self.spare_gpus();
        while o.shortfall(self.spare_gpus()) > 0 {
            if !self.launch(o.largest_gpus.max(1), o.largest_share, None) {
                break;
            }
        }
        let n = self.d.launches.len() - before;
        if n > 0 {
            self.reasons.push(format!(
                "forecast: {} burstable GPUs expected over {}s, beyond {} free on-prem GPUs and {spare} spare cloud GPUs ({n} launched ahead)",
                o.expected, self.state.burst.config.forecast_window_s, o.headroom
            ));
        }
    }

    /// Instances up, coming or planned with nothing placed or packed on them.
    fn idle_instances(&self) -> usize {
        self.slots.iter().filter(|s| s.free == s.gpus).count()
    }

    /// Tops the warm pool up to `min_idle_instances`, with instances that fit the largest recent
    /// or live burstable job (one GPU when none is known).
    fn warm_pool(&mut self, o: &Outlook) {
        let want = self.state.burst.config.min_idle_instances as usize;
        let before = self.d.launches.len();
        let idle = self.idle_instances();
        let (gpus, share) = (o.largest_gpus.max(1), o.largest_share);
        for _ in idle..want {
            if !self.launch(gpus, share, None) {
                break;
            }
        }
        let n = self.d.launches.len() - before;
        if n > 0 {
            self.reasons.push(format!("warm pool: {idle} of {want} instances idle ({n} launched)"));
        }
    }

    /// Idle instances past `idle_timeout` are terminated — unless this decision launches (no
    /// launch/terminate flapping), they hold the warm pool, or the forecast still expects work
    /// for them.
    fn scale_down(&mut self, o: &Outlook) {
        if !self.d.launches.is_empty() {
            return;
        }
        let due = idle_due(self.state, self.now);
        let idle_intents = |s: &&Slot| s.free == s.gpus && s.intent.is_some();
        let idle_not_due = self
            .slots
            .iter()
            .filter(idle_intents)
            .filter(|s| !due.iter().any(|(_, i)| Some(i.intent) == s.intent));
        let mut pool =
            (self.state.burst.config.min_idle_instances as usize).saturating_sub(idle_not_due.count());
        let mut spare = self.spare_gpus();
        for (since, i) in due {
            let packed = self.slots.iter().any(|s| s.intent == Some(i.intent) && s.free < s.gpus);
            if packed {
                continue;
            }
            if pool > 0 {
                pool -= 1;
                continue;
            }
            let without = spare.saturating_sub(u64::from(i.gpus));
            if o.shortfall(without) > 0 {
                continue;
            }
            spare = without;
            self.d.terminate.push((i.intent, idle_reason(self.now, since)));
        }
    }
}

fn secs(s: u64) -> i64 {
    (s.min(i64::MAX as u64 / 1000) as i64) * 1000
}

/// Pending single-task jobs that may burst and have waited at least `min_wait`, largest first
/// (then oldest), skipping held jobs and jobs waiting for dependencies.
fn waiting_jobs(state: &ClusterState, now: i64) -> Vec<&Job> {
    let min_wait = secs(state.burst.config.min_wait_s);
    let mut jobs: Vec<&Job> = state
        .jobs
        .values()
        .filter(|j| j.state == JobState::Pending && !j.held && j.claim.is_none() && j.spec.tasks <= 1)
        .filter(|j| now - j.submit_time_ms >= min_wait)
        .filter(|j| state.may_burst(j) && state.dependency_state(j).is_ok())
        .collect();
    jobs.sort_by_key(|j| (std::cmp::Reverse(j.gpus()), j.id));
    jobs
}

/// The cheapest allowed type per GPU (then per hour, then by name) that fits `need` GPUs of
/// `model` (and, given the current footprint `within`, every limit), and its market: spot where allowed and not backing off, else on-demand where
/// allowed (no spot, or fallback on).
fn cheapest<'a>(
    burst: &'a BurstState,
    need: u32,
    want: CpuMem,
    model: Option<&str>,
    now: i64,
    within: Option<Footprint>,
) -> Option<(&'a InstanceType, bool)> {
    let cfg = &burst.config;
    let backing_off =
        |t: &InstanceType, spot: bool| burst.backoff.get(&(t.name.clone(), spot)).is_some_and(|u| now < *u);
    cfg.instance_types
        .iter()
        .filter(|t| t.gpus >= need && want.fits(t.cpu_mem()) && model_matches(model, &t.gpu_model))
        .filter_map(|t| {
            if cfg.spot_allowed && !backing_off(t, true) {
                Some((t, true))
            } else if (!cfg.spot_allowed || cfg.on_demand_fallback) && !backing_off(t, false) {
                Some((t, false))
            } else {
                None
            }
        })
        .filter(|(t, spot)| {
            let extra = Footprint { instances: 1, gpus: t.gpus, hourly_milli: t.price_milli(*spot) };
            within.is_none_or(|f| burst.fits(f, extra))
        })
        .min_by_key(|(t, spot)| {
            let price = t.price_milli(*spot);
            // Price per GPU in micro-dollars keeps the comparison exact enough and integer.
            (u128::from(price) * 1000 / u128::from(t.gpus), price, t.name.clone())
        })
}

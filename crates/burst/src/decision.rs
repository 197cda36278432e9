//! The burst policy: pure and deterministic. Input: the cluster state (with the burst
//! configuration and instances) and "now"; output: what to launch and what to terminate, each
//! with its reason. No IO, no clock, no randomness: the same input gives the same decision.
//!
//! Launch when (1) burst is enabled, (2) on-prem GPUs are at least `saturation_pct` allocated,
//! and (3) burstable jobs have waited at least `min_wait`, beyond what the cloud capacity already
//! up or on its way can take. Each waiting job is packed onto a planned instance when one has
//! room, else a new instance of the cheapest type per GPU that fits it (GPU count and model)
//! is planned — spot first where allowed, on-demand as the fallback — as long as every limit
//! (instances, GPUs, hourly spend) holds. Terminate a cloud node idle for `idle_timeout`, an
//! instance whose agent never joined within `boot_timeout`, and idle ones once burst is off.

use kairos_scheduler::burst::{
    BurstState, Footprint, InstanceState, InstanceType, LaunchRequest, BURST_LABEL,
};
use kairos_scheduler::model::{model_matches, Share};
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
    gpu_model: String,
    free: u32,
    /// CPUs and memory not yet spoken for.
    share: Share,
}

/// Live instances to terminate: their agent never joined within the boot timeout, or they sat
/// idle past the idle timeout (or burst was disabled).
fn to_terminate(state: &ClusterState, now: i64) -> Vec<(u64, String)> {
    let cfg = &state.burst.config;
    let mut out = Vec::new();
    for i in state.burst.live() {
        let node = state.nodes.get(&i.node_name()).filter(|n| n.state != NodeState::Down);
        let why = match (i.state, node, i.idle_since_ms) {
            (InstanceState::Terminating, _, _) => None,
            (_, None, _) if now - i.requested_ms >= secs(cfg.boot_timeout_s) => {
                Some(format!("its agent did not join within {}s", cfg.boot_timeout_s))
            }
            (_, Some(_), Some(idle)) if !cfg.enabled => {
                Some(format!("burst is disabled (idle since {idle})"))
            }
            (_, Some(_), Some(idle)) if now - idle >= secs(cfg.idle_timeout_s) => {
                Some(format!("idle for {}s", (now - idle) / 1000))
            }
            _ => None,
        };
        if let Some(why) = why {
            out.push((i.intent, why));
        }
    }
    out
}

/// Capacity already there or coming: free GPUs of live cloud nodes, whole instances not joined.
fn cloud_capacity(state: &ClusterState) -> Vec<Slot> {
    let live = state.burst.live().filter(|i| i.state != InstanceState::Terminating);
    live.map(|i| {
        let of_type = || {
            let t = state.burst.config.instance_types.iter().find(|t| t.name == i.instance_type);
            t.map_or(Share { cpus: u32::MAX, mem_mib: u64::MAX }, |t| t.share())
        };
        let (free, share) = match state.nodes.get(&i.node_name()) {
            Some(n) if n.state == NodeState::Up => (
                n.info
                    .gpus
                    .iter()
                    .filter(|g| !n.allocated.contains_key(&g.index) && !n.claimed.contains_key(&g.index))
                    .count() as u32,
                n.free_share(),
            ),
            Some(_) => (0, Share::default()),
            None => (i.gpus, of_type()),
        };
        Slot { gpu_model: i.gpu_model.clone(), free, share }
    })
    .collect()
}

pub fn decide(state: &ClusterState, now: i64) -> Decision {
    let burst = &state.burst;
    let cfg = &burst.config;
    let mut d = Decision { terminate: to_terminate(state, now), ..Decision::default() };
    if !cfg.enabled {
        return d;
    }
    let (used, total) = on_prem_usage(state);
    // No on-prem GPU at all counts as saturated: the cloud is the only capacity.
    let pct = (used * 100).checked_div(total).unwrap_or(100);
    if pct < u64::from(cfg.saturation_pct) {
        // (Not saturated: the pending jobs are not even looked at, so this costs O(nodes).)
        d.held_back =
            Some(format!("on-prem GPUs are only {pct}% allocated (burst threshold {}%)", cfg.saturation_pct));
        return d;
    }
    let waiting = waiting_jobs(state, now);
    if waiting.is_empty() {
        return d;
    }
    let mut slots = cloud_capacity(state);
    let mut footprint = burst.footprint();
    let mut served = 0usize;
    for job in &waiting {
        let need = job.gpus();
        let want = job.spec.share();
        let model = job.spec.gpu_model.as_deref();
        let fits = |s: &Slot| s.free >= need && want.fits(s.share) && model_matches(model, &s.gpu_model);
        if let Some(s) = slots.iter_mut().find(|s| fits(s)) {
            s.free -= need;
            s.share = s.share.minus(want);
            served += 1;
            continue;
        }
        if d.launches.len() >= LAUNCHES_MAX {
            d.held_back = Some(format!("at most {LAUNCHES_MAX} launches per decision"));
            break;
        }
        if cheapest(burst, need, want, model, now, None).is_none() {
            let share = if want == Share::default() {
                String::new()
            } else {
                format!(" (with {} CPUs and {} MiB)", want.cpus, want.mem_mib)
            };
            d.held_back = Some(format!(
                "job {} needs {need}{} GPUs: no allowed instance type fits{share} (or all are backing off)",
                job.id,
                model.map(|m| format!(" {m}")).unwrap_or_default(),
            ));
            continue;
        }
        let Some((t, spot)) = cheapest(burst, need, want, model, now, Some(footprint)) else {
            d.held_back = Some(format!(
                "limit reached: {} instances / {} GPUs / {} m$/h live or planned (max {} / {} / {})",
                footprint.instances,
                footprint.gpus,
                footprint.hourly_milli,
                cfg.max_instances,
                cfg.max_gpus,
                cfg.max_hourly_spend_milli
            ));
            continue;
        };
        let extra = Footprint { instances: 1, gpus: t.gpus, hourly_milli: t.price_milli(spot) };
        footprint = Footprint {
            instances: footprint.instances + 1,
            gpus: footprint.gpus + t.gpus,
            hourly_milli: footprint.hourly_milli + extra.hourly_milli,
        };
        slots.push(Slot {
            gpu_model: t.gpu_model.clone(),
            free: t.gpus - need,
            share: t.share().minus(want),
        });
        d.launches.push(LaunchRequest { instance_type: t.name.clone(), spot });
    }
    if !d.launches.is_empty() {
        d.launch_reason = format!(
            "{} burstable jobs waited over {}s with on-prem GPUs {pct}% allocated ({} fit capacity already up or coming)",
            waiting.len(),
            cfg.min_wait_s,
            served
        );
    }
    d
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
    want: Share,
    model: Option<&str>,
    now: i64,
    within: Option<Footprint>,
) -> Option<(&'a InstanceType, bool)> {
    let cfg = &burst.config;
    let backing_off =
        |t: &InstanceType, spot: bool| burst.backoff.get(&(t.name.clone(), spot)).is_some_and(|u| now < *u);
    cfg.instance_types
        .iter()
        .filter(|t| t.gpus >= need && want.fits(t.share()) && model_matches(model, &t.gpu_model))
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

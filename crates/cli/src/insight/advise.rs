//! What the measurements support, per QoS and partition (pure): wall limits from run-time
//! percentiles, CPU and memory defaults per GPU from what GPU jobs used, GPU sharing or MIG for
//! inference jobs whose GPU memory fits, and an idle-GPU watch where jobs mostly idle. Each
//! piece of advice cites its evidence; `render` writes it into the current policy file.

use std::collections::BTreeMap;

use kairos_proto::v1 as pb;

use super::figures as fig;
use super::neat;
use crate::policy_file::IdleGpuEntry;

/// Fewer measured jobs than this in a class: no advice for it.
pub const MIN_JOBS: usize = 10;
/// Wall limit: this percentile of run times, times the headroom, rounded up to a neat unit.
const WALL_PCT: f64 = 99.0;
const WALL_HEADROOM: f64 = 1.5;
/// CPU and memory defaults per GPU: this percentile of use (memory with headroom).
const DEF_PCT: f64 = 90.0;
const MEM_HEADROOM: f64 = 1.25;
/// A fraction or MIG profile is advised when this share of inference jobs fit it.
const FIT_SHARE: f64 = 0.8;
/// Jobs under this mean GPU utilisation (%) idle; a class where most do gets an idle watch.
const IDLE_PCT: f64 = 10.0;
const IDLE_SHARE: f64 = 0.5;

/// A GPU the nodes offer: its memory and, for a MIG instance, its profile (`1g.18gb`).
#[derive(Debug, Clone, PartialEq)]
pub struct Offer {
    pub memory_mib: u64,
    pub mig_profile: Option<String>,
}

/// The GPUs the nodes offer, MIG instances with their profile.
pub fn offers(nodes: &[pb::Node]) -> Vec<Offer> {
    let gpus = nodes.iter().filter_map(|n| n.info.as_ref()).flat_map(|i| i.gpus.iter());
    gpus.map(|g| Offer {
        memory_mib: g.memory_mib,
        mig_profile: g.mig_parent.map(|_| g.model.rsplit(' ').next().unwrap_or(&g.model).to_string()),
    })
    .collect()
}

/// A proposed setting.
#[derive(Debug, Clone, PartialEq)]
pub enum Setting {
    MaxWall(u64),
    DefCpusPerGpu(u32),
    DefMemPerGpu(u64),
    IdleGpu(IdleGpuEntry),
}

impl Setting {
    pub fn key(&self) -> &'static str {
        match self {
            Setting::MaxWall(_) => "max_wall",
            Setting::DefCpusPerGpu(_) => "def_cpus_per_gpu",
            Setting::DefMemPerGpu(_) => "def_mem_per_gpu",
            Setting::IdleGpu(_) => "idle_gpu",
        }
    }

    /// The value as the policy file writes it.
    pub fn text(&self) -> String {
        match self {
            Setting::MaxWall(s) => format!("\"{}\"", neat::duration_text(*s)),
            Setting::DefCpusPerGpu(c) => c.to_string(),
            Setting::DefMemPerGpu(m) => format!("\"{}\"", neat::mem_arg(*m)),
            Setting::IdleGpu(i) => {
                format!("{{ after = \"{}\", below = {}, action = \"{}\" }}", i.after, i.below, i.action)
            }
        }
    }
}

/// A change to one class's setting, with what it was and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub setting: Setting,
    pub was: String,
    pub why: String,
}

/// The advice for one QoS (`qos.NAME`) or partition (`partitions.NAME`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ClassAdvice {
    pub table: String,
    pub jobs: usize,
    pub changes: Vec<Change>,
    /// Evidence and advice that is not a setting (kept settings, sharing, too few jobs).
    pub notes: Vec<String>,
}

/// What a class has now.
#[derive(Debug, Clone, Default)]
pub struct Current {
    pub max_wall_s: u64,
    pub def_cpus_per_gpu: Option<u32>,
    pub def_mem_per_gpu_mib: Option<u64>,
    pub idle_gpu: bool,
}

impl Current {
    pub fn of_qos(q: &pb::Qos) -> Current {
        Current {
            max_wall_s: q.max_wall_s,
            def_cpus_per_gpu: q.resources.and_then(|r| r.def_cpus_per_gpu),
            def_mem_per_gpu_mib: q.resources.and_then(|r| r.def_mem_per_gpu_mib),
            idle_gpu: q.idle_gpu.is_some(),
        }
    }

    pub fn of_partition(p: &pb::Partition) -> Current {
        Current {
            max_wall_s: p.max_wall_s.unwrap_or(0),
            def_cpus_per_gpu: p.resources.and_then(|r| r.def_cpus_per_gpu),
            def_mem_per_gpu_mib: p.resources.and_then(|r| r.def_mem_per_gpu_mib),
            idle_gpu: p.idle_gpu.is_some(),
        }
    }
}

/// Advice for every QoS and partition of `policy` from `records` (finished jobs count).
pub fn advise(records: &[pb::JobRecord], policy: &pb::Policy, offers: &[Offer]) -> Vec<ClassAdvice> {
    let finished: Vec<&pb::JobRecord> =
        records.iter().filter(|r| r.end_time_ms > 0 && r.start_time_ms > 0 && r.run_ms > 0).collect();
    let qos = policy.qos.iter().map(|q| {
        let jobs: Vec<&pb::JobRecord> = finished.iter().copied().filter(|r| r.qos == q.name).collect();
        class(&format!("qos.{}", q.name), &jobs, &Current::of_qos(q), offers)
    });
    let partitions = policy.partitions.iter().map(|p| {
        let jobs: Vec<&pb::JobRecord> = finished.iter().copied().filter(|r| r.partition == p.name).collect();
        class(&format!("partitions.{}", p.name), &jobs, &Current::of_partition(p), offers)
    });
    qos.chain(partitions).collect()
}

/// One class's advice.
pub fn class(table: &str, jobs: &[&pb::JobRecord], now: &Current, offers: &[Offer]) -> ClassAdvice {
    let mut out = ClassAdvice { table: table.to_string(), jobs: jobs.len(), ..Default::default() };
    if jobs.len() < MIN_JOBS {
        out.notes.push(format!("{} finished jobs measured (fewer than {MIN_JOBS}): no advice", jobs.len()));
        return out;
    }
    wall(jobs, now, &mut out);
    per_gpu(jobs, now, &mut out);
    out.notes.extend(sharing(jobs, offers));
    idle(jobs, now, &mut out);
    out
}

fn wall(jobs: &[&pb::JobRecord], now: &Current, out: &mut ClassAdvice) {
    let runs: Vec<f64> = jobs.iter().filter_map(|r| fig::elapsed_s(r, 0)).collect();
    let Some(p99) = fig::percentile(&runs, WALL_PCT) else { return };
    let proposed = neat::duration_up((p99 * WALL_HEADROOM).ceil() as u64);
    let evidence = format!(
        "p99 run time {} over {} jobs × {WALL_HEADROOM}",
        neat::duration_text(p99.ceil() as u64),
        runs.len()
    );
    if now.max_wall_s == 0 || proposed < now.max_wall_s {
        let was = if now.max_wall_s == 0 { "none".into() } else { neat::duration_text(now.max_wall_s) };
        out.changes.push(Change { setting: Setting::MaxWall(proposed), was, why: evidence });
    } else {
        out.notes.push(format!(
            "max_wall {} kept: {evidence} is not shorter",
            neat::duration_text(now.max_wall_s)
        ));
    }
}

/// Whole-GPU jobs that measured their run: (cores used per GPU, peak memory per GPU in MiB).
fn gpu_use(jobs: &[&pb::JobRecord]) -> (Vec<f64>, Vec<f64>) {
    let whole = jobs.iter().filter(|r| fig::gpus_per_task(r) > 0 && r.gpu_milli == 0);
    let (mut cores, mut mem) = (Vec::new(), Vec::new());
    for r in whole {
        let per = f64::from(fig::gpus_per_task(r));
        cores.extend(fig::cores_used(r).map(|c| c / per));
        if r.max_rss_kib > 0 {
            mem.push(r.max_rss_kib as f64 / 1024.0 / per);
        }
    }
    (cores, mem)
}

fn per_gpu(jobs: &[&pb::JobRecord], now: &Current, out: &mut ClassAdvice) {
    let (cores, mem) = gpu_use(jobs);
    if cores.len() < MIN_JOBS {
        out.notes.push(format!(
            "{} GPU jobs measured their CPU use (fewer than {MIN_JOBS}): CPU and memory defaults kept",
            cores.len()
        ));
        return;
    }
    if let Some(p90) = fig::percentile(&cores, DEF_PCT) {
        let proposed = (p90.ceil() as u32).max(1);
        if now.def_cpus_per_gpu != Some(proposed) {
            let why =
                format!("p90 of cores used per GPU over {} GPU jobs: {p90:.2}, rounded up", cores.len());
            let was = now.def_cpus_per_gpu.map_or_else(|| "unset".into(), |c| c.to_string());
            out.changes.push(Change { setting: Setting::DefCpusPerGpu(proposed), was, why });
        }
    }
    if let Some(p90) = fig::percentile(&mem, DEF_PCT).filter(|_| mem.len() >= MIN_JOBS) {
        let proposed = neat::mem_mib(p90 * MEM_HEADROOM);
        if now.def_mem_per_gpu_mib != Some(proposed) {
            let why = format!(
                "p90 of peak memory per GPU over {} GPU jobs: {} × {MEM_HEADROOM}",
                mem.len(),
                crate::output::mib(p90.ceil() as u64)
            );
            let was = now.def_mem_per_gpu_mib.map_or_else(|| "unset".into(), neat::mem_arg);
            out.changes.push(Change { setting: Setting::DefMemPerGpu(proposed), was, why });
        }
    }
}

/// The share of inference jobs whose GPU memory peak fits 1/k of their GPU, or a MIG profile.
fn sharing(jobs: &[&pb::JobRecord], offers: &[Offer]) -> Option<String> {
    let peaks: Vec<(u64, u64)> = jobs
        .iter()
        .filter(|r| {
            r.profile == pb::Profile::Inference as i32 && r.gpu_mem_device_mib > 0 && r.gpu_mem_max_mib > 0
        })
        .map(|r| (r.gpu_mem_max_mib, r.gpu_mem_device_mib))
        .collect();
    if peaks.len() < MIN_JOBS {
        return None;
    }
    let share = |fits: &dyn Fn(u64, u64) -> bool| {
        peaks.iter().filter(|(peak, device)| fits(*peak, *device)).count() as f64 / peaks.len() as f64
    };
    let fraction =
        [7u64, 4, 3, 2].into_iter().map(|k| (k, share(&|p, d| p <= d / k))).find(|(_, s)| *s >= FIT_SHARE);
    let mut migs: BTreeMap<u64, String> = BTreeMap::new();
    for o in offers {
        if let Some(p) = &o.mig_profile {
            migs.entry(o.memory_mib).or_insert_with(|| p.clone());
        }
    }
    let mig = migs.iter().map(|(m, p)| (p, share(&|peak, _| peak <= *m))).find(|(_, s)| *s >= FIT_SHARE);
    let device = peaks.iter().map(|(_, d)| *d).min().unwrap_or(0);
    let n = peaks.len();
    match (fraction, mig) {
        (None, None) => Some(format!("fewer than 80 % of {n} inference jobs would fit half a GPU: no sharing advised")),
        (Some((k, s)), mig) => Some(format!(
            "{:.0} % of {n} inference jobs peaked under {} (1/{k} of the GPU): gpu_sharing with {k} per GPU (--gpu-fraction {:.3}){}",
            s * 100.0,
            crate::output::mib(device / k),
            1.0 / k as f64,
            mig.map(|(p, s)| format!(", or MIG {p} ({:.0} % fit)", s * 100.0)).unwrap_or_default()
        )),
        (None, Some((p, s))) => Some(format!("{:.0} % of {n} inference jobs fit MIG {p}", s * 100.0)),
    }
}

fn idle(jobs: &[&pb::JobRecord], now: &Current, out: &mut ClassAdvice) {
    let utils: Vec<f64> = jobs.iter().filter_map(|r| fig::gpu_util_pct(r)).collect();
    if utils.len() < MIN_JOBS {
        return;
    }
    let idle = utils.iter().filter(|u| **u < IDLE_PCT).count();
    let share = idle as f64 / utils.len() as f64;
    if share < IDLE_SHARE {
        return;
    }
    let why = format!(
        "{idle} of {} GPU jobs ({:.0} %) averaged under {IDLE_PCT} % GPU utilisation",
        utils.len(),
        share * 100.0
    );
    if now.idle_gpu {
        out.notes.push(format!("{why}; it has an idle_gpu watch already"));
        return;
    }
    let watch = IdleGpuEntry { after: "30m".into(), below: 0.05, action: "notify".into() };
    out.changes.push(Change { setting: Setting::IdleGpu(watch), was: "unset".into(), why });
}

#[cfg(test)]
#[path = "advise_tests.rs"]
mod tests;

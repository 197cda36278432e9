//! `kairos policy advise`: what the measured history supports, per QoS, as a policy file the
//! operator can read, apply or feed to a what-if. The proposals are pure functions of the
//! records (`advise`); each cites its evidence (job count, percentile) as a TOML comment.
//!
//! Per QoS with at least `MIN_JOBS` finished jobs: `max_wall` from the run time p99 (× 1.5),
//! `def_cpus_per_gpu` and `def_mem_per_gpu` from the p90 of cores and memory used per GPU,
//! `gpu_sharing` when most of its inference jobs' GPU memory peaks fit a quarter of the GPU (and
//! which MIG profile of the nodes they would fit), an `idle_gpu` notice when its GPUs are
//! mostly idle.

use std::collections::BTreeMap;

use clap::Args;
use kairos_proto::v1 as pb;

use super::eff::{duration, neat_limit, neat_mem};
use super::figures::{self, quantile};
use crate::client::Client;
use crate::policy_file::{IdleGpuEntry, PolicyFile};

/// Fewer finished jobs than this in a QoS: no advice for it.
pub const MIN_JOBS: usize = 10;

#[derive(Args, Debug)]
pub struct AdviseArgs {
    /// The history read: jobs live at or after this time (`30d`, a date, an RFC 3339 time).
    #[arg(long, short = 'S', default_value = "30d")]
    pub since: String,
}

/// One proposal for QoS `qos`: a change to its entry, with its evidence.
#[derive(Clone, Debug, PartialEq)]
pub struct Advice {
    pub qos: String,
    pub change: Change,
    pub evidence: String,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    MaxWall(String),
    DefCpusPerGpu(u32),
    DefMemPerGpu(String),
    GpuSharing,
    IdleNotify,
    /// Nothing to change; a line worth reading (too few jobs, MIG fits).
    Note,
}

pub async fn advise(client: &Client, args: AdviseArgs) -> anyhow::Result<i32> {
    let now = crate::args::now_ms();
    let since = crate::args::parse_when(&args.since, now).map_err(|e| anyhow::anyhow!("--since: {e}"))?;
    let records =
        super::records(client, pb::ListHistoryRequest { since_ms: since, ..Default::default() }).await?;
    let policy = client
        .admin(pb::GetPolicyRequest {}, |mut c, r| async move { c.get_policy(r).await })
        .await?
        .into_inner();
    let nodes = client
        .admin(pb::ListNodesRequest {}, |mut c, r| async move { c.list_nodes(r).await })
        .await?
        .into_inner()
        .nodes;
    let mut file = PolicyFile::from_pb(&policy);
    let advice = advise_from(&records, &file, &mig_profiles(&nodes));
    print!("{}", render(&mut file, &advice, &args.since).map_err(anyhow::Error::msg)?);
    Ok(0)
}

/// The MIG profiles the nodes offer: (profile name, memory MiB), smallest first.
pub fn mig_profiles(nodes: &[pb::Node]) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = nodes
        .iter()
        .flat_map(|n| n.info.iter().flat_map(|i| &i.gpus))
        .filter(|g| g.mig_parent.is_some())
        .map(|g| (g.model.rsplit(" MIG ").next().unwrap_or(&g.model).to_string(), g.memory_mib))
        .collect();
    out.sort_by_key(|(name, m)| (*m, name.clone()));
    out.dedup();
    out
}

/// The proposals the records support against the current policy file.
pub fn advise_from(records: &[pb::JobRecord], file: &PolicyFile, mig: &[(String, u64)]) -> Vec<Advice> {
    let mut by_qos: BTreeMap<&str, Vec<&pb::JobRecord>> = BTreeMap::new();
    for r in records.iter().filter(|r| r.end_time_ms > 0 && r.start_time_ms > 0) {
        by_qos.entry(r.qos.as_str()).or_default().push(r);
    }
    let mut out = Vec::new();
    for (qos, rs) in by_qos {
        let Some(entry) = file.qos.get(qos) else { continue };
        let say = |change, evidence: String| Advice { qos: qos.to_string(), change, evidence };
        if rs.len() < MIN_JOBS {
            out.push(say(
                Change::Note,
                format!("{} finished jobs: fewer than {MIN_JOBS}, no advice", rs.len()),
            ));
            continue;
        }
        out.extend(wall(rs.as_slice(), &entry.max_wall).map(|(c, e)| say(c, e)));
        out.extend(per_gpu(rs.as_slice()).into_iter().map(|(c, e)| say(c, e)));
        if !entry.gpu_sharing {
            out.extend(sharing(rs.as_slice(), mig).into_iter().map(|(c, e)| say(c, e)));
        }
        if entry.idle_gpu.is_none() {
            out.extend(idle(rs.as_slice()).map(|(c, e)| say(c, e)));
        }
    }
    out
}

fn wall(rs: &[&pb::JobRecord], current: &str) -> Option<(Change, String)> {
    let ran: Vec<f64> = rs
        .iter()
        .filter(|r| r.state == pb::JobState::Completed as i32)
        .filter_map(|r| figures::ran_s(r))
        .collect();
    if ran.len() < MIN_JOBS {
        return None;
    }
    let p99 = quantile(&ran, 0.99)?;
    let proposed = neat_limit(p99 * 1.5);
    let now_s = crate::policy_file::parse_secs("max_wall", current).ok()? as f64;
    let new_s = crate::policy_file::parse_secs("max_wall", &proposed).ok()? as f64;
    // Only a limit far from what the jobs need is worth a change.
    (new_s * 2.0 < now_s).then(|| {
        (
            Change::MaxWall(proposed),
            format!("{} completed jobs ran at most {} (p99); limit {current}", ran.len(), duration(p99)),
        )
    })
}

fn per_gpu(rs: &[&pb::JobRecord]) -> Vec<(Change, String)> {
    let gpu_jobs: Vec<&&pb::JobRecord> = rs.iter().filter(|r| r.gpus > 0 && r.run_ms > 0).collect();
    let mut out = Vec::new();
    if gpu_jobs.len() < MIN_JOBS {
        return out;
    }
    let per_task_gpus = |r: &pb::JobRecord| f64::from(r.gpus) / f64::from(r.tasks.max(1));
    let cores: Vec<f64> =
        gpu_jobs.iter().filter_map(|r| Some(figures::cores_used(r)? / per_task_gpus(r))).collect();
    if let Some(p90) = quantile(&cores, 0.9) {
        let n = (p90.ceil() as u32).max(1);
        out.push((
            Change::DefCpusPerGpu(n),
            format!("{} GPU jobs used at most {p90:.1} cores per GPU (p90)", cores.len()),
        ));
    }
    let mem: Vec<f64> = gpu_jobs
        .iter()
        .filter(|r| r.max_rss_kib > 0)
        .map(|r| r.max_rss_kib as f64 / 1024.0 / per_task_gpus(r))
        .collect();
    if let Some(p90) = quantile(&mem, 0.9).filter(|_| mem.len() >= MIN_JOBS) {
        out.push((
            Change::DefMemPerGpu(neat_mem(p90 * 1.25)),
            format!(
                "{} GPU jobs peaked at most {} per GPU (p90; + 25 %)",
                mem.len(),
                crate::output::mib(p90 as u64)
            ),
        ));
    }
    out
}

fn sharing(rs: &[&pb::JobRecord], mig: &[(String, u64)]) -> Vec<(Change, String)> {
    let inference: Vec<&&pb::JobRecord> = rs
        .iter()
        .filter(|r| r.profile == pb::Profile::Inference as i32 && r.gpu_mem_device_mib > 0 && r.gpus == 1)
        .collect();
    if inference.len() < MIN_JOBS {
        return Vec::new();
    }
    let device = inference.iter().map(|r| r.gpu_mem_device_mib).min().unwrap_or(0);
    let quarter = device / 4;
    let fit = inference.iter().filter(|r| r.gpu_mem_max_mib <= quarter).count();
    let share = 100 * fit / inference.len();
    let mut out = Vec::new();
    let fits_mig = mig.iter().find(|(_, m)| {
        inference.iter().filter(|r| r.gpu_mem_max_mib <= *m).count() * 100 / inference.len() >= 80
    });
    let mig_note = fits_mig.map(|(name, _)| format!(", or MIG {name}")).unwrap_or_default();
    let evidence = format!(
        "{share} % of {} inference jobs peaked under {}: gpu_sharing with 4 per GPU{mig_note}",
        inference.len(),
        crate::output::mib(quarter)
    );
    out.push((if share >= 50 { Change::GpuSharing } else { Change::Note }, evidence));
    out
}

fn idle(rs: &[&pb::JobRecord]) -> Option<(Change, String)> {
    let measured: Vec<&&pb::JobRecord> = rs.iter().filter(|r| r.gpu_ms > 0).collect();
    if measured.len() < MIN_JOBS {
        return None;
    }
    let gpu_ms: u64 = measured.iter().map(|r| r.gpu_ms).sum();
    let busy: u64 = measured.iter().map(|r| r.gpu_busy_ms).sum();
    let util = 100.0 * busy as f64 / gpu_ms as f64;
    (util < 10.0).then(|| {
        (Change::IdleNotify, format!("{} jobs' GPUs were {util:.1} % busy over their runs", measured.len()))
    })
}

/// The policy file with the proposals applied, each with its evidence above the file.
pub fn render(file: &mut PolicyFile, advice: &[Advice], since: &str) -> Result<String, String> {
    let mut head = format!("# kairos policy advise --since {since}: the current policy with what the measured history\n# supports (apply with `kairos policy apply`, check with --dry-run).\n");
    if advice.is_empty() {
        head += "# nothing to propose\n";
    }
    for a in advice {
        let Some(q) = file.qos.get_mut(&a.qos) else { continue };
        let what = match &a.change {
            Change::MaxWall(w) => {
                q.max_wall = w.clone();
                format!("max_wall = \"{w}\"")
            }
            Change::DefCpusPerGpu(n) => {
                q.def_cpus_per_gpu = Some(*n);
                format!("def_cpus_per_gpu = {n}")
            }
            Change::DefMemPerGpu(m) => {
                q.def_mem_per_gpu = Some(m.clone());
                format!("def_mem_per_gpu = \"{m}\"")
            }
            Change::GpuSharing => {
                q.gpu_sharing = true;
                "gpu_sharing = true".to_string()
            }
            Change::IdleNotify => {
                q.idle_gpu = Some(IdleGpuEntry { after: "30m".into(), below: 0.05, action: "notify".into() });
                "idle_gpu = { after = \"30m\", below = 0.05, action = \"notify\" }".to_string()
            }
            Change::Note => String::new(),
        };
        let what = if what.is_empty() { String::new() } else { format!("{what}: ") };
        head += &format!("# qos.{}: {what}{}\n", a.qos, a.evidence);
    }
    Ok(format!("{head}\n{}", file.to_toml()?))
}

#[cfg(test)]
#[path = "advise_tests.rs"]
mod tests;

//! `kairos sim`: replays a trace through the production scheduling core (`kairos_sim`), no
//! cluster needed.

use clap::Args;

use kairos_sim::SimConfig;

#[derive(Args, Debug)]
pub struct SimArgs {
    /// Alibaba v2023 pod list (openb_pod_list_*.csv): class LS is inference, the rest training.
    #[arg(long, value_name = "CSV", conflicts_with = "jobs")]
    pub pods: Option<std::path::PathBuf>,
    /// A cluster's own history (`kairos history --export-trace`): its jobs, nodes and recorded
    /// events, replayed under the policy it was exported with (or --policy, or each of
    /// --compare), each with its fidelity to what happened.
    #[arg(
        long,
        value_name = "FILE.jsonl",
        conflicts_with_all = [
            "pods", "jobs", "nodes", "cluster", "inflate", "load", "offered_load", "from", "time_limit_factor",
            "estimate_every"
        ]
    )]
    pub history: Option<std::path::PathBuf>,
    /// Alibaba v2023 GPU node list (openb_node_list_gpu_node.csv).
    #[arg(long, value_name = "CSV", conflicts_with = "cluster")]
    pub nodes: Option<std::path::PathBuf>,
    /// A cluster of N nodes with G GPUs each instead of a node list (e.g. 4x8), optionally of
    /// one GPU model and with CPUS and MEM (256G; MiB without a unit) per node:
    /// 4x8:A100, 4x8:A100:64:512G, 4x8:64:512G. Without them the GPUs are of model "sim" and
    /// CPUs and memory bind nothing. BxNxG: B blocks (topology level `block`) of N nodes each;
    /// the replay then runs topology-blind, preferred and required side by side.
    #[arg(long, value_name = "[Bx]NxG[:MODEL][:CPUS:MEM]")]
    pub cluster: Option<String>,
    /// Training jobs that ask a whole node's GPUs become gangs of this many nodes with the
    /// same GPU-time (their run time divided by it): the public trace has no gangs.
    #[arg(long, value_name = "NODES", value_parser = clap::value_parser!(u32).range(2..=256))]
    pub gangs: Option<u32>,
    /// A JSONL trace instead: {"submit_s", "duration_s", "gpus", "class": inference|training}.
    #[arg(long, value_name = "JSONL")]
    pub jobs: Option<std::path::PathBuf>,
    /// Compress arrivals by this factor: the trace's arrival times divided by it (1.3: 30 %
    /// denser). Default: the trace's own times.
    #[arg(long, value_name = "FACTOR", allow_negative_numbers = true, conflicts_with = "offered_load")]
    pub load: Option<f64>,
    /// Compress arrivals so the offered load — GPU time asked / (GPUs × the arrival window) —
    /// is X (1.3: 30 % more work than the cluster can do while jobs arrive).
    #[arg(long, value_name = "X", allow_negative_numbers = true)]
    pub offered_load: Option<f64>,
    /// Inflate the trace the way the FGD paper does: draw tasks (with the seed) until they ask
    /// for FACTOR × the cluster's GPUs (1.3: 30 % more than it has), copies of drawn tasks
    /// beyond the trace's own, a drawn subset below it.
    #[arg(long, value_name = "FACTOR", allow_negative_numbers = true)]
    pub inflate: Option<f64>,
    /// Jobs that arrive before this time (seconds from the trace's start) arrive at it instead:
    /// the Alibaba trace's first pods all existed when it began (time 0), and the rest arrive
    /// from day 117 on (10108800), so that gap would otherwise dominate any compression.
    #[arg(long, value_name = "SECONDS")]
    pub from: Option<u64>,
    /// Jobs state their run time × FACTOR as their time limit (rounded up to the second, up to
    /// their QoS's max wall): backfill and the start estimates plan by the limits, so the
    /// estimates' error (reported against the actual starts) depends on it.
    #[arg(long, value_name = "FACTOR", default_value_t = kairos_sim::TIME_LIMIT_FACTOR, allow_negative_numbers = true)]
    pub time_limit_factor: f64,
    /// When the replay records the waiting jobs' start estimates (`kairos queue --start`'s), to
    /// report their error against the actual starts: `change` (after every pass that followed a
    /// change), SECONDS (at most once in that time, and that long after a change at the latest:
    /// each costs a planning pass with up to 64 estimates, slow on large clusters with long
    /// queues), or `off`.
    #[arg(long, value_name = "change|SECONDS|off", default_value = "change", value_parser = estimate_every)]
    pub estimate_every: EstimateEvery,
    /// Inference pods the trace gives a fraction of a GPU (`gpu_milli` below 1000) ask for that
    /// fraction and share GPUs (where their QoS allows; the shipped inference QoS does);
    /// without it each takes a whole GPU.
    #[arg(long)]
    pub gpu_fractions: bool,
    /// Orders jobs that arrive in the same millisecond, and draws --inflate's tasks (same seed,
    /// same output).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Preempted training saves its work on the checkpoint signal (else only every
    /// --checkpoint-every and what it did since is redone).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub checkpoint_on_signal: bool,
    /// How often training checkpoints by itself (seconds).
    #[arg(long, default_value_t = 1800)]
    pub checkpoint_every: u64,
    /// The policy to replay under (the `kairos policy apply` format); default: the shipped
    /// policy, the one a new cluster runs (`kairos qos list`), printed above the figures.
    #[arg(long, value_name = "FILE.toml", conflicts_with = "compare")]
    pub policy: Option<std::path::PathBuf>,
    /// Jobs belong to N accounts, a0 … (by a seeded hash of each job); accounts a policy lacks
    /// are added under its root. A policy's `[accounts.aK]` give them guarantees
    /// (`guaranteed = { gpus = … }`): the report then shows, per team, the guaranteed GPU-hours
    /// honoured, how long it waited while owed GPUs, and what it lent and borrowed.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub accounts: Option<u32>,
    /// Replay under each of these policies and show them side by side.
    #[arg(long, value_name = "FILE.toml", num_args = 1..)]
    pub compare: Vec<std::path::PathBuf>,
    /// Cloud burst: replay without it and under each of these burst configurations (the
    /// `kairos burst config apply` format; its `[sim]` table describes the simulated cloud), side
    /// by side. The production burst policy and reconciler decide; --plot then draws spend
    /// against inference p99.
    #[arg(long, value_name = "FILE.toml", num_args = 1.., conflicts_with = "compare")]
    pub burst: Vec<std::path::PathBuf>,
    /// Also draw the wait CDF per class and the GPUs allocated over time into this SVG (with
    /// --compare: one row per policy; with --burst: spend per day against inference wait p99,
    /// one point per configuration).
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<std::path::PathBuf>,
}

/// `--estimate-every`: None off, else at most once in that many ms (0: after every change).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EstimateEvery(pub Option<i64>);

fn estimate_every(text: &str) -> Result<EstimateEvery, String> {
    match text {
        "change" => Ok(EstimateEvery(Some(0))),
        "off" => Ok(EstimateEvery(None)),
        s => s
            .parse::<u64>()
            .ok()
            .filter(|s| (1..=365 * 86_400).contains(s))
            .map(|s| EstimateEvery(Some(s as i64 * 1000)))
            .ok_or_else(|| format!("\"{s}\" is not change, off or a number of seconds (1 to a year)")),
    }
}

/// The topology level of `--cluster BxNxG`'s blocks.
const BLOCK: &str = "block";

/// `--gangs N`: training jobs asking a whole node's GPUs become N-node gangs of the same GPU-time.
fn gangs_of(jobs: &mut [kairos_sim::TraceJob], nodes: &[kairos_sim::TraceNode], width: u32) {
    let whole = nodes.iter().map(|n| n.gpus).max().unwrap_or(0);
    for j in jobs.iter_mut().filter(|j| !j.inference && j.gpus == whole && j.tasks <= 1) {
        j.tasks = width;
        j.duration_ms = (j.duration_ms / i64::from(width)).max(1000);
    }
}

/// `--cluster NxG[:MODEL][:CPUS:MEM]`: N nodes (`n0` …) of G GPUs of MODEL (default "sim"),
/// with CPUS and MEM each when given (else they bind nothing).
fn cluster_of(text: &str) -> anyhow::Result<Vec<kairos_sim::TraceNode>> {
    let bad = || {
        anyhow::anyhow!(
            "--cluster: \"{text}\" is not NODESxGPUS[:MODEL][:CPUS:MEM] (e.g. 4x8, 4x8:A100, 4x8:A100:64:512G)"
        )
    };
    let mut parts = text.split(':');
    let sizes: Vec<u32> = parts
        .next()
        .unwrap_or_default()
        .split(['x', 'X'])
        .map(|s| s.trim().parse().map_err(|_| bad()))
        .collect::<anyhow::Result<_>>()?;
    let (blocks, n, g) = match sizes[..] {
        [n, g] => (None, n, g),
        [b, n, g] if (1..=1000).contains(&b) => (Some(b), n, g),
        _ => return Err(bad()),
    };
    let n = n.saturating_mul(blocks.unwrap_or(1));
    if n == 0 || g == 0 || n > 100_000 || g > 64 {
        return Err(bad());
    }
    let rest: Vec<&str> = parts.map(str::trim).collect();
    let (model, share) = match rest[..] {
        [] => ("sim", None),
        [model] => (model, None),
        [cpus, mem] => ("sim", Some((cpus, mem))),
        [model, cpus, mem] => (model, Some((cpus, mem))),
        _ => return Err(bad()),
    };
    if model.is_empty()
        || model.len() > 64
        || !model.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
    {
        return Err(bad());
    }
    let (cpus, mem_mib) = match share {
        None => (0, 0),
        Some((cpus, mem)) => {
            let cpus: u32 = cpus.parse().ok().filter(|c| (1..=100_000).contains(c)).ok_or_else(bad)?;
            let mem = kairos_proto::units::parse_mem_mib(mem)
                .map_err(|e| anyhow::anyhow!("--cluster: \"{text}\": memory {e}"))?;
            if mem == 0 {
                return Err(bad());
            }
            (cpus, mem)
        }
    };
    let per_block = n / blocks.unwrap_or(1);
    Ok((0..n)
        .map(|i| {
            let labels = blocks
                .map(|_| [(BLOCK.to_string(), format!("b{}", i / per_block))].into())
                .unwrap_or_default();
            kairos_sim::TraceNode {
                name: format!("n{i}"),
                gpus: g,
                model: model.into(),
                cpus,
                mem_mib,
                labels,
            }
        })
        .collect())
}

/// The QoS table of `policy`, as `kairos qos list` prints a cluster's.
fn print_qos(policy: &kairos_scheduler::policy::Policy) {
    let pb = kairos_convert::policy::policy_to_pb(policy);
    let rows: Vec<Vec<String>> = pb.qos.iter().map(crate::qos::qos_row).collect();
    crate::output::table(&crate::qos::QOS_HEADER, &rows);
}

/// `kairos sim`: replays the trace under each policy (or burst setting) asked for, and prints
/// the reports (and writes the picture, with --plot).
pub fn sim(json: bool, args: SimArgs) -> anyhow::Result<i32> {
    if let Some(history) = &args.history {
        if args.burst.len() > 1 {
            anyhow::bail!("--history: one --burst file at most");
        }
        let policies: Vec<std::path::PathBuf> = args.policy.iter().chain(&args.compare).cloned().collect();
        return crate::whatif::sim_history(
            json,
            history,
            &policies,
            args.burst.first().map(|p| p.as_path()),
            args.plot.as_deref(),
        );
    }
    let factor = args.time_limit_factor;
    if !(factor > 0.0 && factor <= 1000.0) {
        anyhow::bail!("--time-limit-factor: {factor} is not a factor in (0, 1000]");
    }
    let (nodes, jobs, load) = workload_of(&args)?;
    let config = SimConfig {
        load,
        seed: args.seed,
        checkpoint_on_signal: args.checkpoint_on_signal,
        checkpoint_every_s: args.checkpoint_every.max(1),
        fractions: args.gpu_fractions,
        accounts: args.accounts.unwrap_or(0),
        time_limit_factor: args.time_limit_factor,
        estimates: args.estimate_every.0.is_some(),
        estimate_every_ms: args.estimate_every.0.unwrap_or(0),
        ..SimConfig::default()
    };
    let policies = policies_of(&args)?;
    // One replay per policy, or (--burst) one without burst and one per burst file.
    let mut runs: Vec<(String, &kairos_scheduler::policy::Policy, Option<kairos_sim::cloud::BurstSetup>)> =
        policies.iter().map(|(name, p)| (name.clone(), p, None)).collect();
    if !args.burst.is_empty() {
        let policy = &policies[0].1;
        runs = vec![("no burst".to_string(), policy, None)];
        for path in &args.burst {
            runs.push((path.display().to_string(), policy, Some(crate::burst_file::setup_of(path, policy)?)));
        }
    }
    let placements = topology_runs(&nodes, &config, &mut runs);
    let mut reports: Vec<(String, kairos_sim::Report)> = Vec::new();
    let mut pictures: Vec<(String, kairos_sim::plot::Series)> = Vec::new();
    for (k, (name, policy, burst)) in runs.into_iter().enumerate() {
        let config = SimConfig { burst, ..placements.get(k).unwrap_or(&placements[0]).clone() };
        let (report, series) = kairos_sim::simulate_with_series(&nodes, &jobs, policy, &config);
        pictures.push((name.clone(), series));
        reports.push((name, report));
    }
    if let Some(path) = &args.plot {
        let picture = match (args.burst.is_empty(), &pictures[..]) {
            (false, _) => kairos_sim::plot::tradeoff_svg(&reports),
            (true, [(_, one)]) => kairos_sim::plot::svg(one),
            (true, many) => kairos_sim::plot::compare_svg(many),
        };
        std::fs::write(path, picture)
            .map_err(|e| anyhow::anyhow!("--plot: writing {}: {e}", path.display()))?;
    }
    print_reports(json, &args, &policies, &reports)?;
    Ok(0)
}

/// The replay's nodes and jobs (shifted by --from, inflated by --inflate) and its compression
/// (--load, or the one --offered-load asks for).
fn workload_of(
    args: &SimArgs,
) -> anyhow::Result<(Vec<kairos_sim::TraceNode>, Vec<kairos_sim::TraceJob>, Option<f64>)> {
    let read = |p: &std::path::Path| {
        std::fs::read_to_string(p).map_err(|e| anyhow::anyhow!("reading {}: {e}", p.display()))
    };
    let nodes = match (&args.nodes, &args.cluster) {
        (Some(p), _) => kairos_sim::trace::alibaba_nodes(&p.display().to_string(), &read(p)?)?,
        (None, Some(c)) => cluster_of(c)?,
        (None, None) => anyhow::bail!("--nodes CSV or --cluster NxG: the GPU nodes are needed"),
    };
    let mut jobs = match (&args.pods, &args.jobs) {
        (Some(p), _) => kairos_sim::trace::alibaba_pods(&p.display().to_string(), &read(p)?)?.0,
        (None, Some(j)) => kairos_sim::trace::jsonl(&j.display().to_string(), &read(j)?)?,
        (None, None) => anyhow::bail!("a trace is needed: --pods CSV or --jobs JSONL"),
    };
    if let Some(load) = args.load.filter(|l| !(*l > 0.0 && l.is_finite())) {
        anyhow::bail!("--load: {load} is not a positive factor");
    }
    if let Some(from_ms) = args.from.map(|s| s.saturating_mul(1000).min(i64::MAX as u64) as i64) {
        for j in &mut jobs {
            j.submit_ms = j.submit_ms.max(from_ms) - from_ms;
        }
    }
    if let Some(width) = args.gangs {
        gangs_of(&mut jobs, &nodes, width);
    }
    let gpus = nodes.iter().map(|n| n.gpus).sum();
    let jobs = match args.inflate {
        Some(f) if !(f > 0.0 && f <= 100.0) => anyhow::bail!("--inflate: {f} is not a factor in (0, 100]"),
        Some(f) => kairos_sim::inflate(&jobs, gpus, f, args.seed),
        None => jobs,
    };
    let load = match args.offered_load {
        Some(x) if !(x > 0.0 && x <= 100.0) => anyhow::bail!("--offered-load: {x} is not in (0, 100]"),
        Some(x) => Some(kairos_sim::load_for(&jobs, gpus, x).ok_or_else(|| {
            anyhow::anyhow!("--offered-load: {x} is more than these jobs can offer even all at once")
        })?),
        None => args.load,
    };
    Ok((nodes, jobs, load))
}

/// Blocks (`--cluster BxNxG`): the one policy's replay becomes three — topology-blind,
/// preferred (the cluster names the level) and required (every gang asks it); the configs of
/// the runs, in order (one for all when there are no blocks).
fn topology_runs(
    nodes: &[kairos_sim::TraceNode],
    config: &SimConfig,
    runs: &mut Vec<(String, &kairos_scheduler::policy::Policy, Option<kairos_sim::cloud::BurstSetup>)>,
) -> Vec<SimConfig> {
    use kairos_scheduler::topology::{Topology, TopologyAsk};
    let blocks = nodes.iter().any(|n| n.labels.contains_key(BLOCK));
    let blind = SimConfig { topology_level: blocks.then(|| BLOCK.to_string()), ..config.clone() };
    if !blocks || runs.len() != 1 {
        return vec![blind];
    }
    let (name, policy, _) = runs.remove(0);
    let topology = Topology { levels: vec![BLOCK.into()], ..Default::default() };
    let aware = SimConfig { topology: Some(topology), ..blind.clone() };
    let ask = TopologyAsk { level: BLOCK.into(), required: true, max_domains: 1, relax_after_s: None };
    for label in ["topology-blind", "block preferred", "block required"] {
        runs.push((format!("{name}, {label}"), policy, None));
    }
    vec![blind, aware.clone(), SimConfig { gang_topology: Some(ask), ..aware }]
}

/// The reports: the one policy's QoS table first (as text), then one report (as JSON), or
/// several by name (a JSON object, or a table side by side).
fn print_reports(
    json: bool,
    args: &SimArgs,
    policies: &[(String, kairos_scheduler::policy::Policy)],
    reports: &[(String, kairos_sim::Report)],
) -> anyhow::Result<()> {
    if let ([(name, policy)], false) = (policies, json) {
        match args.policy {
            None => {
                println!("policy: {name} (what a new cluster runs; `kairos qos list` there shows the same)")
            }
            Some(_) => println!("policy: {name}"),
        }
        print_qos(policy);
        println!();
    }
    match (json, reports.len() == 1) {
        (true, true) => println!("{}", serde_json::to_string_pretty(&reports[0].1)?),
        (true, false) => {
            let by_name: serde_json::Map<String, serde_json::Value> = reports
                .iter()
                .map(|(n, r)| Ok((n.clone(), serde_json::to_value(r)?)))
                .collect::<Result<_, serde_json::Error>>()?;
            println!("{}", serde_json::to_string_pretty(&by_name)?)
        }
        (false, _) => println!("{}", kairos_sim::Report::table(reports)),
    }
    Ok(())
}

/// The policies to replay under: --compare's, --policy's, or the shipped one.
fn policies_of(args: &SimArgs) -> anyhow::Result<Vec<(String, kairos_scheduler::policy::Policy)>> {
    Ok(if !args.compare.is_empty() {
        args.compare
            .iter()
            .map(|p| Ok((p.display().to_string(), crate::policy_file::load(p)?)))
            .collect::<anyhow::Result<_>>()?
    } else if let Some(p) = &args.policy {
        vec![(p.display().to_string(), crate::policy_file::load(p)?)]
    } else {
        vec![("shipped".to_string(), kairos_scheduler::policy::Policy::default())]
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_replay_file_is_the_shipped_policy_with_its_limits_lifted() {
        let text = include_str!("../../../deploy/sim/replay.toml");
        let file = crate::policy_file::PolicyFile::parse(text).unwrap();
        let policy = kairos_convert::policy::policy_from_pb(file.to_pb().unwrap()).unwrap();
        assert_eq!(policy, kairos_sim::replay_policy());
    }

    /// docs/policy.md's table of the shipped QoS says what `Policy::default()` is.
    #[test]
    fn the_documented_shipped_policy_is_the_one_a_new_cluster_runs() {
        use kairos_scheduler::policy::{Policy, PreemptMode};
        let doc = include_str!("../../../docs/policy.md");
        let start = doc.find("| QoS | priority | max wall | limits | preempted | preempts |").unwrap();
        let rows: Vec<Vec<&str>> = doc[start..]
            .lines()
            .skip(2)
            .take_while(|l| l.starts_with('|'))
            .map(|l| l.trim_matches('|').split('|').map(str::trim).collect())
            .collect();
        let shipped = Policy::default();
        let names: Vec<&str> = rows.iter().map(|r| r[0].trim_matches('`')).collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(sorted, shipped.qos.keys().map(String::as_str).collect::<Vec<_>>());
        let list = |text: &str| -> Vec<String> {
            let mut v: Vec<String> = text
                .split(',')
                .map(|x| x.trim().trim_matches('`').to_string())
                .filter(|x| x != "—")
                .collect();
            v.sort();
            v
        };
        for r in &rows {
            let q = &shipped.qos[r[0].trim_matches('`')];
            assert_eq!(r[1], q.priority.to_string(), "{r:?}");
            assert_eq!(r[2], format!("{} h", q.max_wall_s / 3600), "{r:?}");
            let limits = match (q.grp_gpus, q.user_jobs) {
                (Some(g), _) => format!("{g} GPUs in total"),
                (None, Some(j)) => format!("{j} jobs per user"),
                (None, None) => "—".to_string(),
            };
            assert_eq!(r[3], limits, "{r:?}");
            let preempted = match (q.preempt_mode, q.grace_s) {
                (PreemptMode::Off, _) => r[4].starts_with("never"),
                (PreemptMode::Requeue, 0) => r[4] == "requeue",
                (PreemptMode::Requeue, g) => r[4] == format!("requeue, {} min grace", g / 60),
                _ => false,
            };
            assert!(preempted, "{r:?}: {:?} grace {}", q.preempt_mode, q.grace_s);
            assert_eq!(r[4].contains("burstable"), q.burstable, "{r:?}");
            assert_eq!(r[4].contains("shares GPUs"), q.gpu_sharing, "{r:?}");
            assert_eq!(list(r[5]), q.preempt.iter().cloned().collect::<Vec<_>>(), "{r:?}");
        }
    }

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        sim: SimArgs,
    }

    /// Time limits are the run time × 2 unless said; a factor that is not positive is refused
    /// before the trace is read.
    #[test]
    fn the_time_limit_factor_defaults_to_the_replays_and_must_be_positive() {
        use clap::Parser;
        let args = Cli::try_parse_from(["sim"]).unwrap().sim;
        assert_eq!(args.time_limit_factor, 2.0);
        for bad in ["0", "-1", "NaN", "1001"] {
            let args = Cli::try_parse_from(["sim", "--time-limit-factor", bad]).unwrap().sim;
            let e = sim(false, args).unwrap_err().to_string();
            assert!(e.starts_with("--time-limit-factor: ") && !e.contains('\n'), "{bad}: {e}");
        }
        let args = Cli::try_parse_from(["sim", "--time-limit-factor", "1.5"]).unwrap().sim;
        assert_eq!(args.time_limit_factor, 1.5);
        // Estimates after every change unless said.
        let every = |a: &[&str]| {
            Cli::try_parse_from(["sim"].iter().chain(a)).map(|c| c.sim.estimate_every.0).map_err(|_| ())
        };
        assert_eq!(every(&[]), Ok(Some(0)));
        assert_eq!(every(&["--estimate-every", "60"]), Ok(Some(60_000)));
        assert_eq!(every(&["--estimate-every", "off"]), Ok(None));
        for bad in ["0", "-5", "1m", "never"] {
            assert_eq!(every(&["--estimate-every", bad]), Err(()), "{bad}");
        }
        // A history keeps its jobs' limits.
        assert!(Cli::try_parse_from(["sim", "--history", "h.jsonl", "--time-limit-factor", "3"]).is_err());
        assert!(Cli::try_parse_from(["sim", "--history", "h.jsonl"]).is_ok());
    }

    #[test]
    fn a_synthetic_cluster_takes_a_model_and_cpus_and_memory() {
        let one = |text: &str| {
            cluster_of(text).map(|n| (n.len(), n[0].gpus, n[0].model.clone(), n[0].cpus, n[0].mem_mib))
        };
        assert_eq!(one("4x8").unwrap(), (4, 8, "sim".into(), 0, 0));
        assert_eq!(one("2x4:A100").unwrap(), (2, 4, "A100".into(), 0, 0));
        assert_eq!(one("2x4:A100:64:512G").unwrap(), (2, 4, "A100".into(), 64, 512 * 1024));
        assert_eq!(one("1x8:16:1024").unwrap(), (1, 8, "sim".into(), 16, 1024));
        for bad in ["4by8", "0x8", "4x8:", "4x8:A100:64", "4x8:A100:0:1G", "4x8:a:b:c:d", "4x8:A 100"] {
            let e = cluster_of(bad).unwrap_err().to_string();
            assert!(e.starts_with("--cluster: ") && !e.contains('\n'), "{bad}: {e}");
        }
    }
}

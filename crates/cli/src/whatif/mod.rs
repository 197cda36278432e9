//! Policy what-if on the cluster's own history: `kairos history --export-trace`, `kairos
//! policy what-if`, `kairos sim --history`, and the comparison `kairos policy apply` shows
//! before it asks for confirmation.
//!
//! The controllers only serve the history, the nodes' event log and the policy; every replay
//! runs here, on the CLI's machine, through the production scheduling core (`kairos_sim`).

pub mod compare;
pub mod export;

use std::path::{Path, PathBuf};

use clap::Args;
use kairos_sim::history::HistoryTrace;
use kairos_sim::SimConfig;

use crate::args::{now_ms, parse_when};
use crate::client::Client;

/// The window `policy what-if` and `policy apply` replay unless told otherwise.
pub const DEFAULT_SINCE: &str = "7d";

#[derive(Args, Debug)]
pub struct WhatIfArgs {
    /// The proposed policy (the `kairos policy apply` format).
    pub proposed: PathBuf,
    /// Replay the jobs live since then: a time ago (`7d`, `12h`), a date or an RFC 3339 time.
    #[arg(long, default_value = DEFAULT_SINCE)]
    pub since: String,
    /// Replay both with cloud burst under this configuration (`kairos burst config apply`
    /// format; its `[sim]` table describes the simulated cloud).
    #[arg(long, value_name = "FILE.toml")]
    pub burst: Option<PathBuf>,
    /// Also draw both replays' wait CDFs and GPU allocation into this SVG.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
}

/// Reads a history trace file.
pub fn read_trace(path: &Path) -> anyhow::Result<HistoryTrace> {
    let meta = std::fs::metadata(path).map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
    // A 30-day window of 200,000 jobs is about 100 MB.
    if meta.len() > 2 << 30 {
        anyhow::bail!("{}: {} bytes is more than a history trace may be (2 GiB)", path.display(), meta.len());
    }
    let text =
        std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
    HistoryTrace::parse(&path.display().to_string(), &text).map_err(anyhow::Error::from)
}

/// The replay's settings for a history: its jobs' own checkpoint behaviour and stop times.
fn config(burst: Option<kairos_sim::cloud::BurstSetup>) -> SimConfig {
    SimConfig { fractions: true, burst, ..SimConfig::default() }
}

/// The cluster's policy, as the core's.
async fn current_policy(client: &Client) -> anyhow::Result<kairos_scheduler::policy::Policy> {
    let pb = crate::client::get_policy(client).await?;
    kairos_convert::policy::policy_from_pb(pb)
        .map_err(|s| anyhow::anyhow!("the cluster's policy: {}", s.message()))
}

/// Fetches the window since `since` and compares `proposed` with the cluster's policy on it.
pub async fn what_if_on_cluster(
    client: &Client,
    proposed: &kairos_scheduler::policy::Policy,
    since: &str,
    burst: Option<&Path>,
) -> anyhow::Result<(compare::Comparison, [compare::Side; 2])> {
    let now = now_ms();
    let since = parse_when(since, now).map_err(|e| anyhow::anyhow!("--since: {e}"))?;
    let trace = export::fetch(client, since, 0, now).await?;
    let current = current_policy(client).await?;
    let burst = burst.map(|p| crate::burst_file::setup_of(p, &current)).transpose()?;
    Ok(compare::compare(&trace, &current, proposed, &config(burst)))
}

/// `kairos policy what-if PROPOSED.toml`.
pub async fn what_if(client: &Client, json: bool, args: WhatIfArgs) -> anyhow::Result<i32> {
    let proposed = crate::policy_file::load(&args.proposed)?;
    let (c, sides) = what_if_on_cluster(client, &proposed, &args.since, args.burst.as_deref()).await?;
    if let Some(path) = &args.plot {
        let series: Vec<(String, kairos_sim::plot::Series)> =
            sides.into_iter().map(|s| (s.name, s.series)).collect();
        std::fs::write(path, kairos_sim::plot::compare_svg(&series))
            .map_err(|e| anyhow::anyhow!("--plot: writing {}: {e}", path.display()))?;
    }
    if json {
        crate::output::print_json(&serde_json::to_value(&c)?);
    } else {
        print!("{}", compare::text(&c));
        println!("summary sha256: {}", c.summary_sha256);
    }
    Ok(0)
}

/// `kairos history --export-trace FILE`: the window as a history trace.
pub async fn export_trace(client: &Client, since: i64, until: i64, path: &Path) -> anyhow::Result<i32> {
    let trace = export::fetch(client, since, until, now_ms()).await?;
    std::fs::write(path, trace.to_jsonl()).map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
    println!(
        "exported {} jobs, {} nodes and {} node changes to {}",
        trace.jobs.len(),
        trace.nodes.len(),
        trace.node_events.len(),
        path.display()
    );
    Ok(0)
}

/// `kairos sim --history FILE [--policy P | --compare A B …]`: the history replayed under each
/// policy (default: the one it was exported under), side by side, each with its fidelity.
pub fn sim_history(
    json: bool,
    path: &Path,
    policies: &[PathBuf],
    burst: Option<&Path>,
    plot: Option<&Path>,
) -> anyhow::Result<i32> {
    let trace = read_trace(path)?;
    let mut named: Vec<(String, kairos_scheduler::policy::Policy)> = Vec::new();
    if policies.is_empty() {
        if trace.window.policy_toml.is_empty() {
            anyhow::bail!(
                "{}: the trace carries no policy: name one with --policy or --compare",
                path.display()
            );
        }
        named.push((
            "exported policy".into(),
            crate::policy_file::load_text(&trace.window.policy_toml, path)?,
        ));
    }
    for p in policies {
        named.push((p.display().to_string(), crate::policy_file::load(p)?));
    }
    let mut sides = Vec::new();
    let mut fidelities = Vec::new();
    for (name, policy) in &named {
        let burst = burst.map(|b| crate::burst_file::setup_of(b, policy)).transpose()?;
        let (side, f) = compare::replay(&trace, policy, &config(burst), name);
        sides.push(side);
        fidelities.push(f);
    }
    if let Some(plot) = plot {
        let series: Vec<(String, kairos_sim::plot::Series)> =
            sides.iter().map(|s| (s.name.clone(), s.series.clone())).collect();
        std::fs::write(plot, kairos_sim::plot::compare_svg(&series))
            .map_err(|e| anyhow::anyhow!("--plot: writing {}: {e}", plot.display()))?;
    }
    if json {
        let out: Vec<serde_json::Value> = sides
            .iter()
            .zip(&fidelities)
            .map(|(s, f)| serde_json::json!({"policy": s.name, "fidelity": f, "report": s.report}))
            .collect();
        crate::output::print_json(&serde_json::Value::Array(out));
        return Ok(0);
    }
    for (s, f) in sides.iter().zip(&fidelities) {
        println!("{}:", s.name);
        for line in compare::fidelity_lines(f) {
            println!("  {line}");
        }
    }
    println!();
    if let [a, b, ..] = &sides[..] {
        println!("{}", compare::table(&a.report, &b.report, [&a.name, &b.name]));
        println!("\nchanges:");
        for s in compare::changes(&a.report, &b.report) {
            println!("  - {s}");
        }
    } else {
        let named: Vec<(String, kairos_sim::Report)> =
            sides.iter().map(|s| (s.name.clone(), s.report.clone())).collect();
        println!("{}", kairos_sim::Report::table(&named));
    }
    Ok(0)
}

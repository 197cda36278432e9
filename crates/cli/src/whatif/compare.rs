//! The what-if: a history replayed under the policy that ran and under a proposed one, side
//! by side, with the fidelity first and the largest changes as sentences. Pure (the replays
//! run here, on the CLI's machine, never on a controller).

use std::collections::BTreeSet;

use kairos_scheduler::policy::Policy;
use kairos_sim::fidelity::{fidelity, Fidelity};
use kairos_sim::history::HistoryTrace;
use kairos_sim::report::Group;
use kairos_sim::{Report, SimConfig};
use serde::Serialize;
use sha2::Digest;

/// Most sentences of changes printed.
const CHANGES_MAX: usize = 12;

/// One replay of the what-if.
pub struct Side {
    pub name: String,
    pub report: Report,
    pub series: kairos_sim::plot::Series,
}

#[derive(Serialize)]
pub struct Comparison {
    /// The replay under the policy that ran, against the record.
    pub fidelity: Fidelity,
    pub current: Report,
    pub proposed: Report,
    /// The largest changes, as sentences.
    pub changes: Vec<String>,
    /// SHA-256 of the printed summary (what `policy apply` records in its audit event).
    pub summary_sha256: String,
}

/// Replays `trace` under `policy`: the report, the plot's series and the fidelity against the
/// record.
pub fn replay(trace: &HistoryTrace, policy: &Policy, config: &SimConfig, name: &str) -> (Side, Fidelity) {
    let replay = kairos_sim::simulate_history(trace, policy, config);
    let f = fidelity(trace, &replay);
    (Side { name: name.to_string(), report: replay.report.rounded(), series: replay.series }, f)
}

/// The what-if of `proposed` against `current` on `trace`.
pub fn compare(
    trace: &HistoryTrace,
    current: &Policy,
    proposed: &Policy,
    config: &SimConfig,
) -> (Comparison, [Side; 2]) {
    let (now, fidelity) = replay(trace, current, config, "current");
    let (then, _) = replay(trace, proposed, config, "proposed");
    let changes = changes(&now.report, &then.report);
    let mut c = Comparison {
        fidelity,
        current: now.report.clone(),
        proposed: then.report.clone(),
        changes,
        summary_sha256: String::new(),
    };
    c.summary_sha256 = hex::encode(sha2::Sha256::digest(text(&c).as_bytes()));
    (c, [now, then])
}

/// A duration in words: `850 ms`, `4 s`, `3 min`, `2.5 h`.
pub fn span(s: f64) -> String {
    if s < 1.0 {
        format!("{:.0} ms", s * 1000.0)
    } else if s < 120.0 {
        format!("{s:.0} s")
    } else if s < 7200.0 {
        format!("{:.0} min", s / 60.0)
    } else {
        format!("{:.1} h", s / 3600.0)
    }
}

/// Whether a wait moved enough to say: by more than a fifth and more than 2 s.
fn moved(a: f64, b: f64) -> bool {
    (b - a).abs() > 2.0 && (b - a).abs() > 0.2 * a.max(b)
}

/// Per QoS and per account: waits that moved, preemptions, jobs started; weighted by how much.
fn group_changes(a: &Report, b: &Report) -> Vec<(f64, String)> {
    let mut out: Vec<(f64, String)> = Vec::new();
    let empty =
        Group { summary: kairos_sim::report::Class::default().summary(), preempted: 0, lost_gpu_hours: 0.0 };
    for (kind, ga, gb) in [("qos", &a.by_qos, &b.by_qos), ("account", &a.by_account, &b.by_account)] {
        let names: BTreeSet<&String> = ga.keys().chain(gb.keys()).collect();
        for name in names {
            let (x, y) = (ga.get(name).unwrap_or(&empty), gb.get(name).unwrap_or(&empty));
            let mut parts = Vec::new();
            let mut weight = 0.0;
            for (label, p, q) in [
                ("p99", x.summary.wait_s.p99, y.summary.wait_s.p99),
                ("p50", x.summary.wait_s.p50, y.summary.wait_s.p50),
            ] {
                if moved(p, q) {
                    parts.push(format!("wait {label} {} → {}", span(p), span(q)));
                    weight += (q - p).abs();
                }
            }
            let d = y.preempted as i64 - x.preempted as i64;
            if kind == "qos" && d != 0 {
                let n = d.unsigned_abs();
                let more = if d > 0 { "more" } else { "fewer" };
                parts.push(format!(
                    "{n} {more} preemption{} of its jobs ({} → {})",
                    if n == 1 { "" } else { "s" },
                    x.preempted,
                    y.preempted
                ));
                weight += n as f64 * 60.0;
            }
            if x.summary.jobs != y.summary.jobs {
                parts.push(format!("{} → {} jobs started", x.summary.jobs, y.summary.jobs));
                weight += (x.summary.jobs as f64 - y.summary.jobs as f64).abs() * 60.0;
            }
            if !parts.is_empty() {
                out.push((weight, format!("{kind} {name}: {}", parts.join("; "))));
            }
        }
    }
    out
}

/// The largest differences between the replays, largest first.
pub fn changes(a: &Report, b: &Report) -> Vec<String> {
    let mut out = group_changes(a, b);
    if (a.utilization - b.utilization).abs() >= 0.01 {
        out.push((
            0.0,
            format!("GPU utilisation {:.1} % → {:.1} %", a.utilization * 100.0, b.utilization * 100.0),
        ));
    }
    if (a.redone_gpu_hours - b.redone_gpu_hours).abs() >= 0.01 {
        out.push((
            0.0,
            format!("GPU-hours lost to preemption {:.2} → {:.2}", a.redone_gpu_hours, b.redone_gpu_hours),
        ));
    }
    if a.unfinished != b.unfinished {
        out.push((f64::MAX, format!("unfinished jobs {} → {}", a.unfinished, b.unfinished)));
    }
    let accounts: BTreeSet<&String> = a.shares.keys().chain(b.shares.keys()).collect();
    for acct in accounts {
        let (x, y) = (a.shares.get(acct).copied().unwrap_or(0.0), b.shares.get(acct).copied().unwrap_or(0.0));
        if (x - y).abs() >= 0.05 {
            out.push((
                0.0,
                format!("account {acct}: fairshare usage share {:.0} % → {:.0} %", x * 100.0, y * 100.0),
            ));
        }
    }
    if let (Some(x), Some(y)) = (&a.burst, &b.burst) {
        if (x.spend_usd - y.spend_usd).abs() >= 0.01 {
            out.push((0.0, format!("burst spend ${:.2} → ${:.2}", x.spend_usd, y.spend_usd)));
        }
    }
    out.sort_by(|p, q| q.0.total_cmp(&p.0).then(p.1.cmp(&q.1)));
    out.into_iter().take(CHANGES_MAX).map(|(_, s)| s).collect()
}

fn waits(g: Option<&Group>) -> String {
    g.map_or("-".into(), |g| {
        format!("{:.1} / {:.1} / {:.1}", g.summary.wait_s.p50, g.summary.wait_s.p90, g.summary.wait_s.p99)
    })
}

/// The side-by-side table: waits p50/p90/p99 and preemptions per QoS and per account, GPU-hours
/// lost, utilisation, fairshare shares at the end, burst spend.
pub fn table(a: &Report, b: &Report, names: [&str; 2]) -> String {
    let mut rows: Vec<[String; 3]> = vec![[String::new(), names[0].into(), names[1].into()]];
    for (kind, ga, gb) in [("qos", &a.by_qos, &b.by_qos), ("account", &a.by_account, &b.by_account)] {
        let keys: BTreeSet<&String> = ga.keys().chain(gb.keys()).collect();
        for k in keys {
            let (x, y) = (ga.get(k), gb.get(k));
            rows.push([format!("{kind} {k}: wait p50 / p90 / p99 (s)"), waits(x), waits(y)]);
            if kind == "qos" {
                let pre = |g: Option<&Group>| {
                    g.map_or("-".into(), |g| format!("{} ({:.2} GPU-h lost)", g.preempted, g.lost_gpu_hours))
                };
                rows.push([format!("qos {k}: preempted"), pre(x), pre(y)]);
            }
        }
    }
    let both = |label: &str, f: &dyn Fn(&Report) -> String| [label.to_string(), f(a), f(b)];
    rows.push(both("jobs (unfinished)", &|r| format!("{} ({})", r.jobs, r.unfinished)));
    rows.push(both("preemptions", &|r| r.preemptions.to_string()));
    rows.push(both("GPU-hours lost to preemption", &|r| format!("{:.2}", r.redone_gpu_hours)));
    rows.push(both("GPU utilisation", &|r| format!("{:.3}", r.utilization)));
    let accounts: BTreeSet<&String> = a.shares.keys().chain(b.shares.keys()).collect();
    for acct in accounts {
        let share = |r: &Report| r.shares.get(acct).map_or("-".into(), |s| format!("{:.1} %", s * 100.0));
        rows.push([format!("account {acct}: fairshare usage share at the end"), share(a), share(b)]);
    }
    if a.burst.is_some() || b.burst.is_some() {
        rows.push(both("burst spend $", &|r| {
            r.burst.as_ref().map_or("-".into(), |x| format!("{:.2}", x.spend_usd))
        }));
    }
    let widths: Vec<usize> =
        (0..3).map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0)).collect();
    rows.iter()
        .map(|r| {
            format!("{:<w0$}  {:<w1$}  {}", r[0], r[1], r[2], w0 = widths[0], w1 = widths[1])
                .trim_end()
                .to_string()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The fidelity as lines: the summary, then the jobs not reproduced (at most 10).
pub fn fidelity_lines(f: &Fidelity) -> Vec<String> {
    let mut out = vec![f.summary()];
    if f.poor {
        out.push("  the replay under the current policy does not reproduce what happened: read the comparison with care".into());
    }
    for m in f.not_reproduced.iter().take(10) {
        out.push(format!("  not reproduced: job {} ({}): {}", m.id, m.name, m.why));
    }
    if f.not_reproduced.len() > 10 {
        out.push(format!("  … and {} more", f.not_reproduced.len() - 10));
    }
    out
}

/// The summary as printed (and hashed): fidelity first, the table, the changes.
pub fn text(c: &Comparison) -> String {
    let mut out = fidelity_lines(&c.fidelity).join("\n");
    out.push_str("\n\n");
    out.push_str(&table(&c.current, &c.proposed, ["current", "proposed"]));
    out.push_str("\n\nchanges:\n");
    if c.changes.is_empty() {
        out.push_str("  none that matter: waits, preemptions and shares move little\n");
    }
    for s in &c.changes {
        out.push_str(&format!("  - {s}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use kairos_sim::history::{HistoryJob, NodeShape, Recorded, Window};

    const T0: i64 = 1_700_000_000_000;

    /// One 4-GPU node: training on all of it, then inference that preempts it.
    fn trace() -> HistoryTrace {
        let job = |id: u64, qos: &str, submit_s: i64, work_s: i64, gpus: u32, starts: &[i64], pre: u32| {
            HistoryJob {
                id,
                name: format!("{qos}-{id}"),
                user: "alice".into(),
                qos: qos.into(),
                profile: qos.into(),
                submit_ms: T0 + submit_s * 1000,
                work_ms: work_s * 1000,
                gpus,
                tasks: 1,
                requeue: true,
                stop_ms: 1000,
                recorded: Recorded {
                    state: "COMPLETED".into(),
                    starts: starts.iter().map(|s| T0 + s * 1000).collect(),
                    end_ms: None,
                    preemptions: pre,
                },
                ..Default::default()
            }
        };
        HistoryTrace {
            window: Window { from_ms: T0, to_ms: T0 + 1_000_000, ..Default::default() },
            nodes: vec![NodeShape {
                name: "n1".into(),
                gpus: 4,
                gpu_model: "fake".into(),
                ..Default::default()
            }],
            node_events: vec![],
            jobs: vec![job(1, "training", 0, 300, 4, &[0, 11], 1), job(2, "inference", 10, 60, 2, &[11], 0)],
        }
    }

    #[test]
    fn taking_away_inference_preemption_shows_as_longer_inference_waits_and_no_preemption() {
        let current = Policy::default();
        let mut proposed = current.clone();
        proposed.qos.get_mut("inference").unwrap().preempt.clear();
        let (c, _) = compare(&trace(), &current, &proposed, &SimConfig::default());
        assert!(!c.fidelity.poor, "{:?}", c.fidelity);
        assert_eq!((c.current.preemptions, c.proposed.preemptions), (1, 0));
        let inf = (&c.current.by_qos["inference"], &c.proposed.by_qos["inference"]);
        assert!(inf.1.summary.wait_s.p99 > inf.0.summary.wait_s.p99 + 200.0, "{inf:?}");
        assert!(
            c.changes.iter().any(|s| s.starts_with("qos inference: wait p99 1 s → 5 min")),
            "{:?}",
            c.changes
        );
        assert!(
            c.changes.iter().any(|s| s.contains("1 fewer preemption of its jobs (1 → 0)")),
            "{:?}",
            c.changes
        );
        let printed = text(&c);
        assert!(printed.starts_with("fidelity: 2/2"), "{printed}");
        assert_eq!(c.summary_sha256, hex::encode(sha2::Sha256::digest(printed.as_bytes())));
        // The same policy twice changes nothing.
        let (same, _) = compare(&trace(), &current, &current, &SimConfig::default());
        assert!(same.changes.is_empty(), "{:?}", same.changes);
        assert!(text(&same).contains("none that matter"));
    }
}

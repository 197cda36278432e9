//! `kairos sim --plot FILE.svg`: the wait CDF of each class and the GPUs allocated over time,
//! as one self-contained SVG (no fonts or scripts beyond the SVG itself).

use std::fmt::Write;

/// What a replay records for its plot.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Series {
    /// Waits (s) of the inference and the training jobs that ran.
    pub inference_waits: Vec<f64>,
    pub training_waits: Vec<f64>,
    /// (ms since the first arrival, GPUs allocated) at every change.
    pub allocation: Vec<(i64, u32)>,
    pub total_gpus: u32,
}

const W: f64 = 900.0;
const H: f64 = 330.0;
const PAD: f64 = 55.0;

fn panel(
    out: &mut String,
    x0: f64,
    title: &str,
    x_label: &str,
    y_label: &str,
    x_ticks: &[(f64, String)],
    y_ticks: &[(f64, String)],
) {
    let (w, h) = (W / 2.0 - PAD * 1.5, H - PAD * 2.0);
    let _ = write!(
        out,
        r##"<rect x="{x0}" y="{PAD}" width="{w}" height="{h}" fill="none" stroke="#888"/><text x="{tx}" y="30" font-size="15" text-anchor="middle">{title}</text><text x="{tx}" y="{xl}" font-size="12" text-anchor="middle">{x_label}</text><text x="{yl}" y="{ty}" font-size="12" text-anchor="middle" transform="rotate(-90 {yl} {ty})">{y_label}</text>"##,
        tx = x0 + w / 2.0,
        xl = H - 12.0,
        yl = x0 - 38.0,
        ty = PAD + h / 2.0,
    );
    for (f, label) in x_ticks {
        let x = x0 + f * w;
        let _ = write!(
            out,
            r##"<line x1="{x:.1}" y1="{b}" x2="{x:.1}" y2="{b2}" stroke="#888"/><text x="{x:.1}" y="{t}" font-size="10" text-anchor="middle">{label}</text>"##,
            b = PAD + h,
            b2 = PAD + h + 4.0,
            t = PAD + h + 16.0
        );
    }
    for (f, label) in y_ticks {
        let y = PAD + h - f * h;
        let _ = write!(
            out,
            r##"<line x1="{a}" y1="{y:.1}" x2="{x0}" y2="{y:.1}" stroke="#888"/><text x="{t}" y="{ty:.1}" font-size="10" text-anchor="end">{label}</text>"##,
            a = x0 - 4.0,
            t = x0 - 6.0,
            ty = y + 3.0
        );
    }
}

/// Points (fractions of the panel, 0..1) as a polyline in the panel at `x0`.
fn line(out: &mut String, x0: f64, points: &[(f64, f64)], colour: &str) {
    let (w, h) = (W / 2.0 - PAD * 1.5, H - PAD * 2.0);
    let coords: Vec<String> = points
        .iter()
        .map(|(fx, fy)| format!("{:.1},{:.1}", x0 + fx.clamp(0.0, 1.0) * w, PAD + h - fy.clamp(0.0, 1.0) * h))
        .collect();
    let _ = write!(
        out,
        r##"<polyline fill="none" stroke="{colour}" stroke-width="1.6" points="{}"/>"##,
        coords.join(" ")
    );
}

/// The CDF of `waits` on a log axis of 1 + wait seconds up to `max_log10`.
fn cdf(waits: &[f64], max_log10: f64) -> Vec<(f64, f64)> {
    let mut sorted = waits.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len().max(1) as f64;
    let step = (sorted.len() / 400).max(1);
    let mut points: Vec<(f64, f64)> = sorted
        .iter()
        .enumerate()
        .filter(|(i, _)| i % step == 0 || *i + 1 == sorted.len())
        .map(|(i, w)| ((1.0 + w).log10() / max_log10, (i + 1) as f64 / n))
        .collect();
    points.insert(0, (0.0, 0.0));
    points
}

/// The whole picture.
pub fn svg(series: &Series) -> String {
    let mut out = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif"><rect width="100%" height="100%" fill="white"/>"##
    );
    panels(&mut out, series);
    out.push_str("</svg>\n");
    out
}

/// `kairos sim --compare … --plot`: the picture of each policy's replay, one row each, under
/// its name.
pub fn compare_svg(named: &[(String, Series)]) -> String {
    let height = H * named.len().max(1) as f64;
    let mut out = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" font-family="sans-serif"><rect width="100%" height="100%" fill="white"/>"##
    );
    for (i, (name, series)) in named.iter().enumerate() {
        let y = H * i as f64;
        let _ = write!(
            out,
            r##"<g transform="translate(0 {y})"><text x="8" y="14" font-size="13" font-weight="bold">{}</text>"##,
            escape(name)
        );
        panels(&mut out, series);
        out.push_str("</g>");
    }
    out.push_str("</svg>\n");
    out
}

/// The wait CDFs and the allocation of one replay, in a picture of height `H`.
fn panels(out: &mut String, series: &Series) {
    // Left: wait CDFs.
    let longest = series.inference_waits.iter().chain(&series.training_waits).fold(1.0f64, |a, b| a.max(*b));
    let max_log10 = (1.0 + longest).log10().ceil().max(1.0);
    let x_ticks: Vec<(f64, String)> = (0..=max_log10 as i32)
        .map(|e| (f64::from(e) / max_log10, format!("{}", 10f64.powi(e) as u64)))
        .collect();
    let y_ticks: Vec<(f64, String)> =
        (0..=4).map(|i| (f64::from(i) / 4.0, format!("{:.2}", f64::from(i) / 4.0))).collect();
    let left = PAD + 10.0;
    panel(out, left, "Wait CDF", "1 + wait (s, log)", "fraction of jobs", &x_ticks, &y_ticks);
    line(out, left, &cdf(&series.inference_waits, max_log10), "#d62728");
    line(out, left, &cdf(&series.training_waits, max_log10), "#1f77b4");
    let _ = write!(
        out,
        r##"<text x="{x}" y="{y}" font-size="12" fill="#d62728">inference ({})</text><text x="{x}" y="{y2}" font-size="12" fill="#1f77b4">training ({})</text>"##,
        series.inference_waits.len(),
        series.training_waits.len(),
        x = left + 10.0,
        y = PAD + 16.0,
        y2 = PAD + 32.0,
    );
    // Right: GPUs allocated over time (a step line, at most ~2,000 points).
    let right = W / 2.0 + PAD;
    let end = series.allocation.last().map_or(1, |(t, _)| (*t).max(1)) as f64;
    let gpus = f64::from(series.total_gpus.max(1));
    let step = (series.allocation.len() / 2000).max(1);
    let mut points = Vec::new();
    let mut previous = 0.0;
    for (i, (t, allocated)) in series.allocation.iter().enumerate() {
        if i % step != 0 && i + 1 != series.allocation.len() {
            continue;
        }
        let x = *t as f64 / end;
        points.push((x, previous));
        previous = f64::from(*allocated) / gpus;
        points.push((x, previous));
    }
    let hours = end / 3_600_000.0;
    let x_ticks: Vec<(f64, String)> =
        (0..=4).map(|i| (f64::from(i) / 4.0, format!("{:.0} h", hours * f64::from(i) / 4.0))).collect();
    let y_ticks: Vec<(f64, String)> =
        (0..=4).map(|i| (f64::from(i) / 4.0, format!("{:.0}", gpus * f64::from(i) / 4.0))).collect();
    panel(out, right, "GPUs allocated", "time since the first arrival", "GPUs", &x_ticks, &y_ticks);
    line(out, right, &points, "#2ca02c");
}

/// Escapes text for the SVG.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// `kairos sim --burst … --plot`: each configuration as a point — spend per simulated day
/// against inference wait p99 (log) — with its name, so the trade-off shows at a glance.
pub fn tradeoff_svg(reports: &[(String, crate::Report)]) -> String {
    let mut out = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif"><rect width="100%" height="100%" fill="white"/>"##
    );
    let spend = |r: &crate::Report| r.burst.as_ref().map_or(0.0, |b| b.spend_per_day_usd);
    let most = reports.iter().map(|(_, r)| spend(r)).fold(1.0f64, f64::max);
    let top = reports.iter().map(|(_, r)| r.inference.wait_s.p99).fold(1.0f64, f64::max);
    let max_log10 = (1.0 + top).log10().ceil().max(1.0);
    let x_ticks: Vec<(f64, String)> =
        (0..=4).map(|i| (f64::from(i) / 4.0, format!("${:.0}", most * f64::from(i) / 4.0))).collect();
    let y_ticks: Vec<(f64, String)> = (0..=max_log10 as i32)
        .map(|e| (f64::from(e) / max_log10, format!("{}", 10f64.powi(e) as u64)))
        .collect();
    let left = PAD + 10.0;
    let title = "Cloud spend vs inference wait";
    panel(
        &mut out,
        left,
        title,
        "spend per simulated day (US$)",
        "1 + inference p99 (s, log)",
        &x_ticks,
        &y_ticks,
    );
    let (w, h) = (W / 2.0 - PAD * 1.5, H - PAD * 2.0);
    let legend = W / 2.0 + PAD;
    for (i, (name, r)) in reports.iter().enumerate() {
        let colour = ["#444", "#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e"][i % 6];
        let (fx, fy) = (spend(r) / most, (1.0 + r.inference.wait_s.p99).log10() / max_log10);
        let (x, y) = (left + fx.clamp(0.0, 1.0) * w, PAD + h - fy.clamp(0.0, 1.0) * h);
        let _ = write!(
            out,
            r##"<circle cx="{x:.1}" cy="{y:.1}" r="5" fill="{colour}"/><text x="{legend}" y="{ly}" font-size="12" fill="{colour}">● {} — p99 {:.1} s, ${:.2}/day</text>"##,
            escape(name),
            r.inference.wait_s.p99,
            spend(r),
            ly = PAD + 16.0 * (i as f64 + 1.0),
        );
    }
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plot_is_an_svg_with_both_panels_and_their_lines() {
        let series = Series {
            inference_waits: vec![0.0, 1.0, 30.0],
            training_waits: vec![5.0, 500.0],
            allocation: vec![(0, 0), (1000, 4), (5000, 8), (9000, 0)],
            total_gpus: 8,
        };
        let svg = svg(&series);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 3, "two CDFs and the allocation");
        assert!(
            svg.contains("inference (3)") && svg.contains("training (2)") && svg.contains("GPUs allocated")
        );
        // Full allocation reaches the top of the panel.
        let top = PAD;
        assert!(svg.contains(&format!(",{top:.1}")), "{svg}");
        // Side by side: every policy's row, under its name.
        let other = Series { training_waits: vec![1.0], ..series.clone() };
        let both = compare_svg(&[("a.toml".into(), series), ("b<c>.toml".into(), other)]);
        assert_eq!(both.matches("<polyline").count(), 6, "three lines per policy");
        assert!(
            both.contains(">a.toml<") && both.contains("b&lt;c&gt;.toml") && both.contains("training (1)")
        );
        assert!(both.contains(&format!("height=\"{}\"", 2.0 * H)));
    }
}

//! The Prometheus text exposition format (version 0.0.4), written directly: one `# HELP` and
//! `# TYPE` per family, label values escaped, histograms with cumulative `le` buckets, `_sum`
//! and `_count`. Families are rendered fresh at every scrape from the daemon's state, so there
//! is no registry: a gauge is what the state says now. `promtool check metrics` passes on the
//! output (e2e `metrics.rs`).

use std::fmt::Write;

/// One scrape's worth of metric families.
#[derive(Default)]
pub struct Exposition {
    out: String,
}

/// Label pairs of one series.
pub type Labels<'a> = &'a [(&'a str, &'a str)];

impl Exposition {
    pub fn new() -> Self {
        Exposition::default()
    }

    /// A gauge family: one sample per label set.
    pub fn gauge(&mut self, name: &str, help: &str, samples: &[(Labels<'_>, f64)]) -> &mut Self {
        self.family(name, help, "gauge", samples)
    }

    /// A counter family (`name` ends in `_total`).
    pub fn counter(&mut self, name: &str, help: &str, samples: &[(Labels<'_>, f64)]) -> &mut Self {
        self.family(name, help, "counter", samples)
    }

    /// A histogram family: one histogram per label set.
    pub fn histogram(&mut self, name: &str, help: &str, series: &[(Labels<'_>, &Histogram)]) -> &mut Self {
        self.header(name, help, "histogram");
        for (labels, h) in series {
            let mut cumulative = 0;
            for (bound, count) in h.bounds.iter().zip(&h.counts) {
                cumulative += count;
                let le = format_value(*bound);
                self.sample(&format!("{name}_bucket"), labels, Some(("le", &le)), cumulative as f64);
            }
            self.sample(&format!("{name}_bucket"), labels, Some(("le", "+Inf")), h.count as f64);
            self.sample(&format!("{name}_sum"), labels, None, h.sum);
            self.sample(&format!("{name}_count"), labels, None, h.count as f64);
        }
        self
    }

    /// The text, ready to serve.
    pub fn finish(self) -> String {
        self.out
    }

    fn family(&mut self, name: &str, help: &str, kind: &str, samples: &[(Labels<'_>, f64)]) -> &mut Self {
        self.header(name, help, kind);
        for (labels, value) in samples {
            self.sample(name, labels, None, *value);
        }
        self
    }

    fn header(&mut self, name: &str, help: &str, kind: &str) {
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: Labels<'_>, extra: Option<(&str, &str)>, value: f64) {
        self.out.push_str(name);
        let all: Vec<(&str, &str)> = labels.iter().copied().chain(extra).collect();
        if !all.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in all.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape(v));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {}", format_value(value));
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

fn format_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        format!("{v}")
    }
}

/// A histogram of observations with fixed upper bounds (buckets are not cumulative here; the
/// exposition accumulates them).
#[derive(Clone, Debug, PartialEq)]
pub struct Histogram {
    bounds: Vec<f64>,
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    /// An empty histogram with these ascending upper bounds (an implicit `+Inf` follows).
    pub fn new(bounds: &[f64]) -> Self {
        Histogram { bounds: bounds.to_vec(), counts: vec![0; bounds.len()], sum: 0.0, count: 0 }
    }

    pub fn observe(&mut self, v: f64) {
        if let Some(i) = self.bounds.iter().position(|b| v <= *b) {
            self.counts[i] += 1;
        }
        self.sum += v;
        self.count += 1;
    }

    pub fn count(&self) -> u64 {
        self.count
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_render_in_the_text_format_with_escaped_labels_and_cumulative_buckets() {
        let mut h = Histogram::new(&[0.5, 1.0]);
        for v in [0.1, 0.7, 0.9, 3.0] {
            h.observe(v);
        }
        let mut e = Exposition::new();
        e.gauge("kairos_up", "Up.", &[(&[], 1.0)]);
        e.counter("kairos_x_total", "X.", &[(&[("mode", "a\"b")], 2.0)]);
        e.histogram("kairos_wait_seconds", "Wait.", &[(&[("qos", "batch")], &h)]);
        let text = e.finish();
        let want = "# HELP kairos_up Up.\n# TYPE kairos_up gauge\nkairos_up 1\n\
            # HELP kairos_x_total X.\n# TYPE kairos_x_total counter\nkairos_x_total{mode=\"a\\\"b\"} 2\n\
            # HELP kairos_wait_seconds Wait.\n# TYPE kairos_wait_seconds histogram\n\
            kairos_wait_seconds_bucket{qos=\"batch\",le=\"0.5\"} 1\n\
            kairos_wait_seconds_bucket{qos=\"batch\",le=\"1\"} 3\n\
            kairos_wait_seconds_bucket{qos=\"batch\",le=\"+Inf\"} 4\n\
            kairos_wait_seconds_sum{qos=\"batch\"} 4.7\n\
            kairos_wait_seconds_count{qos=\"batch\"} 4\n";
        assert_eq!(text, want);
    }
}

//! The Prometheus text exposition format (version 0.0.4), written by hand: one `# HELP` and one
//! `# TYPE` line per metric family, then its samples, label values escaped.

use std::fmt::{Display, Write};

/// The `Content-Type` of a scrape answer.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Kind of a metric family (`# TYPE` line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// Accumulates one scrape's text.
#[derive(Debug, Default)]
pub struct TextWriter {
    out: String,
}

impl TextWriter {
    pub fn new() -> Self {
        TextWriter::default()
    }

    /// Start a metric family: its `# HELP` and `# TYPE` lines.
    pub fn family(&mut self, name: &str, kind: Kind, help: &str) {
        let _ = writeln!(
            self.out,
            "# HELP {name} {}\n# TYPE {name} {}",
            escape_help(help),
            kind.as_str()
        );
    }

    /// One sample line: `name{l1="v1",l2="v2"} value`.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl Display) {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape_label(v));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
    }

    /// A histogram's samples from per-bucket (non-cumulative) counts; `counts` has one more entry
    /// than `bounds` (the +Inf overflow bucket). `sum` is in the unit of `bounds`.
    pub fn histogram(
        &mut self,
        name: &str,
        labels: &[(&str, &str)],
        bounds: &[f64],
        counts: &[u64],
        sum: f64,
    ) {
        let bucket = format!("{name}_bucket");
        let mut cumulative: u64 = 0;
        for (i, count) in counts.iter().enumerate() {
            cumulative = cumulative.saturating_add(*count);
            let le = match bounds.get(i) {
                Some(b) => format_float(*b),
                None => "+Inf".to_owned(),
            };
            let mut with_le: Vec<(&str, &str)> = labels.to_vec();
            with_le.push(("le", &le));
            self.sample(&bucket, &with_le, cumulative);
        }
        self.sample(&format!("{name}_sum"), labels, format_float(sum));
        self.sample(&format!("{name}_count"), labels, cumulative);
    }

    pub fn finish(self) -> String {
        self.out
    }
}

/// A float as Prometheus reads it (Rust's `Display` never uses exponents; integers keep no
/// fraction).
pub fn format_float(v: f64) -> String {
    if v.is_nan() {
        "NaN".to_owned()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.to_owned()
    } else {
        format!("{v}")
    }
}

/// Label values: backslash, double quote and newline are escaped.
pub fn escape_label(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

/// HELP text: backslash and newline are escaped.
pub fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn family_and_samples() {
        let mut w = TextWriter::new();
        w.family("x_total", Kind::Counter, "Things.\nMore \\ things");
        w.sample("x_total", &[], 3);
        w.sample("x_total", &[("op", "LOOKUP"), ("errno", "ENOENT")], 7u64);
        assert_eq!(
            w.finish(),
            "# HELP x_total Things.\\nMore \\\\ things\n# TYPE x_total counter\n\
             x_total 3\nx_total{op=\"LOOKUP\",errno=\"ENOENT\"} 7\n"
        );
    }

    #[test]
    fn label_values_are_escaped() {
        let mut w = TextWriter::new();
        w.sample("g", &[("path", "a\"b\\c\nd")], 1);
        assert_eq!(w.finish(), "g{path=\"a\\\"b\\\\c\\nd\"} 1\n");
    }

    #[test]
    fn histogram_is_cumulative_with_inf_sum_and_count() {
        let mut w = TextWriter::new();
        w.histogram("h", &[("op", "READ")], &[0.001, 0.5], &[2, 0, 1], 1.25);
        assert_eq!(
            w.finish(),
            "h_bucket{op=\"READ\",le=\"0.001\"} 2\n\
             h_bucket{op=\"READ\",le=\"0.5\"} 2\n\
             h_bucket{op=\"READ\",le=\"+Inf\"} 3\n\
             h_sum{op=\"READ\"} 1.25\n\
             h_count{op=\"READ\"} 3\n"
        );
    }

    #[test]
    fn floats() {
        assert_eq!(format_float(0.00005), "0.00005");
        assert_eq!(format_float(5.0), "5");
        assert_eq!(format_float(f64::INFINITY), "+Inf");
        assert_eq!(format_float(f64::NAN), "NaN");
    }
}

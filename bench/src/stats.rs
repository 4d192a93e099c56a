//! Aggregation over rounds, the markdown table and the JSON output.

use std::fmt::Write as _;

use crate::workload::Sample;

#[derive(Debug, Clone, Default)]
pub struct Summary {
    pub rounds: usize,
    pub ops: u64,
    pub requests: u64,
    pub errors: u64,
    /// Median over rounds of ops/s.
    pub ops_per_s: f64,
    pub mib_per_s: f64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    pub notes: Vec<String>,
    pub first_error: Option<String>,
    /// MDS requests over all rounds that reported them, and per operation.
    pub mds_requests: Option<u64>,
    pub mds_per_op: Option<f64>,
}

/// Nearest-rank percentile of a sorted slice (q in 0..=1).
pub fn percentile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Pools the latencies of all rounds; throughput is the median of the per-round rates.
pub fn summarize(samples: &[Sample]) -> Summary {
    let mut lat: Vec<u64> = samples
        .iter()
        .flat_map(|s| s.lat_ns.iter().copied())
        .collect();
    lat.sort_unstable();
    let rate = |f: &dyn Fn(&Sample) -> f64| {
        median(
            samples
                .iter()
                .filter(|s| !s.wall.is_zero())
                .map(|s| f(s) / s.wall.as_secs_f64())
                .collect(),
        )
    };
    let us = |q: f64| percentile(&lat, q) as f64 / 1000.0;
    let mut notes: Vec<String> = samples
        .iter()
        .flat_map(|s| s.notes.iter().cloned())
        .collect();
    notes.sort();
    notes.dedup();
    // Only rounds that know their MDS request count contribute (requests, ops).
    let mds = samples
        .iter()
        .filter_map(|s| s.mds_requests.map(|r| (r, s.ops)))
        .fold(None, |acc: Option<(u64, u64)>, (r, o)| {
            let (ar, ao) = acc.unwrap_or((0, 0));
            Some((ar + r, ao + o))
        });
    Summary {
        rounds: samples.len(),
        ops: samples.iter().map(|s| s.ops).sum(),
        requests: samples.iter().map(|s| s.requests).sum(),
        errors: samples.iter().map(|s| s.errors).sum(),
        ops_per_s: rate(&|s| s.ops as f64),
        mib_per_s: rate(&|s| s.bytes as f64 / 1_048_576.0),
        p50_us: us(0.50),
        p90_us: us(0.90),
        p99_us: us(0.99),
        p999_us: us(0.999),
        max_us: lat.last().map_or(0.0, |m| *m as f64 / 1000.0),
        notes,
        first_error: samples.iter().find_map(|s| s.first_error.clone()),
        mds_requests: mds.map(|(r, _)| r),
        mds_per_op: mds.and_then(|(r, ops)| (ops > 0).then(|| r as f64 / ops as f64)),
    }
}

/// One row of results: workload × target.
#[derive(Debug, Clone)]
pub struct Row {
    pub workload: String,
    pub bandwidth: bool,
    pub target: String,
    pub summary: Summary,
}

fn ratio(a: f64, base: f64) -> String {
    if base > 0.0 {
        format!("{:.2}×", a / base)
    } else {
        "–".into()
    }
}

/// A markdown table; ratios are against each of `baselines` (throughput: higher is better;
/// p50/p99: lower is better). "MDS req/op" is MDS requests per operation (– when unknown).
pub fn table(rows: &[Row], baselines: &[String]) -> String {
    let mut t = String::new();
    let _ = write!(t, "| workload | target | ops/s | MiB/s | p50 µs | p90 µs | p99 µs | p99.9 µs | max µs | errors | MDS req/op |");
    let mut sep = String::from("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for b in baselines {
        let _ = write!(t, " thr vs {b} | p50 vs {b} | p99 vs {b} |");
        sep.push_str("---:|---:|---:|");
    }
    let _ = writeln!(t);
    let _ = writeln!(t, "{sep}");
    for r in rows {
        let s = &r.summary;
        let thr = if r.bandwidth {
            s.mib_per_s
        } else {
            s.ops_per_s
        };
        let mib = if r.bandwidth {
            format!("{:.1}", s.mib_per_s)
        } else {
            "".into()
        };
        let mds = match s.mds_per_op {
            Some(0.0) => "0".to_string(),
            Some(v) if v < 0.01 => format!("{v:.4}"),
            Some(v) => format!("{v:.2}"),
            None => "–".into(),
        };
        let _ = write!(
            t,
            "| {} | {} | {:.0} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {} | {} |",
            r.workload,
            r.target,
            s.ops_per_s,
            mib,
            s.p50_us,
            s.p90_us,
            s.p99_us,
            s.p999_us,
            s.max_us,
            s.errors,
            mds,
        );
        for baseline in baselines {
            let base = rows
                .iter()
                .find(|b| b.workload == r.workload && &b.target == baseline)
                .map(|b| &b.summary);
            let (tr, p50r, p99r) = match base {
                Some(b) => (
                    ratio(
                        thr,
                        if r.bandwidth {
                            b.mib_per_s
                        } else {
                            b.ops_per_s
                        },
                    ),
                    ratio(s.p50_us, b.p50_us),
                    ratio(s.p99_us, b.p99_us),
                ),
                None => ("–".into(), "–".into(), "–".into()),
            };
            let _ = write!(t, " {tr} | {p50r} | {p99r} |");
        }
        let _ = writeln!(t);
    }
    t
}

fn jstr(s: &str) -> String {
    let mut o = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

fn jnum(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.3}")
    } else {
        "null".into()
    }
}

/// JSON for plotting: summaries plus each round's raw numbers.
pub fn json(
    rows: &[Row],
    rounds: &[(usize, String, String, Sample)],
    meta: &[(String, String)],
) -> String {
    let mut o = String::from("{\n  \"meta\": {");
    let m: Vec<String> = meta
        .iter()
        .map(|(k, v)| format!("{}: {}", jstr(k), jstr(v)))
        .collect();
    o.push_str(&m.join(", "));
    o.push_str("},\n  \"summary\": [\n");
    let rs: Vec<String> = rows
        .iter()
        .map(|r| {
            let s = &r.summary;
            format!(
                "    {{\"workload\": {}, \"target\": {}, \"rounds\": {}, \"ops\": {}, \"requests\": {}, \"errors\": {}, \"ops_per_s\": {}, \"mib_per_s\": {}, \"p50_us\": {}, \"p90_us\": {}, \"p99_us\": {}, \"p999_us\": {}, \"max_us\": {}, \"mds_requests\": {}, \"mds_per_op\": {}, \"notes\": [{}]}}",
                jstr(&r.workload), jstr(&r.target), s.rounds, s.ops, s.requests, s.errors, jnum(s.ops_per_s), jnum(s.mib_per_s),
                jnum(s.p50_us), jnum(s.p90_us), jnum(s.p99_us), jnum(s.p999_us), jnum(s.max_us),
                s.mds_requests.map_or("null".into(), |v| v.to_string()), s.mds_per_op.map_or("null".into(), |v| format!("{v:.6}")),
                s.notes.iter().map(|n| jstr(n)).collect::<Vec<_>>().join(", ")
            )
        })
        .collect();
    o.push_str(&rs.join(",\n"));
    o.push_str("\n  ],\n  \"rounds\": [\n");
    let rr: Vec<String> = rounds
        .iter()
        .map(|(round, target, w, s)| {
            let mut lat = s.lat_ns.clone();
            lat.sort_unstable();
            format!(
                "    {{\"round\": {round}, \"target\": {}, \"workload\": {}, \"ops\": {}, \"requests\": {}, \"bytes\": {}, \"wall_s\": {}, \"errors\": {}, \"p50_us\": {}, \"p99_us\": {}, \"mds_requests\": {}}}",
                jstr(target), jstr(w), s.ops, s.requests, s.bytes, jnum(s.wall.as_secs_f64()), s.errors,
                jnum(percentile(&lat, 0.5) as f64 / 1000.0), jnum(percentile(&lat, 0.99) as f64 / 1000.0),
                s.mds_requests.map_or("null".into(), |v| v.to_string())
            )
        })
        .collect();
    o.push_str(&rr.join(",\n"));
    o.push_str("\n  ]\n}\n");
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 0.5), 50);
        assert_eq!(percentile(&v, 0.99), 99);
        assert_eq!(percentile(&v, 0.999), 100);
        assert_eq!(percentile(&v, 0.0), 1);
        assert_eq!(percentile(&[], 0.5), 0);
    }

    #[test]
    fn summary_uses_median_rate_and_pools_latency() {
        let s = |ops, secs, lat: Vec<u64>| Sample {
            ops,
            wall: Duration::from_secs(secs),
            lat_ns: lat,
            ..Sample::default()
        };
        let m = summarize(&[
            s(100, 1, vec![1000, 3000]),
            s(100, 2, vec![2000]),
            s(100, 4, vec![4000]),
        ]);
        assert_eq!(m.ops_per_s, 50.0);
        assert_eq!(m.p50_us, 2.0);
        assert_eq!(m.max_us, 4.0);
    }

    #[test]
    fn mds_requests_per_op_only_from_rounds_that_counted() {
        let s = |ops, mds| Sample {
            ops,
            wall: Duration::from_secs(1),
            mds_requests: mds,
            ..Sample::default()
        };
        let m = summarize(&[s(100, Some(0)), s(100, Some(0))]);
        assert_eq!(m.mds_per_op, Some(0.0));
        let m = summarize(&[s(100, Some(300)), s(50, None)]);
        assert_eq!(m.mds_requests, Some(300));
        assert_eq!(m.mds_per_op, Some(3.0));
        assert_eq!(summarize(&[s(100, None)]).mds_per_op, None);
    }

    #[test]
    fn table_has_ratios_against_baseline() {
        let row = |t: &str, ops| Row {
            workload: "w".into(),
            bandwidth: false,
            target: t.into(),
            summary: Summary {
                ops_per_s: ops,
                p50_us: 10.0,
                p99_us: 20.0,
                ..Summary::default()
            },
        };
        let t = table(
            &[row("a", 100.0), row("b", 150.0)],
            &["a".into(), "b".into()],
        );
        assert!(t.contains("| w | b | 150 |"));
        assert!(t.contains("1.50×"));
        assert!(t.contains("0.67×"));
        assert!(t.contains("thr vs b"));
    }

    #[test]
    fn json_escapes() {
        assert_eq!(jstr("a\"b\\c\n"), "\"a\\\"b\\\\c\\u000a\"");
    }
}

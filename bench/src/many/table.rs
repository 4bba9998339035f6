//! The many workload's table: per subject, the medians over repeats of the closed
//! loop's throughput and server CPU per call, the open loop's p50 and p99, and the
//! server's memory per connection, each as a ratio to a baseline subject of the same
//! run.

use std::fmt::Write as _;

use super::ManyPhase;
use crate::{report::BenchResult, stats};

/// One column: which phase, what it reads, how it prints.
struct Column {
    header: &'static str,
    phase: ManyPhase,
    metric: fn(&BenchResult) -> f64,
    format: fn(f64) -> String,
    /// A ratio to the baseline (else the subject's own value only).
    ratio: bool,
}

fn per_second(v: f64) -> String {
    format!("{:.1} k/s", v / 1e3)
}

fn micros(v: f64) -> String {
    format!("{v:.1} µs")
}

fn kib(v: f64) -> String {
    format!("{:.1} KiB", v / 1024.0)
}

const COLUMNS: [Column; 7] = [
    Column {
        header: "peak calls/s",
        phase: ManyPhase::Closed,
        metric: |r| r.calls_per_s,
        format: per_second,
        ratio: true,
    },
    Column {
        header: "server cpu/call",
        phase: ManyPhase::Closed,
        metric: |r| server_cpu_us_per_call(r),
        format: micros,
        ratio: true,
    },
    Column {
        header: "closed-loop p50",
        phase: ManyPhase::Closed,
        metric: |r| r.lat.p50_us,
        format: micros,
        ratio: true,
    },
    Column {
        header: "open-loop p50",
        phase: ManyPhase::Open,
        metric: |r| r.lat.p50_us,
        format: micros,
        ratio: true,
    },
    Column {
        header: "open-loop p99",
        phase: ManyPhase::Open,
        metric: |r| r.lat.p99_us,
        format: micros,
        ratio: true,
    },
    Column {
        header: "open-loop p99/p50",
        phase: ManyPhase::Open,
        metric: |r| r.lat.p99_us / r.lat.p50_us.max(1e-9),
        format: |v| format!("{v:.2}"),
        ratio: false,
    },
    Column {
        header: "server memory/conn",
        phase: ManyPhase::Closed,
        metric: |r| r.many.as_ref().map_or(0.0, |m| m.bytes_per_connection()),
        format: kib,
        ratio: true,
    },
];

/// Server CPU microseconds per call (the server process's, every thread).
pub(crate) fn server_cpu_us_per_call(r: &BenchResult) -> f64 {
    if r.calls == 0 {
        0.0
    } else {
        r.server_cpu_s * 1e6 / r.calls as f64
    }
}

impl Column {
    fn median(&self, results: &[BenchResult], subject: &str) -> Option<f64> {
        let values: Vec<f64> = results
            .iter()
            .filter(|r| r.subject == subject)
            .filter(|r| r.many.as_ref().is_some_and(|m| m.phase == self.phase))
            .map(self.metric)
            .collect();
        stats::median(&values)
    }
}

/// The markdown table of the many results, ratios to `baseline`; empty when there
/// are none.
pub(crate) fn table(results: &[BenchResult], repeats: usize, baseline: &str) -> String {
    let mut subjects: Vec<&str> = Vec::new();
    for r in results.iter().filter(|r| r.many.is_some()) {
        if !subjects.contains(&r.subject) {
            subjects.push(r.subject);
        }
    }
    let Some(shape) = results.iter().find_map(|r| r.many.as_ref()) else {
        return String::new();
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Many connections: {} connections, {} calls in flight on each (closed loop), then \
         calls on a schedule at {} of the peak rate (open loop); ratios to {baseline} \
         (median over {repeats} repeat(s); the subject's median in parentheses; p99/p50 \
         is the subject's own). Server memory/conn: VmRSS during the closed loop minus \
         before connecting, per connection.\n",
        shape.connections, shape.in_flight, shape.open_load
    );
    out.push_str("| subject |");
    for c in &COLUMNS {
        let _ = write!(out, " {} |", c.header);
    }
    out.push_str("\n| --- |");
    out.push_str(&" ---: |".repeat(COLUMNS.len()));
    out.push('\n');
    for subject in subjects {
        let _ = write!(out, "| {subject} |");
        for c in &COLUMNS {
            let cell = match (c.median(results, subject), c.median(results, baseline)) {
                (None, _) => "n/a".to_string(),
                (Some(v), _) if !c.ratio => (c.format)(v),
                (Some(v), Some(base)) if base > 0.0 => {
                    format!("{:.2}× ({})", v / base, (c.format)(v))
                }
                (Some(v), _) => format!("n/a ({})", (c.format)(v)),
            };
            let _ = write!(out, " {cell} |");
        }
        out.push('\n');
    }
    out
}

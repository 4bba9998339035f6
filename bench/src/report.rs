//! Output: one JSON object per result, a markdown table of ratios to a baseline subject
//! (`raw-tcp` unless `--baseline` says otherwise), and an SVG of latency CDFs.
//!
//! Definitions: `calls_per_s` = calls / wall_s; `mib_per_s` = request payload bytes
//! per second / 2^20 (one direction: the echo moves as many bytes back);
//! `cpu_us_per_call` = (server_cpu_s + client_cpu_s) * 1e6 / calls, where each CPU
//! time is that thread's `CLOCK_THREAD_CPUTIME_ID` over the measured phase. In the
//! connect workload a "call" is a connection (connect, one call, drop): `calls_per_s`
//! is connections per second and the latencies are whole connections.

use std::fmt::Write as _;

use crate::{
    lossy::LossOutcome,
    many::ManyOutcome,
    stats::{self, LatencySummary},
    subjects::BenchSubject,
    workloads::{Measurement, Workload},
};

/// One result line.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct BenchResult {
    /// Subject name.
    pub(crate) subject: &'static str,
    /// Workload name.
    pub(crate) workload: &'static str,
    /// Bytes of payload per request.
    pub(crate) payload_bytes: usize,
    /// Calls in flight at once.
    pub(crate) concurrency: usize,
    /// Measured calls.
    pub(crate) calls: u64,
    /// Wall-clock seconds of the measured phase.
    pub(crate) wall_s: f64,
    /// Calls per second.
    pub(crate) calls_per_s: f64,
    /// Request payload MiB per second.
    pub(crate) mib_per_s: f64,
    /// Per-call latency percentiles.
    pub(crate) lat: LatencySummary,
    /// CPU seconds of the server thread.
    pub(crate) server_cpu_s: f64,
    /// CPU seconds of the client thread.
    pub(crate) client_cpu_s: f64,
    /// Microseconds of CPU (both threads) per call.
    pub(crate) cpu_us_per_call: f64,
    /// The lossy workload's loss rate and deadline misses (extra JSON fields).
    pub(crate) loss: Option<LossOutcome>,
    /// The many workload's phase, server memory and second latency summary (extra
    /// JSON fields).
    pub(crate) many: Option<ManyOutcome>,
}

/// `a / b`, or 0 when `b` is 0.
fn per(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

impl BenchResult {
    /// The result of `m`, a measurement of `subject` under `workload`.
    pub(crate) fn new(subject: impl BenchSubject, workload: Workload, m: &Measurement) -> Self {
        let wall_s = m.wall.as_secs_f64();
        let calls = m.calls as f64;
        let server_cpu_s = m.server_cpu.as_secs_f64();
        let client_cpu_s = m.client_cpu.as_secs_f64();
        BenchResult {
            subject: subject.name(),
            workload: workload.name(),
            payload_bytes: m.payload_bytes,
            concurrency: m.concurrency,
            calls: m.calls,
            wall_s,
            calls_per_s: per(calls, wall_s),
            mib_per_s: per(calls * m.payload_bytes as f64, wall_s) / f64::from(1 << 20),
            // The many workload's samples stay in its client process, which sends
            // their summary.
            lat: m.many.as_ref().map_or_else(
                || LatencySummary::from_sorted(&m.samples),
                |many| many.lat.clone(),
            ),
            server_cpu_s,
            client_cpu_s,
            cpu_us_per_call: per((server_cpu_s + client_cpu_s) * 1e6, calls),
            loss: m.loss.clone(),
            many: m.many.clone(),
        }
    }

    /// The JSON line (no newline), keys in the documented order; a lossy result's
    /// fields ([`LossOutcome::json_fields`]) or a many result's
    /// ([`ManyOutcome::json_fields`]) come last.
    pub(crate) fn to_json(&self) -> String {
        let l = &self.lat;
        let json = format!(
            concat!(
                r#"{{"kind":"result","subject":"{}","workload":"{}","payload_bytes":{},"#,
                r#""concurrency":{},"calls":{},"wall_s":{},"calls_per_s":{},"mib_per_s":{},"#,
                r#""lat_us":{{"p50_us":{},"p90_us":{},"p99_us":{},"p999_us":{},"max_us":{},"#,
                r#""mean_us":{},"samples":{}}},"server_cpu_s":{},"client_cpu_s":{},"#,
                r#""cpu_us_per_call":{}}}"#
            ),
            json_escape(self.subject),
            json_escape(self.workload),
            self.payload_bytes,
            self.concurrency,
            self.calls,
            num(self.wall_s, 6),
            num(self.calls_per_s, 1),
            num(self.mib_per_s, 3),
            num(l.p50_us, 3),
            num(l.p90_us, 3),
            num(l.p99_us, 3),
            num(l.p999_us, 3),
            num(l.max_us, 3),
            num(l.mean_us, 3),
            l.samples,
            num(self.server_cpu_s, 6),
            num(self.client_cpu_s, 6),
            num(self.cpu_us_per_call, 3),
        );
        let extra = match (&self.loss, &self.many) {
            (Some(loss), _) => loss.json_fields(),
            (None, Some(many)) => many.json_fields(crate::many::server_cpu_us_per_call(self)),
            (None, None) => return json,
        };
        format!("{},{extra}}}", &json[..json.len() - 1])
    }
}

/// A JSON number with `decimals` places (JSON has no NaN or infinity: those print 0).
fn num(x: f64, decimals: usize) -> String {
    if x.is_finite() {
        format!("{x:.decimals$}")
    } else {
        "0".into()
    }
}

/// Escapes a string for a JSON string literal.
fn json_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out
}

/// How a table column's absolute value prints.
#[derive(Clone, Copy)]
enum Unit {
    Micros,
    PerSecond,
    MibPerSecond,
}

impl Unit {
    fn format(self, v: f64) -> String {
        match self {
            Unit::Micros => format!("{v:.1} µs"),
            Unit::PerSecond if v >= 1e3 => format!("{:.1} k/s", v / 1e3),
            Unit::PerSecond => format!("{v:.0} /s"),
            Unit::MibPerSecond => format!("{v:.0} MiB/s"),
        }
    }
}

/// Which of a workload's results a column reads.
#[derive(Clone, Copy)]
enum Select {
    /// Every result.
    All,
    /// Those with this payload size.
    Payload(usize),
    /// Those with one call (or connection) at a time.
    Sequential,
    /// Those with more than one at a time.
    Concurrent,
}

impl Select {
    fn matches(self, r: &BenchResult) -> bool {
        match self {
            Select::All => true,
            Select::Payload(bytes) => r.payload_bytes == bytes,
            Select::Sequential => r.concurrency == 1,
            Select::Concurrent => r.concurrency > 1,
        }
    }
}

/// One column of the ratio table.
struct Column {
    header: &'static str,
    workload: Workload,
    select: Select,
    metric: fn(&BenchResult) -> f64,
    unit: Unit,
    /// Shown only when the results include the workload (the call workloads' columns
    /// always are, with n/a when not measured).
    optional: bool,
}

const COLUMNS: [Column; 8] = [
    Column {
        header: "latency p50",
        workload: Workload::Latency,
        select: Select::All,
        metric: |r| r.lat.p50_us,
        unit: Unit::Micros,
        optional: false,
    },
    Column {
        header: "latency cpu/call",
        workload: Workload::Latency,
        select: Select::All,
        metric: |r| r.cpu_us_per_call,
        unit: Unit::Micros,
        optional: false,
    },
    Column {
        header: "throughput calls/s",
        workload: Workload::Throughput,
        select: Select::All,
        metric: |r| r.calls_per_s,
        unit: Unit::PerSecond,
        optional: false,
    },
    Column {
        header: "throughput cpu/call",
        workload: Workload::Throughput,
        select: Select::All,
        metric: |r| r.cpu_us_per_call,
        unit: Unit::Micros,
        optional: false,
    },
    Column {
        header: "bulk 16 MiB MiB/s",
        workload: Workload::Bulk,
        select: Select::Payload(16 << 20),
        metric: |r| r.mib_per_s,
        unit: Unit::MibPerSecond,
        optional: false,
    },
    Column {
        header: "bulk 1 MiB MiB/s",
        workload: Workload::Bulk,
        select: Select::Payload(1 << 20),
        metric: |r| r.mib_per_s,
        unit: Unit::MibPerSecond,
        optional: false,
    },
    Column {
        header: "connect conns/s, sequential",
        workload: Workload::Connect,
        select: Select::Sequential,
        metric: |r| r.calls_per_s,
        unit: Unit::PerSecond,
        optional: true,
    },
    Column {
        header: "connect conns/s, concurrent",
        workload: Workload::Connect,
        select: Select::Concurrent,
        metric: |r| r.calls_per_s,
        unit: Unit::PerSecond,
        optional: true,
    },
];

/// The subject the ratios divide by unless `--baseline` names another.
pub(crate) const DEFAULT_BASELINE: &str = "raw-tcp";

impl Column {
    /// The median of this column's metric over `subject`'s results (one per repeat).
    fn median(&self, results: &[BenchResult], subject: &str) -> Option<f64> {
        let values: Vec<f64> = results
            .iter()
            .filter(|r| {
                r.subject == subject && r.workload == self.workload.name() && self.select.matches(r)
            })
            .map(self.metric)
            .collect();
        stats::median(&values)
    }
}

/// The markdown table of each subject's medians (over repeats) divided by `baseline`'s
/// medians from the same run, with the subject's own median in parentheses.
pub(crate) fn ratio_table(results: &[BenchResult], repeats: usize, baseline: &str) -> String {
    let mut subjects: Vec<&str> = Vec::new();
    for r in results {
        if !subjects.contains(&r.subject) {
            subjects.push(r.subject);
        }
    }
    let columns: Vec<&Column> = COLUMNS
        .iter()
        .filter(|c| !c.optional || results.iter().any(|r| r.workload == c.workload.name()))
        .collect();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Ratios to {baseline} (median over {repeats} repeat(s); the subject's median in \
         parentheses). Lower is better for latency and cpu/call, higher for calls/s, \
         MiB/s and conns/s; n/a: not measured.\n"
    );
    out.push_str("| subject |");
    for c in &columns {
        let _ = write!(out, " {} |", c.header);
    }
    out.push_str("\n| --- |");
    out.push_str(&" ---: |".repeat(columns.len()));
    out.push('\n');
    for subject in subjects {
        let _ = write!(out, "| {subject} |");
        for c in &columns {
            let cell = match (c.median(results, subject), c.median(results, baseline)) {
                (None, _) => "n/a".to_string(),
                (Some(v), Some(base)) if base > 0.0 => {
                    format!("{:.2}× ({})", v / base, c.unit.format(v))
                }
                (Some(v), _) => format!("n/a ({})", c.unit.format(v)),
            };
            let _ = write!(out, " {cell} |");
        }
        out.push('\n');
    }
    out
}

/// Colors of the CDF lines, in subject order.
const PALETTE: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
];

/// Most points drawn per CDF line.
const MAX_POINTS: usize = 2_000;

/// An SVG of latency CDFs: one line per `(name, sorted samples in ns)`, x in
/// microseconds on a log scale, y the fraction of calls at or below x.
pub(crate) fn latency_cdf_svg(series: &[(String, Vec<u32>)]) -> String {
    const W: f64 = 820.0;
    const H: f64 = 500.0;
    const LEFT: f64 = 70.0;
    const RIGHT: f64 = 150.0;
    const TOP: f64 = 40.0;
    const BOTTOM: f64 = 60.0;
    let (plot_w, plot_h) = (W - LEFT - RIGHT, H - TOP - BOTTOM);

    let to_us = |ns: u32| f64::from(ns.max(1)) / 1e3;
    let non_empty = series.iter().filter(|(_, s)| !s.is_empty());
    let lo_us = non_empty
        .clone()
        .map(|(_, s)| to_us(s[0]))
        .fold(f64::INFINITY, f64::min);
    let hi_us = non_empty
        .map(|(_, s)| to_us(s[s.len() - 1]))
        .fold(0.0, f64::max);
    let (lo, hi) = if lo_us.is_finite() && hi_us > 0.0 {
        let lo = lo_us.log10().floor();
        (lo, hi_us.log10().ceil().max(lo + 1.0))
    } else {
        (0.0, 1.0)
    };
    let x = |us: f64| LEFT + (us.log10() - lo) / (hi - lo) * plot_w;
    let y = |frac: f64| TOP + (1.0 - frac) * plot_h;

    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="15">Latency CDF (latency workload)</text>"#,
        LEFT + plot_w / 2.0
    );
    // Decades and their 2..9 multiples on x; quarters on y.
    for decade in lo as i32..=hi as i32 {
        let base = 10f64.powi(decade);
        let px = x(base);
        let _ = writeln!(
            svg,
            r##"<line x1="{px:.1}" y1="{TOP}" x2="{px:.1}" y2="{:.1}" stroke="#bbb"/><text x="{px:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            TOP + plot_h,
            TOP + plot_h + 18.0,
            fmt_us_label(base)
        );
        if decade < hi as i32 {
            for m in 2..10 {
                let px = x(base * f64::from(m));
                let _ = writeln!(
                    svg,
                    r##"<line x1="{px:.1}" y1="{TOP}" x2="{px:.1}" y2="{:.1}" stroke="#eee"/>"##,
                    TOP + plot_h
                );
            }
        }
    }
    for q in 0..=4 {
        let frac = f64::from(q) / 4.0;
        let py = y(frac);
        let _ = writeln!(
            svg,
            r##"<line x1="{LEFT}" y1="{py:.1}" x2="{:.1}" y2="{py:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{frac:.2}</text>"##,
            LEFT + plot_w,
            LEFT - 8.0,
            py + 4.0
        );
    }
    let _ = writeln!(
        svg,
        r#"<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="black"/>"#
    );
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">latency (µs, log scale)</text>"#,
        LEFT + plot_w / 2.0,
        H - 15.0
    );
    let _ = writeln!(
        svg,
        r#"<text transform="translate(18 {:.1}) rotate(-90)" text-anchor="middle">fraction of calls ≤ latency</text>"#,
        TOP + plot_h / 2.0
    );

    for (i, (name, samples)) in series.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        if !samples.is_empty() {
            let n = samples.len();
            let step = n.div_ceil(MAX_POINTS);
            let mut points = String::new();
            // Always include the last sample, so the line reaches 1.
            for idx in (0..n).step_by(step).chain(std::iter::once(n - 1)) {
                let frac = (idx + 1) as f64 / n as f64;
                let _ = write!(points, "{:.1},{:.1} ", x(to_us(samples[idx])), y(frac));
            }
            let _ = writeln!(
                svg,
                r#"<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{}"/>"#,
                points.trim_end()
            );
        }
        let ly = TOP + 10.0 + 20.0 * i as f64;
        let lx = LEFT + plot_w + 15.0;
        let _ = writeln!(
            svg,
            r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{color}" stroke-width="3"/><text x="{}" y="{}">{}</text>"#,
            lx + 25.0,
            lx + 32.0,
            ly + 4.0,
            xml_escape(name)
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// `1 µs`, `10 µs`, ..., `1 ms`, `10 ms`, ... for a decade in microseconds.
fn fmt_us_label(us: f64) -> String {
    if us >= 1e6 {
        format!("{} s", us / 1e6)
    } else if us >= 1e3 {
        format!("{} ms", us / 1e3)
    } else {
        format!("{us} µs")
    }
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::subjects::Subject;

    fn measurement() -> Measurement {
        Measurement {
            payload_bytes: 1 << 20,
            concurrency: 1,
            calls: 4,
            samples: vec![1_000, 2_000, 3_000, 4_000],
            wall: Duration::from_secs(2),
            server_cpu: Duration::from_millis(1),
            client_cpu: Duration::from_millis(3),
            loss: None,
            many: None,
        }
    }

    /// The keys of a flat-or-nested JSON object, in order, by a small scanner.
    fn keys(json: &str) -> Vec<String> {
        let mut keys = Vec::new();
        let mut rest = json;
        while let Some(start) = rest.find('"') {
            let after = &rest[start + 1..];
            let end = after.find('"').unwrap();
            let token = &after[..end];
            rest = &after[end + 1..];
            if rest.starts_with(':') {
                keys.push(token.to_string());
            }
        }
        keys
    }

    #[test]
    fn json_line_has_exactly_the_specified_keys() {
        let r = BenchResult::new(Subject::Tcp, Workload::Bulk, &measurement());
        let line = r.to_json();
        assert_eq!(
            keys(&line),
            [
                "kind",
                "subject",
                "workload",
                "payload_bytes",
                "concurrency",
                "calls",
                "wall_s",
                "calls_per_s",
                "mib_per_s",
                "lat_us",
                "p50_us",
                "p90_us",
                "p99_us",
                "p999_us",
                "max_us",
                "mean_us",
                "samples",
                "server_cpu_s",
                "client_cpu_s",
                "cpu_us_per_call",
            ]
        );
        assert_eq!(
            line,
            r#"{"kind":"result","subject":"tcp","workload":"bulk","payload_bytes":1048576,"concurrency":1,"calls":4,"wall_s":2.000000,"calls_per_s":2.0,"mib_per_s":2.000,"lat_us":{"p50_us":2.000,"p90_us":4.000,"p99_us":4.000,"p999_us":4.000,"max_us":4.000,"mean_us":2.500,"samples":4},"server_cpu_s":0.001000,"client_cpu_s":0.003000,"cpu_us_per_call":1000.000}"#
        );
        assert!(!line.contains('\n'));
    }

    #[test]
    fn numbers_are_json() {
        assert_eq!(num(f64::NAN, 3), "0");
        assert_eq!(num(f64::INFINITY, 3), "0");
        assert_eq!(num(1.23456, 2), "1.23");
        assert_eq!(json_escape("a\"b\\c\n"), "a\\\"b\\\\c\\u000a");
    }

    #[test]
    fn zero_calls_give_zero_rates() {
        let mut m = measurement();
        m.calls = 0;
        m.samples.clear();
        m.wall = Duration::ZERO;
        let r = BenchResult::new(Subject::RawTcp, Workload::Latency, &m);
        assert_eq!(
            (r.calls_per_s, r.mib_per_s, r.cpu_us_per_call),
            (0.0, 0.0, 0.0)
        );
    }

    #[test]
    fn table_divides_medians_by_raw_tcp() {
        let mut results = Vec::new();
        for (subject, p50s) in [
            (Subject::RawTcp, [10.0, 20.0, 30.0]),
            (Subject::Tcp, [11.0, 22.0, 99.0]),
        ] {
            for p50 in p50s {
                let mut r = BenchResult::new(subject, Workload::Latency, &measurement());
                r.lat.p50_us = p50;
                results.push(r);
            }
        }
        let table = ratio_table(&results, 3, "raw-tcp");
        assert!(table.contains("| raw-tcp | 1.00× (20.0 µs) |"), "{table}");
        assert!(table.contains("| tcp | 1.10× (22.0 µs) |"), "{table}");
        assert!(table.contains("n/a"), "{table}");
        assert!(!table.contains("conns/s,"), "{table}");
        let table = ratio_table(&results, 3, "tcp");
        assert!(table.contains("| raw-tcp | 0.91× (20.0 µs) |"), "{table}");
        assert!(table.contains("| tcp | 1.00× (22.0 µs) |"), "{table}");
    }

    #[test]
    fn connect_columns_split_by_concurrency() {
        let mut results = Vec::new();
        for (subject, rates) in [
            (Subject::Tcp, [1000.0, 4000.0]),
            (Subject::Tls, [250.0, 2000.0]),
        ] {
            for (concurrency, rate) in [1, 16].into_iter().zip(rates) {
                let mut m = measurement();
                m.concurrency = concurrency;
                let mut r = BenchResult::new(subject, Workload::Connect, &m);
                r.calls_per_s = rate;
                results.push(r);
            }
        }
        let table = ratio_table(&results, 1, "tcp");
        assert!(
            table.contains("| connect conns/s, sequential | connect conns/s, concurrent |"),
            "{table}"
        );
        assert!(
            table.contains(
                "| tls | n/a | n/a | n/a | n/a | n/a | n/a | 0.25× (250 /s) | 0.50× (2.0 k/s) |"
            ),
            "{table}"
        );
    }

    #[test]
    fn svg_has_one_line_per_subject() {
        let series = vec![
            ("tcp".to_string(), vec![10_000, 20_000, 30_000]),
            ("raw-tcp".to_string(), vec![5_000, 6_000]),
        ];
        let svg = latency_cdf_svg(&series);
        assert!(svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains(">raw-tcp</text>"));
        assert!(svg.contains(">1 µs</text>") && svg.contains(">100 µs</text>"));
    }
}

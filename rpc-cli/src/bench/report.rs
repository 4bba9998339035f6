//! [`Summary`]: a bench's results, as text for people, JSON for scripts, and a
//! self-contained HTML page with the latency distribution drawn as inline SVG.

use std::{collections::BTreeMap, fmt::Write as _, time::Duration};

use rpc_core::Code;

use super::Histogram;
use crate::exit::code_name;

/// The percentiles every report shows, as (label, fraction).
pub const PERCENTILES: [(&str, f64); 6] = [
    ("p50", 0.50),
    ("p75", 0.75),
    ("p90", 0.90),
    ("p95", 0.95),
    ("p99", 0.99),
    ("p99.9", 0.999),
];

/// Bins of the text histogram.
const TEXT_BINS: usize = 12;
/// Bins of the HTML chart.
const HTML_BINS: usize = 40;

/// A bench's results.
#[derive(Debug, Clone)]
pub struct Summary {
    /// The server.
    pub uri: String,
    /// `package.Service/Method`.
    pub method: String,
    /// Workers.
    pub concurrency: u32,
    /// Connections.
    pub connections: u32,
    /// `--rps`, if given.
    pub rps_limit: Option<f64>,
    /// Wall time of the measured phase.
    pub duration: Duration,
    /// Every measured call's latency.
    pub histogram: Histogram,
    /// Calls by status code (0 is OK).
    pub codes: BTreeMap<u32, u64>,
    /// Failed calls by `CODE: message` (the first few distinct messages).
    pub messages: BTreeMap<String, u64>,
    /// The run was cut short by Ctrl-C: the report covers the calls finished by then.
    pub interrupted: bool,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// `83.1 µs`, `1.20 ms`, `2.00 s`.
fn human(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us < 1000.0 {
        format!("{us:.1} µs")
    } else if us < 1e6 {
        format!("{:.2} ms", us / 1e3)
    } else {
        format!("{:.2} s", us / 1e6)
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

impl Summary {
    /// Calls measured.
    pub fn calls(&self) -> u64 {
        self.codes.values().sum()
    }

    /// Calls that succeeded.
    pub fn ok(&self) -> u64 {
        self.codes.get(&0).copied().unwrap_or(0)
    }

    /// Calls per second over the measured phase.
    pub fn rate(&self) -> f64 {
        self.calls() as f64 / self.duration.as_secs_f64().max(1e-9)
    }

    fn code_counts(&self) -> Vec<(String, u64)> {
        self.codes
            .iter()
            .map(|(&code, &count)| (code_name(Code::from_u32(code)), count))
            .collect()
    }

    /// The summary for people.
    pub fn text(&self) -> String {
        let h = &self.histogram;
        let mut out = String::new();
        let _ = writeln!(out, "Summary:");
        let _ = writeln!(out, "  target:       {} {}", self.uri, self.method);
        let _ = writeln!(
            out,
            "  workers:      {} on {} connection(s){}",
            self.concurrency,
            self.connections,
            self.rps_limit
                .map(|r| format!(", rate limit {r}/s"))
                .unwrap_or_default()
        );
        let _ = writeln!(
            out,
            "  calls:        {} ({} ok, {} failed)",
            self.calls(),
            self.ok(),
            self.calls() - self.ok()
        );
        let _ = writeln!(out, "  duration:     {}", human(self.duration));
        if self.interrupted {
            let _ = writeln!(
                out,
                "  interrupted:  by Ctrl-C (the calls finished before it; those in flight are left out)"
            );
        }
        let _ = writeln!(out, "  rate:         {:.0} calls/s", self.rate());
        let _ = writeln!(
            out,
            "  latency:      min {}, mean {}, max {}",
            human(h.min()),
            human(h.mean()),
            human(h.max())
        );
        let _ = writeln!(out, "\nLatency distribution:");
        for (label, q) in PERCENTILES {
            let _ = writeln!(out, "  {label:>6}  {}", human(h.quantile(q)));
        }
        let bins = h.bins(TEXT_BINS);
        let peak = bins.iter().map(|b| b.2).max().unwrap_or(0).max(1);
        if !bins.is_empty() {
            let _ = writeln!(out, "\nLatency histogram:");
            for (from, to, count) in bins {
                let bar = "∎".repeat(((count * 40) / peak) as usize);
                let _ = writeln!(
                    out,
                    "  {:>10} - {:<10} [{count}]\t{bar}",
                    human(from),
                    human(to)
                );
            }
        }
        let _ = writeln!(out, "\nStatus codes:");
        for (name, count) in self.code_counts() {
            let _ = writeln!(out, "  {name:<20} {count}");
        }
        if !self.messages.is_empty() {
            let _ = writeln!(out, "\nErrors:");
            for (message, count) in &self.messages {
                let _ = writeln!(out, "  [{count}] {message}");
            }
        }
        out
    }

    /// The summary as one JSON object (times in milliseconds).
    pub fn json(&self) -> serde_json::Value {
        let h = &self.histogram;
        let mut latency = serde_json::Map::new();
        latency.insert("min".into(), ms(h.min()).into());
        latency.insert("mean".into(), ms(h.mean()).into());
        for (label, q) in PERCENTILES {
            latency.insert(label.into(), ms(h.quantile(q)).into());
        }
        latency.insert("max".into(), ms(h.max()).into());
        let histogram: Vec<serde_json::Value> = h
            .bins(TEXT_BINS)
            .into_iter()
            .map(|(from, to, count)| {
                serde_json::json!({"from_ms": ms(from), "to_ms": ms(to), "count": count})
            })
            .collect();
        let status: serde_json::Map<String, serde_json::Value> = self
            .code_counts()
            .into_iter()
            .map(|(name, count)| (name, count.into()))
            .collect();
        serde_json::json!({
            "uri": self.uri,
            "method": self.method,
            "concurrency": self.concurrency,
            "connections": self.connections,
            "rps_limit": self.rps_limit,
            "calls": self.calls(),
            "ok": self.ok(),
            "errors": self.calls() - self.ok(),
            "duration_s": self.duration.as_secs_f64(),
            "interrupted": self.interrupted,
            "calls_per_s": self.rate(),
            "latency_ms": latency,
            "histogram": histogram,
            "status": status,
            "error_messages": self.messages,
        })
    }

    /// A self-contained HTML report: the numbers, and the latency distribution as an
    /// SVG bar chart (log-spaced bins) with the percentiles marked.
    pub fn html(&self) -> String {
        let h = &self.histogram;
        let bins = h.bins(HTML_BINS);
        let (width, height, left, bottom) = (900.0f64, 320.0f64, 60.0f64, 40.0f64);
        let plot_w = width - left - 20.0;
        let plot_h = height - bottom - 20.0;
        let peak = bins.iter().map(|b| b.2).max().unwrap_or(0).max(1) as f64;
        let mut svg = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" \
             viewBox=\"0 0 {width} {height}\" role=\"img\" aria-label=\"latency histogram\">\n"
        );
        let _ = writeln!(
            svg,
            "<line x1=\"{left}\" y1=\"{0}\" x2=\"{1}\" y2=\"{0}\" stroke=\"#333\"/>",
            20.0 + plot_h,
            left + plot_w
        );
        let _ = writeln!(
            svg,
            "<line x1=\"{left}\" y1=\"20\" x2=\"{left}\" y2=\"{}\" stroke=\"#333\"/>",
            20.0 + plot_h
        );
        // The count scale: the tallest bar's count at the top, zero at the bottom.
        let _ = writeln!(
            svg,
            "<text x=\"{:.1}\" y=\"26\" font-size=\"11\" text-anchor=\"end\">{peak}</text>\
             <text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"end\">0</text>",
            left - 4.0,
            left - 4.0,
            20.0 + plot_h
        );
        let bar_w = plot_w / bins.len().max(1) as f64;
        for (i, (from, to, count)) in bins.iter().enumerate() {
            let bar_h = plot_h * (*count as f64) / peak;
            let x = left + i as f64 * bar_w;
            let y = 20.0 + plot_h - bar_h;
            let _ = writeln!(
                svg,
                "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{bar_h:.1}\" fill=\"#4a7bd0\">\
                 <title>{} – {}: {count} calls</title></rect>",
                (bar_w - 1.0).max(0.5),
                human(*from),
                human(*to)
            );
            if i % 5 == 0 {
                let _ = writeln!(
                    svg,
                    "<text x=\"{x:.1}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"middle\">{}</text>",
                    20.0 + plot_h + 16.0,
                    human(*from)
                );
            }
        }
        // Percentile markers, placed on the same log scale as the bins.
        if let (Some(first), Some(last)) = (bins.first(), bins.last()) {
            let lo = first.0.as_secs_f64().max(1e-9);
            let hi = last.1.as_secs_f64().max(lo * 1.000001);
            for (label, q) in [("p50", 0.5), ("p99", 0.99), ("p99.9", 0.999)] {
                let v = h.quantile(q).as_secs_f64().max(lo);
                let x = left + plot_w * ((v / lo).ln() / (hi / lo).ln()).clamp(0.0, 1.0);
                let _ = writeln!(
                    svg,
                    "<line x1=\"{x:.1}\" y1=\"20\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"#d04a4a\" \
                     stroke-dasharray=\"4 3\"/><text x=\"{:.1}\" y=\"32\" font-size=\"11\" \
                     fill=\"#d04a4a\">{label}</text>",
                    20.0 + plot_h,
                    x + 3.0
                );
            }
        }
        let _ = writeln!(
            svg,
            "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"12\" text-anchor=\"middle\">latency (log scale)</text>",
            left + plot_w / 2.0,
            height - 4.0
        );
        let _ = writeln!(
            svg,
            "<text x=\"14\" y=\"{:.1}\" font-size=\"12\" transform=\"rotate(-90 14 {:.1})\" \
             text-anchor=\"middle\">calls</text>",
            20.0 + plot_h / 2.0,
            20.0 + plot_h / 2.0
        );
        svg.push_str("</svg>\n");

        let mut rows = String::new();
        for (label, value) in [
            ("target", format!("{} {}", self.uri, self.method)),
            (
                "workers",
                format!("{} on {} connection(s)", self.concurrency, self.connections),
            ),
            (
                "calls",
                format!(
                    "{} ({} ok, {} failed)",
                    self.calls(),
                    self.ok(),
                    self.calls() - self.ok()
                ),
            ),
            ("duration", human(self.duration)),
            ("rate", format!("{:.0} calls/s", self.rate())),
            (
                "min / mean / max",
                format!(
                    "{} / {} / {}",
                    human(h.min()),
                    human(h.mean()),
                    human(h.max())
                ),
            ),
        ] {
            let _ = writeln!(
                rows,
                "<tr><th>{}</th><td>{}</td></tr>",
                escape(label),
                escape(&value)
            );
        }
        let mut percentiles = String::new();
        for (label, q) in PERCENTILES {
            let _ = writeln!(
                percentiles,
                "<tr><th>{label}</th><td>{}</td></tr>",
                human(h.quantile(q))
            );
        }
        let mut codes = String::new();
        for (name, count) in self.code_counts() {
            let _ = writeln!(codes, "<tr><th>{name}</th><td>{count}</td></tr>");
        }
        for (message, count) in &self.messages {
            let _ = writeln!(
                codes,
                "<tr><th>{count}×</th><td>{}</td></tr>",
                escape(message)
            );
        }
        format!(
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
             <title>rpc bench: {title}</title>\n<style>\
             body{{font-family:sans-serif;margin:2em;color:#222}}\
             table{{border-collapse:collapse;margin:1em 0}}\
             th,td{{padding:.2em .8em;text-align:left;border-bottom:1px solid #ddd}}\
             th{{font-weight:600}}</style></head>\n<body>\n<h1>rpc bench</h1>\n\
             <table>\n{rows}</table>\n<h2>Latency distribution</h2>\n{svg}\
             <table>\n{percentiles}</table>\n<h2>Status codes</h2>\n<table>\n{codes}</table>\n\
             </body></html>\n",
            title = escape(&self.method),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary() -> Summary {
        let mut histogram = Histogram::new();
        for us in [100, 200, 300, 4000] {
            histogram.record(Duration::from_micros(us));
        }
        Summary {
            uri: "tcp://127.0.0.1:1".into(),
            method: "p.S/M".into(),
            concurrency: 2,
            connections: 1,
            rps_limit: None,
            duration: Duration::from_secs(1),
            histogram,
            codes: BTreeMap::from([(0, 3), (14, 1)]),
            messages: BTreeMap::from([("UNAVAILABLE: <gone>".to_owned(), 1)]),
            interrupted: false,
        }
    }

    #[test]
    fn json_counts_calls_and_statuses() {
        let json = summary().json();
        assert_eq!(json["calls"], 4);
        assert_eq!(json["ok"], 3);
        assert_eq!(json["errors"], 1);
        assert_eq!(json["status"]["OK"], 3);
        assert_eq!(json["status"]["UNAVAILABLE"], 1);
        let binned: u64 = json["histogram"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["count"].as_u64().unwrap())
            .sum();
        assert_eq!(binned, 4);
    }

    #[test]
    fn html_is_self_contained_and_escaped() {
        let html = summary().html();
        assert!(html.contains("<svg"));
        assert!(html.contains("&lt;gone&gt;"));
        assert!(!html.contains("<script"));
        assert!(!html.contains("http://") || html.contains("http://www.w3.org/2000/svg"));
    }
}

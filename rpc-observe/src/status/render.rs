//! The status pages as strings: HTML with inline CSS and script, and the JSON the index
//! page polls. Every string a peer chose goes through [`escape`] (HTML) or
//! [`json_str`] (JSON).

use std::{
    fmt::Write as _,
    time::{Duration, Instant, SystemTime},
};

use rpc_core::{server::ConnectionInfo, Code};

use super::{
    window::WINDOW_SECS, CallSample, MethodStats, RpczFilter, ServerInfo, StatusBoard,
    StatusFilter, DEFAULT_ROWS,
};

/// Height of a chart in SVG units; its width is one unit per second of the window.
const CHART_HEIGHT: f64 = 40.0;

/// The page's style: small, no external font nor image.
const STYLE: &str = "\
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1d2329;background:#f6f7f9}
header{background:#1d2329;color:#fff;padding:8px 16px;display:flex;gap:24px;align-items:baseline}
header h1{font-size:18px;margin:0}header a{color:#9cd0ff;margin-right:12px}
main{padding:12px 16px}h2{font-size:16px;margin:16px 0 8px}
table{border-collapse:collapse;background:#fff}td,th{padding:3px 8px;border-bottom:1px solid #e3e6ea;text-align:left;vertical-align:top}
th{background:#eef1f4}td.n{text-align:right;font-variant-numeric:tabular-nums}
.info td:first-child{color:#5b6670}
section.method{background:#fff;border:1px solid #e3e6ea;border-radius:6px;padding:8px 12px;margin:8px 0}
section.method h3{font:600 14px ui-monospace,monospace;margin:0 0 6px}
.charts{display:grid;grid-template-columns:repeat(4,1fr);gap:12px}
figure{margin:0}figcaption{display:flex;justify-content:space-between;color:#5b6670;font-size:12px}
figcaption b{color:#1d2329;font-size:15px}
svg{width:100%;height:48px;background:#f9fafb;border:1px solid #eef1f4}
path{fill:none;stroke:#2f7ed8;stroke-width:1.5;stroke-linecap:round;vector-effect:non-scaling-stroke}
svg[data-metric=errors] path{stroke:#d8452f}svg[data-metric=p99] path{stroke:#8a4fd8}
.totals{color:#5b6670;font-size:12px;margin:6px 0 0}
.ok{color:#1a7f37}.err{color:#c62828;font-weight:600}
.problems{color:#c62828}form label{margin-right:12px}code{font:12px ui-monospace,monospace}
";

/// The index page's script: polls `status.json` every second and redraws the charts
/// and numbers, building a row (from the `<template>`) for a method seen for the first
/// time. It writes text and attributes only, never HTML. `body[data-polls]` counts the
/// polls that succeeded.
const SCRIPT: &str = r#"
(function () {
  const H = 40;
  const rows = new Map();
  document.querySelectorAll("section.method").forEach((s) => rows.set(s.dataset.method, s));
  let polls = 0;
  function points(values) {
    let max = 0;
    for (const v of values) if (v !== null && v > max) max = v;
    const scale = max > 0 ? max : 1;
    const out = [];
    let run = 0;
    values.forEach((v, i) => {
      if (v === null) {
        if (run === 1) out.push("h0");
        run = 0;
        return;
      }
      out.push((run === 0 ? "M" : "L") + i + "," + (H - 2 - (v / scale) * (H - 4)).toFixed(1));
      run += 1;
    });
    if (run === 1) out.push("h0");
    return [out.join(" "), max];
  }
  function show(v, digits) {
    return v === null ? "\u2014" : v.toFixed(digits);
  }
  function row(m) {
    let s = rows.get(m.method);
    if (!s) {
      s = document.getElementById("method-row").content.firstElementChild.cloneNode(true);
      s.dataset.method = m.method;
      s.querySelector("h3").textContent = m.method;
      s.querySelectorAll("[data-method]").forEach((e) => e.setAttribute("data-method", m.method));
      document.getElementById("methods").appendChild(s);
      rows.set(m.method, s);
    }
    return s;
  }
  function update(data) {
    document.getElementById("uptime").textContent = data.uptime;
    for (const m of data.methods) {
      const s = row(m);
      const series = { calls: m.calls, errors: m.error_pct, p50: m.p50_ms, p99: m.p99_ms };
      const now = { calls: m.rate, errors: m.recent.error_pct, p50: m.recent.p50_ms, p99: m.recent.p99_ms };
      for (const metric of Object.keys(series)) {
        const [pts, max] = points(series[metric]);
        const svg = s.querySelector('svg[data-metric="' + metric + '"]');
        svg.querySelector("path").setAttribute("d", pts);
        svg.setAttribute("data-max", String(max));
        const value = s.querySelector('b[data-metric="' + metric + '"]');
        const text = show(now[metric], metric === "calls" ? 1 : metric === "errors" ? 1 : 2);
        value.textContent = text;
        value.setAttribute("data-value", now[metric] === null ? "" : String(now[metric]));
        s.querySelector('small[data-metric="' + metric + '"]').textContent = "max " + show(max, 1);
      }
      for (const [field, value] of Object.entries(m.fields)) {
        const e = s.querySelector('[data-field="' + field + '"]');
        if (e) e.textContent = value;
      }
    }
    document.getElementById("empty").hidden = data.methods.length > 0;
  }
  async function poll() {
    try {
      const response = await fetch("status.json", { cache: "no-store" });
      if (response.ok) {
        update(await response.json());
        polls += 1;
        document.body.setAttribute("data-polls", String(polls));
      }
    } catch (e) {
      document.body.setAttribute("data-poll-error", String(e));
    }
  }
  setInterval(poll, 1000);
  poll();
})();
"#;

/// `text` made safe anywhere in HTML: in an element or a quoted attribute.
pub(crate) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Appends `text` as a JSON string; `<`, `>` and `&` as `\u` escapes too, so the
/// JSON is safe inside HTML as well.
pub(crate) fn json_str(out: &mut String, text: &str) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c < ' ' || matches!(c, '<' | '>' | '&' | '\u{2028}' | '\u{2029}') => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A JSON number, or `null` for none (or a value JSON cannot carry).
fn json_num(out: &mut String, value: Option<f64>) {
    match value {
        Some(v) if v.is_finite() => {
            let _ = write!(out, "{}", (v * 1000.0).round() / 1000.0);
        }
        _ => out.push_str("null"),
    }
}

fn json_array(out: &mut String, values: impl Iterator<Item = Option<f64>>) {
    out.push('[');
    for (i, v) in values.enumerate() {
        if i > 0 {
            out.push(',');
        }
        json_num(out, v);
    }
    out.push(']');
}

/// A duration for people: `850 µs`, `1.25 ms`, `2.50 s`, `3 min 20 s`.
pub(crate) fn human(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us < 1_000.0 {
        format!("{us:.0} µs")
    } else if us < 1e6 {
        format!("{:.2} ms", us / 1e3)
    } else if d < Duration::from_secs(120) {
        format!("{:.2} s", us / 1e6)
    } else {
        let s = d.as_secs();
        match s {
            ..7_200 => format!("{} min {} s", s / 60, s % 60),
            7_200..172_800 => format!("{} h {} min", s / 3_600, s / 60 % 60),
            _ => format!("{} d {} h", s / 86_400, s / 3_600 % 24),
        }
    }
}

/// A wall-clock time in UTC: `2026-12-01 19:42:32.123Z`.
pub(crate) fn utc(t: SystemTime) -> String {
    let since = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's days-to-civil, for days since 1970-01-01.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}.{:03}Z",
        rest / 3_600,
        rest / 60 % 60,
        rest % 60,
        since.subsec_millis()
    )
}

/// Bytes for people: `512 B`, `1.5 KiB`, `3.2 MiB`.
fn bytes(n: u64) -> String {
    match n {
        ..1_024 => format!("{n} B"),
        1_024..1_048_576 => format!("{:.1} KiB", n as f64 / 1_024.0),
        1_048_576..1_073_741_824 => format!("{:.1} MiB", n as f64 / 1_048_576.0),
        _ => format!("{:.2} GiB", n as f64 / 1_073_741_824.0),
    }
}

/// The common head, header and navigation of every page.
fn page(out: &mut String, title: &str, heading: &str) {
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width\">\
         <title>{title}</title><style>{STYLE}</style></head>\n<body data-polls=\"0\">\
         <header><h1>{heading}</h1><nav><a href=\"/\">status</a><a href=\"/connections\">connections</a>\
         <a href=\"/rpcz\">rpcz</a><a href=\"/metrics\">metrics</a></nav></header>\n<main>\n",
        title = escape(title),
        heading = escape(heading),
    );
}

const END: &str = "</main></body></html>\n";

/// The four charts of a method: name, caption, how to read a point.
const METRICS: [(&str, &str); 4] = [
    ("calls", "calls/s"),
    ("errors", "errors %"),
    ("p50", "p50 ms"),
    ("p99", "p99 ms"),
];

/// The per-second series of a method for each chart, and its current values.
struct Charts {
    series: [Vec<Option<f64>>; 4],
    now: [Option<f64>; 4],
}

fn error_pct(calls: u64, errors: u64) -> Option<f64> {
    (calls > 0).then(|| errors as f64 * 100.0 / calls as f64)
}

fn ms(d: Option<Duration>) -> Option<f64> {
    d.map(|d| d.as_secs_f64() * 1e3)
}

impl Charts {
    fn of(m: &MethodStats) -> Charts {
        // Seconds before the board started have no point (a gap, not a zero).
        let first = m.series.first;
        let calls = m
            .calls()
            .iter()
            .enumerate()
            .map(|(i, &c)| (i >= first).then_some(f64::from(c)))
            .collect();
        let errors = m
            .calls()
            .iter()
            .zip(m.errors())
            .map(|(&c, &e)| error_pct(c.into(), e.into()))
            .collect();
        let recent = &m.series.recent;
        Charts {
            series: [
                calls,
                errors,
                m.p50().map(ms).collect(),
                m.p99().map(ms).collect(),
            ],
            now: [
                Some(m.rate()),
                error_pct(recent.calls, recent.errors),
                recent.p50_us.map(|us| us / 1e3),
                recent.p99_us.map(|us| us / 1e3),
            ],
        }
    }
}

/// A path (`d`) through `values` (one per second), scaled to the largest; and it. A
/// second without a value (no calls) breaks the line: a new segment starts after it
/// (one line drawn across such seconds showed a latency climbing steadily for minutes
/// between two bursts; from a review), and a lone value is a dot (`h0`, drawn with the
/// line's round cap).
fn points(values: &[Option<f64>]) -> (String, f64) {
    let max = values.iter().flatten().copied().fold(0.0, f64::max);
    let scale = if max > 0.0 { max } else { 1.0 };
    let mut out = String::new();
    let mut run = 0;
    for (i, v) in values.iter().enumerate() {
        let Some(v) = v else {
            if run == 1 {
                out.push_str(" h0");
            }
            run = 0;
            continue;
        };
        if !out.is_empty() {
            out.push(' ');
        }
        let _ = write!(
            out,
            "{}{i},{:.1}",
            if run == 0 { 'M' } else { 'L' },
            CHART_HEIGHT - 2.0 - v / scale * (CHART_HEIGHT - 4.0)
        );
        run += 1;
    }
    if run == 1 {
        out.push_str(" h0");
    }
    (out, max)
}

fn show(value: Option<f64>, digits: usize) -> String {
    value.map_or_else(|| "\u{2014}".to_owned(), |v| format!("{v:.digits$}"))
}

/// The per-method fields under the charts, as (`data-field`, text).
fn fields(m: &MethodStats) -> Vec<(&'static str, String)> {
    let (calls, errors, p50, p99) = m.last_minute();
    let (total, total_errors) = m.totals();
    vec![
        ("in_flight", m.in_flight.to_string()),
        ("minute_calls", calls.to_string()),
        ("minute_errors", show(error_pct(calls, errors), 1)),
        ("minute_p50", p50.map_or_else(|| "\u{2014}".into(), human)),
        ("minute_p99", p99.map_or_else(|| "\u{2014}".into(), human)),
        ("total_calls", total.to_string()),
        ("total_errors", total_errors.to_string()),
    ]
}

/// One method's row: title, four charts, the numbers under them. `None`: the empty
/// template the script clones for a method it has not seen.
fn method_row(out: &mut String, m: Option<&MethodStats>) {
    let name = escape(m.map_or("", |m| &m.method));
    let charts = m.map(Charts::of);
    let _ = write!(
        out,
        "<section class=\"method\" data-method=\"{name}\"><h3>{name}</h3><div class=\"charts\">"
    );
    for (i, (metric, caption)) in METRICS.iter().enumerate() {
        let (pts, max) = charts
            .as_ref()
            .map_or((String::new(), 0.0), |c| points(&c.series[i]));
        let now = charts.as_ref().and_then(|c| c.now[i]);
        let digits = if i < 2 { 1 } else { 2 };
        let _ = write!(
            out,
            "<figure class=\"chart\"><figcaption><span>{caption} <small data-metric=\"{metric}\">max {max:.1}</small></span>\
             <b class=\"value\" data-method=\"{name}\" data-metric=\"{metric}\" data-value=\"{value}\">{text}</b></figcaption>\
             <svg data-method=\"{name}\" data-metric=\"{metric}\" data-max=\"{max}\" viewBox=\"0 0 {WINDOW_SECS} {CHART_HEIGHT}\" \
             preserveAspectRatio=\"none\"><path d=\"{pts}\"/></svg></figure>",
            value = now.map_or_else(String::new, |v| v.to_string()),
            text = show(now, digits),
        );
    }
    out.push_str("</div><p class=\"totals\">");
    let fields = m.map(fields).unwrap_or_default();
    let field = |name: &str| {
        fields
            .iter()
            .find(|(f, _)| *f == name)
            .map_or("", |(_, v)| v.as_str())
            .to_owned()
    };
    let _ = writeln!(
        out,
        "in flight <b data-field=\"in_flight\">{}</b> · last minute: <b data-field=\"minute_calls\">{}</b> calls, \
         <b data-field=\"minute_errors\">{}</b>% errors, p50 <b data-field=\"minute_p50\">{}</b>, \
         p99 <b data-field=\"minute_p99\">{}</b> · since start: <b data-field=\"total_calls\">{}</b> calls, \
         <b data-field=\"total_errors\">{}</b> errors</p></section>",
        field("in_flight"),
        field("minute_calls"),
        field("minute_errors"),
        field("minute_p50"),
        field("minute_p99"),
        field("total_calls"),
        field("total_errors"),
    );
}

/// The index page (`/`): the server's version, uptime, listeners and configuration,
/// and per method four charts of the last [`WINDOW_SECS`] seconds (calls per second,
/// error rate, p50 and p99 latency), each an `<svg data-method="..."
/// data-metric="calls|errors|p50|p99">` with a `<path>` (broken where a second had no
/// value) and a current value in a
/// `<b class="value" data-metric="..." data-value="...">` (the last ten seconds). Its
/// script polls `status.json` ([`render_json`]) every second and redraws them.
pub fn render_index(board: &StatusBoard, info: &ServerInfo) -> String {
    let mut out = String::with_capacity(16 * 1024);
    page(&mut out, &format!("{} status", info.name), &info.name);
    out.push_str("<table class=\"info\">");
    let started = utc(info.started);
    let rows: [(&str, String); 3] = [
        ("version", escape(&info.version)),
        ("started", started),
        (
            "uptime",
            format!("<span id=\"uptime\">{}</span>", human(info.uptime())),
        ),
    ];
    for (name, value) in rows {
        let _ = write!(out, "<tr><td>{name}</td><td>{value}</td></tr>");
    }
    for listener in &info.listeners {
        let _ = write!(
            out,
            "<tr><td>listener</td><td><code class=\"listener\">{}</code></td></tr>",
            escape(listener)
        );
    }
    out.push_str("</table>\n<h2>Calls, last five minutes</h2><div id=\"methods\">\n");
    let methods = board.methods();
    for m in &methods {
        method_row(&mut out, Some(m));
    }
    let _ = write!(
        out,
        "</div><p id=\"empty\"{}>No calls yet.</p>\n<template id=\"method-row\">",
        if methods.is_empty() { "" } else { " hidden" }
    );
    method_row(&mut out, None);
    out.push_str("</template>\n<h2>Configuration</h2><table class=\"config\">");
    for (name, value) in &info.config {
        let _ = write!(
            out,
            "<tr><td>{}</td><td><code>{}</code></td></tr>",
            escape(name),
            escape(value)
        );
    }
    let _ = write!(out, "</table>\n<script>{SCRIPT}</script>\n{END}");
    out
}

/// What the index page polls (`/status.json`): the uptime, and per method the series
/// of the charts (`calls`, `error_pct`, `p50_ms`, `p99_ms`: one value per complete
/// second, oldest first, `null` for a second without calls), the current `rate`
/// (calls per second over the last ten seconds), `recent` (error rate and
/// percentiles over the same ten seconds) and the `fields` under the charts.
pub fn render_json(board: &StatusBoard, info: &ServerInfo) -> String {
    render_json_at(board, info, Instant::now())
}

pub(crate) fn render_json_at(board: &StatusBoard, info: &ServerInfo, now: Instant) -> String {
    let mut out = String::with_capacity(8 * 1024);
    out.push_str("{\"uptime\":");
    json_str(&mut out, &human(info.uptime()));
    let _ = write!(
        out,
        ",\"uptime_s\":{},\"window_s\":{WINDOW_SECS},\"methods\":[",
        info.uptime().as_secs()
    );
    for (i, m) in board.methods_at(now).iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let charts = Charts::of(m);
        out.push_str("{\"method\":");
        json_str(&mut out, &m.method);
        let _ = write!(out, ",\"in_flight\":{},\"rate\":", m.in_flight);
        json_num(&mut out, charts.now[0]);
        for (name, series) in ["calls", "error_pct", "p50_ms", "p99_ms"]
            .iter()
            .zip(&charts.series)
        {
            let _ = write!(out, ",\"{name}\":");
            json_array(&mut out, series.iter().copied());
        }
        out.push_str(",\"recent\":{\"error_pct\":");
        json_num(&mut out, charts.now[1]);
        out.push_str(",\"p50_ms\":");
        json_num(&mut out, charts.now[2]);
        out.push_str(",\"p99_ms\":");
        json_num(&mut out, charts.now[3]);
        out.push_str("},\"fields\":{");
        for (j, (field, value)) in fields(m).iter().enumerate() {
            if j > 0 {
                out.push(',');
            }
            let _ = write!(out, "\"{field}\":");
            json_str(&mut out, value);
        }
        out.push_str("}}");
    }
    out.push_str("]}\n");
    out
}

/// The connections page (`/connections`): each open connection's peer, wire (the
/// peer's scheme), when it opened and its age, calls in flight, requests, and bytes
/// and frames each way. Each row is a `<tr class="connection" data-wire="tcp"
/// data-bytes-received="..." data-bytes-sent="...">`.
pub fn render_connections(connections: &[ConnectionInfo]) -> String {
    let mut out = String::with_capacity(4 * 1024);
    page(&mut out, "connections", "connections");
    let _ = write!(
        out,
        "<p id=\"count\" data-count=\"{n}\">{n} open connection{s}</p>\n<table class=\"connections\">\
         <tr><th>peer</th><th>wire</th><th>opened</th><th>age</th><th>in flight</th><th>requests</th>\
         <th>received</th><th>sent</th><th>frames in</th><th>frames out</th></tr>\n",
        n = connections.len(),
        s = if connections.len() == 1 { "" } else { "s" },
    );
    for c in connections.iter().take(MAX_CONNECTION_ROWS) {
        let wire = escape(c.peer.scheme());
        let _ = writeln!(
            out,
            "<tr class=\"connection\" data-wire=\"{wire}\" data-bytes-received=\"{}\" data-bytes-sent=\"{}\">\
             <td><code>{}</code></td><td>{wire}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td></tr>",
            c.bytes_received,
            c.bytes_sent,
            escape(c.peer.description()),
            utc(c.opened),
            human(c.age),
            c.in_flight,
            c.requests,
            bytes(c.bytes_received),
            bytes(c.bytes_sent),
            c.frames_received,
            c.frames_sent,
        );
    }
    out.push_str("</table>\n");
    if connections.len() > MAX_CONNECTION_ROWS {
        let _ = writeln!(
            out,
            "<p id=\"more\">and {} more, not shown (the page lists at most {MAX_CONNECTION_ROWS})</p>",
            connections.len() - MAX_CONNECTION_ROWS
        );
    }
    out.push_str(END);
    out
}

/// Rows the connections page lists: a server holds up to 10,000 connections by
/// default, which a peer can open, and each row is about 360 bytes.
const MAX_CONNECTION_ROWS: usize = 1000;

/// The calls page (`/rpcz`): the sampled calls `filter` lets through, slowest first,
/// each a `<tr class="call" data-method="..." data-status="OK">` with its start time,
/// method, peer, status, time queued, handler time, total, message sizes and status
/// message; above them a form for the filter, and what the query had that was not
/// understood.
pub fn render_rpcz(board: &StatusBoard, filter: &RpczFilter) -> String {
    let calls = board.calls(filter);
    let mut out = String::with_capacity(32 * 1024);
    page(&mut out, "rpcz", "rpcz");
    let _ = write!(
        out,
        "<form method=\"get\" action=\"/rpcz\"><label>method <input name=\"method\" list=\"methods\" value=\"{}\"></label>\
         <datalist id=\"methods\">",
        escape(filter.method.as_deref().unwrap_or(""))
    );
    for name in board.method_names() {
        let _ = write!(out, "<option value=\"{}\">", escape(&name));
    }
    out.push_str(
        "</datalist><label>status <select name=\"status\"><option value=\"\">any</option>",
    );
    let selected = |s: StatusFilter| {
        if filter.status == Some(s) {
            " selected"
        } else {
            ""
        }
    };
    let _ = write!(
        out,
        "<option value=\"ERROR\"{}>any error</option>",
        selected(StatusFilter::Errors)
    );
    for code in (0..=16).map(Code::from_u32) {
        let name = code.name().unwrap_or_default();
        let _ = write!(
            out,
            "<option value=\"{name}\"{}>{name}</option>",
            selected(StatusFilter::Code(code))
        );
    }
    if let Some(StatusFilter::Code(code)) = filter.status {
        if code.name().is_none() {
            let n = code.as_u32();
            let _ = write!(out, "<option value=\"{n}\" selected>{n}</option>");
        }
    }
    let _ = writeln!(
        out,
        "</select></label><label>min ms <input name=\"min_ms\" size=\"6\" value=\"{}\"></label>\
         <label>rows <input name=\"limit\" size=\"5\" value=\"{}\"></label><button>filter</button></form>",
        filter
            .min
            .map_or_else(String::new, |d| (d.as_secs_f64() * 1e3).to_string()),
        filter.limit.unwrap_or(DEFAULT_ROWS),
    );
    if !filter.problems.is_empty() {
        out.push_str("<ul class=\"problems\">");
        for problem in &filter.problems {
            let _ = write!(out, "<li>ignored {}</li>", escape(problem));
        }
        out.push_str("</ul>\n");
    }
    let _ = write!(
        out,
        "<p id=\"count\" data-count=\"{}\">{} call{} shown, slowest first (of the last {} and the slowest of the last {} s)</p>\n\
         <table class=\"calls\"><tr><th>started</th><th>method</th><th>peer</th><th>status</th><th>queued</th>\
         <th>handler</th><th>total</th><th>request</th><th>response</th><th>message</th></tr>\n",
        calls.len(),
        calls.len(),
        if calls.len() == 1 { "" } else { "s" },
        super::RECENT_CALLS,
        super::SLOWEST_FOR.as_secs(),
    );
    for call in &calls {
        call_row(&mut out, call);
    }
    out.push_str("</table>\n");
    out.push_str(END);
    out
}

fn call_row(out: &mut String, call: &CallSample) {
    let method = escape(&call.method);
    let status = call
        .code
        .name()
        .map_or_else(|| call.code.as_u32().to_string(), str::to_owned);
    let _ = writeln!(
        out,
        "<tr class=\"call\" data-id=\"{}\" data-method=\"{method}\" data-status=\"{status}\" data-total-us=\"{}\">\
         <td>{}</td><td><code>{method}</code></td><td><code>{}</code></td><td class=\"status {}\">{status}</td>\
         <td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
         <td class=\"n\">{}</td><td>{}</td></tr>",
        call.id,
        call.total().as_micros(),
        utc(call.started),
        escape(call.peer.as_ref().map_or("", |p| p.description())),
        if call.code == Code::OK { "ok" } else { "err" },
        call.queued.map_or_else(|| "\u{2014}".into(), human),
        human(call.handler),
        human(call.total()),
        bytes(call.request_bytes as u64),
        call.response_bytes
            .map_or_else(|| "\u{2014}".into(), |n| bytes(n as u64)),
        escape(call.message.as_deref().unwrap_or("")),
    );
}

#[cfg(test)]
mod chart_tests {
    /// A second without a value breaks the line (a new segment, `M`), and a value alone
    /// between two gaps is a dot (`h0`): one line drawn across empty seconds showed a
    /// latency climbing between two bursts (from a review).
    #[test]
    fn seconds_without_a_value_break_the_line() {
        let values = [
            Some(1.0),
            Some(2.0),
            None,
            Some(4.0),
            None,
            None,
            Some(3.0),
            Some(4.0),
        ];
        let (d, max) = super::points(&values);
        assert_eq!(max, 4.0);
        let ops: Vec<&str> = d.split(' ').map(|op| &op[..1]).collect();
        assert_eq!(ops, ["M", "L", "M", "h", "M", "L"], "{d}");
        assert!(
            d.starts_with("M0,") && d.contains(" M3,") && d.contains(" M6,"),
            "{d}"
        );
        assert_eq!(super::points(&[None, Some(1.0)]).0, "M1,2.0 h0");
        assert_eq!(super::points(&[None, None]).0, "");
    }
}

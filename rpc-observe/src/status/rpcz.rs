//! The `/rpcz` sample: the most recent calls, and the slowest of the last minutes, each
//! set bounded; and the filter the page applies to them.

use std::{
    collections::VecDeque,
    sync::Arc,
    time::{Duration, SystemTime},
};

use rpc_core::{Code, Peer};

/// Recent calls kept for `/rpcz`, whatever their duration: at a few hundred bytes
/// each, a few hundred kilobytes.
pub const RECENT_CALLS: usize = 1_000;
/// Slowest calls kept for `/rpcz` besides the recent ones, so that a slow call stays
/// visible after a thousand fast ones have pushed it out of the recent ring.
pub const SLOWEST_CALLS: usize = 200;
/// How long a call counts among the slowest: after that it gives way to any call.
pub const SLOWEST_FOR: Duration = Duration::from_secs(300);
/// Longest status message kept with a failed call; the rest is cut.
const MAX_MESSAGE: usize = 200;

/// One call as the status page shows it.
#[derive(Clone, Debug)]
pub struct CallSample {
    /// Increases by one per call recorded, from 1.
    pub id: u64,
    /// `package.Service/Method`, as the client sent it.
    pub method: Arc<str>,
    /// Who called, if the server said.
    pub peer: Option<Arc<Peer>>,
    /// How the call ended.
    pub code: Code,
    /// The status message of a failed call, cut at 200 bytes; `None` for `OK`.
    pub message: Option<Box<str>>,
    /// When the handler started (wall clock).
    pub started: SystemTime,
    /// From the request frame read off the connection to the handler's start, when the
    /// server told when it was read.
    pub queued: Option<Duration>,
    /// The handler's time, with the layers under the status layer.
    pub handler: Duration,
    /// The request message's size (0 for a streaming call).
    pub request_bytes: usize,
    /// The response message's size; `None` for a streamed response or a failed call.
    pub response_bytes: Option<usize>,
}

impl CallSample {
    /// Queued plus handler time: what the page sorts by.
    pub fn total(&self) -> Duration {
        self.queued.unwrap_or_default() + self.handler
    }

    /// Cuts `message` to what a sample keeps.
    pub(crate) fn cut_message(message: &str) -> Box<str> {
        let mut end = message.len().min(MAX_MESSAGE);
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message[..end].into()
    }
}

/// Which status codes `/rpcz` shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusFilter {
    /// Calls that ended with this code.
    Code(Code),
    /// Calls that ended with anything but `OK` (`status=ERROR`).
    Errors,
}

impl StatusFilter {
    fn matches(self, code: Code) -> bool {
        match self {
            StatusFilter::Code(wanted) => code == wanted,
            StatusFilter::Errors => code != Code::OK,
        }
    }
}

/// What `/rpcz` shows: `?method=...&status=...&min_ms=...&limit=...`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RpczFilter {
    /// Calls whose method contains this text (`Echo/Say`, or a whole name).
    pub method: Option<String>,
    /// Calls with this status.
    pub status: Option<StatusFilter>,
    /// Calls that took at least this long (queued plus handler time).
    pub min: Option<Duration>,
    /// At most this many rows, slowest first. Default (`None`): [`DEFAULT_ROWS`].
    pub limit: Option<usize>,
    /// Parameters of the query that were not understood, each with why; the page
    /// shows them and ignores the parameter.
    pub problems: Vec<String>,
}

/// Problems of a query kept (then a count of the others), and characters of each.
const MAX_PROBLEMS: usize = 8;
const MAX_PROBLEM_CHARS: usize = 160;

/// Rows `/rpcz` shows when the query sets no `limit`.
pub const DEFAULT_ROWS: usize = 200;

impl RpczFilter {
    /// Reads a query string (`method=Echo%2FSay&status=NOT_FOUND&min_ms=5`, without
    /// the `?`). Status by name (`OK`, `NOT_FOUND`, any case), by number, or `ERROR`
    /// for every code but `OK`. Never fails: what it cannot read goes to
    /// [`problems`](Self::problems). Empty values are no filter.
    ///
    /// ```
    /// use rpc_observe::status::{RpczFilter, StatusFilter};
    /// let filter = RpczFilter::from_query("method=Echo%2FSay&status=not_found&min_ms=x");
    /// assert_eq!(filter.method.as_deref(), Some("Echo/Say"));
    /// assert_eq!(filter.status, Some(StatusFilter::Code(rpc_core::Code::NOT_FOUND)));
    /// assert_eq!(filter.min, None);
    /// assert_eq!(filter.problems.len(), 1);
    /// ```
    pub fn from_query(query: &str) -> RpczFilter {
        let mut filter = RpczFilter::default();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let (key, value) = (percent_decode(key), percent_decode(value));
            let value = value.trim();
            if value.is_empty() {
                continue;
            }
            match key.as_str() {
                "method" => filter.method = Some(value.to_owned()),
                "status" => match parse_status(value) {
                    Some(status) => filter.status = Some(status),
                    None => filter
                        .problems
                        .push(format!("status={value}: not a status name or number")),
                },
                "min_ms" => match value.parse::<f64>() {
                    Ok(ms) if (0.0..1e12).contains(&ms) => {
                        filter.min = Some(Duration::from_secs_f64(ms / 1000.0))
                    }
                    _ => filter
                        .problems
                        .push(format!("min_ms={value}: not a number of milliseconds")),
                },
                "limit" => match value.parse::<usize>() {
                    Ok(n) => filter.limit = Some(n),
                    Err(_) => filter
                        .problems
                        .push(format!("limit={value}: not a number of rows")),
                },
                other => filter.problems.push(format!(
                    "{other}: not a filter (method, status, min_ms, limit)"
                )),
            }
        }
        // What the page shows of them is bounded, whatever the query's length: a query
        // of thousands of bad parameters made a page 30 times its size.
        for problem in &mut filter.problems {
            if let Some((cut, _)) = problem.char_indices().nth(MAX_PROBLEM_CHARS) {
                problem.truncate(cut);
                problem.push('…');
            }
        }
        if filter.problems.len() > MAX_PROBLEMS {
            let more = filter.problems.len() - MAX_PROBLEMS;
            filter.problems.truncate(MAX_PROBLEMS);
            filter.problems.push(format!("and {more} more"));
        }
        filter
    }

    /// Whether `call` passes.
    pub fn matches(&self, call: &CallSample) -> bool {
        self.method
            .as_deref()
            .is_none_or(|m| call.method.contains(m))
            && self.status.is_none_or(|s| s.matches(call.code))
            && self.min.is_none_or(|min| call.total() >= min)
    }
}

/// A status by name (any case), by number, or `ERROR`.
fn parse_status(text: &str) -> Option<StatusFilter> {
    if text.eq_ignore_ascii_case("ERROR") {
        return Some(StatusFilter::Errors);
    }
    if let Ok(n) = text.parse::<u32>() {
        return Some(StatusFilter::Code(Code::from_u32(n)));
    }
    (0..=16)
        .map(Code::from_u32)
        .find(|code| {
            code.name()
                .is_some_and(|name| name.eq_ignore_ascii_case(text))
        })
        .map(StatusFilter::Code)
}

/// `application/x-www-form-urlencoded` decoding: `+` is a space, `%XX` a byte; a `%`
/// not followed by two hex digits stays as it is, and bytes that are not UTF-8 become
/// U+FFFD.
pub(crate) fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .filter(|h| h.iter().all(u8::is_ascii_hexdigit))
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(byte) => {
                        out.push(byte);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            byte => out.push(byte),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The sample: a ring of the last [`RECENT_CALLS`] calls, and the [`SLOWEST_CALLS`]
/// slowest of the last [`SLOWEST_FOR`]. Both allocated once.
#[derive(Debug)]
pub(crate) struct Rpcz {
    recent: VecDeque<CallSample>,
    /// Each with the second it ended in.
    slowest: Vec<(u64, CallSample)>,
    /// The fastest total time among `slowest` when it is full: calls faster than it
    /// stay out without a scan.
    floor: Duration,
    /// The second `slowest` was last cleared of calls older than [`SLOWEST_FOR`].
    swept: u64,
}

impl Rpcz {
    pub(crate) fn new() -> Rpcz {
        Rpcz {
            recent: VecDeque::with_capacity(RECENT_CALLS),
            slowest: Vec::with_capacity(SLOWEST_CALLS),
            floor: Duration::ZERO,
            swept: 0,
        }
    }

    /// Keeps `call`, which ended in `second`, among the recent calls, and among the
    /// slowest if `slowest` (not a streamed answer: a stream is timed to its end, a
    /// health watch's to its client's leaving, and 200 of them held every place in
    /// the slowest set, hiding the slow calls it exists to keep; from a review).
    pub(crate) fn record(&mut self, second: u64, call: CallSample, slowest: bool) {
        if second != self.swept {
            // Once a second at most: old slow calls give way.
            self.swept = second;
            let before = self.slowest.len();
            self.slowest
                .retain(|(ended, _)| second.saturating_sub(*ended) < SLOWEST_FOR.as_secs());
            if self.slowest.len() != before {
                self.floor = Duration::ZERO;
            }
        }
        let total = call.total();
        if !slowest {
        } else if self.slowest.len() < SLOWEST_CALLS {
            self.slowest.push((second, call.clone()));
            if self.slowest.len() == SLOWEST_CALLS {
                self.floor = self.fastest_slow().1;
            }
        } else if total > self.floor {
            let (index, _) = self.fastest_slow();
            self.slowest[index] = (second, call.clone());
            self.floor = self.fastest_slow().1;
        }
        if self.recent.len() == RECENT_CALLS {
            self.recent.pop_front();
        }
        self.recent.push_back(call);
    }

    /// The index and total time of the fastest call among the slowest.
    fn fastest_slow(&self) -> (usize, Duration) {
        self.slowest
            .iter()
            .enumerate()
            .map(|(i, (_, call))| (i, call.total()))
            .min_by_key(|&(_, total)| total)
            .unwrap_or((0, Duration::ZERO))
    }

    /// The calls `filter` lets through, slowest first, at most its limit.
    pub(crate) fn select(&self, filter: &RpczFilter) -> Vec<CallSample> {
        let mut calls: Vec<&CallSample> = self
            .recent
            .iter()
            .chain(self.slowest.iter().map(|(_, call)| call))
            .filter(|call| filter.matches(call))
            .collect();
        calls.sort_by_key(|call| call.id);
        calls.dedup_by_key(|call| call.id);
        calls.sort_by(|a, b| b.total().cmp(&a.total()).then(b.id.cmp(&a.id)));
        calls.truncate(filter.limit.unwrap_or(DEFAULT_ROWS));
        calls.into_iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(id: u64, method: &str, code: Code, ms: u64) -> CallSample {
        CallSample {
            id,
            method: method.into(),
            peer: None,
            code,
            message: None,
            started: SystemTime::UNIX_EPOCH,
            queued: None,
            handler: Duration::from_millis(ms),
            request_bytes: 0,
            response_bytes: None,
        }
    }

    #[test]
    fn slowest_first_and_filtered() {
        let mut rpcz = Rpcz::new();
        rpcz.record(1, call(1, "a.S/Get", Code::OK, 5), true);
        rpcz.record(1, call(2, "a.S/Get", Code::NOT_FOUND, 50), true);
        rpcz.record(1, call(3, "a.S/Put", Code::OK, 20), true);
        let ids = |filter: &RpczFilter| -> Vec<u64> {
            rpcz.select(filter).iter().map(|c| c.id).collect()
        };
        assert_eq!(ids(&RpczFilter::default()), [2, 3, 1]);
        assert_eq!(ids(&RpczFilter::from_query("method=Get")), [2, 1]);
        assert_eq!(ids(&RpczFilter::from_query("status=OK")), [3, 1]);
        assert_eq!(ids(&RpczFilter::from_query("status=error")), [2]);
        assert_eq!(ids(&RpczFilter::from_query("status=5")), [2]);
        assert_eq!(ids(&RpczFilter::from_query("min_ms=10")), [2, 3]);
        assert_eq!(ids(&RpczFilter::from_query("limit=1")), [2]);
        assert_eq!(
            ids(&RpczFilter::from_query("method=a.S%2FPut&status=OK")),
            [3]
        );
    }

    /// Streamed answers (a health watch held for a minute) stay out of the slowest
    /// calls: 200 of them held every place there, and a slow unary call was gone
    /// from `/rpcz` once the recent ring moved on (from a review).
    #[test]
    fn streamed_answers_do_not_push_slow_calls_out() {
        let mut rpcz = Rpcz::new();
        for id in 1..=SLOWEST_CALLS as u64 {
            rpcz.record(1, call(id, "h.Health/Watch", Code::OK, 60_000), false);
        }
        rpcz.record(1, call(1_000, "a.S/Get", Code::OK, 500), true);
        for id in 2_000..(2_000 + 2 * RECENT_CALLS as u64) {
            rpcz.record(1, call(id, "h.Health/Check", Code::OK, 1), true);
        }
        let slow_gets = RpczFilter::from_query("method=Get&min_ms=100");
        let ids: Vec<u64> = rpcz.select(&slow_gets).iter().map(|c| c.id).collect();
        assert_eq!(ids, [1_000]);
    }

    #[test]
    fn a_slow_call_outlives_the_recent_ring_then_expires() {
        let mut rpcz = Rpcz::new();
        rpcz.record(1, call(1, "m", Code::OK, 900), true);
        for id in 2..(2 + 3 * RECENT_CALLS as u64) {
            rpcz.record(2, call(id, "m", Code::OK, 1), true);
        }
        let slow = RpczFilter::from_query("min_ms=100");
        assert_eq!(rpcz.select(&slow).len(), 1);
        assert_eq!(rpcz.recent.len(), RECENT_CALLS);
        assert_eq!(rpcz.slowest.len(), SLOWEST_CALLS);
        // Once SLOWEST_FOR has passed, it gives way.
        rpcz.record(
            2 + SLOWEST_FOR.as_secs(),
            call(99_999, "m", Code::OK, 1),
            true,
        );
        assert!(rpcz.select(&slow).is_empty());
    }

    #[test]
    fn the_slowest_keep_the_slowest() {
        let mut rpcz = Rpcz::new();
        for id in 1..=1_000u64 {
            rpcz.record(1, call(id, "m", Code::OK, id), true);
        }
        let mut kept: Vec<u64> = rpcz.slowest.iter().map(|(_, c)| c.id).collect();
        kept.sort_unstable();
        assert_eq!(kept, (801..=1_000).collect::<Vec<_>>());
    }

    #[test]
    fn queries_never_fail() {
        for query in [
            "",
            "&&",
            "=",
            "status",
            "status=",
            "min_ms=-1",
            "min_ms=NaN",
            "min_ms=1e400",
            "limit=-3",
            "method=%",
            "method=%zz%4",
            "method=%ff%fe",
            "x=y",
            "status=BOGUS",
        ] {
            let _ = RpczFilter::from_query(query);
        }
        let filter = RpczFilter::from_query("min_ms=NaN&status=BOGUS&x=1&limit=-3");
        assert_eq!(filter.problems.len(), 4, "{:?}", filter.problems);
        assert_eq!(
            filter,
            RpczFilter {
                problems: filter.problems.clone(),
                ..RpczFilter::default()
            }
        );
        assert_eq!(percent_decode("a+b%2Fc%"), "a b/c%");
        assert_eq!(
            RpczFilter::from_query("min_ms=2.5").min,
            Some(Duration::from_micros(2_500))
        );
    }

    #[test]
    fn messages_are_cut_on_a_char_boundary() {
        let long = "é".repeat(300);
        let cut = CallSample::cut_message(&long);
        assert!(cut.len() <= MAX_MESSAGE);
        assert!(long.starts_with(&*cut));
    }
}

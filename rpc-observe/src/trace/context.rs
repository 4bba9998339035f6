//! [`TraceContext`]: a W3C trace context (`traceparent`, `tracestate`), parsed and
//! formatted without OpenTelemetry, and the task-local "current" context that a server
//! span hands to the calls its handler makes.

use std::{cell::Cell, fmt, future::Future};

use tokio::task::futures::TaskLocalFuture;

/// The `traceparent` metadata key (W3C Trace Context, level 1).
pub const TRACEPARENT: &str = "traceparent";

/// The `tracestate` metadata key (W3C Trace Context): vendor data, carried unchanged.
pub const TRACESTATE: &str = "tracestate";

/// The `sampled` bit of the trace flags.
pub const FLAG_SAMPLED: u8 = 0x01;

/// Longest `tracestate` carried on: the W3C limit is 32 members, which in practice
/// stays well under this; a longer one is dropped rather than forwarded.
const MAX_TRACESTATE_LEN: usize = 512;

tokio::task_local! {
    /// The trace context of the server span whose handler is running.
    static CURRENT: Option<TraceContext>;
}

/// One position in a distributed trace: the trace, the span, the flags, and the vendor
/// state, as W3C Trace Context carries them.
///
/// ```
/// use rpc_observe::trace::TraceContext;
/// let header = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
/// let parent = TraceContext::parse(header, Some("vendor=x")).unwrap();
/// assert_eq!(parent.traceparent(), header);
/// let child = parent.child();
/// assert_eq!(child.trace_id, parent.trace_id);
/// assert_ne!(child.span_id, parent.span_id);
/// assert_eq!(child.state.as_deref(), Some("vendor=x"));
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct TraceContext {
    /// The trace, shared by every span of it (never zero).
    pub trace_id: u128,
    /// This span (never zero).
    pub span_id: u64,
    /// Trace flags ([`FLAG_SAMPLED`]).
    pub flags: u8,
    /// The `tracestate` header, carried unchanged.
    pub state: Option<String>,
}

impl fmt::Debug for TraceContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TraceContext")
            .field("trace_id", &format_args!("{:032x}", self.trace_id))
            .field("span_id", &format_args!("{:016x}", self.span_id))
            .field("flags", &self.flags)
            .field("state", &self.state)
            .finish()
    }
}

impl TraceContext {
    /// A new trace: random trace and span ids, sampled.
    pub fn root() -> TraceContext {
        TraceContext {
            trace_id: (u128::from(random_u64()) << 64) | u128::from(random_u64()),
            span_id: random_u64(),
            flags: FLAG_SAMPLED,
            state: None,
        }
    }

    /// A span of the same trace whose parent is this one: a new span id, the same
    /// trace, flags and state.
    pub fn child(&self) -> TraceContext {
        TraceContext {
            span_id: random_u64(),
            ..self.clone()
        }
    }

    /// Parses a `traceparent` header (`00-{trace id}-{span id}-{flags}`, lower-case
    /// hex) and the `tracestate` that came with it. `None` if it is malformed or has
    /// a zero id (the W3C rules: such a header is ignored, and a new trace starts).
    /// A version other than `00` is read as `00` if its first four fields are.
    pub fn parse(traceparent: &str, tracestate: Option<&str>) -> Option<TraceContext> {
        let bytes = traceparent.as_bytes();
        // version(2) - trace(32) - span(16) - flags(2)
        if bytes.len() < 55 || [2, 35, 52].iter().any(|&i| bytes[i] != b'-') {
            return None;
        }
        let version = hex64(&bytes[0..2])?;
        if version == 0xff || (version == 0 && bytes.len() != 55) {
            return None;
        }
        if bytes.len() > 55 && bytes[55] != b'-' {
            return None;
        }
        let trace_id =
            (u128::from(hex64(&bytes[3..19])?) << 64) | u128::from(hex64(&bytes[19..35])?);
        let span_id = hex64(&bytes[36..52])?;
        let flags = u8::try_from(hex64(&bytes[53..55])?).ok()?;
        if trace_id == 0 || span_id == 0 {
            return None;
        }
        let state = tracestate
            .filter(|s| !s.is_empty() && s.len() <= MAX_TRACESTATE_LEN)
            .map(str::to_owned);
        Some(TraceContext {
            trace_id,
            span_id,
            flags,
            state,
        })
    }

    /// The `traceparent` header of this context.
    pub fn traceparent(&self) -> String {
        // By hand rather than `format!`: this runs for every traced call, and
        // formatting a `u128` as hex through `fmt` is several times slower.
        let mut out = *b"00-00000000000000000000000000000000-0000000000000000-00";
        write_hex(&mut out[3..35], &self.trace_id.to_be_bytes());
        write_hex(&mut out[36..52], &self.span_id.to_be_bytes());
        write_hex(&mut out[53..55], &[self.flags]);
        String::from_utf8(out.to_vec()).expect("a traceparent is ASCII")
    }

    /// The context of the server span whose handler is running (set by
    /// [`ServerTraceLayer`](super::ServerTraceLayer) with the default propagator), if
    /// any: what a client call made from a handler continues.
    pub fn current() -> Option<TraceContext> {
        CURRENT.try_with(Clone::clone).ok().flatten()
    }

    /// Runs `poll` with `context` as the [`current`](Self::current) one: how a server
    /// call's future is polled, without a task-local future around calls that have no
    /// context.
    pub(super) fn enter<R>(context: &TraceContext, poll: impl FnOnce() -> R) -> R {
        CURRENT.sync_scope(Some(context.clone()), poll)
    }

    /// Runs `future` with `context` as the [`current`](Self::current) one: how a task
    /// that a handler spawns keeps the handler's trace,
    /// `tokio::spawn(TraceContext::scope(TraceContext::current(), work))`.
    pub fn scope<F: Future>(
        context: Option<TraceContext>,
        future: F,
    ) -> TaskLocalFuture<Option<TraceContext>, F> {
        CURRENT.scope(context, future)
    }
}

/// The value of each ASCII byte as a hex digit (either case), or [`NOT_HEX`].
const HEX_VALUE: [u8; 256] = {
    let mut table = [NOT_HEX; 256];
    let mut i = 0;
    while i < 10 {
        table[b'0' as usize + i] = i as u8;
        i += 1;
    }
    let mut i = 0;
    while i < 6 {
        table[b'a' as usize + i] = 10 + i as u8;
        table[b'A' as usize + i] = 10 + i as u8;
        i += 1;
    }
    table
};

/// [`HEX_VALUE`] of a byte that is not a hex digit: the high bit, which no digit has.
const NOT_HEX: u8 = 0x80;

/// The value of 1 to 16 hex digits (either case), or `None` if there are none, too
/// many, or a byte is not one. A table lookup per digit and one check at the end: the
/// digits of random ids defeat a branch per digit (a `match` on ranges, or
/// `u128::from_str_radix`, were several percent of a traced call's CPU), and a `u64`
/// shifts in one instruction where a `u128` takes several.
fn hex64(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 16 {
        return None;
    }
    let mut value = 0u64;
    let mut bad = 0u8;
    for &b in digits {
        let digit = HEX_VALUE[usize::from(b)];
        bad |= digit;
        value = (value << 4) | u64::from(digit & 0xf);
    }
    (bad & NOT_HEX == 0).then_some(value)
}

/// Writes `bytes` as lowercase hex into `out` (two digits a byte: `out` is twice as
/// long).
fn write_hex(out: &mut [u8], bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for (pair, &b) in out.chunks_exact_mut(2).zip(bytes) {
        pair[0] = HEX[usize::from(b >> 4)];
        pair[1] = HEX[usize::from(b & 0xf)];
    }
}

/// A non-zero random number: splitmix64 over a per-thread state seeded from
/// [`rpc_core::frame::random_client_id`] (ids need to be unique, not secret).
fn random_u64() -> u64 {
    thread_local! {
        static STATE: Cell<u64> = Cell::new(rpc_core::frame::random_client_id() as u64);
    }
    loop {
        let x = STATE.with(|s| {
            let next = s.get().wrapping_add(0x9e37_79b9_7f4a_7c15);
            s.set(next);
            next
        });
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        if z != 0 {
            return z;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_w3c_example_and_formats_it_back() {
        let header = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let context = TraceContext::parse(header, None).unwrap();
        assert_eq!(context.trace_id, 0x4bf92f3577b34da6a3ce929d0e0e4736);
        assert_eq!(context.span_id, 0x00f067aa0ba902b7);
        assert_eq!(context.flags, FLAG_SAMPLED);
        assert_eq!(context.traceparent(), header);
    }

    #[test]
    fn hex_digits_either_case_and_nothing_else() {
        assert_eq!(hex64(b"00f067aa0ba902b7"), Some(0x00f0_67aa_0ba9_02b7));
        assert_eq!(hex64(b"ABCdef"), Some(0xabcdef));
        assert_eq!(hex64(b"0123456789"), Some(0x0123456789));
        assert_eq!(hex64("f".repeat(16).as_bytes()), Some(u64::MAX));
        for bad in [
            "", "+1", "-1", "0x1", " 1", "g", "G", "/", ":", "@", "`", "\u{e9}",
        ] {
            assert_eq!(hex64(bad.as_bytes()), None, "{bad:?}");
        }
        assert_eq!(hex64("1".repeat(17).as_bytes()), None);
        // Every byte: a digit exactly when it is one of 0-9, a-f, A-F.
        for b in 0..=255u8 {
            assert_eq!(
                hex64(&[b]).is_some(),
                b.is_ascii_hexdigit(),
                "byte {b:#04x}"
            );
        }
        let mut out = [0u8; 4];
        write_hex(&mut out, &[0x0a, 0xb1]);
        assert_eq!(&out, b"0ab1");
    }

    #[test]
    fn ids_with_any_digits_round_trip() {
        for (trace_id, span_id, flags) in [
            (u128::MAX, u64::MAX, 0xff),
            (1, 1, 0),
            (
                0x0123_4567_89ab_cdef_fedc_ba98_7654_3210,
                0x8000_0000_0000_0001,
                1,
            ),
            (1 << 64, 1 << 63, 0x10),
        ] {
            let context = TraceContext {
                trace_id,
                span_id,
                flags,
                state: None,
            };
            let header = context.traceparent();
            assert_eq!(header.len(), 55);
            assert_eq!(header, header.to_lowercase());
            assert_eq!(TraceContext::parse(&header, None), Some(context));
        }
    }

    #[test]
    fn refuses_malformed_and_zero_ids() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceContext::parse(bad, None), None, "{bad:?}");
        }
        // A future version with more fields is read for what version 00 defines.
        let future = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-more";
        assert!(TraceContext::parse(future, None).is_some());
    }

    #[test]
    fn roots_and_children_have_fresh_non_zero_ids() {
        let root = TraceContext::root();
        assert_ne!(root.trace_id, 0);
        let child = root.child();
        assert_eq!(child.trace_id, root.trace_id);
        assert_ne!(child.span_id, root.span_id);
        assert_eq!(TraceContext::parse(&child.traceparent(), None), Some(child));
    }

    #[tokio::test]
    async fn current_is_the_scoped_context() {
        assert_eq!(TraceContext::current(), None);
        let root = TraceContext::root();
        let seen = TraceContext::scope(Some(root.clone()), async { TraceContext::current() }).await;
        assert_eq!(seen, Some(root));
    }
}

//! [`TraceContext`]: a W3C trace context (`traceparent`, `tracestate`), parsed and
//! formatted without OpenTelemetry, and the task-local "current" context that a server
//! span hands to the calls its handler makes.

use std::{cell::Cell, fmt, future::Future};

use bytes::Bytes;
use rpc_core::ByteStr;

use tokio::task::futures::TaskLocalFuture;

/// The `traceparent` metadata key (W3C Trace Context, level 1).
pub const TRACEPARENT: &str = "traceparent";

/// The `tracestate` metadata key (W3C Trace Context): vendor data, carried unchanged.
pub const TRACESTATE: &str = "tracestate";

/// The `sampled` bit of the trace flags.
pub const FLAG_SAMPLED: u8 = 0x01;
/// The trace flags W3C Trace Context defines: sampled (Level 1) and random (Level 2,
/// `0x02`: the trace id's right 7 bytes are random). A child passes on only these.
const KNOWN_FLAGS: u8 = FLAG_SAMPLED | 0x02;

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
    /// trace and state, and the flags W3C Trace Context defines (sampled, and Level 2's
    /// random trace id): the others a vendor MUST set to zero, not pass on.
    pub fn child(&self) -> TraceContext {
        TraceContext {
            span_id: random_u64(),
            flags: self.flags & KNOWN_FLAGS,
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
        if bytes.len() < 55 || bytes[2] != b'-' || bytes[35] != b'-' || bytes[52] != b'-' {
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
            (u128::from(hex16(&bytes[3..19])?) << 64) | u128::from(hex16(&bytes[19..35])?);
        let span_id = hex16(&bytes[36..52])?;
        let flags = u8::try_from(hex64(&bytes[53..55])?).ok()?;
        if trace_id == 0 || span_id == 0 {
            return None;
        }
        // Passed on to every call the handler makes: only a value that any wire carries,
        // in the W3C form (printable ASCII; a gRPC peer's header takes nothing else, and
        // one `é` failed every gRPC call of the handler).
        let state = tracestate.and_then(self::tracestate);
        Some(TraceContext {
            trace_id,
            span_id,
            flags,
            state,
        })
    }

    /// The `traceparent` header of this context.
    pub fn traceparent(&self) -> String {
        String::from(self.traceparent_value().as_str())
    }

    /// The `traceparent` header as a metadata value: no `String` on the way (this runs
    /// for every traced call).
    pub(super) fn traceparent_value(&self) -> ByteStr {
        let mut out = *b"00-00000000000000000000000000000000-0000000000000000-00";
        out[3..19].copy_from_slice(&hex16_out((self.trace_id >> 64) as u64));
        out[19..35].copy_from_slice(&hex16_out(self.trace_id as u64));
        out[36..52].copy_from_slice(&hex16_out(self.span_id));
        out[53..55].copy_from_slice(&hex16_out(u64::from(self.flags))[14..]);
        ByteStr::from_utf8(Bytes::copy_from_slice(&out)).expect("a traceparent is ASCII")
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
        i += 1;
    }
    table
};

/// [`HEX_VALUE`] of a byte that is not a hex digit: the high bit, which no digit has.
const NOT_HEX: u8 = 0x80;

/// The value of 1 to 16 lowercase hex digits (W3C's `HEXDIGLC`: a `traceparent` with
/// an upper-case digit is not one, and starts a new trace), or `None` if there are none, too
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

/// The value of exactly 16 lowercase hex digits, or `None` if a byte is not one.
fn hex16(digits: &[u8]) -> Option<u64> {
    let (high, low) = digits.split_at_checked(8)?;
    let high = hex8(high.try_into().ok()?)?;
    let low = hex8(low.try_into().ok()?)?;
    Some((u64::from(high) << 32) | u64::from(low))
}

/// Every byte of a word: `0x01` in each.
const ONES: u64 = 0x0101_0101_0101_0101;

/// The value of eight lowercase hex digits, the first the most significant, or
/// `None` if a byte is not one: a word at a time (a trace and a span id are six
/// words), where [`hex64`] takes a table lookup and a shift per digit.
fn hex8(digits: &[u8; 8]) -> Option<u32> {
    const HIGH: u64 = ONES * 0x80;
    let x = u64::from_le_bytes(*digits);
    // With every byte below 0x80, adding less than 0x80 to each carries into no other.
    if x & HIGH != 0 {
        return None;
    }
    // The high bit of each byte that is at least `n`.
    let at_least = |n: u8| (x + ONES * u64::from(0x80 - n)) & HIGH;
    let digit = at_least(b'0') & !at_least(b'9' + 1);
    let lower = at_least(b'a') & !at_least(b'f' + 1);
    if digit | lower != HIGH {
        return None;
    }
    // A digit's value is its low four bits; a letter's (bit 6 set) those plus 9.
    let nibbles = (x & (ONES * 0x0f)) + ((x >> 6) & ONES) * 9;
    // Byte i holds digit i, the most significant first: pair, then quad, then the word.
    let pairs = ((nibbles & 0x000f_000f_000f_000f) << 4) | ((nibbles >> 8) & 0x000f_000f_000f_000f);
    let quads = ((pairs & 0x0000_00ff_0000_00ff) << 8) | ((pairs >> 16) & 0x0000_00ff_0000_00ff);
    let word = ((quads & 0xffff) << 16) | ((quads >> 32) & 0xffff);
    Some(word as u32)
}

/// `value` as 16 lowercase hex digits, a word of eight at a time.
fn hex16_out(value: u64) -> [u8; 16] {
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&hex8_out((value >> 32) as u32));
    out[8..].copy_from_slice(&hex8_out(value as u32));
    out
}

/// `value` as eight lowercase hex digits: its nibbles spread over a word's bytes, the
/// most significant first, then `'0'` added to each and `'a' - '0' - 10` more to those
/// of ten and above.
fn hex8_out(value: u32) -> [u8; 8] {
    let mut x = u64::from(value);
    x = (x | (x << 16)) & 0x0000_ffff_0000_ffff;
    x = (x | (x << 8)) & 0x00ff_00ff_00ff_00ff;
    x = (x | (x << 4)) & 0x0f0f_0f0f_0f0f_0f0f;
    let letters = ((x + ONES * 6) >> 4) & ONES;
    (x + ONES * u64::from(b'0') + letters * u64::from(b'a' - b'0' - 10)).to_be_bytes()
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

/// The `tracestate` to keep and pass on (W3C Trace Context, 3.3), normalized: its list
/// members without the optional whitespace around them, joined by `,`. `None` (the
/// header is dropped whole, as the spec allows) when a member is not `key=value` in
/// the spec's grammar (keys lower-case `a-z0-9_-*/`, at most 256 characters, or
/// `tenant@system`; values printable ASCII without `,` and `=`, at most 256, not
/// ending in a space), a key repeats, or there are more than 32 members. Over
/// [`MAX_TRACESTATE_LEN`] bytes, members are dropped as the spec says: first those
/// longer than 128 characters, then from the end.
fn tracestate(value: &str) -> Option<String> {
    // More than 32 members of the longest size could hold: no need to read further.
    if value.len() > 32 * 520 {
        return None;
    }
    let mut members: Vec<(&str, &str)> = Vec::new();
    for member in value.split(',') {
        let member = member.trim_matches([' ', '\t']);
        if member.is_empty() {
            continue;
        }
        let (key, val) = member.split_once('=')?;
        if !tracestate_key(key) || !tracestate_value(val) || members.iter().any(|(k, _)| *k == key)
        {
            return None;
        }
        members.push((key, val));
        if members.len() > 32 {
            return None;
        }
    }
    let len = |members: &[(&str, &str)]| {
        members
            .iter()
            .map(|(k, v)| k.len() + 1 + v.len())
            .sum::<usize>()
            + members.len().saturating_sub(1)
    };
    while len(&members) > MAX_TRACESTATE_LEN {
        match members
            .iter()
            .rposition(|(k, v)| k.len() + 1 + v.len() > 128)
        {
            Some(long) => members.remove(long),
            None => members.pop()?,
        };
    }
    if members.is_empty() {
        return None;
    }
    let mut out = String::with_capacity(len(&members));
    for (i, (key, val)) in members.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(key);
        out.push('=');
        out.push_str(val);
    }
    Some(out)
}

/// A `tracestate` key: `lcalpha 0*255(lcalpha / DIGIT / "_" / "-" / "*" / "/")`, or
/// `tenant@system` (a tenant of at most 241 starting with a letter or digit, a system
/// of at most 14 starting with a letter).
fn tracestate_key(key: &str) -> bool {
    let rest = |b: u8| {
        b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'-' | b'*' | b'/')
    };
    let part = |text: &str, max: usize, first: fn(&u8) -> bool| {
        text.len() <= max && text.as_bytes().first().is_some_and(first) && text.bytes().all(rest)
    };
    match key.split_once('@') {
        None => part(key, 256, u8::is_ascii_lowercase),
        Some((tenant, system)) => {
            part(tenant, 241, |b| {
                b.is_ascii_lowercase() || b.is_ascii_digit()
            }) && part(system, 14, u8::is_ascii_lowercase)
        }
    }
}

/// A `tracestate` value: 1 to 256 printable ASCII characters but `,` and `=`, not
/// ending in a space.
fn tracestate_value(value: &str) -> bool {
    (1..=256).contains(&value.len())
        && value
            .bytes()
            .all(|b| (0x20..=0x7e).contains(&b) && b != b',' && b != b'=')
        && !value.ends_with(' ')
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A caller's `tracestate` is kept only in the W3C form, printable ASCII: it is
    /// passed on to every call the handler makes, and a gRPC peer's header takes
    /// nothing else (a review: `k=é` failed every gRPC call of the handler).
    #[test]
    fn only_a_well_formed_tracestate_is_kept() {
        let header = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let kept = |state: &str| {
            TraceContext::parse(header, Some(state))
                .unwrap()
                .state
                .is_some()
        };
        assert!(kept("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"));
        assert!(kept("a=1, ,b=2"));
        for bad in ["", "k=\u{e9}", "k=v\nx=y", "novalue", "=v", "k=", ",,"] {
            assert!(!kept(bad), "{bad:?} kept");
        }
        let many = (0..33)
            .map(|i| format!("k{i}=v"))
            .collect::<Vec<_>>()
            .join(",");
        assert!(!kept(&many), "33 members kept");
        assert!(!kept(&format!("k={}", "v".repeat(MAX_TRACESTATE_LEN))));
    }

    /// The spec's grammar, not only `key=value`: optional whitespace (tabs too) around
    /// members is allowed and dropped; upper-case keys, `=` in a value, a repeated key
    /// or a key of 257 characters drop the header (a strict SDK downstream would drop
    /// it, with every vendor's entry); a header over 512 bytes loses its members over
    /// 128 characters first, then members from the end.
    #[test]
    fn tracestate_follows_the_w3c_grammar_and_truncation() {
        let header = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let state = |state: &str| TraceContext::parse(header, Some(state)).unwrap().state;
        assert_eq!(state("a=1,\tb=2 ").as_deref(), Some("a=1,b=2"));
        assert_eq!(state("t0@sys=x y").as_deref(), Some("t0@sys=x y"));
        let long_key = "k".repeat(257);
        for bad in [
            "K=v",
            "k=a=b",
            "a=1,a=2",
            "1k=v",
            "t@Sys=1",
            &format!("{long_key}=v"),
        ] {
            assert_eq!(state(bad), None, "{bad:?} kept");
        }
        let long = format!("big={}", "x".repeat(200));
        let members: Vec<String> = (0..25).map(|i| format!("k{i:02}=v")).collect();
        let input = format!(
            "{},{long},{}",
            members[..12].join(","),
            members[12..].join(",")
        );
        let padded = format!(
            "{input},{}",
            (0..2)
                .map(|i| format!("p{i}={}", "y".repeat(120)))
                .collect::<Vec<_>>()
                .join(",")
        );
        assert!(padded.len() > MAX_TRACESTATE_LEN, "{}", padded.len());
        let kept = state(&padded).expect("a tracestate");
        assert!(kept.len() <= MAX_TRACESTATE_LEN, "{}", kept.len());
        assert!(!kept.contains("big="), "the long member goes first: {kept}");
        assert!(
            kept.starts_with("k00=v,") && kept.contains("k24=v,p0="),
            "{kept}"
        );
    }

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
    fn lowercase_hex_digits_and_nothing_else() {
        assert_eq!(hex64(b"00f067aa0ba902b7"), Some(0x00f0_67aa_0ba9_02b7));
        assert_eq!(hex64(b"abcdef"), Some(0xabcdef));
        assert_eq!(hex64(b"ABCdef"), None, "W3C's ids are lowercase");
        assert_eq!(hex64(b"0123456789"), Some(0x0123456789));
        assert_eq!(hex64("f".repeat(16).as_bytes()), Some(u64::MAX));
        for bad in [
            "", "+1", "-1", "0x1", " 1", "g", "G", "/", ":", "@", "`", "\u{e9}",
        ] {
            assert_eq!(hex64(bad.as_bytes()), None, "{bad:?}");
        }
        assert_eq!(hex64("1".repeat(17).as_bytes()), None);
        // Every byte: a digit exactly when it is one of 0-9, a-f.
        for b in 0..=255u8 {
            assert_eq!(
                hex64(&[b]).is_some(),
                b.is_ascii_digit() || (b'a'..=b'f').contains(&b),
                "byte {b:#04x}"
            );
        }
    }

    #[test]
    fn words_of_lowercase_hex_digits_and_nothing_else() {
        assert_eq!(hex8(b"00f067aa"), Some(0x00f0_67aa));
        assert_eq!(hex8(b"abcdef09"), Some(0xabcd_ef09));
        assert_eq!(hex8(b"ABCdef09"), None);
        assert_eq!(hex16(b"4bf92f3577b34da6"), Some(0x4bf9_2f35_77b3_4da6));
        assert_eq!(hex16(b"4bf92f3577b34da"), None);
        assert_eq!(hex8_out(0x0a0b_c1f9), *b"0a0bc1f9");
        assert_eq!(hex16_out(u64::MAX), *b"ffffffffffffffff");
        // Every byte in every position: a digit exactly when it is one of 0-9, a-f,
        // with the value `hex64` gives it.
        for position in 0..8 {
            for b in 0..=255u8 {
                let mut digits = *b"01234567";
                digits[position] = b;
                let word = hex8(&digits);
                assert_eq!(
                    word.is_some(),
                    b.is_ascii_digit() || (b'a'..=b'f').contains(&b),
                    "byte {b:#04x} at {position}"
                );
                if let Some(word) = word {
                    assert_eq!(u64::from(word), hex64(&digits).unwrap());
                }
            }
        }
        // Every nibble in every position, out and back.
        for position in 0..8 {
            for nibble in 0..16u32 {
                let value = 0x1234_5678 ^ (nibble << (4 * position));
                let digits = hex8_out(value);
                assert_eq!(digits, *format!("{value:08x}").as_bytes());
                assert_eq!(hex8(&digits), Some(value));
            }
        }
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

    /// A child passes on only the flags W3C defines (sampled, random): the others a
    /// vendor MUST set to zero (they were forwarded as they came).
    #[test]
    fn a_child_passes_on_only_the_defined_flags() {
        let parent = TraceContext::parse(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-ff",
            None,
        )
        .unwrap();
        assert_eq!(parent.flags, 0xff);
        assert!(parent.child().traceparent().ends_with("-03"));
        let unsampled = TraceContext::parse(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
            None,
        )
        .unwrap();
        assert!(unsampled.child().traceparent().ends_with("-00"));
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
            // Upper-case hex is not W3C's (its test suite ignores such a header).
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00F067AA0BA902B7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0A",
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

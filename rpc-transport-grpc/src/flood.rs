//! The server's bound on HTTP/2 control frames: PINGs, SETTINGS, PRIORITY,
//! WINDOW_UPDATEs and frames of types HTTP/2 does not define, which h2 answers or
//! drops by itself without a limit. A peer that read its socket was answered 74,000
//! PINGs a second for as long as it sent them (another client's latency rose to
//! 241 ms on two cores), and 1.1 million PRIORITY frames or 1.9 million unknown frames
//! a second were taken for ever.
//!
//! [`ControlFrames`] counts the control frames the server reads since the last sign of
//! a call: a HEADERS frame or a DATA frame with a payload (or END_STREAM) read, or a
//! HEADERS or DATA frame written. Legitimate control frames come with calls (the
//! WINDOW_UPDATEs of a download, grpc-core's BDP PINGs while data arrives, both
//! following DATA the server wrote) or seldom (keepalive PINGs, every few seconds at
//! most; a SETTINGS change), so the count starts over at every sign of a call. Past
//! `max` control frames within `period` of the first one counted, the connection is
//! closed with GOAWAY `ENHANCE_YOUR_CALM`, as grpc-go closes a peer that PINGs too
//! often (`too_many_pings`). A count that reaches `max` after `period` or more starts
//! again with that frame: a peer that sends control frames and nothing else is held to
//! `max` per `period` (100 a second with the defaults) rather than closed.
//!
//! PING and SETTINGS acknowledgements count too: a peer sends them only in answer to
//! ours (one SETTINGS, and a keepalive PING per interval), so a flood of them is no
//! answer. Empty DATA frames without END_STREAM count, carrying nothing. RST_STREAM
//! does not (a client may cancel thousands of calls at once; the link's reset budget
//! bounds those), nor GOAWAY, CONTINUATION or PUSH_PROMISE (h2's to refuse).
//!
//! Sans-IO: the wrapper that reads the frame headers (`crate::meter`) feeds it, and
//! the clock is read only at the first control frame after a sign of a call and once
//! every `max` frames after it.

use std::time::Duration;

use tokio::time::Instant;

const DATA: u8 = 0;
const HEADERS: u8 = 1;
const PRIORITY: u8 = 2;
const SETTINGS: u8 = 4;
const PING: u8 = 6;
const WINDOW_UPDATE: u8 = 8;
/// The highest frame type RFC 9113 defines (CONTINUATION).
const LAST_KNOWN: u8 = 9;
const END_STREAM: u8 = 0x1;

/// A server connection's count of control frames (see the module docs).
#[derive(Debug)]
pub(crate) struct ControlFrames {
    max: u32,
    period: Duration,
    /// Control frames counted since `since`.
    count: u32,
    /// When the count started: `None` right after a sign of a call.
    since: Option<Instant>,
    /// The writer's count of HEADERS and DATA frames written, as last seen.
    written: u64,
}

/// What a frame is to the count.
#[derive(Debug, PartialEq)]
enum Kind {
    /// A sign of a call: the count starts over.
    Call,
    /// Counted.
    Control,
    /// Neither.
    Other,
}

fn kind(frame_type: u8, flags: u8, len: usize) -> Kind {
    match frame_type {
        HEADERS => Kind::Call,
        DATA if len > 0 || flags & END_STREAM != 0 => Kind::Call,
        DATA | PRIORITY | SETTINGS | PING | WINDOW_UPDATE => Kind::Control,
        t if t > LAST_KNOWN => Kind::Control,
        _ => Kind::Other,
    }
}

impl ControlFrames {
    /// At most `max` control frames within `period` (see the module docs).
    pub(crate) fn new(max: u32, period: Duration) -> ControlFrames {
        ControlFrames {
            max: max.max(1),
            period,
            count: 0,
            since: None,
            written: 0,
        }
    }

    /// A frame header read: its type, flags and payload length, with the writer's
    /// count of HEADERS and DATA frames written so far. False once the peer has sent
    /// more control frames than the budget allows (and the connection is to close).
    pub(crate) fn read(
        &mut self,
        frame_type: u8,
        flags: u8,
        len: usize,
        written: u64,
        now: impl FnOnce() -> Instant,
    ) -> bool {
        if written != self.written {
            self.written = written;
            self.since = None;
        }
        match kind(frame_type, flags, len) {
            Kind::Call => {
                self.since = None;
                true
            }
            Kind::Other => true,
            Kind::Control => match self.since {
                None => {
                    self.since = Some(now());
                    self.count = 1;
                    true
                }
                Some(_) if self.count < self.max => {
                    self.count += 1;
                    true
                }
                Some(since) => {
                    let now = now();
                    if now.saturating_duration_since(since) < self.period {
                        return false;
                    }
                    self.since = Some(now);
                    self.count = 1;
                    true
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ACK: u8 = 0x1;

    #[test]
    fn frames_are_sorted_into_calls_control_and_neither() {
        assert_eq!(kind(HEADERS, 0, 0), Kind::Call);
        assert_eq!(kind(DATA, 0, 5), Kind::Call);
        assert_eq!(kind(DATA, END_STREAM, 0), Kind::Call);
        assert_eq!(kind(DATA, 0, 0), Kind::Control);
        for t in [PRIORITY, SETTINGS, PING, WINDOW_UPDATE, 10, 0x77, 0xff] {
            assert_eq!(kind(t, 0, 8), Kind::Control, "type {t}");
        }
        assert_eq!(kind(PING, ACK, 8), Kind::Control);
        // RST_STREAM, PUSH_PROMISE, GOAWAY, CONTINUATION.
        for t in [3, 5, 7, 9] {
            assert_eq!(kind(t, 0, 8), Kind::Other, "type {t}");
        }
    }

    #[test]
    fn more_than_max_within_the_period_spends_the_budget() {
        let start = Instant::now();
        let mut frames = ControlFrames::new(100, Duration::from_secs(10));
        for i in 0..100 {
            assert!(frames.read(PING, 0, 8, 0, || start), "frame {i}");
        }
        assert!(!frames.read(PING, 0, 8, 0, || start + Duration::from_secs(9)));
    }

    #[test]
    fn a_call_either_way_starts_the_count_over() {
        let start = Instant::now();
        let mut frames = ControlFrames::new(100, Duration::from_secs(10));
        for round in 0..10 {
            for _ in 0..100 {
                assert!(frames.read(WINDOW_UPDATE, 0, 4, round, || start));
            }
            // DATA written (the writer's count moved): the count starts over.
        }
        for _ in 0..100 {
            assert!(frames.read(PING, 0, 8, 10, || start));
        }
        // A HEADERS frame read.
        assert!(frames.read(HEADERS, 0, 20, 10, || start));
        for _ in 0..100 {
            assert!(frames.read(PRIORITY, 0, 5, 10, || start));
        }
        // Empty DATA frames do not.
        assert!(!frames.read(DATA, 0, 0, 10, || start));
    }

    /// Keepalive PINGs on an idle connection, however long it lives, and a peer held
    /// to `max` per `period`, are not ended.
    #[test]
    fn a_slow_count_starts_again_after_the_period() {
        let start = Instant::now();
        let mut frames = ControlFrames::new(100, Duration::from_secs(10));
        let mut at = start;
        for _ in 0..10_000 {
            // One every 200 ms: 50 per period.
            at += Duration::from_millis(200);
            assert!(frames.read(PING, 0, 8, 0, || at));
        }
        let mut frames = ControlFrames::new(100, Duration::from_secs(10));
        for period in 0..5 {
            let at = start + Duration::from_secs(10 * period);
            for _ in 0..100 {
                assert!(frames.read(PING, 0, 8, 0, || at));
            }
        }
    }
}

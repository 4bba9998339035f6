//! The bound on a peer's HTTP/2 control frames (a client's on a server, and a
//! server's on a client, since session 41): PINGs, SETTINGS, PRIORITY,
//! WINDOW_UPDATEs and frames of types HTTP/2 does not define, which a connection
//! answers or drops by itself. Without a limit (the h2 crate, which the links ran on
//! before), a peer that read its socket was answered 74,000 PINGs a second for as long
//! as it sent them (another client's latency rose to 241 ms on two cores), and 1.1
//! million PRIORITY frames or 1.9 million unknown frames a second were taken for ever.
//!
//! [`ControlFrames`] counts the control frames the server reads, less a credit of
//! [`CALL_CREDIT`] for each sign of a call: a HEADERS frame or a DATA frame of at
//! least [`CREDITED_DATA`] bytes (or with END_STREAM) read, or a HEADERS or DATA frame
//! written. Legitimate
//! control frames come with calls (the WINDOW_UPDATEs of a download, grpc-core's BDP
//! PINGs while data arrives, a cancelled call's RST_STREAM: a few per DATA or HEADERS
//! frame at most) or seldom (keepalive PINGs, every few seconds at most; a SETTINGS
//! change), so calls pay for them. Past `max` control frames within `period` of the
//! first one counted, the connection is closed with GOAWAY `ENHANCE_YOUR_CALM`, as
//! grpc-go closes a peer that PINGs too often (`too_many_pings`). Credit that finds
//! the count at 0 is kept, up to `max` frames, for the control frames to come: a
//! client that cancels a burst of calls at once (a few hundred in flight whose
//! deadlines pass together) sends their RST_STREAMs after all their HEADERS, and an
//! h2-based client writes the frames of many streams round-robin, so the calls' own
//! control frames often come after all the calls did (a credit that was lost when it
//! found nothing to pay for closed such a connection). A count that
//! reaches `max` after `period` or more starts again with that frame: a peer that
//! sends control frames and nothing else is held to `max` per `period` (100 a second
//! with the defaults) rather than closed. (A sign of a call once started the count
//! over: 999 PINGs and one call to an unknown method, over and over, kept almost all
//! of a flood's rate; a review.)
//!
//! PING and SETTINGS acknowledgements count too: a peer sends them only in answer to
//! ours (one SETTINGS, and a keepalive PING per interval), so a flood of them is no
//! answer. Empty DATA frames without END_STREAM count, carrying nothing; so do
//! RST_STREAM and GOAWAY (an RST_STREAM of a stream long closed, and a GOAWAY
//! repeating the last one, are taken without a word: a flood of either after one call
//! was bounded by nothing; a client that cancels its calls sent a HEADERS for each,
//! which pays for the RST_STREAM). CONTINUATION and PUSH_PROMISE do not count (the
//! connection bounds the first and refuses the second).
//!
//! Sans-IO: the server's HTTP/2 connection (`crate::http2::conn`) feeds it each frame
//! header it reads, and
//! the clock is read only at the first control frame after a sign of a call and once
//! every `max` frames after it.

use std::time::Duration;

use tokio::time::Instant;

const DATA: u8 = 0;
const HEADERS: u8 = 1;
const PRIORITY: u8 = 2;
const SETTINGS: u8 = 4;
const RST_STREAM: u8 = 3;
const PING: u8 = 6;
const GOAWAY: u8 = 7;
const WINDOW_UPDATE: u8 = 8;
/// The highest frame type RFC 9113 defines (CONTINUATION).
const LAST_KNOWN: u8 = 9;
const END_STREAM: u8 = 0x1;

/// Control frames a sign of a call (a HEADERS or DATA frame read or written) takes
/// off the count: more than a call's own control frames (a WINDOW_UPDATE for the
/// stream and one for the connection per DATA frame, a BDP PING, an RST_STREAM), far
/// fewer than a flood sends per call.
pub(crate) const CALL_CREDIT: u32 = 8;

/// Bytes of payload a DATA frame read (without END_STREAM) must carry to pay
/// [`CALL_CREDIT`]: a peer that sent 1-byte DATA frames, each followed by 8 PINGs,
/// kept almost all of a flood's rate (a review). Smaller ones count for nothing either
/// way; a client's stream of small messages is paid for by the answers written.
pub(crate) const CREDITED_DATA: usize = 1024;

/// A server connection's count of control frames (see the module docs).
#[derive(Debug)]
pub(crate) struct ControlFrames {
    max: u32,
    period: Duration,
    /// Control frames counted since `since`, less the credit of the calls since.
    count: u32,
    /// Credit of calls that found `count` at 0, kept for the control frames to come:
    /// at most `max`.
    banked: u32,
    /// When the count started: `None` while it is 0.
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
        DATA if len >= CREDITED_DATA || flags & END_STREAM != 0 => Kind::Call,
        DATA if len > 0 => Kind::Other,
        DATA | PRIORITY | RST_STREAM | SETTINGS | PING | GOAWAY | WINDOW_UPDATE => Kind::Control,
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
            banked: 0,
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
        let kind = kind(frame_type, flags, len);
        let mut calls = written.wrapping_sub(self.written);
        self.written = written;
        if kind == Kind::Call {
            calls = calls.saturating_add(1);
        }
        if calls > 0 {
            let credit = u32::try_from(calls)
                .unwrap_or(u32::MAX)
                .saturating_mul(CALL_CREDIT);
            let paid = credit.min(self.count);
            self.count -= paid;
            self.banked = self.banked.saturating_add(credit - paid).min(self.max);
            if self.count == 0 {
                self.since = None;
            }
        }
        match kind {
            Kind::Call | Kind::Other => true,
            Kind::Control if self.banked > 0 => {
                self.banked -= 1;
                true
            }
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
        assert_eq!(kind(DATA, 0, CREDITED_DATA), Kind::Call);
        assert_eq!(kind(DATA, 0, 5), Kind::Other);
        assert_eq!(kind(DATA, END_STREAM, 0), Kind::Call);
        assert_eq!(kind(DATA, 0, 0), Kind::Control);
        for t in [PRIORITY, SETTINGS, PING, WINDOW_UPDATE, 10, 0x77, 0xff] {
            assert_eq!(kind(t, 0, 8), Kind::Control, "type {t}");
        }
        assert_eq!(kind(PING, ACK, 8), Kind::Control);
        assert_eq!(kind(RST_STREAM, 0, 4), Kind::Control);
        assert_eq!(kind(GOAWAY, 0, 8), Kind::Control);
        // PUSH_PROMISE, CONTINUATION.
        for t in [5, 9] {
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

    /// A download's control frames (two WINDOW_UPDATEs and a BDP PING per DATA frame
    /// written), a client's cancels (an RST_STREAM after each HEADERS), go on for
    /// ever: each call pays for its own.
    #[test]
    fn calls_either_way_pay_for_their_control_frames() {
        let start = Instant::now();
        let mut frames = ControlFrames::new(100, Duration::from_secs(10));
        for written in 1..=100_000u64 {
            assert!(frames.read(WINDOW_UPDATE, 0, 4, written, || start));
            assert!(frames.read(WINDOW_UPDATE, 0, 4, written, || start));
            assert!(frames.read(PING, 0, 8, written, || start));
        }
        for _ in 0..100_000 {
            assert!(frames.read(HEADERS, 0, 20, 100_000, || start));
            assert!(frames.read(RST_STREAM, 0, 4, 100_000, || start));
        }
        // Empty DATA frames are no call: what the calls banked (100, less the last
        // RST_STREAM), then the budget, run out.
        for _ in 0..199 {
            assert!(frames.read(DATA, 0, 0, 100_000, || start));
        }
        assert!(!frames.read(DATA, 0, 0, 100_000, || start));
    }

    /// A burst of calls, then all their RST_STREAMs (a client whose calls' deadlines
    /// passed together; an h2-based client writing many streams' frames round-robin):
    /// the calls pay for their cancels though these came after them all, up to `max`
    /// banked, and then the budget as ever.
    #[test]
    fn calls_pay_for_control_frames_that_come_after_them_all() {
        let start = Instant::now();
        let mut frames = ControlFrames::new(1_000, Duration::from_secs(10));
        for _ in 0..256 {
            assert!(frames.read(HEADERS, 0, 20, 0, || start));
        }
        for _ in 0..256 {
            assert!(frames.read(RST_STREAM, 0, 4, 0, || start));
        }
        // 744 banked are left (1,000 at most were kept), then the budget of 1,000.
        for i in 0..1_744 {
            assert!(frames.read(PING, 0, 8, 0, || start), "PING {i}");
        }
        assert!(!frames.read(PING, 0, 8, 0, || start));
        // Nothing is banked beyond `max`, however many calls came first.
        let mut frames = ControlFrames::new(100, Duration::from_secs(10));
        for _ in 0..10_000 {
            assert!(frames.read(HEADERS, 0, 20, 0, || start));
        }
        let ended = (0..1_000).find(|_| !frames.read(PING, 0, 8, 0, || start));
        assert_eq!(ended, Some(200));
    }

    /// Tiny DATA frames read pay for nothing: 1-byte frames, each followed by 8 PINGs,
    /// are a flood (they once took 8 off the count each).
    #[test]
    fn tiny_data_frames_do_not_pay_for_pings() {
        let start = Instant::now();
        let mut frames = ControlFrames::new(1_000, Duration::from_secs(10));
        let ended = (0..1_000).find(|_| {
            !frames.read(DATA, 0, 1, 0, || start)
                || (0..8).any(|_| !frames.read(PING, 0, 8, 0, || start))
        });
        assert!(ended.is_some_and(|round| round < 130), "{ended:?}");
    }

    /// A flood with a call now and then (999 PINGs, then a HEADERS that the server
    /// answers with a HEADERS of its own) is still a flood: it once started the
    /// count over at each call, and kept almost all of the flood's rate.
    #[test]
    fn a_call_now_and_then_does_not_pay_for_a_flood() {
        let start = Instant::now();
        let mut frames = ControlFrames::new(1_000, Duration::from_secs(10));
        let mut ended = None;
        // The writer's count is the round's number: the server answered each call
        // before.
        for round in 0..10u64 {
            for _ in 0..999 {
                if !frames.read(PING, 0, 8, round, || start) {
                    ended = Some(round);
                    break;
                }
            }
            if ended.is_some() {
                break;
            }
            assert!(frames.read(HEADERS, 0, 20, round, || start));
        }
        assert_eq!(ended, Some(1), "ended in the second round");
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

//! Keepalive: finding out that a silent peer is gone, on the client and the server
//! alike (`docs/wire.md` §2.9).
//!
//! After an *interval* in which nothing arrived from the peer, a side that wants an
//! answer (the client while it has calls in flight, the server while it has calls) sends
//! a PING; if still nothing arrives within the *timeout*, the connection is dead: its
//! calls fail `UNAVAILABLE` and it is closed (a client reconnects on its next call). Any
//! frame counts as a sign of life, not only the PONG.
//!
//! Nothing is paid per frame but a flag (`heard`) the connection sets when it reads
//! one; the timer is armed once per interval and checks the flag when it fires, like
//! the server's idle timer. So a PING goes out after between one and two intervals of
//! silence, and the connection is declared dead at most `2 × interval + timeout` after
//! the last frame.
//!
//! On a link that may lose frames (UDP), one PING or PONG lost must not kill the
//! connection: the PING is sent [`UNRELIABLE_PROBES`] times (with the same id) spread
//! over the timeout.
//!
//! [`Keepalive`] is the decision alone (no clock, no I/O), [`KeepaliveTimer`] drives it
//! from a Tokio timer, and [`PingGuard`] is the server's tolerance of client PINGs.

use std::{task::Context, time::Duration};

use tokio::time::Instant;

use crate::{link::LazySleep, Error, ErrorKind};

/// PINGs sent per probe on a link that may lose frames, the timeout split between
/// them: one lost datagram must not cost the connection.
pub(crate) const UNRELIABLE_PROBES: u32 = 3;

/// PINGs a server tolerates sooner than its minimum interval before it closes the
/// connection (gRPC's `GRPC_ARG_HTTP2_MAX_PING_STRIKES` default).
pub(crate) const MAX_PING_STRIKES: u32 = 2;

/// Copies of one PING a server takes without a strike: the [`UNRELIABLE_PROBES`] a
/// client sends, each of which a network may duplicate, with room to spare.
pub(crate) const MAX_PING_COPIES: u32 = 4 * UNRELIABLE_PROBES;

/// The least time a peer whose writes wait on it may take none of them before its
/// connection is closed, whatever it sends meanwhile (and at least two keepalive
/// intervals), on both sides: a socket's writer is woken only once a third of its send
/// buffer has drained, so a peer reading slowly (under some 40 KiB/s, a 4 MiB buffer)
/// shows no progress for a while, and with a short keepalive interval it was taken
/// for one that reads nothing (from a review).
pub(crate) const MIN_WRITE_STALL: std::time::Duration = std::time::Duration::from_secs(30);

/// How long a connection's writes have waited on its peer without moving, as seen at
/// the keepalive timer's firings (both sides: see [`MIN_WRITE_STALL`]).
#[derive(Debug)]
pub(crate) struct WriteStall<T> {
    /// The writes' measure when it last moved (or did not wait), and when.
    seen: Option<(T, tokio::time::Instant)>,
}

impl<T: PartialEq + Copy> WriteStall<T> {
    pub(crate) fn new() -> Self {
        WriteStall { seen: None }
    }

    /// At a firing: `writes`, a measure of what was written that moves as the peer
    /// takes bytes; `waits`, whether writes wait on the peer now. How long they have
    /// not moved, once that is two `interval`s and [`MIN_WRITE_STALL`] at least.
    pub(crate) fn check(
        &mut self,
        writes: T,
        waits: bool,
        interval: std::time::Duration,
    ) -> Option<std::time::Duration> {
        let now = tokio::time::Instant::now();
        match self.seen {
            Some((seen, since)) if waits && seen == writes => {
                let stalled = now.saturating_duration_since(since);
                (stalled >= (2 * interval).max(MIN_WRITE_STALL)).then_some(stalled)
            }
            _ => {
                self.seen = Some((writes, now));
                None
            }
        }
    }
}

/// When to PING and when to give up; see [`crate::client::ChannelBuilder::keepalive_interval`]
/// and [`crate::server::ServerBuilder::keepalive_interval`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct KeepaliveConfig {
    /// Silence before a PING; `None`: keepalive is off.
    pub(crate) interval: Option<Duration>,
    /// Silence after the PING before the connection is declared dead.
    pub(crate) timeout: Duration,
}

/// What the connection does when the keepalive timer fires.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    /// Nothing to do.
    Nothing,
    /// Send a PING with this id.
    Ping(u64),
    /// Nothing arrived within the timeout after a PING: the peer is gone.
    Dead,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Waiting for an interval of silence.
    Quiet,
    /// A PING (`sent` copies of it) is out and nothing has arrived since.
    Probing { id: u64, sent: u32 },
}

/// The keepalive decision of one connection, sans-IO: told when its timer fired and
/// whether anything arrived since, it says what to do and when to fire next.
#[derive(Debug)]
pub(crate) struct Keepalive {
    interval: Duration,
    timeout: Duration,
    probes: u32,
    phase: Phase,
    next_id: u64,
}

impl Keepalive {
    /// `reliable`: whether the link delivers every frame (see
    /// [`Link::is_reliable`](crate::link::Link::is_reliable)).
    pub(crate) fn new(interval: Duration, timeout: Duration, reliable: bool) -> Self {
        Keepalive {
            interval,
            timeout,
            probes: if reliable { 1 } else { UNRELIABLE_PROBES },
            phase: Phase::Quiet,
            next_id: 1,
        }
    }

    /// How long until the timer should first fire.
    pub(crate) fn first_delay(&self) -> Duration {
        self.interval
    }

    fn step(&self) -> Duration {
        (self.timeout / self.probes).max(Duration::from_millis(1))
    }

    /// The timer fired. `heard`: a frame arrived since it was armed (or the connection
    /// could not have read one: it stopped reading at its own limits). `wanted`:
    /// whether silence now deserves a PING (calls in flight, or pinging while idle).
    /// Returns what to do and when to fire next.
    pub(crate) fn on_timer(&mut self, heard: bool, wanted: bool) -> (Action, Duration) {
        if heard {
            self.phase = Phase::Quiet;
            return (Action::Nothing, self.interval);
        }
        match self.phase {
            Phase::Quiet if !wanted => (Action::Nothing, self.interval),
            Phase::Quiet => {
                let id = self.next_id;
                self.next_id = self.next_id.wrapping_add(1);
                self.phase = Phase::Probing { id, sent: 1 };
                (Action::Ping(id), self.step())
            }
            Phase::Probing { id, sent } if sent < self.probes => {
                self.phase = Phase::Probing { id, sent: sent + 1 };
                (Action::Ping(id), self.step())
            }
            Phase::Probing { .. } => (Action::Dead, self.interval),
        }
    }

    /// The error a dead connection ends with; its message says "keepalive".
    pub(crate) fn dead(&self) -> Error {
        Error::new(
            ErrorKind::TimedOut,
            format!(
                "keepalive: nothing arrived for {:?} after a PING (the peer or the path to \
                 it is gone)",
                self.timeout
            ),
        )
    }
}

/// A [`Keepalive`] driven by a Tokio timer. One allocation per connection (the
/// timer), none per frame.
pub(crate) struct KeepaliveTimer {
    machine: Keepalive,
    sleep: LazySleep,
}

impl KeepaliveTimer {
    /// A timer for a link (`reliable`: see
    /// [`Link::is_reliable`](crate::link::Link::is_reliable)); `None` if keepalive is off.
    pub(crate) fn new(config: KeepaliveConfig, reliable: bool) -> Option<Self> {
        let machine = Keepalive::new(config.interval?, config.timeout, reliable);
        let sleep = LazySleep::new(machine.first_delay());
        Some(KeepaliveTimer { machine, sleep })
    }

    /// Polls the timer; `None` while it has not fired. When it has, takes `heard`
    /// (clearing it), asks `wanted()` only if needed, re-arms the timer (registered
    /// with `cx`) and returns the action.
    pub(crate) fn poll(
        &mut self,
        cx: &mut Context<'_>,
        heard: &mut bool,
        wanted: impl FnOnce() -> bool,
    ) -> Option<Action> {
        if self.sleep.poll(cx).is_pending() {
            return None;
        }
        let heard = std::mem::take(heard);
        let wanted = !heard && wanted();
        let (action, next) = self.machine.on_timer(heard, wanted);
        self.sleep.reset(Instant::now() + next);
        let _ = self.sleep.poll(cx); // registers the new deadline
        Some(action)
    }

    pub(crate) fn dead(&self) -> Error {
        self.machine.dead()
    }
}

/// A server's tolerance of client PINGs, like gRPC's ping enforcement: a PING sooner
/// than `min_interval` after the previous one is a strike, and more than
/// [`MAX_PING_STRIKES`] strikes in a row close the connection. A PING at least
/// `min_interval` after the previous one clears the strikes; a PING that repeats the
/// previous one's id sooner than `min_interval` after it first came is a copy (a
/// retransmission over UDP) and does not count, up to [`MAX_PING_COPIES`]: further
/// ones are strikes, or a client repeating one id would never be held to the interval.
/// One id repeated on time is a new PING (ids need not change).
#[derive(Debug)]
pub(crate) struct PingGuard {
    min_interval: Duration,
    last: Option<(u64, Instant)>,
    /// Copies of the last PING so far (its first arrival not counted).
    copies: u32,
    strikes: u32,
}

impl PingGuard {
    pub(crate) fn new(min_interval: Duration) -> Self {
        PingGuard {
            min_interval,
            last: None,
            copies: 0,
            strikes: 0,
        }
    }

    /// A PING with `id` arrived at `now`. Returns whether it is tolerated.
    pub(crate) fn on_ping(&mut self, id: u64, now: Instant) -> bool {
        match self.last {
            Some((last_id, at))
                if last_id == id && now.saturating_duration_since(at) < self.min_interval =>
            {
                // A copy of the last PING, whose time stays the first copy's.
                if self.copies < MAX_PING_COPIES {
                    self.copies += 1;
                    return true;
                }
                self.strikes += 1;
                return self.strikes <= MAX_PING_STRIKES;
            }
            Some((_, at)) if now.saturating_duration_since(at) < self.min_interval => {
                self.strikes += 1;
                self.copies = 0;
            }
            _ => {
                self.strikes = 0;
                self.copies = 0;
            }
        }
        self.last = Some((id, now));
        self.strikes <= MAX_PING_STRIKES
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Config {
        interval: Duration,
        timeout: Duration,
    }

    const CONFIG: Config = Config {
        interval: Duration::from_secs(30),
        timeout: Duration::from_secs(20),
    };

    impl Keepalive {
        fn with(config: Config, reliable: bool) -> Self {
            Keepalive::new(config.interval, config.timeout, reliable)
        }
    }

    #[test]
    fn silence_with_calls_pings_then_declares_the_peer_dead() {
        let mut k = Keepalive::with(CONFIG, true);
        assert_eq!(k.first_delay(), CONFIG.interval);
        assert_eq!(k.on_timer(false, true), (Action::Ping(1), CONFIG.timeout));
        assert_eq!(k.on_timer(false, true).0, Action::Dead);
    }

    #[test]
    fn any_frame_counts_as_an_answer() {
        let mut k = Keepalive::with(CONFIG, true);
        assert_eq!(k.on_timer(true, true), (Action::Nothing, CONFIG.interval));
        assert_eq!(k.on_timer(false, true).0, Action::Ping(1));
        // Something arrived (a PONG or a response) before the timeout.
        assert_eq!(k.on_timer(true, true), (Action::Nothing, CONFIG.interval));
        // The next silence gets a fresh PING.
        assert_eq!(k.on_timer(false, true).0, Action::Ping(2));
    }

    #[test]
    fn an_idle_connection_is_not_pinged_unless_wanted() {
        let mut k = Keepalive::with(CONFIG, true);
        for _ in 0..3 {
            assert_eq!(k.on_timer(false, false), (Action::Nothing, CONFIG.interval));
        }
        // A probe under way goes on even if the calls ended meanwhile.
        assert_eq!(k.on_timer(false, true).0, Action::Ping(1));
        assert_eq!(k.on_timer(false, false).0, Action::Dead);
    }

    #[test]
    fn unreliable_links_send_the_same_ping_several_times_within_the_timeout() {
        let mut k = Keepalive::with(CONFIG, false);
        let step = CONFIG.timeout / UNRELIABLE_PROBES;
        for _ in 0..UNRELIABLE_PROBES {
            assert_eq!(k.on_timer(false, true), (Action::Ping(1), step));
        }
        assert_eq!(k.on_timer(false, true).0, Action::Dead);
        // An answer to any copy saves it.
        let mut k = Keepalive::with(CONFIG, false);
        assert_eq!(k.on_timer(false, true).0, Action::Ping(1));
        assert_eq!(k.on_timer(false, true).0, Action::Ping(1));
        assert_eq!(k.on_timer(true, true).0, Action::Nothing);
    }

    #[test]
    fn ping_guard_counts_strikes_and_forgives() {
        let start = Instant::now();
        let at = |ms| start + Duration::from_millis(ms);
        let mut g = PingGuard::new(Duration::from_secs(10));
        assert!(g.on_ping(1, at(0)));
        // Copies of one PING (UDP) are not strikes.
        assert!(g.on_ping(1, at(1)));
        assert!(g.on_ping(1, at(2)));
        assert!(g.on_ping(2, at(100))); // strike 1
        assert!(g.on_ping(3, at(200))); // strike 2
        assert!(g.on_ping(4, at(10_200))); // in time: forgiven
        assert!(g.on_ping(5, at(10_300))); // strike 1
        assert!(g.on_ping(6, at(10_400))); // strike 2
        assert!(!g.on_ping(7, at(10_500)), "the third strike closes");
    }

    /// A client that sends every PING with one id is held to the interval too, once
    /// past the copies an unreliable link sends. (From a review: a repeated id was
    /// never counted, so such a client could PING as often as it liked.)
    #[test]
    fn a_repeated_id_past_the_copies_is_a_strike() {
        let start = Instant::now();
        let at = |ms| start + Duration::from_millis(ms);
        let mut g = PingGuard::new(Duration::from_secs(10));
        assert!(g.on_ping(9, at(0)));
        for ms in 1..=u64::from(MAX_PING_COPIES) {
            assert!(g.on_ping(9, at(ms)), "a copy");
        }
        let tolerated = (0..100)
            .take_while(|&ms| g.on_ping(9, at(100 + ms)))
            .count();
        assert_eq!(tolerated, MAX_PING_STRIKES as usize);
        // One id repeated on time is a new PING each time, not a copy.
        let mut g = PingGuard::new(Duration::from_secs(10));
        for i in 0..100 {
            assert!(g.on_ping(5, at(10_000 * i)), "PING {i} on time");
        }
        // A new id in time later starts over.
        let mut g = PingGuard::new(Duration::from_secs(10));
        assert!(g.on_ping(1, at(0)));
        assert!(g.on_ping(1, at(1)));
        assert!(g.on_ping(2, at(10_001)));
        for ms in 0..u64::from(MAX_PING_COPIES) {
            assert!(g.on_ping(2, at(10_002 + ms)), "copies of the new PING");
        }
    }
}

//! A bound on the log lines remote peers can cause.
//!
//! A server logs a peer it refuses (a protocol error, the connection limit) so that an
//! operator sees why a client failed; but each refused connection costs its attacker a
//! handshake at most, and one line per connection let a peer write about 1 MB of log a
//! second (from a review: 13,757 lines in 4 s). A [`LogLimiter`] lets a few lines
//! through per period and counts the rest, which the next line let through reports as
//! `suppressed`; the server's counters ([`ServerStats`](crate::server::ServerStats))
//! count every refusal.

use std::{
    sync::Mutex,
    time::{Duration, Instant},
};

/// At most `burst` log lines per `period`; the others are counted, and the next line
/// allowed carries their number. Shared by every connection of a kind (a `static`).
///
/// ```
/// use std::time::Duration;
/// use rpc_core::logs::LogLimiter;
///
/// static REFUSALS: LogLimiter = LogLimiter::new(10, Duration::from_secs(10));
/// if let Some(suppressed) = REFUSALS.allow() {
///     tracing::info!(suppressed, "peer refused");
/// }
/// ```
#[derive(Debug)]
pub struct LogLimiter {
    burst: u32,
    period: Duration,
    state: Mutex<Window>,
}

#[derive(Debug)]
struct Window {
    /// When the current period started (`None` before the first line).
    started: Option<Instant>,
    /// Lines let through in it.
    allowed: u32,
    /// Lines held back since the last one let through.
    suppressed: u64,
}

impl LogLimiter {
    /// At most `burst` lines per `period`.
    pub const fn new(burst: u32, period: Duration) -> LogLimiter {
        LogLimiter {
            burst,
            period,
            state: Mutex::new(Window {
                started: None,
                allowed: 0,
                suppressed: 0,
            }),
        }
    }

    /// The bound of the lines of refused peers, one limiter per kind of refusal: ten
    /// lines per ten seconds (the server's protocol errors and connection limit, the
    /// gRPC wire's HTTP/2 refusals).
    pub const fn for_refusals() -> LogLimiter {
        LogLimiter::new(10, Duration::from_secs(10))
    }

    /// Whether a line may be written now: `Some(n)` with the lines held back since the
    /// last one written (to log with it), or `None` (counted).
    pub fn allow(&self) -> Option<u64> {
        self.allow_at(Instant::now())
    }

    fn allow_at(&self, now: Instant) -> Option<u64> {
        let mut window = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let fresh = window
            .started
            .is_none_or(|started| now.saturating_duration_since(started) >= self.period);
        if fresh {
            window.started = Some(now);
            window.allowed = 0;
        }
        if window.allowed >= self.burst {
            window.suppressed += 1;
            return None;
        }
        window.allowed += 1;
        Some(std::mem::take(&mut window.suppressed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_per_period_then_counted_and_reported_with_the_next_line() {
        let limiter = LogLimiter::new(3, Duration::from_secs(10));
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        assert_eq!(limiter.allow_at(at(0)), Some(0));
        assert_eq!(limiter.allow_at(at(1)), Some(0));
        assert_eq!(limiter.allow_at(at(2)), Some(0));
        for s in 3..10 {
            assert_eq!(limiter.allow_at(at(s)), None);
        }
        // A new period: its first line says how many were left out.
        assert_eq!(limiter.allow_at(at(10)), Some(7));
        assert_eq!(limiter.allow_at(at(11)), Some(0));
    }
}

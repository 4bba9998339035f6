//! The open-loop schedule: call `i` of a phase is due `i / rate` seconds after the
//! phase starts, whatever happened to the calls before it. Pure arithmetic, no clock:
//! the caller passes the time elapsed since the start.
//!
//! Issuing calls on a schedule, and timing each from its scheduled time rather than
//! from when it was actually sent, keeps a slow response from delaying the calls
//! after it out of the measurement (no coordinated omission).

use std::time::Duration;

/// Guards the floor and ceiling below against floating-point error just beside an
/// integer (`0.3 * 10 = 3.0000000000000004`).
const EPSILON: f64 = 1e-9;

/// Calls at a fixed rate for a fixed time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct OpenLoop {
    /// Calls per second.
    rate: f64,
    /// Calls in the phase: those due before its end.
    total: u64,
}

impl OpenLoop {
    /// `rate` calls per second for `duration`; `None` unless the rate is positive and
    /// finite.
    pub(crate) fn new(rate: f64, duration: Duration) -> Option<OpenLoop> {
        if !(rate.is_finite() && rate > 0.0) {
            return None;
        }
        // Call i is due at i / rate; those due before `duration`: i < duration * rate.
        let total = (duration.as_secs_f64() * rate - EPSILON).ceil().max(0.0) as u64;
        Some(OpenLoop { rate, total })
    }

    /// Calls in the phase.
    pub(crate) fn total(&self) -> u64 {
        self.total
    }

    /// When call `i` is due, from the start of the phase (rounded up to the next
    /// nanosecond, so that [`due`](Self::due) of it counts call `i`).
    pub(crate) fn at(&self, i: u64) -> Duration {
        Duration::from_nanos((i as f64 * 1e9 / self.rate).ceil() as u64)
    }

    /// How many calls are due `elapsed` after the start (call 0 is due at once), at
    /// most [`total`](Self::total).
    pub(crate) fn due(&self, elapsed: Duration) -> u64 {
        let due = (elapsed.as_secs_f64() * self.rate + EPSILON).floor() as u64 + 1;
        due.min(self.total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_are_evenly_spaced() {
        let s = OpenLoop::new(1000.0, Duration::from_secs(1)).unwrap();
        assert_eq!(s.total(), 1000);
        assert_eq!(s.at(0), Duration::ZERO);
        assert_eq!(s.at(1), Duration::from_millis(1));
        assert_eq!(s.at(999), Duration::from_millis(999));
        assert_eq!(s.due(Duration::ZERO), 1);
        assert_eq!(s.due(Duration::from_micros(999)), 1);
        assert_eq!(s.due(Duration::from_millis(1)), 2);
        assert_eq!(s.due(Duration::from_micros(2500)), 3);
        assert_eq!(s.due(Duration::from_millis(999)), 1000);
        assert_eq!(s.due(Duration::from_secs(10)), 1000);
    }

    #[test]
    fn a_call_is_due_at_its_own_time() {
        // 1/3 s does not divide evenly: at(i) rounds, due() must still count call i.
        let s = OpenLoop::new(3.0, Duration::from_secs(1)).unwrap();
        assert_eq!(s.total(), 3);
        for i in 0..3 {
            assert_eq!(s.due(s.at(i)), i + 1, "call {i}");
        }
        let s = OpenLoop::new(7_919.0, Duration::from_millis(1500)).unwrap();
        assert_eq!(s.total(), 11_879); // ceil(1.5 * 7919 = 11878.5)
        for i in [0, 1, 17, 4_000, 11_878] {
            assert_eq!(s.due(s.at(i)), i + 1, "call {i}");
        }
    }

    #[test]
    fn fractional_totals_round_up_and_bad_rates_are_refused() {
        assert_eq!(
            OpenLoop::new(2.5, Duration::from_secs(1)).unwrap().total(),
            3 // due at 0, 0.4 and 0.8 s
        );
        assert_eq!(
            OpenLoop::new(10.0, Duration::from_millis(300))
                .unwrap()
                .total(),
            3
        );
        assert_eq!(OpenLoop::new(5.0, Duration::ZERO).unwrap().total(), 0);
        assert_eq!(
            OpenLoop::new(5.0, Duration::ZERO)
                .unwrap()
                .due(Duration::ZERO),
            0
        );
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert_eq!(OpenLoop::new(bad, Duration::from_secs(1)), None, "{bad}");
        }
    }
}

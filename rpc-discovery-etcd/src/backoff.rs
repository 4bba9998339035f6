//! [`Backoff`]: how long a follower waits before watching again after a failure.

use std::time::Duration;

/// Waits between attempts to watch (or list) again while etcd is unreachable,
/// restarting, or refusing: exponential from `min`, doubling per failure in a row, capped
/// at `max`, and jittered (each wait is uniform between half and all of its bound, so
/// that the clients of a restarted etcd do not all come back at the same instant).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// Bound of the first wait. Default: [`Backoff::DEFAULT_MIN`].
    pub min: Duration,
    /// Bound of every wait. Default: [`Backoff::DEFAULT_MAX`].
    pub max: Duration,
}

impl Backoff {
    /// Default bound of the first wait: an etcd that restarts is usually back within
    /// a second.
    pub const DEFAULT_MIN: Duration = Duration::from_millis(100);

    /// Default bound of every wait: a client learns of replicas at most this long
    /// after etcd is back.
    pub const DEFAULT_MAX: Duration = Duration::from_secs(5);

    /// The wait after `failures` failures in a row (1 or more), for a `unit` in
    /// `[0, 1)`.
    pub(crate) fn delay(&self, failures: u32, unit: f64) -> Duration {
        let doublings = failures.saturating_sub(1).min(30);
        let bound = self
            .min
            .saturating_mul(1u32 << doublings)
            .min(self.max.max(self.min));
        bound.mul_f64(0.5 + unit.clamp(0.0, 1.0) / 2.0)
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            min: Backoff::DEFAULT_MIN,
            max: Backoff::DEFAULT_MAX,
        }
    }
}

/// A number in `[0, 1)` that differs between calls and processes (for jitter, not for
/// secrets).
pub(crate) fn unit() -> f64 {
    (rpc_core::frame::random_client_id() >> 75) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_from_min_is_capped_and_jittered() {
        let b = Backoff::default();
        let ms = |d: Duration| d.as_millis();
        assert_eq!(ms(b.delay(1, 0.999_999)), 99);
        assert_eq!(ms(b.delay(1, 0.0)), 50);
        assert_eq!(ms(b.delay(2, 0.0)), 100);
        assert_eq!(ms(b.delay(4, 0.0)), 400);
        assert_eq!(ms(b.delay(7, 0.0)), 2500, "capped at 5 s");
        assert_eq!(ms(b.delay(u32::MAX, 0.0)), 2500);
        for _ in 0..1000 {
            let u = unit();
            assert!((0.0..1.0).contains(&u), "{u}");
        }
    }
}

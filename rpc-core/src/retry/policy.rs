//! [`RetryPolicy`]: attempts, backoff, budget, retryable codes, per-method overrides.

use std::{
    collections::HashMap,
    hash::{BuildHasher, Hasher},
    time::Duration,
};

use super::{jittered, TpsBudget};
use crate::Code;

/// Overrides for one method (by wire name, `package.Service/Method`).
#[derive(Clone, Debug, Default)]
pub struct MethodRetry {
    /// Attempts in all, the first included. Default: the policy's.
    pub max_attempts: Option<u32>,
    /// Codes that make a safe method retry. Default: the policy's.
    pub retryable_codes: Option<Vec<Code>>,
    /// Whether the method is safe to repeat, overriding its `.proto`
    /// `idempotency_level`. Default: what the `.proto` says.
    pub safe_to_repeat: Option<bool>,
}

impl MethodRetry {
    pub(crate) fn retryable<'a>(&'a self, policy: &'a RetryPolicy) -> &'a [Code] {
        self.retryable_codes
            .as_deref()
            .unwrap_or(&policy.retryable_codes)
    }
}

/// How [`RetryLayer`](super::RetryLayer) retries. Every field has a documented default.
#[derive(Clone, Debug)]
pub struct RetryPolicy {
    /// Attempts in all, the first included. Default: 3.
    pub max_attempts: u32,
    /// Backoff before the first retry (upper bound; the actual wait is jittered).
    /// Default: 50 ms.
    pub initial_backoff: Duration,
    /// Longest backoff. Default: 2 s.
    pub max_backoff: Duration,
    /// Growth of the backoff per retry. Default: 2.
    pub multiplier: f64,
    /// Longest server pushback ([`Pushback`](super::Pushback)) waited for: a server
    /// asking for a longer wait ends the call with its status at once, instead of
    /// holding it (and a call without a deadline, for ever). Default: 60 s.
    pub max_pushback: Duration,
    /// Codes that make a safe-to-repeat method retry. Default: `[UNAVAILABLE]`.
    pub retryable_codes: Vec<Code>,
    /// Time budget of one attempt; when it runs out, a safe method is retried (within
    /// the call's own timeout). Default: none.
    pub per_attempt_timeout: Option<Duration>,
    /// Retries allowed as a fraction of recent calls, from 0 to 1,000 (a value
    /// outside, or NaN, is taken as the nearest bound, NaN as 0). Default: 0.2.
    pub budget_percent: f32,
    /// Retries allowed per second regardless of traffic, below 2^31 - 1 (a larger
    /// value is taken as the bound). Default: 10.
    pub budget_min_per_sec: u32,
    /// How long a call counts as "recent" for the budget, from 1 s to 60 s (tower's
    /// `TpsBudget` bounds; a value outside is taken as the nearest bound). Default:
    /// 10 s.
    pub budget_window: Duration,
    /// Hedging: for a method that is safe to repeat, send a second attempt if the first
    /// has not answered after this long; the first success wins and the other attempt
    /// is cancelled (on the server too). Hedges draw on the retry budget. Default: off.
    pub hedge_delay: Option<Duration>,
    /// Retry methods that are not safe to repeat after failures that leave their outcome
    /// unknown (a connection lost mid-call), relying on the server's duplicate cache:
    /// such calls carry a call key, and the server answers a repeat from its cache (or
    /// refuses it) instead of running it twice. Default: `true`.
    pub at_most_once: bool,
    /// Per-method overrides, by wire name (`package.Service/Method`). Default: none.
    pub overrides: HashMap<String, MethodRetry>,
}

/// What a method without overrides uses.
static NO_OVERRIDES: MethodRetry = MethodRetry {
    max_attempts: None,
    retryable_codes: None,
    safe_to_repeat: None,
};

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 3,
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(2),
            multiplier: 2.0,
            max_pushback: Duration::from_secs(60),
            retryable_codes: vec![Code::UNAVAILABLE],
            per_attempt_timeout: None,
            budget_percent: 0.2,
            budget_min_per_sec: 10,
            budget_window: Duration::from_secs(10),
            hedge_delay: None,
            at_most_once: true,
            overrides: HashMap::new(),
        }
    }
}

impl RetryPolicy {
    /// The overrides of one method (`package.Service/Method`), empty if it has none.
    pub fn method(&self, path: &str) -> &MethodRetry {
        self.overrides.get(path).unwrap_or(&NO_OVERRIDES)
    }

    /// Sets the overrides of one method.
    pub fn with_method(mut self, path: impl Into<String>, retry: MethodRetry) -> Self {
        self.overrides.insert(path.into(), retry);
        self
    }

    /// A budget as this policy describes it, its window and fraction brought within
    /// their bounds (`TpsBudget::new` panics outside them).
    pub fn new_budget(&self) -> TpsBudget {
        let percent = if self.budget_percent.is_nan() {
            0.0
        } else {
            self.budget_percent.clamp(0.0, 1000.0)
        };
        TpsBudget::new(
            self.budget_window
                .clamp(Duration::from_secs(1), Duration::from_secs(60)),
            self.budget_min_per_sec.min(i32::MAX as u32 - 1),
            percent,
        )
    }

    /// The jittered wait before retry number `attempt` (1-based).
    pub fn backoff(&self, attempt: u32) -> Duration {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(attempt);
        let unit = (h.finish() >> 11) as f64 / (1u64 << 53) as f64;
        jittered(
            self.initial_backoff,
            self.max_backoff,
            self.multiplier,
            attempt,
            unit,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_outside_its_bounds_is_brought_within_them() {
        // tower's TpsBudget::new asserts 1 s <= window <= 60 s, 0 <= percent <= 1000
        // and min_per_sec < 2^31 - 1: these panicked in RetryLayer::new (from two
        // reviews).
        for (window, percent) in [
            (Duration::from_secs(120), 0.2),
            (Duration::from_millis(500), 0.2),
            (Duration::ZERO, -1.0),
            (Duration::MAX, f32::NAN),
            (Duration::from_secs(10), 5000.0),
        ] {
            let policy = RetryPolicy {
                budget_window: window,
                budget_percent: percent,
                budget_min_per_sec: u32::MAX,
                ..RetryPolicy::default()
            };
            let budget = policy.new_budget();
            use tower::retry::budget::Budget as _;
            budget.deposit();
            // The floor of 10 a second still allows a retry.
            assert!(budget.withdraw(), "{window:?} {percent}");
        }
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let p = RetryPolicy::default();
        let ms = |d: Duration| d.as_millis();
        let j = |attempt, unit| {
            ms(jittered(
                p.initial_backoff,
                p.max_backoff,
                2.0,
                attempt,
                unit,
            ))
        };
        assert_eq!(j(1, 0.999_999), 49);
        assert_eq!(j(1, 0.0), 25);
        assert_eq!(j(3, 0.0), 100);
        assert_eq!(j(30, 0.0), 1000);
        for attempt in 1..10 {
            let b = p.backoff(attempt);
            assert!(
                b <= Duration::from_secs(2) && b >= Duration::from_millis(25),
                "{b:?}"
            );
        }
    }

    #[test]
    fn overrides_are_per_method() {
        let p = RetryPolicy::default().with_method(
            "a.B/C",
            MethodRetry {
                max_attempts: Some(5),
                ..MethodRetry::default()
            },
        );
        assert_eq!(p.method("a.B/C").max_attempts, Some(5));
        assert_eq!(p.method("a.B/D").max_attempts, None);
    }
}

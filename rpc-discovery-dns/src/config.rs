//! [`DnsConfig`]: how often names are looked up again, how failed lookups are
//! retried, and which name servers are asked.

use std::{net::SocketAddr, time::Duration};

use rpc_core::discover::DEFAULT_DNS_INTERVAL;

/// Default first delay before a failed lookup is tried again.
pub const DEFAULT_RETRY_MIN: Duration = Duration::from_secs(1);

/// Shortest time between two scheduled lookups of a name whose records have a shorter
/// TTL: a TTL of 0 must not turn into a busy loop.
pub const MIN_TTL_INTERVAL: Duration = Duration::from_secs(1);

/// Shortest delay the resolver waits between lookups, whatever the configuration says
/// (a zero interval would be a busy loop).
const MIN_DELAY: Duration = Duration::from_millis(1);

/// Settings of a [`DnsResolver`](crate::DnsResolver). Every field has a documented
/// default; start from `DnsConfig::default()` and change what you need.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DnsConfig {
    /// Time between two lookups of a name that answered. A record TTL shorter than this
    /// is used instead, but never less than [`MIN_TTL_INTERVAL`]. Default:
    /// [`DEFAULT_DNS_INTERVAL`] (30 s).
    pub interval: Duration,
    /// Delay before the first retry of a failed lookup (no answer, `SERVFAIL`,
    /// `REFUSED`, ...); it doubles with each failure in a row up to
    /// [`retry_max`](Self::retry_max). Also the delay before a name that answered
    /// "does not exist" is asked again to confirm it, and, while a name has no members
    /// (it does not exist, or answered none), the delay before it is asked again,
    /// doubling as a failure's does, never past the interval. Default:
    /// [`DEFAULT_RETRY_MIN`] (1 s).
    pub retry_min: Duration,
    /// Longest delay between retries of failed lookups (taken as `retry_min` if
    /// smaller). Default: [`DEFAULT_DNS_INTERVAL`] (30 s).
    pub retry_max: Duration,
    /// The name servers to ask. `None`: the system's (`/etc/resolv.conf`, with its
    /// search domains and options, and `/etc/hosts`). `Some`: exactly these, over UDP
    /// (and over TCP, on the same port, for an answer too large for a datagram), without
    /// search domains or `/etc/hosts` (for your own DNS servers, and tests).
    /// Default: `None`.
    pub nameservers: Option<Vec<SocketAddr>>,
    /// How long one query waits for an answer before it counts as failed. `None`: the
    /// system's `options timeout:` (5 s if unset). Default: `None`.
    pub query_timeout: Option<Duration>,
}

impl Default for DnsConfig {
    fn default() -> Self {
        DnsConfig {
            interval: DEFAULT_DNS_INTERVAL,
            retry_min: DEFAULT_RETRY_MIN,
            retry_max: DEFAULT_DNS_INTERVAL,
            nameservers: None,
            query_timeout: None,
        }
    }
}

/// The delays of a [`DnsConfig`], made consistent (no zero delays, `retry_max` at
/// least `retry_min`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Schedule {
    pub(crate) interval: Duration,
    pub(crate) retry_min: Duration,
    pub(crate) retry_max: Duration,
}

impl From<&DnsConfig> for Schedule {
    fn from(config: &DnsConfig) -> Self {
        let retry_min = config.retry_min.max(MIN_DELAY);
        Schedule {
            interval: config.interval.max(MIN_DELAY),
            retry_min,
            retry_max: config.retry_max.max(retry_min),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inconsistent_delays_are_made_consistent() {
        let schedule = Schedule::from(&DnsConfig {
            interval: Duration::ZERO,
            retry_min: Duration::from_secs(5),
            retry_max: Duration::from_secs(1),
            ..DnsConfig::default()
        });
        assert_eq!(schedule.interval, MIN_DELAY);
        assert_eq!(schedule.retry_min, Duration::from_secs(5));
        assert_eq!(schedule.retry_max, Duration::from_secs(5));
    }
}

//! The retransmission timeout of requests on links that may lose them (UDP): what the
//! channel knows of the path's round trip, and the timeouts it derives from it. Pure
//! arithmetic on durations, so that it can be tested without a clock.
//!
//! A request's first timeout is RFC 6298's `srtt + 4·rttvar`, measured on requests
//! answered without a retransmission (Karn's rule), within the configured floor and
//! ceiling. Each retransmission of the same request doubles it, up to a ceiling that
//! depends on the path and on the call:
//!
//! - **the path**: four times the first timeout, but at least [`MIN_BACKOFF_CEILING`].
//!   A fixed ceiling (1 s) let the timeout of a request on a 1 ms path grow to a
//!   thousand round trips, so that a call with a 3 s deadline got only 8 copies through
//!   loss; a ceiling of a few round trips still backs off from a server that is slow
//!   or gone, without giving up the copies that repair loss.
//! - **the call**: at most a quarter of its time budget, from the request's first
//!   sending to its deadline ([`COPIES_PER_BUDGET`]), so that several copies fit in it
//!   however far the backoff went. (A ceiling from the time *left* would shrink as the
//!   deadline nears and crowd copies into the last moments; this one spaces them
//!   evenly.)
//! - the configured ceiling (`max` of
//!   [`ChannelBuilder::retransmission`](super::ChannelBuilder::retransmission)) caps
//!   both; and the ceiling is never below the first timeout, so a request is never sent
//!   again sooner than an answer could come back.

use std::time::Duration;

use super::channel::RetransmitConfig;

/// Lowest ceiling the path gives the backoff: a request is sent again at least this
/// far apart once backed off (timers and handlers are not finer than a few ms, and a
/// server that is slow must not get a copy every few milliseconds).
pub(crate) const MIN_BACKOFF_CEILING: Duration = Duration::from_millis(200);

/// The backoff never waits longer than a call's time budget divided by this, so that
/// about this many copies at least fit in it (the first timeout allowing).
pub(crate) const COPIES_PER_BUDGET: u32 = 4;

/// The round trip of a path, as far as answered requests tell.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RttEstimate {
    srtt: Option<Duration>,
    rttvar: Duration,
}

impl RttEstimate {
    /// Learns from the round trip of a request answered without a retransmission.
    pub(crate) fn sample(&mut self, sample: Duration) {
        match self.srtt {
            None => {
                self.srtt = Some(sample);
                self.rttvar = sample / 2;
            }
            Some(srtt) => {
                let diff = srtt.abs_diff(sample);
                self.rttvar = (self.rttvar * 3 + diff) / 4;
                self.srtt = Some((srtt * 7 + sample) / 8);
            }
        }
    }

    /// A request's first timeout: `srtt + 4·rttvar` within `min ..= max`, or
    /// `initial` before a round trip is measured.
    pub(crate) fn first(&self, config: &RetransmitConfig) -> Duration {
        match self.srtt {
            None => config.initial,
            Some(srtt) => (srtt + 4 * self.rttvar).clamp(config.min, config.max),
        }
    }

    /// The most a request's timeout grows to by doubling, for a call whose `budget`
    /// runs from the request's first sending to its deadline (`None`: no deadline). See
    /// the [module docs](self).
    pub(crate) fn ceiling(&self, config: &RetransmitConfig, budget: Option<Duration>) -> Duration {
        let first = self.first(config);
        let mut ceiling = (4 * first).max(MIN_BACKOFF_CEILING).min(config.max);
        if let Some(budget) = budget {
            ceiling = ceiling.min(budget / COPIES_PER_BUDGET);
        }
        ceiling.max(first)
    }

    /// The timeout after a retransmission of a request whose timeout was `previous`:
    /// twice as long, within the [ceiling](Self::ceiling).
    pub(crate) fn backoff(
        &self,
        config: &RetransmitConfig,
        previous: Duration,
        budget: Option<Duration>,
    ) -> Duration {
        (previous * 2).min(self.ceiling(config, budget))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::channel::{DEFAULT_INITIAL_RTO, DEFAULT_MAX_RTO, DEFAULT_MIN_RTO};

    const MS: Duration = Duration::from_millis(1);

    fn config() -> RetransmitConfig {
        RetransmitConfig {
            initial: DEFAULT_INITIAL_RTO,
            min: DEFAULT_MIN_RTO,
            max: DEFAULT_MAX_RTO,
        }
    }

    fn measured(rtt: Duration) -> RttEstimate {
        let mut estimate = RttEstimate::default();
        for _ in 0..100 {
            estimate.sample(rtt);
        }
        estimate
    }

    /// The timeouts of one request without a deadline, first to `n`th.
    fn timeouts(estimate: &RttEstimate, n: usize) -> Vec<Duration> {
        let config = config();
        std::iter::successors(Some(estimate.first(&config)), |&rto| {
            Some(estimate.backoff(&config, rto, None))
        })
        .take(n)
        .collect()
    }

    /// How many times a request goes out before `deadline` (from its first sending) on
    /// a path where every copy is lost, and the shortest wait between two.
    fn copies_before(estimate: &RttEstimate, deadline: Duration) -> (usize, Duration) {
        let config = config();
        let (mut at, mut copies) = (Duration::ZERO, 1);
        let mut rto = estimate.first(&config);
        let mut shortest = rto;
        loop {
            at += rto;
            if at >= deadline {
                return (copies, shortest);
            }
            copies += 1;
            rto = estimate.backoff(&config, rto, Some(deadline));
            shortest = shortest.min(rto);
        }
    }

    #[test]
    fn the_backoff_stops_a_few_round_trips_out_not_at_a_fixed_second() {
        // A fast path: the first timeout is the floor, the backoff stops at 200 ms.
        let fast = measured(MS);
        assert_eq!(
            timeouts(&fast, 8),
            [10, 20, 40, 80, 160, 200, 200, 200].map(|ms| ms * MS)
        );
        // Before a measurement: from the initial timeout to four times it.
        assert_eq!(
            timeouts(&RttEstimate::default(), 5),
            [100, 200, 400, 400, 400].map(|ms| ms * MS)
        );
        // A slow path reaches the configured ceiling.
        let slow = measured(400 * MS);
        assert_eq!(timeouts(&slow, 3), [400, 800, 1000].map(|ms| ms * MS));
    }

    #[test]
    fn a_deadline_leaves_room_for_several_copies() {
        let fast = measured(MS);
        // With a fixed 1 s ceiling a 3 s deadline allowed 9 sendings; now 19, the last
        // 13 of them 200 ms apart.
        let (copies, shortest) = copies_before(&fast, 3000 * MS);
        assert_eq!(copies, 19);
        assert_eq!(
            shortest,
            fast.first(&config()),
            "never sooner than the path allows"
        );
        // A short budget holds several copies, however far the backoff went.
        let config = config();
        assert_eq!(fast.backoff(&config, 200 * MS, Some(400 * MS)), 100 * MS);
        assert_eq!(copies_before(&fast, 400 * MS).0, 7);
        assert_eq!(fast.backoff(&config, 200 * MS, Some(MS)), 10 * MS);
        // A path slower than the budget allows: once per first timeout.
        let slow = measured(400 * MS);
        assert_eq!(copies_before(&slow, 1000 * MS), (3, 400 * MS));
        let slower = measured(800 * MS);
        assert_eq!(copies_before(&slower, 3000 * MS).0, 4);
    }

    #[test]
    fn the_configured_ceiling_caps_the_path_and_the_floor_holds() {
        let config = RetransmitConfig {
            initial: 50 * MS,
            min: 10 * MS,
            max: 150 * MS,
        };
        let fast = measured(MS);
        assert_eq!(fast.ceiling(&config, None), 150 * MS);
        let slow = measured(400 * MS);
        assert_eq!(slow.first(&config), 150 * MS);
        assert_eq!(slow.ceiling(&config, Some(MS)), 150 * MS);
    }
}

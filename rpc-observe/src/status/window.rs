//! One method's recent history: a ring of per-second buckets (calls, errors, a small
//! log-scale latency histogram), pure and clock-free: every call takes the second it
//! happens in.

use std::time::Duration;

/// Seconds of history kept per method: what the charts of the status page cover.
pub const WINDOW_SECS: usize = 300;

/// Buckets of the latency histogram: two per power of two of microseconds, from 1 µs
/// up to 2^27 µs (134 s); slower calls land in the last bucket. A percentile read
/// from it is within about 20% of the true value, enough for a chart.
pub(crate) const HIST_BUCKETS: usize = 56;

/// The histogram bucket of a latency.
pub(crate) fn bucket_of(latency: Duration) -> usize {
    let micros = u64::try_from(latency.as_micros())
        .unwrap_or(u64::MAX)
        .max(1);
    let octave = 63 - micros.leading_zeros() as usize;
    let half = if octave > 0 {
        ((micros >> (octave - 1)) & 1) as usize
    } else {
        0
    };
    (2 * octave + half).min(HIST_BUCKETS - 1)
}

/// The value a bucket stands for: the middle of its range, in microseconds.
pub(crate) fn bucket_value_us(bucket: usize) -> f64 {
    let lower = |b: usize| {
        let base = (1u64 << (b / 2)) as f64;
        if b % 2 == 1 {
            base * 1.5
        } else {
            base
        }
    };
    (lower(bucket) + lower(bucket + 1)) / 2.0
}

/// The `q` quantile (0 < q ≤ 1) of a histogram, in microseconds; `None` if it is empty.
pub(crate) fn quantile_us(hist: &[u32; HIST_BUCKETS], q: f64) -> Option<f64> {
    let total: u64 = hist.iter().map(|&n| u64::from(n)).sum();
    if total == 0 {
        return None;
    }
    let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
    let mut seen = 0;
    for (bucket, &n) in hist.iter().enumerate() {
        seen += u64::from(n);
        if seen >= rank {
            return Some(bucket_value_us(bucket));
        }
    }
    None
}

/// One second of one method.
#[derive(Clone, Debug)]
struct Second {
    /// Which second this slot holds (seconds since the board started); `u64::MAX`:
    /// none yet.
    second: u64,
    calls: u32,
    errors: u32,
    hist: [u32; HIST_BUCKETS],
}

impl Second {
    const EMPTY: Second = Second {
        second: u64::MAX,
        calls: 0,
        errors: 0,
        hist: [0; HIST_BUCKETS],
    };
}

/// The last [`WINDOW_SECS`] seconds of one method, and its totals since it was first
/// called.
#[derive(Debug)]
pub(crate) struct Window {
    ring: Box<[Second]>,
    total_calls: u64,
    total_errors: u64,
}

/// A window read at one moment: per complete second, oldest first, and sums.
#[derive(Clone, Debug, Default)]
pub(crate) struct Series {
    pub(crate) calls: Vec<u32>,
    pub(crate) errors: Vec<u32>,
    pub(crate) p50_us: Vec<Option<f64>>,
    pub(crate) p99_us: Vec<Option<f64>>,
    /// The index of the first second after the board started: the ones before it
    /// count as empty, but there was nothing to count.
    pub(crate) first: usize,
    /// The last minute merged.
    pub(crate) minute: Summary,
    /// The last ten seconds merged (the "now" of the page).
    pub(crate) recent: Summary,
    pub(crate) total_calls: u64,
    pub(crate) total_errors: u64,
}

/// Calls, errors and percentiles over a span of seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Summary {
    pub(crate) seconds: u32,
    pub(crate) calls: u64,
    pub(crate) errors: u64,
    pub(crate) p50_us: Option<f64>,
    pub(crate) p99_us: Option<f64>,
}

impl Summary {
    fn of(seconds: &[&Second]) -> Summary {
        let mut hist = [0u32; HIST_BUCKETS];
        let mut summary = Summary {
            seconds: seconds.len() as u32,
            ..Summary::default()
        };
        for second in seconds {
            summary.calls += u64::from(second.calls);
            summary.errors += u64::from(second.errors);
            for (sum, n) in hist.iter_mut().zip(second.hist) {
                *sum = sum.saturating_add(n);
            }
        }
        summary.p50_us = quantile_us(&hist, 0.5);
        summary.p99_us = quantile_us(&hist, 0.99);
        summary
    }
}

impl Window {
    pub(crate) fn new() -> Window {
        Window {
            ring: vec![Second::EMPTY; WINDOW_SECS].into_boxed_slice(),
            total_calls: 0,
            total_errors: 0,
        }
    }

    /// Counts a call that ended in `second`, after `latency`.
    pub(crate) fn record(&mut self, second: u64, error: bool, latency: Duration) {
        let slot = &mut self.ring[(second % WINDOW_SECS as u64) as usize];
        if slot.second != second {
            *slot = Second::EMPTY;
            slot.second = second;
        }
        slot.calls = slot.calls.saturating_add(1);
        slot.hist[bucket_of(latency)] = slot.hist[bucket_of(latency)].saturating_add(1);
        self.total_calls += 1;
        if error {
            slot.errors = slot.errors.saturating_add(1);
            self.total_errors += 1;
        }
    }

    /// The slot of `second`, if it still holds that second.
    fn at(&self, second: u64) -> Option<&Second> {
        let slot = &self.ring[(second % WINDOW_SECS as u64) as usize];
        (slot.second == second).then_some(slot)
    }

    /// The complete seconds before `now` (the one in progress left out), oldest
    /// first: seconds before the board started count as empty.
    pub(crate) fn series(&self, now: u64) -> Series {
        let empty = Second::EMPTY;
        let seconds: Vec<&Second> = (1..=WINDOW_SECS as u64)
            .rev()
            .map(|back| {
                now.checked_sub(back)
                    .and_then(|s| self.at(s))
                    .unwrap_or(&empty)
            })
            .collect();
        Series {
            calls: seconds.iter().map(|s| s.calls).collect(),
            errors: seconds.iter().map(|s| s.errors).collect(),
            p50_us: seconds.iter().map(|s| quantile_us(&s.hist, 0.5)).collect(),
            p99_us: seconds.iter().map(|s| quantile_us(&s.hist, 0.99)).collect(),
            first: WINDOW_SECS - (now.min(WINDOW_SECS as u64) as usize),
            minute: Summary::of(&seconds[WINDOW_SECS - 60..]),
            recent: Summary::of(&seconds[WINDOW_SECS - 10..]),
            total_calls: self.total_calls,
            total_errors: self.total_errors,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    #[test]
    fn buckets_grow_by_half_octaves_and_stay_in_range() {
        assert_eq!(bucket_of(Duration::ZERO), 0);
        assert_eq!(bucket_of(us(1)), 0);
        assert_eq!(bucket_of(us(2)), 2);
        assert_eq!(bucket_of(us(3)), 3);
        assert_eq!(bucket_of(us(4)), 4);
        assert_eq!(bucket_of(us(6)), 5);
        assert_eq!(bucket_of(Duration::from_secs(100_000)), HIST_BUCKETS - 1);
        let mut last = 0;
        for micros in [1, 10, 100, 1_000, 10_000, 100_000, 1_000_000] {
            let bucket = bucket_of(us(micros));
            assert!(bucket >= last);
            last = bucket;
            // The bucket's value is within 25% of what was put in.
            let value = bucket_value_us(bucket);
            assert!(
                (value - micros as f64).abs() <= micros as f64 * 0.25 + 1.0,
                "{micros} µs -> {value}"
            );
        }
    }

    #[test]
    fn percentiles_of_a_known_spread() {
        let mut w = Window::new();
        // 98 fast calls (100 µs) and 2 slow ones (50 ms), in second 10.
        for _ in 0..98 {
            w.record(10, false, us(100));
        }
        w.record(10, true, Duration::from_millis(50));
        w.record(10, true, Duration::from_millis(50));
        let series = w.series(11);
        assert_eq!(*series.calls.last().unwrap(), 100);
        assert_eq!(*series.errors.last().unwrap(), 2);
        let p50 = series.p50_us.last().unwrap().unwrap();
        let p99 = series.p99_us.last().unwrap().unwrap();
        assert!((80.0..=125.0).contains(&p50), "p50 {p50}");
        assert!((40_000.0..=62_500.0).contains(&p99), "p99 {p99}");
        assert_eq!(series.minute.calls, 100);
        assert_eq!(series.minute.errors, 2);
        assert_eq!((series.total_calls, series.total_errors), (100, 2));
    }

    #[test]
    fn the_second_in_progress_is_left_out() {
        let mut w = Window::new();
        w.record(5, false, us(10));
        assert_eq!(w.series(5).calls.iter().sum::<u32>(), 0);
        assert_eq!(w.series(6).calls.iter().sum::<u32>(), 1);
        assert_eq!(w.series(6).calls.len(), WINDOW_SECS);
        assert_eq!(
            w.series(6).first,
            WINDOW_SECS - 6,
            "seconds 0 to 5 complete"
        );
        assert_eq!(w.series(1_000).first, 0);
    }

    #[test]
    fn old_seconds_roll_out_of_the_window() {
        let mut w = Window::new();
        w.record(1, false, us(10));
        w.record(2, true, us(10));
        // Still there at the edge of the window ...
        let series = w.series(1 + WINDOW_SECS as u64);
        assert_eq!(series.calls.iter().sum::<u32>(), 2);
        assert_eq!(series.calls[0], 1);
        // ... gone after it, though the totals keep them.
        let series = w.series(3 + WINDOW_SECS as u64);
        assert_eq!(series.calls.iter().sum::<u32>(), 0);
        assert_eq!(series.minute.calls, 0);
        assert_eq!(series.total_calls, 2);
        // A slot reused by a later second starts from zero.
        w.record(2 + WINDOW_SECS as u64, false, us(10));
        let series = w.series(3 + WINDOW_SECS as u64);
        assert_eq!(*series.calls.last().unwrap(), 1);
        assert_eq!(*series.errors.last().unwrap(), 0);
    }

    #[test]
    fn summaries_cover_their_seconds_only() {
        let mut w = Window::new();
        w.record(100, false, us(10)); // 100 s before 200: in the window, not the minute
        for s in 190..200 {
            w.record(s, s % 2 == 0, us(1_000));
        }
        let series = w.series(200);
        assert_eq!(series.recent.calls, 10);
        assert_eq!(series.recent.errors, 5);
        assert_eq!(series.minute.calls, 10);
        assert_eq!(series.calls.iter().sum::<u32>(), 11);
    }
}

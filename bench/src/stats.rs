//! Latency percentiles from raw samples, and per-thread CPU clocks.
//!
//! Latencies are kept as one `u32` of nanoseconds per call (saturating at ~4.29 s) and
//! sorted once; percentiles use the nearest-rank definition: the p-th percentile of
//! `n` sorted samples is the sample at 1-based rank `ceil(p * n)` (at least 1).
#![allow(unsafe_code)]

use std::time::Duration;

/// A latency sample in nanoseconds, saturated to `u32::MAX` (~4.29 s).
pub(crate) fn nanos(elapsed: Duration) -> u32 {
    u32::try_from(elapsed.as_nanos()).unwrap_or(u32::MAX)
}

/// The percentile summary of one result, in microseconds.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct LatencySummary {
    /// Median.
    pub(crate) p50_us: f64,
    /// 90th percentile.
    pub(crate) p90_us: f64,
    /// 99th percentile.
    pub(crate) p99_us: f64,
    /// 99.9th percentile.
    pub(crate) p999_us: f64,
    /// Largest sample.
    pub(crate) max_us: f64,
    /// Arithmetic mean.
    pub(crate) mean_us: f64,
    /// Number of samples.
    pub(crate) samples: usize,
}

impl LatencySummary {
    /// Summarizes samples of nanoseconds that are sorted ascending. All zero when empty.
    pub(crate) fn from_sorted(sorted: &[u32]) -> Self {
        let Some(&max) = sorted.last() else {
            return LatencySummary::default();
        };
        let sum: u64 = sorted.iter().map(|&s| u64::from(s)).sum();
        let us = |ns: u32| f64::from(ns) / 1e3;
        LatencySummary {
            p50_us: us(percentile(sorted, 0.50)),
            p90_us: us(percentile(sorted, 0.90)),
            p99_us: us(percentile(sorted, 0.99)),
            p999_us: us(percentile(sorted, 0.999)),
            max_us: us(max),
            mean_us: sum as f64 / sorted.len() as f64 / 1e3,
            samples: sorted.len(),
        }
    }
}

/// The nearest-rank percentile `p` (0 to 1) of ascending `sorted`; 0 when it is empty.
pub(crate) fn percentile(sorted: &[u32], p: f64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    let n = sorted.len();
    // ceil(p * n) with a guard against floating-point error just above an integer
    // (0.9 * 10 = 9.000000000000002).
    let rank = (p.clamp(0.0, 1.0) * n as f64 - 1e-9).ceil() as usize;
    sorted[rank.clamp(1, n) - 1]
}

/// The median of `values` (the mean of the middle two for an even count); `None` when
/// empty. NaNs sort last.
pub(crate) fn median(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    })
}

/// CPU time the calling OS thread has used so far (`CLOCK_THREAD_CPUTIME_ID`).
pub(crate) fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call, and
    // CLOCK_THREAD_CPUTIME_ID is supported by every Linux kernel we run on.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID) failed");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Pins the calling OS thread to one CPU (`sched_setaffinity(0, ..)`).
pub(crate) fn pin_current_thread(cpu: usize) -> std::io::Result<()> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("cpu {cpu} is out of range"),
        ));
    }
    // SAFETY: cpu_set_t is a plain bit array for which all-zeroes is valid; CPU_SET
    // writes inside it because `cpu < CPU_SETSIZE` (checked above); the kernel only
    // reads `size_of::<cpu_set_t>()` bytes from the pointer, which points to `set`.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_ZERO(&mut set);
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The resident memory (`VmRSS`) of process `pid`, in bytes: what the memory figures
/// of the many workload and of `rpc-bench-idle` and `rpc-bench-udp-associations`
/// measure.
pub fn rss_bytes(pid: u32) -> std::io::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .ok_or_else(|| std::io::Error::other(format!("no VmRSS in /proc/{pid}/status")))?;
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("cannot parse {line:?}")))?;
    Ok(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<u32> = (1..=10).collect();
        assert_eq!(percentile(&v, 0.0), 1);
        assert_eq!(percentile(&v, 0.1), 1);
        assert_eq!(percentile(&v, 0.11), 2);
        assert_eq!(percentile(&v, 0.5), 5);
        assert_eq!(percentile(&v, 0.9), 9);
        assert_eq!(percentile(&v, 0.99), 10);
        assert_eq!(percentile(&v, 1.0), 10);
        assert_eq!(percentile(&[7], 0.999), 7);
        assert_eq!(percentile(&[], 0.5), 0);

        let v: Vec<u32> = (1..=1000).collect();
        assert_eq!(percentile(&v, 0.5), 500);
        assert_eq!(percentile(&v, 0.99), 990);
        assert_eq!(percentile(&v, 0.999), 999);
    }

    #[test]
    fn summary_in_microseconds() {
        let v: Vec<u32> = (1..=1000).map(|i| i * 1000).collect();
        let s = LatencySummary::from_sorted(&v);
        assert_eq!(s.p50_us, 500.0);
        assert_eq!(s.p90_us, 900.0);
        assert_eq!(s.p99_us, 990.0);
        assert_eq!(s.p999_us, 999.0);
        assert_eq!(s.max_us, 1000.0);
        assert_eq!(s.mean_us, 500.5);
        assert_eq!(s.samples, 1000);
        assert_eq!(LatencySummary::from_sorted(&[]), LatencySummary::default());
    }

    #[test]
    fn medians() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0]), Some(3.0));
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
    }

    #[test]
    fn nanos_saturate() {
        assert_eq!(nanos(Duration::from_micros(3)), 3000);
        assert_eq!(nanos(Duration::from_secs(10)), u32::MAX);
    }

    #[test]
    fn thread_cpu_time_advances() {
        let start = thread_cpu_time();
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = std::hint::black_box(x.wrapping_add(i));
        }
        assert!(thread_cpu_time() > start, "{x}");
    }
}

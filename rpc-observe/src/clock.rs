//! Time stamps for call durations.
//!
//! A client call's layers read the clock twice (when the call starts, when it ends).
//! `std::time::Instant::now` costs about 26 ns a read on the machines this was
//! measured on (a `clock_gettime` through the vDSO); `quanta` reads the CPU's
//! time-stamp counter, calibrated against it, in about 10 (and falls back to the OS
//! clock where the counter cannot be trusted). With the metrics layers on both sides
//! the reads were 5% of a call's CPU at a million calls a second.
//!
//! A server call starts at its arrival, which the core stamps with a
//! `std::time::Instant` ([`ServerCall::received`](rpc_core::server::ServerCall::received)):
//! such a start stays in that clock.
//!
//! `quanta` calibrates the counter on its first read, in a loop that runs until its
//! error is small or for at most 200 ms; on a virtual machine it often runs the whole
//! 200 ms. That must not stall whatever thread makes the first layer (a runtime's
//! worker, say), so the first layer starts the calibration on a thread of its own
//! ([`warm_up`]) and stamps stay on the OS clock until it is done.

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Once,
    },
    time::Duration,
};

/// Set once the counter is calibrated: stamps may use it from then on.
static CALIBRATED: AtomicBool = AtomicBool::new(false);

/// When a call started, in one of the two clocks.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Stamp {
    /// The time-stamp counter (`quanta`).
    Counter(quanta::Instant),
    /// The OS clock: a server call's arrival.
    Os(std::time::Instant),
}

impl Stamp {
    /// Now: by the time-stamp counter once it is calibrated, by the OS clock until
    /// then.
    pub(crate) fn now() -> Stamp {
        if CALIBRATED.load(Ordering::Acquire) {
            Stamp::Counter(quanta::Instant::now())
        } else {
            Stamp::Os(std::time::Instant::now())
        }
    }

    /// The time since this stamp, in the stamp's clock.
    pub(crate) fn elapsed(&self) -> Duration {
        match self {
            Stamp::Counter(at) => quanta::Instant::now().saturating_duration_since(*at),
            Stamp::Os(at) => at.elapsed(),
        }
    }
}

/// Starts calibrating the counter clock on a thread of its own (once per process): a
/// layer calls it when it is made. Where no thread can be started, stamps stay on the
/// OS clock.
pub(crate) fn warm_up() {
    static STARTED: Once = Once::new();
    STARTED.call_once(|| {
        let calibrate = || {
            let _ = quanta::Instant::now();
            CALIBRATED.store(true, Ordering::Release);
        };
        let _ = std::thread::Builder::new()
            .name("rpc-observe-clock".into())
            .spawn(calibrate);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_use_the_os_clock_until_the_counter_is_calibrated_then_the_counter() {
        warm_up();
        // Whichever clock it is in, a stamp measures from when it was taken.
        let stamp = Stamp::now();
        assert!(stamp.elapsed() < Duration::from_secs(10), "{stamp:?}");
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let stamp = Stamp::now();
            // The flag only ever turns on: still off after the stamp, it was off for it.
            if CALIBRATED.load(Ordering::Acquire) {
                break;
            }
            assert!(matches!(stamp, Stamp::Os(_)), "{stamp:?}");
            assert!(std::time::Instant::now() < deadline, "never calibrated");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(matches!(Stamp::now(), Stamp::Counter(_)));
    }

    #[test]
    fn both_clocks_measure_a_sleep() {
        let (counter, os) = (
            Stamp::Counter(quanta::Instant::now()),
            Stamp::Os(std::time::Instant::now()),
        );
        std::thread::sleep(Duration::from_millis(20));
        for stamp in [counter, os] {
            let elapsed = stamp.elapsed();
            assert!(
                elapsed >= Duration::from_millis(19),
                "{stamp:?}: {elapsed:?}"
            );
            assert!(elapsed < Duration::from_secs(10), "{stamp:?}: {elapsed:?}");
        }
    }
}

//! [`LazySleep`]: a timer a connection's task checks in every round at little cost.

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll, Waker},
    time::Duration,
};

use tokio::time::{Instant, Sleep};

/// A `Sleep` that a connection task checks every round, polled only when that can
/// change something: once after it is armed (which registers the task's waker with
/// the timer), then only after it fired or when the task's waker is another one.
/// Polling an armed `Sleep` is not free (the task's budget, the timer's waker slot): it
/// had been some 600 instructions of every unary call, client and server each. The
/// core's keepalive and idle timers use it, and so can a transport's link (UDP's
/// retransmission and idle timer does).
///
/// It relies on a pending poll of the `Sleep` having registered the waker, which holds
/// outside the task's budget (it polls in `unconstrained`); as a safety net against
/// runtimes where it may not (Tokio's task dumps, under `tokio_unstable`), the check
/// after 64 skipped in a row polls anyway.
pub struct LazySleep {
    sleep: Pin<Box<Sleep>>,
    /// The waker the armed sleep holds, once a poll registered it.
    armed_for: Option<Waker>,
    /// Checks skipped since the last poll.
    skipped: u8,
}

/// Checks a [`LazySleep`] skips at most in a row.
const MAX_SKIPS: u8 = 64;

impl LazySleep {
    /// A sleep armed for `duration` from now.
    pub fn new(duration: Duration) -> Self {
        LazySleep {
            sleep: Box::pin(tokio::time::sleep(duration)),
            armed_for: None,
            skipped: 0,
        }
    }

    /// `Ready` once the deadline has passed (and at every check after, until it is
    /// [`reset`](Self::reset)); `Pending` with the task registered to be woken then.
    pub fn poll(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if let Some(waker) = &self.armed_for {
            if waker.will_wake(cx.waker()) && !self.sleep.is_elapsed() && self.skipped < MAX_SKIPS {
                self.skipped += 1;
                return Poll::Pending;
            }
        }
        self.skipped = 0;
        // Outside the task's budget: a poll the budget refused would register nothing,
        // and the check above would then skip the polls that would.
        let poll = Pin::new(&mut tokio::task::coop::unconstrained(self.sleep.as_mut())).poll(cx);
        match (&poll, &mut self.armed_for) {
            (Poll::Ready(()), armed) => *armed = None,
            (Poll::Pending, Some(waker)) => waker.clone_from(cx.waker()),
            (Poll::Pending, armed @ None) => *armed = Some(cx.waker().clone()),
        }
        poll
    }

    /// Arms it again for `deadline`; the next [`poll`](Self::poll) registers it.
    pub fn reset(&mut self, deadline: Instant) {
        self.sleep.as_mut().reset(deadline);
        self.armed_for = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Polls `sleep` once from the current task.
    async fn check(sleep: &mut LazySleep) -> Poll<()> {
        std::future::poll_fn(|cx| Poll::Ready(sleep.poll(cx))).await
    }

    #[tokio::test(start_paused = true)]
    async fn a_lazy_sleep_fires_when_due_and_again_after_a_reset() {
        let mut sleep = LazySleep::new(Duration::from_millis(10));
        assert!(check(&mut sleep).await.is_pending());
        tokio::time::advance(Duration::from_millis(5)).await;
        // Armed for this task and not due: the check skips the poll.
        assert!(check(&mut sleep).await.is_pending());
        assert_eq!(sleep.skipped, 1);
        tokio::time::advance(Duration::from_millis(6)).await;
        assert!(check(&mut sleep).await.is_ready());
        sleep.reset(Instant::now() + Duration::from_millis(10));
        assert!(check(&mut sleep).await.is_pending());
        // The task sleeps on the registration the checks made, and is woken when due.
        let start = Instant::now();
        std::future::poll_fn(|cx| sleep.poll(cx)).await;
        assert_eq!(start.elapsed(), Duration::from_millis(10));
    }

    #[tokio::test(start_paused = true)]
    async fn a_lazy_sleep_registers_again_for_another_waker() {
        let mut sleep = LazySleep::new(Duration::from_millis(10));
        // Armed by a poll with a waker that wakes nobody.
        let mut other = Context::from_waker(futures::task::noop_waker_ref());
        assert!(sleep.poll(&mut other).is_pending());
        // This task's first check must poll (and register) rather than skip, or the
        // timeout would fire first.
        let woken = tokio::time::timeout(
            Duration::from_secs(1),
            std::future::poll_fn(|cx| sleep.poll(cx)),
        )
        .await;
        assert!(
            woken.is_ok(),
            "the sleep never woke the task that checked it"
        );
    }
}

//! Which streams of a link have something to do.
//!
//! Each stream is polled with a waker of its own ([`StreamWaker`]): when h2 wakes it
//! (a response arrived, send capacity opened, the peer reset the stream), the stream's
//! id joins the link's list of woken streams and the link's task is woken. A round of
//! the link then polls the streams of that list ([`Readiness::take`]), not every
//! stream of the connection: with `n` calls in flight, a wake-up costs what its own
//! streams need instead of `n` polls, each of which takes h2's connection lock.
//!
//! Changes the link makes itself (a message queued, credit granted, a stream opened)
//! mark the stream ([`StreamWaker::mark`]) without waking the task: the core flushes
//! the link after every frame it sends, and the flush polls the marked streams.

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex, PoisonError,
    },
    task::{Context, Wake, Waker},
};

/// The woken streams of one link, and the waker of the task that drives the link.
#[derive(Default)]
pub(crate) struct Readiness {
    shared: Arc<Shared>,
    /// The list handed out last, kept for its allocation.
    spare: Vec<u64>,
    /// The task waker last given to `shared`, to skip the lock when it is unchanged.
    task: Option<Waker>,
}

#[derive(Default)]
struct Shared {
    woken: Mutex<Woken>,
}

#[derive(Default)]
struct Woken {
    ids: Vec<u64>,
    task: Option<Waker>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Woken> {
        // The lock guards plain data that no panic leaves half-changed.
        self.woken.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Readiness {
    /// Remembers the task that drives the link, to be woken when a stream is.
    pub(crate) fn register(&mut self, cx: &Context<'_>) {
        if self.task.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            return;
        }
        self.task = Some(cx.waker().clone());
        self.shared.lock().task = Some(cx.waker().clone());
    }

    /// A waker for the stream `id`.
    pub(crate) fn waker(&self, id: u64) -> StreamWaker {
        let flag = Arc::new(Flag {
            id,
            queued: AtomicBool::new(false),
            shared: self.shared.clone(),
        });
        StreamWaker {
            waker: Waker::from(flag.clone()),
            flag,
        }
    }

    /// The streams woken or marked since the last call, each once. Give the list
    /// back with [`put_back`](Self::put_back) to reuse its allocation.
    pub(crate) fn take(&mut self) -> Vec<u64> {
        let mut ids = std::mem::take(&mut self.spare);
        ids.clear();
        std::mem::swap(&mut ids, &mut self.shared.lock().ids);
        ids
    }

    /// [`take`](Self::take), plus the ids of `always` (which it empties), each id once:
    /// the streams waiting for h2's send capacity, which a round polls whether woken or
    /// not, since h2 does not always wake a stream when it gives it capacity (seen with
    /// more calls in flight than the connection's stream limit and window allow).
    pub(crate) fn take_with(&mut self, always: &mut Vec<u64>) -> Vec<u64> {
        let mut ids = self.take();
        ids.append(always);
        if ids.len() > 1 {
            ids.sort_unstable();
            ids.dedup();
        }
        ids
    }

    /// Returns a list from [`take`](Self::take).
    pub(crate) fn put_back(&mut self, ids: Vec<u64>) {
        self.spare = ids;
    }
}

/// The waker of one stream: h2 keeps it while the stream waits for something.
pub(crate) struct StreamWaker {
    waker: Waker,
    flag: Arc<Flag>,
}

impl StreamWaker {
    /// Puts the stream on the list without waking the task (the link's own change,
    /// polled at its next flush).
    pub(crate) fn mark(&self) {
        self.flag.enqueue();
    }

    /// The waker to poll the stream with (for a `Context`). The stream leaves the
    /// list first, so a wake-up during or after the poll puts it back.
    pub(crate) fn for_poll(&self) -> Waker {
        self.flag.queued.store(false, Ordering::Release);
        self.waker.clone()
    }
}

struct Flag {
    id: u64,
    /// On the list (or being polled after being taken from it, until `context`).
    queued: AtomicBool,
    shared: Arc<Shared>,
}

impl Flag {
    /// Adds the id to the list unless it is there; returns the task to wake if it
    /// was added.
    fn enqueue(&self) -> Option<Waker> {
        if self.queued.swap(true, Ordering::AcqRel) {
            return None;
        }
        let mut woken = self.shared.lock();
        woken.ids.push(self.id);
        woken.task.clone()
    }
}

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // Woken outside the lock. Already on the list: the task was woken when it
        // was put there, and will take it.
        if let Some(task) = self.enqueue() {
            task.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn a_woken_stream_is_listed_once_and_wakes_the_task_once() {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let task = Waker::from(count.clone());
        let mut readiness = Readiness::default();
        readiness.register(&Context::from_waker(&task));
        let a = readiness.waker(1);
        let b = readiness.waker(2);
        a.waker.wake_by_ref();
        a.waker.wake_by_ref();
        // By value too (h2 may keep a clone and wake it).
        let owned = b.waker.clone();
        owned.wake();
        assert_eq!(readiness.take(), vec![1, 2]);
        assert_eq!(count.0.load(Ordering::Relaxed), 2);
        // Taken but not polled yet: still counts as listed.
        a.waker.wake_by_ref();
        assert!(readiness.take().is_empty());
        // Polled: a new wake-up lists it again.
        drop(a.for_poll());
        a.waker.wake_by_ref();
        assert_eq!(readiness.take(), vec![1]);
        assert_eq!(count.0.load(Ordering::Relaxed), 3);
    }

    #[test]
    fn a_mark_lists_the_stream_without_waking_the_task() {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let task = Waker::from(count.clone());
        let mut readiness = Readiness::default();
        readiness.register(&Context::from_waker(&task));
        let a = readiness.waker(7);
        a.mark();
        a.mark();
        let ids = readiness.take();
        assert_eq!(ids, vec![7]);
        readiness.put_back(ids);
        assert_eq!(count.0.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_wake_before_the_task_is_known_is_kept() {
        let mut readiness = Readiness::default();
        let a = readiness.waker(3);
        a.waker.wake_by_ref();
        assert_eq!(readiness.take(), vec![3]);
    }
}

//! The duplicate-request cache behind at-most-once execution, sans-IO.
//!
//! A request that carries a [`CallKey`] is looked up by (client, call):
//!
//! - unknown and newer than the client's horizon: it runs, and the entry records who
//!   waits for its outcome;
//! - still running: the duplicate waits for the same execution;
//! - finished: the duplicate gets the recorded outcome;
//! - unknown but not newer than the horizon (an entry for it may have been evicted):
//!   it is refused, since it may already have run. Never a second execution.
//!
//! Finished entries are evicted oldest first when there are too many, when they hold
//! too many bytes, or when they are older than the maximum age; evicting an entry
//! raises its client's horizon to that call. Only repeats (attempt > 1) are checked
//! against the horizon: a first attempt never ran, whatever its number. Running
//! entries are not evicted; `max_running` bounds them.

use std::{
    collections::{HashMap, VecDeque},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use tokio::time::Instant;

use crate::frame::CallKey;

/// Bounds of the duplicate cache. Every field has a documented default.
#[derive(Clone, Debug)]
pub struct DedupeConfig {
    /// Most finished calls remembered. Default: 10,000.
    pub max_entries: usize,
    /// Most bytes of remembered outcomes. Default: 32 MiB.
    pub max_bytes: usize,
    /// How long a finished call is remembered. Default: 60 s: longer than a client's
    /// retries of one call take with the default retry policy.
    pub max_age: Duration,
    /// Most keyed calls running at once, server-wide. A keyed handler runs to completion
    /// even when its caller goes away (its outcome must be recorded), so this, not the
    /// per-connection limit, bounds them. Past it, new keyed calls are refused with
    /// `RESOURCE_EXHAUSTED` before they run. Default: 10,000.
    pub max_running: usize,
}

impl Default for DedupeConfig {
    fn default() -> Self {
        DedupeConfig {
            max_entries: 10_000,
            max_bytes: 32 << 20,
            max_age: Duration::from_secs(60),
            max_running: 10_000,
        }
    }
}

/// What the cache did, for metrics.
#[derive(Debug, Default)]
pub struct DedupeStats {
    /// Duplicates answered with a recorded outcome.
    pub hits: AtomicU64,
    /// Duplicates that waited for the execution still running.
    pub attached: AtomicU64,
    /// Finished entries evicted.
    pub evictions: AtomicU64,
    /// Duplicates refused because they were older than the cache remembers.
    pub too_old: AtomicU64,
    /// Keyed requests that were a retry (attempt 2 or more), whatever became of them.
    /// Retries of methods that are safe to repeat carry no key and look like new calls.
    pub retries: AtomicU64,
}

/// What to do with a keyed request.
pub(crate) enum Admit<O> {
    /// First time seen: run it, then [`DuplicateCache::complete`].
    Run,
    /// Running: the waiter was recorded and gets the outcome on completion.
    Attached,
    /// Finished: here is its outcome.
    Cached(O),
    /// Older than what the cache remembers: it may have run; refuse it.
    TooOld,
    /// Too many keyed calls are running: refuse it without running it.
    Busy,
}

enum Entry<W, O> {
    Running(Vec<W>),
    Done { outcome: O, bytes: usize },
}

type Key = (u128, u64);

/// The cache. `W` is whoever waits for an outcome, `O` the outcome.
pub(crate) struct DuplicateCache<W, O> {
    config: DedupeConfig,
    entries: HashMap<Key, Entry<W, O>>,
    /// Finished entries, oldest first.
    done: VecDeque<(Key, Instant)>,
    bytes: usize,
    running: usize,
    /// Per client: the highest call number evicted, and when.
    horizon: HashMap<u128, (u64, Instant)>,
    stats: Arc<DedupeStats>,
}

impl<W, O: Clone> DuplicateCache<W, O> {
    pub(crate) fn new(config: DedupeConfig) -> Self {
        DuplicateCache {
            config,
            entries: HashMap::new(),
            done: VecDeque::new(),
            bytes: 0,
            running: 0,
            horizon: HashMap::new(),
            stats: Arc::default(),
        }
    }

    pub(crate) fn stats(&self) -> &Arc<DedupeStats> {
        &self.stats
    }

    /// Looks a keyed request up; see [`Admit`].
    pub(crate) fn admit(&mut self, key: &CallKey, waiter: W, now: Instant) -> Admit<O> {
        self.evict(now);
        if key.attempt > 1 {
            self.stats.retries.fetch_add(1, Ordering::Relaxed);
        }
        match self.entries.get_mut(&(key.client, key.call)) {
            Some(Entry::Running(waiters)) => {
                waiters.push(waiter);
                self.stats.attached.fetch_add(1, Ordering::Relaxed);
                Admit::Attached
            }
            Some(Entry::Done { outcome, .. }) => {
                self.stats.hits.fetch_add(1, Ordering::Relaxed);
                Admit::Cached(outcome.clone())
            }
            None => {
                // A first attempt never ran before, whatever its number: calls of one
                // client do not arrive in order. Only a repeat can be a duplicate.
                if key.attempt > 1
                    && self
                        .horizon
                        .get(&key.client)
                        .is_some_and(|&(call, _)| key.call <= call)
                {
                    self.stats.too_old.fetch_add(1, Ordering::Relaxed);
                    return Admit::TooOld;
                }
                if self.running >= self.config.max_running {
                    return Admit::Busy;
                }
                self.running += 1;
                self.entries
                    .insert((key.client, key.call), Entry::Running(vec![waiter]));
                Admit::Run
            }
        }
    }

    /// Records the outcome of a call admitted with [`Admit::Run`]; returns everyone
    /// waiting for it (the first requester included).
    pub(crate) fn complete(
        &mut self,
        key: &CallKey,
        outcome: O,
        bytes: usize,
        now: Instant,
    ) -> Vec<W> {
        let k = (key.client, key.call);
        let waiters = match self.entries.insert(k, Entry::Done { outcome, bytes }) {
            Some(Entry::Running(waiters)) => {
                self.running -= 1;
                waiters
            }
            _ => Vec::new(),
        };
        self.bytes += bytes;
        self.done.push_back((k, now));
        self.evict(now);
        waiters
    }

    /// Forgets a call admitted with [`Admit::Run`] that will not run after all (its
    /// request was dropped before a handler started); returns who was waiting, to be
    /// told. A later repeat runs it.
    pub(crate) fn abandon(&mut self, key: &CallKey) -> Vec<W> {
        match self.entries.remove(&(key.client, key.call)) {
            Some(Entry::Running(waiters)) => {
                self.running -= 1;
                waiters
            }
            Some(done) => {
                // Finished after all: keep it.
                self.entries.insert((key.client, key.call), done);
                Vec::new()
            }
            None => Vec::new(),
        }
    }

    fn evict(&mut self, now: Instant) {
        while let Some(&(key, at)) = self.done.front() {
            let over = self.done.len() > self.config.max_entries
                || self.bytes > self.config.max_bytes
                || now.saturating_duration_since(at) > self.config.max_age;
            if !over {
                break;
            }
            self.done.pop_front();
            if let Some(Entry::Done { bytes, .. }) = self.entries.remove(&key) {
                self.bytes -= bytes;
            }
            let horizon = self.horizon.entry(key.0).or_insert((key.1, now));
            *horizon = (horizon.0.max(key.1), now);
            self.stats.evictions.fetch_add(1, Ordering::Relaxed);
        }
        // Horizons of clients silent for long are dropped, so the table stays bounded;
        // by then their calls are far older than any retry.
        if self.horizon.len() > self.config.max_entries {
            let keep = self.config.max_age * 10;
            self.horizon
                .retain(|_, &mut (_, at)| now.saturating_duration_since(at) <= keep);
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn running_calls_are_capped_and_abandoned_ones_can_run_again() {
        let config = DedupeConfig {
            max_running: 1,
            ..DedupeConfig::default()
        };
        let mut c = DuplicateCache::<&str, u32>::new(config);
        let now = Instant::now();
        assert!(matches!(c.admit(&key(1), "a", now), Admit::Run));
        assert!(matches!(c.admit(&key(2), "b", now), Admit::Busy));
        assert!(matches!(c.admit(&key(1), "retry", now), Admit::Attached));
        assert_eq!(c.abandon(&key(1)), vec!["a", "retry"]);
        assert!(matches!(c.admit(&key(2), "b", now), Admit::Run));
    }

    fn key(call: u64) -> CallKey {
        CallKey {
            client: 7,
            call,
            attempt: 1,
        }
    }

    #[test]
    fn run_attach_then_cached() {
        let mut c = DuplicateCache::<&str, u32>::new(DedupeConfig::default());
        let now = Instant::now();
        assert!(matches!(c.admit(&key(1), "first", now), Admit::Run));
        assert!(matches!(c.admit(&key(1), "retry", now), Admit::Attached));
        assert_eq!(c.complete(&key(1), 42, 8, now), vec!["first", "retry"]);
        assert!(matches!(c.admit(&key(1), "late", now), Admit::Cached(42)));
        assert_eq!(c.stats().hits.load(Ordering::Relaxed), 1);
        assert_eq!(c.stats().attached.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn evicted_calls_are_refused_never_rerun() {
        let config = DedupeConfig {
            max_entries: 2,
            ..DedupeConfig::default()
        };
        let mut c = DuplicateCache::<(), u32>::new(config);
        let now = Instant::now();
        for call in 1..=3 {
            assert!(matches!(c.admit(&key(call), (), now), Admit::Run));
            c.complete(&key(call), call as u32, 1, now);
        }
        assert_eq!(c.len(), 2, "call 1 evicted");
        let repeat = CallKey {
            attempt: 2,
            ..key(1)
        };
        assert!(matches!(c.admit(&repeat, (), now), Admit::TooOld));
        assert!(matches!(c.admit(&key(3), (), now), Admit::Cached(3)));
        // A new call of the same client still runs; another client is unaffected.
        assert!(matches!(c.admit(&key(4), (), now), Admit::Run));
        let other = CallKey {
            client: 8,
            call: 1,
            attempt: 1,
        };
        assert!(matches!(c.admit(&other, (), now), Admit::Run));
        assert_eq!(c.stats().evictions.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn age_and_bytes_bound_the_cache() {
        let config = DedupeConfig {
            max_bytes: 100,
            max_age: Duration::from_secs(10),
            ..DedupeConfig::default()
        };
        let mut c = DuplicateCache::<(), u32>::new(config);
        let t0 = Instant::now();
        c.admit(&key(1), (), t0);
        c.complete(&key(1), 1, 60, t0);
        c.admit(&key(2), (), t0);
        c.complete(&key(2), 2, 60, t0);
        assert_eq!(c.len(), 1, "over 100 bytes: the oldest went");
        let repeat = CallKey {
            attempt: 2,
            ..key(2)
        };
        assert!(matches!(
            c.admit(&repeat, (), t0 + Duration::from_secs(11)),
            Admit::TooOld
        ));
    }
}

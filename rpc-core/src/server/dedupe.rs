//! The duplicate-request cache behind at-most-once execution, sans-IO.
//!
//! A request that carries a [`CallKey`] is looked up by (client, call), where the
//! client id has its method and its caller's credentials hashed in ([`scoped_key`]):
//! the same key on a call of another method, or from another caller, is another call.
//! The rest of this module treats that as the client:
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
//! against the horizon: a first attempt never ran, whatever its number; except over a
//! link that may deliver a request twice (UDP), where a late copy of a first attempt
//! can come after its entry was evicted, so every attempt is checked. Running
//! entries are not evicted; `max_running` bounds them, and `max_waiting_per_call` the
//! attempts waiting for one of them. At `max_running`, running calls nobody waits for
//! (every connection that sent them has closed) are stopped to make room.
//!
//! Every table has a bound, and none is scanned per request (the one scan, for
//! running calls nobody waits for, runs at `max_running` only, at most every 100 ms):
//!
//! - entries: `max_entries` finished ones (and `max_bytes`, `max_age`), `max_running`
//!   running ones, each with at most `max_waiting_per_call` waiters. Waiters whose
//!   connection is gone are pruned when the bound is reached; a connection drops its
//!   own cancelled waiter with [`DuplicateCache::detach`].
//! - horizons: `max_clients` exact ones, least recently raised evicted first (a queue,
//!   amortized O(1) per eviction). An evicted horizon is not forgotten: it is *folded*
//!   into one of [`FOLDED_HORIZONS`] buckets picked by a keyed hash of the client id,
//!   each holding the highest call folded into it. A client's horizon is the higher of
//!   its exact one and its bucket's, so it never goes down when its exact entry goes:
//!   a repeat of an evicted call is still refused. The price is that a client sharing a
//!   bucket with a client of higher call numbers has its unknown repeats refused as
//!   "may already have run" sooner than needed; never a second execution.
//! - a horizon (exact or folded) not raised for 10 times `max_age` (at least 10
//!   minutes) is dropped: by then
//!   the client's calls are far older than any retry.

use std::{
    collections::{hash_map::RandomState, HashMap, VecDeque},
    hash::{BuildHasher, Hasher},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use tokio::{sync::Notify, time::Instant};

use crate::frame::CallKey;

/// The key the cache files a call under: `key` with its client id replaced by a hash
/// of it, the call's method and its caller (`caller`: [`caller_of`]'s fingerprint of
/// the credentials it came with), keyed with this process's secret random keys
/// (SipHash, 128 bits in all). So the same key on a call of another method is another
/// call (a client numbering calls per method gets its own, never the recorded outcome
/// of a different method); and the same key from another caller is another call: the
/// cache is consulted before any layer authenticates the call, and a peer that learnt
/// someone's call key (keys are not secrets: traces record them) got that caller's
/// recorded answer, or waited for its running call, without a credential. Unkeyed,
/// the method's hash was folded into the id, and a client id chosen to cancel it out
/// reached another method's outcome. Horizons are per client, method and caller
/// likewise.
pub(crate) fn scoped_key(key: CallKey, method: &str, caller: u64) -> CallKey {
    let (first, second) = keys();
    let hash = |state: &RandomState| {
        let mut h = state.build_hasher();
        h.write_u128(key.client);
        h.write(method.as_bytes());
        h.write_u8(0xff);
        h.write_u64(caller);
        h.finish()
    };
    CallKey {
        client: (u128::from(hash(first)) << 64) | u128::from(hash(second)),
        ..key
    }
}

/// [`scoped_key`] for a call with no credentials.
#[cfg(test)]
pub(crate) fn method_key(key: CallKey, method: &str) -> CallKey {
    scoped_key(key, method, 0)
}

/// A fingerprint of the credentials a call came with, for [`scoped_key`]: its
/// `authorization` metadata (a bearer token, say) and `peer`, [`peer_of`]'s
/// fingerprint of its connection's peer. A service that takes its credentials from
/// another metadata entry is not told apart this way: see docs/wire.md 6.8.
pub(crate) fn caller_of(peer: u64, authorization: Option<&[u8]>) -> u64 {
    let mut h = keys().0.build_hasher();
    h.write_u64(peer);
    match authorization {
        Some(value) => {
            h.write_u8(1);
            h.write(value);
        }
        None => h.write_u8(0),
    }
    h.finish()
}

/// What the transport verified of a connection's peer, for [`caller_of`] (once per
/// connection): its TLS certificate's identity (its names and addresses; the
/// certificate itself only when it has none), a Unix socket peer's user and group; not
/// where it connects from (a retry comes on another connection, from another port),
/// nor which certificate of an identity it presents: certificates are rotated (every
/// half hour, for SPIFFE's), and a retry on a new connection with the new certificate
/// was another caller's call, and ran again (from a review).
pub(crate) fn peer_of(peer: &crate::Peer) -> u64 {
    let mut h = keys().1.build_hasher();
    if let Some(tls) = peer.tls() {
        h.write_u8(2);
        let named =
            !(tls.uris.is_empty() && tls.dns_names.is_empty() && tls.ip_addresses.is_empty());
        if !named {
            h.write(&tls.certificate);
        }
        h.write_u8(u8::from(tls.authenticated()));
        for name in tls.uris.iter().chain(&tls.dns_names) {
            h.write(name.as_bytes());
            h.write_u8(0xff);
        }
        for ip in &tls.ip_addresses {
            std::hash::Hash::hash(ip, &mut h);
        }
    }
    if let Some(unix) = peer.unix_credentials() {
        h.write_u8(3);
        h.write_u32(unix.uid);
        h.write_u32(unix.gid);
    }
    h.finish()
}

/// This process's secret hash keys for [`scoped_key`] and [`caller_of`].
fn keys() -> &'static (RandomState, RandomState) {
    static KEYS: std::sync::OnceLock<(RandomState, RandomState)> = std::sync::OnceLock::new();
    KEYS.get_or_init(|| (RandomState::new(), RandomState::new()))
}

/// Buckets that keep the horizons of clients pushed out of the exact table. A fixed
/// 4,096 (under 100 KiB, allocated at the first fold): enough that a client rarely
/// shares a bucket with a busy one, small enough to cost nothing.
pub(crate) const FOLDED_HORIZONS: usize = 4096;

/// How many times `max_age` a horizon is kept after it was last raised.
const HORIZON_KEEP_FACTOR: u32 = 10;

/// The least time a horizon is kept, whatever `max_age`: a retry can come after a
/// dead connection is noticed (keepalive: over two minutes by default), and a short
/// (or zero) `max_age` had horizons gone before it, so that the retry of an evicted
/// call ran again (from a review).
const MIN_HORIZON_KEEP: Duration = Duration::from_secs(600);

/// Bounds of the duplicate cache. Every field has a documented default.
#[derive(Clone, Debug)]
pub struct DedupeConfig {
    /// Most finished calls remembered. Default: 10,000.
    pub max_entries: usize,
    /// Most bytes of remembered outcomes. An outcome over a sixteenth of it is
    /// remembered as `ABORTED` "the call ran; its outcome ... was too large for the
    /// server to keep" (a repeat learns that it ran, not its answer), so that one large
    /// answer does not evict many others'. Default: 32 MiB.
    pub max_bytes: usize,
    /// How long a finished call is remembered. Default: 60 s: longer than a client's
    /// retries of one call take with the default retry policy.
    pub max_age: Duration,
    /// Most keyed calls running at once, server-wide. A keyed handler runs to completion
    /// even when its caller goes away (its outcome must be recorded; up to
    /// `max_unattended` after the last one left), so this, not the per-connection
    /// limit, bounds them. At it, running calls nobody waits for any more are stopped
    /// (`ABORTED`) to make room; if none is, new keyed calls are refused with
    /// `RESOURCE_EXHAUSTED` before they run. (A stopped handler's future is dropped;
    /// work it handed elsewhere, a `spawn_blocking` say, runs on uncounted.)
    /// Default: 10,000.
    pub max_running: usize,
    /// Most requests waiting for one running keyed call, the one that runs it included.
    /// A client retries a call a few times; more waiters are a client repeating one key
    /// on purpose. Past it, a repeat is answered `RESOURCE_EXHAUSTED` (after waiters
    /// whose connection is gone were dropped). Default: 16. Minimum 1.
    pub max_waiting_per_call: usize,
    /// How long a running keyed call goes on once nobody waits for it: every request
    /// that ran it or attached to it came over a connection that has closed, and no
    /// retry came meanwhile. Its handler is then stopped (dropped, maybe part way) and
    /// its outcome recorded as `ABORTED`, which later retries get: the call is never
    /// run twice. Without it a handler that never ends (no deadline) would hold one of
    /// `max_running` for ever after its client left, and 40 connections' worth of
    /// such calls refuse every keyed call of the server. Checked every quarter of it
    /// (100 ms at the least), so a call goes within 1¼ times this. Default: 60 s (as
    /// `max_age`: longer than a client's retries of one call take with the default
    /// retry policy).
    pub max_unattended: Duration,
    /// Most clients whose horizon is kept exactly. Past it, the least recently raised
    /// one is folded into a shared bucket (see the module docs): memory stays bounded
    /// and an evicted call is still never run twice. Default: 10,000.
    pub max_clients: usize,
}

impl Default for DedupeConfig {
    fn default() -> Self {
        DedupeConfig {
            max_entries: 10_000,
            max_bytes: 32 << 20,
            max_age: Duration::from_secs(60),
            max_running: 10_000,
            max_waiting_per_call: 16,
            max_unattended: Duration::from_secs(60),
            max_clients: 10_000,
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
    /// Duplicates refused because too many requests already waited for the same call.
    pub too_many_waiting: AtomicU64,
    /// Client horizons pushed out of the exact table into a shared bucket.
    pub horizons_folded: AtomicU64,
    /// Running calls nobody waited for any more, stopped to make room for new ones
    /// at `max_running` (their outcome is `ABORTED`).
    pub reclaimed: AtomicU64,
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
    /// Too many requests already wait for this running call: refuse it (the call goes
    /// on running for the others).
    TooManyWaiting,
}

/// Who waits for a keyed call's outcome, as far as the cache needs to know.
pub(crate) trait OutcomeWaiter {
    /// Whether the waiter can no longer take an outcome (its connection is gone), so
    /// that the cache may drop it.
    fn is_gone(&self) -> bool;
}

/// The server's waiter: a connection's outcome queue, gone when the connection is.
impl<T, U> OutcomeWaiter for (tokio::sync::mpsc::UnboundedSender<T>, U) {
    fn is_gone(&self) -> bool {
        self.0.is_closed()
    }
}

enum Entry<W, O> {
    /// Running, and counted in `max_running`: who waits for its outcome, and what
    /// wakes its handler's task to stop it (once that task watches it).
    Running {
        waiters: Vec<W>,
        stop: Option<Arc<Notify>>,
    },
    /// Running still, but told to stop to make room (`reclaim`): no longer counted.
    /// Repeats attach and get the outcome, `ABORTED`.
    Stopping(Vec<W>),
    Done {
        outcome: O,
        bytes: usize,
    },
}

/// Whether anyone waits for a running keyed call, as its handler's task sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attention {
    /// A connection that sent it or a repeat is open.
    Awaited,
    /// Every such connection closed; it runs on for a while (`max_unattended`).
    Unattended,
    /// Stop now: its place was given to a new call (`max_running` was reached), or
    /// it is not running.
    Stop,
}

/// How often, at most, the running calls are scanned for ones nobody waits for when
/// a new keyed call finds `max_running` reached.
const RECLAIM_EVERY: Duration = Duration::from_millis(100);

type Key = (u128, u64);

/// Per client, the highest call number evicted (see the module docs).
struct Horizons {
    /// Exact horizons: the call and when it was last raised.
    exact: HashMap<u128, (u64, Instant)>,
    /// Every client of `exact` once, with when it was queued; least recently raised
    /// first, except that a client raised since it was queued is queued again when it
    /// reaches the front instead of being evicted.
    order: VecDeque<(u128, Instant)>,
    /// Folded horizons by bucket; empty until the first fold.
    folded: Vec<Option<(u64, Instant)>>,
    hasher: RandomState,
    max_clients: usize,
    keep: Duration,
}

impl Horizons {
    fn new(config: &DedupeConfig) -> Self {
        Horizons {
            exact: HashMap::new(),
            order: VecDeque::new(),
            folded: Vec::new(),
            hasher: RandomState::new(),
            max_clients: config.max_clients,
            keep: config
                .max_age
                .saturating_mul(HORIZON_KEEP_FACTOR)
                .max(MIN_HORIZON_KEEP),
        }
    }

    fn live(&self, at: Instant, now: Instant) -> bool {
        now.saturating_duration_since(at) <= self.keep
    }

    fn bucket(&self, client: u128) -> usize {
        (self.hasher.hash_one(client) % FOLDED_HORIZONS as u64) as usize
    }

    /// The client's horizon: every call at or below it may have run.
    fn get(&self, client: u128, now: Instant) -> Option<u64> {
        let exact = self.exact(client, now);
        let folded = if self.folded.is_empty() {
            None
        } else {
            self.folded[self.bucket(client)]
                .filter(|&(_, at)| self.live(at, now))
                .map(|(call, _)| call)
        };
        exact.max(folded)
    }

    /// The client's own horizon, without the bucket it may share: see
    /// [`DuplicateCache::admit_from`].
    fn exact(&self, client: u128, now: Instant) -> Option<u64> {
        self.exact
            .get(&client)
            .filter(|&&(_, at)| self.live(at, now))
            .map(|&(call, _)| call)
    }

    /// Call `call` of `client` was evicted: raise the client's horizon to it.
    fn raise(&mut self, client: u128, call: u64, now: Instant, stats: &DedupeStats) {
        match self.exact.get_mut(&client) {
            Some(horizon) => *horizon = (horizon.0.max(call), now),
            None => {
                self.exact.insert(client, (call, now));
                self.order.push_back((client, now));
            }
        }
        self.trim(now, stats);
    }

    /// Folds horizons past `max_clients`, drops those past their age. Amortized O(1):
    /// each pass over an entry either removes it or requeues it once per raise.
    fn trim(&mut self, now: Instant, stats: &DedupeStats) {
        while let Some(&(client, queued)) = self.order.front() {
            let over = self.exact.len() > self.max_clients;
            if !over && self.live(queued, now) {
                break;
            }
            self.order.pop_front();
            let Some(&(call, at)) = self.exact.get(&client) else {
                continue;
            };
            if at > queued && self.live(at, now) {
                self.order.push_back((client, at)); // raised since: a second chance
                continue;
            }
            self.exact.remove(&client);
            if self.live(at, now) {
                self.fold(client, call, at);
                stats.horizons_folded.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn fold(&mut self, client: u128, call: u64, at: Instant) {
        if self.folded.is_empty() {
            self.folded = vec![None; FOLDED_HORIZONS];
        }
        let bucket = self.bucket(client);
        let keep = self.keep;
        let slot = &mut self.folded[bucket];
        *slot = Some(match *slot {
            Some((c, a)) if at.saturating_duration_since(a) <= keep => (c.max(call), a.max(at)),
            _ => (call, at),
        });
    }

    #[cfg(test)]
    fn exact_len(&self) -> usize {
        self.exact.len()
    }
}

/// The cache. `W` is whoever waits for an outcome, `O` the outcome.
pub(crate) struct DuplicateCache<W, O> {
    config: DedupeConfig,
    entries: HashMap<Key, Entry<W, O>>,
    /// Finished entries, oldest first.
    done: VecDeque<(Key, Instant)>,
    bytes: usize,
    running: usize,
    /// When the running calls may be scanned again for ones nobody waits for.
    next_reclaim: Option<Instant>,
    horizons: Horizons,
    stats: Arc<DedupeStats>,
}

impl<W: OutcomeWaiter, O: Clone> DuplicateCache<W, O> {
    pub(crate) fn new(mut config: DedupeConfig) -> Self {
        config.max_waiting_per_call = config.max_waiting_per_call.max(1);
        DuplicateCache {
            horizons: Horizons::new(&config),
            config,
            entries: HashMap::new(),
            done: VecDeque::new(),
            bytes: 0,
            running: 0,
            next_reclaim: None,
            stats: Arc::default(),
        }
    }

    pub(crate) fn stats(&self) -> &Arc<DedupeStats> {
        &self.stats
    }

    /// [`admit_from`](Self::admit_from) for a request over a reliable link.
    #[cfg(test)]
    pub(crate) fn admit(&mut self, key: &CallKey, waiter: W, now: Instant) -> Admit<O> {
        self.admit_from(key, waiter, now, false)
    }

    /// Looks a keyed request up; see [`Admit`]. `first_may_repeat`: the request came
    /// over a link that may deliver a request more than once (UDP: the client's
    /// retransmissions and the network's copies carry the same attempt number), so
    /// that even a first attempt may have run already, and is checked against the
    /// client's horizon like a repeat: its own horizon only, not a folded bucket's,
    /// which other clients' calls raise, so that a new client's first calls are not
    /// refused for a neighbour's numbers. (So a client whose horizon was folded out of
    /// the exact table, the least recently raised of more than `max_clients`, loses
    /// this check for its first attempts' copies.)
    pub(crate) fn admit_from(
        &mut self,
        key: &CallKey,
        waiter: W,
        now: Instant,
        first_may_repeat: bool,
    ) -> Admit<O> {
        self.evict(now);
        if key.attempt > 1 {
            self.stats.retries.fetch_add(1, Ordering::Relaxed);
        }
        match self.entries.get_mut(&(key.client, key.call)) {
            Some(Entry::Running { waiters, .. } | Entry::Stopping(waiters)) => {
                let max = self.config.max_waiting_per_call;
                if waiters.len() >= max {
                    // Only at the bound, so attaching stays O(1).
                    waiters.retain(|w| !w.is_gone());
                }
                if waiters.len() >= max {
                    self.stats.too_many_waiting.fetch_add(1, Ordering::Relaxed);
                    return Admit::TooManyWaiting;
                }
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
                // client do not arrive in order. Only a repeat can be a duplicate, and,
                // over a link that delivers copies, a first attempt's late copy.
                let horizon = if key.attempt > 1 {
                    self.horizons.get(key.client, now)
                } else if first_may_repeat {
                    self.horizons.exact(key.client, now)
                } else {
                    None
                };
                if horizon.is_some_and(|call| key.call <= call) {
                    self.stats.too_old.fetch_add(1, Ordering::Relaxed);
                    return Admit::TooOld;
                }
                if self.running >= self.config.max_running && self.reclaim(now) == 0 {
                    return Admit::Busy;
                }
                self.running += 1;
                self.entries.insert(
                    (key.client, key.call),
                    Entry::Running {
                        waiters: vec![waiter],
                        stop: None,
                    },
                );
                Admit::Run
            }
        }
    }

    /// Drops the waiters of a running call that `is` picks, and returns how many: a
    /// connection calls it when a request it attached (or ran) is cancelled, so that a
    /// client repeating and cancelling one key holds no waiter per repeat. The call
    /// keeps running; its outcome still goes to the other waiters and the cache.
    /// Nothing happens for a call that is not running.
    pub(crate) fn detach(&mut self, key: &CallKey, mut is: impl FnMut(&W) -> bool) -> usize {
        match self.entries.get_mut(&(key.client, key.call)) {
            Some(Entry::Running { waiters, .. } | Entry::Stopping(waiters)) => {
                let before = waiters.len();
                waiters.retain(|w| !is(w));
                before - waiters.len()
            }
            _ => 0,
        }
    }

    /// Whether anyone waits for the running call `key` (waiters gone are dropped).
    /// `stop`, if given, is what [`reclaim`](Self::reclaim) wakes when it tells the
    /// call to stop: its handler's task, which then asks again.
    pub(crate) fn attention(&mut self, key: &CallKey, stop: Option<&Arc<Notify>>) -> Attention {
        match self.entries.get_mut(&(key.client, key.call)) {
            Some(Entry::Running {
                waiters,
                stop: slot,
            }) => {
                if let Some(stop) = stop {
                    *slot = Some(stop.clone());
                }
                waiters.retain(|w| !w.is_gone());
                if waiters.is_empty() {
                    Attention::Unattended
                } else {
                    Attention::Awaited
                }
            }
            _ => Attention::Stop,
        }
    }

    /// At `max_running`: every running call nobody waits for (each connection that
    /// sent it or a repeat has closed) is told to stop now, rather than
    /// `max_unattended` later, and its place goes to new calls; returns how many. A
    /// client that sends keyed calls which never end and leaves, again and again,
    /// so cannot keep the server's keyed calls refused; only calls a connection still
    /// waits for hold places, each in one of that connection's slots. Scans the
    /// entries, so at most once per [`RECLAIM_EVERY`].
    fn reclaim(&mut self, now: Instant) -> usize {
        if self.next_reclaim.is_some_and(|at| now < at) {
            return 0;
        }
        self.next_reclaim = Some(now + RECLAIM_EVERY);
        let mut freed = 0;
        for entry in self.entries.values_mut() {
            let Entry::Running { waiters, stop } = entry else {
                continue;
            };
            waiters.retain(|w| !w.is_gone());
            if waiters.is_empty() {
                // A permit if the task is not waiting yet: it is not missed.
                if let Some(stop) = stop.take() {
                    stop.notify_one();
                }
                *entry = Entry::Stopping(Vec::new());
                freed += 1;
            }
        }
        self.running -= freed;
        self.stats
            .reclaimed
            .fetch_add(freed as u64, Ordering::Relaxed);
        freed
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
            Some(Entry::Running { waiters, .. }) => {
                self.running -= 1;
                waiters
            }
            Some(Entry::Stopping(waiters)) => waiters,
            _ => Vec::new(),
        };
        self.bytes += bytes;
        self.done.push_back((k, now));
        self.evict(now);
        waiters
    }

    /// The largest outcome kept whole: a sixteenth of `max_bytes`. One larger would
    /// evict many others' (all of them, past `max_bytes`: two keyed downloads of
    /// 16 MiB emptied the cache, and every other client's retry was refused).
    pub(crate) fn max_outcome_bytes(&self) -> usize {
        self.config.max_bytes / 16
    }

    /// Forgets a call admitted with [`Admit::Run`] that will not run after all (its
    /// request was dropped before a handler started); returns who was waiting, to be
    /// told. A later repeat runs it.
    pub(crate) fn abandon(&mut self, key: &CallKey) -> Vec<W> {
        match self.entries.remove(&(key.client, key.call)) {
            Some(Entry::Running { waiters, .. }) => {
                self.running -= 1;
                waiters
            }
            Some(Entry::Stopping(waiters)) => waiters,
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
            self.horizons.raise(key.0, key.1, now, &self.stats);
            self.stats.evictions.fetch_add(1, Ordering::Relaxed);
        }
        // Horizons past their age go even when nothing is evicted.
        self.horizons.trim(now, &self.stats);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }

    #[cfg(test)]
    fn waiting(&self, key: &CallKey) -> usize {
        match self.entries.get(&(key.client, key.call)) {
            Some(Entry::Running { waiters, .. } | Entry::Stopping(waiters)) => waiters.len(),
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client's certificate rotated between two attempts of a call (a retry on a
    /// new connection) is the same caller: it was another, and the retry ran again.
    /// Another identity is another caller; a certificate with no names is told apart
    /// by the certificate itself.
    #[test]
    fn a_rotated_certificate_of_one_identity_is_the_same_caller() {
        use crate::peer::TlsIdentity;
        let identity = |uri: &str, certificate: &[u8]| {
            crate::Peer::new("10.0.0.1:5000").with_tls(TlsIdentity {
                version: "TLSv1.3".into(),
                alpn: None,
                dns_names: Vec::new(),
                uris: if uri.is_empty() {
                    Vec::new()
                } else {
                    vec![uri.into()]
                },
                ip_addresses: Vec::new(),
                certificate: certificate.to_vec(),
            })
        };
        let a = "spiffe://example.org/a";
        assert_eq!(
            peer_of(&identity(a, b"cert 1")),
            peer_of(&identity(a, b"cert 2"))
        );
        assert_ne!(
            peer_of(&identity(a, b"cert 1")),
            peer_of(&identity("spiffe://example.org/b", b"cert 1"))
        );
        assert_ne!(
            peer_of(&identity("", b"cert 1")),
            peer_of(&identity("", b"cert 2"))
        );
        assert_ne!(peer_of(&identity(a, b"cert 1")), peer_of(&identity(a, b"")));
    }
    use tokio::sync::mpsc;

    /// A client id chosen to cancel out the difference of two methods' unkeyed hashes
    /// (how the method was folded in before) does not reach the other method's call,
    /// nor does the same key from another caller.
    #[test]
    fn crafted_client_ids_and_other_callers_get_keys_of_their_own() {
        let fnv = |method: &str| {
            let mut hash = super::super::router::Fnv::default();
            hash.write(method.as_bytes());
            u128::from(hash.finish()) << 64
        };
        let key = CallKey {
            client: 0x5eed,
            call: 1,
            attempt: 1,
        };
        let crafted = CallKey {
            client: key.client ^ fnv("t.S/Put") ^ fnv("t.S/Get"),
            ..key
        };
        assert_ne!(
            scoped_key(key, "t.S/Put", 0).client,
            scoped_key(crafted, "t.S/Get", 0).client
        );
        assert_ne!(
            scoped_key(key, "t.S/Put", 1).client,
            scoped_key(key, "t.S/Put", 2).client
        );
        assert_eq!(scoped_key(key, "t.S/Put", 7), scoped_key(key, "t.S/Put", 7));
    }

    impl OutcomeWaiter for &str {
        fn is_gone(&self) -> bool {
            false
        }
    }

    impl OutcomeWaiter for () {
        fn is_gone(&self) -> bool {
            false
        }
    }

    /// A connection's waiter as the server makes them: its outcome queue and a tag.
    type ConnWaiter = (mpsc::UnboundedSender<u32>, u64);

    fn repeat(call: u64) -> CallKey {
        CallKey {
            attempt: 2,
            ..key(call)
        }
    }

    /// Issue 19, finding 4: one key repeated (and cancelled) 100,000 times held 100,000
    /// waiters. A cancelled repeat is detached; without that, the waiters of one call
    /// stop at the bound and further repeats are refused.
    #[test]
    fn cancelled_repeats_are_detached() {
        let mut c = DuplicateCache::<ConnWaiter, u32>::new(DedupeConfig::default());
        let now = Instant::now();
        let (tx, _rx) = mpsc::unbounded_channel();
        assert!(matches!(c.admit(&key(1), (tx.clone(), 0), now), Admit::Run));
        for tag in 1..=100_000 {
            assert!(matches!(
                c.admit(&repeat(1), (tx.clone(), tag), now),
                Admit::Attached
            ));
            assert_eq!(c.detach(&repeat(1), |(_, t)| *t == tag), 1);
        }
        assert_eq!(c.waiting(&key(1)), 1, "only the first request still waits");
        assert_eq!(
            c.detach(&key(2), |_| true),
            0,
            "not running: nothing to detach"
        );
        assert_eq!(c.complete(&key(1), 7, 8, now).len(), 1);
    }

    #[test]
    fn waiters_of_one_call_are_bounded() {
        let mut c = DuplicateCache::<ConnWaiter, u32>::new(DedupeConfig::default());
        let max = DedupeConfig::default().max_waiting_per_call;
        let now = Instant::now();
        let (tx, _rx) = mpsc::unbounded_channel();
        assert!(matches!(c.admit(&key(1), (tx.clone(), 0), now), Admit::Run));
        let mut attached = 0;
        for tag in 1..=100_000 {
            match c.admit(&repeat(1), (tx.clone(), tag), now) {
                Admit::Attached => attached += 1,
                Admit::TooManyWaiting => {}
                _ => panic!("a repeat of a running call neither attached nor refused"),
            }
        }
        assert_eq!(attached, max - 1);
        assert_eq!(c.waiting(&key(1)), max);
        assert_eq!(
            c.stats().too_many_waiting.load(Ordering::Relaxed),
            100_000 - (max as u64 - 1)
        );
        // Everyone waiting still gets the outcome; a later repeat gets it from the cache.
        assert_eq!(c.complete(&key(1), 7, 8, now).len(), max);
        assert!(matches!(
            c.admit(&repeat(1), (tx, 0), now),
            Admit::Cached(7)
        ));
    }

    #[test]
    fn waiters_whose_connection_is_gone_are_pruned() {
        let mut c = DuplicateCache::<ConnWaiter, u32>::new(DedupeConfig::default());
        let max = DedupeConfig::default().max_waiting_per_call;
        let now = Instant::now();
        let (tx, _rx) = mpsc::unbounded_channel();
        assert!(matches!(c.admit(&key(1), (tx, 0), now), Admit::Run));
        for tag in 1..=10_000 {
            // Each repeat on its own connection, which closes at once.
            let (tx, rx) = mpsc::unbounded_channel();
            drop(rx);
            assert!(matches!(
                c.admit(&repeat(1), (tx, tag), now),
                Admit::Attached
            ));
            assert!(c.waiting(&key(1)) <= max);
        }
    }

    /// Issue 19, finding 5: 20,000 clients with a cache of 100 entries held 19,900
    /// horizons. The table stays at its bound, and no evicted call runs again.
    #[test]
    fn horizons_are_bounded_and_evicted_calls_are_still_refused() {
        let config = DedupeConfig {
            max_entries: 100,
            max_clients: 100,
            ..DedupeConfig::default()
        };
        let mut c = DuplicateCache::<(), u32>::new(config);
        let now = Instant::now();
        let client = |client: u128, call: u64, attempt: u32| CallKey {
            client,
            call,
            attempt,
        };
        for id in 0..20_000u128 {
            assert!(matches!(c.admit(&client(id, 1, 1), (), now), Admit::Run));
            c.complete(&client(id, 1, 1), 1, 1, now);
            assert!(c.horizons.exact_len() <= 100);
        }
        assert!(c.stats().horizons_folded.load(Ordering::Relaxed) >= 19_800);
        for id in 0..19_900u128 {
            assert!(
                matches!(c.admit(&client(id, 1, 2), (), now), Admit::TooOld),
                "client {id}: an evicted call must not run again"
            );
        }
        // New calls still run, and so does an unknown repeat above every horizon.
        assert!(matches!(c.admit(&client(5, 2, 1), (), now), Admit::Run));
        assert!(matches!(c.admit(&client(6, 9, 2), (), now), Admit::Run));
    }

    #[test]
    fn horizons_go_after_ten_maximum_ages() {
        let config = DedupeConfig {
            max_entries: 1,
            max_clients: 1,
            max_age: Duration::from_secs(60),
            ..DedupeConfig::default()
        };
        let mut c = DuplicateCache::<(), u32>::new(config);
        let t0 = Instant::now();
        for id in 1..=3u128 {
            let k = CallKey {
                client: id,
                call: 1,
                attempt: 1,
            };
            c.admit(&k, (), t0);
            c.complete(&k, 1, 1, t0);
        }
        let old = CallKey {
            client: 1,
            call: 1,
            attempt: 2,
        };
        assert!(matches!(c.admit(&old, (), t0), Admit::TooOld));
        let later = t0 + Duration::from_secs(601);
        assert!(matches!(c.admit(&old, (), later), Admit::Run));
        // Left: client 3's, raised just now by evicting its (expired) entry.
        assert_eq!(c.horizons.exact_len(), 1);
    }

    /// Horizons stay at least 10 minutes, whatever `max_age`: with a short one (here
    /// zero) they were gone before a retry that comes after a dead connection is
    /// noticed, and the retry of an evicted call ran again (from a review).
    #[test]
    fn horizons_stay_ten_minutes_at_least() {
        let config = DedupeConfig {
            max_entries: 1,
            max_age: Duration::ZERO,
            ..DedupeConfig::default()
        };
        let mut c = DuplicateCache::<(), u32>::new(config);
        let t0 = Instant::now();
        let first = CallKey {
            client: 1,
            call: 1,
            attempt: 1,
        };
        c.admit(&first, (), t0);
        c.complete(&first, 1, 1, t0);
        // Another call evicts the first (its entry is past a zero max_age at once).
        let second = CallKey { call: 2, ..first };
        c.admit(&second, (), t0 + Duration::from_secs(1));
        let retry = CallKey {
            attempt: 2,
            ..first
        };
        let late = t0 + Duration::from_secs(300);
        assert!(
            matches!(c.admit(&retry, (), late), Admit::TooOld),
            "the retry of an evicted call would run again"
        );
    }

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

    /// At `max_running`, calls nobody waits for (their connections closed) give their
    /// places to new ones, and their tasks are told to stop; calls a connection waits
    /// for keep theirs. Repeats of a stopped call wait for its (ABORTED) outcome, and
    /// its completion does not give back a place twice. Before, such calls held their
    /// places until `max_unattended` passed, and a client that sent never-ending keyed
    /// calls and left, again and again, kept every keyed call of the server refused.
    #[test]
    fn calls_nobody_waits_for_make_room_at_max_running() {
        let config = DedupeConfig {
            max_running: 2,
            ..DedupeConfig::default()
        };
        let mut c = DuplicateCache::<ConnWaiter, u32>::new(config);
        let now = Instant::now();
        let (left, left_rx) = mpsc::unbounded_channel();
        let (stays, _stays_rx) = mpsc::unbounded_channel();
        assert!(matches!(c.admit(&key(1), (left, 1), now), Admit::Run));
        assert!(matches!(
            c.admit(&key(2), (stays.clone(), 2), now),
            Admit::Run
        ));
        let stop = Arc::new(Notify::new());
        assert_eq!(c.attention(&key(1), Some(&stop)), Attention::Awaited);
        // Both awaited: a new call is refused.
        assert!(matches!(
            c.admit(&key(3), (stays.clone(), 3), now),
            Admit::Busy
        ));
        drop(left_rx);
        // Within RECLAIM_EVERY of the last scan: refused still (no scan per request).
        assert!(matches!(
            c.admit(&key(3), (stays.clone(), 3), now),
            Admit::Busy
        ));
        let later = now + RECLAIM_EVERY;
        assert!(matches!(
            c.admit(&key(3), (stays.clone(), 3), later),
            Admit::Run
        ));
        assert_eq!(c.stats().reclaimed.load(Ordering::Relaxed), 1);
        // Call 1's task was woken (a permit: it had not waited yet) and told to stop;
        // call 2 runs on.
        assert!(futures::FutureExt::now_or_never(stop.notified()).is_some());
        assert_eq!(c.attention(&key(1), None), Attention::Stop);
        assert_eq!(c.attention(&key(2), None), Attention::Awaited);
        // A repeat of call 1 waits for its outcome; it does not run it again.
        assert!(matches!(
            c.admit(&repeat(1), (stays.clone(), 4), later),
            Admit::Attached
        ));
        assert_eq!(c.complete(&key(1), 9, 8, later).len(), 1);
        // Full again (calls 2 and 3): call 1's end gave back no second place.
        let much_later = later + RECLAIM_EVERY;
        assert!(matches!(
            c.admit(&key(5), (stays, 5), much_later),
            Admit::Busy
        ));
    }

    fn key(call: u64) -> CallKey {
        CallKey {
            client: 7,
            call,
            attempt: 1,
        }
    }

    #[test]
    fn the_same_key_on_another_method_is_another_call() {
        let mut c = DuplicateCache::<&str, u32>::new(DedupeConfig::default());
        let now = Instant::now();
        let (say, add) = (
            "rpc.examples.v1.Echo/Say",
            "rpc.examples.v1.KeyValue/Increment",
        );
        assert!(matches!(
            c.admit(&method_key(key(1), add), "add", now),
            Admit::Run
        ));
        c.complete(&method_key(key(1), add), 10, 8, now);
        // Not Increment's recorded outcome: Say runs.
        assert!(matches!(
            c.admit(&method_key(key(1), say), "say", now),
            Admit::Run
        ));
        c.complete(&method_key(key(1), say), 20, 8, now);
        // Each method's repeat gets its own outcome.
        let again = |method| method_key(repeat(1), method);
        assert!(matches!(
            c.admit(&again(add), "add", now),
            Admit::Cached(10)
        ));
        assert!(matches!(
            c.admit(&again(say), "say", now),
            Admit::Cached(20)
        ));
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

    /// Over UDP a first attempt can arrive twice (a retransmission, a copy the network
    /// made, an original delayed past its retransmission): once its entry is evicted,
    /// a late copy is refused like a repeat. Over a reliable link a first attempt
    /// below the horizon still runs (calls of one client arrive out of order).
    /// Found by a lossy-network round: 100 calls answered OK ran 136 times.
    #[test]
    fn a_late_copy_of_a_first_attempt_over_udp_is_not_rerun() {
        let config = DedupeConfig {
            max_entries: 2,
            ..DedupeConfig::default()
        };
        let mut c = DuplicateCache::<(), u32>::new(config);
        let now = Instant::now();
        for call in 1..=3 {
            assert!(matches!(
                c.admit_from(&key(call), (), now, true),
                Admit::Run
            ));
            c.complete(&key(call), call as u32, 1, now);
        }
        assert_eq!(c.len(), 2, "call 1 evicted");
        assert!(matches!(
            c.admit_from(&key(1), (), now, true),
            Admit::TooOld
        ));
        assert!(matches!(
            c.admit_from(&key(3), (), now, true),
            Admit::Cached(3)
        ));
        assert!(matches!(c.admit_from(&key(4), (), now, true), Admit::Run));
        assert!(matches!(c.admit_from(&key(1), (), now, false), Admit::Run));

        // Only a client's own horizon counts for its first attempts: once horizons are
        // folded into shared buckets, a new client's first calls still run (its
        // repeats are refused by the bucket, as before).
        let config = DedupeConfig {
            max_entries: 1,
            max_clients: 1,
            ..DedupeConfig::default()
        };
        let mut c = DuplicateCache::<(), u32>::new(config);
        let call = |client: u128, attempt: u32| CallKey {
            client,
            call: 10,
            attempt,
        };
        for client in 0..20_000 {
            assert!(matches!(
                c.admit_from(&call(client, 1), (), now, true),
                Admit::Run
            ));
            c.complete(&call(client, 1), 1, 1, now);
        }
        // A newcomer whose bucket a folded horizon raised (most are: 20,000 clients in
        // 4,096 buckets; the first such id is taken, so the test does not depend on
        // the hash's key).
        let newcomer = (1u128 << 100..)
            .find(|&id| c.horizons.get(id, now).is_some())
            .unwrap();
        assert!(matches!(
            c.admit_from(&call(newcomer, 2), (), now, true),
            Admit::TooOld
        ));
        assert!(matches!(
            c.admit_from(&call(newcomer, 1), (), now, true),
            Admit::Run
        ));
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

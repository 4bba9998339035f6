//! What a server's connections carried: a registry of the open connections
//! ([`Server::connections`](super::Server::connections)) and the totals across every
//! connection, closed ones included ([`Server::stats`](super::Server::stats)).
//!
//! Each connection task counts into plain fields of its own and publishes them into its
//! [`ConnectionCounters`] once per poll: the counters have one writer, so publishing is
//! a store, not a locked read-modify-write, and a reader sees values at most one poll
//! old. Bytes and frames are the core's frames as the link hands them over (header and
//! payload); a gRPC connection counts its messages and metadata, not HTTP/2's framing.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed},
        Arc, Mutex,
    },
    time::{Duration, Instant, SystemTime},
};

use tokio_util::sync::CancellationToken;

use crate::{bulk::Regions, Peer};

/// One open connection, as [`Server::connections`](super::Server::connections) saw it.
#[derive(Clone, Debug)]
pub struct ConnectionInfo {
    /// Who is on the other end; [`Peer::scheme`] is its wire (`tcp`, `grpc`...).
    pub peer: Arc<Peer>,
    /// When the server accepted it (after the transport's handshake, if any).
    pub opened: SystemTime,
    /// How long it has been open.
    pub age: Duration,
    /// Calls being handled or answered, and requests waiting for their service.
    pub in_flight: usize,
    /// Requests received (unary and streaming calls).
    pub requests: u64,
    /// Bytes of frames received.
    pub bytes_received: u64,
    /// Bytes of frames sent.
    pub bytes_sent: u64,
    /// Frames received.
    pub frames_received: u64,
    /// Frames sent.
    pub frames_sent: u64,
}

/// Totals across every connection a server served, the closed ones included.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Connections accepted.
    pub connections_opened: u64,
    /// Connections ended.
    pub connections_closed: u64,
    /// Requests received.
    pub requests: u64,
    /// Requests answered `DEADLINE_EXCEEDED` without their handler running: their
    /// deadline had passed when they arrived, or while they waited for a busy service.
    pub expired_before_handler: u64,
    /// Connections turned away at the connection limit.
    pub refused_at_limit: u64,
    /// Connections closed with an error GOAWAY: the peer broke the protocol or one of
    /// the connection's limits, or its transport's own protocol (a link's error of
    /// kind [`Protocol`](crate::ErrorKind::Protocol): an HTTP/2 GOAWAY on the gRPC
    /// wire, a soft RDMA packet refused). The server's logs show a few, not all.
    pub refused_for_errors: u64,
    /// Requests answered `RESOURCE_EXHAUSTED` without their handler running because
    /// the server's budget of large requests had no room for them
    /// ([`ServerBuilder::max_large_request_bytes`](super::ServerBuilder::max_large_request_bytes)):
    /// they never reach a service, so no layer counts them (from a review: they showed
    /// nowhere).
    pub refused_over_budget: u64,
    /// Bytes of frames received.
    pub bytes_received: u64,
    /// Bytes of frames sent.
    pub bytes_sent: u64,
    /// Frames received.
    pub frames_received: u64,
    /// Frames sent.
    pub frames_sent: u64,
}

/// The counts a connection task keeps as it goes: plain integers, no atomics.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Counts {
    pub(crate) requests: u64,
    pub(crate) expired: u64,
    pub(crate) bytes_received: u64,
    pub(crate) bytes_sent: u64,
    pub(crate) frames_received: u64,
    pub(crate) frames_sent: u64,
    pub(crate) in_flight: usize,
    /// How much of frames partly received has arrived
    /// ([`Link::receiving`](crate::link::Link::receiving)).
    pub(crate) receiving: u64,
    /// What the link has not written yet, as it measures it
    /// ([`Link::unsent`](crate::link::Link::unsent)).
    pub(crate) unsent: u64,
    /// Frames among those received and sent that are no progress of a call: PINGs and
    /// PONGs either way, and frames received for no call in flight (a CANCEL, WINDOW or
    /// DATA for an id that is not open). The others are the calls' own: what
    /// [`Registry::evict_quiet`] takes for their progress.
    pub(crate) keepalive: u64,
}

impl Counts {
    /// Counts a frame received.
    #[inline]
    pub(crate) fn received(&mut self, bytes: usize) {
        self.frames_received += 1;
        self.bytes_received += bytes as u64;
    }

    /// Counts a frame sent.
    #[inline]
    pub(crate) fn sent(&mut self, bytes: usize) {
        self.frames_sent += 1;
        self.bytes_sent += bytes as u64;
    }
    /// Adds another connection's totals (not its gauge, `in_flight`).
    fn add(&mut self, other: &Counts) {
        self.requests += other.requests;
        self.expired += other.expired;
        self.bytes_received += other.bytes_received;
        self.bytes_sent += other.bytes_sent;
        self.frames_received += other.frames_received;
        self.frames_sent += other.frames_sent;
    }
}

/// A connection's counters as others read them; written by its task only.
#[derive(Debug)]
pub(crate) struct ConnectionCounters {
    peer: Arc<Peer>,
    opened: SystemTime,
    opened_at: Instant,
    requests: AtomicU64,
    expired: AtomicU64,
    bytes_received: AtomicU64,
    bytes_sent: AtomicU64,
    frames_received: AtomicU64,
    frames_sent: AtomicU64,
    in_flight: AtomicUsize,
    receiving: AtomicU64,
    unsent: AtomicU64,
    keepalive: AtomicU64,
    /// Ends the connection gracefully (a child of the server's shutdown token).
    evict: CancellationToken,
    /// [`Registry::evict_quiet`] chose it: its GOAWAY says why.
    evicted: std::sync::atomic::AtomicBool,
    /// ... for calls that made no progress (not as a quiet connection): it closes with
    /// them.
    evicted_stalled: std::sync::atomic::AtomicBool,
    /// The buffers its handlers exposed to the peer, which may still pull them.
    regions: Arc<Regions>,
}

impl ConnectionCounters {
    /// Whether the connection was ended to make room for a new one.
    pub(crate) fn evicted(&self) -> bool {
        self.evicted.load(Relaxed)
    }

    /// Whether it was ended for calls that made no progress
    /// ([`ServerBuilder::evict_stalled_after`](super::ServerBuilder::evict_stalled_after)).
    pub(crate) fn evicted_stalled(&self) -> bool {
        self.evicted_stalled.load(Relaxed)
    }

    /// Publishes the task's counts. One writer (the connection's task): plain stores.
    pub(crate) fn publish(&self, counts: &Counts) {
        self.requests.store(counts.requests, Relaxed);
        self.expired.store(counts.expired, Relaxed);
        self.bytes_received.store(counts.bytes_received, Relaxed);
        self.bytes_sent.store(counts.bytes_sent, Relaxed);
        self.frames_received.store(counts.frames_received, Relaxed);
        self.frames_sent.store(counts.frames_sent, Relaxed);
        self.in_flight.store(counts.in_flight, Relaxed);
        self.receiving.store(counts.receiving, Relaxed);
        self.unsent.store(counts.unsent, Relaxed);
        self.keepalive.store(counts.keepalive, Relaxed);
    }

    fn counts(&self) -> Counts {
        Counts {
            requests: self.requests.load(Relaxed),
            expired: self.expired.load(Relaxed),
            bytes_received: self.bytes_received.load(Relaxed),
            bytes_sent: self.bytes_sent.load(Relaxed),
            frames_received: self.frames_received.load(Relaxed),
            frames_sent: self.frames_sent.load(Relaxed),
            in_flight: self.in_flight.load(Relaxed),
            receiving: self.receiving.load(Relaxed),
            unsent: self.unsent.load(Relaxed),
            keepalive: self.keepalive.load(Relaxed),
        }
    }

    fn info(&self, now: Instant) -> ConnectionInfo {
        let counts = self.counts();
        ConnectionInfo {
            peer: self.peer.clone(),
            opened: self.opened,
            age: now.saturating_duration_since(self.opened_at),
            in_flight: counts.in_flight,
            requests: counts.requests,
            bytes_received: counts.bytes_received,
            bytes_sent: counts.bytes_sent,
            frames_received: counts.frames_received,
            frames_sent: counts.frames_sent,
        }
    }
}

/// The open connections and the totals of the closed ones.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    state: Mutex<RegistryState>,
    refused_at_limit: AtomicU64,
    refused_for_errors: AtomicU64,
    refused_over_budget: AtomicU64,
}

#[derive(Debug, Default)]
struct RegistryState {
    next_id: u64,
    open: HashMap<u64, Open>,
    /// No search for a quiet connection before then: the last one found none.
    no_search_before: Option<Instant>,
    /// Connections chosen by [`Registry::evict_quiet`] still open (closing).
    evicting: usize,
    /// Sums over the connections that ended.
    closed: Counts,
    opened: u64,
    closed_count: u64,
}

/// Connections [`Registry::evict_quiet`] chose that may be closing at once: past it,
/// new connections at the limit are refused until they are gone. Each evicted one ends
/// within its closing grace (1 s), so the open connections exceed the limit by this
/// many at most.
const MAX_EVICTING: usize = 64;

/// An open connection's counters, and since when [`Registry::evict_quiet`] has seen its
/// count of frames received, what it had of frames partly received and what it had not
/// written yet, unchanged; and since when its calls' frames (those received and sent
/// but PINGs and PONGs) with the same two.
#[derive(Debug)]
struct Open {
    counters: Arc<ConnectionCounters>,
    seen: (u64, u64, u64),
    unchanged_since: Instant,
    progress: (u64, u64, u64),
    stalled_since: Instant,
}

impl Registry {
    /// Counts a connection turned away at the connection limit.
    pub(crate) fn count_refused_at_limit(&self) {
        self.refused_at_limit.fetch_add(1, Relaxed);
    }

    /// Registers a connection; it leaves the registry when the returned entry drops.
    /// `evict` is the token that ends it gracefully, `regions` what its handlers
    /// exposed.
    pub(crate) fn open(
        self: &Arc<Self>,
        peer: Arc<Peer>,
        evict: CancellationToken,
        regions: Arc<Regions>,
    ) -> Entry {
        let counters = Arc::new(ConnectionCounters {
            peer,
            opened: SystemTime::now(),
            opened_at: Instant::now(),
            requests: AtomicU64::new(0),
            expired: AtomicU64::new(0),
            bytes_received: AtomicU64::new(0),
            bytes_sent: AtomicU64::new(0),
            frames_received: AtomicU64::new(0),
            frames_sent: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            receiving: Default::default(),
            unsent: Default::default(),
            keepalive: Default::default(),
            evict,
            evicted: Default::default(),
            evicted_stalled: Default::default(),
            regions,
        });
        let mut state = self.lock();
        let id = state.next_id;
        state.next_id += 1;
        state.opened += 1;
        let open = Open {
            counters: counters.clone(),
            seen: (0, 0, 0),
            unchanged_since: counters.opened_at,
            progress: (0, 0, 0),
            stalled_since: counters.opened_at,
        };
        state.open.insert(id, open);
        Entry {
            registry: self.clone(),
            id,
            counters,
        }
    }

    /// Open connections, oldest first.
    pub(crate) fn connections(&self) -> Vec<ConnectionInfo> {
        let now = Instant::now();
        let mut open: Vec<(u64, ConnectionInfo)> = self
            .lock()
            .open
            .iter()
            .map(|(id, open)| (*id, open.counters.info(now)))
            .collect();
        open.sort_unstable_by_key(|(id, _)| *id);
        open.into_iter().map(|(_, info)| info).collect()
    }

    /// Totals over every connection, open and closed.
    pub(crate) fn stats(&self) -> ServerStats {
        let state = self.lock();
        let mut sum = state.closed;
        for open in state.open.values() {
            sum.add(&open.counters.counts());
        }
        ServerStats {
            connections_opened: state.opened,
            connections_closed: state.closed_count,
            requests: sum.requests,
            expired_before_handler: sum.expired,
            refused_at_limit: self.refused_at_limit.load(Relaxed),
            refused_for_errors: self.refused_for_errors.load(Relaxed),
            refused_over_budget: self.refused_over_budget.load(Relaxed),
            bytes_received: sum.bytes_received,
            bytes_sent: sum.bytes_sent,
            frames_received: sum.frames_received,
            frames_sent: sum.frames_sent,
        }
    }

    /// Ends the open connection that has been quiet longest, to make room for a new
    /// one at the connection limit: one with nothing in flight (no call, stream or
    /// exposed buffer) whose count of frames received, what it has of a frame partly
    /// received and what it has not written yet were seen unchanged for at least
    /// `quiet` (by this search, which notes the counts it sees: there is no clock per
    /// frame); it closes gracefully. Failing that, with `stalled`, the one whose calls
    /// have made no progress longest, for at least `stalled`: calls in flight, but no
    /// frame either way other than PINGs and PONGs, nor more of a frame partly
    /// received, nor anything more written (streams opened and left silent, which a
    /// peer answering keepalive PINGs held for ever); it closes with its calls.
    /// Returns its peer and whether it had calls in flight, or `None` if no connection
    /// qualifies (or [`MAX_EVICTING`] chosen ones are still closing); a search that
    /// finds none holds off the next for a little (up to a second), so that a flood of
    /// connections at the limit does not scan the table for each.
    pub(crate) fn evict_quiet(
        &self,
        quiet: Duration,
        stalled: Option<Duration>,
    ) -> Option<(Arc<Peer>, bool)> {
        let now = Instant::now();
        let mut state = self.lock();
        if state.no_search_before.is_some_and(|t| now < t) || state.evicting >= MAX_EVICTING {
            return None;
        }
        let mut victim: Option<(Instant, &Arc<ConnectionCounters>)> = None;
        let mut busy_victim: Option<(Instant, &Arc<ConnectionCounters>)> = None;
        for open in state.open.values_mut() {
            let counters = &open.counters;
            let (received, receiving, unsent) = (
                counters.frames_received.load(Relaxed),
                counters.receiving.load(Relaxed),
                counters.unsent.load(Relaxed),
            );
            let calls = (received + counters.frames_sent.load(Relaxed))
                .wrapping_sub(counters.keepalive.load(Relaxed));
            // Changed since the last look: not a candidate this time.
            let progressed = (calls, receiving, unsent) != open.progress;
            if progressed {
                open.progress = (calls, receiving, unsent);
                open.stalled_since = now;
            }
            let heard = (received, receiving, unsent) != open.seen;
            if heard {
                open.seen = (received, receiving, unsent);
                open.unchanged_since = now;
            }
            if counters.evicted() || !counters.regions.is_empty() {
                continue;
            }
            if counters.in_flight.load(Relaxed) == 0 {
                if !heard
                    && now.saturating_duration_since(open.unchanged_since) >= quiet
                    && victim.is_none_or(|(since, _)| open.unchanged_since < since)
                {
                    victim = Some((open.unchanged_since, counters));
                }
            } else if !progressed
                && stalled.is_some_and(|stalled| {
                    now.saturating_duration_since(open.stalled_since) >= stalled
                })
                && busy_victim.is_none_or(|(since, _)| open.stalled_since < since)
            {
                busy_victim = Some((open.stalled_since, counters));
            }
        }
        let chosen = match (victim, busy_victim) {
            (Some((_, counters)), _) => Some((counters.clone(), false)),
            (None, Some((_, counters))) => Some((counters.clone(), true)),
            (None, None) => None,
        };
        let Some((counters, busy)) = chosen else {
            state.no_search_before = Some(now + (quiet / 4).min(Duration::from_secs(1)));
            return None;
        };
        state.no_search_before = None;
        state.evicting += 1;
        // Marked under the lock: another listener's accept loop searching at once
        // cannot choose it too.
        counters.evicted_stalled.store(busy, Relaxed);
        counters.evicted.store(true, Relaxed);
        drop(state);
        counters.evict.cancel();
        Some((counters.peer.clone(), busy))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RegistryState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A connection's place in the [`Registry`]; leaving it adds the connection's counts
/// to the closed totals.
#[derive(Debug)]
pub(crate) struct Entry {
    registry: Arc<Registry>,
    id: u64,
    counters: Arc<ConnectionCounters>,
}

impl Entry {
    /// Counts the connection as closed for an error of its peer's.
    pub(crate) fn count_refusal(&self) {
        self.registry.refused_for_errors.fetch_add(1, Relaxed);
    }

    /// Counts a request refused for the server's budget of large requests.
    pub(crate) fn count_over_budget(&self) {
        self.registry.refused_over_budget.fetch_add(1, Relaxed);
    }

    /// The counters the connection task publishes into.
    pub(crate) fn counters(&self) -> Arc<ConnectionCounters> {
        self.counters.clone()
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        let mut state = self.registry.lock();
        if let Some(open) = state.open.remove(&self.id) {
            if open.counters.evicted() {
                state.evicting -= 1;
            }
            state.closed.add(&open.counters.counts());
            state.closed_count += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closed_connections_keep_counting_in_the_totals() {
        let registry = Arc::new(Registry::default());
        let open = |peer| {
            registry.open(
                Arc::new(Peer::new(peer)),
                CancellationToken::new(),
                Arc::default(),
            )
        };
        let a = open("tcp://10.0.0.1:1");
        let b = open("udp://10.0.0.2:2");
        let mut counts = Counts::default();
        counts.received(100);
        counts.sent(40);
        counts.requests = 1;
        counts.in_flight = 1;
        a.counters().publish(&counts);
        let open = registry.connections();
        assert_eq!(open.len(), 2);
        assert_eq!(open[0].peer.description(), "tcp://10.0.0.1:1");
        assert_eq!((open[0].bytes_received, open[0].bytes_sent), (100, 40));
        assert_eq!(open[0].in_flight, 1);
        assert_eq!(open[1].frames_received, 0);
        drop(a);
        let stats = registry.stats();
        assert_eq!(registry.connections().len(), 1);
        assert_eq!((stats.connections_opened, stats.connections_closed), (2, 1));
        assert_eq!(
            (stats.bytes_received, stats.frames_sent, stats.requests),
            (100, 1, 1)
        );
        drop(b);
        assert!(registry.connections().is_empty());
    }

    /// The connection chosen at the limit: not one heard since the last look (it
    /// counts as heard then: a frame received, or more of a frame partly received),
    /// not one with anything in flight or exposed, not one chosen already; the one
    /// unchanged longest of the others. Its token is cancelled.
    #[test]
    fn eviction_takes_a_quiet_connection_with_nothing_in_flight() {
        let registry = Arc::new(Registry::default());
        let open = |peer| {
            let token = CancellationToken::new();
            let regions = Arc::new(Regions::default());
            let entry = registry.open(Arc::new(Peer::new(peer)), token.clone(), regions.clone());
            (entry, token, regions)
        };
        let (silent, silent_token, _) = open("tcp://10.0.0.1:1");
        let (talker, talker_token, _) = open("tcp://10.0.0.2:1");
        let (busy, busy_token, _) = open("tcp://10.0.0.3:1");
        let (exposing, _, regions) = open("tcp://10.0.0.4:1");
        let (uploading, uploading_token, _) = open("tcp://10.0.0.5:1");
        // What the connection task publishes: frames received so far, calls in flight.
        let heard = |entry: &Entry, frames, in_flight| {
            let mut counts = Counts::default();
            for _ in 0..frames {
                counts.received(10);
            }
            counts.in_flight = in_flight;
            entry.counters().publish(&counts);
        };
        // A frame arriving slowly, and an answer leaving slowly: more of each before
        // each look.
        let (downloading, downloading_token, _) = open("tcp://10.0.0.6:1");
        let upload = |bytes| {
            uploading.counters().publish(&Counts {
                receiving: bytes,
                ..Counts::default()
            });
            downloading.counters().publish(&Counts {
                unsent: 1000 - bytes,
                ..Counts::default()
            });
        };
        heard(&talker, 1, 0);
        heard(&busy, 1, 1);
        let bulk = crate::bulk::Bulk::new(regions, Arc::new(|_| Ok(())), Arc::default(), 1 << 20);
        let exposed = bulk
            .expose_read(bytes::Bytes::from_static(b"x"), Duration::from_secs(60))
            .unwrap();
        let peer = |p: Option<Arc<Peer>>| p.map(|p| p.description().to_owned());
        let evict = || peer(registry.evict_quiet(Duration::ZERO, None).map(|(p, _)| p));

        // The silent one; the talker was heard since the last look (there was none).
        upload(1);
        assert_eq!(evict().as_deref(), Some("tcp://10.0.0.1:1"));
        assert!(silent_token.is_cancelled() && silent.counters().evicted());
        assert!(!talker_token.is_cancelled());
        // Unchanged since that look, the talker goes next; then no one qualifies.
        upload(2);
        assert_eq!(evict().as_deref(), Some("tcp://10.0.0.2:1"));
        assert!(talker_token.is_cancelled());
        upload(3);
        assert_eq!(evict(), None);
        // Its call answered, the busy one qualifies (the one exposing still does not).
        heard(&busy, 2, 0);
        upload(4);
        assert_eq!(evict(), None, "heard since the last look");
        upload(5);
        assert_eq!(evict().as_deref(), Some("tcp://10.0.0.3:1"));
        assert!(busy_token.is_cancelled());
        upload(6);
        assert_eq!(evict(), None);
        // Its buffer revoked, the one exposing goes too.
        drop(exposed);
        upload(7);
        assert_eq!(evict().as_deref(), Some("tcp://10.0.0.4:1"));
        assert!(!uploading_token.is_cancelled() && !downloading_token.is_cancelled());
        // Both stall: nothing more of the frame, nothing more written, since the last
        // look. The one that has been quiet longer (by the order of their last
        // changes, here the same look) goes first, then the other.
        let first = evict().unwrap();
        let second = evict().unwrap();
        let mut both = [first, second];
        both.sort();
        assert_eq!(both, ["tcp://10.0.0.5:1", "tcp://10.0.0.6:1"]);
        assert_eq!(evict(), None);
        drop(exposing);
    }

    /// With `stalled`, failing a quiet connection, the one whose calls made no progress
    /// longest (PINGs and PONGs are none), seen so at two looks `stalled` apart; it is
    /// marked stalled (it closes with its calls), a quiet one is not.
    #[test]
    fn eviction_takes_a_stalled_connection_when_none_is_quiet() {
        let registry = Arc::new(Registry::default());
        let open = |peer| {
            let token = CancellationToken::new();
            let entry = registry.open(Arc::new(Peer::new(peer)), token.clone(), Arc::default());
            (entry, token)
        };
        let (pinging, pinging_token) = open("tcp://10.0.0.1:1");
        let (working, working_token) = open("tcp://10.0.0.2:1");
        let publish = |entry: &Entry, frames: u64, keepalive: u64| {
            let mut counts = Counts::default();
            for _ in 0..frames {
                counts.received(10);
            }
            counts.keepalive = keepalive;
            counts.in_flight = 1;
            entry.counters().publish(&counts);
        };
        let evict = || {
            registry
                .evict_quiet(Duration::ZERO, Some(Duration::ZERO))
                .map(|(peer, busy)| (peer.description().to_owned(), busy))
        };
        publish(&pinging, 1, 0);
        publish(&working, 1, 0);
        assert_eq!(evict(), None, "the first look notes the counts");
        // One frame more each: a PING on the one, a call's frame on the other.
        publish(&pinging, 2, 1);
        publish(&working, 2, 0);
        assert_eq!(evict(), Some(("tcp://10.0.0.1:1".to_owned(), true)));
        assert!(pinging_token.is_cancelled() && pinging.counters().evicted_stalled());
        assert!(!working_token.is_cancelled() && !working.counters().evicted_stalled());
        // Nothing more from the other: stalled since the last look.
        assert_eq!(evict(), Some(("tcp://10.0.0.2:1".to_owned(), true)));
        // A quiet one is taken as quiet, not stalled.
        let (idle, _) = open("tcp://10.0.0.3:1");
        assert_eq!(evict(), Some(("tcp://10.0.0.3:1".to_owned(), false)));
        assert!(idle.counters().evicted() && !idle.counters().evicted_stalled());
    }
}

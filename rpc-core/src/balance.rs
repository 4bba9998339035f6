//! [`Balanced`]: one client over several replicas of a service, as a drop-in for a
//! single [`Channel`].
//!
//! Each call goes to a replica with a connection ([`Channel::is_connected`]; every
//! replica's channel starts connecting when it is added, and those without a
//! connection are told to make one as calls pass them over, a failed connect ejecting
//! the replica as a call that could not be sent would; only when none has one does a
//! call go to a replica still connecting; over UDP a channel is connected as soon as
//! its socket is), the less loaded of two picked at
//! random ("power of two choices"), where load is the replica's calls in flight right
//! now, counted by this client: a real measure, so a slow or overloaded replica gets fewer calls
//! (and when both picks carry more than twice the least loaded replica's load plus 2,
//! that one gets the call: replicas that stopped answering, whose calls pile up, are
//! passed over even when both picks are such); each call
//! in a row (up to three) that failed as a dead replica's would adds 2 to it for a
//! second after the last, so a retry or a hedge after a timeout goes to another idle
//! replica rather than back to the one that timed out; calls its server answers
//! `INTERNAL`, `UNKNOWN` or `DATA_LOSS` weigh the same (but never eject it), so that a
//! replica failing every call in a millisecond, with the fewest calls in flight, does
//! not win most choices. A replica
//! whose connection cannot be made (a call fails as
//! [unprocessed](crate::Status::is_unprocessed)), or whose calls fail
//! [`EJECT_AFTER_FAILURES`] times in a row with `UNAVAILABLE` or `DEADLINE_EXCEEDED`
//! (a host that went silent; only while at most half of the set is ejected then, so
//! that failures all replicas share do not send every call to one), is ejected for a
//! while, then probed again with real calls; each ejection after another with no successful call in between lasts longer
//! (the base time once more each time, up to [`MAX_EJECTION_MULTIPLIER`] times it), so
//! a replica that keeps failing its probes costs fewer calls each round. While every
//! replica is ejected, calls still go to the least recently ejected one, so a
//! recovering service is noticed.
//!
//! A unary call that never reached its replica (the connection could not be made, or
//! the server turned it away unprocessed: a GOAWAY, a shutdown, or on the gRPC wire a
//! stream refused with REFUSED_STREAM, which counts toward the ejection threshold like
//! an `UNAVAILABLE` instead of ejecting the replica at once; a graceful GOAWAY, which
//! a server's idle timeout sends too, counts for neither, unless it came on a
//! connection the server had not served yet: a replica that accepts every connection
//! and turns it away at once, draining for good, counts it as a REFUSED_STREAM, and is
//! weighed down, then ejected and probed again later, as a failing one) is sent on to another
//! live replica at once, up to two more, within the call's own deadline: it ran
//! nowhere, so this is safe for any method, and the caller does not see a replica
//! that went away (gRPC's "transparent retry"). A streaming call goes on the same way
//! when its connection could not be made, since none of its messages was taken then;
//! refused later (a GOAWAY), it fails, as its messages may have been taken already,
//! and with a [retry policy](crate::retry) the caller may try again.
//!
//! **A call's attempts stay on one replica.** A retry of a call that carries a call
//! key (a method with side effects under a [retry layer](crate::retry) with
//! `at_most_once`: `docs/semantics.md`), after an attempt that may have run, goes to
//! the replica that attempt went to (by its address) while that replica is in the
//! set, ejected or not: only its duplicate cache knows the call, so a retry after a
//! lost answer is answered from it instead of running the method again elsewhere. A
//! retry goes elsewhere only when that replica has left the set. One it turns away
//! unprocessed (its connection cannot be made, a GOAWAY) is not sent on to another,
//! unlike a first attempt: this attempt ran nowhere, but the earlier one may have run
//! there, and another replica would run the call again; it fails, and the retry
//! layer tries that replica again, within its attempts and the call's deadline. Under
//! a retry layer the replica is kept with the call (its attempts share it) for as long
//! as the call lasts, whatever other calls do; and for keys the application repeats
//! itself (in later calls), the replicas of the last [`AFFINITY_CALLS`] keyed calls
//! whose attempt failed that way are remembered (a repeat that succeeds frees its
//! call's place).
//!
//! Replicas are added and removed with [`Balanced::apply`], fed by discovery (a
//! [`Change`] stream, [`Balanced::follow`]) or by hand. Following discovery never
//! empties the set: when discovery stops listing every replica (registrations that
//! expired because the replicas lost the registry, not because they died), the last
//! known ones are kept until it lists one again.
//!
//! **Waiting for the first replica.** Right after a client starts following discovery
//! it may know no replica yet. A call then waits for one, up to
//! [`Balanced::wait_for_ready`] ([`DEFAULT_WAIT_FOR_READY`] by default) or its own
//! deadline, whichever comes first, instead of failing at once; after that it fails
//! with `UNAVAILABLE` (or `DEADLINE_EXCEEDED`, if its deadline came first; marked
//! unprocessed either way). The `UNAVAILABLE` carries a
//! [`Pushback::Stop`](crate::retry::Pushback): a retry layer does not try again, as its
//! attempts would each wait as long again. The wait is the call's
//! (`poll_ready` is ready at once when no replica is known), so that it knows the
//! call's deadline. `wait_for_ready(None)` fails at once, as gRPC's default "fail
//! fast" does.
//!
//! [`Channel`]: crate::client::Channel

use std::{
    collections::{hash_map::RandomState, HashMap, VecDeque},
    fmt,
    hash::{BuildHasher, Hasher},
    sync::{
        atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering},
        Arc, Mutex, RwLock,
    },
    task::{Context, Poll},
    time::Duration,
};

use futures::future::BoxFuture;
use tokio::{sync::Notify, time::Instant};
use tower::Service;

use crate::{
    client::{Channel, ClientCall, ClientReply},
    endpoint::Endpoint,
    frame::CallKey,
    Error, Status,
};

/// Calls in a row failing with `UNAVAILABLE` or `DEADLINE_EXCEEDED` after which a
/// replica is ejected (one unreachable connect is enough), as long as at most half of
/// the set is ejected then (gRPC's outlier detection has `max_ejection_percent` for
/// this): failures every replica shares (a slow dependency, a deadline too short for
/// a method) do not eject all but one, which then took every call. A replica whose
/// connection cannot be made is ejected whatever the share.
pub const EJECT_AFTER_FAILURES: usize = 3;

/// How long a replica's failures in a row weigh on its load when calls are spread
/// (2 each, up to three): long enough for a retry or hedge of the call that failed to
/// go elsewhere, short enough that a replica with a transient failure is soon picked
/// again at low concurrency (a weight kept until a success would starve it of calls,
/// and of the chance to succeed or be ejected).
const FAILURE_WEIGHS_FOR_MS: u64 = 1000;

/// The two choices' winner gives way to the least loaded replica when its load is
/// more than this many times that one's plus [`OVERLOAD_MARGIN`]: replicas whose calls
/// pile up (hung, or far slower) are passed over even when both picks are such.
const OVERLOAD_FACTOR: usize = 2;

/// See [`OVERLOAD_FACTOR`]; also the load up to which the two choices stand unchecked
/// (no walk over every replica while loads are low).
const OVERLOAD_MARGIN: usize = 2;

/// How long a replica that could not be reached is left out before it is tried again
/// (its first ejection; see [`MAX_EJECTION_MULTIPLIER`]).
pub const DEFAULT_EJECTION: Duration = Duration::from_secs(2);

/// A replica's `n`th ejection in a row (no call succeeded since the one before) lasts
/// `n` times the base ejection time, up to this many times it (as gRPC's outlier
/// detection grows its ejections, to its `max_ejection_time`).
pub const MAX_EJECTION_MULTIPLIER: u32 = 10;

/// How long a call waits for a replica while none is known (a client that has just
/// started following discovery): long enough for a first lookup, short enough that a
/// service with no replica at all is reported promptly.
pub const DEFAULT_WAIT_FOR_READY: Duration = Duration::from_secs(5);

/// How many keyed calls' replicas a [`Balanced`] remembers for keys the application
/// repeats itself in later calls (see the module docs; within one call of a retry
/// layer its attempts keep their replica for as long as it lasts, whatever other calls
/// do): those of
/// the last keyed calls whose attempt failed after it may have run, oldest forgotten
/// first. First attempts that succeed take no room (and no lock); a repeat that
/// succeeds frees its call's place. At a thousand such failures a second, a repeat
/// within four seconds still finds its replica.
pub const AFFINITY_CALLS: usize = 4096;

/// A change in the set of a service's replicas, as discovery reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// A replica appeared; for an endpoint already in the set, it registered again (a
    /// replica restarted at the same address before its old registration expired),
    /// which ends its ejection: it is tried again at once.
    Insert(Endpoint),
    /// A replica went away.
    Remove(Endpoint),
}

/// Makes a (lazily connecting) channel to one replica; implemented by transports.
pub trait MakeChannel: Send + Sync + 'static {
    /// A channel to `endpoint`, or an error if this transport cannot reach it.
    fn make_channel(&self, endpoint: &Endpoint) -> Result<Channel, Error>;
}

impl<F> MakeChannel for F
where
    F: Fn(&Endpoint) -> Result<Channel, Error> + Send + Sync + 'static,
{
    fn make_channel(&self, endpoint: &Endpoint) -> Result<Channel, Error> {
        self(endpoint)
    }
}

struct Replica {
    endpoint: Endpoint,
    channel: Channel,
    in_flight: Arc<AtomicUsize>,
    /// Ejected until this many milliseconds after `epoch`; 0 when not ejected.
    ejected_until_ms: Arc<AtomicU64>,
    /// Cleared by a health check that did not answer `SERVING`.
    healthy: AtomicBool,
    /// Calls in a row that failed as a dead replica's would (`UNAVAILABLE`,
    /// `DEADLINE_EXCEEDED`); a success resets it.
    failures: Arc<AtomicUsize>,
    /// When the last of those failures came, in milliseconds after `epoch`: they
    /// weigh on the replica's load for [`FAILURE_WEIGHS_FOR_MS`] after it.
    failed_at_ms: AtomicU64,
    /// Ejections since the last successful call: how long the next one lasts.
    ejections: AtomicU32,
    /// Its channel's failed connects, as last seen by a pick: one more is an
    /// unreachable replica, ejected as a call that could not be sent would make it.
    connect_failures: AtomicU64,
}

/// Called with a replica's endpoint when it is ejected.
type EjectionHook = Arc<dyn Fn(&Endpoint) + Send + Sync>;

struct Shared {
    make: Box<dyn MakeChannel>,
    replicas: RwLock<Arc<Vec<Arc<Replica>>>>,
    ejection: Duration,
    epoch: Instant,
    on_ejection: RwLock<Option<EjectionHook>>,
    /// Calls waiting for a first replica, woken when one is added. A waiting call
    /// that gives up (its wait or deadline over, its future dropped) leaves nothing
    /// behind: a `Vec` of wakers kept every such call's waker, and with it its task,
    /// until a replica came, and was walked on every wait.
    added: Notify,
    /// The replica each recent keyed call was sent to.
    affinity: Mutex<Affinity>,
    /// Inserts past [`MAX_REPLICAS`] were refused since the list was last under it
    /// (logged once).
    over_limit: AtomicBool,
    /// Held while a replica is ejected for failing calls (`Balanced::attempt`), so
    /// that the share of the set ejected is counted one decision at a time.
    ejecting: Mutex<()>,
    /// Endpoints inserted past [`MAX_REPLICAS`], oldest first, up to as many again:
    /// the next to take a place a removal frees (discovery reports each endpoint once,
    /// so one dropped here would never be used). Locked inside `replicas`' lock.
    waiting: Mutex<VecDeque<Endpoint>>,
    /// Tasks that serve this set alone (following discovery), aborted when the last
    /// clone of the set is dropped ([`Balanced::stop_with`]).
    tasks: Mutex<Vec<tokio::task::AbortHandle>>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        for task in self
            .tasks
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            task.abort();
        }
    }
}

impl Shared {
    /// The replicas as they are now.
    fn snapshot(&self) -> Arc<Vec<Arc<Replica>>> {
        self.replicas
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Milliseconds since `epoch`, plus one (0 means "not ejected").
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64 + 1
    }

    /// Whether one more replica may be ejected for failing calls: only while at least
    /// half of the set would stay in (see [`EJECT_AFTER_FAILURES`]; one of two may go).
    fn may_eject_for_failures(&self) -> bool {
        let now = self.now_ms();
        let replicas = self.snapshot();
        // Replicas without a connection count as out too: they take no calls while
        // others have one (`pick_in`), so ejecting half of the connected ones would
        // leave every call to the unreachable (from a review).
        let out = replicas
            .iter()
            .filter(|r| {
                r.ejected_until_ms.load(Ordering::Relaxed) > now || !r.channel.is_connected()
            })
            .count();
        (out + 1) * 2 <= replicas.len()
    }

    /// Ejects `replica` as unreachable (its connection could not be made), unless it
    /// is ejected already: for the base time, longer after each ejection in a row,
    /// counted from `failed_ms`; calls the ejection hook (read here, when a replica is
    /// ejected, not on every call). Returns whether it did.
    fn eject_unreachable(
        &self,
        replica: &Replica,
        failed_ms: u64,
        cause: &dyn fmt::Display,
    ) -> bool {
        let until = replica.ejected_until_ms.load(Ordering::Relaxed);
        let nth = replica.ejections.load(Ordering::Relaxed).saturating_add(1);
        let ejection = self
            .ejection
            .saturating_mul(nth.min(MAX_EJECTION_MULTIPLIER));
        let ejected_until = failed_ms.saturating_add(ejection.as_millis() as u64);
        if until > failed_ms
            || replica
                .ejected_until_ms
                .compare_exchange(until, ejected_until, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return false;
        }
        replica.ejections.store(nth, Ordering::Relaxed);
        tracing::warn!(replica = %replica.endpoint, ejected_for = ?ejection, status = %cause, "replica ejected: calls go to the others until it ends");
        let hook = self
            .on_ejection
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let Some(hook) = hook {
            hook(&replica.endpoint);
        }
        true
    }
}

/// How long after discovery removed a replica it is called back when discovery then
/// lists none at all ([`LastKnown`]).
const KEEP_REMOVED_FOR: Duration = Duration::from_secs(30);

/// What [`Balanced::follow`] does when discovery stops listing every replica: it keeps
/// the last known ones instead of emptying the set. Registrations expire when the
/// replicas cannot reach the registry, not only when they die: a partition between
/// etcd and the replicas, which clients still reach, emptied every client's set and
/// failed every call while every replica was up (a review). So the removal that would
/// empty the set is held back, and the replicas removed in the [`KEEP_REMOVED_FOR`]
/// before it are added back; calls go on to them (those that are gone fail to
/// connect, and are ejected, as any unreachable replica). The first replica
/// discovery lists again ends it: the held-back ones are removed then, unless listed.
/// (gRPC's xDS and Envoy keep their endpoints likewise, in their "panic" mode.)
#[derive(Default)]
struct LastKnown {
    /// Replicas kept although discovery no longer lists them.
    kept: Vec<Endpoint>,
    /// Replicas removed lately, oldest first, and when.
    removed: VecDeque<(Instant, Endpoint)>,
}

impl LastKnown {
    /// The changes to apply to `set` for `change`.
    fn filter(&mut self, set: &Balanced, change: Change) -> Vec<Change> {
        let now = Instant::now();
        while self
            .removed
            .front()
            .is_some_and(|(at, _)| now.duration_since(*at) > KEEP_REMOVED_FOR)
        {
            self.removed.pop_front();
        }
        match change {
            Change::Insert(endpoint) => {
                self.removed.retain(|(_, e)| *e != endpoint);
                let mut changes: Vec<Change> = std::mem::take(&mut self.kept)
                    .into_iter()
                    .filter(|kept| *kept != endpoint)
                    .map(Change::Remove)
                    .collect();
                if !changes.is_empty() {
                    tracing::info!(replica = %endpoint, "discovery lists a replica again: the replicas kept while it listed none go");
                }
                changes.insert(0, Change::Insert(endpoint));
                changes
            }
            Change::Remove(endpoint) => {
                if !self.kept.is_empty() {
                    if !self.kept.contains(&endpoint) {
                        self.kept.push(endpoint);
                    }
                    return Vec::new();
                }
                let endpoints = set.endpoints();
                if endpoints.iter().any(|e| *e != endpoint) || !endpoints.contains(&endpoint) {
                    self.removed.push_back((now, endpoint.clone()));
                    if self.removed.len() > MAX_REPLICAS {
                        self.removed.pop_front();
                    }
                    return vec![Change::Remove(endpoint)];
                }
                // The last one: discovery lists none any more.
                let back: Vec<Endpoint> = self.removed.drain(..).map(|(_, e)| e).collect();
                tracing::warn!(
                    replica = %endpoint,
                    kept = back.len() + 1,
                    "discovery lists no replica any more (expired registrations: the replicas may have lost the registry, not died): calling the last known ones until it lists one again"
                );
                self.kept = back.clone();
                self.kept.push(endpoint);
                back.into_iter().map(Change::Insert).collect()
            }
        }
    }
}

/// Replicas a [`Balanced`] keeps at most: discovery that lists more (a misconfigured
/// or hostile registry, a DNS name with thousands of addresses) has the rest wait,
/// with a warning, instead of a channel, a task and a place in every pick each; as
/// many again wait (their endpoints only), and take the places removals free, oldest
/// first. Past that, inserts are ignored.
pub const MAX_REPLICAS: usize = 4096;

/// The replica (its address) of each of the last [`AFFINITY_CALLS`] keyed calls whose
/// attempt failed after it may have run, by the call's client and number.
#[derive(Default)]
struct Affinity {
    replicas: HashMap<(u128, u64), Endpoint>,
    /// The calls in `replicas`, oldest first.
    order: VecDeque<(u128, u64)>,
}

impl Affinity {
    fn remember(&mut self, key: &CallKey, replica: &Endpoint) {
        let call = (key.client, key.call);
        if self.replicas.insert(call, replica.clone()).is_none() {
            self.order.push_back(call);
        }
        while self.order.len() > AFFINITY_CALLS {
            if let Some(oldest) = self.order.pop_front() {
                self.replicas.remove(&oldest);
            }
        }
    }

    /// Forgets the replica of the keyed call `key` (a repeat of it succeeded): a scan
    /// of at most [`AFFINITY_CALLS`], on that rare path only.
    fn forget(&mut self, key: &CallKey) {
        let call = (key.client, key.call);
        if self.replicas.remove(&call).is_some() {
            self.order.retain(|kept| *kept != call);
        }
    }
}

/// A balanced client over the replicas of one service. Cheap to clone; clones share
/// the replicas and their load counts. See the [module docs](self).
///
/// ```
/// use rpc_core::balance::{Balanced, Change};
/// use rpc_core::{client::{Channel, Client}, link::mem, Endpoint, Request};
/// # use rpc_core::{method::{Idempotency, MethodDescriptor}, server::{Server, ServerCall, ServerReply}, Status};
/// # static SAY: MethodDescriptor = MethodDescriptor { service: "demo.Echo", method: "Say",
/// #     path: "demo.Echo/Say", idempotency: Idempotency::NoSideEffects };
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let echo = tower::service_fn(|call: ServerCall| async move {
/// #     Ok::<_, Status>(ServerReply { payload: call.payload.into(), ..ServerReply::default() })
/// # });
/// // Two replicas, in memory. With a transport, `make` is its own (for TCP,
/// // `rpc_transport_tcp::StreamChannels`), and discovery feeds `apply` (`follow`).
/// let (a, to_a) = mem::listener();
/// let (b, to_b) = mem::listener();
/// # tokio::spawn(Server::builder().add_named_service("demo.Echo", echo.clone()).serve(a));
/// # tokio::spawn(Server::builder().add_named_service("demo.Echo", echo).serve(b));
/// let first: Endpoint = "tcp://10.0.0.1:7000".parse()?;
/// let replica_a = first.clone();
/// let balanced = Balanced::new(move |endpoint: &Endpoint| {
///     let connector = if *endpoint == replica_a { to_a.clone() } else { to_b.clone() };
///     Ok::<_, rpc_core::Error>(Channel::builder().connect_lazy(connector))
/// });
/// balanced.apply(Change::Insert(first))?;
/// balanced.apply(Change::Insert("tcp://10.0.0.2:7000".parse()?))?;
/// // Used like one channel: by a generated client, or by `Client` here.
/// let mut client = Client::new(balanced.clone());
/// for _ in 0..4 {
///     client.unary::<_, String>(Request::new("hi".to_string()), &SAY).await?;
/// }
/// assert_eq!(balanced.endpoints().len(), 2);
/// # Ok(()) }
/// ```
pub struct Balanced {
    shared: Arc<Shared>,
    /// The replica picked by `poll_ready`, with its channel made ready, and whether
    /// the set had another replica then (see [`Pick`]).
    picked: Option<(Pick, Channel)>,
    /// How long a call waits while no replica is known.
    wait_for_ready: Option<Duration>,
}

impl Clone for Balanced {
    fn clone(&self) -> Self {
        Balanced {
            shared: self.shared.clone(),
            picked: None,
            wait_for_ready: self.wait_for_ready,
        }
    }
}

impl fmt::Debug for Balanced {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Balanced")
            .field("replicas", &self.endpoints())
            .finish_non_exhaustive()
    }
}

impl Balanced {
    /// A balanced client with no replicas yet; `make` opens channels to the ones
    /// [`apply`](Self::apply) adds.
    pub fn new(make: impl MakeChannel) -> Balanced {
        Balanced::with_ejection(make, DEFAULT_EJECTION)
    }

    /// Like [`new`](Self::new), with the time an unreachable replica is left out the
    /// first time (later ejections in a row last longer: [`MAX_EJECTION_MULTIPLIER`]).
    /// Default: [`DEFAULT_EJECTION`].
    pub fn with_ejection(make: impl MakeChannel, ejection: Duration) -> Balanced {
        Balanced {
            shared: Arc::new(Shared {
                make: Box::new(make),
                replicas: RwLock::new(Arc::new(Vec::new())),
                ejection,
                epoch: Instant::now(),
                on_ejection: RwLock::new(None),
                added: Notify::new(),
                affinity: Mutex::new(Affinity::default()),
                over_limit: AtomicBool::new(false),
                waiting: Mutex::new(VecDeque::new()),
                tasks: Mutex::new(Vec::new()),
                ejecting: Mutex::new(()),
            }),
            picked: None,
            wait_for_ready: Some(DEFAULT_WAIT_FOR_READY),
        }
    }

    /// How long a call waits for a replica while none is known; `None` fails at once
    /// with `UNAVAILABLE`. Applies to this handle and the clones made from it.
    /// Default: [`DEFAULT_WAIT_FOR_READY`].
    pub fn wait_for_ready(mut self, wait: Option<Duration>) -> Balanced {
        self.wait_for_ready = wait;
        self
    }

    /// Calls `hook` with a replica's endpoint each time it is ejected, for example to
    /// make discovery look again at once (`rpc_discovery_dns::Refresh::refresh`)
    /// instead of at its next interval. Replaces an earlier hook.
    pub fn on_ejection(&self, hook: impl Fn(&Endpoint) + Send + Sync + 'static) {
        *self
            .shared
            .on_ejection
            .write()
            .unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(hook));
    }

    /// A balanced client over a fixed list (`Endpoint::Static`'s members, or any list).
    pub fn from_endpoints(
        make: impl MakeChannel,
        endpoints: impl IntoIterator<Item = Endpoint>,
    ) -> Result<Balanced, Error> {
        let balanced = Balanced::new(make);
        for endpoint in endpoints {
            balanced.apply(Change::Insert(endpoint))?;
        }
        Ok(balanced)
    }

    /// Adds or removes a replica. Calls in flight on a removed replica finish there.
    pub fn apply(&self, change: Change) -> Result<(), Error> {
        let mut guard = self
            .shared
            .replicas
            .write()
            .unwrap_or_else(|e| e.into_inner());
        let mut next: Vec<Arc<Replica>> = guard.as_ref().clone();
        match change {
            Change::Insert(endpoint) => {
                if let Some(known) = next.iter().find(|r| r.endpoint == endpoint) {
                    // Registered again: a restarted replica, not the one ejected (from
                    // a review: one restarted on its address got no calls for 4 s, its
                    // old self's ejection running on).
                    known.ejected_until_ms.store(0, Ordering::Relaxed);
                    known.failures.store(0, Ordering::Relaxed);
                    known.ejections.store(0, Ordering::Relaxed);
                    return Ok(());
                }
                if next.len() >= MAX_REPLICAS {
                    if !self.shared.over_limit.swap(true, Ordering::Relaxed) {
                        tracing::warn!(
                            %endpoint,
                            limit = MAX_REPLICAS,
                            "discovery lists more replicas than a balanced client keeps: \
                             the others wait for a place"
                        );
                    }
                    let mut waiting = self
                        .shared
                        .waiting
                        .lock()
                        .unwrap_or_else(|e| e.into_inner());
                    if waiting.len() < MAX_REPLICAS && !waiting.contains(&endpoint) {
                        waiting.push_back(endpoint);
                    }
                    return Ok(());
                }
                next.push(self.new_replica(endpoint)?);
            }
            Change::Remove(endpoint) => {
                let before = next.len();
                next.retain(|r| r.endpoint != endpoint);
                let mut waiting = self
                    .shared
                    .waiting
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                if next.len() == before {
                    waiting.retain(|e| *e != endpoint);
                }
                // A place freed: the endpoint that waited longest takes it.
                while next.len() < MAX_REPLICAS {
                    let Some(endpoint) = waiting.pop_front() else {
                        break;
                    };
                    match self.new_replica(endpoint) {
                        Ok(replica) => next.push(replica),
                        Err(err) => {
                            tracing::warn!(error = %err, "discovery reported a replica this client cannot reach");
                        }
                    }
                }
                if next.len() < MAX_REPLICAS {
                    self.shared.over_limit.store(false, Ordering::Relaxed);
                }
            }
        }
        let added = next.len() > guard.len();
        *guard = Arc::new(next);
        drop(guard);
        if added {
            self.shared.added.notify_waiters();
        }
        Ok(())
    }

    /// A new replica at `endpoint`, with its channel, which starts connecting at once
    /// (calls go to replicas with a connection first: see [`pick_in`](Self::pick_in)).
    fn new_replica(&self, endpoint: Endpoint) -> Result<Arc<Replica>, Error> {
        let channel = self.shared.make.make_channel(&endpoint)?;
        channel.connect_idle();
        Ok(Arc::new(Replica {
            endpoint,
            channel,
            in_flight: Arc::new(AtomicUsize::new(0)),
            ejected_until_ms: Arc::new(AtomicU64::new(0)),
            healthy: AtomicBool::new(true),
            failures: Arc::new(AtomicUsize::new(0)),
            failed_at_ms: AtomicU64::new(0),
            ejections: AtomicU32::new(0),
            connect_failures: AtomicU64::new(0),
        }))
    }

    /// Applies discovery's changes as they come (see [`crate::discover::resolve`]),
    /// until the stream ends, or a change comes after every clone of this set was
    /// dropped. Returns the future that does it, for the caller to run (spawn it);
    /// dropping it stops following. A removal that would empty the set is held back:
    /// the last known replicas (that one, and those removed in the 30 s before it) stay
    /// until discovery lists one again, with a warning (see the module docs). It does
    /// not keep the set alive: hand its task to
    /// [`stop_with`](Self::stop_with) to have it aborted when the set goes, so that a
    /// quiet discovery stream (a watch of etcd) is not kept for nothing.
    pub fn follow(
        &self,
        changes: impl futures::Stream<Item = Change> + Send + 'static,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let shared = Arc::downgrade(&self.shared);
        let wait_for_ready = self.wait_for_ready;
        async move {
            futures::pin_mut!(changes);
            let mut last = LastKnown::default();
            while let Some(change) = futures::StreamExt::next(&mut changes).await {
                let Some(shared) = shared.upgrade() else {
                    return; // nobody calls through the set any more
                };
                let balanced = Balanced {
                    shared,
                    picked: None,
                    wait_for_ready,
                };
                for change in last.filter(&balanced, change) {
                    if let Err(err) = balanced.apply(change) {
                        tracing::warn!(error = %err, "discovery reported a replica this client cannot reach");
                    }
                }
            }
        }
    }

    /// Aborts `task` when the last clone of this set is dropped: a task that serves
    /// the set alone, such as [`follow`](Self::follow)'s (`rpc-connect` hands it the
    /// tasks it spawns for `dns://` and `etcd://` sets; a client made and dropped per
    /// tenant or per reload left its discovery watch and lookups running for ever).
    pub fn stop_with(&self, task: tokio::task::AbortHandle) {
        self.shared
            .tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(task);
    }

    /// Health-checks every replica every `interval` with the standard
    /// `grpc.health.v1.Health/Check` (for `service`; `""` is the server as a whole),
    /// and leaves out those that do not answer `SERVING` within `timeout` (the wait
    /// for room on the replica's channel included) until a later check says they do.
    /// With none answering `SERVING`, calls are spread over all replicas not ejected.
    /// Returns the future that does it, for the caller to spawn; dropping it stops
    /// checking (and keeps the last verdicts), and it ends by itself when the last
    /// clone of the set is dropped (it holds none between checks; hand its task to
    /// [`stop_with`](Self::stop_with) to stop a check in progress then too).
    /// `rpc_connect`'s `ConnectOptions::health_check` sets this up.
    pub fn health_checks(
        &self,
        service: &str,
        interval: Duration,
        timeout: Duration,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let shared = Arc::downgrade(&self.shared);
        let request = crate::payload::encode(&HealthCheckRequest {
            service: service.to_owned(),
        });
        async move {
            loop {
                let Some(replicas) = shared.upgrade().map(|shared| shared.snapshot()) else {
                    return;
                };
                let checks = replicas.iter().map(|replica| {
                    let mut channel = replica.channel.clone();
                    let payload = request.clone();
                    async move {
                        let call = ClientCall {
                            method: crate::ByteStr::from_static("grpc.health.v1.Health/Check"),
                            idempotency: crate::method::Idempotency::NoSideEffects,
                            metadata: crate::Metadata::new(),
                            timeout: Some(timeout),
                            call_key: None,
                            payload,
                            stream: None,
                            compress: None,
                        };
                        // The wait for the channel's room counts against the
                        // timeout too: a replica whose every in-flight slot is held by
                        // calls it never answers is not serving, and must not hold up
                        // the verdicts on the others.
                        let check = async {
                            let ready = tower::ServiceExt::ready(&mut channel).await.ok()?;
                            let reply = ready.call(call).await.ok()?;
                            <HealthCheckResponse as prost::Message>::decode(reply.payload).ok()
                        };
                        let serving = tokio::time::timeout(timeout, check)
                            .await
                            .ok()
                            .flatten()
                            .is_some_and(|r| r.status == SERVING);
                        if replica.healthy.swap(serving, Ordering::Relaxed) != serving {
                            tracing::info!(replica = %replica.endpoint, serving, "health changed");
                        }
                    }
                });
                futures::future::join_all(checks).await;
                drop(replicas);
                tokio::time::sleep(interval).await;
            }
        }
    }

    /// The replicas, in the order they were added.
    pub fn endpoints(&self) -> Vec<Endpoint> {
        self.snapshot().iter().map(|r| r.endpoint.clone()).collect()
    }

    /// Each replica with its load: the calls in flight on it (a streaming call counts
    /// until its stream ends).
    pub fn loads(&self) -> Vec<(Endpoint, usize)> {
        self.snapshot()
            .iter()
            .map(|r| (r.endpoint.clone(), r.in_flight.load(Ordering::Relaxed)))
            .collect()
    }

    fn snapshot(&self) -> Arc<Vec<Arc<Replica>>> {
        self.shared.snapshot()
    }

    fn now_ms(&self) -> u64 {
        self.shared.now_ms()
    }

    /// A replica for the next call (see [`pick_in`](Self::pick_in)).
    fn pick(&self) -> Option<Pick> {
        let replicas = self.snapshot();
        let others = replicas.len() > 1;
        self.pick_in(&replicas).map(|replica| (replica, others))
    }

    /// Power of two choices among the replicas not ejected and healthy whose channel
    /// is connected; if none is connected, among those not ejected and healthy; if none
    /// is healthy, among those not ejected (health checks failing everywhere say more
    /// about the checks, or a dependency all share, than about one replica: spreading
    /// the calls beats sending them all to the first); if all are ejected, the one
    /// whose ejection ends first. The live replicas without a connection are told to
    /// make one meanwhile ([`Channel::connect_idle`]; a replica backing off after a
    /// failed attempt waits for its backoff), so that they take calls once they have
    /// it. (Calls went to replicas still connecting, as gRPC's balancers do not: a
    /// registered replica that dropped every packet cost each call sent its way a
    /// connect timeout, or its deadline, while the others were ready: a churn review.)
    fn pick_in(&self, replicas: &[Arc<Replica>]) -> Option<Arc<Replica>> {
        let now = self.now_ms();
        let unejected = |r: &&Arc<Replica>| r.ejected_until_ms.load(Ordering::Relaxed) <= now;
        let is_live = |r: &&Arc<Replica>| unejected(r) && r.healthy.load(Ordering::Relaxed);
        let mut unconnected = false;
        for replica in replicas.iter().filter(unejected) {
            if replica.channel.is_connected() {
                continue;
            }
            unconnected = true;
            // A connect that failed since the last look: unreachable, ejected as a
            // call that could not be sent would have made it (its ejection hook, a
            // DNS look-up again, runs; no call needs to pay for finding out).
            let failures = replica.channel.connect_failures();
            if replica.connect_failures.swap(failures, Ordering::Relaxed) != failures {
                let cause = "its connection could not be made";
                if self.shared.eject_unreachable(replica, now, &cause) {
                    continue;
                }
            }
            replica.channel.connect_idle();
        }
        // In each tier, the replicas with a connection first.
        let choose = |tier: &dyn Fn(&&Arc<Replica>) -> bool| {
            unconnected
                .then(|| Self::two_choices(replicas, now, |r| tier(r) && r.channel.is_connected()))
                .flatten()
                .or_else(|| Self::two_choices(replicas, now, tier))
        };
        choose(&is_live).or_else(|| choose(&unejected)).or_else(|| {
            replicas
                .iter()
                .min_by_key(|r| r.ejected_until_ms.load(Ordering::Relaxed))
                .cloned()
        })
    }

    /// Power of two choices among the replicas `is_live` takes (`None` if none).
    fn two_choices(
        replicas: &[Arc<Replica>],
        now: u64,
        is_live: impl Fn(&&Arc<Replica>) -> bool,
    ) -> Option<Arc<Replica>> {
        // Counted and indexed in place: no allocation per call.
        let n = replicas.iter().filter(&is_live).count();
        if n == 0 {
            return None;
        }
        // Liveness is read again on the walk, and another task may eject a replica or a
        // health check mark one down in between: the walk then falls short, and any
        // replica will do for this call (it panicked here: `expect("k < n")`).
        let nth = |k: usize| {
            replicas
                .iter()
                .filter(&is_live)
                .nth(k)
                .unwrap_or(&replicas[k % replicas.len()])
        };
        if n == 1 {
            return Some(nth(0).clone());
        }
        let mut h = RandomState::new().build_hasher();
        h.write_u64(now);
        let random = h.finish();
        // Two different replicas, so a loaded one is never compared with itself.
        let i = (random % n as u64) as usize;
        let j = (i + 1 + ((random >> 32) % (n as u64 - 1)) as usize) % n;
        let (a, b) = (nth(i), nth(j));
        // Calls in flight, and 2 for each call in a row (up to 3) that failed as a
        // dead replica's would: a retry after a per-attempt timeout on a silent
        // replica, or a hedge, goes to the other of two idle replicas rather than back
        // to that one half the time (from a review), while a replica with one failure
        // still takes calls when the others are busier.
        let load = |r: &Arc<Replica>| {
            let failures = r.failures.load(Ordering::Relaxed);
            let recent = failures > 0
                && now
                    < r.failed_at_ms
                        .load(Ordering::Relaxed)
                        .saturating_add(FAILURE_WEIGHS_FOR_MS);
            r.in_flight.load(Ordering::Relaxed)
                + if recent {
                    2 * failures.min(EJECT_AFTER_FAILURES)
                } else {
                    0
                }
        };
        let (winner, winner_load) = if load(b) < load(a) {
            (b, load(b))
        } else {
            (a, load(a))
        };
        // Both picks may be replicas that stopped answering, whose calls pile up
        // until their deadlines: with two of four hung, one call in six went to one of
        // them whatever its load, and a client's calls all ended up waiting there
        // while the healthy two sat idle (from a review). A winner well above the
        // least loaded replica gives way to it (the first of the least loaded from
        // the first pick on, so ties do not always favour the same one).
        if winner_load > OVERLOAD_MARGIN {
            let least = replicas
                .iter()
                .filter(&is_live)
                .enumerate()
                .min_by_key(|&(k, r)| (load(r), (k + n - i) % n))
                .map_or(winner, |(_, r)| r);
            if winner_load > OVERLOAD_FACTOR * load(least) + OVERLOAD_MARGIN {
                return Some(least.clone());
            }
        }
        Some(winner.clone())
    }
}

impl Balanced {
    /// Waits until a replica is known.
    async fn replica(&self) {
        loop {
            let added = self.shared.added.notified();
            tokio::pin!(added);
            // Registered before the look, so that a replica added between the two
            // wakes it.
            added.as_mut().enable();
            if self.pick().is_some() {
                return;
            }
            added.await;
        }
    }

    /// `call`, which `poll_ready` found no replica for: waits for one up to the
    /// wait-for-ready time and the call's deadline, then sends it as any call, with
    /// what is left of its time budget.
    async fn call_when_ready(mut self, mut call: ClientCall) -> Result<ClientReply, Status> {
        let wait = self.wait_for_ready.unwrap_or_default();
        let start = Instant::now();
        let budget = call.timeout;
        let out_of_time = |what: &str| {
            let budget = budget.unwrap_or_default();
            Status::deadline_exceeded(format!("deadline of {budget:?} exceeded {what}"))
                .into_unprocessed()
        };
        let replica = self.replica();
        match budget {
            // The deadline comes first: it is what ends the wait.
            Some(budget) if budget < wait => {
                if tokio::time::timeout(budget, replica).await.is_err() {
                    return Err(out_of_time("waiting for a replica: none is known"));
                }
            }
            _ => {
                if tokio::time::timeout(wait, replica).await.is_err() {
                    // Not to be retried: a retry would wait again, and a call with no
                    // deadline under a retry layer would wait max_attempts times.
                    let status = Status::unavailable(format!(
                        "no replicas known after waiting {wait:?} for one"
                    ));
                    return Err(crate::retry::Pushback::Stop
                        .attach(status)
                        .into_unprocessed());
                }
            }
        }
        // Picked again by `poll_ready` (the set may have changed since), which also
        // waits for room on the replica's channel, within what is left of the budget
        // (without a budget, within what is left of the channel's default timeout, if
        // it has one).
        call.timeout = budget.map(|budget| budget.saturating_sub(start.elapsed()));
        crate::intercept::ready_within_budget(
            &mut call.timeout,
            "waiting for room on a replica's channel",
            std::future::poll_fn(|cx| self.poll_ready(cx)),
        )
        .await?;
        self.call(call).await
    }
}

impl Service<ClientCall> for Balanced {
    type Response = ClientReply;
    type Error = Status;
    type Future = BoxFuture<'static, Result<ClientReply, Status>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        if self.picked.is_none() {
            let Some(pick) = self.pick() else {
                return Poll::Ready(match self.wait_for_ready {
                    // The call waits for a replica (`call_when_ready`), within its
                    // own deadline, which only the call knows.
                    Some(_) => Ok(()),
                    None => Err(Status::unavailable("no replicas known yet").into_unprocessed()),
                });
            };
            let channel = pick.0.channel.clone();
            self.picked = Some((pick, channel));
        }
        let (_, channel) = self.picked.as_mut().expect("picked above");
        channel.poll_ready(cx)
    }

    fn call(&mut self, call: ClientCall) -> Self::Future {
        let Some(((replica, others), channel)) = self.picked.take() else {
            // `poll_ready` found no replica (or was not called): the call waits for one.
            return Box::pin(self.clone().call_when_ready(call));
        };
        // A retry after an attempt that may have run (the retry layer counts only
        // those in the key's attempt): to that attempt's replica, and to no other
        // even if that one turns it away unprocessed (its connection cannot be made,
        // a GOAWAY). This attempt ran nowhere then, but the earlier one may have run
        // there, and only that replica's duplicate cache knows it: another would run
        // the call again. The retry fails instead, and the retry layer tries that
        // replica again (or gives up) until it leaves the set.
        if let Some(key) = call.call_key.as_ref().filter(|key| key.attempt > 1) {
            if let Some(earlier) = self.affine(key) {
                if earlier.endpoint == replica.endpoint {
                    return self.send(replica, channel, call, false);
                }
                // The readiness of the replica picked instead goes with its channel.
                drop(channel);
                return Box::pin(self.clone().call_on(earlier, call, false));
            }
        }
        self.send(replica, channel, call, others)
    }
}

impl Balanced {
    /// The replica an earlier attempt of the keyed call `key` went to, if its address
    /// is in the set.
    fn affine(&self, key: &CallKey) -> Option<Arc<Replica>> {
        // Under a retry layer, the call's own slot first; else (or empty: a key the
        // application repeats across calls of the layer) the recent calls' table.
        let in_slot = crate::retry::call_shared().and_then(|shared| {
            shared
                .replica
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
        });
        let earlier = match in_slot {
            Some(earlier) => earlier,
            None => self
                .shared
                .affinity
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .replicas
                .get(&(key.client, key.call))
                .cloned()?,
        };
        self.snapshot()
            .iter()
            .find(|r| r.endpoint == earlier)
            .cloned()
    }

    /// Sends `call` to `replica`, once its channel has room (within the call's time
    /// budget, which loses the time waited).
    async fn call_on(
        self,
        replica: Arc<Replica>,
        mut call: ClientCall,
        others: bool,
    ) -> Result<ClientReply, Status> {
        let mut channel = replica.channel.clone();
        room_within(
            &mut channel,
            &mut call.timeout,
            "waiting for room on the channel of the replica that took the call's first attempt",
        )
        .await?;
        self.send(replica, channel, call, others).await
    }

    /// Sends `call` to `replica` over its ready `channel`, and on to other replicas if
    /// that one never saw it (see [`reroute`](Self::reroute)) and `others` says the
    /// set had another one.
    fn send(
        &self,
        replica: Arc<Replica>,
        channel: Channel,
        call: ClientCall,
        others: bool,
    ) -> BoxFuture<'static, Result<ClientReply, Status>> {
        // A call that never reached its replica can go to another: kept (a clone: its
        // metadata and payload segments copied, their bytes shared; a stream's
        // messages shared, handed back by a call refused before it was sent) only
        // while there is another to go to.
        let again = others.then(|| (call.clone(), self.clone()));
        let first = self.attempt(replica.clone(), channel, call);
        let Some((call, balanced)) = again else {
            return first;
        };
        // The call's time budget runs from here, as the first attempt's does.
        let start = Instant::now();
        Box::pin(async move {
            let result = first.await;
            if !matches!(&result, Err(status) if goes_on(status)) {
                return result;
            }
            balanced.reroute(call, start, replica, result).await
        })
    }
}

/// Replicas after the first a call that reached none of them is sent to (see
/// [`Balanced`]'s `call`): a call the first replica never saw (its connection could
/// not be made, or the server refused it unprocessed) goes to another at once, as
/// gRPC's transparent retry does, whatever the method (it ran nowhere).
const MAX_REROUTES: usize = 2;

/// A status the server answers for itself being broken rather than for the call
/// (`INTERNAL`, `UNKNOWN`, `DATA_LOSS`): weighs its replica down in the choice of two.
fn is_server_error(code: crate::Code) -> bool {
    matches!(
        code,
        crate::Code::INTERNAL | crate::Code::UNKNOWN | crate::Code::DATA_LOSS
    )
}

/// Whether a call that failed with `status` goes on to another replica: it never
/// reached its replica (unprocessed), and its deadline has not passed (a call whose
/// deadline passed before it was sent is unprocessed too, but out of time: a channel's
/// default timeout, which the set does not see, would start afresh on the next).
fn goes_on(status: &Status) -> bool {
    status.is_unprocessed() && status.code() != crate::Code::DEADLINE_EXCEEDED
}

/// A replica picked for a call, and whether the set held another one when it was
/// picked (only then is the call kept to be sent on, see [`MAX_REROUTES`]).
type Pick = (Arc<Replica>, bool);

impl Balanced {
    /// Sends `call`, which `first` never saw (`result`, unprocessed), to other live
    /// replicas, up to [`MAX_REROUTES`], within what is left of its time budget
    /// (counted from `start`, waiting for room on a channel included).
    async fn reroute(
        self,
        call: ClientCall,
        start: Instant,
        first: Arc<Replica>,
        mut result: Result<ClientReply, Status>,
    ) -> Result<ClientReply, Status> {
        let left = |call: &ClientCall| match call.timeout {
            None => Some(None),
            Some(timeout) => match timeout.checked_sub(start.elapsed()) {
                Some(left) if !left.is_zero() => Some(Some(left)),
                _ => None,
            },
        };
        let mut tried = vec![first];
        while matches!(&result, Err(status) if goes_on(status)) && tried.len() <= MAX_REROUTES {
            // A stream goes on only if its messages came back untouched (its
            // connection could not be made), not after a refusal that came later.
            if call.stream.as_ref().is_some_and(|s| !s.is_present()) {
                break;
            }
            let Some(next) = self.pick_untried(&tried) else {
                break;
            };
            let Some(mut budget) = left(&call) else { break };
            let mut channel = next.channel.clone();
            // What is left after the wait is the attempt's budget.
            if room_within(
                &mut channel,
                &mut budget,
                "waiting for room on a replica's channel",
            )
            .await
            .is_err()
            {
                break;
            }
            let mut attempt = call.clone();
            attempt.timeout = budget;
            tried.push(next.clone());
            result = self.attempt(next, channel, attempt).await;
        }
        result
    }

    /// A live replica (not ejected, healthy) not in `tried`, the least loaded.
    fn pick_untried(&self, tried: &[Arc<Replica>]) -> Option<Arc<Replica>> {
        let now = self.now_ms();
        self.snapshot()
            .iter()
            .filter(|r| {
                r.ejected_until_ms.load(Ordering::Relaxed) <= now
                    && r.healthy.load(Ordering::Relaxed)
                    && !tried.iter().any(|t| Arc::ptr_eq(t, r))
            })
            // A replica with a connection first: one that has none yet would make
            // the call wait for its connect (from a review).
            .min_by_key(|r| {
                (
                    !r.channel.is_connected(),
                    r.in_flight.load(Ordering::Relaxed),
                )
            })
            .cloned()
    }

    /// Sends `call` to `replica` over its ready `channel`, counting it in the
    /// replica's load and ejecting the replica if the outcome says it is unreachable.
    fn attempt(
        &self,
        replica: Arc<Replica>,
        mut channel: Channel,
        call: ClientCall,
    ) -> BoxFuture<'static, Result<ClientReply, Status>> {
        replica.in_flight.fetch_add(1, Ordering::Relaxed);
        // Counts the call until it finishes or is dropped.
        let counted = InFlight(replica.in_flight.clone());
        // A keyed attempt that fails after it may have run: its replica is where the
        // call's retry goes. Under a retry layer it is kept in the slot the call's
        // attempts share (read here, where the layer's task-local is set), gone with
        // the call; else in the table of recent keyed calls.
        let keyed = call.call_key;
        let call_shared = keyed.and_then(|_| crate::retry::call_shared());
        let response = channel.call(call);
        let now_ms = self.now_ms();
        let shared = self.shared.clone();
        Box::pin(async move {
            let mut result = response.await;
            // A stream counts as in flight until it ends, not just until its headers.
            match result.as_mut().ok().and_then(|reply| reply.stream.as_ref()) {
                Some(stream) => match stream.take() {
                    Some(mut body) => {
                        body.hold(Box::new(counted));
                        if let Ok(reply) = &mut result {
                            reply.stream = Some(crate::stream::TakeOnce::new(body));
                        }
                    }
                    None => drop(counted),
                },
                None => drop(counted),
            }
            match (&keyed, &result) {
                (Some(key), Err(status)) if !status.is_unprocessed() => {
                    // The call's own slot, which no other call's failures push out; and
                    // the table too, for a key the application repeats in a later call.
                    if let Some(call_shared) = &call_shared {
                        *call_shared
                            .replica
                            .lock()
                            .unwrap_or_else(|e| e.into_inner()) = Some(replica.endpoint.clone());
                    }
                    shared
                        .affinity
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .remember(key, &replica.endpoint);
                }
                // A repeat that succeeded: the call needs its replica no more (a first
                // attempt has nothing to forget, and takes no lock).
                (Some(key), Ok(_)) if key.attempt > 1 => shared
                    .affinity
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .forget(key),
                _ => {}
            }
            // An ejection for failing calls, which the share of the set ejected bounds.
            let mut for_failures = false;
            let eject = match &result {
                Ok(_) => {
                    replica.failures.store(0, Ordering::Relaxed);
                    replica.ejections.store(0, Ordering::Relaxed);
                    // The first success after an ejection ran out readmits the replica
                    // for the logs (picks use it again as soon as the ejection ends).
                    let until = replica.ejected_until_ms.load(Ordering::Relaxed);
                    if until != 0
                        && until <= now_ms
                        && replica
                            .ejected_until_ms
                            .compare_exchange(until, 0, Ordering::Relaxed, Ordering::Relaxed)
                            .is_ok()
                    {
                        tracing::info!(replica = %replica.endpoint, "replica readmitted: a call succeeded after its ejection");
                    }
                    false
                }
                // Turned away by a graceful GOAWAY (a drain, an idle timeout): neither.
                // (One on a connection the server never served, a replica that turns
                // every connection away, comes marked refused: a failure below.)
                Err(status) if status.is_drained() => false,
                // Could not reach it at all (or it is going away). A call it refused
                // alone (shedding load) counts as a failure below instead, and so does
                // one whose deadline passed before it was sent (a replica slow to
                // connect to, or behind on reading: a full queue at a short deadline
                // is no unreachable replica).
                Err(status)
                    if status.is_unprocessed()
                        && !status.is_refused()
                        && status.code() != crate::Code::DEADLINE_EXCEEDED =>
                {
                    true
                }
                // Failing the way an unreachable or stuck replica fails, repeatedly.
                Err(status)
                    if status.code() == crate::Code::UNAVAILABLE
                        || status.code() == crate::Code::DEADLINE_EXCEEDED =>
                {
                    for_failures = true;
                    replica
                        .failed_at_ms
                        .store(shared.now_ms(), Ordering::Relaxed);
                    replica.failures.fetch_add(1, Ordering::Relaxed) + 1 >= EJECT_AFTER_FAILURES
                }
                // The server's own errors (a broken replica: a bad deploy, a lost
                // dependency) weigh it down as failures do, but do not eject it: an
                // application may answer them for one poisonous request. A replica
                // that fails every call in a millisecond has the fewest calls in flight
                // and won nearly every choice of two (from a review).
                Err(status) if is_server_error(status.code()) => {
                    replica
                        .failed_at_ms
                        .store(shared.now_ms(), Ordering::Relaxed);
                    let _ =
                        replica
                            .failures
                            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                                Some((n + 1).min(EJECT_AFTER_FAILURES))
                            });
                    false
                }
                Err(_) => false,
            };
            // Ejections for failures, finishing at once on several replicas, decide one
            // at a time, or each would see the others not yet ejected.
            let serial = (eject && for_failures)
                .then(|| shared.ejecting.lock().unwrap_or_else(|e| e.into_inner()));
            let eject = eject && (serial.is_none() || shared.may_eject_for_failures());
            if eject {
                replica.failures.store(0, Ordering::Relaxed);
                // Counted from the failure. A replica already ejected is not ejected
                // again by the failures of calls made before it was (a burst of calls
                // to a replica that went away is one ejection, not one each).
                if let Err(status) = &result {
                    shared.eject_unreachable(&replica, shared.now_ms(), status);
                }
            }
            drop(serial);
            result
        })
    }
}

/// Waits for room on `channel` within the call's budget `timeout` (or, for a call
/// without one, within what is left of the channel's default timeout), which loses
/// the time waited (`intercept::ready_within_budget`).
async fn room_within(
    channel: &mut Channel,
    timeout: &mut Option<Duration>,
    what: &str,
) -> Result<(), Status> {
    crate::intercept::ready_within_budget(timeout, what, async {
        tower::ServiceExt::ready(channel).await.map(|_| ())
    })
    .await
}

/// `grpc.health.v1.HealthCheckRequest`, declared here so the core needs no generated
/// code (the full service is in `rpc-proto`).
#[derive(Clone, PartialEq, prost::Message)]
struct HealthCheckRequest {
    #[prost(string, tag = "1")]
    service: String,
}

/// `grpc.health.v1.HealthCheckResponse`.
#[derive(Clone, PartialEq, prost::Message)]
struct HealthCheckResponse {
    #[prost(int32, tag = "1")]
    status: i32,
}

/// `HealthCheckResponse.ServingStatus.SERVING`.
const SERVING: i32 = 1;

/// Decrements a replica's in-flight count when the call ends, however it ends.
struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use std::task::Wake;

    use super::*;

    /// The table of keys an application repeats itself: a call's place is freed when
    /// a repeat of it succeeds (`forget`), and one remembered again after that has
    /// one place, not two (the stale one would forget it when it came first).
    #[test]
    fn a_keyed_call_forgotten_and_remembered_again_has_one_place() {
        let mut affinity = Affinity::default();
        let at: Endpoint = "tcp://10.0.0.1:7000".parse().unwrap();
        let key = |call| CallKey {
            client: 7,
            call,
            attempt: 2,
        };
        affinity.remember(&key(1), &at);
        affinity.remember(&key(2), &at);
        affinity.forget(&key(1));
        assert_eq!(affinity.order, [(7, 2)]);
        assert!(!affinity.replicas.contains_key(&(7, 1)));
        affinity.remember(&key(1), &at);
        for n in 3..(AFFINITY_CALLS as u64 + 2) {
            affinity.remember(&key(n), &at);
        }
        // Call 2 was the oldest and went; call 1, remembered after, is still known.
        assert_eq!(affinity.order.len(), AFFINITY_CALLS);
        assert!(!affinity.replicas.contains_key(&(7, 2)));
        assert!(affinity.replicas.contains_key(&(7, 1)));
        // Forgetting a call not remembered changes nothing.
        affinity.forget(&key(u64::MAX));
        assert_eq!(affinity.order.len(), AFFINITY_CALLS);
    }

    struct Noop;

    impl Wake for Noop {
        fn wake(self: Arc<Self>) {}
    }

    /// Following discovery does not keep a set alive, and a task handed to
    /// `stop_with` ends with the set: a client made and dropped per tenant left its
    /// discovery task (an etcd watch, DNS lookups) running for ever (from a review).
    #[tokio::test]
    async fn following_ends_with_the_set() {
        struct Guard(Arc<AtomicBool>);
        impl Drop for Guard {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let (_listener, connector) = crate::link::mem::listener();
        let balanced = Balanced::new(move |_: &Endpoint| -> Result<Channel, Error> {
            Ok(Channel::builder().connect_lazy(connector.clone()))
        });
        // A discovery stream that never says anything more (a quiet watch).
        let dropped = Arc::new(AtomicBool::new(false));
        let guard = Guard(dropped.clone());
        let quiet = futures::StreamExt::map(futures::stream::pending::<Change>(), move |change| {
            let _ = &guard;
            change
        });
        let task = tokio::spawn(balanced.follow(futures::StreamExt::boxed(quiet)));
        balanced.stop_with(task.abort_handle());
        let other = balanced.clone();
        drop(balanced);
        tokio::task::yield_now().await;
        assert!(!dropped.load(Ordering::SeqCst), "a clone still calls");
        drop(other);
        let ended = tokio::time::timeout(Duration::from_secs(10), task).await;
        assert!(ended.is_ok(), "the task was kept");
        assert!(
            dropped.load(Ordering::SeqCst),
            "the discovery stream was kept"
        );
    }

    /// Discovery that stops listing every replica (registrations expired: the replicas
    /// lost the registry, which clients still reach) does not empty the set: the last
    /// known replicas stay until it lists one again, and then those it does not list
    /// go (a review: an etcd-replicas partition failed every call of every client
    /// while every replica was up).
    #[tokio::test]
    async fn discovery_that_lists_no_replica_leaves_the_last_known() {
        let (_listener, connector) = crate::link::mem::listener();
        let balanced = Balanced::new(move |_: &Endpoint| -> Result<Channel, Error> {
            Ok(Channel::builder().connect_lazy(connector.clone()))
        });
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let task = tokio::spawn(balanced.follow(rx));
        let endpoint = |i: u8| -> Endpoint { format!("tcp://10.0.0.{i}:7000").parse().unwrap() };
        let sorted = |mut v: Vec<Endpoint>| {
            v.sort_by_key(|e| e.to_string());
            v
        };
        let settle = || async {
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
        };
        for i in 1..=3 {
            tx.unbounded_send(Change::Insert(endpoint(i))).unwrap();
        }
        // One goes for good: removed.
        tx.unbounded_send(Change::Insert(endpoint(4))).unwrap();
        tx.unbounded_send(Change::Remove(endpoint(4))).unwrap();
        settle().await;
        assert_eq!(balanced.endpoints().len(), 3);
        // Every registration expires: the three removed lately are kept (4 came back
        // with them: it was removed within the same 30 s; discovery reports each
        // change once, so the set cannot tell which went for good).
        for i in 1..=3 {
            tx.unbounded_send(Change::Remove(endpoint(i))).unwrap();
        }
        settle().await;
        assert_eq!(
            sorted(balanced.endpoints()),
            vec![endpoint(1), endpoint(2), endpoint(3), endpoint(4)]
        );
        // One registers again: the others go until they do too.
        tx.unbounded_send(Change::Insert(endpoint(2))).unwrap();
        settle().await;
        assert_eq!(balanced.endpoints(), vec![endpoint(2)]);
        tx.unbounded_send(Change::Insert(endpoint(3))).unwrap();
        tx.unbounded_send(Change::Remove(endpoint(2))).unwrap();
        settle().await;
        assert_eq!(balanced.endpoints(), vec![endpoint(3)]);
        task.abort();
    }

    /// Discovery that lists more than [`MAX_REPLICAS`] endpoints has the rest wait; a
    /// removal makes room for the one that waited longest.
    #[tokio::test]
    async fn replicas_past_the_limit_wait_for_a_place() {
        let (_listener, connector) = crate::link::mem::listener();
        let balanced = Balanced::new(move |_: &Endpoint| -> Result<Channel, Error> {
            Ok(Channel::builder().connect_lazy(connector.clone()))
        });
        let endpoint = |i: usize| -> Endpoint {
            format!("tcp://10.{}.{}.{}:7000", i >> 16, (i >> 8) & 255, i & 255)
                .parse()
                .unwrap()
        };
        for i in 0..MAX_REPLICAS + 10 {
            balanced.apply(Change::Insert(endpoint(i))).unwrap();
        }
        assert_eq!(balanced.endpoints().len(), MAX_REPLICAS);
        // A removal makes room for the one that waited longest: discovery will not
        // report it again.
        balanced.apply(Change::Remove(endpoint(0))).unwrap();
        let endpoints = balanced.endpoints();
        assert_eq!(endpoints.len(), MAX_REPLICAS);
        assert!(endpoints.contains(&endpoint(MAX_REPLICAS)));
        // One that waits and goes is not taken later.
        balanced
            .apply(Change::Remove(endpoint(MAX_REPLICAS + 1)))
            .unwrap();
        balanced.apply(Change::Remove(endpoint(1))).unwrap();
        let endpoints = balanced.endpoints();
        assert!(!endpoints.contains(&endpoint(MAX_REPLICAS + 1)));
        assert!(endpoints.contains(&endpoint(MAX_REPLICAS + 2)));
        assert_eq!(endpoints.len(), MAX_REPLICAS);
    }

    /// A read-only call of `method` with no payload, deadline or metadata.
    fn test_call(method: &'static str) -> ClientCall {
        ClientCall {
            method: method.into(),
            idempotency: crate::method::Idempotency::NoSideEffects,
            metadata: crate::Metadata::new(),
            timeout: None,
            call_key: None,
            payload: crate::Payload::new(),
            stream: None,
            compress: None,
        }
    }

    /// A balancer of three replicas (channels that never connect), and its replicas.
    fn three_replicas() -> (Balanced, Arc<Vec<Arc<Replica>>>) {
        let (_listener, connector) = crate::link::mem::listener();
        let balanced = Balanced::new(move |_: &Endpoint| -> Result<Channel, Error> {
            Ok(Channel::builder().connect_lazy(connector.clone()))
        });
        for port in 1..=3 {
            let endpoint: Endpoint = format!("tcp://10.0.0.{port}:7000").parse().unwrap();
            balanced.apply(Change::Insert(endpoint)).unwrap();
        }
        let replicas = balanced.snapshot();
        (balanced, replicas)
    }

    /// Picks go on while other threads flip replicas in and out of service: a pick that
    /// counted the live replicas and then found fewer on its walk panicked
    /// (`expect("k < n")`; from a review, reachable by a replica that fails calls fast
    /// or flaps its health). Timing-dependent, but without the fix it panicked in each
    /// of three runs on two cores.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn picks_survive_replicas_going_in_and_out_of_service() {
        let (balanced, replicas) = three_replicas();
        let stop = Arc::new(AtomicBool::new(false));
        let flipper = {
            let (replicas, stop) = (replicas.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut i = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    let r = &replicas[i % replicas.len()];
                    r.healthy.store(i % 2 == 0, Ordering::Relaxed);
                    i = i.wrapping_add(1);
                }
            })
        };
        for _ in 0..200_000 {
            assert!(balanced.pick_in(&replicas).is_some());
        }
        stop.store(true, Ordering::Relaxed);
        flipper.join().unwrap();
    }

    /// With every replica failing its health check (a shared dependency down, a wrong
    /// service name), calls are spread over them, not all sent to the first (a
    /// review).
    #[tokio::test]
    async fn with_every_replica_unhealthy_calls_are_still_spread() {
        let (balanced, replicas) = three_replicas();
        for r in replicas.iter() {
            r.healthy.store(false, Ordering::Relaxed);
        }
        // Load on the first: two choices then never leave it picked over an idle one.
        replicas[0].in_flight.store(5, Ordering::Relaxed);
        let picked_first = (0..300)
            .filter(|_| Arc::ptr_eq(&balanced.pick_in(&replicas).unwrap(), &replicas[0]))
            .count();
        assert_eq!(picked_first, 0, "calls went to the loaded first replica");
    }

    /// A replica that registers again (restarted at its address before its old
    /// registration expired) is no longer held ejected: its restarted self takes calls
    /// at once (from a review: none for 4 s, its old self's ejection running on).
    #[tokio::test]
    async fn registering_again_ends_an_ejection() {
        let (balanced, replicas) = three_replicas();
        let far = balanced.now_ms() + 60_000;
        replicas[0].ejected_until_ms.store(far, Ordering::Relaxed);
        replicas[0].ejections.store(3, Ordering::Relaxed);
        let picked_first = |balanced: &Balanced| {
            (0..100)
                .filter(|_| Arc::ptr_eq(&balanced.pick_in(&replicas).unwrap(), &replicas[0]))
                .count()
        };
        assert_eq!(picked_first(&balanced), 0, "an ejected replica was picked");
        balanced
            .apply(Change::Insert(replicas[0].endpoint.clone()))
            .unwrap();
        assert_eq!(
            balanced.snapshot().len(),
            3,
            "no second replica of the endpoint"
        );
        assert!(
            picked_first(&balanced) > 0,
            "still ejected after registering again"
        );
        assert_eq!(replicas[0].ejections.load(Ordering::Relaxed), 0);
    }

    /// Two replicas whose calls pile up (hung) never win over an idle third, even when
    /// both are the two picked (from a review: with two of four hung, every worker of
    /// a client ended up waiting on them while the healthy two sat idle); replicas of
    /// like load still share the calls.
    #[tokio::test]
    async fn replicas_whose_calls_pile_up_give_way_to_the_least_loaded() {
        let (balanced, replicas) = three_replicas();
        replicas[0].in_flight.store(5, Ordering::Relaxed);
        replicas[1].in_flight.store(6, Ordering::Relaxed);
        let idle = (0..300)
            .filter(|_| Arc::ptr_eq(&balanced.pick_in(&replicas).unwrap(), &replicas[2]))
            .count();
        assert_eq!(idle, 300, "calls went to a replica whose calls pile up");
        for (r, load) in replicas.iter().zip([4, 3, 4]) {
            r.in_flight.store(load, Ordering::Relaxed);
        }
        let mut seen = [0usize; 3];
        for _ in 0..300 {
            let picked = balanced.pick_in(&replicas).unwrap();
            let k = replicas
                .iter()
                .position(|r| Arc::ptr_eq(r, &picked))
                .unwrap();
            seen[k] += 1;
        }
        assert!(seen.iter().filter(|&&n| n > 0).count() >= 2, "{seen:?}");
    }

    /// A health check waits for room on the replica's channel only within its
    /// timeout: a replica whose every in-flight slot is held by a call it never
    /// answers is marked unhealthy, and the checks of the others go on (a review: the
    /// wait had no bound and froze every replica's verdict).
    #[tokio::test(start_paused = true)]
    async fn a_health_check_waiting_for_room_times_out() {
        use crate::server::{Server, ServerCall, ServerReply};
        let (listener, connector) = crate::link::mem::listener();
        let server = Server::builder()
            .add_named_service(
                "t.Hold",
                tower::service_fn(|_: ServerCall| async {
                    std::future::pending::<Result<ServerReply, crate::Status>>().await
                }),
            )
            .build();
        tokio::spawn(async move { server.serve(listener).await });
        let balanced = Balanced::new(move |_: &Endpoint| -> Result<Channel, Error> {
            Ok(Channel::builder()
                .max_in_flight(1)
                .connect_lazy(connector.clone()))
        });
        balanced
            .apply(Change::Insert("tcp://10.0.0.1:7000".parse().unwrap()))
            .unwrap();
        let replica = balanced.snapshot()[0].clone();
        let mut channel = replica.channel.clone();
        let held = tokio::spawn(async move {
            let call = test_call("t.Hold/Hold");
            tower::ServiceExt::ready(&mut channel)
                .await
                .unwrap()
                .call(call)
                .await
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        let checking = tokio::spawn(balanced.health_checks(
            "",
            Duration::from_millis(10),
            Duration::from_millis(50),
        ));
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            !replica.healthy.load(Ordering::Relaxed),
            "a replica with no room for the check is still taken as healthy"
        );
        checking.abort();
        held.abort();
    }

    /// Several calls turned away by one GOAWAY on a connection the server never
    /// served are one failure of the replica, not one each: three calls in flight
    /// were an ejection at once (from a review).
    #[tokio::test(start_paused = true)]
    async fn one_connection_turned_away_is_one_failure_however_many_calls_it_had() {
        use crate::link::{Link, LinkConfig, Listener};
        use std::future::poll_fn;
        let (mut listener, connector) = crate::link::mem::listener();
        tokio::spawn(async move {
            let mut open = Vec::new();
            while let Ok(mut link) = listener.accept(&LinkConfig::default()).await {
                // Reads three requests, then goes away without taking any.
                for _ in 0..3 {
                    poll_fn(|cx| link.poll_recv(cx)).await.unwrap().unwrap();
                }
                let mut goaway = bytes::BytesMut::new();
                let code = crate::frame::GoAwayCode::NO_ERROR;
                crate::frame::encode_goaway(&mut goaway, 0, code, "draining");
                poll_fn(|cx| link.poll_ready(cx)).await.unwrap();
                link.start_send(&goaway, crate::Payload::new()).unwrap();
                poll_fn(|cx| link.poll_flush(cx)).await.unwrap();
                open.push(link); // and never closed
            }
        });
        let balanced = Balanced::new(move |_: &Endpoint| -> Result<Channel, Error> {
            Ok(Channel::builder().connect_lazy(connector.clone()))
        });
        for at in ["tcp://10.0.0.1:7000", "tcp://10.0.0.2:7000"] {
            balanced.apply(Change::Insert(at.parse().unwrap())).unwrap();
        }
        let replica = balanced.snapshot()[0].clone();
        let calls = (0..3).map(|_| attempt_on(&balanced, &replica));
        for outcome in futures::future::join_all(calls).await {
            let status = outcome.unwrap_err();
            assert!(status.is_unprocessed(), "{status}");
        }
        assert_eq!(replica.failures.load(Ordering::Relaxed), 1);
        assert!(
            replica.ejected_until_ms.load(Ordering::Relaxed) <= balanced.now_ms(),
            "ejected by one GOAWAY"
        );
    }

    /// A replica whose server answers `INTERNAL` (broken, and fast at it) is weighed
    /// down as a failing one is, so that the choice of two does not favour it for
    /// having the fewest calls in flight; it is not ejected for it (from a review: a
    /// replica failing every call in a millisecond drew most of the traffic).
    #[tokio::test(start_paused = true)]
    async fn a_replica_answering_internal_errors_is_weighed_down_not_ejected() {
        use crate::server::{Server, ServerCall, ServerReply};
        let serve = |fail: bool| {
            let (listener, connector) = crate::link::mem::listener();
            let server = Server::builder()
                .add_named_service(
                    "t.Echo",
                    tower::service_fn(move |_: ServerCall| async move {
                        if fail {
                            Err(crate::Status::internal("broken"))
                        } else {
                            Ok(ServerReply::default())
                        }
                    }),
                )
                .build();
            tokio::spawn(async move { server.serve(listener).await });
            connector
        };
        let (broken, fine) = (serve(true), serve(false));
        let (balanced, replicas, replica) = odd_one_out(broken, fine);
        for _ in 0..5 {
            let status = attempt_on(&balanced, &replica).await.unwrap_err();
            assert_eq!(status.code(), crate::Code::INTERNAL, "{status}");
        }
        let picked = (0..100)
            .filter(|_| Arc::ptr_eq(&balanced.pick_in(&replicas).unwrap(), &replica))
            .count();
        assert_eq!(picked, 0, "the broken replica was picked over an idle one");
        assert!(
            replica.ejected_until_ms.load(Ordering::Relaxed) <= balanced.now_ms(),
            "ejected for its server's errors"
        );
        // Its errors weigh for a while, as failures do: then it is picked again.
        tokio::time::advance(Duration::from_millis(FAILURE_WEIGHS_FOR_MS)).await;
        let picked = (0..100)
            .filter(|_| Arc::ptr_eq(&balanced.pick_in(&replicas).unwrap(), &replica))
            .count();
        assert!(
            picked > 0,
            "still weighed down after its errors stopped weighing"
        );
    }

    /// A set of two replicas, the first reached through `odd` and the other through
    /// `other`: the set, its replicas, and the first.
    fn odd_one_out(
        odd: crate::link::mem::MemConnector,
        other: crate::link::mem::MemConnector,
    ) -> (Balanced, Vec<Arc<Replica>>, Arc<Replica>) {
        let odd_at: Endpoint = "tcp://10.0.0.1:7000".parse().unwrap();
        let at = odd_at.clone();
        let balanced = Balanced::new(move |endpoint: &Endpoint| -> Result<Channel, Error> {
            let connector = if *endpoint == at { &odd } else { &other };
            Ok(Channel::builder().connect_lazy(connector.clone()))
        });
        balanced.apply(Change::Insert(odd_at.clone())).unwrap();
        balanced
            .apply(Change::Insert("tcp://10.0.0.2:7000".parse().unwrap()))
            .unwrap();
        let replicas = balanced.snapshot();
        let replica = replicas
            .iter()
            .find(|r| r.endpoint == odd_at)
            .unwrap()
            .clone();
        (balanced, replicas.to_vec(), replica)
    }

    /// Sends a call to `replica` (its channel made ready first), as `call` does after
    /// a pick.
    async fn attempt_on(
        balanced: &Balanced,
        replica: &Arc<Replica>,
    ) -> Result<ClientReply, Status> {
        let mut channel = replica.channel.clone();
        tower::ServiceExt::ready(&mut channel).await?;
        balanced
            .attempt(replica.clone(), channel, test_call("t.Echo/Say"))
            .await
    }

    /// A replica that takes every connection and turns it away at once with a
    /// graceful GOAWAY (last id 0: draining for good) fails as one that cannot be
    /// reached: weighed down by its first such call, ejected, and tried again once the
    /// ejection is over: its channel connects anew, while the calls go to the other
    /// replica, which has a connection. Its GOAWAYs were taken as idle timeouts, which
    /// count for nothing: it was never ejected, and kept being picked, each of its
    /// calls going on to another replica only after a connection to it (from a
    /// review).
    #[tokio::test(start_paused = true)]
    async fn a_replica_that_turns_every_connection_away_is_weighed_down_then_ejected() {
        use crate::link::{Link, LinkConfig, Listener};
        use std::future::poll_fn;
        let (mut listener, draining) = crate::link::mem::listener();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            let mut open = Vec::new();
            while let Ok(mut link) = listener.accept(&LinkConfig::default()).await {
                count.fetch_add(1, Ordering::Relaxed);
                let mut goaway = bytes::BytesMut::new();
                let code = crate::frame::GoAwayCode::NO_ERROR;
                crate::frame::encode_goaway(&mut goaway, 0, code, "draining");
                poll_fn(|cx| link.poll_ready(cx)).await.unwrap();
                link.start_send(&goaway, crate::Payload::new()).unwrap();
                poll_fn(|cx| link.poll_flush(cx)).await.unwrap();
                open.push(link); // and never closed
            }
        });
        let (_other_listener, other) = crate::link::mem::listener();
        let (balanced, replicas, replica) = odd_one_out(draining, other);
        let picked = |balanced: &Balanced| {
            (0..100)
                .filter(|_| Arc::ptr_eq(&balanced.pick_in(&replicas).unwrap(), &replica))
                .count()
        };

        let status = attempt_on(&balanced, &replica).await.unwrap_err();
        assert!(status.is_unprocessed(), "{status}");
        assert_eq!(
            replica.failures.load(Ordering::Relaxed),
            1,
            "not counted as a failure: {status}"
        );
        assert_eq!(picked(&balanced), 0, "picked over an idle replica");

        // Turned away again (by GOAWAY, or by its channel backing off): ejected.
        for _ in 1..EJECT_AFTER_FAILURES {
            let status = attempt_on(&balanced, &replica).await.unwrap_err();
            assert!(status.is_unprocessed(), "{status}");
        }
        assert!(
            replica.ejected_until_ms.load(Ordering::Relaxed) > balanced.now_ms(),
            "not ejected"
        );

        // Tried again once the ejection is over: the picks have its channel connect
        // anew; the calls meanwhile go to the other, which has a connection.
        tokio::time::advance(DEFAULT_EJECTION + Duration::from_millis(FAILURE_WEIGHS_FOR_MS)).await;
        let before = accepted.load(Ordering::Relaxed);
        let mut tried = false;
        for _ in 0..100 {
            let chosen = balanced.pick_in(&replicas).unwrap();
            assert!(
                !Arc::ptr_eq(&chosen, &replica) || replica.channel.is_connected(),
                "picked without a connection while the other has one"
            );
            if accepted.load(Ordering::Relaxed) > before {
                tried = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(tried, "not tried again after its ejection");
    }

    /// A call that waits for a first replica and gives up (here: dropped) leaves no
    /// waker behind. They were kept, each holding its task, until a replica came: a
    /// client called from a task per request during an outage of its backends grew
    /// without bound, and walked the whole list on every new wait.
    #[tokio::test]
    async fn a_call_that_stopped_waiting_for_a_replica_keeps_no_waker() {
        let mut balanced = Balanced::new(|_: &Endpoint| -> Result<Channel, Error> {
            unreachable!("no replica is ever added")
        })
        .wait_for_ready(Some(Duration::from_secs(60)));
        let wake = Arc::new(Noop);
        let waker = std::task::Waker::from(wake.clone());
        let mut cx = Context::from_waker(&waker);
        for _ in 0..3 {
            assert!(balanced.poll_ready(&mut cx).is_ready());
            let mut call = balanced.call(test_call("demo.Echo/Say"));
            assert!(call.as_mut().poll(&mut cx).is_pending(), "no replica yet");
        }
        drop(waker);
        assert_eq!(
            Arc::strong_count(&wake),
            1,
            "the waker of a call no longer waiting is still held"
        );
    }
}

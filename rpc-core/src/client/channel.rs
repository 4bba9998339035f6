//! [`Channel`]: a cheap-to-clone handle to one connection's driver task.

use std::{
    fmt,
    future::Future,
    pin::Pin,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use tokio::{
    sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore},
    time::{Instant, Sleep},
};
use tokio_util::sync::PollSemaphore;

use super::{
    driver::{Answer, Command, Driver, DriverCell, InlineSend, Outgoing},
    pool::{Members, MAX_CONNECTIONS},
    ClientCall, ClientReply,
};
use crate::{
    frame::DecodeLimits,
    link::{Connector, LinkConfig},
    stream::TakeOnce,
    Error, Status,
};

/// Default bound on calls in flight per channel: enough to keep a fast link busy, small
/// enough that a stalled server cannot make the client hold unbounded requests.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 1024;

/// Default time allowed for one connection attempt.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Default first delay before reconnecting after a failed attempt (it doubles, with
/// jitter, up to [`DEFAULT_BACKOFF_MAX`]).
pub const DEFAULT_BACKOFF_MIN: Duration = Duration::from_millis(50);

/// Default longest delay between reconnection attempts.
pub const DEFAULT_BACKOFF_MAX: Duration = Duration::from_secs(5);

/// The least retransmission timeout [`ChannelBuilder::retransmission`] takes.
const MIN_RTO_FLOOR: Duration = Duration::from_millis(1);

/// Settings of a [`Channel`]; see [`ChannelBuilder`] for each one's meaning.
#[derive(Clone, Debug)]
pub(crate) struct ChannelConfig {
    pub(crate) link: LinkConfig,
    pub(crate) decode: DecodeLimits,
    pub(crate) default_timeout: Option<Duration>,
    pub(crate) connect_timeout: Duration,
    pub(crate) max_in_flight: usize,
    pub(crate) backoff_min: Duration,
    pub(crate) backoff_max: Duration,
    pub(crate) retransmit: RetransmitConfig,
    pub(crate) stream_window: u32,
    pub(crate) compression: Option<crate::compress::Compression>,
    pub(crate) keepalive: crate::keepalive::KeepaliveConfig,
    pub(crate) keepalive_while_idle: bool,
    pub(crate) connections: usize,
}

/// Default silence, while calls are in flight, after which the channel sends a PING
/// (see [`ChannelBuilder::keepalive_interval`]).
pub const DEFAULT_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);

/// Default time the channel waits for any frame after a keepalive PING before it
/// declares the connection dead (gRPC's default keepalive timeout).
pub const DEFAULT_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// Default receive window of each streaming call, in bytes: how much the server may
/// send ahead of what the application has read.
pub const DEFAULT_STREAM_WINDOW: u32 = 1 << 20;

/// Default first retransmission timeout on links that may lose requests (UDP), used
/// until the channel has measured the round trip.
pub const DEFAULT_INITIAL_RTO: Duration = Duration::from_millis(100);

/// Default floor of the retransmission timeout.
pub const DEFAULT_MIN_RTO: Duration = Duration::from_millis(10);

/// Default ceiling of the retransmission timeout, which doubles with every
/// retransmission of the same request (up to a lower ceiling on fast paths and for
/// short deadlines: see [`ChannelBuilder::retransmission`]).
pub const DEFAULT_MAX_RTO: Duration = Duration::from_secs(1);

/// When requests on an unreliable link are sent again: see
/// [`ChannelBuilder::retransmission`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct RetransmitConfig {
    pub(crate) initial: Duration,
    pub(crate) min: Duration,
    pub(crate) max: Duration,
}

/// Builds a [`Channel`].
///
/// ```no_run
/// # async fn f(connector: rpc_core::link::mem::MemConnector) -> Result<(), rpc_core::Error> {
/// use std::time::Duration;
/// let channel = rpc_core::client::Channel::builder()
///     .timeout(Duration::from_secs(1))
///     .max_in_flight(256)
///     .connect(connector)
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct ChannelBuilder {
    config: ChannelConfig,
}

impl Default for ChannelBuilder {
    fn default() -> Self {
        ChannelBuilder {
            config: ChannelConfig {
                link: LinkConfig::default(),
                decode: DecodeLimits::default(),
                default_timeout: None,
                connect_timeout: DEFAULT_CONNECT_TIMEOUT,
                max_in_flight: DEFAULT_MAX_IN_FLIGHT,
                backoff_min: DEFAULT_BACKOFF_MIN,
                backoff_max: DEFAULT_BACKOFF_MAX,
                retransmit: RetransmitConfig {
                    initial: DEFAULT_INITIAL_RTO,
                    min: DEFAULT_MIN_RTO,
                    max: DEFAULT_MAX_RTO,
                },
                stream_window: DEFAULT_STREAM_WINDOW,
                compression: None,
                keepalive: crate::keepalive::KeepaliveConfig {
                    interval: Some(DEFAULT_KEEPALIVE_INTERVAL),
                    timeout: DEFAULT_KEEPALIVE_TIMEOUT,
                },
                keepalive_while_idle: false,
                connections: 1,
            },
        }
    }
}

impl ChannelBuilder {
    /// Time budget for calls that do not set their own, from when the call is sent
    /// (under a [`RetryLayer`](crate::retry::RetryLayer), from its first attempt). It
    /// bounds a wait for a free in-flight slot (`max_in_flight`) too: a call made
    /// through a [`Client`](super::Client) (every generated client), a retry layer,
    /// [`for_methods`](crate::intercept) or [`Balanced`](crate::balance::Balanced)
    /// that is still waiting for one when the default runs out fails
    /// `DEADLINE_EXCEEDED`, marked as never sent (a bare `ServiceExt::ready` on the
    /// channel waits as long as it takes). Default: none (calls wait until they are
    /// answered or the connection fails).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.config.default_timeout = Some(timeout);
        self
    }

    /// Time allowed for one connection attempt. Default: [`DEFAULT_CONNECT_TIMEOUT`].
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.config.connect_timeout = timeout;
        self
    }

    /// Most calls in flight at once; past it, `poll_ready` waits for a call to finish.
    /// Default: [`DEFAULT_MAX_IN_FLIGHT`].
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.config.max_in_flight = n.max(1);
        self
    }

    /// Largest frame accepted from or sent to the server; a larger request fails alone
    /// with `RESOURCE_EXHAUSTED` instead of costing the connection. Default:
    /// [`DEFAULT_MAX_FRAME_LEN`](crate::link::DEFAULT_MAX_FRAME_LEN).
    pub fn max_frame_len(mut self, n: usize) -> Self {
        self.config.link.max_frame_len = n;
        self
    }

    /// Largest metadata block accepted from the server. Default:
    /// [`DEFAULT_MAX_METADATA_LEN`](crate::frame::DEFAULT_MAX_METADATA_LEN).
    pub fn max_metadata_len(mut self, n: usize) -> Self {
        self.config.decode.max_metadata_len = n;
        self.config.link.max_metadata_len = n;
        self
    }

    /// Delays between reconnection attempts: the first failed attempt waits `min`, each
    /// further one twice as long (with jitter) up to `max`. Calls made while the channel
    /// waits fail at once with `UNAVAILABLE`. Connections that end before the server
    /// served them count as failed attempts too from the second in a row (the first
    /// reconnects at once): closed, or turned away by GOAWAY (a server that accepts
    /// every connection and sends GOAWAY at once, draining or overloaded, would
    /// otherwise get a new connection per call), before the server sent any other
    /// frame on them or took a call there (a GOAWAY whose last id covers one), unless
    /// they lasted `max` or longer. One that proved itself so resets the count.
    /// Default: [`DEFAULT_BACKOFF_MIN`], [`DEFAULT_BACKOFF_MAX`].
    pub fn reconnect_backoff(mut self, min: Duration, max: Duration) -> Self {
        self.config.backoff_min = min;
        self.config.backoff_max = max.max(min);
        self
    }

    /// Retransmission of requests on links that may lose them (UDP; see
    /// [`Link::is_reliable`](crate::link::Link::is_reliable)). A request not answered
    /// within the retransmission timeout is sent again with the same id and call key;
    /// the timeout starts at `initial`, then follows the measured round trip
    /// (`srtt + 4·rttvar`, as TCP does) but never below `min`, and doubles with each
    /// retransmission of the same request up to a ceiling: four times that measured
    /// timeout but at least 200 ms, at most a quarter of the call's time budget (so
    /// that several copies fit before its deadline), never below the measured timeout,
    /// and at most `max`. Retransmission stops at the call's deadline: over UDP, give
    /// calls a deadline. A `min` below 1 ms is taken as 1 ms (a zero timeout would
    /// resend without end). Default:
    /// [`DEFAULT_INITIAL_RTO`], [`DEFAULT_MIN_RTO`], [`DEFAULT_MAX_RTO`].
    pub fn retransmission(mut self, initial: Duration, min: Duration, max: Duration) -> Self {
        let min = min.max(MIN_RTO_FLOOR);
        let max = max.max(min);
        self.config.retransmit = RetransmitConfig {
            initial: initial.clamp(min, max),
            min,
            max,
        };
        self
    }

    /// Receive window of each streaming call: the bytes of messages the server may send
    /// beyond what the application has read. A reader that falls behind holds at most
    /// this plus one message. Default: [`DEFAULT_STREAM_WINDOW`].
    pub fn stream_window(mut self, bytes: u32) -> Self {
        self.config.stream_window = bytes.max(1);
        self
    }

    /// Compression of requests (and acceptance of compressed responses), negotiated
    /// with the server: see [`crate::compress`]. Default: `None` (off).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported) if this build does not
    /// have the algorithm asked for (its cargo feature of rpc-core, `zstd` or `gzip`,
    /// is off): an error here rather than a channel that silently never compresses.
    /// (The setter is the one place both [`connect`](Self::connect) and the infallible
    /// [`connect_lazy`](Self::connect_lazy) go through.)
    pub fn compression(
        mut self,
        compression: Option<crate::compress::Compression>,
    ) -> Result<Self, Error> {
        if let Some(compression) = &compression {
            compression.check()?;
        }
        self.config.compression = compression;
        Ok(self)
    }

    /// Keepalive: after this long without a frame from the server while calls are in
    /// flight, the channel sends a PING; if nothing at all arrives within the
    /// [`keepalive_timeout`](Self::keepalive_timeout) after it, the connection is
    /// declared dead: its calls fail with `UNAVAILABLE` (the message says "keepalive";
    /// they may have reached the server, so they are not marked unprocessed) and the
    /// next call reconnects. So a server host that went silent (powered off, cut off by
    /// the network) costs its calls about `interval + timeout`, not their whole
    /// deadline, and calls without a deadline do not hang for ever. Silence is checked
    /// lazily, so the PING goes out after between one and two intervals. `None` turns
    /// keepalive off. Default: [`DEFAULT_KEEPALIVE_INTERVAL`] (30 s).
    ///
    /// Applies on every transport that carries PINGs (TCP, Unix, TLS, UDP, RDMA; not
    /// `grpc://`, whose HTTP/2 link does not: see
    /// [`Link::carries_ping`](crate::link::Link::carries_ping)). Our server answers
    /// PINGs at any rate by default; one configured with
    /// [`ServerBuilder::keepalive_min_interval`](crate::server::ServerBuilder::keepalive_min_interval)
    /// closes connections that PING more often than that, so keep this interval above it.
    pub fn keepalive_interval(mut self, interval: Option<Duration>) -> Self {
        self.config.keepalive.interval = interval.map(|i| i.max(Duration::from_millis(1)));
        self
    }

    /// How long after a keepalive PING the channel waits for any frame before it
    /// declares the connection dead (see [`keepalive_interval`](Self::keepalive_interval)).
    /// Over links that may lose frames (UDP) the PING is sent three times within it.
    /// Default: [`DEFAULT_KEEPALIVE_TIMEOUT`] (20 s).
    pub fn keepalive_timeout(mut self, timeout: Duration) -> Self {
        self.config.keepalive.timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// Whether keepalive PINGs go out while no call is in flight too. That keeps an
    /// idle connection open past a server's idle timeout (PINGs count as activity) and
    /// finds a dead one before the next call needs it, at the cost of a PING per
    /// interval per idle connection. Default: `false` (an idle connection is checked
    /// by its next call, which reconnects if needed).
    pub fn keepalive_while_idle(mut self, enabled: bool) -> Self {
        self.config.keepalive_while_idle = enabled;
        self
    }

    /// A pool: how many connections the channel opens to its server. Calls go to them
    /// in turn (round-robin); each connection reconnects on its own, with its own
    /// backoff, and the others carry the calls meanwhile (the calls handed to one that
    /// is reconnecting fail at once with `UNAVAILABLE`, as unprocessed, so a retry
    /// policy sends them again). Every other setting, the in-flight limit included,
    /// is the channel's, shared by its connections; see `client::pool` for why
    /// round-robin.
    ///
    /// One connection carries many calls at once (multiplexed by id), so a pool is for
    /// more throughput than one connection's driver task and socket give: a server on
    /// many cores that serves each connection from one task, or a link whose one
    /// connection is the bottleneck (`docs/performance.md` measures it). Bulk transfers
    /// of a pooled channel ([`Channel::bulk`]): buffers it exposes are served over every
    /// connection (without RDMA's one-sided path), but buffers the *server* exposed are
    /// reached over the first connection only, while their descriptors are scoped to
    /// the connection that carried them: use a one-connection channel for those.
    ///
    /// Default: 1. At most [`MAX_CONNECTIONS`].
    ///
    /// ```
    /// use rpc_core::{client::Channel, link::mem, server::Server};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), rpc_core::Error> {
    /// let (listener, connector) = mem::listener();
    /// tokio::spawn(Server::builder().serve(listener));
    ///
    /// let channel = Channel::builder().connections(4).connect(connector).await?;
    /// assert_eq!(channel.connections(), 4);
    /// # Ok(()) }
    /// ```
    pub fn connections(mut self, n: usize) -> Self {
        self.config.connections = n.clamp(1, MAX_CONNECTIONS);
        self
    }

    /// Connects now, and fails if the first attempt does (with a pool: if any of its
    /// connections' first attempt does). Each connection's driver task is spawned on
    /// the current Tokio runtime and ends when the last clone of the channel (and the
    /// last call) is dropped.
    pub async fn connect<C: Connector>(self, connector: C) -> Result<Channel, Error> {
        let connect_one = || async {
            tokio::time::timeout(
                self.config.connect_timeout,
                connector.connect(&self.config.link),
            )
            .await
            .map_err(|_| {
                Error::new(
                    crate::ErrorKind::TimedOut,
                    format!(
                        "connect to {} timed out after {:?}",
                        connector.target(),
                        self.config.connect_timeout
                    ),
                )
            })?
        };
        let mut links = Vec::with_capacity(self.config.connections);
        for result in
            futures::future::join_all((0..self.config.connections).map(|_| connect_one())).await
        {
            links.push(Some(result?));
        }
        Ok(self.spawn(connector, links))
    }

    /// Returns at once; the first call connects (with a pool: the first call handed to
    /// each connection). Needs a Tokio runtime, like [`connect`](Self::connect).
    pub fn connect_lazy<C: Connector>(self, connector: C) -> Channel {
        let links = (0..self.config.connections).map(|_| None).collect();
        self.spawn(connector, links)
    }

    /// Spawns one driver per link (`None`: connects on its first call).
    fn spawn<C: Connector>(self, connector: C, links: Vec<Option<C::Link>>) -> Channel {
        let target: Arc<str> = connector.target().into();
        let config = Arc::new(self.config);
        let connector = Arc::new(connector);
        // Buffers the channel exposes are reachable over any of its connections.
        let regions = Arc::new(crate::bulk::Regions::default());
        let pooled = links.len() > 1;
        let members = links
            .into_iter()
            .map(|link| {
                let (tx, rx) = mpsc::unbounded_channel();
                let one_sided: crate::bulk::OneSidedSlot = Arc::default();
                let next_id = Arc::new(AtomicU64::new(1));
                let driver = Driver::new(
                    connector.clone(),
                    config.clone(),
                    rx,
                    link,
                    regions.clone(),
                    one_sided.clone(),
                    next_id.clone(),
                );
                let driver = DriverCell::new(driver);
                tokio::spawn(driver.clone().run());
                Arc::new(Shared {
                    inline: driver,
                    tx,
                    next_id,
                    default_timeout: config.default_timeout,
                    target: target.clone(),
                    max_frame_len: config.link.max_frame_len,
                    max_in_flight: config.max_in_flight,
                    regions: regions.clone(),
                    // One-sided access is registered with one connection: a pool's
                    // buffers are served by whichever connection is asked instead.
                    one_sided: if pooled { Arc::default() } else { one_sided },
                })
            })
            .collect();
        Channel {
            pool: Arc::new(Members::new(members)),
            semaphore: PollSemaphore::new(Arc::new(Semaphore::new(config.max_in_flight))),
            permit: None,
        }
    }
}

/// State of one of a channel's connections, shared by every clone of the channel.
struct Shared {
    /// The driver itself, for a call sent from the caller's thread when the
    /// connection is idle (the driver's `send_inline`), and for a call taken back
    /// unsent at its deadline (`InlineSend::withdraw`).
    inline: Arc<dyn InlineSend>,
    tx: mpsc::UnboundedSender<Command>,
    /// Call ids, shared with the driver, which gives a call a fresh one when another
    /// thread's call with a higher id was written first.
    next_id: Arc<AtomicU64>,
    default_timeout: Option<Duration>,
    target: Arc<str>,
    max_frame_len: usize,
    /// The channel's in-flight bound: with all its permits but the caller's free, no
    /// other call is in flight and the call may go out inline.
    max_in_flight: usize,
    regions: Arc<crate::bulk::Regions>,
    one_sided: crate::bulk::OneSidedSlot,
}

impl Shared {
    /// Hands a call to the driver; `false` if the driver has stopped. With no other
    /// call in flight (`free_permits`: the channel's permits not taken, the caller's
    /// own excepted) the caller writes it itself when it can, which saves the driver
    /// task a wake-up per sequential call; otherwise, and under load, the call is
    /// queued and the driver writes many in one go.
    fn submit(&self, outgoing: Outgoing, free_permits: usize) -> bool {
        let outgoing = if free_permits + 1 >= self.max_in_flight {
            match self.inline.try_send(outgoing) {
                Ok(()) => return true,
                Err(outgoing) => outgoing,
            }
        } else {
            outgoing
        };
        self.tx.send(Command::Call(outgoing)).is_ok()
    }
}

/// A client connection to one server, multiplexing many calls: each gets a u64 id, and
/// responses are matched to callers by id in whatever order they come.
///
/// Cheap to clone; every clone shares the connection and its in-flight limit. One
/// background task owns the connection (see [`ChannelBuilder::connect`]). If the
/// connection fails, the calls in flight fail with `UNAVAILABLE` and the next call
/// reconnects.
///
/// `Channel` is a `tower::Service<ClientCall>`: [`poll_ready`](tower::Service::poll_ready)
/// waits while the in-flight limit is reached.
///
/// ```
/// use rpc_core::{client::{Channel, Client}, link::mem, server::Server, Request};
/// # use rpc_core::{method::{Idempotency, MethodDescriptor}, server::{ServerCall, ServerReply}, Status};
/// # static SAY: MethodDescriptor = MethodDescriptor { service: "demo.Echo", method: "Say",
/// #     path: "demo.Echo/Say", idempotency: Idempotency::NoSideEffects };
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let echo = tower::service_fn(|call: ServerCall| async move {
/// #     Ok::<_, Status>(ServerReply { payload: call.payload.into(), ..ServerReply::default() })
/// # });
/// // In memory here; a transport gives the same (`rpc_transport_tcp::connect(uri)`).
/// let (listener, connector) = mem::listener();
/// tokio::spawn(Server::builder().add_named_service("demo.Echo", echo).serve(listener));
///
/// let channel = Channel::builder()
///     .timeout(std::time::Duration::from_secs(5)) // every call's default deadline
///     .connect(connector)
///     .await?;
/// // Clones share the connection. Generated clients (`EchoClient::new(channel)`) wrap
/// // a channel as `Client` does here; `SAY` describes the method `demo.Echo/Say`.
/// let mut client = Client::new(channel.clone());
/// let reply = client.unary::<_, String>(Request::new("hi".to_string()), &SAY).await?;
/// assert_eq!(reply.into_inner(), "hi");
/// # Ok(()) }
/// ```
pub struct Channel {
    /// The connections (one unless [`ChannelBuilder::connections`] says more).
    pool: Arc<Members<Shared>>,
    semaphore: PollSemaphore,
    permit: Option<OwnedSemaphorePermit>,
}

/// The deadline of a call that relies on the channel's `default` timeout: it runs from
/// the call's start, under a retry layer from its first attempt (each attempt had it
/// afresh); `None` when it is too large to be one.
fn default_deadline(default: Duration) -> Option<Instant> {
    crate::retry::call_began()
        .unwrap_or_else(Instant::now)
        .checked_add(default)
}

thread_local! {
    /// Armed (`Some`) while a caller that bounds a call's wait for room polls what it
    /// waits on ([`noting_default_budget`]): a channel that makes it wait (no free
    /// in-flight slot) leaves what is left of its default timeout here.
    static DEFAULT_BUDGET: std::cell::Cell<Option<Option<Duration>>> =
        const { std::cell::Cell::new(None) };
}

/// Runs `poll` (a poll of a service's readiness, or of a wait that polls one) and
/// returns, with its result, what is left of the default timeout
/// ([`ChannelBuilder::timeout`]) of a channel that made it wait for an in-flight slot;
/// `None` if none did or the channel has no default. How [`Client`](super::Client),
/// an interceptor's wait and `Balanced` bound the wait of a call that sets no timeout
/// of its own: the channel applies its default only when the call is sent, and the
/// layers between them (a retry layer, a balancer, a user's) hide the channel's type.
pub(crate) fn noting_default_budget<R>(poll: impl FnOnce() -> R) -> (R, Option<Duration>) {
    /// Puts the outer caller's state back however `poll` ends (a panic too).
    struct Restore(Option<Option<Duration>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            DEFAULT_BUDGET.set(self.0);
        }
    }
    let restore = Restore(DEFAULT_BUDGET.replace(Some(None)));
    let result = poll();
    let noted = DEFAULT_BUDGET.get().flatten();
    drop(restore);
    (result, noted)
}

impl Channel {
    /// What is left of the channel's default timeout for a call that sets none of its
    /// own: the whole default, or under a retry layer what is left of it since the
    /// call's first attempt (as [`call`](Service::call) counts it); `None` without a
    /// default, or one too large to be a deadline.
    pub(crate) fn default_budget(&self) -> Option<Duration> {
        let deadline = default_deadline(self.pool.first().default_timeout?)?;
        Some(deadline.saturating_duration_since(Instant::now()))
    }
}

impl Clone for Channel {
    fn clone(&self) -> Self {
        Channel {
            pool: self.pool.clone(),
            semaphore: self.semaphore.clone(),
            permit: None,
        }
    }
}

impl fmt::Debug for Channel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Channel")
            .field("target", &self.pool.first().target)
            .field("connections", &self.pool.len())
            .finish_non_exhaustive()
    }
}

impl Channel {
    /// A builder with every setting at its default.
    pub fn builder() -> ChannelBuilder {
        ChannelBuilder::default()
    }

    /// Where this channel connects.
    pub fn target(&self) -> &str {
        &self.pool.first().target
    }

    /// Whether one of the channel's connections is open (made, and not lost or turned
    /// away since), as of its driver's last look. Over UDP an association may still be
    /// opening. [`Balanced`](crate::balance::Balanced) sends calls to replicas whose
    /// channel is connected first.
    pub fn is_connected(&self) -> bool {
        self.pool
            .all()
            .iter()
            .any(|member| member.inline.connected())
    }

    /// Starts connecting, with no call to send, each of the channel's connections that
    /// has none and is neither making one nor backing off after a failed attempt: a
    /// warm-up, so that a first call finds its connection made. Returns at once; a
    /// failed attempt backs off as one made for a call does (calls meanwhile fail
    /// `UNAVAILABLE`, unprocessed).
    pub fn connect_idle(&self) {
        for member in self.pool.all() {
            if member.inline.idle() {
                let _ = member.tx.send(Command::Connect);
            }
        }
    }

    /// How many times the channel's connections failed to connect so far (a connect
    /// refused, timed out or failed its handshake), as of their drivers' last looks.
    pub fn connect_failures(&self) -> u64 {
        self.pool
            .all()
            .iter()
            .map(|member| member.inline.connect_failures())
            .sum()
    }

    /// How many connections the channel has (see [`ChannelBuilder::connections`]).
    pub fn connections(&self) -> usize {
        self.pool.len()
    }

    /// Drops this handle and waits until the channel's connections are closed: each
    /// connection's task ends once every handle is gone (this one, its clones, the
    /// generated clients wrapping them, [`bulk`](Self::bulk) endpoints) and the calls
    /// in flight have ended, after writing what was queued for the server: the
    /// `CANCEL` of a call whose deadline passed or whose caller gave up, say, which a
    /// process that exits right after its last call would otherwise lose with its
    /// runtime (`docs/wire.md` §6.6; the server then learns of the end only from the
    /// closed connection). Dropping a channel closes it the same way, without waiting.
    ///
    /// It waits for the other handles and the calls in flight without a bound: put a
    /// [`tokio::time::timeout`] around it if they may last.
    ///
    /// ```
    /// # use rpc_core::{client::Channel, link::mem};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), rpc_core::Error> {
    /// # let (_listener, connector) = mem::listener();
    /// let channel = Channel::builder().connect_lazy(connector);
    /// // ... calls ...
    /// channel.close().await; // everything queued is written, the connection closed
    /// # Ok(()) }
    /// ```
    pub async fn close(self) {
        let drivers: Vec<Arc<dyn InlineSend>> = self
            .pool
            .all()
            .iter()
            .map(|member| member.inline.clone())
            .collect();
        drop(self);
        for driver in drivers {
            driver.ended().wait().await;
        }
    }

    /// The channel's bulk endpoint: expose buffers to the server, read and write the
    /// buffers it exposes (see [`crate::bulk`]). Exposed buffers belong to the channel:
    /// the server reaches them over whichever connection the channel has (see
    /// [`ChannelBuilder::connections`] for a pooled channel's).
    pub fn bulk(&self) -> crate::bulk::Bulk {
        let shared = self.pool.first();
        let tx = shared.tx.clone();
        crate::bulk::Bulk::new(
            shared.regions.clone(),
            Arc::new(move |op| match tx.send(Command::Bulk(op)) {
                Ok(()) => Ok(()),
                Err(mpsc::error::SendError(Command::Bulk(op))) => Err(op),
                Err(_) => Ok(()),
            }),
            shared.one_sided.clone(),
            shared.max_frame_len,
        )
    }
}

impl tower::Service<ClientCall> for Channel {
    type Response = ClientReply;
    type Error = Status;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        if self.permit.is_none() {
            match self.semaphore.poll_acquire(cx) {
                Poll::Ready(Some(permit)) => self.permit = Some(permit),
                Poll::Ready(None) => {
                    return Poll::Ready(Err(Status::unavailable("channel closed")))
                }
                Poll::Pending => {
                    // A caller bounding the wait may ask what is left of the default.
                    DEFAULT_BUDGET.with(|noted| {
                        if noted.get().is_some() {
                            noted.set(Some(self.default_budget()));
                        }
                    });
                    return Poll::Pending;
                }
            }
        }
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, call: ClientCall) -> ResponseFuture {
        let permit = self
            .permit
            .take()
            .expect("Channel::call without a successful poll_ready");
        let shared = self.pool.pick().clone();
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        let timeout = call.timeout.or(shared.default_timeout);
        // A timeout too large to add to now (`Duration::MAX` as "no limit") is no deadline.
        let deadline = match (call.timeout, shared.default_timeout) {
            (Some(timeout), _) => Instant::now().checked_add(timeout),
            (None, Some(default)) => default_deadline(default),
            (None, None) => None,
        };
        let (reply, rx) = oneshot::channel();
        let streaming = call.stream.is_some();
        let taken = call.stream.as_ref().is_some_and(|s| !s.is_present());
        let outgoing = Outgoing {
            id,
            method: call.method,
            idempotency: call.idempotency,
            metadata: call.metadata,
            deadline,
            call_key: call.call_key,
            payload: call.payload,
            commands: streaming.then(|| shared.tx.clone()),
            stream: call.stream,
            compress: call.compress,
            reply,
        };
        // Made before the call is handed over (which may write it at once): outside a
        // runtime it panics, and the request must not have left by then.
        let sleep = deadline.map(|d| Box::pin(tokio::time::sleep_until(d)));
        let state = if taken {
            State::Done(Some(super::driver::already_taken()))
        } else if !shared.submit(outgoing, self.semaphore.available_permits()) {
            State::Done(Some(
                Status::unavailable("channel driver has stopped").into_unprocessed(),
            ))
        } else {
            State::Waiting { rx }
        };
        ResponseFuture {
            state,
            id,
            timeout,
            sleep,
            shared,
            permit: Some(permit),
        }
    }
}

enum State {
    Waiting {
        rx: oneshot::Receiver<Result<Answer, Status>>,
    },
    Done(Option<Status>),
}

/// The response to one call. Dropping it before it completes cancels the call: a
/// CANCEL frame tells the server to drop the handler.
pub struct ResponseFuture {
    state: State,
    id: u64,
    timeout: Option<Duration>,
    sleep: Option<Pin<Box<Sleep>>>,
    shared: Arc<Shared>,
    /// The in-flight permit; a streaming call's reader takes it over.
    permit: Option<OwnedSemaphorePermit>,
}

impl Future for ResponseFuture {
    type Output = Result<ClientReply, Status>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let rx = match &mut this.state {
            State::Waiting { rx } => rx,
            State::Done(err) => {
                return Poll::Ready(Err(err.take().unwrap_or_else(|| {
                    Status::internal("response future polled after completion")
                })))
            }
        };
        if let Poll::Ready(result) = Pin::new(rx).poll(cx) {
            this.state = State::Done(None);
            return Poll::Ready(match result {
                Ok(Ok(Answer::Unary {
                    metadata,
                    payload,
                    compressed,
                })) => match compressed {
                    Some(limit) => crate::compress::decompress(&payload, limit),
                    None => Ok(payload),
                }
                .map(|payload| ClientReply {
                    metadata,
                    payload,
                    stream: None,
                    compressed: compressed.is_some(),
                }),
                Ok(Ok(Answer::Stream(stream))) => {
                    let (metadata, mut body) = *stream;
                    body.set_permit(this.permit.take());
                    if let (Some(sleep), Some(timeout)) = (this.sleep.take(), this.timeout) {
                        body.set_deadline(sleep, timeout);
                    }
                    Ok(ClientReply {
                        metadata,
                        payload: Bytes::new(),
                        stream: Some(TakeOnce::new(body)),
                        compressed: false,
                    })
                }
                Ok(Err(status)) => Err(status),
                Err(_) => Err(Status::unavailable("channel driver has stopped")),
            });
        }
        if let Some(sleep) = &mut this.sleep {
            if sleep.as_mut().poll(cx).is_ready() {
                // A call still waiting to be written (the connection being made, the
                // link full) is taken back: it never left the client, and its status
                // says so (unprocessed), as other calls that never left do, so that a
                // retry may send it again whatever the method. So is one the driver
                // has just refused unsent (backing off) while it was taken back.
                let mut unsent = this.shared.inline.withdraw(this.id);
                if !unsent {
                    if let State::Waiting { rx } = &mut this.state {
                        let refused = rx.try_recv();
                        unsent = matches!(refused, Ok(Err(status)) if status.is_unprocessed());
                    }
                }
                this.state = State::Done(None);
                let timeout = this.timeout.unwrap_or_default();
                let target = &this.shared.target;
                if unsent {
                    return Poll::Ready(Err(Status::deadline_exceeded(format!(
                        "deadline of {timeout:?} exceeded before the call was sent to {target}"
                    ))
                    .into_unprocessed()));
                }
                // Removes the pending entry and tells the server to stop.
                let _ = this.shared.tx.send(Command::Cancel(this.id));
                return Poll::Ready(Err(Status::deadline_exceeded(format!(
                    "deadline of {timeout:?} exceeded waiting for the answer of {target}"
                ))));
            }
        }
        Poll::Pending
    }
}

impl Drop for ResponseFuture {
    fn drop(&mut self) {
        if matches!(self.state, State::Waiting { .. }) {
            let _ = self.shared.tx.send(Command::Cancel(self.id));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A zero retransmission timeout would send a request again at the instant it
    /// was sent, for ever (a review found the driver spinning): the floor is 1 ms.
    #[test]
    fn a_zero_retransmission_timeout_is_taken_as_the_floor() {
        let builder =
            Channel::builder().retransmission(Duration::ZERO, Duration::ZERO, Duration::ZERO);
        let rto = &builder.config.retransmit;
        assert_eq!(
            (rto.initial, rto.min, rto.max),
            (MIN_RTO_FLOOR, MIN_RTO_FLOOR, MIN_RTO_FLOOR)
        );
    }
}

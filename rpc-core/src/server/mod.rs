//! The server side: [`Server::builder()`], a router of services, one task per
//! connection, limits and graceful shutdown.
//!
//! Layout:
//! - this module: [`ServerBuilder`], [`Server`] and the accept loop;
//! - `router`: service name to service;
//! - `connection`: the task that owns one connection: reads requests while below the
//!   per-connection limit, runs each handler as its own task (so a slow call does not
//!   hold up the next), enforces deadlines, aborts cancelled handlers, and writes
//!   responses (many per system call).

mod connection;
mod dedupe;
pub(crate) mod held;
pub(crate) mod router;
mod stats;

pub use dedupe::{DedupeConfig, DedupeStats};
pub use stats::{ConnectionInfo, ServerStats};

use std::{fmt, future::Future, sync::Arc, time::Duration};

use bytes::Bytes;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tower::{
    layer::util::{Identity, Stack},
    Layer, Service,
};

use crate::{
    bytestr::ByteStr,
    frame::{self, DecodeLimits, GoAwayCode},
    link::{Link, LinkConfig, Listener, UnaryMethods},
    metadata::Metadata,
    stream::{RawStreaming, ReplyStream, TakeOnce},
    Error, ErrorKind, Payload, Status,
};
use router::{BoxService, Router};

std::thread_local! {
    /// See [`stop_cause`].
    static STOP_CAUSE: std::cell::Cell<Option<crate::Code>> = const { std::cell::Cell::new(None) };
}

/// While the server drops a streaming call's handler that it stopped itself, the
/// status code it answered the client with; `None` at any other time. What observes a
/// handler from a `Drop` (a tower layer's future or its response stream, such as the
/// `rpc-observe` layers) reads it there to tell why the call ended, as
/// `std::thread::panicking` tells a panic: `RESOURCE_EXHAUSTED` for a request-stream
/// message over the server's budgets, the status a transport answered a request it
/// could not hand over with (a gRPC message over the size limit, a compression it
/// refuses: [`Received::Stopped`](crate::link::Received::Stopped)), `CANCELLED` for a
/// client's CANCEL. A handler dropped for any other reason (its deadline, its
/// connection gone, a unary call cancelled) leaves it `None`.
///
/// ```
/// // Outside a stopped handler's drop there is no cause.
/// assert_eq!(rpc_core::server::stop_cause(), None);
/// ```
pub fn stop_cause() -> Option<crate::Code> {
    STOP_CAUSE.with(std::cell::Cell::get)
}

/// Runs `f` (the drop of a stopped handler) with [`stop_cause`] reading `code`.
pub(crate) fn with_stop_cause<R>(code: crate::Code, f: impl FnOnce() -> R) -> R {
    let before = STOP_CAUSE.with(|cause| cause.replace(Some(code)));
    // Restored even if a drop panics: the cause must not outlive its drop.
    struct Restore(Option<crate::Code>);
    impl Drop for Restore {
        fn drop(&mut self) {
            STOP_CAUSE.with(|cause| cause.set(self.0));
        }
    }
    let _restore = Restore(before);
    f()
}

/// Default per-connection limit of requests being handled at once.
pub const DEFAULT_MAX_CONCURRENT_REQUESTS: usize = 256;

/// Default limit of open connections; past it new connections get GOAWAY
/// `TOO_MANY_CONNECTIONS` and are closed.
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;

/// Default for [`ServerBuilder::evict_quiet_after`]: at the connection limit, a
/// connection with nothing in flight that received nothing for this long gives its
/// place to a new one.
pub const DEFAULT_EVICT_QUIET_AFTER: Duration = Duration::from_secs(10);

/// Default for [`ServerBuilder::evict_stalled_after`]: at the connection limit, with no
/// quiet connection to close, one whose calls have made no progress for this long is
/// closed with them.
pub const DEFAULT_EVICT_STALLED_AFTER: Duration = Duration::from_secs(60);

/// Default idle timeout: a connection with no calls for this long is closed (with a
/// GOAWAY, so the client reconnects quietly on its next call).
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// Default time graceful shutdown waits for calls in flight before aborting them.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// One call as a server's tower stack sees it.
#[derive(Clone, Debug)]
pub struct ServerCall {
    /// `package.Service/Method`.
    pub method: ByteStr,
    /// Request metadata.
    pub metadata: Metadata,
    /// The time budget left when the handler starts, if the caller has a deadline: the
    /// caller's budget, less the time the request waited for a busy service. The server
    /// drops the handler when it runs out.
    pub timeout: Option<Duration>,
    /// The encoded request message (empty for a streaming call).
    pub payload: Bytes,
    /// A streaming call's request messages; `None` for a unary call.
    pub stream: Option<TakeOnce<RawStreaming>>,
    /// Whether the request message arrived compressed.
    pub compressed: bool,
    /// When the server read the request off its connection (`None` for a call that
    /// did not come from a connection): the handler's start minus this is the time
    /// the request waited (for a busy service, behind the layers).
    pub received: Option<std::time::Instant>,
    /// The connection's bulk endpoint (see [`crate::bulk`]); set by the server.
    pub bulk: Option<crate::bulk::Bulk>,
    /// Who is calling (see [`crate::peer`]); set by the server.
    pub peer: Option<Arc<crate::Peer>>,
    /// Who the call's credentials say is calling; `None` until an authentication layer
    /// (such as [`BearerLayer`](crate::auth::BearerLayer)) sets it. See [`crate::auth`].
    pub principal: Option<Arc<crate::auth::Principal>>,
    /// Values a layer hands the handler, one per type (a user id found in a token, a
    /// tenant): insert them here, and the generated dispatcher moves them to
    /// [`Request::extensions`](crate::Request::extensions). Empty from the server; never
    /// sent on the wire. See [`crate::extensions`].
    pub extensions: crate::Extensions,
}

/// A handler's successful result: response metadata and the encoded message, or for
/// a streaming call the stream of messages.
#[derive(Clone, Debug, Default)]
pub struct ServerReply {
    /// Response metadata (a streaming call's headers).
    pub metadata: Metadata,
    /// The encoded response message (unused when `stream` is set).
    pub payload: Payload,
    /// A streaming call's response messages. A unary reply to a streaming call is sent
    /// as a stream of that one message.
    pub stream: Option<TakeOnce<ReplyStream>>,
    /// Metadata sent when the call ends: a streaming call's trailers (on a unary call
    /// they join `metadata` on the framework's own wires; gRPC's link sends them as
    /// trailers, see [`crate::link::Link::splits_trailers`]).
    pub trailers: Metadata,
    /// Compress the response payload (`Some(true)`), never (`Some(false)`), or as the
    /// server's size threshold decides (`None`); only toward a client that accepts
    /// compression.
    pub compress: Option<bool>,
}

/// A service with a fully qualified name (`package.Service`), which the router uses
/// to find it. Generated `FooServer` types implement it.
pub trait NamedService {
    /// `package.Service`.
    const NAME: &'static str;

    /// The encoded `google.protobuf.FileDescriptorSet` of the `.proto` files that
    /// define this service, their imports included: what server reflection answers
    /// with (see the `rpc-services` crate). Generated `FooServer` types set it to their
    /// package's `FILE_DESCRIPTOR_SET`, which `rpc-codegen` embeds. Default: empty (a
    /// hand-written service: reflection lists its name but cannot describe it).
    const FILE_DESCRIPTOR_SET: &'static [u8] = &[];

    /// Every method of the service, by name (`Say`). When it is not empty, the server
    /// answers a call of another name under the service's prefix with `UNIMPLEMENTED`
    /// itself, before the service and the server's layers see it: names a peer makes
    /// up then never reach a metrics layer's labels or the status page's board, where
    /// they could crowd the real methods out. Generated `FooServer` types list theirs.
    /// Default: empty (the service is handed every name under its prefix).
    const METHODS: &'static [&'static str] = &[];

    /// The service's unary methods, by name (`Say`): a transport that cannot tell a
    /// unary call from a stream hands their calls over as unary ones, which is
    /// cheaper (see [`UnaryMethods`]). Generated `FooServer` types list theirs.
    /// Default: empty (every call over such a transport takes the stream path, which a
    /// generated server's unary methods accept too).
    const UNARY_METHODS: &'static [&'static str] = &[];
}

#[derive(Clone, Debug)]
pub(crate) struct ServerConfig {
    pub(crate) link: LinkConfig,
    pub(crate) decode: DecodeLimits,
    pub(crate) max_concurrent_requests: usize,
    pub(crate) max_connections: usize,
    pub(crate) evict_quiet_after: Option<Duration>,
    pub(crate) evict_stalled_after: Option<Duration>,
    pub(crate) idle_timeout: Option<Duration>,
    pub(crate) drain_timeout: Duration,
    pub(crate) dedupe: Option<DedupeConfig>,
    pub(crate) stream_window: u32,
    pub(crate) max_concurrent_streams: usize,
    pub(crate) compression: Option<crate::compress::Compression>,
    pub(crate) keepalive: crate::keepalive::KeepaliveConfig,
    /// `None`: client PINGs are answered at any rate.
    pub(crate) keepalive_min_interval: Option<Duration>,
    /// Server-wide bytes of large unary requests held at once ([`held`]).
    pub(crate) max_large_request_bytes: usize,
    /// Server-wide bytes of unary answers held for clients that do not read them
    /// ([`held::Unsent`]).
    pub(crate) max_unsent_answer_bytes: usize,
}

/// Default of [`ServerBuilder::max_large_request_bytes`]: 1 GiB.
pub const DEFAULT_MAX_LARGE_REQUEST_BYTES: usize = 1 << 30;

/// Default of [`ServerBuilder::max_unsent_answer_bytes`]: 1 GiB.
pub const DEFAULT_MAX_UNSENT_ANSWER_BYTES: usize = 1 << 30;

/// Default silence, while calls are in flight, after which the server PINGs the client
/// (see [`ServerBuilder::keepalive_interval`]).
pub const DEFAULT_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(60);

/// Default time the server waits for any frame after a keepalive PING before it
/// declares the connection dead (gRPC's default keepalive timeout).
pub const DEFAULT_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// Default receive window of each streaming call on the server, in bytes.
pub const DEFAULT_STREAM_WINDOW: u32 = 1 << 20;

/// Default limit of streaming calls open at once per connection.
pub const DEFAULT_MAX_CONCURRENT_STREAMS: usize = 256;

/// The result of one handler.
pub(crate) type Outcome = Result<ServerReply, Status>;

/// Which request of a connection an outcome answers: its id, and a per-connection
/// sequence number that tells apart requests that reused an id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Tag {
    pub(crate) id: u64,
    pub(crate) seq: u64,
}

/// Who waits for a keyed call's outcome: a connection's outcome queue and the request
/// there.
pub(crate) type Waiter = (tokio::sync::mpsc::UnboundedSender<(Tag, Outcome)>, Tag);

/// The server-wide duplicate cache, shared by its connections.
pub(crate) type SharedCache = Arc<std::sync::Mutex<dedupe::DuplicateCache<Waiter, Outcome>>>;

/// Builds a [`Server`]: settings, tower layers, services.
///
/// ```
/// use std::time::Duration;
/// let builder = rpc_core::server::Server::builder()
///     .max_concurrent_requests(64)
///     .idle_timeout(Some(Duration::from_secs(60)));
/// // .add_service(EchoServer::new(MyEcho)) ... .serve(listener).await
/// # drop(builder);
/// ```
pub struct ServerBuilder<L = Identity> {
    config: ServerConfig,
    layer: L,
    router: Router,
    /// Every service added, in order, with its descriptor set (empty for
    /// [`add_named_service`](ServerBuilder::add_named_service)); a name added again
    /// replaces its entry, as it replaces the service.
    services: Vec<(String, &'static [u8], &'static [&'static str])>,
}

impl Server {
    /// A builder with every setting at its default.
    pub fn builder() -> ServerBuilder {
        ServerBuilder {
            config: ServerConfig {
                link: LinkConfig::default(),
                decode: DecodeLimits::default(),
                max_concurrent_requests: DEFAULT_MAX_CONCURRENT_REQUESTS,
                max_connections: DEFAULT_MAX_CONNECTIONS,
                evict_quiet_after: Some(DEFAULT_EVICT_QUIET_AFTER),
                evict_stalled_after: Some(DEFAULT_EVICT_STALLED_AFTER),
                idle_timeout: Some(DEFAULT_IDLE_TIMEOUT),
                drain_timeout: DEFAULT_DRAIN_TIMEOUT,
                dedupe: Some(DedupeConfig::default()),
                stream_window: DEFAULT_STREAM_WINDOW,
                max_concurrent_streams: DEFAULT_MAX_CONCURRENT_STREAMS,
                compression: None,
                keepalive: crate::keepalive::KeepaliveConfig {
                    interval: Some(DEFAULT_KEEPALIVE_INTERVAL),
                    timeout: DEFAULT_KEEPALIVE_TIMEOUT,
                },
                keepalive_min_interval: None,
                max_large_request_bytes: DEFAULT_MAX_LARGE_REQUEST_BYTES,
                max_unsent_answer_bytes: DEFAULT_MAX_UNSENT_ANSWER_BYTES,
            },
            layer: Identity::new(),
            router: Router::default(),
            services: Vec::new(),
        }
    }
}

impl<L> ServerBuilder<L> {
    /// Requests handled at once per connection; at the limit the server reads nothing
    /// more from that connection until a handler finishes. Default:
    /// [`DEFAULT_MAX_CONCURRENT_REQUESTS`]. Large requests (from a 256th of
    /// [`max_frame_len`](Self::max_frame_len), and compressed ones as decompressed)
    /// are bounded by their size too: those in flight may come to 4 ×
    /// `max_frame_len` per connection (`docs/wire.md` §8).
    pub fn max_concurrent_requests(mut self, n: usize) -> Self {
        self.config.max_concurrent_requests = n.max(1);
        self
    }

    /// Streaming calls open at once per connection. They do not count against
    /// [`max_concurrent_requests`](Self::max_concurrent_requests) (a stream's messages
    /// keep flowing while unary calls wait); past this limit a new stream is refused
    /// with `RESOURCE_EXHAUSTED`. Default: [`DEFAULT_MAX_CONCURRENT_STREAMS`].
    pub fn max_concurrent_streams(mut self, n: usize) -> Self {
        self.config.max_concurrent_streams = n.max(1);
        self
    }

    /// Receive window of each streaming call: the bytes of request messages a client
    /// may send beyond what the handler has read. Default: [`DEFAULT_STREAM_WINDOW`].
    pub fn stream_window(mut self, bytes: u32) -> Self {
        self.config.stream_window = bytes.max(1);
        self
    }

    /// Compression of responses (and advertising that compressed requests are
    /// accepted), negotiated with each client: see [`crate::compress`]. Default: `None`
    /// (off).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Unsupported`] if this build does not
    /// have the algorithm asked for (its cargo feature of rpc-core, `zstd` or `gzip`,
    /// is off): an error here rather than a server that silently never compresses.
    /// (The setter is the one place every way of building a server goes through.)
    pub fn compression(
        mut self,
        compression: Option<crate::compress::Compression>,
    ) -> Result<Self, crate::Error> {
        if let Some(compression) = &compression {
            compression.check()?;
        }
        self.config.compression = compression;
        Ok(self)
    }

    /// Bytes of large unary requests the server holds at once, over all its
    /// connections: requests from a 256th of [`max_frame_len`](Self::max_frame_len)
    /// (64 KiB by default), and every compressed one as decompressed, for as long as
    /// their calls last and their bytes live (the handler's copy, an answer that shares
    /// them), whichever is longer: a handler that decodes a request copies its fields
    /// and drops the bytes, and still holds what it copied. A request
    /// that does not fit is answered `RESOURCE_EXHAUSTED` without running (a retry may
    /// go elsewhere, or later). Each connection also stops reading at 4 ×
    /// `max_frame_len` of its own; this bounds what many connections hold together, a
    /// few kilobytes of compressed zeros standing for 16 MiB each. At least
    /// `max_frame_len`. Large messages of request streams (from the same 256th, and
    /// every compressed one as decompressed, when the handler reads it) are charged
    /// too, for as long as their bytes live; one that does not fit ends its stream
    /// `RESOURCE_EXHAUSTED`. The same bound, counted apart, holds every request-stream
    /// message of any size while its handler has not read it, over all connections;
    /// one past it ends its stream `RESOURCE_EXHAUSTED` too. Default:
    /// [`DEFAULT_MAX_LARGE_REQUEST_BYTES`].
    pub fn max_large_request_bytes(mut self, bytes: usize) -> Self {
        self.config.max_large_request_bytes = bytes;
        self
    }

    /// Bytes of finished unary answers the server holds, over all its connections,
    /// for clients that read them slower than they come or not at all. Each
    /// connection holds at most its calls in flight, but each answer may be as long as
    /// `max_frame_len`, and a small request can have a large answer. While the
    /// server's total is over this bound, a connection that holds more than its share
    /// of it (the bound over the connections holding any) is ended when it finds its
    /// link full again (the client is told nothing: it reads nothing; its calls fail as
    /// a lost connection's, possibly run; logged once as the connection's end, with
    /// the figures), its answers dropped. A client that reads its answers is not
    /// touched however large they are: only answers its link cannot take count. Not
    /// counted: streams' messages (bounded per connection by their windows) and
    /// gRPC's (bounded by HTTP/2's windows). Default:
    /// [`DEFAULT_MAX_UNSENT_ANSWER_BYTES`].
    pub fn max_unsent_answer_bytes(mut self, bytes: usize) -> Self {
        self.config.max_unsent_answer_bytes = bytes;
        self
    }

    /// Open connections at once, over all the listeners this server serves (each
    /// `serve` of it and its clones). A connection past it takes the place of a quiet
    /// one (see [`evict_quiet_after`](Self::evict_quiet_after)), or, when none is
    /// quiet, gets GOAWAY `TOO_MANY_CONNECTIONS` and is closed. Default:
    /// [`DEFAULT_MAX_CONNECTIONS`].
    pub fn max_connections(mut self, n: usize) -> Self {
        self.config.max_connections = n.max(1);
        self
    }

    /// At the [`max_connections`](Self::max_connections) limit, a new connection
    /// takes the place of an open one that has had nothing in flight (no call, stream
    /// or exposed bulk buffer) and received no frame, nor any more of a frame partly
    /// received, and written nothing more of what it had queued (see
    /// [`Link::receiving`] and [`Link::unsent`]), for at least this long: the one
    /// quiet longest gets
    /// GOAWAY `NO_ERROR` and is closed, as in a graceful shutdown
    /// (a request that crosses the GOAWAY is not processed), and its client's
    /// next call opens a new connection. So connections that say nothing, or nothing
    /// for a while, cannot lock out the clients that call. Connections seen quiet
    /// are found by a scan of the open connections at the limit (no clock is read
    /// per frame), which takes note of their counts: "for at least this long" means
    /// between two such scans, and a connection is never taken within this long of
    /// its opening. At most 64 chosen connections close at once (each within a
    /// second), so the open connections may exceed the limit by that many for a
    /// moment. `None`: never; a connection past the limit is refused. Default:
    /// [`DEFAULT_EVICT_QUIET_AFTER`] (10 s).
    pub fn evict_quiet_after(mut self, quiet: Option<Duration>) -> Self {
        self.config.evict_quiet_after = quiet;
        self
    }

    /// At the [`max_connections`](Self::max_connections) limit, when no connection is
    /// quiet enough to close ([`evict_quiet_after`](Self::evict_quiet_after)), a new
    /// connection takes the place of one whose calls have made no progress for at
    /// least this long: calls (or streams) in flight, but no frame received or sent
    /// other than PINGs and PONGs, no more of a frame partly received and nothing more
    /// written. The one stalled longest gets GOAWAY `NO_ERROR` (reason `server is at
    /// its connection limit and the calls of this connection made no progress...`)
    /// and is closed with its calls, whose handlers are dropped (keyed calls run on,
    /// as when any connection closes) and whose client sees them fail `UNAVAILABLE`.
    /// Without it, streams opened and left silent by a peer that answers keepalive
    /// PINGs held their connections for ever, and enough of them locked every new
    /// client out. Found by the same scans as quiet connections; needs
    /// `evict_quiet_after` set. A legitimate call that waits longer than this with
    /// nothing to say (a subscription that rarely has news) is at risk only while the
    /// server is at its limit and nothing quieter is there to close. `None`: never;
    /// connections with calls in flight keep their place. Default:
    /// [`DEFAULT_EVICT_STALLED_AFTER`] (60 s).
    pub fn evict_stalled_after(mut self, stalled: Option<Duration>) -> Self {
        self.config.evict_stalled_after = stalled;
        self
    }

    /// Close connections with no calls for this long; `None` keeps them open. Default:
    /// [`DEFAULT_IDLE_TIMEOUT`].
    pub fn idle_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.config.idle_timeout = timeout;
        self
    }

    /// Keepalive: after this long without a frame from the client while calls are in
    /// flight on its connection (or at any time if the [idle
    /// timeout](Self::idle_timeout) is off), the server sends a PING; if nothing at all
    /// arrives within the [`keepalive_timeout`](Self::keepalive_timeout) after it, the
    /// client is gone: the connection is closed and its handlers are dropped (keyed
    /// calls run on for their retries, as on any close). Idle connections are left to
    /// the idle timeout. Silence is checked lazily, so the PING goes out after between
    /// one and two intervals; while the server has stopped reading a connection at its
    /// limits, silence is not held against the client. `None` turns it off. Default:
    /// [`DEFAULT_KEEPALIVE_INTERVAL`] (60 s). Not on `grpc://` links, whose HTTP/2 does
    /// not carry the core's PINGs.
    pub fn keepalive_interval(mut self, interval: Option<Duration>) -> Self {
        self.config.keepalive.interval = interval.map(|i| i.max(Duration::from_millis(1)));
        self
    }

    /// How long after a keepalive PING the server waits for any frame before it closes
    /// the connection (see [`keepalive_interval`](Self::keepalive_interval)). Over links
    /// that may lose frames (UDP) the PING is sent three times within it. Default:
    /// [`DEFAULT_KEEPALIVE_TIMEOUT`] (20 s).
    pub fn keepalive_timeout(mut self, timeout: Duration) -> Self {
        self.config.keepalive.timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// The shortest interval between client PINGs the server tolerates, like gRPC's
    /// ping enforcement: a PING sooner than this after the previous one is a strike,
    /// and after more than two strikes in a row the connection gets GOAWAY
    /// `TOO_MANY_PINGS` and is closed (a PING on time clears the strikes; a copy of the
    /// previous PING, as UDP retransmits it, does not count). `None` answers PINGs at
    /// any rate. Default: `None`: a PING costs the server little, and one flood is
    /// bounded already (PONGs count against the queue of answers the connection holds,
    /// docs/wire.md §8); set it to keep misconfigured clients from pinging every few
    /// milliseconds. Keep it below the clients' keepalive interval (ours: 30 s).
    pub fn keepalive_min_interval(mut self, interval: Option<Duration>) -> Self {
        self.config.keepalive_min_interval = interval;
        self
    }

    /// How long graceful shutdown lets calls in flight finish. Default:
    /// [`DEFAULT_DRAIN_TIMEOUT`].
    pub fn drain_timeout(mut self, timeout: Duration) -> Self {
        self.config.drain_timeout = timeout;
        self
    }

    /// Largest frame accepted from or sent to a client. A longer incoming frame closes
    /// that connection with GOAWAY `FRAME_TOO_LARGE`; a longer response is replaced by
    /// `RESOURCE_EXHAUSTED`. Default:
    /// [`DEFAULT_MAX_FRAME_LEN`](crate::link::DEFAULT_MAX_FRAME_LEN).
    pub fn max_frame_len(mut self, n: usize) -> Self {
        self.config.link.max_frame_len = n;
        self
    }

    /// Largest metadata block accepted from a client. Default:
    /// [`DEFAULT_MAX_METADATA_LEN`](crate::frame::DEFAULT_MAX_METADATA_LEN).
    pub fn max_metadata_len(mut self, n: usize) -> Self {
        self.config.decode.max_metadata_len = n;
        self.config.link.max_metadata_len = n;
        self
    }

    /// The duplicate cache behind at-most-once execution of calls that carry a call key
    /// (the client's retry layer adds one to calls it may retry although their method
    /// is not safe to repeat). `None` turns it off: a retried keyed call is then refused
    /// with `FAILED_PRECONDITION` rather than run a second time. Default:
    /// `Some(DedupeConfig::default())`.
    pub fn duplicate_cache(mut self, config: Option<DedupeConfig>) -> Self {
        self.config.dedupe = config;
        self
    }

    /// Wraps every service added after this call in `layer`. The first layer added is
    /// the outermost: it sees each call first (add authentication before
    /// authorization).
    pub fn layer<N>(self, layer: N) -> ServerBuilder<Stack<N, L>> {
        ServerBuilder {
            config: self.config,
            layer: Stack::new(layer, self.layer),
            router: self.router,
            services: self.services,
        }
    }

    /// Adds a service under its [`NamedService::NAME`].
    pub fn add_service<S>(self, service: S) -> Self
    where
        S: NamedService,
        L: Layer<S>,
        L::Service: Service<ServerCall, Response = ServerReply, Error = Status>
            + Clone
            + Send
            + Sync
            + 'static,
        <L::Service as Service<ServerCall>>::Future: Send + 'static,
    {
        let mut builder = self.add_routed(S::NAME, S::METHODS, service);
        builder.record(S::NAME, S::FILE_DESCRIPTOR_SET, S::UNARY_METHODS);
        builder
    }

    /// Adds a service under an explicit `package.Service` name. It is recorded in
    /// [`services`](Self::services) with no descriptors, and handed every method name
    /// under its prefix (see [`NamedService::METHODS`]).
    pub fn add_named_service<S>(self, name: &str, service: S) -> Self
    where
        L: Layer<S>,
        L::Service: Service<ServerCall, Response = ServerReply, Error = Status>
            + Clone
            + Send
            + Sync
            + 'static,
        <L::Service as Service<ServerCall>>::Future: Send + 'static,
    {
        self.add_routed(name, &[], service)
    }

    /// Adds `service` under `name`, answering names not in `methods` (unless it is
    /// empty) with `UNIMPLEMENTED` in the router.
    fn add_routed<S>(mut self, name: &str, methods: &'static [&'static str], service: S) -> Self
    where
        L: Layer<S>,
        L::Service: Service<ServerCall, Response = ServerReply, Error = Status>
            + Clone
            + Send
            + Sync
            + 'static,
        <L::Service as Service<ServerCall>>::Future: Send + 'static,
    {
        let service = self.layer.layer(service);
        self.router
            .add(name.to_owned(), methods, BoxService::new(service));
        self.record(name, &[], &[]);
        self
    }

    /// The services added so far, in the order they were first added: each one's
    /// `package.Service` name and encoded `FileDescriptorSet`
    /// ([`NamedService::FILE_DESCRIPTOR_SET`]; empty when unknown). What server
    /// reflection (`rpc_services::ServerBuilderExt::add_reflection`) describes.
    ///
    /// ```
    /// use rpc_core::{server::{Server, ServerCall, ServerReply}, Status};
    /// let echo = tower::service_fn(|_call: ServerCall| async { Ok::<_, Status>(ServerReply::default()) });
    /// let builder = Server::builder()
    ///     .add_named_service("demo.Echo", echo)
    ///     .add_named_service("demo.Echo", echo); // replaces the first
    /// let services: Vec<(&str, &[u8])> = builder.services().collect();
    /// assert_eq!(services, [("demo.Echo", &[][..])]);
    /// ```
    pub fn services(&self) -> impl Iterator<Item = (&str, &'static [u8])> + '_ {
        self.services
            .iter()
            .map(|(name, descriptors, _)| (name.as_str(), *descriptors))
    }

    /// Records a service added under `name`, replacing an earlier one of that name.
    fn record(&mut self, name: &str, descriptors: &'static [u8], unary: &'static [&'static str]) {
        match self.services.iter_mut().find(|(known, _, _)| known == name) {
            Some(entry) => (entry.1, entry.2) = (descriptors, unary),
            None => self.services.push((name.to_owned(), descriptors, unary)),
        }
    }

    /// Finishes building. The [`Server`] can serve several listeners at once.
    pub fn build(mut self) -> Server {
        self.config.link.unary_methods =
            UnaryMethods::new(self.services.iter().flat_map(|(service, _, methods)| {
                methods.iter().map(move |m| format!("{service}/{m}"))
            }));
        let cache = self
            .config
            .dedupe
            .clone()
            .map(|config| Arc::new(std::sync::Mutex::new(dedupe::DuplicateCache::new(config))));
        let large = held::LargeBudget::new(
            self.config
                .max_large_request_bytes
                .max(self.config.link.max_frame_len),
            self.config.max_unsent_answer_bytes,
        );
        Server {
            inner: Arc::new(Inner {
                config: self.config,
                router: self.router,
                cache,
                large,
                open: Arc::default(),
                registry: Arc::default(),
            }),
        }
    }

    /// Shorthand for `build().serve(listener)`.
    pub async fn serve<T: Listener>(self, listener: T) -> Result<(), Error> {
        self.build().serve(listener).await
    }

    /// Shorthand for `build().serve_with_shutdown(listener, signal)`.
    pub async fn serve_with_shutdown<T: Listener>(
        self,
        listener: T,
        signal: impl Future<Output = ()> + Send,
    ) -> Result<(), Error> {
        self.build().serve_with_shutdown(listener, signal).await
    }
}

struct Inner {
    config: ServerConfig,
    router: Router,
    cache: Option<SharedCache>,
    /// Large request bytes held across every connection.
    large: Arc<held::LargeBudget>,
    /// Connections open across every listener this server serves.
    open: Arc<std::sync::atomic::AtomicUsize>,
    /// The open connections' counters, and the totals of the closed ones.
    registry: Arc<stats::Registry>,
}

/// A built server: services plus settings. Cheap to clone.
///
/// ```
/// use rpc_core::{link::mem, server::{Server, ServerCall, ServerReply}, Status};
/// # use rpc_core::{client::{Channel, Client}, method::{Idempotency, MethodDescriptor}, Request};
/// # static SAY: MethodDescriptor = MethodDescriptor { service: "demo.Echo", method: "Say",
/// #     path: "demo.Echo/Say", idempotency: Idempotency::NoSideEffects };
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // A hand-written service; usually a generated one: `EchoServer::new(MyEcho)`.
/// let echo = tower::service_fn(|call: ServerCall| async move {
///     Ok::<_, Status>(ServerReply { payload: call.payload.into(), ..ServerReply::default() })
/// });
/// let server = Server::builder()
///     .max_concurrent_requests(64)
///     .add_named_service("demo.Echo", echo) // or .add_service(EchoServer::new(MyEcho))
///     .build();
/// // In memory here; a transport gives the same (`rpc_transport_tcp::bind(uri)`).
/// let (listener, connector) = mem::listener();
/// let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
/// let serving = tokio::spawn(async move {
///     server.serve_with_shutdown(listener, async { stopped.await.ok(); }).await
/// });
/// # let mut client = Client::new(Channel::builder().connect(connector).await?);
/// # client.unary::<_, String>(Request::new("hi".to_string()), &SAY).await?;
/// stop.send(()).ok(); // graceful: GOAWAY, the calls in flight finish
/// serving.await??;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Server {
    inner: Arc<Inner>,
}

impl fmt::Debug for Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Server")
            .field("services", &self.inner.router.names().collect::<Vec<_>>())
            .field("config", &self.inner.config)
            .finish()
    }
}

impl Server {
    /// Connections open right now, across every listener this server serves.
    pub fn open_connections(&self) -> usize {
        self.inner.open.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Every open connection across the listeners this server serves, oldest first:
    /// its peer, age, calls in flight and what it carried (counts at most one poll of
    /// its task old). Takes a lock the accept loop also takes: for a status page or a
    /// scrape, not for every call.
    pub fn connections(&self) -> Vec<ConnectionInfo> {
        self.inner.registry.connections()
    }

    /// Totals across every connection this server served, closed ones included:
    /// connections, requests, bytes and frames each way, requests whose deadline
    /// passed before their handler started.
    pub fn stats(&self) -> ServerStats {
        self.inner.registry.stats()
    }

    /// What the duplicate cache did so far (`None` if it is off).
    pub fn dedupe_stats(&self) -> Option<Arc<DedupeStats>> {
        let cache = self.inner.cache.as_ref()?;
        let cache = cache.lock().unwrap_or_else(|e| e.into_inner());
        Some(cache.stats().clone())
    }

    /// At the connection limit: ends a quiet connection to make room for a new one
    /// (see [`ServerBuilder::evict_quiet_after`]) and counts the new one in its place
    /// at once; the quiet one leaves the count when its task ends, moments later.
    fn evict_quiet(&self) -> bool {
        let Some(quiet) = self.inner.config.evict_quiet_after else {
            return false;
        };
        let stalled = self.inner.config.evict_stalled_after;
        let Some((peer, busy)) = self.inner.registry.evict_quiet(quiet, stalled) else {
            return false;
        };
        if busy {
            tracing::info!(
                evicted = %peer,
                "connection limit reached: closing the connection whose calls made no \
                 progress longest, and its calls, to make room"
            );
        } else {
            tracing::debug!(
                evicted = %peer,
                "connection limit reached: closing the connection quiet longest to make room"
            );
        }
        self.inner
            .open
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        true
    }

    /// Serves `listener` until it fails.
    pub async fn serve<T: Listener>(&self, listener: T) -> Result<(), Error> {
        self.serve_with_shutdown(listener, std::future::pending())
            .await
    }

    /// Serves `listener` until `signal` completes, then shuts down gracefully: stops
    /// accepting (new connections are refused), sends GOAWAY on every connection,
    /// answers requests that arrive after it with `UNAVAILABLE`, lets the calls in
    /// flight finish for up to the drain timeout, then aborts what is left. Keyed
    /// calls' handlers (which go on after their connection closes or their client
    /// cancels, for a retry to find their outcome) have the drain too; those left at
    /// its end are stopped and their outcome recorded as `ABORTED` ("stopped, maybe
    /// part way").
    ///
    /// Connection tasks belong to this future: dropping it aborts them all.
    pub async fn serve_with_shutdown<T: Listener>(
        &self,
        mut listener: T,
        signal: impl Future<Output = ()> + Send,
    ) -> Result<(), Error> {
        let config = &self.inner.config;
        let shutdown = CancellationToken::new();
        // The keyed handlers its connections start, which outlive their connection (to
        // record their outcome for a retry) but not this: the drain waits for them, and
        // those left are stopped when this function returns, however it does (dropped
        // too).
        let keyed = Arc::new(connection::KeyedRuns::default());
        let _stop_keyed = keyed.stop.clone().drop_guard();
        let mut connections = JoinSet::new();
        // Connections over the limit being told so, off the accept loop.
        let mut rejecting = JoinSet::new();
        tracing::info!(addr = %listener.local_addr(), "serving");
        tokio::pin!(signal);
        loop {
            tokio::select! {
                _ = &mut signal => break,
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
                Some(_) = rejecting.join_next(), if !rejecting.is_empty() => {}
                accepted = listener.accept(&config.link) => match accepted {
                    // Server-wide: a place among every listener's connections, taken
                    // in one step (a check then an increment let listeners accepting
                    // at once overshoot the limit by one each).
                    Ok(link) if !reserve(&self.inner.open, config.max_connections)
                        && !self.evict_quiet() =>
                    {
                        self.inner.registry.count_refused_at_limit();
                        static AT_LIMIT: crate::logs::LogLimiter =
                            crate::logs::LogLimiter::for_refusals();
                        if let Some(suppressed) = AT_LIMIT.allow() {
                            tracing::warn!(peer = %link.peer(), limit = config.max_connections, suppressed, "connection limit reached");
                        }
                        // Told in their own tasks (up to 100 ms each, for a peer that
                        // does not read), so that accepting goes on; past that many at
                        // once, closed without a word.
                        if rejecting.len() < MAX_REJECTING {
                            rejecting.spawn(reject(link, config.max_connections));
                        }
                    }
                    Ok(link) => {
                        // Its place, taken by `reserve`, is given back however the task
                        // ends (finished or aborted).
                        let guard = OpenGuard(self.inner.open.clone());
                        tracing::debug!(peer = %link.peer(), "connection opened");
                        let conn = connection::Connection::new(
                            link,
                            self.inner.router.clone(),
                            self.inner.config.clone(),
                            self.inner.cache.clone(),
                            self.inner.large.clone(),
                            shutdown.clone(),
                            keyed.clone(),
                            &self.inner.registry,
                        );
                        // Not an `async` block: that would hold the connection twice
                        // (the captured value and the one being awaited), doubling the
                        // task's size.
                        connections.spawn(futures::FutureExt::map(conn, move |()| drop(guard)));
                    }
                    Err(err) if err.kind() == ErrorKind::Closed => return Err(err),
                    Err(err) => {
                        // Typically out of file descriptors: back off instead of spinning.
                        tracing::warn!(error = %err, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        }
        listener.stop_accepting();
        // Dropped now (new peers are refused at once), unless its links need it.
        let _kept = listener.links_need_listener().then_some(listener);
        shutdown.cancel();
        let drained = tokio::time::timeout(config.drain_timeout, async {
            while connections.join_next().await.is_some() {}
            // Keyed calls whose connection has closed (or was told CANCEL) run on:
            // their outcome is still wanted by a retry; they have the drain too.
            keyed.idle().await;
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                left = connections.len(),
                "drain timeout: closing the connections left, aborting their calls in flight"
            );
            connections.shutdown().await;
        }
        Ok(())
    }
}

/// Counts one more open connection in `open` unless it holds `max` already.
fn reserve(open: &std::sync::atomic::AtomicUsize, max: usize) -> bool {
    use std::sync::atomic::Ordering::Relaxed;
    open.fetch_update(Relaxed, Relaxed, |n| (n < max).then_some(n + 1))
        .is_ok()
}

/// Decrements the open-connection count when a connection task ends.
struct OpenGuard(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Connections over the limit told why at once, each for up to 100 ms ([`reject`]).
const MAX_REJECTING: usize = 64;

/// Tells a connection over the limit why it is closed, without waiting on it for long.
async fn reject<L: Link>(mut link: L, limit: usize) {
    let mut buf = bytes::BytesMut::new();
    frame::encode_goaway(
        &mut buf,
        0,
        GoAwayCode::TOO_MANY_CONNECTIONS,
        &format!("server is at its limit of {limit} connections"),
    );
    let mut sent = false;
    let send = futures::future::poll_fn(|cx| {
        if !sent {
            futures::ready!(link.poll_ready(cx))?;
            link.start_send(&buf, Payload::new())?;
            sent = true;
        }
        link.poll_close(cx)
    });
    let _ = tokio::time::timeout(Duration::from_millis(100), send).await;
}

#[cfg(test)]
mod tests {
    use std::sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    };

    /// Listeners accepting at once each take a place in one step: never more than the
    /// limit, however they interleave (a check then an increment let each of them
    /// pass the check before any counted).
    #[test]
    fn places_reserved_at_once_never_exceed_the_limit() {
        const MAX: usize = 100;
        let open = Arc::new(AtomicUsize::new(0));
        let taken = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (open, taken) = (open.clone(), taken.clone());
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        if super::reserve(&open, MAX) {
                            taken.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        assert_eq!(taken.load(Ordering::Relaxed), MAX);
        assert_eq!(open.load(Ordering::Relaxed), MAX);
        // A place given back can be taken again.
        open.fetch_sub(1, Ordering::Relaxed);
        assert!(super::reserve(&open, MAX));
        assert!(!super::reserve(&open, MAX));
    }
}

//! [`GrpcConfig`]: the HTTP/2 limits of a gRPC listener or connector.

use std::time::Duration;

/// Streams one connection may have open at once (HTTP/2 `SETTINGS_MAX_CONCURRENT_STREAMS`
/// of a server): the server core's own default stream limit, so that a client waits at
/// the HTTP/2 level instead of meeting `RESOURCE_EXHAUSTED` from the core.
pub const DEFAULT_MAX_CONCURRENT_STREAMS: u32 = 256;

/// Largest header block accepted (`SETTINGS_MAX_HEADER_LIST_SIZE`): four times the
/// core's metadata limit (64 KiB). Headers within it but over the metadata limit get
/// a gRPC status (`RESOURCE_EXHAUSTED`) from the link, which a gRPC client reports as
/// such; over it, the link answers HTTP 431 with `grpc-status` 8 (which gRPC clients
/// report as `RESOURCE_EXHAUSTED` too),
/// and a header block joined from HEADERS and CONTINUATION frames of more than twice
/// it plus 16 KiB ends the connection (GOAWAY `ENHANCE_YOUR_CALM`, `docs/grpc.md`).
/// grpc-go accepts 16 MiB by default and grpc-core 16 KiB; a larger bound lets a peer
/// make the connection hold a larger header block while it is joined and decoded.
pub const DEFAULT_MAX_HEADER_LIST_SIZE: u32 = 4 * rpc_core::frame::DEFAULT_MAX_METADATA_LEN as u32;

/// Largest HTTP/2 frame payload accepted (`SETTINGS_MAX_FRAME_SIZE`, what the peer may
/// send): 256 KiB, so that a peer that honours it (this crate does) sends a 1 MiB
/// message in 4 DATA frames rather than HTTP/2's minimum of 16 KiB's 64 (a bulk
/// echo costs about a third fewer instructions, measured on the h2-based link). A peer
/// can so make a connection hold one frame of that size in its read buffer (the link
/// reads 64 KiB ahead, and makes room for the rest of a longer frame only once 64 KiB
/// of it came). It also bounds a header block sent in one HEADERS frame.
/// What this side sends is bounded by the peer's own setting (16 KiB for most).
pub const DEFAULT_MAX_FRAME_SIZE: u32 = 256 * 1024;

/// Per-stream receive window: what a peer may send on one stream before the
/// application has read it; the core's default stream window.
pub const DEFAULT_STREAM_WINDOW: u32 = 1024 * 1024;

/// Connection receive window: bounds what all streams of a connection together hold
/// unread.
pub const DEFAULT_CONNECTION_WINDOW: u32 = 4 * 1024 * 1024;

/// No effect since the links run their own HTTP/2 (kept so that code setting it compiles): it was the bytes
/// h2 buffered per stream for sending (h2's default). What waits to be sent is now
/// bounded by the core's credit per stream, the server link's hold on new calls, and
/// the link's output buffer (`docs/grpc.md`, "Flow control and bounded memory").
#[deprecated(note = "no effect since the gRPC links run their own HTTP/2 (it was an h2 setting)")]
pub const DEFAULT_MAX_SEND_BUFFER_SIZE: usize = 400 * 1024;

/// No effect since the links run their own HTTP/2 (kept so that code setting it compiles): it was h2's
/// rapid-reset (CVE-2023-44487) bound on streams a peer opened and reset before the
/// server accepted them (h2's default of 20 closed the connections of grpcio clients
/// that cancelled a few hundred calls at once). Every call a peer resets before it is
/// answered now spends the link's budget ([`DEFAULT_MAX_PEER_RESETS`]).
#[deprecated(note = "no effect since the gRPC links run their own HTTP/2 (it was an h2 setting)")]
pub const DEFAULT_MAX_PENDING_ACCEPT_RESET_STREAMS: usize = 1_000;

/// No effect since the links run their own HTTP/2 (kept so that code naming it
/// compiles): it was how long h2 remembered a stream this side reset (h2 0.4.21's
/// default), so that frames the peer had already sent on it were ignored. The links'
/// HTTP/2 ignores frames on a stream it closed however late they come (their DATA's
/// connection window is given back).
#[deprecated(note = "no effect since the gRPC links run their own HTTP/2 (it was an h2 setting)")]
pub const DEFAULT_RESET_STREAM_DURATION: Duration = Duration::from_secs(5);

/// No effect since the links run their own HTTP/2 (kept so that code naming it
/// compiles): it was how many streams this side reset h2 remembered (h2 0.4.21's
/// default); see [`DEFAULT_RESET_STREAM_DURATION`].
#[deprecated(note = "no effect since the gRPC links run their own HTTP/2 (it was an h2 setting)")]
pub const DEFAULT_MAX_CONCURRENT_RESET_STREAMS: usize = 8192;

/// Streams a connection may reset because the peer misbehaved on them (a stream error:
/// DATA past a stream's window or after its end, a malformed header block) or refuse
/// because the peer opened more than `SETTINGS_MAX_CONCURRENT_STREAMS` allows, over
/// the connection's life, before it closes the connection with GOAWAY
/// `ENHANCE_YOUR_CALM`: each costs the connection a reset to write and the peer
/// nothing. The h2 crate's default for the same bound.
pub const DEFAULT_MAX_LOCAL_ERROR_RESET_STREAMS: usize = 1024;

/// Calls a peer may reset (RST_STREAM) before they are answered, whether or not the
/// core had them yet, in a burst, before the connection is closed with GOAWAY
/// ENHANCE_YOUR_CALM: the server's rapid-reset (CVE-2023-44487) bound. The budget
/// refills at this many per [`DEFAULT_PEER_RESET_PERIOD`]. Deadlines count: a client's calls
/// that expire in a burst against a slow server are cancelled with RST_STREAM, and
/// gRPC servers (grpcio, grpc-go) keep such a connection. So the budget is set for an
/// attack, which resets tens of thousands of streams a second or more: 10,000 a
/// second still ends one within a fraction of a second, while a client whose calls
/// are cancelled by the thousand keeps its connection. (It was 200 per 10 s, then
/// 1,000 a second: 3,000 calls a grpcio client cancelled within a second, as a
/// grpc-core server takes them, closed the connection and failed every other call on
/// it.)
pub const DEFAULT_MAX_PEER_RESETS: u32 = 10_000;

/// The period over which [`DEFAULT_MAX_PEER_RESETS`] refills (10,000 resets a second,
/// sustained).
pub const DEFAULT_PEER_RESET_PERIOD: Duration = Duration::from_secs(1);

/// Default time a keepalive PING may go unanswered before the connection is closed
/// (gRPC's default keepalive timeout).
pub const DEFAULT_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// Default interval of the server's keepalive PINGs
/// ([`GrpcConfig::server_keepalive_interval`]): the core's own server keepalive
/// interval. With the default timeout, a client gone without a reset is closed between
/// 80 and 88 s after the last bytes read from it: the PING goes once 60 s passed
/// without reading anything, noticed within an eighth of the interval (7.5 s), and the
/// connection closes 20 s later. (The silence used to be looked at once per
/// interval, from the connection's start, so a client that sent its last frame just
/// after a look was PINGed at 120 s and closed at 140 s; the core's own wire still
/// looks once per interval: up to `2 × interval + timeout`, `rpc_core::keepalive`.)
pub const DEFAULT_SERVER_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(60);

/// Control frames (PING, SETTINGS, PRIORITY, WINDOW_UPDATE, RST_STREAM, GOAWAY, frames
/// of unknown types, empty DATA) a server takes from a client (and a client from a
/// server), less 8 for each HEADERS
/// or DATA frame either way (a DATA frame read: of 1 KiB or more, or ending its
/// stream) ([`GrpcConfig::control_frame_budget`]), within
/// [`DEFAULT_CONTROL_FRAME_PERIOD`] of the first, before it closes the connection with
/// GOAWAY `ENHANCE_YOUR_CALM`. Calls pay for their own control frames, so the
/// WINDOW_UPDATEs and BDP PINGs of a download and the RST_STREAMs of cancels never
/// count up, and a call now and then does not pay for a flood; keepalive PINGs on an idle connection come
/// a few a second at the very most (grpc-go's servers allow one per 5 minutes), 1,000
/// in 10 s is far past any client's, and far below a flood's (before this bound, the
/// h2-based link answered 74,000 PINGs a second to one reading attacker).
pub const DEFAULT_MAX_CONTROL_FRAMES: u32 = 1_000;

/// See [`DEFAULT_MAX_CONTROL_FRAMES`]: a peer that sends only control frames is held
/// to 1,000 per 10 s, 100 a second.
pub const DEFAULT_CONTROL_FRAME_PERIOD: Duration = Duration::from_secs(10);

/// How long a new connection may take to send the HTTP/2 preface and its first
/// SETTINGS frame (and a header block to be whole); a client, for the server's first
/// SETTINGS frame: the TLS listener's handshake timeout.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The HTTP/2 settings and limits of a [`GrpcListener`](crate::GrpcListener) or
/// [`GrpcConnector`](crate::GrpcConnector). The message size limit comes from the
/// core's [`LinkConfig`](rpc_core::link::LinkConfig) (`max_frame_len`), unless
/// [`max_message_len`](Self::max_message_len) sets a lower one.
#[derive(Clone, Debug)]
pub struct GrpcConfig {
    pub(crate) max_concurrent_streams: u32,
    pub(crate) max_header_list_size: u32,
    pub(crate) max_frame_size: u32,
    pub(crate) stream_window: u32,
    pub(crate) connection_window: u32,
    pub(crate) max_local_error_reset_streams: usize,
    pub(crate) max_peer_resets: u32,
    pub(crate) peer_reset_period: Duration,
    pub(crate) handshake_timeout: Duration,
    pub(crate) max_message_len: Option<usize>,
    pub(crate) keepalive_interval: Option<Duration>,
    pub(crate) keepalive_timeout: Duration,
    pub(crate) server_keepalive_interval: Option<Duration>,
    pub(crate) max_control_frames: u32,
    pub(crate) control_frame_period: Duration,
    pub(crate) authority: Option<String>,
}

impl Default for GrpcConfig {
    fn default() -> Self {
        GrpcConfig {
            authority: None,
            max_concurrent_streams: DEFAULT_MAX_CONCURRENT_STREAMS,
            max_header_list_size: DEFAULT_MAX_HEADER_LIST_SIZE,
            max_frame_size: DEFAULT_MAX_FRAME_SIZE,
            stream_window: DEFAULT_STREAM_WINDOW,
            connection_window: DEFAULT_CONNECTION_WINDOW,
            max_local_error_reset_streams: DEFAULT_MAX_LOCAL_ERROR_RESET_STREAMS,
            max_peer_resets: DEFAULT_MAX_PEER_RESETS,
            peer_reset_period: DEFAULT_PEER_RESET_PERIOD,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            max_message_len: None,
            keepalive_interval: None,
            keepalive_timeout: DEFAULT_KEEPALIVE_TIMEOUT,
            server_keepalive_interval: Some(DEFAULT_SERVER_KEEPALIVE_INTERVAL),
            max_control_frames: DEFAULT_MAX_CONTROL_FRAMES,
            control_frame_period: DEFAULT_CONTROL_FRAME_PERIOD,
        }
    }
}

impl GrpcConfig {
    /// The defaults.
    pub fn new() -> GrpcConfig {
        GrpcConfig::default()
    }

    /// Client side: the `:authority` of every request, instead of the address's
    /// `host:port`: the name a replica found by name (`dns+grpc://`) is reached by,
    /// for the proxies and virtual hosts that route on it (gRPC's rule: the
    /// `:authority` is the target's name, not the address connected to). Checked when a
    /// call is made: one that is not a URI authority
    /// ([`is_valid_authority`](crate::is_valid_authority)) fails the calls with
    /// `INTERNAL`.
    /// Default: `None` (the address's).
    pub fn authority(mut self, authority: impl Into<String>) -> Self {
        self.authority = Some(authority.into());
        self
    }

    /// The `:authority` [`authority`](Self::authority) set, if any.
    pub fn authority_override(&self) -> Option<&str> {
        self.authority.as_deref()
    }

    /// Streams a client may open at once on one connection (server side). Keep it at
    /// or below the server's `max_concurrent_streams`. Default:
    /// [`DEFAULT_MAX_CONCURRENT_STREAMS`].
    pub fn max_concurrent_streams(mut self, max: u32) -> Self {
        self.max_concurrent_streams = max.max(1);
        self
    }

    /// Largest header block accepted. Default: [`DEFAULT_MAX_HEADER_LIST_SIZE`].
    pub fn max_header_list_size(mut self, max: u32) -> Self {
        self.max_header_list_size = max;
        self
    }

    /// Largest HTTP/2 frame payload accepted (16 KiB to 16 MiB - 1). Default:
    /// [`DEFAULT_MAX_FRAME_SIZE`].
    pub fn max_frame_size(mut self, max: u32) -> Self {
        self.max_frame_size = max.clamp(16 * 1024, (1 << 24) - 1);
        self
    }

    /// Per-stream receive window. Default: [`DEFAULT_STREAM_WINDOW`].
    pub fn stream_window(mut self, window: u32) -> Self {
        self.stream_window = window.clamp(1, i32::MAX as u32);
        self
    }

    /// Connection receive window. Default: [`DEFAULT_CONNECTION_WINDOW`].
    pub fn connection_window(mut self, window: u32) -> Self {
        self.connection_window = window.clamp(1, i32::MAX as u32);
        self
    }

    /// No effect since the links run their own HTTP/2 (kept so that code setting it compiles) (it was h2's
    /// bytes buffered per stream for sending). Default: [`DEFAULT_MAX_SEND_BUFFER_SIZE`].
    #[deprecated(
        note = "no effect since the gRPC links run their own HTTP/2 (it was an h2 setting)"
    )]
    pub fn max_send_buffer_size(self, max: usize) -> Self {
        let _ = max;
        self
    }

    /// No effect since the links run their own HTTP/2 (kept so that code setting it compiles) (it was h2's
    /// bound on streams reset by the peer before being accepted; see
    /// [`peer_reset_budget`](Self::peer_reset_budget)). Default:
    /// [`DEFAULT_MAX_PENDING_ACCEPT_RESET_STREAMS`].
    #[deprecated(
        note = "no effect since the gRPC links run their own HTTP/2 (it was an h2 setting)"
    )]
    pub fn max_pending_accept_reset_streams(self, max: usize) -> Self {
        let _ = max;
        self
    }

    /// Streams this side may reset for the peer's errors, or refuse past the stream
    /// limit, over a connection's life before it closes the connection with GOAWAY
    /// `ENHANCE_YOUR_CALM`. Default: [`DEFAULT_MAX_LOCAL_ERROR_RESET_STREAMS`].
    pub fn max_local_error_reset_streams(mut self, max: usize) -> Self {
        self.max_local_error_reset_streams = max;
        self
    }

    /// The rapid-reset budget of a server connection: at most `max` calls reset by the
    /// peer before they were answered, refilling at `max` per `period`; beyond it
    /// the connection is closed with GOAWAY ENHANCE_YOUR_CALM. Default:
    /// [`DEFAULT_MAX_PEER_RESETS`] per [`DEFAULT_PEER_RESET_PERIOD`].
    pub fn peer_reset_budget(mut self, max: u32, period: Duration) -> Self {
        self.max_peer_resets = max.max(1);
        self.peer_reset_period = period.max(Duration::from_millis(1));
        self
    }

    /// The most control frames (PING, SETTINGS, PRIORITY, WINDOW_UPDATE,
    /// RST_STREAM, GOAWAY, frames of types HTTP/2 does not define, empty DATA without
    /// END_STREAM) a client may send a server, or a server a client, within `period`
    /// of the first, less 8 for each
    /// sign of a call (a HEADERS frame read or written, a DATA frame written, a DATA
    /// frame read of 1 KiB or more or with END_STREAM; credit that finds nothing to
    /// pay for is kept, up to `max`, for the control frames that follow, such as the
    /// RST_STREAMs of a burst of cancelled calls); past it the connection is
    /// closed with GOAWAY `ENHANCE_YOUR_CALM`. A peer that sends only control frames
    /// is held to `max` per `period`. The link's HTTP/2 answers PINGs and SETTINGS and
    /// drops PRIORITY and unknown frames; this budget is what limits them. Default:
    /// [`DEFAULT_MAX_CONTROL_FRAMES`] per [`DEFAULT_CONTROL_FRAME_PERIOD`].
    pub fn control_frame_budget(mut self, max: u32, period: Duration) -> Self {
        self.max_control_frames = max.max(1);
        self.control_frame_period = period;
        self
    }

    /// Time allowed for the HTTP/2 preface and settings exchange (on a server, from
    /// the link's start, after the TLS handshake on `grpcs://`, to the end of the
    /// client's first SETTINGS frame; on a client, from the link's start to the
    /// server's first SETTINGS frame), and for a header block to be whole once its
    /// first frame is read. Default:
    /// [`DEFAULT_HANDSHAKE_TIMEOUT`].
    pub fn handshake_timeout(mut self, timeout: Duration) -> Self {
        self.handshake_timeout = timeout;
        self
    }

    /// Client side: sends an HTTP/2 PING every `interval` and closes the connection
    /// when one is not answered within [`keepalive_timeout`](Self::keepalive_timeout),
    /// so that a server gone silent (a host cut off without a reset) fails the calls
    /// at once and the channel reconnects, instead of every call waiting out its
    /// deadline. PINGs go only while calls are in flight on the connection, as gRPC's
    /// clients do by default, and only after an interval in which nothing was read from
    /// the server (as grpc-go: a connection whose frames arrive needs no PING). Off by default, as in gRPC: servers limit how often
    /// clients may PING (grpc-go's default allows one every 5 minutes while no data
    /// flows and closes the connection with `too_many_pings` otherwise), so pick an
    /// interval the server permits; a server that closes a connection with GOAWAY
    /// `ENHANCE_YOUR_CALM` doubles the interval of the connector's later connections
    /// (gRPC's keepalive.md), each time it does. The core's own keepalive
    /// (`ChannelBuilder::keepalive_interval`) does not apply to this wire. Default:
    /// `None` (off).
    pub fn keepalive_interval(mut self, interval: Option<Duration>) -> Self {
        self.keepalive_interval = interval.map(|i| i.max(Duration::from_millis(1)));
        self
    }

    /// Server side: sends an HTTP/2 PING once `interval` has passed without reading
    /// anything from the client (a client heard from needs none, and a PING queued
    /// behind a large answer to a slow reader could wait past the timeout; the silence
    /// is looked at every eighth of the interval, so the PING goes between 1 and 1.125
    /// intervals after the last bytes read), and closes the
    /// connection when one is not answered within
    /// [`keepalive_timeout`](Self::keepalive_timeout)
    /// (aborting its calls), so that a client gone without a reset (a host cut off, a
    /// half-open connection) does not hold its calls and their handlers for ever: a
    /// stream with no deadline waiting for a message that never comes, a unary call
    /// waiting for its request. Clients answer PINGs at any rate (the limits gRPC
    /// peers enforce are on PINGs a *server* receives). `None` turns it off.
    /// Default: [`DEFAULT_SERVER_KEEPALIVE_INTERVAL`].
    pub fn server_keepalive_interval(mut self, interval: Option<Duration>) -> Self {
        self.server_keepalive_interval = interval.map(|i| i.max(Duration::from_millis(1)));
        self
    }

    /// How long a keepalive PING (the client's or the server's) may go unanswered.
    /// Default: [`DEFAULT_KEEPALIVE_TIMEOUT`].
    pub fn keepalive_timeout(mut self, timeout: Duration) -> Self {
        self.keepalive_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// Largest message accepted from the peer, as received and, when it came
    /// compressed, as decompressed; a longer one ends its call with
    /// `RESOURCE_EXHAUSTED` (and resets that stream only). Default: the core's
    /// `max_frame_len` less a frame header.
    pub fn max_message_len(mut self, max: usize) -> Self {
        self.max_message_len = Some(max);
        self
    }

    pub(crate) fn message_limit(&self, max_frame_len: usize) -> usize {
        let core = max_frame_len.saturating_sub(rpc_core::frame::HEADER_LEN);
        self.max_message_len.map_or(core, |max| max.min(core))
    }
}

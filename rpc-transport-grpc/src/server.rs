//! The server side: [`GrpcListener`] accepts h2c connections, and each
//! [`GrpcServerLink`] runs one connection's HTTP/2 (`crate::http2`) from the core's own
//! connection task: it reads the socket, turns each incoming stream into the core's
//! REQUEST, DATA and CANCEL frames, and the core's answers into response headers,
//! messages and trailers, which it writes to the socket itself. No task of its own, no
//! header maps: a call's header block is decoded into the fields it names and the
//! core's frames are written into HPACK blocks and DATA frames directly.
//!
//! gRPC's wire does not say whether a method is unary, so a call of a method the
//! server does not list as unary becomes a *streaming* REQUEST (`FLAG_STREAMING`, its
//! messages in DATA frames), which the core's generated servers read a unary method's
//! one message from (`rpc_core::codegen::unary_request`); a call of a listed unary
//! method whose whole request is here goes to the core as a unary REQUEST.
//! `docs/grpc.md` has the whole mapping.

use std::{
    collections::{HashMap, VecDeque},
    future::Future,
    io,
    net::SocketAddr,
    pin::Pin,
    task::{Context, Poll},
    time::{Duration, Instant},
};

use bytes::{Bytes, BytesMut};
use rpc_core::{
    compress::Algorithm,
    frame::{self, Frame, GoAwayCode},
    link::{LazySleep, Link, LinkConfig, Listener, Received, UnaryMethods},
    status::quoted,
    ByteStr, Code, Error, ErrorKind, Metadata, Payload, Peer,
};
use tokio::io::{AsyncWrite, AsyncWriteExt};

use crate::{
    codec::{self, ForCore, Message, MessageDecoder},
    config::GrpcConfig,
    driver::{Io, READ_CHUNK},
    flood::ControlFrames,
    flow::{self, Unfinished, UNFINISHED_MESSAGES},
    headers::{self, HeaderSink},
    http2::{
        conn::{self, Connection, Event, HeaderWriter, IdMap, Role},
        fields,
        frame::Reason,
        hpack::Indexing,
    },
    keepalive::Keepalive,
    Address,
};

/// Accepts gRPC connections on a TCP port: HTTP/2 with prior knowledge
/// (`grpc://`), or inside TLS with ALPN `h2` (`grpcs://`, the `tls` feature).
#[derive(Debug)]
pub struct GrpcListener {
    accepting: Accepting,
    local: SocketAddr,
    config: GrpcConfig,
}

#[derive(Debug)]
enum Accepting {
    Plain(tokio::net::TcpListener),
    #[cfg(feature = "tls")]
    Tls(rpc_transport_tcp::tls::TlsStreamListener),
}

impl GrpcListener {
    /// Binds `address` with `config`. Port 0 picks a free port;
    /// [`local_addr_uri`](Self::local_addr_uri) tells which.
    /// A `grpcs://` address needs TLS settings: see [`bind_tls`](Self::bind_tls).
    pub async fn bind(address: &Address, config: GrpcConfig) -> Result<Self, Error> {
        if address.secure {
            return Err(Error::new(
                ErrorKind::InvalidAddress,
                format!("{address}: grpcs:// needs TLS settings (GrpcListener::bind_tls)"),
            ));
        }
        let listener = tokio::net::TcpListener::bind(address.authority())
            .await
            .map_err(|e| Error::io(format!("bind {address}"), e))?;
        let local = listener
            .local_addr()
            .map_err(|e| Error::io("local address", e))?;
        Ok(GrpcListener {
            accepting: Accepting::Plain(listener),
            local,
            config,
        })
    }

    /// Binds `address` (`grpcs://` or `grpc://`: either way TLS) for gRPC over TLS:
    /// ALPN `h2`, certificate and mTLS from `tls`, handshakes run concurrently as
    /// `tls://`'s listener runs them. Calls see the client's verified certificate in
    /// [`Peer::tls`].
    #[cfg(feature = "tls")]
    pub async fn bind_tls(
        address: &Address,
        config: GrpcConfig,
        tls: rpc_transport_tcp::tls::ServerTls,
    ) -> Result<Self, Error> {
        use rpc_transport_tcp::{tls, Address as StreamAddress};
        let stream_address = StreamAddress::Tcp(address.authority());
        let listener =
            tls::TlsStreamListener::bind(&stream_address, tls, tls::Protocol::H2).await?;
        let local = listener
            .local_addr_uri()
            .strip_prefix("grpcs://")
            .and_then(|a| a.parse().ok())
            .ok_or_else(|| Error::new(ErrorKind::InvalidAddress, "grpcs listener address"))?;
        Ok(GrpcListener {
            accepting: Accepting::Tls(listener),
            local,
            config,
        })
    }

    /// The bound address as a URI (`grpc://127.0.0.1:41234`, `grpcs://…` over TLS).
    pub fn local_addr_uri(&self) -> String {
        match self.accepting {
            Accepting::Plain(_) => format!("grpc://{}", self.local),
            #[cfg(feature = "tls")]
            Accepting::Tls(_) => format!("grpcs://{}", self.local),
        }
    }

    /// The TLS settings of a `grpcs://` listener, to
    /// [`reload`](rpc_transport_tcp::tls::ServerTls::reload) them.
    #[cfg(feature = "tls")]
    pub fn tls(&self) -> Option<&rpc_transport_tcp::tls::ServerTls> {
        match &self.accepting {
            Accepting::Plain(_) => None,
            Accepting::Tls(listener) => Some(listener.tls()),
        }
    }
}

impl Listener for GrpcListener {
    type Link = GrpcServerLink;

    async fn accept(&mut self, config: &LinkConfig) -> Result<GrpcServerLink, Error> {
        let (io, peer): (Io, Peer) = match &mut self.accepting {
            Accepting::Plain(listener) => {
                let (stream, addr) = listener
                    .accept()
                    .await
                    .map_err(|e| Error::io("accept", e))?;
                // Failing to set it costs latency, not correctness.
                let _ = stream.set_nodelay(true);
                let peer = Peer::new(format!("grpc://{addr}")).with_addr(addr);
                (Box::new(stream), peer)
            }
            #[cfg(feature = "tls")]
            Accepting::Tls(listener) => {
                let accepted = listener.accept().await?;
                (Box::new(accepted.stream), accepted.peer)
            }
        };
        Ok(GrpcServerLink::new(io, peer, &self.config, config))
    }

    fn local_addr(&self) -> String {
        self.local_addr_uri()
    }
}

/// What a REQUEST frame says besides its payload, kept while a call waits for its
/// request (or for the link to stop holding new calls back).
struct RequestHead {
    method: String,
    timeout: Option<Duration>,
    call_key: Option<frame::CallKey>,
    metadata: Metadata,
}

impl RequestHead {
    /// The call's REQUEST, unary with `message` or streaming without, as the core
    /// takes it (unencoded).
    fn into_frame(self, id: u64, message: Option<Message>) -> Frame {
        let (streaming, compressed, payload) = match message {
            None => (true, false, Bytes::new()),
            Some(message) => (false, message.compressed, message.data.to_bytes()),
        };
        let request = frame::RequestFrame {
            id,
            method: ByteStr::from(self.method),
            timeout: self.timeout.map(whole_micros),
            call_key: self.call_key,
            metadata: self.metadata,
            streaming,
            compressed,
            payload,
        };
        Frame::Request(request)
    }
}

/// Unary calls one connection keeps waiting for their whole request at most; past it,
/// such a call takes the stream path at once (without the duplicate cache). Keyed
/// calls wait past it (the duplicate cache sees unary calls only; the stream limit
/// bounds them).
const MAX_WAITING: usize = 16;

/// Reads of the socket per round of the connection's task before it yields.
const READS_PER_ROUND: usize = 16;

/// Bytes the connection may have queued for a client that does not read them, beyond
/// DATA its windows allowed (acknowledgements, resets, WINDOW_UPDATEs, header blocks):
/// past it the client is refused (`ENHANCE_YOUR_CALM`). A client that reads its socket
/// never comes near it.
const MAX_UNREAD_CONTROL: usize = 1024 * 1024;

/// Bytes queued for the socket past which the link takes no more frames from the core
/// until the socket took some (`poll_ready`).
const MAX_OUT: usize = 256 * 1024;

/// One call as the server link tracks it.
struct Call {
    /// The request's head until the core has the call: a unary method's call waits
    /// for its whole request, any call waits while the link holds new calls back.
    waiting: Option<RequestHead>,
    /// Goes to the core as a stream (its method is not listed as unary).
    stream_path: bool,
    /// It holds one of the connection's [`MAX_WAITING`] slots.
    holds_wait_slot: bool,
    /// The deadline of a call waiting for its request with a `grpc-timeout`.
    wait_deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    /// The request's messages, as they come.
    decoder: MessageDecoder,
    /// The client ended its side.
    recv_done: bool,
    /// The core was told the request ended (or the link no longer reads it).
    inbound_over: bool,
    /// The core's credit for the request's messages (may go below zero by one
    /// message, as the core allows).
    credit: i64,
    /// Bytes received past the credit whose HTTP/2 window is not released yet.
    held: usize,
    /// This call's part of the connection's unfinished bytes.
    counted: usize,
    /// The response headers went out.
    headers_sent: bool,
    /// The core's side is over (it sent RESPONSE, or was told CANCEL), or the link
    /// answered the call itself.
    answered: bool,
    /// Handed to the core as a unary call: its OK answer is one message, even empty.
    unary: bool,
    /// The request's `grpc-encoding`.
    request_encoding: Option<Algorithm>,
    /// What the core may compress responses with (named in the response headers).
    response_encoding: Option<Algorithm>,
    /// DATA bytes handed to the connection for this stream, and the message ends with
    /// the credit each gives back to the core once written.
    handed: u64,
    sent_marks: VecDeque<(u64, u32)>,
    /// In the round's list of calls to move along.
    touched: bool,
    /// In the link's list of calls held back.
    in_held: bool,
}

/// The link of one gRPC connection on the server (see the module docs).
pub struct GrpcServerLink {
    io: Io,
    conn: Connection,
    input: BytesMut,
    /// The socket ended (or failed): no more reads.
    read_done: bool,
    /// Why the connection is over, once it is (reported to the core once).
    ended: Option<Error>,
    reported_end: bool,
    calls: IdMap<u32, Call>,
    /// Calls with news to move along in this round.
    touched: Vec<u32>,
    /// Calls not yet handed to the core while the link held new calls back.
    held: VecDeque<u32>,
    /// Calls waiting with a deadline (polled each round).
    deadlines: Vec<u32>,
    /// Unary calls waiting for their whole request.
    waiting: usize,
    unary_methods: UnaryMethods,
    /// Frames for the core.
    ready: ForCore,
    max_message: usize,
    /// The core's metadata limit: a call whose request metadata exceed it is refused
    /// `RESOURCE_EXHAUSTED` here rather than as a frame the core refuses.
    max_metadata: usize,
    /// What the calls hold of unfinished request messages, together, and the bound.
    unfinished: Unfinished,
    /// The buffers its decoders reserve to assemble large messages, together.
    reservations: codec::Reservations,
    peer: Peer,
    closing: bool,
    /// The last call the core will process, once it sent GOAWAY: later calls it
    /// answers UNAVAILABLE are refused with RST_STREAM REFUSED_STREAM.
    last_processed: Option<u64>,
    resets: ResetBudget,
    /// The client's preface and first SETTINGS must come within this.
    handshake: Option<LazySleep>,
    handshake_timeout: Duration,
    /// A header block begun must be whole within `handshake_timeout`.
    block_timer: Option<LazySleep>,
    keepalive: Option<Keepalive>,
    bytes_read: u64,
    /// Scratch for the streams whose DATA left.
    scratch: Vec<u32>,
    /// The byte stream has written bytes it has not flushed yet (a TLS stream keeps
    /// records until flushed).
    unflushed: bool,
    /// `start_send` queued frames for the core (an error it answered): the next flush
    /// wakes the core's task to read them.
    pushed: bool,
}

/// The rapid-reset bound (CVE-2023-44487): a token bucket of `max` peer resets
/// refilling at `max` per `period`, spent by every call the client resets before it
/// was answered.
struct ResetBudget {
    tokens: f64,
    max: f64,
    per_second: f64,
    last: Instant,
    exhausted: bool,
}

impl ResetBudget {
    fn new(max: u32, period: Duration) -> ResetBudget {
        let max = f64::from(max);
        ResetBudget {
            tokens: max,
            max,
            per_second: max / period.as_secs_f64(),
            last: Instant::now(),
            exhausted: false,
        }
    }

    /// Spends one reset; false once the budget is gone (and from then on).
    fn spend(&mut self) -> bool {
        if self.exhausted {
            return false;
        }
        let now = Instant::now();
        let refill = now.duration_since(self.last).as_secs_f64() * self.per_second;
        self.last = now;
        self.tokens = (self.tokens + refill).min(self.max) - 1.0;
        if self.tokens < 0.0 {
            self.exhausted = true;
        }
        !self.exhausted
    }
}

/// Writes a header block's fields, choosing which the HPACK tables remember: the
/// fields every response repeats, not metadata or messages.
impl HeaderSink for HeaderWriter<'_> {
    fn put(&mut self, name: &str, value: &[u8]) {
        self.field(name.as_bytes(), value, indexing_of(name, value));
    }
}

/// Whether a response field goes into the HPACK tables: the fields every response
/// repeats, not metadata or messages.
fn indexing_of(name: &str, value: &[u8]) -> Indexing {
    match name {
        "content-type" | "grpc-accept-encoding" | "grpc-encoding" => Indexing::Incremental,
        // The codes gRPC defines; another, remembered, is one a peer may refuse at
        // every later reference (grpcio carried its parse error for 2147483647 into
        // each call that reused the entry; from a review).
        "grpc-status" if matches!(value, [b'0'..=b'9'] | [b'1', b'0'..=b'6']) => {
            Indexing::Incremental
        }
        _ => Indexing::No,
    }
}

impl GrpcServerLink {
    fn new(io: Io, peer: Peer, config: &GrpcConfig, link: &LinkConfig) -> GrpcServerLink {
        let conn = Connection::new(
            Role::Server,
            conn::Config {
                max_concurrent_streams: config.max_concurrent_streams,
                stream_window: config.stream_window,
                connection_window: config.connection_window,
                max_frame_size: config.max_frame_size,
                max_header_list_size: config.max_header_list_size,
                max_local_resets: config.max_local_error_reset_streams,
            },
            Some(ControlFrames::new(
                config.max_control_frames,
                config.control_frame_period,
            )),
        );
        let max_message = config.message_limit(link.max_frame_len);
        GrpcServerLink {
            io,
            conn,
            input: BytesMut::with_capacity(READ_CHUNK),
            read_done: false,
            ended: None,
            reported_end: false,
            calls: HashMap::default(),
            touched: Vec::new(),
            held: VecDeque::new(),
            deadlines: Vec::new(),
            waiting: 0,
            unary_methods: link.unary_methods.clone(),
            ready: ForCore::default(),
            max_message,
            max_metadata: link.max_metadata_len,
            unfinished: Unfinished::new(max_message),
            reservations: codec::Reservations::new(max_message),
            peer,
            closing: false,
            last_processed: None,
            resets: ResetBudget::new(config.max_peer_resets, config.peer_reset_period),
            handshake: Some(LazySleep::new(config.handshake_timeout)),
            handshake_timeout: config.handshake_timeout,
            block_timer: None,
            keepalive: config
                .server_keepalive_interval
                .map(|interval| Keepalive::new(interval, config.keepalive_timeout, "client")),
            bytes_read: 0,
            scratch: Vec::new(),
            unflushed: false,
            pushed: false,
        }
    }

    /// Ends the connection (once): `reason` in a GOAWAY if given, the cause logged.
    fn end(&mut self, error: Error) {
        if self.ended.is_none() {
            self.ended = Some(error);
        }
    }

    /// Whether the link holds new calls back: while the answers waiting for the
    /// client's windows, or the frames the core has not taken, come to
    /// [`UNFINISHED_MESSAGES`] times the largest message. Held back, new calls wait
    /// here (the stream limit and windows bound them), as requests wait in the socket
    /// over TCP; calls the core has go on. A client that takes the waiting answers (or
    /// resets their streams) lifts it.
    fn holding(&self) -> bool {
        let limit = self.max_message.saturating_mul(UNFINISHED_MESSAGES);
        self.conn.pending_total() >= limit || self.ready.bytes >= limit
    }

    fn touch(&mut self, id: u32) {
        if let Some(call) = self.calls.get_mut(&id) {
            if !call.touched {
                call.touched = true;
                self.touched.push(id);
            }
        }
    }

    /// One round of the connection: timers, the socket read and its frames handled,
    /// the calls with news moved along, and what is queued written.
    fn drive(&mut self, cx: &mut Context<'_>) {
        if self.ended.is_none() {
            self.poll_timers(cx);
        }
        if self.ended.is_none() {
            self.read(cx);
            // A header block's deadline armed by this read: polled now, so that it
            // wakes the task when it passes.
            if let Some(timer) = &mut self.block_timer {
                if timer.poll(cx).is_ready() {
                    tracing::info!(peer = %self.peer.description(), "a header block left unfinished past the handshake timeout: closing the connection");
                    self.read_done = true;
                    self.end(self.closed_error("a header block left unfinished"));
                }
            }
        }
        self.step_calls(cx);
        self.credit_sent();
        if self.ended.is_none() && self.conn.out().control_len() > MAX_UNREAD_CONTROL {
            self.conn.abort(
                Reason::ENHANCE_YOUR_CALM,
                "the client does not read what it makes the server send",
            );
            // Logged and counted by the core's connection, as every refusal.
            self.end(self.refusal(
                Reason::ENHANCE_YOUR_CALM,
                "the client does not read what it makes the server send",
            ));
        }
        if let Err(err) = self.write(cx) {
            if self.ended.is_none() {
                self.end(Error::io(
                    format!("gRPC connection from {}", self.peer.description()),
                    err,
                ));
            }
            self.read_done = true;
        }
    }

    /// The link's end for a peer refused with a GOAWAY of `reason`: a protocol error,
    /// which the core's connection logs (within the bound of refusals) and counts in
    /// `ServerStats::refused_for_errors`.
    fn refusal(&self, reason: Reason, what: &str) -> Error {
        Error::new(
            ErrorKind::Protocol,
            format!(
                "gRPC connection from {}: GOAWAY {reason}: {what}",
                self.peer.description()
            ),
        )
    }

    fn closed_error(&self, why: &str) -> Error {
        Error::new(
            ErrorKind::Closed,
            format!("gRPC connection from {}: {why}", self.peer.description()),
        )
    }

    fn poll_timers(&mut self, cx: &mut Context<'_>) {
        if let Some(handshake) = &mut self.handshake {
            if self.conn.is_open() {
                self.handshake = None;
            } else if handshake.poll(cx).is_ready() {
                tracing::debug!(peer = %self.peer.description(), "gRPC client did not finish the HTTP/2 handshake in time");
                self.read_done = true;
                self.end(self.closed_error("no HTTP/2 handshake in time"));
                return;
            }
        }
        if let Some(keepalive) = &mut self.keepalive {
            if let Err(cause) = keepalive.poll(cx, self.bytes_read, true, &mut self.conn) {
                tracing::info!(peer = %self.peer.description(), %cause, "closing the gRPC connection");
                self.read_done = true;
                self.end(self.closed_error(&cause));
            }
        }
        if !self.deadlines.is_empty() {
            let mut i = 0;
            while i < self.deadlines.len() {
                let id = self.deadlines[i];
                let fired = match self
                    .calls
                    .get_mut(&id)
                    .and_then(|c| c.wait_deadline.as_mut())
                {
                    Some(sleep) => sleep.as_mut().poll(cx).is_ready(),
                    None => {
                        self.deadlines.swap_remove(i);
                        continue;
                    }
                };
                if fired {
                    self.touch(id);
                }
                i += 1;
            }
        }
    }

    /// Reads the socket and handles what came, up to [`READS_PER_ROUND`] reads.
    fn read(&mut self, cx: &mut Context<'_>) {
        let mut reads = 0;
        loop {
            self.handle_input();
            if self.conn.is_closed() {
                // A GOAWAY with an error went (or is queued): nothing more is read.
                self.read_done = true;
            }
            if self.ended.is_some() || self.read_done {
                return;
            }
            if reads == READS_PER_ROUND {
                // More may be waiting: another round, after the task's other work.
                cx.waker().wake_by_ref();
                return;
            }
            let want = crate::driver::wanted(&self.input);
            self.input.reserve(want);
            match tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, &mut self.input) {
                Poll::Pending => return,
                Poll::Ready(Ok(0)) => {
                    self.read_done = true;
                    if self.conn.in_header_block() || !self.input.is_empty() {
                        self.end(self.closed_error("the client closed in the middle of a frame"));
                    }
                    return;
                }
                Poll::Ready(Ok(n)) => {
                    self.bytes_read += n as u64;
                    reads += 1;
                }
                Poll::Ready(Err(err)) => {
                    self.read_done = true;
                    let context = format!("gRPC connection from {}", self.peer.description());
                    // Bytes that broke TLS (grpcs://): a protocol error, counted and
                    // logged as on tls:// (from a review: DEBUG only here).
                    #[cfg(feature = "tls")]
                    self.end(rpc_transport_tcp::tls::read_error(context, err));
                    #[cfg(not(feature = "tls"))]
                    self.end(Error::io(context, err));
                    return;
                }
            }
        }
    }

    fn handle_input(&mut self) {
        loop {
            match self.conn.next_event(&mut self.input) {
                Ok(Some(event)) => self.on_event(event),
                Ok(None) => break,
                Err(err) => {
                    // Logged and counted by the core's connection, as every refusal.
                    self.read_done = true;
                    self.end(self.refusal(err.reason, &err.what));
                    return;
                }
            }
        }
        match (&mut self.block_timer, self.conn.in_header_block()) {
            (None, true) => self.block_timer = Some(LazySleep::new(self.handshake_timeout)),
            (Some(_), false) => self.block_timer = None,
            _ => {}
        }
    }

    fn on_event(&mut self, event: Event) {
        match event {
            Event::Headers {
                stream,
                fields,
                end_stream,
                opens,
            } => {
                if !opens && !self.calls.contains_key(&stream) {
                    // Trailers of a call the link is done with (answered, its answer
                    // still waiting for the client's windows): nothing to do.
                    return;
                }
                if let Some(call) = self.calls.get_mut(&stream) {
                    // Trailers from the client: the request's end (their fields are not
                    // read; gRPC has no request trailers).
                    if fields::trailers(&fields).is_err() {
                        self.refuse_malformed(stream, "malformed request trailers");
                        return;
                    }
                    call.recv_done = true;
                    self.touch(stream);
                } else {
                    self.open(stream, &fields, end_stream);
                }
            }
            Event::HeadersTooLarge { stream, end_stream } => {
                if let Some(call) = self.calls.get_mut(&stream) {
                    call.recv_done = true;
                    self.touch(stream);
                    return;
                }
                let _ = end_stream;
                // A header list over the limit: HTTP 431, as HTTP/2 servers answer it,
                // with the gRPC status a gRPC client reports (the one headers over the
                // metadata limit but within this one get; grpcio said UNKNOWN, "Received
                // http2 header with status: 431", for the bare 431).
                self.conn.send_headers(stream, true, |w| {
                    w.field(b":status", b"431", Indexing::No);
                    w.field(b"content-type", b"application/grpc", Indexing::No);
                    w.field(b"grpc-status", b"8", Indexing::No);
                    w.field(
                        b"grpc-message",
                        b"request headers larger than the server takes",
                        Indexing::No,
                    );
                });
                self.conn.finish_early(stream);
            }
            Event::Data {
                stream,
                data,
                end_stream,
            } => {
                let len = data.len();
                let Some(call) = self.calls.get_mut(&stream) else {
                    // A call over (its answer may still wait for the client's windows):
                    // the connection's window comes back, not the stream's.
                    self.conn.discard(stream, len);
                    return;
                };
                if call.answered || call.inbound_over {
                    self.conn.discard(stream, len);
                    return;
                }
                // Released while the core has credit for it, or while a unary call
                // waits for the rest of its request in one of the connection's slots
                // (counted against the bound on unfinished messages); else held back,
                // its window closed: a call the core has not taken (held back while
                // the link holds new calls) makes the client wait.
                if (call.waiting.is_none() && call.credit > 0) || call.holds_wait_slot {
                    self.conn.release(stream, len);
                } else {
                    call.held += len;
                }
                call.decoder.push(data, &self.reservations);
                if end_stream {
                    call.recv_done = true;
                }
                self.touch(stream);
            }
            Event::Reset {
                stream, by_peer, ..
            } => {
                let Some(call) = self.calls.remove(&stream) else {
                    return;
                };
                self.forget(stream, &call);
                if call.answered {
                    return;
                }
                if call.waiting.is_none() {
                    push_cancel(&mut self.ready, u64::from(stream));
                }
                if by_peer && !self.resets.spend() {
                    // Within a bound of its own: peers choose how often (the core
                    // also logs the refusal at INFO, and counts it).
                    static RAPID_RESETS: rpc_core::logs::LogLimiter =
                        rpc_core::logs::LogLimiter::for_refusals();
                    if let Some(suppressed) = RAPID_RESETS.allow() {
                        tracing::warn!(
                            peer = %self.peer.description(),
                            suppressed,
                            "gRPC client reset too many calls (rapid reset): GOAWAY ENHANCE_YOUR_CALM"
                        );
                    }
                    self.conn
                        .abort(Reason::ENHANCE_YOUR_CALM, "too many resets");
                    self.read_done = true;
                    self.end(self.refusal(Reason::ENHANCE_YOUR_CALM, "rapid reset"));
                }
            }
            Event::GoAway { reason, .. } => {
                tracing::debug!(peer = %self.peer.description(), %reason, "HTTP/2 GOAWAY received from the client");
            }
            Event::PingAck(payload) => {
                if let Some(keepalive) = &mut self.keepalive {
                    keepalive.pong(payload, self.bytes_read);
                }
            }
        }
    }

    /// What a call leaving the link held of the connection's counts, and of its
    /// window: DATA held back for it is the connection's again.
    fn forget(&mut self, id: u32, call: &Call) {
        self.unfinished.uncount(call.counted);
        if call.holds_wait_slot {
            self.waiting -= 1;
        }
        if call.held > 0 {
            self.conn.discard(id, call.held);
        }
    }

    fn refuse_malformed(&mut self, stream: u32, why: &str) {
        tracing::debug!(peer = %self.peer.description(), stream, why, "malformed gRPC request: RST_STREAM PROTOCOL_ERROR");
        if let Some(call) = self.calls.remove(&stream) {
            self.forget(stream, &call);
            if call.waiting.is_none() && !call.answered {
                push_cancel(&mut self.ready, u64::from(stream));
            }
        }
        self.conn.reset_malformed(stream);
    }

    /// A new call: checks what HTTP/2 and gRPC require of it, answers it here if it
    /// fails, and otherwise keeps it to hand to the core.
    fn open(&mut self, stream: u32, fields: &[fields::Field], end_stream: bool) {
        let request = match fields::request(fields) {
            Ok(request) => request,
            Err(why) => {
                self.conn.reset_malformed(stream);
                tracing::debug!(peer = %self.peer.description(), stream, why, "malformed HTTP/2 request: RST_STREAM PROTOCOL_ERROR");
                return;
            }
        };
        if request.method != "POST" {
            http_refusal(&mut self.conn, stream, b"405");
            return;
        }
        let Some(codec) = headers::grpc_codec(fields) else {
            http_refusal(&mut self.conn, stream, b"415");
            return;
        };
        // `application/grpc+json` and the like: read as protobuf, the one codec here,
        // as grpc-go does and grpc-java; a request really in another codec then fails
        // to decode, with INTERNAL.
        if !codec.eq_ignore_ascii_case("proto") {
            tracing::debug!(
                content_subtype = codec,
                "a gRPC request in a codec this server does not have: read as protobuf"
            );
        }
        // A query string is no part of the method (`/pkg.S/M?x=1` is `pkg.S/M`).
        let method = std::str::from_utf8(&request.path)
            .ok()
            .map(|path| path.split('?').next().unwrap_or(""))
            .and_then(|path| path.strip_prefix('/'))
            .filter(|method| valid_method(method));
        let Some(method) = method else {
            let path = String::from_utf8_lossy(&request.path);
            let path = path.split('?').next().unwrap_or("");
            let message = format!("malformed method name {:?}", quoted(path));
            trailers_only(&mut self.conn, stream, Code::UNIMPLEMENTED, &message);
            return;
        };
        let request_encoding = match headers::encoding(fields) {
            Ok(encoding) => encoding,
            Err(name) => {
                let message = format!(
                    "grpc-encoding {:?} is not supported (this server decompresses {:?})",
                    quoted(&name),
                    headers::accept_encoding_value()
                );
                trailers_only(&mut self.conn, stream, Code::UNIMPLEMENTED, &message);
                return;
            }
        };
        // The core compresses responses only toward a client that advertised; it is
        // told of one algorithm, so that the headers can name it before the first
        // message.
        let response_encoding = headers::accepted(fields).first().copied();
        let timeout = match fields::get(fields, "grpc-timeout") {
            None => None,
            Some(value) => match codec::parse_timeout(value) {
                Some(timeout) => Some(timeout),
                None => {
                    trailers_only(
                        &mut self.conn,
                        stream,
                        Code::INTERNAL,
                        "malformed grpc-timeout",
                    );
                    return;
                }
            },
        };
        let mut metadata = Metadata::new();
        match headers::read_metadata(fields, &mut metadata, self.max_metadata) {
            Ok(()) => {}
            Err(headers::MetadataError::Malformed(message)) => {
                trailers_only(&mut self.conn, stream, Code::INTERNAL, &message);
                return;
            }
            Err(headers::MetadataError::TooLarge) => {
                let message = "request metadata exceeds the metadata limit";
                trailers_only(&mut self.conn, stream, Code::RESOURCE_EXHAUSTED, message);
                return;
            }
        }
        if let Some(algorithm) = response_encoding {
            let _ = metadata.append(rpc_core::compress::ACCEPT_ENCODING, algorithm.name());
        }
        // Checked again with the entry the link added (the core refuses a block over
        // its limits as a protocol error, which would end the connection).
        if !frame::metadata_fits(&metadata, self.max_metadata) {
            let message = "request metadata exceeds the metadata limit";
            trailers_only(&mut self.conn, stream, Code::RESOURCE_EXHAUSTED, message);
            return;
        }
        let stream_path = !self.unary_methods.contains(method);
        let head = RequestHead {
            method: method.to_owned(),
            timeout,
            call_key: headers::read_call_key(fields),
            metadata,
        };
        self.calls.insert(
            stream,
            Call {
                waiting: Some(head),
                stream_path,
                holds_wait_slot: false,
                wait_deadline: None,
                decoder: MessageDecoder::new(self.max_message),
                recv_done: end_stream,
                inbound_over: false,
                credit: i64::from(frame::INITIAL_STREAM_WINDOW),
                held: 0,
                counted: 0,
                headers_sent: false,
                answered: false,
                unary: false,
                request_encoding,
                response_encoding,
                handed: 0,
                sent_marks: VecDeque::new(),
                touched: false,
                in_held: false,
            },
        );
        self.touch(stream);
    }

    /// Moves along the calls with news, and, once the link stops holding new calls
    /// back, those it held.
    fn step_calls(&mut self, cx: &mut Context<'_>) {
        if !self.held.is_empty() && !self.holding() && !self.closing {
            while let Some(id) = self.held.pop_front() {
                if let Some(call) = self.calls.get_mut(&id) {
                    call.in_held = false;
                }
                self.touch(id);
            }
        }
        let mut touched = std::mem::take(&mut self.touched);
        let mut i = 0;
        while i < touched.len() {
            let id = touched[i];
            i += 1;
            if let Some(call) = self.calls.get_mut(&id) {
                call.touched = false;
            }
            self.step(id, cx);
            // A step may touch calls again (itself, to send what it queued).
            touched.append(&mut self.touched);
        }
        touched.clear();
        self.touched = touched;
    }

    /// Moves one call along: to the core when it may go, its request's messages
    /// within the core's credit, its end.
    fn step(&mut self, id: u32, cx: &mut Context<'_>) {
        let holding = self.holding() || self.closing;
        let Some(call) = self.calls.get_mut(&id) else {
            return;
        };
        if call.answered {
            return;
        }
        let core_id = u64::from(id);
        if call.waiting.is_some() {
            if holding {
                // A call the core has not heard of waits, and nothing in it can be lost
                // meanwhile (its request waits within its window, which stays closed:
                // it gives up a wait slot it had, whose DATA is released as it comes).
                if call.holds_wait_slot {
                    call.holds_wait_slot = false;
                    self.waiting -= 1;
                }
                if !call.in_held {
                    call.in_held = true;
                    self.held.push_back(id);
                }
                return;
            }
            if call.stream_path {
                let head = call.waiting.take().expect("checked above");
                self.ready.push_frame(head.into_frame(core_id, None));
            } else if !self.decide_unary(id, cx) {
                return;
            }
        }
        self.deliver(id);
    }

    /// A unary method's call: unary if its whole request is here (usually: a client
    /// sends HEADERS and its one DATA together). Within the connection's slots, one
    /// whose message has not started to come waits for it, as the unary path is the
    /// cheaper one; a keyed one waits for the rest of its request too, as the
    /// duplicate cache sees only unary calls. Anything else takes the stream path.
    /// False while it waits (or if the call ended here).
    fn decide_unary(&mut self, id: u32, cx: &mut Context<'_>) -> bool {
        let core_id = u64::from(id);
        let call = self.calls.get_mut(&id).expect("the caller found it");
        let head = call.waiting.as_ref().expect("the caller checked");
        let single = call.recv_done && call.decoder.holds_one_message();
        if !single
            && !call.recv_done
            && (head.call_key.is_some() || !call.decoder.has_partial())
            && call.decoder.may_hold_one_message()
            // A keyed call waits whatever the slots (the stream limit bounds them): on
            // the stream path its key would be ignored.
            && (call.holds_wait_slot || self.waiting < MAX_WAITING || head.call_key.is_some())
        {
            if !call.holds_wait_slot {
                call.holds_wait_slot = true;
                self.waiting += 1;
                let release = std::mem::take(&mut call.held);
                if release > 0 {
                    self.conn.release(id, release);
                }
                if let Some(timeout) = head.timeout {
                    call.wait_deadline = Some(Box::pin(tokio::time::sleep(timeout)));
                    self.deadlines.push(id);
                }
            }
            let expired = match &mut call.wait_deadline {
                Some(sleep) => sleep.as_mut().poll(cx).is_ready(),
                None => false,
            };
            // What it holds so far counts against the connection's bound.
            let now = call.decoder.buffered();
            if let Err(err) = self.unfinished.count(&mut call.counted, now) {
                self.fail_request(id, err.code(), &err.to_string(), false);
                return false;
            }
            if !expired {
                return false;
            }
        }
        if call.holds_wait_slot {
            call.holds_wait_slot = false;
            self.waiting -= 1;
        }
        let mut head = call.waiting.take().expect("checked above");
        if let Some(sleep) = call.wait_deadline.take() {
            // It waited: the core gets what is left of its timeout.
            let now = tokio::time::Instant::now();
            head.timeout = Some(sleep.deadline().saturating_duration_since(now));
        }
        if single {
            let message = call
                .decoder
                .next()
                .ok()
                .flatten()
                .expect("holds one message");
            self.unfinished.forget(&mut call.counted);
            let refused = codec::compression_refusal(&message, call.request_encoding);
            if let Some(why) = refused {
                // The core never hears of the call.
                call.answered = true;
                trailers_only(&mut self.conn, id, Code::INTERNAL, why);
                self.remove_call(id);
                return false;
            }
            self.ready
                .push_frame(head.into_frame(core_id, Some(message)));
            call.unary = true;
            call.inbound_over = true;
            let release = std::mem::take(&mut call.held);
            if release > 0 {
                self.conn.release(id, release);
            }
            return false;
        }
        // Not one message (yet, or at all): the stream path, from its REQUEST on; what
        // was read waits in the decoder.
        self.ready.push_frame(head.into_frame(core_id, None));
        true
    }

    /// Hands the core the request's messages within its credit, and its end.
    fn deliver(&mut self, id: u32) {
        let core_id = u64::from(id);
        loop {
            let Some(call) = self.calls.get_mut(&id) else {
                return;
            };
            if call.inbound_over || call.answered {
                return;
            }
            if call.credit > 0 {
                match call.decoder.next() {
                    Err(err) => {
                        self.fail_request(id, err.code(), &err.to_string(), true);
                        return;
                    }
                    Ok(Some(message)) => {
                        self.unfinished.forget(&mut call.counted);
                        let refused = codec::compression_refusal(&message, call.request_encoding);
                        if let Some(why) = refused {
                            self.fail_request(id, Code::INTERNAL, why, true);
                            return;
                        }
                        call.credit -= i64::from(flow::message_cost(message.data.len()));
                        // The window of what leaves the decoder, and no more.
                        let release = call.held.min(codec::PREFIX_LEN + message.data.len());
                        call.held -= release;
                        self.ready.push_message(core_id, message);
                        if release > 0 {
                            self.conn.release(id, release);
                        }
                        continue;
                    }
                    Ok(None) => {
                        // Part of a message: it completes only once its window is
                        // released (it may be longer than the window), within the
                        // connection's bound.
                        let now = call.decoder.buffered();
                        if let Err(err) = self.unfinished.count(&mut call.counted, now) {
                            self.fail_request(id, err.code(), &err.to_string(), true);
                            return;
                        }
                        let release = std::mem::take(&mut call.held);
                        if release > 0 {
                            self.conn.release(id, release);
                        }
                    }
                }
            }
            let call = self.calls.get_mut(&id).expect("still here");
            if !call.recv_done || (call.credit <= 0 && call.decoder.has_partial()) {
                return;
            }
            if let Err(err) = call.decoder.finish() {
                self.fail_request(id, err.code(), &err.to_string(), true);
                return;
            }
            call.inbound_over = true;
            let mut buf = BytesMut::with_capacity(frame::HEADER_LEN);
            frame::encode_data_header(
                &mut buf,
                core_id,
                frame::FLAG_END_STREAM | frame::FLAG_NO_MESSAGE,
                None,
            );
            self.ready.push_back(buf.freeze());
            return;
        }
    }

    /// Ends a call from the link's side (a bad request): the client gets the status,
    /// the core (if it knows the call) the news, which stops its handler as a CANCEL
    /// does, with the status's code for its layers (`Received::Stopped`).
    fn fail_request(&mut self, id: u32, code: Code, message: &str, core_knows: bool) {
        let Some(call) = self.calls.get_mut(&id) else {
            return;
        };
        call.answered = true;
        call.inbound_over = true;
        if core_knows {
            self.ready.push_stopped(u64::from(id), code);
        }
        if call.headers_sent {
            self.conn.send_headers(id, true, |w| {
                headers::write_status(code, message, &[], &Metadata::new(), w);
            });
        } else {
            call.headers_sent = true;
            trailers_only(&mut self.conn, id, code, message);
        }
        self.conn.finish_early(id);
        self.remove_call(id);
    }

    fn remove_call(&mut self, id: u32) {
        if let Some(call) = self.calls.remove(&id) {
            self.forget(id, &call);
        }
    }

    /// Gives the core back its credit for the messages the connection wrote (or
    /// handed to the socket's queue) since the last look.
    fn credit_sent(&mut self) {
        let mut drained = std::mem::take(&mut self.scratch);
        self.conn.take_drained(&mut drained);
        drained.sort_unstable();
        drained.dedup();
        for &id in &drained {
            let Some(call) = self.calls.get_mut(&id) else {
                continue;
            };
            let sent = call.handed - self.conn.pending(id) as u64;
            let mut credit = 0u32;
            while let Some(&(end, cost)) = call.sent_marks.front() {
                if end > sent {
                    break;
                }
                credit = credit.saturating_add(cost);
                call.sent_marks.pop_front();
            }
            if credit > 0 && !call.answered {
                let mut buf = BytesMut::with_capacity(frame::HEADER_LEN + 4);
                frame::encode_window(&mut buf, u64::from(id), credit);
                self.ready.push_back(buf.freeze());
            }
        }
        drained.clear();
        self.scratch = drained;
    }

    /// Writes what the connection queued, as far as the socket takes it.
    fn write(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        crate::driver::write_out(&mut self.io, &mut self.conn, &mut self.unflushed, cx)
    }

    fn on_data(&mut self, data: frame::DataFrame, payload: Payload) {
        let id = data.id as u32;
        let Some(call) = self.calls.get_mut(&id) else {
            return;
        };
        if call.answered {
            return;
        }
        if let Some(metadata) = &data.metadata {
            send_headers(&mut self.conn, id, call, metadata);
        }
        if data.message.is_none() {
            return;
        }
        // Credit comes back for the message as the core sent it (docs/wire.md §6.10).
        let cost = flow::message_cost(payload.len());
        let (payload, compressed) = if data.compressed {
            match headers::fit_encoding(call.response_encoding, payload, self.max_message) {
                Ok(fit) => fit,
                Err(status) => {
                    let message = status.message().to_owned();
                    self.fail_request(id, Code::INTERNAL, &message, true);
                    return;
                }
            }
        } else {
            (payload, false)
        };
        send_headers(&mut self.conn, id, call, &Metadata::new());
        let chunks = codec::encode_message(&payload, compressed);
        for chunk in chunks {
            call.handed += chunk.len() as u64;
            self.conn.send_data(id, chunk, false);
        }
        call.sent_marks.push_back((call.handed, cost));
    }

    fn on_response(&mut self, response: frame::ResponseFrame, payload: Payload) {
        let id = response.id as u32;
        let Some(call) = self.calls.get_mut(&id) else {
            return;
        };
        if call.answered {
            return;
        }
        call.answered = true;
        call.inbound_over = true;
        let unprocessed = response.code == Code::UNAVAILABLE
            && self.last_processed.is_some_and(|last| response.id > last);
        if unprocessed && !call.headers_sent {
            // A call that reached the core after its GOAWAY: refused at the HTTP/2
            // level, as the final GOAWAY's last stream id may cover it.
            self.conn.reset(id, Reason::REFUSED_STREAM);
            self.remove_call(id);
            return;
        }
        // A unary call's OK answer is its one message, even an empty one (gRPC's unary
        // response has exactly one); otherwise a payload is a unary-shaped answer.
        let unary_shaped = !payload.is_empty() || (call.unary && response.code == Code::OK);
        if !unary_shaped && !call.headers_sent {
            call.headers_sent = true;
            let conn = &mut self.conn;
            conn.send_headers(id, true, |w| {
                w.field(b":status", b"200", Indexing::Incremental);
                w.put("content-type", headers::CONTENT_TYPE.as_bytes());
                headers::write_status(
                    response.code,
                    &response.message,
                    &response.details,
                    &response.metadata,
                    w,
                );
                w.put(
                    "grpc-accept-encoding",
                    headers::accept_encoding_value().as_bytes(),
                );
            });
            conn.finish_early(id);
            self.remove_call(id);
            return;
        }
        let headers_sent = call.headers_sent;
        if unary_shaped {
            let (payload, compressed) = if response.compressed {
                match headers::fit_encoding(call.response_encoding, payload, self.max_message) {
                    Ok(fit) => fit,
                    Err(status) => {
                        let message = status.message().to_owned();
                        call.answered = false;
                        self.fail_request(id, Code::INTERNAL, &message, false);
                        return;
                    }
                }
            } else {
                (payload, false)
            };
            // A unary-shaped answer: its metadata are the headers (unless sent ahead).
            send_headers(&mut self.conn, id, call, &response.metadata);
            for chunk in codec::encode_message(&payload, compressed) {
                self.conn.send_data(id, chunk, false);
            }
        }
        let trailing = if unary_shaped && !headers_sent {
            &Metadata::new()
        } else {
            &response.metadata
        };
        self.conn.send_headers(id, true, |w| {
            headers::write_status(
                response.code,
                &response.message,
                &response.details,
                trailing,
                w,
            );
        });
        self.conn.finish_early(id);
        self.remove_call(id);
    }

    /// Refuses (REFUSED_STREAM) the calls the core has not heard of: they may be sent
    /// again elsewhere (RFC 9113 §8.7).
    fn refuse_unseen(&mut self) {
        let unseen: Vec<u32> = self
            .calls
            .iter()
            .filter(|(_, call)| call.waiting.is_some())
            .map(|(&id, _)| id)
            .collect();
        for id in unseen {
            self.conn.reset(id, Reason::REFUSED_STREAM);
            self.remove_call(id);
        }
        self.held.clear();
    }

    /// Reports the connection's end to the core once.
    fn take_end(&mut self) -> Option<Result<Received, Error>> {
        if self.reported_end {
            return None;
        }
        self.reported_end = true;
        self.ended.take().map(Err)
    }
}

/// How long a connection refused for a protocol error goes on being read (and what it
/// reads thrown away) after its GOAWAY, so that the client reads the GOAWAY: closing a
/// socket with unread bytes in it resets the connection, and the client then sees the
/// reset, not why.
const LINGER: Duration = Duration::from_secs(1);

/// Bytes a lingering connection reads at most.
const LINGER_BYTES: usize = 4 << 20;

impl Drop for GrpcServerLink {
    fn drop(&mut self) {
        if !self.conn.is_closed() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let out = self.conn.out().take_all();
        let io = std::mem::replace(&mut self.io, Box::new(tokio::io::empty()));
        runtime.spawn(linger(io, out));
    }
}

/// Writes `out` (the GOAWAY), closes the sending side, and reads until the client
/// closes too, within [`LINGER`] and [`LINGER_BYTES`].
async fn linger(mut io: Io, out: Vec<Bytes>) {
    use tokio::io::AsyncReadExt;
    let _ = tokio::time::timeout(LINGER, async {
        for chunk in out {
            io.write_all(&chunk).await?;
        }
        io.shutdown().await?;
        let mut buf = vec![0u8; 16 * 1024];
        let mut read = 0;
        while read < LINGER_BYTES {
            match io.read(&mut buf).await? {
                0 => break,
                n => read += n,
            }
        }
        Ok::<(), io::Error>(())
    })
    .await;
}

/// Sends the response headers if they are not sent yet.
fn send_headers(conn: &mut Connection, id: u32, call: &mut Call, metadata: &Metadata) {
    if call.headers_sent {
        return;
    }
    call.headers_sent = true;
    let encoding = call.response_encoding;
    conn.send_headers(id, false, |w| {
        w.field(b":status", b"200", Indexing::Incremental);
        w.put("content-type", headers::CONTENT_TYPE.as_bytes());
        if let Err(message) = headers::write_metadata(metadata, w) {
            tracing::debug!("response headers: {message}; left out");
        }
        w.put(
            "grpc-accept-encoding",
            headers::accept_encoding_value().as_bytes(),
        );
        if let Some(algorithm) = encoding {
            w.put("grpc-encoding", algorithm.name().as_bytes());
        }
    });
}

/// Answers with a status and no messages: one HEADERS frame with END_STREAM (and the
/// request, if the client is still sending it, reset with NO_ERROR once it went).
fn trailers_only(conn: &mut Connection, stream: u32, code: Code, message: &str) {
    conn.send_headers(stream, true, |w| {
        w.field(b":status", b"200", Indexing::Incremental);
        w.put("content-type", headers::CONTENT_TYPE.as_bytes());
        headers::write_status(code, message, &[], &Metadata::new(), w);
        w.put(
            "grpc-accept-encoding",
            headers::accept_encoding_value().as_bytes(),
        );
    });
    conn.finish_early(stream);
}

/// Answers a request that is not gRPC with a bare HTTP status.
fn http_refusal(conn: &mut Connection, stream: u32, status: &[u8]) {
    conn.send_headers(stream, true, |w| {
        w.field(b":status", status, Indexing::No);
        if status == b"405" {
            // RFC 9110 15.5.6: a 405 names the methods the resource takes.
            w.field(b"allow", b"POST", Indexing::No);
        }
    });
    conn.finish_early(stream);
}

fn push_cancel(ready: &mut ForCore, id: u64) {
    let mut buf = BytesMut::with_capacity(frame::HEADER_LEN);
    frame::encode_cancel(&mut buf, id);
    ready.push_back(buf.freeze());
}

/// The core's method-name rule (docs/wire.md §3): `service/method`, both non-empty,
/// one slash.
fn valid_method(method: &str) -> bool {
    // The core's frames carry a method name in at most 65,535 bytes.
    if method.len() > usize::from(u16::MAX) {
        return false;
    }
    match method.split_once('/') {
        Some((service, name)) => !service.is_empty() && !name.is_empty() && !name.contains('/'),
        None => false,
    }
}

fn goaway_reason(code: GoAwayCode) -> Reason {
    match code {
        GoAwayCode::PROTOCOL_ERROR | GoAwayCode::UNSUPPORTED_VERSION => Reason::PROTOCOL_ERROR,
        GoAwayCode::FRAME_TOO_LARGE => Reason::FRAME_SIZE_ERROR,
        GoAwayCode::TOO_MANY_CONNECTIONS => Reason::REFUSED_STREAM,
        GoAwayCode::NO_ERROR => Reason::NO_ERROR,
        _ => Reason::INTERNAL_ERROR,
    }
}

impl Link for GrpcServerLink {
    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, Error>>> {
        self.poll_recv_frame(cx)
            .map(|received| received.map(|frame| frame.map(codec::encoded)))
    }

    fn poll_recv_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Received, Error>>> {
        if self.ready.is_empty() {
            self.drive(cx);
        }
        if let Some(frame) = self.ready.pop_front() {
            return Poll::Ready(Some(Ok(frame)));
        }
        if self.ended.is_some() || self.read_done {
            if self.conn.out().is_empty() || self.ended.is_none() {
                return Poll::Ready(self.take_end());
            }
            // The GOAWAY that says why goes first, as far as the socket takes it now:
            // the rest is written by the link's linger once the core drops it (a
            // client that reads nothing must not hold the connection open).
            let _ = self.write(cx);
            return Poll::Ready(self.take_end());
        }
        Poll::Pending
    }

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        if self.conn.out().len() >= MAX_OUT {
            if let Err(err) = self.write(cx) {
                return Poll::Ready(Err(Error::io(
                    format!("gRPC connection from {}", self.peer.description()),
                    err,
                )));
            }
            if self.conn.out().len() >= MAX_OUT {
                return Poll::Pending;
            }
        }
        Poll::Ready(Ok(()))
    }

    fn start_send(&mut self, header: &[u8], payload: Payload) -> Result<(), Error> {
        let frame = codec::core_frame(header)?;
        let had = self.ready.len();
        match frame {
            Frame::Data(data) => self.on_data(data, payload),
            Frame::Response(response) => self.on_response(response, payload),
            Frame::Window { id, increment } => {
                let id = id as u32;
                let Some(call) = self.calls.get_mut(&id) else {
                    return Ok(());
                };
                let was_blocked = call.credit <= 0;
                call.credit = call.credit.saturating_add(i64::from(increment));
                if was_blocked && call.credit > 0 {
                    self.touch(id);
                }
            }
            Frame::GoAway(goaway) => {
                self.last_processed = Some(goaway.last_id);
                // Calls the core has not heard of (waiting for their request, or held
                // back) are refused at once: one handed to the core now would be
                // answered UNAVAILABLE with an id at or below its `last_id`, which a
                // gRPC client takes as a failure, not as a call to send again. Streams
                // opened after have higher ids, refused by the core.
                if goaway.code == GoAwayCode::NO_ERROR {
                    self.conn.go_away(None, Reason::NO_ERROR, b"");
                } else {
                    let reason = goaway_reason(goaway.code);
                    self.conn.abort(reason, &goaway.reason);
                }
                self.refuse_unseen();
            }
            // PONGs answer PINGs this link never forwards; the rest are not the
            // server's to send or have no gRPC equivalent (bulk transfer).
            other => tracing::debug!(?other, "gRPC server link: frame not mapped"),
        }
        self.pushed |= self.ready.len() > had;
        Ok(())
    }

    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        let had = self.ready.len();
        self.drive(cx);
        if self.ready.len() > had || std::mem::take(&mut self.pushed) {
            // Frames for the core (credit, cancels) that it may not poll for.
            cx.waker().wake_by_ref();
        }
        Poll::Ready(Ok(()))
    }

    fn poll_close(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        if !self.closing {
            self.closing = true;
            self.conn.go_away(None, Reason::NO_ERROR, b"");
            // Calls the core never saw (held back, or waiting for their request) are
            // refused, not cancelled: REFUSED_STREAM tells the client that nothing
            // ran, so it may send them again elsewhere (RFC 9113 §8.7).
            self.refuse_unseen();
        }
        self.drive(cx);
        // What the core queued (trailers above all) goes out before letting go.
        let sending =
            self.conn.pending_total() > 0 || !self.conn.out().is_empty() || self.unflushed;
        if sending && self.ended.is_none() && !self.read_done {
            return Poll::Pending;
        }
        if !self.conn.out().is_empty() && self.write(cx).is_ok() && !self.conn.out().is_empty() {
            return Poll::Pending;
        }
        match Pin::new(&mut self.io).poll_shutdown(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(_) => Poll::Ready(Ok(())),
        }
    }

    /// Unary calls waiting for the rest of their request, and the bytes the calls
    /// hold of unfinished messages: it changes as request bodies arrive.
    fn receiving(&self) -> u64 {
        if self.waiting == 0 {
            return 0;
        }
        self.waiting as u64 + self.unfinished.held() as u64
    }

    /// DATA the calls handed the connection and the socket has not taken, with what
    /// else is queued for it: it changes as the client takes a large answer.
    fn unsent(&self) -> u64 {
        (self.conn.pending_total() + self.conn.out_len()) as u64
    }

    /// The message limit (`GrpcConfig::max_message_len`, at most the core's
    /// `max_frame_len` less a frame header) bounds compressed messages decompressed
    /// too.
    fn max_message_len(&self) -> Option<usize> {
        Some(self.max_message)
    }

    fn writes_wait_on_peer_windows(&self) -> bool {
        // DATA waits for the client's stream and connection windows.
        true
    }

    fn peer(&self) -> String {
        self.peer.description().to_owned()
    }

    fn poll_gone(&mut self, cx: &mut Context<'_>) -> Poll<Error> {
        // Reading on (the connection's own frames, WINDOW_UPDATEs above all) is what
        // tells the end.
        self.drive(cx);
        if let Some(err) = self.ended.take() {
            self.reported_end = true;
            return Poll::Ready(err);
        }
        if self.read_done {
            return Poll::Ready(self.closed_error("closed"));
        }
        Poll::Pending
    }

    fn peer_info(&self) -> Peer {
        self.peer.clone()
    }

    /// HTTP/2 runs over a byte stream: a client that closed its sending side may still
    /// read, and is answered with the server's own close (TLS's close_notify over
    /// grpcs://, which a review found missing: the link was dropped with a bare FIN).
    fn half_closes(&self) -> bool {
        true
    }

    /// Bulk transfer has no gRPC form: its operations fail at once.
    fn carries_bulk(&self) -> bool {
        false
    }

    // The core's PINGs are not mapped to HTTP/2 (see `start_send`): its keepalive would
    // wait for PONGs that never come.
    fn carries_ping(&self) -> bool {
        false
    }

    // A unary answer's trailers are gRPC trailers, not response headers.
    fn splits_trailers(&self) -> bool {
        true
    }
}

/// A `grpc-timeout` in whole microseconds, as the core's wire carries it. A budget
/// under one microsecond is an expired deadline (`timeout_us = 0`: `DEADLINE_EXCEEDED`
/// before any handler runs), as it is by the time any server reads it; rounding it up
/// to 1 µs made the outcome a race between the handler and a timer. A longer budget
/// with a fraction of a microsecond is rounded up (`1500n` is 2 µs), so the server
/// never gives a call less time than its caller did.
fn whole_micros(timeout: Duration) -> Duration {
    if timeout < Duration::from_micros(1) {
        return Duration::ZERO;
    }
    Duration::from_micros(u64::try_from(timeout.as_nanos().div_ceil(1000)).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The standard codes' `grpc-status` fields are remembered by the HPACK tables,
    /// others not: a peer that refuses one would refuse it again at every later
    /// reference (from a review: grpcio failed every call of the connection INTERNAL
    /// after one status of 2147483647).
    #[test]
    fn only_standard_status_codes_are_indexed() {
        for code in 0..=16u32 {
            let value = code.to_string();
            assert!(matches!(
                indexing_of("grpc-status", value.as_bytes()),
                Indexing::Incremental
            ));
        }
        for odd in ["17", "99", "1000", "2147483647", "05"] {
            assert!(
                matches!(indexing_of("grpc-status", odd.as_bytes()), Indexing::No),
                "{odd}"
            );
        }
        assert!(matches!(indexing_of("grpc-message", b"x"), Indexing::No));
    }

    #[test]
    fn grpc_timeouts_round_up_to_whole_microseconds_and_under_one_expire() {
        assert_eq!(whole_micros(Duration::from_nanos(999)), Duration::ZERO);
        assert_eq!(whole_micros(Duration::from_nanos(1)), Duration::ZERO);
        assert_eq!(
            whole_micros(Duration::from_nanos(1000)),
            Duration::from_micros(1)
        );
        assert_eq!(
            whole_micros(Duration::from_nanos(1500)),
            Duration::from_micros(2)
        );
        assert_eq!(
            whole_micros(Duration::from_micros(7)),
            Duration::from_micros(7)
        );
        assert_eq!(whole_micros(Duration::ZERO), Duration::ZERO);
        assert_eq!(
            whole_micros(Duration::MAX),
            Duration::from_micros(u64::MAX),
            "saturates"
        );
    }

    use crate::codec::MessageData;

    /// A REQUEST the link builds reaches the core as the frame its bytes would decode
    /// to, with their length (what `poll_recv` hands out, and the hold counts).
    #[test]
    fn requests_handed_over_unencoded_match_their_encoding() {
        let mut metadata = Metadata::new();
        metadata.insert("x-user", "alice").unwrap();
        let key = frame::CallKey {
            client: 7,
            call: 9,
            attempt: 2,
        };
        let heads = [
            (
                Some(Duration::from_millis(250)),
                Some(key),
                metadata.clone(),
            ),
            (None, None, Metadata::new()),
        ];
        let messages = [
            Some(Message {
                compressed: false,
                data: MessageData::from_chunks(vec![
                    Bytes::from_static(b"\x08"),
                    Bytes::from_static(b"\x01"),
                ]),
            }),
            None,
        ];
        for (id, ((timeout, call_key, metadata), message)) in
            (1..).zip(heads.into_iter().zip(messages))
        {
            let head = RequestHead {
                method: "demo.Echo/Say".to_owned(),
                timeout,
                call_key,
                metadata,
            };
            let mut ready = ForCore::default();
            let request = head.into_frame(id, message);
            let entries = match &request {
                Frame::Request(request) => request.metadata.len(),
                other => panic!("not a REQUEST: {other:?}"),
            };
            ready.push_frame(request);
            let held = ready.bytes;
            let received = ready.pop_front().expect("queued");
            let Received::Frame { frame, len } = &received else {
                panic!("a REQUEST is handed over as a frame");
            };
            let len = *len;
            // The hold counts a decoded frame's metadata entries on top.
            assert_eq!(held, len + entries * frame::METADATA_ENTRY_COST);
            let frame = (**frame).clone();
            let bytes = codec::encoded(received);
            assert_eq!(len, bytes.len());
            let decoded = Frame::decode(bytes, &frame::DecodeLimits::default()).unwrap();
            assert_eq!(decoded, frame);
        }
    }
}

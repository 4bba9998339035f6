//! The client side: [`GrpcConnector`] opens an h2c connection (or one over TLS), and
//! [`GrpcClientLink`] runs its HTTP/2 (`crate::http2`) from the core's own tasks: the
//! core's REQUEST, DATA and CANCEL frames become HTTP/2 requests written to the socket
//! by whichever task sends them (a sequential call's caller, on an idle connection),
//! and the responses read from the socket become the core's DATA and RESPONSE frames.
//!
//! A unary REQUEST becomes a request with one message and END_STREAM, written with
//! its headers in one go; its response (headers, one message, trailers) becomes one
//! RESPONSE whose metadata is the headers followed by the trailers. A streaming
//! REQUEST opens the request; each DATA message follows, and the half-close is
//! END_STREAM; the response headers become a DATA frame with metadata, each message a
//! DATA frame, the trailers the closing RESPONSE.

use std::{
    collections::{HashMap, VecDeque},
    io,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, Waker},
};

use bytes::{Bytes, BytesMut};
use rpc_core::{
    compress::{self, Algorithm},
    frame::{self, Frame, GoAwayCode},
    link::{Connector, LazySleep, Link, LinkConfig, Received},
    status::quoted,
    ByteStr, Code, Error, ErrorKind, Metadata, MetadataValue, Payload,
};
use tokio::io::AsyncWrite;

use crate::{
    codec::{self, ForCore, MessageData, MessageDecoder},
    config::GrpcConfig,
    driver::{Io, READ_CHUNK},
    flood::ControlFrames,
    flow::{self, Unfinished},
    headers::{self, HeaderSink, HeaderSource},
    http2::{
        conn::{self, Connection, Event, HeaderWriter, IdMap, OpenError, Role},
        fields,
        frame::Reason,
        hpack::Indexing,
    },
    keepalive::Keepalive,
    Address,
};

/// The `user-agent` of requests this crate sends.
const USER_AGENT: &str = concat!("rpc-transport-grpc/", env!("CARGO_PKG_VERSION"));

/// Opens gRPC links to one server: `grpc://host:port` (h2c, prior knowledge) or,
/// with the `tls` feature, `grpcs://host:port` (TLS, ALPN `h2`).
#[derive(Clone, Debug)]
pub struct GrpcConnector {
    address: Address,
    config: GrpcConfig,
    #[cfg(feature = "tls")]
    tls: Option<rpc_transport_tcp::tls::ClientTls>,
    /// How many times a server closed a connection of this connector with GOAWAY
    /// `ENHANCE_YOUR_CALM` (gRPC's `too_many_pings`): each doubles the keepalive
    /// interval of the connections opened after it (gRPC's keepalive.md).
    calm_downs: Arc<std::sync::atomic::AtomicU32>,
}

/// Most doublings of the keepalive interval after `ENHANCE_YOUR_CALM` GOAWAYs.
const MAX_CALM_DOWNS: u32 = 16;

/// Reads of the socket per round before the task yields.
const READS_PER_ROUND: usize = 16;

/// Bytes the connection may have queued for a server that does not read them, beyond
/// DATA its windows allowed: past it the connection is closed.
const MAX_UNREAD_CONTROL: usize = 1024 * 1024;

/// Bytes queued for the socket past which the link takes no more frames from the core
/// until the socket took some (`poll_ready`).
const MAX_OUT: usize = 256 * 1024;

impl GrpcConnector {
    /// A connector for `address` with `config`. A `grpcs://` address trusts the
    /// system's roots unless [`tls`](Self::tls) says otherwise.
    pub fn new(address: Address, config: GrpcConfig) -> Self {
        GrpcConnector {
            address,
            config,
            #[cfg(feature = "tls")]
            tls: None,
            calm_downs: Arc::default(),
        }
    }

    /// A connector for a `grpc://host:port` or `grpcs://host:port` URI, with the
    /// default settings.
    pub fn from_uri(uri: &str) -> Result<Self, Error> {
        Ok(GrpcConnector::new(uri.parse()?, GrpcConfig::default()))
    }

    /// The TLS settings of a `grpcs://` address (trusted CAs, client certificate,
    /// server name). Default: [`ClientTls::system`](rpc_transport_tcp::tls::ClientTls::system).
    #[cfg(feature = "tls")]
    pub fn tls(mut self, tls: rpc_transport_tcp::tls::ClientTls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// The connection's byte stream: TCP, and TLS over it for `grpcs://`.
    async fn open(&self) -> Result<Io, Error> {
        let io = tokio::net::TcpStream::connect(self.address.authority())
            .await
            .map_err(|e| Error::io(format!("connect to {}", self.address), e))?;
        // Failing to set it costs latency, not correctness.
        let _ = io.set_nodelay(true);
        if !self.address.secure {
            return Ok(Box::new(io));
        }
        #[cfg(feature = "tls")]
        {
            use rpc_transport_tcp::tls::{ClientTls, Protocol};
            let tls = match &self.tls {
                Some(tls) => tls.clone(),
                None => ClientTls::system()?,
            };
            let uri = self.address.to_string();
            let (stream, _identity) = tls
                .handshake(io, self.address.host(), Protocol::H2, &uri)
                .await?;
            Ok(Box::new(stream))
        }
        #[cfg(not(feature = "tls"))]
        Err(Error::new(
            ErrorKind::Unsupported,
            format!(
                "{}: TLS is not built in (enable rpc-transport-grpc's `tls` feature)",
                self.address
            ),
        ))
    }
}

impl Connector for GrpcConnector {
    type Link = GrpcClientLink;

    async fn connect(&self, config: &LinkConfig) -> Result<GrpcClientLink, Error> {
        let io = self.open().await?;
        let max_message = self.config.message_limit(config.max_frame_len);
        let calm_downs = self.calm_downs.load(std::sync::atomic::Ordering::Relaxed);
        let keepalive = self.config.keepalive_interval.map(|interval| {
            Keepalive::new(
                interval.saturating_mul(1 << calm_downs.min(MAX_CALM_DOWNS)),
                self.config.keepalive_timeout,
                "server",
            )
        });
        let conn = Connection::new(
            Role::Client,
            conn::Config {
                max_concurrent_streams: 0,
                stream_window: self.config.stream_window,
                connection_window: self.config.connection_window,
                max_frame_size: self.config.max_frame_size,
                max_header_list_size: self.config.max_header_list_size,
                max_local_resets: self.config.max_local_error_reset_streams,
            },
            // The server's control frames are held to the same budget as a client's
            // on a server: without one, a server could make the client answer PINGs
            // and SETTINGS, and walk its streams for each WINDOW_UPDATE, SETTINGS or
            // GOAWAY, as fast as it sent them (from a review).
            Some(ControlFrames::new(
                self.config.max_control_frames,
                self.config.control_frame_period,
            )),
        );
        let authority = self
            .config
            .authority
            .clone()
            .unwrap_or_else(|| self.address.authority());
        Ok(GrpcClientLink {
            io,
            conn,
            input: BytesMut::with_capacity(READ_CHUNK),
            read_done: false,
            ended: None,
            reported_end: false,
            calls: HashMap::default(),
            by_stream: HashMap::default(),
            to_open: VecDeque::new(),
            touched: Vec::new(),
            ready: ForCore::default(),
            waker: None,
            max_message,
            max_metadata: config.max_metadata_len,
            unfinished: Unfinished::new(max_message),
            reservations: codec::Reservations::new(max_message),
            authority_valid: crate::is_valid_authority(&authority),
            authority,
            scheme: if self.address.secure { "https" } else { "http" },
            target: self.address.to_string(),
            highest_opened: 0,
            goaway_sent: None,
            encodings: Encodings::default(),
            handshake: Some(LazySleep::new(self.config.handshake_timeout)),
            handshake_timeout: self.config.handshake_timeout,
            block_timer: None,
            keepalive,
            calm_downs: self.calm_downs.clone(),
            calmed: false,
            keepalive_interval: self.config.keepalive_interval,
            bytes_read: 0,
            scratch: Vec::new(),
            unflushed: false,
        })
    }

    fn target(&self) -> String {
        self.address.to_string()
    }
}

/// What a call's request still needs to go out once its stream opens.
struct Queued {
    method: ByteStr,
    timeout: Option<std::time::Duration>,
    call_key: Option<frame::CallKey>,
    metadata: Metadata,
    /// DATA (a unary request's message, or a stream's early messages) and whether the
    /// request ends after it.
    data: Vec<Bytes>,
    end: bool,
}

/// Where a call's response stands.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Not opened yet (waiting for the server's stream limit).
    Queued,
    /// Sent; waiting for the response headers.
    Waiting,
    /// Reading the response's messages and trailers.
    Receiving,
}

/// One call as the client link tracks it.
struct ClientCall {
    phase: Phase,
    queued: Option<Queued>,
    /// Its HTTP/2 stream id, once opened (0 before).
    h2_id: u32,
    /// A unary call: its answer is one RESPONSE.
    unary: bool,
    /// The core's credit for the response's messages.
    credit: i64,
    decoder: MessageDecoder,
    /// The server ended its side, with these trailers if it sent any.
    recv_done: bool,
    trailers: Option<Vec<fields::Field>>,
    /// Bytes received past the credit whose HTTP/2 window is not released yet.
    held: usize,
    /// This call's part of the connection's unfinished bytes.
    counted: usize,
    /// A unary call's response headers and message, kept for the RESPONSE.
    headers: Metadata,
    message: Option<MessageData>,
    message_compressed: bool,
    /// The request's `grpc-encoding`: what the core may compress its messages with.
    request_encoding: Option<Algorithm>,
    /// The response's `grpc-encoding`.
    response_encoding: Option<Algorithm>,
    /// A `grpc-encoding` of the response that this build cannot decompress: an error
    /// only if a compressed message comes.
    unknown_encoding: Option<String>,
    /// DATA bytes handed to the connection, and the message ends with the credit each
    /// gives back to the core once written.
    handed: u64,
    sent_marks: VecDeque<(u64, u32)>,
    touched: bool,
}

/// How a call ended, for its RESPONSE.
struct Ending {
    code: Code,
    message: String,
    details: Bytes,
    metadata: Metadata,
    payload: MessageData,
    compressed: bool,
}

impl Ending {
    fn error(code: Code, message: impl Into<String>) -> Ending {
        Ending {
            code,
            message: message.into(),
            details: Bytes::new(),
            metadata: Metadata::new(),
            payload: MessageData::default(),
            compressed: false,
        }
    }
}

/// What the two ends of a connection said about compression, for the
/// `grpc-encoding` of requests (`docs/grpc.md`).
#[derive(Default)]
struct Encodings {
    /// The core's own list (its `rpc-accept-encoding`, configured algorithm first),
    /// from the last request that carried it: the core advertises only on its first
    /// requests.
    ours: Vec<Algorithm>,
    /// `ours` as the `grpc-accept-encoding` every request carries, made when `ours`
    /// changes (not per request).
    ours_header: Option<Bytes>,
    /// The server's `grpc-accept-encoding`, from its last response.
    server: ServerAccepts,
}

/// The server's `grpc-accept-encoding` (the same on every response of a server, as a
/// rule): parsed only when it changes.
#[derive(Default)]
struct ServerAccepts {
    /// The algorithms, in the server's order.
    list: Vec<Algorithm>,
    /// The header they were read from, when it was one value, and `list` as the
    /// core's `rpc-accept-encoding` value (`None` when the list was empty).
    last: Option<(Bytes, Option<MetadataValue>)>,
}

impl ServerAccepts {
    /// Reads a response's `grpc-accept-encoding` into `metadata` as the core's
    /// `rpc-accept-encoding` (on every response: the response may not reach the core,
    /// a cancelled call's for one). The same header as the last one is not parsed
    /// again.
    fn read(&mut self, fields: &[fields::Field], metadata: &mut Metadata) {
        let mut values = fields
            .iter()
            .filter(|(n, _)| n == "grpc-accept-encoding")
            .map(|(_, v)| v);
        let (first, more) = (values.next(), values.next().is_some());
        if let (false, Some(first), Some((header, listed))) = (more, first, &self.last) {
            if first == header {
                if let Some(listed) = listed {
                    let _ = metadata.append(compress::ACCEPT_ENCODING, listed.clone());
                }
                return;
            }
        }
        let accepts = headers::accepted(fields);
        // A value whose clones share one buffer: appended to every response.
        let listed =
            (!accepts.is_empty()).then(|| MetadataValue::from(headers::accept_list(&accepts)));
        if let Some(listed) = &listed {
            let _ = metadata.append(compress::ACCEPT_ENCODING, listed.clone());
            self.list = accepts;
        }
        self.last = match (more, first) {
            (false, Some(first)) => Some((first.clone(), listed)),
            _ => None,
        };
    }
}

impl Encodings {
    /// What the core compresses requests with now, if anything: its own rule.
    fn request(&self) -> Option<Algorithm> {
        if self.ours.is_empty() {
            return None;
        }
        headers::choose(self.ours.first().copied(), &self.server.list)
    }
}

/// The link of one gRPC connection on the client (see `docs/grpc.md`).
pub struct GrpcClientLink {
    io: Io,
    conn: Connection,
    input: BytesMut,
    read_done: bool,
    ended: Option<Error>,
    reported_end: bool,
    calls: IdMap<u64, ClientCall>,
    /// Core call id by HTTP/2 stream id.
    by_stream: IdMap<u32, u64>,
    /// Calls waiting for the server's stream limit, in order.
    to_open: VecDeque<u64>,
    touched: Vec<u64>,
    /// Frames for the core.
    ready: ForCore,
    /// The core's reading task, woken for an answer the link makes while another task
    /// sends (a sequential call's caller).
    waker: Option<Waker>,
    max_message: usize,
    /// The core's metadata limit: responses whose metadata exceed it fail
    /// `RESOURCE_EXHAUSTED` here rather than as a frame the core refuses.
    max_metadata: usize,
    /// What the calls hold of unfinished response messages, together, and the bound.
    unfinished: Unfinished,
    /// The buffers its decoders reserve to assemble large messages, together.
    reservations: codec::Reservations,
    authority: String,
    /// Whether `authority` is one (see [`crate::is_valid_authority`]): calls fail
    /// `INTERNAL` if not.
    authority_valid: bool,
    /// `http`, or `https` over TLS: the requests' `:scheme`.
    scheme: &'static str,
    target: String,
    /// The highest call id opened as an HTTP/2 stream.
    highest_opened: u64,
    /// The `last_id` of the GOAWAY the link gave the core, once it gave one.
    goaway_sent: Option<u64>,
    encodings: Encodings,
    /// The server's first SETTINGS must come within this.
    handshake: Option<LazySleep>,
    handshake_timeout: std::time::Duration,
    block_timer: Option<LazySleep>,
    keepalive: Option<Keepalive>,
    calm_downs: Arc<std::sync::atomic::AtomicU32>,
    /// This connection already counted in `calm_downs`.
    calmed: bool,
    keepalive_interval: Option<std::time::Duration>,
    bytes_read: u64,
    scratch: Vec<u32>,
    /// The byte stream has written bytes it has not flushed yet (a TLS stream keeps
    /// records until flushed).
    unflushed: bool,
}

impl GrpcClientLink {
    fn closed_error(&self, why: &str) -> Error {
        Error::new(
            ErrorKind::Closed,
            format!("gRPC connection to {}: {why}", self.target),
        )
    }

    /// `error`, which ends the connection before the server's first SETTINGS: the
    /// peer is no HTTP/2 server without TLS (every HTTP/2 server sends SETTINGS first)
    /// and processed none of the calls, which fail unprocessed; says what its bytes
    /// look like (from a review: at a grpcs:// port, "the server closed the connection
    /// [the call may have run]").
    fn before_settings(&self, error: Error) -> Error {
        // A refused TLS handshake says so itself, and is unprocessed already.
        if self.conn.heard_settings() || error.kind() == ErrorKind::Refused {
            return error;
        }
        let bytes = &self.input[..];
        let looks = if self.scheme == "https" {
            // Over TLS already (from a review: told to try grpcs://).
            "no HTTP/2 SETTINGS came after the TLS handshake: did the server refuse this \
             client's certificate (mTLS), or is it no gRPC server?"
        } else if bytes.len() >= 2 && matches!(bytes[0], 20..=23) && bytes[1] == 3 {
            "it speaks TLS: call it with grpcs://"
        } else if bytes.starts_with(b"HTTP/") {
            "it speaks HTTP/1, not gRPC"
        } else {
            "its bytes are not HTTP/2, which starts with SETTINGS: is it a port of the \
             framework's own wire (tcp://), or a TLS one (grpcs://)?"
        };
        Error::new(error.kind(), format!("{error} ({looks})")).from_another_protocol()
    }

    fn end(&mut self, error: Error) {
        if self.ended.is_none() {
            self.ended = Some(error);
            // Calls still waiting for a stream never left: unprocessed, safe to send
            // again (they failed as plain UNAVAILABLE with the connection's error).
            // They are dropped, so that nothing opens them on this connection
            // afterwards (a server that half-closed may still read what comes).
            if !self.to_open.is_empty() {
                self.refuse_unopened("the connection ended before the call was sent");
            }
        }
        self.read_done = true;
    }

    fn touch(&mut self, id: u64) {
        if let Some(call) = self.calls.get_mut(&id) {
            if !call.touched {
                call.touched = true;
                self.touched.push(id);
            }
        }
    }

    /// Answers a request the link refuses before it goes out. The core's task is
    /// woken to read the answer: the request may have been written by a caller's
    /// task (a sequential call is), which then flushes without reading.
    fn answer_now(&mut self, id: u64, ending: Ending) {
        push_response(&mut self.ready, id, ending, self.max_metadata);
        if let Some(waker) = &self.waker {
            waker.wake_by_ref();
        }
    }

    fn on_request(&mut self, request: frame::RequestFrame, payload: Payload) {
        let id = request.id;
        if !self.authority_valid {
            let message = format!(
                "the :authority {:?} is not host[:port] (a name, an IPv4 address or a \
                 bracketed IPv6 address, and an optional port)",
                self.authority
            );
            self.answer_now(id, Ending::error(Code::INTERNAL, message));
            return;
        }
        if !valid_path(&request.method) {
            let message = format!(
                "{}://{}/{} is not a valid URI",
                self.scheme, self.authority, request.method
            );
            self.answer_now(id, Ending::error(Code::INTERNAL, message));
            return;
        }
        let ours = accepts_of(&request.metadata);
        if !ours.is_empty() && ours != self.encodings.ours {
            let list = headers::accept_list(&ours) + ",identity";
            self.encodings.ours_header = Some(Bytes::from(list));
            self.encodings.ours = ours;
        }
        let request_encoding = self.encodings.request();
        let (payload, compressed) = if request.compressed {
            match headers::fit_encoding(request_encoding, payload, self.max_message) {
                Ok(fit) => fit,
                Err(status) => {
                    self.answer_now(id, Ending::error(Code::INTERNAL, status.message()));
                    return;
                }
            }
        } else {
            (payload, false)
        };
        if let Err(message) = headers::check_metadata(&request.metadata) {
            self.answer_now(id, Ending::error(Code::INTERNAL, message));
            return;
        }
        let unary = !request.streaming;
        let mut data = Vec::new();
        let mut handed = 0u64;
        if unary {
            for chunk in codec::encode_message(&payload, compressed) {
                handed += chunk.len() as u64;
                data.push(chunk);
            }
        }
        self.calls.insert(
            id,
            ClientCall {
                phase: Phase::Queued,
                queued: Some(Queued {
                    method: request.method,
                    timeout: request.timeout,
                    call_key: request.call_key,
                    metadata: request.metadata,
                    data,
                    end: unary,
                }),
                h2_id: 0,
                unary,
                credit: i64::from(frame::INITIAL_STREAM_WINDOW),
                decoder: MessageDecoder::new(self.max_message),
                recv_done: false,
                trailers: None,
                held: 0,
                counted: 0,
                headers: Metadata::new(),
                message: None,
                message_compressed: false,
                request_encoding,
                response_encoding: None,
                unknown_encoding: None,
                handed,
                sent_marks: VecDeque::new(),
                touched: false,
            },
        );
        self.to_open.push_back(id);
        self.open_queued();
    }

    fn on_data(&mut self, data: frame::DataFrame, payload: Payload) {
        let Some(call) = self.calls.get_mut(&data.id) else {
            return;
        };
        let mut chunks = Vec::new();
        if data.message.is_some() {
            // Credit comes back for the message as the core sent it (docs/wire.md §6.10).
            let credit = flow::message_cost(payload.len());
            let (payload, compressed) = if data.compressed {
                match headers::fit_encoding(call.request_encoding, payload, self.max_message) {
                    Ok(fit) => fit,
                    Err(status) => {
                        if call.h2_id != 0 {
                            self.conn.reset(call.h2_id, Reason::CANCEL);
                        }
                        self.remove_call(data.id);
                        let ending = Ending::error(Code::INTERNAL, status.message());
                        push_response(&mut self.ready, data.id, ending, self.max_metadata);
                        return;
                    }
                }
            } else {
                (payload, false)
            };
            for chunk in codec::encode_message(&payload, compressed) {
                call.handed += chunk.len() as u64;
                chunks.push(chunk);
            }
            call.sent_marks.push_back((call.handed, credit));
        }
        match &mut call.queued {
            Some(queued) => {
                queued.data.extend(chunks);
                queued.end |= data.end_stream;
            }
            None => {
                let n = chunks.len();
                for (i, chunk) in chunks.into_iter().enumerate() {
                    let end = data.end_stream && i + 1 == n;
                    self.conn.send_data(call.h2_id, chunk, end);
                }
                if data.end_stream && n == 0 {
                    self.conn.send_data(call.h2_id, Bytes::new(), true);
                }
            }
        }
    }

    fn on_cancel(&mut self, id: u64) {
        if let Some(call) = self.calls.get(&id) {
            if call.h2_id != 0 {
                self.conn.reset(call.h2_id, Reason::CANCEL);
            }
            self.remove_call(id);
        }
    }

    fn remove_call(&mut self, id: u64) {
        if let Some(call) = self.calls.remove(&id) {
            self.unfinished.uncount(call.counted);
            if call.h2_id != 0 {
                self.by_stream.remove(&call.h2_id);
            }
        }
    }

    /// Opens queued calls while the server's stream limit allows (none once the
    /// connection ended).
    fn open_queued(&mut self) {
        if self.ended.is_some() {
            return;
        }
        while let Some(&id) = self.to_open.front() {
            let Some(call) = self.calls.get_mut(&id) else {
                self.to_open.pop_front();
                continue;
            };
            let h2_id = match self.conn.open_stream() {
                Ok(h2_id) => h2_id,
                Err(OpenError::AtLimit) => return,
                Err(OpenError::Exhausted) => {
                    // No stream will open on this connection: the core's calls not yet
                    // opened were never sent, and are safe to retry elsewhere. The
                    // core's GOAWAY (this one, or the one the server's GOAWAY gave it)
                    // covers them: their ids are above every call opened.
                    self.refuse_unopened("the gRPC server takes no new calls on this connection");
                    return;
                }
            };
            self.to_open.pop_front();
            let queued = call.queued.take().expect("a queued call");
            call.h2_id = h2_id;
            call.phase = Phase::Waiting;
            self.by_stream.insert(h2_id, id);
            self.highest_opened = self.highest_opened.max(id);
            let (scheme, authority) = (self.scheme, self.authority.as_str());
            let accept = self.encodings.ours_header.as_ref();
            let encoding = call.request_encoding;
            self.conn.send_headers(h2_id, false, |w| {
                write_request(w, scheme, authority, &queued, accept, encoding);
            });
            let n = queued.data.len();
            for (i, chunk) in queued.data.into_iter().enumerate() {
                self.conn.send_data(h2_id, chunk, queued.end && i + 1 == n);
            }
            if queued.end && n == 0 {
                self.conn.send_data(h2_id, Bytes::new(), true);
            }
        }
    }

    /// The calls not opened yet fail as unprocessed: they are dropped, and the core is
    /// told with a GOAWAY whose last id is the last call opened.
    fn refuse_unopened(&mut self, why: &str) {
        // Dropped, so that nothing opens them here later; the core's GOAWAY (this one,
        // or an earlier one) covers them: their ids are above every call opened.
        for id in std::mem::take(&mut self.to_open) {
            self.remove_call(id);
        }
        if self.goaway_sent.is_some() {
            return;
        }
        self.goaway_sent = Some(self.highest_opened);
        let mut buf = BytesMut::new();
        frame::encode_goaway(&mut buf, self.highest_opened, GoAwayCode::NO_ERROR, why);
        self.ready.push_front(buf.freeze());
        if let Some(waker) = &self.waker {
            waker.wake_by_ref();
        }
    }

    /// One round: timers, the socket read and its frames handled, the calls with news
    /// moved along, and what is queued written.
    fn drive(&mut self, cx: &mut Context<'_>) {
        if self.ended.is_none() {
            self.poll_timers(cx);
        }
        if self.ended.is_none() && !self.read_done {
            self.read(cx);
            // A header block's deadline armed by this read: polled now, so that it
            // wakes the task when it passes.
            if let Some(timer) = &mut self.block_timer {
                if timer.poll(cx).is_ready() {
                    self.end(self.closed_error("a header block left unfinished"));
                }
            }
        }
        self.open_queued();
        self.step_calls();
        self.credit_sent();
        if let Err(err) = self.write(cx) {
            if self.ended.is_none() {
                // (A peer of another protocol that closed may fail the write first.)
                let error = Error::io(format!("gRPC connection to {}", self.target), err);
                self.end(self.before_settings(error));
            }
        }
        // Looked at once the socket took what it would: the header blocks of many
        // calls opened in one round are no sign of a server that does not read.
        if self.ended.is_none() && self.conn.out().control_len() > MAX_UNREAD_CONTROL {
            self.conn.abort(
                Reason::ENHANCE_YOUR_CALM,
                "the server does not read what it makes the client send",
            );
            self.end(self.closed_error("the server does not read its socket"));
            let _ = self.write(cx);
        }
    }

    fn poll_timers(&mut self, cx: &mut Context<'_>) {
        if let Some(handshake) = &mut self.handshake {
            if self.conn.is_open() {
                self.handshake = None;
            } else if handshake.poll(cx).is_ready() {
                let error = Error::new(
                    ErrorKind::TimedOut,
                    format!("HTTP/2 handshake with {} timed out", self.target),
                );
                self.end(error);
                return;
            }
        }
        if let Some(keepalive) = &mut self.keepalive {
            let due = !self.calls.is_empty();
            if let Err(cause) = keepalive.poll(cx, self.bytes_read, due, &mut self.conn) {
                tracing::debug!(%cause, "closing the gRPC connection");
                self.end(self.closed_error(&cause));
            }
        }
    }

    fn read(&mut self, cx: &mut Context<'_>) {
        let mut reads = 0;
        loop {
            self.handle_input();
            if self.conn.is_closed() {
                self.read_done = true;
            }
            if self.ended.is_some() || self.read_done {
                return;
            }
            if reads == READS_PER_ROUND {
                cx.waker().wake_by_ref();
                return;
            }
            let want = crate::driver::wanted(&self.input);
            self.input.reserve(want);
            match tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, &mut self.input) {
                Poll::Pending => return,
                Poll::Ready(Ok(0)) => {
                    self.read_done = true;
                    let error = self.closed_error("the server closed the connection");
                    self.end(self.before_settings(error));
                    return;
                }
                Poll::Ready(Ok(n)) => {
                    self.bytes_read += n as u64;
                    reads += 1;
                }
                Poll::Ready(Err(err)) => {
                    let error = Error::io(format!("gRPC connection to {}", self.target), err);
                    self.end(self.before_settings(error));
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
                    let protocol = matches!(
                        err.reason,
                        Reason::PROTOCOL_ERROR | Reason::FRAME_SIZE_ERROR
                    );
                    let hint = if protocol && self.conn.heard_settings() {
                        " (the server broke HTTP/2, or its bytes are not HTTP/2 at all: is it \
                         a port of the framework's own wire, tcp://, or a TLS one, grpcs://?)"
                    } else {
                        ""
                    };
                    let error = Error::new(
                        ErrorKind::Protocol,
                        format!(
                            "gRPC connection to {}: {}: {}{hint}",
                            self.target, err.reason, err.what
                        ),
                    );
                    self.end(self.before_settings(error));
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
                ..
            } => {
                let Some(&id) = self.by_stream.get(&stream) else {
                    return;
                };
                if self.calls[&id].phase == Phase::Waiting {
                    match self.on_head(id, &fields, end_stream) {
                        None => self.touch(id),
                        Some(ending) => self.finish(id, ending),
                    }
                    return;
                }
                if let Err(why) = fields::trailers(&fields) {
                    let message = format!("the server's trailers: {why}");
                    self.finish(id, Ending::error(Code::INTERNAL, message));
                    return;
                }
                let call = self.calls.get_mut(&id).expect("by_stream follows calls");
                call.trailers = Some(fields);
                call.recv_done = true;
                self.touch(id);
            }
            Event::HeadersTooLarge { stream, .. } => {
                let Some(&id) = self.by_stream.get(&stream) else {
                    return;
                };
                let message = format!(
                    "gRPC stream to {} failed: this client reset it: the server's headers or \
                     trailers exceed this client's header-list limit \
                     (GrpcConfig::max_header_list_size)",
                    self.target
                );
                self.finish(id, Ending::error(Code::RESOURCE_EXHAUSTED, message));
            }
            Event::Data {
                stream,
                data,
                end_stream,
            } => {
                let len = data.len();
                let Some(&id) = self.by_stream.get(&stream) else {
                    self.conn.release(stream, len);
                    return;
                };
                let call = self.calls.get_mut(&id).expect("by_stream follows calls");
                if call.credit > 0 {
                    self.conn.release(stream, len);
                } else {
                    call.held += len;
                }
                call.decoder.push(data, &self.reservations);
                if end_stream {
                    call.recv_done = true;
                }
                self.touch(id);
            }
            Event::Reset {
                stream,
                reason,
                by_peer,
            } => {
                let Some(&id) = self.by_stream.get(&stream) else {
                    return;
                };
                let call = &self.calls[&id];
                if call.recv_done {
                    // The response is whole (its trailers came): a server stops the
                    // rest of a request it no longer needs with RST_STREAM NO_ERROR
                    // (RFC 9113 §8.1), and the answer stands.
                    return;
                }
                // Only before the response began: a server that answered processed
                // the call, whatever it says of the stream afterwards.
                let unanswered = call.phase == Phase::Waiting;
                if by_peer && unanswered && reason == Reason::REFUSED_STREAM {
                    // RFC 9113 §8.7: refused before any processing; a retry is safe.
                    let message = format!(
                        "the gRPC server {} refused the call's stream (REFUSED_STREAM): not \
                         processed",
                        self.target
                    );
                    self.remove_call(id);
                    self.ready.push_refused(id, message);
                    return;
                }
                let message = if by_peer {
                    format!(
                        "gRPC stream to {} failed: stream reset by the server: {reason}",
                        self.target
                    )
                } else {
                    format!(
                        "gRPC stream to {} failed: this client reset it ({reason}): the \
                         response broke HTTP/2's rules or this client's limits",
                        self.target
                    )
                };
                let code = code_for_reset(reason);
                self.remove_call(id);
                push_response(
                    &mut self.ready,
                    id,
                    Ending::error(code, message),
                    self.max_metadata,
                );
            }
            Event::GoAway {
                last_stream,
                reason,
                debug,
            } => self.on_goaway(last_stream, reason, &debug),
            Event::PingAck(payload) => {
                if let Some(keepalive) = &mut self.keepalive {
                    keepalive.pong(payload, self.bytes_read);
                }
            }
        }
    }

    /// The server's GOAWAY: calls on streams above its last one were not processed;
    /// the core is told with a GOAWAY of its own, whose last id is below the first of
    /// them, and no new call opens here. The calls below run on (RFC 9113 §6.8).
    fn on_goaway(&mut self, last_stream: u32, reason: Reason, debug: &[u8]) {
        if reason == Reason::ENHANCE_YOUR_CALM
            && self.keepalive.as_ref().is_some_and(Keepalive::pinged)
            && !std::mem::replace(&mut self.calmed, true)
        {
            // Only a connection that PINGed: servers send ENHANCE_YOUR_CALM for other
            // floods too (stream resets: the rapid-reset defence). And once per
            // connection: a server repeating its GOAWAY had the interval doubled for
            // each, up to the cap, and keepalive was off for the connector's life.
            let n = self
                .calm_downs
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                + 1;
            tracing::warn!(
                interval = ?self.keepalive_interval.map(|i| i.saturating_mul(2)),
                "the gRPC server closed the connection for too many PINGs \
                 (ENHANCE_YOUR_CALM): new connections PING half as often ({n} times now)"
            );
        }
        // Above the server's last stream: unprocessed, unless the answer had begun
        // (a server that answered a stream and then disowned it broke HTTP/2's
        // promise; the call may have run, so it fails plainly, before the core hears
        // of the GOAWAY).
        let mut refused: Vec<u64> = Vec::new();
        let mut disowned: Vec<u64> = Vec::new();
        for (&id, call) in &self.calls {
            if call.h2_id > last_stream {
                if call.phase == Phase::Receiving {
                    disowned.push(id);
                } else if call.phase == Phase::Waiting {
                    refused.push(id);
                }
            }
        }
        refused.sort_unstable();
        for id in disowned {
            let message = format!(
                "the gRPC server {} is going away and disowned a call it had begun to \
                 answer ({reason})",
                self.target
            );
            self.finish(id, Ending::error(Code::UNAVAILABLE, message));
        }
        let last = match refused.first() {
            Some(&first) => first - 1,
            None => self.highest_opened,
        };
        // The link opens calls in id order: no opened call above `last` survives.
        for &id in &refused {
            if let Some(call) = self.calls.get(&id) {
                if call.h2_id != 0 {
                    self.conn.reset(call.h2_id, Reason::CANCEL);
                }
            }
            self.remove_call(id);
        }
        let last = self.goaway_sent.map_or(last, |sent| sent.min(last));
        if self.goaway_sent != Some(last) {
            self.goaway_sent = Some(last);
            let mut buf = BytesMut::new();
            let debug = String::from_utf8_lossy(debug);
            let message = if debug.is_empty() {
                format!("the gRPC server is going away ({reason})")
            } else {
                format!(
                    "the gRPC server is going away ({reason}: {})",
                    quoted(&debug)
                )
            };
            frame::encode_goaway(&mut buf, last, GoAwayCode::NO_ERROR, &message);
            // Behind the answers above.
            self.ready.push_back(buf.freeze());
        }
        // Calls not opened yet (above `last` too) are the core's to fail.
        for id in std::mem::take(&mut self.to_open) {
            self.remove_call(id);
        }
    }

    /// Handles the response head; `Some` ends the call at once.
    fn on_head(&mut self, id: u64, head: &[fields::Field], end_stream: bool) -> Option<Ending> {
        let call = self.calls.get_mut(&id).expect("the caller found it");
        let status = match fields::response(head) {
            Ok(response) => response.status,
            Err(why) => {
                return Some(Ending::error(
                    Code::INTERNAL,
                    format!("malformed response headers from the server: {why}"),
                ))
            }
        };
        if status != 200 {
            // gRPC's status mapping: an HTTP status stands for the call's only when the
            // response has no grpc-status (a proxy's 429 with grpc-status 8 is
            // RESOURCE_EXHAUSTED, not UNAVAILABLE).
            let grpc = headers::read_status(head);
            if HeaderSource::first(head, "grpc-status").is_some() && grpc.code != Code::OK {
                let mut ending = Ending::error(grpc.code, grpc.message);
                ending.details = grpc.details;
                return Some(ending);
            }
            return Some(Ending::error(
                codec::code_for_http_status(status),
                format!(
                    "the server answered with HTTP status {status}{}",
                    http_reason(status)
                ),
            ));
        }
        // `application/grpc`, alone or with `+codec` or `;parameters`: not
        // `application/grpc-web` or another type that merely starts the same.
        if headers::grpc_codec(head).is_none() {
            let content_type = HeaderSource::first(head, "content-type")
                .map(|v| String::from_utf8_lossy(v).into_owned())
                .unwrap_or_default();
            return Some(Ending::error(
                Code::UNKNOWN,
                format!(
                    "the server answered with content-type {:?}, not gRPC",
                    quoted(&content_type)
                ),
            ));
        }
        let mut metadata = Metadata::new();
        match headers::read_metadata(head, &mut metadata, self.max_metadata) {
            Ok(()) => {}
            Err(headers::MetadataError::Malformed(message)) => {
                let message = format!("the server's response headers: {message}");
                return Some(Ending::error(Code::INTERNAL, message));
            }
            Err(headers::MetadataError::TooLarge) => {
                return Some(Ending::error(Code::RESOURCE_EXHAUSTED, METADATA_TOO_LARGE));
            }
        }
        // The server's `grpc-accept-encoding` becomes the core's `rpc-accept-encoding`,
        // so the core compresses requests toward it (with what the next requests name).
        self.encodings.server.read(head, &mut metadata);
        if end_stream {
            // Trailers-only. (A `grpc-status` in headers that do not end the stream is
            // no status: the trailers that end it are.)
            let status = headers::read_status(head);
            if call.unary && status.code == Code::OK {
                return Some(Ending::error(
                    Code::UNIMPLEMENTED,
                    "the server sent no message for a unary call (a Trailers-Only OK)",
                ));
            }
            return Some(Ending {
                code: status.code,
                message: status.message,
                details: status.details,
                metadata,
                payload: MessageData::default(),
                compressed: false,
            });
        }
        match headers::encoding(head) {
            Ok(encoding) => call.response_encoding = encoding,
            // Failed only if a compressed message comes.
            Err(name) => call.unknown_encoding = Some(name),
        }
        if call.unary {
            call.credit = i64::MAX;
            call.headers = metadata;
        } else {
            if !frame::metadata_fits(&metadata, self.max_metadata) {
                return Some(Ending::error(
                    Code::RESOURCE_EXHAUSTED,
                    "the response's headers exceed the metadata limit",
                ));
            }
            let mut buf = BytesMut::new();
            frame::encode_data_header(&mut buf, id, frame::FLAG_NO_MESSAGE, Some(&metadata));
            self.ready.push_back(buf.freeze());
        }
        call.phase = Phase::Receiving;
        None
    }

    /// Ends a call with `ending`: its RESPONSE to the core, its stream reset if still
    /// open (a response that failed, or one complete before the request was).
    fn finish(&mut self, id: u64, ending: Ending) {
        if let Some(call) = self.calls.get(&id) {
            if call.h2_id != 0 {
                self.conn.reset(call.h2_id, Reason::CANCEL);
            }
        }
        self.remove_call(id);
        push_response(&mut self.ready, id, ending, self.max_metadata);
    }

    fn step_calls(&mut self) {
        let mut touched = std::mem::take(&mut self.touched);
        let mut i = 0;
        while i < touched.len() {
            let id = touched[i];
            i += 1;
            if let Some(call) = self.calls.get_mut(&id) {
                call.touched = false;
            }
            self.step(id);
            touched.append(&mut self.touched);
        }
        touched.clear();
        self.touched = touched;
    }

    /// Hands the core the response's messages within its credit, then its end.
    fn step(&mut self, id: u64) {
        loop {
            let Some(call) = self.calls.get_mut(&id) else {
                return;
            };
            if call.phase != Phase::Receiving {
                return;
            }
            if call.credit > 0 {
                match call.decoder.next() {
                    Err(err) => {
                        self.finish(id, Ending::error(err.code(), err.to_string()));
                        return;
                    }
                    Ok(Some(message)) => {
                        self.unfinished.forget(&mut call.counted);
                        let refused = match (message.compressed, call.response_encoding) {
                            (false, _) => None,
                            (true, None) => Some(match &call.unknown_encoding {
                                Some(name) => format!(
                                    "the server compresses with {:?}, which this client \
                                     cannot decompress",
                                    quoted(name)
                                ),
                                None => "compressed response message without grpc-encoding".into(),
                            }),
                            (true, encoding) => {
                                codec::encoding_mismatch(&message, encoding).map(String::from)
                            }
                        };
                        if let Some(why) = refused {
                            self.finish(id, Ending::error(Code::INTERNAL, why));
                            return;
                        }
                        let release = call.held.min(codec::PREFIX_LEN + message.data.len());
                        call.held -= release;
                        if !call.unary {
                            call.credit -= i64::from(flow::message_cost(message.data.len()));
                            self.ready.push_message(id, message);
                        } else if call.message.is_some() {
                            // A cardinality violation: UNIMPLEMENTED, as gRPC's status
                            // code table has it.
                            let ending = Ending::error(
                                Code::UNIMPLEMENTED,
                                "the server sent several messages for a unary call",
                            );
                            self.finish(id, ending);
                            return;
                        } else {
                            call.message_compressed = message.compressed;
                            call.message = Some(message.data);
                        }
                        let h2_id = call.h2_id;
                        if release > 0 {
                            self.conn.release(h2_id, release);
                        }
                        continue;
                    }
                    Ok(None) => {
                        let now = call.decoder.buffered();
                        if let Err(err) = self.unfinished.count(&mut call.counted, now) {
                            self.finish(id, Ending::error(err.code(), err.to_string()));
                            return;
                        }
                        let release = std::mem::take(&mut call.held);
                        let h2_id = call.h2_id;
                        if release > 0 {
                            self.conn.release(h2_id, release);
                        }
                    }
                }
            }
            let call = self.calls.get_mut(&id).expect("still here");
            if !call.recv_done || (call.credit <= 0 && call.decoder.has_partial()) {
                return;
            }
            if let Err(err) = call.decoder.finish() {
                self.finish(id, Ending::error(err.code(), err.to_string()));
                return;
            }
            let ending = self.ending(id);
            self.finish(id, ending);
            return;
        }
    }

    /// How a call whose response ended ended: its trailers' status, the headers and
    /// trailers as metadata, a unary call's message.
    fn ending(&mut self, id: u64) -> Ending {
        let max_metadata = self.max_metadata;
        let call = self.calls.get_mut(&id).expect("the caller found it");
        let trailers = call.trailers.take();
        // No trailers at all (the last DATA frame ended the stream): `INTERNAL`, as
        // grpc-go reports it; trailers without a `grpc-status` are `UNKNOWN`.
        let status = match &trailers {
            Some(trailers) => headers::read_status(&trailers[..]),
            None => headers::TrailerStatus {
                code: Code::INTERNAL,
                message: "the server closed the stream without sending trailers".to_owned(),
                details: Bytes::new(),
            },
        };
        let mut metadata = std::mem::take(&mut call.headers);
        let malformed = trailers
            .as_ref()
            .and_then(|t| headers::read_metadata(&t[..], &mut metadata, max_metadata).err());
        let mut ending = Ending {
            code: status.code,
            message: status.message,
            details: status.details,
            metadata,
            payload: MessageData::default(),
            compressed: false,
        };
        match malformed {
            None => {}
            Some(headers::MetadataError::Malformed(message)) => {
                let message = format!("the server's trailers: {message}");
                ending = Ending::error(Code::INTERNAL, message);
            }
            Some(headers::MetadataError::TooLarge) => {
                ending = Ending::error(Code::RESOURCE_EXHAUSTED, METADATA_TOO_LARGE);
            }
        }
        if call.unary && ending.code == Code::OK {
            match call.message.take() {
                Some(message) => {
                    ending.payload = message;
                    ending.compressed = call.message_compressed;
                }
                None => {
                    ending = Ending::error(
                        Code::UNIMPLEMENTED,
                        "the server sent no message for a unary call",
                    )
                }
            }
        }
        ending
    }

    /// Gives the core back its credit for the messages the connection wrote.
    fn credit_sent(&mut self) {
        let mut drained = std::mem::take(&mut self.scratch);
        self.conn.take_drained(&mut drained);
        drained.sort_unstable();
        drained.dedup();
        for &h2_id in &drained {
            let Some(&id) = self.by_stream.get(&h2_id) else {
                continue;
            };
            let Some(call) = self.calls.get_mut(&id) else {
                continue;
            };
            let sent = call.handed - self.conn.pending(h2_id) as u64;
            let mut credit = 0u32;
            while let Some(&(end, cost)) = call.sent_marks.front() {
                if end > sent {
                    break;
                }
                credit = credit.saturating_add(cost);
                call.sent_marks.pop_front();
            }
            if credit > 0 {
                let mut buf = BytesMut::with_capacity(frame::HEADER_LEN + 4);
                frame::encode_window(&mut buf, id, credit);
                self.ready.push_back(buf.freeze());
            }
        }
        drained.clear();
        self.scratch = drained;
    }

    fn write(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        crate::driver::write_out(&mut self.io, &mut self.conn, &mut self.unflushed, cx)
    }
}

/// Whether `method` makes a valid `:path` after its slash: visible ASCII.
fn valid_path(method: &str) -> bool {
    !method.is_empty() && method.bytes().all(|b| (0x21..0x7f).contains(&b))
}

/// A metadata sink that leaves `user-agent` out (it goes joined with ours).
struct NoUserAgent<'a, 'b>(&'a mut HeaderWriter<'b>);

impl HeaderSink for NoUserAgent<'_, '_> {
    fn put(&mut self, name: &str, value: &[u8]) {
        if name != "user-agent" {
            self.0.field(name.as_bytes(), value, Indexing::No);
        }
    }
}

/// Writes a request's header block.
fn write_request(
    w: &mut HeaderWriter<'_>,
    scheme: &str,
    authority: &str,
    queued: &Queued,
    accept: Option<&Bytes>,
    encoding: Option<Algorithm>,
) {
    w.field(b":method", b"POST", Indexing::Incremental);
    w.field(b":scheme", scheme.as_bytes(), Indexing::Incremental);
    let mut path = Vec::with_capacity(1 + queued.method.len());
    path.push(b'/');
    path.extend_from_slice(queued.method.as_bytes());
    w.field(b":path", &path, Indexing::Incremental);
    w.field(b":authority", authority.as_bytes(), Indexing::Incremental);
    w.field(b"content-type", b"application/grpc", Indexing::Incremental);
    w.field(b"te", b"trailers", Indexing::Incremental);
    // An application's `user-agent` (metadata forwarded from an incoming call, say)
    // goes in front of ours, in the one header, as grpc-go's does: not a second one.
    let theirs: Vec<&str> = queued
        .metadata
        .get_all("user-agent")
        .filter_map(|v| v.as_str())
        .filter(|v| v.bytes().all(|b| (0x20..=0x7e).contains(&b)))
        .collect();
    if theirs.is_empty() {
        w.field(b"user-agent", USER_AGENT.as_bytes(), Indexing::Incremental);
    } else {
        let joined = format!("{} {USER_AGENT}", theirs.join(" "));
        w.field(b"user-agent", joined.as_bytes(), Indexing::Incremental);
    }
    if let Some(timeout) = queued.timeout {
        w.field(
            b"grpc-timeout",
            codec::format_timeout(timeout).as_bytes(),
            Indexing::No,
        );
    }
    if let Some(key) = &queued.call_key {
        w.field(
            headers::CALL_KEY_HEADER.as_bytes(),
            headers::call_key_value(key).as_bytes(),
            Indexing::No,
        );
        if key.attempt > 1 {
            // gRFC A6: what other gRPC servers read of a retry.
            let mut digits = [0u8; 10];
            w.field(
                headers::PREVIOUS_ATTEMPTS.as_bytes(),
                headers::decimal(key.attempt - 1, &mut digits),
                Indexing::No,
            );
        }
    }
    // Checked when the request came (`headers::check_metadata`).
    let _ = headers::write_metadata(&queued.metadata, &mut NoUserAgent(w));
    if let Some(accept) = accept {
        w.field(b"grpc-accept-encoding", accept, Indexing::Incremental);
    }
    if let Some(algorithm) = encoding {
        w.field(
            b"grpc-encoding",
            algorithm.name().as_bytes(),
            Indexing::Incremental,
        );
    }
}

/// The status a client reports for a stream the server (or this side) reset.
fn code_for_reset(reason: Reason) -> Code {
    match reason {
        Reason::CANCEL => Code::CANCELLED,
        Reason::REFUSED_STREAM => Code::UNAVAILABLE,
        Reason::ENHANCE_YOUR_CALM => Code::RESOURCE_EXHAUSTED,
        Reason::INADEQUATE_SECURITY => Code::PERMISSION_DENIED,
        _ => Code::INTERNAL,
    }
}

/// An HTTP status's reason phrase, after a space, for the few a gRPC client meets.
fn http_reason(status: u16) -> &'static str {
    match status {
        400 => " Bad Request",
        401 => " Unauthorized",
        403 => " Forbidden",
        404 => " Not Found",
        405 => " Method Not Allowed",
        415 => " Unsupported Media Type",
        429 => " Too Many Requests",
        431 => " Request Header Fields Too Large",
        500 => " Internal Server Error",
        502 => " Bad Gateway",
        503 => " Service Unavailable",
        504 => " Gateway Timeout",
        _ => "",
    }
}

/// The algorithms of the core's `rpc-accept-encoding` metadata, in its order.
fn accepts_of(metadata: &Metadata) -> Vec<Algorithm> {
    headers::available_in(
        metadata
            .get_all(compress::ACCEPT_ENCODING)
            .filter_map(|v| v.as_str()),
    )
}

/// The status message of a response whose headers and trailers are over the limit.
const METADATA_TOO_LARGE: &str = "the response's headers and trailers exceed the metadata limit";

/// The call's RESPONSE, as the core takes it (unencoded).
fn push_response(ready: &mut ForCore, id: u64, mut ending: Ending, max_metadata: usize) {
    if !frame::metadata_fits(&ending.metadata, max_metadata) {
        ending = Ending::error(Code::RESOURCE_EXHAUSTED, METADATA_TOO_LARGE);
    }
    let payload = ending.payload.to_bytes();
    let response = frame::ResponseFrame {
        id,
        code: ending.code,
        message: ByteStr::from(ending.message),
        details: ending.details,
        metadata: ending.metadata,
        compressed: ending.compressed,
        payload,
    };
    ready.push_frame(Frame::Response(response));
}

impl Link for GrpcClientLink {
    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, Error>>> {
        self.poll_recv_frame(cx)
            .map(|received| received.map(|frame| frame.map(codec::encoded)))
    }

    fn poll_recv_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Received, Error>>> {
        if !self.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            self.waker = Some(cx.waker().clone());
        }
        if self.ready.is_empty() {
            self.drive(cx);
        }
        if let Some(frame) = self.ready.pop_front() {
            return Poll::Ready(Some(Ok(frame)));
        }
        if self.read_done || self.ended.is_some() {
            if self.reported_end {
                return Poll::Ready(None);
            }
            self.reported_end = true;
            return Poll::Ready(self.ended.take().map(Err));
        }
        Poll::Pending
    }

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        if let Some(err) = &self.ended {
            return Poll::Ready(Err(Error::new(err.kind(), err.message().to_owned())));
        }
        if self.conn.out().len() >= MAX_OUT {
            if let Err(err) = self.write(cx) {
                let error = Error::io(format!("gRPC connection to {}", self.target), err);
                return Poll::Ready(Err(error));
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
            Frame::Request(request) => self.on_request(request, payload),
            Frame::Data(data) => self.on_data(data, payload),
            Frame::Cancel { id } => self.on_cancel(id),
            Frame::Window { id, increment } => {
                if let Some(call) = self.calls.get_mut(&id) {
                    let was_blocked = call.credit <= 0;
                    call.credit = call.credit.saturating_add(i64::from(increment));
                    if was_blocked && call.credit > 0 && call.phase == Phase::Receiving {
                        self.touch(id);
                        if let Some(waker) = &self.waker {
                            waker.wake_by_ref();
                        }
                    }
                }
            }
            // A client's GOAWAY precedes its close; PONGs answer PINGs this link never
            // forwards; bulk transfer has no gRPC form.
            other => tracing::debug!(?other, "gRPC client link: frame not mapped"),
        }
        if self.ready.len() > had {
            // An answer the link made at once (a request it refused): the core's task
            // reads it.
            if let Some(waker) = &self.waker {
                waker.wake_by_ref();
            }
        }
        Ok(())
    }

    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        let had = self.ready.len();
        // Written by whichever task sends (a sequential call's caller, on an idle
        // connection): reading is left to the core's task, woken by the socket.
        self.open_queued();
        self.step_calls();
        self.credit_sent();
        if let Err(err) = self.write(cx) {
            if self.ended.is_none() {
                // (A peer of another protocol that closed may fail the write first.)
                let error = Error::io(format!("gRPC connection to {}", self.target), err);
                self.end(self.before_settings(error));
            }
            if let Some(waker) = &self.waker {
                waker.wake_by_ref();
            }
        }
        if self.ready.len() > had {
            if let Some(waker) = &self.waker {
                waker.wake_by_ref();
            }
        }
        Poll::Ready(Ok(()))
    }

    fn poll_close(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        // The calls are over for the core: their streams reset, the connection ended
        // with a GOAWAY, written as far as the socket takes it.
        let open: Vec<u32> = self
            .calls
            .values()
            .map(|c| c.h2_id)
            .filter(|&h| h != 0)
            .collect();
        for h2_id in open {
            self.conn.reset(h2_id, Reason::CANCEL);
        }
        self.calls.clear();
        self.by_stream.clear();
        self.to_open.clear();
        self.conn.go_away(Some(0), Reason::NO_ERROR, b"");
        if self.write(cx).is_ok() && (!self.conn.out().is_empty() || self.unflushed) {
            // The resets and the GOAWAY go first (the core bounds the wait).
            return Poll::Pending;
        }
        match Pin::new(&mut self.io).poll_shutdown(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(_) => Poll::Ready(Ok(())),
        }
    }

    fn peer(&self) -> String {
        self.target.clone()
    }

    fn poll_gone(&mut self, cx: &mut Context<'_>) -> Poll<Error> {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A RESPONSE the link builds reaches the core as the frame its bytes would decode
    /// to, with their length (what `poll_recv` hands out, and the counts use).
    #[test]
    fn responses_handed_over_unencoded_match_their_encoding() {
        let mut metadata = Metadata::new();
        metadata.insert("x-trailer", "t").unwrap();
        metadata.insert("x-bin", vec![0u8, 1, 2]).unwrap();
        let endings = [
            Ending {
                metadata,
                payload: MessageData::from_chunks(vec![
                    Bytes::from_static(b"ab"),
                    Bytes::from_static(b"cde"),
                ]),
                compressed: true,
                ..Ending::error(Code::OK, "")
            },
            Ending {
                details: Bytes::from_static(b"\x08\x01"),
                ..Ending::error(Code::NOT_FOUND, "no such key")
            },
        ];
        for (id, ending) in (1..).zip(endings) {
            let mut ready = ForCore::default();
            push_response(&mut ready, id, ending, usize::MAX);
            let held = ready.bytes;
            let Some(Received::Frame { frame, len }) = ready.pop_front() else {
                panic!("a RESPONSE is handed over as a frame");
            };
            let bytes = codec::encoded(Received::Frame {
                frame: frame.clone(),
                len,
            });
            let frame = *frame;
            assert_eq!(len, bytes.len());
            // The hold counts a decoded frame's metadata entries on top.
            let Frame::Response(response) = &frame else {
                panic!("not a RESPONSE: {frame:?}");
            };
            let entries = response.metadata.len();
            assert_eq!(held, len + entries * frame::METADATA_ENTRY_COST);
            assert_eq!(ready.bytes, 0);
            let limits = frame::DecodeLimits::default();
            assert_eq!(Frame::decode(bytes, &limits).unwrap(), frame);
        }
    }

    fn accept_header(value: &'static str) -> Vec<fields::Field> {
        vec![(
            Bytes::from_static(b"grpc-accept-encoding"),
            Bytes::from_static(value.as_bytes()),
        )]
    }

    fn told(accepts: &mut ServerAccepts, headers: &[fields::Field]) -> Option<String> {
        let mut metadata = Metadata::new();
        accepts.read(headers, &mut metadata);
        metadata
            .get(compress::ACCEPT_ENCODING)
            .and_then(|v| v.as_str())
            .map(str::to_owned)
    }

    #[test]
    fn the_servers_accept_list_reaches_the_core_on_every_response() {
        let available: Vec<_> = [Algorithm::Gzip, Algorithm::Zstd]
            .into_iter()
            .filter(|a| a.is_available())
            .collect();
        let Some(&first) = available.first() else {
            return; // nothing to accept in this build
        };
        let mut accepts = ServerAccepts::default();
        let one = accept_header(first.name());
        // Every response carries it (the last may have been lost with its call), the
        // same header parsed once.
        for _ in 0..3 {
            assert_eq!(told(&mut accepts, &one).as_deref(), Some(first.name()));
            assert_eq!(accepts.list, [first]);
        }
        // Silence changes nothing, here as in the core.
        assert_eq!(told(&mut accepts, &[]), None);
        assert_eq!(accepts.list, [first]);
        let none = accept_header("identity");
        assert_eq!(told(&mut accepts, &none), None);
        assert_eq!(told(&mut accepts, &none), None, "an empty list, remembered");
        assert_eq!(accepts.list, [first]);
        let mut two = one.clone();
        two.extend(accept_header("identity"));
        assert_eq!(told(&mut accepts, &two).as_deref(), Some(first.name()));
        assert_eq!(told(&mut accepts, &two).as_deref(), Some(first.name()));
    }

    #[test]
    fn methods_that_make_no_valid_path_are_refused() {
        assert!(valid_path("pkg.S/A"));
        assert!(!valid_path("pkg S/bad"));
        assert!(!valid_path("pkg.S/\u{e9}"));
        assert!(!valid_path(""));
    }
}

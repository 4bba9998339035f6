//! The client side: [`GrpcConnector`] opens an h2c connection, and
//! [`GrpcClientLink`] turns the core's REQUEST, DATA and CANCEL frames into HTTP/2
//! requests, and the responses back into the core's DATA and RESPONSE frames.
//!
//! A unary REQUEST becomes a request with one message and END_STREAM; its response
//! (headers, one message, trailers) becomes one RESPONSE whose metadata is the
//! headers followed by the trailers. A streaming REQUEST opens the request; each
//! DATA message follows, and the half-close is END_STREAM; the response headers
//! become a DATA frame with metadata, each message a DATA frame, the trailers the
//! closing RESPONSE.

use std::{
    collections::{HashMap, VecDeque},
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, Waker},
};

use bytes::{Bytes, BytesMut};
use h2::client::{ResponseFuture, SendRequest};
use http::{HeaderValue, Method};
use rpc_core::{
    compress::{self, Algorithm},
    frame::{self, Frame, GoAwayCode},
    link::{Connector, Link, LinkConfig, Received},
    status::quoted,
    ByteStr, Code, Error, ErrorKind, Metadata, MetadataValue, Payload,
};

use crate::{
    codec::{self, ForCore, MessageData},
    config::GrpcConfig,
    driver::Driver,
    flow::{self, InError, InEvent, Inbound, Outbound, Unfinished},
    headers,
    meter::{Meter, Metered},
    ready::{Readiness, StreamWaker},
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
    async fn open(&self) -> Result<crate::driver::Io, Error> {
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
        let meter = Arc::new(Meter::default());
        let io: crate::driver::Io = Box::new(Metered::client(
            self.open().await?,
            meter.clone(),
            self.config.handshake_timeout,
        ));
        let handshake = self.config.client_builder().handshake::<_, Bytes>(io);
        let (send_request, connection) =
            match tokio::time::timeout(self.config.handshake_timeout, handshake).await {
                Ok(Ok(pair)) => pair,
                Ok(Err(err)) => {
                    return Err(Error::new(
                        ErrorKind::Protocol,
                        format!("HTTP/2 handshake with {}: {err}", self.address),
                    ))
                }
                Err(_) => {
                    return Err(Error::new(
                        ErrorKind::TimedOut,
                        format!("HTTP/2 handshake with {} timed out", self.address),
                    ))
                }
            };
        let max_message = self.config.message_limit(config.max_frame_len);
        let calm_downs = self.calm_downs.load(std::sync::atomic::Ordering::Relaxed);
        let keepalive =
            self.config
                .keepalive_interval
                .map(|interval| crate::driver::ClientKeepalive {
                    interval: interval.saturating_mul(1 << calm_downs.min(MAX_CALM_DOWNS)),
                    timeout: self.config.keepalive_timeout,
                    calls: Arc::default(),
                    calm_downs: self.calm_downs.clone(),
                    meter: meter.clone(),
                });
        Ok(GrpcClientLink {
            send_request: Some(send_request),
            calls: keepalive.as_ref().map(|k| k.calls.clone()),
            driver: Driver::spawn(crate::driver::client(connection, keepalive)),
            streams: HashMap::new(),
            readiness: Readiness::default(),
            sending: Vec::new(),
            gone: Vec::new(),
            to_open: VecDeque::new(),
            ready: ForCore::default(),
            waker: None,
            max_message,
            unfinished: Unfinished::for_connection(max_message),
            meter,
            max_metadata: config.max_metadata_len,
            authority: self
                .config
                .authority
                .clone()
                .unwrap_or_else(|| self.address.authority()),
            scheme: if self.address.secure { "https" } else { "http" },
            target: self.address.to_string(),
            highest_opened: 0,
            goaway_sent: None,
            encodings: Encodings::default(),
            uris: UriCache::default(),
        })
    }

    fn target(&self) -> String {
        self.address.to_string()
    }
}

enum Phase {
    /// Waiting for h2 to take a new stream.
    Queued(http::Request<()>),
    /// Sent; waiting for the response headers.
    Waiting(ResponseFuture),
    /// Reading the response's messages and trailers.
    Receiving(Inbound),
}

/// One call as the client link tracks it.
struct ClientStream {
    /// What h2 wakes when the call has news; the link marks it when it queues work.
    waker: StreamWaker,
    phase: Phase,
    out: Outbound,
    /// A unary call: its answer is one RESPONSE.
    unary: bool,
    /// Credit the core granted before the response arrived.
    credit: i64,
    /// A unary call's response headers and message, kept for the RESPONSE.
    headers: Metadata,
    message: Option<MessageData>,
    /// Whether that message is compressed.
    message_compressed: bool,
    /// The request's `grpc-encoding`: what the core may compress its messages with.
    request_encoding: Option<Algorithm>,
    /// The response's `grpc-encoding`.
    response_encoding: Option<Algorithm>,
    /// A `grpc-encoding` of the response that this build cannot decompress: an error
    /// only if a compressed message comes (a server may name one and send its
    /// messages uncompressed; grpc-go reads those too).
    unknown_encoding: Option<String>,
    /// Its HTTP/2 stream id, once opened (0 before).
    h2_id: u32,
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
    ours_header: Option<HeaderValue>,
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
    last: Option<(HeaderValue, Option<MetadataValue>)>,
}

impl ServerAccepts {
    /// Reads a response's `grpc-accept-encoding` into `metadata` as the core's
    /// `rpc-accept-encoding` (on every response: the response may not reach the core,
    /// a cancelled call's for one). The same header as the last one is not parsed
    /// again.
    fn read(&mut self, headers: &http::HeaderMap, metadata: &mut Metadata) {
        let mut values = headers.get_all(headers::name::GRPC_ACCEPT_ENCODING).iter();
        let (first, more) = (values.next(), values.next().is_some());
        if let (false, Some(first), Some((header, listed))) = (more, first, &self.last) {
            if first == header {
                if let Some(listed) = listed {
                    let _ = metadata.append(compress::ACCEPT_ENCODING, listed.clone());
                }
                return;
            }
        }
        let accepts = headers::accepted(headers);
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

/// Parsed request URIs of the last methods called, so that a call to one of them
/// clones its URI instead of formatting and parsing it.
#[derive(Default)]
struct UriCache {
    /// Each method's own copy (a method decoded from a frame may be a slice of a
    /// larger buffer, which the cache must not keep alive).
    entries: Vec<(Box<str>, http::Uri)>,
    /// The entry replaced next once the cache is full.
    next: usize,
}

impl UriCache {
    /// Methods remembered.
    const CAPACITY: usize = 16;

    /// The URI of `method` on `scheme://authority`, which are the same for every call
    /// of one link.
    fn get(&mut self, scheme: &str, authority: &str, method: &str) -> Option<http::Uri> {
        if let Some((_, uri)) = self.entries.iter().find(|(m, _)| &**m == method) {
            return Some(uri.clone());
        }
        let uri = format!("{scheme}://{authority}/{method}")
            .parse::<http::Uri>()
            .ok()?;
        if self.entries.len() < Self::CAPACITY {
            self.entries.push((method.into(), uri.clone()));
        } else {
            self.entries[self.next] = (method.into(), uri.clone());
            self.next = (self.next + 1) % Self::CAPACITY;
        }
        Some(uri)
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
    send_request: Option<SendRequest<Bytes>>,
    driver: Driver,
    /// Calls in flight, published on every poll for the keepalive (if on), which
    /// PINGs only while there are some.
    calls: Option<Arc<std::sync::atomic::AtomicUsize>>,
    streams: HashMap<u64, ClientStream>,
    /// Which of `streams` to poll next (see the `ready` module).
    readiness: Readiness,
    /// Streams waiting for h2's send capacity: polled every round.
    sending: Vec<u64>,
    /// Calls a round found finished, kept between rounds for its allocation.
    gone: Vec<u64>,
    to_open: VecDeque<u64>,
    /// Frames for the core.
    ready: ForCore,
    waker: Option<Waker>,
    max_message: usize,
    /// What the streams hold of unfinished responses, together.
    unfinished: Arc<Unfinished>,
    /// What h2 has written of each stream's DATA (see `crate::meter`).
    meter: Arc<Meter>,
    /// The core's metadata limit: responses whose metadata exceed it fail
    /// `RESOURCE_EXHAUSTED` here rather than as a frame the core refuses.
    max_metadata: usize,
    authority: String,
    /// `http`, or `https` over TLS: the requests' `:scheme`.
    scheme: &'static str,
    target: String,
    /// The highest call id opened as an HTTP/2 stream.
    highest_opened: u64,
    /// The `last_id` of the GOAWAY the link gave the core, once it gave one: calls
    /// above it were not processed. A later GOAWAY of the server's (HTTP/2's two-phase
    /// shutdown) may refuse streams at or below it, and the link gives a lower one.
    goaway_sent: Option<u64>,
    encodings: Encodings,
    uris: UriCache,
}

impl GrpcClientLink {
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
        let Some(uri) = self.uris.get(self.scheme, &self.authority, &request.method) else {
            let message = format!(
                "{}://{}/{} is not a valid URI",
                self.scheme, self.authority, request.method
            );
            self.answer_now(id, Ending::error(Code::INTERNAL, message));
            return;
        };
        let ours = accepts_of(&request.metadata);
        if !ours.is_empty() && ours != self.encodings.ours {
            let list = headers::accept_list(&ours) + ",identity";
            self.encodings.ours_header = HeaderValue::try_from(list).ok();
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
        let mut http_request = http::Request::new(());
        *http_request.method_mut() = Method::POST;
        *http_request.uri_mut() = uri;
        *http_request.version_mut() = http::Version::HTTP_2;
        let h = http_request.headers_mut();
        h.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static(headers::CONTENT_TYPE),
        );
        h.insert(http::header::TE, HeaderValue::from_static("trailers"));
        h.insert(
            http::header::USER_AGENT,
            HeaderValue::from_static(USER_AGENT),
        );
        if let Some(timeout) = request.timeout {
            if let Ok(value) = HeaderValue::try_from(codec::format_timeout(timeout)) {
                h.insert(headers::name::GRPC_TIMEOUT, value);
            }
        }
        if let Some(key) = &request.call_key {
            h.insert(headers::name::CALL_KEY, headers::call_key_value(key));
            if key.attempt > 1 {
                // gRFC A6: what other gRPC servers read of a retry.
                h.insert(
                    headers::PREVIOUS_ATTEMPTS,
                    HeaderValue::from(key.attempt - 1),
                );
            }
        }
        if let Err(message) = headers::write_metadata(&request.metadata, h) {
            self.answer_now(id, Ending::error(Code::INTERNAL, message));
            return;
        }
        // An application's `user-agent` (metadata forwarded from an incoming call, say)
        // goes in front of ours, in the one header, as grpc-go's does: not a second one.
        if h.get_all(http::header::USER_AGENT).iter().nth(1).is_some() {
            let theirs: Vec<&[u8]> = h
                .get_all(http::header::USER_AGENT)
                .iter()
                .skip(1)
                .map(HeaderValue::as_bytes)
                .collect();
            let mut joined = theirs.join(&b" "[..]);
            joined.push(b' ');
            joined.extend_from_slice(USER_AGENT.as_bytes());
            if let Ok(value) = HeaderValue::from_bytes(&joined) {
                h.insert(http::header::USER_AGENT, value);
            }
        }
        if let Some(value) = &self.encodings.ours_header {
            h.insert(headers::name::GRPC_ACCEPT_ENCODING, value.clone());
        }
        if let Some(algorithm) = request_encoding {
            h.insert(
                headers::name::GRPC_ENCODING,
                HeaderValue::from_static(algorithm.name()),
            );
        }
        let mut out = Outbound::new(None, self.meter.clone());
        let unary = !request.streaming;
        if unary {
            let chunks = codec::encode_message(&payload, compressed);
            out.push_message(chunks, 0);
            out.push_end_stream();
        }
        self.streams.insert(
            id,
            ClientStream {
                waker: self.readiness.waker(id),
                phase: Phase::Queued(http_request),
                out,
                unary,
                credit: i64::from(frame::INITIAL_STREAM_WINDOW),
                headers: Metadata::new(),
                message: None,
                message_compressed: false,
                request_encoding,
                response_encoding: None,
                unknown_encoding: None,
                h2_id: 0,
            },
        );
        self.to_open.push_back(id);
    }

    fn on_data(&mut self, data: frame::DataFrame, payload: Payload) {
        let Some(stream) = self.streams.get_mut(&data.id) else {
            return;
        };
        if data.message.is_some() {
            // Credit comes back for the message as the core sent it (docs/wire.md §6.10).
            let credit = flow::message_cost(payload.len());
            let (payload, compressed) = if data.compressed {
                match headers::fit_encoding(stream.request_encoding, payload, self.max_message) {
                    Ok(fit) => fit,
                    Err(status) => {
                        stream.out.reset(h2::Reason::CANCEL);
                        self.streams.remove(&data.id);
                        let ending = Ending::error(Code::INTERNAL, status.message());
                        push_response(&mut self.ready, data.id, ending, self.max_metadata);
                        return;
                    }
                }
            } else {
                (payload, false)
            };
            let chunks = codec::encode_message(&payload, compressed);
            stream.out.push_message(chunks, credit);
        }
        if data.end_stream {
            stream.out.push_end_stream();
        }
        stream.waker.mark();
    }

    fn on_cancel(&mut self, id: u64) {
        if let Some(mut stream) = self.streams.remove(&id) {
            stream.out.reset(h2::Reason::CANCEL);
        }
    }

    /// Opens queued calls while h2 takes new streams.
    fn open_queued(&mut self, cx: &mut Context<'_>) {
        let Some(send_request) = &mut self.send_request else {
            return;
        };
        while let Some(&id) = self.to_open.front() {
            let Some(stream) = self.streams.get_mut(&id) else {
                self.to_open.pop_front();
                continue;
            };
            match send_request.poll_ready(cx) {
                Poll::Pending => return,
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(err)) => {
                    self.refused(&err);
                    return;
                }
            }
            self.to_open.pop_front();
            let Phase::Queued(request) = &mut stream.phase else {
                continue;
            };
            let request = std::mem::replace(request, http::Request::new(()));
            match send_request.send_request(request, false) {
                Ok((response, send)) => {
                    stream.out.open(send);
                    // A unary request goes to h2 now, right behind its headers: h2's
                    // connection task, on another thread, could otherwise write the
                    // headers alone, and the server would see the call before its
                    // message and take the stream path (docs/grpc.md). What this
                    // misses (no capacity, an error) the stream's next poll, marked
                    // below, sees again.
                    let _ = stream.out.poll_send(cx);
                    stream.h2_id = u32::from(response.stream_id());
                    stream.phase = Phase::Waiting(response);
                    stream.waker.mark();
                    self.highest_opened = self.highest_opened.max(id);
                }
                Err(err) => {
                    self.to_open.push_front(id);
                    self.refused(&err);
                    return;
                }
            }
        }
    }

    /// h2 takes no new streams (GOAWAY, or the connection failed): tells the core,
    /// whose calls not yet opened were never sent and are safe to retry.
    fn refused(&mut self, err: &h2::Error) {
        if self.goaway_sent.is_some() {
            return;
        }
        self.goaway_sent = Some(self.highest_opened);
        // The server's GOAWAY, whatever its code: the calls opened run on (RFC 9113
        // §6.8: they may still complete), so the core is told NO_ERROR, which fails
        // only the calls not opened. Another failure ends the connection.
        let code = if err.is_go_away() && err.is_remote() {
            GoAwayCode::NO_ERROR
        } else {
            GoAwayCode::INTERNAL_ERROR
        };
        let mut buf = BytesMut::new();
        frame::encode_goaway(
            &mut buf,
            self.highest_opened,
            code,
            &format!(
                "the gRPC server takes no new calls: {err}{}",
                not_http2_hint(err)
            ),
        );
        self.ready.push_front(buf.freeze());
        self.send_request = None;
    }

    /// Opens queued calls and polls the calls h2 woke or the link marked.
    fn poll_streams(&mut self, cx: &mut Context<'_>) {
        self.readiness.register(cx);
        self.open_queued(cx);
        let mut gone = std::mem::take(&mut self.gone);
        let mut refused = Vec::new();
        let woken = self.readiness.take_with(&mut self.sending);
        for &id in &woken {
            let Some(stream) = self.streams.get_mut(&id) else {
                continue;
            };
            let waker = stream.waker.for_poll();
            let mut cx = Context::from_waker(&waker);
            let server = &mut self.encodings.server;
            match poll_stream(
                id,
                stream,
                (self.max_message, self.max_metadata, &self.unfinished),
                server,
                &mut self.ready,
                &self.target,
                &mut cx,
            ) {
                StreamState::Going if stream.out.is_sending() => self.sending.push(id),
                StreamState::Going => {}
                StreamState::Done => gone.push(id),
                StreamState::Refused => {
                    refused.push((id, stream.h2_id));
                    gone.push(id);
                }
            }
        }
        self.readiness.put_back(woken);
        for id in gone.drain(..) {
            self.streams.remove(&id);
        }
        self.gone = gone;
        if !refused.is_empty() {
            self.refuse(&refused);
        }
    }

    /// The server's GOAWAY left out these calls' streams (by core id and HTTP/2 stream
    /// id): they were not processed, and a GOAWAY to the core says so. HTTP/2 refuses
    /// every stream above a GOAWAY's last stream id, so an opened call above the first
    /// refused one, by core id, whose HTTP/2 stream is above the lowest refused one is
    /// refused too (h2 may not have woken it yet). One whose HTTP/2 stream is below
    /// would survive (the link opens calls in id order, so there is none); the core
    /// would count it unprocessed wrongly, so then the refused calls fail plainly.
    fn refuse(&mut self, refused: &[(u64, u32)]) {
        let (Some(&first), Some(&lowest)) = (
            refused.iter().map(|(id, _)| id).min(),
            refused.iter().map(|(_, h2)| h2).min(),
        ) else {
            return;
        };
        let last = first - 1;
        if self.goaway_sent.is_some_and(|sent| sent <= last) {
            // The core already knows: the calls above its last id were not processed.
            return;
        }
        let survivor = self.streams.iter().any(|(&id, stream)| {
            id > last && !matches!(stream.phase, Phase::Queued(_)) && stream.h2_id < lowest
        });
        if survivor {
            for &(id, _) in refused {
                push_response(
                    &mut self.ready,
                    id,
                    Ending::error(
                        Code::UNAVAILABLE,
                        "the gRPC server is going away: it refused the call's stream",
                    ),
                    self.max_metadata,
                );
            }
            return;
        }
        self.goaway_sent = Some(last);
        let mut buf = BytesMut::new();
        frame::encode_goaway(
            &mut buf,
            last,
            GoAwayCode::NO_ERROR,
            "the gRPC server is going away",
        );
        self.ready.push_front(buf.freeze());
        self.send_request = None;
    }
}

enum StreamState {
    Going,
    Done,
    /// Failed by a GOAWAY that did not cover it: never processed.
    Refused,
}

fn poll_stream(
    id: u64,
    stream: &mut ClientStream,
    (max_message, max_metadata, unfinished): (usize, usize, &Arc<Unfinished>),
    server_accepts: &mut ServerAccepts,
    ready: &mut ForCore,
    target: &str,
    cx: &mut Context<'_>,
) -> StreamState {
    if let Poll::Ready(Err(_)) = stream.out.poll_send(cx) {
        // The server reset the stream or stopped reading it; the receiving side tells
        // how the call ended.
        stream.out.reset_quietly();
    }
    let owed = stream.out.take_owed();
    if owed > 0 {
        let mut buf = BytesMut::with_capacity(frame::HEADER_LEN + 4);
        frame::encode_window(&mut buf, id, owed);
        ready.push_back(buf.freeze());
    }
    loop {
        match &mut stream.phase {
            Phase::Queued(_) => return StreamState::Going,
            Phase::Waiting(response) => match Pin::new(response).poll(cx) {
                Poll::Pending => return StreamState::Going,
                Poll::Ready(Err(err)) => {
                    return fail(id, stream, &err, ready, max_metadata, target)
                }
                Poll::Ready(Ok(response)) => {
                    let head = on_head(
                        id,
                        stream,
                        response,
                        (max_message, max_metadata, unfinished),
                        server_accepts,
                        ready,
                    );
                    if let Some(ending) = head {
                        stream.out.reset(h2::Reason::CANCEL);
                        push_response(ready, id, ending, max_metadata);
                        return StreamState::Done;
                    }
                }
            },
            Phase::Receiving(inbound) => match inbound.poll_event(cx) {
                Poll::Pending => return StreamState::Going,
                Poll::Ready(Ok(InEvent::Message(message))) => {
                    let refused = match (message.compressed, stream.response_encoding) {
                        (false, _) => None,
                        (true, None) => Some(match &stream.unknown_encoding {
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
                        let ending = Ending::error(Code::INTERNAL, why);
                        stream.out.reset(h2::Reason::CANCEL);
                        push_response(ready, id, ending, max_metadata);
                        return StreamState::Done;
                    }
                    if !stream.unary {
                        let flags = if message.compressed {
                            frame::FLAG_COMPRESSED
                        } else {
                            0
                        };
                        let mut buf =
                            BytesMut::with_capacity(frame::HEADER_LEN + message.data.len());
                        frame::encode_data_header(&mut buf, id, flags, None);
                        message.data.copy_to(&mut buf);
                        ready.push_back(buf.freeze());
                    } else if stream.message.is_some() {
                        // A cardinality violation: UNIMPLEMENTED, as gRPC's status
                        // code table has it.
                        let ending = Ending::error(
                            Code::UNIMPLEMENTED,
                            "the server sent several messages for a unary call",
                        );
                        stream.out.reset(h2::Reason::CANCEL);
                        push_response(ready, id, ending, max_metadata);
                        return StreamState::Done;
                    } else {
                        stream.message_compressed = message.compressed;
                        stream.message = Some(message.data);
                    }
                }
                Poll::Ready(Ok(InEvent::End(trailers))) => {
                    // No trailers at all (the last DATA frame ended the stream):
                    // `INTERNAL`, as grpc-go reports it; trailers without a
                    // `grpc-status` are `UNKNOWN` (`read_status`).
                    let status = trailers
                        .as_ref()
                        .map(headers::read_status)
                        .unwrap_or_else(|| headers::TrailerStatus {
                            code: Code::INTERNAL,
                            message: "the server closed the stream without sending trailers"
                                .to_owned(),
                            details: Bytes::new(),
                        });
                    let mut metadata = std::mem::take(&mut stream.headers);
                    let malformed = trailers.as_ref().and_then(|trailers| {
                        headers::read_metadata(trailers, &mut metadata, max_metadata).err()
                    });
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
                    if stream.unary && ending.code == Code::OK {
                        match stream.message.take() {
                            Some(message) => {
                                ending.payload = message;
                                ending.compressed = stream.message_compressed;
                            }
                            None => {
                                ending = Ending::error(
                                    Code::UNIMPLEMENTED,
                                    "the server sent no message for a unary call",
                                )
                            }
                        }
                    }
                    push_response(ready, id, ending, max_metadata);
                    return StreamState::Done;
                }
                Poll::Ready(Err(InError::Message(err))) => {
                    stream.out.reset(h2::Reason::CANCEL);
                    let ending = Ending::error(err.code(), err.to_string());
                    push_response(ready, id, ending, max_metadata);
                    return StreamState::Done;
                }
                Poll::Ready(Err(InError::H2(err))) => {
                    return fail(id, stream, &err, ready, max_metadata, target)
                }
            },
        }
    }
}

/// Handles the response head; `Some` ends the call at once.
fn on_head(
    id: u64,
    stream: &mut ClientStream,
    response: http::Response<h2::RecvStream>,
    (max_message, max_metadata, unfinished): (usize, usize, &Arc<Unfinished>),
    server_accepts: &mut ServerAccepts,
    ready: &mut ForCore,
) -> Option<Ending> {
    let (parts, body) = response.into_parts();
    if parts.status != http::StatusCode::OK {
        // gRPC's status mapping: an HTTP status stands for the call's only when the
        // response has no grpc-status (a proxy's 429 with grpc-status 8 is
        // RESOURCE_EXHAUSTED, not UNAVAILABLE).
        // (An OK there answers nothing: the HTTP status stands.)
        let status = headers::read_status(&parts.headers);
        if parts.headers.contains_key(headers::name::GRPC_STATUS) && status.code != Code::OK {
            let mut ending = Ending::error(status.code, status.message);
            ending.details = status.details;
            return Some(ending);
        }
        return Some(Ending::error(
            codec::code_for_http_status(parts.status.as_u16()),
            format!("the server answered with HTTP status {}", parts.status),
        ));
    }
    let content_type = parts
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    // `application/grpc`, alone or with `+codec` or `;parameters`: not
    // `application/grpc-web` or another type that merely starts the same.
    if headers::grpc_codec(&parts.headers).is_none() {
        return Some(Ending::error(
            Code::UNKNOWN,
            format!(
                "the server answered with content-type {:?}, not gRPC",
                quoted(content_type)
            ),
        ));
    }
    let mut metadata = Metadata::new();
    match headers::read_metadata(&parts.headers, &mut metadata, max_metadata) {
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
    server_accepts.read(&parts.headers, &mut metadata);
    if body.is_end_stream() {
        // Trailers-only. (A `grpc-status` in headers that do not end the stream is no
        // status: the trailers that end it are.)
        let status = headers::read_status(&parts.headers);
        if stream.unary && status.code == Code::OK {
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
    match headers::encoding(&parts.headers) {
        Ok(encoding) => stream.response_encoding = encoding,
        // Failed only if a compressed message comes (`poll_stream`).
        Err(name) => stream.unknown_encoding = Some(name),
    }
    let credit = if stream.unary {
        i64::MAX
    } else {
        if over_metadata_limit(&metadata, max_metadata) {
            return Some(Ending::error(
                Code::RESOURCE_EXHAUSTED,
                "the response's headers exceed the metadata limit",
            ));
        }
        let mut buf = BytesMut::new();
        frame::encode_data_header(&mut buf, id, frame::FLAG_NO_MESSAGE, Some(&metadata));
        ready.push_back(buf.freeze());
        stream.credit
    };
    if stream.unary {
        stream.headers = metadata;
    }
    stream.phase = Phase::Receiving(Inbound::new(body, max_message, credit, unfinished.clone()));
    None
}

/// The algorithms of the core's `rpc-accept-encoding` metadata, in its order.
fn accepts_of(metadata: &Metadata) -> Vec<Algorithm> {
    headers::available_in(
        metadata
            .get_all(compress::ACCEPT_ENCODING)
            .filter_map(|v| v.as_str()),
    )
}

/// Ends a call whose stream failed.
fn fail(
    id: u64,
    stream: &mut ClientStream,
    err: &h2::Error,
    ready: &mut ForCore,
    max_metadata: usize,
    target: &str,
) -> StreamState {
    stream.out.reset_quietly();
    // Only before the response began: a server that answered processed the call,
    // whatever it says of the stream afterwards.
    let unanswered = matches!(stream.phase, Phase::Queued(_) | Phase::Waiting(_));
    // A stream above the last id of the server's GOAWAY: not processed.
    if err.is_go_away() && err.is_remote() && unanswered {
        return StreamState::Refused;
    }
    // RFC 9113 §8.7: a stream refused before any processing; a retry is safe.
    if unanswered
        && err.is_reset()
        && err.is_remote()
        && err.reason() == Some(h2::Reason::REFUSED_STREAM)
    {
        ready.push_refused(
            id,
            format!("the gRPC server {target} refused the call's stream (REFUSED_STREAM): not processed"),
        );
        return StreamState::Done;
    }
    let code = match err.reason() {
        Some(reason) if err.is_reset() => codec::code_for_reset(reason),
        _ => Code::UNAVAILABLE,
    };
    let message = if err.is_reset() && err.is_library() {
        // h2 reset the stream itself: what the server sent on it broke HTTP/2's rules
        // for a response, or this side's limits (a header block over the header list
        // size, which h2 reports as a PROTOCOL_ERROR of its own). The server did speak
        // HTTP/2: no hint about the port.
        format!(
            "gRPC stream to {target} failed: this client reset it ({err}): the response \
             broke HTTP/2's rules or this client's limits, such as a header block over \
             GrpcConfig::max_header_list_size"
        )
    } else {
        format!(
            "gRPC stream to {target} failed: {err}{}",
            not_http2_hint(err)
        )
    };
    push_response(ready, id, Ending::error(code, message), max_metadata);
    StreamState::Done
}

/// A hint after an error h2 found in the server's bytes, which is what a peer that
/// does not speak HTTP/2 at all produces (`grpc://` at a port of our own wire or a TLS
/// one); empty for other errors. The error reaches a call either as its stream's or as
/// the connection's, whichever h2 reports first.
fn not_http2_hint(err: &h2::Error) -> &'static str {
    let protocol = matches!(
        err.reason(),
        Some(h2::Reason::PROTOCOL_ERROR | h2::Reason::FRAME_SIZE_ERROR)
    );
    // A stream's own error is a peer that speaks HTTP/2: not this.
    if err.is_library() && protocol && !err.is_reset() {
        " (the server broke HTTP/2, or its bytes are not HTTP/2 at all: is it a port of \
         the framework's own wire, tcp://, or a TLS one, grpcs://?)"
    } else {
        ""
    }
}

/// Whether `metadata` would not fit a frame's metadata block at the core's limits
/// (`max_metadata`, and its entries): the core would refuse the frame and lose the
/// connection.
fn over_metadata_limit(metadata: &Metadata, max_metadata: usize) -> bool {
    !frame::metadata_fits(metadata, max_metadata)
}

/// The status message of a response whose headers and trailers are over the limit.
const METADATA_TOO_LARGE: &str = "the response's headers and trailers exceed the metadata limit";

/// The call's RESPONSE, as the core takes it (unencoded).
fn push_response(ready: &mut ForCore, id: u64, mut ending: Ending, max_metadata: usize) {
    if over_metadata_limit(&ending.metadata, max_metadata) {
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

impl GrpcClientLink {
    /// Tells the keepalive how many calls are in flight (it PINGs only while some are).
    fn publish_calls(&self) {
        if let Some(calls) = &self.calls {
            calls.store(
                self.streams.len() + self.to_open.len(),
                std::sync::atomic::Ordering::Relaxed,
            );
        }
    }
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
            self.poll_streams(cx);
        }
        self.publish_calls();
        if let Some(frame) = self.ready.pop_front() {
            return Poll::Ready(Some(Ok(frame)));
        }
        match std::task::ready!(self.driver.poll_finished(cx)) {
            Ok(()) => Poll::Ready(None),
            Err(err) => Poll::Ready(Some(Err(Error::new(
                ErrorKind::Closed,
                format!("gRPC connection to {}: {err}", self.target),
            )))),
        }
    }

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        if let Poll::Ready(Err(err)) = self.driver.poll_finished(cx) {
            return Poll::Ready(Err(Error::new(
                ErrorKind::Closed,
                format!("gRPC connection to {}: {err}", self.target),
            )));
        }
        Poll::Ready(Ok(()))
    }

    fn start_send(&mut self, header: &[u8], payload: Payload) -> Result<(), Error> {
        let frame = codec::core_frame(header)?;
        match frame {
            Frame::Request(request) => self.on_request(request, payload),
            Frame::Data(data) => self.on_data(data, payload),
            Frame::Cancel { id } => self.on_cancel(id),
            Frame::Window { id, increment } => {
                if let Some(stream) = self.streams.get_mut(&id) {
                    let unblocked = match &mut stream.phase {
                        Phase::Receiving(inbound) => inbound.grant(increment),
                        _ => {
                            stream.credit = stream.credit.saturating_add(i64::from(increment));
                            false
                        }
                    };
                    if unblocked {
                        stream.waker.mark();
                        if let Some(waker) = &self.waker {
                            waker.wake_by_ref();
                        }
                    }
                }
            }
            // A client's GOAWAY precedes its close, which says the same to h2; PONGs
            // answer PINGs this link never forwards; bulk transfer has no gRPC form.
            other => tracing::debug!(?other, "gRPC client link: frame not mapped"),
        }
        Ok(())
    }

    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        let had = self.ready.len();
        self.poll_streams(cx);
        // A call sent from its caller's task on an idle connection (the core's inline
        // send) reaches the link here, not through a poll of the driver task.
        self.publish_calls();
        if self.ready.len() > had {
            cx.waker().wake_by_ref();
        }
        Poll::Ready(Ok(()))
    }

    fn poll_close(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        // Dropping every handle ends the HTTP/2 connection: open streams are reset
        // (the calls are over for the core) and the driver closes the socket.
        self.streams.clear();
        self.to_open.clear();
        self.send_request = None;
        Poll::Ready(Ok(()))
    }

    fn peer(&self) -> String {
        self.target.clone()
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

    fn accept_header(value: &'static str) -> http::HeaderMap {
        let mut headers = http::HeaderMap::new();
        headers.insert(
            headers::name::GRPC_ACCEPT_ENCODING,
            HeaderValue::from_static(value),
        );
        headers
    }

    fn told(accepts: &mut ServerAccepts, headers: &http::HeaderMap) -> Option<String> {
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
        assert_eq!(told(&mut accepts, &http::HeaderMap::new()), None);
        assert_eq!(accepts.list, [first]);
        let none = accept_header("identity");
        assert_eq!(told(&mut accepts, &none), None);
        assert_eq!(told(&mut accepts, &none), None, "an empty list, remembered");
        assert_eq!(accepts.list, [first]);
        let mut two = one.clone();
        two.append(
            headers::name::GRPC_ACCEPT_ENCODING,
            HeaderValue::from_static("identity"),
        );
        assert_eq!(told(&mut accepts, &two).as_deref(), Some(first.name()));
        assert_eq!(told(&mut accepts, &two).as_deref(), Some(first.name()));
    }

    #[test]
    fn request_uris_are_remembered_per_method() {
        let mut uris = UriCache::default();
        let a = uris.get("http", "h:1", "pkg.S/A").expect("valid");
        assert_eq!(a.to_string(), "http://h:1/pkg.S/A");
        assert_eq!(uris.get("http", "h:1", "pkg.S/A"), Some(a));
        for i in 0..2 * UriCache::CAPACITY {
            let method = format!("pkg.S/M{i}");
            let uri = uris.get("http", "h:1", &method).expect("valid");
            assert_eq!(uri.path(), format!("/{method}"));
        }
        assert_eq!(uris.entries.len(), UriCache::CAPACITY, "bounded");
        assert_eq!(uris.get("http", "h:1", "pkg S/bad"), None);
    }
}

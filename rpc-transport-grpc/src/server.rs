//! The server side: [`GrpcListener`] accepts h2c connections, and each
//! [`GrpcServerLink`] turns the HTTP/2 streams of one connection into the core's
//! frames and the core's answers back into HTTP/2.
//!
//! Every incoming gRPC call becomes a *streaming* REQUEST (`FLAG_STREAMING`, its
//! messages in DATA frames): gRPC's wire does not say whether a method is unary, so
//! the link cannot know, and the core's generated servers take a unary method's one
//! message from a stream (`rpc_core::codegen::unary_request`). `docs/grpc.md` has the
//! whole mapping.

use std::{
    collections::HashMap,
    future::Future,
    net::SocketAddr,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, Waker},
    time::{Duration, Instant},
};

use bytes::{Bytes, BytesMut};
use h2::server::SendResponse;
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use rpc_core::{
    compress::Algorithm,
    frame::{self, Frame, GoAwayCode},
    link::{Link, LinkConfig, Listener, Received, UnaryMethods},
    status::quoted,
    ByteStr, Code, Error, ErrorKind, Metadata, Payload, Peer,
};
use tokio::sync::mpsc;

use crate::{
    codec::{self, ForCore, Message},
    config::GrpcConfig,
    driver::{self, Accepted, Command, Control, Driver},
    flood::ControlFrames,
    flow::{self, InError, InEvent, Inbound, Outbound, Unfinished, UNFINISHED_MESSAGES},
    headers,
    meter::{Meter, Metered},
    ready::{Readiness, StreamWaker},
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
        let (io, peer): (driver::Io, Peer) = match &mut self.accepting {
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

/// One call as the server link tracks it.
struct ServerStream {
    /// What h2 wakes when the call has news; the link marks it when it queues work.
    waker: StreamWaker,
    /// The request's messages, until the client half-closes.
    inbound: Option<Inbound>,
    /// Until the response headers are sent.
    respond: Option<SendResponse<Bytes>>,
    out: Outbound,
    /// The core's side is over (it sent RESPONSE, or was told CANCEL): the link only
    /// finishes sending what is queued.
    answered: bool,
    /// Handed to the core as a unary call: its OK answer is one message, even empty.
    unary: bool,
    /// A call of a unary method whose REQUEST is not sent yet: decided at its first
    /// poll (unary if its whole request is there), or later for a call that waits
    /// for its request (see `poll_stream`).
    waiting: Option<RequestHead>,
    /// It holds one of the connection's [`MAX_WAITING`] slots.
    holds_wait_slot: bool,
    /// The deadline of a call waiting for its request with a `grpc-timeout`: when it
    /// fires the call stops waiting and reaches the core, which ends it with
    /// `DEADLINE_EXCEEDED`; the core gets what is left of the timeout.
    wait_deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    /// The request's `grpc-encoding`: what its compressed messages are in.
    request_encoding: Option<Algorithm>,
    /// What the core may compress responses with (the client's first accepted
    /// algorithm this build has), named in the response headers' `grpc-encoding`.
    response_encoding: Option<Algorithm>,
}

/// What a REQUEST frame says besides its payload, kept while a call waits for its
/// request.
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
/// calls wait past it (the duplicate cache sees unary calls only; h2's stream limit
/// bounds them).
const MAX_WAITING: usize = 16;

/// How many calls of a connection wait for their request (see [`MAX_WAITING`]).
type WaitSlots = usize;

/// The link of one gRPC connection on the server: HTTP/2 streams in, the core's frames
/// out (see `docs/grpc.md`).
pub struct GrpcServerLink {
    accepted: mpsc::Receiver<Accepted>,
    accept_closed: bool,
    driver: Driver,
    control: Arc<Control>,
    streams: HashMap<u64, ServerStream>,
    /// Which of `streams` to poll next (see the `ready` module).
    readiness: Readiness,
    /// Streams waiting for h2's send capacity: polled every round.
    sending: Vec<u64>,
    /// Calls a round found finished, kept between rounds for its allocation.
    gone: Vec<u64>,
    /// Unary calls waiting for their whole request.
    waiting: WaitSlots,
    /// The server's unary methods: their calls go to the core as unary ones when the
    /// whole request is already here (`docs/grpc.md`).
    unary_methods: UnaryMethods,
    /// Frames for the core.
    ready: ForCore,
    /// Calls not yet handed to the core that a round skipped while the link held
    /// new requests back (see [`holding`](Self::holding)): polled again once it
    /// stops.
    held: Vec<u64>,
    waker: Option<Waker>,
    max_message: usize,
    /// What the streams hold of unfinished requests, together.
    unfinished: Arc<Unfinished>,
    /// What h2 has written of each stream's DATA (see `crate::meter`).
    meter: Arc<Meter>,
    /// The core's metadata limit: a call whose request metadata exceed it is refused
    /// `RESOURCE_EXHAUSTED` here rather than as a frame the core refuses.
    max_metadata: usize,
    peer: Peer,
    closing: bool,
    /// The last call the core will process, once it sent GOAWAY: it answers later
    /// calls UNAVAILABLE unprocessed, which the client is told as RST_STREAM
    /// REFUSED_STREAM (gRPC clients retry those on another connection).
    last_processed: Option<u64>,
    resets: ResetBudget,
}

/// The rapid-reset bound (CVE-2023-44487) on calls the link already handed to the
/// core: a token bucket of `max` peer resets refilling at `max` per `period`. h2's
/// own bound counts only streams reset before they were accepted, and the driver
/// accepts eagerly, so without this a peer could make the core start and cancel
/// calls as fast as it can send HEADERS and RST_STREAM.
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

    /// Spends `n` resets; false once the budget is gone (and from then on).
    fn spend(&mut self, n: u32) -> bool {
        if self.exhausted {
            return false;
        }
        let now = Instant::now();
        let refill = now.duration_since(self.last).as_secs_f64() * self.per_second;
        self.last = now;
        self.tokens = (self.tokens + refill).min(self.max) - f64::from(n);
        if self.tokens < 0.0 {
            self.exhausted = true;
        }
        !self.exhausted
    }
}

impl GrpcServerLink {
    fn new(io: driver::Io, peer: Peer, config: &GrpcConfig, link: &LinkConfig) -> GrpcServerLink {
        let (tx, accepted) = mpsc::channel(driver::ACCEPT_QUEUE);
        let control = Arc::new(Control::default());
        let meter = Arc::new(Meter::default());
        let driver = Driver::spawn(driver::serve(
            Box::new(Metered::server(
                io,
                meter.clone(),
                config.handshake_timeout,
                ControlFrames::new(config.max_control_frames, config.control_frame_period),
                control.clone(),
                peer.description().to_owned(),
            )),
            config.server_builder(),
            config.handshake_timeout,
            config
                .server_keepalive_interval
                .map(|interval| (interval, config.keepalive_timeout)),
            tx,
            control.clone(),
            peer.description().to_owned(),
            meter.clone(),
        ));
        let max_message = config.message_limit(link.max_frame_len);
        GrpcServerLink {
            accepted,
            accept_closed: false,
            driver,
            control,
            streams: HashMap::new(),
            readiness: Readiness::default(),
            sending: Vec::new(),
            gone: Vec::new(),
            waiting: 0,
            unary_methods: link.unary_methods.clone(),
            ready: ForCore::default(),
            held: Vec::new(),
            waker: None,
            max_message,
            unfinished: Unfinished::for_connection(max_message),
            meter,
            max_metadata: link.max_metadata_len,
            peer,
            closing: false,
            last_processed: None,
            resets: ResetBudget::new(config.max_peer_resets, config.peer_reset_period),
        }
    }

    /// A new call: checks what gRPC requires of it, answers it here if it fails, and
    /// otherwise hands the core a streaming REQUEST.
    fn open(&mut self, request: http::Request<h2::RecvStream>, mut respond: SendResponse<Bytes>) {
        let id = u64::from(u32::from(respond.stream_id()));
        let (parts, body) = request.into_parts();
        if parts.method != Method::POST {
            http_refusal(&mut respond, StatusCode::METHOD_NOT_ALLOWED);
            return;
        }
        let Some(codec) = headers::grpc_codec(&parts.headers) else {
            http_refusal(&mut respond, StatusCode::UNSUPPORTED_MEDIA_TYPE);
            return;
        };
        let fail = |respond: &mut SendResponse<Bytes>, code: Code, message: String| {
            trailers_only(respond, code, &message, &[], &Metadata::new());
        };
        // `application/grpc+json` and the like: read as protobuf, the one codec here,
        // as grpc-go does (it logs "Unsupported codec ... Defaulting to proto") and
        // grpc-java (which ignores the subtype); a request really in another codec
        // then fails to decode, with INTERNAL.
        if !codec.eq_ignore_ascii_case("proto") {
            tracing::debug!(
                content_subtype = codec,
                "a gRPC request in a codec this server does not have: read as protobuf"
            );
        }
        let method = parts.uri.path().strip_prefix('/').unwrap_or("");
        if !valid_method(method) {
            let message = format!("malformed method name {:?}", quoted(parts.uri.path()));
            fail(&mut respond, Code::UNIMPLEMENTED, message);
            return;
        }
        let request_encoding = match headers::encoding(&parts.headers) {
            Ok(encoding) => encoding,
            Err(name) => {
                let message = format!(
                    "grpc-encoding {:?} is not supported (this server decompresses {:?})",
                    quoted(&name),
                    headers::accept_encoding_value()
                );
                fail(&mut respond, Code::UNIMPLEMENTED, message);
                return;
            }
        };
        // The core compresses responses only toward a client that advertised; it is
        // told of one algorithm, so that the headers can name it before the first
        // message.
        let response_encoding = headers::accepted(&parts.headers).first().copied();
        let timeout = match parts.headers.get(headers::name::GRPC_TIMEOUT) {
            None => None,
            Some(value) => match codec::parse_timeout(value.as_bytes()) {
                Some(timeout) => Some(timeout),
                None => {
                    fail(
                        &mut respond,
                        Code::INTERNAL,
                        "malformed grpc-timeout".into(),
                    );
                    return;
                }
            },
        };
        let mut metadata = Metadata::new();
        match headers::read_metadata(&parts.headers, &mut metadata, self.max_metadata) {
            Ok(()) => {}
            Err(headers::MetadataError::Malformed(message)) => {
                fail(&mut respond, Code::INTERNAL, message);
                return;
            }
            Err(headers::MetadataError::TooLarge) => {
                let message = "request metadata exceeds the metadata limit".to_owned();
                fail(&mut respond, Code::RESOURCE_EXHAUSTED, message);
                return;
            }
        }
        if let Some(algorithm) = response_encoding {
            let _ = metadata.append(rpc_core::compress::ACCEPT_ENCODING, algorithm.name());
        }
        // Checked again with the entry the link added (the core refuses a block over
        // its limits as a protocol error, which would end the connection).
        if !frame::metadata_fits(&metadata, self.max_metadata) {
            let message = "request metadata exceeds the metadata limit".to_owned();
            fail(&mut respond, Code::RESOURCE_EXHAUSTED, message);
            return;
        }
        let head = RequestHead {
            method: method.to_owned(),
            timeout,
            call_key: headers::read_call_key(&parts.headers),
            metadata,
        };
        let credit = i64::from(frame::INITIAL_STREAM_WINDOW);
        // A unary method's call is decided at its first poll, still in this round
        // (`poll_stream`); any other goes to the core as a stream now.
        let waiting = if self.unary_methods.contains(method) {
            Some(head)
        } else {
            self.ready.push_frame(head.into_frame(id, None));
            None
        };
        let waker = self.readiness.waker(id);
        // Polled at the next flush (a call opened here: in this very round).
        waker.mark();
        self.streams.insert(
            id,
            ServerStream {
                waker,
                inbound: Some(Inbound::new(
                    body,
                    self.max_message,
                    credit,
                    self.unfinished.clone(),
                )),
                respond: Some(respond),
                out: Outbound::new(None, self.meter.clone()),
                answered: false,
                unary: false,
                waiting,
                holds_wait_slot: false,
                wait_deadline: None,
                request_encoding,
                response_encoding,
            },
        );
    }

    /// Whether the link holds new calls back: while the unary answers that the
    /// peer's windows keep from leaving, or the frames the core has not taken, come
    /// to [`UNFINISHED_MESSAGES`] times the largest message. Nothing else bounds
    /// either: the core hands the link every answer (a client that sent 15 MiB echo
    /// requests with its windows at zero made one connection hold 1 GB), and a core
    /// at its own bounds stops taking frames while the link's flushes go on reading
    /// requests. Held back, new streams wait in h2 (its stream limit and windows
    /// bound them) and new unary requests in their streams, as requests wait in the
    /// socket over TCP; calls the core has go on (their messages within its credit,
    /// their answers, WINDOW frames and resets), and so do their answers: the hold
    /// bounds what new calls add, not what admitted ones queue. A client that takes
    /// the waiting answers (or resets their streams) lifts it; one that reads its
    /// answers only after making another call waits on itself, as over TCP when its
    /// requests fill a socket the server does not drain.
    fn holding(&self) -> bool {
        let limit = self.max_message.saturating_mul(UNFINISHED_MESSAGES);
        self.meter.queued() >= limit || self.ready.bytes >= limit
    }

    /// Accepts new calls and moves along the calls h2 woke or the link marked: data
    /// out within h2's capacity, credit back to the core, messages in within the
    /// core's credit, resets noticed. New calls only while the link is not
    /// [`holding`](Self::holding) them back.
    fn poll_streams(&mut self, cx: &mut Context<'_>) {
        self.readiness.register(cx);
        if !self.held.is_empty() && !self.holding() {
            self.sending.append(&mut self.held);
        }
        let mut gone = std::mem::take(&mut self.gone);
        let mut resets = 0;
        // The calls the core has first: a reset among them goes to the core (as a
        // CANCEL) before the REQUEST of a call opened in its place. The other way,
        // a client at the stream limit that reset one and opened another in one
        // write had the new one refused RESOURCE_EXHAUSTED by the core, which still
        // counted the old (from a review).
        self.poll_woken(&mut gone, &mut resets, true);
        for &id in &gone {
            self.streams.remove(&id);
        }
        let mut accept_held = false;
        let mut opened = false;
        while !self.accept_closed {
            if self.holding() {
                accept_held = true;
                break;
            }
            match self.accepted.poll_recv(cx) {
                Poll::Ready(Some((request, respond))) => {
                    self.open(request, respond);
                    opened = true;
                }
                Poll::Ready(None) => self.accept_closed = true,
                Poll::Pending => break,
            }
        }
        if opened {
            // The calls opened, in this very round (and any woken since; not again
            // those sending, polled above).
            self.poll_woken(&mut gone, &mut resets, false);
        }
        for id in gone.drain(..) {
            self.streams.remove(&id);
        }
        self.gone = gone;
        if (accept_held || !self.held.is_empty()) && !self.holding() && !self.closing {
            // The hold ended in this round (answers left): the next one takes the
            // calls held back, which nothing else would wake it for.
            cx.waker().wake_by_ref();
        }
        let already = self.resets.exhausted;
        if resets > 0 && !self.resets.spend(resets) && !already {
            tracing::warn!(
                peer = %self.peer.description(),
                "gRPC client reset too many calls (rapid reset): GOAWAY ENHANCE_YOUR_CALM"
            );
            self.control
                .send(Command::Abrupt(h2::Reason::ENHANCE_YOUR_CALM));
        }
    }

    /// Polls the streams h2 woke or the link marked (and, with `sending`, those
    /// sending), collecting the finished in `gone` and counting the client's resets.
    fn poll_woken(&mut self, gone: &mut Vec<u64>, resets: &mut u32, sending: bool) {
        let woken = if sending {
            self.readiness.take_with(&mut self.sending)
        } else {
            self.readiness.take_with(&mut Vec::new())
        };
        for &id in &woken {
            // Closing, too: a call the core never saw is then refused (`poll_close`).
            let holding = self.holding() || self.closing;
            let Some(stream) = self.streams.get_mut(&id) else {
                continue;
            };
            if stream.waiting.is_some() && holding {
                // A call the core has not heard of: it waits, and nothing in it
                // can be lost meanwhile (its request stays in h2; a reset is seen
                // when it is polled again).
                self.held.push(id);
                continue;
            }
            let waker = stream.waker.for_poll();
            match poll_stream(
                id,
                stream,
                &mut self.ready,
                &mut self.waiting,
                &mut Context::from_waker(&waker),
            ) {
                Step::Going if stream.out.is_sending() => self.sending.push(id),
                Step::Going => {}
                Step::Done => gone.push(id),
                Step::PeerReset => {
                    *resets += 1;
                    gone.push(id);
                }
            }
        }
        self.readiness.put_back(woken);
    }

    fn on_data(&mut self, data: frame::DataFrame, payload: Payload) {
        let Some(stream) = self.streams.get_mut(&data.id) else {
            return;
        };
        if stream.answered {
            return;
        }
        stream.waker.mark();
        if let Some(metadata) = &data.metadata {
            send_headers(stream, metadata);
        }
        if data.message.is_none() {
            return;
        }
        // Credit comes back for the message as the core sent it (docs/wire.md §6.10).
        let cost = flow::message_cost(payload.len());
        let (payload, compressed) = if data.compressed {
            match headers::fit_encoding(stream.response_encoding, payload, self.max_message) {
                Ok(fit) => fit,
                Err(status) => {
                    end_call(stream, Code::INTERNAL, status.message());
                    push_cancel(&mut self.ready, data.id);
                    return;
                }
            }
        } else {
            (payload, false)
        };
        send_headers(stream, &Metadata::new());
        let chunks = codec::encode_message(&payload, compressed);
        stream.out.push_message(chunks, cost);
    }

    fn on_response(&mut self, response: frame::ResponseFrame, payload: Payload) {
        let Some(stream) = self.streams.get_mut(&response.id) else {
            return;
        };
        if stream.answered {
            return;
        }
        stream.waker.mark();
        stream.answered = true;
        stream.inbound = None;
        // Headers already out (a stream's, or a unary answer's sent ahead of it, see
        // `Link::splits_trailers`): the RESPONSE's metadata are the trailers.
        let headers_sent = stream.respond.is_none();
        let unprocessed = response.code == Code::UNAVAILABLE
            && self.last_processed.is_some_and(|last| response.id > last);
        if unprocessed {
            if let Some(mut respond) = stream.respond.take() {
                // A call that reached the core after its GOAWAY: refused at the HTTP/2
                // level, as the final GOAWAY's last stream id may cover it.
                respond.send_reset(h2::Reason::REFUSED_STREAM);
                stream.out.reset_quietly();
                return;
            }
        }
        // A unary call's OK answer is its one message, even an empty one (gRPC's unary
        // response has exactly one); otherwise a payload is a unary-shaped answer.
        let unary_shaped = !payload.is_empty() || (stream.unary && response.code == Code::OK);
        if !unary_shaped {
            if let Some(mut respond) = stream.respond.take() {
                trailers_only(
                    &mut respond,
                    response.code,
                    &response.message,
                    &response.details,
                    &response.metadata,
                );
                stream.out.reset_quietly();
                return;
            }
        } else {
            let (payload, compressed) = if response.compressed {
                match headers::fit_encoding(stream.response_encoding, payload, self.max_message) {
                    Ok(fit) => fit,
                    Err(status) => {
                        end_call(stream, Code::INTERNAL, status.message());
                        return;
                    }
                }
            } else {
                (payload, false)
            };
            // A unary-shaped answer: its metadata are the headers (unless sent ahead).
            send_headers(stream, &response.metadata);
            let chunks = codec::encode_message(&payload, compressed);
            // Counted in the link's hold on new calls while the peer does not take
            // it (`holding`).
            stream.out.count_in_connection();
            stream.out.push_message(chunks, 0);
        }
        let mut trailers = HeaderMap::new();
        let trailing = if unary_shaped && !headers_sent {
            &Metadata::new()
        } else {
            &response.metadata
        };
        headers::write_status(
            response.code,
            &response.message,
            &response.details,
            trailing,
            &mut trailers,
        );
        stream.out.push_trailers(trailers);
    }

    fn wake(&self) {
        if let Some(waker) = &self.waker {
            waker.wake_by_ref();
        }
    }

    fn poll_driver_end(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, Error>>> {
        match std::task::ready!(self.driver.poll_finished(cx)) {
            Ok(()) => Poll::Ready(None),
            Err(err) => Poll::Ready(Some(Err(Error::new(
                ErrorKind::Closed,
                format!("gRPC connection from {}: {err}", self.peer.description()),
            )))),
        }
    }
}

/// Where a call stands after [`poll_stream`].
enum Step {
    Going,
    /// The link is done with it.
    Done,
    /// The peer reset it before the core answered (the core was told CANCEL): counts
    /// against the connection's [`ResetBudget`].
    PeerReset,
}

/// Whether `err` is an RST_STREAM from the peer.
fn is_peer_reset(err: &h2::Error) -> bool {
    err.is_reset() && err.is_remote()
}

/// Moves one call along.
fn poll_stream(
    id: u64,
    stream: &mut ServerStream,
    ready: &mut ForCore,
    waiting: &mut WaitSlots,
    cx: &mut Context<'_>,
) -> Step {
    if let (Some(head), Some(inbound)) = (&stream.waiting, &mut stream.inbound) {
        // A unary method's call: unary if its whole request is here (usually: a client
        // sends HEADERS and its one DATA together). Within the connection's slots, one
        // whose message has not started to come (its DATA in a later read: h2's
        // writer may send the HEADERS alone) waits for it, as the unary path is the
        // cheaper one; a keyed one waits for the rest of its request too, as the
        // duplicate cache sees only unary calls, so a keyed retry keeps its
        // at-most-once guarantee only as one. Anything else takes the stream path,
        // where the core knows the call (a server draining waits for it).
        let single = inbound.take_single(cx);
        if single.is_none()
            && (head.call_key.is_some() || !inbound.has_data())
            && inbound.may_become_single()
            // A keyed call waits whatever the slots (h2's stream limit bounds them):
            // on the stream path its key would be ignored, and refused it would be
            // sent whole again.
            && (stream.holds_wait_slot || *waiting < MAX_WAITING || head.call_key.is_some())
        {
            if !stream.holds_wait_slot {
                stream.holds_wait_slot = true;
                *waiting += 1;
                // Its first poll, in the round that opened it: its timeout starts now.
                if let Some(timeout) = head.timeout {
                    stream.wait_deadline = Some(Box::pin(tokio::time::sleep(timeout)));
                }
            }
            let expired = match &mut stream.wait_deadline {
                Some(sleep) => sleep.as_mut().poll(cx).is_ready(),
                None => false,
            };
            if !expired {
                // h2 wakes the stream for more, the timer at the deadline.
                return Step::Going;
            }
        }
        if stream.holds_wait_slot {
            stream.holds_wait_slot = false;
            *waiting -= 1;
        }
        let mut head = stream.waiting.take().expect("matched above");
        if let Some(sleep) = stream.wait_deadline.take() {
            // It waited: the core gets what is left of its timeout.
            let now = tokio::time::Instant::now();
            head.timeout = Some(sleep.deadline().saturating_duration_since(now));
        }
        match single {
            Some(message) if message.compressed && stream.request_encoding.is_none() => {
                // The core never hears of the call.
                end_call(
                    stream,
                    Code::INTERNAL,
                    "compressed message without grpc-encoding",
                );
                return Step::Done;
            }
            Some(message)
                if message.compressed
                    && codec::encoding_mismatch(&message, stream.request_encoding).is_some() =>
            {
                let why = codec::encoding_mismatch(&message, stream.request_encoding);
                end_call(stream, Code::INTERNAL, why.unwrap_or_default());
                return Step::Done;
            }
            Some(message) => {
                ready.push_frame(head.into_frame(id, Some(message)));
                stream.inbound = None;
                stream.unary = true;
                // Again, to watch for a reset.
                return poll_stream(id, stream, ready, waiting, cx);
            }
            // Not one message (yet, or at all, or failed): the stream path, from its
            // REQUEST on; what was read waits in the request half. Its answer is still
            // one message of any size (the core sends a unary reply whatever its
            // credit), so it counts in the hold on new calls as a unary answer does:
            // else a client that sends each request's DATA after its HEADERS, with
            // the wait slots taken, had every answer queued uncounted.
            None => {
                stream.out.count_in_connection();
                ready.push_frame(head.into_frame(id, None));
            }
        }
    }
    match stream.out.poll_send(cx) {
        Poll::Ready(Err(err)) => {
            // Reset by the client, or the connection is gone.
            if stream.answered {
                return Step::Done;
            }
            push_cancel(ready, id);
            return if is_peer_reset(&err) || stream.out.reset_by_peer() {
                Step::PeerReset
            } else {
                Step::Done
            };
        }
        Poll::Ready(Ok(())) | Poll::Pending => {}
    }
    let owed = stream.out.take_owed();
    if owed > 0 && !stream.answered {
        let mut buf = BytesMut::with_capacity(frame::HEADER_LEN + 4);
        frame::encode_window(&mut buf, id, owed);
        ready.push_back(buf.freeze());
    }
    if stream.answered {
        return if stream.out.is_finished() {
            Step::Done
        } else {
            Step::Going
        };
    }
    let Some(inbound) = &mut stream.inbound else {
        // The client half-closed: only a reset can still come from it. Polling for it
        // is what has h2 wake this stream when one comes.
        return poll_reset(id, stream, ready, cx);
    };
    loop {
        match inbound.poll_event(cx) {
            // Held back by the core's credit, the half polled nothing of h2: watch for
            // a reset meanwhile, which nothing else would wake this stream for.
            Poll::Pending if inbound.is_held() => return poll_reset(id, stream, ready, cx),
            Poll::Pending => return Step::Going,
            Poll::Ready(Ok(InEvent::Message(message))) => {
                let refused = match (message.compressed, stream.request_encoding) {
                    (false, _) => None,
                    (true, None) => Some("compressed message without grpc-encoding"),
                    (true, encoding) => codec::encoding_mismatch(&message, encoding),
                };
                if let Some(why) = refused {
                    end_call(stream, Code::INTERNAL, why);
                    push_cancel(ready, id);
                    // Again, to send the trailers `end_call` queued.
                    return poll_stream(id, stream, ready, waiting, cx);
                }
                let flags = if message.compressed {
                    frame::FLAG_COMPRESSED
                } else {
                    0
                };
                let mut buf = BytesMut::with_capacity(frame::HEADER_LEN + message.data.len());
                frame::encode_data_header(&mut buf, id, flags, None);
                message.data.copy_to(&mut buf);
                ready.push_back(buf.freeze());
            }
            Poll::Ready(Ok(InEvent::End(_trailers))) => {
                let mut buf = BytesMut::with_capacity(frame::HEADER_LEN);
                frame::encode_data_header(
                    &mut buf,
                    id,
                    frame::FLAG_END_STREAM | frame::FLAG_NO_MESSAGE,
                    None,
                );
                ready.push_back(buf.freeze());
                stream.inbound = None;
                // Again, to watch for a reset from now on.
                return poll_stream(id, stream, ready, waiting, cx);
            }
            Poll::Ready(Err(InError::Message(err))) => {
                end_call(stream, err.code(), &err.to_string());
                push_cancel(ready, id);
                // Again, to send the trailers `end_call` queued.
                return poll_stream(id, stream, ready, waiting, cx);
            }
            Poll::Ready(Err(InError::H2(err))) => {
                push_cancel(ready, id);
                return if is_peer_reset(&err) {
                    Step::PeerReset
                } else {
                    Step::Done
                };
            }
        }
    }
}

/// Polls for a reset of a call whose request half has nothing to poll (ended, or held
/// back by credit); a reset ends it with a CANCEL to the core.
fn poll_reset(
    id: u64,
    stream: &mut ServerStream,
    ready: &mut ForCore,
    cx: &mut Context<'_>,
) -> Step {
    let reset = match &mut stream.respond {
        Some(respond) => respond.poll_reset(cx),
        None => stream.out.poll_reset(cx),
    };
    match reset {
        Poll::Pending => Step::Going,
        Poll::Ready(Ok(_)) => {
            push_cancel(ready, id);
            Step::PeerReset
        }
        Poll::Ready(Err(_)) => {
            push_cancel(ready, id);
            Step::Done
        }
    }
}

fn push_cancel(ready: &mut ForCore, id: u64) {
    let mut buf = BytesMut::with_capacity(frame::HEADER_LEN);
    frame::encode_cancel(&mut buf, id);
    ready.push_back(buf.freeze());
}

/// Sends the response headers if they are not sent yet.
fn send_headers(stream: &mut ServerStream, metadata: &Metadata) {
    let Some(mut respond) = stream.respond.take() else {
        return;
    };
    let mut response = http::Response::new(());
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static(headers::CONTENT_TYPE),
    );
    if let Err(message) = headers::write_metadata(metadata, response.headers_mut()) {
        tracing::debug!("response headers: {message}; left out");
    }
    let h = response.headers_mut();
    h.insert(
        headers::name::GRPC_ACCEPT_ENCODING,
        headers::accept_encoding_value(),
    );
    if let Some(algorithm) = stream.response_encoding {
        h.insert(
            headers::name::GRPC_ENCODING,
            HeaderValue::from_static(algorithm.name()),
        );
    }
    match respond.send_response(response, false) {
        Ok(send) => stream.out.open(send),
        Err(_) => stream.out.reset_quietly(),
    }
}

/// Ends a call from the link's side (a bad message from the client): the client gets
/// the status, the core a CANCEL (pushed by the caller).
fn end_call(stream: &mut ServerStream, code: Code, message: &str) {
    stream.answered = true;
    stream.inbound = None;
    match stream.respond.take() {
        Some(mut respond) => {
            trailers_only(&mut respond, code, message, &[], &Metadata::new());
            stream.out.reset_quietly();
        }
        None => {
            let mut trailers = HeaderMap::new();
            headers::write_status(code, message, &[], &Metadata::new(), &mut trailers);
            stream.out.push_trailers(trailers);
        }
    }
}

/// Answers with a status and no messages: one HEADERS frame with END_STREAM.
fn trailers_only(
    respond: &mut SendResponse<Bytes>,
    code: Code,
    message: &str,
    details: &[u8],
    metadata: &Metadata,
) {
    let mut response = http::Response::new(());
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static(headers::CONTENT_TYPE),
    );
    headers::write_status(code, message, details, metadata, headers);
    headers.insert(
        headers::name::GRPC_ACCEPT_ENCODING,
        headers::accept_encoding_value(),
    );
    let _ = respond.send_response(response, true);
}

/// Answers a request that is not gRPC with a bare HTTP status.
fn http_refusal(respond: &mut SendResponse<Bytes>, status: StatusCode) {
    let mut response = http::Response::new(());
    *response.status_mut() = status;
    if status == StatusCode::METHOD_NOT_ALLOWED {
        // RFC 9110 15.5.6: a 405 names the methods the resource takes.
        response
            .headers_mut()
            .insert(http::header::ALLOW, http::HeaderValue::from_static("POST"));
    }
    let _ = respond.send_response(response, true);
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

fn goaway_reason(code: GoAwayCode) -> h2::Reason {
    match code {
        GoAwayCode::PROTOCOL_ERROR | GoAwayCode::UNSUPPORTED_VERSION => h2::Reason::PROTOCOL_ERROR,
        GoAwayCode::FRAME_TOO_LARGE => h2::Reason::FRAME_SIZE_ERROR,
        GoAwayCode::TOO_MANY_CONNECTIONS => h2::Reason::REFUSED_STREAM,
        GoAwayCode::NO_ERROR => h2::Reason::NO_ERROR,
        _ => h2::Reason::INTERNAL_ERROR,
    }
}

impl Link for GrpcServerLink {
    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, Error>>> {
        self.poll_recv_frame(cx)
            .map(|received| received.map(|frame| frame.map(codec::encoded)))
    }

    fn poll_recv_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Received, Error>>> {
        if !self.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            self.waker = Some(cx.waker().clone());
            // So that the core publishes `unsent` as h2 writes what the streams
            // finished handing over.
            self.meter.set_link_task(cx.waker());
        }
        if self.ready.is_empty() {
            self.poll_streams(cx);
        }
        if let Some(frame) = self.ready.pop_front() {
            return Poll::Ready(Some(Ok(frame)));
        }
        if self.accept_closed {
            return self
                .poll_driver_end(cx)
                .map(|end| end.map(|end| end.map(Received::Bytes)));
        }
        Poll::Pending
    }

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        Poll::Ready(Ok(()))
    }

    fn start_send(&mut self, header: &[u8], payload: Payload) -> Result<(), Error> {
        let frame = codec::core_frame(header)?;
        match frame {
            Frame::Data(data) => self.on_data(data, payload),
            Frame::Response(response) => self.on_response(response, payload),
            Frame::Window { id, increment } => {
                let Some(stream) = self.streams.get_mut(&id) else {
                    return Ok(());
                };
                let unblocked = stream
                    .inbound
                    .as_mut()
                    .is_some_and(|inbound| inbound.grant(increment));
                if unblocked {
                    stream.waker.mark();
                    self.wake();
                }
            }
            Frame::GoAway(goaway) => {
                self.last_processed = Some(goaway.last_id);
                // Calls the core has not heard of (waiting for their request, or held
                // back) are refused at once: h2's final GOAWAY may cover their
                // streams, and one handed to the core now would be answered
                // UNAVAILABLE with an id at or below its `last_id`, which a gRPC
                // client takes as a failure, not as a call to send again (from a
                // review). Streams opened after have higher ids, refused by the core.
                let unseen: Vec<u64> = self
                    .streams
                    .iter()
                    .filter(|(_, stream)| stream.waiting.is_some())
                    .map(|(&id, _)| id)
                    .collect();
                for id in unseen {
                    if let Some(mut stream) = self.streams.remove(&id) {
                        if let Some(respond) = &mut stream.respond {
                            respond.send_reset(h2::Reason::REFUSED_STREAM);
                        }
                        stream.out.reset_quietly();
                        if stream.holds_wait_slot {
                            self.waiting -= 1;
                        }
                    }
                }
                let command = if goaway.code == GoAwayCode::NO_ERROR {
                    Command::Graceful
                } else {
                    Command::Abrupt(goaway_reason(goaway.code))
                };
                self.control.send(command);
            }
            // PONGs answer PINGs this link never forwards; the rest are not the
            // server's to send or have no gRPC equivalent (bulk transfer).
            other => tracing::debug!(?other, "gRPC server link: frame not mapped"),
        }
        Ok(())
    }

    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        let had = self.ready.len();
        self.poll_streams(cx);
        if self.ready.len() > had {
            // Frames for the core (credit, cancels) that it may not poll for.
            cx.waker().wake_by_ref();
        }
        if self.accept_closed {
            if let Poll::Ready(Some(Err(err))) = self.poll_driver_end(cx) {
                return Poll::Ready(Err(err));
            }
        }
        Poll::Ready(Ok(()))
    }

    fn poll_close(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        if !self.closing {
            self.closing = true;
            self.control.send(Command::Graceful);
            self.accepted.close();
            while let Ok((_, mut respond)) = self.accepted.try_recv() {
                respond.send_reset(h2::Reason::REFUSED_STREAM);
            }
        }
        // Hand h2 what the core queued (trailers above all) before letting go.
        self.poll_streams(cx);
        let sending = self
            .streams
            .values()
            .any(|s| s.answered && !s.out.is_finished() && !s.out.is_idle());
        if sending {
            return Poll::Pending;
        }
        // Calls the core never saw (held back, or waiting for their request) are
        // refused, not cancelled: REFUSED_STREAM tells the client that nothing ran,
        // so it may send them again elsewhere (RFC 9113 §8.7).
        for stream in self.streams.values_mut() {
            if stream.waiting.is_some() {
                if let Some(respond) = &mut stream.respond {
                    respond.send_reset(h2::Reason::REFUSED_STREAM);
                }
            }
        }
        self.streams.clear();
        self.waiting = 0;
        match std::task::ready!(self.driver.poll_finished(cx)) {
            Ok(()) => Poll::Ready(Ok(())),
            Err(err) => Poll::Ready(Err(Error::new(ErrorKind::Closed, err))),
        }
    }

    /// Unary calls waiting for the rest of their request, and the bytes the streams
    /// hold of unfinished messages: it changes as request bodies arrive.
    fn receiving(&self) -> u64 {
        if self.waiting == 0 {
            return 0;
        }
        self.waiting as u64 + self.unfinished.held() as u64
    }

    /// DATA the streams were given and the connection has not written: it changes as
    /// the client takes a large answer (counted by the connection's writer, which
    /// wakes the core's task every 64 KiB it writes).
    fn unsent(&self) -> u64 {
        self.meter.unsent()
    }

    fn writes_wait_on_peer_windows(&self) -> bool {
        // DATA waits in h2 for the client's stream and connection windows.
        true
    }

    fn peer(&self) -> String {
        self.peer.description().to_owned()
    }

    fn poll_gone(&mut self, cx: &mut Context<'_>) -> Poll<Error> {
        // The HTTP/2 connection's task ends with the connection.
        match std::task::ready!(self.poll_driver_end(cx)) {
            Some(Err(err)) => Poll::Ready(err),
            _ => Poll::Ready(Error::new(
                ErrorKind::Closed,
                format!("gRPC connection from {} closed", self.peer.description()),
            )),
        }
    }

    fn peer_info(&self) -> Peer {
        self.peer.clone()
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

/// A `grpc-timeout` in whole microseconds, as the core's wire carries it, rounded up:
/// `999n` is 1 µs, not an expired deadline (refused before any handler runs), and
/// `1500n` 2 µs (from a review: both were cut down).
fn whole_micros(timeout: Duration) -> Duration {
    Duration::from_micros(u64::try_from(timeout.as_nanos().div_ceil(1000)).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_round_up_to_whole_microseconds() {
        assert_eq!(
            whole_micros(Duration::from_nanos(999)),
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

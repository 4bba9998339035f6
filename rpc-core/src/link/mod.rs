//! The traits transports implement: a [`Link`] moves whole frames, a [`Connector`]
//! opens links for a client, a [`Listener`] accepts them for a server.
//!
//! The core sees messages, never bytes. A byte-stream transport rebuilds frame
//! boundaries itself (TCP with a length prefix); a datagram transport gets them from
//! the network. Either way the core receives one whole frame per
//! [`poll_recv`](Link::poll_recv) and hands the link one frame per
//! [`start_send`](Link::start_send), split into a small header (encoded by the core)
//! and a payload kept as [`Bytes`] so that large messages are never copied on the way
//! out. A link may buffer any number of frames until [`poll_flush`](Link::poll_flush),
//! which is how many frames go out per system call under load.
//!
//! [`mem`] is an in-memory link for deterministic tests of the core; [`LazySleep`] is a
//! timer a link's task can check in every round at little cost.

mod lazy_sleep;
pub mod mem;

pub use crate::idmap::IdHasher;
pub use lazy_sleep::LazySleep;

use std::{
    collections::HashSet,
    future::Future,
    sync::Arc,
    task::{Context, Poll},
};

use bytes::Bytes;

use crate::{Error, Payload};

/// Default maximum frame length: 16 MiB, four times gRPC's default message limit. It
/// bounds what one peer can make the receiver allocate for a single frame; services
/// that move larger messages raise it on both sides.
pub const DEFAULT_MAX_FRAME_LEN: usize = 16 * 1024 * 1024;

/// Settings the core hands a transport when it opens or accepts a link.
#[derive(Clone, Debug)]
pub struct LinkConfig {
    /// Largest frame (not counting any transport prefix) the link accepts from the
    /// peer; a longer one is refused before anything is allocated for it.
    /// Default: [`DEFAULT_MAX_FRAME_LEN`].
    pub max_frame_len: usize,
    /// Largest metadata block the core accepts from the peer (the server's or
    /// channel's `max_metadata_len`): a link that translates another protocol's
    /// headers into frames (gRPC's) refuses a call whose metadata would exceed it with
    /// a status of its own, instead of handing the core a frame it would refuse with
    /// the whole connection. Default: [`DEFAULT_MAX_METADATA_LEN`](crate::frame::DEFAULT_MAX_METADATA_LEN).
    pub max_metadata_len: usize,
    /// Server side: the methods the server knows to be unary. Default: none.
    pub unary_methods: UnaryMethods,
}

impl Default for LinkConfig {
    fn default() -> Self {
        LinkConfig {
            max_frame_len: DEFAULT_MAX_FRAME_LEN,
            max_metadata_len: crate::frame::DEFAULT_MAX_METADATA_LEN,
            unary_methods: UnaryMethods::default(),
        }
    }
}

/// The methods a server knows to be unary, by wire name (`pkg.Service/Method`).
///
/// A transport whose wire cannot tell a unary call from a stream (gRPC's, where every
/// call is a stream) hands the calls of these methods to the core as unary REQUESTs
/// when their one message has arrived with the end of the stream, instead of as
/// streams, which cost the core a stream slot, a task and flow control. The server
/// fills it from its services' [`NamedService::UNARY_METHODS`](crate::server::NamedService::UNARY_METHODS)
/// (generated servers list theirs); a service added by name only has none listed, and
/// its calls keep the stream path, which serves unary methods too.
///
/// ```
/// use rpc_core::link::UnaryMethods;
/// let unary = UnaryMethods::new(["demo.Echo/Say".to_string()]);
/// assert!(unary.contains("demo.Echo/Say"));
/// assert!(!unary.contains("demo.Echo/Count"));
/// ```
#[derive(Clone, Debug, Default)]
pub struct UnaryMethods(Option<Arc<MethodSet>>);

/// The paths of [`UnaryMethods`], hashed with FNV-1a as the router's service names are
/// (one look-up per gRPC call; a peer choosing the paths it asks for can make a look-up
/// compare against at most the server's own few methods).
type MethodSet = HashSet<Box<str>, std::hash::BuildHasherDefault<crate::server::router::Fnv>>;

impl UnaryMethods {
    /// The set of `paths`.
    pub fn new(paths: impl IntoIterator<Item = String>) -> Self {
        let set: MethodSet = paths.into_iter().map(String::into_boxed_str).collect();
        UnaryMethods((!set.is_empty()).then(|| Arc::new(set)))
    }

    /// Whether `path` (`pkg.Service/Method`) names a unary method.
    pub fn contains(&self, path: &str) -> bool {
        self.0.as_ref().is_some_and(|set| set.contains(path))
    }

    /// Whether no method is listed.
    pub fn is_empty(&self) -> bool {
        self.0.is_none()
    }
}

/// A frame as a link hands it to the core ([`Link::poll_recv_frame`]).
#[derive(Debug)]
pub enum Received {
    /// The frame's bytes: the core decodes them and checks them against its limits.
    Bytes(Bytes),
    /// A frame the link built itself from another protocol's messages (gRPC's): the
    /// core takes it as it is instead of decoding bytes the link would have encoded
    /// for it, so the link has made every check the decoder would: metadata that
    /// [`frame::metadata_fits`](crate::frame::metadata_fits) `LinkConfig::max_metadata_len`
    /// (bytes and entries), keys and values built through
    /// [`Metadata`](crate::Metadata)'s checks, a method of the form
    /// `package.Service/Method` of at most 65,535 bytes, a timeout in whole
    /// microseconds, no payload on a streaming REQUEST. `len` is the length its
    /// encoding would have, for the connection's counts.
    Frame {
        /// The frame (boxed: the bytes variant, every frame of the framework's own
        /// wires, stays small to move).
        frame: Box<crate::frame::Frame>,
        /// Its encoded length.
        len: usize,
    },
    /// The peer refused call `id` before processing any of it (HTTP/2's RST_STREAM
    /// with REFUSED_STREAM, RFC 9113 §8.7): the client fails the call as unprocessed
    /// ([`Status::is_unprocessed`](crate::Status::is_unprocessed)), which a retry
    /// policy may retry whatever the method's idempotency, and the connection goes on.
    /// Client links only: a server connection ignores it.
    Refused {
        /// The call.
        id: u64,
        /// Why, for the status message.
        message: String,
    },
    /// The link ended call `id` itself, answering the peer with a status of `code`:
    /// a request it could not hand over (gRPC's link: a message over the size limit,
    /// one it cannot decompress). The server stops the call's handler as for a CANCEL,
    /// and what observes the handler (its layers, through
    /// [`server::stop_cause`](crate::server::stop_cause)) sees `code` rather than
    /// `CANCELLED`. Server links only: a client connection ignores it.
    Stopped {
        /// The call.
        id: u64,
        /// The status code the link answered with.
        code: crate::Code,
    },
}

/// A connection that moves whole frames. Owned and driven by one task.
pub trait Link: Send + Unpin + 'static {
    /// Receives the next whole frame; `Ready(None)` is a clean end of stream (the peer
    /// closed between frames). The end of the stream in the middle of a frame is an
    /// error of kind [`Closed`](crate::ErrorKind::Closed).
    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, Error>>>;

    /// Receives the next whole frame as [`poll_recv`](Link::poll_recv) does, or the
    /// frame itself when the link built it (what the core's connections call). The
    /// default hands over `poll_recv`'s bytes; a link that translates another
    /// protocol into the core's frames returns them unencoded, which saves encoding
    /// and decoding each one.
    fn poll_recv_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Received, Error>>> {
        // A plain match: this is every frame's path on the framework's own wires, and
        // the closures of `Poll::map` cost a debug build's instruction guard.
        match self.poll_recv(cx) {
            Poll::Ready(Some(Ok(bytes))) => Poll::Ready(Some(Ok(Received::Bytes(bytes)))),
            Poll::Ready(Some(Err(err))) => Poll::Ready(Some(Err(err))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    /// Ready when the link can take another frame without buffering past its bound.
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>>;

    /// Queues one frame: `header` followed by the segments of `payload`. Call after
    /// [`poll_ready`](Link::poll_ready) returned ready.
    fn start_send(&mut self, header: &[u8], payload: Payload) -> Result<(), Error>;

    /// Writes out everything queued.
    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>>;

    /// Flushes and closes the sending side.
    fn poll_close(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>>;

    /// A description of the peer for logs and errors (`tcp://127.0.0.1:4000`).
    fn peer(&self) -> String;

    /// Ready, with why, once the link knows its connection is over without
    /// [`poll_recv`](Link::poll_recv) being called: the server's connection polls it
    /// while it has stopped reading at its limits, so that the calls of a peer that
    /// went away end instead of waiting for frames nobody reads. The default, for
    /// links that learn it only by reading, is never ready.
    fn poll_gone(&mut self, cx: &mut Context<'_>) -> Poll<Error> {
        let _ = cx;
        Poll::Pending
    }

    /// How much of frames partly received has arrived (bytes of a frame read in
    /// pieces, fragments of messages in reassembly, requests waiting for their body),
    /// 0 when none: at its connection limit the server does not take a connection
    /// for a quiet one while this changes between its looks
    /// ([`ServerBuilder::evict_quiet_after`](crate::server::ServerBuilder::evict_quiet_after)),
    /// so a slow upload is not cut short while it progresses, and one that stalls
    /// does not hold its place (over TLS the measure moves a whole record at a time).
    /// Asked once per poll of the server's connection: keep it cheap. The default
    /// is 0.
    fn receiving(&self) -> u64 {
        0
    }

    /// Bytes queued and not yet written to the transport (an answer a peer reads
    /// slowly), or another measure of them that changes as the peer takes them (UDP
    /// counts the fragments the peer acknowledged, and a client's keepalive on a link
    /// that is not reliable takes its changes for the server's life; gRPC, the DATA given to
    /// its streams less what was written; RDMA, the work requests posted while frames
    /// wait for credit or a pull), 0 when none (a measure may also stay at another
    /// constant once the link lost track of some bytes: only its changes count):
    /// at its connection limit the server does not take a connection for a quiet
    /// one while this changes between its looks, so a slow download is not cut
    /// short while it progresses, and a peer that reads nothing does not hold its
    /// place. Asked once per poll of the server's connection, and published only
    /// then: a link whose sending goes on without its task being woken (a writer of
    /// its own) wakes that task as it progresses. Keep it cheap. The default is 0.
    fn unsent(&self) -> u64 {
        0
    }

    /// Takes back call `id`'s REQUEST, handed to [`start_send`](Link::start_send),
    /// if nothing of the call has left yet and nothing will (a client link that holds
    /// requests until its connection opens: UDP's, before the server's ACCEPT);
    /// returns whether it did. The client asks at a call's deadline, so that a call
    /// that never left fails as unprocessed, as one still waiting in the client does
    /// (`Status::is_unprocessed`). The default, false, suits links that send what
    /// they are given.
    fn withdraw(&mut self, id: u64) -> bool {
        let _ = id;
        false
    }

    /// Whether writing ([`poll_ready`](Link::poll_ready), [`start_send`](Link::start_send),
    /// [`poll_flush`](Link::poll_flush)) may take in frames that the next
    /// [`poll_recv`](Link::poll_recv) returns without waking the task that
    /// [`poll_recv`](Link::poll_recv) last left `Pending` (a link that reads its socket
    /// as it writes, UDP's). A server connection then reads again after writing
    /// answers that freed a slot. The default, true, is always safe; a link whose
    /// writes that succeed never read (a byte stream's) says false, which spares the
    /// server that read after every answer.
    fn reads_while_writing(&self) -> bool {
        true
    }

    /// Whether the peer may still read after the link saw the end of what it sends
    /// (a byte stream's half-close): a server closing the connection then still
    /// writes its GOAWAY once [`poll_gone`](Link::poll_gone) reports the end. Links
    /// whose end means the peer is gone altogether keep the default, false.
    fn half_closes(&self) -> bool {
        false
    }

    /// What the transport knows of the peer, handed to every call the server reads
    /// from this link ([`Request::peer`](crate::Request::peer)). The default knows
    /// only [`peer`](Link::peer)'s description.
    fn peer_info(&self) -> crate::Peer {
        crate::Peer::new(self.peer())
    }

    /// The largest message the link accepts from its peer, when it is below the core's
    /// `max_frame_len` (gRPC's `GrpcConfig::max_message_len`): a compressed message
    /// the core decompresses may expand to no more than this either, so that a limit
    /// a user set on the link is not passed by compressing (found in review: a gzip
    /// message inflated to 16 MiB under a 1 MiB limit). `None`, the default: the
    /// core's `max_frame_len` is the only limit.
    fn max_message_len(&self) -> Option<usize> {
        None
    }

    /// Whether what [`unsent`](Link::unsent) counts may wait on a flow-control
    /// window the peer keeps closed while it is alive and reading (HTTP/2's, for a
    /// stream its application reads slowly), rather than only on the peer reading the
    /// connection at all. The server closes a reliable connection whose answers have
    /// not moved for two keepalive intervals, whatever the client sends, only on
    /// links where this is false (the default: our own wire's credit keeps answers
    /// out of the link until the client grants it).
    fn writes_wait_on_peer_windows(&self) -> bool {
        false
    }

    /// Whether every frame sent arrives exactly once and in order unless the link
    /// fails (true for byte streams). A link that may lose, duplicate or reorder
    /// frames (UDP) returns false; the core then retransmits requests that get no
    /// answer and treats a repeated request id as a duplicate, not a protocol error.
    fn is_reliable(&self) -> bool {
        true
    }

    /// On a link that is not [reliable](Link::is_reliable): whether the link itself
    /// delivers (or repairs) a frame of `frame_len` bytes, so that the core must not
    /// retransmit it. UDP delivers fragmented frames itself and leaves single-datagram
    /// frames to the core.
    fn delivers(&self, frame_len: usize) -> bool {
        let _ = frame_len;
        self.is_reliable()
    }

    /// Whether a PING frame the core sends reaches the peer's core and its PONG comes
    /// back (true for links that carry every frame). The core's keepalive
    /// ([`ChannelBuilder::keepalive_interval`](crate::client::ChannelBuilder::keepalive_interval),
    /// [`ServerBuilder::keepalive_interval`](crate::server::ServerBuilder::keepalive_interval))
    /// runs only on links that do: a link that translates frames into another protocol
    /// and drops PINGs (gRPC's HTTP/2, which has liveness of its own) returns false, or
    /// its silent but healthy connections would be declared dead.
    fn carries_ping(&self) -> bool {
        true
    }

    /// Whether the link carries BULK and BULK_REPLY frames (bulk transfer over the
    /// connection, [`crate::bulk`]). A link that translates frames into a protocol
    /// without them (gRPC's HTTP/2) returns false: a bulk operation on its connection
    /// then fails at once with `UNIMPLEMENTED`, instead of waiting, unanswered, for its
    /// deadline.
    fn carries_bulk(&self) -> bool {
        true
    }

    /// Whether the link carries a unary answer's trailers apart from its headers. On
    /// the framework's own wires a unary RESPONSE has one metadata block, the headers
    /// followed by the trailers (`docs/wire.md`). A link that translates into a
    /// protocol with trailers of their own (gRPC's HTTP/2) returns true: the server
    /// core then sends an OK unary answer that has trailers as a DATA frame without a
    /// message carrying the headers, followed by the RESPONSE, whose metadata are the
    /// trailers alone. The two go with one [`poll_ready`](Link::poll_ready): a link
    /// that returns true takes both `start_send`s after it.
    fn splits_trailers(&self) -> bool {
        false
    }

    /// One-sided access to the peer's memory, if the transport has it (RDMA): bulk
    /// transfers ([`crate::bulk`]) then use it instead of BULK frames.
    fn one_sided(&self) -> Option<std::sync::Arc<dyn crate::bulk::OneSided>> {
        None
    }
}

/// Opens links to one server: what a client [`Channel`](crate::client::Channel)
/// reconnects with.
pub trait Connector: Send + Sync + 'static {
    /// The link type.
    type Link: Link;

    /// Opens a new link.
    fn connect(
        &self,
        config: &LinkConfig,
    ) -> impl Future<Output = Result<Self::Link, Error>> + Send;

    /// Where this connector connects to (`tcp://127.0.0.1:4000`).
    fn target(&self) -> String;
}

/// Accepts links for a [`Server`](crate::server::Server).
pub trait Listener: Send + 'static {
    /// The link type.
    type Link: Link;

    /// Waits for the next incoming link.
    fn accept(
        &mut self,
        config: &LinkConfig,
    ) -> impl Future<Output = Result<Self::Link, Error>> + Send;

    /// The address this listener accepts on (`tcp://127.0.0.1:4000`).
    fn local_addr(&self) -> String;

    /// The server takes no more links from this listener (its graceful shutdown
    /// began), while the links already accepted finish. A listener that answers
    /// peers itself before they are accepted (UDP's association handshake) refuses
    /// new ones from now on, so that they fail at once instead of waiting for an
    /// answer that never comes. Default: nothing (a stream socket's peers are refused
    /// by the kernel once the listener is dropped).
    fn stop_accepting(&mut self) {}

    /// Whether the links this listener accepted depend on it (UDP: associations that
    /// share the listener's socket are routed by it). A server then keeps the
    /// listener, after [`stop_accepting`](Self::stop_accepting), until its connections
    /// are drained; otherwise it drops the listener as it stops accepting. Default:
    /// `false`.
    fn links_need_listener(&self) -> bool {
        false
    }
}

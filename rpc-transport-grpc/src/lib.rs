//! gRPC over HTTP/2 as one more wire: `grpc://host:port` (h2c, HTTP/2 with prior
//! knowledge) and, with the `tls` feature, `grpcs://host:port` (TLS, ALPN `h2`), built
//! on an HTTP/2 of its own (`http2`), which each link runs from the core's own
//! connection task rather than from a task of its own.
//!
//! It is a [`Link`](rpc_core::link::Link) like TCP's or UDP's: the server link turns
//! each incoming HTTP/2 stream into the core's REQUEST, DATA and CANCEL frames and
//! the core's DATA and RESPONSE frames into response headers, messages and trailers;
//! the client link does the reverse. So `Server`, `Channel`, generated clients and
//! servers, tower layers, deadlines, cancellation and call keys work over gRPC
//! unchanged, and any gRPC client (grpcio, grpc-go, grpcurl, tonic) calls our
//! servers, and our clients call any gRPC server. Compression maps onto the core's
//! (gzip, and zstd when built) through `grpc-encoding`. Keepalive is HTTP/2's own: the
//! client sends HTTP/2 PINGs when [`GrpcConfig::keepalive_interval`] is set (off by
//! default, as in gRPC), the server after
//! [`GrpcConfig::server_keepalive_interval`] without reading from the client (on by
//! default); the core's own PING frame is not carried over this wire.
//! `docs/grpc.md` has the mapping and what is not supported yet.
//!
//! # Layout
//!
//! - `codec`: the 5-byte message prefix, `grpc-timeout`,
//!   `grpc-message` percent-encoding, base64; sans-IO, unit-tested.
//! - `headers`: metadata and status ↔ HTTP/2 headers and trailers.
//! - `http2`: HTTP/2 (RFC 9113) of our own, sans-IO: `frame` (frames read, checked
//!   and written), `hpack` (RFC 7541: the encoder without Huffman, the decoder
//!   complete), `conn` (one connection's state: settings, streams, flow control both
//!   ways, header blocks joined and decoded, stream and connection errors), `fields`
//!   (the rules a decoded header block must keep); tested against the `h2` crate
//!   (`interop_tests`).
//! - `flood`: the server's bound on control frames (PING, SETTINGS, PRIORITY,
//!   WINDOW_UPDATE, RST_STREAM, GOAWAY, unknown types) without a call, fed by
//!   `http2::conn` with each frame header it reads.
//! - `keepalive`: HTTP/2 keepalive PINGs, the server's and the client's.
//! - `flow`: how the core's stream credit is counted on this wire (what a message
//!   costs), and the connection's bound on unfinished messages.
//! - `driver`: the byte stream a link runs its HTTP/2 over (TCP, or TLS over it).
//! - [`GrpcListener`] / [`GrpcServerLink`] and [`GrpcConnector`] / [`GrpcClientLink`]:
//!   each link owns its socket and runs its `http2::conn::Connection` from the core's
//!   connection task.
//! - [`GrpcConfig`]: HTTP/2 settings and limits, each with its default.
//!
//! # Example
//!
//! ```no_run
//! # async fn f() -> Result<(), rpc_core::Error> {
//! let listener = rpc_transport_grpc::bind("grpc://127.0.0.1:0").await?;
//! let addr = listener.local_addr_uri();
//! // Server::builder().add_service(..).build().serve(listener) in a task, then:
//! let channel = rpc_transport_grpc::connect(&addr).await?;
//! # drop(channel); Ok(()) }
//! ```

mod client;
mod codec;
mod config;
mod driver;
mod flood;
mod flow;
#[cfg(any(fuzzing, test))]
#[doc(hidden)]
pub mod fuzzing;
mod headers;
mod http2;
mod keepalive;
mod server;

use std::{fmt, str::FromStr};

use rpc_core::{
    client::Channel,
    endpoint::{Endpoint, Scheme},
    link::Listener,
    Error, ErrorKind,
};

pub use client::{GrpcClientLink, GrpcConnector};
pub use codec::PREFIX_LEN;
pub use config::{
    GrpcConfig, DEFAULT_CONNECTION_WINDOW, DEFAULT_CONTROL_FRAME_PERIOD, DEFAULT_HANDSHAKE_TIMEOUT,
    DEFAULT_KEEPALIVE_TIMEOUT, DEFAULT_MAX_CONCURRENT_STREAMS, DEFAULT_MAX_CONTROL_FRAMES,
    DEFAULT_MAX_FRAME_SIZE, DEFAULT_MAX_HEADER_LIST_SIZE, DEFAULT_MAX_LOCAL_ERROR_RESET_STREAMS,
    DEFAULT_MAX_PEER_RESETS, DEFAULT_PEER_RESET_PERIOD, DEFAULT_SERVER_KEEPALIVE_INTERVAL,
    DEFAULT_STREAM_WINDOW,
};
// h2's settings, kept so that code naming them compiles (with a warning).
#[allow(deprecated)]
pub use config::{
    DEFAULT_MAX_CONCURRENT_RESET_STREAMS, DEFAULT_MAX_PENDING_ACCEPT_RESET_STREAMS,
    DEFAULT_MAX_SEND_BUFFER_SIZE, DEFAULT_RESET_STREAM_DURATION,
};
pub use server::{GrpcListener, GrpcServerLink};

/// Whether this wire keeps metadata key `key` for HTTP/2 and gRPC themselves, and so
/// never sends it as a call's metadata: HTTP/2's connection headers, gRPC's protocol
/// headers (`grpc-status`, `grpc-message`, `grpc-status-details-bin`, `grpc-timeout`,
/// `grpc-encoding`, `grpc-accept-encoding`, `grpc-message-type`),
/// `grpc-previous-rpc-attempts` (the client writes it from a retried call's key) and
/// the framework's own keys. Other `grpc-` keys (`grpc-trace-bin`) are metadata.
///
/// ```
/// assert!(rpc_transport_grpc::is_reserved_header("grpc-timeout"));
/// assert!(!rpc_transport_grpc::is_reserved_header("grpc-trace-bin"));
/// ```
pub fn is_reserved_header(key: &str) -> bool {
    headers::is_reserved_for_writing(key)
}

/// Whether `authority` may be sent as HTTP/2's `:authority`: a URI authority without
/// user information (RFC 9113 §8.3.1): a host (a name, an IPv4 address or a bracketed
/// IPv6 address) and an optional port, in the characters RFC 3986 allows there.
/// [`GrpcConfig::authority`] takes no other.
///
/// ```
/// assert!(rpc_transport_grpc::is_valid_authority("api.example.com:443"));
/// assert!(rpc_transport_grpc::is_valid_authority("[::1]:50051"));
/// assert!(!rpc_transport_grpc::is_valid_authority("user@api.example.com"));
/// assert!(!rpc_transport_grpc::is_valid_authority("api.example.com/v1"));
/// assert!(!rpc_transport_grpc::is_valid_authority(""));
/// assert!(!rpc_transport_grpc::is_valid_authority("a:b:c"));
/// assert!(!rpc_transport_grpc::is_valid_authority("host:http"));
/// assert!(!rpc_transport_grpc::is_valid_authority("host:70000"));
/// assert!(!rpc_transport_grpc::is_valid_authority("%zz"));
/// ```
pub fn is_valid_authority(authority: &str) -> bool {
    // A bracketed IPv6 address (a zone after `%25` allowed), or a name or an IPv4
    // address (RFC 3986's reg-name: unreserved, percent-encoded and sub-delims).
    let (host_ok, port) = match authority.strip_prefix('[') {
        Some(rest) => {
            let Some((inside, after)) = rest.split_once(']') else {
                return false;
            };
            let ip = inside.contains(':')
                && inside
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b":.%-_~".contains(&b));
            (ip, after)
        }
        None => {
            let (host, port) = match authority.find(':') {
                Some(at) => authority.split_at(at),
                None => (authority, ""),
            };
            (is_reg_name(host), port)
        }
    };
    // An optional port: `:` and 1 to 5 digits, at most 65535.
    let port_ok = port.is_empty()
        || port
            .strip_prefix(':')
            .and_then(|digits| {
                (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
                    .then(|| digits.parse::<u16>().ok())
                    .flatten()
            })
            .is_some();
    host_ok && port_ok
}

/// RFC 3986's reg-name, not empty: unreserved characters, sub-delims and `%XX`.
fn is_reg_name(host: &str) -> bool {
    let bytes = host.as_bytes();
    let mut at = 0;
    while at < bytes.len() {
        let b = bytes[at];
        if b == b'%' {
            let hex = |i: usize| bytes.get(i).is_some_and(u8::is_ascii_hexdigit);
            if !(hex(at + 1) && hex(at + 2)) {
                return false;
            }
            at += 3;
        } else if b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=".contains(&b) {
            at += 1;
        } else {
            return false;
        }
    }
    !host.is_empty()
}

/// A `grpc://host:port` or `grpcs://host:port` address (the host: a name, an IPv4
/// address or a bracketed IPv6 address).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Address {
    host: String,
    port: u16,
    /// `grpcs://`: over TLS.
    pub(crate) secure: bool,
}

impl Address {
    /// `host:port`, as HTTP/2's `:authority` and for connecting and binding.
    pub fn authority(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// The host as written, without an IPv6 address's brackets: the name a server's
    /// certificate is checked against over TLS.
    pub fn host(&self) -> &str {
        self.host.trim_start_matches('[').trim_end_matches(']')
    }

    /// Whether it is a `grpcs://` address (TLS).
    pub fn is_secure(&self) -> bool {
        self.secure
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.secure { "grpcs" } else { "grpc" };
        write!(f, "{scheme}://{}:{}", self.host, self.port)
    }
}

impl TryFrom<&Endpoint> for Address {
    type Error = Error;

    fn try_from(endpoint: &Endpoint) -> Result<Address, Error> {
        match endpoint {
            Endpoint::Host {
                scheme: scheme @ (Scheme::Grpc | Scheme::Grpcs),
                host,
                port,
            } => Ok(Address {
                host: host.clone(),
                port: *port,
                secure: *scheme == Scheme::Grpcs,
            }),
            other => Err(Error::new(
                ErrorKind::InvalidAddress,
                format!("{other} is not a gRPC address (grpc://host:port or grpcs://host:port)"),
            )),
        }
    }
}

impl FromStr for Address {
    type Err = Error;

    fn from_str(uri: &str) -> Result<Address, Error> {
        Address::try_from(&uri.parse::<Endpoint>()?)
    }
}

/// Binds a gRPC listener to a `grpc://host:port` URI with the default settings
/// (`grpcs://` needs TLS settings: [`GrpcListener::bind_tls`]).
pub async fn bind(uri: &str) -> Result<GrpcListener, Error> {
    GrpcListener::bind(&uri.parse()?, GrpcConfig::default()).await
}

/// A channel to the gRPC server at `uri` (`grpc://host:port`, or with the `tls`
/// feature `grpcs://host:port` trusting the system's roots), with default settings.
/// The channel connects now.
pub async fn connect(uri: &str) -> Result<Channel, Error> {
    Channel::builder()
        .connect(GrpcConnector::from_uri(uri)?)
        .await
}

// `GrpcListener` is handed to `Server::serve` like any listener.
const _: fn() = || {
    fn is_listener<L: Listener>() {}
    is_listener::<GrpcListener>();
};

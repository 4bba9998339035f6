//! [`Peer`]: who is on the other end of a connection, as far as its transport can tell.
//!
//! A server hands every call the [`Peer`] of its connection
//! ([`Request::peer`](crate::Request::peer), `ServerCall::peer`), so that interceptors,
//! authorization layers and handlers can decide by who is calling:
//!
//! | transport | what the peer carries |
//! | --- | --- |
//! | TCP, UDP, RDMA | the remote socket address |
//! | Unix socket | the peer process's uid, gid and pid (`SO_PEERCRED`) |
//! | TLS (`tls://`, `tls+unix://`) | the above, plus the verified client certificate's subject alternative names |
//!
//! Only what the transport verified is here: a remote address is what the socket says
//! (spoofable on UDP), a certificate identity is present only when the certificate
//! was verified against the server's client-CA bundle (mTLS).

use std::{fmt, net::SocketAddr};

/// The other end of a connection.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Peer {
    description: String,
    addr: Option<SocketAddr>,
    unix: Option<UnixCredentials>,
    tls: Option<TlsIdentity>,
}

impl Peer {
    /// A peer known only by a description for logs (`tcp://127.0.0.1:4000`).
    pub fn new(description: impl Into<String>) -> Peer {
        Peer {
            description: description.into(),
            ..Peer::default()
        }
    }

    /// Sets the remote socket address.
    pub fn with_addr(mut self, addr: SocketAddr) -> Peer {
        self.addr = Some(addr);
        self
    }

    /// Sets the Unix-socket credentials of the peer process.
    pub fn with_unix_credentials(mut self, credentials: UnixCredentials) -> Peer {
        self.unix = Some(credentials);
        self
    }

    /// Sets the verified TLS identity.
    pub fn with_tls(mut self, identity: TlsIdentity) -> Peer {
        self.tls = Some(identity);
        self
    }

    /// A description for logs and errors (`tcp://127.0.0.1:4000`).
    pub fn description(&self) -> &str {
        &self.description
    }

    /// The wire, from the description's scheme: `tcp`, `tls`, `unix`, `udp`, `rdma`,
    /// `grpc`...; empty if the description has none.
    pub fn scheme(&self) -> &str {
        self.description
            .split_once("://")
            .map_or("", |(scheme, _)| scheme)
    }

    /// The remote socket address (TCP, UDP, RDMA; `None` on a Unix socket).
    pub fn addr(&self) -> Option<SocketAddr> {
        self.addr
    }

    /// The peer process's credentials, on a Unix socket.
    pub fn unix_credentials(&self) -> Option<&UnixCredentials> {
        self.unix.as_ref()
    }

    /// The connection's TLS identity: set on every TLS connection, with the verified
    /// certificate's names when the peer presented one (mTLS).
    pub fn tls(&self) -> Option<&TlsIdentity> {
        self.tls.as_ref()
    }

    /// Whether the peer presented a certificate, verified, whose subject alternative
    /// names include `name`: a URI (it has a `:`, which no DNS name has: a SPIFFE id
    /// such as `spiffe://example.org/web`, a `urn:`) among its URIs, compared exactly, or a DNS name
    /// among its DNS names, compared ASCII case-insensitively. The two kinds are not
    /// mixed: a DNS name spelled as a URI names nothing. A SPIFFE id matches only a
    /// certificate with one URI (an X.509-SVID has exactly one): one with several is
    /// no SVID, and holds none of their identities.
    pub fn has_identity(&self, name: &str) -> bool {
        self.tls.as_ref().is_some_and(|tls| {
            if name.contains(':') {
                (!name.starts_with("spiffe://") || tls.uris.len() == 1)
                    && tls.uris.iter().any(|u| u == name)
            } else {
                tls.dns_names.iter().any(|d| d.eq_ignore_ascii_case(name))
            }
        })
    }
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.description)
    }
}

/// A Unix-socket peer's process credentials, as the kernel reported them when the
/// connection was made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnixCredentials {
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
    /// Process id, where the platform gives it.
    pub pid: Option<i32>,
}

/// What a TLS handshake established about the peer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsIdentity {
    /// The TLS version (`"TLSv1.3"`).
    pub version: String,
    /// The ALPN protocol agreed on, if any.
    pub alpn: Option<String>,
    /// DNS names among the verified peer certificate's subject alternative names.
    pub dns_names: Vec<String>,
    /// URIs among them (SPIFFE ids, for instance).
    pub uris: Vec<String>,
    /// IP addresses among them.
    pub ip_addresses: Vec<std::net::IpAddr>,
    /// The verified peer certificate (DER), if the peer presented one; empty otherwise.
    pub certificate: Vec<u8>,
}

impl TlsIdentity {
    /// Whether the peer presented a (verified) certificate.
    pub fn authenticated(&self) -> bool {
        !self.certificate.is_empty()
    }
}

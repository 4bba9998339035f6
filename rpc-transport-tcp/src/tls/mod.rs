//! TLS over the stream transports (cargo feature `tls`): `tls://host:port` over TCP and
//! `tls+unix:///path` over a Unix socket.
//!
//! TLS is a stream wrapper, not a transport: inside the TLS session flows exactly the
//! length-prefixed byte stream of `tcp://`, so the core, streams, bulk transfers and
//! the duplicate cache are unchanged. What TLS adds rides up with the connection: the
//! client certificate's verified names reach every call as
//! [`Peer::tls`](rpc_core::Peer::tls).
//!
//! - TLS 1.3, and 1.2 for compatibility, with rustls and its `ring` provider
//!   (`TLS13_AES_128_GCM_SHA256` preferred). rustls runs the handshake and keeps the
//!   session (tickets, key updates); the records after it are sealed and opened by
//!   [`TlsStream`] with ring, in buffers of its own, using the traffic keys rustls
//!   hands over (its `kernel` API, made for kernel TLS): fewer copies and system
//!   calls than rustls's buffered connection (docs/performance.md, TLS).
//! - ALPN protocol id [`ALPN`] (`rpc/1`): a server refuses a client that offers other
//!   protocols only, and a client refuses a server that does not select `rpc/1`, so a
//!   TLS peer of another protocol (an HTTPS server, say) fails at the handshake.
//! - [`ServerTls`]: certificate chain and key from PEM; an optional client-CA bundle
//!   turns on mTLS (a client certificate is then required and verified); a handshake
//!   timeout; [`ServerTls::reload`] swaps certificate, key and CA without a restart
//!   (connections already open keep their session).
//! - [`ClientTls`]: the system's roots and any CA files, SNI and name verification
//!   from the URI's host (or [`ClientTlsBuilder::server_name`]), an optional client
//!   certificate.
//! - [`TlsListener`] and [`TlsConnector`]: the listener runs handshakes concurrently
//!   in tasks it owns, so a peer that stalls mid-handshake delays nobody and is cut
//!   off at the handshake timeout.
//!
//! Handshake failures are errors of kind [`ErrorKind::Tls`] whose message says why in
//! words a user can act on (unknown issuer, expired, name mismatch, a plain-text port);
//! calls over a channel that meets one fail with `UNAVAILABLE` carrying that message.
//!
//! ```no_run
//! # async fn f() -> Result<(), rpc_core::Error> {
//! use rpc_transport_tcp::tls::{ClientTls, ServerTls, TlsListener};
//!
//! let server_tls = ServerTls::builder()
//!     .cert_files("server.pem", "server.key")
//!     .client_ca_file("clients-ca.pem") // mTLS
//!     .build()?;
//! let listener = TlsListener::bind("tls://0.0.0.0:7443", server_tls.clone()).await?;
//! // Server::builder().add_service(..).serve(listener); on SIGHUP: server_tls.reload()?
//!
//! let client_tls = ClientTls::builder()
//!     .ca_file("ca.pem")
//!     .identity_files("client.pem", "client.key")
//!     .build()?;
//! let channel = rpc_transport_tcp::tls::connect("tls://db.internal:7443", &client_tls).await?;
//! # drop((listener, channel)); Ok(()) }
//! ```

mod anchors;
mod client;
#[cfg(any(fuzzing, test))]
pub mod fuzzing;
mod leaf;
mod record;
mod san;
mod server;
mod stream;
#[cfg(test)]
mod tests;

use std::{io, path::Path, sync::Arc, time::Duration};

use rpc_core::{peer::TlsIdentity, Error, ErrorKind};
use rustls::pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};

pub use client::{connect, connect_lazy, ClientTls, ClientTlsBuilder, TlsChannels, TlsConnector};
pub use server::{
    bind, ServerTls, ServerTlsBuilder, TlsAccepted, TlsListener, TlsStats, TlsStreamListener,
    MAX_PENDING_HANDSHAKES, MAX_PENDING_HANDSHAKES_PER_SOURCE,
};
pub use stream::TlsStream;

use crate::{Stream, StreamLink};

/// The ALPN protocol id of this framework's wire over TLS.
pub const ALPN: &[u8] = b"rpc/1";

/// The protocol inside a TLS connection, as its ALPN id names it. The same
/// [`ServerTls`] and [`ClientTls`] settings serve both; each listener or connector
/// offers exactly one, so a peer of the other is refused at the handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// This framework's wire ([`ALPN`], `rpc/1`): `tls://`, `tls+unix://`.
    Rpc,
    /// HTTP/2 (`h2`), for gRPC's wire: `grpcs://` (rpc-transport-grpc).
    H2,
}

impl Protocol {
    /// The ALPN protocol id.
    pub const fn alpn(self) -> &'static [u8] {
        match self {
            Protocol::Rpc => ALPN,
            Protocol::H2 => b"h2",
        }
    }

    /// The URI scheme of its TCP addresses (`tls`, `grpcs`).
    pub const fn scheme(self) -> &'static str {
        match self {
            Protocol::Rpc => "tls",
            Protocol::H2 => "grpcs",
        }
    }

    /// What it is, for error messages.
    fn what(self) -> &'static str {
        match self {
            Protocol::Rpc => "this framework's protocol (ALPN rpc/1)",
            Protocol::H2 => "HTTP/2 for gRPC (ALPN h2)",
        }
    }
}

/// Default time a TLS handshake may take, on either side, before the connection is
/// dropped: long enough for a slow network, short enough that a peer that opens a
/// connection and stalls holds nothing for long.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Most bytes of TLS records a connection seals ahead of the socket. A large frame is
/// sealed and written in pieces of this size: at 64 KiB (rustls's default), 16 MiB
/// echoes took a quarter more CPU (3.5 times as many writes) than at 256 KiB, the
/// link's own high-water mark of unsent bytes, which bounds it the same way: only
/// while a connection is writing, and only until the peer reads (docs/performance.md,
/// TLS).
const SEND_BUFFER_LIMIT: usize = 256 * 1024;

/// The link over TLS.
pub type TlsLink = StreamLink<TlsStream<Stream>>;

/// rustls's `ring` provider, with `TLS13_AES_128_GCM_SHA256` first among the cipher
/// suites (ring lists `TLS13_AES_256_GCM_SHA384` first; the others keep their order).
/// A client's first choice is what our servers pick, and this one costs about a tenth
/// less CPU per new connection here: its handshake hashes with SHA-256, which CPUs
/// with the SHA extensions compute in hardware, where SHA-384 runs in software; bulk
/// data costs the same (docs/performance.md, "TLS bulk (session 6)"). Both are TLS
/// 1.3's AES-GCM; 128-bit keys are the suite every TLS 1.3 peer must implement.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    let mut provider = rustls::crypto::ring::default_provider();
    provider
        .cipher_suites
        .sort_by_key(|suite| suite.suite() != rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
    Arc::new(provider)
}

fn tls_error(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::Tls, message.into())
}

/// Where PEM comes from: a file (re-read on reload) or bytes.
#[derive(Clone)]
enum Pem {
    File(std::path::PathBuf),
    Bytes(Arc<[u8]>),
}

/// A file's path, or only the size of PEM given as bytes: they may hold a private key,
/// and the settings that hold them (`ServerTls`, `ListenOptions`...) are `Debug`, which
/// a user's log line may print.
impl std::fmt::Debug for Pem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Pem::File(path) => f.debug_tuple("File").field(path).finish(),
            Pem::Bytes(bytes) => write!(f, "Bytes(<{} bytes of PEM, not shown>)", bytes.len()),
        }
    }
}

impl Pem {
    fn read(&self) -> Result<Arc<[u8]>, Error> {
        match self {
            Pem::Bytes(bytes) => Ok(bytes.clone()),
            Pem::File(path) => std::fs::read(path)
                .map(Arc::from)
                .map_err(|e| Error::io(format!("read {}", path.display()), e)),
        }
    }

    fn name(&self) -> String {
        match self {
            Pem::File(path) => path.display().to_string(),
            Pem::Bytes(_) => "PEM bytes".to_owned(),
        }
    }

    fn file(path: impl AsRef<Path>) -> Pem {
        Pem::File(path.as_ref().to_owned())
    }
}

/// A PEM reader's error in words: its markers and lines as text, not as the byte
/// values its `Display` prints (from a review: "missing section end marker: [80, 82,
/// 73, ...]" for a truncated key file).
fn pem_error(err: &rustls::pki_types::pem::Error) -> String {
    use rustls::pki_types::pem::Error as E;
    match err {
        // (The marker's label only, "PRIVATE KEY": the line is said whole.)
        E::MissingSectionEnd { end_marker } => format!(
            "no line \"-----END {}-----\" (is the file cut short?)",
            String::from_utf8_lossy(end_marker)
        ),
        E::IllegalSectionStart { line } => {
            format!("a malformed line {:?}", String::from_utf8_lossy(line))
        }
        other => other.to_string(),
    }
}

fn certificates(pem: &Pem) -> Result<Vec<CertificateDer<'static>>, Error> {
    let bytes = pem.read()?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            tls_error(format!(
                "{}: not PEM certificates: {}",
                pem.name(),
                pem_error(&e)
            ))
        })?;
    if certs.is_empty() {
        return Err(tls_error(format!(
            "{}: no certificate (expected -----BEGIN CERTIFICATE-----)",
            pem.name()
        )));
    }
    Ok(certs)
}

fn private_key(pem: &Pem) -> Result<PrivateKeyDer<'static>, Error> {
    let bytes = pem.read()?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| {
        tls_error(format!(
            "{}: no private key (PKCS#8, PKCS#1 or SEC1 PEM expected): {}",
            pem.name(),
            pem_error(&e)
        ))
    })
}

/// Trust anchors, and their certificates (for [`anchors::limits_of`]).
type Anchors = (rustls::RootCertStore, Vec<CertificateDer<'static>>);

/// The CAs of `pems` as trust anchors.
fn root_store(pems: &[Pem]) -> Result<Anchors, Error> {
    let mut roots = rustls::RootCertStore::empty();
    let mut anchors = Vec::new();
    for pem in pems {
        for (i, cert) in certificates(pem)?.into_iter().enumerate() {
            anchors.push(cert.clone());
            if let Some(why) = leaf::not_a_ca(&cert) {
                return Err(tls_error(format!(
                    "{}: certificate {} is not a CA's: {why}; as a CA to trust, its key \
                     could sign certificates for any name or identity (give the certificate \
                     of the CA that issued it)",
                    pem.name(),
                    i + 1
                )));
            }
            roots
                .add(cert)
                .map_err(|e| tls_error(format!("{}: not a usable CA: {e}", pem.name())))?;
        }
    }
    Ok((roots, anchors))
}

/// What the handshake established, for [`Peer::tls`](rpc_core::Peer::tls).
fn identity(conn: &rustls::CommonState) -> TlsIdentity {
    let mut identity = TlsIdentity {
        // "TLSv1.3", as `TlsIdentity::version` says (rustls's own names are
        // "TLSv1_3").
        version: match conn.protocol_version() {
            Some(rustls::ProtocolVersion::TLSv1_3) => "TLSv1.3",
            Some(rustls::ProtocolVersion::TLSv1_2) => "TLSv1.2",
            _ => "TLS",
        }
        .to_owned(),
        alpn: conn
            .alpn_protocol()
            .map(|p| String::from_utf8_lossy(p).into_owned()),
        ..TlsIdentity::default()
    };
    if let Some(leaf) = conn.peer_certificates().and_then(|chain| chain.first()) {
        let names = san::alt_names(leaf);
        identity.dns_names = names.dns;
        identity.uris = names.uris;
        identity.ip_addresses = names.ips;
        identity.certificate = leaf.to_vec();
    }
    identity
}

/// The rustls error inside an I/O error from a [`TlsStream`], if there is one.
fn rustls_error(err: &io::Error) -> Option<&rustls::Error> {
    let inner = err.get_ref()?;
    inner
        .downcast_ref::<rustls::Error>()
        .or_else(|| Some(&inner.downcast_ref::<PeerAlert>()?.error))
}

/// Whether a read's error from a [`TlsStream`] is the peer's bytes breaking TLS: a
/// record that fails authentication, too long, malformed or unexpected (the stream
/// answered it with its fatal alert). Not the peer's own alert, an end or a local
/// failure. A link over a [`TlsStream`] reports such an error as
/// [`ErrorKind::Protocol`], which the server counts and logs as a peer that broke its
/// transport's protocol.
pub fn peer_broke_tls(err: &io::Error) -> bool {
    err.kind() == io::ErrorKind::InvalidData
        && err
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
            .is_some_and(|e| !matches!(e, rustls::Error::General(_)))
}

/// A read's error from a [`TlsStream`] as a link reports it: [`ErrorKind::Protocol`],
/// "`context`: the peer broke TLS", when [`peer_broke_tls`]; otherwise an I/O error
/// ([`Error::io`]). `context` says what was read ("read from tls://...").
pub fn read_error(context: String, err: io::Error) -> Error {
    if peer_broke_tls(&err) {
        return Error::new(
            ErrorKind::Protocol,
            format!("{context}: the peer broke TLS"),
        )
        .with_source(err);
    }
    Error::io(context, err)
}

/// A fatal alert the peer sent once the handshake was over, said in words: in TLS 1.3
/// a server checks a client's certificate after the client's side of the handshake
/// is done, so its refusal reaches the client as an alert on the first read.
#[derive(Debug, Clone)]
pub(crate) struct PeerAlert {
    error: rustls::Error,
    message: String,
}

impl PeerAlert {
    /// The alert `alert` from the `side` (`"server"`, `"client"`); `sent_no_certificate`
    /// when this side is a client that had no certificate to send.
    pub(crate) fn new(
        alert: rustls::AlertDescription,
        side: &str,
        sent_no_certificate: bool,
    ) -> PeerAlert {
        // After the handshake (or at its very end, a TLS 1.3 server refusing our
        // certificate): an alert not described is no refusal of the handshake, and
        // its name is said once (a review saw "refused the handshake: TLS alert X
        // (TLS alert X)" for an alert long after it).
        let described = describe_alert(alert, side, None, sent_no_certificate);
        let message = if described.contains("TLS alert") {
            // Not described: no refusal of the handshake either.
            described.replace("refused the handshake", "ended the connection")
        } else if described.contains(&format!("({alert:?})")) {
            described
        } else {
            format!("{described} (TLS alert {alert:?})")
        };
        PeerAlert {
            message,
            error: rustls::Error::AlertReceived(alert),
        }
    }
}

impl std::fmt::Display for PeerAlert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for PeerAlert {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// What a fatal alert from the `side` means; `what` is the protocol for ALPN refusals;
/// `sent_no_certificate` when this side is a client that had none to send.
fn describe_alert(
    alert: rustls::AlertDescription,
    side: &str,
    what: Option<&str>,
    sent_no_certificate: bool,
) -> String {
    use rustls::AlertDescription as Alert;
    match alert {
        // Servers that want a certificate and got none do not all say
        // certificate_required: Go's (etcd's) says bad_certificate, which read as
        // "not signed by a CA the server trusts" (from a review).
        Alert::UnknownCA | Alert::BadCertificate | Alert::CertificateUnknown
            if sent_no_certificate =>
        {
            format!(
                "the {side} requires a client certificate (mTLS) and we have none \
                 ({alert:?}): configure one (the rpc CLI: --cert and --key)"
            )
        }
        Alert::NoApplicationProtocol => match what {
            Some(what) => format!("the {side} does not speak {what} over TLS (ALPN refused)"),
            None => format!("the {side} refused the application protocol (ALPN)"),
        },
        Alert::CertificateRequired => format!(
            "the {side} requires a client certificate (mTLS): configure one (the rpc CLI: \
             --cert and --key)"
        ),
        Alert::UnknownCA => format!(
            "the {side} refused our certificate ({alert:?}): it is not signed by a CA the \
             {side} trusts"
        ),
        // A certificate it cannot use: one not for this purpose (its extended key
        // usage), a CA's (from a review: read "ended the connection").
        Alert::CertificateUnknown | Alert::UnsupportedCertificate => format!(
            "the {side} refused our certificate ({alert:?}): it cannot use it (one not \
             for this purpose in its extended key usage, or a CA's certificate)"
        ),
        // Also what a client says of a certificate without the name it checked
        // (Python's ssl; from a review, which read "not signed by a CA").
        Alert::BadCertificate => format!(
            "the {side} refused our certificate ({alert:?}): it does not trust it (not \
             signed by a CA the {side} trusts, or not valid for the name it checked)"
        ),
        // One alert for both (RFC 8446 §6.2: "expired or is not currently valid"); a
        // certificate not valid yet was reported as expired (from a review).
        Alert::CertificateExpired => {
            format!("the {side} says our certificate has expired or is not valid yet")
        }
        other => format!("the {side} refused the handshake: TLS alert {other:?}"),
    }
}

/// Says why a handshake failed, in words a user can act on. `side` is the peer
/// (`"server"` for a client's handshake).
fn describe(err: &io::Error, peer: &str, side: &str, protocol: Protocol) -> String {
    let what = protocol.what();
    use rustls::{CertificateError as Cert, Error as E};
    // A certificate's validity bound, in words.
    let at = |t: &rustls::pki_types::UnixTime| {
        leaf::moment(i64::try_from(t.as_secs()).unwrap_or(i64::MAX))
    };
    let why = match rustls_error(err) {
        Some(E::InvalidCertificate(cert)) => match cert {
            // The option to name depends on which side is refusing: the client's CAs
            // (the CLI's --ca), or the server's client CAs (rpc-server's
            // --tls-client-ca; a server's log named the CLI's option, from a review).
            Cert::UnknownIssuer if side == "server" => "the server's certificate is not \
                trusted: unknown issuer (add its CA to the trusted CAs; the rpc CLI: --ca)"
                .to_owned(),
            Cert::UnknownIssuer => format!(
                "the {side}'s certificate is not trusted: unknown issuer (add its CA to \
                 the client CAs; rpc-server: --tls-client-ca)"
            ),
            Cert::ExpiredContext { not_after, .. } => format!(
                "the {side}'s certificate has expired (it was valid until {})",
                at(not_after)
            ),
            Cert::Expired => format!("the {side}'s certificate has expired"),
            Cert::NotValidYetContext { not_before, .. } => format!(
                "the {side}'s certificate is not valid yet (it is valid from {})",
                at(not_before)
            ),
            Cert::NotValidYet => format!("the {side}'s certificate is not valid yet"),
            // With rustls's own words, which name the certificate's names.
            Cert::NotValidForName | Cert::NotValidForNameContext { .. } => format!(
                "name mismatch: the {side}'s certificate is not valid for the name checked \
                 (the host connected to, or the TLS server name given for it; the rpc CLI: \
                 --server-name): {cert}"
            ),
            Cert::Revoked => format!("the {side}'s certificate is revoked"),
            // (Debug output before a review.)
            Cert::InvalidPurpose | Cert::InvalidPurposeContext { .. } => format!(
                "the {side}'s certificate is not for a TLS {side} (its extended key usage \
                 leaves out {})",
                if side == "server" {
                    "serverAuth"
                } else {
                    "clientAuth"
                }
            ),
            other if format!("{other:?}").contains("PathLenConstraintViolated") => format!(
                "the {side}'s certificate chain has more CA certificates below a CA than \
                 that CA allows (pathlen in its basic constraints)"
            ),
            // webpki's error, which rustls carries without naming it.
            other if format!("{other:?}").contains("CaUsedAsEndEntity") => format!(
                "the {side}'s certificate is a CA certificate (basic constraints CA:TRUE), \
                 which cannot be a peer's own certificate (`openssl req -x509` makes one \
                 by default): issue the {side} a certificate signed by that CA{}",
                // Only a client can skip the check of its server's certificate.
                if side == "server" {
                    ", or, for a test server, skip the check (the rpc CLI: --insecure)"
                } else {
                    ""
                }
            ),
            // Ours (a trusted CA's path length limit) or a verifier's own words.
            Cert::Other(other) => format!("the {side}'s certificate was refused: {other}"),
            other => format!("the {side}'s certificate was refused: {other:?}"),
        },
        Some(E::InvalidMessage(_)) | Some(E::InappropriateMessage { .. }) => format!(
            "the {side} did not answer with TLS: is it a plain-text port (tcp://, unix://)?"
        ),
        Some(E::AlertReceived(alert)) => describe_alert(*alert, side, Some(what), false),
        Some(E::NoCertificatesPresented) => {
            format!("the {side} presented no certificate, and one is required")
        }
        Some(E::NoApplicationProtocol) => {
            format!("the {side} does not speak {what} over TLS (no common ALPN protocol)")
        }
        Some(other) => format!("TLS handshake with the {side} failed: {other}"),
        // A TLS server of this framework also closes, before its first byte, a
        // connection from an address with too many handshakes running or waiting
        // already (a client behind one NAT with a thousand others; from a review).
        // (A reset when our ClientHello was still unread in its socket.)
        None if matches!(
            err.kind(),
            io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset
        ) && side == "server" =>
        {
            format!(
                "the server closed the connection during the TLS handshake: is it a \
                 plain-text port (tcp://, unix://)? (A TLS server of this framework also \
                 closes a connection from an address with {MAX_PENDING_HANDSHAKES} \
                 handshakes running or waiting already: try again in a moment.)"
            )
        }
        // A server's view of a client that went (a client refusing our certificate
        // without an alert, as grpcio's does, or a port probe); a plain-text port is a
        // client's question only (from a review).
        None if err.kind() == io::ErrorKind::UnexpectedEof => format!(
            "the {side} closed the connection before the TLS handshake ended (a {side} \
             that refused our certificate without an alert, one that gave up, or a port \
             probe)"
        ),
        None => format!("TLS handshake with the {side} failed: {err}"),
    };
    format!("{peer}: {why}")
}

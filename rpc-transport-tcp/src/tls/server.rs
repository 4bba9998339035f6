//! The server side: [`ServerTls`] settings (reloadable), the [`TlsStreamListener`]
//! that runs handshakes, and the [`TlsListener`] of this framework's wire on it.

use std::{
    net::SocketAddr,
    path::Path,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex, RwLock,
    },
    time::Duration,
};

use rpc_core::{
    endpoint::{Endpoint, Scheme},
    link::{LinkConfig, Listener},
    Error, Peer,
};
use tokio::task::JoinSet;

use super::{
    certificates, describe, private_key, provider, tls_error, Pem, Protocol, TlsLink, TlsStream,
};
use crate::{invalid, peer_of, Address, Stream, StreamLink, StreamListener};

/// Most handshakes one source (an IPv4 address, an IPv6 /64) has running or waiting
/// their turn at once; past it, a new connection from there is closed at once
/// ([`TlsStats::refused_busy_source`]).
pub const MAX_PENDING_HANDSHAKES: usize = 1024;

/// Most handshakes of one source running at once: its further connections wait for
/// their turn (within their handshake timeout), so that one host stalling its
/// handshakes delays only itself.
pub const MAX_PENDING_HANDSHAKES_PER_SOURCE: usize = MAX_PENDING_HANDSHAKES / 8;

/// Handshake tasks a listener holds at most, running or waiting, whatever their
/// source; past it the listener stops accepting until one ends, and new connections
/// wait in the kernel's backlog. Bounds the memory, tasks and descriptors that peers
/// who connect and stall can make the server hold; a few sources together can still
/// reach it (see docs/security.md).
const MAX_HANDSHAKE_TASKS: usize = 4 * MAX_PENDING_HANDSHAKES;

/// What a server's TLS listeners have seen, since the [`ServerTls`] was built.
#[derive(Debug, Default)]
pub struct TlsStats {
    /// Handshakes that completed.
    pub handshakes: AtomicU64,
    /// Handshakes that failed (a refused or absent certificate, a peer that does not
    /// speak TLS or not ALPN `rpc/1`).
    pub failed: AtomicU64,
    /// Handshakes cut off at the handshake timeout.
    pub timed_out: AtomicU64,
    /// Connections closed unanswered because their source had
    /// [`MAX_PENDING_HANDSHAKES`] handshakes running or waiting already.
    pub refused_busy_source: AtomicU64,
    /// Successful [`ServerTls::reload`]s.
    pub reloads: AtomicU64,
}

/// A server's TLS settings: certificate chain and key, and for mTLS the CAs that
/// client certificates must chain to. Cheap to clone; every clone shares the current
/// settings, so [`reload`](ServerTls::reload) on one is seen by every listener.
#[derive(Clone)]
pub struct ServerTls {
    inner: Arc<Inner>,
}

struct Inner {
    source: Mutex<Source>,
    current: RwLock<Configs>,
    /// Held for a whole reload: two at once could otherwise leave `source` with one's
    /// settings and `current` with the other's (a revoked client CA still trusted).
    reloading: Mutex<()>,
    handshake_timeout: Duration,
    stats: TlsStats,
}

/// The settings in use, one per protocol (they differ in ALPN only).
struct Configs {
    rpc: Arc<rustls::ServerConfig>,
    h2: Arc<rustls::ServerConfig>,
    /// The leaf certificate (DER) these serve, and the name of its source.
    leaf: Vec<u8>,
    name: String,
}

impl Configs {
    fn new(source: &Source) -> Result<Configs, Error> {
        let rpc = server_config(source, Protocol::Rpc)?;
        let mut h2 = rpc.clone();
        h2.alpn_protocols = vec![Protocol::H2.alpn().to_vec()];
        let leaf = certificates(&source.cert)?
            .first()
            .map(|der| der.to_vec())
            .unwrap_or_default();
        Ok(Configs {
            rpc: Arc::new(rpc),
            h2: Arc::new(h2),
            leaf,
            name: source.cert.name(),
        })
    }

    /// What is wrong with the leaf for a server now (see
    /// [`ServerTls::certificate_problem`]), if anything: read at each call, so that a
    /// certificate that expired since it was loaded says so.
    fn problem(&self) -> Option<String> {
        super::leaf::problem(&self.leaf, std::time::SystemTime::now())
            .map(|problem| format!("certificate {}: {problem}", self.name))
    }

    /// Logs a warning for a certificate put in use a little before its validity
    /// starts (within the clock skew `problem` allows for: from a review, one valid
    /// 4 minutes later was taken without a word, and every client refused it).
    fn warn_if_early(&self) {
        if let Some(early) = super::leaf::not_yet_valid(&self.leaf, std::time::SystemTime::now()) {
            tracing::warn!(certificate = %self.name, "TLS certificate in use: {early}");
        }
    }
}

#[derive(Clone, Debug)]
struct Source {
    cert: Pem,
    key: Pem,
    client_cas: Vec<Pem>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("source", &*self.inner.source.lock().expect("poisoned"))
            .field("handshake_timeout", &self.inner.handshake_timeout)
            .finish_non_exhaustive()
    }
}

impl ServerTls {
    /// Settings to build.
    pub fn builder() -> ServerTlsBuilder {
        ServerTlsBuilder::default()
    }

    /// Re-reads the certificate, key and client CAs from their files and uses them
    /// for every handshake from now on. Connections already open keep their session,
    /// and calls on them are undisturbed. On error the settings in use stay.
    pub fn reload(&self) -> Result<(), Error> {
        let _one_at_a_time = self.inner.reloading.lock().expect("poisoned");
        let source = self.inner.source.lock().expect("poisoned").clone();
        self.install(source)
    }

    /// Uses this certificate chain and key (PEM) from now on, keeping the client CAs:
    /// for certificates that come from somewhere other than files.
    pub fn reload_pem(&self, cert: impl AsRef<[u8]>, key: impl AsRef<[u8]>) -> Result<(), Error> {
        let _one_at_a_time = self.inner.reloading.lock().expect("poisoned");
        let mut source = self.inner.source.lock().expect("poisoned").clone();
        source.cert = Pem::Bytes(Arc::from(cert.as_ref()));
        source.key = Pem::Bytes(Arc::from(key.as_ref()));
        self.install(source)
    }

    /// Builds and puts in use the settings of `source`; the caller holds `reloading`.
    /// A certificate no client would take (expired, a CA's, not for servers) is an
    /// error: the settings in use stay, rather than every handshake failing from now on.
    fn install(&self, source: Source) -> Result<(), Error> {
        let config = Configs::new(&source)?;
        if let Some(problem) = config.problem() {
            return Err(tls_error(format!("{problem}; not put in use")));
        }
        config.warn_if_early();
        *self.inner.source.lock().expect("poisoned") = source;
        *self.inner.current.write().expect("poisoned") = config;
        self.inner.stats.reloads.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Why the certificate in use cannot serve TLS, if it cannot: out of its validity
    /// period, a CA's certificate, or an extended key usage without TLS servers (every
    /// client refuses such a server's handshake). [`build`](ServerTlsBuilder::build)
    /// takes such a certificate (with a warning in the log: tests and tools may want
    /// one), [`reload`](Self::reload) refuses it; a server that should not start with
    /// one checks here (`rpc-server` does).
    pub fn certificate_problem(&self) -> Option<String> {
        self.inner.current.read().expect("poisoned").problem()
    }

    /// When the certificate in use expires, if its validity can be read: for a
    /// warning or a metric before it does.
    pub fn certificate_expiry(&self) -> Option<std::time::SystemTime> {
        let seconds = super::leaf::not_after(&self.inner.current.read().expect("poisoned").leaf)?;
        std::time::UNIX_EPOCH.checked_add(Duration::from_secs(u64::try_from(seconds).ok()?))
    }

    /// Whether client certificates are required (mTLS).
    pub fn requires_client_certificates(&self) -> bool {
        !self
            .inner
            .source
            .lock()
            .expect("poisoned")
            .client_cas
            .is_empty()
    }

    /// Handshakes completed, failed, timed out; reloads.
    pub fn stats(&self) -> &TlsStats {
        &self.inner.stats
    }

    pub(super) fn config(&self, protocol: Protocol) -> Arc<rustls::ServerConfig> {
        let configs = self.inner.current.read().expect("poisoned");
        match protocol {
            Protocol::Rpc => configs.rpc.clone(),
            Protocol::H2 => configs.h2.clone(),
        }
    }
}

fn server_config(source: &Source, protocol: Protocol) -> Result<rustls::ServerConfig, Error> {
    let provider = provider();
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| tls_error(format!("TLS settings: {e}")))?;
    let builder = if source.client_cas.is_empty() {
        builder.with_no_client_auth()
    } else {
        let (roots, anchors) = super::root_store(&source.client_cas)?;
        let limits = super::anchors::limits_of(&anchors);
        let verifier =
            rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| tls_error(format!("client CAs: {e}")))?;
        match limits {
            // A client CA limits the CAs below it (pathlen), which webpki leaves out.
            Some(limits) => {
                builder.with_client_cert_verifier(Arc::new(super::anchors::ClientCerts {
                    inner: verifier,
                    limits,
                }))
            }
            None => builder.with_client_cert_verifier(verifier),
        }
    };
    let mut config = builder
        .with_single_cert(certificates(&source.cert)?, private_key(&source.key)?)
        .map_err(|e| {
            // rustls's words are a client's ("invalid peer certificate: BadEncoding"
            // for a corrupt file of our own; from a review).
            let why = match &e {
                rustls::Error::InvalidCertificate(cert) => {
                    format!("the certificate cannot be read or used ({cert:?})")
                }
                other => other.to_string(),
            };
            tls_error(format!(
                "certificate {} with key {}: {why}",
                source.cert.name(),
                source.key.name()
            ))
        })?;
    config.alpn_protocols = vec![protocol.alpn().to_vec()];
    if !source.client_cas.is_empty() {
        // No session resumption with client certificates: rustls restores a resumed
        // session's client chain without verifying it again (nor its expiry), and
        // issues new tickets with it at each resumption, so a client whose certificate
        // expired (or was replaced, the short-lived certificates docs/security.md
        // recommends instead of revocation) kept its identity by resuming (from a
        // review). Every mTLS connection verifies a certificate.
        config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
        config.send_tls13_tickets = 0;
    }
    // The record layer after the handshake is the stream's own (`TlsStream`).
    config.enable_secret_extraction = true;
    Ok(config)
}

/// Builds [`ServerTls`].
#[derive(Clone, Debug)]
pub struct ServerTlsBuilder {
    cert: Option<(Pem, Pem)>,
    client_cas: Vec<Pem>,
    handshake_timeout: Duration,
}

impl Default for ServerTlsBuilder {
    fn default() -> Self {
        ServerTlsBuilder {
            cert: None,
            client_cas: Vec::new(),
            handshake_timeout: super::DEFAULT_HANDSHAKE_TIMEOUT,
        }
    }
}

impl ServerTlsBuilder {
    /// The server's certificate chain (leaf first) and private key, as PEM files;
    /// re-read by [`ServerTls::reload`]. Required (or [`cert_pem`](Self::cert_pem)).
    pub fn cert_files(mut self, cert: impl AsRef<Path>, key: impl AsRef<Path>) -> Self {
        self.cert = Some((Pem::file(cert), Pem::file(key)));
        self
    }

    /// The server's certificate chain and private key as PEM bytes.
    pub fn cert_pem(mut self, cert: impl AsRef<[u8]>, key: impl AsRef<[u8]>) -> Self {
        self.cert = Some((
            Pem::Bytes(Arc::from(cert.as_ref())),
            Pem::Bytes(Arc::from(key.as_ref())),
        ));
        self
    }

    /// Requires client certificates that chain to the CAs in this PEM file (mTLS).
    /// Default: no client certificates asked for.
    pub fn client_ca_file(mut self, path: impl AsRef<Path>) -> Self {
        self.client_cas.push(Pem::file(path));
        self
    }

    /// Requires client certificates that chain to these PEM CAs (mTLS).
    pub fn client_ca_pem(mut self, pem: impl AsRef<[u8]>) -> Self {
        self.client_cas.push(Pem::Bytes(Arc::from(pem.as_ref())));
        self
    }

    /// How long a client may take to complete its handshake before it is cut off.
    /// Default: [`DEFAULT_HANDSHAKE_TIMEOUT`](super::DEFAULT_HANDSHAKE_TIMEOUT).
    pub fn handshake_timeout(mut self, timeout: Duration) -> Self {
        self.handshake_timeout = timeout;
        self
    }

    /// Reads the files and builds the settings.
    pub fn build(self) -> Result<ServerTls, Error> {
        let (cert, key) = self.cert.ok_or_else(|| {
            tls_error("a TLS server needs a certificate and key (cert_files or cert_pem)")
        })?;
        let source = Source {
            cert,
            key,
            client_cas: self.client_cas,
        };
        let configs = Configs::new(&source)?;
        if let Some(problem) = configs.problem() {
            tracing::warn!(%problem, "a TLS server certificate no client will take");
        }
        configs.warn_if_early();
        Ok(ServerTls {
            inner: Arc::new(Inner {
                source: Mutex::new(source),
                current: RwLock::new(configs),
                reloading: Mutex::new(()),
                handshake_timeout: self.handshake_timeout,
                stats: TlsStats::default(),
            }),
        })
    }
}

/// A connection whose TLS handshake completed.
#[derive(Debug)]
pub struct TlsAccepted {
    /// The TLS stream, ready for the protocol its ALPN named.
    pub stream: TlsStream<Stream>,
    /// Who the client is: its address (or Unix credentials) and, with mTLS, the
    /// verified names of its certificate.
    pub peer: Peer,
}

/// Accepts TLS connections on TCP or a Unix socket and runs their handshakes, for a
/// protocol on top: this framework's wire ([`TlsListener`]) or HTTP/2 (gRPC's
/// `grpcs://`, in rpc-transport-grpc). Handshakes run concurrently in tasks the
/// listener owns (stopped when it is dropped), at most
/// [`MAX_PENDING_HANDSHAKES_PER_SOURCE`] of one source at once and 4,096 in all, each
/// cut off at the handshake timeout; a failed handshake is logged at
/// DEBUG and counted in [`TlsStats`], and never stops the listener.
pub struct TlsStreamListener {
    listener: StreamListener,
    tls: ServerTls,
    protocol: Protocol,
    handshakes: JoinSet<Option<TlsAccepted>>,
    sources: crate::SourceSlots,
}

impl std::fmt::Debug for TlsStreamListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsStreamListener")
            .field("local", &self.local_addr_uri())
            .field("protocol", &self.protocol)
            .finish_non_exhaustive()
    }
}

impl TlsStreamListener {
    /// Binds `address` for connections of `protocol` (the ALPN id the server
    /// selects; a client that offers only others is refused).
    pub async fn bind(
        address: &Address,
        tls: ServerTls,
        protocol: Protocol,
    ) -> Result<TlsStreamListener, Error> {
        Ok(TlsStreamListener {
            listener: StreamListener::bind(address).await?,
            tls,
            protocol,
            handshakes: JoinSet::new(),
            sources: crate::SourceSlots::new(
                MAX_PENDING_HANDSHAKES_PER_SOURCE,
                MAX_PENDING_HANDSHAKES,
            ),
        })
    }

    /// The bound address as a URI of the protocol's scheme (`tls://127.0.0.1:41234`,
    /// `tls+unix:///run/app.sock`, `grpcs://127.0.0.1:41234`), ready for a client.
    pub fn local_addr_uri(&self) -> String {
        match self.listener.address() {
            Address::Tcp(addr) => format!("{}://{addr}", self.protocol.scheme()),
            Address::Unix(path) => format!("tls+unix://{}", path.display()),
        }
    }

    /// The settings, to [`reload`](ServerTls::reload) them.
    pub fn tls(&self) -> &ServerTls {
        &self.tls
    }

    /// TCP keepalive on the connections it accepts (see
    /// [`TcpKeepalive`](crate::TcpKeepalive); ignored on a Unix socket). Default: `None`
    /// (off).
    pub fn tcp_keepalive(mut self, keepalive: Option<crate::TcpKeepalive>) -> Self {
        self.listener = self.listener.tcp_keepalive(keepalive);
        self
    }

    /// The next connection whose handshake completed. Fails only if the socket
    /// cannot accept.
    pub async fn accept(&mut self) -> Result<TlsAccepted, Error> {
        loop {
            let room = self.handshakes.len() < MAX_HANDSHAKE_TASKS;
            tokio::select! {
                Some(done) = self.handshakes.join_next(), if !self.handshakes.is_empty() => {
                    if let Ok(Some(accepted)) = done {
                        return Ok(accepted);
                    }
                }
                accepted = self.listener.accept_stream(), if room => {
                    let (stream, addr) = accepted.map_err(|e| Error::io("accept", e))?;
                    let peer = match addr {
                        Some(addr) => format!("{}://{addr}", self.protocol.scheme()),
                        None => format!("{} (client)", self.local_addr_uri()),
                    };
                    // Over a Unix socket, the peer's user is its source.
                    let uid = match (&stream, addr) {
                        (crate::Stream::Unix(unix), None) => {
                            unix.peer_cred().ok().map(|cred| cred.uid())
                        }
                        _ => None,
                    };
                    let admitted = match uid {
                        Some(uid) => self.sources.admit_uid(uid),
                        None => self.sources.admit(addr),
                    };
                    let Some(slot) = admitted else {
                        tracing::debug!(%peer, "TLS connection closed: its source has \
                            {MAX_PENDING_HANDSHAKES} handshakes running or waiting");
                        self.tls.inner.stats.refused_busy_source.fetch_add(1, Ordering::Relaxed);
                        continue;
                    };
                    let (tls, protocol) = (self.tls.clone(), self.protocol);
                    self.handshakes.spawn(async move {
                        // The handshake timeout runs from here: waiting for the
                        // source's turn counts.
                        let started = tokio::time::Instant::now();
                        let timeout = tls.inner.handshake_timeout;
                        let Ok(_turn) = tokio::time::timeout(timeout, slot.turn()).await else {
                            tls.inner.stats.timed_out.fetch_add(1, Ordering::Relaxed);
                            tracing::debug!(%peer, "TLS handshake timed out waiting its turn");
                            return None;
                        };
                        let left = timeout.saturating_sub(started.elapsed());
                        handshake(stream, addr, peer, tls, protocol, left).await
                    });
                }
            }
        }
    }
}

/// Accepts TLS links of this framework's wire (ALPN `rpc/1`) on TCP or a Unix socket:
/// a [`TlsStreamListener`] whose streams carry the length-prefixed frames of `tcp://`.
pub struct TlsListener {
    inner: TlsStreamListener,
}

impl std::fmt::Debug for TlsListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsListener")
            .field("local", &self.local_addr_uri())
            .finish_non_exhaustive()
    }
}

impl TlsListener {
    /// Binds a `tls://host:port` or `tls+unix:///path` URI.
    pub async fn bind(uri: &str, tls: ServerTls) -> Result<TlsListener, Error> {
        let address = match uri.parse::<Endpoint>()? {
            Endpoint::Host {
                scheme: Scheme::Tls,
                host,
                port,
            } => Address::Tcp(format!("{host}:{port}")),
            Endpoint::TlsUnix(path) => Address::Unix(path),
            _ => return Err(invalid(uri, "not a TLS address (tls:// or tls+unix://)")),
        };
        Ok(TlsListener {
            inner: TlsStreamListener::bind(&address, tls, Protocol::Rpc).await?,
        })
    }

    /// The bound address as a URI (`tls://127.0.0.1:41234`), ready for a client.
    pub fn local_addr_uri(&self) -> String {
        self.inner.local_addr_uri()
    }

    /// The settings, to [`reload`](ServerTls::reload) them.
    pub fn tls(&self) -> &ServerTls {
        self.inner.tls()
    }

    /// TCP keepalive on the connections it accepts (see
    /// [`TcpKeepalive`](crate::TcpKeepalive); ignored on a Unix socket). Default: `None`
    /// (off).
    pub fn tcp_keepalive(mut self, keepalive: Option<crate::TcpKeepalive>) -> Self {
        self.inner = self.inner.tcp_keepalive(keepalive);
        self
    }
}

impl Listener for TlsListener {
    type Link = TlsLink;

    async fn accept(&mut self, config: &LinkConfig) -> Result<TlsLink, Error> {
        let TlsAccepted { stream, peer } = self.inner.accept().await?;
        let description = peer.description().to_owned();
        Ok(StreamLink::new(stream, description, config.max_frame_len)
            .with_peer_info(peer)
            .with_close_probe(|tls, cx| tls.get_ref().poll_peer_closed(cx)))
    }

    fn local_addr(&self) -> String {
        self.local_addr_uri()
    }
}

/// Runs a handshake for at most `timeout` (what is left of the handshake timeout).
async fn handshake(
    stream: Stream,
    addr: Option<SocketAddr>,
    description: String,
    tls: ServerTls,
    protocol: Protocol,
    timeout: Duration,
) -> Option<TlsAccepted> {
    let peer = peer_of(&stream, addr, description.clone());
    let stats = &tls.inner.stats;
    let accept = async {
        let conn = rustls::server::UnbufferedServerConnection::new(tls.config(protocol))
            .map_err(super::record::tls_io)?;
        // A client that offers no ALPN at all is accepted (docs/wire.md §1.1): rustls
        // refuses only an offer with nothing in common with ours.
        super::stream::handshake(conn, stream, false).await
    };
    match tokio::time::timeout(timeout, accept).await {
        Err(_) => {
            stats.timed_out.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(peer = %description, "TLS handshake timed out");
            None
        }
        Ok(Err(err)) => {
            stats.failed.fetch_add(1, Ordering::Relaxed);
            let why = describe(&err, &description, "client", protocol);
            tracing::debug!(error = %why, "TLS handshake failed");
            None
        }
        Ok(Ok((stream, identity))) => {
            stats.handshakes.fetch_add(1, Ordering::Relaxed);
            let peer = peer.with_tls(identity);
            Some(TlsAccepted { stream, peer })
        }
    }
}

/// Binds a [`TlsListener`] to a `tls://` or `tls+unix://` URI.
pub async fn bind(uri: &str, tls: ServerTls) -> Result<TlsListener, Error> {
    TlsListener::bind(uri, tls).await
}

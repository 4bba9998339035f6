//! The client side: [`ClientTls`] settings and the [`TlsConnector`].

use std::{path::Path, sync::Arc, time::Duration};

use rpc_core::{
    client::Channel,
    endpoint::{Endpoint, Scheme},
    link::{Connector, LinkConfig},
    peer::TlsIdentity,
    Error, Peer,
};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};

use super::{
    certificates, describe, private_key, provider, tls_error, Pem, Protocol, TlsLink, TlsStream,
};
use crate::{invalid, Address, Stream, StreamLink, TcpKeepalive};

/// A client's TLS settings: whom it trusts and how it proves who it is. Cheap to
/// clone; build with [`ClientTls::builder`].
#[derive(Clone)]
pub struct ClientTls {
    config: Arc<rustls::ClientConfig>,
    /// The same with ALPN `h2`, for gRPC's wire.
    h2: Arc<rustls::ClientConfig>,
    server_name: Option<String>,
    handshake_timeout: Duration,
    /// `dangerous_accept_any_certificate`: the server's certificate was not verified,
    /// so its names are not reported as its identity.
    unverified: bool,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("server_name", &self.server_name)
            .field("handshake_timeout", &self.handshake_timeout)
            .finish_non_exhaustive()
    }
}

impl ClientTls {
    /// Settings to build: the system's roots, no client certificate.
    pub fn builder() -> ClientTlsBuilder {
        ClientTlsBuilder::default()
    }

    /// These settings, checking servers' certificates for `name` unless a server name
    /// was set already: what `dns+tls://NAME` discovery uses, since the replicas it
    /// finds are IP addresses whose certificates carry the service's name.
    pub fn default_server_name(&self, name: &str) -> ClientTls {
        let mut tls = self.clone();
        tls.server_name.get_or_insert_with(|| name.to_owned());
        tls
    }

    /// The name the server's certificate is checked against: the one set with
    /// [`ClientTlsBuilder::server_name`], else `host`.
    pub fn server_name_for<'a>(&'a self, host: &'a str) -> &'a str {
        self.server_name.as_deref().unwrap_or(host)
    }

    /// Runs the client's side of a TLS handshake over `io` for `protocol` (the only
    /// ALPN id offered; a server that selects none is refused), within the handshake
    /// timeout, checking the server's certificate for
    /// [`server_name_for(host)`](Self::server_name_for). `uri` names the server in
    /// errors, which say why in words a user can act on ([`ErrorKind::Tls`](rpc_core::ErrorKind::Tls)).
    /// For a wire of its own over TLS: gRPC's `grpcs://` in rpc-transport-grpc;
    /// [`TlsConnector`] uses it for this framework's.
    pub async fn handshake<IO>(
        &self,
        io: IO,
        host: &str,
        protocol: Protocol,
        uri: &str,
    ) -> Result<(TlsStream<IO>, TlsIdentity), Error>
    where
        IO: AsyncRead + AsyncWrite + Unpin,
    {
        let host = self.server_name_for(host);
        let name = ServerName::try_from(host.to_owned()).map_err(|_| {
            invalid(
                uri,
                &format!("{host:?} is not a DNS name or IP address to verify"),
            )
        })?;
        let config = match protocol {
            Protocol::Rpc => self.config.clone(),
            Protocol::H2 => self.h2.clone(),
        };
        let sent_no_certificate = !config.client_auth_cert_resolver.has_certs();
        let handshake = async {
            let conn = rustls::client::UnbufferedClientConnection::new(config, name)
                .map_err(super::record::tls_io)?;
            super::stream::handshake(conn, io, sent_no_certificate).await
        };
        let (tls, mut identity) =
            match tokio::time::timeout(self.handshake_timeout, handshake).await {
                Err(_) => {
                    return Err(tls_error(format!(
                        "{uri}: the TLS handshake did not finish in {:?}",
                        self.handshake_timeout
                    )))
                }
                // (Without rustls's error as the source: `describe` says what it says,
                // and the message showed its reason twice.)
                Ok(Err(err)) => return Err(tls_error(describe(&err, uri, "server", protocol))),
                Ok(Ok(tls)) => tls,
            };
        if identity.alpn.as_deref().map(str::as_bytes) != Some(protocol.alpn()) {
            return Err(tls_error(format!(
                "{uri}: the server did not agree to {}: it does not speak that protocol",
                protocol.what()
            )));
        }
        if self.unverified {
            // Nobody checked the certificate: its names are the server's claim only,
            // and `authenticated()` must not say otherwise.
            identity.dns_names.clear();
            identity.uris.clear();
            identity.ip_addresses.clear();
            identity.certificate.clear();
        }
        Ok((tls, identity))
    }

    /// The system's trusted roots and nothing else, made once per process: what
    /// `tls://` URIs use when no settings are given.
    pub fn system() -> Result<ClientTls, Error> {
        static SYSTEM: std::sync::OnceLock<Result<ClientTls, String>> = std::sync::OnceLock::new();
        SYSTEM
            .get_or_init(|| ClientTls::builder().build().map_err(|e| e.to_string()))
            .clone()
            .map_err(tls_error)
    }
}

/// Builds [`ClientTls`].
#[derive(Clone, Debug)]
pub struct ClientTlsBuilder {
    system_roots: bool,
    cas: Vec<Pem>,
    identity: Option<(Pem, Pem)>,
    server_name: Option<String>,
    handshake_timeout: Duration,
    accept_any_certificate: bool,
}

impl Default for ClientTlsBuilder {
    fn default() -> Self {
        ClientTlsBuilder {
            system_roots: true,
            cas: Vec::new(),
            identity: None,
            server_name: None,
            handshake_timeout: super::DEFAULT_HANDSHAKE_TIMEOUT,
            accept_any_certificate: false,
        }
    }
}

impl ClientTlsBuilder {
    /// Whether to trust the system's root certificates (read once from the platform's
    /// store). Default: true.
    pub fn system_roots(mut self, yes: bool) -> Self {
        self.system_roots = yes;
        self
    }

    /// Also trusts the CA certificates in this PEM file. Default: none.
    pub fn ca_file(mut self, path: impl AsRef<Path>) -> Self {
        self.cas.push(Pem::file(path));
        self
    }

    /// Also trusts these PEM CA certificates. Default: none.
    pub fn ca_pem(mut self, pem: impl AsRef<[u8]>) -> Self {
        self.cas.push(Pem::Bytes(Arc::from(pem.as_ref())));
        self
    }

    /// Presents this certificate chain and key (PEM files) to servers that ask for
    /// one (mTLS). Default: none.
    pub fn identity_files(mut self, cert: impl AsRef<Path>, key: impl AsRef<Path>) -> Self {
        self.identity = Some((Pem::file(cert), Pem::file(key)));
        self
    }

    /// Presents this certificate chain and key (PEM bytes). Default: none.
    pub fn identity_pem(mut self, cert: impl AsRef<[u8]>, key: impl AsRef<[u8]>) -> Self {
        self.identity = Some((
            Pem::Bytes(Arc::from(cert.as_ref())),
            Pem::Bytes(Arc::from(key.as_ref())),
        ));
        self
    }

    /// The name sent as SNI and checked against the server's certificate, instead of
    /// the URI's host: for servers reached by IP address whose certificate names a
    /// host, and for `tls+unix://`. Default: the URI's host; `localhost` for
    /// `tls+unix://`.
    pub fn server_name(mut self, name: impl Into<String>) -> Self {
        self.server_name = Some(name.into());
        self
    }

    /// **Dangerous**: accepts any certificate the server presents, without checking
    /// who signed it, its validity period or its names; the handshake's signatures are
    /// still checked (the server holds the key of the certificate it sent), and the
    /// traffic is encrypted, but anyone on the path can pose as the server. For
    /// testing against servers with self-signed certificates (the `rpc` CLI's
    /// `--insecure`), never in production. Default: false.
    pub fn dangerous_accept_any_certificate(mut self, yes: bool) -> Self {
        self.accept_any_certificate = yes;
        self
    }

    /// How long the handshake may take. Default: [`DEFAULT_HANDSHAKE_TIMEOUT`](super::DEFAULT_HANDSHAKE_TIMEOUT).
    pub fn handshake_timeout(mut self, timeout: Duration) -> Self {
        self.handshake_timeout = timeout;
        self
    }

    /// Reads the files and builds the settings.
    pub fn build(self) -> Result<ClientTls, Error> {
        let (mut roots, mut anchors) = super::root_store(&self.cas)?;
        if self.system_roots {
            // Unreadable entries of the system store are skipped, as browsers do.
            let native = rustls_native_certs::load_native_certs();
            anchors.extend(native.certs.iter().cloned());
            roots.add_parsable_certificates(native.certs);
        }
        let limits = super::anchors::limits_of(&anchors);
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_error(format!("TLS settings: {e}")))?;
        let builder = match limits {
            // A CA limits the CAs below it (pathlen), which webpki leaves out.
            Some(limits) => {
                let inner = rustls::client::WebPkiServerVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider(),
                )
                .build()
                .map_err(|e| tls_error(format!("CAs: {e}")))?;
                builder
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(super::anchors::ServerCerts {
                        inner,
                        limits,
                    }))
            }
            None => builder.with_root_certificates(roots),
        };
        let mut config = match &self.identity {
            Some((cert, key)) => builder
                .with_client_auth_cert(certificates(cert)?, private_key(key)?)
                .map_err(|e| {
                    tls_error(format!(
                        "client certificate {} with key {}: {e}",
                        cert.name(),
                        key.name()
                    ))
                })?,
            None => builder.with_no_client_auth(),
        };
        if self.accept_any_certificate {
            config
                .dangerous()
                .set_certificate_verifier(Arc::new(AcceptAnyCertificate(provider())));
        }
        config.alpn_protocols = vec![Protocol::Rpc.alpn().to_vec()];
        // The record layer after the handshake is the stream's own (`TlsStream`).
        config.enable_secret_extraction = true;
        let mut h2 = config.clone();
        h2.alpn_protocols = vec![Protocol::H2.alpn().to_vec()];
        Ok(ClientTls {
            config: Arc::new(config),
            h2: Arc::new(h2),
            server_name: self.server_name,
            handshake_timeout: self.handshake_timeout,
            unverified: self.accept_any_certificate,
        })
    }
}

/// The verifier of [`ClientTlsBuilder::dangerous_accept_any_certificate`]: any
/// certificate is taken as the server's, and only the handshake's signatures, made
/// with its key, are checked.
#[derive(Debug)]
struct AcceptAnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AcceptAnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Opens TLS links to one `tls://` or `tls+unix://` address.
#[derive(Clone, Debug)]
pub struct TlsConnector {
    address: Address,
    uri: String,
    /// The URI's host (`localhost` for `tls+unix://`), checked in the certificate
    /// unless the settings name another.
    host: String,
    tls: ClientTls,
    tcp_keepalive: Option<TcpKeepalive>,
}

impl TlsConnector {
    /// TCP keepalive on the connections it opens (see [`TcpKeepalive`]). Default:
    /// `None` (off).
    pub fn tcp_keepalive(mut self, keepalive: Option<TcpKeepalive>) -> Self {
        self.tcp_keepalive = keepalive;
        self
    }

    /// A connector for a `tls://` or `tls+unix://` URI with these settings.
    pub fn new(uri: &str, tls: ClientTls) -> Result<TlsConnector, Error> {
        TlsConnector::for_endpoint(&uri.parse()?, tls)
    }

    /// A connector for a parsed `tls://` or `tls+unix://` endpoint.
    pub fn for_endpoint(endpoint: &Endpoint, tls: ClientTls) -> Result<TlsConnector, Error> {
        let (address, host) = match endpoint {
            Endpoint::Host {
                scheme: Scheme::Tls,
                host,
                port,
            } => (
                Address::Tcp(format!("{host}:{port}")),
                host.trim_start_matches('[')
                    .trim_end_matches(']')
                    .to_owned(),
            ),
            Endpoint::TlsUnix(path) => (Address::Unix(path.clone()), "localhost".to_owned()),
            other => {
                return Err(invalid(
                    &other.to_string(),
                    "not a TLS address (use tls://host:port or tls+unix:///path)",
                ))
            }
        };
        let name = tls.server_name_for(&host);
        if ServerName::try_from(name).is_err() {
            return Err(invalid(
                &endpoint.to_string(),
                &format!("{name:?} is not a DNS name or IP address to verify"),
            ));
        }
        Ok(TlsConnector {
            address,
            uri: endpoint.to_string(),
            host,
            tls,
            tcp_keepalive: None,
        })
    }
}

impl Connector for TlsConnector {
    type Link = TlsLink;

    async fn connect(&self, config: &LinkConfig) -> Result<TlsLink, Error> {
        let stream = Stream::connect(&self.address)
            .await
            .map_err(|e| Error::io(format!("connect to {}", self.uri), e))?;
        if let Some(keepalive) = &self.tcp_keepalive {
            stream
                .set_tcp_keepalive(keepalive)
                .map_err(|e| Error::io(format!("TCP keepalive on {}", self.uri), e))?;
        }
        let (tls, identity) = self
            .tls
            .handshake(stream, &self.host, Protocol::Rpc, &self.uri)
            .await?;
        let peer = Peer::new(self.uri.clone()).with_tls(identity);
        Ok(StreamLink::new(tls, self.uri.clone(), config.max_frame_len).with_peer_info(peer))
    }

    fn target(&self) -> String {
        self.uri.clone()
    }
}

/// Connects a [`Channel`] to a `tls://` or `tls+unix://` URI.
pub async fn connect(uri: &str, tls: &ClientTls) -> Result<Channel, Error> {
    Channel::builder()
        .connect(TlsConnector::new(uri, tls.clone())?)
        .await
}

/// A [`Channel`] to a `tls://` or `tls+unix://` URI that connects on its first call.
pub fn connect_lazy(uri: &str, tls: &ClientTls) -> Result<Channel, Error> {
    Ok(Channel::builder().connect_lazy(TlsConnector::new(uri, tls.clone())?))
}

/// Makes channels to `tls://` and `tls+unix://` replicas for a
/// [`Balanced`](rpc_core::balance::Balanced) client; each connects on its first call.
#[derive(Clone, Debug)]
pub struct TlsChannels {
    builder: rpc_core::client::ChannelBuilder,
    tls: ClientTls,
}

impl TlsChannels {
    /// Channels built with `builder`'s settings and `tls`.
    pub fn new(builder: rpc_core::client::ChannelBuilder, tls: ClientTls) -> Self {
        TlsChannels { builder, tls }
    }
}

impl rpc_core::balance::MakeChannel for TlsChannels {
    fn make_channel(&self, endpoint: &Endpoint) -> Result<Channel, Error> {
        let connector = TlsConnector::for_endpoint(endpoint, self.tls.clone())?;
        Ok(self.builder.clone().connect_lazy(connector))
    }
}

//! Certificate verifiers that apply the trust anchors' own path length limits on top of
//! webpki's checks ([`leaf::AnchorLimit`](super::leaf)): a server's of client
//! certificates (mTLS), a client's of server certificates. Everything else is the
//! inner verifier's.

use std::sync::Arc;

use rustls::{
    client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    pki_types::{CertificateDer, ServerName, UnixTime},
    server::danger::{ClientCertVerified, ClientCertVerifier},
    CertificateError, DigitallySignedStruct, DistinguishedName, OtherError, SignatureScheme,
};

use super::leaf::{anchor_limits, over_anchor_limit, AnchorLimit};

/// Why a chain breaks its anchor's limit, as the handshake's error.
#[derive(Debug)]
struct OverAnchorLimit(String);

impl std::fmt::Display for OverAnchorLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for OverAnchorLimit {}

/// The limits of `anchors` (DER certificates), `None` when none has one (the inner
/// verifier is then used as it is).
pub(super) fn limits_of(anchors: &[CertificateDer<'_>]) -> Option<Arc<[AnchorLimit]>> {
    let limits = anchor_limits(anchors.iter().map(|der| der.as_ref()));
    (!limits.is_empty()).then(|| limits.into())
}

fn check(
    limits: &[AnchorLimit],
    end_entity: &CertificateDer<'_>,
    intermediates: &[CertificateDer<'_>],
) -> Result<(), rustls::Error> {
    let intermediates: Vec<&[u8]> = intermediates.iter().map(|der| der.as_ref()).collect();
    match over_anchor_limit(limits, end_entity, &intermediates) {
        None => Ok(()),
        Some(why) => Err(rustls::Error::InvalidCertificate(CertificateError::Other(
            OtherError(Arc::new(OverAnchorLimit(why))),
        ))),
    }
}

/// A server's verifier of client certificates, with the anchors' limits.
#[derive(Debug)]
pub(super) struct ClientCerts {
    pub(super) inner: Arc<dyn ClientCertVerifier>,
    pub(super) limits: Arc<[AnchorLimit]>,
}

impl ClientCertVerifier for ClientCerts {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        check(&self.limits, end_entity, intermediates)?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// A client's verifier of server certificates, with the anchors' limits.
#[derive(Debug)]
pub(super) struct ServerCerts {
    pub(super) inner: Arc<dyn ServerCertVerifier>,
    pub(super) limits: Arc<[AnchorLimit]>,
}

impl ServerCertVerifier for ServerCerts {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let verified = self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        )?;
        check(&self.limits, end_entity, intermediates)?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

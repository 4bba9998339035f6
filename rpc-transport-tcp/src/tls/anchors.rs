//! Certificate verifiers that apply the trusted CAs' own path length limits (the
//! pathLenConstraint of their basic constraints) on top of rustls's checks: a
//! server's of client certificates (mTLS), a client's of server certificates.
//!
//! webpki, which rustls verifies chains with, applies each intermediate's limit but
//! not a trust anchor's own (RFC 5280 leaves it to the application; OpenSSL and Go
//! apply it): from a review, a client CA with `pathlen:0` that had issued a CA
//! certificate let that certificate's holder mint client identities. After rustls's
//! verifier accepts a chain, webpki builds it again with a check of the path it found
//! (`VerifiedPath`: signatures verified, the anchor it reached): a path through more
//! CA certificates below its anchor than the anchor allows is refused, and webpki goes
//! on to the other paths the certificates sent allow. So a certificate sent along
//! with a copied name (a decoy, signed by another key) cannot stand in for the real
//! issuer, and of two trusted CAs with one name, the one whose key signed counts.
//! Everything else is the inner verifier's.

use std::{cell::Cell, sync::Arc};

use rustls::{
    client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    crypto::WebPkiSupportedAlgorithms,
    pki_types::{CertificateDer, ServerName, TrustAnchor, UnixTime},
    server::danger::{ClientCertVerified, ClientCertVerifier},
    CertificateError, DigitallySignedStruct, DistinguishedName, OtherError, SignatureScheme,
};

/// The trusted CAs as webpki takes them, with their limits.
#[derive(Debug)]
pub(super) struct Limits {
    anchors: Vec<TrustAnchor<'static>>,
    /// Each anchor's limit, by index (`None`: no limit).
    path_lens: Vec<Option<u64>>,
    algorithms: WebPkiSupportedAlgorithms,
}

/// The limits of the trusted CAs `anchors` (DER certificates), `None` when none has
/// one (the inner verifier is then used as it is).
pub(super) fn limits_of(anchors: &[CertificateDer<'_>]) -> Option<Arc<Limits>> {
    let mut limits = Limits {
        anchors: Vec::new(),
        path_lens: Vec::new(),
        algorithms: super::provider().signature_verification_algorithms,
    };
    for der in anchors {
        // One webpki cannot read is no anchor of rustls's either.
        let Ok(anchor) = webpki::anchor_from_trusted_cert(der) else {
            continue;
        };
        limits.anchors.push(anchor.to_owned());
        limits.path_lens.push(super::leaf::path_len(der));
    }
    limits
        .path_lens
        .iter()
        .any(Option::is_some)
        .then(|| Arc::new(limits))
}

/// Why a chain breaks its anchor's limit, as the handshake's error. Its `Debug` is its
/// words too: rustls shows the cause of a certificate error in `Debug` form.
struct OverAnchorLimit(String);

impl std::fmt::Debug for OverAnchorLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::fmt::Display for OverAnchorLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for OverAnchorLimit {}

impl Limits {
    /// Whether the chain (already accepted by rustls's verifier) has a path to a
    /// trusted CA within that CA's limit, for `usage`.
    fn check(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
        usage: webpki::KeyUsage,
    ) -> Result<(), rustls::Error> {
        let refused = |why: String| {
            rustls::Error::InvalidCertificate(CertificateError::Other(OtherError(Arc::new(
                OverAnchorLimit(why),
            ))))
        };
        let cert = webpki::EndEntityCert::try_from(end_entity)
            .map_err(|e| refused(format!("cannot be read again: {e}")))?;
        // The last path refused for its anchor's limit: what the refusal says.
        let over: Cell<Option<(u64, u64)>> = Cell::new(None);
        let within_limit = |path: &webpki::VerifiedPath<'_>| -> Result<(), webpki::Error> {
            let anchor = path.anchor();
            let limit = self
                .anchors
                .iter()
                .zip(&self.path_lens)
                .find(|(a, _)| {
                    a.subject == anchor.subject
                        && a.subject_public_key_info == anchor.subject_public_key_info
                })
                .and_then(|(_, limit)| *limit);
            let Some(limit) = limit else {
                return Ok(());
            };
            // Self-issued certificates (a CA's key rollover) do not count (RFC 5280
            // 6.1.4 (l)).
            let below = path
                .intermediate_certificates()
                .filter(|c| c.subject() != c.issuer())
                .count() as u64;
            if below > limit {
                over.set(Some((below, limit)));
                return Err(webpki::Error::PathLenConstraintViolated);
            }
            Ok(())
        };
        match cert.verify_for_usage(
            self.algorithms.all,
            &self.anchors,
            intermediates,
            now,
            usage,
            None,
            Some(&within_limit),
        ) {
            Ok(_) => Ok(()),
            Err(err) => Err(refused(match over.get() {
                Some((below, limit)) => format!(
                    "{below} CA certificates below a trusted CA that allows {limit} \
                     (pathlen:{limit} in its basic constraints)"
                ),
                None => format!("no path to a trusted CA within its limits ({err})"),
            })),
        }
    }
}

/// A server's verifier of client certificates, with the anchors' limits.
#[derive(Debug)]
pub(super) struct ClientCerts {
    pub(super) inner: Arc<dyn ClientCertVerifier>,
    pub(super) limits: Arc<Limits>,
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
        self.limits.check(
            end_entity,
            intermediates,
            now,
            webpki::KeyUsage::client_auth(),
        )?;
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
    pub(super) limits: Arc<Limits>,
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
        self.limits.check(
            end_entity,
            intermediates,
            now,
            webpki::KeyUsage::server_auth(),
        )?;
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

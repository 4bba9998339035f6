//! The TLS record layer of a connection after its handshake: sealing and opening
//! application-data records in buffers the [`TlsStream`](super::TlsStream) owns, with
//! the traffic keys rustls derived (its `kernel` API, made for kTLS: rustls keeps the
//! session's secrets, session tickets and key updates, the record protection is ours).
//!
//! Only AEAD suites exist in rustls (AES-GCM and ChaCha20-Poly1305), for TLS 1.3
//! (RFC 8446 §5.2: nonce = IV ⊕ sequence number, the record header as additional data,
//! the real content type inside) and TLS 1.2 (RFC 5288 and RFC 7905: for AES-GCM an
//! 8-byte explicit nonce in each record, rustls's construction IV ⊕ sequence number;
//! the sequence number, type, version and length as additional data).

use std::io;

use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use rustls::ConnectionTrafficSecrets;

/// Bytes of a record header: content type, version, length.
pub(super) const HEADER_LEN: usize = 5;

/// Most plaintext bytes in one record (2^14).
pub(super) const MAX_FRAGMENT: usize = 16 * 1024;

/// Bytes of an AEAD tag (the same for every suite rustls offers).
const TAG_LEN: usize = 16;

/// Bytes of TLS 1.2 AES-GCM's explicit nonce.
const EXPLICIT_NONCE_LEN: usize = 8;

/// Record content types.
pub(super) const ALERT: u8 = 21;
pub(super) const HANDSHAKE: u8 = 22;
pub(super) const APPLICATION_DATA: u8 = 23;

/// Which record protection the connection negotiated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Version {
    /// TLS 1.3: the real content type is inside the encryption.
    Tls13,
    /// TLS 1.2 with AES-GCM: an explicit nonce in each record.
    Tls12Gcm,
    /// TLS 1.2 with ChaCha20-Poly1305: no explicit nonce.
    Tls12Chacha,
}

impl Version {
    /// Most bytes after the header of a record the peer may send.
    pub(super) fn max_ciphertext(self) -> usize {
        match self {
            Version::Tls13 => MAX_FRAGMENT + 256,
            Version::Tls12Gcm | Version::Tls12Chacha => MAX_FRAGMENT + 2048,
        }
    }

    /// Most plaintext bytes (TLS 1.3: content and padding, without the type) that fit
    /// in a record of [`max_ciphertext`](Self::max_ciphertext) bytes (the fuzz target's).
    #[cfg(any(fuzzing, test))]
    pub(super) fn max_plaintext(self) -> usize {
        self.max_ciphertext() + HEADER_LEN - self.overhead()
    }

    /// Bytes a record adds to its plaintext, header included.
    pub(super) fn overhead(self) -> usize {
        HEADER_LEN
            + TAG_LEN
            + match self {
                Version::Tls13 => 1,
                Version::Tls12Gcm => EXPLICIT_NONCE_LEN,
                Version::Tls12Chacha => 0,
            }
    }
}

/// One direction's key, IV and sequence number.
pub(super) struct Keys {
    key: LessSafeKey,
    iv: [u8; aead::NONCE_LEN],
    /// The sequence number of the next record.
    pub(super) seq: u64,
}

impl Keys {
    /// The keys of one direction as rustls extracted them.
    pub(super) fn new(seq: u64, secrets: ConnectionTrafficSecrets) -> io::Result<Keys> {
        let (algorithm, key, iv) = match &secrets {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv } => (&aead::AES_128_GCM, key, iv),
            ConnectionTrafficSecrets::Aes256Gcm { key, iv } => (&aead::AES_256_GCM, key, iv),
            ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => {
                (&aead::CHACHA20_POLY1305, key, iv)
            }
            _ => return Err(unsupported()),
        };
        let key = UnboundKey::new(algorithm, key.as_ref()).map_err(|_| unsupported())?;
        Ok(Keys {
            key: LessSafeKey::new(key),
            iv: iv.as_ref().try_into().map_err(|_| unsupported())?,
            seq,
        })
    }

    /// The nonce of the next record: IV ⊕ sequence number.
    fn nonce(&self) -> [u8; aead::NONCE_LEN] {
        let mut nonce = self.iv;
        for (n, s) in nonce[4..].iter_mut().zip(self.seq.to_be_bytes()) {
            *n ^= s;
        }
        nonce
    }

    /// Appends one record of content type `typ` to `out`: the plaintext is the
    /// concatenation of `parts` (at most [`MAX_FRAGMENT`] bytes), copied once into
    /// `out` and sealed there.
    pub(super) fn seal(&mut self, version: Version, typ: u8, parts: &[&[u8]], out: &mut Vec<u8>) {
        debug_assert!(parts.iter().map(|p| p.len()).sum::<usize>() <= MAX_FRAGMENT);
        self.seal_any(version, typ, parts, out);
    }

    /// A peer's record of up to [`max_plaintext`](Version::max_plaintext) bytes (the
    /// fuzz target's: past 2^14 for the receiver's `record_overflow` checks).
    #[cfg(any(fuzzing, test))]
    pub(super) fn seal_oversized(
        &mut self,
        version: Version,
        typ: u8,
        parts: &[&[u8]],
        out: &mut Vec<u8>,
    ) {
        assert!(parts.iter().map(|p| p.len()).sum::<usize>() <= version.max_plaintext());
        self.seal_any(version, typ, parts, out);
    }

    /// [`seal`](Self::seal) without its bound (inlined there: the same code).
    #[inline(always)]
    fn seal_any(&mut self, version: Version, typ: u8, parts: &[&[u8]], out: &mut Vec<u8>) {
        let plain_len: usize = parts.iter().map(|p| p.len()).sum();
        let nonce = self.nonce();
        let start = out.len();
        let body_len = plain_len + version.overhead() - HEADER_LEN;
        out.reserve(HEADER_LEN + body_len);
        let outer = if version == Version::Tls13 {
            APPLICATION_DATA
        } else {
            typ
        };
        out.push(outer);
        out.extend_from_slice(&[3, 3]);
        out.extend_from_slice(&(body_len as u16).to_be_bytes());
        if version == Version::Tls12Gcm {
            out.extend_from_slice(&nonce[4..]);
        }
        let sealed_from = out.len();
        for part in parts {
            out.extend_from_slice(part);
        }
        let mut aad = [0u8; 13];
        let aad = match version {
            Version::Tls13 => {
                out.push(typ);
                aad[..HEADER_LEN].copy_from_slice(&out[start..start + HEADER_LEN]);
                &aad[..HEADER_LEN]
            }
            Version::Tls12Gcm | Version::Tls12Chacha => {
                aad = tls12_aad(self.seq, typ, [3, 3], plain_len);
                &aad[..]
            }
        };
        let aad = Aad::from(aad);
        let tag = self
            .key
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                aad,
                &mut out[sealed_from..],
            )
            .expect("a record is far below the AEAD's length limit");
        out.extend_from_slice(tag.as_ref());
        self.seq += 1;
    }

    /// Opens the record `record` (header included) in place. Returns its content type
    /// and the range of its plaintext within `record`.
    pub(super) fn open(
        &mut self,
        version: Version,
        record: &mut [u8],
    ) -> io::Result<(u8, std::ops::Range<usize>)> {
        let header: [u8; HEADER_LEN] = record[..HEADER_LEN].try_into().expect("a header");
        let body = &mut record[HEADER_LEN..];
        let nonce = self.nonce();
        let plain_len = match version {
            Version::Tls13 => {
                if header[0] != APPLICATION_DATA {
                    return Err(tls_io(rustls::Error::InvalidMessage(
                        rustls::InvalidMessage::InvalidContentType,
                    )));
                }
                self.key
                    .open_in_place(Nonce::assume_unique_for_key(nonce), Aad::from(header), body)
                    .map_err(|_| tls_io(rustls::Error::DecryptError))?
                    .len()
            }
            Version::Tls12Gcm => {
                if body.len() < EXPLICIT_NONCE_LEN + TAG_LEN {
                    return Err(tls_io(rustls::Error::DecryptError));
                }
                let mut nonce = nonce;
                nonce[4..].copy_from_slice(&body[..EXPLICIT_NONCE_LEN]);
                let aad = tls12_aad(
                    self.seq,
                    header[0],
                    [header[1], header[2]],
                    body.len() - EXPLICIT_NONCE_LEN - TAG_LEN,
                );
                self.key
                    .open_within(
                        Nonce::assume_unique_for_key(nonce),
                        Aad::from(aad),
                        body,
                        EXPLICIT_NONCE_LEN..,
                    )
                    .map_err(|_| tls_io(rustls::Error::DecryptError))?
                    .len()
            }
            Version::Tls12Chacha => {
                if body.len() < TAG_LEN {
                    return Err(tls_io(rustls::Error::DecryptError));
                }
                let aad = tls12_aad(
                    self.seq,
                    header[0],
                    [header[1], header[2]],
                    body.len() - TAG_LEN,
                );
                self.key
                    .open_in_place(Nonce::assume_unique_for_key(nonce), Aad::from(aad), body)
                    .map_err(|_| tls_io(rustls::Error::DecryptError))?
                    .len()
            }
        };
        self.seq += 1;
        let (typ, plain_len) = match version {
            Version::Tls13 => {
                // Content, type and padding together are at most 2^14 + 1 bytes.
                if plain_len > MAX_FRAGMENT + 1 {
                    return Err(tls_io(rustls::Error::PeerSentOversizedRecord));
                }
                // The real type is the last non-zero byte; zeros after it are padding.
                let plain = &body[..plain_len];
                match plain.iter().rposition(|&b| b != 0) {
                    Some(at) => (plain[at], at),
                    None => {
                        return Err(tls_io(rustls::Error::PeerMisbehaved(
                            rustls::PeerMisbehaved::IllegalTlsInnerPlaintext,
                        )))
                    }
                }
            }
            Version::Tls12Gcm | Version::Tls12Chacha => (header[0], plain_len),
        };
        if plain_len > MAX_FRAGMENT {
            return Err(tls_io(rustls::Error::PeerSentOversizedRecord));
        }
        Ok((typ, HEADER_LEN..HEADER_LEN + plain_len))
    }
}

/// TLS 1.2's additional data: sequence number, type, version (the record header's:
/// received, authenticated as received, RFC 5246 §6.2.3.3), plaintext length.
fn tls12_aad(seq: u64, typ: u8, version: [u8; 2], len: usize) -> [u8; 13] {
    let mut aad = [0; 13];
    aad[..8].copy_from_slice(&seq.to_be_bytes());
    aad[8] = typ;
    aad[9..11].copy_from_slice(&version);
    aad[11..].copy_from_slice(&(len as u16).to_be_bytes());
    aad
}

/// A rustls error as an I/O error, as tokio-rustls reported them: what
/// [`describe`](super::describe) and the links' messages look into.
pub(super) fn tls_io(err: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, err)
}

fn unsupported() -> io::Error {
    tls_io(rustls::Error::General(
        "the negotiated cipher suite has no record protection here".into(),
    ))
}

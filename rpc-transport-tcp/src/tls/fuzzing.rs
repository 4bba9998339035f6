//! The fuzz target of the TLS record layer (`fuzz/fuzz_targets/tls_records.rs`): a
//! [`TlsStream`] after a handshake it never made, with traffic keys fixed here, reading
//! what a peer sends. Compiled only with `--cfg fuzzing` (which `fuzz/run` sets) and in
//! tests; not part of the crate's API.
//!
//! The input picks the cipher and the side the stream plays (client or server: a
//! client takes session tickets and refuses renegotiation, a server refuses both), and
//! scripts the peer: records sealed with the right keys (so that the fuzzer reaches
//! what is checked after decryption: the inner content type, TLS 1.3's padding and a
//! plaintext with no type, plaintexts past 2^14, alerts, post-handshake messages, key
//! updates), raw bytes (headers and lengths of every kind, records that fail to open),
//! and key changes on the peer's side. The stream reads in pieces of the sizes the
//! input gives and writes between reads, to a peer that may stop taking writes (a
//! broken pipe or a reset after so many bytes: the stream then looks for the alert the
//! peer sent before closing), and that opens every record the stream sends.
//! [`records`] checks that it never panics, never yields more plaintext than was sealed
//! as application data, ends every script with a clean end or an error (never a
//! hang), fails every read after an error with the same kind, sends only records its
//! peer can open and nothing after a fatal alert (none for the peer's own), and keeps
//! its buffers within their bounds.

use std::{
    io,
    pin::Pin,
    task::{Context, Poll, Waker},
};

use rustls::{
    crypto::{
        cipher::{AeadKey, Iv},
        ring::cipher_suite,
    },
    ConnectionTrafficSecrets, ExtractedSecrets, SupportedCipherSuite,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::{
    record::{Keys, Version, ALERT, APPLICATION_DATA, HANDSHAKE, HEADER_LEN, MAX_FRAGMENT},
    stream::{Kernel, TlsStream, RX_LARGE},
    SEND_BUFFER_LIMIT,
};

/// Stands for rustls's connection after the handshake: the suite, the side, and each
/// direction's key epoch (a key update moves to the next one).
pub(crate) struct FuzzKernel {
    pub(crate) suite: SupportedCipherSuite,
    pub(crate) client: bool,
    tx_epoch: u8,
    rx_epoch: u8,
}

impl FuzzKernel {
    /// A client's session ticket (RFC 8446 §4.6.1: lifetime, age_add, nonce, ticket,
    /// extensions), checked for its layout as rustls reads it, and kept nowhere.
    pub(crate) fn new_session_ticket(&self, body: &[u8]) -> Result<(), rustls::Error> {
        let whole = body
            .get(8..)
            .and_then(|rest| vector(rest, 1))
            .and_then(|(_, rest)| vector(rest, 2))
            .filter(|(ticket, _)| !ticket.is_empty())
            .and_then(|(_, rest)| vector(rest, 2))
            .is_some_and(|(_, rest)| rest.is_empty());
        if whole {
            Ok(())
        } else {
            Err(rustls::Error::InvalidMessage(
                rustls::InvalidMessage::MessageTooShort,
            ))
        }
    }

    pub(crate) fn update_tx(&mut self) -> (u64, ConnectionTrafficSecrets) {
        self.tx_epoch = self.tx_epoch.wrapping_add(1);
        (0, secrets(self.suite, Side::Ours, self.tx_epoch))
    }

    pub(crate) fn update_rx(&mut self) -> (u64, ConnectionTrafficSecrets) {
        self.rx_epoch = self.rx_epoch.wrapping_add(1);
        (0, secrets(self.suite, Side::Peer, self.rx_epoch))
    }
}

#[derive(Clone, Copy)]
enum Side {
    Ours = 1,
    Peer = 2,
}

/// A vector with a length of `len_bytes` bytes at the front of `bytes`, and what
/// follows it.
fn vector(bytes: &[u8], len_bytes: usize) -> Option<(&[u8], &[u8])> {
    let (len, rest) = bytes.split_at_checked(len_bytes)?;
    let len = len.iter().fold(0, |n, &b| (n << 8) | usize::from(b));
    rest.split_at_checked(len)
}

/// The traffic keys of one side's sending direction at `epoch`: fixed bytes, as the
/// test needs no secrecy.
fn secrets(suite: SupportedCipherSuite, side: Side, epoch: u8) -> ConnectionTrafficSecrets {
    let key = AeadKey::from([side as u8 ^ epoch.wrapping_mul(16); 32]);
    let iv = Iv::new([epoch ^ 0x5a; 12]);
    if suite == cipher_suite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256 {
        ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv }
    } else {
        ConnectionTrafficSecrets::Aes256Gcm { key, iv }
    }
}

/// A peer that hands over `data` in pieces of the sizes given (cycled), a size of 0
/// making the reader wait once, and takes whatever is written, or with `fail` that
/// many bytes and then fails every write with that error; it opens what it takes.
struct Peer {
    data: Vec<u8>,
    at: usize,
    pieces: Vec<u16>,
    next: usize,
    waited: bool,
    written: usize,
    fail: Option<(usize, io::ErrorKind)>,
    received: Received,
}

/// The peer's reading side: opens every record the stream sends with the keys the
/// stream must be using (following its key updates), and keeps the last alert.
struct Received {
    suite: SupportedCipherSuite,
    version: Version,
    epoch: u8,
    keys: Keys,
    /// The start of a record not yet whole.
    partial: Vec<u8>,
    /// The last alert: level and description.
    alert: Option<[u8; 2]>,
    /// The stream sent a fatal alert: nothing may follow it.
    fatal: bool,
}

impl Received {
    fn new(suite: SupportedCipherSuite, version: Version) -> Received {
        Received {
            suite,
            version,
            epoch: 0,
            keys: Keys::new(0, secrets(suite, Side::Ours, 0)).expect("a supported suite"),
            partial: Vec::new(),
            alert: None,
            fatal: false,
        }
    }

    /// Bytes the stream wrote; panics unless they are records sealed as they must be.
    fn take(&mut self, bytes: &[u8]) {
        self.partial.extend_from_slice(bytes);
        let mut at = 0;
        while let Some(header) = self.partial.get(at..at + HEADER_LEN) {
            let end = at + HEADER_LEN + usize::from(u16::from_be_bytes([header[3], header[4]]));
            if end > self.partial.len() {
                break;
            }
            assert!(!self.fatal, "a record after the stream's fatal alert");
            let record = &mut self.partial[at..end];
            let (typ, plain) = self
                .keys
                .open(self.version, record)
                .expect("the stream sent a record its peer cannot open");
            let plain = &record[plain];
            match typ {
                APPLICATION_DATA => {}
                ALERT => {
                    let alert: [u8; 2] = plain.try_into().expect("one alert a record");
                    self.fatal = alert[0] == 2;
                    self.alert = Some(alert);
                }
                HANDSHAKE if self.version == Version::Tls13 => {
                    assert!(
                        matches!(plain, [24, 0, 0, 1, 0 | 1]),
                        "the stream sent the handshake message {plain:?}"
                    );
                    self.epoch = self.epoch.wrapping_add(1);
                    self.keys = Keys::new(0, secrets(self.suite, Side::Ours, self.epoch))
                        .expect("a supported suite");
                }
                _ => panic!("the stream sent a record of type {typ}"),
            }
            at = end;
        }
        self.partial.drain(..at);
    }
}

impl AsyncRead for Peer {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let piece = self.pieces.get(self.next).copied().unwrap_or(u16::MAX);
        self.next = (self.next + 1) % self.pieces.len().max(1);
        if piece == 0 && !self.waited {
            self.waited = true;
            return Poll::Pending;
        }
        self.waited = false;
        let n = usize::from(piece.max(1))
            .min(buf.remaining())
            .min(self.data.len() - self.at);
        let at = self.at;
        buf.put_slice(&self.data[at..at + n]);
        self.at += n;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Peer {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let n = match self.fail {
            Some((limit, kind)) if self.written >= limit => return Poll::Ready(Err(kind.into())),
            Some((limit, _)) => buf.len().min(limit - self.written),
            None => buf.len(),
        };
        self.received.take(&buf[..n]);
        self.written += n;
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// Reads bytes off the front of the input; zeros past its end.
struct Script<'a>(&'a [u8]);

impl Script<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }

    fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.u8(), self.u8()])
    }

    fn bytes(&mut self, n: usize) -> &[u8] {
        let (taken, rest) = self.0.split_at(n.min(self.0.len()));
        self.0 = rest;
        taken
    }
}

/// What a script came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// Plaintext bytes read.
    pub read: usize,
    /// Whether the stream ended cleanly (the peer's `close_notify`) rather than with
    /// an error.
    pub clean: bool,
    /// Bytes the stream wrote to the peer (sealed records).
    pub written: usize,
    /// Whether a write failed with the alert the peer had sent as its error.
    pub write_alerted: bool,
    /// The last alert the stream sent, level and description: a refusal's fatal
    /// alert, a renegotiation's refusal.
    pub alert: Option<[u8; 2]>,
}

/// A kernel after a handshake that negotiated `suite`, on the `client` side or the
/// server's, and the first keys.
fn kernel_and_keys(suite: SupportedCipherSuite, client: bool) -> (Kernel, ExtractedSecrets) {
    let kernel = Kernel::Fuzz(FuzzKernel {
        suite,
        client,
        tx_epoch: 0,
        rx_epoch: 0,
    });
    let keys = ExtractedSecrets {
        tx: (0, secrets(suite, Side::Ours, 0)),
        rx: (0, secrets(suite, Side::Peer, 0)),
    };
    (kernel, keys)
}

/// A TLS 1.3 stream over `io` as a handshake hands it over: its receive buffer `rbuf`,
/// holding `end` bytes read ahead (tests).
#[cfg(test)]
pub(crate) fn handed_over<IO>(io: IO, rbuf: Vec<u8>, end: usize) -> TlsStream<IO> {
    let (kernel, keys) = kernel_and_keys(cipher_suite::TLS13_AES_256_GCM_SHA384, false);
    TlsStream::new(io, kernel, keys, rbuf, end, Vec::new(), false).expect("a supported suite")
}

/// Runs one script (see the [module docs](self)); panics if the stream breaks a rule.
/// The script: a byte for the cipher (mod 3: TLS 1.3, TLS 1.2 AES-GCM, TLS 1.2
/// ChaCha20) and the side (3 to 5 mod 6: a client); a count of read sizes (mod 9) and
/// the sizes (2 bytes each, 0: the read waits once); then the steps, each a byte (mod
/// 6) and what it takes (below).
pub fn records(data: &[u8]) -> Outcome {
    let mut script = Script(data);
    // The cipher, and the side: a server for 0 to 2, a client for 3 to 5, and so on.
    let first = script.u8();
    let client = first / 3 % 2 == 1;
    let (suite, version) = match first % 3 {
        0 => (cipher_suite::TLS13_AES_256_GCM_SHA384, Version::Tls13),
        1 => (
            cipher_suite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
            Version::Tls12Gcm,
        ),
        _ => (
            cipher_suite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
            Version::Tls12Chacha,
        ),
    };
    let pieces: Vec<u16> = (0..script.u8() % 9).map(|_| script.u16()).collect();

    // The peer's side: what it sends, sealed with its keys as it goes.
    let mut peer_epoch = 0u8;
    let mut peer = Keys::new(0, secrets(suite, Side::Peer, 0)).expect("a supported suite");
    let mut wire = Vec::new();
    let mut sealed_data = 0usize;
    let mut writes = Vec::new();
    let mut fail = None;
    let most = version.max_plaintext();
    while !script.0.is_empty() && wire.len() < 1 << 20 {
        match script.u8() % 6 {
            // A record sealed with the peer's current key: type, then plaintext, up to
            // what the record's length allows (past 2^14: refused). Type 0 in TLS 1.3
            // makes the plaintext all of the inner plaintext: its trailing zeros are
            // padding and its last other byte the type (none: a record without one).
            0 | 1 => {
                let typ = match script.u8() {
                    n @ 0..=4 => [23, 21, 22, 20, 0][usize::from(n)],
                    n => n,
                };
                let len = usize::from(script.u16()) % (most + 1);
                let plain = script.bytes(len).to_vec();
                sealed_data += match (typ, version) {
                    (23, _) => plain.len(),
                    (0, Version::Tls13) => match plain.iter().rposition(|&b| b != 0) {
                        Some(at) if plain[at] == 23 => at,
                        _ => 0,
                    },
                    _ => 0,
                };
                peer.seal_oversized(version, typ, &[&plain], &mut wire);
            }
            // Raw bytes: headers and lengths of any kind, records that do not open.
            2 => {
                let len = usize::from(script.u8());
                wire.extend_from_slice(script.bytes(len));
            }
            // The peer moves to its next key (as after sending a key update).
            3 => {
                peer_epoch = peer_epoch.wrapping_add(1);
                peer = Keys::new(0, secrets(suite, Side::Peer, peer_epoch))
                    .expect("a supported suite");
            }
            // The stream writes this many bytes before its next read.
            4 => writes.push(usize::from(script.u16())),
            // The peer takes this many bytes more of writes, then fails them as a
            // closed connection does.
            _ => {
                let after = usize::from(script.u16());
                let kind = if script.u8() % 2 == 0 {
                    io::ErrorKind::BrokenPipe
                } else {
                    io::ErrorKind::ConnectionReset
                };
                fail = Some((after, kind));
            }
        }
    }

    let (kernel, keys) = kernel_and_keys(suite, client);
    let io = Peer {
        data: wire,
        at: 0,
        pieces,
        next: 0,
        waited: false,
        written: 0,
        fail,
        received: Received::new(suite, version),
    };
    let wire_len = io.data.len();
    let mut stream = TlsStream::new(io, kernel, keys, Vec::new(), 0, Vec::new(), false)
        .expect("a supported suite");
    let mut cx = Context::from_waker(Waker::noop());
    let mut out = vec![0u8; 4096];
    let mut read = 0usize;
    let mut waits = 0usize;
    let mut writes = writes.into_iter();
    let payload = vec![0xa5u8; usize::from(u16::MAX)];
    let mut write_alerted = false;
    let clean = loop {
        if let Some(n) = writes.next() {
            // Writing fails only if the stream has closed its sending side, or the
            // peer stops taking writes; then each write is flushed, so that it fails
            // between reads.
            let _ = Pin::new(&mut stream).poll_write(&mut cx, &payload[..n]);
            if fail.is_some() {
                let flushed = Pin::new(&mut stream).poll_flush(&mut cx);
                if let Poll::Ready(Err(err)) = flushed {
                    if err
                        .get_ref()
                        .is_some_and(|inner| inner.is::<super::PeerAlert>())
                    {
                        // The alert it found is the reader's error too.
                        write_alerted = true;
                        let mut buf = ReadBuf::new(&mut out);
                        let read = Pin::new(&mut stream).poll_read(&mut cx, &mut buf);
                        assert!(
                            matches!(&read, Poll::Ready(Err(e)) if e.kind() == err.kind()),
                            "read after the alert: {read:?}"
                        );
                        break false;
                    }
                }
            }
        }
        let mut buf = ReadBuf::new(&mut out);
        match Pin::new(&mut stream).poll_read(&mut cx, &mut buf) {
            Poll::Ready(Ok(())) if buf.filled().is_empty() => break true,
            Poll::Ready(Ok(())) => read += buf.filled().len(),
            Poll::Ready(Err(err)) => {
                // Broken for good: every later read fails too, with the same kind of
                // error (an UnexpectedEof, then InvalidData, was a review's finding).
                for _ in 0..2 {
                    let mut buf = ReadBuf::new(&mut out);
                    let again = Pin::new(&mut stream).poll_read(&mut cx, &mut buf);
                    assert!(
                        matches!(&again, Poll::Ready(Err(e)) if e.kind() == err.kind()),
                        "read after the error {err}: {again:?}"
                    );
                }
                // The peer's own fatal alert is not answered.
                if err
                    .get_ref()
                    .is_some_and(|inner| inner.is::<super::PeerAlert>())
                {
                    assert!(
                        !matches!(stream.get_ref().received.alert, Some([2, _])),
                        "the peer's fatal alert was answered"
                    );
                }
                break false;
            }
            Poll::Pending => {
                waits += 1;
                assert!(waits <= wire_len + 1, "reader stuck");
            }
        }
        assert!(read <= sealed_data, "more plaintext than was sent");
        // The receive buffer, and post-handshake messages (64 KiB, and the record
        // that took them past it); the send buffer, which writing fills to its limit
        // and a record more, and reading may add an alert to.
        let (received, unsent) = stream.buffered();
        assert!(
            received <= RX_LARGE + 64 * 1024 + MAX_FRAGMENT + 256,
            "receive buffers grew to {received}"
        );
        assert!(
            unsent <= 2 * (SEND_BUFFER_LIMIT + MAX_FRAGMENT + 256),
            "the send buffer grew to {unsent}"
        );
    };
    // What the stream sealed goes out (a peer that takes everything takes it).
    let flushed = Pin::new(&mut stream).poll_flush(&mut cx);
    if fail.is_some() {
        assert!(flushed.is_ready(), "flush waits");
    } else {
        assert!(matches!(flushed, Poll::Ready(Ok(()))), "flush: {flushed:?}");
    }
    let alert = stream.get_ref().received.alert;
    assert!(
        !(clean && matches!(alert, Some([2, _]))),
        "a fatal alert, and a clean end"
    );
    Outcome {
        read,
        clean,
        written: stream.get_ref().written,
        write_alerted,
        alert,
    }
}

/// The X.509 readers of certificates a peer sends (an mTLS client's subject
/// alternative names, which become its identity) or an operator gives (the leaf
/// checks of a server's own certificate: validity, CA, extended key usage; the
/// trust anchors' check that they are CAs, and their path length limits), on any
/// bytes (`fuzz/fuzz_targets/x509.rs`). Besides never panicking: a certificate found
/// expired has a readable end before now, and the names read are within the input.
pub fn certificate(der: &[u8]) {
    let now = std::time::SystemTime::now();
    let _ = super::leaf::not_a_ca(der);
    let problem = super::leaf::problem(der, now);
    let end = super::leaf::not_after(der);
    if problem
        .as_deref()
        .is_some_and(|p| p.starts_with("it expired"))
    {
        let end = end.expect("an expired certificate has a readable end");
        let now_s = now
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        assert!(end < i64::try_from(now_s).unwrap_or(i64::MAX), "{end}");
    }
    let names = super::san::alt_names(der);
    let bytes: usize = names.dns.iter().chain(&names.uris).map(String::len).sum();
    assert!(
        bytes <= der.len(),
        "{bytes} bytes of names from {}",
        der.len()
    );
    assert!(names.ips.len() <= der.len() / 4 + 1);
    // As a trusted CA: its path length limit.
    let _ = super::leaf::path_len(der);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A script: `version` (0: TLS 1.3, 1: 1.2 AES-GCM, 2: 1.2 ChaCha20, on a server's
    /// side; 3 to 5 the same on a client's), whole reads, one application-data record
    /// of `text`.
    fn one_record(version: u8, text: &[u8]) -> Vec<u8> {
        let mut s = vec![version, 0];
        s.extend_from_slice(&sealed(0, text));
        s
    }

    /// The script step that seals a record of type `typ` (0: application data, 1:
    /// alert, 2: handshake, 3: change_cipher_spec, 4: type 0) holding `plain`.
    fn sealed(typ: u8, plain: &[u8]) -> Vec<u8> {
        let mut s = vec![0, typ];
        s.extend_from_slice(&(plain.len() as u16).to_be_bytes());
        s.extend_from_slice(plain);
        s
    }

    /// `records`, as (plaintext read, clean end).
    fn run(script: &[u8]) -> (usize, bool) {
        let outcome = records(script);
        (outcome.read, outcome.clean)
    }

    /// `records`, as (plaintext read, clean end, the last alert the stream sent).
    fn run_alert(script: &[u8]) -> (usize, bool, Option<[u8; 2]>) {
        let outcome = records(script);
        (outcome.read, outcome.clean, outcome.alert)
    }

    /// Alerts (level, description) the stream sends.
    const UNEXPECTED_MESSAGE: Option<[u8; 2]> = Some([2, 10]);
    const RECORD_OVERFLOW: Option<[u8; 2]> = Some([2, 22]);
    const ILLEGAL_PARAMETER: Option<[u8; 2]> = Some([2, 47]);
    const DECODE_ERROR: Option<[u8; 2]> = Some([2, 50]);
    const NO_RENEGOTIATION: Option<[u8; 2]> = Some([1, 100]);

    #[test]
    fn sealed_records_are_read_and_rules_hold() {
        for version in 0..3 {
            // No close_notify: the data, then an error (the peer just closed).
            assert_eq!(run(&one_record(version, b"hello")), (5, false));
            // close_notify (an alert: warning, close_notify) ends it cleanly.
            let mut s = one_record(version, b"hello");
            s.extend_from_slice(&sealed(1, &[1, 0]));
            assert_eq!(run(&s), (5, true), "version {version}");
            // A fatal alert is an error, and is not answered.
            let mut s = one_record(version, b"hello");
            s.extend_from_slice(&sealed(1, &[2, 40]));
            assert_eq!(run(&s), (5, false));
            assert_eq!(records(&s).written, 0);
            // Garbage, then an oversized header: an error, nothing read.
            assert_eq!(run(&[version, 0, 2, 5, 23, 3, 3, 0xff, 0xff]), (0, false));
            // A record under a key the stream does not have: an error, answered with
            // one alert record (bad_record_mac) sealed under the stream's own key:
            // header, explicit nonce (TLS 1.2 AES-GCM), level and description, the
            // inner content type (TLS 1.3), tag.
            let mut s = vec![version, 0, 3];
            s.extend_from_slice(&sealed(0, b"hello"));
            assert_eq!(run(&s), (0, false));
            let alert_len = [5 + 2 + 1 + 16, 5 + 8 + 2 + 16, 5 + 2 + 16][usize::from(version)];
            assert_eq!(records(&s).written, alert_len, "version {version}");
            assert_eq!(records(&s).alert, Some([2, 20]), "bad_record_mac");
            // 32 empty records in a row are accepted, 33 are not.
            let mut s = vec![version, 0];
            for _ in 0..32 {
                s.extend_from_slice(&sealed(0, b""));
            }
            s.extend_from_slice(&sealed(0, b"x"));
            s.extend_from_slice(&sealed(1, &[1, 0]));
            assert_eq!(run(&s), (1, true));
            let mut s = vec![version, 0];
            for _ in 0..33 {
                s.extend_from_slice(&sealed(0, b""));
            }
            s.extend_from_slice(&sealed(0, b"x"));
            assert_eq!(run(&s), (0, false));
            // An alert is handled before it is counted: close_notify after 32 empty
            // records is a clean end, and a fatal alert there is not answered (both
            // were refused as the 33rd in a row, and the fatal one answered).
            let mut s = vec![version, 0];
            for _ in 0..32 {
                s.extend_from_slice(&sealed(0, b""));
            }
            let mut fatal = s.clone();
            s.extend_from_slice(&sealed(1, &[1, 0]));
            assert_eq!(run(&s), (0, true), "version {version}");
            fatal.extend_from_slice(&sealed(1, &[2, 40]));
            assert_eq!(records(&fatal).written, 0, "version {version}");
        }
        // TLS 1.2: the record header's version is authenticated (RFC 5246 §6.2.3.3):
        // a record whose header says 03 01 does not open (it did).
        for (version, suite, v) in [
            (
                1u8,
                cipher_suite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
                Version::Tls12Gcm,
            ),
            (
                2,
                cipher_suite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
                Version::Tls12Chacha,
            ),
        ] {
            let mut peer = Keys::new(0, secrets(suite, Side::Peer, 0)).unwrap();
            let mut wire = Vec::new();
            peer.seal(v, 23, &[b"hello"], &mut wire);
            let raw = |wire: &[u8]| {
                let mut s = vec![version, 0, 2, wire.len() as u8];
                s.extend_from_slice(wire);
                s
            };
            // (Raw bytes count as no sealed data: had it opened, `records` would
            // have found more plaintext read than sealed.)
            wire[2] = 1;
            assert_eq!(run(&raw(&wire)), (0, false), "version {version}");
        }
        // TLS 1.3: a key update that asks for one back (handshake type 24, length 1,
        // update_requested), the peer's next key, a write, data under the new key.
        let mut s = one_record(0, b"before");
        s.extend_from_slice(&sealed(2, &[24, 0, 0, 1, 1]));
        s.extend_from_slice(&[3, 4, 0, 100]);
        s.extend_from_slice(&sealed(0, b"after"));
        s.extend_from_slice(&sealed(1, &[1, 0]));
        assert_eq!(run(&s), (11, true));
        // TLS 1.2 has no key update: the same message is refused.
        let mut s = one_record(1, b"before");
        s.extend_from_slice(&sealed(2, &[24, 0, 0, 1, 1]));
        assert_eq!(run(&s), (6, false));
        // TLS 1.3: a warning alert other than close_notify and user_canceled is
        // fatal; user_canceled is not.
        let mut s = one_record(0, b"x");
        s.extend_from_slice(&sealed(1, &[1, 90]));
        s.extend_from_slice(&sealed(1, &[1, 0]));
        assert_eq!(run(&s), (1, true));
        let mut s = one_record(0, b"x");
        s.extend_from_slice(&sealed(1, &[1, 40]));
        assert_eq!(run(&s), (1, false));
        // TLS 1.2: such a warning is ignored.
        let mut s = one_record(1, b"x");
        s.extend_from_slice(&sealed(1, &[1, 40]));
        s.extend_from_slice(&sealed(1, &[1, 0]));
        assert_eq!(run(&s), (1, true));
        // user_canceled at the fatal level: fatal in TLS 1.2 (RFC 5246 §7.2), a
        // closure alert whatever its level in TLS 1.3.
        for (version, read) in [(1, (1, false)), (2, (1, false)), (0, (2, true))] {
            let mut s = one_record(version, b"x");
            s.extend_from_slice(&sealed(1, &[2, 90]));
            s.extend_from_slice(&sealed(0, b"y"));
            s.extend_from_slice(&sealed(1, &[1, 0]));
            assert_eq!(run(&s), read, "version {version}");
        }
        // Application data between the parts of a handshake message: refused.
        let mut s = one_record(0, b"x");
        s.extend_from_slice(&sealed(2, &[4, 0, 0]));
        s.extend_from_slice(&sealed(0, b"y"));
        assert_eq!(run(&s), (1, false));
        // TLS 1.3 padding only, no content type: refused, unexpected_message (RFC 8446
        // §5.4). (Type 0 in the script, 4: the script's 0 was application data, and
        // this sealed a record of type 200.)
        let mut s = one_record(0, b"x");
        s.extend_from_slice(&sealed(4, &[0; 3]));
        let outcome = records(&s);
        assert_eq!((outcome.read, outcome.clean), (1, false));
        assert_eq!(outcome.alert, Some([2, 10]));
        assert_eq!(run(&[]), (0, false));
        // Every prefix of a script, read one byte at a time, with a wait on the way.
        let mut s = vec![0, 2, 0, 1, 0, 0];
        s.extend_from_slice(&sealed(0, b"hello"));
        s.extend_from_slice(&sealed(1, &[1, 0]));
        for end in 0..s.len() {
            records(&s[..end]);
        }
        assert_eq!(run(&s), (5, true));
    }

    /// Writes that fill the send buffer while the receive buffer is at its largest
    /// are within the target's bounds (the bound counted both buffers together, and
    /// such inputs failed the fuzz run on correct behaviour).
    #[test]
    fn a_full_send_buffer_beside_a_full_receive_buffer_is_within_bounds() {
        let mut s = vec![
            0, 1, 0x27, 0x10, 4, 0xff, 0xff, 4, 0xff, 0xff, 0, 0, 0x40, 0,
        ];
        s.extend(std::iter::repeat_n(0x41, 16384));
        records(&s);
    }

    /// A write that fails as a closed connection's does, after the peer sent a fatal
    /// alert: the error is the alert, and the reader gets it too; with data before the
    /// alert, the data stays the reader's and the write fails plainly.
    #[test]
    fn a_failed_write_reports_the_alert_the_peer_sent() {
        for version in 0..3 {
            for kind in [0, 1] {
                // Whole reads; writes fail from the first byte; a fatal alert
                // (bad_certificate); a write of 100 bytes.
                let mut s = vec![version, 0, 5, 0, 0, kind];
                s.extend_from_slice(&sealed(1, &[2, 42]));
                s.extend_from_slice(&[4, 0, 100]);
                let outcome = records(&s);
                assert!(outcome.write_alerted, "version {version}, kind {kind}");
                assert_eq!(
                    (outcome.read, outcome.clean, outcome.written),
                    (0, false, 0)
                );
                let mut s = vec![version, 0, 5, 0, 0, kind];
                s.extend_from_slice(&sealed(0, b"data"));
                s.extend_from_slice(&sealed(1, &[2, 42]));
                s.extend_from_slice(&[4, 0, 100]);
                let outcome = records(&s);
                assert!(!outcome.write_alerted, "version {version}, kind {kind}");
                assert_eq!((outcome.read, outcome.clean), (4, false));
            }
        }
        // The peer takes the first 50 bytes of a write: not all of its record.
        let mut s = vec![0, 0, 5, 0, 50, 0];
        s.extend_from_slice(&sealed(1, &[2, 42]));
        s.extend_from_slice(&[4, 0, 100]);
        let outcome = records(&s);
        assert!(outcome.write_alerted);
        assert_eq!(outcome.written, 50);
    }

    /// A read that fails because writing out what reading queued failed (the peer
    /// reset the connection) hands out the plaintext the search for the peer's alert
    /// opened first, then fails for good: the fuzzer found a read failing and the
    /// next one handing out that plaintext.
    #[test]
    fn a_read_failed_by_a_write_stays_failed() {
        // TLS 1.3; reads wait once, then take everything; six writes of 45,746 bytes
        // (the peer takes none: the stream keeps them unsent); an empty record and
        // one of 23 bytes; writes fail from the first byte.
        let mut s = vec![0, 3, 0, 0, 0xb2, 0xb2, 0xb2, 0xb2];
        s.extend(std::iter::repeat_n([4, 0xb2, 0xb2], 6).flatten());
        s.extend_from_slice(&sealed(0, b""));
        s.extend_from_slice(&sealed(0, &[0xb2; 23]));
        s.extend_from_slice(&[5, 0, 0, 0]);
        let outcome = records(&s);
        assert!(!outcome.clean);
        assert_eq!(outcome.read, 23);
    }

    #[test]
    fn key_update_requests_are_answered_once_before_our_next_data() {
        // Twenty requests, the peer changing key after each, and no write of ours:
        // nothing is sent (a peer that asks and never reads queues nothing here).
        let mut s = vec![0, 0];
        for _ in 0..20 {
            s.extend_from_slice(&sealed(2, &[24, 0, 0, 1, 1]));
            s.push(3);
        }
        s.extend_from_slice(&sealed(0, b"data"));
        s.extend_from_slice(&sealed(1, &[1, 0]));
        let silent = records(&s);
        assert_eq!((silent.read, silent.clean, silent.written), (4, true, 0));
        // Then one write of 100 bytes: one key update (5 + 5 + 1 + 16 bytes) and the
        // data's record (5 + 100 + 1 + 16), however many requests came.
        let mut s = vec![0, 0];
        for _ in 0..20 {
            s.extend_from_slice(&sealed(2, &[24, 0, 0, 1, 1]));
            s.push(3);
        }
        // (The stream writes before each read: nothing before the first, which takes
        // in every record; 100 bytes before the second; then it flushes.)
        s.extend_from_slice(&[4, 0, 0, 4, 0, 100]);
        s.extend_from_slice(&sealed(0, b"data"));
        s.extend_from_slice(&sealed(1, &[1, 0]));
        let answered = records(&s);
        assert_eq!((answered.read, answered.clean), (4, true));
        assert_eq!(answered.written, 27 + 122);
        // More than 32 key updates with no data between them: refused.
        let mut s = vec![0, 0];
        for _ in 0..33 {
            s.extend_from_slice(&sealed(2, &[24, 0, 0, 1, 0]));
            s.push(3);
        }
        s.extend_from_slice(&sealed(0, b"data"));
        assert_eq!(run(&s), (0, false));
    }

    /// A record of another type between the parts of a handshake message is refused
    /// with unexpected_message (RFC 8446 §5.1, RFC 5246 §6.2.1; it was decode_error).
    #[test]
    fn a_record_inside_a_handshake_message_is_an_unexpected_message() {
        for version in 0..6 {
            for (typ, plain) in [(0, &b"y"[..]), (1, &[1, 0][..])] {
                let mut s = one_record(version, b"x");
                // A handshake message's first 3 bytes.
                s.extend_from_slice(&sealed(2, &[4, 0, 0]));
                s.extend_from_slice(&sealed(typ, plain));
                let got = run_alert(&s);
                assert_eq!(got, (1, false, UNEXPECTED_MESSAGE), "version {version}");
            }
        }
    }

    /// Bytes that are no record header (the version's first byte is not 3) are a
    /// decode_error, as rustls answers them (it was unexpected_message); a record of a
    /// type that is not expected is unexpected_message (RFC 8446 §5).
    #[test]
    fn bytes_that_are_no_record_header_are_a_decode_error() {
        for version in 0..3 {
            let mut s = one_record(version, b"x");
            s.extend_from_slice(&[2, 5, 23, 2, 3, 0, 5]);
            assert_eq!(run_alert(&s), (1, false, DECODE_ERROR), "version {version}");
        }
        // TLS 1.3: a header of another type than application_data; inside, a
        // change_cipher_spec, and a type of no meaning.
        let mut s = one_record(0, b"x");
        s.extend_from_slice(&[2, 6, 22, 3, 3, 0, 1, 1]);
        assert_eq!(run_alert(&s), (1, false, UNEXPECTED_MESSAGE));
        for typ in [3, 99] {
            let mut s = one_record(0, b"x");
            s.extend_from_slice(&sealed(typ, &[1]));
            assert_eq!(run_alert(&s), (1, false, UNEXPECTED_MESSAGE), "type {typ}");
        }
    }

    /// A KeyUpdate whose body is not one byte does not decode: decode_error (it was
    /// illegal_parameter, which is for a request_update other than 0 and 1: RFC 8446
    /// §4.6.3).
    #[test]
    fn a_key_update_of_another_length_is_a_decode_error() {
        for (message, alert) in [
            (&[24, 0, 0, 0][..], DECODE_ERROR),
            (&[24, 0, 0, 2, 0, 0][..], DECODE_ERROR),
            (&[24, 0, 0, 1, 2][..], ILLEGAL_PARAMETER),
        ] {
            let mut s = one_record(0, b"x");
            s.extend_from_slice(&sealed(2, message));
            assert_eq!(run_alert(&s), (1, false, alert), "{message:?}");
        }
    }

    /// TLS 1.2 after the handshake, on a client's side (script byte 4, 5): a
    /// HelloRequest is refused with a warning, once, whether it comes alone or in
    /// parts; one with a body does not decode (RFC 5246 §7.4.1.1: it is empty), alone,
    /// behind another message in its record, or with its body in the next record:
    /// decode_error (it was taken as a request).
    #[test]
    fn a_hello_request_with_a_body_is_a_decode_error() {
        for version in [4, 5] {
            // Handshake records between data and close_notify.
            let with = |handshake: &[&[u8]]| {
                let mut s = one_record(version, b"x");
                for plain in handshake {
                    s.extend_from_slice(&sealed(2, plain));
                }
                s.extend_from_slice(&sealed(0, b"y"));
                s.extend_from_slice(&sealed(1, &[1, 0]));
                run_alert(&s)
            };
            assert_eq!(with(&[&[0, 0, 0, 0]]), (2, true, NO_RENEGOTIATION));
            assert_eq!(with(&[&[0, 0], &[0, 0]]), (2, true, NO_RENEGOTIATION));
            let with_a_body: [&[&[u8]]; 3] = [
                &[&[0, 0, 0, 1, 7]],
                &[&[0, 0, 0, 0, 0, 0, 0, 1, 7]],
                &[&[0, 0, 0, 1], &[7]],
            ];
            for handshake in with_a_body {
                let got = with(handshake);
                assert_eq!(got, (1, false, DECODE_ERROR), "{version}: {handshake:?}");
            }
            // A second request: unexpected_message.
            let twice = with(&[&[0, 0, 0, 0, 0, 0, 0, 0]]);
            assert_eq!(twice, (1, false, UNEXPECTED_MESSAGE));
        }
        // A server gets none.
        for version in [1, 2] {
            let mut s = one_record(version, b"x");
            s.extend_from_slice(&sealed(2, &[0, 0, 0, 0]));
            assert_eq!(run_alert(&s), (1, false, UNEXPECTED_MESSAGE));
        }
    }

    /// TLS 1.3 inner plaintexts the script could not make (its type 0 was application
    /// data, and its records had no padding): padding after the type is taken off; a
    /// plaintext of zeros has no type, unexpected_message; content, type and padding
    /// past 2^14 + 1 bytes are record_overflow (RFC 8446 §5.4), as a TLS 1.2 plaintext
    /// past 2^14 is (RFC 5246 §6.2.1; the script's records stopped at 2^14).
    #[test]
    fn tls13_padding_no_content_type_and_records_past_the_limit() {
        // Script type 4 is type 0: the plaintext is the whole inner plaintext.
        let padded = |data: &[u8], padding: usize| {
            let mut inner = data.to_vec();
            inner.push(23);
            inner.resize(inner.len() + padding, 0);
            sealed(4, &inner)
        };
        let mut s = vec![0, 0];
        s.extend_from_slice(&padded(b"hello", 100));
        // 2^14 + 1 bytes: content, type, a byte of padding.
        s.extend_from_slice(&padded(&[7; 16383], 0));
        s.extend_from_slice(&padded(b"x", 16000));
        s.extend_from_slice(&sealed(1, &[1, 0]));
        assert_eq!(run_alert(&s), (5 + 16383 + 1, true, None));
        let mut s = vec![0, 0];
        s.extend_from_slice(&padded(&[7; 16384], 0));
        assert_eq!(run_alert(&s), (0, false, RECORD_OVERFLOW));
        let mut s = vec![0, 0];
        s.extend_from_slice(&sealed(4, &[0; 50]));
        assert_eq!(run_alert(&s), (0, false, UNEXPECTED_MESSAGE));
        for version in [1, 2] {
            let mut s = vec![version, 0];
            s.extend_from_slice(&sealed(0, &[7; 16385]));
            assert_eq!(run_alert(&s), (0, false, RECORD_OVERFLOW), "{version}");
        }
    }

    /// The stream as a client (script byte 3 to 5; the script played a server only):
    /// it takes TLS 1.3 session tickets, which a server refuses (unexpected_message),
    /// and one that does not decode is a decode_error.
    #[test]
    fn a_client_takes_session_tickets() {
        // NewSessionTicket: lifetime, age_add, a nonce of 1 byte, a ticket of 3, no
        // extensions.
        let mut ticket = vec![
            4, 0, 0, 17, 0, 0, 0, 60, 1, 2, 3, 4, 1, 9, 0, 3, 7, 7, 7, 0, 0,
        ];
        let with = |version: u8, message: &[u8]| {
            let mut s = one_record(version, b"x");
            s.extend_from_slice(&sealed(2, message));
            s.extend_from_slice(&sealed(0, b"y"));
            s.extend_from_slice(&sealed(1, &[1, 0]));
            run_alert(&s)
        };
        assert_eq!(with(3, &ticket), (2, true, None));
        assert_eq!(with(0, &ticket), (1, false, UNEXPECTED_MESSAGE));
        // Without its extensions' length.
        ticket[3] -= 2;
        ticket.truncate(ticket.len() - 2);
        assert_eq!(with(3, &ticket), (1, false, DECODE_ERROR));
    }
}

//! [`TlsStream`]: a TLS connection as a byte stream, with its handshake run by rustls's
//! unbuffered API and its records sealed and opened in buffers of its own
//! ([`record`](super::record)).
//!
//! Why not tokio-rustls: rustls's buffered connection reads at most 4 KiB per call,
//! copies every decrypted record into a fresh `Vec`, and tokio-rustls copies it again
//! into the reader's buffer; the sender allocates and fills a `Vec` per record. Here the
//! socket is read in chunks of up to [`RX_LARGE`], records are opened in place and
//! copied once into the reader's buffer; the sender seals records straight into the
//! buffer it writes from (docs/performance.md, "TLS bulk (session 6)").
//!
//! After the handshake rustls keeps what the record layer cannot do itself
//! ([`rustls::kernel::KernelConnection`]): session tickets the server sends a client,
//! and new traffic secrets on a TLS 1.3 key update, either way.

use std::{
    io::{self, IoSlice},
    ops::{DerefMut, Range},
    pin::Pin,
    task::{ready, Context, Poll, Waker},
};

use rpc_core::peer::TlsIdentity;
use rustls::{
    client::{ClientConnectionData, UnbufferedClientConnection},
    kernel::KernelConnection,
    server::{ServerConnectionData, UnbufferedServerConnection},
    unbuffered::{
        ConnectionState, EncodeError, EncodeTlsData, InsufficientSizeError,
        UnbufferedConnectionCommon, UnbufferedStatus,
    },
    AlertDescription, ConnectionTrafficSecrets, ExtractedSecrets, SupportedCipherSuite,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

use super::record::{
    tls_io, Keys, Version, ALERT, APPLICATION_DATA, HANDSHAKE, HEADER_LEN, MAX_FRAGMENT,
};

/// The receive buffer's size at first: one whole record. A buffer grown past it
/// (`RX_LARGE`) goes back to it when a read finds the socket empty with no record in
/// part, and a send buffer grown past [`TX_KEEP`] is let go once written out while
/// the socket has nothing to read: a connection idle after a large call holds what
/// one after small calls holds (a review measured 527 KiB per idle TLS connection
/// after one 200 KB call, 5 GB at 10,000 connections).
const RX_SMALL: usize = 18 * 1024;

/// The most the send buffer keeps between bursts (see [`RX_SMALL`]): a few records.
const TX_KEEP: usize = 64 * 1024;

/// The receive buffer's size once a read filled it (a burst of records is arriving):
/// one `read` then brings up to this many bytes, many records.
pub(super) const RX_LARGE: usize = 256 * 1024;

/// Most bytes the handshake buffers: a handshake message of rustls's largest
/// (0xffff bytes, a certificate chain) in records, and a whole record more, as rustls's
/// own buffered connection allows (64 KiB while joining a message, then one read). Its
/// unbuffered API keeps every record of a message it is joining until the message is
/// whole, so this is also what a peer sending a message in tiny records can make it
/// hold: it held up to 1 MiB before, and kept it for the connection's life.
const MAX_HANDSHAKE_BUFFER: usize = 0xffff + 2 * (HEADER_LEN + MAX_FRAGMENT + 2048);

/// Most bytes of post-handshake messages (session tickets, key updates) buffered
/// while they arrive.
const MAX_POST_HANDSHAKE: usize = 64 * 1024;

/// Key updates, warning alerts or empty records accepted in a row from a peer before
/// the application data between them (as rustls counts them): each costs a key
/// schedule step or a record's work, and a peer that sends nothing else is attacking.
const MAX_IN_A_ROW: u8 = 32;

/// TLS handshake message types after the handshake.
const NEW_SESSION_TICKET: u8 = 4;
const KEY_UPDATE: u8 = 24;
const HELLO_REQUEST: u8 = 0;

/// A rustls connection during its handshake: client or server.
pub(super) trait Handshaking:
    DerefMut<Target = UnbufferedConnectionCommon<Self::Data>>
{
    /// rustls's per-side data.
    type Data;

    /// `process_tls_records`.
    fn process<'c, 'i>(
        &'c mut self,
        incoming: &'i mut [u8],
    ) -> UnbufferedStatus<'c, 'i, Self::Data>;

    /// The traffic secrets and what keeps the session after the handshake.
    fn into_kernel(self) -> Result<(ExtractedSecrets, Kernel), rustls::Error>;
}

impl Handshaking for UnbufferedClientConnection {
    type Data = ClientConnectionData;

    fn process<'c, 'i>(
        &'c mut self,
        incoming: &'i mut [u8],
    ) -> UnbufferedStatus<'c, 'i, ClientConnectionData> {
        self.process_tls_records(incoming)
    }

    fn into_kernel(self) -> Result<(ExtractedSecrets, Kernel), rustls::Error> {
        let (secrets, kernel) = self.dangerous_into_kernel_connection()?;
        Ok((secrets, Kernel::Client(kernel)))
    }
}

impl Handshaking for UnbufferedServerConnection {
    type Data = ServerConnectionData;

    fn process<'c, 'i>(
        &'c mut self,
        incoming: &'i mut [u8],
    ) -> UnbufferedStatus<'c, 'i, ServerConnectionData> {
        self.process_tls_records(incoming)
    }

    fn into_kernel(self) -> Result<(ExtractedSecrets, Kernel), rustls::Error> {
        let (secrets, kernel) = self.dangerous_into_kernel_connection()?;
        Ok((secrets, Kernel::Server(kernel)))
    }
}

/// What rustls keeps of a session after the handshake.
pub(super) enum Kernel {
    Client(KernelConnection<ClientConnectionData>),
    Server(KernelConnection<ServerConnectionData>),
    /// The fuzz target's: no handshake, keys from [`super::fuzzing`].
    #[cfg(any(fuzzing, test))]
    Fuzz(super::fuzzing::FuzzKernel),
}

impl Kernel {
    /// Whether this side is the client.
    fn is_client(&self) -> bool {
        match self {
            Kernel::Client(_) => true,
            Kernel::Server(_) => false,
            #[cfg(any(fuzzing, test))]
            Kernel::Fuzz(k) => k.client,
        }
    }

    /// A TLS 1.3 `NewSessionTicket`'s body, for a client's session store.
    fn new_session_ticket(&mut self, body: &[u8]) -> Result<(), rustls::Error> {
        match self {
            Kernel::Client(k) => k.handle_new_session_ticket(body),
            Kernel::Server(_) => Err(rustls::Error::InappropriateHandshakeMessage {
                expect_types: vec![],
                got_type: rustls::HandshakeType::NewSessionTicket,
            }),
            #[cfg(any(fuzzing, test))]
            Kernel::Fuzz(k) => k.new_session_ticket(body),
        }
    }

    fn suite(&self) -> SupportedCipherSuite {
        match self {
            Kernel::Client(k) => k.negotiated_cipher_suite(),
            Kernel::Server(k) => k.negotiated_cipher_suite(),
            #[cfg(any(fuzzing, test))]
            Kernel::Fuzz(k) => k.suite,
        }
    }

    fn update_tx(&mut self) -> Result<(u64, ConnectionTrafficSecrets), rustls::Error> {
        match self {
            Kernel::Client(k) => k.update_tx_secret(),
            Kernel::Server(k) => k.update_tx_secret(),
            #[cfg(any(fuzzing, test))]
            Kernel::Fuzz(k) => Ok(k.update_tx()),
        }
    }

    fn update_rx(&mut self) -> Result<(u64, ConnectionTrafficSecrets), rustls::Error> {
        match self {
            Kernel::Client(k) => k.update_rx_secret(),
            Kernel::Server(k) => k.update_rx_secret(),
            #[cfg(any(fuzzing, test))]
            Kernel::Fuzz(k) => Ok(k.update_rx()),
        }
    }
}

/// What one `process_tls_records` asks for next.
enum Step {
    Again,
    Transmit,
    Read,
    Done,
    Eof,
    Fail(rustls::Error),
}

/// Runs a handshake over `io` to its end, then hands the connection to the record
/// layer. `check` sees the finished handshake (its identity and ALPN) before it does.
/// Errors are rustls's errors inside I/O errors (what
/// [`describe`](super::describe) reads), or the socket's; a failed handshake sends
/// the peer rustls's alert first.
pub(super) async fn handshake<C, IO>(
    mut conn: C,
    mut io: IO,
    sent_no_certificate: bool,
) -> io::Result<(TlsStream<IO>, TlsIdentity)>
where
    C: Handshaking,
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let mut incoming = vec![0u8; RX_SMALL];
    let mut filled = 0;
    // rustls is given whole records one at a time, up to `given`, when it asks for
    // more: so that it stops right after the handshake, and what the peer sent behind
    // its last flight (data, a key update, a ticket, close_notify) is left to the
    // record layer whole, rather than processed by rustls and lost at the handover.
    let mut given = 0;
    let mut outgoing = Vec::new();
    // Application data that arrived with the peer's last handshake flight.
    let mut early = Vec::new();
    // A write that failed: the peer may have closed the connection after an alert
    // that says why, still to be read.
    let mut write_failed: Option<io::Error> = None;
    loop {
        let (discard, step) = {
            let UnbufferedStatus { mut discard, state } = conn.process(&mut incoming[..given]);
            let step = match state {
                Err(err) => Step::Fail(err),
                Ok(ConnectionState::EncodeTlsData(mut data)) => {
                    encode(&mut data, &mut outgoing)?;
                    Step::Again
                }
                Ok(ConnectionState::TransmitTlsData(data)) => {
                    data.done();
                    Step::Transmit
                }
                Ok(ConnectionState::BlockedHandshake) => Step::Read,
                Ok(ConnectionState::ReadTraffic(mut traffic)) => {
                    while let Some(record) = traffic.next_record() {
                        let record = record.map_err(tls_io)?;
                        discard += record.discard;
                        early.extend_from_slice(record.payload);
                    }
                    Step::Again
                }
                Ok(ConnectionState::WriteTraffic(_)) => Step::Done,
                Ok(ConnectionState::PeerClosed | ConnectionState::Closed) => Step::Eof,
                Ok(other) => Step::Fail(rustls::Error::General(format!(
                    "unexpected TLS state {other:?}"
                ))),
            };
            (discard, step)
        };
        incoming.copy_within(discard..filled, 0);
        filled -= discard;
        given -= discard;
        match step {
            Step::Again => {}
            Step::Transmit => {
                if write_failed.is_none() {
                    write_failed = io.write_all(&outgoing).await.err();
                }
                outgoing.clear();
            }
            Step::Read => {
                if let Some(end) = next_record_end(&incoming[..filled], given) {
                    given = end;
                    continue;
                }
                if filled == incoming.len() {
                    if incoming.len() >= MAX_HANDSHAKE_BUFFER {
                        return Err(tls_io(rustls::Error::General(
                            "handshake message too large".into(),
                        )));
                    }
                    incoming.resize((incoming.len() * 2).min(MAX_HANDSHAKE_BUFFER), 0);
                }
                let n = match io.read(&mut incoming[filled..]).await {
                    Ok(n) => n,
                    Err(err) => return Err(write_failed.unwrap_or(err)),
                };
                if n == 0 {
                    return Err(write_failed.unwrap_or_else(|| {
                        io::Error::new(io::ErrorKind::UnexpectedEof, "tls handshake eof")
                    }));
                }
                filled += n;
            }
            Step::Eof => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the peer closed the TLS connection during its handshake",
                ))
            }
            Step::Fail(err) => {
                // rustls queued an alert that says why, perhaps behind records of the
                // handshake (a ServerHello before an ALPN refusal): send them. The
                // calls must see the same buffer (rustls's deframer keeps positions in
                // it), and stop at the alert: one more would deframe the failed record
                // again.
                for _ in 0..8 {
                    let UnbufferedStatus { state, .. } = conn.process(&mut incoming[..given]);
                    let Ok(ConnectionState::EncodeTlsData(mut data)) = state else {
                        break;
                    };
                    let start = outgoing.len();
                    encode(&mut data, &mut outgoing)?;
                    if is_alert(&outgoing[start..]) {
                        break;
                    }
                }
                if write_failed.is_none() && !outgoing.is_empty() {
                    let _ = io.write_all(&outgoing).await;
                    let _ = io.flush().await;
                }
                return Err(tls_io(err));
            }
            Step::Done => break,
        }
    }
    if let Some(err) = write_failed {
        return Err(err);
    }
    if !outgoing.is_empty() {
        io.write_all(&outgoing).await?;
    }
    let identity = super::identity(&conn);
    let (secrets, kernel) = conn.into_kernel().map_err(tls_io)?;
    TlsStream::new(
        io,
        kernel,
        secrets,
        incoming,
        filled,
        early,
        sent_no_certificate,
    )
    .map(|stream| (stream, identity))
}

/// The end of the whole record that starts at `from` in `buf`, if it is all there; all
/// of `buf` when the bytes at `from` are no record header (rustls then says what is
/// wrong with them).
fn next_record_end(buf: &[u8], from: usize) -> Option<usize> {
    let rest = buf.get(from..).filter(|rest| rest.len() >= HEADER_LEN)?;
    let len = usize::from(u16::from_be_bytes([rest[3], rest[4]]));
    if rest[1] != 3 || len > MAX_FRAGMENT + 2048 {
        return Some(buf.len());
    }
    let end = from + HEADER_LEN + len;
    (end <= buf.len()).then_some(end)
}

/// A copy of `err` for the reads after it: the same kind, and the same rustls error or
/// peer alert inside (what [`rustls_error`](super::rustls_error) and the links read),
/// the same OS error, or the same words.
fn same_error(err: &io::Error) -> io::Error {
    if let Some(code) = err.raw_os_error() {
        return io::Error::from_raw_os_error(code);
    }
    if let Some(tls) = tls_cause(err, err.kind()) {
        return tls;
    }
    match err.get_ref() {
        Some(inner) => io::Error::new(err.kind(), inner.to_string()),
        None => err.kind().into(),
    }
}

/// A copy of `err`'s TLS cause (a rustls error, or the peer's alert), as an error of
/// `kind`, if it has one.
fn tls_cause(err: &io::Error, kind: io::ErrorKind) -> Option<io::Error> {
    let inner = err.get_ref()?;
    if let Some(tls) = inner.downcast_ref::<rustls::Error>() {
        Some(io::Error::new(kind, tls.clone()))
    } else {
        inner
            .downcast_ref::<super::PeerAlert>()
            .map(|alert| io::Error::new(kind, alert.clone()))
    }
}

/// Whether a server sends `alert` only to refuse a handshake (the client's
/// certificate, most of them), never once it has taken the connection.
fn refuses_handshake(alert: AlertDescription) -> bool {
    matches!(
        alert,
        AlertDescription::CertificateRequired
            | AlertDescription::BadCertificate
            | AlertDescription::UnsupportedCertificate
            | AlertDescription::CertificateRevoked
            | AlertDescription::CertificateExpired
            | AlertDescription::CertificateUnknown
            | AlertDescription::UnknownCA
            | AlertDescription::AccessDenied
            | AlertDescription::HandshakeFailure
    )
}

/// Whether `record` is an alert: in the clear or TLS 1.2's (its own content type), or
/// TLS 1.3's under the handshake keys (the only record of its length: 2 bytes, the
/// type and a tag).
fn is_alert(record: &[u8]) -> bool {
    match record.first() {
        Some(&ALERT) => true,
        Some(&APPLICATION_DATA) => record.len() == HEADER_LEN + 2 + 1 + 16,
        _ => false,
    }
}

/// Encodes a handshake record at the end of `out`.
fn encode<D>(data: &mut EncodeTlsData<'_, D>, out: &mut Vec<u8>) -> io::Result<()> {
    let start = out.len();
    let mut room = 0;
    loop {
        out.resize(start + room, 0);
        match data.encode(&mut out[start..]) {
            Ok(n) => {
                out.truncate(start + n);
                return Ok(());
            }
            Err(EncodeError::InsufficientSize(InsufficientSizeError { required_size })) => {
                room = required_size;
            }
            Err(err) => return Err(io::Error::other(err)),
        }
    }
}

/// A TLS connection after its handshake, as a byte stream: what [`TlsLink`](super::TlsLink)
/// carries this framework's frames over, and gRPC's `grpcs://` its HTTP/2.
///
/// Reading opens records in place in a buffer of the stream's own, filled by reads of
/// up to 256 KiB, and copies their plaintext once into the caller's buffer. Writing
/// seals records of up to 16 KiB straight into a send buffer, written when it holds
/// 256 KiB and on flush. A TLS 1.3 key update from the peer is followed (and answered
/// if asked for), and the stream updates its own key before the cipher's
/// confidentiality limit; session tickets reach the client's session store;
/// `close_notify` ends the reading side, and shutting down sends one. A peer that
/// closes the connection without `close_notify` is an error of kind
/// [`UnexpectedEof`](io::ErrorKind::UnexpectedEof), as rustls reports it. Once a read
/// fails (but for an error of the socket's own), every later read reports the same
/// error.
pub struct TlsStream<IO> {
    io: IO,
    kernel: Kernel,
    version: Version,
    tx: Keys,
    rx: Keys,
    /// Records sealed with one key before the stream updates it (TLS 1.3) or fails.
    tx_limit: u64,
    /// Received bytes, up to `end` (its length): plaintext not yet read at `plain`,
    /// then records from `pos`; its capacity is what one read may fill.
    rbuf: Vec<u8>,
    pos: usize,
    end: usize,
    plain: Range<usize>,
    /// Post-handshake messages that arrived in part.
    handshake: Vec<u8>,
    /// The peer sent `close_notify`.
    read_closed: bool,
    /// The peer asked for a key update (TLS 1.3): ours goes before our next
    /// application data (RFC 8446 §4.6.3: one answer, however many requests came
    /// while we were silent).
    key_update_owed: bool,
    /// Key updates, warning alerts and empty records since the last application data
    /// from the peer ([`MAX_IN_A_ROW`]).
    in_a_row: u8,
    /// A TLS 1.2 server asked for renegotiation once (refused with a warning); a
    /// second request is an error.
    renegotiation_refused: bool,
    /// Reading failed: the connection is unusable.
    broken: bool,
    /// A client that had no certificate to send (what a server's refusal of the
    /// handshake means).
    sent_no_certificate: bool,
    /// The error that broke it: every read from then on reports it (a copy: the same
    /// kind and cause), once the plaintext opened before it is read.
    error: Option<io::Error>,
    /// Sealed records not yet written, from `wpos`.
    wbuf: Vec<u8>,
    wpos: usize,
    /// `close_notify` is sealed.
    write_closed: bool,
    /// The task of a write, flush or shutdown waiting for the socket: a read that
    /// writes out (an alert, records a waiting writer left) takes the socket's one
    /// write waker, so it wakes this one to register again.
    write_waker: Option<Waker>,
    /// The task of the last read that waited for the socket: a writer that reads
    /// (for the alert behind a refused write) may take the socket's one read waker,
    /// so it wakes this one to register again.
    read_waker: Option<Waker>,
}

impl<IO> std::fmt::Debug for TlsStream<IO> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsStream")
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

impl<IO> TlsStream<IO> {
    pub(super) fn new(
        io: IO,
        kernel: Kernel,
        secrets: ExtractedSecrets,
        rbuf: Vec<u8>,
        end: usize,
        early: Vec<u8>,
        sent_no_certificate: bool,
    ) -> io::Result<TlsStream<IO>> {
        let mut rbuf = rbuf;
        // A buffer the handshake grew for a large message (or a peer's tiny records) is
        // not kept for the connection's life: the record layer starts at a record's
        // size and grows as records come (what was read ahead stays).
        rbuf.truncate(end);
        rbuf.shrink_to(RX_SMALL.max(end));
        let suite = kernel.suite();
        let version = match (&suite, &secrets.tx.1) {
            (SupportedCipherSuite::Tls13(_), _) => Version::Tls13,
            (_, ConnectionTrafficSecrets::Chacha20Poly1305 { .. }) => Version::Tls12Chacha,
            _ => Version::Tls12Gcm,
        };
        let tx_limit = match suite {
            SupportedCipherSuite::Tls13(s) => s.common.confidentiality_limit,
            SupportedCipherSuite::Tls12(s) => s.common.confidentiality_limit,
        };
        let (tx_seq, tx) = secrets.tx;
        let (rx_seq, rx) = secrets.rx;
        let mut stream = TlsStream {
            io,
            kernel,
            version,
            tx: Keys::new(tx_seq, tx)?,
            rx: Keys::new(rx_seq, rx)?,
            tx_limit,
            plain: 0..0,
            pos: 0,
            end,
            rbuf,
            handshake: Vec::new(),
            read_closed: false,
            key_update_owed: false,
            in_a_row: 0,
            renegotiation_refused: false,
            broken: false,
            sent_no_certificate,
            error: None,
            wbuf: Vec::new(),
            wpos: 0,
            write_closed: false,
            write_waker: None,
            read_waker: None,
        };
        if !early.is_empty() {
            // Rare: data rustls opened with the last handshake flight. Put it in front
            // of the records still to open.
            let mut rbuf = early;
            let len = rbuf.len();
            rbuf.extend_from_slice(&stream.rbuf[..end]);
            stream.end = rbuf.len();
            stream.rbuf = rbuf;
            stream.plain = 0..len;
            stream.pos = len;
        }
        Ok(stream)
    }

    /// The wrapped stream.
    pub fn get_ref(&self) -> &IO {
        &self.io
    }

    /// Bytes the stream holds in its receive and post-handshake buffers, and in its
    /// send buffer (the fuzz target's bounds).
    #[cfg(any(fuzzing, test))]
    pub(super) fn buffered(&self) -> (usize, usize) {
        (self.rbuf.capacity() + self.handshake.len(), self.wbuf.len())
    }

    /// The memory the receive and send buffers hold (tests).
    #[cfg(test)]
    pub(super) fn capacities(&self) -> (usize, usize) {
        (self.rbuf.capacity(), self.wbuf.capacity())
    }

    /// Updates the sending key every `records` records (tests: the cipher's limit is
    /// millions).
    #[cfg(test)]
    pub(super) fn set_tx_limit(&mut self, records: u64) {
        self.tx_limit = records;
    }

    /// Sends a key update that asks the peer for one too.
    #[cfg(test)]
    pub(super) fn request_key_update(&mut self) -> io::Result<()> {
        self.key_update(true)
    }

    /// Seals one record into the send buffer, updating the key first if it has
    /// sealed as many records as its cipher allows.
    fn seal(&mut self, typ: u8, parts: &[&[u8]]) -> io::Result<()> {
        if typ == APPLICATION_DATA && self.key_update_owed {
            self.key_update_owed = false;
            self.key_update(false)?;
        }
        // TLS 1.3 keeps a record for its KeyUpdate; TLS 1.2, which cannot update its
        // key, keeps one for its close_notify (alerts use it).
        let tls13 = self.version == Version::Tls13;
        let reserve = if tls13 || typ == APPLICATION_DATA {
            2
        } else {
            1
        };
        if self.tx.seq.saturating_add(reserve) >= self.tx_limit {
            if !tls13 {
                if typ == APPLICATION_DATA && !self.write_closed {
                    // The key's last record: close_notify, so that the peer sees the
                    // end rather than a truncation, and shutdown can still finish (it
                    // failed, and sent neither close_notify nor FIN; from a review).
                    self.tx
                        .seal(self.version, ALERT, &[&[1, 0]], &mut self.wbuf);
                    self.write_closed = true;
                }
                return Err(tls_io(rustls::Error::EncryptError));
            }
            self.key_update(false)?;
        }
        self.tx.seal(self.version, typ, parts, &mut self.wbuf);
        Ok(())
    }

    /// Sends a TLS 1.3 `key_update` under the current key, then uses the next one.
    fn key_update(&mut self, request: bool) -> io::Result<()> {
        self.tx.seal(
            self.version,
            HANDSHAKE,
            &[&[KEY_UPDATE, 0, 0, 1, u8::from(request)]],
            &mut self.wbuf,
        );
        let (seq, secrets) = self.kernel.update_tx().map_err(tls_io)?;
        self.tx = Keys::new(seq, secrets)?;
        Ok(())
    }

    /// Opens the record at `pos`, if it is all there; `Ok(false)` if more bytes are
    /// needed.
    fn open_next(&mut self) -> io::Result<bool> {
        let available = &self.rbuf[self.pos..self.end];
        if available.len() < HEADER_LEN {
            return Ok(false);
        }
        if available[1] != 3 {
            // Not a record header: decode_error, as rustls answers it (it was
            // unexpected_message, which RFC 8446 §5 keeps for a record of a type not
            // expected).
            return Err(tls_io(rustls::Error::InvalidMessage(
                rustls::InvalidMessage::UnknownProtocolVersion,
            )));
        }
        let len = u16::from_be_bytes([available[3], available[4]]) as usize;
        if len > self.version.max_ciphertext() {
            return Err(tls_io(rustls::Error::PeerSentOversizedRecord));
        }
        if available.len() < HEADER_LEN + len {
            return Ok(false);
        }
        let start = self.pos;
        self.pos += HEADER_LEN + len;
        let (typ, plain) = self
            .rx
            .open(self.version, &mut self.rbuf[start..self.pos])?;
        let plain = start + plain.start..start + plain.end;
        if !self.handshake.is_empty() && typ != HANDSHAKE {
            // A handshake message in parts must not be interleaved (RFC 8446 §5.1,
            // RFC 5246 §6.2.1): a record of an unexpected type, unexpected_message (it
            // was decode_error).
            return Err(tls_io(rustls::Error::PeerMisbehaved(
                rustls::PeerMisbehaved::MessageInterleavedWithHandshakeMessage,
            )));
        }
        if typ == APPLICATION_DATA && !plain.is_empty() {
            self.in_a_row = 0;
        } else if typ != ALERT {
            self.count_in_a_row()?;
        }
        match typ {
            APPLICATION_DATA => self.plain = plain,
            // Handled before it is counted: a close_notify or a fatal alert after a
            // run of empty records is an end (it was answered unexpected_message); a
            // warning that goes on counts.
            ALERT => {
                self.alert(plain)?;
                if !self.read_closed {
                    self.count_in_a_row()?;
                }
            }
            HANDSHAKE if plain.is_empty() => {
                return Err(tls_io(rustls::Error::InvalidMessage(
                    rustls::InvalidMessage::MessageTooShort,
                )))
            }
            HANDSHAKE => self.post_handshake(plain)?,
            _ => {
                return Err(tls_io(rustls::Error::InappropriateMessage {
                    expect_types: vec![rustls::ContentType::ApplicationData],
                    got_type: rustls::ContentType::from(typ),
                }))
            }
        }
        Ok(true)
    }

    /// Counts a record that carried no application data; too many in a row is an
    /// error.
    fn count_in_a_row(&mut self) -> io::Result<()> {
        self.in_a_row += 1;
        if self.in_a_row > MAX_IN_A_ROW {
            return Err(tls_io(rustls::Error::PeerMisbehaved(
                rustls::PeerMisbehaved::TooManyEmptyFragments,
            )));
        }
        Ok(())
    }

    fn alert(&mut self, plain: Range<usize>) -> io::Result<()> {
        let &[level, description] = &self.rbuf[plain] else {
            return Err(tls_io(rustls::Error::InvalidMessage(
                rustls::InvalidMessage::MessageTooShort,
            )));
        };
        let description = AlertDescription::from(description);
        match description {
            AlertDescription::CloseNotify => {
                self.read_closed = true;
                Ok(())
            }
            // TLS 1.3: every alert but close_notify and user_canceled is fatal,
            // whatever its level (RFC 8446 §6); TLS 1.2: warnings are ignored. Either
            // way, at most MAX_IN_A_ROW in a row (counted in open_next).
            // user_canceled is a closure alert in TLS 1.3, whatever its level; in
            // TLS 1.2 a fatal-level alert is fatal, this one too (RFC 5246 §7.2).
            AlertDescription::UserCanceled if level == 1 || self.version == Version::Tls13 => {
                Ok(())
            }
            _ if level == 1 && self.version != Version::Tls13 => Ok(()),
            _ => {
                let side = if self.kernel.is_client() {
                    "server"
                } else {
                    "client"
                };
                // A server's refusal of our certificate (TLS 1.3: after our side of
                // the handshake, so at the first read) means it refused the
                // connection and took nothing sent on it: `ConnectionRefused`, which
                // fails the calls as unprocessed (from a review: "[the call may have
                // run]" for a handshake the server refused).
                let kind = if self.kernel.is_client() && refuses_handshake(description) {
                    io::ErrorKind::ConnectionRefused
                } else {
                    io::ErrorKind::InvalidData
                };
                let alert = super::PeerAlert::new(description, side, self.sent_no_certificate);
                Err(io::Error::new(kind, alert))
            }
        }
    }

    /// Session tickets, key updates (TLS 1.3); a renegotiation request (TLS 1.2),
    /// refused as rustls refuses it.
    fn post_handshake(&mut self, plain: Range<usize>) -> io::Result<()> {
        self.handshake.extend_from_slice(&self.rbuf[plain]);
        if self.handshake.len() > MAX_POST_HANDSHAKE {
            return Err(tls_io(rustls::Error::InvalidMessage(
                rustls::InvalidMessage::HandshakePayloadTooLarge,
            )));
        }
        while self.handshake.len() >= 4 {
            let h = &self.handshake;
            let len = u32::from_be_bytes([0, h[1], h[2], h[3]]) as usize;
            if h.len() < 4 + len {
                break;
            }
            let typ = h[0];
            let body: Vec<u8> = h[4..4 + len].to_vec();
            self.handshake.drain(..4 + len);
            match (typ, self.kernel.is_client(), self.version) {
                (NEW_SESSION_TICKET, true, Version::Tls13) => {
                    self.kernel.new_session_ticket(&body).map_err(tls_io)?;
                }
                (KEY_UPDATE, _, Version::Tls13) => {
                    // A request_update other than 0 and 1 is illegal_parameter (RFC 8446
                    // §4.6.3); a body of another length does not decode, decode_error
                    // (it was illegal_parameter).
                    let request = match body[..] {
                        [0] => false,
                        [1] => true,
                        [_] => {
                            return Err(tls_io(rustls::Error::InvalidMessage(
                                rustls::InvalidMessage::InvalidKeyUpdate,
                            )))
                        }
                        [] => {
                            return Err(tls_io(rustls::Error::InvalidMessage(
                                rustls::InvalidMessage::MessageTooShort,
                            )))
                        }
                        _ => {
                            return Err(tls_io(rustls::Error::InvalidMessage(
                                rustls::InvalidMessage::TrailingData("KeyUpdate"),
                            )))
                        }
                    };
                    // A key update ends its record (RFC 8446 §5.1).
                    if !self.handshake.is_empty() {
                        return Err(tls_io(rustls::Error::PeerMisbehaved(
                            rustls::PeerMisbehaved::KeyEpochWithPendingFragment,
                        )));
                    }
                    let (seq, secrets) = self.kernel.update_rx().map_err(tls_io)?;
                    self.rx = Keys::new(seq, secrets)?;
                    if request && !self.write_closed {
                        // Answered before our next application data, once however
                        // many requests arrive meanwhile: a peer that asks and never
                        // reads cannot make us queue answers.
                        self.key_update_owed = true;
                    }
                }
                // A HelloRequest is empty (RFC 5246 §7.4.1.1): one with a body does
                // not decode, decode_error (it was taken as a request).
                (HELLO_REQUEST, true, Version::Tls12Gcm | Version::Tls12Chacha)
                    if !body.is_empty() =>
                {
                    return Err(tls_io(rustls::Error::InvalidMessage(
                        rustls::InvalidMessage::TrailingData("HelloRequest"),
                    )))
                }
                (HELLO_REQUEST, true, Version::Tls12Gcm | Version::Tls12Chacha)
                    if !self.renegotiation_refused =>
                {
                    // no_renegotiation, a warning; once.
                    self.renegotiation_refused = true;
                    if !self.write_closed {
                        self.seal(ALERT, &[&[1, 100]])?;
                    }
                }
                _ => {
                    return Err(tls_io(rustls::Error::InappropriateHandshakeMessage {
                        expect_types: vec![],
                        got_type: rustls::HandshakeType::from(typ),
                    }))
                }
            }
        }
        Ok(())
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> TlsStream<IO> {
    /// Tells the peer why its records are refused, as TLS asks (RFC 8446 §5.2, §6.2): a
    /// fatal alert, sealed behind whatever is still unsent and written if the socket
    /// takes it now (never waited for: the connection is failing). Nothing is sent for
    /// the peer's own fatal alert, and nothing is sent after it.
    fn send_fatal_alert(&mut self, err: &io::Error, cx: &mut Context<'_>) {
        use rustls::{Error as E, InvalidMessage as M};
        if self.write_closed {
            return;
        }
        let description = match super::rustls_error(err) {
            Some(E::AlertReceived(_)) => {
                // The peer's fatal alert closes the connection both ways (RFC 8446
                // §6.2): nothing more is written, not even a close_notify.
                self.write_closed = true;
                return;
            }
            Some(E::DecryptError) => AlertDescription::BadRecordMac,
            Some(E::PeerSentOversizedRecord) => AlertDescription::RecordOverflow,
            Some(E::InvalidMessage(M::InvalidKeyUpdate)) => AlertDescription::IllegalParameter,
            Some(E::InvalidMessage(M::InvalidContentType))
            | Some(E::InappropriateMessage { .. })
            | Some(E::InappropriateHandshakeMessage { .. })
            | Some(E::PeerMisbehaved(_)) => AlertDescription::UnexpectedMessage,
            Some(E::InvalidMessage(_)) => AlertDescription::DecodeError,
            _ => AlertDescription::InternalError,
        };
        self.write_closed = true;
        // Within the key's record limit only (a key update first would be one more
        // message to a failing peer): past it the connection just closes.
        if self.tx.seq.saturating_add(1) < self.tx_limit {
            let alert = [2, u8::from(description)];
            self.tx.seal(self.version, ALERT, &[&alert], &mut self.wbuf);
            let _ = self.poll_write_out(cx);
        }
    }

    /// Writes the send buffer until it is empty.
    fn poll_write_out(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.wpos < self.wbuf.len() {
            let n = match ready!(Pin::new(&mut self.io).poll_write(cx, &self.wbuf[self.wpos..])) {
                Ok(n) => n,
                Err(err)
                    if matches!(
                        err.kind(),
                        io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
                    ) =>
                {
                    // The peer's alert, read now or already by the reader (which
                    // keeps it: over a Unix socket, where a write after the peer's
                    // close fails at once, the reader often had it first, and the
                    // writer said "broken pipe"; from a review, 6 handshakes in 30).
                    let why = match self.alert_behind(cx) {
                        Some(alert) => alert,
                        None => self.error.as_ref().map_or(err, same_error),
                    };
                    return Poll::Ready(Err(why));
                }
                Err(err) => return Poll::Ready(Err(err)),
            };
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.wpos += n;
        }
        self.wbuf.clear();
        self.wpos = 0;
        Poll::Ready(Ok(()))
    }

    /// After a write failed because the peer closed the connection: the fatal alert
    /// it sent first, if it is already here, which says why in words ("broken pipe"
    /// said nothing). A TLS 1.3 server checks the client's certificate after the
    /// client's handshake is over, so a client without one sees its first writes go
    /// out and the server's alert, then a reset, come back. The kernel keeps what came
    /// before a reset readable. Records are opened only while no application data
    /// waits for the reader (that stays the reader's, the alert behind it too).
    fn alert_behind(&mut self, cx: &mut Context<'_>) -> Option<io::Error> {
        if self.broken || self.read_closed {
            return None;
        }
        let mut polled = false;
        let mut found = None;
        // A few reads at most: an alert is one small record.
        'reads: for _ in 0..4 {
            while self.plain.is_empty() {
                match self.open_next() {
                    Ok(true) => {}
                    Ok(false) => break,
                    Err(err) => {
                        self.broken = true;
                        if let Some(alert) = err
                            .get_ref()
                            .and_then(|inner| inner.downcast_ref::<super::PeerAlert>())
                        {
                            // The reader is told the same.
                            let copy = io::Error::new(err.kind(), alert.clone());
                            self.error = Some(copy);
                            found = Some(err);
                        } else {
                            self.error = Some(err);
                        }
                        break 'reads;
                    }
                }
                if self.read_closed {
                    break 'reads;
                }
            }
            if !self.plain.is_empty() {
                break;
            }
            polled = true;
            match self.poll_fill(cx) {
                Poll::Ready(Ok(n)) if n > 0 => {}
                _ => break,
            }
        }
        // Reading here may have taken the socket's read waker from a reader waiting
        // in another task, or read what it waits for: it looks again.
        if polled {
            if let Some(reader) = self.read_waker.take() {
                if !reader.will_wake(cx.waker()) {
                    reader.wake();
                }
            }
        }
        found
    }

    /// Reads more of the socket behind the record being assembled (every whole record
    /// before it is open and read: `plain` is empty); `Ok(0)` at its end.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        let partial = self.end - self.pos;
        self.rbuf.copy_within(self.pos..self.end, 0);
        self.rbuf.truncate(partial);
        self.end = partial;
        self.pos = 0;
        self.plain = 0..0;
        if self.rbuf.capacity() - partial < RX_SMALL / 2 {
            // Small until a record arrives in parts: then records are coming faster
            // than they are read, and one read may as well bring many.
            let size = if self.rbuf.capacity() >= RX_SMALL {
                RX_LARGE
            } else {
                RX_SMALL
            };
            self.rbuf
                .reserve_exact(size.max(partial + RX_SMALL / 2) - partial);
        }
        // Into the spare capacity, not zeroed first (a buffer grown again after an
        // idle spell costs no pass over it).
        let n = ready!(tokio_util::io::poll_read_buf(
            Pin::new(&mut self.io),
            cx,
            &mut self.rbuf
        ))?;
        self.end += n;
        Poll::Ready(Ok(n))
    }

    /// The socket had nothing to read: buffers grown for a burst go back to their
    /// small sizes (see [`RX_SMALL`]), the receive buffer keeping a record in part,
    /// the send buffer only once written out.
    fn idle(&mut self) {
        let keep = RX_SMALL.max(self.end);
        if self.rbuf.capacity() > keep {
            self.rbuf.shrink_to(keep);
        }
        if self.wbuf.capacity() > TX_KEEP && self.unsent() == 0 {
            self.wbuf = Vec::new();
            self.wpos = 0;
        }
    }

    /// [`poll_write_out`](Self::poll_write_out) for a writer, which is woken again if
    /// a read takes the socket's write waker meanwhile.
    fn poll_write_out_or_park(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let written = self.poll_write_out(cx);
        if written.is_pending() {
            self.park_writer(cx);
        } else {
            self.write_waker = None;
        }
        written
    }

    fn park_writer(&mut self, cx: &mut Context<'_>) {
        match &mut self.write_waker {
            Some(waker) => waker.clone_from(cx.waker()),
            None => self.write_waker = Some(cx.waker().clone()),
        }
    }

    fn unsent(&self) -> usize {
        self.wbuf.len() - self.wpos
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncRead for TlsStream<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        loop {
            if !this.plain.is_empty() {
                let n = this.plain.len().min(buf.remaining());
                buf.put_slice(&this.rbuf[this.plain.start..this.plain.start + n]);
                this.plain.start += n;
                if buf.remaining() == 0 {
                    return Poll::Ready(Ok(()));
                }
                continue;
            }
            if this.broken {
                // The plaintext opened before the failure first (records a failed
                // write's search for the peer's alert opened, say); the error next, and
                // the same at every read after it (a second read after a truncation
                // said InvalidData, not UnexpectedEof; from a review).
                if buf.filled().len() > before {
                    return Poll::Ready(Ok(()));
                }
                return Poll::Ready(Err(this.error.as_ref().map_or_else(
                    || {
                        io::Error::new(
                            io::ErrorKind::InvalidData,
                            "the TLS connection failed earlier",
                        )
                    },
                    same_error,
                )));
            }
            if this.read_closed {
                return Poll::Ready(Ok(()));
            }
            match this.open_next() {
                Ok(true) => continue,
                Ok(false) => {}
                Err(err) => {
                    this.broken = true;
                    this.send_fatal_alert(&err, cx);
                    // The plaintext before the bad record first; the error next.
                    this.error = Some(err);
                    continue;
                }
            }
            // Reading never waits for writing (both peers may be sending at once, each
            // with a full send buffer): what reading itself queues is bounded, one
            // renegotiation refusal at most, as a key update's answer waits for our next
            // application data.
            if this.unsent() > 0 {
                // Sealed records, an alert say: on their way, if the socket takes them.
                let written = this.poll_write_out(cx);
                // This took the socket's write waker from a writer waiting for it (in
                // another task, after a split), or wrote what it waited to write.
                // (Not the reader's own task: one that polls both, as the
                // framework's connection drivers do, would wake itself for ever while
                // the socket stays full.)
                if let Some(writer) = this.write_waker.take() {
                    if !writer.will_wake(cx.waker()) {
                        writer.wake();
                    }
                }
                if let Poll::Ready(Err(err)) = written {
                    // The connection failed (the peer reset it, say): for the reader
                    // too, for good, as after any other read error, once the plaintext
                    // opened before it (in looking for the peer's alert) is read. An
                    // error that search stored says more than the write's.
                    this.broken = true;
                    if this.error.is_none() {
                        this.error = Some(err);
                    }
                    continue;
                }
            }
            if buf.filled().len() > before {
                return Poll::Ready(Ok(()));
            }
            // Every whole record is open and read: keep the partial one, read more.
            let filled = match this.poll_fill(cx) {
                Poll::Ready(filled) => filled?,
                Poll::Pending => {
                    this.idle();
                    // Kept for a writer that reads (`alert_behind`).
                    match &this.read_waker {
                        Some(waker) if waker.will_wake(cx.waker()) => {}
                        _ => this.read_waker = Some(cx.waker().clone()),
                    }
                    return Poll::Pending;
                }
            };
            if filled == 0 {
                this.broken = true;
                this.error = Some(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "peer closed connection without sending TLS close_notify",
                ));
            }
        }
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncWrite for TlsStream<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.write_closed {
            // Closed by the peer's fatal alert (read by the reader): that is why,
            // not "broken pipe" alone (the CLI said only that, at times, for a
            // handshake the server refused; from a review).
            // (A refusal of the handshake keeps its kind: nothing was taken.)
            let why = (this.error.as_ref()).and_then(|err| {
                let kind = match err.kind() {
                    io::ErrorKind::ConnectionRefused => io::ErrorKind::ConnectionRefused,
                    _ => io::ErrorKind::BrokenPipe,
                };
                tls_cause(err, kind)
            });
            return Poll::Ready(Err(why.unwrap_or_else(|| io::ErrorKind::BrokenPipe.into())));
        }
        let limit = super::SEND_BUFFER_LIMIT;
        if this.unsent() >= limit {
            if let Poll::Ready(Err(err)) = this.poll_write_out(cx) {
                return Poll::Ready(Err(err));
            }
            if this.unsent() >= limit {
                this.park_writer(cx);
                return Poll::Pending;
            }
        }
        if this.wpos > 0 && this.wpos >= this.wbuf.len() / 2 {
            this.wbuf.drain(..this.wpos);
            this.wpos = 0;
        }
        // Seal records of up to 16 KiB from the slices, in order, until the buffer
        // holds `limit` bytes.
        let mut taken = 0;
        let mut slices = bufs.iter().map(|b| &b[..]).filter(|b| !b.is_empty());
        let mut current: Option<&[u8]> = slices.next();
        while current.is_some() && this.unsent() < limit {
            let mut parts: [&[u8]; 16] = [&[]; 16];
            let mut count = 0;
            let mut len = 0;
            while let Some(slice) = current {
                let n = slice.len().min(MAX_FRAGMENT - len);
                parts[count] = &slice[..n];
                count += 1;
                len += n;
                if n < slice.len() {
                    current = Some(&slice[n..]);
                } else {
                    current = slices.next();
                }
                if len == MAX_FRAGMENT || count == parts.len() {
                    break;
                }
            }
            if let Err(err) = this.seal(APPLICATION_DATA, &parts[..count]) {
                if taken > 0 {
                    // What is sealed goes out; the error comes with the next write.
                    return Poll::Ready(Ok(taken));
                }
                return Poll::Ready(Err(err));
            }
            taken += len;
        }
        Poll::Ready(Ok(taken))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_write_out_or_park(cx))?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.write_closed {
            // close_notify, a warning.
            this.seal(ALERT, &[&[1, 0]])?;
            this.write_closed = true;
        }
        ready!(this.poll_write_out_or_park(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

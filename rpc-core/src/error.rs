//! [`Error`]: the one opaque error type for connections and transports.
//!
//! Calls fail with a [`Status`](crate::Status); what goes wrong below a call (a
//! connect that fails, a peer that sends garbage, a frame over the limit) is an
//! [`Error`] with a [`kind()`](Error::kind). A call that meets one sees `UNAVAILABLE`
//! carrying its text.

use std::{borrow::Cow, fmt, io};

/// What kind of failure an [`Error`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// An I/O error from the operating system.
    Io,
    /// The peer closed the connection, possibly in the middle of a frame.
    Closed,
    /// A frame longer than the configured maximum was announced.
    FrameTooLarge,
    /// The peer broke the protocol (a malformed frame, an unexpected kind).
    Protocol,
    /// The peer speaks another protocol version.
    UnsupportedVersion,
    /// The peer sent GOAWAY with an error code.
    GoAway,
    /// An address or URI could not be understood.
    InvalidAddress,
    /// A limit of this side was reached (for example the connection limit).
    LimitReached,
    /// The peer refused the connection before it took anything on it (a UDP server
    /// with no room for another association, or shutting down): nothing sent on it
    /// was processed, so its calls fail as unprocessed.
    Refused,
    /// A deadline passed (for example while connecting).
    TimedOut,
    /// A TLS handshake failed: a certificate was not trusted, a name did not match,
    /// the peer does not speak TLS or refused ours.
    Tls,
    /// A setting asks for something this build does not have (a compression
    /// algorithm whose cargo feature is off).
    Unsupported,
}

/// A connection or transport failure: a connect that fails, a peer that sends
/// garbage, a frame over the limit. Calls fail with a [`Status`](crate::Status); one
/// that meets an `Error` sees `UNAVAILABLE` carrying its text.
pub struct Error {
    kind: ErrorKind,
    /// The peer speaks another protocol ([`Error::from_another_protocol`]).
    another_protocol: bool,
    message: Cow<'static, str>,
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl Error {
    /// A new error of `kind` with a message.
    pub fn new(kind: ErrorKind, message: impl Into<Cow<'static, str>>) -> Error {
        Error {
            kind,
            another_protocol: false,
            message: message.into(),
            source: None,
        }
    }

    /// Marks the error as a peer's that speaks another protocol (TLS on a plain
    /// connection, HTTP, HTTP/2 where this wire was expected), seen before it sent a
    /// frame of this wire: a server of another protocol ran none of the calls sent to
    /// it, so a client fails them as unprocessed (safe to send elsewhere; from a
    /// review: a replica registered at a port of another service failed its calls as
    /// "connection lost", which also told the caller they might have run).
    pub fn from_another_protocol(mut self) -> Error {
        self.another_protocol = true;
        self
    }

    /// Whether the peer speaks another protocol ([`Error::from_another_protocol`]).
    pub fn is_another_protocol(&self) -> bool {
        self.another_protocol
    }

    /// Attaches the underlying cause.
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Error {
        self.source = Some(Box::new(source));
        self
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message, without the cause.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// An I/O error with context (`"connect to 127.0.0.1:9"`).
    pub fn io(context: impl Into<Cow<'static, str>>, err: io::Error) -> Error {
        let kind = match err.kind() {
            io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe => ErrorKind::Closed,
            io::ErrorKind::TimedOut => ErrorKind::TimedOut,
            // Nothing was taken: a connect refused, a TLS server's refusal of the
            // handshake after the client's side of it was done.
            io::ErrorKind::ConnectionRefused => ErrorKind::Refused,
            _ => ErrorKind::Io,
        };
        Error::new(kind, context).with_source(err)
    }
}

impl From<io::Error> for Error {
    fn from(err: io::Error) -> Error {
        Error::io("i/o error", err)
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Error");
        d.field("kind", &self.kind).field("message", &self.message);
        if let Some(source) = &self.source {
            d.field("source", source);
        }
        d.finish()
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)?;
        if let Some(source) = &self.source {
            write!(f, ": {source}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

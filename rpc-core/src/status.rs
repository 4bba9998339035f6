//! Call outcomes: [`Code`] and [`Status`].
//!
//! Codes are numerically compatible with gRPC's. [`Code`] is an open newtype over
//! `u32` (as h2 keeps its `Reason`), so a code this version does not know still
//! round-trips unchanged through the framework.

use std::fmt;

use bytes::Bytes;

use crate::metadata::Metadata;

/// A status code, numerically compatible with gRPC's.
///
/// Unknown values are kept as they are: `Code::from_u32(99).as_u32() == 99`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Code(u32);

macro_rules! codes {
    ($( $(#[$doc:meta])* $name:ident = $value:expr, $text:expr; )*) => {
        impl Code {
            $( $(#[$doc])* pub const $name: Code = Code($value); )*

            /// The canonical upper-case name (`"DEADLINE_EXCEEDED"`), or `None` for a code
            /// this version does not know.
            pub const fn name(self) -> Option<&'static str> {
                match self.0 {
                    $( $value => Some($text), )*
                    _ => None,
                }
            }
        }
    };
}

codes! {
    /// Not an error; returned on success.
    OK = 0, "OK";
    /// The operation was cancelled, typically by the caller.
    CANCELLED = 1, "CANCELLED";
    /// Unknown error.
    UNKNOWN = 2, "UNKNOWN";
    /// The client specified an invalid argument.
    INVALID_ARGUMENT = 3, "INVALID_ARGUMENT";
    /// The deadline expired before the operation could complete.
    DEADLINE_EXCEEDED = 4, "DEADLINE_EXCEEDED";
    /// Some requested entity was not found.
    NOT_FOUND = 5, "NOT_FOUND";
    /// The entity a client attempted to create already exists.
    ALREADY_EXISTS = 6, "ALREADY_EXISTS";
    /// The caller does not have permission to execute the operation.
    PERMISSION_DENIED = 7, "PERMISSION_DENIED";
    /// Some resource has been exhausted (a quota, a limit, space).
    RESOURCE_EXHAUSTED = 8, "RESOURCE_EXHAUSTED";
    /// The system is not in a state required for the operation.
    FAILED_PRECONDITION = 9, "FAILED_PRECONDITION";
    /// The operation was aborted, typically by a concurrency conflict.
    ABORTED = 10, "ABORTED";
    /// The operation was attempted past the valid range.
    OUT_OF_RANGE = 11, "OUT_OF_RANGE";
    /// The operation is not implemented or supported (unknown service or method).
    UNIMPLEMENTED = 12, "UNIMPLEMENTED";
    /// An invariant expected by the system was broken.
    INTERNAL = 13, "INTERNAL";
    /// The service is currently unavailable; a transient condition.
    UNAVAILABLE = 14, "UNAVAILABLE";
    /// Unrecoverable data loss or corruption.
    DATA_LOSS = 15, "DATA_LOSS";
    /// The request does not have valid authentication credentials.
    UNAUTHENTICATED = 16, "UNAUTHENTICATED";
}

impl Code {
    /// The code with this numeric value (known or not).
    pub const fn from_u32(value: u32) -> Code {
        Code(value)
    }

    /// The numeric value, as carried on the wire.
    pub const fn as_u32(self) -> u32 {
        self.0
    }
}

impl fmt::Debug for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name),
            None => write!(f, "Code({})", self.0),
        }
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// The outcome of a failed call: a [`Code`], a UTF-8 message, optional details bytes
/// (for example an encoded `google.rpc.Status`), and the response metadata.
///
/// ```
/// use rpc_core::{Code, Status};
///
/// // A handler fails a call with a status ...
/// fn lookup(key: &str) -> Result<u64, Status> {
///     match key {
///         "answer" => Ok(42),
///         _ => Err(Status::not_found(format!("no key {key:?}"))),
///     }
/// }
///
/// // ... and the caller gets it as it was sent, and decides by its code.
/// let status = lookup("question").unwrap_err();
/// assert_eq!(status.code(), Code::NOT_FOUND);
/// assert_eq!(status.message(), r#"no key "question""#);
/// assert_eq!(status.to_string(), r#"NOT_FOUND: no key "question""#);
/// ```
#[derive(Clone, PartialEq)]
pub struct Status {
    code: Code,
    message: String,
    details: Bytes,
    metadata: Metadata,
    /// Set by the client when the request certainly reached no handler.
    unprocessed: bool,
    /// ...because the server refused this one call (HTTP/2's REFUSED_STREAM), not
    /// because it could not be reached or is going away.
    refused: bool,
    /// ...because a graceful GOAWAY turned it away: the server drains or rotates the
    /// connection (an idle timeout), neither gone nor failing.
    drained: bool,
    /// Set by a server's layer that refused the call before its handler ran (an
    /// authentication or authorization layer): the duplicate cache records no outcome
    /// for it. Never carried on the wire.
    before_handler: bool,
}

macro_rules! constructors {
    ($( $(#[$doc:meta])* $fn:ident => $code:ident; )*) => {
        impl Status {
            $(
                $(#[$doc])*
                pub fn $fn(message: impl Into<String>) -> Status {
                    Status::new(Code::$code, message)
                }
            )*
        }
    };
}

constructors! {
    /// A `CANCELLED` status.
    cancelled => CANCELLED;
    /// An `UNKNOWN` status.
    unknown => UNKNOWN;
    /// An `INVALID_ARGUMENT` status.
    invalid_argument => INVALID_ARGUMENT;
    /// A `DEADLINE_EXCEEDED` status.
    deadline_exceeded => DEADLINE_EXCEEDED;
    /// A `NOT_FOUND` status.
    not_found => NOT_FOUND;
    /// An `ALREADY_EXISTS` status.
    already_exists => ALREADY_EXISTS;
    /// A `PERMISSION_DENIED` status.
    permission_denied => PERMISSION_DENIED;
    /// A `RESOURCE_EXHAUSTED` status.
    resource_exhausted => RESOURCE_EXHAUSTED;
    /// A `FAILED_PRECONDITION` status.
    failed_precondition => FAILED_PRECONDITION;
    /// An `ABORTED` status.
    aborted => ABORTED;
    /// An `OUT_OF_RANGE` status.
    out_of_range => OUT_OF_RANGE;
    /// An `UNIMPLEMENTED` status.
    unimplemented => UNIMPLEMENTED;
    /// An `INTERNAL` status.
    internal => INTERNAL;
    /// An `UNAVAILABLE` status.
    unavailable => UNAVAILABLE;
    /// A `DATA_LOSS` status.
    data_loss => DATA_LOSS;
    /// An `UNAUTHENTICATED` status.
    unauthenticated => UNAUTHENTICATED;
}

impl Status {
    /// A status with a code and a message.
    pub fn new(code: Code, message: impl Into<String>) -> Status {
        Status {
            code,
            message: message.into(),
            details: Bytes::new(),
            metadata: Metadata::new(),
            unprocessed: false,
            refused: false,
            drained: false,
            before_handler: false,
        }
    }

    /// Whether the request certainly reached no handler: it was never written (the
    /// connection could not be made, or the channel was backing off), or the server
    /// said it would not read it (its id was above a GOAWAY's `last_id`, or, on the
    /// gRPC wire, it reset the call's stream with REFUSED_STREAM before answering).
    /// Such a call is safe to send again whatever the method. Set by the client only;
    /// never carried on the wire.
    pub fn is_unprocessed(&self) -> bool {
        self.unprocessed
    }

    /// Marks the status as [unprocessed](Self::is_unprocessed).
    pub(crate) fn into_unprocessed(mut self) -> Status {
        self.unprocessed = true;
        self
    }

    /// Marks the status as [unprocessed](Self::is_unprocessed) because a graceful
    /// GOAWAY turned the call away: a balancer neither ejects the replica for it nor
    /// counts it as a failure (a connection rotated or timed out while idle refuses
    /// every call in flight above its `last_id`; counted, three ejected a healthy
    /// replica). A replica really going away refuses the next connection.
    pub(crate) fn into_drained(mut self) -> Status {
        self.unprocessed = true;
        self.drained = true;
        self
    }

    /// Whether a graceful GOAWAY turned the call away ([`into_drained`](Self::into_drained)).
    pub(crate) fn is_drained(&self) -> bool {
        self.drained
    }

    /// Clears the [unprocessed](Self::is_unprocessed) mark: the status of a last
    /// attempt that reached no handler, when an earlier attempt of the same call may
    /// have run.
    pub(crate) fn into_possibly_run(mut self) -> Status {
        self.unprocessed = false;
        self.refused = false;
        self.drained = false;
        self
    }

    /// Marks the status as [unprocessed](Self::is_unprocessed) because the server
    /// refused this one call (shedding load, say) while its connection goes on, or
    /// turned away a connection it never served with a graceful GOAWAY (a server
    /// draining for good): a failure of the replica, counted toward its ejection,
    /// but not proof that it is gone.
    pub(crate) fn into_refused(mut self) -> Status {
        self.unprocessed = true;
        self.refused = true;
        self
    }

    /// Whether the server refused this one call unprocessed ([`into_refused`](Self::into_refused)):
    /// a replica that does so is not gone, and is not ejected for it at once.
    pub(crate) fn is_refused(&self) -> bool {
        self.refused
    }

    /// Marks a server's refusal of a call whose handler never ran (an auth layer's):
    /// a keyed call refused so leaves no outcome in the duplicate cache, which a peer
    /// without credentials could otherwise fill, pushing out the outcomes that
    /// callers' retries need. A retry of it runs the layers again.
    pub(crate) fn into_before_handler(mut self) -> Status {
        self.before_handler = true;
        self
    }

    /// Whether a server's layer refused the call before its handler ran
    /// ([`into_before_handler`](Self::into_before_handler)).
    pub(crate) fn is_before_handler(&self) -> bool {
        self.before_handler
    }

    /// Attaches details bytes (opaque to the framework).
    pub fn with_details(mut self, details: impl Into<Bytes>) -> Status {
        self.details = details.into();
        self
    }

    /// Attaches response metadata.
    pub fn with_metadata(mut self, metadata: Metadata) -> Status {
        self.metadata = metadata;
        self
    }

    /// The code.
    pub fn code(&self) -> Code {
        self.code
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The details bytes (empty if none).
    pub fn details(&self) -> &Bytes {
        &self.details
    }

    /// The response metadata that came with the status.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// Mutable access to the response metadata.
    pub fn metadata_mut(&mut self) -> &mut Metadata {
        &mut self.metadata
    }

    /// Splits the status into its parts.
    pub fn into_parts(self) -> (Code, String, Bytes, Metadata) {
        (self.code, self.message, self.details, self.metadata)
    }
}

impl fmt::Debug for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Status");
        d.field("code", &self.code).field("message", &self.message);
        if !self.details.is_empty() {
            d.field("details", &self.details);
        }
        if !self.metadata.is_empty() {
            d.field("metadata", &self.metadata);
        }
        d.finish()
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.message.is_empty() {
            write!(f, "{}", self.code)
        } else {
            write!(f, "{}: {}", self.code, self.message)
        }
    }
}

impl std::error::Error for Status {}

impl From<crate::Error> for Status {
    /// A connection-level failure seen by a call: `UNAVAILABLE` with the cause.
    fn from(err: crate::Error) -> Status {
        Status::unavailable(err.to_string())
    }
}

/// The most bytes of peer input a status message quotes (see [`quoted`]).
pub const MAX_QUOTED_LEN: usize = 200;

/// `text` as a status message may quote it: cut to at most [`MAX_QUOTED_LEN`] bytes,
/// at a character boundary, with `…` after the cut. For messages that repeat what a
/// peer sent (an unknown method or service name, a header): the peer's input may be
/// tens of KiB (a method name on the framework's wire, a `:path` within HTTP/2's header
/// list limit), and echoed whole it went back as a `grpc-message` larger than gRPC
/// clients take (grpc-core refuses response metadata over 8 KiB, and reported
/// `RESOURCE_EXHAUSTED` instead of the call's `UNIMPLEMENTED`).
pub fn quoted(text: &str) -> std::borrow::Cow<'_, str> {
    if text.len() <= MAX_QUOTED_LEN {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut end = MAX_QUOTED_LEN;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    std::borrow::Cow::Owned(format!("{}…", &text[..end]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoted_input_is_cut_at_a_char_boundary() {
        assert_eq!(quoted("pkg.Svc/M"), "pkg.Svc/M");
        let exact = "a".repeat(MAX_QUOTED_LEN);
        assert_eq!(quoted(&exact), exact);
        let long = "a".repeat(60_000);
        assert_eq!(quoted(&long), format!("{}…", "a".repeat(MAX_QUOTED_LEN)));
        // A 3-byte character across the bound is left out whole.
        let wide = format!("{}€€", "a".repeat(MAX_QUOTED_LEN - 1));
        assert_eq!(
            quoted(&wide),
            format!("{}…", "a".repeat(MAX_QUOTED_LEN - 1))
        );
    }

    #[test]
    fn unknown_codes_round_trip() {
        let code = Code::from_u32(4242);
        assert_eq!(code.as_u32(), 4242);
        assert_eq!(code.name(), None);
        assert_eq!(format!("{code:?}"), "Code(4242)");
    }

    #[test]
    fn known_codes_have_grpc_numbers() {
        assert_eq!(Code::OK.as_u32(), 0);
        assert_eq!(Code::DEADLINE_EXCEEDED.as_u32(), 4);
        assert_eq!(Code::UNIMPLEMENTED.as_u32(), 12);
        assert_eq!(Code::UNAVAILABLE.as_u32(), 14);
        assert_eq!(Code::UNAUTHENTICATED.as_u32(), 16);
        assert_eq!(Code::from_u32(14).name(), Some("UNAVAILABLE"));
    }

    #[test]
    fn display_has_code_and_message() {
        let s = Status::not_found("no key \"a\"");
        assert_eq!(s.to_string(), "NOT_FOUND: no key \"a\"");
    }
}

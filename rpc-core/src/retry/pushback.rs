//! A server's word on whether and when a failed call may be retried: gRPC's
//! `grpc-retry-pushback-ms` (gRPC's retry design, A6), carried in the failed call's
//! status metadata on every wire of this framework (as a trailer on `grpc://`).

use std::time::Duration;

use crate::Status;

/// The metadata key of a server's pushback: a decimal number of milliseconds to wait
/// before retrying, or a negative (or unreadable) value: do not retry.
pub const RETRY_PUSHBACK: &str = "grpc-retry-pushback-ms";

/// What a server asks of the retries of a call it failed, put in the failed call's
/// [`Status`] with [`attach`](Pushback::attach). [`RetryLayer`](super::RetryLayer)
/// honours it as gRPC's clients do: a call whose status the policy would retry is
/// retried after exactly [`RetryAfter`](Pushback::RetryAfter)'s delay (instead of the
/// backoff, which starts again from its first step for the retries after it; the
/// call's own deadline still bounds the wait) and not at all after
/// [`Stop`](Pushback::Stop). A pushback never makes a status retryable that the policy
/// would not retry.
///
/// ```
/// use std::time::Duration;
/// use rpc_core::{retry::Pushback, Status};
///
/// // In a handler that sheds load: try again in half a second.
/// let status = Pushback::RetryAfter(Duration::from_millis(500))
///     .attach(Status::unavailable("overloaded"));
/// assert_eq!(Pushback::of(&status), Some(Pushback::RetryAfter(Duration::from_millis(500))));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pushback {
    /// Retry, if the policy would, after this long.
    RetryAfter(Duration),
    /// Do not retry this call.
    Stop,
}

impl Pushback {
    /// The pushback `status` carries, if any. A value that is not a decimal number of
    /// milliseconds (negative, empty, text, a sign), or one past `u64`, is
    /// [`Stop`](Pushback::Stop), as gRPC reads it; so are several values.
    pub fn of(status: &Status) -> Option<Pushback> {
        let metadata = status.metadata();
        let text = metadata.get(RETRY_PUSHBACK)?.as_str().unwrap_or("");
        if metadata.get_all(RETRY_PUSHBACK).nth(1).is_some()
            || text.is_empty()
            || !text.bytes().all(|b| b.is_ascii_digit())
        {
            return Some(Pushback::Stop);
        }
        Some(match text.parse::<u64>() {
            Ok(ms) => Pushback::RetryAfter(Duration::from_millis(ms)),
            Err(_) => Pushback::Stop,
        })
    }

    /// `status` with this pushback in its metadata, in place of any it had.
    pub fn attach(self, mut status: Status) -> Status {
        let value = match self {
            Pushback::RetryAfter(delay) => u64::try_from(delay.as_millis())
                .unwrap_or(u64::MAX)
                .to_string(),
            Pushback::Stop => "-1".to_owned(),
        };
        status
            .metadata_mut()
            .insert(RETRY_PUSHBACK, value)
            .expect("a valid text entry");
        status
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_read_as_grpc_reads_them() {
        let with = |value: &str| {
            let mut status = Status::unavailable("x");
            status
                .metadata_mut()
                .insert(RETRY_PUSHBACK, value.to_owned())
                .unwrap();
            Pushback::of(&status)
        };
        assert_eq!(Pushback::of(&Status::unavailable("x")), None);
        assert_eq!(with("0"), Some(Pushback::RetryAfter(Duration::ZERO)));
        assert_eq!(
            with("250"),
            Some(Pushback::RetryAfter(Duration::from_millis(250)))
        );
        for stop in [
            "-1",
            "",
            "soon",
            "1.5",
            "+5",
            " 5",
            "99999999999999999999999",
        ] {
            assert_eq!(with(stop), Some(Pushback::Stop), "{stop:?}");
        }
        let status = Pushback::Stop
            .attach(Pushback::RetryAfter(Duration::from_secs(1)).attach(Status::unavailable("x")));
        assert_eq!(
            status.metadata().get_all(RETRY_PUSHBACK).count(),
            1,
            "replaced"
        );
        assert_eq!(Pushback::of(&status), Some(Pushback::Stop));
        let mut twice =
            Pushback::RetryAfter(Duration::from_secs(1)).attach(Status::unavailable("x"));
        twice.metadata_mut().append(RETRY_PUSHBACK, "1000").unwrap();
        assert_eq!(Pushback::of(&twice), Some(Pushback::Stop), "two values");
    }
}

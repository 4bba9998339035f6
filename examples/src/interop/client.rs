//! The interop cases a client runs: [`TestCase`], its names as `interop-client
//! --test-case` takes them, [`Target`] (the channels a case uses) and
//! [`TestCase::run`].

use std::{fmt, str::FromStr, time::Duration};

use rpc_core::{client::Channel, compress::Compression};

use super::{cancel_cases, cases, compression_cases};

/// The channels to one interop server that the cases run over.
#[derive(Clone, Debug)]
pub struct Target {
    /// Compression on ([`Compression::default`]: messages from 1 KiB up, negotiated),
    /// so far as this build has it. Every case uses this one but the next.
    pub channel: Channel,
    /// Compression off: `client_compressed_streaming` sends its uncompressed probe
    /// here, since stream messages on `channel` are compressed by size alone.
    pub plain: Channel,
    /// The URI both channels connect to: its scheme decides which cases the
    /// transport can run ([`TestCase::unavailable`]).
    pub uri: String,
}

impl Target {
    /// Connects both channels to a `tcp://`, `tls://`, `unix://`, `tls+unix://`,
    /// `udp://`, `rdma://` or `rdma+unix://` URI (TLS trusting the system's roots).
    pub async fn connect(uri: &str) -> Result<Target, rpc_core::Error> {
        Target::connect_with(uri, &rpc_connect::ConnectOptions::new()).await
    }

    /// [`connect`](Self::connect), with `options`' TLS settings (their channel
    /// settings are replaced by the two this target needs).
    pub async fn connect_with(
        uri: &str,
        options: &rpc_connect::ConnectOptions,
    ) -> Result<Target, rpc_core::Error> {
        let compressing = Channel::builder().compression(Some(Compression::default()))?;
        Ok(Target {
            channel: rpc_connect::connect_with(uri, &options.clone().channel(compressing)).await?,
            plain: rpc_connect::connect_with(uri, &options.clone().channel(Channel::builder()))
                .await?,
            uri: uri.to_owned(),
        })
    }
}

/// Hang guard for one case: a case that takes longer fails. Never a measure of speed;
/// each call inside also carries [`CALL_TIMEOUT`].
pub const CASE_GUARD: Duration = Duration::from_secs(60);

/// Deadline of every call a case makes, except where the case is about deadlines. UDP
/// calls need one (a silent server costs the whole deadline), and it keeps a broken
/// server from hanging the client.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);

macro_rules! test_cases {
    ($( $(#[$doc:meta])* $variant:ident => $name:literal, )*) => {
        /// One case of gRPC's interop descriptions (`docs/interop.md` says how each is
        /// adapted).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum TestCase {
            $( $(#[$doc])* $variant, )*
        }

        impl TestCase {
            /// Every case, in the order `--test-case all` runs them.
            pub const ALL: &'static [TestCase] = &[$(TestCase::$variant,)*];

            /// The case's name, as gRPC spells it (`empty_unary`).
            pub fn name(self) -> &'static str {
                match self {
                    $(TestCase::$variant => $name,)*
                }
            }
        }
    };
}

test_cases! {
    /// `EmptyCall` with an empty message succeeds.
    EmptyUnary => "empty_unary",
    /// `UnaryCall` with a 271,828-byte payload gets 314,159 bytes back.
    LargeUnary => "large_unary",
    /// `StreamingInputCall` with four payloads gets their total size, 74,922.
    ClientStreaming => "client_streaming",
    /// `StreamingOutputCall` gets four responses of the sizes asked for, in order.
    ServerStreaming => "server_streaming",
    /// `FullDuplexCall`: four requests, each sent after the previous answer.
    PingPong => "ping_pong",
    /// `FullDuplexCall` with no requests gets no responses and succeeds.
    EmptyStream => "empty_stream",
    /// Echo metadata comes back as headers and trailers (unary and bidirectional).
    CustomMetadata => "custom_metadata",
    /// A status asked for in the request comes back (unary and bidirectional).
    StatusCodeAndMessage => "status_code_and_message",
    /// A status message with whitespace and non-ASCII characters comes back intact.
    SpecialStatusMessage => "special_status_message",
    /// `TestService/UnimplementedCall` answers `UNIMPLEMENTED`.
    UnimplementedMethod => "unimplemented_method",
    /// `UnimplementedService/UnimplementedCall`, served by nobody: `UNIMPLEMENTED`.
    UnimplementedService => "unimplemented_service",
    /// A `StreamingInputCall` dropped after it opened, before any message.
    CancelAfterBegin => "cancel_after_begin",
    /// A `FullDuplexCall` dropped after its first response.
    CancelAfterFirstResponse => "cancel_after_first_response",
    /// A `FullDuplexCall` the server never answers, with a 1 ms deadline.
    TimeoutOnSleepingServer => "timeout_on_sleeping_server",
    /// Unary requests sent compressed and not; the server checks which.
    ClientCompressedUnary => "client_compressed_unary",
    /// Unary responses the server compresses or not, as asked.
    ServerCompressedUnary => "server_compressed_unary",
    /// Stream messages sent compressed and not; the server checks which.
    ClientCompressedStreaming => "client_compressed_streaming",
    /// Streamed responses the server compresses or not, as asked per message.
    ServerCompressedStreaming => "server_compressed_streaming",
}

impl TestCase {
    /// Whether the case cancels a call (tests can check the server's side on an
    /// in-process server with `ServerStats`).
    pub fn cancels(self) -> bool {
        matches!(
            self,
            TestCase::CancelAfterBegin | TestCase::CancelAfterFirstResponse
        )
    }

    /// Whether the case needs compression on the channel (and in `rpc-core`).
    pub fn compresses(self) -> bool {
        matches!(
            self,
            TestCase::ClientCompressedUnary
                | TestCase::ServerCompressedUnary
                | TestCase::ClientCompressedStreaming
                | TestCase::ServerCompressedStreaming
        )
    }

    /// Why this build cannot run the case, if it cannot: the compression cases need
    /// one of rpc-core's compression features (`zstd`, `gzip`).
    pub fn unavailable(self) -> Option<&'static str> {
        (self.compresses() && !Compression::is_available()).then_some(
            "not available: rpc-core was built without compression (its cargo features `zstd` \
             and `gzip`)",
        )
    }

    /// Runs the case against `target`; `Err` says why it failed (a case
    /// [unavailable](Self::unavailable) over `target` fails with that reason). The
    /// whole case is bounded by [`CASE_GUARD`].
    pub async fn run(self, target: &Target) -> Result<(), String> {
        if let Some(why) = self.unavailable() {
            return Err(why.to_owned());
        }
        let channel = target.channel.clone();
        let plain = target.plain.clone();
        let case = async move {
            match self {
                TestCase::EmptyUnary => cases::empty_unary(channel).await,
                TestCase::LargeUnary => cases::large_unary(channel).await,
                TestCase::ClientStreaming => cases::client_streaming(channel).await,
                TestCase::ServerStreaming => cases::server_streaming(channel).await,
                TestCase::PingPong => cases::ping_pong(channel).await,
                TestCase::EmptyStream => cases::empty_stream(channel).await,
                TestCase::CustomMetadata => cases::custom_metadata(channel).await,
                TestCase::StatusCodeAndMessage => cases::status_code_and_message(channel).await,
                TestCase::SpecialStatusMessage => cases::special_status_message(channel).await,
                TestCase::UnimplementedMethod => cases::unimplemented_method(channel).await,
                TestCase::UnimplementedService => cases::unimplemented_service(channel).await,
                TestCase::CancelAfterBegin => cancel_cases::cancel_after_begin(channel).await,
                TestCase::CancelAfterFirstResponse => {
                    cancel_cases::cancel_after_first_response(channel).await
                }
                TestCase::TimeoutOnSleepingServer => {
                    cancel_cases::timeout_on_sleeping_server(channel).await
                }
                TestCase::ClientCompressedUnary => {
                    compression_cases::client_compressed_unary(channel).await
                }
                TestCase::ServerCompressedUnary => {
                    compression_cases::server_compressed_unary(channel).await
                }
                TestCase::ClientCompressedStreaming => {
                    compression_cases::client_compressed_streaming(channel, plain).await
                }
                TestCase::ServerCompressedStreaming => {
                    compression_cases::server_compressed_streaming(channel).await
                }
            }
        };
        tokio::time::timeout(CASE_GUARD, case)
            .await
            .unwrap_or_else(|_| Err(format!("did not finish within {CASE_GUARD:?}")))
    }
}

impl fmt::Display for TestCase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is not a case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownCase(pub String);

impl fmt::Display for UnknownCase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown test case {:?}; the cases are:", self.0)?;
        for case in TestCase::ALL {
            write!(f, " {case}")?;
        }
        Ok(())
    }
}

impl std::error::Error for UnknownCase {}

impl FromStr for TestCase {
    type Err = UnknownCase;

    fn from_str(name: &str) -> Result<TestCase, UnknownCase> {
        TestCase::ALL
            .iter()
            .copied()
            .find(|case| case.name() == name)
            .ok_or_else(|| UnknownCase(name.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_are_unique() {
        for case in TestCase::ALL {
            assert_eq!(case.name().parse::<TestCase>(), Ok(*case));
        }
        let mut names: Vec<_> = TestCase::ALL.iter().map(|c| c.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), TestCase::ALL.len());
        assert!("all".parse::<TestCase>().is_err());
    }
}

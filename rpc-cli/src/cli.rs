//! The command line: subcommands, their flags, and the examples each `--help` shows.

use std::{path::PathBuf, time::Duration};

use clap::{Args, Parser, Subcommand, ValueEnum};

const TOP_EXAMPLES: &str = "\
Examples:
  rpc list tcp://127.0.0.1:7000
  rpc describe tcp://127.0.0.1:7000 rpc.examples.v1.Echo
  rpc call tcp://127.0.0.1:7000 rpc.examples.v1.Echo/Say -d '{\"message\": \"hi\"}'
  rpc health unix:///run/app.sock
  rpc bench tcp://127.0.0.1:7000 rpc.examples.v1.Echo/Say -d '{}' -c 50 -z 10s

URIs: tcp://host:port, unix:///path, udp://host:port, rdma://host:port, rdma+unix:///path,
tls://host:port, tls+unix:///path, grpc://host:port, grpcs://host:port, and service names
static://a,b, dns://name[:port] (dns+udp://, dns+tls://, dns+grpc://, dns+grpcs:// for
the replicas' wire) and etcd://host:port/service.

Exit codes: 0 ok, 1 error, 2 usage, 4 not serving (health), 64 + status code for a
failed call (78: unreachable, 68: no connection within --timeout). See docs/cli.md.";

/// `rpc`: call, inspect, health-check and load-test RPC servers, over any transport.
#[derive(Debug, Parser)]
#[command(name = "rpc", version, after_help = TOP_EXAMPLES)]
pub struct Cli {
    /// The subcommand.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Calls a method with JSON requests and prints JSON responses.
    #[command(after_help = CALL_EXAMPLES)]
    Call(CallArgs),
    /// Lists the services a server serves, or one service's methods.
    #[command(after_help = LIST_EXAMPLES)]
    List(ListArgs),
    /// Shows a service, method, message or enum as .proto text.
    #[command(after_help = DESCRIBE_EXAMPLES)]
    Describe(DescribeArgs),
    /// Checks grpc.health.v1 health: exits 0 only when SERVING (a container probe).
    #[command(after_help = HEALTH_EXAMPLES)]
    Health(HealthArgs),
    /// Load-tests a unary method: latency histogram, percentiles, status counts.
    #[command(after_help = BENCH_EXAMPLES)]
    Bench(BenchArgs),
    /// Prints a shell completion script.
    #[command(after_help = COMPLETIONS_EXAMPLES)]
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

const CALL_EXAMPLES: &str = "\
Examples:
  rpc call tcp://127.0.0.1:7000 rpc.examples.v1.Echo/Say -d '{\"message\": \"hi\"}'
  rpc call unix:///tmp/echo.sock rpc.examples.v1.Echo/Count -d '{\"count\": 3}'   # one JSON line per message
  printf '{\"value\":1}\\n{\"value\":2}\\n' | rpc call udp://127.0.0.1:7000 rpc.examples.v1.Echo/Sum -d @-
  rpc call tls://host:7443 --ca ca.pem pkg.Svc/Get -d @request.json -H 'x-user: ann' -v
  rpc call tcp://127.0.0.1:7000 rpc.examples.v1.Echo/Say --proto echo.proto -I proto -d '{}'

Requests are proto3 JSON (field names in lowerCamel or as in the .proto). Client and
bidirectional streams read a sequence of JSON values (JSON lines) and send each as it is
read. A failed call prints its status and exits 64 + its code.";

const LIST_EXAMPLES: &str = "\
Examples:
  rpc list tcp://127.0.0.1:7000
  rpc list tcp://127.0.0.1:7000 rpc.examples.v1.Echo
  rpc list rdma://127.0.0.1:7000 --proto echo.proto -I proto";

const DESCRIBE_EXAMPLES: &str = "\
Examples:
  rpc describe tcp://127.0.0.1:7000 rpc.examples.v1.Echo
  rpc describe tcp://127.0.0.1:7000 rpc.examples.v1.Echo/Say
  rpc describe tcp://127.0.0.1:7000 rpc.examples.v1.SayRequest";

const HEALTH_EXAMPLES: &str = "\
Examples:
  rpc health tcp://127.0.0.1:7000                       # the server as a whole
  rpc health tcp://127.0.0.1:7000 rpc.examples.v1.Echo  # one service
  rpc health tls://app:7443 --ca ca.pem --timeout 1s

Exit codes: 0 SERVING, 4 any other health status, 64 + code when the check failed
(69 NOT_FOUND: unknown service, 76 UNIMPLEMENTED: no health service, 78: unreachable).";

const BENCH_EXAMPLES: &str = "\
Examples:
  rpc bench tcp://127.0.0.1:7000 rpc.examples.v1.Echo/Say -d '{\"message\":\"hi\"}' -n 100000 -c 64
  rpc bench udp://127.0.0.1:7000 rpc.examples.v1.Echo/Say -d '{}' -z 30s --rps 20000 --warmup 1000
  rpc bench tcp://127.0.0.1:7000 rpc.examples.v1.Echo/Say -d '{}' -n 5000 --format json
  rpc bench tcp://127.0.0.1:7000 rpc.examples.v1.Echo/Say -d '{}' -z 10s --html report.html

The request is encoded once and its bytes reused for every call; responses are not
decoded (only their status is counted).

Exit code: 0 when the run completed, whatever the calls' statuses (read them in the
report: `ok`, `errors` and `status` with --format json); 1 or 64 + code when the run
could not start (bad request, unreachable server).";

const COMPLETIONS_EXAMPLES: &str = "\
Examples:
  rpc completions bash > /etc/bash_completion.d/rpc
  rpc completions zsh > \"${fpath[1]}/_rpc\"
  rpc completions fish > ~/.config/fish/completions/rpc.fish";

/// `uri` with its scheme in lowercase, as the rest of the CLI compares schemes
/// (they are case-insensitive, RFC 3986 §3.1).
fn lowercase_scheme(uri: &str) -> Result<String, String> {
    Ok(rpc_core::endpoint::lowercase_scheme(uri).into_owned())
}

/// How to reach the server: the URI, the time budget, metadata and TLS.
#[derive(Debug, Clone, Args)]
pub struct ConnArgs {
    /// The server: tcp://, unix://, udp://, rdma://, rdma+unix://, tls://, tls+unix://,
    /// grpc://, grpcs://, or a service name (static://, dns://, dns+udp:// and the other
    /// dns+ schemes, etcd://). Schemes in any case (kept lowercase).
    #[arg(value_parser = lowercase_scheme)]
    pub uri: String,

    /// Time budget of each call, e.g. 500ms, 10s, 1m (a bare number is seconds), or
    /// `none` (no deadline: an interactive stream). Connecting is bounded by it too.
    /// Default: 10s (`bench`: 20s).
    #[arg(
        long,
        value_name = "DURATION",
        value_parser = parse_timeout,
        allow_hyphen_values = true
    )]
    pub timeout: Option<Duration>,

    /// Request metadata `key: value` (repeatable); values of `-bin` keys are base64.
    #[arg(short = 'H', long = "header", value_name = "KEY:VALUE")]
    pub headers: Vec<String>,

    /// TLS: a PEM file of CA certificates to trust, besides the system's roots.
    #[arg(long, value_name = "PEM")]
    pub ca: Option<PathBuf>,

    /// TLS: a PEM client certificate (chain), for servers that require one (mTLS).
    #[arg(long, value_name = "PEM", requires = "key")]
    pub cert: Option<PathBuf>,

    /// TLS: the PEM private key of --cert.
    #[arg(long, value_name = "PEM", requires = "cert")]
    pub key: Option<PathBuf>,

    /// TLS: the name to check the server's certificate against, instead of the URI's host.
    #[arg(long, value_name = "NAME")]
    pub server_name: Option<String>,

    /// gRPC (grpc://, grpcs://, dns+grpc://, dns+grpcs://): the :authority of each
    /// request (the name a proxy or virtual host routes on), instead of the URI's
    /// host:port; over TLS also the name the certificate must carry, unless
    /// --server-name gives one.
    #[arg(long, value_name = "HOST[:PORT]")]
    pub authority: Option<String>,

    /// TLS: accept any server certificate, unchecked (self-signed test servers; the
    /// traffic is encrypted, but anyone on the path can pose as the server). Not with
    /// `--ca`, which it would leave unused.
    #[arg(long, conflicts_with = "ca")]
    pub insecure: bool,

    /// etcd://: reach etcd's members over TLS, trusting the CAs of this PEM file
    /// besides the system's roots.
    #[arg(long, value_name = "PEM")]
    pub etcd_ca: Option<PathBuf>,

    /// etcd://: a PEM client certificate for etcd (its --client-cert-auth), over TLS.
    #[arg(long, value_name = "PEM", requires = "etcd_key")]
    pub etcd_cert: Option<PathBuf>,

    /// etcd://: the PEM private key of --etcd-cert.
    #[arg(long, value_name = "PEM", requires = "etcd_cert")]
    pub etcd_key: Option<PathBuf>,

    /// etcd://: log in to etcd as this user (etcd's auth enable), with the password on
    /// the first line of --etcd-password-file.
    #[arg(long, value_name = "NAME", requires = "etcd_password_file")]
    pub etcd_user: Option<String>,

    /// etcd://: the file whose first line is --etcd-user's password.
    #[arg(long, value_name = "FILE", requires = "etcd_user")]
    pub etcd_password_file: Option<PathBuf>,

    /// Largest message this side sends or takes, e.g. 64MiB (suffixes KiB, MiB, GiB, or
    /// bytes; K, KB, M, MB, G, GB are powers of 1024 too), at most 1 GiB; the frame that
    /// carries it may be about 17 KiB larger (its metadata). Default: the framework's
    /// frame limit, 16 MiB for the whole frame (message and metadata). The server has a
    /// limit of its own.
    #[arg(long, value_name = "SIZE", value_parser = parse_message_size)]
    pub max_message_size: Option<usize>,
}

/// `--max-message-size`: a size of at most 1 GiB (a frame's length is 32 bits).
pub fn parse_message_size(text: &str) -> Result<usize, String> {
    match parse_size(text)? {
        size if size > 1 << 30 => Err(format!("{text:?}: at most 1GiB")),
        size => Ok(size),
    }
}

/// Parses `65536`, `64KiB`, `16MiB`, `1GiB` (also `K`, `M`, `G`, `KB`, `MB`, `GB`,
/// all powers of 1024).
pub fn parse_size(text: &str) -> Result<usize, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: usize = number
        .parse()
        .map_err(|_| format!("{text:?} is not a size (e.g. 65536, 64KiB, 16MiB)"))?;
    let scale: usize = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        other => {
            return Err(format!(
                "unknown unit {other:?} in {text:?} (KiB, MiB, GiB)"
            ))
        }
    };
    match number.checked_mul(scale) {
        Some(0) | None => Err(format!(
            "{text:?}: the size must be above zero and fit memory"
        )),
        Some(size) => Ok(size),
    }
}

/// Where schemas come from: server reflection by default, or `.proto` files.
#[derive(Debug, Clone, Args, Default)]
pub struct SchemaArgs {
    /// Read the schema from this .proto file instead of server reflection (repeatable).
    #[arg(long = "proto", value_name = "FILE")]
    pub protos: Vec<PathBuf>,

    /// A directory imports of --proto files are looked up in (repeatable). Default: the
    /// directory of each --proto file.
    #[arg(short = 'I', long = "import-path", value_name = "DIR")]
    pub import_paths: Vec<PathBuf>,

    /// Read the schema from this binary FileDescriptorSet (protoc -o / buf build -o).
    #[arg(long, value_name = "FILE")]
    pub protoset: Vec<PathBuf>,
}

/// `rpc call`.
#[derive(Debug, Clone, Args)]
pub struct CallArgs {
    /// Connection.
    #[command(flatten)]
    pub conn: ConnArgs,

    /// The method: `package.Service/Method` (or `package.Service.Method`, or gRPC's
    /// path `/package.Service/Method`).
    pub method: String,

    /// The request as JSON; `@FILE` reads a file, `@-` (or `@`) standard input. Client
    /// and bidirectional streams take a sequence of JSON values (an array stands for
    /// its elements). Without it, or empty: `{}` (unary and server streams), no
    /// messages (client and bidirectional streams).
    #[arg(
        short = 'd',
        long = "data",
        value_name = "JSON|@FILE|@-",
        allow_hyphen_values = true
    )]
    pub data: Option<String>,

    /// Print response headers and trailers (on stderr).
    #[arg(short, long)]
    pub verbose: bool,

    /// Print fields that have their default value too (an unset message field as null).
    #[arg(long)]
    pub emit_defaults: bool,

    /// Print field names as in the .proto, not lowerCamelCase.
    #[arg(long)]
    pub proto_names: bool,

    /// Print every response on one line (server and bidirectional streams always
    /// are).
    #[arg(long)]
    pub compact: bool,

    /// Retrying a failed unary call.
    #[command(flatten)]
    pub retry: RetryArgs,

    /// Schema source.
    #[command(flatten)]
    pub schema: SchemaArgs,
}

/// `rpc call`'s retries of a failed unary call, by the framework's retry layer
/// (`rpc_core::retry`). Off by default.
#[derive(Debug, Clone, Args, Default)]
pub struct RetryArgs {
    /// Retry a failed unary call up to N times (at most 100; default 0, no retry). A
    /// call that certainly reached no handler (never written, or turned away
    /// unprocessed) is retried whatever the method; a method whose .proto says
    /// `idempotency_level = IDEMPOTENT` or `NO_SIDE_EFFECTS` (or with --idempotent) also
    /// when it fails with a --retry-on code; any other failure is final, unless
    /// --at-most-once. Waits 50 ms before the first retry, doubling up to 2 s
    /// (jittered), or what the server asks for (grpc-retry-pushback-ms); every attempt
    /// within the call's --timeout. Streaming methods are not retried.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(0..=100))]
    pub retries: Option<u32>,

    /// The codes that make a safe-to-repeat method retry, by name or number,
    /// comma-separated (`UNAVAILABLE,RESOURCE_EXHAUSTED`, `14`). Default: UNAVAILABLE.
    #[arg(
        long,
        value_name = "CODE,...",
        value_delimiter = ',',
        value_parser = parse_code,
        requires = "retries"
    )]
    pub retry_on: Vec<rpc_core::Code>,

    /// Treat the method as safe to repeat, whatever its .proto says.
    #[arg(long, requires = "retries")]
    pub idempotent: bool,

    /// Also retry a method that is not safe to repeat after a failure that leaves its
    /// outcome unknown (the connection lost while the call was in flight), with a call
    /// key by which the server runs it at most once: this framework's servers keep a
    /// duplicate cache by default and answer a repeat from it; a server without one
    /// (another gRPC implementation) may run the call twice.
    #[arg(long, requires = "retries")]
    pub at_most_once: bool,
}

/// A status code by name (any case, `deadline_exceeded`) or number (0 to 16).
pub fn parse_code(text: &str) -> Result<rpc_core::Code, String> {
    let text = text.trim();
    let mut known = (0..=16).map(rpc_core::Code::from_u32);
    let found = match text.parse::<u32>() {
        Ok(number) => known.find(|code| code.as_u32() == number),
        Err(_) => known.find(|code| {
            code.name()
                .is_some_and(|name| name.eq_ignore_ascii_case(text))
        }),
    };
    found.ok_or_else(|| {
        format!("{text:?} is not a status code (a name such as UNAVAILABLE, or 0 to 16)")
    })
}

/// `rpc list`.
#[derive(Debug, Clone, Args)]
pub struct ListArgs {
    /// Connection.
    #[command(flatten)]
    pub conn: ConnArgs,

    /// List this service's methods instead of the services.
    pub service: Option<String>,

    /// Schema source.
    #[command(flatten)]
    pub schema: SchemaArgs,
}

/// `rpc describe`.
#[derive(Debug, Clone, Args)]
pub struct DescribeArgs {
    /// Connection.
    #[command(flatten)]
    pub conn: ConnArgs,

    /// A service, method (`Service/Method` or `Service.Method`), message, enum, field
    /// (`Message.field`) or enum value (`Enum.VALUE`), by its full name; without it,
    /// every service the server lists.
    pub symbol: Option<String>,

    /// Schema source.
    #[command(flatten)]
    pub schema: SchemaArgs,
}

/// `rpc health`.
#[derive(Debug, Clone, Args)]
pub struct HealthArgs {
    /// Connection.
    #[command(flatten)]
    pub conn: ConnArgs,

    /// The service to check; default: the server as a whole ("").
    #[arg(default_value = "")]
    pub service: String,
}

/// Output format of `bench`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// A summary for people.
    Text,
    /// One JSON object, for scripts.
    Json,
    /// The self-contained HTML page of `--html` (as ghz's `-O html`).
    Html,
}

/// `rpc bench`.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Connection.
    #[command(flatten)]
    pub conn: ConnArgs,

    /// The unary method: `package.Service/Method`.
    pub method: String,

    /// The request as JSON (`@FILE`, `@-`), encoded once for every call. Default: `{}`.
    #[arg(
        short = 'd',
        long = "data",
        value_name = "JSON|@FILE|@-",
        allow_hyphen_values = true
    )]
    pub data: Option<String>,

    /// Calls in flight at once (workers), at most 10,000, each keeping a latency
    /// histogram of 58 KiB (and at most -n).
    #[arg(short = 'c', long, default_value_t = 50, value_parser = parse_concurrency)]
    pub concurrency: u32,

    /// Connections the workers share (round robin), at most 10,000 (and at most one
    /// per worker).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub connections: u32,

    /// Total calls to make (not counting warm-up). Default: 200 unless -z is given.
    #[arg(short = 'n', long = "calls", visible_alias = "total", conflicts_with = "duration", value_parser = clap::value_parser!(u64).range(1..))]
    pub calls: Option<u64>,

    /// Run for this long instead of a number of calls, e.g. 10s, 1m.
    #[arg(short = 'z', long = "duration", value_parser = parse_positive_duration)]
    pub duration: Option<Duration>,

    /// Limit the rate to this many calls per second (all workers together).
    #[arg(long, value_name = "N", value_parser = parse_rate)]
    pub rps: Option<f64>,

    /// Calls made before measuring, not counted.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub warmup: u64,

    /// Output format of the summary on stdout.
    #[arg(short = 'O', long, value_enum, default_value_t = Format::Text)]
    pub format: Format,

    /// Also write a self-contained HTML report (latency distribution as SVG) to FILE.
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,

    /// No progress bar, even on a terminal.
    #[arg(long)]
    pub no_progress: bool,

    /// Threads that run the workers and connections (1: one thread, no work stealing),
    /// at most 1,024. Default: one per CPU.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub threads: Option<u32>,

    /// Schema source.
    #[command(flatten)]
    pub schema: SchemaArgs,
}

/// The most calls `bench -c` keeps in flight: each worker has a latency histogram of
/// its own (58 KiB, merged at the end), so this many take some 570 MiB; -c 100,000
/// (the bound before) took 5.8 GB before the first call (from a review).
pub const MAX_CONCURRENCY: u32 = 10_000;

/// `-c`'s value: a number of workers from 1 to [`MAX_CONCURRENCY`].
fn parse_concurrency(text: &str) -> Result<u32, String> {
    match text.trim().parse::<u32>() {
        Ok(workers @ 1..=MAX_CONCURRENCY) => Ok(workers),
        Ok(_) => Err(format!(
            "{text:?}: at most {MAX_CONCURRENCY} calls in flight (each worker keeps a \
             latency histogram of 58 KiB), and at least 1"
        )),
        Err(_) => Err(format!(
            "{text:?} is not a number of calls in flight (1 to {MAX_CONCURRENCY})"
        )),
    }
}

/// `--rps`'s value: a positive number of calls per second.
fn parse_rate(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        // At least a call every 1000 s: a slower rate's interval overflowed the
        // workers' clocks (each worker panicked, and the report said 0 calls).
        Ok(rate) if rate.is_finite() && rate >= 0.001 => Ok(rate),
        _ => Err(format!(
            "{text:?}: give a number of calls per second, at least 0.001"
        )),
    }
}

/// `-z`'s value: a duration longer than nothing.
fn parse_positive_duration(text: &str) -> Result<Duration, String> {
    match parse_duration(text)? {
        zero if zero.is_zero() => Err(format!("{text:?}: a run of no time measures nothing")),
        // A year: past it an end instant may not fit in the clock (it panicked).
        long if long > MAX_RUN => Err(format!(
            "{text:?}: longer than a run can be (at most {} days)",
            MAX_RUN.as_secs() / 86_400
        )),
        duration => Ok(duration),
    }
}

/// The longest run `-z` takes.
const MAX_RUN: Duration = Duration::from_secs(365 * 86_400);

/// `--timeout`'s value: a duration, or `none` ([`NO_DEADLINE`]).
pub fn parse_timeout(text: &str) -> Result<Duration, String> {
    if text.trim().eq_ignore_ascii_case("none") {
        return Ok(NO_DEADLINE);
    }
    match parse_duration(text)? {
        zero if zero.is_zero() => Err(format!(
            "{text:?}: a call cannot finish in no time; give a duration, or `none` for no \
             deadline"
        )),
        timeout => Ok(timeout),
    }
}

/// `--timeout none`: calls without a deadline.
pub const NO_DEADLINE: Duration = Duration::MAX;

impl ConnArgs {
    /// The deadline of each call `--timeout` asks for: its duration, none for
    /// `--timeout none`, or `default` when it is not given.
    pub fn deadline(&self, default: Option<Duration>) -> Option<Duration> {
        match self.timeout {
            None => default,
            Some(NO_DEADLINE) => None,
            Some(timeout) => Some(timeout),
        }
    }

    /// The time budget of a schema lookup (reflection): the calls' deadline, or the
    /// default under `--timeout none` (a lookup is not interactive).
    pub fn lookup_timeout(&self) -> Duration {
        use crate::target::DEFAULT_TIMEOUT;
        self.deadline(Some(DEFAULT_TIMEOUT))
            .unwrap_or(DEFAULT_TIMEOUT)
    }
}

/// Parses `500ms`, `10s`, `1.5s`, `2m`, `1h`, `250us`, and sums of them as Go writes
/// them (`1h30m`, `1m30s`); a bare number is seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let not_a_duration = || format!("{text:?} is not a duration (e.g. 500ms, 10s, 2m, 1h30m)");
    if text.is_empty() {
        return Err(not_a_duration());
    }
    if text.starts_with('-') {
        return Err(format!("{text:?}: a duration cannot be negative"));
    }
    let mut rest = text;
    let mut seconds = 0.0;
    while !rest.is_empty() {
        let split = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(split);
        let value: f64 = number.parse().map_err(|_| not_a_duration())?;
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        let scale = match unit.trim() {
            "" if rest.len() == text.len() => 1.0, // a bare number
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" => 1e-6,
            "ns" => 1e-9,
            "m" | "min" => 60.0,
            "h" => 3600.0,
            "" => {
                return Err(format!(
                    "{number:?} in {text:?} needs a unit (ns, us, ms, s, m, h): only a \
                     number alone is seconds"
                ))
            }
            other => {
                return Err(format!(
                    "unknown unit {other:?} in {text:?} (ns, us, ms, s, m, h)"
                ))
            }
        };
        seconds += value * scale;
        rest = after;
    }
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("{text:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert!(parse_duration("fast").is_err());
        assert!(parse_duration("5 parsecs").is_err());
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("1m30.5s"), Ok(Duration::from_millis(90_500)));
        let missing = parse_duration("1h30").unwrap_err();
        assert!(missing.contains("needs a unit"), "{missing}");
        let negative = parse_duration("-5s").unwrap_err();
        assert!(negative.contains("cannot be negative"), "{negative}");
        assert!(parse_duration("").is_err());
        assert!(parse_timeout("0").is_err());
        assert!(parse_timeout("0s").is_err());
        assert_eq!(parse_timeout("none"), Ok(NO_DEADLINE));
        assert_eq!(parse_size("65536"), Ok(65536));
        assert_eq!(parse_size("64KiB"), Ok(64 << 10));
        assert_eq!(parse_size("32mb"), Ok(32 << 20));
        assert!(parse_size("0").is_err());
        assert!(parse_size("5 parsecs").is_err());
        assert_eq!(parse_message_size("1GiB"), Ok(1 << 30));
        assert!(parse_message_size("5GiB").is_err());
    }

    /// The CLI compares schemes (TLS flags, gRPC metadata rules, DNS checks, the
    /// transport's name) in lowercase: a server URI is taken in any case.
    #[test]
    fn uri_schemes_in_any_case_are_lowercased() {
        assert_eq!(
            lowercase_scheme("GRPCS://H:443/x"),
            Ok("grpcs://H:443/x".into())
        );
        assert_eq!(
            lowercase_scheme("Dns+Udp://kv:7"),
            Ok("dns+udp://kv:7".into())
        );
        assert_eq!(lowercase_scheme("localhost:7"), Ok("localhost:7".into()));
    }

    /// `bench -c` past its maximum is a usage error that says the maximum and why:
    /// each worker keeps a 58 KiB histogram, and -c 100000 took 5.8 GB up front.
    #[test]
    fn bench_concurrency_is_bounded() {
        let bench =
            |c: &str| Cli::try_parse_from(["rpc", "bench", "tcp://127.0.0.1:1", "p.S/M", "-c", c]);
        let Command::Bench(args) = bench("10000").unwrap().command else {
            panic!("not bench");
        };
        assert_eq!(args.concurrency, MAX_CONCURRENCY);
        for refused in ["10001", "100000", "0", "many"] {
            let err = bench(refused).unwrap_err().to_string();
            assert!(
                err.contains(&MAX_CONCURRENCY.to_string()),
                "{refused}: {err}"
            );
        }
        let err = bench("100000").unwrap_err().to_string();
        assert!(err.contains("at most 10000 calls in flight"), "{err}");
    }

    #[test]
    fn the_command_line_is_consistent() {
        <Cli as clap::CommandFactory>::command().debug_assert();
    }
}

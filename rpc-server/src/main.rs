//! The deployable server: the example key-value (and echo) service, the standard health
//! service, registration in etcd, and a graceful drain on SIGTERM.
//!
//! ```text
//! rpc-server [--listen URI]... [--register etcd://HOST:PORT[,HOST:PORT]/SERVICE]
//!            [--advertise URI|auto] [--ttl-s N] [--drain-timeout-ms N] [--name NAME]
//!            [--admin HOST:PORT] [--config FILE] [--log text|json]
//!            [--tls-cert PEM --tls-key PEM [--tls-client-ca PEM]] [--auth-tokens FILE]
//!            [--etcd-ca PEM] [--etcd-cert PEM --etcd-key PEM]
//!            [--etcd-user NAME --etcd-password-file FILE] [--no-reflection]
//!            [--max-connections N] [--max-concurrent-requests N] [--max-frame-len BYTES]
//!            [--max-large-request-bytes BYTES] [--max-unsent-answer-bytes BYTES]
//! ```
//!
//! - `--listen` may repeat (default `tcp://127.0.0.1:7000`): `tcp://`, `tls://`,
//!   `unix://`, `tls+unix://`, `udp://`, `rdma://`, `rdma+unix://` (RDMA: the soft
//!   provider), `grpc://` (gRPC's own wire, h2c: any gRPC client) or `grpcs://` (the
//!   same over TLS); port 0 picks a free port. UDP and RDMA carry no encryption, and
//!   `grpc://` is plaintext HTTP/2: listening on any of them at a non-loopback address
//!   logs a warning.
//! - `--tls-cert` and `--tls-key` (PEM files) are the certificate chain and key of the
//!   `tls://`, `tls+unix://` and `grpcs://` listeners; `--tls-client-ca` turns on mTLS (clients
//!   must present a certificate of one of its CAs). SIGHUP re-reads all three: new
//!   connections get the new certificate, open ones keep theirs.
//! - Server reflection (`grpc.reflection.v1` and `v1alpha`, `rpc_services`) lists
//!   and describes every service, for `rpc list`/`describe` and grpcurl;
//!   `--no-reflection` turns it off.
//! - `--auth-tokens FILE` requires a bearer token (`authorization: Bearer TOKEN`) on
//!   every call but the health checks, from the tokens in FILE (see
//!   `rpc_core::auth`); a call without a valid one gets `UNAUTHENTICATED`. (A call
//!   of a service or method the server does not have is answered `UNIMPLEMENTED`
//!   before any layer runs, as gRPC servers do, docs/wire.md 6.5: the names of the
//!   services are not secret from a peer without a token.) SIGHUP
//!   re-reads FILE: calls that arrive afterwards are checked against its tokens (a
//!   file that no longer parses, or holds no token, is logged and the tokens in use
//!   are kept).
//! - `--register` puts `--advertise` (default `auto`: the first listener's bound
//!   address) under the service in etcd, with a lease of `--ttl-s` seconds (default 5).
//!   A listener bound to every interface (`0.0.0.0`, `[::]`) has no address to
//!   register: `auto` is then refused, and `--advertise` must name one.
//! - A secured etcd: `--etcd-ca` (PEM, CAs trusted besides the system's roots)
//!   reaches its members over TLS (`https://`), and `--etcd-cert` with `--etcd-key`
//!   adds a client certificate (etcd's `--client-cert-auth`); `--etcd-user` with
//!   `--etcd-password-file` authenticates as an etcd user (etcd's `auth enable`; the
//!   file's first line is the password). Each needs `--register`. See
//!   `rpc_discovery_etcd::Cluster`.
//! - The bounds on what peers make the server hold, `rpc_core::server::ServerBuilder`'s
//!   (docs/wire.md §8, docs/security.md): `--max-connections` (10,000),
//!   `--max-concurrent-requests` per connection (256), `--max-frame-len` (16 MiB:
//!   requests and answers), `--max-large-request-bytes` (1 GiB, server-wide) and
//!   `--max-unsent-answer-bytes` (1 GiB, server-wide). A service with large answers to
//!   small requests exposed to untrusted clients lowers them.
//! - Every reply a handler finished, errors included, carries `x-served-by: NAME`
//!   (default: the advertised address); statuses the server makes itself (a deadline
//!   that stopped the handler, an unknown service) do not.
//! - `--admin HOST:PORT` (or a bare `PORT`, on 127.0.0.1; default off) serves the
//!   admin pages over HTTP/1.1 (`src/admin.rs`, on hyper), read-only (GET and HEAD):
//!   `/`, a live status page (per method calls/s, error rate, p50 and p99 over five
//!   minutes, as charts updated every second; uptime, version, listeners,
//!   configuration); `/connections` (each connection's peer, wire, age, calls in
//!   flight, bytes each way); `/rpcz` (recent and slow calls with their timing and
//!   status, slowest first, `?method=&status=&min_ms=`); and `/metrics`, Prometheus
//!   text (calls, errors and latency histograms per method, handlers in flight, open
//!   connections, duplicate-cache and TLS handshake counters, each with its `# HELP`;
//!   names in `docs/observability.md`) from `metrics-exporter-prometheus`. It has no
//!   authentication: a non-loopback address logs a warning. Prints
//!   `metrics on http://HOST:PORT/metrics`, then `admin on http://HOST:PORT/`.
//!   `--metrics HOST:PORT` is the same option under its older name (if both are
//!   given, the one given last: the command line's over the file's).
//! - Logs go to stderr through `tracing`: one line per event, as text (default) or as
//!   JSON objects (`--log json`), at INFO and above (or as `RUST_LOG` says: a level,
//!   `off`, or `target=level` directives).
//! - `--config FILE` reads the same options from a file, one `name value` per line
//!   (`listen tcp://0.0.0.0:7000`; a `#` at the start of a word starts a comment, so
//!   a path may hold one: `tls-key /keys/#2.pem`); a switch is its name alone
//!   (`no-reflection`). Flags on the command line win: a `--listen` there replaces the
//!   file's `listen` lines, and the other options take their last value. An unknown
//!   option, on the command line or in the file, is an error (exit 2, with the option
//!   named), as is a config file that cannot be read, a value that does not parse or
//!   is out of range, and options that do not go together; failures at run time (a
//!   port in use, etcd unreachable, a certificate file missing) exit 1. Exit 2 means a
//!   restart will not help until the command line or file changes.
//! - Prints `listening on URI` per listener, then `registered` if it registered.
//! - `--help` prints every flag with its default.
//! - SIGTERM or Ctrl-C: report NOT_SERVING and deregister first (probes and clients
//!   stop choosing it; 200 ms for watchers of etcd when registered), then GOAWAY and
//!   finish the calls in flight (up to the drain timeout). A second SIGTERM or Ctrl-C
//!   during that stops the process at once (exit 1). The handlers of these signals and
//!   of SIGHUP are installed first thing, before the arguments are read: a SIGHUP sent
//!   while the server starts (registering, say) is acted on once it has started, and
//!   never kills it half-registered; a SIGTERM or Ctrl-C while it registers stops it
//!   at once (exit 1; a key it may have put in etcd goes when its lease expires), and
//!   one while it binds is acted on once it serves (a drain, exit 0). Only in
//!   the process's first milliseconds, before its runtime is up, does a SIGTERM end it
//!   by the signal (exit status 143 in a shell), with nothing bound or registered.
//!
//! With no flags it needs nothing external. Registration goes through
//! `rpc-discovery-etcd`, which talks to etcd over the project's own gRPC client.

use std::time::Duration;

use rpc_connect::{AnyListener, ListenOptions};
use rpc_core::{
    auth::{BearerLayer, SharedTokens, TokenSet},
    server::Server,
    Endpoint,
};
use rpc_proto::{
    echo::{echo_server::EchoServer, EchoService},
    health::{HealthReporter, ServingStatus},
    kv::{key_value_server::KeyValueServer, MemoryStore},
};
use rpc_services::ServerBuilderExt;
use rpc_transport_tcp::tls::ServerTls;
use tokio::signal::unix::{signal, SignalKind};

mod admin;
mod metrics;
mod transport_metrics;

/// `rpc-server --help`: every flag, with its default (the module doc says more).
/// `tests/help.rs` checks that it names every flag the module doc and the code know.
/// Prints a line on standard output, which tools read (`listening on ...`); a reader
/// that has gone (`| head -1`) is no reason to stop serving (`println!` panicked, after
/// the server had registered).
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// The longest registration lease `--ttl-s` takes: etcd's own limit is near it (it
/// refuses 9,000,000,000 s), and past `i64` the lease wrapped to a negative TTL.
const MAX_TTL_S: u64 = 100_000_000;

const HELP: &str = "\
rpc-server: the example key-value and echo services and the health service, registered
in etcd, drained gracefully on SIGTERM.

USAGE:
    rpc-server [--listen URI]... [--register etcd://HOST:PORT[,HOST:PORT]/SERVICE]
               [--advertise URI|auto] [--ttl-s N] [--drain-timeout-ms N] [--name NAME]
               [--admin HOST:PORT] [--config FILE] [--log text|json]
               [--tls-cert PEM --tls-key PEM [--tls-client-ca PEM]] [--auth-tokens FILE]
               [--etcd-ca PEM] [--etcd-cert PEM --etcd-key PEM]
               [--etcd-user NAME --etcd-password-file FILE] [--no-reflection]
               [--max-connections N] [--max-concurrent-requests N] [--max-frame-len BYTES]
               [--max-large-request-bytes BYTES] [--max-unsent-answer-bytes BYTES]

OPTIONS:
    --listen URI             Serve on URI; may repeat. tcp://, tls://, unix://, tls+unix://,
                             udp://, rdma://, rdma+unix://, grpc://, grpcs://; port 0
                             picks a free port.
                             Default: tcp://127.0.0.1:7000
    --register ETCD_URI      Register in etcd under SERVICE with a lease, e.g.
                             etcd://127.0.0.1:2379/kv. Default: no registration
    --advertise URI|auto     The address registered; auto: the first listener's bound
                             address (refused for 0.0.0.0 or [::]). Default: auto
    --ttl-s N                The registration lease, in seconds. Default: 5
    --drain-timeout-ms N     On SIGTERM, how long calls in flight may finish. Default: 10000
    --name NAME              Sent as x-served-by on every reply a handler finished
                             (errors too; not on statuses the server makes itself:
                             a deadline, an unknown service). Default: the advertised
                             address
    --admin HOST:PORT        Serve the read-only admin pages over HTTP: / (live status
                             page), /connections, /rpcz (recent calls), /metrics
                             (Prometheus text). A bare PORT binds 127.0.0.1; other
                             addresses are reachable by anyone, without
                             authentication. Default: off
    --metrics HOST:PORT      The same as --admin (its older name)
    --config FILE            Read options from FILE, one `name value` per line (a `#` at
                             the start of a word starts a comment; a switch is its name
                             alone); the command line's win (its --listen replaces the
                             file's)
    --log text|json          Log format on stderr, INFO and above (RUST_LOG sets a
                             level, off, or target=level directives such as
                             info,rpc_core=debug). Default: text
    --tls-cert PEM           Certificate chain of the tls://, tls+unix:// and grpcs://
                             listeners
    --tls-key PEM            Its private key (with --tls-cert)
    --tls-client-ca PEM      Require client certificates from these CAs (mTLS);
                             repeatable, each file's CAs trusted. SIGHUP re-reads the
                             TLS files
    --auth-tokens FILE       Require `authorization: Bearer TOKEN` with a token from FILE on
                             every call but the health checks. SIGHUP re-reads FILE
    --etcd-ca PEM            Reach etcd over TLS (https://), trusting these CAs besides
                             the system's roots. Default: plain HTTP/2
    --etcd-cert PEM          A client certificate for etcd (--client-cert-auth), over
                             TLS; with --etcd-key
    --etcd-key PEM           Its private key (with --etcd-cert)
    --etcd-user NAME         Authenticate to etcd as this user (etcd's auth enable);
                             with --etcd-password-file
    --etcd-password-file FILE
                             The etcd user's password: the file's first line
    --no-reflection          Do not serve server reflection (grpc.reflection.v1 and
                             v1alpha), which lists and describes every service.
                             Default: served
    --max-connections N      Open connections at once, over every listener.
                             Default: 10000
    --max-concurrent-requests N
                             Calls in flight per connection (past it the server stops
                             reading that connection). Default: 256
    --max-frame-len BYTES    Largest request or answer frame. Default: 16777216
    --max-large-request-bytes BYTES
                             Bytes of large requests held at once, all connections
                             together; at least --max-frame-len (a smaller value is
                             raised to it). Default: 1073741824
    --max-unsent-answer-bytes BYTES
                             Bytes of answers held for clients that do not read them,
                             all connections together; past it the connections holding
                             the most are ended. Default: 1073741824
    -h, --help               Print this help

Exit status: 0 after a graceful stop; 2 for a mistake in the settings (an unknown
option, a missing or bad value, options that do not go together, a config file that
cannot be read or has a bad line): a restart will not help; 1 for any other failure.
";

/// A mistake in the command line or the config file: exit status 2 (as `rpc`'s usage
/// errors), so that a supervisor can tell it from a failure at run time, which a
/// restart may fix (this one needs an edit).
#[derive(Debug)]
struct Usage(String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

/// The options that take a value (`--name VALUE` or `--name=VALUE`).
const VALUE_FLAGS: &[&str] = &[
    "--listen",
    "--register",
    "--advertise",
    "--ttl-s",
    "--drain-timeout-ms",
    "--name",
    "--admin",
    "--metrics",
    "--config",
    "--log",
    "--tls-cert",
    "--tls-key",
    "--tls-client-ca",
    "--auth-tokens",
    "--etcd-ca",
    "--etcd-cert",
    "--etcd-key",
    "--etcd-user",
    "--etcd-password-file",
    "--max-connections",
    "--max-concurrent-requests",
    "--max-frame-len",
    "--max-large-request-bytes",
    "--max-unsent-answer-bytes",
];

/// The options that take none.
const SWITCHES: &[&str] = &["--no-reflection", "--help", "-h"];

/// How to reach a secured etcd: `--etcd-ca`, `--etcd-cert`/`--etcd-key`,
/// `--etcd-user`/`--etcd-password-file` (checked; the files are read when used).
#[derive(Debug, Default)]
struct EtcdSecurity {
    ca: Option<String>,
    identity: Option<(String, String)>,
    user: Option<(String, String)>,
}

/// The etcd options of `args`, or what is wrong with them (a usage error).
fn etcd_security(args: &[String], registering: bool) -> Result<EtcdSecurity, String> {
    let security = EtcdSecurity {
        ca: flag(args, "--etcd-ca"),
        identity: match (flag(args, "--etcd-cert"), flag(args, "--etcd-key")) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            _ => return Err("--etcd-cert and --etcd-key go together".into()),
        },
        user: match (
            flag(args, "--etcd-user"),
            flag(args, "--etcd-password-file"),
        ) {
            (Some(user), Some(file)) => Some((user, file)),
            (None, None) => None,
            _ => return Err("--etcd-user and --etcd-password-file go together".into()),
        },
    };
    let any = security.ca.is_some() || security.identity.is_some() || security.user.is_some();
    if any && !registering {
        return Err("the --etcd-* options need --register (they say how to reach etcd)".into());
    }
    Ok(security)
}

impl EtcdSecurity {
    /// The cluster of `members`, with these settings: its files read now.
    fn cluster(
        &self,
        members: &[String],
    ) -> Result<rpc_discovery_etcd::Cluster, Box<dyn std::error::Error>> {
        let mut cluster = rpc_discovery_etcd::Cluster::new(members)?;
        if self.ca.is_some() || self.identity.is_some() {
            let mut tls = rpc_transport_tcp::tls::ClientTls::builder();
            if let Some(ca) = &self.ca {
                tls = tls.ca_file(ca);
            }
            if let Some((cert, key)) = &self.identity {
                tls = tls.identity_files(cert, key);
            }
            let tls = tls
                .build()
                .map_err(|e| format!("--etcd-ca, --etcd-cert or --etcd-key: {e}"))?;
            cluster = cluster.tls(tls);
        }
        if let Some((user, file)) = &self.user {
            if self.ca.is_none() && self.identity.is_none() {
                tracing::warn!(
                    "--etcd-user without --etcd-ca: the etcd password and token cross the \
                     network in clear text (keep etcd's client port on a trusted network)"
                );
            }
            let text = std::fs::read_to_string(file)
                .map_err(|e| format!("--etcd-password-file {file}: {e}"))?;
            let password = text.lines().next().unwrap_or_default();
            if password.is_empty() {
                return Err(
                    format!("--etcd-password-file {file}: no password on its first line").into(),
                );
            }
            cluster = cluster.user(user, password);
        }
        Ok(cluster)
    }
}

/// The options that may be given more than once, each adding a value.
const REPEATABLE: [&str; 2] = ["--listen", "--tls-client-ca"];

/// Notes option `name` (`--name`) as given, in `given` (each as written): an error,
/// naming the option as `shown` (`--name` on the command line, `name` in the config
/// file), if it takes one value and was given already, also under its other name
/// (`--metrics` is `--admin`'s older name).
fn given_once(given: &mut Vec<String>, name: &str, shown: &str) -> Result<(), String> {
    fn option(name: &str) -> &str {
        if name == "--metrics" {
            "--admin"
        } else {
            name
        }
    }
    if REPEATABLE.contains(&name) {
        return Ok(());
    }
    if let Some(first) = given.iter().find(|first| option(first) == option(name)) {
        if first == name {
            return Err(format!("{shown} is given twice: it takes one value"));
        }
        let dashes = if shown.starts_with("--") { "--" } else { "" };
        return Err(format!(
            "{dashes}admin and {dashes}metrics (its older name) are both given: give one"
        ));
    }
    given.push(name.to_owned());
    Ok(())
}

/// Refuses what is not an option of `--help`, instead of ignoring a misspelt one, and
/// a one-valued option given twice.
fn check_args(args: &[String]) -> Result<(), String> {
    let mut iter = args.iter();
    let mut given = Vec::new();
    while let Some(arg) = iter.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((name, _)) if name.starts_with("--") => (name, true),
            _ => (arg.as_str(), false),
        };
        if VALUE_FLAGS.contains(&name) {
            if !inline && iter.next().is_none() {
                return Err(format!("{name} needs a value (see --help)"));
            }
            // One value each but for the repeatable ones: the last silently won
            // (from a review: `--admin A --metrics B` served B alone).
            given_once(&mut given, name, name)?;
        } else if SWITCHES.contains(&name) {
            if inline {
                return Err(format!("{name} takes no value"));
            }
        } else if name.starts_with('-') {
            return Err(format!("unknown option {name:?} (see --help)"));
        } else {
            return Err(format!(
                "unexpected argument {arg:?} (options start with --; see --help)"
            ));
        }
    }
    Ok(())
}

/// Whether the switch `name` is given as an option, not as another option's value
/// (`--name -h` names the server `-h`; it printed the help).
fn has_switch(args: &[String], name: &str) -> bool {
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        if VALUE_FLAGS.contains(&arg.as_str()) {
            iter.next();
        } else if arg == name {
            return true;
        }
    }
    false
}

/// The bounds `--max-*` set (docs/wire.md §8), each at least 1.
struct Limits {
    connections: usize,
    requests: usize,
    frame_len: usize,
    large_request_bytes: usize,
    unsent_answer_bytes: usize,
}

impl Limits {
    fn from_args(args: &[String]) -> Result<Limits, Usage> {
        use rpc_core::server::{
            DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_LARGE_REQUEST_BYTES,
            DEFAULT_MAX_UNSENT_ANSWER_BYTES,
        };
        let positive = |name: &str, default: usize| -> Result<usize, Usage> {
            match number(args, name, default).map_err(Usage)? {
                0 => Err(Usage(format!("{name} 0: give at least 1"))),
                n => Ok(n),
            }
        };
        Ok(Limits {
            connections: positive("--max-connections", DEFAULT_MAX_CONNECTIONS)?,
            requests: positive(
                "--max-concurrent-requests",
                rpc_core::server::DEFAULT_MAX_CONCURRENT_REQUESTS,
            )?,
            frame_len: positive("--max-frame-len", rpc_core::link::DEFAULT_MAX_FRAME_LEN)?,
            large_request_bytes: positive(
                "--max-large-request-bytes",
                DEFAULT_MAX_LARGE_REQUEST_BYTES,
            )?,
            unsent_answer_bytes: positive(
                "--max-unsent-answer-bytes",
                DEFAULT_MAX_UNSENT_ANSWER_BYTES,
            )?,
        })
    }
}

/// `--name`'s value parsed as a number, with an error that names the option.
fn number<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> Result<T, String>
where
    T::Err: std::fmt::Display,
{
    match flag(args, name) {
        None => Ok(default),
        Some(value) => value.parse().map_err(|e| format!("{name} {value:?}: {e}")),
    }
}

fn flag_values(args: &[String], name: &str) -> Vec<String> {
    let mut values = Vec::new();
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        if arg == name {
            if let Some(value) = iter.next() {
                values.push(value.clone());
            }
        } else if let Some(value) = arg.strip_prefix(&format!("{name}=")) {
            values.push(value.to_owned());
        }
    }
    values
}

fn flag(args: &[String], name: &str) -> Option<String> {
    flag_values(args, name).pop()
}

/// The value of an option that has an older name too (`--admin`, `--metrics`): the
/// one given last under either, so the command line's wins over the config file's.
fn flag_of(args: &[String], names: &[&str]) -> Option<String> {
    let mut last = None;
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        for name in names {
            if arg == name {
                last = iter.next().cloned();
                break;
            } else if let Some(value) = arg
                .strip_prefix(name)
                .and_then(|rest| rest.strip_prefix('='))
            {
                last = Some(value.to_owned());
                break;
            }
        }
    }
    last
}

/// A config file's line without its comment: from a `#` that starts a word (the
/// line's first, or one after a space) to the end. A `#` inside a word, as in a path
/// `/keys/#2.pem`, is part of the value.
fn without_comment(line: &str) -> &str {
    let mut word_starts = true;
    for (at, c) in line.char_indices() {
        if c == '#' && word_starts {
            return &line[..at];
        }
        word_starts = c.is_whitespace();
    }
    line
}

/// Warns about a listener on a non-loopback address whose calls cross the network in
/// clear text: `udp://`, `rdma://` and `grpc://` always (`tcp://` is the framework's
/// plain wire, which users choose knowingly; `grpc://` is easy to take for gRPC's usual
/// TLS), and with `tokens` (`--auth-tokens`) every listener without TLS, as bearer
/// tokens are passwords (`docs/security.md`).
fn warn_if_unencrypted(uri: &str, tokens: bool) {
    let Ok(endpoint) = uri.parse::<Endpoint>() else {
        return;
    };
    let Endpoint::Host { scheme, .. } = &endpoint else {
        return;
    };
    if is_loopback(&endpoint) {
        return;
    }
    use rpc_core::endpoint::Scheme;
    let name = scheme.as_str();
    let (what, instead) = match scheme {
        Scheme::Tls | Scheme::Grpcs => return,
        Scheme::Udp | Scheme::Rdma => ("carries no encryption or authentication", "tls://"),
        Scheme::Grpc => ("is plaintext HTTP/2 (h2c)", "grpcs://"),
        _ => ("", ""),
    };
    if !what.is_empty() {
        tracing::warn!(
            listen = uri,
            "{name}:// {what}: use it on trusted networks only ({instead} for the others)"
        );
    }
    if tokens {
        tracing::warn!(
            listen = uri,
            "--auth-tokens with {name}://: clients send their bearer tokens in clear text \
             (tls:// or grpcs:// for untrusted networks)"
        );
    }
}

/// Raises the soft limit on open descriptors to the hard one: a server holds one per
/// connection, and a TLS listener up to 4,096 handshakes on its own, past the 1,024
/// that many systems give a process by default. Best effort.
#[allow(unsafe_code)]
fn raise_open_files_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we pass, which lives for the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return;
    }
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: setrlimit reads the struct we pass, which lives for the call.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            tracing::warn!(
                limit = limit.rlim_cur,
                hard = limit.rlim_max,
                "could not raise the open-descriptor limit: it bounds the connections served"
            );
        }
    }
}

/// Checks `RUST_LOG`'s directives beyond what `Targets` refuses, and returns them as
/// `Targets` is to read them (without spaces or empty ones): each is a level or
/// `target=level`, a target a module path (`rpc_core`, `rpc_core::server`). `Targets`
/// reads a bare word as a target at TRACE, so a misspelt level (`warning`,
/// `verbose`) or a crate named with a hyphen filtered out every line, the warning
/// that would have said so included (from a review).
fn log_directives(spec: &str) -> Result<String, String> {
    // Names, and tracing's numbers (0 off to 5 trace).
    const LEVELS: [&str; 12] = [
        "trace", "debug", "info", "warn", "error", "off", "0", "1", "2", "3", "4", "5",
    ];
    let level = |word: &str| LEVELS.iter().any(|l| l.eq_ignore_ascii_case(word.trim()));
    // Spaces around directives and empty ones are left out of what `Targets` reads
    // (from a review: `Targets` read " info" as a target, and `debug,` filtered out
    // every line, with no warning).
    let directives: Vec<&str> = spec
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .collect();
    if directives.is_empty() {
        return Err("no directive".to_owned());
    }
    for &directive in &directives {
        let Some((target, at)) = directive.split_once('=') else {
            if level(directive) {
                continue;
            }
            return Err(format!(
                "{directive:?} is not a level; a target takes one: {directive}=debug"
            ));
        };
        if !level(at) {
            return Err(format!("{at:?} in {directive:?} is not a level"));
        }
        let target = target.trim();
        if target.contains(['[', '{']) {
            return Err(format!("{directive:?}: span filters are not supported"));
        }
        if target.contains('-') {
            return Err(format!(
                "{directive:?}: targets are module paths, with _ where a crate's name has - ({})",
                target.replace('-', "_")
            ));
        }
        let path = target.split("::").all(|part| {
            !part.is_empty() && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        });
        if !path {
            return Err(format!("{directive:?}: {target:?} is not a module path"));
        }
    }
    Ok(directives
        .iter()
        .map(|d| match d.split_once('=') {
            Some((target, level)) => format!("{}={}", target.trim(), level.trim()),
            None => (*d).to_owned(),
        })
        .collect::<Vec<_>>()
        .join(","))
}

/// Whether the log lines are JSON (`--log json`), once the logger is installed: the
/// fatal error is then one JSON line too.
static JSON_LOGS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match run().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            // The error's message, not its `Debug` form; with `--log json`, as one
            // JSON object like every other line (a log pipeline needs this one most;
            // from a review: it was plain text).
            if JSON_LOGS.get() == Some(&true) {
                // Through a subscriber of its own, not the installed one: RUST_LOG's
                // filter (`off`, or one that leaves rpc_server out) dropped it, and
                // before the logger is installed there is none (from a review: a bad
                // `--listen` with `--log json` exited 1 with nothing said).
                let fatal = tracing_subscriber::fmt()
                    .json()
                    .with_writer(std::io::stderr)
                    .finish();
                tracing::subscriber::with_default(fatal, || {
                    tracing::error!(error = %err, "rpc-server stopped");
                });
            } else {
                eprintln!("rpc-server: {err}");
            }
            if err.is::<Usage>() {
                std::process::ExitCode::from(2)
            } else {
                std::process::ExitCode::FAILURE
            }
        }
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    // First of all: a signal sent while the server starts is acted on once it has
    // started (SIGHUP's default action would kill it, half-registered), and a SIGTERM
    // is never missed. (Before this, in the process's first milliseconds, a SIGTERM
    // ends it by the signal, as any process; nothing is bound or registered then.)
    let mut term = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut hangup = signal(SignalKind::hangup())?;
    // The status page's uptime counts from here.
    let mut info = rpc_observe::status::ServerInfo::new("rpc-server", env!("CARGO_PKG_VERSION"));
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    if has_switch(&args, "--help") || has_switch(&args, "-h") {
        print!("{HELP}");
        return Ok(());
    }
    // Known before the arguments are checked, so that their errors are JSON too.
    if flag(&args, "--log").as_deref() == Some("json") {
        let _ = JSON_LOGS.set(true);
    }
    check_args(&args).map_err(Usage)?;
    if let Some(path) = flag(&args, "--config") {
        // The file's options first, so that the command line's come last and win.
        let text = std::fs::read_to_string(&path)
            .map_err(|e| Usage(format!("cannot read config file {path}: {e}")))?;
        // A UTF-8 byte-order mark (editors on Windows write one) is not text.
        let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
        // The file's `log json` makes its own errors JSON too (unless the command
        // line says otherwise).
        if flag(&args, "--log").is_none()
            && text
                .lines()
                .any(|line| without_comment(line).split_whitespace().eq(["log", "json"]))
        {
            let _ = JSON_LOGS.set(true);
        }
        let mut from_file = Vec::new();
        // One-valued options given twice in the file (as on the command line: the
        // last silently won; from a review).
        let mut given = Vec::new();
        for (number, line) in text.lines().enumerate() {
            let line = without_comment(line).trim();
            if line.is_empty() {
                continue;
            }
            let option = |name: &str| format!("--{name}");
            let switch = |name: &str| SWITCHES.contains(&option(name).as_str()) && name != "help";
            let Some((name, value)) = line.split_once(char::is_whitespace) else {
                if switch(line) {
                    from_file.push(option(line));
                    continue;
                }
                return Err(Usage(format!("{path}:{}: expected `name value`", number + 1)).into());
            };
            if switch(name) {
                return Err(Usage(format!("{path}:{}: {name} takes no value", number + 1)).into());
            }
            if name == "config" {
                return Err(Usage(format!(
                    "{path}:{}: a config file cannot name another",
                    number + 1
                ))
                .into());
            }
            if !VALUE_FLAGS.contains(&option(name).as_str()) {
                // `--listen tcp://...` as on the command line: the name is `listen`.
                let hint = match name.strip_prefix("--") {
                    Some(bare) if VALUE_FLAGS.contains(&option(bare).as_str()) => {
                        format!(" (write names without --: `{bare} {}`)", value.trim())
                    }
                    _ => String::new(),
                };
                return Err(Usage(format!(
                    "{path}:{}: unknown option {name:?}{hint}",
                    number + 1
                ))
                .into());
            }
            // A `listen` on the command line replaces the file's (the others but
            // `tls-client-ca`, below, are single-valued: the command line's, coming
            // last, wins).
            if name == "listen" && !flag_values(&args, "--listen").is_empty() {
                continue;
            }
            // So does a `--tls-client-ca` (repeatable too): the command line's CAs
            // replace the file's, so that a CA can be dropped without editing it.
            if name == "tls-client-ca" && !flag_values(&args, "--tls-client-ca").is_empty() {
                continue;
            }
            given_once(&mut given, &option(name), name)
                .map_err(|why| Usage(format!("{path}:{}: {why}", number + 1)))?;
            from_file.push(format!("--{name}"));
            from_file.push(value.trim().to_owned());
        }
        from_file.append(&mut args);
        args = from_file;
    }
    // INFO unless RUST_LOG says otherwise: a level (`debug` shows TLS handshake
    // failures and the other DEBUG lines of docs/observability.md), `off`, or
    // directives per crate (`rpc_core=warn,info`; from a review: a bare level only, so
    // `rpc_core`'s lines could not be turned down alone).
    use tracing_subscriber::{filter::Targets, layer::SubscriberExt};
    let at_info = || Targets::new().with_default(tracing::Level::INFO);
    let mut bad_filter = None;
    let filter = match std::env::var("RUST_LOG") {
        Ok(spec) if !spec.trim().is_empty() => {
            match log_directives(spec.trim())
                .and_then(|directives| directives.parse::<Targets>().map_err(|err| err.to_string()))
            {
                Ok(filter) => filter,
                Err(err) => {
                    bad_filter = Some((spec.clone(), err));
                    at_info()
                }
            }
        }
        _ => at_info(),
    };
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(tracing::level_filters::LevelFilter::TRACE);
    let json = match flag(&args, "--log").as_deref() {
        None | Some("text") => false,
        Some("json") => true,
        Some(other) => return Err(Usage(format!("--log takes text or json, not {other:?}")).into()),
    };
    let installed = if json {
        tracing::subscriber::set_global_default(builder.json().finish().with(filter))
    } else {
        tracing::subscriber::set_global_default(builder.finish().with(filter))
    };
    installed.map_err(|err| format!("cannot install the logger: {err}"))?;
    let _ = JSON_LOGS.set(json);
    if let Some((spec, err)) = bad_filter {
        tracing::warn!(
            rust_log = %spec,
            error = %err,
            "RUST_LOG is no level (error, warn, info, debug, trace, off) nor list of \
             target=level directives: logging at INFO"
        );
    }
    raise_open_files_limit();
    // Schemes in any case, compared below in lowercase.
    let mut listens: Vec<String> = flag_values(&args, "--listen")
        .iter()
        .map(|uri| rpc_core::endpoint::lowercase_scheme(uri).into_owned())
        .collect();
    if listens.is_empty() {
        listens.push("tcp://127.0.0.1:7000".into());
    }
    let drain = Duration::from_millis(number(&args, "--drain-timeout-ms", 10_000).map_err(Usage)?);
    let ttl_s = number(&args, "--ttl-s", 5).map_err(Usage)?;
    // etcd takes leases of up to about 3 years (9,000,000,000 s is refused).
    if !(1..=MAX_TTL_S).contains(&ttl_s) {
        return Err(Usage(format!("--ttl-s {ttl_s}: give 1 to {MAX_TTL_S} seconds")).into());
    }
    let ttl = Duration::from_secs(ttl_s);
    let limits = Limits::from_args(&args)?;

    let register = match flag(&args, "--register") {
        None => None,
        Some(uri) => match uri.parse::<Endpoint>() {
            Ok(Endpoint::Etcd { cluster, service }) => Some((cluster, service)),
            Ok(other) => {
                return Err(
                    Usage(format!("--register {uri}: needs etcd://..., not {other}")).into(),
                )
            }
            Err(err) => return Err(Usage(format!("--register {uri}: {err}")).into()),
        },
    };
    let etcd_security = etcd_security(&args, register.is_some()).map_err(Usage)?;

    // Settings first (a mistake, exit 2), files after (a failure at run time: a secret
    // may not be mounted yet).
    let tls_files = match (flag(&args, "--tls-cert"), flag(&args, "--tls-key")) {
        (Some(cert), Some(key)) => Some((cert, key)),
        (None, None) if flag(&args, "--tls-client-ca").is_none() => None,
        _ => {
            return Err(Usage(
                "--tls-cert and --tls-key go together (and --tls-client-ca needs them)".into(),
            )
            .into())
        }
    };
    // Each listen URI is checked before anything binds: a scheme that does not exist,
    // a port out of range, a TLS scheme without certificate and key are settings
    // mistakes (exit 2), not failures to retry (a unit that restarts on failure would
    // loop on a typo).
    let mut any_tls = false;
    for uri in &listens {
        let endpoint: Endpoint = uri
            .parse()
            .map_err(|err| Usage(format!("--listen {uri}: {err}")))?;
        // From the parsed scheme (schemes are read without case: `TLS://` is TLS).
        let needs_tls = matches!(
            endpoint,
            Endpoint::TlsUnix(_)
                | Endpoint::Host {
                    scheme: rpc_core::endpoint::Scheme::Tls | rpc_core::endpoint::Scheme::Grpcs,
                    ..
                }
        );
        any_tls |= needs_tls;
        if needs_tls && tls_files.is_none() {
            return Err(Usage(format!(
                "--listen {uri}: a TLS listener needs --tls-cert and --tls-key"
            ))
            .into());
        }
        if !matches!(
            endpoint,
            Endpoint::Host { .. }
                | Endpoint::Unix(_)
                | Endpoint::TlsUnix(_)
                | Endpoint::RdmaUnix(_)
        ) {
            return Err(Usage(format!(
                "--listen {uri}: a server listens on one address (tcp://, tls://, unix://, \
                 tls+unix://, udp://, rdma://, rdma+unix://, grpc://, grpcs://), not a list \
                 or a name to resolve"
            ))
            .into());
        }
    }
    if let Some((cert, key)) = &tls_files {
        for (name, file) in [("--tls-cert", cert), ("--tls-key", key)] {
            if file.trim().is_empty() {
                return Err(Usage(format!("{name} needs a file")).into());
            }
        }
    }
    // TLS settings no listener uses are a mistyped scheme, not a choice: the server
    // would serve in the clear while its operator believes (m)TLS is on.
    // `any_tls` is from the parsed schemes, so `TLS://` counts.
    if tls_files.is_some() && !any_tls {
        return Err(Usage(
            "--tls-cert and --tls-key are given, but no --listen is tls://, tls+unix:// \
                    or grpcs://: nothing would use them"
                .into(),
        )
        .into());
    }
    // Each file named by an option is read now, so that a missing one is named by its
    // option (the TLS builders name the path alone), and the etcd ones before any
    // listener serves (they were read only when registering).
    let named_files = [
        "--tls-cert",
        "--tls-key",
        "--etcd-ca",
        "--etcd-cert",
        "--etcd-key",
        "--etcd-password-file",
    ]
    .into_iter()
    .filter_map(|option| flag(&args, option).map(|path| (option, path)))
    .chain(
        flag_values(&args, "--tls-client-ca")
            .into_iter()
            .map(|path| ("--tls-client-ca", path)),
    );
    for (option, path) in named_files {
        std::fs::read(&path).map_err(|e| format!("{option} {path}: cannot read it: {e}"))?;
    }
    // The etcd cluster with its TLS and credentials, its files read and parsed now,
    // before any listener serves (it was made only when registering, after).
    let register = match register {
        None => None,
        Some((members, service)) => Some((etcd_security.cluster(&members)?, service)),
    };
    let tls = match tls_files {
        Some((cert, key)) => {
            let mut builder = ServerTls::builder().cert_files(cert, key);
            // Repeatable: every file's CAs are trusted (only the last one was, silently).
            for ca in flag_values(&args, "--tls-client-ca") {
                builder = builder.client_ca_file(ca);
            }
            let tls = builder.build()?;
            // A certificate every client refuses (expired, a CA's, not for servers)
            // would leave the server up and every TLS handshake failing.
            if let Some(problem) = tls.certificate_problem() {
                return Err(format!("--tls-cert: {problem}").into());
            }
            if let Some(left) = tls
                .certificate_expiry()
                .and_then(|end| end.duration_since(std::time::SystemTime::now()).ok())
            {
                if left < Duration::from_secs(14 * 86_400) {
                    tracing::warn!(
                        days_left = left.as_secs() / 86_400,
                        "the TLS certificate expires within 14 days: renew it (SIGHUP reloads)"
                    );
                }
            }
            Some(tls)
        }
        None => None,
    };
    let mut options = ListenOptions::new();
    if let Some(tls) = &tls {
        options = options.tls(tls.clone());
    }
    let mut listeners = Vec::new();
    let has_tokens = flag(&args, "--auth-tokens").is_some();
    for uri in &listens {
        warn_if_unencrypted(uri, has_tokens);
        listeners.push(AnyListener::bind_with(uri, &options).await?);
    }
    let advertise: Endpoint = match flag(&args, "--advertise").as_deref() {
        None | Some("auto") => {
            let bound: Endpoint = listeners[0].local_addr_uri().parse()?;
            let socket_path = matches!(
                bound,
                Endpoint::Unix(_) | Endpoint::TlsUnix(_) | Endpoint::RdmaUnix(_)
            );
            if socket_path && flag(&args, "--register").is_some() {
                // Clients on other hosts would dial that path on their own machine.
                return Err(Usage(format!(
                    "--advertise auto would register {bound}, a socket path only clients on \
                     this host can use: give the address clients should use (as in \
                     --advertise tcp://HOST:PORT), or --advertise {bound} if every client \
                     runs here"
                ))
                .into());
            }
            if let (Some(_), Endpoint::Host { scheme, port, .. }) =
                (flag(&args, "--register"), &bound)
            {
                if is_wildcard(&bound) {
                    // Registered, it would send every client to its own host.
                    let picked = matches!(
                        listens[0].parse::<Endpoint>(),
                        Ok(Endpoint::Host { port: 0, .. })
                    );
                    let advice = if picked {
                        // The port was picked for this run: the next start picks another.
                        format!(
                            "a fixed port to listen on and the address clients should use, as \
                             in --listen {0}://0.0.0.0:PORT --advertise {0}://HOST:PORT",
                            scheme.as_str()
                        )
                    } else {
                        format!(
                            "the address clients should use, as in --advertise {}://HOST:{port}",
                            scheme.as_str()
                        )
                    };
                    return Err(Usage(format!(
                        "--advertise auto would register {bound}, which no other host can \
                         reach: give {advice}"
                    ))
                    .into());
                }
                if is_loopback(&bound) {
                    tracing::warn!(
                        advertise = %bound,
                        "registering a loopback address: only clients on this host can \
                         use it (--advertise names another)"
                    );
                }
            }
            bound
        }
        Some(uri) => {
            let advertise: Endpoint = uri
                .parse()
                .map_err(|err| Usage(format!("--advertise {uri}: {err}")))?;
            check_advertised(&advertise).map_err(Usage)?;
            advertise
        }
    };
    // A value a wire cannot carry failed or lost every reply's metadata (gRPC's takes
    // printable ASCII only): refused when given, escaped when it is the advertised
    // address (a Unix socket's path may be anything).
    let name = match flag(&args, "--name") {
        Some(name) => {
            if name.is_empty() || !name.bytes().all(|b| b.is_ascii_graphic() || b == b' ') {
                return Err(Usage(format!(
                    "--name {name:?}: give printable ASCII (x-served-by goes on every wire, \
                     gRPC's included, whose metadata takes nothing else)"
                ))
                .into());
            }
            name
        }
        None => advertise.to_string().escape_default().to_string(),
    };
    let name: &'static str = Box::leak(name.into_boxed_str());

    // Before the server's first call: the metrics layer registers with this recorder.
    // `--metrics` is `--admin`'s older name.
    let admin = match flag_of(&args, &["--admin", "--metrics"]) {
        Some(addr) => {
            let resolved = admin::resolve(&addr).map_err(|e| -> Box<dyn std::error::Error> {
                match e {
                    admin::AddressError::Malformed(m) => Usage(m).into(),
                    admin::AddressError::Lookup(m) => m.into(),
                }
            })?;
            let listener = admin::bind(resolved)
                .await
                .map_err(|e| format!("--admin {addr}: {e}"))?;
            let board = rpc_observe::status::StatusBoard::new();
            Some((listener, board, metrics::install()?))
        }
        None => None,
    };
    let health = HealthReporter::new();
    health.set("rpc.examples.v1.KeyValue", ServingStatus::Serving);
    health.set("rpc.examples.v1.Echo", ServingStatus::Serving);
    // Bearer tokens on every call but the health check (probes carry no token). Only
    // Check: a Watch stream never ends, and exempt, it let a peer with no token keep
    // every connection busy (and so never evicted), and List names the services.
    let tokens = match flag(&args, "--auth-tokens") {
        Some(path) => Some((SharedTokens::new(load_tokens(&path)?), path)),
        None => None,
    };
    let auth = tokens.as_ref().map(|(tokens, _)| {
        BearerLayer::shared(tokens.clone()).exempt(["grpc.health.v1.Health/Check"])
    });
    let server = Server::builder()
        .drain_timeout(drain)
        .max_connections(limits.connections)
        .max_concurrent_requests(limits.requests)
        .max_frame_len(limits.frame_len)
        .max_large_request_bytes(limits.large_request_bytes)
        .max_unsent_answer_bytes(limits.unsent_answer_bytes)
        // First, so that the status page times the other layers too, and calls refused
        // by authentication are counted (and so for the metrics layer).
        .layer(tower::util::option_layer(
            admin.as_ref().map(|(_, board, _)| board.layer()),
        ))
        .layer(rpc_observe::metrics::ServerMetricsLayer::new())
        .layer(tower::util::option_layer(auth))
        .layer(metrics::ServedByLayer(name))
        .add_service(KeyValueServer::new(MemoryStore::default()))
        .add_service(EchoServer::new(EchoService))
        .add_service(health.service());
    let server = if has_switch(&args, "--no-reflection") {
        server
    } else {
        server.add_reflection()
    }
    .build();

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut serving = tokio::task::JoinSet::new();
    let mut transports = Vec::new();
    for listener in listeners {
        say!("listening on {}", listener.local_addr_uri());
        if let Some(stats) = listener.transport_stats() {
            transports.push(transport_metrics::Listened {
                listener: listener.local_addr_uri(),
                stats,
            });
        }
        info.listeners.push(listener.local_addr_uri());
        let mut stop = stop_rx.clone();
        let stopped = async move {
            let _ = stop.wait_for(|s| *s).await;
        };
        serving.spawn(listener.serve(&server, stopped));
    }

    if let Some((listener, board, prometheus)) = admin {
        let addr = listener.local_addr()?;
        // `tests/metrics.rs` reads this line; the status page is at the same address.
        say!("metrics on http://{addr}/metrics");
        say!("admin on http://{addr}/");
        tokio::spawn(metrics::record_stats(
            server.clone(),
            tls.clone(),
            prometheus.clone(),
            transports,
        ));
        info.name = name.to_owned();
        info.config = admin::config_lines(&args);
        let admin = admin::Admin {
            board,
            info,
            server: server.clone(),
            prometheus,
        };
        tokio::spawn(admin::serve(listener, std::sync::Arc::new(admin)));
    }

    let registration = match register {
        None => None,
        Some((cluster, service)) => {
            let registering = cluster.register(&service, &advertise, ttl);
            let registration = tokio::select! {
                registration = registering => registration?,
                // Not registered yet: nothing to drain, no client sent here by etcd.
                // (A key put before the answer goes when its lease expires.)
                _ = term.recv() => return Err("SIGTERM while registering in etcd".into()),
                _ = interrupt.recv() => return Err("interrupted while registering in etcd".into()),
            };
            say!(
                "registered {advertise} as {service} at {}",
                registration.key()
            );
            Some(registration)
        }
    };

    // A listener whose serving ended before the stop (its socket failed): the server
    // would stay registered and SERVING with a transport gone. It stops as on SIGTERM
    // (the other listeners drain) and exits 1, for its supervisor to start it again.
    let mut failed = None;
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = interrupt.recv() => break,
            _ = hangup.recv() => reload(tls.as_ref(), tokens.as_ref()),
            Some(ended) = serving.join_next(), if !serving.is_empty() => {
                let why = match ended {
                    Ok(Ok(())) => "it ended".to_owned(),
                    Ok(Err(err)) => err.to_string(),
                    Err(err) => err.to_string(),
                };
                tracing::error!(error = %why, "a listener stopped serving: stopping the server");
                failed = Some(format!("a listener stopped serving: {why}"));
                break;
            }
        }
    }
    let stopping = async {
        stop(health, registration, drain, stop_tx, serving).await?;
        match failed {
            Some(why) => Err(why.into()),
            None => Ok(()),
        }
    };
    tokio::select! {
        result = stopping => result,
        // Whoever sends a second one wants the process gone, not a drain waited out.
        _ = term.recv() => Err("a second SIGTERM: stopped without finishing the calls in flight".into()),
        _ = interrupt.recv() => Err("a second interrupt: stopped without finishing the calls in flight".into()),
    }
}

/// Reads the tokens file of `--auth-tokens`, which must hold a token.
fn load_tokens(path: &str) -> Result<TokenSet, String> {
    let tokens = TokenSet::load(path).map_err(|e| format!("--auth-tokens: {e}"))?;
    if tokens.is_empty() {
        // (A secret not mounted yet, say): every call but health would fail.
        return Err(format!("--auth-tokens {path}: the file holds no token"));
    }
    Ok(tokens)
}

/// SIGHUP: re-reads the TLS files and the tokens file, each kept as it was if its new
/// content is refused.
fn reload(tls: Option<&ServerTls>, tokens: Option<&(SharedTokens, String)>) {
    if let Some(tls) = tls {
        match tls.reload() {
            Ok(()) => tracing::info!("SIGHUP: TLS certificate, key and client CAs reloaded"),
            Err(err) => tracing::error!(
                error = %err,
                "SIGHUP: TLS reload failed; keeping the certificate, key and client CAs in use"
            ),
        }
    }
    if let Some((tokens, path)) = tokens {
        match load_tokens(path) {
            Ok(loaded) => {
                let count = loaded.len();
                tokens.replace(loaded);
                tracing::info!(tokens = count, "SIGHUP: bearer tokens reloaded");
            }
            Err(err) => tracing::error!(
                error = %err,
                "SIGHUP: tokens reload failed; keeping the tokens in use (a token removed \
                 from the file is still accepted until a reload succeeds)"
            ),
        }
    }
    if tls.is_none() && tokens.is_none() {
        tracing::info!("SIGHUP: nothing to reload (no TLS, no tokens file)");
    }
}

/// The graceful stop: NOT_SERVING, deregistration, GOAWAY, and the calls in flight
/// finished (up to the drain timeout).
async fn stop(
    health: HealthReporter,
    registration: Option<rpc_discovery_etcd::Registration>,
    drain: Duration,
    stop_tx: tokio::sync::watch::Sender<bool>,
    mut serving: tokio::task::JoinSet<Result<(), rpc_core::Error>>,
) -> Result<(), Box<dyn std::error::Error>> {
    // NOT_SERVING and deregistration first: health probes and clients stop choosing
    // this replica while it still answers.
    health.set_all_not_serving();
    if let Some(registration) = registration {
        match registration.deregister().await {
            // Give watching clients a moment to see the removal before GOAWAY.
            Ok(()) => tokio::time::sleep(Duration::from_millis(200)).await,
            // etcd unreachable: the key goes when its lease expires; the drain goes on
            // (GOAWAY tells the clients connected now).
            Err(err) => tracing::warn!(
                error = %err,
                "deregistering from etcd failed; the key stays until its lease expires"
            ),
        }
    }
    tracing::info!(drain_timeout = ?drain, "draining: GOAWAY sent, finishing calls in flight");
    let _ = stop_tx.send(true);
    // Health Watch streams end now, with the GOAWAY on its way (they never end on their
    // own, and would hold the drain for its whole timeout; ended before it, gRPC's
    // health clients would watch again at once).
    health.shutdown();
    // Every listener drains before an error is reported: returning at the first
    // dropped the others' tasks, and their calls in flight, mid-drain.
    let mut first: Option<Box<dyn std::error::Error>> = None;
    while let Some(result) = serving.join_next().await {
        let error: Option<Box<dyn std::error::Error>> = match result {
            Ok(Ok(())) => None,
            Ok(Err(err)) => Some(err.into()),
            Err(err) => Some(err.into()),
        };
        if let Some(err) = error {
            tracing::error!(error = %err, "a listener failed while draining");
            first.get_or_insert(err);
        }
    }
    if let Some(err) = first {
        return Err(err);
    }
    tracing::info!("stopped");
    Ok(())
}

/// Whether `endpoint` is a loopback host address (`127.0.0.1`, `[::1]`, `localhost`).
fn is_loopback(endpoint: &Endpoint) -> bool {
    matches!(endpoint, Endpoint::Host { host, .. } if host == "localhost")
        || host_ip(endpoint).is_some_and(|ip| ip.is_loopback())
}

/// The IP address a host endpoint names (IPv4-mapped ones as IPv4), if it names one.
fn host_ip(endpoint: &Endpoint) -> Option<std::net::IpAddr> {
    match endpoint {
        Endpoint::Host { host, .. } => host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .ok()
            .map(|ip| ip.to_canonical()),
        _ => None,
    }
}

/// Refuses an `--advertise` that clients could not use as one server's address: a
/// service name (discovery's job), port 0, or a wildcard host (what a client would
/// read as its own host). Registered, it failed every client by etcd name, or sent it
/// nowhere.
fn check_advertised(advertise: &Endpoint) -> Result<(), String> {
    let why = match advertise {
        Endpoint::Host { port: 0, .. } => "port 0 is no port a client can reach",
        Endpoint::Host { .. } if is_wildcard(advertise) => {
            "a wildcard address names every interface of this host, and to a client its own"
        }
        Endpoint::Host { .. }
        | Endpoint::Unix(_)
        | Endpoint::TlsUnix(_)
        | Endpoint::RdmaUnix(_) => return Ok(()),
        _ => "a service name is no server's address (clients find this server through it)",
    };
    Err(format!(
        "--advertise {advertise}: {why}; give the address clients should use, as in \
         --advertise tcp://HOST:PORT"
    ))
}

/// Whether `endpoint` is a host address bound to every interface (`0.0.0.0`, `[::]`):
/// a listener's address, not one a client can use.
fn is_wildcard(endpoint: &Endpoint) -> bool {
    host_ip(endpoint).is_some_and(|ip| ip.is_unspecified())
}

#[cfg(test)]
mod tests {
    /// RUST_LOG as `Targets` is given it: spaces and empty directives left out (from a
    /// review: `Targets` read " info" as a target at TRACE, and `debug,` silenced
    /// every line), tracing's numeric levels taken; what is no level refused.
    #[test]
    fn log_directives_are_read_as_written() {
        for (spec, read) in [
            ("rpc_core=warn, info", "rpc_core=warn,info"),
            ("debug,", "debug"),
            (" info , rpc_core = debug ", "info,rpc_core=debug"),
            ("2", "2"),
            ("rpc_core::server=trace", "rpc_core::server=trace"),
        ] {
            assert_eq!(super::log_directives(spec).as_deref(), Ok(read), "{spec}");
            assert!(read.parse::<tracing_subscriber::filter::Targets>().is_ok());
        }
        for bad in [
            ",",
            "warning",
            "rpc-server=debug",
            "rpc_core[conn]=debug",
            "rpc_core",
        ] {
            assert!(super::log_directives(bad).is_err(), "{bad}");
        }
    }
}

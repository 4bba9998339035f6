//! `rpc`, the command line: call, inspect, health-check and load-test any server the
//! framework can reach, over any of its wires (`tcp://`, `unix://`, `udp://`,
//! `rdma://`, `tls://`, `grpc://`, and service names such as `dns://` and `static://`).
//!
//! The binary is `src/main.rs`; this library holds its parts, so that its tests can
//! reach the JSON mapping directly. Usage, exit codes and examples: `docs/cli.md`.
//!
//! # Layout
//!
//! - [`cli`]: the command line (clap), with the examples each `--help` shows.
//! - [`exit`]: `Failure`, an error with the exit code it ends the
//!   process with; the documented exit codes.
//! - [`target`]: connects a URI (one server or a balanced service name) and the TLS
//!   options; [`metadata`] parses `-H key:value` and prints response metadata.
//! - [`schema`]: descriptors from server reflection ([`reflection`]) or from `.proto`
//!   files (protox); method and symbol lookup with the closest names on a miss.
//! - [`json`]: the proto3 JSON mapping of dynamic messages, with the field path of a
//!   value that does not fit.
//! - [`call`]: `rpc call`, unary and the three streaming kinds, as raw calls of
//!   encoded bytes on the channel's `tower::Service`.
//! - [`describe`]: `rpc list` and `rpc describe`, descriptors printed as `.proto`
//!   text with their comments.
//! - [`health`]: `rpc health`, a container probe.
//! - [`bench`](mod@bench): `rpc bench`, the load generator, its latency histogram and reports
//!   (text, JSON, HTML with an inline SVG chart).

pub mod bench;
pub mod call;
pub mod cli;
pub mod describe;
mod editions;
pub mod exit;
pub mod health;
pub mod json;
pub mod metadata;
pub mod reflection;
pub mod schema;
pub mod target;

use cli::{Cli, Command};
use exit::Failure;

/// Runs one command line to its end; the error carries the exit code.
pub async fn run(cli: Cli) -> Result<(), Failure> {
    match cli.command {
        Command::Call(args) => call::run(args).await,
        Command::List(args) => describe::list(args).await,
        Command::Describe(args) => describe::describe(args).await,
        Command::Health(args) => health::run(args).await,
        Command::Bench(args) => bench::run(args).await,
        Command::Completions { shell } => {
            let mut command = <Cli as clap::CommandFactory>::command();
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut command, "rpc", &mut script);
            exit::write_stdout(&script)
        }
    }
}

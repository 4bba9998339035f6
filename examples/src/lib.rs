//! Runnable programs of the framework:
//!
//! - `tour`: starts a server in-process and calls every example method over every
//!   transport, printing one line per step with its latency;
//! - `echo-server` / `echo-client`: the example services in two processes;
//! - `interop-server` / `interop-client`: gRPC's interop suite ([`interop`],
//!   `docs/interop.md`).
//!
//! This library holds what the binaries share: argument parsing helpers, [`listen`]
//! and [`connect`] for every transport's URI, and the interop service and cases.

use std::time::Duration;

pub mod interop;

/// Reads `--name value` pairs from the command line. Returns the values of `name`,
/// in order (a flag may repeat).
pub fn flag_values(args: &[String], name: &str) -> Vec<String> {
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

/// The last value of `--name`, if given.
pub fn flag(args: &[String], name: &str) -> Option<String> {
    flag_values(args, name).pop()
}

/// Refuses what is not one of the program's options (`values` take a value, as
/// `--name value` or `--name=value`; `switches` none): a misspelt option was ignored
/// and the program ran with its defaults (from a review: `echo-server --lisen X`
/// served on the default port). `Err` says what is wrong, for the usage error.
pub fn check_args(args: &[String], values: &[&str], switches: &[&str]) -> Result<(), String> {
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((name, _)) if name.starts_with("--") => (name, true),
            _ => (arg.as_str(), false),
        };
        if values.contains(&name) {
            if !inline && iter.next().is_none() {
                return Err(format!("{name} needs a value (see --help)"));
            }
        } else if switches.contains(&name) {
            if inline {
                return Err(format!("{name} takes no value"));
            }
        } else if name.starts_with('-') {
            return Err(format!("unknown option {name:?} (see --help)"));
        } else {
            return Err(format!("unexpected argument {arg:?} (see --help)"));
        }
    }
    Ok(())
}

/// A usage error: [`report`] exits with status 2 for it (1 for other errors).
#[derive(Debug)]
pub struct Usage(pub String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

/// The exit status of a program's `run`: its error said in words on standard error
/// (not `main`'s `Debug` dump; from a review), status 2 for a [`Usage`] error, 1 for
/// another.
pub fn report(result: Result<(), Box<dyn std::error::Error>>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("{err}");
            std::process::ExitCode::from(if err.is::<Usage>() { 2 } else { 1 })
        }
    }
}

/// The options of [`server_tls`].
pub const SERVER_TLS_OPTIONS: [&str; 3] = ["--tls-cert", "--tls-key", "--tls-client-ca"];

/// The options of [`connect_options`].
pub const CLIENT_TLS_OPTIONS: [&str; 4] =
    ["--tls-ca", "--tls-cert", "--tls-key", "--tls-server-name"];

/// [`check_args`], or the usage error on standard error and exit status 2.
pub fn exit_on_bad_args(args: &[String], values: &[&str], switches: &[&str]) {
    if let Err(why) = check_args(args, values, switches) {
        eprintln!("{why}");
        std::process::exit(2);
    }
}

/// Binds a listener by URI and serves it; and a channel by URI: the `rpc-connect`
/// crate's [`rpc_connect::serve`] and [`rpc_connect::connect`].
pub use rpc_connect::{connect, serve as listen, Serving};

/// The TLS options of the example servers: `--tls-cert PEM --tls-key PEM` for their
/// `tls://` and `tls+unix://` listeners, and `--tls-client-ca PEM` (repeatable: the
/// CAs of every file are trusted) to require client certificates (mTLS). `None`
/// without `--tls-cert`.
pub fn server_tls(
    args: &[String],
) -> Result<Option<rpc_transport_tcp::tls::ServerTls>, Box<dyn std::error::Error>> {
    let (cert, key) = match (flag(args, "--tls-cert"), flag(args, "--tls-key")) {
        (Some(cert), Some(key)) => (cert, key),
        (None, None) if flag(args, "--tls-client-ca").is_none() => return Ok(None),
        _ => {
            return Err(Usage(
                "--tls-cert and --tls-key go together (--tls-client-ca needs them)".into(),
            )
            .into())
        }
    };
    let mut builder = rpc_transport_tcp::tls::ServerTls::builder().cert_files(cert, key);
    // Repeatable, as rpc-server's: every file's CAs are trusted.
    for ca in flag_values(args, "--tls-client-ca") {
        builder = builder.client_ca_file(ca);
    }
    Ok(Some(builder.build()?))
}

/// The TLS options of the example clients, for `tls://` and `tls+unix://` servers:
/// `--tls-ca PEM` (trusted besides the system's roots), `--tls-cert PEM --tls-key PEM`
/// (a client certificate, for mTLS) and `--tls-server-name NAME` (the name checked
/// against the server's certificate, instead of the URI's host).
pub fn connect_options(
    args: &[String],
) -> Result<rpc_connect::ConnectOptions, Box<dyn std::error::Error>> {
    let mut builder = rpc_transport_tcp::tls::ClientTls::builder();
    if let Some(ca) = flag(args, "--tls-ca") {
        builder = builder.ca_file(ca);
    }
    match (flag(args, "--tls-cert"), flag(args, "--tls-key")) {
        (Some(cert), Some(key)) => builder = builder.identity_files(cert, key),
        (None, None) => {}
        _ => return Err(Usage("--tls-cert and --tls-key go together".into()).into()),
    }
    if let Some(name) = flag(args, "--tls-server-name") {
        builder = builder.server_name(name);
    }
    Ok(rpc_connect::ConnectOptions::new().tls(builder.build()?))
}

/// Serves `server` on every URI of `listens` (printing `listening on URI` for each once
/// it accepts) until SIGTERM or Ctrl-C; then runs `on_stop` and shuts every listener
/// down gracefully: GOAWAY, then the calls in flight finish. SIGHUP reloads the TLS
/// certificate, if `tls` is given. The main loop of the example server binaries.
pub async fn serve_until_signalled(
    server: &rpc_core::server::Server,
    listens: Vec<String>,
    tls: Option<rpc_transport_tcp::tls::ServerTls>,
    on_stop: impl FnOnce(),
) -> Result<(), Box<dyn std::error::Error>> {
    use tokio::signal::unix::{signal, SignalKind};
    // Installed before the listeners report ready, so a SIGTERM is never missed.
    let mut term = signal(SignalKind::terminate())?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut tasks = tokio::task::JoinSet::new();
    for uri in listens {
        let mut stop = stop_rx.clone();
        let stopped = async move {
            let _ = stop.wait_for(|s| *s).await;
        };
        let mut options = rpc_connect::ListenOptions::new();
        if let Some(tls) = &tls {
            options = options.tls(tls.clone());
        }
        let (bound, serving) = rpc_connect::serve_with(server, &uri, &options, stopped).await?;
        println!("listening on {bound}");
        tasks.spawn(serving);
    }
    let mut hangup = signal(SignalKind::hangup())?;
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
            _ = hangup.recv() => if let Some(tls) = &tls {
                match tls.reload() {
                    Ok(()) => eprintln!("SIGHUP: TLS certificate reloaded"),
                    Err(err) => eprintln!("SIGHUP: TLS reload failed, certificate kept: {err}"),
                }
            },
        }
    }
    on_stop();
    let _ = stop_tx.send(true);
    while let Some(result) = tasks.join_next().await {
        result??;
    }
    Ok(())
}

/// Formats a duration the way the tour prints latencies: `83 µs`, `1.20 ms`, `2.00 s`.
pub fn fmt_latency(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us < 1000.0 {
        format!("{us:.0} µs")
    } else if us < 1e6 {
        format!("{:.2} ms", us / 1e3)
    } else {
        format!("{:.2} s", us / 1e6)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_repeat_and_take_equals() {
        let args: Vec<String> = ["--listen", "a", "--x", "--listen=b"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(flag_values(&args, "--listen"), vec!["a", "b"]);
        assert_eq!(flag(&args, "--missing"), None);
    }
}

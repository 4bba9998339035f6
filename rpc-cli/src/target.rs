//! Connects a URI: [`Target`], one server's [`Channel`] or a balanced service name, as
//! one `tower::Service<ClientCall>`, with the TLS options of the command line.

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use rpc_core::{
    balance::Balanced,
    client::{Channel, ClientCall, ClientReply, ResponseFuture},
    ErrorKind, Status,
};
use rpc_transport_tcp::tls::ClientTls;
use tower::Service;

use crate::{
    cli::ConnArgs,
    exit::{status_exit_code, Failure},
};

/// The default time budget of one call of `call`, `list`, `describe` and `health`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where calls go: one server, or the replicas of a service name.
#[derive(Clone, Debug)]
pub enum Target {
    /// One server (`tcp://`, `unix://`, `udp://`, `rdma://`, `tls://`, `grpc://`, ...).
    One(Channel),
    /// A service name (`static://`, `dns://`, ...), balanced over its replicas.
    Many(Balanced),
}

/// How long [`Target::close`] waits for the channel to write what it queued.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

impl Target {
    /// Closes the connection once what the channel queued for the server is written,
    /// the `CANCEL` of a call past its deadline say (`docs/wire.md` §6.6), which the
    /// process's exit right after would otherwise lose; at most a second. A
    /// service name's replicas are closed as they are dropped.
    pub async fn close(self) {
        if let Target::One(channel) = self {
            let _ = tokio::time::timeout(CLOSE_GRACE, channel.close()).await;
        }
    }
}

impl Service<ClientCall> for Target {
    type Response = ClientReply;
    type Error = Status;
    type Future = TargetFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        match self {
            Target::One(channel) => channel.poll_ready(cx),
            Target::Many(balanced) => balanced.poll_ready(cx),
        }
    }

    fn call(&mut self, call: ClientCall) -> TargetFuture {
        match self {
            Target::One(channel) => TargetFuture::One(channel.call(call)),
            Target::Many(balanced) => TargetFuture::Many(balanced.call(call)),
        }
    }
}

/// The future of one call on a [`Target`].
pub enum TargetFuture {
    /// On a channel.
    One(ResponseFuture),
    /// On a balancer.
    Many(<Balanced as Service<ClientCall>>::Future),
}

impl Future for TargetFuture {
    type Output = Result<ClientReply, Status>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            TargetFuture::One(future) => Pin::new(future).poll(cx),
            TargetFuture::Many(future) => future.as_mut().poll(cx),
        }
    }
}

/// The transport a URI's scheme names, for error messages.
pub fn transport_name(uri: &str) -> &'static str {
    match uri.split_once("://").map_or("", |(scheme, _)| scheme) {
        "tcp" => "TCP",
        "unix" => "a Unix socket",
        "udp" | "dns+udp" => "UDP",
        "rdma" | "dns+rdma" => "RDMA",
        "rdma+unix" => "RDMA over a Unix socket (soft provider)",
        "tls" | "dns+tls" => "TLS over TCP",
        "tls+unix" => "TLS over a Unix socket",
        "grpc" | "dns+grpc" => "gRPC (HTTP/2)",
        "grpcs" | "dns+grpcs" => "gRPC (HTTP/2) over TLS",
        "dns" | "dns+tcp" => "TCP (replicas from DNS)",
        "etcd" => "the transport the replicas registered in etcd",
        "static" => "the static list's transport",
        _ => "an unknown transport",
    }
}

fn is_service_name(uri: &str) -> bool {
    matches!(
        uri.split_once("://").map_or("", |(scheme, _)| scheme),
        "static"
            | "dns"
            | "dns+tcp"
            | "dns+udp"
            | "dns+tls"
            | "dns+grpc"
            | "dns+grpcs"
            | "dns+rdma"
            | "etcd"
    )
}

/// A `dns://name:port` (or `dns+...`) whose name does not resolve at all: an error
/// naming it now (UNAVAILABLE, nothing sent), rather than a wait for replicas that
/// cannot come. (An SRV name,
/// without a port, is left to the resolver.)
async fn check_dns_name(uri: &str) -> Result<(), rpc_core::Error> {
    let Some((scheme, rest)) = uri.split_once("://") else {
        return Ok(());
    };
    if scheme != "dns" && !scheme.starts_with("dns+") {
        return Ok(());
    }
    let authority = rest.split('/').next().unwrap_or(rest);
    let Some((host, port)) = authority.rsplit_once(':') else {
        return Ok(());
    };
    let (Ok(port), false) = (port.parse::<u16>(), host.is_empty()) else {
        return Ok(());
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    match tokio::net::lookup_host((host, port)).await {
        Ok(_) => Ok(()),
        // A lookup that fails may work later (a resolver out of reach, a name not
        // published yet): UNAVAILABLE, as `tcp://` with that name is, not a usage
        // error (from a review: exit 1 here, 78 there).
        Err(err) => Err(rpc_core::Error::new(
            ErrorKind::Io,
            format!("the name {host:?} does not resolve: {err}"),
        )),
    }
}

/// How long a TLS handshake may take: the whole `--timeout` (and a little more, so
/// that `--timeout` ends it) for one server; a service name's replicas keep the
/// transport's own, so that a silent one is passed over for another.
fn handshake_deadline(conn: &ConnArgs) -> Option<Duration> {
    conn.deadline(Some(DEFAULT_TIMEOUT))
        .filter(|_| !is_service_name(&conn.uri))
        .map(|timeout| timeout + PAST_THE_TIMEOUT)
}

/// The TLS settings of `--ca`, `--cert`, `--key`, `--server-name` and `--insecure`, if
/// any is given (otherwise TLS URIs trust the system's roots).
fn client_tls(conn: &ConnArgs) -> Result<Option<ClientTls>, Failure> {
    // A static or etcd service name's replicas may be TLS ones, and an unknown scheme
    // is reported as such when connecting: both left alone.
    let scheme = conn.uri.split_once("://").map_or("", |(scheme, _)| scheme);
    let tls = matches!(
        scheme,
        "tls" | "tls+unix" | "grpcs" | "dns+tls" | "dns+grpcs"
    );
    // `--authority` names the server over grpcs:// as grpcurl's does, unless
    // `--server-name` names it.
    let server_name = conn.server_name.clone().or_else(|| {
        let grpcs = matches!(scheme, "grpcs" | "dns+grpcs");
        let authority = conn.authority.as_deref().filter(|_| grpcs)?;
        Some(authority_host(authority).to_owned())
    });
    if conn.ca.is_none() && conn.cert.is_none() && server_name.is_none() && !conn.insecure {
        if !tls {
            return Ok(None);
        }
        // The system's roots, with a handshake that may take the whole --timeout.
        let mut builder = ClientTls::builder();
        if let Some(timeout) = handshake_deadline(conn) {
            builder = builder.handshake_timeout(timeout);
        }
        return builder
            .build()
            .map(Some)
            .map_err(|err| Failure::error(format!("TLS settings: {err}")));
    }
    let unknown = transport_name(&conn.uri) == transport_name("");
    // ghz's `--insecure` means plain text: on a plain-text gRPC URI, alone, it asks
    // for nothing that is not so.
    let plain_grpc = matches!(scheme, "grpc" | "dns+grpc");
    if plain_grpc
        && conn.insecure
        && conn.ca.is_none()
        && conn.cert.is_none()
        && conn.server_name.is_none()
    {
        return Ok(None);
    }
    if !tls && !unknown && !matches!(scheme, "static" | "etcd") {
        return Err(Failure::error(format!(
            "--ca, --cert, --key, --server-name and --insecure are for TLS, and {} is plain \
             text over \
             {}: use a TLS scheme (tls://, tls+unix://, grpcs://, dns+tls://, dns+grpcs://)",
            conn.uri,
            transport_name(&conn.uri)
        )));
    }
    let mut builder = ClientTls::builder();
    if let Some(ca) = &conn.ca {
        builder = builder.ca_file(ca);
    }
    if let (Some(cert), Some(key)) = (&conn.cert, &conn.key) {
        builder = builder.identity_files(cert, key);
    }
    if let Some(name) = server_name {
        builder = builder.server_name(name);
    }
    if conn.insecure {
        builder = builder.dangerous_accept_any_certificate(true);
    }
    if let Some(timeout) = handshake_deadline(conn) {
        // The handshake may take the whole --timeout (see `connect`).
        builder = builder.handshake_timeout(timeout);
    }
    builder
        .build()
        .map(Some)
        .map_err(|err| Failure::error(format!("TLS options: {err}")))
}

/// The host of an authority (`host[:port]`, the host perhaps a bracketed IPv6
/// address), as a certificate names it: without the port or the brackets.
fn authority_host(authority: &str) -> &str {
    if let Some(bracketed) = authority.strip_prefix('[') {
        return bracketed.split(']').next().unwrap_or(bracketed);
    }
    match authority.rsplit_once(':') {
        Some((host, _)) if !host.contains(':') => host,
        _ => authority,
    }
}

/// `--authority`, checked: for the gRPC schemes (and service names, whose replicas
/// may be gRPC ones) only, and a URI authority.
fn grpc_options(
    conn: &ConnArgs,
    options: rpc_connect::ConnectOptions,
) -> Result<rpc_connect::ConnectOptions, Failure> {
    let Some(authority) = &conn.authority else {
        return Ok(options);
    };
    let scheme = conn.uri.split_once("://").map_or("", |(scheme, _)| scheme);
    if !matches!(
        scheme,
        "grpc" | "grpcs" | "dns+grpc" | "dns+grpcs" | "static" | "etcd"
    ) {
        return Err(Failure::error(format!(
            "--authority is gRPC's :authority, and {} is not a gRPC URI (grpc://, grpcs://, \
             dns+grpc://, dns+grpcs://)",
            conn.uri
        )));
    }
    if !rpc_transport_grpc::is_valid_authority(authority) {
        return Err(Failure::error(format!(
            "--authority {authority:?}: not a URI authority (host or host:port, without user \
             information, path or spaces)"
        )));
    }
    Ok(options.grpc(rpc_transport_grpc::GrpcConfig::default().authority(authority.clone())))
}

/// The settings of `--etcd-ca`, `--etcd-cert`/`--etcd-key` and `--etcd-user` with
/// `--etcd-password-file`, for an `etcd://` service name (refused for any other URI).
fn etcd_options(
    conn: &ConnArgs,
    mut options: rpc_connect::ConnectOptions,
) -> Result<rpc_connect::ConnectOptions, Failure> {
    let tls = conn.etcd_ca.is_some() || conn.etcd_cert.is_some();
    if !tls && conn.etcd_user.is_none() {
        return Ok(options);
    }
    let scheme = conn.uri.split_once("://").map_or("", |(scheme, _)| scheme);
    if !scheme.eq_ignore_ascii_case("etcd") {
        return Err(Failure::error(format!(
            "--etcd-ca, --etcd-cert, --etcd-key and --etcd-user say how to reach etcd, and \
             {} is not an etcd:// service name",
            conn.uri
        )));
    }
    if tls {
        let mut builder = ClientTls::builder();
        if let Some(ca) = &conn.etcd_ca {
            builder = builder.ca_file(ca);
        }
        if let (Some(cert), Some(key)) = (&conn.etcd_cert, &conn.etcd_key) {
            builder = builder.identity_files(cert, key);
        }
        let tls = builder
            .build()
            .map_err(|err| Failure::error(format!("etcd TLS options: {err}")))?;
        options = options.etcd_tls(tls);
    }
    if let (Some(user), Some(file)) = (&conn.etcd_user, &conn.etcd_password_file) {
        let text = std::fs::read_to_string(file).map_err(|err| {
            Failure::error(format!("--etcd-password-file {}: {err}", file.display()))
        })?;
        let password = text.lines().next().unwrap_or_default();
        options = options.etcd_user(user.clone(), password);
    }
    Ok(options)
}

/// How much longer than `--timeout` the transports' own connect and handshake
/// timeouts are set: `--timeout` ends a connect that takes it all.
const PAST_THE_TIMEOUT: Duration = Duration::from_secs(1);

/// Connects to `conn.uri`: a channel to one server, or a balancer over a service
/// name's replicas. An unreachable server fails with exit code 78 (`UNAVAILABLE`),
/// saying which transport and what failed.
///
/// Connecting is bounded by `--timeout` too (a TCP connect or TLS handshake to a peer
/// that never answers ends there, not at the transport's own longer timeout): past it,
/// the exit code is 68 (`DEADLINE_EXCEEDED`).
pub async fn connect(conn: &ConnArgs) -> Result<Target, Failure> {
    let mut options = rpc_connect::ConnectOptions::new();
    let mut channel = rpc_core::client::Channel::builder();
    if let Some(size) = conn.max_message_size {
        // A frame carries the message behind its header and metadata.
        let frame = size.saturating_add(rpc_core::frame::DEFAULT_MAX_METADATA_LEN + 1024);
        channel = channel.max_frame_len(frame);
    }
    let deadline = conn.deadline(Some(DEFAULT_TIMEOUT));
    // One server only: a balanced call whose replica does not answer its connect goes
    // on to another after the transports' own connect timeout, unprocessed.
    if let Some(timeout) = deadline.filter(|_| !is_service_name(&conn.uri)) {
        // A connect (and TLS handshake) may take the whole --timeout, not the
        // transports' own 5 s: a user on a slow link raises --timeout. (A little
        // more, so that --timeout ends it, as DEADLINE_EXCEEDED.)
        channel = channel.connect_timeout(timeout + PAST_THE_TIMEOUT);
    }
    options = options.channel(channel);
    if let Some(tls) = client_tls(conn)? {
        options = options.tls(tls);
    }
    options = etcd_options(conn, options)?;
    options = grpc_options(conn, options)?;
    let uri = conn.uri.as_str();
    let connecting = async {
        check_dns_name(uri).await?;
        if is_service_name(uri) {
            rpc_connect::balanced_with(uri, &options)
                .await
                .map(Target::Many)
        } else {
            rpc_connect::connect_with(uri, &options)
                .await
                .map(Target::One)
        }
    };
    let result = match deadline {
        None => connecting.await,
        Some(timeout) => match tokio::time::timeout(timeout, connecting).await {
            Ok(result) => result,
            // An etcd:// name waits for etcd's listing first: an etcd that does not
            // answer (stalled) is what took the time, not the replicas (a review read
            // "over the transport the replicas registered" of an etcd stopped with
            // SIGSTOP). Nothing was sent either way.
            Err(_) if uri.starts_with("etcd://") => {
                return Err(Failure::with_code(
                    status_exit_code(rpc_core::Code::DEADLINE_EXCEEDED),
                    format!(
                        "cannot list the replicas of {uri} in etcd within the --timeout of \
                         {timeout:?}: etcd did not answer [not run: safe to try again]"
                    ),
                ))
            }
            Err(_) => {
                return Err(Failure::with_code(
                    status_exit_code(rpc_core::Code::DEADLINE_EXCEEDED),
                    format!(
                        "cannot connect to {uri} over {} within the --timeout of {timeout:?} \
                         [not run: safe to try again]",
                        transport_name(uri)
                    ),
                ))
            }
        },
    };
    result.map_err(|err| {
        let transport = transport_name(uri);
        // The URI is named once: a transport's error may start with it.
        let text = err.to_string();
        let why = text
            .strip_prefix(uri)
            .and_then(|rest| rest.strip_prefix(": "));
        match err.kind() {
            ErrorKind::InvalidAddress | ErrorKind::Unsupported if text.starts_with(uri) => {
                Failure::error(text)
            }
            ErrorKind::InvalidAddress | ErrorKind::Unsupported => {
                Failure::error(format!("{uri}: {err}"))
            }
            // etcd itself is out of reach, not the replicas: say so (a churn review
            // read "cannot connect ... over the transport the replicas registered").
            _ if uri.starts_with("etcd://") && text.starts_with("etcd") => Failure::with_code(
                status_exit_code(rpc_core::Code::UNAVAILABLE),
                format!(
                    "cannot list the replicas of {uri} in etcd: {err} [not run: safe to try \
                         again]"
                ),
            ),
            // (Nothing was sent: the `[not run]` of a call refused unprocessed.)
            kind => Failure::with_code(
                status_exit_code(rpc_core::Code::UNAVAILABLE),
                format!(
                    "cannot connect to {uri} over {transport} ({kind:?}): {} [not run: safe \
                     to try again]",
                    why.unwrap_or(&text)
                ),
            ),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_of_an_authority_is_the_certificates_name() {
        for (authority, host) in [
            ("api.example.com:443", "api.example.com"),
            ("api.example.com", "api.example.com"),
            ("[::1]:8443", "::1"),
            ("[::1]", "::1"),
            ("10.0.0.5:50051", "10.0.0.5"),
        ] {
            assert_eq!(authority_host(authority), host, "{authority}");
        }
    }

    #[test]
    fn service_names_are_told_apart_from_servers() {
        assert!(is_service_name("dns://echo.example:7000"));
        assert!(is_service_name("static://tcp://a:1,tcp://b:1"));
        // Every form `Endpoint` parses as a service name (dns+tcp and dns+rdma were
        // taken for single servers and refused).
        for scheme in [
            "dns+tcp",
            "dns+udp",
            "dns+tls",
            "dns+grpc",
            "dns+grpcs",
            "dns+rdma",
        ] {
            assert!(is_service_name(&format!("{scheme}://echo.example:7000")));
        }
        assert!(is_service_name("etcd://127.0.0.1:2379/kv"));
        assert!(!is_service_name("tcp://127.0.0.1:7000"));
        assert_eq!(transport_name("rdma://h:1"), "RDMA");
    }
}

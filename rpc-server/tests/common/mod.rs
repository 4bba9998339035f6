//! Shared by the tests that need etcd: where it is, and unique service names.

#![allow(dead_code, unreachable_pub)]

use std::{process::Stdio, time::Duration};

use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
};

/// The etcd cluster to test against, or `None` (after saying why) to skip.
pub fn cluster() -> Option<Vec<String>> {
    let endpoints = std::env::var("RPC_ETCD_ENDPOINTS").unwrap_or_else(|_| "127.0.0.1:2379".into());
    let endpoints: Vec<String> = endpoints.split(',').map(str::to_owned).collect();
    let reachable = std::net::TcpStream::connect_timeout(
        &endpoints[0].parse().expect("RPC_ETCD_ENDPOINTS: host:port"),
        Duration::from_secs(1),
    )
    .is_ok();
    if reachable {
        return Some(endpoints);
    }
    if std::env::var_os("CI").is_some() {
        panic!(
            "etcd is not reachable at {}; .ci/run should have started it",
            endpoints[0]
        );
    }
    eprintln!(
        "skipped: no etcd at {} (set RPC_ETCD_ENDPOINTS)",
        endpoints[0]
    );
    None
}

/// A service name no other test uses.
pub fn unique(name: &str) -> String {
    format!("{name}-{}", rpc_core::frame::random_client_id() as u32)
}

/// Starts `rpc-server` registered under `service`; waits until it has registered.
pub async fn start(cluster: &[String], service: &str, name: &str) -> Child {
    let mut child = Command::new(env!("CARGO_BIN_EXE_rpc-server"))
        .args([
            "--listen",
            "tcp://127.0.0.1:0",
            "--register",
            &format!("etcd://{}/{service}", cluster.join(",")),
            "--ttl-s",
            "2",
            "--drain-timeout-ms",
            "5000",
            "--name",
            name,
        ])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start rpc-server");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    loop {
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("rpc-server did not register")
            .unwrap()
            .expect("rpc-server exited");
        if line.starts_with("registered") {
            break;
        }
    }
    child
}

/// `rpc-server` as started by [`launch`]: the process (killed on drop), its
/// listeners' URIs in the order it announced them, and its admin server's address
/// (`HOST:PORT`, when `--admin` or `--metrics` was given).
pub struct Launched {
    pub child: Child,
    pub uris: Vec<String>,
    pub admin: Option<String>,
}

/// Starts `rpc-server` with `args` and reads its announcements: one `listening on URI`
/// per `--listen`, then, with `--admin` (or `--metrics`), `metrics on
/// http://ADDR/metrics` and `admin on http://ADDR/`, both at the same address.
pub async fn launch(args: &[&str]) -> Launched {
    let listeners = args.iter().filter(|a| **a == "--listen").count();
    let admin_wanted = args.iter().any(|a| *a == "--admin" || *a == "--metrics");
    let mut child = Command::new(env!("CARGO_BIN_EXE_rpc-server"))
        .args(args)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start rpc-server");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let (mut uris, mut metrics, mut admin) = (Vec::new(), None, None);
    while uris.len() < listeners || (admin_wanted && admin.is_none()) {
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("rpc-server did not announce its listeners")
            .unwrap()
            .expect("rpc-server exited");
        if let Some(uri) = line.strip_prefix("listening on ") {
            uris.push(uri.to_owned());
        } else if let Some(rest) = line.strip_prefix("metrics on http://") {
            metrics = rest.strip_suffix("/metrics").map(str::to_owned);
        } else if let Some(rest) = line.strip_prefix("admin on http://") {
            admin = rest.strip_suffix('/').map(str::to_owned);
        }
    }
    assert_eq!(metrics, admin, "one address serves both");
    Launched { child, uris, admin }
}

/// The whole answer (head and body) to a plain HTTP/1.1 GET.
pub async fn http_get(addr: &str, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    response
}

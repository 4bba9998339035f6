//! Shared by the tests that need etcd: where it is, and unique service names.

#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

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

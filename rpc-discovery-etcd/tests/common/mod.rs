//! Shared by the etcd tests: where etcd is, and unique service names.

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

/// Whether the `etcd` binary is here, for the tests that run an etcd of their own;
/// without it they are skipped with a message, except under CI, where that fails.
pub fn have_etcd() -> bool {
    let found = std::process::Command::new("etcd")
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        assert!(
            std::env::var_os("CI").is_none(),
            "no etcd binary; .ci/run installs etcd-server"
        );
        eprintln!("skipped: no etcd binary (Debian: etcd-server)");
    }
    found
}

/// A port nothing listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A directory of the test's own, removed however the test ends.
pub struct TempDir(pub std::path::PathBuf);

impl TempDir {
    /// A new, empty directory named after `name`.
    pub fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(unique(name));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

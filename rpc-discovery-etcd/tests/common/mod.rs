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

/// A port nothing listens on now, for an etcd the test starts (and may restart on the
/// same port). Picked below Linux's ephemeral range (32768 and up), where no
/// connection made meanwhile takes it by chance, and never twice in one process.
pub fn free_port() -> u16 {
    use std::hash::{BuildHasher, Hasher};
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap();
    for _ in 0..10_000 {
        let random = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        let port = 20_000 + (random % 12_000) as u16;
        if given.contains(&port) || std::net::TcpListener::bind(("127.0.0.1", port)).is_err() {
            continue;
        }
        given.push(port);
        return port;
    }
    panic!("no free port between 20000 and 32000");
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

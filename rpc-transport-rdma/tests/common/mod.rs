//! Helpers shared by the integration tests: endpoint and link pairs over real
//! sockets, and waits with hang guards (never timing assertions).

#![allow(dead_code, unreachable_pub)]

pub mod peer;

use std::{
    future::poll_fn,
    path::PathBuf,
    sync::atomic::{AtomicUsize, Ordering},
    time::Duration,
};

use bytes::Bytes;
use rpc_core::link::Link;
use rpc_transport_rdma::{
    provider::{Completion, Endpoint},
    soft::{self, SoftEndpoint, SoftListener},
    Address, RdmaConfig, RdmaLink,
};

/// Hang guard for one wait; never a measure of speed.
pub const GUARD: Duration = Duration::from_secs(60);

/// A fresh socket path in the temporary directory.
pub fn socket_path(name: &str) -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    std::env::temp_dir().join(format!(
        "rpc-rdma-{}-{name}-{}.sock",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ))
}

/// Two connected soft endpoints: (client, server).
pub async fn endpoint_pair(
    client: &RdmaConfig,
    server: &RdmaConfig,
    tcp: bool,
) -> (SoftEndpoint, SoftEndpoint) {
    let address = if tcp {
        Address::Tcp("127.0.0.1:0".into())
    } else {
        Address::Unix(socket_path("pair"))
    };
    let mut listener = SoftListener::bind(&address, server.clone()).await.unwrap();
    let address = listener.address().clone();
    let (a, b) = tokio::join!(soft::connect(&address, client), listener.accept());
    (a.unwrap(), b.unwrap())
}

/// Two connected links: (client, server).
pub async fn link_pair(
    client: &RdmaConfig,
    server: &RdmaConfig,
    max_frame_len: usize,
    tcp: bool,
) -> (RdmaLink, RdmaLink) {
    let (a, b) = endpoint_pair(client, server, tcp).await;
    (
        RdmaLink::new(a, client, max_frame_len).unwrap(),
        RdmaLink::new(b, server, max_frame_len).unwrap(),
    )
}

/// The next completion of `ep`.
pub async fn completion<E: Endpoint>(ep: &mut E) -> Completion<E::Buf> {
    tokio::time::timeout(GUARD, poll_fn(|cx| ep.poll_completion(cx)))
        .await
        .expect("completion hung")
        .expect("endpoint failed")
}

pub async fn recv<L: Link>(link: &mut L) -> Option<Result<Bytes, rpc_core::Error>> {
    tokio::time::timeout(GUARD, poll_fn(|cx| link.poll_recv(cx)))
        .await
        .expect("recv hung")
}

pub async fn send<L: Link>(link: &mut L, header: &[u8], payload: Bytes) {
    tokio::time::timeout(GUARD, poll_fn(|cx| link.poll_ready(cx)))
        .await
        .expect("poll_ready hung")
        .unwrap();
    link.start_send(header, payload.into()).unwrap();
}

pub async fn flush<L: Link>(link: &mut L) {
    tokio::time::timeout(GUARD, poll_fn(|cx| link.poll_flush(cx)))
        .await
        .expect("flush hung")
        .unwrap();
}

/// A deterministic pattern (a byte per position) so that misplaced bytes show.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u32)
                .wrapping_mul(2654435761)
                .rotate_left(u32::from(seed) % 32) as u8
        })
        .collect()
}

pub fn no_cma() -> RdmaConfig {
    RdmaConfig {
        cross_memory_attach: false,
        ..RdmaConfig::default()
    }
}

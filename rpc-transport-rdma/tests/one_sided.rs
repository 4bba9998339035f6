//! The soft provider's interface in one process: messages into posted buffers,
//! one-sided reads and writes by cross-memory attach and through the responder,
//! and every way an access is refused, each leaving the connection usable.

mod common;

use bytes::Bytes;
use common::{completion, endpoint_pair, no_cma, pattern};
use rpc_core::ErrorKind;
use rpc_transport_rdma::{
    provider::{Access, Buffer, Endpoint, Op, Region, RegionDesc},
    soft::SoftEndpoint,
    RdmaConfig,
};

/// Reads `len` bytes at `offset` of `desc` from `ep`: the data, or the error.
async fn read(
    ep: &mut SoftEndpoint,
    desc: RegionDesc,
    offset: u64,
    len: usize,
) -> Result<Vec<u8>, rpc_core::Error> {
    let dst = ep.alloc(len).unwrap();
    let slice = rpc_transport_rdma::provider::RemoteSlice {
        region: desc,
        offset,
        len,
    };
    ep.post_read(7, dst, 0, slice).unwrap();
    let c = completion(ep).await;
    assert_eq!((c.wr, c.op), (7, Op::Read));
    c.result.map(|n| c.buf.as_slice()[..n].to_vec())
}

async fn write(
    ep: &mut SoftEndpoint,
    desc: RegionDesc,
    offset: u64,
    data: &[u8],
) -> Result<usize, rpc_core::Error> {
    let mut src = ep.alloc(data.len()).unwrap();
    src.as_mut_slice().copy_from_slice(data);
    let slice = rpc_transport_rdma::provider::RemoteSlice {
        region: desc,
        offset,
        len: data.len(),
    };
    ep.post_write(8, src, 0, slice).unwrap();
    let c = completion(ep).await;
    assert_eq!((c.wr, c.op), (8, Op::Write));
    c.result
}

/// Two connected endpoints, with cross-memory attach allowed or not, over TCP or a
/// Unix socket. Only a Unix socket confirms the peer's pid, so only there is it used.
async fn pair(cma: bool, tcp: bool) -> (SoftEndpoint, SoftEndpoint) {
    let config = if cma { RdmaConfig::default() } else { no_cma() };
    let (a, b) = endpoint_pair(&config, &config, tcp).await;
    assert_eq!(a.uses_cross_memory_attach(), cma && !tcp);
    assert_eq!(b.uses_cross_memory_attach(), cma && !tcp);
    (a, b)
}

async fn reads_and_writes_move_the_data(cma: bool, tcp: bool) {
    let (mut a, b) = pair(cma, tcp).await;
    // Larger than a responder chunk, and not a multiple of it.
    let data = pattern(3 * 256 * 1024 + 123, 1);
    let readable = b.expose(Bytes::from(data.clone())).unwrap();
    // A peer that cannot attach to our memory is not told where it is.
    assert_eq!(
        readable.desc().addr != 0,
        cma && !tcp,
        "{:?}",
        readable.desc()
    );
    let writable = b
        .register(b.alloc(1 << 20).unwrap(), Access::READ_WRITE)
        .unwrap();
    let got = read(&mut a, readable.desc(), 0, data.len()).await.unwrap();
    assert!(got == data, "whole region read intact");
    let got = read(&mut a, readable.desc(), 1000, 5000).await.unwrap();
    assert!(got == data[1000..6000], "a slice read intact");
    let written = pattern(600_000, 2);
    assert_eq!(
        write(&mut a, writable.desc(), 4096, &written)
            .await
            .unwrap(),
        written.len()
    );
    let back = read(&mut a, writable.desc(), 4096, written.len())
        .await
        .unwrap();
    assert!(back == written, "read back what was written");
    let buf = writable.revoke().await.expect("an owned buffer");
    assert!(buf.as_slice()[4096..4096 + written.len()] == written[..]);
    assert!(buf.as_slice()[..4096].iter().all(|&b| b == 0));
    let stats = a.stats();
    if cma && !tcp {
        assert!(stats.cma_reads.load(std::sync::atomic::Ordering::Relaxed) >= 3);
        assert_eq!(
            b.stats().served.load(std::sync::atomic::Ordering::Relaxed),
            0,
            "b's responder did nothing"
        );
    } else {
        assert!(b.stats().served.load(std::sync::atomic::Ordering::Relaxed) > 0);
    }
    drop(readable);
    assert_eq!(
        b.stats()
            .regions_live
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_and_writes_by_cross_memory_attach() {
    reads_and_writes_move_the_data(true, false).await;
    // Over TCP, even on loopback, through the responder.
    reads_and_writes_move_the_data(true, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_and_writes_through_the_responder() {
    reads_and_writes_move_the_data(false, false).await;
    reads_and_writes_move_the_data(false, true).await;
}

async fn refusals_are_clear_and_harmless(cma: bool) {
    let (mut a, b) = pair(cma, false).await;
    let data = pattern(4096, 3);
    let readable = b.expose(Bytes::from(data.clone())).unwrap();
    let writable = b.register(b.alloc(4096).unwrap(), Access::WRITE).unwrap();
    let desc = readable.desc();
    let cases: Vec<(&str, RegionDesc, u64, usize, bool, &str)> = vec![
        (
            "wrong key",
            RegionDesc {
                key: desc.key + (7 << 32),
                ..desc
            },
            0,
            16,
            false,
            "unknown remote key",
        ),
        (
            "wrong slot",
            RegionDesc {
                key: desc.key + 500,
                ..desc
            },
            0,
            16,
            false,
            "unknown remote key",
        ),
        // The descriptor lies about the length: the owner's table decides.
        (
            "out of bounds",
            RegionDesc {
                len: 1 << 20,
                ..desc
            },
            4000,
            200,
            false,
            "out of bounds",
        ),
        (
            "offset overflow",
            RegionDesc {
                len: u64::MAX,
                ..desc
            },
            u64::MAX - 4,
            16,
            false,
            "out of bounds",
        ),
        (
            "write to a read-only region",
            desc,
            0,
            16,
            true,
            "write access denied",
        ),
        (
            "read of a write-only region",
            writable.desc(),
            0,
            16,
            false,
            "read access denied",
        ),
    ];
    for (what, desc, offset, len, is_write, words) in cases {
        let result = if is_write {
            write(&mut a, desc, offset, &vec![1u8; len])
                .await
                .map(|_| Vec::new())
        } else {
            read(&mut a, desc, offset, len).await
        };
        let err = result.expect_err(what);
        assert_eq!(err.kind(), ErrorKind::Protocol, "{what}: {err}");
        assert!(err.to_string().contains(words), "{what}: {err}");
        // The connection is still good.
        assert!(
            read(&mut a, readable.desc(), 0, 4096).await.unwrap() == data,
            "after {what}"
        );
    }
    // Use after deregistration.
    let stale = readable.desc();
    drop(readable);
    let err = read(&mut a, stale, 0, 16).await.unwrap_err();
    assert!(err.to_string().contains("revoked"), "{err}");
    // The slot is reused by a new region; the old key stays refused.
    let again = b.expose(Bytes::from_static(b"another region")).unwrap();
    assert_eq!(again.desc().key & 0xffff_ffff, stale.key & 0xffff_ffff);
    let err = read(&mut a, stale, 0, 4).await.unwrap_err();
    assert!(err.to_string().contains("revoked"), "{err}");
    assert_eq!(read(&mut a, again.desc(), 0, 7).await.unwrap(), b"another");
    assert!(
        b.stats()
            .rejected
            .load(std::sync::atomic::Ordering::Relaxed)
            + a.stats()
                .rejected
                .load(std::sync::atomic::Ordering::Relaxed)
            >= 8
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_by_cross_memory_attach() {
    refusals_are_clear_and_harmless(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_through_the_responder() {
    refusals_are_clear_and_harmless(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_land_in_posted_buffers_and_a_missing_buffer_is_an_error() {
    let config = RdmaConfig {
        recv_buffers: 4,
        ..RdmaConfig::default()
    };
    let (mut a, mut b) = endpoint_pair(&config, &config, false).await;
    assert_eq!(b.recv_buffers(), 4);
    for i in 0..4u8 {
        let mut buf = a.alloc(100).unwrap();
        buf.as_mut_slice()[0] = i;
        a.post_send(100 + u64::from(i), buf, 10, true).unwrap();
        let c = completion(&mut a).await;
        assert_eq!((c.op, c.wr), (Op::Send, 100 + u64::from(i)));
    }
    let mut ids = Vec::new();
    for i in 0..4u8 {
        let c = completion(&mut b).await;
        assert_eq!(c.op, Op::Recv);
        assert_eq!(c.result.unwrap(), 10);
        assert_eq!(c.buf.as_slice()[0], i, "in order");
        ids.push(c.wr);
    }
    ids.sort_unstable();
    assert_eq!(ids, [0, 1, 2, 3], "the buffers posted at setup");
    // A fifth message finds no buffer: the receiving connection fails, as on
    // hardware with no receiver-not-ready retries.
    a.post_send(200, a.alloc(10).unwrap(), 10, true).unwrap();
    let err = std::future::poll_fn(|cx| b.poll_completion(cx))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("receiver not ready"), "{err}");
    assert_eq!(b.stats().rnr.load(std::sync::atomic::Ordering::Relaxed), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoking_a_region_waits_for_nothing_when_idle_and_frees_it() {
    let (_a, b) = pair(true, false).await;
    let region = b
        .register(b.alloc(64).unwrap(), Access::READ_WRITE)
        .unwrap();
    assert_eq!(
        b.stats()
            .regions_live
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    let buf = region.revoke().await.unwrap();
    assert_eq!(buf.len(), 64);
    assert_eq!(
        b.stats()
            .regions_live
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
    assert_eq!(
        b.stats()
            .quarantined
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
}

/// Over TCP no peer is taken to be on this host, on loopback either: nothing confirms
/// the pid a TCP peer's HELLO names (a Unix socket's SO_PEERCRED does), and a peer
/// naming another process, with the table of another connection to it, would have us
/// check its accesses against that table and copy to and from that process (two
/// hostile-peer rounds: a remote peer echoing our own HELLO back, then a local one
/// replaying the HELLO of its other connection). So TCP peers are served through the
/// responder. Tried at this host's address on its default route too, when it has one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tcp_peer_is_not_taken_for_this_host() {
    use rpc_transport_rdma::{soft, Address};
    let config = RdmaConfig::default();
    let mut listener = soft::SoftListener::bind(&Address::Tcp("0.0.0.0:0".into()), config.clone())
        .await
        .unwrap();
    let Address::Tcp(bound) = listener.address().clone() else {
        unreachable!("a TCP listener")
    };
    let port = bound.rsplit(':').next().unwrap();
    let mut hosts = vec!["127.0.0.1".to_owned()];
    // This host's address on its default route (no datagram is sent).
    let probe = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    match probe
        .connect("10.255.255.1:9")
        .and_then(|()| probe.local_addr())
    {
        Ok(addr) if !addr.ip().is_loopback() && !addr.ip().is_unspecified() => {
            hosts.push(addr.ip().to_string())
        }
        _ => eprintln!("no non-loopback address: loopback only"),
    }
    for host in hosts {
        let at = Address::Tcp(format!("{host}:{port}"));
        let (a, b) = tokio::join!(soft::connect(&at, &config), listener.accept());
        let (a, b) = (a.unwrap(), b.unwrap());
        assert!(!a.uses_cross_memory_attach(), "{host}");
        assert!(!b.uses_cross_memory_attach(), "{host}");
    }
}

/// A descriptor of another connection's region (a stale one kept across a
/// reconnection, say) is refused, not taken for the region of this connection at the
/// same index: every table's first region had the same key (a review).
async fn another_connections_descriptor_is_refused(cma: bool) {
    let (_a1, b1) = pair(cma, false).await;
    let (mut a2, b2) = pair(cma, false).await;
    let one = b1.expose(Bytes::from_static(b"connection one")).unwrap();
    let two = b2.expose(Bytes::from_static(b"connection two")).unwrap();
    assert_eq!(one.desc().key & 0xffff_ffff, two.desc().key & 0xffff_ffff);
    let err = read(&mut a2, one.desc(), 0, 14).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Protocol, "{err}");
    assert!(
        err.to_string().contains("unknown remote key") || err.to_string().contains("revoked"),
        "{err}"
    );
    assert_eq!(
        read(&mut a2, two.desc(), 0, 14).await.unwrap(),
        b"connection two"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_connections_descriptor_is_refused_by_cross_memory_attach() {
    another_connections_descriptor_is_refused(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_connections_descriptor_is_refused_through_the_responder() {
    another_connections_descriptor_is_refused(false).await;
}

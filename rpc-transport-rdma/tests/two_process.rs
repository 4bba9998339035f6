//! Two processes: one-sided operations while the peer's application is blocked (and
//! proof that it ran no code), and a peer killed in the middle of a transfer.
//!
//! The peer is this test binary again (see `common::peer`): [`peer_process`] runs
//! its role.

mod common;

use std::{future::poll_fn, io::BufRead, path::PathBuf, sync::atomic::Ordering, time::Duration};

use bytes::Bytes;
use common::{
    completion, no_cma, pattern,
    peer::{self, all_switches, blocked_in, say, start_client_peer, start_peer, READ_SYSCALL},
    recv, socket_path, GUARD,
};
use rpc_core::link::Link;
use rpc_transport_rdma::{
    provider::{Access, Buffer, Endpoint, Op, Region, RegionDesc, RemoteSlice, DESC_LEN},
    soft::{self, SoftListener},
    Address, RdmaConfig, RdmaLink,
};
use tokio::io::AsyncWriteExt;

const REGION: usize = 8 << 20;
const BIG_REGION: usize = 64 << 20;
const BIG_FRAME: usize = 32 << 20;

/// The peer processes' entry point; returns at once in a normal test run.
#[test]
fn peer_process() {
    let Some((role, path)) = peer::role() else {
        return;
    };
    match role.as_str() {
        "exposer" => exposer(path, false, REGION),
        "exposer-responder" => exposer(path, true, REGION),
        "exposer-big" => exposer(path, false, BIG_REGION),
        "exposer-big-responder" => exposer(path, true, BIG_REGION),
        "big-sender" => big_sender(path),
        other => panic!("unknown role {other}"),
    }
    std::process::exit(0);
}

/// Exposes a readable region (a known pattern) and a writable one, sends their
/// descriptors, then blocks its only application thread on standard input. With
/// cross-memory attach the runtime is single-threaded, so nothing of this process
/// runs at all while blocked; with the responder, one runtime worker serves the
/// peer while the application's (main) thread stays blocked.
fn exposer(path: PathBuf, responder: bool, size: usize) {
    let rt = if responder {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    }
    .unwrap();
    let config = if responder {
        no_cma()
    } else {
        RdmaConfig::default()
    };
    let (ep, readable, writable) = rt.block_on(async {
        let mut listener = SoftListener::bind(&Address::Unix(path), config)
            .await
            .unwrap();
        say("listening");
        let mut ep = listener.accept().await.unwrap();
        let readable = ep.expose(Bytes::from(pattern(size, 1))).unwrap();
        let writable = ep.register(ep.alloc(size).unwrap(), Access::WRITE).unwrap();
        let mut buf = ep.alloc(2 * DESC_LEN).unwrap();
        let mut d = [0u8; DESC_LEN];
        readable.desc().encode(&mut d);
        buf.as_mut_slice()[..DESC_LEN].copy_from_slice(&d);
        writable.desc().encode(&mut d);
        buf.as_mut_slice()[DESC_LEN..].copy_from_slice(&d);
        ep.post_send(1, buf, 2 * DESC_LEN, true).unwrap();
        let c = completion(&mut ep).await;
        assert_eq!(c.op, Op::Send);
        // Let the driver write the message out before the thread blocks.
        tokio::time::sleep(Duration::from_millis(50)).await;
        (ep, readable, writable)
    });
    // The test harness runs this in a thread of its own; tell which.
    let me = std::fs::read_link("/proc/thread-self").unwrap();
    let tid = me.file_name().unwrap().to_string_lossy().into_owned();
    say(&format!("blocked {tid}"));
    // The application blocks here and runs no code until the test writes a line.
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).unwrap();
    let buf = rt.block_on(writable.revoke()).expect("an owned buffer");
    if buf.as_slice() == pattern(size, 2).as_slice() {
        say("write-ok");
    } else {
        say("write-bad");
    }
    drop((readable, ep));
}

/// Connects a link and sends two large frames by rendezvous, then idles until it
/// is killed.
fn big_sender(path: PathBuf) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let config = RdmaConfig::default();
        let ep = soft::connect(&Address::Unix(path), &config).await.unwrap();
        let mut link = RdmaLink::new(ep, &config, BIG_FRAME * 2).unwrap();
        for seed in [1u8, 2] {
            common::send(&mut link, &[seed], Bytes::from(pattern(BIG_FRAME, seed))).await;
        }
        common::flush(&mut link).await;
        say("sent");
        std::future::pending::<()>().await;
    });
}

async fn descriptors(ep: &mut soft::SoftEndpoint) -> (RegionDesc, RegionDesc) {
    let c = completion(ep).await;
    assert_eq!(c.op, Op::Recv);
    assert_eq!(c.result.unwrap(), 2 * DESC_LEN);
    let readable = RegionDesc::decode(&c.buf.as_slice()[..DESC_LEN]).unwrap();
    let writable = RegionDesc::decode(&c.buf.as_slice()[DESC_LEN..]).unwrap();
    ep.post_recv(c.wr, c.buf).unwrap();
    (readable, writable)
}

/// A one-sided read: the data, or the error (of the operation, or of the
/// connection).
async fn read(
    ep: &mut soft::SoftEndpoint,
    desc: RegionDesc,
    offset: u64,
    len: usize,
) -> Result<Vec<u8>, rpc_core::Error> {
    let slice = RemoteSlice {
        region: desc,
        offset,
        len,
    };
    ep.post_read(1, ep.alloc(len).unwrap(), 0, slice)?;
    let c = tokio::time::timeout(GUARD, poll_fn(|cx| ep.poll_completion(cx)))
        .await
        .expect("read hung")?;
    c.result.map(|n| c.buf.as_slice()[..n].to_vec())
}

async fn one_sided_while_blocked(responder: bool) {
    let role = if responder {
        "exposer-responder"
    } else {
        "exposer"
    };
    let mut peer = start_peer(role).await;
    peer.wait_for("listening").await;
    let config = if responder {
        no_cma()
    } else {
        RdmaConfig::default()
    };
    let mut ep = soft::connect(&Address::Unix(peer.path.clone()), &config)
        .await
        .unwrap();
    assert_eq!(ep.uses_cross_memory_attach(), !responder);
    let (readable, writable) = descriptors(&mut ep).await;
    let said = peer.next_said().await;
    let app: u32 = said
        .strip_prefix("blocked ")
        .expect("blocked <tid>")
        .parse()
        .unwrap();
    let pid = peer.pid();
    // Wait until the application's thread sits in read(2) on its standard input.
    tokio::time::timeout(GUARD, async {
        while blocked_in(pid, app).as_deref() != Some(READ_SYSCALL) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the peer never blocked");
    let before = all_switches(pid);

    // Reads: whole, and in pieces.
    let data = pattern(REGION, 1);
    assert!(
        read(&mut ep, readable, 0, REGION).await.unwrap() == data,
        "whole region"
    );
    for offset in [0usize, 12345, REGION - 100] {
        let len = 100.min(REGION - offset);
        let got = read(&mut ep, readable, offset as u64, len).await.unwrap();
        assert!(got == data[offset..offset + len]);
    }
    // Writes, in two halves.
    let written = pattern(REGION, 2);
    for half in [0, REGION / 2] {
        let mut src = ep.alloc(REGION / 2).unwrap();
        src.as_mut_slice()
            .copy_from_slice(&written[half..half + REGION / 2]);
        let slice = RemoteSlice {
            region: writable,
            offset: half as u64,
            len: REGION / 2,
        };
        ep.post_write(2, src, 0, slice).unwrap();
        let c = completion(&mut ep).await;
        assert_eq!(c.op, Op::Write);
        assert_eq!(c.result.unwrap(), REGION / 2);
    }
    // A refused access, while we are at it: still no code of the peer's application.
    let err = read(&mut ep, writable, 0, 10).await.unwrap_err();
    assert!(err.to_string().contains("read access denied"), "{err}");

    let after = all_switches(pid);
    assert_eq!(
        after[&app], before[&app],
        "the peer's application thread did not run during the operations"
    );
    assert_eq!(
        blocked_in(pid, app).as_deref(),
        Some(READ_SYSCALL),
        "still blocked"
    );
    if responder {
        // The responder ran on the runtime's worker, never on the application's
        // thread (nor on the test harness's main thread, which waits for it).
        assert!(
            after.iter().any(|(tid, n)| before.get(tid) != Some(n)),
            "some thread (the runtime worker) served the requests"
        );
        assert_eq!(after[&pid], before[&pid]);
    } else {
        // A single-threaded runtime: no thread of the peer ran at all.
        assert_eq!(after, before, "no thread of the peer process ran");
    }
    let stats = ep.stats();
    if responder {
        assert!(stats.remote_ops.load(Ordering::Relaxed) >= 6);
    } else {
        assert!(stats.cma_reads.load(Ordering::Relaxed) >= 4);
        assert_eq!(stats.cma_writes.load(Ordering::Relaxed), 2);
    }

    // Release the peer: it checks, after revoking its region, what we wrote.
    let mut stdin = peer.child.stdin.take().unwrap();
    stdin.write_all(b"go\n").await.unwrap();
    peer.wait_for("write-ok").await;
    let status = tokio::time::timeout(GUARD, peer.child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_sided_operations_complete_while_the_peer_application_is_blocked() {
    one_sided_while_blocked(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_responder_serves_while_the_peer_application_is_blocked() {
    one_sided_while_blocked(true).await;
}

async fn killed_mid_read(responder: bool) {
    let role = if responder {
        "exposer-big-responder"
    } else {
        "exposer-big"
    };
    let mut peer = start_peer(role).await;
    peer.wait_for("listening").await;
    let config = if responder {
        no_cma()
    } else {
        RdmaConfig::default()
    };
    let mut ep = soft::connect(&Address::Unix(peer.path.clone()), &config)
        .await
        .unwrap();
    let (readable, _) = descriptors(&mut ep).await;
    assert!(peer.next_said().await.starts_with("blocked "));
    let data = pattern(BIG_REGION, 1);
    let chunk = 1 << 20;
    let mut offset = 0;
    let err = loop {
        if offset == 8 * chunk {
            // Mid-transfer: the peer dies.
            peer.child.start_kill().unwrap();
            tokio::time::timeout(GUARD, peer.child.wait())
                .await
                .unwrap()
                .unwrap();
        }
        assert!(
            offset < BIG_REGION,
            "every read succeeded after the peer was killed"
        );
        match read(&mut ep, readable, offset as u64, chunk).await {
            Ok(got) => {
                assert!(offset < 8 * chunk, "a read after the kill succeeded");
                assert!(got == data[offset..offset + chunk]);
                offset += chunk;
            }
            Err(err) => break err,
        }
    };
    assert_eq!(offset, 8 * chunk);
    let text = err.to_string();
    if responder {
        assert!(
            // "ended before ...", or "the connection ... ended: <why>" when the driver
            // ended before this read was posted.
            text.contains("ended") || text.contains("is closed"),
            "a clear error: {text}"
        );
    } else {
        assert!(text.contains("is gone"), "a clear error: {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_killed_mid_transfer_fails_the_read_by_cross_memory_attach() {
    killed_mid_read(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_killed_mid_transfer_fails_the_read_through_the_responder() {
    killed_mid_read(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_killed_with_a_frame_announced_fails_the_link_clearly() {
    let path = socket_path("big");
    let config = RdmaConfig {
        // One pull at a time: the second frame waits, announced, while we hold the
        // first.
        max_pulls: 1,
        ..RdmaConfig::default()
    };
    let mut listener = SoftListener::bind(&Address::Unix(path.clone()), config.clone())
        .await
        .unwrap();
    let mut peer = start_client_peer("big-sender", path).await;
    let ep = tokio::time::timeout(GUARD, listener.accept())
        .await
        .unwrap()
        .unwrap();
    let mut link = RdmaLink::new(ep, &config, BIG_FRAME * 2).unwrap();
    peer.wait_for("sent").await;
    tokio::time::timeout(GUARD, async {
        loop {
            poll_fn(|cx| {
                let _ = link.poll_flush(cx);
                std::task::Poll::Ready(())
            })
            .await;
            let stats = link.stats();
            if stats.rendezvous_received.load(Ordering::Relaxed) == 1
                && stats.recv_held.load(Ordering::Relaxed) == 2
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the first frame was pulled and the second announced");
    peer.child.start_kill().unwrap();
    tokio::time::timeout(GUARD, peer.child.wait())
        .await
        .unwrap()
        .unwrap();
    let first = recv(&mut link).await.unwrap().unwrap();
    assert_eq!(first[0], 1);
    assert!(
        first[1..] == pattern(BIG_FRAME, 1)[..],
        "the frame pulled before the kill"
    );
    let err = recv(&mut link)
        .await
        .expect("an error, not the end")
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("is gone") || text.contains("middle of a rendezvous frame"),
        "a clear error: {text}"
    );
}

//! Instructions per unary call, counted by valgrind: the other half of issue 17's
//! regression guard (`work_per_call.rs` counts allocations). Not a benchmark: nothing
//! here reads a clock, and the figures do not depend on the machine's load.
//!
//! The `workload` test (ignored in a normal run) makes sequential `Echo/Say` calls of
//! 32 bytes with the generated client and server, both on one `current_thread` runtime
//! on one thread, so that they interleave the same way from run to run, over one
//! transport: the in-memory link, TCP on loopback, UDP on loopback (its
//! retransmission timer set far beyond what valgrind's slowness could reach), or
//! RDMA over the soft provider on loopback TCP (its driver tasks on the same thread). The
//! guard runs this test binary's `workload` under `valgrind --tool=cachegrind` twice,
//! with [`FEW`] and [`MANY`] calls after the same warm-up, and takes the difference of
//! the two instruction counts over `MANY - FEW`: the instructions of one call, client
//! and server together, with everything before and after the calls cancelled out.
//!
//! Each figure is compared with `instructions_per_call.baseline` next to this file; one
//! more than [`TOLERANCE`] above its baseline fails the test, and one more than that
//! below it asks for the baseline to be lowered (so that a gain is locked in). A change
//! that must add work rewrites the baseline with
//! `RPC_UPDATE_BASELINE=1 cargo test -p rpc-examples --test instructions_per_call`
//! (and `--release` for the release figures) and says why in its commit message.
//! Debug and release builds keep their figures under their own prefix. Needs
//! `valgrind` on the `PATH` (`.ci/run` installs it); without it the guard is skipped
//! with a message, except under `CI`, where it fails. The baseline is this
//! repository's toolchain's (the machine's stable Rust): another compiler version
//! may count differently and need `RPC_UPDATE_BASELINE=1`.

#[path = "common/baseline.rs"]
mod baseline;

use std::{collections::BTreeMap, process::Command, time::Duration};

use baseline::profile;
use bytes::Bytes;
use rpc_core::{
    client::Channel,
    link::{mem, Listener},
    server::Server,
    Request,
};
use rpc_proto::echo::{echo_client::EchoClient, echo_server::EchoServer, EchoService, SayRequest};

/// Calls before counting starts, in both runs.
const WARM_UP: usize = 200;
/// Calls of the shorter run.
const FEW: usize = 200;
/// Calls of the longer run.
const MANY: usize = 1_200;
/// A figure may move by this fraction of its baseline before the test fails (above)
/// or asks for a new baseline (below). The counts of one build agree to within 0.1%
/// from run to run (client and server on one thread interleave the same way each time).
const TOLERANCE: f64 = 0.02;
/// Request payload bytes (`rpc-bench`'s latency workload sends 32).
const PAYLOAD: usize = 32;

const BASELINE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/instructions_per_call.baseline"
);

/// The comment lines at the top of the baseline file.
const HEADER: &str = "# Instructions per sequential unary call, client and server together (see\n\
     # tests/instructions_per_call.rs). Written by\n\
     #   RPC_UPDATE_BASELINE=1 cargo test -p rpc-examples --test instructions_per_call\n\
     # (add --release for the release figures). A commit that raises a figure says why.\n";

const TRANSPORTS: [&str; 4] = ["mem", "tcp", "udp", "rdma"];

/// The measured calls: run only under valgrind, by the guard below.
#[test]
#[ignore = "run by instructions_per_call_stay_within_their_baseline under valgrind"]
fn workload() {
    let transport = std::env::var("RPC_IR_TRANSPORT").expect("RPC_IR_TRANSPORT");
    let calls: usize = std::env::var("RPC_IR_CALLS")
        .expect("RPC_IR_CALLS")
        .parse()
        .expect("a number of calls");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        // Valgrind slows a round trip fifty-fold: no retransmission may fire (UDP).
        let far = Duration::from_secs(30);
        let builder = Channel::builder().retransmission(far, far, far);
        let channel = match transport.as_str() {
            "mem" => {
                let (listener, connector) = mem::listener();
                spawn_server(listener);
                builder.connect(connector).await
            }
            "tcp" => {
                let listener = rpc_transport_tcp::bind("tcp://127.0.0.1:0")
                    .await
                    .expect("bind");
                let uri = listener.local_addr_uri();
                spawn_server(listener);
                let connector = rpc_transport_tcp::StreamConnector::from_uri(&uri).expect("uri");
                builder.connect(connector).await
            }
            "udp" => {
                let listener = rpc_transport_udp::bind("udp://127.0.0.1:0")
                    .await
                    .expect("bind");
                let uri = listener.local_addr_uri();
                spawn_server(listener);
                let connector = rpc_transport_udp::UdpConnector::from_uri(&uri).expect("uri");
                builder.connect(connector).await
            }
            "rdma" => {
                // The soft provider over TCP: its driver tasks run on this runtime too.
                let listener = rpc_transport_rdma::bind("rdma://127.0.0.1:0")
                    .await
                    .expect("bind");
                let uri = listener.local_addr_uri();
                spawn_server(listener);
                let connector = rpc_transport_rdma::RdmaConnector::from_uri(&uri).expect("uri");
                builder.connect(connector).await
            }
            other => panic!("unknown transport {other}"),
        }
        .expect("connect");
        let mut client = EchoClient::new(channel);
        let payload = Bytes::from(vec![7u8; PAYLOAD]);
        for _ in 0..WARM_UP + calls {
            let request = Request::new(SayRequest {
                message: String::new(),
                payload: payload.clone(),
            });
            let reply = client.say(request).await.expect("Say");
            assert_eq!(reply.get_ref().payload.len(), PAYLOAD);
        }
    });
}

/// Serves the generated `Echo` on `listener`, in a task of the current runtime.
fn spawn_server<L: Listener>(listener: L) {
    let server = Server::builder()
        .add_service(EchoServer::new(EchoService))
        .build();
    tokio::spawn(async move { server.serve(listener).await });
}

/// Instructions of this binary's `workload` over `transport` with `calls` calls.
fn instructions(transport: &str, calls: usize) -> u64 {
    let exe = std::env::current_exe().expect("the test binary");
    let out = Command::new("valgrind")
        .args(["--tool=cachegrind", "--cache-sim=no"])
        .arg("--cachegrind-out-file=/dev/null")
        .arg(exe)
        .args(["--exact", "workload", "--ignored", "--test-threads=1"])
        .env("RPC_IR_TRANSPORT", transport)
        .env("RPC_IR_CALLS", calls.to_string())
        .output()
        .expect("valgrind runs (apt-get install valgrind)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "workload over {transport} failed under valgrind:\n{stderr}"
    );
    // `==1234== I   refs:      61,675,275`
    stderr
        .lines()
        .find_map(|line| {
            let (_, count) = line.split_once("I   refs:")?;
            count.trim().replace(',', "").parse().ok()
        })
        .unwrap_or_else(|| panic!("no instruction count in valgrind's output:\n{stderr}"))
}

#[test]
fn instructions_per_call_stay_within_their_baseline() {
    let valgrind = Command::new("valgrind").arg("--version").output();
    if !valgrind.is_ok_and(|v| v.status.success()) {
        // As the tests that need etcd, grpcio or chromium: skipped outside CI, so that
        // `cargo test --workspace` needs nothing installed; under CI a missing valgrind
        // fails the guard rather than turning it off.
        assert!(
            std::env::var_os("CI").is_none(),
            "this guard needs valgrind on the PATH under CI (apt-get install valgrind)"
        );
        eprintln!("skipped: the instruction guard needs valgrind (apt-get install valgrind)");
        return;
    }
    let mut measured = BTreeMap::new();
    for transport in TRANSPORTS {
        let few = instructions(transport, FEW);
        let many = instructions(transport, MANY);
        let per_call = many.saturating_sub(few) as f64 / (MANY - FEW) as f64;
        measured.insert(format!("{}.{transport}.unary", profile()), per_call.round());
    }
    if baseline::updating() {
        baseline::write(BASELINE, HEADER, &measured, 0);
        return;
    }
    let baseline = baseline::read(BASELINE);
    let mut failures = Vec::new();
    for (key, value) in &measured {
        println!("{key} = {value:.0}");
        let Some(&base) = baseline.get(key) else {
            failures.push(format!(
                "{key}: no baseline (RPC_UPDATE_BASELINE=1 writes one)"
            ));
            continue;
        };
        if *value > base * (1.0 + TOLERANCE) {
            failures.push(format!(
                "{key}: {value:.0} instructions per call, over the baseline's {base:.0} by \
                 more than {:.0}%",
                TOLERANCE * 100.0
            ));
        } else if *value < base * (1.0 - TOLERANCE) {
            failures.push(format!(
                "{key}: {value:.0} instructions per call, under the baseline's {base:.0} by \
                 more than {:.0}%: lock the gain in (RPC_UPDATE_BASELINE=1)",
                TOLERANCE * 100.0
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

//! Several hosts: two replicas in their own network namespaces (veth pairs, their own
//! addresses). One host is cut off (its link goes down: packets vanish, nothing is
//! refused) and the client keeps working on the other. And a server behind a router
//! whose far link has a smaller MTU than UDP's datagrams: calls go through.
//!
//! Needs root and `ip` (iproute2). Skipped otherwise, except under CI, where they are
//! there and the test must run.

mod common;

use std::{process::Stdio, time::Duration};

use futures::StreamExt;
use rpc_core::{balance::Balanced, retry::RetryPolicy, Endpoint, Request};
use rpc_proto::echo::{echo_client::EchoClient, SayRequest};
use rpc_transport_tcp::StreamChannels;
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
};

fn ip(args: &str) -> bool {
    std::process::Command::new("ip")
        .args(args.split_whitespace())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A network namespace with a veth link to the host; removed on drop.
struct Host {
    ns: String,
    host_if: String,
    ns_if: String,
}

impl Host {
    fn create(ns: &str, subnet: u8) -> Option<Host> {
        let host_if = format!("{ns}-h");
        let ns_if = format!("{ns}-n");
        let _ = ip(&format!("netns del {ns}"));
        let _ = ip(&format!("link del {host_if}"));
        let ok = ip(&format!("netns add {ns}"))
            && ip(&format!("link add {host_if} type veth peer name {ns_if}"))
            && ip(&format!("link set {ns_if} netns {ns}"))
            && ip(&format!("addr add 10.231.{subnet}.1/24 dev {host_if}"))
            && ip(&format!("link set {host_if} up"))
            && ip(&format!(
                "netns exec {ns} ip addr add 10.231.{subnet}.2/24 dev {ns_if}"
            ))
            && ip(&format!("netns exec {ns} ip link set {ns_if} up"))
            && ip(&format!("netns exec {ns} ip link set lo up"));
        let host = Host {
            ns: ns.to_owned(),
            host_if,
            ns_if,
        };
        ok.then_some(host)
    }

    /// Takes the host's end of the link down: packets to it vanish (a connect times
    /// out; nothing is refused or reported unreachable).
    fn cut_off(&self) {
        assert!(ip(&format!(
            "netns exec {} ip link set {} down",
            self.ns, self.ns_if
        )));
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = ip(&format!("link del {}", self.host_if));
        let _ = ip(&format!("netns del {}", self.ns));
    }
}

async fn serve_in(host: &Host, addr: &str, name: &str) -> Child {
    serve_in_ns(&host.ns, &format!("tcp://{addr}"), name, &[]).await
}

async fn serve_in_ns(ns: &str, uri: &str, name: &str, more: &[&str]) -> Child {
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, env!("CARGO_BIN_EXE_rpc-server")])
        .args(["--listen", uri, "--name", name])
        .args(more)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start rpc-server in a namespace");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("rpc-server did not start")
        .unwrap()
        .expect("rpc-server exited");
    assert!(line.starts_with("listening on"), "{line}");
    // Read on: a closed pipe would fail the server's next line (the admin address).
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    child
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_survives_a_host_becoming_unreachable() {
    let a = Host::create("rpcnsa", 1);
    let b = Host::create("rpcnsb", 2);
    let (Some(a), Some(b)) = (a, b) else {
        if std::env::var_os("CI").is_some() {
            panic!("could not create network namespaces (needs root and iproute2)");
        }
        eprintln!("skipped: cannot create network namespaces (needs root and iproute2)");
        return;
    };
    let _server_a = serve_in(&a, "10.231.1.2:7000", "host-a").await;
    let _server_b = serve_in(&b, "10.231.2.2:7000", "host-b").await;

    let endpoints: Vec<Endpoint> = ["tcp://10.231.1.2:7000", "tcp://10.231.2.2:7000"]
        .iter()
        .map(|e| e.parse().unwrap())
        .collect();
    let balanced = Balanced::from_endpoints(StreamChannels::default(), endpoints).unwrap();
    let policy = RetryPolicy {
        per_attempt_timeout: Some(Duration::from_millis(300)),
        initial_backoff: Duration::from_millis(10),
        max_attempts: 5,
        ..RetryPolicy::default()
    };
    let client = EchoClient::new(balanced).with_retries(policy);
    let run = |n: usize| {
        let client = client.clone();
        async move {
            futures::stream::iter(0..n)
                .map(|_| {
                    let mut c = client.clone();
                    async move {
                        let reply = c
                            .say(
                                Request::new(SayRequest {
                                    message: "x".into(),
                                    payload: Default::default(),
                                })
                                .with_timeout(Duration::from_secs(5)),
                            )
                            .await?;
                        Ok::<_, rpc_core::Status>(
                            reply
                                .metadata()
                                .get_str("x-served-by")
                                .unwrap_or("")
                                .to_owned(),
                        )
                    }
                })
                .buffer_unordered(8)
                .collect::<Vec<_>>()
                .await
        }
    };
    let before = run(100).await;
    assert!(before.iter().all(|r| r.is_ok()), "{before:?}");
    assert!(before.iter().any(|r| r.as_deref() == Ok("host-a")));
    assert!(before.iter().any(|r| r.as_deref() == Ok("host-b")));

    // Host A goes silent: no RST, no ICMP, packets just vanish.
    a.cut_off();
    let after = run(100).await;
    let failed: Vec<_> = after.iter().filter(|r| r.is_err()).collect();
    assert!(
        failed.is_empty(),
        "calls failed after host A went silent: {failed:?}"
    );
    assert!(after.iter().all(|r| r.as_deref() == Ok("host-b")));
    drop(b);
}

/// A router namespace between this host and a server namespace; the router's link to
/// the server has an MTU of 1000 bytes, less than a UDP datagram of 1200 bytes with
/// its headers. Removed on drop.
struct NarrowPath;

impl NarrowPath {
    const ROUTER: &'static str = "rpcnsr";
    const SERVER: &'static str = "rpcnss";

    fn create() -> Option<NarrowPath> {
        let (r, s) = (Self::ROUTER, Self::SERVER);
        NarrowPath::remove();
        let ok = ip(&format!("netns add {r}"))
            && ip(&format!("netns add {s}"))
            && ip("link add rpcnsr-h type veth peer name rpcnsr-n")
            && ip(&format!("link set rpcnsr-n netns {r}"))
            && ip("addr add 10.232.1.1/24 dev rpcnsr-h")
            && ip("link set rpcnsr-h up")
            && ip("route add 10.232.2.0/24 via 10.232.1.2")
            && ip(&format!(
                "netns exec {r} ip addr add 10.232.1.2/24 dev rpcnsr-n"
            ))
            && ip(&format!("netns exec {r} ip link set rpcnsr-n up"))
            && ip(&format!(
                "netns exec {r} ip link add rpcnss-r type veth peer name rpcnss-n"
            ))
            && ip(&format!("netns exec {r} ip link set rpcnss-n netns {s}"))
            && ip(&format!("netns exec {r} ip link set rpcnss-r mtu 1000"))
            && ip(&format!(
                "netns exec {r} ip addr add 10.232.2.1/24 dev rpcnss-r"
            ))
            && ip(&format!("netns exec {r} ip link set rpcnss-r up"))
            && ip(&format!("netns exec {s} ip link set rpcnss-n mtu 1000"))
            && ip(&format!(
                "netns exec {s} ip addr add 10.232.2.2/24 dev rpcnss-n"
            ))
            && ip(&format!("netns exec {s} ip link set rpcnss-n up"))
            && ip(&format!("netns exec {s} ip link set lo up"))
            && ip(&format!(
                "netns exec {s} ip route add default via 10.232.2.1"
            ))
            && std::process::Command::new("ip")
                .args(["netns", "exec", r, "sh", "-c"])
                .arg("echo 1 > /proc/sys/net/ipv4/ip_forward")
                .status()
                .is_ok_and(|s| s.success());
        let path = NarrowPath;
        ok.then_some(path)
    }

    fn remove() {
        let _ = ip("link del rpcnsr-h");
        let _ = ip(&format!("netns del {}", Self::ROUTER));
        let _ = ip(&format!("netns del {}", Self::SERVER));
    }
}

impl Drop for NarrowPath {
    fn drop(&mut self) {
        NarrowPath::remove();
    }
}

/// UDP calls larger than a datagram, to a server past a hop whose MTU is smaller than
/// the datagrams: the router answers the first ones with ICMP "fragmentation needed",
/// which the kernel reports on the connected socket, and then fragments to the path's
/// MTU; the server's own link is narrower too, so its segmented sends are refused.
/// (A multi-host round: the client's association failed at once with "receive from
/// ...: Message too long", the server's silently, leaving its caller to wait out the
/// deadline; and every segmented send lost a datagram, 440 MB of repairs for 12 MB
/// sent.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udp_calls_cross_a_hop_with_a_smaller_mtu() {
    let Some(_path) = NarrowPath::create() else {
        if std::env::var_os("CI").is_some() {
            panic!("could not create network namespaces (needs root and iproute2)");
        }
        eprintln!("skipped: cannot create network namespaces (needs root and iproute2)");
        return;
    };
    let admin = ["--admin", "10.232.2.2:9100"];
    let _server = serve_in_ns(NarrowPath::SERVER, "udp://10.232.2.2:7000", "far", &admin).await;
    let payload = rpc_core::bytes::Bytes::from(vec![7u8; 1_000_000]);
    for i in 0..10 {
        // Each call on a new association, the path's MTU forgotten: the router's ICMP
        // comes again.
        assert!(ip("route flush cache"));
        assert!(ip(&format!(
            "netns exec {} ip route flush cache",
            NarrowPath::SERVER
        )));
        let channel = rpc_connect::connect("udp://10.232.2.2:7000").await.unwrap();
        let reply = EchoClient::new(channel)
            .say(
                Request::new(SayRequest {
                    message: format!("call {i}"),
                    payload: payload.clone(),
                })
                .with_timeout(Duration::from_secs(20)),
            )
            .await
            .unwrap_or_else(|status| panic!("call {i}: {status}"));
        assert_eq!(reply.get_ref().payload.len(), payload.len(), "call {i}");
    }
    // Nothing was lost past the router's first ICMP: the server's answers (10 MB,
    // 8,500 datagrams) went without repairs once it stopped segmenting its sends.
    let metrics = common::http_get("10.232.2.2:9100", "/metrics").await;
    let resent: u64 = metrics
        .lines()
        .find(|l| l.starts_with("rpc_udp_retransmitted_fragments_total"))
        .and_then(|l| l.split_whitespace().last())
        .expect("the retransmission counter")
        .parse()
        .unwrap();
    assert!(resent < 200, "{resent} fragments sent again");
}

//! Several hosts: two replicas in their own network namespaces (veth pairs, their own
//! addresses). One host is cut off (its link goes down: packets vanish, nothing is
//! refused) and the client keeps working on the other.
//!
//! Needs root and `ip` (iproute2). Skipped otherwise, except under CI, where they are
//! there and the test must run.

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
    let mut child = Command::new("ip")
        .args(["netns", "exec", &host.ns, env!("CARGO_BIN_EXE_rpc-server")])
        .args(["--listen", &format!("tcp://{addr}"), "--name", name])
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

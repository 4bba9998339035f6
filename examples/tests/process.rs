//! Crash tests with real processes: the `echo-server` binary killed with SIGKILL in the
//! middle of a call, then restarted on the same address (over TCP, and over UDP where
//! the client keeps its socket across the restart, and where a stream open across it
//! must fail rather than wait for its deadline).

use std::{process::Stdio, time::Duration};

use rpc_core::Code;
use rpc_proto::echo::{echo_client::EchoClient, SayRequest, SleepRequest};
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
};

/// Starts `echo-server --listen uri` and waits for its `listening on` line.
async fn start_server(uri: &str) -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_echo-server"))
        .args(["--listen", uri])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start echo-server");
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .expect("echo-server did not start")
        .unwrap()
        .expect("echo-server exited");
    let bound = line
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();
    (child, bound)
}

/// A port no socket of this machine is bound to, TCP or UDP, below Linux's ephemeral
/// range (32768 and up): a server restarted on it finds it free, where a port the kernel
/// picked could have gone meanwhile to one of the connections other tests open.
fn unused_port() -> u16 {
    use std::hash::{BuildHasher, Hasher};
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap();
    for _ in 0..10_000 {
        let random = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        let port = 20_000 + (random % 12_000) as u16;
        if given.contains(&port)
            || std::net::TcpListener::bind(("127.0.0.1", port)).is_err()
            || std::net::UdpSocket::bind(("127.0.0.1", port)).is_err()
        {
            continue;
        }
        given.push(port);
        return port;
    }
    panic!("no free port between 20000 and 32000");
}

#[tokio::test]
async fn killed_server_fails_pending_calls_and_the_same_channel_recovers_after_restart() {
    let (mut server, uri) = start_server(&format!("tcp://127.0.0.1:{}", unused_port())).await;
    let channel = rpc_transport_tcp::connect(&uri).await.unwrap();
    let mut client = EchoClient::new(channel.clone());
    client
        .say(SayRequest {
            message: "up".into(),
            payload: Default::default(),
        })
        .await
        .unwrap();

    // Three calls in flight when the server dies.
    let pending: Vec<_> = (0..3)
        .map(|_| {
            let mut c = client.clone();
            tokio::spawn(async move { c.sleep(SleepRequest { delay_ms: 60_000 }).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    server.start_kill().unwrap();
    server.wait().await.unwrap();
    for call in pending {
        let err = tokio::time::timeout(Duration::from_secs(5), call)
            .await
            .expect("a pending call hung after the server died")
            .unwrap()
            .unwrap_err();
        assert_eq!(err.code(), Code::UNAVAILABLE, "{err}");
    }

    // While the server is down, calls fail fast with UNAVAILABLE.
    let err = client
        .say(SayRequest {
            message: "down".into(),
            payload: Default::default(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::UNAVAILABLE, "{err}");

    // Restart on the same address: the same channel works again after its backoff.
    let (_server, again) = start_server(&uri).await;
    assert_eq!(again, uri);
    let mut last = None;
    for _ in 0..100 {
        match client
            .say(SayRequest {
                message: "back".into(),
                payload: Default::default(),
            })
            .await
        {
            Ok(reply) => {
                assert_eq!(reply.get_ref().message, "back");
                return;
            }
            Err(status) => {
                assert_eq!(status.code(), Code::UNAVAILABLE, "{status}");
                last = Some(status);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    panic!("the channel never reconnected: {last:?}");
}

#[tokio::test]
async fn a_udp_server_restarted_on_its_port_serves_a_client_that_kept_its_socket() {
    let (mut server, uri) = start_server(&format!("udp://127.0.0.1:{}", unused_port())).await;
    let mut client = EchoClient::new(rpc_transport_udp::connect(&uri).await.unwrap());
    // Fragmented both ways: reliable messages, numbered per association.
    let large = "x".repeat(20_000);
    let say = |client: &mut EchoClient<rpc_core::client::Channel>| {
        let mut client = client.clone();
        let message = large.clone();
        async move {
            client
                .say(
                    rpc_core::Request::new(SayRequest {
                        message,
                        payload: Default::default(),
                    })
                    .with_timeout(Duration::from_secs(30)),
                )
                .await
        }
    };
    for _ in 0..3 {
        assert_eq!(say(&mut client).await.unwrap().get_ref().message, large);
    }

    // Killed and restarted with nothing sent meanwhile: the client still has its
    // socket and its message numbers, which mean nothing to the new process.
    server.start_kill().unwrap();
    server.wait().await.unwrap();
    let (_server, again) = start_server(&uri).await;
    assert_eq!(again, uri);

    // The new server's first acknowledgement carries its new association tag: the
    // client drops the old association at once. A call may fail with UNAVAILABLE;
    // none waits for its deadline, and the channel's next association works.
    for attempt in 1..=5 {
        match say(&mut client).await {
            Ok(reply) => {
                assert_eq!(reply.get_ref().message, large);
                return;
            }
            Err(status) => {
                assert_eq!(
                    status.code(),
                    Code::UNAVAILABLE,
                    "attempt {attempt}: {status}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    panic!("the channel never got through to the restarted server");
}

/// A call that reached a UDP server killed while it ran, the server then started again
/// on its port: the client's next datagram draws the new listener's GOAWAY (`last_id`
/// 0, for an address it has no association for), which cannot speak for that call. It
/// fails as possibly run, as over TCP, not as unprocessed: a balancer moved such a
/// call to another replica, where it ran a second time.
#[tokio::test]
async fn a_call_running_when_a_udp_server_was_killed_is_not_called_unprocessed() {
    let (mut server, uri) = start_server(&format!("udp://127.0.0.1:{}", unused_port())).await;
    let channel = rpc_core::client::Channel::builder()
        // No copy of the request goes again before the restart (a request sent again
        // fails as possibly run anyway), and no PING: the next call draws the GOAWAY.
        .retransmission(
            Duration::from_secs(20),
            Duration::from_secs(20),
            Duration::from_secs(20),
        )
        .keepalive_interval(None)
        .connect(rpc_transport_udp::UdpConnector::from_uri(&uri).unwrap())
        .await
        .unwrap();
    let mut client = EchoClient::new(channel);
    let say = |message: &str| {
        rpc_core::Request::new(SayRequest {
            message: message.to_owned(),
            payload: Default::default(),
        })
        .with_timeout(Duration::from_secs(30))
    };
    assert_eq!(client.say(say("up")).await.unwrap().get_ref().message, "up");
    let running = {
        let mut client = client.clone();
        tokio::spawn(async move {
            client
                .sleep(
                    rpc_core::Request::new(SleepRequest { delay_ms: 60_000 })
                        .with_timeout(Duration::from_secs(60)),
                )
                .await
        })
    };
    // Time for the request to reach the server, well within the first copy's timer.
    tokio::time::sleep(Duration::from_millis(500)).await;
    server.start_kill().unwrap();
    server.wait().await.unwrap();
    let (_server, again) = start_server(&uri).await;
    assert_eq!(again, uri);

    let next = tokio::time::timeout(Duration::from_secs(30), client.say(say("after")))
        .await
        .expect("a call on the forgotten association hung");
    let status = tokio::time::timeout(Duration::from_secs(30), running)
        .await
        .expect("the running call hung")
        .unwrap()
        .expect_err("an answer from a server that was killed");
    assert_eq!(status.code(), Code::UNAVAILABLE, "{status}");
    assert!(!status.is_unprocessed(), "{status}");
    if next.is_ok() {
        return;
    }
    // The channel's next association works.
    for _ in 0..5 {
        if client.say(say("again")).await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("the channel never got through to the restarted server");
}

/// A stream open on an association that a restarted server does not know: while it
/// waits for the next message the client sends nothing but keepalive PINGs, which the
/// new server answered with PONGs (without state), so the stream hung until its
/// deadline. The client's PINGs go as messages, and a fragment from an address without
/// an association is answered with GOAWAY: the stream fails, and the channel's next
/// association works.
#[tokio::test]
async fn a_udp_stream_across_a_server_restart_fails_instead_of_hanging() {
    let (mut server, uri) = start_server(&format!("udp://127.0.0.1:{}", unused_port())).await;
    let connector = rpc_transport_udp::UdpConnector::from_uri(&uri).unwrap();
    let channel = rpc_core::client::Channel::builder()
        // The first PING goes 2 to 4 s after the last frame: after the restart.
        .keepalive_interval(Some(Duration::from_secs(2)))
        .connect(connector)
        .await
        .unwrap();
    let mut client = EchoClient::new(channel);
    let say = |message: &str| SayRequest {
        message: message.to_owned(),
        payload: Default::default(),
    };
    // The request stream stays open: the client has nothing to send.
    let (requests, requests_rx) = futures::channel::mpsc::unbounded();
    requests.unbounded_send(say("one")).unwrap();
    let mut replies = client
        .chat(rpc_core::Request::new(requests_rx).with_timeout(Duration::from_secs(600)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(replies.message().await.unwrap().unwrap().message, "re: one");
    // Waiting for the next message before the restart (asking for it returns the
    // stream's credit), and time for the server's acknowledgements to arrive: a
    // fragment the client sent after the restart would draw the GOAWAY by itself,
    // PINGs or not. (Late ones make this test pass without testing the PINGs; they
    // cannot make it fail.)
    let next = tokio::spawn(async move { replies.message().await });
    tokio::time::sleep(Duration::from_millis(500)).await;

    server.start_kill().unwrap();
    server.wait().await.unwrap();
    let (_server, again) = start_server(&uri).await;
    assert_eq!(again, uri);

    let ended = tokio::time::timeout(Duration::from_secs(30), next)
        .await
        .expect("the stream hung on an association the server does not know")
        .unwrap();
    let status = ended.expect_err("a message from a server that was restarted");
    assert_eq!(status.code(), Code::UNAVAILABLE, "{status}");
    drop(requests);
    let reply = client
        .say(rpc_core::Request::new(say("two")).with_timeout(Duration::from_secs(30)))
        .await
        .unwrap();
    assert_eq!(reply.get_ref().message, "two");
}

#[tokio::test]
async fn sigterm_drains_calls_in_flight() {
    let (server, uri) = start_server(&format!("tcp://127.0.0.1:{}", unused_port())).await;
    let client = EchoClient::new(rpc_transport_tcp::connect(&uri).await.unwrap());
    let mut calls = Vec::new();
    for _ in 0..3 {
        let mut c = client.clone();
        let mut call = Box::pin(async move { c.sleep(SleepRequest { delay_ms: 3_000 }).await });
        // The first poll hands the request to the channel, in this order.
        assert!(futures::poll!(call.as_mut()).is_pending());
        calls.push(tokio::spawn(call));
    }
    // The server reads a connection in order: once a call made after the three is
    // answered, it has taken them (a call that arrives after the SIGTERM is refused,
    // and the test fails).
    let mut after = client.clone();
    after
        .say(SayRequest {
            message: "after the sleeps".into(),
            payload: Default::default(),
        })
        .await
        .unwrap();
    let pid = server.id().unwrap() as i32;
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    for call in calls {
        let reply = call
            .await
            .unwrap()
            .expect("an in-flight call failed on SIGTERM");
        assert_eq!(reply.get_ref().slept_ms, 3_000);
    }
    let output = tokio::time::timeout(Duration::from_secs(10), server.wait_with_output())
        .await
        .expect("server did not exit after draining")
        .unwrap();
    assert!(output.status.success(), "{:?}", output.status);
}

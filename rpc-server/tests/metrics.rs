//! `rpc-server` configured from a file, with its Prometheus endpoint: calls and errors
//! per method, latency histograms, connections and duplicate-cache counters show up
//! in `GET /metrics`, with their `# HELP` lines. Needs no etcd.

mod common;

use std::{process::Stdio, time::Duration};

use tower::Service;

use rpc_proto::echo::{echo_client::EchoClient, FailRequest, SayRequest};
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::TcpStream,
    process::Command,
};

#[tokio::test]
async fn metrics_count_calls_per_method_and_code() {
    let config = std::env::temp_dir().join(format!("rpc-server-{}.conf", std::process::id()));
    std::fs::write(
        &config,
        "# rpc-server test configuration\nlisten tcp://127.0.0.1:0\nmetrics 127.0.0.1:0\nname from-config\nlog json\n",
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_rpc-server"))
        .args(["--config", config.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let logs = tokio::spawn(async move {
        let mut text = String::new();
        let _ = BufReader::new(stderr).read_to_string(&mut text).await;
        text
    });
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    async fn next(lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>) -> String {
        tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("rpc-server said nothing")
            .unwrap()
            .expect("rpc-server exited")
    }
    let listening = next(&mut lines).await;
    let uri = listening
        .strip_prefix("listening on ")
        .expect(&listening)
        .to_owned();
    let metrics_line = next(&mut lines).await;
    let metrics = metrics_line
        .strip_prefix("metrics on http://")
        .and_then(|s| s.strip_suffix("/metrics"))
        .expect(&metrics_line)
        .to_owned();

    let mut client = EchoClient::new(rpc_transport_tcp::connect(&uri).await.unwrap());
    for _ in 0..5 {
        let reply = client
            .say(SayRequest {
                message: "m".into(),
                payload: Default::default(),
            })
            .await
            .unwrap();
        assert_eq!(reply.metadata().get_str("x-served-by"), Some("from-config"));
    }
    let _ = client
        .fail(FailRequest {
            code: 5,
            message: "nope".into(),
        })
        .await
        .unwrap_err();

    // A retry (attempt 2 of a keyed call), as a retrying client sends one.
    let mut raw = rpc_transport_tcp::connect(&uri).await.unwrap();
    let retry = rpc_core::client::ClientCall {
        method: "rpc.examples.v1.KeyValue/Increment".into(),
        idempotency: Default::default(),
        metadata: rpc_core::Metadata::new(),
        timeout: None,
        call_key: Some(rpc_core::frame::CallKey {
            client: 7,
            call: 1,
            attempt: 2,
        }),
        payload: rpc_core::Payload::new(),
        stream: None,
        compress: None,
    };
    let _ = tower::ServiceExt::ready(&mut raw)
        .await
        .unwrap()
        .call(retry)
        .await;

    // The server's own counters reach the exporter once a second: scrape until they
    // are there.
    let expected = [
        "rpc_server_calls_total{method=\"rpc.examples.v1.Echo/Say\",code=\"OK\"} 5",
        "rpc_server_calls_total{method=\"rpc.examples.v1.Echo/Fail\",code=\"NOT_FOUND\"} 1",
        "rpc_server_call_duration_seconds_count{method=\"rpc.examples.v1.Echo/Say\"} 5",
        "rpc_server_call_duration_seconds_bucket{method=\"rpc.examples.v1.Echo/Say\",le=\"10\"} 5",
        "rpc_server_calls_in_flight{method=\"rpc.examples.v1.Echo/Say\"} 0",
        "# HELP rpc_server_calls_total ",
        "# TYPE rpc_server_call_duration_seconds histogram",
        "rpc_server_connections 2",
        "rpc_server_retried_requests_total 1",
    ];
    let mut body = String::new();
    for _ in 0..100 {
        body = scrape(&metrics, "/metrics").await;
        if expected.iter().all(|line| body.contains(line)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(body.starts_with("HTTP/1.1 200 OK"), "{body}");
    for line in expected {
        assert!(body.contains(line), "missing {line:?} in\n{body}");
    }
    let _ = std::fs::remove_file(&config);

    // Structured logs: JSON lines on stderr.
    child.start_kill().unwrap();
    child.wait().await.unwrap();
    let logs = logs.await.unwrap();
    let first = logs.lines().next().unwrap_or_default();
    assert!(
        first.starts_with('{') && first.contains("\"level\":\"INFO\"") && first.contains("serving"),
        "{logs}"
    );
}

/// `GET path` on the metrics address, the whole response as text.
async fn scrape(addr: &str, path: &str) -> String {
    let mut http = TcpStream::connect(addr).await.unwrap();
    http.write_all(
        format!("GET {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut body = String::new();
    http.read_to_string(&mut body).await.unwrap();
    body
}

/// The value of the first sample of `name` whose labels contain `labels`, in a scrape.
fn sample(body: &str, name: &str, labels: &str) -> Option<f64> {
    body.lines()
        .filter(|line| !line.starts_with('#'))
        .find(|line| {
            line.starts_with(name)
                && line[name.len()..].starts_with(['{', ' '])
                && line.contains(labels)
        })
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
}

#[tokio::test]
async fn connection_and_transport_counters_reach_the_exporter() {
    let common::Launched {
        child: _child,
        uris,
        admin,
    } = common::launch(&[
        "--listen",
        "tcp://127.0.0.1:0",
        "--listen",
        "udp://127.0.0.1:0",
        "--listen",
        "rdma://127.0.0.1:0",
        "--metrics",
        "127.0.0.1:0",
    ])
    .await;
    let metrics = admin.expect("the admin server's address");
    assert_eq!(uris.len(), 3, "{uris:?}");
    for uri in &uris {
        let mut client = EchoClient::new(rpc_connect::connect(uri).await.unwrap());
        for _ in 0..20 {
            client
                .say(SayRequest {
                    message: "m".into(),
                    payload: Default::default(),
                })
                .await
                .unwrap();
        }
    }
    let (udp, rdma) = (&uris[1], &uris[2]);
    let udp_label = format!("listener=\"{udp}\"");
    let rdma_label = format!("listener=\"{rdma}\"");
    let checks: Vec<(&str, String)> = vec![
        ("rpc_server_requests_total", String::new()),
        ("rpc_server_received_bytes_total", String::new()),
        ("rpc_server_sent_frames_total", String::new()),
        ("rpc_server_connections_opened_total", String::new()),
        ("rpc_udp_sent_datagrams_total", udp_label.clone()),
        ("rpc_udp_received_datagrams_total", udp_label.clone()),
        ("rpc_udp_sent_bytes_total", udp_label.clone()),
        // The client's HELLOs, the first answered RETRY.
        ("rpc_udp_unassociated_datagrams_total", udp_label.clone()),
        ("rpc_udp_retries_sent_total", udp_label.clone()),
        (
            "rpc_rdma_sent_frames_total",
            format!("{rdma_label},mode=\"eager\""),
        ),
        (
            "rpc_rdma_received_frames_total",
            format!("{rdma_label},mode=\"eager\""),
        ),
        ("rpc_rdma_batch_messages_total", rdma_label.clone()),
    ];
    let mut body = String::new();
    for _ in 0..100 {
        body = scrape(&metrics, "/metrics").await;
        if checks
            .iter()
            .all(|(name, labels)| sample(&body, name, labels).is_some_and(|v| v > 0.0))
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for (name, labels) in &checks {
        let value = sample(&body, name, labels);
        assert!(
            value.is_some_and(|v| v > 0.0),
            "{name}{{{labels}}} is {value:?} in\n{body}"
        );
    }
    // Gauges: the clients have closed their associations by now, and a server
    // measures round trips only when its messages are acknowledged on their own.
    for name in ["rpc_udp_smoothed_rtt_seconds", "rpc_udp_peers"] {
        assert!(
            sample(&body, name, &udp_label).is_some(),
            "{name} missing in\n{body}"
        );
    }
    // Three connections served 20 calls each.
    assert!(sample(&body, "rpc_server_requests_total", "").unwrap() >= 60.0);
    for name in ["rpc_udp_lost_messages_total", "rpc_rdma_credit_waits_total"] {
        assert!(body.contains(&format!("# HELP {name} ")), "{name}: no HELP");
    }
}

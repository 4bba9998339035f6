//! The server binaries over RDMA (the soft provider): `echo-server` and
//! `interop-server` listening on `rdma://` and `rdma+unix://`, called by the client
//! binaries and by an in-process channel, then stopped with SIGTERM.

use std::{process::Stdio, time::Duration};

use rpc_proto::echo::{echo_client::EchoClient, SayRequest};
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
};

/// Hang guard for one wait; never a measure of speed.
const GUARD: Duration = Duration::from_secs(60);

/// Starts `binary` with one `--listen` per URI and waits for a `listening on` line
/// for each; returns the bound URIs in order.
async fn start(binary: &str, listens: &[String]) -> (Child, Vec<String>) {
    let mut command = Command::new(binary);
    for uri in listens {
        command.args(["--listen", uri]);
    }
    let mut child = command
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the server");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut bound = Vec::new();
    for _ in listens {
        let line = tokio::time::timeout(GUARD, lines.next_line())
            .await
            .expect("the server did not start")
            .unwrap()
            .expect("the server exited");
        let uri = line
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected line {line:?}"));
        bound.push(uri.to_owned());
    }
    (child, bound)
}

/// Stops a server with SIGTERM and checks that it exits cleanly.
async fn terminate(child: Child) {
    let pid = child.id().unwrap().to_string();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(status.success());
    let output = tokio::time::timeout(GUARD, child.wait_with_output())
        .await
        .expect("the server did not exit after SIGTERM")
        .unwrap();
    assert!(output.status.success(), "{:?}", output.status);
}

fn unix_socket(name: &str) -> String {
    let path = std::env::temp_dir().join(format!("rpc-{name}-{}.sock", std::process::id()));
    format!("rdma+unix://{}", path.display())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_server_listens_on_rdma_and_echo_client_calls_it() {
    let listens = ["rdma://127.0.0.1:0".to_owned(), unix_socket("echo-rdma")];
    let (server, bound) = start(env!("CARGO_BIN_EXE_echo-server"), &listens).await;
    assert!(bound[0].starts_with("rdma://127.0.0.1:"), "{bound:?}");
    assert_eq!(bound[1], listens[1]);
    for uri in &bound {
        // In process, through the examples' `connect`...
        let channel = rpc_examples::connect(uri).await.unwrap();
        let reply = EchoClient::new(channel)
            .say(SayRequest {
                message: "over rdma".into(),
                payload: Default::default(),
            })
            .await
            .unwrap();
        assert_eq!(reply.get_ref().message, "over rdma");
        // ... and with the client binary.
        let output = Command::new(env!("CARGO_BIN_EXE_echo-client"))
            .args(["--server", uri, "--message", "hi", "--count", "3"])
            .kill_on_drop(true)
            .output();
        let output = tokio::time::timeout(GUARD, output)
            .await
            .expect("echo-client hung")
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{stdout}");
        assert_eq!(stdout.lines().count(), 3, "{stdout}");
        assert!(stdout.contains("\"hi #2\""), "{stdout}");
    }
    terminate(server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interop_server_listens_on_rdma_and_the_client_runs_every_case() {
    let listens = ["rdma://127.0.0.1:0".to_owned()];
    let (server, bound) = start(env!("CARGO_BIN_EXE_interop-server"), &listens).await;
    let output = Command::new(env!("CARGO_BIN_EXE_interop-client"))
        .args(["--server", &bound[0], "--test-case", "all"])
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(2 * GUARD, output)
        .await
        .expect("interop-client hung")
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "interop-client over rdma failed ({}):\n{stdout}{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout
        .lines()
        .all(|l| l.starts_with("ok ") || l.starts_with("skipped ")));
    assert!(stdout.contains("ok large_unary"), "{stdout}");
    terminate(server).await;
}

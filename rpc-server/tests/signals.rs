//! `rpc-server` as a real process, and what its signals and its config file do (an
//! operator's round): SIGHUP sent while the server starts does not kill it, a second
//! SIGTERM during a drain stops it at once, SIGHUP re-reads the tokens file, and the
//! config file's comments, switches and the `--metrics`/`--admin` names.

mod common;

use std::{process::Stdio, time::Duration};

use rpc_core::{auth::CredentialsLayer, Code, Request};
use rpc_proto::echo::{echo_client::EchoClient, SayRequest, SleepRequest};
use rpc_services::reflection::v1::{
    server_reflection_client::ServerReflectionClient, server_reflection_request::MessageRequest,
    ServerReflectionRequest,
};
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, BufReader},
    process::{Child, Command},
};
use tower::Layer;

const GUARD: Duration = Duration::from_secs(30);

fn send(child: &Child, signal: libc::c_int) {
    let pid = child.id().expect("running") as libc::pid_t;
    // SAFETY: kill(2) with our own child's pid; no memory is involved.
    #[allow(unsafe_code)]
    let sent = unsafe { libc::kill(pid, signal) };
    assert_eq!(sent, 0, "kill({pid}, {signal})");
}

/// A scratch directory for one test's files.
fn scratch(test: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("rpc-server-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Waits for the child to exit; returns its status code (None: killed by a signal)
/// and what it wrote on stderr.
async fn exit_of(mut child: Child) -> (Option<i32>, String) {
    let status = tokio::time::timeout(GUARD, child.wait())
        .await
        .expect("rpc-server did not exit")
        .unwrap();
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .await
        .unwrap();
    (status.code(), stderr)
}

/// SIGHUP's default action is to end the process: sent while the server registered in
/// etcd (before its handler was installed, which came after registering), it killed
/// the server half-started. Now every signal handler is installed before the
/// listeners bind: the SIGHUP waits for the server to have started, and a SIGTERM
/// while registering stops it with a word instead of waiting for etcd.
#[tokio::test]
async fn a_sighup_while_registering_does_not_kill_the_server() {
    // An "etcd" that accepts connections and never answers: registering waits.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let etcd = format!("etcd://{}/kv", silent.local_addr().unwrap());
    let mut child = Command::new(env!("CARGO_BIN_EXE_rpc-server"))
        .args(["--listen", "tcp://127.0.0.1:0", "--register", &etcd])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start rpc-server");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(GUARD, lines.next_line())
        .await
        .expect("rpc-server did not announce its listener")
        .unwrap()
        .expect("rpc-server exited");
    assert!(line.starts_with("listening on "), "{line}");
    // Registering now (it waits for etcd for seconds).
    send(&child, libc::SIGHUP);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        child.try_wait().unwrap().is_none(),
        "SIGHUP while registering ended the server"
    );
    send(&child, libc::SIGTERM);
    let (code, stderr) = exit_of(child).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("SIGTERM while registering"), "{stderr}");
}

/// A second SIGTERM during the drain stops the server at once: the handler
/// installed for the first one made every later SIGTERM (and Ctrl-C) do nothing, and
/// the server waited out its drain timeout for a call in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_sigterm_during_the_drain_stops_the_server_at_once() {
    let mut launched = common::launch(&[
        "--listen",
        "tcp://127.0.0.1:0",
        "--drain-timeout-ms",
        "60000",
        "--admin",
        "127.0.0.1:0",
    ])
    .await;
    let admin = launched.admin.clone().expect("the admin address");
    let channel = rpc_connect::connect(&launched.uris[0]).await.unwrap();
    let mut client = EchoClient::new(channel);
    // A call the drain would wait a minute for.
    let sleeping = tokio::spawn(async move {
        client
            .sleep(Request::new(SleepRequest { delay_ms: 60_000 }))
            .await
    });
    // The call has reached its handler when the status page counts it in flight (a
    // SIGTERM before that would find nothing to drain, and exit at once).
    let in_flight = "\"method\":\"rpc.examples.v1.Echo/Sleep\",\"in_flight\":1";
    tokio::time::timeout(GUARD, async {
        while !common::http_get(&admin, "/status.json")
            .await
            .contains(in_flight)
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the call never reached the server");
    send(&launched.child, libc::SIGTERM);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        launched.child.try_wait().unwrap().is_none(),
        "the first SIGTERM drains, with a call in flight"
    );
    send(&launched.child, libc::SIGTERM);
    let status = tokio::time::timeout(GUARD, launched.child.wait())
        .await
        .expect("a second SIGTERM did not stop the draining server")
        .unwrap();
    assert_eq!(status.code(), Some(1));
    // The call in flight fails (its connection went with the process).
    let result = tokio::time::timeout(GUARD, sleeping)
        .await
        .unwrap()
        .unwrap();
    assert!(result.is_err());
}

async fn say_with(uri: &str, token: &str) -> Result<String, rpc_core::Status> {
    let channel = rpc_connect::connect(uri).await.unwrap();
    let reply = EchoClient::new(CredentialsLayer::bearer(token).layer(channel))
        .say(Request::new(SayRequest {
            message: "hi".into(),
            ..SayRequest::default()
        }))
        .await?;
    Ok(reply.into_inner().message)
}

/// SIGHUP re-reads `--auth-tokens`: a token removed from the file is refused and one
/// added is taken (it re-read only the TLS files, so revoking a leaked token took a
/// restart); a file that no longer holds a token keeps the tokens in use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_tokens_file() {
    let dir = scratch("tokens");
    let tokens = dir.join("tokens");
    std::fs::write(&tokens, "old-token alice\n").unwrap();
    let launched = common::launch(&[
        "--listen",
        "tcp://127.0.0.1:0",
        "--auth-tokens",
        tokens.to_str().unwrap(),
    ])
    .await;
    let uri = &launched.uris[0];
    assert_eq!(say_with(uri, "old-token").await.unwrap(), "hi");

    std::fs::write(&tokens, "new-token bob\n").unwrap();
    send(&launched.child, libc::SIGHUP);
    let deadline = tokio::time::Instant::now() + GUARD;
    // The reload happens when the server handles the signal: wait for its effect.
    while say_with(uri, "new-token").await.is_err() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "new-token never taken"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let status = say_with(uri, "old-token").await.unwrap_err();
    assert_eq!(status.code(), Code::UNAUTHENTICATED, "{status}");

    // A file emptied (a secret being rotated, say) is refused: the tokens stay.
    std::fs::write(&tokens, "# nothing yet\n").unwrap();
    send(&launched.child, libc::SIGHUP);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(say_with(uri, "new-token").await.unwrap(), "hi");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The config file: a `#` inside a value is part of it (a key file named `#2.pem`
/// was cut to `/keys/`), a switch is its name alone (`no-reflection` was refused as
/// "expected `name value`"), and `--metrics` on the command line wins over the file's
/// `admin` as every other command-line option does (the file's `admin` won).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_config_file_keeps_hashes_in_values_and_takes_switches() {
    let dir = scratch("config");
    let tokens = dir.join("#1.tokens");
    std::fs::write(&tokens, "t0ken alice\n").unwrap();
    let config = dir.join("server.conf");
    std::fs::write(
        &config,
        format!(
            "# the test's server\n\
             listen tcp://127.0.0.1:0   # a free port\n\
             auth-tokens {}\n\
             no-reflection\n\
             admin 127.0.0.1:1\n",
            tokens.display()
        ),
    )
    .unwrap();
    let launched = common::launch(&[
        "--config",
        config.to_str().unwrap(),
        "--metrics",
        "127.0.0.1:0",
    ])
    .await;
    // The command line's admin address, not the file's port 1.
    let admin = launched.admin.as_deref().unwrap();
    assert!(!admin.ends_with(":1"), "{admin}");
    let uri = &launched.uris[0];
    assert_eq!(say_with(uri, "t0ken").await.unwrap(), "hi");
    // Reflection is off: its service is unknown.
    let channel = rpc_connect::connect(uri).await.unwrap();
    let mut reflection =
        ServerReflectionClient::new(CredentialsLayer::bearer("t0ken").layer(channel));
    let list = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let status = reflection
        .server_reflection_info(futures::stream::iter([list]))
        .await
        .map(|_| ())
        .unwrap_err();
    assert_eq!(status.code(), Code::UNIMPLEMENTED, "{status}");
    let bad = dir.join("bad.conf");
    std::fs::write(&bad, "no-reflection yes\n").unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_rpc-server"))
        .args(["--config", bad.to_str().unwrap()])
        .output()
        .await
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("bad.conf:1: no-reflection takes no value"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

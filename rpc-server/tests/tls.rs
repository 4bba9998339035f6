//! `rpc-server` as a real process with mutual TLS and bearer tokens, registered in a
//! real etcd under its `tls://` address: a client that finds it by service name
//! connects with TLS, presents its certificate and token, and is served; a call
//! without the token is refused while health checks need none; SIGHUP swaps the
//! certificate for new connections. And the warning for UDP on a non-loopback address.

mod common;

use std::{path::PathBuf, process::Stdio, time::Duration};

use rpc_core::{auth::CredentialsLayer, balance::Balanced, Code, Request};
use rpc_proto::{
    echo::{echo_client::EchoClient, SayRequest},
    health::{health_client::HealthClient, HealthCheckRequest},
};
use rpc_transport_tcp::tls::ClientTls;
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
};
use tower::Layer;

const GUARD: Duration = Duration::from_secs(60);

fn cert(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../testdata/tls")
        .join(name)
}

/// Reads the child's stdout until a line starts with `prefix`; returns the rest.
async fn line_after(
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    prefix: &str,
) -> String {
    loop {
        let line = tokio::time::timeout(GUARD, lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("rpc-server never printed {prefix:?}"))
            .unwrap()
            .expect("rpc-server exited");
        if let Some(rest) = line.strip_prefix(prefix) {
            return rest.to_owned();
        }
    }
}

fn client_tls(ca: &str) -> ClientTls {
    client_tls_as(ca, "client.pem", "client.key")
}

/// Client settings trusting `ca` and presenting the test certificate `identity`.
fn client_tls_as(ca: &str, identity: &str, key: &str) -> ClientTls {
    ClientTls::builder()
        .system_roots(false)
        .ca_file(cert(ca))
        .identity_files(cert(identity), cert(key))
        .build()
        .unwrap()
}

async fn say(balanced: Balanced, token: Option<&str>) -> Result<String, rpc_core::Status> {
    let request = Request::new(SayRequest {
        message: "over mtls".into(),
        ..SayRequest::default()
    })
    .with_timeout(Duration::from_secs(10));
    let reply = match token {
        Some(token) => {
            EchoClient::new(CredentialsLayer::bearer(token).layer(balanced))
                .say(request)
                .await?
        }
        None => EchoClient::new(balanced).say(request).await?,
    };
    Ok(reply.into_inner().message)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_with_mtls_and_tokens_found_through_etcd() {
    let Some(cluster) = common::cluster() else {
        return;
    };
    let service = common::unique("tls");
    let dir = std::env::temp_dir().join(format!("rpc-server-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert_path, key_path) = (dir.join("server.pem"), dir.join("server.key"));
    std::fs::copy(cert("server.pem"), &cert_path).unwrap();
    std::fs::copy(cert("server.key"), &key_path).unwrap();
    let tokens = dir.join("tokens");
    std::fs::write(&tokens, "# token name roles\nabc123token  web  reader\n").unwrap();

    let mut child: Child = Command::new(env!("CARGO_BIN_EXE_rpc-server"))
        .args(["--listen", "tls://127.0.0.1:0", "--name", "secure"])
        .arg("--tls-cert")
        .arg(&cert_path)
        .arg("--tls-key")
        .arg(&key_path)
        .arg("--tls-client-ca")
        .arg(cert("ca.pem"))
        .arg("--auth-tokens")
        .arg(&tokens)
        .arg("--register")
        .arg(format!("etcd://{}/{service}", cluster.join(",")))
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start rpc-server");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let uri = line_after(&mut lines, "listening on ").await;
    assert!(uri.starts_with("tls://"), "{uri}");
    line_after(&mut lines, "registered ").await;

    // Found by service name in etcd: the registered address is tls://, dialed with TLS.
    let options = rpc_connect::ConnectOptions::new().tls(client_tls("ca.pem"));
    let balanced = Balanced::new(rpc_connect::AnyChannels::new(options));
    let changes = rpc_discovery_etcd::resolve(&cluster, &service)
        .await
        .unwrap();
    tokio::spawn(balanced.follow(changes));
    tokio::time::timeout(GUARD, async {
        while balanced.endpoints().is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the replica never showed up in etcd");

    assert_eq!(
        say(balanced.clone(), Some("abc123token")).await.unwrap(),
        "over mtls"
    );
    let status = say(balanced.clone(), None).await.unwrap_err();
    assert_eq!(status.code(), Code::UNAUTHENTICATED, "{status:?}");
    let status = say(balanced.clone(), Some("wrong")).await.unwrap_err();
    assert_eq!(status.code(), Code::UNAUTHENTICATED, "{status:?}");
    // Health checks carry no token, and pass.
    let health = HealthClient::new(balanced.clone())
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap();
    assert_eq!(health.into_inner().status, 1, "SERVING");
    // Check only: a Watch never ends, and without a token it held connections busy
    // (from a review).
    let status = HealthClient::new(balanced.clone())
        .watch(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .map(|_| ())
        .unwrap_err();
    assert_eq!(status.code(), Code::UNAUTHENTICATED, "{status:?}");

    // SIGHUP after the files changed: new connections get a certificate of the other
    // CA; a client trusting only the old CA is now refused.
    std::fs::copy(cert("server-other.pem"), &cert_path).unwrap();
    std::fs::copy(cert("server-other.key"), &key_path).unwrap();
    let pid = child.id().unwrap().to_string();
    let hup = std::process::Command::new("kill")
        .args(["-HUP", &pid])
        .status()
        .unwrap();
    assert!(hup.success());
    let other = rpc_connect::ConnectOptions::new().tls(client_tls("other-ca.pem"));
    let served = tokio::time::timeout(GUARD, async {
        loop {
            // A fresh channel each time: a new connection, a new handshake.
            let channel = rpc_connect::connect_with(&uri, &other).await;
            if let Ok(channel) = channel {
                let reply = EchoClient::new(CredentialsLayer::bearer("abc123token").layer(channel))
                    .say(SayRequest::default())
                    .await;
                if reply.is_ok() {
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(served.is_ok(), "the reloaded certificate was never served");
    let old = rpc_connect::ConnectOptions::new().tls(client_tls("ca.pem"));
    let refused = rpc_connect::connect_with(&uri, &old).await.unwrap_err();
    assert!(refused.to_string().contains("unknown issuer"), "{refused}");

    child.kill().await.unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udp_and_plaintext_grpc_on_a_non_loopback_address_are_warned_about() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_rpc-server"))
        .args([
            "--listen",
            "udp://0.0.0.0:0",
            "--listen",
            "grpc://0.0.0.0:0",
            "--listen",
            "grpc://127.0.0.1:0",
            "--listen",
            "tcp://127.0.0.1:0",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start rpc-server");
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    line_after(&mut stdout, "listening on tcp://").await;
    child.kill().await.unwrap();
    let mut stderr = String::new();
    tokio::io::AsyncReadExt::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr)
        .await
        .unwrap();
    assert!(
        stderr.contains("udp:// carries no encryption"),
        "no warning in: {stderr}"
    );
    assert_eq!(stderr.matches("no encryption").count(), 1, "{stderr}");
    // grpc:// is h2c: warned about off loopback only.
    assert!(
        stderr.contains("grpc:// is plaintext HTTP/2 (h2c)") && stderr.contains("grpcs://"),
        "no warning in: {stderr}"
    );
    assert_eq!(stderr.matches("plaintext HTTP/2").count(), 1, "{stderr}");
}

/// Starts `rpc-server` on `tls://127.0.0.1:0` with the test server certificate and
/// `args` after it; returns the child and its address.
async fn tls_server(args: &[&str]) -> (Child, String) {
    let (cert_path, key_path) = (cert("server.pem"), cert("server.key"));
    let mut all = vec![
        "--listen",
        "tls://127.0.0.1:0",
        "--tls-cert",
        cert_path.to_str().unwrap(),
        "--tls-key",
        key_path.to_str().unwrap(),
    ];
    all.extend_from_slice(args);
    let mut launched = common::launch(&all).await;
    (launched.child, launched.uris.remove(0))
}

/// Whether a client presenting the test certificate `identity` (with `key`) is served
/// a call at `uri`.
async fn served_as(uri: &str, identity: &str, key: &str) -> bool {
    let options = rpc_connect::ConnectOptions::new().tls(client_tls_as("ca.pem", identity, key));
    match rpc_connect::connect_with(uri, &options).await {
        Ok(channel) => {
            tokio::time::timeout(GUARD, EchoClient::new(channel).say(SayRequest::default()))
                .await
                .expect("no answer")
                .is_ok()
        }
        Err(_) => false,
    }
}

/// `--tls-client-ca` given twice trusts the clients of both CAs (only the last file's
/// were, the first dropped without a word).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_client_ca_given_is_trusted() {
    let (ca, other) = (cert("ca.pem"), cert("other-ca.pem"));
    let (mut child, uri) = tls_server(&[
        "--tls-client-ca",
        ca.to_str().unwrap(),
        "--tls-client-ca",
        other.to_str().unwrap(),
    ])
    .await;
    assert!(served_as(&uri, "client.pem", "client.key").await);
    assert!(served_as(&uri, "rogue.pem", "rogue.key").await);
    child.kill().await.unwrap();
}

/// `--tls-client-ca` on the command line replaces the config file's, as `--listen`
/// does: an operator drops a CA without editing the file (both were trusted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn command_line_client_cas_replace_the_files() {
    let dir = std::env::temp_dir().join(format!("rpc-server-ca-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("server.conf");
    std::fs::write(
        &config,
        format!("tls-client-ca {}\n", cert("other-ca.pem").display()),
    )
    .unwrap();
    let ca = cert("ca.pem");
    let (mut child, uri) = tls_server(&[
        "--config",
        config.to_str().unwrap(),
        "--tls-client-ca",
        ca.to_str().unwrap(),
    ])
    .await;
    assert!(
        served_as(&uri, "client.pem", "client.key").await,
        "the command line's CA"
    );
    assert!(
        !served_as(&uri, "rogue.pem", "rogue.key").await,
        "the file's CA is still trusted"
    );
    child.kill().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

//! docs/wire.md is enough to write a client: `tests/wire/client.py` (TCP: unary calls,
//! errors, PING, a server-streaming call, a keyed call, a bad version; then protocol
//! errors, a frame too large, deadlines, CANCEL, client and bidirectional streams, flow
//! control and keyed repeats) and
//! `tests/wire/udp_client.py` (UDP, section 1.2; with association tags, a repeated
//! fragment of a finished message, CANCEL, and CLOSE), written from the document alone, talk
//! to the example server. Skipped (with a message) where no `python3` is installed.

mod common;

use common::{TestEcho, TestServer};
use rpc_core::server::Server;
use rpc_proto::{echo::echo_server::EchoServer, kv::key_value_server::KeyValueServer};

fn python3_missing() -> bool {
    if std::process::Command::new("python3")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipped: python3 is not installed");
        return true;
    }
    false
}

#[tokio::test]
async fn a_python_client_written_from_the_wire_doc_talks_to_the_server() {
    if python3_missing() {
        return;
    }
    let (echo, _probe) = TestEcho::new(None);
    let server = TestServer::start(Server::builder(), echo).await;
    let (host, port) = server
        .uri
        .trim_start_matches("tcp://")
        .rsplit_once(':')
        .unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/wire/client.py");
    let output = tokio::process::Command::new("python3")
        .args([script, host, port])
        .output()
        .await
        .expect("run python3");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "python client failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("ok Count streams 1, 2, 3"), "{stdout}");
    assert!(stdout.contains("ok a keyed call is answered"), "{stdout}");
    assert!(stdout.contains("ok GOAWAY UNSUPPORTED_VERSION"), "{stdout}");
    // The edge cases ran to their end.
    assert!(
        stdout.contains("ok an id already in flight: last_id 1"),
        "{stdout}"
    );
    assert!(
        stdout.contains("ok a WINDOW brings the rest: 3000 of 3000, then OK"),
        "{stdout}"
    );
    assert!(stdout.contains("ok a new call key runs again"), "{stdout}");
}

#[tokio::test]
async fn a_python_udp_client_written_from_the_wire_doc_talks_to_the_server() {
    if python3_missing() {
        return;
    }
    let (echo, _probe) = TestEcho::new(None);
    let server = Server::builder()
        .add_service(EchoServer::new(echo))
        .add_service(KeyValueServer::new(rpc_proto::kv::MemoryStore::default()))
        .build();
    let listener = rpc_transport_udp::bind("udp://127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr_uri();
    let task = tokio::spawn(async move { server.serve(listener).await });
    let (host, port) = addr.trim_start_matches("udp://").rsplit_once(':').unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/wire/udp_client.py");
    let output = tokio::process::Command::new("python3")
        .args([script, host, port])
        .output()
        .await
        .expect("run python3");
    task.abort();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "python UDP client failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains("ok UNIMPLEMENTED for an unknown method over UDP"),
        "{stdout}"
    );
    assert!(
        stdout.contains("ok every acknowledgement is TAGGED with the server's tag"),
        "{stdout}"
    );
    assert!(
        stdout.contains("ok a REQUEST after CLOSE gets GOAWAY NO_ERROR, last_id 0"),
        "{stdout}"
    );
}

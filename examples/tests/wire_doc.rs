//! docs/wire.md is enough to write a client: `tests/wire/client.py`, written from the
//! document alone, talks to the example server. Skipped (with a message) where no
//! `python3` is installed.

mod common;

use common::{TestEcho, TestServer};
use rpc_core::server::Server;

#[tokio::test]
async fn a_python_client_written_from_the_wire_doc_talks_to_the_server() {
    if std::process::Command::new("python3")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipped: python3 is not installed");
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
    assert!(stdout.contains("ok GOAWAY UNSUPPORTED_VERSION"), "{stdout}");
}

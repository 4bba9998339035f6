//! Runs each small single-purpose example (`examples/src/bin/`, listed in the README's
//! "Examples" section) as users do, a process of its own that starts its server on
//! loopback: it must exit with success and print the line that shows it worked.

use std::process::Command;

/// Runs the example binary `path` and checks its exit status and that its output
/// has a line containing `expected`.
fn run(name: &str, path: &str, expected: &str) {
    let output = Command::new(path)
        .output()
        .unwrap_or_else(|err| panic!("cannot run the {name} example: {err}"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the {name} example failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    assert!(
        stdout.lines().any(|line| line.contains(expected)),
        "the {name} example printed no line with {expected:?}:\n{stdout}"
    );
}

#[test]
fn streaming() {
    run(
        "streaming",
        env!("CARGO_BIN_EXE_streaming"),
        "sum: 100 values add up to 5050",
    );
}

#[test]
fn retries() {
    run(
        "retries",
        env!("CARGO_BIN_EXE_retries"),
        "stored: visits = 1 (ran once; 1 answer from the duplicate cache)",
    );
}

#[test]
fn auth() {
    run(
        "auth",
        env!("CARGO_BIN_EXE_auth"),
        "with a token: hi, as alice",
    );
}

#[test]
fn health() {
    run(
        "health",
        env!("CARGO_BIN_EXE_health"),
        "watch rpc.examples.v1.Echo: NotServing",
    );
}

#[test]
fn bulk() {
    run(
        "bulk",
        env!("CARGO_BIN_EXE_bulk"),
        "download over tcp: 67108864 bytes, checksum ok",
    );
}

#[test]
fn udp() {
    run(
        "udp",
        env!("CARGO_BIN_EXE_udp"),
        "increments: 100/100 answered, hits = 100",
    );
}

#[test]
fn tls() {
    run("tls", env!("CARGO_BIN_EXE_tls"), "client: hello over mTLS");
}

#[test]
fn connect() {
    run("connect", env!("CARGO_BIN_EXE_connect"), "6 calls ok");
}

//! Runs the Quickstart program: its client gets the server's answer.

#[test]
fn the_quickstart_client_gets_world() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_rpc-quickstart"))
        .output()
        .expect("run the quickstart");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the quickstart failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(stdout, "hello => world\n");
}

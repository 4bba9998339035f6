//! Runs the compiled `rpc-bench-compare` on a small latency and bulk run of tonic and
//! tarpc (the bulk workload's 16 MiB echoes check the raised size limits).

use std::process::Command;

/// The value after `"key":` up to the next `,` or `}`.
fn field<'a>(line: &'a str, key: &str) -> &'a str {
    let pattern = format!("\"{key}\":");
    let start = line
        .find(&pattern)
        .unwrap_or_else(|| panic!("no {key} in {line}"))
        + pattern.len();
    let rest = &line[start..];
    &rest[..rest.find([',', '}']).unwrap_or(rest.len())]
}

#[test]
fn tonic_and_tarpc_echo_small_and_16_mib_payloads() {
    let output = Command::new(env!("CARGO_BIN_EXE_rpc-bench-compare"))
        .args([
            "--quick",
            "--calls",
            "100",
            "--workload",
            "latency",
            "--workload",
            "bulk",
            "--subject",
            "tonic",
            "--subject",
            "tarpc",
        ])
        .output()
        .expect("run rpc-bench-compare");
    let stdout = String::from_utf8(output.stdout).unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let lines: Vec<&str> = stdout.lines().filter(|l| l.starts_with('{')).collect();
    let expected = [
        ("tonic", "latency", "32"),
        ("tarpc", "latency", "32"),
        ("tonic", "bulk", "1048576"),
        ("tonic", "bulk", "16777216"),
        ("tarpc", "bulk", "1048576"),
        ("tarpc", "bulk", "16777216"),
    ];
    assert_eq!(lines.len(), expected.len(), "{stdout}");
    for (line, (subject, workload, payload)) in lines.iter().zip(expected) {
        assert_eq!(field(line, "subject"), format!("\"{subject}\""), "{line}");
        assert_eq!(field(line, "workload"), format!("\"{workload}\""), "{line}");
        assert_eq!(field(line, "payload_bytes"), payload, "{line}");
        let calls: u64 = field(line, "calls").parse().unwrap();
        assert!(calls > 0, "{line}");
    }
    assert!(
        stdout.contains("| tonic |") && stdout.contains("| tarpc |"),
        "{stdout}"
    );
}

//! Runs the compiled `rpc-bench` on tiny workloads and checks its JSON lines.

use std::process::Command;

/// The keys of a result line, in order.
const KEYS: [&str; 20] = [
    "kind",
    "subject",
    "workload",
    "payload_bytes",
    "concurrency",
    "calls",
    "wall_s",
    "calls_per_s",
    "mib_per_s",
    "lat_us",
    "p50_us",
    "p90_us",
    "p99_us",
    "p999_us",
    "max_us",
    "mean_us",
    "samples",
    "server_cpu_s",
    "client_cpu_s",
    "cpu_us_per_call",
];

/// The value after `"key":` up to the next `,` or `}` (numbers and strings without
/// commas are all this test reads).
fn field<'a>(line: &'a str, key: &str) -> &'a str {
    let pattern = format!("\"{key}\":");
    let start = line
        .find(&pattern)
        .unwrap_or_else(|| panic!("no {key} in {line}"))
        + pattern.len();
    let rest = &line[start..];
    &rest[..rest.find([',', '}']).unwrap_or(rest.len())]
}

/// Runs `rpc-bench` with `args`; its stdout, once it succeeded.
fn run_bench(args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_rpc-bench"))
        .args(args)
        .output()
        .expect("run rpc-bench");
    let stdout = String::from_utf8(output.stdout).unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    stdout
}

#[test]
fn quick_latency_run_prints_result_lines() {
    let stdout = run_bench(&[
        "--quick",
        "--workload",
        "latency",
        "--subject",
        "tcp",
        "--subject",
        "tls",
        "--subject",
        "raw-tcp",
    ]);
    let lines: Vec<&str> = stdout.lines().filter(|l| l.starts_with('{')).collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    for (line, subject) in lines.iter().zip(["\"tcp\"", "\"tls\"", "\"raw-tcp\""]) {
        assert!(line.ends_with('}'), "{line}");
        assert_eq!(line.matches('{').count(), 2, "{line}");
        assert_eq!(line.matches('}').count(), 2, "{line}");
        let mut at = 0;
        for key in KEYS {
            let pos = line[at..]
                .find(&format!("\"{key}\":"))
                .unwrap_or_else(|| panic!("{key} missing or out of order in {line}"));
            at += pos + key.len();
        }
        assert_eq!(line.matches("\":").count(), KEYS.len(), "{line}");
        assert_eq!(field(line, "kind"), "\"result\"");
        assert_eq!(field(line, "subject"), subject);
        assert_eq!(field(line, "workload"), "\"latency\"");
        let calls: u64 = field(line, "calls").parse().unwrap();
        assert!(calls > 0, "{line}");
        for key in &KEYS[6..] {
            if *key != "lat_us" {
                let v: f64 = field(line, key)
                    .parse()
                    .unwrap_or_else(|_| panic!("{key} in {line}"));
                assert!(v.is_finite() && v >= 0.0, "{key} in {line}");
            }
        }
    }
    assert!(
        stdout.contains("| tcp |") && stdout.contains("| tls |") && stdout.contains("| raw-tcp |"),
        "{stdout}"
    );
}

#[test]
fn quick_tls_run_covers_every_workload_beside_tcp() {
    let stdout = run_bench(&[
        "--quick",
        "--duration-s",
        "0.3",
        "--concurrency",
        "32",
        "--subject",
        "tcp",
        "--subject",
        "tls",
        "--baseline",
        "tcp",
    ]);
    let lines: Vec<&str> = stdout.lines().filter(|l| l.starts_with('{')).collect();
    // Per subject: latency, throughput, bulk (two sizes), connect (sequential and
    // concurrent).
    assert_eq!(lines.len(), 12, "{stdout}");
    for subject in ["tcp", "tls"] {
        let of = |workload: &str| -> Vec<&str> {
            lines
                .iter()
                .copied()
                .filter(|l| {
                    field(l, "subject") == format!("\"{subject}\"")
                        && field(l, "workload") == format!("\"{workload}\"")
                })
                .collect()
        };
        for (workload, results) in [
            ("latency", 1),
            ("throughput", 1),
            ("bulk", 2),
            ("connect", 2),
        ] {
            let found = of(workload);
            assert_eq!(found.len(), results, "{subject} {workload}: {stdout}");
            for line in found {
                let calls: u64 = field(line, "calls").parse().unwrap();
                assert!(calls > 0, "{line}");
            }
        }
        let connect = of("connect");
        let concurrency: Vec<&str> = connect.iter().map(|l| field(l, "concurrency")).collect();
        assert_eq!(concurrency, ["1", "16"], "{stdout}");
        let calls: Vec<&str> = connect.iter().map(|l| field(l, "calls")).collect();
        assert_eq!(calls, ["100", "200"], "{stdout}");
    }
    assert!(stdout.contains("Ratios to tcp"), "{stdout}");
    assert!(
        stdout.contains("| connect conns/s, sequential |"),
        "{stdout}"
    );
    assert!(stdout.contains("| tcp | 1.00× ("), "{stdout}");
    assert!(stdout.contains("| tls | "), "{stdout}");
}

#[test]
fn quick_udp_throughput_run_measures_the_framework_and_the_raw_baseline() {
    let stdout = run_bench(&[
        "--quick",
        "--workload",
        "throughput",
        "--duration-s",
        "0.3",
        "--concurrency",
        "32",
        "--subject",
        "udp",
        "--subject",
        "raw-udp",
    ]);
    let lines: Vec<&str> = stdout.lines().filter(|l| l.starts_with('{')).collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    for (line, subject) in lines.iter().zip(["\"udp\"", "\"raw-udp\""]) {
        assert_eq!(field(line, "subject"), subject);
        assert_eq!(field(line, "workload"), "\"throughput\"");
        let calls: u64 = field(line, "calls").parse().unwrap();
        assert!(calls > 0, "{line}");
    }
}

#[test]
fn quick_grpc_run_covers_the_call_workloads_with_two_ratio_tables() {
    let stdout = run_bench(&[
        "--quick",
        "--duration-s",
        "0.3",
        "--subject",
        "grpc",
        "--subject",
        "tcp",
        "--workload",
        "latency",
        "--workload",
        "throughput",
        "--workload",
        "bulk",
        "--baseline",
        "grpc",
        "--baseline",
        "tcp",
    ]);
    let lines: Vec<&str> = stdout.lines().filter(|l| l.starts_with('{')).collect();
    let grpc: Vec<(&str, &str, &str)> = lines
        .iter()
        .filter(|l| field(l, "subject") == "\"grpc\"")
        .map(|l| {
            let calls: u64 = field(l, "calls").parse().unwrap();
            assert!(calls > 0, "{l}");
            (
                field(l, "workload"),
                field(l, "payload_bytes"),
                field(l, "concurrency"),
            )
        })
        .collect();
    // 256 calls in flight on one HTTP/2 connection, 16 MiB messages echoed.
    assert_eq!(
        grpc,
        [
            ("\"latency\"", "32", "1"),
            ("\"throughput\"", "32", "256"),
            ("\"bulk\"", "1048576", "1"),
            ("\"bulk\"", "16777216", "1"),
        ],
        "{stdout}"
    );
    assert!(stdout.contains("Ratios to grpc"), "{stdout}");
    assert!(stdout.contains("Ratios to tcp"), "{stdout}");
    assert!(stdout.contains("| grpc | 1.00× ("), "{stdout}");
}

#[test]
fn idle_connection_memory_is_measured() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_rpc-bench-idle"))
        .args(["--connections", "200"])
        .output()
        .expect("run rpc-bench-idle");
    assert!(output.status.success(), "{output:?}");
    let line = String::from_utf8(output.stdout).unwrap();
    assert!(line.starts_with("{\"kind\":\"idle_connections\""), "{line}");
    assert!(line.contains("\"connections\":200"), "{line}");
    let per: f64 = line
        .rsplit("\"bytes_per_connection\":")
        .next()
        .and_then(|v| v.trim().trim_end_matches('}').parse().ok())
        .expect("bytes_per_connection");
    assert!(per > 0.0, "{line}");
}

#[test]
fn many_connections_run_reports_both_phases_from_a_client_process() {
    let stdout = run_bench(&[
        "--workload",
        "many",
        "--subject",
        "tcp",
        "--subject",
        "raw-tcp",
        "--connections-many",
        "24",
        "--in-flight",
        "2",
        "--duration-s",
        "0.3",
    ]);
    let lines: Vec<&str> = stdout.lines().filter(|l| l.starts_with('{')).collect();
    let expected = [
        ("\"tcp\"", "\"closed\""),
        ("\"tcp\"", "\"open\""),
        ("\"raw-tcp\"", "\"closed\""),
        ("\"raw-tcp\"", "\"open\""),
    ];
    assert_eq!(lines.len(), expected.len(), "{stdout}");
    for (line, (subject, phase)) in lines.iter().zip(expected) {
        assert_eq!(field(line, "subject"), subject, "{line}");
        assert_eq!(field(line, "workload"), "\"many\"", "{line}");
        assert_eq!(field(line, "phase"), phase, "{line}");
        assert_eq!(field(line, "connections"), "24", "{line}");
        assert_eq!(field(line, "concurrency"), "48", "{line}");
        let calls: u64 = field(line, "calls").parse().unwrap();
        assert!(calls > 0, "{line}");
        let rss: u64 = field(line, "server_rss_load_bytes").parse().unwrap();
        assert!(rss > 0, "{line}");
    }
    assert!(
        stdout.contains("| open-loop p99 |") && stdout.contains("| raw-tcp | 1.00×"),
        "{stdout}"
    );
}

//! Runs the example: its four spans (client, front server, the front server's call,
//! back server) must form one trace, each the child of the one before.

use std::process::Command;

#[test]
fn one_trace_across_a_client_and_two_servers() {
    let output = Command::new(env!("CARGO_BIN_EXE_rpc-example-otel"))
        .output()
        .expect("the example runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("reply: hello"), "{stdout}");
    let summary = stdout
        .lines()
        .find(|line| line.starts_with("4 spans, trace ids: [\""))
        .unwrap_or_else(|| panic!("no summary of 4 spans in\n{stdout}"));
    assert_eq!(
        summary.matches(',').count(),
        1,
        "more than one trace: {summary}"
    );

    // `Kind name span ID parent ID`, last span first (spans end inside out).
    let spans: Vec<(String, String, String)> = stdout
        .lines()
        .skip_while(|line| !line.starts_with("4 spans"))
        .skip(1)
        .map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            (
                words[1].to_owned(),
                words[3].to_owned(),
                words[5].to_owned(),
            )
        })
        .collect();
    let names: Vec<&str> = spans.iter().map(|(name, _, _)| name.as_str()).collect();
    assert_eq!(
        names,
        [
            "demo.Back/Say",
            "demo.Back/Say",
            "demo.Front/Forward",
            "demo.Front/Forward"
        ]
    );
    for pair in spans.windows(2) {
        assert_eq!(
            pair[0].2, pair[1].1,
            "{} is not the child of {}",
            pair[0].0, pair[1].0
        );
    }
    assert_eq!(
        spans[3].2, "0000000000000000",
        "the client's span is the root"
    );
}

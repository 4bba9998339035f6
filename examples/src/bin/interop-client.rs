//! Runs gRPC's interop cases against an `interop-server` (`docs/interop.md`).
//!
//! ```text
//! interop-client [--server URI] [--test-case NAME|all]...
//! ```
//!
//! Default server `tcp://127.0.0.1:7001` (`unix://`, `udp://`, `rdma://`,
//! `rdma+unix://` and `grpc://` work too); default case `all`. `--test-case` may repeat. Prints one line per case, `ok CASE` or
//! `FAILED CASE: why`, and exits with status 1 if any case failed (2 for an unknown
//! case name). Under `all`, the
//! compression cases of a build without compression print `skipped CASE: why` instead
//! (asked for by name, they fail); over `grpc://` they run as over the other wires.

use rpc_examples::{
    flag, flag_values,
    interop::client::{Target, TestCase},
};

#[tokio::main]
async fn main() -> std::process::ExitCode {
    rpc_examples::report(run().await)
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!(
            "interop-client [--server URI] [--test-case NAME|all]... [--tls-ca PEM] \
             [--tls-cert PEM --tls-key PEM] [--tls-server-name NAME]"
        );
        println!("cases:");
        for case in TestCase::ALL {
            println!("  {case}");
        }
        return Ok(());
    }
    let mut values = vec!["--server", "--test-case"];
    values.extend(rpc_examples::CLIENT_TLS_OPTIONS);
    rpc_examples::exit_on_bad_args(&args, &values, &[]);
    let server = flag(&args, "--server").unwrap_or_else(|| "tcp://127.0.0.1:7001".into());
    let mut names = flag_values(&args, "--test-case");
    if names.is_empty() {
        names.push("all".into());
    }
    // (case, whether it was asked for by name)
    let mut cases = Vec::new();
    for name in &names {
        if name == "all" {
            cases.extend(TestCase::ALL.iter().map(|&case| (case, false)));
        } else {
            match name.parse::<TestCase>() {
                Ok(case) => cases.push((case, true)),
                Err(unknown) => {
                    eprintln!("{unknown}");
                    std::process::exit(2);
                }
            }
        }
    }

    // A private CA, a client certificate (mTLS): as echo-client's (from a review:
    // interop runs against a test CA's server were not possible).
    let options = rpc_examples::connect_options(&args)?;
    let target = match Target::connect_with(&server, &options).await {
        Ok(target) => target,
        Err(err) => {
            eprintln!("cannot connect to {server}: {err}");
            std::process::exit(1);
        }
    };
    let mut failures = 0;
    for (case, by_name) in cases {
        match case.unavailable() {
            Some(why) if !by_name => {
                println!("skipped {case}: {why}");
                continue;
            }
            _ => {}
        }
        match case.run(&target).await {
            Ok(()) => println!("ok {case}"),
            Err(why) => {
                failures += 1;
                println!("FAILED {case}: {why}");
            }
        }
    }
    if failures > 0 {
        std::process::exit(1);
    }
    Ok(())
}

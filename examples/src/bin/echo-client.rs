//! Calls the example `Echo` service.
//!
//! ```text
//! echo-client [--server URI] [--message TEXT] [--count N] [--timeout-ms N]
//!             [--tls-ca PEM] [--tls-cert PEM --tls-key PEM] [--tls-server-name NAME]
//! ```
//!
//! Default server `tcp://127.0.0.1:7000` (`tls://`, `unix://`, `tls+unix://`,
//! `udp://`, `rdma://` and `rdma+unix://` work too). For TLS, `--tls-ca` adds a
//! trusted CA to the system's, `--tls-cert`/`--tls-key` present a client certificate
//! (mTLS), `--tls-server-name` checks the server's certificate for that name instead
//! of the URI's host. Prints one line per call.

use std::time::{Duration, Instant};

use rpc_core::Request;
use rpc_examples::{flag, fmt_latency};
use rpc_proto::echo::{echo_client::EchoClient, SayRequest};

#[tokio::main]
async fn main() -> std::process::ExitCode {
    rpc_examples::report(run().await)
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!(
            "echo-client [--server URI] [--message TEXT] [--count N] [--timeout-ms N] \
             [--tls-ca PEM] [--tls-cert PEM --tls-key PEM] [--tls-server-name NAME]"
        );
        return Ok(());
    }
    let mut values = vec!["--server", "--message", "--count", "--timeout-ms"];
    values.extend(rpc_examples::CLIENT_TLS_OPTIONS);
    rpc_examples::exit_on_bad_args(&args, &values, &[]);
    let server = flag(&args, "--server").unwrap_or_else(|| "tcp://127.0.0.1:7000".into());
    let message = flag(&args, "--message").unwrap_or_else(|| "hello".into());
    let count: u32 = flag(&args, "--count").map_or(Ok(1), |c| c.parse())?;
    let timeout =
        Duration::from_millis(flag(&args, "--timeout-ms").map_or(Ok(5000), |t| t.parse())?);

    let options = rpc_examples::connect_options(&args)?;
    let channel = rpc_connect::connect_with(&server, &options).await?;
    let mut client = EchoClient::new(channel);
    let mut failures = 0;
    for i in 0..count {
        let request = Request::new(SayRequest {
            message: format!("{message} #{i}"),
            payload: Default::default(),
        })
        .with_timeout(timeout);
        let start = Instant::now();
        match client.say(request).await {
            Ok(reply) => println!(
                "{server} Say -> {:?} in {}",
                reply.get_ref().message,
                fmt_latency(start.elapsed())
            ),
            Err(status) => {
                failures += 1;
                println!(
                    "{server} Say -> {status} in {}",
                    fmt_latency(start.elapsed())
                );
            }
        }
    }
    if failures > 0 {
        std::process::exit(1);
    }
    Ok(())
}

//! `rpc`: call, inspect, health-check and load-test servers of this framework (and
//! gRPC servers), over any transport. See `rpc --help` and `docs/cli.md`.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = rpc_cli::cli::Cli::parse();
    // One worker thread per CPU, unless `bench --threads` says otherwise.
    let mut builder = match &cli.command {
        rpc_cli::cli::Command::Bench(args) if args.threads == Some(1) => {
            tokio::runtime::Builder::new_current_thread()
        }
        rpc_cli::cli::Command::Bench(args) => {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            if let Some(threads) = args.threads {
                builder.worker_threads(threads as usize);
            }
            builder
        }
        _ => tokio::runtime::Builder::new_multi_thread(),
    };
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            rpc_cli::exit::write_stderr(&format!("error: cannot start the runtime: {err}\n"));
            return ExitCode::from(rpc_cli::exit::EXIT_ERROR);
        }
    };
    // `bench` handles Ctrl-C itself: it reports what it measured, then exits 130.
    let own_interrupt = matches!(cli.command, rpc_cli::cli::Command::Bench(_));
    let outcome = runtime.block_on(async {
        if own_interrupt {
            return rpc_cli::run(cli).await;
        }
        tokio::select! {
            outcome = rpc_cli::run(cli) => outcome,
            // Ctrl-C (SIGINT) exits 130, the shell's code for it, as an exit code a
            // caller reads as such (a process killed by the signal has none: Python's
            // subprocess sees -2). At once: a thread blocked reading standard input
            // (`-d @-`) is not waited for.
            Ok(()) = tokio::signal::ctrl_c() => {
                rpc_cli::exit::write_stderr("interrupted\n");
                std::process::exit(i32::from(rpc_cli::exit::EXIT_INTERRUPTED));
            }
        }
    });
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            // Every control character escaped, whatever a peer put in the message.
            rpc_cli::exit::write_stderr(&rpc_cli::exit::error_text(&failure));
            ExitCode::from(failure.exit_code)
        }
    }
}

//! The command line of a harness binary: arguments, the run loop, the exit code.
//!
//! Generic over a [`BenchSubject`] set, so that another binary (such as the
//! `rpc-bench-compare` crate beside this one) can add subjects of its own and keep the
//! same flags, workloads, output and ratio table. `rpc-bench` itself runs
//! [`main`]`::<`[`Subject`](crate::Subject)`>`.

use std::{io::Write as _, path::PathBuf, process::ExitCode, time::Duration};

use crate::{
    report::{self, BenchResult},
    subjects::BenchSubject,
    threads::{self, ServerThread},
    workloads::{self, Params, Workload},
};

/// What the command line asked for.
#[derive(Debug)]
struct Config<S> {
    subjects: Vec<S>,
    workloads: Vec<Workload>,
    repeat: usize,
    pin: Option<(usize, usize)>,
    params: Params,
    plot: Option<PathBuf>,
    /// The subjects the ratio tables divide by: one table each, in this order.
    baselines: Vec<String>,
    /// `--many-client ADDR --many-subject S` (hidden): this process is the many
    /// workload's client process, against `S`'s server at `ADDR`.
    many_client: Option<(String, S)>,
    /// `--many-server S` (hidden): this process is the many workload's server
    /// process for `S`.
    many_server: Option<S>,
}

fn parse_args<S: BenchSubject>(args: &[String]) -> Result<Config<S>, String> {
    let mut subjects = Vec::new();
    let mut workloads = Vec::new();
    let mut repeat = 1;
    let mut pin = Some((0, 1));
    let mut quick = false;
    let mut calls = None;
    let mut duration = None;
    let mut concurrency = None;
    let mut plot = None;
    let mut baselines = Vec::new();
    let mut loss = Vec::new();
    let mut lossy_payload = None;
    let mut many = crate::many::ManyParams::DEFAULT;
    let mut many_addr = None;
    let mut many_subject = None;
    let mut many_server = None;
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let mut value = || {
            args.next()
                .map(String::as_str)
                .ok_or_else(|| format!("{arg} needs a value"))
        };
        match arg.as_str() {
            "all" => {
                subjects.extend_from_slice(S::all());
                workloads.extend_from_slice(S::workloads());
            }
            "--subject" => match value()? {
                "all" => subjects.extend_from_slice(S::all()),
                name => subjects
                    .push(S::parse(name).ok_or_else(|| format!("unknown subject {name:?}"))?),
            },
            "--workload" => match value()? {
                "all" => workloads.extend_from_slice(S::workloads()),
                name => workloads.push(
                    Workload::parse(name).ok_or_else(|| format!("unknown workload {name:?}"))?,
                ),
            },
            "--repeat" => repeat = positive(value()?, arg)?,
            "--pin-cpus" => pin = parse_pin(value()?)?,
            "--quick" => quick = true,
            "--calls" => calls = Some(positive(value()?, arg)?),
            "--duration-s" => {
                let v = value()?;
                let secs: f64 = v.parse().map_err(|_| format!("bad {arg} {v:?}"))?;
                if !(secs.is_finite() && secs > 0.0) {
                    return Err(format!("{arg} must be positive"));
                }
                duration = Some(Duration::from_secs_f64(secs));
            }
            "--concurrency" => concurrency = Some(positive(value()?, arg)?),
            "--loss" => {
                let v = value()?;
                let rate: f64 = v.parse().map_err(|_| format!("bad {arg} {v:?}"))?;
                if !(0.0..1.0).contains(&rate) {
                    return Err(format!("{arg} must be at least 0 and below 1, not {v:?}"));
                }
                loss.push(rate);
            }
            "--lossy-payload" => lossy_payload = Some(positive(value()?, arg)?),
            "--connections" => {
                crate::subjects::framework::set_connections(positive(value()?, arg)?)
            }
            "--connections-many" => many.connections = positive(value()?, arg)?,
            "--in-flight" => many.in_flight = positive(value()?, arg)?,
            "--open-load" => {
                let v = value()?;
                let load: f64 = v.parse().map_err(|_| format!("bad {arg} {v:?}"))?;
                if !(load > 0.0 && load <= 1.0) {
                    return Err(format!("{arg} must be above 0 and at most 1, not {v:?}"));
                }
                many.open_load = load;
            }
            "--many-client" => many_addr = Some(value()?.to_string()),
            "--many-server" => {
                let name = value()?;
                many_server =
                    Some(S::parse(name).ok_or_else(|| format!("unknown subject {name:?}"))?);
            }
            "--many-subject" => {
                let name = value()?;
                many_subject =
                    Some(S::parse(name).ok_or_else(|| format!("unknown subject {name:?}"))?);
            }
            "--plot" => plot = Some(PathBuf::from(value()?)),
            "--baseline" => {
                let name = value()?;
                S::parse(name).ok_or_else(|| format!("unknown subject {name:?}"))?;
                baselines.push(name.to_string());
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if subjects.is_empty() {
        subjects.extend_from_slice(S::all());
    }
    if workloads.is_empty() {
        workloads.extend_from_slice(S::workloads());
    }
    if baselines.is_empty() {
        baselines.push(report::DEFAULT_BASELINE.to_string());
    }
    baselines.dedup();
    dedup(&mut subjects);
    dedup(&mut workloads);
    let mut params = if quick {
        Params::quick()
    } else {
        Params::full()
    };
    if let Some(calls) = calls {
        params.latency.calls = calls;
        params.latency.warmup = calls / 10;
        params.lossy.calls = calls;
        params.lossy.warmup = calls / 10;
    }
    if let Some(duration) = duration {
        params.duration = duration;
    }
    if !loss.is_empty() {
        params.lossy.rates = crate::lossy::LossyParams::with_reference(&loss);
    }
    if let Some(bytes) = lossy_payload {
        params.lossy.payload_bytes = bytes;
    }
    if let Some(concurrency) = concurrency {
        params.concurrency = concurrency;
        params.lossy.in_flight = concurrency;
    }
    params.many = many;
    let many_client = match (many_addr, many_subject) {
        (Some(addr), Some(subject)) => Some((addr, subject)),
        (None, None) => None,
        _ => return Err("--many-client and --many-subject go together".into()),
    };
    Ok(Config {
        subjects,
        workloads,
        repeat,
        pin,
        params,
        plot,
        baselines,
        many_client,
        many_server,
    })
}

fn positive(v: &str, flag: &str) -> Result<usize, String> {
    v.parse()
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("{flag} needs a positive integer, not {v:?}"))
}

fn parse_pin(v: &str) -> Result<Option<(usize, usize)>, String> {
    if v == "none" {
        return Ok(None);
    }
    let bad = || format!("--pin-cpus needs S,C (two CPU numbers) or none, not {v:?}");
    let (s, c) = v.split_once(',').ok_or_else(bad)?;
    Ok(Some((
        s.trim().parse().map_err(|_| bad())?,
        c.trim().parse().map_err(|_| bad())?,
    )))
}

/// Removes later duplicates, keeping the first occurrence's order.
fn dedup<T: PartialEq + Copy>(items: &mut Vec<T>) {
    let mut seen = Vec::with_capacity(items.len());
    items.retain(|item| {
        let new = !seen.contains(item);
        if new {
            seen.push(*item);
        }
        new
    });
}

/// Runs one workload against one subject on a fresh server and client thread.
fn measure<S: BenchSubject>(
    subject: S,
    workload: Workload,
    config: &Config<S>,
) -> std::io::Result<Vec<workloads::Measurement>> {
    let server = ServerThread::spawn(subject, config.pin.map(|p| p.0))?;
    let (addr, control, params) = (
        server.addr.clone(),
        server.control.clone(),
        config.params.clone(),
    );
    let result = threads::run_client(config.pin.map(|p| p.1), move || async move {
        subject.run(workload, &params, &addr, &control).await
    });
    server.stop();
    result
}

fn run<S: BenchSubject>(config: &Config<S>) -> std::io::Result<()> {
    let mut results = Vec::new();
    let mut cdfs: Vec<(String, Vec<u32>)> = Vec::new();
    let mut stdout = std::io::stdout().lock();
    for repeat in 1..=config.repeat {
        for &workload in &config.workloads {
            for &subject in &config.subjects {
                if !subject.supports(workload) {
                    eprintln!("# {subject} {workload}: skipped (not implemented for {subject})");
                    continue;
                }
                eprintln!("# repeat {repeat}/{}: {subject} {workload}", config.repeat);
                let measured = if workload == Workload::Many {
                    crate::many::measure(subject, &config.params)
                } else {
                    measure(subject, workload, config)
                };
                let measurements = measured.map_err(|e| {
                    std::io::Error::new(e.kind(), format!("{subject} {workload}: {e}"))
                })?;
                for m in measurements {
                    let result = BenchResult::new(subject, workload, &m);
                    writeln!(stdout, "{}", result.to_json())?;
                    stdout.flush()?;
                    results.push(result);
                    if workload == Workload::Latency && config.plot.is_some() {
                        match cdfs.iter_mut().find(|(name, _)| name == subject.name()) {
                            Some((_, samples)) => samples.extend(m.samples),
                            None => cdfs.push((subject.name().to_string(), m.samples)),
                        }
                    }
                }
            }
        }
    }
    // The lossy and many workloads' results have tables of their own.
    let (lossy, results): (Vec<BenchResult>, Vec<BenchResult>) =
        results.into_iter().partition(|r| r.loss.is_some());
    let (many, results): (Vec<BenchResult>, Vec<BenchResult>) =
        results.into_iter().partition(|r| r.many.is_some());
    for baseline in config.baselines.iter().filter(|_| !results.is_empty()) {
        writeln!(stdout)?;
        write!(
            stdout,
            "{}",
            report::ratio_table(&results, config.repeat, baseline)
        )?;
    }
    if !lossy.is_empty() {
        writeln!(stdout)?;
        write!(stdout, "{}", crate::lossy::table(&lossy, config.repeat))?;
    }
    for baseline in config.baselines.iter().filter(|_| !many.is_empty()) {
        writeln!(stdout)?;
        write!(
            stdout,
            "{}",
            crate::many::table(&many, config.repeat, baseline)
        )?;
    }
    stdout.flush()?;
    if let Some(path) = &config.plot {
        for (_, samples) in &mut cdfs {
            samples.sort_unstable();
        }
        std::fs::write(path, report::latency_cdf_svg(&cdfs))?;
        eprintln!("# wrote {}", path.display());
    }
    Ok(())
}

/// The whole program: parses `std::env::args()`, prints `usage` for `--help`/`-h`,
/// runs the measurements and prints their results. Errors go to stderr, prefixed
/// with `program`; bad arguments exit with 2, failed runs with 1.
pub fn main<S: BenchSubject>(program: &str, usage: &str) -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        print!("{usage}");
        return ExitCode::SUCCESS;
    }
    let config = match parse_args::<S>(&args) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("{program}: {e}\n\n{usage}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = crate::quiet_subscriber::install_from_env() {
        eprintln!("{program}: {e}");
        return ExitCode::from(2);
    }
    if let Some(subject) = config.many_server {
        return match crate::many::server_main(subject, &config.params) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("{program} (many server of {subject}): {e}");
                ExitCode::FAILURE
            }
        };
    }
    if let Some((addr, subject)) = &config.many_client {
        return match crate::many::client_main(*subject, addr, &config.params) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("{program} (many client of {subject}): {e}");
                ExitCode::FAILURE
            }
        };
    }
    match run(&config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{program}: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::subjects::Subject;

    /// `rpc-bench`'s parser.
    fn parse_args(args: &[String]) -> Result<Config<Subject>, String> {
        super::parse_args(args)
    }

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn defaults_are_everything() {
        let c = parse_args(&[]).unwrap();
        assert_eq!(c.subjects, Subject::ALL);
        assert_eq!(c.workloads, Workload::ALL);
        assert_eq!((c.repeat, c.pin), (1, Some((0, 1))));
        assert_eq!(c.params, Params::full());
        assert_eq!(c.baselines, ["raw-tcp"]);
        assert_eq!(parse_args(&args("all")).unwrap().workloads, Workload::ALL);
    }

    #[test]
    fn flags() {
        let c = parse_args(&args(
            "--quick --workload latency --subject tcp --subject raw-tcp --subject tcp \
             --pin-cpus 0,0 --repeat 3 --calls 50 --duration-s 0.5 --plot x.svg \
             --baseline tcp",
        ))
        .unwrap();
        assert_eq!(c.subjects, [Subject::Tcp, Subject::RawTcp]);
        assert_eq!(c.workloads, [Workload::Latency]);
        assert_eq!((c.repeat, c.pin), (3, Some((0, 0))));
        assert_eq!((c.params.latency.calls, c.params.latency.warmup), (50, 5));
        assert_eq!(c.params.duration, Duration::from_millis(500));
        assert_eq!(c.plot, Some(PathBuf::from("x.svg")));
        assert_eq!(c.baselines, ["tcp"]);
        let c = parse_args(&args("--baseline grpc --baseline tcp")).unwrap();
        assert_eq!(c.baselines, ["grpc", "tcp"]);
        let c = parse_args(&args("--workload connect --subject tls")).unwrap();
        assert_eq!(
            (c.subjects, c.workloads),
            (vec![Subject::Tls], vec![Workload::Connect])
        );
        assert_eq!(parse_args(&args("--pin-cpus none")).unwrap().pin, None);
        let c = parse_args(&args(
            "--workload lossy --subject udp --loss 0.2 --loss 0.01",
        ))
        .unwrap();
        assert_eq!(c.workloads, [Workload::Lossy]);
        assert_eq!(c.params.lossy.rates, [0.0, 0.2, 0.01]);
        let c = parse_args(&args(
            "--workload many --subject tcp --connections-many 64 --in-flight 3 --duration-s 2 \
             --open-load 0.25",
        ))
        .unwrap();
        assert_eq!(c.workloads, [Workload::Many]);
        assert_eq!(
            (c.params.many.connections, c.params.many.in_flight),
            (64, 3)
        );
        assert_eq!(c.params.many.payload_bytes, 32);
        assert_eq!(c.params.many.open_load, 0.25);
        assert_eq!(c.params.duration, Duration::from_secs(2));
        assert!(c.many_client.is_none() && c.many_server.is_none());
        let c = parse_args(&args("--many-server grpc")).unwrap();
        assert_eq!(c.many_server, Some(Subject::Grpc));
        let c = parse_args(&args("--many-client 127.0.0.1:9 --many-subject raw-tcp")).unwrap();
        assert_eq!(
            c.many_client,
            Some(("127.0.0.1:9".to_string(), Subject::RawTcp))
        );
        let c = parse_args(&args("--workload many")).unwrap();
        assert_eq!(c.params.many.open_load, 0.5);
        assert_eq!(
            (c.params.many.connections, c.params.many.in_flight),
            (1000, 8)
        );
        let c = parse_args(&args("--workload lossy --calls 100")).unwrap();
        assert_eq!((c.params.lossy.calls, c.params.lossy.warmup), (100, 10));
        assert_eq!(c.params.lossy.rates, [0.0, 0.05, 0.2]);
    }

    #[test]
    fn bad_flags() {
        for bad in [
            "--subject grpcio",
            "--repeat 0",
            "--pin-cpus 1",
            "--calls",
            "--nope",
            "--baseline grpcio",
            "--loss 1",
            "--loss -0.1",
            "--loss x",
            "--lossy-payload 0",
            "--connections-many 0",
            "--in-flight x",
            "--open-load 0",
            "--open-load 1.5",
            "--many-client 127.0.0.1:9",
            "--many-subject tcp",
            "--many-server nope",
            "--many-client 127.0.0.1:9 --many-subject nope",
        ] {
            assert!(parse_args(&args(bad)).is_err(), "{bad}");
        }
    }
}

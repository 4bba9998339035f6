//! `rpc bench`: a load generator for one unary method.
//!
//! The request is encoded once; every call clones the same `ClientCall` (its payload
//! and method path are reference-counted bytes, so a clone allocates nothing) and the
//! response is never decoded: only its status is counted. Each worker keeps its own
//! [`Histogram`] and status counts, merged at the end; the only shared state in the
//! loop is the counter that hands out call numbers (and, with a progress bar, two
//! counters it reads).
//!
//! - [`histogram`]: latencies in log-linear buckets.
//! - [`report`]: the summary as text, JSON and a self-contained HTML page.

pub mod histogram;
pub mod report;

use std::{
    collections::BTreeMap,
    io::IsTerminal,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use rpc_core::{client::ClientCall, Status};
use tower::{Service, ServiceExt};

pub use histogram::Histogram;
pub use report::Summary;

use crate::{
    call::{idempotency, unary_call, Input},
    cli::{BenchArgs, Format},
    exit::{code_name, Failure},
    metadata,
    schema::Schemas,
    target::{self, Target},
};

/// Calls when neither `-n` nor `-z` is given.
pub const DEFAULT_CALLS: u64 = 200;
/// Distinct error messages a worker remembers, and the report shows (the rest are
/// counted by code only).
const MAX_ERROR_MESSAGES: usize = 16;
/// Characters of a server's error message kept for the report.
const MAX_MESSAGE_CHARS: usize = 200;

/// When a phase stops.
#[derive(Clone, Copy, Debug)]
enum Limit {
    Calls(u64),
    Until(Instant),
}

/// How long past the end of a timed run (`-z`) a call may still run before it is cut
/// off and counted as `DEADLINE_EXCEEDED`.
const STRAGGLER_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// What the workers share.
struct Shared {
    /// The next call number to hand out.
    next: AtomicU64,
    /// With `--rps`: when the next call may start. Calls start at even intervals, and
    /// never to catch up on time lost (a stalled server is not sent the calls it missed
    /// all at once when it comes back).
    next_at: std::sync::Mutex<Option<Instant>>,
    /// Calls finished and failed (only counted with a progress bar).
    done: AtomicU64,
    failed: AtomicU64,
    /// Ctrl-C came: the workers stop, leaving their calls in flight.
    stop: Arc<Stop>,
}

/// The news of a Ctrl-C, for the workers of a run.
#[derive(Default)]
struct Stop {
    stopped: std::sync::atomic::AtomicBool,
    notify: tokio::sync::Notify,
}

impl Stop {
    fn stopped(&self) -> bool {
        self.stopped.load(Ordering::Relaxed)
    }

    fn stop(&self) {
        self.stopped.store(true, Ordering::Relaxed);
        self.notify.notify_waiters();
    }

    /// Until Ctrl-C (at once if it came).
    async fn wait(&self) {
        let notified = self.notify.notified();
        if self.stopped() {
            return;
        }
        notified.await;
    }
}

/// One worker's results.
#[derive(Default)]
struct WorkerResult {
    histogram: Histogram,
    codes: BTreeMap<u32, u64>,
    messages: BTreeMap<String, u64>,
}

struct Phase {
    limit: Limit,
    rps: Option<f64>,
    record: bool,
    progress: bool,
    /// `--max-message-size`: a larger response fails its call `RESOURCE_EXHAUSTED`,
    /// as `rpc call`'s does.
    max_message: Option<usize>,
}

/// With `--rps`: when a call may start, given when the next one was due (`None` for
/// the first, at `start`), and when the one after it is due. A call due in the past
/// by more than 10 ms (the workers were held up: a stalled server) starts 10 ms ago,
/// not at its slot, so the calls owed are not sent in a burst.
fn rps_slot(due: Option<Instant>, start: Instant, now: Instant, rps: f64) -> (Instant, Instant) {
    // Lateness up to this is made up (the timer's millisecond ticks make every slot a
    // little late at high rates); a longer hold-up is not.
    let slack = Duration::from_millis(10);
    let at = due.map_or(start, |due| due.max(now.checked_sub(slack).unwrap_or(now)));
    (at, at + Duration::from_secs_f64(1.0 / rps))
}

async fn worker(
    mut target: Target,
    template: ClientCall,
    shared: Arc<Shared>,
    phase: Arc<Phase>,
    start: Instant,
) -> WorkerResult {
    let mut result = WorkerResult::default();
    loop {
        // Made before the check: a Ctrl-C after it is seen below.
        let stopping = shared.stop.notify.notified();
        tokio::pin!(stopping);
        if shared.stop.stopped() {
            break;
        }
        let n = shared.next.fetch_add(1, Ordering::Relaxed);
        match phase.limit {
            Limit::Calls(total) if n >= total => break,
            Limit::Until(end) if Instant::now() >= end => break,
            _ => {}
        }
        if let Some(rps) = phase.rps {
            let at = {
                let mut next_at = shared.next_at.lock().unwrap_or_else(|e| e.into_inner());
                let (at, next) = rps_slot(*next_at, start, Instant::now(), rps);
                *next_at = Some(next);
                at
            };
            if let Limit::Until(end) = phase.limit {
                if at >= end {
                    break;
                }
            }
            // A Ctrl-C is not kept waiting for a slot (at --rps 0.001, hours).
            tokio::select! {
                () = tokio::time::sleep_until(at.into()) => {}
                () = &mut stopping => break,
            }
        }
        let began = Instant::now();
        // `None`: the timed run ended while the worker waited for a slot.
        let call = async {
            match target.ready().await {
                Ok(ready) => {
                    // A worker that waited for a free slot past the end of a timed run
                    // does not call: with many workers (-c far above what the
                    // connections carry at once) the calls queued at the end took
                    // longer than the run.
                    if matches!(phase.limit, Limit::Until(end) if Instant::now() >= end) {
                        return None;
                    }
                    let call = ready.call(template.clone());
                    Some(match phase.limit {
                        // A call still running this long after the end of a timed run
                        // (a stalled server, a hung handler) is cut off, so that the
                        // run ends and reports: calls without a deadline waited for
                        // ever, and the run with them.
                        Limit::Until(end) => {
                            let cut_off = (end + STRAGGLER_GRACE).into();
                            match tokio::time::timeout_at(cut_off, call).await {
                                Ok(outcome) => outcome,
                                Err(_) => Err(Status::deadline_exceeded(format!(
                                    "still running {STRAGGLER_GRACE:?} after the end of the \
                                     timed run"
                                ))),
                            }
                        }
                        Limit::Calls(_) => call.await,
                    })
                }
                Err(status) => Some(Err(status)),
            }
        };
        // A call in flight at Ctrl-C is dropped (cancelled), and not counted.
        let outcome = tokio::select! {
            outcome = call => outcome,
            () = stopping => None,
        };
        let Some(outcome) = outcome else {
            break;
        };
        let outcome = outcome.and_then(|reply| {
            let len = reply.payload.len();
            let over = crate::call::over_limit(phase.max_message, "the response", len);
            over.map_or(Ok(reply), Err)
        });
        let latency = began.elapsed();
        if phase.progress {
            shared.done.fetch_add(1, Ordering::Relaxed);
            if outcome.is_err() {
                shared.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
        if !phase.record {
            continue;
        }
        result.histogram.record(latency);
        let code = match &outcome {
            Ok(_) => 0,
            Err(status) => {
                // At most MAX_MESSAGE_CHARS of a server's message (it may send
                // megabytes, for every call).
                let text = crate::exit::printable(status.message());
                let cut = text
                    .char_indices()
                    .nth(MAX_MESSAGE_CHARS)
                    .map_or(text.len(), |(at, _)| at);
                let more = if cut < text.len() { "..." } else { "" };
                let message = format!("{}: {}{more}", code_name(status.code()), &text[..cut]);
                if let Some(count) = result.messages.get_mut(&message) {
                    *count += 1;
                } else if result.messages.len() < MAX_ERROR_MESSAGES {
                    result.messages.insert(message, 1);
                }
                status.code().as_u32()
            }
        };
        *result.codes.entry(code).or_default() += 1;
    }
    result
}

/// Runs the workers of one phase to its end and merges their results.
async fn run_phase(
    targets: &[Target],
    template: &ClientCall,
    concurrency: u32,
    phase: Phase,
    label: &str,
    stop: &Arc<Stop>,
) -> Result<(WorkerResult, Duration), Failure> {
    let shared = Arc::new(Shared {
        next: AtomicU64::new(0),
        next_at: std::sync::Mutex::new(None),
        done: AtomicU64::new(0),
        failed: AtomicU64::new(0),
        stop: Arc::clone(stop),
    });
    let phase = Arc::new(phase);
    let start = Instant::now();
    let bar = phase.progress.then(|| progress_bar(phase.limit, label));
    let ticker = bar.clone().map(|bar| {
        let shared = shared.clone();
        let limit = phase.limit;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            loop {
                tick.tick().await;
                let done = shared.done.load(Ordering::Relaxed);
                let failed = shared.failed.load(Ordering::Relaxed);
                let elapsed = start.elapsed();
                match limit {
                    Limit::Calls(_) => bar.set_position(done),
                    Limit::Until(_) => bar.set_position(elapsed.as_millis() as u64),
                }
                let rate = done as f64 / elapsed.as_secs_f64().max(1e-9);
                bar.set_message(format!("{done} calls, {rate:.0}/s, {failed} errors"));
            }
        })
    });
    let workers: Vec<_> = (0..concurrency as usize)
        .map(|i| {
            tokio::spawn(worker(
                targets[i % targets.len()].clone(),
                template.clone(),
                shared.clone(),
                phase.clone(),
                start,
            ))
        })
        .collect();
    let mut merged = WorkerResult::default();
    let mut broken = None;
    for worker in workers {
        // A worker that panicked is a failed run, not a worker's calls left out of
        // the report (which then said nothing had happened, and exited 0).
        let result = match worker.await {
            Ok(result) => result,
            Err(err) => {
                broken.get_or_insert(err);
                continue;
            }
        };
        merged.histogram.merge(&result.histogram);
        for (code, count) in result.codes {
            *merged.codes.entry(code).or_default() += count;
        }
        // Each worker keeps its first few messages; merged, the first few of all (a
        // server that puts a request id in every message, at -c 100000, made a report
        // of 1.6 million lines: from a review).
        for (message, count) in result.messages {
            if let Some(known) = merged.messages.get_mut(&message) {
                *known += count;
            } else if merged.messages.len() < MAX_ERROR_MESSAGES {
                merged.messages.insert(message, count);
            }
        }
    }
    let elapsed = start.elapsed();
    if let Some(ticker) = ticker {
        ticker.abort();
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    if let Some(err) = broken {
        return Err(Failure::error(format!("a bench worker failed: {err}")));
    }
    Ok((merged, elapsed))
}

fn progress_bar(limit: Limit, label: &str) -> indicatif::ProgressBar {
    let (length, template) = match limit {
        Limit::Calls(n) => (n, "{prefix} [{bar:40}] {pos}/{len} {msg}"),
        Limit::Until(end) => (
            end.saturating_duration_since(Instant::now()).as_millis() as u64,
            "{prefix} [{bar:40}] {elapsed} {msg}",
        ),
    };
    let bar = indicatif::ProgressBar::with_draw_target(
        Some(length),
        indicatif::ProgressDrawTarget::stderr_with_hz(10),
    );
    if let Ok(style) = indicatif::ProgressStyle::with_template(template) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_prefix(label.to_owned());
    bar
}

/// A bench call's deadline unless `--timeout` gives one (as ghz's default): long
/// enough not to cut a slow server's tail, and a server that never answers cannot
/// hold a `-n` run for ever.
pub const BENCH_TIMEOUT: Duration = Duration::from_secs(20);

/// Runs `rpc bench`.
pub async fn run(args: BenchArgs) -> Result<(), Failure> {
    // Ctrl-C stops the run and reports what was measured (as ghz does), then exits
    // 130; before the run (connecting, looking the method up) it exits 130 at once.
    let stop = Arc::new(Stop::default());
    let listening = {
        let stop = Arc::clone(&stop);
        // Polled once here, so that the handler is in place before anything else
        // (the spawned task may run later).
        let mut ctrl_c = Box::pin(tokio::signal::ctrl_c());
        let _ = futures::poll!(ctrl_c.as_mut());
        tokio::spawn(async move {
            if ctrl_c.await.is_ok() {
                stop.stop();
            }
        })
    };
    let prepared = tokio::select! {
        prepared = prepare(&args) => prepared?,
        () = stop.wait() => return Err(interrupted()),
    };
    let result = measure(&args, prepared, &stop).await;
    listening.abort();
    result
}

/// What a run needs, made before it: the connections, the call, the workers.
struct Prepared {
    targets: Vec<Target>,
    template: ClientCall,
    concurrency: u32,
    connections: u32,
    path: String,
    html: Option<(std::path::PathBuf, std::fs::File)>,
}

/// Connects, looks the method up, encodes the request and opens `--html`'s file.
async fn prepare(args: &BenchArgs) -> Result<Prepared, Failure> {
    let request_metadata = metadata::parse_headers(&args.conn.headers, &args.conn.uri)?;
    // Opened before connecting, as `rpc call` opens it: a file to fix is exit 1.
    let input = Input::open(args.data.as_deref())?;
    let (first, mut schemas, mut method) =
        Schemas::connect_to_method(&args.conn, &args.schema, &args.method, &request_metadata)
            .await?;
    if method.is_client_streaming() || method.is_server_streaming() {
        return Err(Failure::error(format!(
            "{} is a streaming method; bench loads unary methods",
            method.full_name()
        )));
    }
    // As `rpc call` reads it: the types its `Any` values name looked up first.
    let payload = input
        .single(&mut schemas, &args.method, &mut method)
        .await?;
    crate::call::within_limit(args.conn.max_message_size, "the request", payload.len())?;
    schemas.release();
    let path = format!("{}/{}", method.parent_service().full_name(), method.name());
    let template = unary_call(
        &path,
        idempotency(&method),
        request_metadata,
        args.conn.deadline(Some(BENCH_TIMEOUT)),
        payload,
    );
    // More workers than calls, or connections than workers, would only idle (and a
    // huge -c with a small -n would allocate for nothing).
    let concurrency = match (args.duration, args.calls) {
        (None, calls) => {
            let calls = calls.unwrap_or(DEFAULT_CALLS).max(args.warmup).max(1);
            args.concurrency
                .min(u32::try_from(calls).unwrap_or(u32::MAX))
        }
        (Some(_), _) => args.concurrency,
    };
    let connections = args.connections.min(concurrency);
    // The report's file is made before the run, so that a path that cannot be written
    // does not cost the run.
    let html = match &args.html {
        Some(path) => Some((
            path.clone(),
            // Opened without truncating: a run cut short leaves an earlier report.
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .open(path)
                .map_err(|err| Failure::error(format!("--html {}: {err}", path.display())))?,
        )),
        None => None,
    };
    let mut targets = vec![first];
    for _ in 1..connections {
        targets.push(target::connect(&args.conn).await?);
    }
    Ok(Prepared {
        targets,
        template,
        concurrency,
        connections,
        path,
        html,
    })
}

/// Runs the warm-up and the measured phase, and reports.
async fn measure(args: &BenchArgs, prepared: Prepared, stop: &Arc<Stop>) -> Result<(), Failure> {
    let progress = !args.no_progress && std::io::stderr().is_terminal();
    if args.warmup > 0 {
        let phase = Phase {
            limit: Limit::Calls(args.warmup),
            rps: args.rps,
            record: false,
            progress,
            max_message: args.conn.max_message_size,
        };
        run_phase(
            &prepared.targets,
            &prepared.template,
            prepared.concurrency,
            phase,
            "warm-up",
            stop,
        )
        .await?;
        // Interrupted here, the measured phase ends at once and its report (of no
        // calls, `interrupted` in it) is printed as after any Ctrl-C (from a review:
        // a script expecting JSON got nothing).
    }
    let limit = match args.duration {
        Some(duration) => Limit::Until(Instant::now() + duration),
        None => Limit::Calls(args.calls.unwrap_or(DEFAULT_CALLS)),
    };
    let phase = Phase {
        limit,
        rps: args.rps,
        record: true,
        progress,
        max_message: args.conn.max_message_size,
    };
    let (result, elapsed) = run_phase(
        &prepared.targets,
        &prepared.template,
        prepared.concurrency,
        phase,
        "bench",
        stop,
    )
    .await?;
    let interrupted = stop.stopped();

    let summary = Summary {
        uri: args.conn.uri.clone(),
        method: prepared.path,
        concurrency: prepared.concurrency,
        connections: prepared.connections,
        rps_limit: args.rps,
        duration: elapsed,
        histogram: result.histogram,
        codes: result.codes,
        messages: result.messages,
        interrupted,
    };
    // The report file first: a closed stdout ends the command (quietly) without it.
    if let Some((path, mut file)) = prepared.html {
        use std::io::Write as _;
        let page = summary.html();
        file.set_len(0)
            .and_then(|()| file.write_all(page.as_bytes()))
            .map_err(|err| Failure::error(format!("--html {}: {err}", path.display())))?;
    }
    match args.format {
        Format::Text => crate::exit::write_stdout(summary.text().as_bytes())?,
        Format::Json => crate::exit::write_stdout(format!("{}\n", summary.json()).as_bytes())?,
        Format::Html => crate::exit::write_stdout(summary.html().as_bytes())?,
    }
    if interrupted {
        return Err(interrupted_after_report());
    }
    Ok(())
}

/// Ctrl-C before anything was measured.
fn interrupted() -> Failure {
    Failure::with_code(crate::exit::EXIT_INTERRUPTED, "interrupted")
}

/// Ctrl-C, after the report of what was measured.
fn interrupted_after_report() -> Failure {
    Failure::with_code(
        crate::exit::EXIT_INTERRUPTED,
        "interrupted: the report covers the calls finished before Ctrl-C",
    )
}

#[cfg(test)]
mod rps_tests {
    use super::*;

    /// Calls are spaced 1/rps apart, and after a stall they resume at that pace from
    /// now: the calls owed are not made up in a burst. (A discovery round saw 6,500
    /// calls in 0.8 s at --rps 1000 after a 6 s stall.)
    #[test]
    fn a_stall_is_not_made_up_with_a_burst() {
        let start = Instant::now();
        let ms = Duration::from_millis;
        let (at, next) = rps_slot(None, start, start, 1000.0);
        assert_eq!((at, next), (start, start + ms(1)));
        let (at, next) = rps_slot(Some(next), start, start, 1000.0);
        assert_eq!((at, next), (start + ms(1), start + ms(2)));
        // A slot a few milliseconds late (the timer's ticks) is kept: the rate holds.
        let (at, _) = rps_slot(Some(next), start, start + ms(5), 1000.0);
        assert_eq!(at, start + ms(2));
        // Six seconds later: the calls owed are not made up, only the last 10 ms.
        let later = start + ms(6000);
        let (at, next) = rps_slot(Some(next), start, later, 1000.0);
        assert_eq!((at, next), (later - ms(10), later - ms(9)));
    }
}

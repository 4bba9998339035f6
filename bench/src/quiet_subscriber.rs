//! `RPC_BENCH_SUBSCRIBER`: a `tracing` subscriber installed as the process's global
//! default. `drop` enables every span and event and keeps none of them: the trace
//! layers do all their work (spans enabled, fields recorded, clocks read, spans
//! entered on every poll) and nothing is formatted or written, the cost of the layers
//! themselves under a subscriber without the subscriber's own. `off` filters
//! everything out, as a subscriber configured to drop every span does: spans are
//! disabled where they are made.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

use tracing::{
    span::{Attributes, Id, Record},
    subscriber::Subscriber,
    Event, Metadata,
};

/// Enables everything, drops everything.
///
/// Span ids come from a counter of the thread that makes the span, with the thread's
/// number in the high bits: one counter shared by the client's and the server's threads
/// would move its cache line between the two CPUs on every span (a tenth of a call's
/// time at 0,1 in `perf`), a cost of this subscriber, not of the layers it measures.
/// `tracing-subscriber`'s registry keeps its spans per thread for the same reason.
struct DropEverything;

/// The next thread's number, for the high bits of its span ids.
static THREADS: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// This thread's next span id (0 until its first span).
    static NEXT_ID: Cell<u64> = const { Cell::new(0) };
}

impl Subscriber for DropEverything {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        let id = NEXT_ID.with(|next| {
            let mut id = next.get();
            if id == 0 {
                id = THREADS.fetch_add(1, Ordering::Relaxed) << 40;
            }
            next.set(id + 1);
            id + 1
        });
        Id::from_u64(id)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, _: &Event<'_>) {}

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

/// Enables nothing: a subscriber whose filter drops every span and event (as a
/// `fmt` subscriber at a level that excludes them would), so spans are disabled
/// where they are made.
struct FilterEverything;

impl Subscriber for FilterEverything {
    fn register_callsite(&self, _: &'static Metadata<'static>) -> tracing::subscriber::Interest {
        tracing::subscriber::Interest::never()
    }

    fn enabled(&self, _: &Metadata<'_>) -> bool {
        false
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, _: &Event<'_>) {}

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

/// Installs the subscriber `RPC_BENCH_SUBSCRIBER` names, if any: `drop` (enables
/// everything, keeps nothing) or `off` (filters everything out).
pub(crate) fn install_from_env() -> Result<(), String> {
    let result = match std::env::var("RPC_BENCH_SUBSCRIBER").as_deref() {
        Err(_) | Ok("") | Ok("none") => return Ok(()),
        Ok("drop") => tracing::subscriber::set_global_default(DropEverything),
        Ok("off") => tracing::subscriber::set_global_default(FilterEverything),
        Ok(other) => {
            return Err(format!(
                "RPC_BENCH_SUBSCRIBER={other}: expected drop, off or none"
            ))
        }
    };
    result.map_err(|e| e.to_string())
}

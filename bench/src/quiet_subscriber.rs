//! `RPC_BENCH_SUBSCRIBER=drop`: a `tracing` subscriber that enables every span and
//! event and keeps none of them, installed as the process's global default. With it
//! the trace layers do all their work (spans enabled, fields recorded, clocks read,
//! spans entered on every poll) and nothing is formatted or written: the cost of the
//! layers themselves under a subscriber, without the subscriber's own.

use std::sync::atomic::{AtomicU64, Ordering};

use tracing::{
    span::{Attributes, Id, Record},
    subscriber::Subscriber,
    Event, Metadata,
};

/// Enables everything, drops everything.
struct DropEverything {
    next: AtomicU64,
}

impl Subscriber for DropEverything {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(self.next.fetch_add(1, Ordering::Relaxed))
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, _: &Event<'_>) {}

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

/// Installs the subscriber `RPC_BENCH_SUBSCRIBER` names, if any (`drop`).
pub(crate) fn install_from_env() -> Result<(), String> {
    match std::env::var("RPC_BENCH_SUBSCRIBER").as_deref() {
        Err(_) | Ok("") | Ok("none") => Ok(()),
        Ok("drop") => tracing::subscriber::set_global_default(DropEverything {
            next: AtomicU64::new(1),
        })
        .map_err(|e| e.to_string()),
        Ok(other) => Err(format!(
            "RPC_BENCH_SUBSCRIBER={other}: expected drop or none"
        )),
    }
}

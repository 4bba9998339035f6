//! The baseline files of the counted regression guards (`work_per_call.rs`,
//! `instructions_per_call.rs`): `key = value` lines, each figure under its build
//! profile's prefix.

#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeMap;

/// The profile the figures belong to (debug and release builds do different work).
pub fn profile() -> &'static str {
    if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    }
}

/// `key = value` lines; `#` starts a comment.
pub fn parse(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .map(|line| line.split('#').next().unwrap_or("").trim())
        .filter(|line| !line.is_empty())
        .filter_map(|line| {
            let (key, value) = line.split_once('=')?;
            Some((key.trim().to_owned(), value.trim().parse().ok()?))
        })
        .collect()
}

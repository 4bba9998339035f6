//! The baseline files of the counted regression guards (`work_per_call.rs`,
//! `instructions_per_call.rs`): `key = value` lines under a comment header, each
//! figure under its build profile's prefix (debug and release builds do different
//! work), rewritten when `RPC_UPDATE_BASELINE=1`.

#![allow(dead_code, unreachable_pub)]

use std::{collections::BTreeMap, fmt::Write as _};

/// The profile the figures belong to.
pub fn profile() -> &'static str {
    if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    }
}

/// The figures of the baseline at `path` (none if it does not exist yet).
pub fn read(path: &str) -> BTreeMap<String, f64> {
    parse(&std::fs::read_to_string(path).unwrap_or_default())
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

/// Whether this run rewrites the baseline (`RPC_UPDATE_BASELINE=1`).
pub fn updating() -> bool {
    std::env::var_os("RPC_UPDATE_BASELINE").is_some_and(|v| v == "1")
}

/// Rewrites the baseline at `path`: this profile's figures become `measured`, the other
/// profile's stay; `header` (comment lines) first, each value with `decimals` decimals.
pub fn write(path: &str, header: &str, measured: &BTreeMap<String, f64>, decimals: usize) {
    let mut figures = read(path);
    figures.retain(|key, _| !key.starts_with(&format!("{}.", profile())));
    figures.extend(measured.iter().map(|(k, v)| (k.clone(), *v)));
    let mut out = String::from(header);
    for (key, value) in &figures {
        writeln!(out, "{key} = {value:.decimals$}").unwrap();
    }
    std::fs::write(path, out).expect("write the baseline");
    println!("baseline rewritten: {path}");
}

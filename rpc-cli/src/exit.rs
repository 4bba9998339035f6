//! Exit codes, and [`Failure`]: what went wrong and the code the process exits with.
//!
//! | code | meaning |
//! | --- | --- |
//! | 0 | success (`health`: the service is `SERVING`) |
//! | 1 | the command could not run: bad JSON, unknown method or symbol, no schema, unreadable file |
//! | 2 | bad command line (from clap) |
//! | 4 | `health`: the server answered, and the service is not `SERVING` |
//! | 64 + status code | the call failed with that status (65 `CANCELLED` … 80 `UNAUTHENTICATED`); a server that cannot be reached is 78 (`UNAVAILABLE`) |
//! | 130 | interrupted (Ctrl-C, SIGINT) |
//!
//! A closed standard output (`rpc list … | head -1`) ends the command quietly, with 0.

use std::{fmt, io::Write as _};

use rpc_core::{Code, Status};

/// The command could not run (input, schema or lookup error).
pub const EXIT_ERROR: u8 = 1;
/// `health`: the service is known but not `SERVING`.
pub const EXIT_NOT_SERVING: u8 = 4;
/// Interrupted by Ctrl-C (SIGINT), as a shell reports a program the signal ended.
pub const EXIT_INTERRUPTED: u8 = 130;
/// Added to a failed call's status code.
pub const EXIT_STATUS_BASE: u8 = 64;

/// How much of a status message is printed: a server may send megabytes of it.
const MAX_SHOWN_MESSAGE: usize = 16 * 1024;

/// The first [`MAX_SHOWN_MESSAGE`] bytes of `text`, cut at a character boundary.
fn shown(text: &str) -> &str {
    if text.len() <= MAX_SHOWN_MESSAGE {
        return text;
    }
    let mut end = MAX_SHOWN_MESSAGE;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The exit code of a call that failed with `code`: 64 + the code; a code gRPC does
/// not define (past 16) exits as `UNKNOWN` (66), since 64 + 66 would read as a shell's
/// 130 for Ctrl-C (the message still gives the number).
pub fn status_exit_code(code: Code) -> u8 {
    let code = match code.as_u32() {
        code @ 0..=16 => code,
        _ => Code::UNKNOWN.as_u32(),
    };
    EXIT_STATUS_BASE + code as u8
}

/// An error that ends the command: the message printed on stderr, and the exit code.
/// It is printed by [`error_text`], which escapes what a peer may have put in it.
#[derive(Debug)]
pub struct Failure {
    /// The process's exit code.
    pub exit_code: u8,
    /// What to print (without the `error: ` prefix), on one line.
    pub message: String,
    /// A failed call's details as JSON, printed on a line of their own
    /// (`details: ...`).
    pub details: Option<String>,
}

impl Failure {
    /// The command could not run (exit code 1).
    pub fn error(message: impl Into<String>) -> Failure {
        Failure {
            exit_code: EXIT_ERROR,
            message: message.into(),
            details: None,
        }
    }

    /// A failed call (exit code 64 + its code), printed as code name, message and
    /// decoded details.
    pub fn status(status: &Status, details: Option<String>) -> Failure {
        let mut message = format!("{} ({})", code_name(status.code()), status.code().as_u32());
        if !status.message().is_empty() {
            message.push_str(": ");
            message.push_str(&printable(shown(status.message())));
            if status.message().len() > MAX_SHOWN_MESSAGE {
                message.push_str(&format!(
                    "... (cut: {} bytes in all)",
                    status.message().len()
                ));
            }
            // The library's words name its own setting; this side's is the CLI's
            // option.
            let text = status.message();
            // (A message's or frame's size; metadata has a limit of its own.)
            let message_size = text.contains("max_frame_len")
                || (text.starts_with("a message of") && text.contains("exceeds the limit of"));
            if message_size {
                message.push_str(
                    " (this side's limit: --max-message-size; a limit of the server's is its \
                     own setting)",
                );
            } else if text.contains("max_metadata_len") {
                // (No option raises it: from a review, the library's advice was all.)
                message.push_str(
                    " (this side's limit is the framework's default, 16 KiB, which rpc has \
                     no option for)",
                );
            }
        }
        // Whether the call may have run: a script retrying on 78 must know (from a
        // review: a connection lost mid-call said nothing of the kind, and the call
        // had run).
        if status.code() == Code::UNAVAILABLE {
            message.push_str(if status.is_unprocessed() {
                " [not run: safe to try again]"
            } else {
                " [the call may have run]"
            });
        }
        Failure {
            exit_code: status_exit_code(status.code()),
            message,
            // JSON, kept valid: what a peer put in it is escaped the JSON way.
            details: details.map(|details| printable_json(&details).into_owned()),
        }
    }

    /// Nothing more to do and nothing to say: standard output was closed by its
    /// reader. Exit code 0, no message.
    pub fn quiet() -> Failure {
        Failure {
            exit_code: 0,
            message: String::new(),
            details: None,
        }
    }

    /// A failure with an explicit exit code and message.
    pub fn with_code(exit_code: u8, message: impl Into<String>) -> Failure {
        Failure {
            exit_code,
            message: message.into(),
            details: None,
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)?;
        if let Some(details) = &self.details {
            write!(f, "\ndetails: {details}")?;
        }
        Ok(())
    }
}

/// What the process prints on standard error for `failure` (nothing for a
/// [quiet](Failure::quiet) one): `error: ` and its message, then its details. The one
/// place errors are written for the user, so every control character in them is
/// written as an escape (`\n`, `\u{1b}`), whichever way a peer's text (a status
/// message, a reflection error, a type or file name, a GOAWAY reason) came into the
/// message: it cannot send the terminal escape sequences, nor start a line of its own.
/// The details stay JSON, escaped the JSON way ([`printable_json`]).
pub fn error_text(failure: &Failure) -> String {
    if failure.message.is_empty() && failure.details.is_none() {
        return String::new();
    }
    let mut text = format!("error: {}\n", printable(&failure.message));
    if let Some(details) = &failure.details {
        text.push_str("details: ");
        text.push_str(&printable_json(details));
        text.push('\n');
    }
    text
}

impl std::error::Error for Failure {}

/// Writes `bytes` to standard output and flushes it. A reader that went away ends
/// the command [quietly](Failure::quiet); another error is a failure (exit code 1).
pub fn write_stdout(bytes: &[u8]) -> Result<(), Failure> {
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(bytes).and_then(|()| stdout.flush()) {
        Ok(()) => Ok(()),
        Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => Err(Failure::quiet()),
        Err(err) => Err(Failure::error(format!("stdout: {err}"))),
    }
}

/// Writes `text` to standard error, ignoring a failure: `eprint!` panics when stderr is
/// closed (`rpc ... 2>&1 | grep -q X` whose reader has gone), which turned a command's
/// own exit code into 101.
pub fn write_stderr(text: &str) {
    let mut stderr = std::io::stderr().lock();
    let _ = stderr.write_all(text.as_bytes());
    let _ = stderr.flush();
}

/// A code's name (`NOT_FOUND`), or `CODE_<n>` for one no status defines.
pub fn code_name(code: Code) -> String {
    code.name()
        .map(str::to_owned)
        .unwrap_or_else(|| format!("CODE_{}", code.as_u32()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unavailable_says_whether_the_call_may_have_run() {
        let lost = Failure::status(&Status::unavailable("connection lost"), None);
        assert!(
            lost.message.ends_with("[the call may have run]"),
            "{}",
            lost.message
        );
        assert_eq!(lost.exit_code, 78);
        // (A call that never ran: `tests/cli.rs`, against a closed port.)
        let other = Failure::status(&Status::not_found("no such key"), None);
        assert!(!other.message.contains('['), "{}", other.message);
    }

    #[test]
    fn a_size_limit_names_the_option_that_raises_it() {
        for text in [
            "request of 20971575 bytes exceeds the maximum frame length of 16777216 bytes \
             (raise max_frame_len on both sides)",
            "a message of 2000008 bytes exceeds the limit of 1065972 bytes",
        ] {
            let failure = Failure::status(&Status::resource_exhausted(text), None);
            assert!(failure.message.contains("--max-message-size"), "{text}");
        }
        for text in [
            "no such key",
            "request metadata of 20000 bytes exceeds the limit of 16384 bytes",
        ] {
            let failure = Failure::status(&Status::resource_exhausted(text), None);
            assert!(!failure.message.contains("--max-message-size"), "{text}");
        }
        let metadata = "request metadata of 20006 bytes in 1 entries exceeds the limit of \
                        16384 bytes and 512 entries (raise max_metadata_len on both sides)";
        let failure = Failure::status(&Status::resource_exhausted(metadata), None);
        assert!(
            failure.message.contains("no option for"),
            "{}",
            failure.message
        );
    }

    /// A server's status message of megabytes is printed cut (it printed whole: 24 MB
    /// of escapes on standard error for a 9 MiB message, from a review).
    #[test]
    fn a_huge_status_message_is_cut() {
        let text = "é".repeat(MAX_SHOWN_MESSAGE); // two bytes each
        let failure = Failure::status(&Status::internal(text.clone()), None);
        assert!(
            failure.message.len() < MAX_SHOWN_MESSAGE + 100,
            "{}",
            failure.message.len()
        );
        assert!(failure
            .message
            .ends_with(&format!("(cut: {} bytes in all)", text.len())));
        let short = Failure::status(&Status::internal("short"), None);
        assert_eq!(short.message, "INTERNAL (13): short");
    }

    #[test]
    fn status_codes_map_to_64_plus_code() {
        assert_eq!(status_exit_code(Code::OK), 64);
        assert_eq!(status_exit_code(Code::NOT_FOUND), 69);
        assert_eq!(status_exit_code(Code::UNAVAILABLE), 78);
        assert_eq!(status_exit_code(Code::UNAUTHENTICATED), 80);
        assert_eq!(
            status_exit_code(Code::from_u32(66)),
            66,
            "not 130, a shell's Ctrl-C"
        );
        assert_eq!(status_exit_code(Code::from_u32(1000)), 66);
    }

    /// Whatever a message holds, it prints as one line without terminal controls (C0
    /// and C1 controls, DEL): text a server put in it unescaped (a type name from an
    /// `Any`, say) cannot clear the screen, retitle the window or fake a line of the
    /// CLI's own. A status's details follow on their own line, as JSON.
    #[test]
    fn errors_print_without_a_peers_controls() {
        let failure = Failure::error("no type 'a\u{1b}]0;owned\u{7}\nerror: OK\u{9b}2J\u{7f}'");
        assert_eq!(
            error_text(&failure),
            "error: no type 'a\\u{1b}]0;owned\\u{7}\\nerror: OK\\u{9b}2J\\u{7f}'\n"
        );
        let status = Status::new(Code::NOT_FOUND, "gone\u{1b}[2J\nerror: fake");
        let details = serde_json::json!({"m": "a\u{9b}b\u{1b}"}).to_string();
        let text = error_text(&Failure::status(&status, Some(details)));
        assert_eq!(
            text,
            "error: NOT_FOUND (5): gone\\u{1b}[2J\\nerror: fake\n\
             details: {\"m\":\"a\\u009bb\\u001b\"}\n"
        );
        assert!(!text.chars().any(|c| c.is_control() && c != '\n'), "{text}");
        assert_eq!(error_text(&Failure::quiet()), "");
    }

    #[test]
    fn unknown_codes_have_a_name() {
        assert_eq!(code_name(Code::NOT_FOUND), "NOT_FOUND");
        assert_eq!(code_name(Code::from_u32(99)), "CODE_99");
    }
}

/// `text` from a peer, safe to print on a terminal: control characters (escape
/// sequences, carriage returns, newlines that would start a line of the CLI's own) and
/// the Unicode controls that reorder text are written as escapes (`\n`, `\u{1b}`), so a
/// server cannot make the output say what it did not. Borrowed when there is none.
pub fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    escape_controls(text, false)
}

/// [`printable`] for multi-line text (a `.proto` file's text): newlines are kept.
pub fn printable_lines(text: &str) -> std::borrow::Cow<'_, str> {
    escape_controls(text, true)
}

/// Whether `c` is one [`printable`] escapes: a control character, or a Unicode
/// control that reorders text.
fn is_unsafe(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{61c}' | '\u{200e}' | '\u{200f}' | '\u{2028}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
        )
}

/// JSON text (as `serde_json` writes it) with every character [`printable`] would
/// escape written as a JSON escape (`\u202e`) instead, so that it stays valid JSON
/// and prints as it is. (`serde_json` escapes the C0 controls only; the others can
/// only be inside strings, where an escape means the same.)
pub fn printable_json(json: &str) -> std::borrow::Cow<'_, str> {
    // A raw newline in `serde_json`'s text is pretty printing's (it escapes every C0
    // control in strings): kept, or the JSON would not parse.
    let unsafe_char = |c: char| is_unsafe(c) && c != '\n';
    if !json.chars().any(unsafe_char) {
        return std::borrow::Cow::Borrowed(json);
    }
    let mut out = String::with_capacity(json.len() + 8);
    for c in json.chars() {
        if unsafe_char(c) {
            use std::fmt::Write;
            let _ = write!(out, "\\u{:04x}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

fn escape_controls(text: &str, keep_newlines: bool) -> std::borrow::Cow<'_, str> {
    let unsafe_char = |c: char| is_unsafe(c) && !(keep_newlines && c == '\n');
    if !text.chars().any(unsafe_char) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            c if !unsafe_char(c) => out.push(c),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c => {
                use std::fmt::Write;
                let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
            }
        }
    }
    std::borrow::Cow::Owned(out)
}

#[cfg(test)]
mod printable_tests {
    use super::*;

    #[test]
    fn json_from_a_peer_stays_json() {
        let json = serde_json::json!({"message": "a\u{1b}[2J\u{85}\u{7f}\u{202e}b"}).to_string();
        let shown = printable_json(&json);
        assert!(!shown.chars().any(is_unsafe), "{shown}");
        // `printable_json` again, which `error_text` runs over every failure's details,
        // leaves it be.
        assert_eq!(printable_json(&shown), shown);
        let back: serde_json::Value = serde_json::from_str(&shown).unwrap();
        assert_eq!(back["message"], "a\u{1b}[2J\u{85}\u{7f}\u{202e}b");
        assert_eq!(printable_json("{\"a\": 1}"), "{\"a\": 1}");
    }

    #[test]
    fn controls_from_a_peer_are_escaped() {
        assert_eq!(printable("plain text, ünïcode"), "plain text, ünïcode");
        assert_eq!(
            printable("\u{1b}[2Jok\r\nerror: OK (0): fake\t\u{7f}\u{202e}"),
            "\\u{1b}[2Jok\\r\\nerror: OK (0): fake\\t\\u{7f}\\u{202e}"
        );
        assert_eq!(
            printable_lines("a\nb\u{1b}]0;title\u{7}"),
            "a\nb\\u{1b}]0;title\\u{7}"
        );
    }
}

//! [`Error`]: why generation failed.

use std::{error::Error as StdError, fmt, io};

/// Why code generation failed. Its `Display` is the message a build script prints:
/// for a bad `.proto` it starts with `file.proto:LINE:COL:`. Its `Debug` is the same
/// message (what `fn main() -> Result<..>` and `unwrap` print), not the struct.
pub struct Error {
    kind: ErrorKind,
    message: String,
    source: Option<Box<dyn StdError + Send + Sync + 'static>>,
}

/// What kind of failure an [`Error`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A `.proto` file could not be found, read, parsed or checked (unknown type, bad
    /// import, ...). The message names the file and, where known, the line and column.
    Proto,
    /// The descriptors were valid but the Rust code could not be generated (for
    /// example a bad `extern_path`), or a generated name would clash.
    Generate,
    /// Writing the generated files failed (only from [`Builder::compile`](crate::Builder::compile)).
    Io,
}

impl Error {
    pub(crate) fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error {
            kind,
            message: message.into(),
            source: None,
        }
    }

    pub(crate) fn with_source(
        kind: ErrorKind,
        message: impl Into<String>,
        source: impl StdError + Send + Sync + 'static,
    ) -> Error {
        Error {
            kind,
            message: message.into(),
            source: Some(Box::new(source)),
        }
    }

    /// This error with the message's leading `file: ` (a protox error without a
    /// position) made `at_file:LINE:COL: `.
    pub(crate) fn at(mut self, file: &str, at_file: &str, line: usize, column: usize) -> Error {
        if let Some(rest) = self
            .message
            .strip_prefix(file)
            .and_then(|rest| rest.strip_prefix(": "))
        {
            self.message = format!("{at_file}:{line}:{column}: {rest}");
        }
        self
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl StdError for Error {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|source| source as &(dyn StdError + 'static))
    }
}

impl From<protox::Error> for Error {
    fn from(err: protox::Error) -> Error {
        // protox's `Debug` (unlike its `Display`) is the compiler-style one line
        // `file.proto:LINE:COL: message` for parse and check errors, and the plain
        // message where no position is known.
        let mut message = format!("{err:?}");
        if let Some(file) = err.file() {
            if !message.starts_with(file) {
                message = format!("{file}: {message}");
            }
        }
        // The compiler's hint, which neither `Debug` nor `Display` carries ("'b.Thing'
        // is defined in 'b.proto', which is not imported by 'a.proto'", "set the
        // `allow_alias` option"): protoc prints its own.
        if let Some(help) = miette::Diagnostic::help(&err) {
            message = format!("{message} ({help})");
        }
        // protox parses `syntax = "proto2"` and `"proto3"` only.
        if message.contains("found 'edition'") {
            message.push_str(
                " (protobuf editions 2023 and 2024 are read, as the proto3 or proto2 file \
                 that means the same, when `edition` is the file's first statement)",
            );
        }
        // protox-parse names a bad import path "invalid group name" (its help says
        // what is wrong; from a review).
        if message.contains("invalid group name (imports may not") {
            message = message.replace("invalid group name (", "invalid import path (");
        }
        // prost-reflect, under protox, refuses clashing JSON names in every syntax
        // (protoc refuses them in proto3 only, and warns otherwise), naming the
        // raw field's empty `json_name` (from a review: "JSON name ''").
        if message.contains("a field with JSON name") {
            message = message.replace(
                "a field with JSON name '' is already defined",
                "this field's JSON name is another field's too",
            );
            message.push_str(
                " (two fields of the message have the same JSON name: default names, as \
                 `x1` and `x_1` both are `x1`, or json_name options, or one of each; the \
                 .proto compiler this generator uses refuses that in every file, where \
                 protoc only warns of clashing default names in proto2 and \
                 LEGACY_BEST_EFFORT files: rename a field, or give it a json_name of its \
                 own)",
            );
        }
        Error::with_source(ErrorKind::Proto, message, err)
    }
}

impl From<Error> for io::Error {
    fn from(err: Error) -> io::Error {
        let kind = match err.kind {
            ErrorKind::Proto => io::ErrorKind::InvalidInput,
            ErrorKind::Generate | ErrorKind::Io => io::ErrorKind::Other,
        };
        io::Error::new(kind, err)
    }
}

//! Protobuf editions (`edition = "2023";`, `"2024"`), read as the proto3 (or proto2)
//! file that means the same to prost: protox parses `syntax = "proto2"` and
//! `"proto3"` only.
//!
//! Edition 2023's defaults are proto3's with explicit presence: open enums, packed
//! repeated scalars, UTF-8 checked strings. So an editions file becomes a proto3 file
//! whose singular fields (outside oneofs) are `optional`, unless their presence is
//! implicit (`features.field_presence = IMPLICIT`, for the file or the field). A file
//! proto3 cannot express becomes a proto2 file instead (`optional` and `required`
//! labels, `packed = true` on repeated fields; implicit presence is then explicit):
//! one with a field default (`[default = ...]`), a `LEGACY_REQUIRED` field, an enum
//! whose first value is not 0 (a closed one), or `json_format = LEGACY_BEST_EFFORT`.
//! `repeated_field_encoding = EXPANDED`, for the file or a field, is `packed = false`.
//! The other features are dropped, as prost's code does not depend on them
//! (`enum_type`, `utf8_validation`, `json_format`, language features such as
//! `features.(pb.cpp)` and their `google/protobuf/*_features.proto` imports);
//! `message_encoding = DELIMITED` (groups) and a file-wide `LEGACY_REQUIRED` are
//! refused. Features are read in both forms (`features.x = V`, `features = { x: V
//! }`). Edition 2024's `export` and `local` go, and its `import option` is a plain
//! import.
//!
//! The text is edited in place, line for line: an error in the file keeps its line
//! (its column may move on a line that gained `optional `).

/// The `.proto` text `source` holds, as proto3 or proto2, when it is an editions file;
/// `Ok(None)` for any other file. The error says what cannot be expressed, and where:
/// the byte offset of the statement (or token) that says it.
pub(crate) fn rewrite(source: &str) -> Result<Option<String>, (String, usize)> {
    let tokens = tokenize(source);
    let Some(at) = tokens
        .iter()
        .position(|t| t.text(source) == "edition")
        .filter(|&i| i == 0)
    else {
        return Ok(None);
    };
    let edition = tokens
        .get(at + 2)
        .map(|t| t.text(source).trim_matches(['"', '\'']))
        .unwrap_or_default();
    if !matches!(edition, "2023" | "2024") {
        return Err((
            format!(
                "edition {edition:?}: editions 2023 and 2024 are read (as proto3 or proto2), \
                 no other"
            ),
            tokens.get(at + 2).map_or(0, |t| t.start),
        ));
    }
    let mut parser = Parser {
        source,
        tokens: &tokens,
        at: 0,
        edits: Vec::new(),
        file_implicit: false,
        file_expanded: false,
        proto2: false,
    };
    // Two passes: the first finds the file's features and whether proto3 can say it
    // all; the second edits.
    // Every refusal is raised with `at` on the statement it is about (from a review:
    // the errors had no line and column, where protox's have).
    let located = |parser: &Parser<'_>, why: String| {
        let at = tokens.get(parser.at).map_or(source.len(), |t| t.start);
        (why, at)
    };
    if let Err(why) = parser.file_features() {
        return Err(located(&parser, why));
    }
    parser.proto2 = needs_proto2(source, &tokens);
    parser.at = 0;
    parser.edits.clear();
    if let Err(why) = parser.file() {
        return Err(located(&parser, why));
    }
    Ok(Some(apply(source, parser.edits)))
}

/// Whether a number's text is zero, in any of the forms protobuf reads (`0`, `00`,
/// `0x0`, `0X00`, `-0`, ...; from a review: `0x00` was taken for a first value that
/// is not zero, which made the file proto2 in silence).
fn is_zero(number: &str) -> bool {
    let digits = number.strip_prefix('-').unwrap_or(number);
    let digits = digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
        .unwrap_or(digits);
    !digits.is_empty() && digits.bytes().all(|b| b == b'0')
}

/// Whether the file holds what proto3 cannot say: a field default, a required field,
/// an enum whose first value is not 0 (a closed enum's may be; proto3 wants 0), or
/// `json_format = LEGACY_BEST_EFFORT` (proto3 refuses fields whose JSON names clash).
fn needs_proto2(source: &str, tokens: &[Token]) -> bool {
    let text = |i: usize| tokens.get(i).map_or("", |t| t.text(source));
    (0..tokens.len()).any(|i| match text(i) {
        // An option `[default = ...]`, not a field or value named `default`.
        "default" => i > 0 && matches!(text(i - 1), "[" | ",") && text(i + 1) == "=",
        // A feature's value (`= X` or `: X`), not an enum value of that name.
        "LEGACY_REQUIRED" | "LEGACY_BEST_EFFORT" => {
            i > 0 && matches!(text(i - 1), "=" | ":") && text(i + 1) != "="
        }
        // `enum E {`: its first value, past options and reservations.
        "enum" if text(i + 2) == "{" => {
            let mut j = i + 3;
            while matches!(text(j), "option" | "reserved" | ";") {
                // To the statement's `;`, past those inside an aggregate value's
                // braces (`{ a: 1; b: 2 }`; from a review).
                let mut depth = 0usize;
                while !matches!((text(j), depth), (";", 0) | ("", _)) {
                    match text(j) {
                        "{" => depth += 1,
                        "}" => depth = depth.saturating_sub(1),
                        _ => {}
                    }
                    j += 1;
                }
                j += 1;
            }
            // (A sign may be a token of its own.)
            let value = match text(j + 2) {
                "-" => text(j + 3),
                value => value,
            };
            text(j + 1) == "=" && !is_zero(value)
        }
        _ => false,
    })
}

/// The value a feature is set to in `statement` (its tokens): `features.NAME = VALUE`,
/// or `NAME: VALUE` inside `features = { ... }`.
fn feature_value<'a>(statement: &[&'a str], name: &str) -> Option<&'a str> {
    // The tokens glued, so that `features . NAME` (spaces, a line break: protoc takes
    // them) reads as `features.NAME` (from a review: with spaces, DELIMITED went
    // through unrefused and IMPLICIT was not seen); each token's start in the glue.
    let mut glued = String::new();
    let mut starts = Vec::with_capacity(statement.len());
    for token in statement {
        starts.push(glued.len());
        glued.push_str(token);
    }
    let value_at = |end: usize| {
        let i = starts.iter().position(|&start| start == end)?;
        statement.get(i).copied()
    };
    [format!("features.{name}="), format!("{name}:")]
        .iter()
        .find_map(|pattern| {
            glued.match_indices(pattern.as_str()).find_map(|(at, _)| {
                // Where a token starts, not inside a longer name.
                starts
                    .contains(&at)
                    .then(|| value_at(at + pattern.len()))
                    .flatten()
            })
        })
}

/// A token: its byte range in the source.
#[derive(Clone, Copy, Debug)]
struct Token {
    start: usize,
    end: usize,
}

impl Token {
    fn text(self, source: &str) -> &str {
        &source[self.start..self.end]
    }
}

/// The tokens of `source`, comments left out: identifiers (dotted and parenthesized
/// parts included, `features.(pb.cpp).x` is one), numbers, strings, and single
/// characters.
fn tokenize(source: &str) -> Vec<Token> {
    let bytes = source.as_bytes();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        if c.is_ascii_whitespace() {
            i += 1;
        } else if bytes[i..].starts_with(b"//") {
            while i < bytes.len() && bytes[i] != b'\n' {
                i += 1;
            }
        } else if bytes[i..].starts_with(b"/*") {
            i += 2;
            while i < bytes.len() && !bytes[i..].starts_with(b"*/") {
                i += 1;
            }
            i = (i + 2).min(bytes.len());
        } else if c == b'"' || c == b'\'' {
            let start = i;
            i += 1;
            while i < bytes.len() && bytes[i] != c {
                if bytes[i] == b'\\' {
                    i += 1;
                }
                i += 1;
            }
            i = (i + 1).min(bytes.len());
            tokens.push(Token { start, end: i });
        } else if c.is_ascii_alphanumeric() || c == b'_' || c == b'.' {
            let start = i;
            let mut depth = 0usize;
            while i < bytes.len() {
                let b = bytes[i];
                if b.is_ascii_alphanumeric() || b == b'_' || b == b'.' || b == b'-' && i == start {
                    i += 1;
                } else if b == b'(' && i > start && bytes[i - 1] == b'.' {
                    depth += 1;
                    i += 1;
                } else if b == b')' && depth > 0 {
                    depth -= 1;
                    i += 1;
                } else {
                    break;
                }
            }
            tokens.push(Token { start, end: i });
        } else {
            // One character (a multi-byte one whole).
            let len = source[i..].chars().next().map_or(1, char::len_utf8);
            tokens.push(Token {
                start: i,
                end: i + len,
            });
            i += len;
        }
    }
    tokens
}

/// An edit: the byte range replaced, and the text put there.
type Edit = (usize, usize, String);

/// `source` with `edits` made (in any order; they do not overlap), each replaced
/// range keeping its line breaks (after the text put there).
fn apply(source: &str, mut edits: Vec<Edit>) -> String {
    edits.sort_by_key(|edit| edit.0);
    let mut out = String::with_capacity(source.len() + 16 * edits.len());
    let mut at = 0;
    for (start, end, text) in edits {
        out.push_str(&source[at..start]);
        out.push_str(&text);
        // The line breaks the text put there lacks, so that every line stays one.
        let replaced = &source[start..end];
        let breaks = replaced.matches('\n').count();
        out.extend(std::iter::repeat_n(
            '\n',
            breaks.saturating_sub(text.matches('\n').count()),
        ));
        at = end;
    }
    out.push_str(&source[at..]);
    out
}

/// What a scope of the file holds.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Scope {
    File,
    Message,
    Oneof,
    Enum,
    Service,
    Extend,
}

struct Parser<'a> {
    source: &'a str,
    tokens: &'a [Token],
    at: usize,
    edits: Vec<Edit>,
    /// `option features.field_presence = IMPLICIT;` for the file.
    file_implicit: bool,
    /// `option features.repeated_field_encoding = EXPANDED;` for the file.
    file_expanded: bool,
    /// The file becomes proto2 (see [`needs_proto2`]).
    proto2: bool,
}

impl<'a> Parser<'a> {
    fn peek(&self, ahead: usize) -> &str {
        self.tokens
            .get(self.at + ahead)
            .map_or("", |t| t.text(self.source))
    }

    fn start(&self, index: usize) -> usize {
        self.tokens
            .get(index)
            .map_or(self.source.len(), |t| t.start)
    }

    fn end(&self, index: usize) -> usize {
        self.tokens.get(index).map_or(self.source.len(), |t| t.end)
    }

    /// The index of the token that ends the statement starting at `self.at`: its `;`,
    /// or the `{` that opens its body, outside brackets and option values.
    fn statement_end(&self) -> usize {
        let mut depth = 0usize;
        let mut i = self.at;
        while i < self.tokens.len() {
            match self.tokens[i].text(self.source) {
                "[" | "(" | "<" => depth += 1,
                "]" | ")" | ">" => depth = depth.saturating_sub(1),
                // An option's message value: `option (x) = { a: 1 };`.
                "{" if depth > 0 || i > 0 && self.tokens[i - 1].text(self.source) == "=" => {
                    i = self.matching_brace(i);
                }
                ";" | "{" if depth == 0 => return i,
                "}" if depth == 0 => return i,
                _ => {}
            }
            i += 1;
        }
        self.tokens.len()
    }

    /// Whether the statement that ends at `tokens[end]` opens a body (`{`).
    fn opens_body(&self, end: usize) -> bool {
        self.tokens
            .get(end)
            .is_some_and(|t| t.text(self.source) == "{")
    }

    /// The texts of `tokens[from..to]`.
    fn texts(&self, from: usize, to: usize) -> Vec<&'a str> {
        self.tokens[from..to]
            .iter()
            .map(|t| t.text(self.source))
            .collect()
    }

    /// The index of the `}` that closes the `{` at `open`.
    fn matching_brace(&self, open: usize) -> usize {
        let mut depth = 0usize;
        for i in open..self.tokens.len() {
            match self.tokens[i].text(self.source) {
                "{" => depth += 1,
                "}" => {
                    depth -= 1;
                    if depth == 0 {
                        return i;
                    }
                }
                _ => {}
            }
        }
        self.tokens.len()
    }

    /// The first pass: the file-level features.
    fn file_features(&mut self) -> Result<(), String> {
        while self.at < self.tokens.len() {
            let end = self.statement_end();
            if self.peek(0) == "option" && self.peek(1).starts_with("features") {
                let statement: Vec<&str> = self.texts(self.at, end);
                let presence = feature_value(&statement, "field_presence");
                if let Some(value) = presence {
                    self.file_implicit = value == "IMPLICIT";
                }
                if let Some(value) = feature_value(&statement, "repeated_field_encoding") {
                    self.file_expanded = value == "EXPANDED";
                }
                if presence == Some("LEGACY_REQUIRED") {
                    return Err(
                        "features.field_presence = LEGACY_REQUIRED for a whole file \
                                is not read: give it on the fields"
                            .to_owned(),
                    );
                }
            }
            self.at = if self.opens_body(end) {
                self.matching_brace(end) + 1
            } else {
                end + 1
            };
        }
        Ok(())
    }

    fn file(&mut self) -> Result<(), String> {
        self.body(Scope::File)
    }

    /// The statements of a scope, up to its `}` (or the file's end).
    fn body(&mut self, scope: Scope) -> Result<(), String> {
        while self.at < self.tokens.len() {
            let first = self.peek(0).to_owned();
            match first.as_str() {
                "}" => {
                    self.at += 1;
                    return Ok(());
                }
                ";" => self.at += 1,
                "edition" if scope == Scope::File => {
                    let end = self.statement_end();
                    let syntax = if self.proto2 { "proto2" } else { "proto3" };
                    self.edits.push((
                        self.start(self.at),
                        self.end(end),
                        format!("syntax = \"{syntax}\";"),
                    ));
                    self.at = end + 1;
                }
                "import" => {
                    let end = self.statement_end();
                    let file = self.tokens[self.at..end]
                        .iter()
                        .map(|t| t.text(self.source))
                        .find(|t| t.starts_with(['"', '\'']))
                        .unwrap_or_default();
                    // Edition 2024's option imports are plain ones to proto3; the
                    // language features' files define nothing prost uses.
                    let file = file.trim_matches(['"', '\'']);
                    if file.starts_with("google/protobuf/") && file.ends_with("_features.proto") {
                        self.blank(self.at, end);
                    } else if self.peek(1) == "option" {
                        self.blank(self.at + 1, self.at + 1);
                    }
                    self.at = end + 1;
                }
                "option" => {
                    let end = self.statement_end();
                    if self.peek(1).starts_with("features.") || self.peek(1) == "features" {
                        self.refuse_delimited(self.at, end)?;
                        self.blank(self.at, end);
                    }
                    self.at = end + 1;
                }
                "export" | "local" if matches!(self.peek(1), "message" | "enum" | "service") => {
                    self.blank(self.at, self.at);
                    self.at += 1;
                }
                "message" | "enum" | "service" | "oneof" | "extend" => {
                    let inner = match first.as_str() {
                        "message" => Scope::Message,
                        "enum" => Scope::Enum,
                        "service" => Scope::Service,
                        "oneof" => Scope::Oneof,
                        _ => Scope::Extend,
                    };
                    let end = self.statement_end();
                    self.at = end + 1;
                    if self.opens_body(end) {
                        self.body(inner)?;
                    }
                }
                "rpc" => {
                    let end = self.statement_end();
                    self.at = if self.opens_body(end) {
                        let close = self.matching_brace(end);
                        self.strip_feature_options(end + 1, close)?;
                        close + 1
                    } else {
                        end + 1
                    };
                }
                "reserved" => {
                    // Editions reserve names as identifiers (`reserved foo;`), proto2
                    // and proto3 as strings.
                    let end = self.statement_end();
                    for i in self.at + 1..end {
                        let text = self.tokens[i].text(self.source);
                        let name = text.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_');
                        if name && text != "to" && text != "max" {
                            let (start, stop) = (self.start(i), self.end(i));
                            self.edits.push((start, stop, format!("\"{text}\"")));
                        }
                    }
                    self.at = end + 1;
                }
                "optional" | "required" | "group"
                    if matches!(scope, Scope::Message | Scope::Oneof | Scope::Extend) =>
                {
                    return Err(format!(
                        "`{first}` is not a label of editions (field presence is a feature)"
                    ));
                }
                _ if matches!(scope, Scope::Message | Scope::Oneof | Scope::Extend)
                    && !matches!(first.as_str(), "reserved" | "extensions") =>
                {
                    self.field(scope)?;
                }
                _ => {
                    let end = self.statement_end();
                    self.strip_feature_options(self.at, end)?;
                    self.at = end + 1;
                }
            }
        }
        Ok(())
    }

    /// A field (a `repeated` one, a map, or a singular one) at `self.at`.
    fn field(&mut self, scope: Scope) -> Result<(), String> {
        let end = self.statement_end();
        let statement: Vec<&str> = self.texts(self.at, end);
        let label = statement.first().copied().unwrap_or_default();
        let field_presence = feature_value(&statement, "field_presence");
        let implicit = match field_presence {
            Some("IMPLICIT") => true,
            Some(_) => false,
            None => self.file_implicit,
        };
        let required = field_presence == Some("LEGACY_REQUIRED");
        // A repeated field's encoding, said as proto3 or proto2 say it: proto3 packs by
        // default (as editions do), proto2 does not. (`packed` on a field that cannot
        // be packed is ignored, as by prost.)
        let expanded = match feature_value(&statement, "repeated_field_encoding") {
            Some(value) => value == "EXPANDED",
            None => self.file_expanded,
        };
        let packed = match (label == "repeated", expanded) {
            (true, true) => Some("packed = false"),
            (true, false) if self.proto2 => Some("packed = true"),
            _ => None,
        };
        self.refuse_delimited(self.at, end)?;
        let singular = label != "repeated" && label != "map";
        let add = match (singular, scope) {
            (true, Scope::Message) if required => Some("required "),
            (true, Scope::Message) if self.proto2 || !implicit => Some("optional "),
            // Extensions have explicit presence; proto2 wants it said.
            (true, Scope::Extend) if self.proto2 => Some("optional "),
            _ => None,
        };
        if let Some(add) = add {
            self.edits
                .push((self.start(self.at), self.start(self.at), add.to_owned()));
        }
        self.strip_options(self.at, end, packed)?;
        self.at = end + 1;
        Ok(())
    }

    /// Refuses `message_encoding = DELIMITED` (groups) in `tokens[from..to]`: that
    /// feature's value, not any token of the name (from a review: a field named
    /// `DELIMITED`, or defaulting to an enum value of that name, was refused).
    fn refuse_delimited(&self, from: usize, to: usize) -> Result<(), String> {
        let statement = self.texts(from, to.min(self.tokens.len()));
        if feature_value(&statement, "message_encoding") == Some("DELIMITED") {
            return Err(
                "features.message_encoding = DELIMITED (a group's encoding) is not read: \
                 prost has no groups outside proto2"
                    .to_owned(),
            );
        }
        Ok(())
    }

    /// Strips the feature entries of the `[...]` options in `tokens[from..to]`, and the
    /// `option features...;` statements of an rpc's body.
    fn strip_feature_options(&mut self, from: usize, to: usize) -> Result<(), String> {
        let mut i = from;
        while i < to {
            if self.tokens[i].text(self.source) == "option"
                && self
                    .tokens
                    .get(i + 1)
                    .is_some_and(|t| t.text(self.source).starts_with("features."))
            {
                let saved = self.at;
                self.at = i;
                let end = self.statement_end();
                self.at = saved;
                self.blank(i, end);
                i = end + 1;
            } else {
                i += 1;
            }
        }
        self.strip_options(from, to, None)
    }

    /// Rewrites the `[...]` option list in `tokens[from..to]` (`to`: the statement's
    /// `;`) without its feature entries, and with `extra` (`packed = ...`) if given;
    /// the brackets go when nothing is left, and come when only `extra` is.
    fn strip_options(&mut self, from: usize, to: usize, extra: Option<&str>) -> Result<(), String> {
        let Some(open) = (from..to).find(|&i| self.tokens[i].text(self.source) == "[") else {
            if let Some(extra) = extra {
                let at = self.start(to);
                self.edits.push((at, at, format!(" [{extra}]")));
            }
            return Ok(());
        };
        // The entries, split at commas outside nested brackets and braces.
        let mut entries: Vec<(usize, usize)> = Vec::new();
        let mut depth = 0usize;
        let mut first = open + 1;
        let mut close = to;
        for i in open + 1..to {
            match self.tokens[i].text(self.source) {
                "[" | "{" | "(" => depth += 1,
                "}" | ")" => depth = depth.saturating_sub(1),
                "]" if depth > 0 => depth -= 1,
                "]" => {
                    entries.push((first, i));
                    close = i;
                    break;
                }
                "," if depth == 0 => {
                    entries.push((first, i));
                    first = i + 1;
                }
                _ => {}
            }
        }
        let is_feature = |&(a, _): &(usize, usize)| {
            self.tokens.get(a).is_some_and(|t| {
                let text = t.text(self.source);
                text.starts_with("features.") || text == "features"
            })
        };
        if !entries.iter().any(is_feature) && extra.is_none() {
            return Ok(());
        }
        let mut kept: Vec<String> = entries
            .iter()
            .filter(|entry| !is_feature(entry) && entry.0 < entry.1)
            .map(|&(a, b)| self.source[self.start(a)..self.end(b - 1)].to_owned())
            .collect();
        if let Some(extra) = extra {
            kept.push(extra.to_owned());
        }
        let text = if kept.is_empty() {
            String::new()
        } else {
            format!("[{}]", kept.join(", "))
        };
        self.edits.push((self.start(open), self.end(close), text));
        Ok(())
    }

    /// Blanks `tokens[from..=to]` (line breaks kept).
    fn blank(&mut self, from: usize, to: usize) {
        self.edits
            .push((self.start(from), self.end(to), String::new()));
    }
}

#[cfg(test)]
mod tests {
    use super::rewrite;

    #[test]
    fn other_files_are_left_alone() {
        assert_eq!(rewrite("syntax = \"proto3\";\nmessage A {}\n"), Ok(None));
        assert_eq!(rewrite("// edition = \"2023\";\nmessage A {}\n"), Ok(None));
    }

    #[test]
    fn singular_fields_get_explicit_presence() {
        let source = "edition = \"2023\";\npackage p;\nmessage A {\n  string name = 1;\n  \
                      repeated int32 ids = 2;\n  map<string, A> children = 3;\n  \
                      oneof kind {\n    int32 n = 4;\n  }\n  B b = 5;\n  \
                      int32 plain = 6 [features.field_presence = IMPLICIT];\n  \
                      repeated int32 loose = 7 [features.repeated_field_encoding = EXPANDED, \
                      deprecated = true];\n}\n";
        let expected =
            "syntax = \"proto3\";\npackage p;\nmessage A {\n  optional string name = 1;\n  \
                        repeated int32 ids = 2;\n  map<string, A> children = 3;\n  \
                        oneof kind {\n    int32 n = 4;\n  }\n  optional B b = 5;\n  \
                        int32 plain = 6 ;\n  \
                        repeated int32 loose = 7 [deprecated = true, packed = false];\n}\n";
        assert_eq!(rewrite(source).unwrap().unwrap(), expected);
    }

    #[test]
    fn file_features_and_language_features_go() {
        let source = "edition = \"2024\";\nimport \"google/protobuf/cpp_features.proto\";\n\
                      import option \"x.proto\";\n\
                      option features.field_presence = IMPLICIT;\n\
                      option features.(pb.cpp).string_type = VIEW;\n\
                      option java_package = \"p\";\nexport message A {\n  string s = 1;\n  \
                      string t = 2 [features.field_presence = EXPLICIT];\n}\n\
                      local enum E {\n  option features.enum_type = OPEN;\n  E_0 = 0;\n}\n";
        let out = rewrite(source).unwrap().unwrap();
        assert!(out.starts_with("syntax = \"proto3\";\n"), "{out}");
        assert!(!out.contains("features"), "{out}");
        // The language features' import goes; an option import is a plain one.
        assert!(!out.contains("cpp_features"), "{out}");
        assert!(out.contains("import  \"x.proto\";"), "{out}");
        assert!(out.contains("  string s = 1;"), "{out}");
        assert!(out.contains("  optional string t = 2 ;"), "{out}");
        assert!(out.contains("option java_package = \"p\";"), "{out}");
        assert!(
            out.contains("\n message A {") && out.contains("\n enum E {"),
            "{out}"
        );
        // Line for line.
        assert_eq!(out.lines().count(), source.lines().count());
    }

    #[test]
    fn defaults_and_required_fields_make_proto2() {
        let source = "edition = \"2023\";\nmessage A {\n  int32 n = 1 [default = 7];\n  \
                      string id = 2 [features.field_presence = LEGACY_REQUIRED];\n  \
                      repeated int32 ids = 3;\n  repeated int32 loose = 4 \
                      [features.repeated_field_encoding = EXPANDED];\n}\n";
        // Packed, as editions' default is, where proto2's is not.
        let expected =
            "syntax = \"proto2\";\nmessage A {\n  optional int32 n = 1 [default = 7];\n  \
                        required string id = 2 ;\n  repeated int32 ids = 3 [packed = true];\n  \
                        repeated int32 loose = 4 [packed = false];\n}\n";
        assert_eq!(rewrite(source).unwrap().unwrap(), expected);
        // A closed enum whose first value is not 0 (proto3 wants 0) makes proto2 too;
        // a closed one starting at 0, a field or a value named `default` do not.
        let closed = "edition = \"2023\";\noption features.enum_type = CLOSED;\n\
                      enum E {\n  E_ONE = 1;\n}\n";
        assert!(rewrite(closed)
            .unwrap()
            .unwrap()
            .starts_with("syntax = \"proto2\";"));
        let zero = "edition = \"2023\";\noption features.enum_type = CLOSED;\n\
                    enum E {\n  option allow_alias = true;\n  E_0 = 0;\n  E_ONE = 1;\n}\n";
        assert!(rewrite(zero)
            .unwrap()
            .unwrap()
            .starts_with("syntax = \"proto3\";"));
        let named = "edition = \"2023\";\nmessage A {\n  bool default = 1;\n}\n\
                     enum M {\n  M_0 = 0;\n  default = 1;\n}\n";
        assert!(rewrite(named)
            .unwrap()
            .unwrap()
            .starts_with("syntax = \"proto3\";"));
    }

    /// Migrated proto2 files set their features for the whole file: expanded repeated
    /// fields (`packed = false`, unless a field says PACKED), implicit presence, in
    /// either form of the option.
    #[test]
    fn file_wide_features_reach_every_field() {
        let source = "edition = \"2023\";\n\
                      option features.repeated_field_encoding = EXPANDED;\n\
                      option features = { field_presence: IMPLICIT };\n\
                      message A {\n  repeated int32 ids = 1;\n  \
                      repeated int32 p = 2 [features.repeated_field_encoding = PACKED];\n  \
                      repeated int32 d = 3 [deprecated = true];\n  int32 n = 4;\n}\n";
        let out = rewrite(source).unwrap().unwrap();
        assert!(out.starts_with("syntax = \"proto3\";"), "{out}");
        assert!(!out.contains("features"), "{out}");
        assert!(
            out.contains("repeated int32 ids = 1 [packed = false];"),
            "{out}"
        );
        assert!(out.contains("repeated int32 p = 2 ;"), "{out}");
        assert!(
            out.contains("repeated int32 d = 3 [deprecated = true, packed = false];"),
            "{out}"
        );
        assert!(out.contains("\n  int32 n = 4;"), "{out}");
        assert_eq!(out.lines().count(), source.lines().count());
    }

    /// Options over several lines keep their line breaks once: every line stays one.
    #[test]
    fn lines_stay_lines_under_multi_line_options() {
        let source = "edition = \"2023\";\nmessage A {\n  repeated int32 x = 1 [\n    \
                      (my.opt) = {\n      a: 1\n    },\n    \
                      features.repeated_field_encoding = EXPANDED\n  ];\n  int32 y = 2;\n}\n";
        let out = rewrite(source).unwrap().unwrap();
        assert_eq!(out.lines().count(), source.lines().count(), "{out}");
        let y = |text: &str| text.lines().position(|l| l.contains("y = 2")).unwrap();
        assert_eq!(y(&out), y(source), "{out}");
        assert!(out.contains("packed = false"), "{out}");
        // A user's file whose name ends in `_features.proto` is a plain import.
        let import = "edition = \"2023\";\nimport \"ml/user_features.proto\";\n";
        assert!(rewrite(import)
            .unwrap()
            .unwrap()
            .contains("import \"ml/user_features.proto\";"));
    }

    #[test]
    fn reserved_names_become_strings() {
        let source = "edition = \"2023\";\nmessage A {\n  reserved 2, 5 to max;\n  reserved foo, bar_2;\n}\n";
        let expected = "syntax = \"proto3\";\nmessage A {\n  reserved 2, 5 to max;\n  reserved \"foo\", \"bar_2\";\n}\n";
        assert_eq!(rewrite(source).unwrap().unwrap(), expected);
    }

    #[test]
    fn what_cannot_be_said_is_refused() {
        let delimited = "edition = \"2023\";\nmessage A {\n  \
                         B b = 1 [features.message_encoding = DELIMITED];\n}\n";
        // Each refusal says where: the statement's (or the token's) offset.
        let (why, at) = rewrite(delimited).unwrap_err();
        assert!(why.contains("DELIMITED"), "{why}");
        assert_eq!(&delimited[at..at + 3], "B b", "{at}");
        let (why, at) = rewrite("edition = \"2030\";\n").unwrap_err();
        assert!(why.contains("2030") && at == 10, "{why} {at}");
        let labelled = "edition = \"2023\";\nmessage A {\n  optional int32 n = 1;\n}\n";
        let (why, at) = rewrite(labelled).unwrap_err();
        assert!(why.contains("optional"), "{why}");
        assert!(labelled[at..].starts_with("optional int32"), "{at}");
        // Enum values may be named so.
        let values =
            "edition = \"2023\";\nenum E {\n  E_0 = 0;\n  optional = 1;\n  required = 2;\n}\n";
        assert!(rewrite(values).is_ok());
        // A field named DELIMITED, or defaulting to a value of that name, is no group's
        // encoding (from a review: both were refused).
        let named = "edition = \"2023\";\nenum F {\n  F_0 = 0;\n  DELIMITED = 1;\n}\n\
                     message A {\n  int32 DELIMITED = 1;\n  F f = 2 [default = DELIMITED];\n}\n";
        assert!(rewrite(named).is_ok(), "{:?}", rewrite(named));
    }

    /// A first enum value of zero in any form keeps a file proto3, and an enum value
    /// named LEGACY_REQUIRED is no feature's (from a review: `0x00` made the file
    /// proto2 in silence, every field an `Option`).
    #[test]
    fn zero_in_any_form_and_value_names_keep_proto3() {
        for zero in ["0", "00", "0x0", "0x00", "0X0", "-0", "-0x0", "000"] {
            let source = format!(
                "edition = \"2023\";\noption features.field_presence = IMPLICIT;\n\
                 enum Flags {{\n  FLAGS_NONE = {zero};\n  FLAGS_A = 0x01;\n}}\n\
                 message M {{\n  int32 count = 1;\n}}\n"
            );
            let out = rewrite(&source).unwrap().unwrap();
            assert!(out.starts_with("syntax = \"proto3\";"), "{zero}: {out}");
        }
        let one = "edition = \"2023\";\nenum E {\n  E_ONE = 0x01;\n}\n";
        assert!(rewrite(one)
            .unwrap()
            .unwrap()
            .starts_with("syntax = \"proto2\";"));
        let named = "edition = \"2023\";\nenum E {\n  E_0 = 0;\n  LEGACY_REQUIRED = 1;\n}\n";
        assert!(rewrite(named)
            .unwrap()
            .unwrap()
            .starts_with("syntax = \"proto3\";"));
        let feature = "edition = \"2023\";\nmessage A {\n  \
                       int32 n = 1 [features.field_presence = LEGACY_REQUIRED];\n}\n";
        assert!(rewrite(feature)
            .unwrap()
            .unwrap()
            .starts_with("syntax = \"proto2\";"));
        // An aggregate option with `;` between its fields before the first value.
        let aggregate = "edition = \"2023\";\nenum E {\n  option (agg) = { a: 1; b: 2 };\n  \
                         E_ZERO = 0;\n}\n";
        let out = rewrite(aggregate).unwrap().unwrap();
        assert!(out.starts_with("syntax = \"proto3\";"), "{out}");
    }

    /// A feature's name written with spaces or a line break around its dot is the
    /// feature still (from a review: DELIMITED went through, IMPLICIT was not seen).
    #[test]
    fn features_are_read_whatever_the_spaces() {
        for spaced in [
            "features . message_encoding=DELIMITED",
            "features.\n  message_encoding = DELIMITED",
        ] {
            let source =
                format!("edition = \"2023\";\nmessage M {{\n  M child = 1 [{spaced}];\n}}\n");
            let (why, _) = rewrite(&source).unwrap_err();
            assert!(why.contains("DELIMITED"), "{spaced}: {why}");
        }
        let implicit = "edition = \"2023\";\noption features . field_presence = IMPLICIT;\n\
                        message M {\n  int32 n = 1;\n}\n";
        let out = rewrite(implicit).unwrap().unwrap();
        assert!(
            out.contains("  int32 n = 1;") && !out.contains("optional"),
            "{out}"
        );
    }

    #[test]
    fn option_values_and_rpc_bodies_are_passed_over() {
        let source = "edition = \"2023\";\nimport \"google/api/annotations.proto\";\n\
                      service S {\n  rpc Get(A) returns (A) {\n    \
                      option (google.api.http) = { get: \"/v1/{name=a/*}\" body: \"*\" };\n    \
                      option features.(pb.java).x = Y;\n  }\n}\n\
                      message A {\n  string name = 1 [(custom) = { a: 1, b: [2, 3] }];\n}\n";
        let out = rewrite(source).unwrap().unwrap();
        assert!(
            out.contains("option (google.api.http) = { get: \"/v1/{name=a/*}\" body: \"*\" };"),
            "{out}"
        );
        assert!(!out.contains("features"), "{out}");
        assert!(
            out.contains("optional string name = 1 [(custom) = { a: 1, b: [2, 3] }];"),
            "{out}"
        );
        assert!(
            out.contains("import \"google/api/annotations.proto\";"),
            "{out}"
        );
    }
}

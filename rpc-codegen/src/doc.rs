//! [`clean_docs`]: makes sure no code block of a `.proto` comment runs as a doctest,
//! and that comments do not trip lints of the crate including the code.
//!
//! prost-build's `cleanup-markdown` marks fenced blocks `text,{info}`, except
//! ```` ```rust ````, which it marks `compile_fail`: a block that compiles (say
//! `assert!(true);`) then fails `cargo test --doc` in the crate that includes the
//! generated code. Comments of the `.proto` describe other languages' APIs as often
//! as Rust, so every fence of a generated doc comment gets the info string `text`.
//!
//! Indented code that prost-build left as such (its Markdown pass read it as part of
//! an HTML block like `<pre>`, a footnote or a metadata block, where rustdoc sees an
//! indented code block) is fenced as `text` too.
//!
//! Tabs become four spaces: clippy's `tabs_in_doc_comments` would flag them in the
//! crate that includes the code. Unicode bidirectional controls (U+202E, ...) become
//! escapes (`\u{202E}`): rustc rejects them in comments.

use std::fmt::Write as _;

/// Rewrites the info string of every opening code fence in the doc comments (`///`)
/// of generated `code` to `text`, their tabs to four spaces and their Unicode
/// bidirectional controls to escapes (see [`clean_chars`]). Fences follow CommonMark:
/// three or more backticks or tildes, indented at most three spaces (more in a list
/// item), open a block, a line of at least as many of the same character closes it, and a block still open where the doc comment ends is
/// closed there. Fences in block quotes (`> ````) count too: prost-build marks a
/// ```` ```rust ```` block in a quote `compile_fail` as any other. A fence opened in a
/// quote is closed only by a fence at the same quote depth, or by the end of its quote
/// (a line with fewer `>`), and a fence outside quotes is not closed by a quoted one.
pub(crate) fn clean_docs(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    // The open fence of the current doc comment: its character, its length and the
    // quote depth it opened at.
    let mut open: Option<(char, usize, usize)> = None;
    // The text column of the list item that fence was opened in, if it was: a line
    // left of it ends the item, and the fence with it (CommonMark: a container's end
    // ends the code in it; code has no lazy continuation).
    let mut open_in_item: Option<usize> = None;
    // Indented code this function fenced itself (below), and what it needs to know:
    // whether the last doc line was blank (or there was none), and whether a list is
    // going on (where indented lines continue an item).
    let mut indented_open = false;
    // Where that fence goes (spaces after `///`): the text's column of the list item
    // the code is in, so that the block stays in the item.
    let mut fence_at = 1;
    let mut after_blank = true;
    let mut in_list = false;
    // Where the text of each open list item starts (in spaces after `///`), outermost
    // first: a line indented less than four past the innermost's is the item's text,
    // not code. After a blank line, a line indented less than an item's text is no
    // longer in that item (CommonMark): back in an outer one, whose column counts.
    let mut items: Vec<usize> = Vec::new();
    // The marker of the last item started: a bullet's character, or an ordered
    // item's delimiter (`.` or `)`).
    let mut last_kind: Option<char> = None;
    // Indented code in a block quote this function fenced itself: the quote depth.
    // With the spaces before the quote's `>` (inside a list item, the item's): the
    // fence lines go there, so that they stay in the item (from a review: placed at
    // the comment's first column, they ended the item, and the quoted line after them
    // was indented code, which ran).
    let mut quoted_open: Option<(usize, usize)> = None;
    // The quote depth of the previous doc line, and whether that line was a blank
    // line of its quote (or there was none): indented code may start a quote's
    // content, or follow a blank line in it.
    let mut last_depth = 0;
    let mut quote_after_blank = true;
    let lines: Vec<&str> = code.split_inclusive('\n').collect();
    // The labels of the current doc comment's reference definitions to URLs (see
    // [`Definition`]), found when its first line is met.
    let mut urls: Option<Vec<String>> = None;
    for (at, &line) in lines.iter().enumerate() {
        let cleaned;
        let line = if line.trim_start().starts_with("///") && line.contains(needs_cleaning) {
            cleaned = clean_chars(line);
            cleaned.as_str()
        } else {
            line
        };
        let indent = line.len() - line.trim_start().len();
        let Some(doc) = line[indent..].strip_prefix("///") else {
            urls = None;
            open = None;
            indented_open = false;
            quoted_open = None;
            after_blank = true;
            in_list = false;
            items.clear();
            last_depth = 0;
            quote_after_blank = true;
            out.push_str(line);
            continue;
        };
        let blank = doc.trim().is_empty();
        let spaces = doc.len() - doc.trim_start_matches(' ').len();
        let prefix = &line[..line.len() - doc.len()];
        // A line left of the list item a fence is open in ends the item and the
        // fence (from a review: the `rust` or `should_panic` fence such a line opened
        // was taken for the open fence's content, and ran).
        if !blank
            && open.is_some()
            && open_in_item.is_some_and(|column| spaces < column)
            && !doc.trim_start().starts_with('>')
        {
            open = None;
            open_in_item = None;
            while items.last().is_some_and(|&column| column > spaces) {
                items.pop();
            }
            in_list = !items.is_empty();
            after_blank = true;
        }
        if in_list && after_blank && !blank {
            while items.last().is_some_and(|&column| column > spaces) {
                items.pop();
            }
            // Left of every item's text: the list is over (from a review: indented
            // code after it was taken for an item's text, and ran).
            if items.is_empty() {
                in_list = false;
            }
        }
        let item_content = items.last().copied().unwrap_or(0);
        // Indented code needs four spaces past the comment's own one, or past the text of
        // the list item it is in.
        let code_indent = if in_list { item_content + 4 } else { 5 };
        if indented_open {
            if blank || spaces >= code_indent {
                out.push_str(line);
                after_blank = blank;
                continue;
            }
            indented_open = false;
            out.push_str(prefix);
            out.push_str(&" ".repeat(fence_at));
            out.push_str("```\n");
        }
        // A `>` indented as code is code, not a block quote.
        let (depth, text, quoted_indent) = if spaces >= code_indent {
            (0, doc.trim(), 0)
        } else {
            unquoted(doc)
        };
        if let Some((open_depth, open_spaces)) = quoted_open {
            let quoted_blank = depth == open_depth && text.is_empty();
            if depth == open_depth && (quoted_blank || quoted_indent >= 4) {
                out.push_str(line);
                last_depth = depth;
                continue;
            }
            quoted_open = None;
            out.push_str(prefix);
            out.push_str(&" ".repeat(open_spaces));
            out.push_str(&"> ".repeat(open_depth));
            out.push_str("```\n");
            // Code has no lazy continuation: a quote that ends with code ends there,
            // and indented code may follow at once (from a review: it ran).
            if depth < open_depth {
                after_blank = true;
            }
        }
        if depth > 0 && depth != last_depth {
            quote_after_blank = true; // a quote (or a deeper one) starts here
        }
        if open.is_none()
            && depth > 0
            && !text.is_empty()
            && quoted_indent >= 4
            && quote_after_blank
        {
            // Indented code at the start of a block quote's content, or after a blank
            // line in it (prost-build leaves it be inside an HTML block's lines): fenced
            // within the quote.
            quoted_open = Some((depth, spaces.max(1)));
            out.push_str(prefix);
            out.push_str(&" ".repeat(spaces.max(1)));
            out.push_str(&"> ".repeat(depth));
            out.push_str("```text\n");
            out.push_str(line);
            last_depth = depth;
            quote_after_blank = false;
            after_blank = false;
            continue;
        }
        last_depth = depth;
        if depth > 0 {
            quote_after_blank = text.is_empty();
        }
        // The end of a quote ends a fence opened inside it (CommonMark), and, being
        // the end of code, the block: indented code may follow at once (from a
        // review: after `> ```` and `> line`, an indented line ran as a doctest).
        if open.is_some_and(|(_, _, opened_at)| depth < opened_at) {
            open = None;
            after_blank = true;
        }
        if open.is_none() && !blank && spaces >= code_indent && after_blank {
            // Indented code that prost-build's Markdown pass did not turn into a fence
            // (it read it as part of an HTML block, a footnote or a metadata block,
            // which rustdoc does not): rustdoc would run it as a doctest.
            indented_open = true;
            fence_at = if in_list { item_content } else { 1 };
            out.push_str(prefix);
            out.push_str(&" ".repeat(fence_at));
            out.push_str("```text\n");
            out.push_str(line);
            after_blank = false;
            continue;
        }
        if !blank && spaces <= 4 && open.is_none() {
            let item = doc.trim();
            // A bullet, with its text or alone on the line (prettyplease trims `- ` to
            // `-`); not a thematic break (`- - -`, `* * *`).
            let bullet = (item.starts_with("- ")
                || item.starts_with("* ")
                || item.starts_with("+ ")
                || matches!(item, "-" | "*" | "+"))
                && !is_break_or_underline(item);
            // An ordered marker, with its text or alone on the line (prettyplease trims
            // `10. ` to `10.`): its number.
            let ordered = item.split_once(['.', ')']).and_then(|(n, rest)| {
                let digits = !n.is_empty() && n.len() <= 9 && n.bytes().all(|b| b.is_ascii_digit());
                (digits && (rest.is_empty() || rest.starts_with(' '))).then_some(n)
            });
            // A list can interrupt a paragraph only with a bullet or the number 1
            // (CommonMark): `2. run it` under a line of text continues that text,
            // unless it is the next item of an ordered list going on (from a review:
            // `10. ten` under a bullet's text was taken for a new item, and the
            // indented code after it for that item's text).
            let delimiter = ordered.map(|n| item.as_bytes()[n.len()] as char);
            let starts = bullet
                || ordered.is_some_and(|n| {
                    after_blank
                        || (in_list && last_kind == delimiter)
                        || n.trim_start_matches('0') == "1"
                });
            if starts {
                in_list = true;
                let marker_len = if bullet {
                    1
                } else {
                    ordered.map_or(1, |n| n.len() + 1)
                };
                // A marker left of an item's text starts a sibling or an outer item.
                while items.last().is_some_and(|&column| column > spaces) {
                    items.pop();
                }
                items.push(spaces + marker_len + 1);
                last_kind = if bullet {
                    item.chars().next()
                } else {
                    delimiter
                };
            } else if spaces <= 1 {
                in_list = false;
                items.clear();
            }
        }
        // A heading, a thematic break or a setext underline ends its block at once:
        // indented code may follow it without a blank line (CommonMark).
        // In a list, within three spaces of the text of the item it is in (a break
        // cannot continue a paragraph lazily: left of an item's text, it ends that
        // item; from a review, a break or setext underline in an item, then indented
        // code, ran).
        let trimmed = doc.trim();
        let breaks = depth == 0
            && open.is_none()
            && spaces < code_indent
            && (is_atx_heading(trimmed) || is_break_or_underline(trimmed));
        if breaks && in_list {
            while items.last().is_some_and(|&column| column > spaces) {
                items.pop();
            }
            in_list = !items.is_empty();
        }
        let base = if in_list {
            items.last().copied().unwrap_or(1)
        } else {
            1
        };
        let block_end = breaks && spaces.saturating_sub(base) <= 3;
        after_blank = blank || block_end;
        // The end of a quote ends a fence opened inside it (CommonMark).
        if open.is_some_and(|(_, _, opened_at)| depth < opened_at) {
            open = None;
        }
        // A fence is indented at most three spaces past the comment's own (CommonMark),
        // or past the `> ` of a block quote, more only in a list item: deeper, it is a
        // paragraph's continuation or a line of the code it is in (an HTML block's, a
        // fenced block's), which rustdoc reads as text.
        let indent = if depth > 0 {
            quoted_indent
        } else {
            spaces.saturating_sub(1)
        };
        // In a list item, up to three past the item's text: four past it is the item's
        // indented code (or, after a line of text, that text's continuation).
        let fence = if indent <= 3 || (in_list && spaces < code_indent) {
            fence(text)
        } else {
            None
        };
        match (open, fence) {
            (None, Some((c, n, info))) if !(c == '`' && info.contains('`')) => {
                open = Some((c, n, depth));
                open_in_item =
                    (in_list && depth == 0 && spaces >= item_content).then_some(item_content);
                let prefix_len = line.len() - text.len();
                out.push_str(&line[..prefix_len]);
                out.push_str(&text[..n]);
                out.push_str("text\n");
            }
            (Some((c, n, opened_at)), Some((fence_char, fence_len, info)))
                if depth == opened_at && c == fence_char && fence_len >= n && info.is_empty() =>
            {
                open = None;
                // A closed fence ends its block: indented code may follow at once, in
                // a quote too (from a review: a quoted fence closed early by a fence
                // line of its content, then quoted indented code, ran).
                after_blank = true;
                if depth > 0 {
                    quote_after_blank = true;
                }
                out.push_str(line);
            }
            (Some(_), _) => out.push_str(line),
            (None, _) => {
                // Prose (not code: indented four past the comment's own space, or past
                // the text of the list item it is in): what reads as an HTML tag or a
                // link to a Rust path is escaped.
                let indented_code = spaces >= code_indent;
                let urls = urls.get_or_insert_with(|| url_labels(&lines[at..]));
                // A line indented as code that this pass reads as a paragraph's
                // continuation (code cannot start here) is indented with no-break
                // spaces past the first: Markdown indents with spaces and tabs only, so
                // rustdoc cannot read it as code where its reading of the blocks before
                // differs from this pass's (from a review: HTML lines, thematic breaks,
                // `10.` after a bullet each let one run as a doctest). A continuation's
                // indentation is not shown, so nothing changes on the page. Not in a
                // list item: there, clippy's `doc_lazy_continuation` takes a line so
                // indented for an unindented continuation, a warning in the user's
                // build; the list's own reading above keeps its code fenced.
                let unindented;
                let unindent = indented_code && depth == 0 && !in_list;
                let (line, doc) = if unindent {
                    let prefix_len = line.len() - doc.len();
                    unindented = format!(
                        "{} {}{}",
                        &line[..prefix_len],
                        "\u{a0}".repeat(spaces - 1),
                        &doc[spaces..]
                    );
                    (unindented.as_str(), &unindented[prefix_len..])
                } else {
                    (line, doc)
                };
                if indented_code {
                    out.push_str(line);
                } else if let Some(definition) =
                    Definition::parse(doc).filter(|d| depth == 0 && !unindent && d.to_url())
                {
                    // prost-build escaped it; rustdoc reads it (and its uses) as a link.
                    let prefix_len = line.len() - doc.len();
                    out.push_str(&line[..prefix_len]);
                    let _ = writeln!(
                        out,
                        "{}[{}]: {}",
                        &doc[..spaces],
                        definition.label,
                        definition.rest
                    );
                } else {
                    let prefix_len = line.len() - doc.len();
                    out.push_str(&line[..prefix_len]);
                    out.push_str(&escape_tags(doc, &lines[at + 1..], urls));
                }
            }
        }
    }
    text_fences(out)
}

/// Every doc line that reads as a fence with an info string, wherever it stands
/// (this pass's reading of the blocks around it aside: in a list nested four deep, in
/// a list in a block quote), made a `text` fence: a line rustdoc reads as an opening
/// fence would otherwise run its block as a doctest (prost-build writes a `rust`
/// fence as a `compile_fail` one, which runs too; from a review). A closing fence has
/// no info string, and a fence in a code block's content only changes its shown info.
fn text_fences(code: String) -> String {
    // Where the info string of `line`'s fence starts, if the fence runs code.
    let runs_at = |line: &str| -> Option<usize> {
        let doc = line.trim_start().strip_prefix("///")?;
        let rest = doc.trim_start_matches([' ', '>']);
        let (c, n, info) = fence(rest)?;
        let word = info.split([',', ' ', '\t']).next().unwrap_or("");
        // (Backticks in the info string: inline code, not a fence.)
        let runs = !info.is_empty() && word != "text" && !(c == '`' && info.contains('`'));
        runs.then(|| line.len() - rest.len() + n)
    };
    let mut out = String::with_capacity(code.len());
    for line in code.split_inclusive('\n') {
        match runs_at(line) {
            Some(at) => {
                out.push_str(&line[..at]);
                out.push_str("text\n");
            }
            None => out.push_str(line),
        }
    }
    out
}

/// Whether `text` (a doc line, trimmed) is an ATX heading: one to six `#`, then a
/// space or the end of the line.
fn is_atx_heading(text: &str) -> bool {
    let hashes = text.len() - text.trim_start_matches('#').len();
    (1..=6).contains(&hashes) && (text.len() == hashes || text[hashes..].starts_with(' '))
}

/// Whether `text` (a doc line, trimmed) is a thematic break (three or more `*`, `-` or
/// `_`, spaces between allowed) or a setext heading's underline (`=` or `-` only).
fn is_break_or_underline(text: &str) -> bool {
    let Some(first) = text.chars().next() else {
        return false;
    };
    let marks = text.chars().filter(|c| *c != ' ').count();
    match first {
        '*' | '-' | '_' => marks >= 3 && text.chars().all(|c| c == first || c == ' '),
        '=' => text.chars().all(|c| c == '='),
        _ => false,
    }
}

/// The code fence `text` starts with, if any: its character, its length (three or
/// more) and its info string.
fn fence(text: &str) -> Option<(char, usize, &str)> {
    let fence_char = text.chars().next().filter(|c| *c == '`' || *c == '~')?;
    let fence_len = text.chars().take_while(|c| *c == fence_char).count();
    // Both characters are one byte long.
    (fence_len >= 3).then(|| (fence_char, fence_len, text[fence_len..].trim()))
}

/// The quote depth of a doc comment line (its block quote markers: 1 for `> `, 2 for
/// `> > `), its text after them and its leading white space, and that white space's
/// width past the last marker's optional space (0 outside quotes).
fn unquoted(doc: &str) -> (usize, &str, usize) {
    let mut text = doc.trim_start();
    let mut depth = 0;
    let mut indent = 0;
    while let Some(rest) = text.strip_prefix('>') {
        text = rest.trim_start();
        indent = (rest.len() - text.len()).saturating_sub(1);
        depth += 1;
    }
    (depth, text, indent)
}

/// The Unicode bidirectional controls (embeddings, overrides and isolates) that rustc
/// rejects in comments (`text_direction_codepoint_in_comment`, deny by default).
const BIDI_CONTROLS: &[char] = &[
    '\u{202A}', '\u{202B}', '\u{202C}', '\u{202D}', '\u{202E}', '\u{2066}', '\u{2067}', '\u{2068}',
    '\u{2069}',
];

/// Whether [`clean_chars`] changes `c`.
fn needs_cleaning(c: char) -> bool {
    c == '\t' || BIDI_CONTROLS.contains(&c)
}

/// `line` with tabs as four spaces (clippy's `tabs_in_doc_comments`) and Unicode
/// bidirectional controls written as escapes (`\u{202E}`), which rustc would reject.
fn clean_chars(line: &str) -> String {
    let mut out = String::with_capacity(line.len() + 8);
    for c in line.chars() {
        if c == '\t' {
            out.push_str("    ");
        } else if BIDI_CONTROLS.contains(&c) {
            let _ = write!(out, "\\u{{{:X}}}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    out
}

/// Escapes every `<` of Markdown prose that would start an HTML tag (`<T>`,
/// `<package>`, `</div>`): comments of `.proto` files write placeholders that way, and
/// rustdoc takes them for unclosed HTML (a warning, an error under `-D warnings`) and
/// hides them. Code spans and autolinks (`<https://...>`, `<a@b.c>`) are kept.
///
/// Also escapes the `[` of inline links to what rustdoc would resolve as a Rust path
/// (see [`links_to_path`]): `[the note](Note)`, and wiki links (`[[Note]]`), which
/// prost-build's `cleanup-markdown` rewrites to `[Note](Note)`. A `.proto` comment
/// names `.proto` items, which are rarely in scope where the doc comment lands (never
/// in the modules generated for a service), and an unresolved link is a warning.
fn escape_tags(text: &str, after: &[&str], urls: &[String]) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    // Whether the text of the last reference link met was escaped (its label then
    // is too, even empty: `[label][]`).
    let mut text_escaped = false;
    let mut rest = text;
    while let Some(at) = rest.find(['`', '<', '[']) {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        if rest.starts_with('`') {
            // A code span: from a run of backticks to the next run of the same length.
            let run = rest.len() - rest.trim_start_matches('`').len();
            let close = rest[run..].match_indices(&rest[..run]).find(|&(i, _)| {
                let after = &rest[run + i + run..];
                !after.starts_with('`') && !rest[..run + i].ends_with('`')
            });
            let end = close.map_or(run, |(i, _)| run + i + run);
            out.push_str(&rest[..end]);
            rest = &rest[end..];
            continue;
        }
        if rest.starts_with('[') {
            // A link's text may go on over the paragraph's next lines.
            let joined;
            let link = if rest.contains(']') {
                rest
            } else {
                // The paragraph's next lines, read only for such a link.
                joined = format!("{rest}{}", paragraph_after(after));
                &joined
            };
            // The label of a reference link (`[text][label]`), after its text: a
            // shortcut reference (`[label]`) to rustdoc once the text is escaped.
            let label = (out.ends_with(']') && !out.ends_with("\\]"))
                .then(|| closing_bracket(link).map(|close| &link[1..close]))
                .flatten();
            let unresolved = match label {
                Some("") => text_escaped,
                Some(label) => !urls.contains(&fold(label)),
                None => {
                    text_escaped = reference_without_url(link, urls);
                    links_to_path(link) || text_escaped
                }
            };
            if unresolved && !out.ends_with('\\') {
                out.push('\\');
            }
            out.push('[');
            rest = &rest[1..];
            continue;
        }
        if let Some((url, len)) = url_template(rest) {
            out.push('`');
            out.push_str(url);
            out.push('`');
            rest = &rest[len..];
            continue;
        }
        let tag_like = rest[1..]
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || matches!(c, '/' | '!' | '?'));
        let autolink = rest[1..].find('>').is_some_and(|end| {
            let inner = &rest[1..1 + end];
            !inner.contains(char::is_whitespace) && (inner.contains(':') || inner.contains('@'))
        });
        let escaped = out.ends_with('\\');
        if tag_like && !autolink && !escaped {
            out.push('\\');
        }
        out.push('<');
        rest = &rest[1..];
    }
    out.push_str(rest);
    out
}

/// A URL with placeholders in angle brackets (`https://host/v1/<name>/items`), which
/// prost-build wraps as if it were a link (`<https://host/v1/<name>/items>`): no
/// autolink can hold a `<`, so rustdoc would see a bare URL (a warning) and an HTML
/// tag. Given `text` that starts with such a wrapped URL, returns the URL and the
/// length of the wrapped text, for the caller to write it as code.
fn url_template(text: &str) -> Option<(&str, usize)> {
    let inner = text.strip_prefix('<')?;
    if !(inner.starts_with("https://") || inner.starts_with("http://")) {
        return None;
    }
    // prost-build's URLs end at white space or `)`; it adds the `>` after them.
    let len = inner
        .find(|c: char| c.is_whitespace() || c == ')')
        .unwrap_or(inner.len());
    let url = inner[..len].strip_suffix('>')?;
    (url.contains('<') && !url.contains('`')).then_some((url, 1 + len))
}

/// Whether `text`, which starts with `[`, starts with an inline link whose destination
/// rustdoc takes for an intra-doc link: `[text](Name)`, `[text](<a::b>)`,
/// `` [text](`Name`#anchor) ``; not `[text](https://...)`, `[text](page.md)`,
/// `[text](#anchor)`. As rustdoc, it ignores destinations with characters no Rust
/// path has.
fn links_to_path(text: &str) -> bool {
    let Some(destination) = closing_bracket(text).and_then(|i| text[i + 1..].strip_prefix('('))
    else {
        return false;
    };
    let destination = match destination.strip_prefix('<') {
        Some(angled) => angled.split('>').next().unwrap_or(""),
        None => destination
            .split(|c: char| c.is_whitespace() || c == ')')
            .next()
            .unwrap_or(""),
    };
    is_rust_path(destination)
}

/// Whether rustdoc takes a link destination for a Rust path it must resolve (an
/// intra-doc link): as rustdoc, it ignores backticks and an anchor, and destinations
/// with characters no Rust path has (`/`, `.`, ...).
fn is_rust_path(destination: &str) -> bool {
    let path = destination.replace('`', "");
    let path = path.split('#').next().unwrap_or("");
    !path.is_empty()
        && path
            .chars()
            .all(|c| c.is_alphanumeric() || ":_<>,!*&;@()".contains(c))
}

/// A Markdown reference definition as prost-build writes it back at the end of a
/// comment whose text uses it (`[text][label]`, `[label][]`), with its brackets
/// escaped: `\[label\]: <https://example.com> "title"`. rustdoc would resolve the
/// uses, left as links, as Rust paths: a definition to a URL gets its brackets back,
/// and the uses of any other label are escaped (see [`reference_without_url`]).
struct Definition<'a> {
    label: &'a str,
    /// The destination and the title, if any, as written.
    rest: &'a str,
}

impl<'a> Definition<'a> {
    /// The definition a doc line (after `///`) holds, if it is one.
    fn parse(doc: &'a str) -> Option<Definition<'a>> {
        let text = doc.trim_start_matches(' ').strip_prefix("\\[")?;
        let (label, rest) = text.split_once("\\]: ")?;
        let rest = rest.trim_end();
        (!label.is_empty() && !rest.is_empty()).then_some(Definition { label, rest })
    }

    /// Whether its destination is one rustdoc leaves as it is (a URL, a page, an
    /// anchor), not a Rust path.
    fn to_url(&self) -> bool {
        let destination = match self.rest.strip_prefix('<') {
            Some(angled) => angled.split('>').next().unwrap_or(""),
            None => self.rest.split(char::is_whitespace).next().unwrap_or(""),
        };
        !is_rust_path(destination)
    }
}

/// The labels (case folded, as Markdown matches them) of the reference definitions to
/// URLs in the doc comment that starts at `lines[0]`.
fn url_labels(lines: &[&str]) -> Vec<String> {
    lines
        .iter()
        .map_while(|line| line.trim_start().strip_prefix("///"))
        .filter_map(Definition::parse)
        .filter(Definition::to_url)
        .map(|definition| fold(definition.label))
        .collect()
}

/// The text of the doc lines that follow (`lines`) in the same paragraph: up to a
/// blank doc line or the comment's end, without their `///`.
fn paragraph_after(lines: &[&str]) -> String {
    lines
        .iter()
        .map_while(|line| line.trim_start().strip_prefix("///"))
        .take_while(|doc| !doc.trim().is_empty())
        .collect()
}

/// Whether `text`, which starts with `[`, starts with a reference link (`[text][label]`
/// or `[label][]`) whose label has no definition to a URL among `urls` (case folded):
/// rustdoc would resolve its label as a Rust path.
fn reference_without_url(text: &str, urls: &[String]) -> bool {
    let Some(close) = closing_bracket(text) else {
        return false;
    };
    let Some(after) = text[close + 1..].strip_prefix('[') else {
        return false;
    };
    let Some(end) = closing_bracket(&text[close + 1..]) else {
        return false;
    };
    let label = match &after[..end - 1] {
        "" => &text[1..close],
        label => label,
    };
    !urls.contains(&fold(label))
}

/// A reference label as Markdown matches it: case folded, white space collapsed.
fn fold(label: &str) -> String {
    label
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .to_lowercase()
}

/// The index of the `]` that closes the `[` `text` starts with (escapes skipped).
fn closing_bracket(text: &str) -> Option<usize> {
    let mut depth = 0usize;
    let mut chars = text.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' => {
                chars.next();
            }
            '[' => depth += 1,
            ']' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::clean_docs;

    /// [`super::escape_tags`] of one line, alone in its comment.
    fn escape_tags(text: &str) -> String {
        super::escape_tags(text, &[], &[])
    }

    #[test]
    fn what_reads_as_html_is_escaped_in_prose_only() {
        assert_eq!(
            escape_tags(" Map<K, V> of <package>.<service>, </div> and a < b"),
            " Map\\<K, V> of \\<package>.\\<service>, \\</div> and a < b"
        );
        assert_eq!(
            escape_tags(" `Vec<T>` and ``a`<b>`` stay, <https://x.y/z> and <a@b.c> too"),
            " `Vec<T>` and ``a`<b>`` stay, <https://x.y/z> and <a@b.c> too"
        );
        assert_eq!(
            escape_tags(" already \\<T>, unclosed `<T> span"),
            " already \\<T>, unclosed `\\<T> span"
        );
        let code =
            "/// A <T>.\n///\n///     let x: Vec<T>;\n/// ```\n/// <T>\n/// ```\nlet a = b<c>();\n";
        // (Indented code, kept as it is, in a fence of its own.)
        let expected = "/// A \\<T>.\n///\n/// ```text\n///     let x: Vec<T>;\n/// ```\n/// ```text\n/// <T>\n/// ```\nlet a = b<c>();\n";
        assert_eq!(clean_docs(code), expected);
    }

    #[test]
    fn links_to_rust_paths_are_escaped_in_prose_only() {
        assert_eq!(
            escape_tags(" [Note](Note), [the `a`](<a::b>), [x](`X`#y) and [x](f() \"t\")"),
            " \\[Note](Note), \\[the `a`](<a::b>), \\[x](`X`#y) and \\[x](f() \"t\")"
        );
        assert_eq!(
            escape_tags(
                " [a](https://x.y/z), [b](<https://x.y>), [c](page.md), [d](#anchor), [e][f], \
                 \\[g\\](G), `[h](H)` and [i [j]] (J)"
            ),
            " [a](https://x.y/z), [b](<https://x.y>), [c](page.md), [d](#anchor), \\[e]\\[f], \
             \\[g\\](G), `[h](H)` and [i [j]] (J)"
        );
        assert_eq!(escape_tags(" [[wiki]](W)"), " \\[[wiki]](W)");
        // A link whose text goes on over the next line is judged whole.
        assert_eq!(
            super::escape_tags(
                " Read [the\n",
                &["/// note](Note) and [the\n", "/// spec](https://x.y)\n"],
                &[]
            ),
            " Read \\[the\n"
        );
        assert_eq!(
            super::escape_tags(" Read [the\n", &["/// spec](https://x.y)\n"], &[]),
            " Read [the\n"
        );
        // References: to a label defined as a URL, kept; to any other, escaped.
        let urls = ["spec".to_owned(), "rfc 9110".to_owned()];
        assert_eq!(
            super::escape_tags(
                " [the spec][Spec], [RFC  9110][], [x][local], [y][]",
                &[],
                &urls
            ),
            " [the spec][Spec], [RFC  9110][], \\[x]\\[local], \\[y]\\[]"
        );
        // prost-build's wrapping of URLs with placeholders becomes code.
        assert_eq!(
            escape_tags(" GET <https://h.example/v1/<name>/x> or <<https://h.example>>."),
            " GET `https://h.example/v1/<name>/x` or <<https://h.example>>."
        );
        let code = "/// [Note](Note)\n/// ```\n/// [Note](Note)\n/// ```\nlet a = [b](c);\n";
        let expected =
            "/// \\[Note](Note)\n/// ```text\n/// [Note](Note)\n/// ```\nlet a = [b](c);\n";
        assert_eq!(clean_docs(code), expected);
    }

    #[test]
    fn every_fence_becomes_text() {
        let code = "/// A.\n\
                    ///\n\
                    /// ```compile_fail\n\
                    /// assert!(true);\n\
                    /// ```\n\
                    ///\n    \
                    /// ```text,rust,no_run\n    \
                    /// ```rust\n    \
                    /// ```\n\
                    pub struct A;\n";
        let expected = "/// A.\n\
                        ///\n\
                        /// ```text\n\
                        /// assert!(true);\n\
                        /// ```\n\
                        ///\n    \
                        /// ```text\n    \
                        /// ```text\n    \
                        /// ```\n\
                        pub struct A;\n";
        assert_eq!(clean_docs(code), expected);
    }

    #[test]
    fn a_block_left_open_ends_with_its_doc_comment() {
        let code = "/// ```\n/// fn main() {}\npub struct A;\n/// ```rust\n/// x\n/// ```\n";
        let expected =
            "/// ```text\n/// fn main() {}\npub struct A;\n/// ```text\n/// x\n/// ```\n";
        assert_eq!(clean_docs(code), expected);
    }

    #[test]
    fn fences_in_block_quotes_become_text() {
        let code = "/// >\n/// > ```compile_fail\n/// > let x = 1;\n/// > ```\n/// > > ~~~\n";
        let expected = "/// >\n/// > ```text\n/// > let x = 1;\n/// > ```\n/// > > ~~~text\n";
        assert_eq!(clean_docs(code), expected);
    }

    #[test]
    fn a_quoted_fence_closes_only_at_its_own_depth_or_with_its_quote() {
        // Outside quotes, a quoted fence is content: the block goes on to its own
        // closing fence, and the `rust` block after it is made `text`.
        let code = "/// ```\n/// > ```\n/// ```\n/// ```rust\n/// x\n/// ```\n";
        let expected = "/// ```text\n/// > ```\n/// ```\n/// ```text\n/// x\n/// ```\n";
        assert_eq!(clean_docs(code), expected);
        // A quote that ends without its closing fence ends the block with it.
        let code = "/// > ```\n/// > a\n///\n/// ```rust\n/// x\n/// ```\n";
        let expected = "/// > ```text\n/// > a\n///\n/// ```text\n/// x\n/// ```\n";
        assert_eq!(clean_docs(code), expected);
    }

    /// A fence with an info string is made `text` wherever it stands, deep lists and
    /// lists in quotes included (from a review: `compile_fail` blocks ran there).
    #[test]
    fn fences_deep_in_lists_and_quotes_become_text() {
        let code = "/// 1. a\n///    1. b\n///       1. c\n///          1. d\n\
                    ///             ```compile_fail\n///             x\n///             ```\n\
                    /// > - Item\n/// >   - Sub:\n/// >     ```rust,ignore\n/// >     y\n/// >     ```\n";
        let out = clean_docs(code);
        assert!(
            !out.contains("compile_fail") && !out.contains("rust"),
            "{out}"
        );
        assert!(out.contains("///             ```text\n"), "{out}");
        assert!(out.contains("/// >     ```text\n"), "{out}");
        // Inline code that starts a line is no fence.
        let code = "/// ```a``` is inline\n";
        assert_eq!(clean_docs(code), code);
        // A quoted fence closed early by a fence line of its content (prost-build
        // writes every fence with three backticks), then quoted indented code.
        let code = "/// > ```\n/// > ```\n/// >     assert!(true);\n/// > ```\n";
        let out = clean_docs(code);
        assert!(
            out.contains("/// > ```text\n/// >     assert!(true);"),
            "{out}"
        );
    }

    /// A quote that ends with code (a fence it opened, or indented code this
    /// function fenced in it) is followed at once by indented code: that code is
    /// fenced too (from a review: after an HTML line, both ran as doctests).
    #[test]
    fn indented_code_right_after_a_quote_that_ends_with_code_is_fenced() {
        let code = "/// \\<p>\n/// > ```\n/// > get(key)\n///     assert!(false);\n";
        let out = clean_docs(code);
        assert!(
            out.ends_with("/// > get(key)\n/// ```text\n///     assert!(false);\n"),
            "{out}"
        );
        let code = "/// \\<p>\n/// > Note:\n/// >\n/// >     get(key)\n///     assert!(false);\n";
        let out = clean_docs(code);
        assert!(
            out.contains("/// > ```text\n/// >     get(key)\n/// > ```\n/// ```text\n///     assert!(false);\n"),
            "{out}"
        );
        // A quoted paragraph goes on lazily: its indented line is no code.
        let code = "/// > a paragraph\n///     goes on\n";
        assert_eq!(
            clean_docs(code),
            "/// > a paragraph\n/// \u{a0}\u{a0}\u{a0}\u{a0}goes on\n"
        );
    }

    /// Cases a fuzzer found (from a review) where rustdoc's reading of list items
    /// differed from this pass's, and code ran: a fence open in an item, ended by a
    /// line left of the item, before a `rust` fence; `10.` under a bullet's text
    /// (its continuation, not an item), then a thematic break and indented code in
    /// the bullet's item; a quote with indented code inside an item.
    #[test]
    fn list_items_end_their_code_as_rustdoc_reads_them() {
        let code = "/// - item\n///      ```\n///          Term\n/// ```rust\n/// x\n/// ```\n";
        let out = clean_docs(code);
        assert!(out.contains("/// ```text\n/// x\n"), "{out}");
        let code = "/// - item\n/// 10. ten\n///    ***\n///        ]]>\n";
        let out = clean_docs(code);
        assert!(out.contains("```text\n///        ]]>\n"), "{out}");
        let code = "/// * item\n///     </p>\n///     >     quoted code\n///       </div>\n";
        let out = clean_docs(code);
        assert!(
            out.contains("///     > ```text\n///     >     quoted code\n///     > ```\n"),
            "{out}"
        );
        // A setext underline in an item ends the item's paragraph (a heading), and a
        // thematic break left of a nested item's text ends that item: indented code
        // after either is fenced.
        let code = "/// - item\n///     ---\n///       ```rust\n";
        assert!(
            clean_docs(code).contains("```text\n///       ```text"),
            "{}",
            clean_docs(code)
        );
        let code = "/// * item\n///   - item\n///    ***\n///        code\n";
        assert!(
            clean_docs(code).contains("```text\n///        code"),
            "{}",
            clean_docs(code)
        );
        // The next item of an ordered list going on is an item, whatever its number.
        // (Its line after is its text's continuation: no fence.)
        let code = "/// 9. nine\n/// 10. ten\n///         text of ten\n";
        assert!(!clean_docs(code).contains("```"), "{}", clean_docs(code));
    }

    #[test]
    fn prose_that_starts_with_code_is_escaped() {
        let code = "/// `x` is a <T> and [the x](X).\n/// ``a`` <b>\n";
        let expected = "/// `x` is a \\<T> and \\[the x](X).\n/// ``a`` \\<b>\n";
        assert_eq!(clean_docs(code), expected);
    }

    /// Reference links with their definitions, as prost-build writes them back
    /// (escaped, at the comment's end): a definition to a URL is restored, and the
    /// uses of one to a Rust path are escaped, rustdoc would resolve them.
    #[test]
    fn reference_definitions_to_urls_are_restored() {
        let code = "/// See [the spec][spec] and [it][local].\n///\n\
                    /// \\[spec\\]: <https://x.y/spec> \"Spec\"\n/// \\[local\\]: Note\n\
                    pub struct A;\n/// [the spec][spec]\npub struct B;\n";
        let expected = "/// See [the spec][spec] and \\[it]\\[local].\n///\n\
                        /// [spec]: <https://x.y/spec> \"Spec\"\n/// \\[local\\]: Note\n\
                        pub struct A;\n/// \\[the spec]\\[spec]\npub struct B;\n";
        assert_eq!(clean_docs(code), expected);
    }

    #[test]
    fn bidi_controls_of_docs_become_escapes() {
        let code = "/// a\u{202E}b\u{2066}c\u{200F}\nlet s = \"\u{202E}\";\n";
        let expected = "/// a\\u{202E}b\\u{2066}c\u{200F}\nlet s = \"\u{202E}\";\n";
        assert_eq!(clean_docs(code), expected);
    }

    #[test]
    fn tabs_of_docs_become_spaces() {
        let code = "/// a\tb\nlet s = \"\t\";\n";
        assert_eq!(clean_docs(code), "/// a    b\nlet s = \"\t\";\n");
    }

    /// Indented code after a blank line, outside fences and lists, is fenced as text
    /// (found by a review: prost-build leaves it in `<pre>` blocks, footnotes and
    /// metadata blocks, and rustdoc ran it as a doctest).
    #[test]
    fn indented_code_left_unfenced_is_fenced_as_text() {
        let code = "/// \\<pre>\n///\n///     x\n///\n///     y\n/// \\</pre>\npub struct A;\n";
        let expected = "/// \\<pre>\n///\n/// ```text\n///     x\n///\n///     y\n/// ```\n/// \\</pre>\npub struct A;\n";
        assert_eq!(clean_docs(code), expected);
        // Left open where the doc comment ends (rustdoc closes it there).
        let code = "/// a\n///\n///     x\npub struct A;\n";
        let expected = "/// a\n///\n/// ```text\n///     x\npub struct A;\n";
        assert_eq!(clean_docs(code), expected);
        // Not in a list (an item's continuation), not after a line of prose, not in a
        // fence.
        let code = "/// - item\n///\n///     more of it\n/// a\n///     b\n/// ```\n///\n///     c\n/// ```\n";
        let expected = "/// - item\n///\n///     more of it\n/// a\n/// \u{a0}\u{a0}\u{a0}\u{a0}b\n/// ```text\n///\n///     c\n/// ```\n";
        assert_eq!(clean_docs(code), expected);
    }

    /// A fence line indented four spaces or more past the comment's own is text to
    /// rustdoc (a paragraph's continuation, a line of an HTML block): taken for a fence,
    /// it swallowed the real fence after it, which kept prost-build's `compile_fail`
    /// (found by a review).
    #[test]
    fn deeply_indented_fence_lines_are_not_fences() {
        let code = "/// \\<pre>\n/// text\n///     ```\n/// \\</pre>\n///\n/// ```compile_fail\n/// assert!(true);\n/// ```\n";
        let expected = "/// \\<pre>\n/// text\n/// \u{a0}\u{a0}\u{a0}\u{a0}```\n/// \\</pre>\n///\n/// ```text\n/// assert!(true);\n/// ```\n";
        assert_eq!(clean_docs(code), expected);
        // Nor in a block quote.
        let code = "/// > text\n/// >     ```\n/// >\n/// > ```compile_fail\n/// > x\n/// > ```\n";
        let expected = "/// > text\n/// >     ```\n/// >\n/// > ```text\n/// > x\n/// > ```\n";
        assert_eq!(clean_docs(code), expected);
        // Nor does one close a block; in a list item a fence indented up to three past
        // the item's text counts.
        let code = "/// ```\n///     ```\n/// x\n/// ```\n/// 1. item\n///\n///       ```rust\n///       y\n///       ```\n";
        let expected = "/// ```text\n///     ```\n/// x\n/// ```\n/// 1. item\n///\n///       ```text\n///       y\n///       ```\n";
        assert_eq!(clean_docs(code), expected);
        // Four past it, the lines are indented code of the item (the fence among them):
        // fenced as text at the item's text.
        let code = "/// 1. item\n///\n///        ```rust\n///        y\n/// after\n";
        // (The fence line in the block's content is made text too: `text_fences`.)
        let expected = "/// 1. item\n///\n///    ```text\n///        ```text\n///        y\n///    ```\n/// after\n";
        assert_eq!(clean_docs(code), expected);
    }

    /// Round 6 (found by a review, each a doctest or a rustdoc warning in the crate that
    /// includes the code): an ordered list item from 10 whose text is a fence
    /// (prettyplease trims `10. ` to `10.`); indented code right after a heading, after
    /// a list marker that cannot start a list, and at a block quote's start; and the
    /// continuation lines of a nested list item, which are its text, escaped.
    #[test]
    fn markdown_that_rustdoc_reads_otherwise_is_cleaned() {
        let code = "/// Steps:\n///\n/// 10.\n///     ```compile_fail\n///     x\n///     ```\n";
        let expected = "/// Steps:\n///\n/// 10.\n///     ```text\n///     x\n///     ```\n";
        assert_eq!(clean_docs(code), expected);
        let code = "/// \\<pre>\n/// # Example\n///      x\n/// \\</pre>\n";
        let expected =
            "/// \\<pre>\n/// # Example\n/// ```text\n///      x\n/// ```\n/// \\</pre>\n";
        assert_eq!(clean_docs(code), expected);
        let code = "/// \\<pre>\n/// 2. run it\n///\n///      x\n/// \\</pre>\n";
        let expected =
            "/// \\<pre>\n/// 2. run it\n///\n/// ```text\n///      x\n/// ```\n/// \\</pre>\n";
        assert_eq!(clean_docs(code), expected);
        let code = "/// \\<pre>\n/// >     x\n/// \\</pre>\n";
        let expected = "/// \\<pre>\n/// > ```text\n/// >     x\n/// > ```\n/// \\</pre>\n";
        assert_eq!(clean_docs(code), expected);
        // A spaced thematic break is no list item: code right after it is fenced.
        let code = "/// \\<pre>\n/// - - -\n///      x\n/// \\</pre>\n";
        let expected = "/// \\<pre>\n/// - - -\n/// ```text\n///      x\n/// ```\n/// \\</pre>\n";
        assert_eq!(clean_docs(code), expected);
        let code =
            "/// * outer\n///   * inner, a Vec<T>,\n///     then Vec<T> and [the note](Note)\n";
        let expected =
            "/// * outer\n///   * inner, a Vec\\<T>,\n///     then Vec\\<T> and \\[the note](Note)\n";
        assert_eq!(clean_docs(code), expected);
        // Back from a nested item to the outer one (a blank line, then the outer item's
        // column): code four past the outer item's text is code, fenced there, not
        // prose of the inner item.
        let code = "/// \\<pre>\n/// - outer\n///   - inner\n///\n///   outer again\n///\n///       let v = Vec::<u8>::new();\n/// \\</pre>\n";
        let expected = "/// \\<pre>\n/// - outer\n///   - inner\n///\n///   outer again\n///\n///   ```text\n///       let v = Vec::<u8>::new();\n///   ```\n/// \\</pre>\n";
        assert_eq!(clean_docs(code), expected);
    }

    /// Round 7 (a review porting the cleaner): indented code right after a closing
    /// fence (a block ends there), a processing instruction `<?xml ...?>` (an HTML
    /// block of one line to rustdoc unless escaped), and a fence indented four past a
    /// list item's text, which is that item's text, not a fence (it opened a block
    /// that swallowed the next real one, a `compile_fail` doctest).
    #[test]
    fn blocks_that_end_or_never_open_are_read_as_rustdoc_reads_them() {
        let code = "/// \\<pre>\n/// ```\n/// x\n/// ```\n///      assert!(false);\n/// \\</pre>\n";
        let expected = "/// \\<pre>\n/// ```text\n/// x\n/// ```\n/// ```text\n///      assert!(false);\n/// ```\n/// \\</pre>\n";
        assert_eq!(clean_docs(code), expected);
        let code = "/// \\<pre>\n/// <?xml version=\"1.0\"?>\n///      <root/>\n/// \\</pre>\n";
        let expected =
            "/// \\<pre>\n/// \\<?xml version=\"1.0\"?>\n/// \u{a0}\u{a0}\u{a0}\u{a0}\u{a0}<root/>\n/// \\</pre>\n";
        assert_eq!(clean_docs(code), expected);
        let code = "/// \\<pre>\n/// 1. run\n///        ```\n/// \\</pre>\n///\n/// ```compile_fail\n/// let x = 1;\n/// ```\n";
        let expected = "/// \\<pre>\n/// 1. run\n///        ```\n/// \\</pre>\n///\n/// ```text\n/// let x = 1;\n/// ```\n";
        assert_eq!(clean_docs(code), expected);
    }

    #[test]
    fn inline_code_and_code_lines_are_kept() {
        let code = "/// ````code with ``` inside````\n\
                    let s = \"```rust\";\n\
                    /// ~~~~\n/// ```rust\n/// ~~~\n/// ~~~~\n";
        let expected = "/// ````code with ``` inside````\n\
                        let s = \"```rust\";\n\
                        /// ~~~~text\n/// ```text\n/// ~~~\n/// ~~~~\n";
        assert_eq!(clean_docs(code), expected);
    }
}

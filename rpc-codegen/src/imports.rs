//! The file resolver `.proto` files are read with: protox's (the include directories,
//! then the well-known types), mended for chains of `import public`.
//!
//! prost-reflect 0.16, which protox uses to resolve names, follows `import public` one
//! level only: with `a.proto` importing `b.proto`, which has `import public "c.proto"`,
//! which has `import public "d.proto"`, `a.proto` cannot name `d.proto`'s types
//! ("name '...' is not defined"), which protoc accepts. So each file that re-exports
//! files through such a chain is handed to protox with the whole chain as its own
//! `import public`s (`b.proto` imports `c.proto` and `d.proto` publicly), which one
//! level reaches; [`Mended::restore`] then takes the added imports out of the
//! descriptors the compiler returns, so that the generated code and the embedded
//! descriptor sets see the files as written.
//!
//! protox reports some errors without a line and column; [`Mended::locate`] adds the
//! one protoc would give, from what the resolver read.

use std::{
    cell::RefCell,
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    path::{Path, PathBuf},
    rc::Rc,
};

use prost_types::{FileDescriptorProto, FileDescriptorSet};
use protox::file::{
    ChainFileResolver, File, FileResolver, GoogleFileResolver, IncludeFileResolver,
};

use crate::{
    error::{Error, ErrorKind},
    names::{self, Scopes},
};

/// protox's resolver for `includes`, with public import chains made one level deep.
pub(crate) struct Resolver {
    inner: ChainFileResolver,
    state: Rc<RefCell<State>>,
}

/// What the resolver learned, shared with the caller once the compiler owns it.
#[derive(Default)]
struct State {
    /// Files read ahead to follow their public imports, not yet handed to protox.
    opened: HashMap<String, File>,
    /// Each file's direct `import public`s.
    public: HashMap<String, Vec<String>>,
    /// Files read from disk.
    paths: BTreeSet<PathBuf>,
    /// Files given imports of their own: their number of imports and their public
    /// imports (indices), as written.
    mended: BTreeMap<String, (usize, Vec<i32>)>,
    /// The include directories, in order: where a file that failed to read is.
    includes: Vec<PathBuf>,
    /// Each file's imports, with where their statements are.
    imports: HashMap<String, Vec<(String, Option<LineColumn>)>>,
    /// What each file read declares that names are looked up in (`crate::names`).
    scopes: HashMap<String, Rc<Scopes>>,
    /// Every scope name of the files read: what the compiler knows when it adds one.
    known: HashSet<String>,
}

/// A line and a column, 0-based, as `SourceCodeInfo` has them.
type LineColumn = (i32, i32);

/// The files [`Resolver`] read and mended, to take out of the compiler's output.
pub(crate) struct Mended(Rc<RefCell<State>>);

impl Resolver {
    /// The resolver, and the handle to what it reads.
    pub(crate) fn new(includes: &[impl AsRef<Path>]) -> (Resolver, Mended) {
        let mut inner = ChainFileResolver::new();
        for include in includes {
            inner.add(IncludeFileResolver::new(include.as_ref().to_owned()));
        }
        inner.add(GoogleFileResolver::new());
        let state = Rc::new(RefCell::new(State {
            includes: includes.iter().map(|i| i.as_ref().to_owned()).collect(),
            ..State::default()
        }));
        let mended = Mended(Rc::clone(&state));
        (Resolver { inner, state }, mended)
    }

    /// Opens `name` (or takes it from the files read ahead) and notes its path and its
    /// public imports.
    fn open(&self, name: &str) -> Result<File, protox::Error> {
        let cached = self.state.borrow_mut().opened.remove(name);
        let file = match cached {
            Some(file) => file,
            None => match self.inner.open_file(name) {
                Ok(file) => file,
                // protox parses proto2 and proto3 only: an editions file is read as
                // the file of those that means the same (`editions`).
                Err(err) if format!("{err:?}").contains("found 'edition'") => {
                    self.open_mended(name)?.ok_or(err)?
                }
                // protox does not skip a UTF-8 byte-order mark, which protoc has
                // skipped since 3.0 (from a review: such files, which some Windows
                // editors write, were refused).
                Err(err) if format!("{err:?}").ends_with(":1:1: invalid token") => {
                    self.open_mended(name)?.ok_or(err)?
                }
                Err(err) => return Err(err),
            },
        };
        if let Some((line, column)) = file.source().and_then(too_deep) {
            return Err(protox::Error::new(Refused(format!(
                "{name}:{line}:{column}: nested more than {MAX_NESTING} levels deep \
                 (messages and option values): flatten it (protox's parser of option \
                 values would overflow the stack)"
            ))));
        }
        if let Some(refusal) = method_named_type(name, file.file_descriptor_proto()) {
            return Err(protox::Error::new(Refused(refusal)));
        }
        let mut state = self.state.borrow_mut();
        if let Some(path) = file.path() {
            state.paths.insert(path.to_path_buf());
        }
        let descriptor = file.file_descriptor_proto();
        let public = descriptor
            .public_dependency
            .iter()
            .filter_map(|&i| descriptor.dependency.get(usize::try_from(i).ok()?))
            .cloned()
            .collect();
        state.public.insert(name.to_owned(), public);
        let locations = descriptor.source_code_info.iter().flat_map(|i| &i.location);
        let imports = (0..)
            .zip(&descriptor.dependency)
            .map(|(i, import)| {
                let at = locations.clone().find(|l| l.path == [3, i]);
                let at = at.and_then(|l| Some((*l.span.first()?, *l.span.get(1)?)));
                (import.clone(), at)
            })
            .collect();
        state.imports.insert(name.to_owned(), imports);
        if !state.scopes.contains_key(name) {
            let scopes = Scopes::of(descriptor);
            state.known.extend(scopes.names());
            state.scopes.insert(name.to_owned(), Rc::new(scopes));
        }
        Ok(file)
    }

    /// `name` from the include directories, mended, if it needs it: an editions file as
    /// the proto3 or proto2 file that means the same (`crate::editions`), and without
    /// a UTF-8 byte-order mark; `None` if it needs neither.
    fn open_mended(&self, name: &str) -> Result<Option<File>, protox::Error> {
        let includes = self.state.borrow().includes.clone();
        let Some(path) = includes.iter().map(|i| i.join(name)).find(|p| p.is_file()) else {
            return Ok(None);
        };
        let Ok(source) = std::fs::read_to_string(&path) else {
            return Ok(None);
        };
        // Without a byte-order mark (the positions below count from after it, as a
        // text editor's do).
        let bom = source.starts_with('\u{feff}');
        let source = source.strip_prefix('\u{feff}').unwrap_or(&source);
        let text = match crate::editions::rewrite(source) {
            Ok(Some(text)) => text,
            Ok(None) if bom => source.to_owned(),
            Ok(None) => return Ok(None),
            Err((why, at)) => {
                // Positioned as protox's own errors are (`file:line:column:`).
                let before = &source[..at.min(source.len())];
                let line = before.matches('\n').count() + 1;
                // (Bytes, as protox and protoc count columns.)
                let column = before.rsplit('\n').next().map_or(0, str::len) + 1;
                return Err(protox::Error::new(Refused(format!(
                    "{name}:{line}:{column}: {why} (editions are read as the proto3 or proto2 \
                     file that means the same)"
                ))));
            }
        };
        let file = File::from_source(name, &text)?;
        self.state.borrow_mut().paths.insert(path);
        Ok(Some(file))
    }

    /// The direct public imports of `name`, read ahead if it was not read yet (none if
    /// it cannot be: protox reports that when it opens the file itself).
    fn public_of(&self, name: &str) -> Vec<String> {
        self.read_ahead(name);
        let state = self.state.borrow();
        state.public.get(name).cloned().unwrap_or_default()
    }

    /// The direct imports of `name`, public or not, read ahead as [`Self::public_of`].
    fn imports_of(&self, name: &str) -> Vec<String> {
        self.read_ahead(name);
        let state = self.state.borrow();
        let imports = state.imports.get(name).into_iter().flatten();
        imports.map(|(import, _)| import.clone()).collect()
    }

    /// Reads `name` now, if it was not read yet, for protox to take later.
    fn read_ahead(&self, name: &str) {
        if self.state.borrow().imports.contains_key(name) {
            return;
        }
        if let Ok(file) = self.open(name) {
            self.state.borrow_mut().opened.insert(name.to_owned(), file);
        }
    }

    /// `descriptor` (the file `name`) with the compound type names that protoc resolves
    /// otherwise than protox written in full (`crate::names`); `None` if there is
    /// none. The files it imports, at any depth, are read ahead: the compiler knows
    /// them when it adds this one.
    fn protoc_names(
        &self,
        name: &str,
        descriptor: &FileDescriptorProto,
    ) -> Option<FileDescriptorProto> {
        if !names::has_compound_names(descriptor) {
            return None;
        }
        let direct = self.imports_of(name);
        let mut seen: BTreeSet<String> = BTreeSet::from([name.to_owned()]);
        let mut queue = direct.clone();
        while let Some(next) = queue.pop() {
            if seen.insert(next.clone()) {
                queue.extend(self.imports_of(&next));
            }
        }
        // The file sees itself, its imports, and what those re-export, at any depth.
        let mut visible: BTreeSet<String> = BTreeSet::from([name.to_owned()]);
        let mut queue = direct;
        while let Some(next) = queue.pop() {
            if visible.insert(next.clone()) {
                queue.extend(self.public_of(&next));
            }
        }
        let state = self.state.borrow();
        let visible: Vec<&Scopes> = visible
            .iter()
            .filter_map(|file| state.scopes.get(file).map(|s| &**s))
            .collect();
        names::protoc_names(descriptor, &visible, &state.known)
    }
}

impl FileResolver for Resolver {
    fn resolve_path(&self, path: &Path) -> Option<String> {
        self.inner.resolve_path(path)
    }

    fn open_file(&self, name: &str) -> Result<File, protox::Error> {
        let file = self.open(name)?;
        let chained = self.chain_public(name, file.file_descriptor_proto());
        let named = self.protoc_names(
            name,
            chained.as_ref().unwrap_or(file.file_descriptor_proto()),
        );
        // Its path is noted in `open`; its source is only for protox's error snippets
        // (positions come from the descriptor's source info).
        Ok(match named.or(chained) {
            Some(descriptor) => File::from_file_descriptor_proto(descriptor),
            None => file,
        })
    }
}

impl Resolver {
    /// `descriptor` (the file `name`) with the files its public imports re-export,
    /// beyond the first level, as public imports of its own; `None` if there are none.
    fn chain_public(
        &self,
        name: &str,
        descriptor: &FileDescriptorProto,
    ) -> Option<FileDescriptorProto> {
        // The files the public imports re-export, beyond the first level, that are not
        // public imports of this file already (one may be a plain import of it: it
        // becomes a public one, from a review).
        let mut queue = self.public_of(name);
        let mut known: BTreeSet<String> = queue.iter().cloned().collect();
        known.insert(name.to_owned());
        let mut visited: BTreeSet<String> = BTreeSet::new();
        let mut further = Vec::new();
        while let Some(next) = queue.pop() {
            if !visited.insert(next.clone()) {
                continue;
            }
            for public in self.public_of(&next) {
                if known.insert(public.clone()) {
                    further.push(public.clone());
                }
                queue.push(public);
            }
        }
        if further.is_empty() {
            return None;
        }
        let mut descriptor = descriptor.clone();
        self.state.borrow_mut().mended.insert(
            name.to_owned(),
            (
                descriptor.dependency.len(),
                descriptor.public_dependency.clone(),
            ),
        );
        for public in further {
            let index = match descriptor.dependency.iter().position(|d| *d == public) {
                Some(index) => index,
                None => {
                    descriptor.dependency.push(public);
                    descriptor.dependency.len() - 1
                }
            };
            descriptor
                .public_dependency
                .push(i32::try_from(index).unwrap_or(i32::MAX));
        }
        Some(descriptor)
    }
}

impl Mended {
    /// `err` as an [`Error`], with the position protoc would give where protox gives
    /// none: the end of the last token of a file that ends inside a definition (a
    /// missing `}`) or a comment, the first byte of a file that is not UTF-8, the
    /// import that starts an import cycle (in the cycle's first file), the second
    /// `package` of a file.
    pub(crate) fn locate(&self, err: protox::Error) -> Error {
        let message = format!("{err:?}");
        let file = err.file().map(str::to_owned);
        let error = Error::from(err);
        let Some(file) = file else {
            return error;
        };
        let positioned = message
            .strip_prefix(file.as_str())
            .and_then(|rest| rest.strip_prefix(':'))
            .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()));
        if positioned {
            return error;
        }
        let state = self.0.borrow();
        let position = if message.ends_with("reached end of file") {
            state.read(&file).map(|text| {
                let text = String::from_utf8_lossy(&text);
                (file.clone(), end_of(text.trim_end()))
            })
        } else if message.ends_with("is not valid utf-8") {
            state.read(&file).and_then(|text| {
                let valid = std::str::from_utf8(&text).err()?.valid_up_to();
                let valid = std::str::from_utf8(&text[..valid]).ok()?;
                Some((file.clone(), end_of(valid)))
            })
        } else if message == "multiple package names specified" {
            state.read(&file).and_then(|text| {
                let text = String::from_utf8_lossy(&text);
                let (line, text) = text
                    .lines()
                    .enumerate()
                    .filter(|(_, line)| {
                        line.trim_start()
                            .strip_prefix("package")
                            .is_some_and(|rest| rest.starts_with(char::is_whitespace))
                    })
                    .nth(1)?;
                let column = text.chars().count() - text.trim_start().chars().count();
                Some((file.clone(), (line + 1, column + 1)))
            })
        } else if let Some(cycle) = message.strip_prefix("import cycle detected: ") {
            // The chain may lead into the cycle from a file outside it (`main -> a ->
            // b -> a`): the cycle starts where its last name first appears, and the
            // import to point at is that file's of the next (protoc's position; from a
            // review, the root's import of `a` was named).
            let chain: Vec<&str> = cycle.split(" -> ").collect();
            let start = chain
                .last()
                .and_then(|last| chain.iter().position(|name| name == last))
                .unwrap_or(0);
            let mut names = chain[start..].iter().copied();
            names.next().zip(names.next()).and_then(|(first, second)| {
                let imports = state.imports.get(first)?;
                let (_, at) = imports.iter().find(|(import, _)| import == second)?;
                let (line, column) = (*at)?;
                let line = usize::try_from(line).ok()? + 1;
                let column = usize::try_from(column).ok()? + 1;
                Some((first.to_owned(), (line, column)))
            })
        } else {
            None
        };
        match position {
            Some((at_file, (line, column))) => error.at(&file, &at_file, line, column),
            None => error,
        }
    }

    /// The `.proto` files read from disk, imports included.
    pub(crate) fn sources(&self) -> BTreeSet<PathBuf> {
        self.0.borrow().paths.clone()
    }

    /// Takes the imports the resolver added out of `fds` and of `encoded` (the same set,
    /// as protox encodes it: with the extension options prost-types drops).
    pub(crate) fn restore(
        &self,
        fds: &mut FileDescriptorSet,
        encoded: Vec<u8>,
    ) -> Result<Vec<u8>, Error> {
        let state = self.0.borrow();
        if state.mended.is_empty() {
            return Ok(encoded);
        }
        for file in &mut fds.file {
            if let Some((count, public)) = state.mended.get(file.name()) {
                file.dependency.truncate(*count);
                file.public_dependency.clone_from(public);
            }
        }
        let mut out = Vec::with_capacity(encoded.len());
        for (name, field) in crate::raw_files_in_order(&encoded)? {
            match state.mended.get(name.as_str()) {
                Some((count, public)) => {
                    let body = strip_imports(field_body(field)?, *count, public)?;
                    encode_len_field(1, &body, &mut out);
                }
                None => out.extend_from_slice(field),
            }
        }
        Ok(out)
    }
}

/// How deep braces (`{`, and `<` of option values) may nest in a `.proto` file.
/// prost-reflect parses an option's value recursively, for protox: in a debug build a
/// value nested about 450 levels deep overflowed the 8 MiB stack of a build script
/// (and about 110 that of a 2 MiB thread), aborting it. Messages nest 32 deep at most
/// (protox's limit), and the option values of real files a few levels.
const MAX_NESTING: usize = 64;

/// Where the brace that opens nesting level [`MAX_NESTING`] + 1 of `source` is, if
/// one does (line and column, 1-based, in characters), outside comments and strings.
/// `<` counts too (it opens message values as `{` does; in `map<K, V>` it closes
/// at once).
fn too_deep(source: &str) -> Option<(usize, usize)> {
    let mut depth = 0usize;
    let (mut line, mut column) = (1, 0);
    let mut chars = source.chars().peekable();
    // The quote of the string the scan is in, or `/`, `*` or `#` for a comment.
    let mut inside: Option<char> = None;
    while let Some(c) = chars.next() {
        column += 1;
        if c == '\n' {
            (line, column) = (line + 1, 0);
        }
        match (inside, c) {
            (Some('/' | '#'), '\n') => inside = None,
            (Some('*'), '*') if chars.peek() == Some(&'/') => {
                chars.next();
                column += 1;
                inside = None;
            }
            (Some('"' | '\''), '\\') => {
                if chars.next_if(|&c| c != '\n').is_some() {
                    column += 1;
                }
            }
            (Some(quote @ ('"' | '\'')), c) if c == quote || c == '\n' => inside = None,
            (Some(_), _) => {}
            (None, '/') if matches!(chars.peek(), Some('/' | '*')) => {
                inside = chars.next();
                column += 1;
            }
            (None, '"' | '\'' | '#') => inside = Some(c),
            (None, '{' | '<') => {
                depth += 1;
                if depth > MAX_NESTING {
                    return Some((line, column));
                }
            }
            (None, '}' | '>') => depth = depth.saturating_sub(1),
            (None, _) => {}
        }
    }
    None
}

/// An error of the resolver's own, which protox passes on: its `Debug` (what
/// [`Error`]'s conversion shows) is the message, positioned.
struct Refused(String);

/// protoc's refusal of a method's request or response type written as a simple
/// name that is the name of a method of the same service (`rpc Get(Get)`):
/// protoc looks names up from the method's scope outward and finds the method before
/// the message (protocolbuffers/protobuf#3377), where protox finds the message. The
/// file is refused as protoc refuses it, so that a `.proto` that builds here builds
/// for every other language too (from a review: `rpc Version(Version)`, a common
/// shape, generated Rust and broke the team's protoc-based clients). `descriptor` is
/// the file as parsed, its names as written.
fn method_named_type(name: &str, descriptor: &FileDescriptorProto) -> Option<String> {
    const SERVICE: i32 = 6;
    const METHOD: i32 = 2;
    let locations = descriptor.source_code_info.iter().flat_map(|i| &i.location);
    for (s, service) in (0..).zip(&descriptor.service) {
        let methods: Vec<&str> = service.method.iter().map(|m| m.name()).collect();
        for (m, method) in (0..).zip(&service.method) {
            for (field, written) in [(2, method.input_type()), (3, method.output_type())] {
                // A compound name (`Get.Inner`) goes on past a part that is no
                // message, package or service, in protoc as in protox: only a simple
                // one stops at the method.
                if written.contains('.') {
                    continue;
                }
                if !methods.contains(&written) {
                    continue;
                }
                let path = [SERVICE, s, METHOD, m, field];
                let at = locations
                    .clone()
                    .find(|location| location.path == path)
                    .and_then(|location| Some((location.span.first()?, location.span.get(1)?)))
                    .map_or(String::new(), |(line, column)| {
                        format!(":{}:{}", line + 1, column + 1)
                    });
                let package = descriptor.package();
                let full = if package.is_empty() {
                    format!(".{written}")
                } else {
                    format!(".{package}.{written}")
                };
                return Some(format!(
                    "{name}{at}: \"{written}\" is not a message type: inside service {}, it \
                     names the method {written} (protoc looks names up from the method \
                     outward, and refuses this file); write the type's full name, such as \
                     {full}",
                    service.name()
                ));
            }
        }
    }
    None
}

impl std::fmt::Debug for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

impl State {
    /// The contents of the file protox opens as `name` (the first include directory's
    /// that has it), if it is on disk.
    fn read(&self, name: &str) -> Option<Vec<u8>> {
        let path = self
            .includes
            .iter()
            .map(|include| include.join(name))
            .find(|path| path.is_file())?;
        std::fs::read(path).ok()
    }
}

/// The line and column (1-based, in characters) just past `text`.
fn end_of(text: &str) -> (usize, usize) {
    let line = text.matches('\n').count() + 1;
    let column = text.rsplit('\n').next().unwrap_or_default().chars().count() + 1;
    (line, column)
}

fn malformed() -> Error {
    Error::new(
        ErrorKind::Generate,
        "protox encoded a malformed descriptor set",
    )
}

/// The message of a length-delimited field (key, length, message).
fn field_body(mut field: &[u8]) -> Result<&[u8], Error> {
    use protox::prost::encoding::decode_varint;
    decode_varint(&mut field).map_err(|_| malformed())?;
    decode_varint(&mut field).map_err(|_| malformed())?;
    Ok(field)
}

/// Appends field `number` (length-delimited) holding `body`.
fn encode_len_field(number: u32, body: &[u8], out: &mut Vec<u8>) {
    use protox::prost::encoding::encode_varint;
    encode_varint(u64::from(number << 3 | 2), out);
    encode_varint(body.len() as u64, out);
    out.extend_from_slice(body);
}

/// An encoded `FileDescriptorProto` with its imports (`dependency`, field 3) past the
/// first `count` left out, and the `public_dependency` entries (field 10) that are not
/// in `public` (the file's as written: an added one may point at an import of its
/// own); every other field as it is.
fn strip_imports(file: &[u8], count: usize, public: &[i32]) -> Result<Vec<u8>, Error> {
    use protox::prost::encoding::{decode_varint, encode_varint};
    const DEPENDENCY: u64 = 3;
    const PUBLIC_DEPENDENCY: u64 = 10;
    let mut out = Vec::with_capacity(file.len());
    let mut rest = file;
    let mut dependencies = 0;
    let kept = |index: u64| i32::try_from(index).is_ok_and(|index| public.contains(&index));
    while !rest.is_empty() {
        let start = rest;
        let key = decode_varint(&mut rest).map_err(|_| malformed())?;
        let (number, wire_type) = (key >> 3, key & 7);
        let mut packed = None;
        match wire_type {
            0 => {
                let value = decode_varint(&mut rest).map_err(|_| malformed())?;
                if number == PUBLIC_DEPENDENCY && !kept(value) {
                    continue;
                }
            }
            1 => rest = rest.get(8..).ok_or_else(malformed)?,
            2 => {
                let len = usize::try_from(decode_varint(&mut rest).map_err(|_| malformed())?)
                    .map_err(|_| malformed())?;
                let body = rest.get(..len).ok_or_else(malformed)?;
                rest = &rest[len..];
                if number == DEPENDENCY {
                    dependencies += 1;
                    if dependencies > count {
                        continue;
                    }
                }
                if number == PUBLIC_DEPENDENCY {
                    packed = Some(body);
                }
            }
            5 => rest = rest.get(4..).ok_or_else(malformed)?,
            _ => return Err(malformed()),
        }
        match packed {
            Some(mut values) => {
                let mut body = Vec::with_capacity(values.len());
                while !values.is_empty() {
                    let value = decode_varint(&mut values).map_err(|_| malformed())?;
                    if kept(value) {
                        encode_varint(value, &mut body);
                    }
                }
                if !body.is_empty() {
                    encode_len_field(10, &body, &mut out);
                }
            }
            None => out.extend_from_slice(&start[..start.len() - rest.len()]),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    /// The files given imports of their own are read through protox without their path
    /// (`File::from_file_descriptor_proto`): their path still reaches
    /// `cargo:rerun-if-changed`.
    #[test]
    fn the_sources_include_files_whose_imports_were_extended() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/protos/unseen/round9");
        let includes = [root.join("inc1"), root.join("inc2")];
        let parsed = crate::configure()
            .prepare(&["r9/svc/service.proto"], &includes, None)
            .unwrap_or_else(|err| panic!("{err}"));
        for file in [
            "inc1/r9/chain/top.proto",
            "inc1/r9/chain/mid.proto",
            "inc1/r9/chain/leaf.proto",
            "inc2/r9/c/types.proto",
            "inc1/r9/svc/service.proto",
        ] {
            assert!(
                parsed.sources.contains(&root.join(file)),
                "{file}: {:?}",
                parsed.sources
            );
        }
    }
}

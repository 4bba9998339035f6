//! Where descriptors come from: server reflection by default, or `.proto` files
//! (parsed by protox) and binary descriptor sets. Method and symbol lookup, with the
//! closest names when a name is not found.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use prost::Message as _;
use prost_reflect::{
    DescriptorPool, EnumDescriptor, MessageDescriptor, MethodDescriptor, ServiceDescriptor,
};
use rpc_core::{Code, Metadata};

use crate::{
    cli::{ConnArgs, SchemaArgs},
    exit::Failure,
    reflection::{Reflection, ReflectionError},
    target::Target,
};

/// Most names a "did you mean" line offers.
const MAX_SUGGESTIONS: usize = 3;
/// Most services whose methods are fetched by reflection to suggest a method name.
const MAX_SERVICES_SEARCHED: usize = 64;

/// A symbol `describe` can show.
#[derive(Debug, Clone)]
pub enum Symbol {
    /// A service.
    Service(ServiceDescriptor),
    /// A method.
    Method(MethodDescriptor),
    /// A message.
    Message(MessageDescriptor),
    /// An enum.
    Enum(EnumDescriptor),
    /// A message's field (`pkg.Message.field`).
    Field(prost_reflect::FieldDescriptor),
    /// An enum's value (`pkg.Enum.VALUE`).
    EnumValue(prost_reflect::EnumValueDescriptor),
}

enum Source {
    Files,
    Reflection(Box<Reflection>),
}

/// The schemas of one server: a descriptor pool, filled from files up front or from
/// reflection as symbols are asked for.
pub struct Schemas {
    source: Source,
    pool: DescriptorPool,
    uri: String,
}

impl Schemas {
    /// Schemas from `args`' files if any are given, otherwise from the server's
    /// reflection service (asked with `metadata`, each request within `timeout`).
    pub fn open(
        args: &SchemaArgs,
        target: &Target,
        uri: &str,
        metadata: Metadata,
        timeout: Duration,
    ) -> Result<Schemas, Failure> {
        if args.protos.is_empty() && args.protoset.is_empty() {
            return Ok(Schemas {
                source: Source::Reflection(Box::new(Reflection::new(
                    target.clone(),
                    metadata,
                    timeout,
                ))),
                pool: DescriptorPool::global(),
                uri: uri.to_owned(),
            });
        }
        Schemas::files(args, uri)
    }

    /// Connects to `conn`'s server and finds `path`'s method, with the schemas it was
    /// found in: from `args`' files, read (and the method looked up) before connecting,
    /// so that a file that does not compile or a method it lacks is exit 1 whether or
    /// not the server can be reached; otherwise from the server's reflection (asked
    /// with `metadata`). What `call` and `bench` start with.
    pub async fn connect_to_method(
        conn: &ConnArgs,
        args: &SchemaArgs,
        path: &str,
        metadata: &Metadata,
    ) -> Result<(Target, Schemas, MethodDescriptor), Failure> {
        if Schemas::from_files(args) {
            let mut schemas = Schemas::files(args, &conn.uri)?;
            let method = schemas.method(path).await?;
            let target = crate::target::connect(conn).await?;
            return Ok((target, schemas, method));
        }
        let target = crate::target::connect(conn).await?;
        let mut schemas = Schemas::open(
            args,
            &target,
            &conn.uri,
            metadata.clone(),
            conn.lookup_timeout(),
        )?;
        let method = schemas.method(path).await?;
        Ok((target, schemas, method))
    }

    /// Whether `args` name files to read the schema from (no reflection needed).
    pub fn from_files(args: &SchemaArgs) -> bool {
        !args.protos.is_empty() || !args.protoset.is_empty()
    }

    /// Schemas from `args`' files alone (`uri` names the server in errors): what `list`
    /// and `describe` use with `--proto` or `--protoset`, without a connection.
    pub fn files(args: &SchemaArgs, uri: &str) -> Result<Schemas, Failure> {
        let mut schemas = Schemas {
            source: Source::Files,
            pool: DescriptorPool::global(),
            uri: uri.to_owned(),
        };
        for set in &args.protoset {
            let set_path = set;
            let bytes = std::fs::read(set)
                .map_err(|err| Failure::error(format!("--protoset {}: {err}", set.display())))?;
            // Counted on the encoding first, as reflection's answers are.
            crate::reflection::check_descriptor_set(&bytes)
                .map_err(|why| Failure::error(format!("--protoset {}: {why}", set.display())))?;
            let mut set =
                prost_types::FileDescriptorSet::decode(bytes.as_slice()).map_err(|err| {
                    Failure::error(format!(
                        "--protoset {}: not a FileDescriptorSet: {err}",
                        set.display()
                    ))
                })?;
            // Editions files as proto2, read off each file's encoding.
            let raw = crate::reflection::set_files(&bytes);
            for (file, raw) in set.file.iter_mut().zip(raw) {
                crate::editions::normalize(file, raw).map_err(|why| {
                    Failure::error(format!("--protoset {}: {why}", set_path.display()))
                })?;
            }
            crate::reflection::check_links(&set.file).map_err(|why| {
                Failure::error(format!("--protoset {}: {why}", set_path.display()))
            })?;
            schemas.pool.add_file_descriptor_set(set).map_err(|err| {
                let text = err.to_string();
                // A set made without its imports (protoc's default).
                let hint = if text.contains("has not been added") {
                    " (a set must hold the files it imports: protoc --include_imports)"
                } else {
                    ""
                };
                Failure::error(format!("--protoset {}: {text}{hint}", set_path.display()))
            })?;
        }
        if !args.protos.is_empty() {
            let set = compile_protos(&args.protos, &args.import_paths)?;
            schemas
                .pool
                .add_file_descriptor_set(set)
                .map_err(|err| Failure::error(format!("--proto: {err}")))?;
        }
        Ok(schemas)
    }

    /// Closes the reflection stream, if one is open: call it once the command's own
    /// calls start, which should have the channel's call slots. A later lookup opens
    /// another.
    pub fn release(&mut self) {
        if let Source::Reflection(reflection) = &mut self.source {
            reflection.close();
        }
    }

    /// Ends the reflection stream, if one is open, and waits (within the target's
    /// closing grace) until it has ended and the connection is closed: the server
    /// sees the stream end OK, not cancelled by the process's exit.
    pub async fn finish(mut self) {
        if let Source::Reflection(reflection) = std::mem::replace(&mut self.source, Source::Files) {
            let target = reflection.target();
            drop(reflection);
            target.close().await;
        }
    }

    /// The descriptors known so far.
    pub fn pool(&self) -> &DescriptorPool {
        &self.pool
    }

    /// Whether the schema comes from server reflection.
    pub fn is_reflection(&self) -> bool {
        matches!(self.source, Source::Reflection(_))
    }

    /// Where the schema comes from, for errors: the server (reflection), or the files.
    fn source_name(&self) -> String {
        match self.source {
            Source::Reflection(_) => self.uri.clone(),
            Source::Files => "the schema files given (--proto, --protoset, which replace \
                              the server's reflection: give the service's own files too)"
                .to_owned(),
        }
    }

    fn reflection_failure(&self, err: ReflectionError) -> Failure {
        match err {
            ReflectionError::NotServed(http_answer) => Failure::error(format!(
                "{} does not serve reflection (neither grpc.reflection.v1 nor v1alpha{}): \
                 give the schema as files, e.g. --proto path/to/service.proto \
                 --import-path path/to (or --protoset FILE)",
                self.uri,
                http_answer.map_or(String::new(), |answer| format!(
                    "; {answer}, not gRPC's answer: a proxy with no route for it, or no gRPC \
                     server there"
                ))
            )),
            ReflectionError::Status(status) => {
                let mut failure = Failure::status(&status, None);
                // A connection that failed, a deadline, credentials refused: the
                // connection's trouble, met on its first call (reflection's), not
                // reflection's; the label would send the user the wrong way.
                use rpc_core::Code;
                let connection = [
                    Code::UNAVAILABLE,
                    Code::DEADLINE_EXCEEDED,
                    Code::UNAUTHENTICATED,
                    Code::PERMISSION_DENIED,
                    Code::CANCELLED,
                ];
                if !connection.contains(&status.code()) {
                    failure.message = format!("reflection: {}", failure.message);
                }
                failure
            }
            ReflectionError::BadDescriptor(message) => Failure::error(message),
        }
    }

    /// The services: from reflection's list, or every service of the files.
    pub async fn services(&mut self) -> Result<Vec<String>, Failure> {
        match &mut self.source {
            Source::Reflection(reflection) => {
                let result = reflection.list_services().await;
                result.map_err(|err| self.reflection_failure(err))
            }
            Source::Files => {
                let mut names: Vec<String> = self
                    .pool
                    .services()
                    .map(|s| s.full_name().to_owned())
                    .collect();
                names.sort();
                Ok(names)
            }
        }
    }

    /// Makes sure the pool has `symbol` (asks reflection if needed). `Ok(false)` when
    /// the server does not know it.
    async fn fetch(&mut self, symbol: &str) -> Result<bool, Failure> {
        if has_symbol(&self.pool, symbol) {
            return Ok(true);
        }
        let Source::Reflection(reflection) = &mut self.source else {
            return Ok(false);
        };
        match reflection.add_symbol(&mut self.pool, symbol).await {
            Ok(()) => Ok(has_symbol(&self.pool, symbol)),
            Err(ReflectionError::Status(status)) if status.code() == Code::NOT_FOUND => Ok(false),
            Err(err) => Err(self.reflection_failure(err)),
        }
    }

    /// Adds to the pool the message types of `names` it lacks and reflection has
    /// (the types of `Any` values; best effort: a failed lookup leaves a type out).
    /// Whether the pool gained any.
    pub async fn resolve(&mut self, names: &[String]) -> bool {
        let mut gained = false;
        for name in names {
            if self.pool.get_message_by_name(name).is_none() {
                gained |= matches!(self.fetch(name).await, Ok(true));
            }
        }
        // Each batch (a response's Any types) on a stream of its own: kept, the stream
        // held a call slot. Its time is charged to the command's one budget of twice
        // --timeout on release (the wait for a long stream's next response is not).
        self.release();
        gained
    }

    /// A service by full name; a miss names the closest services.
    pub async fn service(&mut self, name: &str) -> Result<ServiceDescriptor, Failure> {
        if self.fetch(name).await? {
            if let Some(service) = self.pool.get_service_by_name(name) {
                return Ok(service);
            }
        }
        let services = self.services().await?;
        Err(Failure::error(format!(
            "no service {name:?} in {}{}",
            self.source_name(),
            suggest(name, &services, "services")
        )))
    }

    /// A method, as `package.Service/Method` or `package.Service.Method`; a miss
    /// names the closest methods.
    pub async fn method(&mut self, path: &str) -> Result<MethodDescriptor, Failure> {
        let Some((service_name, method_name)) = split_method(path) else {
            // A method's name alone (`Echo`): the methods of that name, in whichever
            // services have one (best effort: a failed lookup leaves them out).
            let name = path.trim_start_matches('.');
            let mut hint = String::new();
            if !name.is_empty() && !name.contains('/') {
                if let Ok(methods) = self.all_methods().await {
                    let named: Vec<String> = methods
                        .into_iter()
                        .filter(|m| m.rsplit('/').next() == Some(name))
                        .collect();
                    if !named.is_empty() {
                        hint = suggest(name, &named, "methods");
                    }
                }
            }
            return Err(Failure::error(format!(
                "{path:?} is not a method name: expected package.Service/Method{hint}"
            )));
        };
        if !self.fetch(service_name).await? {
            // A service's name without a method (`pkg.Service`, read as the method
            // `Service` of a service `pkg`): said so, with its methods.
            let whole = path.trim_start_matches('/').trim_start_matches('.');
            if !whole.contains('/') && matches!(self.fetch(whole).await, Ok(true)) {
                if let Some(service) = self.pool.get_service_by_name(whole) {
                    let methods: Vec<String> = service
                        .methods()
                        .map(|m| format!("{}/{}", service.full_name(), m.name()))
                        .collect();
                    return Err(Failure::error(format!(
                        "{whole} is a service, not a method: name one of its methods \
                         (package.Service/Method): {}",
                        methods.join(", ")
                    )));
                }
            }
            let services = self.services().await?;
            let hint = if services.iter().any(|s| s == service_name) {
                suggest(service_name, &services, "services")
            } else {
                suggest(path, &self.all_methods().await?, "methods")
            };
            return Err(Failure::error(format!(
                "no service {service_name:?} in {}{hint}",
                self.source_name()
            )));
        }
        let service = self
            .pool
            .get_service_by_name(service_name)
            .ok_or_else(|| Failure::error(format!("{service_name} is not a service")))?;
        if let Some(method) = service.methods().find(|m| m.name() == method_name) {
            return Ok(method);
        }
        let candidates: Vec<String> = service
            .methods()
            .map(|m| format!("{}/{}", service.full_name(), m.name()))
            .collect();
        Err(Failure::error(format!(
            "service {service_name} has no method {method_name:?}{}",
            suggest(path, &candidates, "methods")
        )))
    }

    /// Every method of every service, as `package.Service/Method` (reflection: of the
    /// first services listed, for suggestions).
    async fn all_methods(&mut self) -> Result<Vec<String>, Failure> {
        let services = self.services().await?;
        let mut methods = Vec::new();
        for name in services.iter().take(MAX_SERVICES_SEARCHED) {
            // Best effort, for suggestions: a service whose descriptors cannot be had
            // (an import the server does not give) is left out, not the error of a
            // name that was mistyped for another service.
            if !matches!(self.fetch(name).await, Ok(true)) {
                continue;
            }
            if let Some(service) = self.pool.get_service_by_name(name) {
                methods.extend(
                    service
                        .methods()
                        .map(|m| format!("{}/{}", service.full_name(), m.name())),
                );
            }
        }
        Ok(methods)
    }

    /// A service, method, message or enum by full name.
    pub async fn symbol(&mut self, name: &str) -> Result<Symbol, Failure> {
        let name = name.trim_start_matches('.');
        let dotted = name.replace('/', ".");
        if self.fetch(&dotted).await? {
            if let Some(symbol) = find_symbol(&self.pool, &dotted) {
                return Ok(symbol);
            }
        }
        // A field or an enum value, which reflection servers need not know as
        // symbols: through the message or enum they are in.
        if let Some((parent, _)) = dotted.rsplit_once('.') {
            if self.fetch(parent).await? {
                if let Some(symbol) = find_symbol(&self.pool, &dotted) {
                    return Ok(symbol);
                }
            }
        }
        // A method whose service the server knows but the symbol lookup missed.
        if let Some((service, _)) = split_method(name) {
            if self.fetch(service).await? {
                if let Ok(method) = self.method(name).await {
                    return Ok(Symbol::Method(method));
                }
            }
        }
        // The services' own files first (reflection fetches them as they are asked
        // for): their messages are the likely meaning of a short name, not the
        // well-known types every pool holds.
        let mut candidates = self.all_methods().await?;
        candidates.extend(self.services().await?);
        let well_known =
            |m: &str| m.starts_with("google.protobuf.") && !name.starts_with("google.");
        candidates.extend(
            self.pool
                .all_messages()
                .map(|m| m.full_name().to_owned())
                .filter(|m| !well_known(m)),
        );
        Err(Failure::error(format!(
            "{} knows no symbol {name:?}{}",
            self.source_name(),
            suggest(name, &candidates, "symbols")
        )))
    }
}

/// Splits `pkg.Service/Method` or `pkg.Service.Method`; gRPC's path form,
/// `/pkg.Service/Method` (as logs show it), is taken too.
pub fn split_method(path: &str) -> Option<(&str, &str)> {
    let path = path
        .strip_prefix('/')
        .unwrap_or(path)
        .trim_start_matches('.');
    let (service, method) = path.split_once('/').or_else(|| path.rsplit_once('.'))?;
    (!service.is_empty() && !method.is_empty() && !method.contains('/'))
        .then_some((service, method))
}

fn has_symbol(pool: &DescriptorPool, symbol: &str) -> bool {
    find_symbol(pool, symbol).is_some()
}

fn find_symbol(pool: &DescriptorPool, name: &str) -> Option<Symbol> {
    if let Some(service) = pool.get_service_by_name(name) {
        return Some(Symbol::Service(service));
    }
    if let Some(message) = pool.get_message_by_name(name) {
        return Some(Symbol::Message(message));
    }
    if let Some(enum_) = pool.get_enum_by_name(name) {
        return Some(Symbol::Enum(enum_));
    }
    let (parent, last) = name.rsplit_once('.')?;
    if let Some(service) = pool.get_service_by_name(parent) {
        return service
            .methods()
            .find(|m| m.name() == last)
            .map(Symbol::Method);
    }
    if let Some(message) = pool.get_message_by_name(parent) {
        return message.get_field_by_name(last).map(Symbol::Field);
    }
    pool.get_enum_by_name(parent)?
        .get_value_by_name(last)
        .map(Symbol::EnumValue)
}

/// Compiles `.proto` files with protox, with source info (for comments). Without
/// import paths, each file's directory is one.
fn compile_protos(
    protos: &[PathBuf],
    import_paths: &[PathBuf],
) -> Result<prost_types::FileDescriptorSet, Failure> {
    let mut includes: Vec<PathBuf> = import_paths.to_vec();
    if includes.is_empty() {
        for proto in protos {
            let dir = proto
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            if !includes.iter().any(|i| i == dir) {
                includes.push(dir.to_owned());
            }
        }
    }
    // A file is named as a path, or relative to an import path (as protoc's are).
    for proto in protos {
        if !proto.is_file() && !includes.iter().any(|dir| dir.join(proto).is_file()) {
            return Err(Failure::error(format!(
                "--proto {}: no such file (nor under an --import-path)",
                proto.display()
            )));
        }
    }
    // Read as the code generator reads them: editions files too, `import public`
    // chains of any length, errors at `file.proto:LINE:COL`.
    rpc_codegen::parse(protos, &includes).map_err(|err| {
        let what = if err.to_string().starts_with("include directory") {
            "--import-path"
        } else {
            "--proto"
        };
        Failure::error(format!("{what}: {err}"))
    })
}

/// " (did you mean: a, b?)" with the candidates closest to `name`, or the list of
/// what there is when none is close.
pub fn suggest(name: &str, candidates: &[String], what: &str) -> String {
    if candidates.iter().any(|c| c == name) {
        // Listed, yet not found: the server's reflection lists what it cannot define.
        return " (the server lists it, but its reflection gives no file that defines it)"
            .to_owned();
    }
    let lower = name.to_ascii_lowercase();
    let mut scored: Vec<(usize, &String)> = candidates
        .iter()
        .map(|c| {
            let c_lower = c.to_ascii_lowercase();
            // A name matching the end of a candidate (a method or service given
            // without its package) is as good as a typo of one letter.
            let distance =
                if c_lower.ends_with(&lower) || c_lower.ends_with(&lower.replace('.', "/")) {
                    1
                } else {
                    levenshtein(&lower, &c_lower)
                };
            (distance, c)
        })
        .collect();
    scored.sort();
    let limit = name.len() / 4 + 1;
    let close: Vec<&str> = scored
        .iter()
        .filter(|(d, _)| *d <= limit)
        .take(MAX_SUGGESTIONS)
        .map(|(_, c)| c.as_str())
        .collect();
    // The names may be a server's (reflection): escaped, one line.
    let printable = |names: Vec<&str>| -> Vec<String> {
        names
            .into_iter()
            .map(|n| crate::exit::printable(n).into_owned())
            .collect()
    };
    if !close.is_empty() {
        return format!(" (did you mean {}?)", printable(close).join(", "));
    }
    if candidates.is_empty() {
        return format!(" (there are no {what})");
    }
    let mut all: Vec<&str> = candidates.iter().map(String::as_str).take(20).collect();
    if candidates.len() > all.len() {
        all.push("...");
    }
    format!(" ({what}: {})", printable(all).join(", "))
}

/// The edit distance between two strings, by characters.
pub fn levenshtein(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let next = (row[j + 1] + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn method_names_split_both_ways() {
        assert_eq!(split_method("a.B/C"), Some(("a.B", "C")));
        assert_eq!(split_method("a.B.C"), Some(("a.B", "C")));
        assert_eq!(split_method(".a.B/C"), Some(("a.B", "C")));
        // gRPC's path form, as logs show it.
        assert_eq!(split_method("/a.B/C"), Some(("a.B", "C")));
        assert_eq!(split_method("C"), None);
        assert_eq!(split_method("a/b/c"), None);
    }

    #[test]
    fn suggestions_are_the_closest_names() {
        assert_eq!(levenshtein("kitten", "sitting"), 3);
        let methods: Vec<String> = ["p.Echo/Say", "p.Echo/Sleep", "p.Echo/Sum"]
            .map(String::from)
            .to_vec();
        assert_eq!(
            suggest("p.Echo/Sai", &methods, "methods"),
            " (did you mean p.Echo/Say, p.Echo/Sum?)"
        );
        assert_eq!(
            suggest("Echo/Sleep", &methods, "methods"),
            " (did you mean p.Echo/Sleep?)"
        );
        assert!(suggest("zzzzzzzzzzzzzz", &methods, "methods").starts_with(" (methods: p.Echo/Say"));
    }
}

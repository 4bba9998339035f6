//! Checks on the descriptor set that must fail the build before prost-build runs
//! (a `ServiceGenerator` cannot return errors).

use std::collections::{hash_map::Entry, HashMap};

use heck::{ToSnakeCase, ToUpperCamelCase};
use prost_types::{
    field_descriptor_proto::Type, DescriptorProto, EnumDescriptorProto, EnumValueDescriptorProto,
    FieldDescriptorProto, FileDescriptorProto, FileDescriptorSet, MethodDescriptorProto,
};

use crate::error::{Error, ErrorKind};

/// Which streaming kind a method is, as error messages and docs name it; `None` for
/// a unary method.
pub(crate) fn streaming_kind(
    client_streaming: bool,
    server_streaming: bool,
) -> Option<&'static str> {
    match (client_streaming, server_streaming) {
        (false, false) => None,
        (true, false) => Some("client-streaming"),
        (false, true) => Some("server-streaming"),
        (true, true) => Some("bidirectional-streaming"),
    }
}

fn is_streaming(method: &MethodDescriptorProto) -> bool {
    streaming_kind(method.client_streaming(), method.server_streaming()).is_some()
}

/// Whether `name` gives Rust identifiers in every case: `_` or `_1` do not (`1Client`).
fn has_rust_name(name: &str) -> bool {
    name.to_upper_camel_case()
        .starts_with(|c: char| c.is_alphabetic())
}

/// `file.proto:LINE:COL` of the element at `path` of `file` (see
/// `SourceCodeInfo.Location.path`), or the file's name if it has no source info.
/// Looked up in an index of the file's locations made at its first question (see
/// [`Positions`]): a scan per question made the checks quadratic in a file's types (a
/// file of 8,000 messages took 70 s, from a review).
fn position(file: &FileDescriptorProto, path: &[i32]) -> String {
    let Some(info) = file.source_code_info.as_ref() else {
        return file.name().to_owned();
    };
    let at = POSITIONS.with(|cache| {
        let mut cache = cache.borrow_mut();
        let key = info.location.as_ptr() as usize;
        let index = match &mut *cache {
            Some((cached, index)) if *cached == key => index,
            slot => {
                let mut index = HashMap::with_capacity(info.location.len());
                for location in &info.location {
                    if let [line, col, ..] = location.span[..] {
                        // The first location of a path, as a scan would find.
                        index.entry(location.path.clone()).or_insert((line, col));
                    }
                }
                &mut slot.insert((key, index)).1
            }
        };
        index.get(path).copied()
    });
    match at {
        Some((line, col)) => format!("{}:{}:{}", file.name(), line + 1, col + 1),
        None => file.name().to_owned(),
    }
}

/// The index of one file's locations, by path, and which file's (the address of its
/// locations): kept while [`check`] runs ([`Positions`]), dropped when it returns.
type PositionIndex = HashMap<Vec<i32>, (i32, i32)>;

std::thread_local! {
    static POSITIONS: std::cell::RefCell<Option<(usize, PositionIndex)>> =
        const { std::cell::RefCell::new(None) };
}

/// Clears the index of [`position`] when created and when dropped: an address is a
/// file's only while the set [`check`] reads is borrowed.
struct Positions;

impl Positions {
    fn scoped() -> Positions {
        POSITIONS.with(|cache| cache.borrow_mut().take());
        Positions
    }
}

impl Drop for Positions {
    fn drop(&mut self) {
        POSITIONS.with(|cache| cache.borrow_mut().take());
    }
}

/// `FileDescriptorProto.package`, `.message_type`, `.service`,
/// `ServiceDescriptorProto.method`.
const PACKAGE_FIELD: i32 = 2;
const MESSAGE_FIELD: i32 = 4;
const SERVICE_FIELD: i32 = 6;
const METHOD_FIELD: i32 = 2;
/// `FileDescriptorProto.enum_type`; `DescriptorProto.field`, `.nested_type`,
/// `.enum_type`; `EnumDescriptorProto.value`.
const FILE_ENUM_FIELD: i32 = 5;
const FIELD_FIELD: i32 = 2;
const NESTED_FIELD: i32 = 3;
const NESTED_ENUM_FIELD: i32 = 4;
const VALUE_FIELD: i32 = 2;
/// `DescriptorProto.oneof_decl`.
const ONEOF_FIELD: i32 = 8;

/// Fails on a service or method name that gives no Rust identifier, on two methods of
/// one service whose Rust names would be the same (among those generated: streaming
/// methods do not count when they are skipped), and on a module generated for a
/// service that another item of its package also generates.
pub(crate) fn check(
    fds: &FileDescriptorSet,
    skip_streaming_methods: bool,
    extern_paths: &[(String, String)],
) -> Result<(), Error> {
    let _positions = Positions::scoped();
    check_extern_paths(extern_paths)?;
    check_extern_prefixes(fds, extern_paths)?;
    for file in &fds.file {
        for (s, service) in (0..).zip(&file.service) {
            let full_name = if file.package().is_empty() {
                service.name().to_owned()
            } else {
                format!("{}.{}", file.package(), service.name())
            };
            if !has_rust_name(service.name()) {
                return Err(no_rust_name(
                    position(file, &[SERVICE_FIELD, s]),
                    &format!("service {full_name}"),
                ));
            }
            let mut rust_names = HashMap::new();
            let mut constants = HashMap::new();
            for (m, method) in (0..).zip(&service.method) {
                if skip_streaming_methods && is_streaming(method) {
                    continue;
                }
                if !has_rust_name(method.name()) {
                    return Err(no_rust_name(
                        position(file, &[SERVICE_FIELD, s, METHOD_FIELD, m]),
                        &format!("method {full_name}/{}", method.name()),
                    ));
                }
                if let Some(other) = rust_names.insert(method.name().to_snake_case(), method.name())
                {
                    return Err(Error::new(
                        ErrorKind::Generate,
                        format!(
                            "{}: methods {full_name}/{other} and {full_name}/{} would have the \
                             same Rust name (`{}`, before keywords are escaped)",
                            position(file, &[SERVICE_FIELD, s, METHOD_FIELD, m]),
                            method.name(),
                            method.name().to_snake_case()
                        ),
                    ));
                }
                let constant = crate::service::method_constant(method.name());
                if let Some(other) = constants.insert(constant.clone(), method.name()) {
                    return Err(Error::new(
                        ErrorKind::Generate,
                        format!(
                            "{}: methods {full_name}/{other} and {full_name}/{} would have the \
                             same descriptor constant (`{constant}`; `ALL` is the list of every \
                             method, so a method `All` becomes `ALL_METHOD`): rename one",
                            position(file, &[SERVICE_FIELD, s, METHOD_FIELD, m]),
                            method.name(),
                        ),
                    ));
                }
            }
        }
    }
    check_file_names(fds, extern_paths)?;
    check_underscore_names(fds, extern_paths)?;
    check_modules(fds, extern_paths)?;
    check_explicit_map_entries(fds)?;
    check_map_entries(fds)?;
    check_well_known(fds, extern_paths)?;
    check_types(fds, extern_paths)
}

/// Whether prost-build gives a message named `name` the same Rust name for its struct
/// (upper camel case) and for the module of its nested types (snake case): names
/// that start with a digit once leading underscores go (`_1`, `_1a`; prost-build
/// puts a `_` before both).
fn struct_is_module(name: &str) -> bool {
    name.to_upper_camel_case() == name.to_snake_case()
}

/// Fails on a message, enum, enum value, field or oneof whose name is only underscores
/// (`message _`, `int32 __ = 1`), which gives no Rust name (prost-build panicked on
/// it); on a message whose struct and module of nested types prost-build would give
/// one name (`message _1 { message Inner {} }`: see [`struct_is_module`]); and on a
/// package segment whose module a type of the parent package would be named as
/// (`package a._1` beside `message _1` in `package a`). Other names are safe: types
/// are upper camel case and modules snake case.
fn check_underscore_names(
    fds: &FileDescriptorSet,
    extern_paths: &[(String, String)],
) -> Result<(), Error> {
    let only_underscores = |name: &str| name.chars().all(|c| c == '_');
    let no_name = |file: &FileDescriptorProto, path: &[i32], item: String| {
        Error::new(
            ErrorKind::Generate,
            format!(
                "{}: {item} gives no Rust identifier: its name must have a letter or a digit",
                position(file, path)
            ),
        )
    };
    let check_enum =
        |file: &FileDescriptorProto, enumeration: &EnumDescriptorProto, path: &[i32]| {
            if only_underscores(enumeration.name()) {
                return Err(no_name(file, path, format!("enum {}", enumeration.name())));
            }
            for (v, value, variant) in variants(enumeration) {
                if variant.is_empty() {
                    let at = [path, &[VALUE_FIELD, v]].concat();
                    let item = format!("value {} of enum {}", value.name(), enumeration.name());
                    return Err(no_name(file, &at, item));
                }
            }
            Ok(())
        };
    // Messages to check, with their paths.
    let mut messages: Vec<(&FileDescriptorProto, &DescriptorProto, Vec<i32>)> = Vec::new();
    // Per package module: its types, by Rust name (heck's, without prost-build's `_`).
    let mut types_of: HashMap<String, HashMap<String, (String, String)>> = HashMap::new();
    for file in fds.file.iter().filter(|f| is_generated(f, extern_paths)) {
        let types = types_of.entry(module_of(file.package())).or_default();
        for (m, message) in (0..).zip(&file.message_type) {
            let path = vec![MESSAGE_FIELD, m];
            let item = format!("message {}", message.name());
            types.insert(type_name(message.name()), (position(file, &path), item));
            messages.push((file, message, path));
        }
        for (e, enumeration) in (0..).zip(&file.enum_type) {
            let path = [FILE_ENUM_FIELD, e];
            check_enum(file, enumeration, &path)?;
            let item = format!("enum {}", enumeration.name());
            types.insert(type_name(enumeration.name()), (position(file, &path), item));
        }
    }
    while let Some((file, message, path)) = messages.pop() {
        if only_underscores(message.name()) {
            return Err(no_name(file, &path, format!("message {}", message.name())));
        }
        if struct_is_module(message.name()) && has_nested_module(message) {
            return Err(Error::new(
                ErrorKind::Generate,
                format!(
                    "{}: message {} has nested types (or a oneof), and its struct and their \
                     module would both be the Rust name `_{}`: give it a name that starts \
                     with a letter",
                    position(file, &path),
                    message.name(),
                    type_name(message.name()),
                ),
            ));
        }
        for (f, field) in (0..).zip(&message.field) {
            if only_underscores(field.name()) {
                let at = [&path[..], &[FIELD_FIELD, f]].concat();
                let item = format!("field {} of message {}", field.name(), message.name());
                return Err(no_name(file, &at, item));
            }
        }
        for (o, oneof) in real_oneofs(message) {
            if only_underscores(oneof) {
                let at = [&path[..], &[ONEOF_FIELD, o]].concat();
                let item = format!("oneof {oneof} of message {}", message.name());
                return Err(no_name(file, &at, item));
            }
        }
        for (e, enumeration) in (0..).zip(&message.enum_type) {
            check_enum(
                file,
                enumeration,
                &[&path[..], &[NESTED_ENUM_FIELD, e]].concat(),
            )?;
        }
        for (n, nested) in (0..).zip(&message.nested_type) {
            messages.push((file, nested, [&path[..], &[NESTED_FIELD, n]].concat()));
        }
    }
    for file in fds.file.iter().filter(|f| is_generated(f, extern_paths)) {
        let segments: Vec<&str> = file.package().split('.').collect();
        for depth in 0..segments.len() {
            let module = segments[depth].to_snake_case();
            let parent = segments[..depth].join(".");
            let Some((other_position, other)) = types_of
                .get(&module_of(&parent))
                .and_then(|types| types.get(&module))
            else {
                continue;
            };
            return Err(Error::new(
                ErrorKind::Generate,
                format!(
                    "{}: package {} and {other} ({other_position}) would both be the Rust \
                     name `_{}` in one module: rename one",
                    position(file, &[PACKAGE_FIELD]),
                    segments[..=depth].join("."),
                    module,
                ),
            ));
        }
    }
    Ok(())
}

/// The `.proto` paths prost-build maps itself (to `prost_types` and, for `Empty` and
/// the wrappers, to Rust types): an `extern_path` for one of them is a duplicate.
const PROST_BUILD_EXTERN: &[&str] = &[
    ".google.protobuf",
    ".google.protobuf.BoolValue",
    ".google.protobuf.BytesValue",
    ".google.protobuf.DoubleValue",
    ".google.protobuf.Empty",
    ".google.protobuf.FloatValue",
    ".google.protobuf.Int32Value",
    ".google.protobuf.Int64Value",
    ".google.protobuf.StringValue",
    ".google.protobuf.UInt32Value",
    ".google.protobuf.UInt64Value",
];

/// Fails on an `extern_path` prost-build would refuse (its `.proto` path not fully
/// qualified, with an empty segment, given twice or one prost-build maps itself) or
/// whose Rust path is empty. prost-build finds these only while it writes the files,
/// and [`Builder::compile`](crate::Builder::compile) could not tell its error from a
/// failed write.
fn check_extern_paths(extern_paths: &[(String, String)]) -> Result<(), Error> {
    let refused = |proto: &str, rust: &str, why: &str| {
        Error::new(
            ErrorKind::Generate,
            format!("extern_path({proto:?}, {rust:?}): {why}"),
        )
    };
    for (i, (proto, rust)) in extern_paths.iter().enumerate() {
        if !proto.starts_with('.') {
            return Err(refused(
                proto,
                rust,
                "the .proto path must be fully qualified, starting with a dot (`.pkg.Type`)",
            ));
        }
        if proto.split('.').skip(1).any(str::is_empty) {
            return Err(refused(proto, rust, "the .proto path has an empty segment"));
        }
        if rust.trim().is_empty() {
            return Err(refused(proto, rust, "the Rust path is empty"));
        }
        if extern_paths[..i]
            .iter()
            .any(|(earlier, _)| earlier == proto)
        {
            return Err(refused(proto, rust, "the .proto path is given twice"));
        }
        if PROST_BUILD_EXTERN.contains(&proto.as_str()) {
            return Err(refused(
                proto,
                rust,
                "prost-build maps this path itself (to prost-types or a Rust type); map the \
                 types of google.protobuf one by one instead",
            ));
        }
    }
    Ok(())
}

/// Fails on an `extern_path` whose Rust path prost-build would rewrite: where the
/// `.proto` path is a package, or a message with nested types, prost-build builds the
/// paths of the types below it segment by segment and snake-cases every segment but a
/// leading `crate` (`self` becomes `self_`, `super` `super_`), and the generated code
/// then names a module that does not exist (found in review:
/// `extern_path(".vendored", "self::vendored")` failed to compile).
fn check_extern_prefixes(
    fds: &FileDescriptorSet,
    extern_paths: &[(String, String)],
) -> Result<(), Error> {
    for (proto, rust) in extern_paths {
        let below = format!("{proto}.");
        let is_prefix = fds.file.iter().any(|file| {
            let package = format!(".{}", file.package());
            let mut names = Vec::new();
            collect_type_names(&package, &file.message_type, &file.enum_type, &mut names);
            names.iter().any(|name| name.starts_with(&below))
        });
        if !is_prefix {
            continue;
        }
        // Other segments come out as they went in (a message's own name in snake
        // case is the module of its nested types, as prost-build wants it).
        let rewritten = rust
            .split("::")
            .find(|segment| matches!(*segment, "self" | "super" | "Self"));
        if let Some(segment) = rewritten {
            return Err(Error::new(
                ErrorKind::Generate,
                format!(
                    "extern_path({proto:?}, {rust:?}): {proto} has types below it, whose \
                     Rust paths prost-build builds from this one with every segment in \
                     snake case, `{segment}` becoming `{segment}_`: map it to a path \
                     from a crate (`::other_crate::pkg`, `crate::pkg`), or map each type \
                     on its own"
                ),
            ));
        }
    }
    Ok(())
}

/// The full names (`.pkg.Outer.Inner`) of `messages` and `enums` under `scope`, with
/// every nested type.
fn collect_type_names(
    scope: &str,
    messages: &[prost_types::DescriptorProto],
    enums: &[prost_types::EnumDescriptorProto],
    names: &mut Vec<String>,
) {
    let scope = scope.trim_end_matches('.');
    for e in enums {
        names.push(format!("{scope}.{}", e.name()));
    }
    for m in messages {
        let name = format!("{scope}.{}", m.name());
        collect_type_names(&name, &m.nested_type, &m.enum_type, names);
        names.push(name);
    }
}

/// The types of `google.protobuf` (and `google.protobuf.compiler`) that
/// `prost_types` has, which the well-known types map to (or, for `Empty` and the
/// wrappers, the Rust types prost-build maps them to). `descriptor.proto` has grown
/// since (editions: `FeatureSet`, `Edition`, ...).
const WELL_KNOWN: &[&str] = &[
    "Any",
    "Api",
    "BoolValue",
    "BytesValue",
    "DescriptorProto",
    "DescriptorProto.ExtensionRange",
    "DescriptorProto.ReservedRange",
    "DoubleValue",
    "Duration",
    "Empty",
    "Enum",
    "EnumDescriptorProto",
    "EnumDescriptorProto.EnumReservedRange",
    "EnumOptions",
    "EnumValue",
    "EnumValueDescriptorProto",
    "EnumValueOptions",
    "ExtensionRangeOptions",
    "Field",
    "Field.Cardinality",
    "Field.Kind",
    "FieldDescriptorProto",
    "FieldDescriptorProto.Label",
    "FieldDescriptorProto.Type",
    "FieldMask",
    "FieldOptions",
    "FieldOptions.CType",
    "FieldOptions.JSType",
    "FileDescriptorProto",
    "FileDescriptorSet",
    "FileOptions",
    "FileOptions.OptimizeMode",
    "FloatValue",
    "GeneratedCodeInfo",
    "GeneratedCodeInfo.Annotation",
    "Int32Value",
    "Int64Value",
    "ListValue",
    "MessageOptions",
    "Method",
    "MethodDescriptorProto",
    "MethodOptions",
    "MethodOptions.IdempotencyLevel",
    "Mixin",
    "NullValue",
    "OneofDescriptorProto",
    "OneofOptions",
    "Option",
    "ServiceDescriptorProto",
    "ServiceOptions",
    "SourceCodeInfo",
    "SourceCodeInfo.Location",
    "SourceContext",
    "StringValue",
    "Struct",
    "Syntax",
    "Timestamp",
    "Type",
    "UInt32Value",
    "UInt64Value",
    "UninterpretedOption",
    "UninterpretedOption.NamePart",
    "Value",
    "compiler.CodeGeneratorRequest",
    "compiler.CodeGeneratorResponse",
    "compiler.CodeGeneratorResponse.Feature",
    "compiler.CodeGeneratorResponse.File",
    "compiler.Version",
];

/// Fails on a field or method of generated code whose type is a `google.protobuf`
/// type that `prost_types` lacks (see [`WELL_KNOWN`]): the code would name a type that
/// does not exist (rustc: "cannot find type `FeatureSet`").
fn check_well_known(
    fds: &FileDescriptorSet,
    extern_paths: &[(String, String)],
) -> Result<(), Error> {
    let missing = |type_name: &str| {
        let Some(name) = type_name.strip_prefix(".google.protobuf.") else {
            return false;
        };
        let mapped = extern_paths.iter().any(|(proto, _)| {
            type_name == proto
                || type_name
                    .strip_prefix(proto.as_str())
                    .is_some_and(|rest| rest.starts_with('.'))
        });
        !mapped && !WELL_KNOWN.contains(&name)
    };
    let refused = |file: &FileDescriptorProto, path: &[i32], what: String, type_name: &str| {
        Error::new(
            ErrorKind::Generate,
            format!(
                "{}: {what} has the type {}, which prost-types (where the well-known types \
                 come from) does not have: use another type, or map google.protobuf types \
                 of your own with extern_path",
                position(file, path),
                type_name.trim_start_matches('.'),
            ),
        )
    };
    fn fields<'a>(
        message: &'a DescriptorProto,
        path: Vec<i32>,
        out: &mut Vec<(Vec<i32>, String, &'a str)>,
    ) {
        for (f, field) in (0..).zip(&message.field) {
            out.push((
                [&path[..], &[FIELD_FIELD, f]].concat(),
                format!("field {}.{}", message.name(), field.name()),
                field.type_name(),
            ));
        }
        for (n, nested) in (0..).zip(&message.nested_type) {
            fields(nested, [&path[..], &[NESTED_FIELD, n]].concat(), out);
        }
    }
    for file in fds.file.iter().filter(|f| is_generated(f, extern_paths)) {
        let mut uses = Vec::new();
        for (m, message) in (0..).zip(&file.message_type) {
            fields(message, vec![MESSAGE_FIELD, m], &mut uses);
        }
        for (s, service) in (0..).zip(&file.service) {
            for (m, method) in (0..).zip(&service.method) {
                let path = vec![SERVICE_FIELD, s, METHOD_FIELD, m];
                let what = format!("method {}/{}", service.name(), method.name());
                uses.push((path.clone(), what.clone(), method.input_type()));
                uses.push((path, what, method.output_type()));
            }
        }
        if let Some((path, what, type_name)) = uses.into_iter().find(|(_, _, t)| missing(t)) {
            return Err(refused(file, &path, what, type_name));
        }
    }
    Ok(())
}

/// Whether `file`'s package is generated here: not mapped with `extern_path`, nor the
/// well-known types (which are `prost_types`').
fn is_generated(file: &FileDescriptorProto, extern_paths: &[(String, String)]) -> bool {
    let package = format!(".{}", file.package());
    !std::iter::once(".google.protobuf")
        .chain(extern_paths.iter().map(|(proto, _)| proto.as_str()))
        .any(|prefix| {
            package == prefix
                || package
                    .strip_prefix(prefix)
                    .is_some_and(|rest| rest.starts_with('.'))
        })
}

/// Most bytes of a file name on the usual file systems (ext4, XFS, APFS, NTFS).
const MAX_FILE_NAME: usize = 255;

/// Fails on a package whose name is too long for the files its code goes in
/// (`pkg.sub.rs` and `pkg.sub.fds.bin`): the file system's error named neither the
/// package nor where it is declared.
fn check_file_names(
    fds: &FileDescriptorSet,
    extern_paths: &[(String, String)],
) -> Result<(), Error> {
    for file in fds
        .file
        .iter()
        .filter(|file| is_generated(file, extern_paths))
    {
        let name = crate::descriptor_file_name(file);
        if name.len() > MAX_FILE_NAME {
            return Err(Error::new(
                ErrorKind::Generate,
                format!(
                    "{}: package {} is too long for the names of the files its code goes in \
                     ({} bytes with `.fds.bin`; file systems allow {MAX_FILE_NAME}): shorten it",
                    position(file, &[PACKAGE_FIELD]),
                    file.package(),
                    name.len(),
                ),
            ));
        }
    }
    Ok(())
}

/// Fails on a message that sets `option map_entry = true` itself and is not shaped as
/// the entry protoc makes for a `map<K, V>` field (nested, with exactly the fields
/// `key = 1` and `value = 2`, nothing nested): protoc refuses the option set
/// explicitly, protox lets it through, and prost-build, which takes such a message for
/// a map's entry, panicked on one without those fields or generated no type for a
/// top-level one.
fn check_explicit_map_entries(fds: &FileDescriptorSet) -> Result<(), Error> {
    use prost_types::field_descriptor_proto::Label;
    fn walk(
        file: &FileDescriptorProto,
        messages: &[DescriptorProto],
        path: &[i32],
        fields: i32,
    ) -> Option<(String, String)> {
        for (m, message) in (0..).zip(messages) {
            let here = [path, &[fields, m]].concat();
            if message.options.as_ref().is_some_and(|o| o.map_entry()) {
                let entry_like = fields == NESTED_FIELD
                    && message.field.len() == 2
                    && message.field.iter().all(|f| {
                        matches!((f.number(), f.name()), (1, "key") | (2, "value"))
                            && f.label() == Label::Optional
                    })
                    && message.nested_type.is_empty()
                    && message.enum_type.is_empty()
                    && message.oneof_decl.is_empty();
                if !entry_like {
                    return Some((position(file, &here), message.name().to_owned()));
                }
            }
            if let Some(found) = walk(file, &message.nested_type, &here, NESTED_FIELD) {
                return Some(found);
            }
        }
        None
    }
    for file in &fds.file {
        if let Some((at, name)) = walk(file, &file.message_type, &[], MESSAGE_FIELD) {
            return Err(Error::new(
                ErrorKind::Generate,
                format!(
                    "{at}: message {name} sets option map_entry, which is not set \
                     explicitly (protoc refuses it): write a map<KeyType, ValueType> field \
                     instead"
                ),
            ));
        }
    }
    Ok(())
}

/// Fails on a map's entry message (`Outer.ValuesEntry` of `map<K, V> values`) named
/// as a type anywhere but by its own map field: as a method's input or output, or as
/// another field's type. protox accepts it (protoc refuses the field), but
/// prost-build generates no Rust type for an entry, so the code would not compile.
fn check_map_entries(fds: &FileDescriptorSet) -> Result<(), Error> {
    /// The entries of `messages` (in `prefix`) and of their nested messages, by full
    /// name, with their parent's full name.
    fn collect(messages: &[DescriptorProto], prefix: &str, entries: &mut HashMap<String, String>) {
        for message in messages {
            let full_name = format!("{prefix}.{}", message.name());
            if message.options.as_ref().is_some_and(|o| o.map_entry()) {
                entries.insert(full_name.clone(), prefix.to_owned());
            }
            collect(&message.nested_type, &full_name, entries);
        }
    }
    /// The first field of `messages` (nested too) whose type is an entry it is not
    /// the map field of: its position and its type.
    fn misused(
        file: &FileDescriptorProto,
        messages: &[DescriptorProto],
        path: &[i32],
        fields: i32,
        prefix: &str,
        entries: &HashMap<String, String>,
    ) -> Option<(String, String)> {
        for (m, message) in (0..).zip(messages) {
            let message_path = [path, &[fields, m]].concat();
            let full_name = format!("{prefix}.{}", message.name());
            for (f, field) in (0..).zip(&message.field) {
                let Some(parent) = entries.get(field.type_name()) else {
                    continue;
                };
                let repeated =
                    field.label() == prost_types::field_descriptor_proto::Label::Repeated;
                if *parent != full_name || !repeated {
                    let at = [&message_path[..], &[FIELD_FIELD, f]].concat();
                    return Some((position(file, &at), field.type_name().to_owned()));
                }
            }
            let nested = &message.nested_type;
            if let Some(found) = misused(
                file,
                nested,
                &message_path,
                NESTED_FIELD,
                &full_name,
                entries,
            ) {
                return Some(found);
            }
        }
        None
    }
    let prefix = |file: &FileDescriptorProto| match file.package() {
        "" => String::new(),
        package => format!(".{package}"),
    };
    let mut entries = HashMap::new();
    for file in &fds.file {
        collect(&file.message_type, &prefix(file), &mut entries);
    }
    if entries.is_empty() {
        return Ok(());
    }
    let entry_error = |at: String, what: &str, entry: &str| {
        Error::new(
            ErrorKind::Generate,
            format!(
                "{at}: {what} is {}, the entry of a map field, which has no type of its own \
                 (prost-build generates none): use a message of your own with the same \
                 fields",
                entry.trim_start_matches('.')
            ),
        )
    };
    for file in &fds.file {
        if let Some((at, entry)) = misused(
            file,
            &file.message_type,
            &[],
            MESSAGE_FIELD,
            &prefix(file),
            &entries,
        ) {
            return Err(entry_error(at, "the field's type", &entry));
        }
        for (s, service) in (0..).zip(&file.service) {
            for (m, method) in (0..).zip(&service.method) {
                for (what, type_name) in [
                    ("its input type", method.input_type()),
                    ("its output type", method.output_type()),
                ] {
                    if entries.contains_key(type_name) {
                        let at = position(file, &[SERVICE_FIELD, s, METHOD_FIELD, m]);
                        let what = format!("method {}/{}: {what}", service.name(), method.name());
                        return Err(entry_error(at, &what, type_name));
                    }
                }
            }
        }
    }
    Ok(())
}

/// The Rust name prost-build gives a message or an enum (upper camel case, `Self`
/// escaped as it cannot be a raw identifier).
fn type_name(name: &str) -> String {
    match name.to_upper_camel_case() {
        name if name == "Self" => "Self_".to_owned(),
        name => name,
    }
}

/// A Rust item of one scope (a package's module or a message's): its name, where it is
/// declared, and what it is.
type Scope = HashMap<String, (String, String)>;

/// Fails on two messages or enums whose Rust types would have the same name in one
/// module (`message FooBar` and `message Foo_Bar`; `enum Kind` and `message kind` in
/// one message), on two values of an enum that would give the same variant once
/// prost-build strips the enum's name from them (`COLOR_RED` and `RED` in `enum
/// Color`: prost-build panics on it), and on a proto2 default naming an alias value,
/// for which prost-build generates no variant. protoc accepts them (the enum values in
/// proto2 only, with a warning). Files of packages mapped with `extern_path` (and the
/// well-known types, which are `prost_types`') are not generated, so not checked.
fn check_types(fds: &FileDescriptorSet, extern_paths: &[(String, String)]) -> Result<(), Error> {
    let mut enums: HashMap<String, &EnumDescriptorProto> = HashMap::new();
    let mut packages: HashMap<String, Scope> = HashMap::new();
    let generated = |file: &&FileDescriptorProto| is_generated(file, extern_paths);
    for file in fds.file.iter().filter(generated) {
        let package = file.package();
        let prefix = if package.is_empty() {
            String::new()
        } else {
            format!(".{package}")
        };
        let scope = packages.entry(module_of(package)).or_default();
        let items = Items {
            messages: &file.message_type,
            enums: &file.enum_type,
            fields: (MESSAGE_FIELD, FILE_ENUM_FIELD),
        };
        check_scope(file, scope, items, &[], &prefix, &mut enums)?;
    }
    for file in fds.file.iter().filter(generated) {
        for (i, message) in (0..).zip(&file.message_type) {
            check_defaults(file, message, &[MESSAGE_FIELD, i], &enums)?;
        }
    }
    Ok(())
}

/// Adds `name` to `scope`, failing if another item has it already.
fn declare(
    scope: &mut Scope,
    name: &str,
    file: &FileDescriptorProto,
    path: &[i32],
    kind: &str,
    proto_name: &str,
) -> Result<(), Error> {
    let here = position(file, path);
    let item = format!("{kind} {proto_name}");
    match scope.entry(name.to_owned()) {
        Entry::Vacant(entry) => {
            entry.insert((here, item));
            Ok(())
        }
        Entry::Occupied(entry) => {
            let (other_position, other) = entry.get();
            Err(Error::new(
                ErrorKind::Generate,
                format!(
                    "{here}: {item} and {other} ({other_position}) would both be the Rust type \
                     `{name}` in one module: rename one"
                ),
            ))
        }
    }
}

/// The messages and enums of one scope (a file or a message), and the numbers of
/// their fields in it.
struct Items<'a> {
    messages: &'a [DescriptorProto],
    enums: &'a [EnumDescriptorProto],
    /// (messages, enums): `FileDescriptorProto`'s or `DescriptorProto`'s.
    fields: (i32, i32),
}

/// Declares `items` in `scope` (their Rust types), checks their enums' variants and
/// the scopes of their messages, nested in turn; `path` is the scope's and `prefix`
/// its protobuf name with a leading `.` (empty for the files without a package).
fn check_scope<'a>(
    file: &FileDescriptorProto,
    scope: &mut Scope,
    items: Items<'a>,
    path: &[i32],
    prefix: &str,
    enums: &mut HashMap<String, &'a EnumDescriptorProto>,
) -> Result<(), Error> {
    let (message_field, enum_field) = items.fields;
    for (i, message) in (0..).zip(items.messages) {
        if message.options.as_ref().is_some_and(|o| o.map_entry()) {
            continue; // a map's entry: no Rust type
        }
        let message_path = [path, &[message_field, i]].concat();
        let name = message.name();
        declare(
            scope,
            &type_name(name),
            file,
            &message_path,
            "message",
            name,
        )?;
        let nested = Items {
            messages: &message.nested_type,
            enums: &message.enum_type,
            fields: (NESTED_FIELD, NESTED_ENUM_FIELD),
        };
        let full_name = format!("{prefix}.{name}");
        let mut nested_scope = Scope::new();
        check_scope(
            file,
            &mut nested_scope,
            nested,
            &message_path,
            &full_name,
            enums,
        )?;
        check_members(file, message, &message_path, &mut nested_scope)?;
    }
    for (e, enumeration) in (0..).zip(items.enums) {
        let enum_path = [path, &[enum_field, e]].concat();
        let name = enumeration.name();
        declare(scope, &type_name(name), file, &enum_path, "enum", name)?;
        check_enum(file, enumeration, &enum_path)?;
        enums.insert(format!("{prefix}.{name}"), enumeration);
    }
    Ok(())
}

/// The Rust keywords prost-build escapes as raw identifiers in field names
/// (`type` → `r#type`; its `ident::to_snake`). `self`, `super`, `crate`, `Self` and
/// `extern` get a `_` suffix instead, which needs no care.
const RAW_KEYWORDS: &[&str] = &[
    "as", "break", "const", "continue", "else", "enum", "false", "fn", "for", "if", "impl", "in",
    "let", "loop", "match", "mod", "move", "mut", "pub", "ref", "return", "static", "struct",
    "trait", "true", "type", "unsafe", "use", "where", "while", "dyn", "abstract", "become", "box",
    "do", "final", "macro", "override", "priv", "typeof", "unsized", "virtual", "yield", "async",
    "await", "try", "gen",
];

/// Whether `field` of `message` is a `map<K, V>` whose values are an enum (its entry,
/// nested in `message`, has an enum `value`).
fn enum_valued_map(message: &DescriptorProto, field: &FieldDescriptorProto) -> bool {
    if field.r#type() != Type::Message {
        return false;
    }
    let Some(entry) = field.type_name().rsplit('.').next() else {
        return false;
    };
    message
        .nested_type
        .iter()
        .find(|n| n.name() == entry && n.options.as_ref().is_some_and(|o| o.map_entry()))
        .is_some_and(|entry| {
            entry
                .field
                .iter()
                .any(|f| f.number() == 2 && f.r#type() == Type::Enum)
        })
}

/// The oneofs prost-build makes enums of: not the synthetic ones of proto3 `optional`
/// fields (each holds one field marked `proto3_optional`).
fn real_oneofs(message: &DescriptorProto) -> impl Iterator<Item = (i32, &str)> {
    (0..).zip(&message.oneof_decl).filter_map(|(o, oneof)| {
        let synthetic = message
            .field
            .iter()
            .filter(|f| f.oneof_index == Some(o))
            .all(|f| f.proto3_optional());
        (!synthetic).then_some((o, oneof.name()))
    })
}

/// Fails on members of `message` whose Rust names would clash, which rustc would
/// refuse in the generated code: two fields of its struct (`Foo` and `foo`; a field
/// and a oneof, `kind` and `oneof Kind`), two accessors (an enum field `color` has
/// `color()` and `set_color()`, an optional field `set_color` has `set_color()`), two
/// oneof enums in the message's module (`oneof Choice` and `oneof choice`, or the
/// `KindOneOf` prost-build names the enum of `oneof kind` when the message has a type
/// `Kind`, beside a type `KindOneOf`), and two variants of one oneof (`Value` and
/// `value`). protoc accepts most of them (proto2 allows names differing in case).
fn check_members(
    file: &FileDescriptorProto,
    message: &DescriptorProto,
    path: &[i32],
    nested: &mut Scope,
) -> Result<(), Error> {
    let clash = |what: &str, name: &str, a: &str, b: &str, at: [i32; 2]| {
        Error::new(
            ErrorKind::Generate,
            format!(
                "{}: {b} and {a} of message {} would both be the Rust {what} `{name}`: rename one",
                position(file, &[path, &at].concat()),
                message.name()
            ),
        )
    };
    let fields = (0..)
        .zip(&message.field)
        .map(|(f, field)| (f, field.name()));
    let what = |name: &str| format!("field {name} of message {}", message.name());
    refuse_reserved(
        file,
        path,
        FIELD_FIELD,
        what,
        &message.reserved_name,
        fields,
    )?;
    let oneofs: Vec<(i32, &str)> = real_oneofs(message).collect();
    let in_real_oneof =
        |index: Option<i32>| index.is_some_and(|i| oneofs.iter().any(|(o, _)| *o == i));
    // The struct's fields: fields outside oneofs, and one per oneof.
    let mut fields: HashMap<String, String> = HashMap::new();
    // The accessors prost-build writes.
    let mut methods: HashMap<String, String> = HashMap::new();
    for (f, field) in (0..).zip(&message.field) {
        let proto = format!("field {}", field.name());
        if in_real_oneof(field.oneof_index) {
            continue;
        }
        let at = [FIELD_FIELD, f];
        let name = field.name().to_snake_case();
        if let Some(other) = fields.insert(name.clone(), proto.clone()) {
            return Err(clash("field", &name, &other, &proto, at));
        }
        use prost_types::field_descriptor_proto::Label;
        let repeated = field.label() == Label::Repeated;
        let optional = field.proto3_optional()
            || (file.syntax() != "proto3" && field.label() == Label::Optional);
        let mut accessors = Vec::new();
        if enum_valued_map(message, field) {
            // prost-derive adds `get_x()` and `insert_x()` to a map of enum values,
            // naming them from the field's escaped name: `r#type` makes `get_r#type`,
            // no identifier (the derive panics).
            if RAW_KEYWORDS.contains(&name.as_str()) {
                return Err(Error::new(
                    ErrorKind::Generate,
                    format!(
                        "{}: map field {} of message {} has enum values and a name that is \
                         a Rust keyword (`r#{name}`): prost-derive cannot name its \
                         accessors (`get_r#{name}`): rename the field",
                        position(file, &[path, &at].concat()),
                        field.name(),
                        message.name()
                    ),
                ));
            }
            accessors.push(format!("get_{name}"));
            accessors.push(format!("insert_{name}"));
        } else if field.r#type() == Type::Enum {
            accessors.push(name.clone());
            accessors.push(format!("{}_{name}", if repeated { "push" } else { "set" }));
        } else if optional && !matches!(field.r#type(), Type::Message | Type::Group) {
            accessors.push(name.clone());
        }
        for method in accessors {
            if let Some(other) = methods.insert(method.clone(), proto.clone()) {
                return Err(clash("method", &format!("{method}()"), &other, &proto, at));
            }
        }
    }
    for &(o, oneof) in &oneofs {
        let proto = format!("oneof {oneof}");
        let name = oneof.to_snake_case();
        if let Some(other) = fields.insert(name.clone(), proto.clone()) {
            return Err(clash("field", &name, &other, &proto, [ONEOF_FIELD, o]));
        }
        let mut variants: HashMap<String, String> = HashMap::new();
        for (f, field) in (0..).zip(&message.field) {
            if field.oneof_index != Some(o) {
                continue;
            }
            let variant = field.name().to_upper_camel_case();
            let field_proto = format!("field {}", field.name());
            if let Some(other) = variants.insert(variant.clone(), field_proto.clone()) {
                return Err(clash(
                    &format!("variant of {proto}'s enum"),
                    &variant,
                    &other,
                    &field_proto,
                    [FIELD_FIELD, f],
                ));
            }
        }
    }
    // The oneof enums, in the message's module with its nested types: prost-build adds
    // `OneOf` to a name one of its nested messages or enums has.
    let nested_names: Vec<String> = (message.nested_type.iter().map(|m| m.name()))
        .chain(message.enum_type.iter().map(|e| e.name()))
        .map(ToUpperCamelCase::to_upper_camel_case)
        .collect();
    for &(o, oneof) in &oneofs {
        let mut name = type_name(oneof);
        if nested_names.contains(&oneof.to_upper_camel_case()) {
            name.push_str("OneOf");
        }
        declare(
            nested,
            &name,
            file,
            &[path, &[ONEOF_FIELD, o]].concat(),
            "oneof",
            oneof,
        )?;
    }
    Ok(())
}

/// Two values of `enumeration` (aliases aside) whose variants would have one name.
fn check_enum(
    file: &FileDescriptorProto,
    enumeration: &EnumDescriptorProto,
    path: &[i32],
) -> Result<(), Error> {
    let values = (0..)
        .zip(&enumeration.value)
        .map(|(v, value)| (v, value.name()));
    let what = |name: &str| format!("value {name} of enum {}", enumeration.name());
    refuse_reserved(
        file,
        path,
        VALUE_FIELD,
        what,
        &enumeration.reserved_name,
        values,
    )?;
    let mut seen: HashMap<String, &str> = HashMap::new();
    for (v, value, variant) in variants(enumeration) {
        if let Some(other) = seen.insert(variant.clone(), value.name()) {
            return Err(Error::new(
                ErrorKind::Generate,
                format!(
                    "{}: values {other} and {} of enum {} would both be the Rust variant \
                     `{variant}` (prost-build strips the enum's name from its values): rename one",
                    position(file, &[path, &[VALUE_FIELD, v]].concat()),
                    value.name(),
                    enumeration.name(),
                ),
            ));
        }
    }
    Ok(())
}

/// Fails on a member (a field, an enum value: `(index, name)` in the element at `path`,
/// under `field` of it) whose name is in `reserved`, as protoc does and protox does not:
/// names are reserved so that a deleted field's JSON and text names are not reused
/// (from a review). `what` names the member of a name.
fn refuse_reserved<'a>(
    file: &FileDescriptorProto,
    path: &[i32],
    field: i32,
    what: impl Fn(&str) -> String,
    reserved: &[String],
    members: impl Iterator<Item = (i32, &'a str)>,
) -> Result<(), Error> {
    for (i, name) in members {
        if reserved.iter().any(|r| r == name) {
            return Err(Error::new(
                ErrorKind::Proto,
                format!(
                    "{}: {}: the name is reserved (`reserved \"{name}\";`)",
                    position(file, &[path, &[field, i]].concat()),
                    what(name),
                ),
            ));
        }
    }
    Ok(())
}

/// The values of `enumeration` prost-build makes variants of (an alias of an earlier
/// value's number gets none), with their indexes and variant names.
fn variants(
    enumeration: &EnumDescriptorProto,
) -> impl Iterator<Item = (i32, &EnumValueDescriptorProto, String)> {
    let prefix = type_name(enumeration.name());
    let mut numbers = std::collections::HashSet::new();
    (0..)
        .zip(&enumeration.value)
        .filter(move |(_, value)| numbers.insert(value.number()))
        .map(move |(v, value)| (v, value, variant_name(&prefix, value.name())))
}

/// prost-build's variant name for `value` of an enum whose name in upper camel case is
/// `prefix`: the value in upper camel case, without the prefix if what follows it
/// starts a word.
fn variant_name(prefix: &str, value: &str) -> String {
    let name = value.to_upper_camel_case();
    match name.strip_prefix(prefix) {
        Some(rest) if rest.starts_with(char::is_uppercase) => rest.to_owned(),
        _ => name,
    }
}

/// A field's default that names an enum value which is an alias of an earlier one and
/// whose variant name no generated variant has (prost-build writes the default as the
/// variant of the name given, and generates none for aliases).
fn check_defaults(
    file: &FileDescriptorProto,
    message: &DescriptorProto,
    path: &[i32],
    enums: &HashMap<String, &EnumDescriptorProto>,
) -> Result<(), Error> {
    for (f, field) in (0..).zip(&message.field) {
        if let (Some(default), Type::Float) = (field.default_value.as_deref(), field.r#type()) {
            // A finite value past f32's range: prost-derive parses it (as an f32) to
            // infinity and panics (protoc would have rounded it to `inf`). What rounds
            // to f32::MAX (C's FLT_MAX literal 3.40282347e+38, a little above the
            // exact value) is fine.
            let past = default.parse::<f32>().is_ok_and(f32::is_infinite)
                && default.parse::<f64>().is_ok_and(f64::is_finite);
            if past {
                return Err(Error::new(
                    ErrorKind::Generate,
                    format!(
                        "{}: the default of float field {} is {default}, past the largest \
                         float (about 3.4e38): write inf (or -inf), or a value in range",
                        position(file, &[path, &[FIELD_FIELD, f]].concat()),
                        field.name(),
                    ),
                ));
            }
        }
        let (Some(default), Type::Enum) = (field.default_value.as_deref(), field.r#type()) else {
            continue;
        };
        let Some(enumeration) = enums.get(field.type_name()) else {
            continue;
        };
        let Some(at) = enumeration.value.iter().position(|v| v.name() == default) else {
            continue;
        };
        let number = enumeration.value[at].number();
        let Some(first) = enumeration.value[..at]
            .iter()
            .find(|v| v.number() == number)
        else {
            continue; // not an alias
        };
        let wanted = variant_name(&type_name(enumeration.name()), default);
        if !variants(enumeration).any(|(_, _, variant)| variant == wanted) {
            return Err(Error::new(
                ErrorKind::Generate,
                format!(
                    "{}: the default of field {} is {default}, an alias of {} in enum {}: \
                     prost-build generates no variant for an alias; give {} as the default",
                    position(file, &[path, &[FIELD_FIELD, f]].concat()),
                    field.name(),
                    first.name(),
                    enumeration.name(),
                    first.name(),
                ),
            ));
        }
    }
    for (j, nested) in (0..).zip(&message.nested_type) {
        check_defaults(file, nested, &[path, &[NESTED_FIELD, j]].concat(), enums)?;
    }
    Ok(())
}

fn no_rust_name(position: String, item: &str) -> Error {
    Error::new(
        ErrorKind::Generate,
        format!(
            "{position}: {item} gives no Rust identifier: after leading underscores its \
             name must start with a letter"
        ),
    )
}

/// Whether prost-build writes a module of nested types for `message` (named after it
/// in snake case): for nested messages (not the entries of map fields, which are
/// `HashMap`s), enums and oneofs (not proto3 `optional`'s).
fn has_nested_module(message: &DescriptorProto) -> bool {
    let real_oneof = message
        .field
        .iter()
        .any(|field| field.oneof_index.is_some() && !field.proto3_optional());
    let nested_message = message.nested_type.iter().any(|nested| {
        !nested
            .options
            .as_ref()
            .is_some_and(|options| options.map_entry())
    });
    nested_message || !message.enum_type.is_empty() || real_oneof
}

/// The Rust module of `package`, as the modules of [`check_modules`] are named (each
/// segment in snake case, keywords not escaped), joined by `.`: packages that differ
/// only in case (`a.FooBar`, `a.foo_bar`) are one module, as prost-build writes them.
fn module_of(package: &str) -> String {
    package
        .split('.')
        .filter(|segment| !segment.is_empty())
        .map(ToSnakeCase::to_snake_case)
        .collect::<Vec<_>>()
        .join(".")
}

/// Fails when two items of one package's module would generate the same module: the
/// `foo_methods`, `foo_client` and `foo_server` modules of services whose names only
/// differ in case (`FooBar`, `foo_bar`), or such a module and the nested-type module
/// of a message (`message FooClient { message Inner {} }` and `service Foo`), also
/// from two packages that differ only in case (`a.B` and `a.b` are both `a::b`).
/// Fails too when such a module has the name of a package's module, which the include
/// file nests in its parent package's (`message Sub { enum Kind {} }` in `package a`
/// and `package a.sub`), and on a package segment that gives no module name
/// (`package a._`). Packages whose code is not generated (the well-known types, those
/// of `extern_path`) have no module: `message Protobuf { enum Kind {} }` in
/// `package google` is fine beside an import of `google.protobuf`'s types.
fn check_modules(fds: &FileDescriptorSet, extern_paths: &[(String, String)]) -> Result<(), Error> {
    // Per package module (see `module_of`): module name to (position, what generates
    // it, its package).
    let mut packages: HashMap<String, HashMap<String, (String, String, &str)>> = HashMap::new();
    for file in &fds.file {
        if let Some(segment) = file
            .package()
            .split('.')
            .filter(|segment| !segment.is_empty())
            .find(|segment| segment.to_snake_case().is_empty())
        {
            return Err(Error::new(
                ErrorKind::Generate,
                format!(
                    "{}: package {} gives no Rust module for its segment `{segment}`: \
                     after leading underscores a segment must start with a letter or digit",
                    position(file, &[PACKAGE_FIELD]),
                    file.package(),
                ),
            ));
        }
        let modules = packages.entry(module_of(file.package())).or_default();
        // prost-build writes no messages of a package it does not generate (the
        // well-known types, `extern_path`s): their modules do not exist.
        let generated = is_generated(file, extern_paths);
        let message_modules = (0..)
            .zip(&file.message_type)
            .filter(|(_, message)| generated && has_nested_module(message))
            .map(|(i, message)| {
                let module = message.name().to_snake_case();
                let item = format!("message {}", message.name());
                (module, (position(file, &[MESSAGE_FIELD, i]), item))
            });
        let service_modules = (0..).zip(&file.service).flat_map(|(s, service)| {
            let snake = service.name().to_snake_case();
            let item = format!("service {}", service.name());
            let position = position(file, &[SERVICE_FIELD, s]);
            ["methods", "client", "server"].map(|suffix| {
                (
                    format!("{snake}_{suffix}"),
                    (position.clone(), item.clone()),
                )
            })
        });
        for (module, (position, item)) in message_modules.chain(service_modules) {
            match modules.entry(module) {
                Entry::Vacant(entry) => {
                    entry.insert((position, item, file.package()));
                }
                Entry::Occupied(entry) => {
                    let (other_position, other, other_package) = entry.get();
                    let package = file.package();
                    let message = if *other_package == package {
                        format!(
                            "{position}: {item} and {other} ({other_position}) of package \
                             `{package}` would both generate the Rust module `{}`",
                            entry.key()
                        )
                    } else {
                        format!(
                            "{position}: {item} of package `{package}` and {other} \
                             ({other_position}) of package `{other_package}` would both \
                             generate the Rust module `{}` (packages that differ only in \
                             case are one Rust module)",
                            entry.key()
                        )
                    };
                    return Err(Error::new(ErrorKind::Generate, message));
                }
            }
        }
    }
    // The package modules the include file has: those of packages with code (a package
    // that is not generated has none, unless services of it are).
    let has_code =
        |file: &&FileDescriptorProto| is_generated(file, extern_paths) || !file.service.is_empty();
    for file in fds.file.iter().filter(has_code) {
        let segments: Vec<&str> = file.package().split('.').collect();
        // From depth 0: a package's first segment is a module next to those of the
        // files without a package.
        for depth in 0..segments.len() {
            let parent = segments[..depth].join(".");
            let module = segments[depth].to_snake_case();
            let Some((other_position, other, _)) = packages
                .get(&module_of(&parent))
                .and_then(|modules| modules.get(&module))
            else {
                continue;
            };
            let parent = if parent.is_empty() {
                "the files without a package".to_owned()
            } else {
                format!("package `{parent}`")
            };
            return Err(Error::new(
                ErrorKind::Generate,
                format!(
                    "{}: package {} and {other} ({other_position}) of {parent} would both \
                     generate the Rust module `{}`",
                    position(file, &[PACKAGE_FIELD]),
                    segments[..=depth].join("."),
                    segments[..=depth]
                        .iter()
                        .map(|segment| segment.to_snake_case())
                        .collect::<Vec<_>>()
                        .join("::"),
                ),
            ));
        }
    }
    Ok(())
}

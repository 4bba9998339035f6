//! Checks on the descriptor set that must fail the build before prost-build runs
//! (a `ServiceGenerator` cannot return errors).

use std::collections::{hash_map::Entry, HashMap};

use heck::{ToSnakeCase, ToUpperCamelCase};
use prost_types::{
    field_descriptor_proto::Type, DescriptorProto, EnumDescriptorProto, EnumValueDescriptorProto,
    FileDescriptorProto, FileDescriptorSet, MethodDescriptorProto,
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
fn position(file: &FileDescriptorProto, path: &[i32]) -> String {
    let location = file
        .source_code_info
        .as_ref()
        .and_then(|info| info.location.iter().find(|location| location.path == path));
    match location.map(|location| &location.span[..]) {
        Some([line, col, ..]) => format!("{}:{}:{}", file.name(), line + 1, col + 1),
        _ => file.name().to_owned(),
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

/// Fails on a service or method name that gives no Rust identifier, on two methods of
/// one service whose Rust names would be the same (among those generated: streaming
/// methods do not count when they are skipped), and on a module generated for a
/// service that another item of its package also generates.
pub(crate) fn check(
    fds: &FileDescriptorSet,
    skip_streaming_methods: bool,
    extern_paths: &[(String, String)],
) -> Result<(), Error> {
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
    check_modules(fds)?;
    check_map_entries(fds)?;
    check_types(fds, extern_paths)
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
        check_scope(
            file,
            &mut Scope::new(),
            nested,
            &message_path,
            &full_name,
            enums,
        )?;
    }
    for (e, enumeration) in (0..).zip(items.enums) {
        let enum_path = [path, &[enum_field, e]].concat();
        let name = enumeration.name();
        declare(scope, &type_name(name), file, &enum_path, "enum", name)?;
        check_enum(file, enumeration, &enum_path)?;
        enums.insert(format!("{prefix}.{name}"), enumeration);
    }
    // Oneofs need no check: prost-build names a oneof's enum `KindOneOf` when the
    // message has a type `Kind`.
    Ok(())
}

/// Two values of `enumeration` (aliases aside) whose variants would have one name.
fn check_enum(
    file: &FileDescriptorProto,
    enumeration: &EnumDescriptorProto,
    path: &[i32],
) -> Result<(), Error> {
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
/// (`package a._`).
fn check_modules(fds: &FileDescriptorSet) -> Result<(), Error> {
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
        let message_modules = (0..)
            .zip(&file.message_type)
            .filter(|(_, message)| has_nested_module(message))
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
    for file in &fds.file {
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

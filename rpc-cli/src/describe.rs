//! `rpc list` and `rpc describe`: services, methods, messages and enums printed as
//! `.proto` text, with the comments the descriptors carry (source info: reflection of
//! this framework's servers, and `--proto` files).

use std::{cell::RefCell, collections::HashMap, fmt::Write as _};

use prost_reflect::{
    EnumDescriptor, FieldDescriptor, FileDescriptor, Kind, MessageDescriptor, MethodDescriptor,
    ServiceDescriptor, Value,
};
use prost_types::{
    field_descriptor_proto::{Label, Type},
    source_code_info::Location,
    FileDescriptorProto, SourceCodeInfo,
};

use crate::{
    cli::{DescribeArgs, ListArgs},
    exit::Failure,
    json::kind_name,
    metadata,
    schema::{Schemas, Symbol},
    target,
};

/// Runs `rpc list`: the services, one per line; or with a service, its methods as
/// `package.Service/Method`.
pub async fn list(args: ListArgs) -> Result<(), Failure> {
    let mut schemas = open(&args.conn, &args.schema).await?;
    let listed = list_with(&args, &mut schemas).await;
    schemas.finish().await;
    listed
}

async fn list_with(args: &ListArgs, schemas: &mut Schemas) -> Result<(), Failure> {
    let lines = match &args.service {
        None => schemas.services().await?,
        Some(name) => {
            let service = schemas.service(name).await?;
            service
                .methods()
                .map(|m| format!("{}/{}", service.full_name(), m.name()))
                .collect()
        }
    };
    // Names from reflection are a server's words: one line each, whatever they hold.
    let text: String = lines
        .iter()
        .map(|line| format!("{}\n", crate::exit::printable(line)))
        .collect();
    crate::exit::write_stdout(text.as_bytes())
}

/// Runs `rpc describe`.
pub async fn describe(args: DescribeArgs) -> Result<(), Failure> {
    let mut schemas = open(&args.conn, &args.schema).await?;
    let described = describe_with(&args, &mut schemas).await;
    schemas.finish().await;
    described
}

async fn describe_with(args: &DescribeArgs, schemas: &mut Schemas) -> Result<(), Failure> {
    let Some(symbol) = &args.symbol else {
        // No symbol: every service the server lists (grpcurl's `describe`).
        let mut text = String::new();
        for name in schemas.services().await? {
            if let Symbol::Service(service) = schemas.symbol(&name).await? {
                if !text.is_empty() {
                    text.push('\n');
                }
                text.push_str(&service_text(&service));
            }
        }
        return crate::exit::write_stdout(crate::exit::printable_lines(&text).as_bytes());
    };
    let text = match schemas.symbol(symbol).await? {
        Symbol::Service(service) => service_text(&service),
        Symbol::Method(method) => method_text(&method, ""),
        Symbol::Message(message) => message_text(&message, ""),
        Symbol::Enum(enum_) => enum_text(&enum_, ""),
        Symbol::Field(field) => {
            let message = field.parent_message();
            format!(
                "// a field of {}\n{}",
                message.full_name(),
                field_line(&field, "")
            )
        }
        Symbol::EnumValue(value) => {
            let enum_ = value.parent_enum();
            let file = enum_.parent_file();
            format!(
                "// a value of {}\n{}{} = {};\n",
                enum_.full_name(),
                comments(&file, value.path(), ""),
                value.name(),
                value.number()
            )
        }
    };
    // Comments and names from reflection are a server's words: no terminal controls.
    crate::exit::write_stdout(crate::exit::printable_lines(&text).as_bytes())
}

async fn open(
    conn: &crate::cli::ConnArgs,
    schema: &crate::cli::SchemaArgs,
) -> Result<Schemas, Failure> {
    let request_metadata = metadata::parse_headers(&conn.headers, &conn.uri)?;
    // From files, nothing is asked of the server: no connection (grpcurl's
    // `-proto x.proto list` works offline too).
    if Schemas::from_files(schema) {
        return Schemas::files(schema, &conn.uri);
    }
    let target = target::connect(conn).await?;
    Schemas::open(
        schema,
        &target,
        &conn.uri,
        request_metadata,
        conn.lookup_timeout(),
    )
}

/// The source location of the element at `path` (the first, as protoc writes one per
/// element), through an index of `proto`'s locations built once per file: a search of
/// them per element made describing a message of 80,000 fields take half a minute.
fn location_of<'a>(
    proto: &FileDescriptorProto,
    info: &'a SourceCodeInfo,
    path: &[i32],
) -> Option<&'a Location> {
    thread_local! {
        /// The file last indexed (its address) and its locations' indices by path.
        static INDEX: RefCell<(usize, HashMap<Vec<i32>, usize>)> = RefCell::default();
    }
    let key = std::ptr::from_ref(proto) as usize;
    let found = INDEX.with(|index| {
        let mut index = index.borrow_mut();
        if index.0 != key {
            let mut by_path = HashMap::with_capacity(info.location.len());
            for (i, location) in info.location.iter().enumerate() {
                by_path.entry(location.path.clone()).or_insert(i);
            }
            *index = (key, by_path);
        }
        index.1.get(path).copied()
    });
    // The address may be another file's by now (one freed, another made there, which
    // a command's pool, kept to its end, does not do): a location found is checked,
    // and searched for if it is not the one.
    let location = info.location.get(found?)?;
    if location.path == path {
        Some(location)
    } else {
        info.location.iter().find(|l| l.path == path)
    }
}

/// The comments of the element at `path` in `file`, as `// ` lines indented by
/// `indent` (leading comments, then trailing ones).
fn comments(file: &FileDescriptor, path: &[i32], indent: &str) -> String {
    let proto = file.file_descriptor_proto();
    let Some(info) = &proto.source_code_info else {
        return String::new();
    };
    let Some(location) = location_of(proto, info, path) else {
        return String::new();
    };
    let mut out = String::new();
    for text in [&location.leading_comments, &location.trailing_comments]
        .into_iter()
        .flatten()
    {
        for line in text.trim_end().lines() {
            let line = line.strip_prefix(' ').unwrap_or(line).trim_end();
            if line.is_empty() {
                let _ = writeln!(out, "{indent}//");
            } else {
                let _ = writeln!(out, "{indent}// {line}");
            }
        }
    }
    out
}

/// A service as `.proto` text.
pub fn service_text(service: &ServiceDescriptor) -> String {
    let file = service.parent_file();
    let mut out = format!("// {} (package {})\n", file.name(), file.package_name());
    out.push_str(&comments(&file, service.path(), ""));
    let _ = writeln!(out, "service {} {{", service.name());
    let service_options = service.service_descriptor_proto().options.as_ref();
    if service_options.and_then(|o| o.deprecated) == Some(true) {
        out.push_str("  option deprecated = true;\n\n");
    }
    for (i, method) in service.methods().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out.push_str(&method_text(&method, "  "));
    }
    out.push_str("}\n");
    out
}

/// A method as a `.proto` `rpc` line (with its options), indented by `indent`.
pub fn method_text(method: &MethodDescriptor, indent: &str) -> String {
    let file = method.parent_file();
    let mut out = comments(&file, method.path(), indent);
    let stream = |yes: bool| if yes { "stream " } else { "" };
    let _ = write!(
        out,
        "{indent}rpc {}({}.{}) returns ({}.{})",
        method.name(),
        stream(method.is_client_streaming()),
        method.input().full_name(),
        stream(method.is_server_streaming()),
        method.output().full_name(),
    );
    let level = method
        .options()
        .get_field_by_name("idempotency_level")
        .and_then(|v| match v.as_ref() {
            Value::EnumNumber(1) => Some("NO_SIDE_EFFECTS"),
            Value::EnumNumber(2) => Some("IDEMPOTENT"),
            _ => None,
        });
    let mut options = Vec::new();
    if method
        .method_descriptor_proto()
        .options
        .as_ref()
        .and_then(|o| o.deprecated)
        == Some(true)
    {
        options.push("deprecated = true".to_owned());
    }
    if let Some(level) = level {
        options.push(format!("idempotency_level = {level}"));
    }
    if options.is_empty() {
        out.push_str(";\n");
    } else {
        out.push_str(" {\n");
        for option in options {
            let _ = writeln!(out, "{indent}  option {option};");
        }
        let _ = writeln!(out, "{indent}}}");
    }
    out
}

/// A field's type as written in a `.proto` of the message's package: the label, and
/// names relative where the package allows.
fn field_type(field: &FieldDescriptor) -> String {
    let name = |kind: &Kind| match kind {
        Kind::Message(_) | Kind::Enum(_) => format!(".{}", kind_name(kind)),
        _ => kind_name(kind),
    };
    if field.is_map() {
        if let Kind::Message(entry) = field.kind() {
            return format!(
                "map<{}, {}>",
                name(&entry.map_entry_key_field().kind()),
                name(&entry.map_entry_value_field().kind())
            );
        }
    }
    let base = name(&field.kind());
    let proto = field.field_descriptor_proto();
    if field.is_list() {
        format!("repeated {base}")
    } else if proto.proto3_optional() {
        format!("optional {base}")
    } else if is_proto2(&field.parent_file()) && field.containing_oneof().is_none() {
        // proto2 says every field's label; a oneof's fields have none.
        match proto.label() {
            Label::Required => format!("required {base}"),
            _ => format!("optional {base}"),
        }
    } else {
        base
    }
}

/// Whether the file is proto2 (the descriptor's `syntax` is empty or `proto2`), whose
/// fields carry labels and may have defaults.
fn is_proto2(file: &FileDescriptor) -> bool {
    matches!(file.file_descriptor_proto().syntax(), "" | "proto2")
}

fn field_line(field: &FieldDescriptor, indent: &str) -> String {
    let file = field.parent_file();
    let mut out = comments(&file, field.path(), indent);
    let proto = field.field_descriptor_proto();
    let mut options = Vec::new();
    if let Some(default) = &proto.default_value {
        options.push(format!("default = {}", default_text(field, default)));
    }
    if field.json_name() != default_json_name(field.name()) {
        options.push(format!("json_name = \"{}\"", field.json_name()));
    }
    if let Some(packed) = proto.options.as_ref().and_then(|o| o.packed) {
        options.push(format!("packed = {packed}"));
    }
    if proto.options.as_ref().and_then(|o| o.deprecated) == Some(true) {
        options.push("deprecated = true".to_owned());
    }
    let options = if options.is_empty() {
        String::new()
    } else {
        format!(" [{}]", options.join(", "))
    };
    // A proto2 group: the field of a nested message type, sent with the group
    // encoding; shown as that field, and said so.
    let group = if proto.r#type() == Type::Group {
        " // a group"
    } else {
        ""
    };
    let _ = writeln!(
        out,
        "{indent}{} {} = {}{options};{group}",
        field_type(field),
        field.name(),
        field.number()
    );
    out
}

/// A proto2 default as `.proto` text: strings quoted (the descriptor holds them
/// unescaped; bytes come C-escaped already), the rest as the descriptor has them.
fn default_text(field: &FieldDescriptor, default: &str) -> String {
    match field.kind() {
        Kind::String => format!("\"{}\"", proto_escape(default)),
        Kind::Bytes => format!("\"{default}\""),
        _ => default.to_owned(),
    }
}

/// `text` as the inside of a `.proto` string literal: backslashes, quotes and control
/// characters escaped (octal), the rest (UTF-8 included) as it is.
fn proto_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                let _ = write!(out, "\\{:03o}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

/// The `reserved` numbers and names, and the `extensions` ranges, of a message or an
/// enum, as `.proto` lines. `ranges` are `(start, end)` with `end` exclusive
/// (`inclusive_end`: inclusive, as enums' are).
fn reserved_lines(
    out: &mut String,
    indent: &str,
    keyword: &str,
    ranges: impl Iterator<Item = (i32, i32)>,
    inclusive_end: bool,
    max: i32,
) {
    let ranges: Vec<String> = ranges
        .map(|(start, end)| {
            let last = if inclusive_end {
                end
            } else {
                end.saturating_sub(1)
            };
            match last {
                _ if last == start => start.to_string(),
                _ if last >= max => format!("{start} to max"),
                _ => format!("{start} to {last}"),
            }
        })
        .collect();
    if !ranges.is_empty() {
        let _ = writeln!(out, "{indent}{keyword} {};", ranges.join(", "));
    }
}

fn reserved_names(out: &mut String, indent: &str, names: &[String]) {
    if !names.is_empty() {
        let quoted: Vec<String> = names.iter().map(|n| format!("\"{n}\"")).collect();
        let _ = writeln!(out, "{indent}reserved {};", quoted.join(", "));
    }
}

/// The largest field number (2^29 - 1).
const MAX_FIELD_NUMBER: i32 = (1 << 29) - 1;

/// protoc's default JSON name: lowerCamelCase of the field name.
fn default_json_name(name: &str) -> String {
    let mut out = String::new();
    let mut upper = false;
    for c in name.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// A message as `.proto` text (nested messages and enums included), indented by
/// `indent`.
pub fn message_text(message: &MessageDescriptor, indent: &str) -> String {
    let file = message.parent_file();
    let mut out = comments(&file, message.path(), indent);
    let _ = writeln!(out, "{indent}message {} {{", message.name());
    let inner = format!("{indent}  ");
    let proto = message.descriptor_proto();
    if proto.options.as_ref().and_then(|o| o.deprecated) == Some(true) {
        let _ = writeln!(out, "{inner}option deprecated = true;");
    }
    let mut in_oneof: Option<String> = None;
    // In the order the .proto declares them (prost-reflect's `fields()` goes by number).
    let fields = proto
        .field
        .iter()
        .filter_map(|field| message.get_field(field.number() as u32));
    for field in fields {
        let oneof = field.containing_oneof().filter(|o| !o.is_synthetic());
        match (&in_oneof, &oneof) {
            (Some(open), Some(o)) if open == o.name() => {}
            (open, o) => {
                if open.is_some() {
                    let _ = writeln!(out, "{inner}}}");
                    in_oneof = None;
                }
                if let Some(o) = o {
                    out.push_str(&comments(&file, o.path(), &inner));
                    let _ = writeln!(out, "{inner}oneof {} {{", o.name());
                    in_oneof = Some(o.name().to_owned());
                }
            }
        }
        let field_indent = if in_oneof.is_some() {
            format!("{inner}  ")
        } else {
            inner.clone()
        };
        out.push_str(&field_line(&field, &field_indent));
    }
    if in_oneof.is_some() {
        let _ = writeln!(out, "{inner}}}");
    }
    reserved_lines(
        &mut out,
        &inner,
        "reserved",
        proto.reserved_range.iter().map(|r| (r.start(), r.end())),
        false,
        MAX_FIELD_NUMBER,
    );
    reserved_names(&mut out, &inner, &proto.reserved_name);
    reserved_lines(
        &mut out,
        &inner,
        "extensions",
        proto.extension_range.iter().map(|r| (r.start(), r.end())),
        false,
        MAX_FIELD_NUMBER,
    );
    for child in message.child_messages().filter(|m| !m.is_map_entry()) {
        out.push_str(&message_text(&child, &inner));
    }
    for child in message.child_enums() {
        out.push_str(&enum_text(&child, &inner));
    }
    let _ = writeln!(out, "{indent}}}");
    out
}

/// An enum as `.proto` text, indented by `indent`.
pub fn enum_text(enum_: &EnumDescriptor, indent: &str) -> String {
    let file = enum_.parent_file();
    let mut out = comments(&file, enum_.path(), indent);
    let _ = writeln!(out, "{indent}enum {} {{", enum_.name());
    let inner = format!("{indent}  ");
    let proto = enum_.enum_descriptor_proto();
    let enum_options = proto.options.as_ref();
    if enum_options.and_then(|o| o.allow_alias) == Some(true) {
        let _ = writeln!(out, "{inner}option allow_alias = true;");
    }
    if enum_options.and_then(|o| o.deprecated) == Some(true) {
        let _ = writeln!(out, "{inner}option deprecated = true;");
    }
    // In the order the .proto declares them (prost-reflect's `values()` goes by number,
    // which put an alias before the name it aliases).
    let values = proto
        .value
        .iter()
        .filter_map(|value| enum_.get_value_by_name(value.name()));
    for value in values {
        out.push_str(&comments(&file, value.path(), &inner));
        let deprecated = value
            .enum_value_descriptor_proto()
            .options
            .as_ref()
            .and_then(|o| o.deprecated)
            == Some(true);
        let options = if deprecated {
            " [deprecated = true]"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "{inner}{} = {}{options};",
            value.name(),
            value.number()
        );
    }
    reserved_lines(
        &mut out,
        &inner,
        "reserved",
        proto.reserved_range.iter().map(|r| (r.start(), r.end())),
        true,
        i32::MAX,
    );
    reserved_names(&mut out, &inner, &proto.reserved_name);
    let _ = writeln!(out, "{indent}}}");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proto2_labels_defaults_options_and_reserved_are_shown() {
        use protox::file::{File, FileResolver};

        const SOURCE: &str = r#"
syntax = "proto2";
package legacy;

message Order {
  option deprecated = true;
  required int64 id = 1;
  optional string note = 2 [default = "say \"hi\" café"];
  repeated int32 codes = 3 [packed = true];
  optional Kind kind = 4 [default = BIG, deprecated = true];
  optional group Extra = 5 { optional int32 weight = 6; }
  oneof pick { int32 a = 7; string b = 8; }
  reserved 10, 12 to 14, 20 to max;
  reserved "old", "older";
  extensions 100 to 199;
}

enum Kind {
  option allow_alias = true;
  SMALL = 0;
  BIG = 1;
  LARGE = 1 [deprecated = true];
  reserved 5 to 7;
  reserved "HUGE";
}

message Late {
  optional int32 z = 9;
  optional int32 a = 1;
}

enum Step {
  option allow_alias = true;
  UNKNOWN = 0;
  DONE = 3;
  STARTED = 1;
  FINISHED = 3;
  BEGUN = 1;
}

service Orders {
  option deprecated = true;
  rpc Get(Order) returns (Order) { option deprecated = true; }
}
"#;
        struct One;
        impl FileResolver for One {
            fn open_file(&self, name: &str) -> Result<File, protox::Error> {
                match name {
                    "legacy.proto" => File::from_source(name, SOURCE),
                    _ => Err(protox::Error::file_not_found(name)),
                }
            }
        }
        let mut compiler = protox::Compiler::with_file_resolver(One);
        compiler.open_file("legacy.proto").unwrap();
        let pool =
            prost_reflect::DescriptorPool::from_file_descriptor_set(compiler.file_descriptor_set())
                .unwrap();

        let order = message_text(&pool.get_message_by_name("legacy.Order").unwrap(), "");
        for line in [
            "  option deprecated = true;",
            "  required int64 id = 1;",
            r#"  optional string note = 2 [default = "say \"hi\" café"];"#,
            "  repeated int32 codes = 3 [packed = true];",
            "  optional .legacy.Kind kind = 4 [default = BIG, deprecated = true];",
            "  optional .legacy.Order.Extra extra = 5; // a group",
            "    int32 a = 7;",
            "  reserved 10, 12 to 14, 20 to max;",
            r#"  reserved "old", "older";"#,
            "  extensions 100 to 199;",
            "    optional int32 weight = 6;",
        ] {
            assert!(order.lines().any(|l| l == line), "{line:?} in\n{order}");
        }
        let kind = enum_text(&pool.get_enum_by_name("legacy.Kind").unwrap(), "");
        for line in [
            "  option allow_alias = true;",
            "  LARGE = 1 [deprecated = true];",
            "  reserved 5 to 7;",
            r#"  reserved "HUGE";"#,
        ] {
            assert!(kind.lines().any(|l| l == line), "{line:?} in\n{kind}");
        }
        // Declaration order, not number order (an alias came before its name).
        let late = message_text(&pool.get_message_by_name("legacy.Late").unwrap(), "");
        assert!(
            late.find("z = 9").unwrap() < late.find("a = 1").unwrap(),
            "{late}"
        );
        let step = enum_text(&pool.get_enum_by_name("legacy.Step").unwrap(), "");
        let names: Vec<&str> = step
            .lines()
            .filter_map(|l| l.trim().split_once(" = "))
            .map(|(name, _)| name)
            .filter(|name| !name.starts_with("option"))
            .collect();
        assert_eq!(
            names,
            ["UNKNOWN", "DONE", "STARTED", "FINISHED", "BEGUN"],
            "{step}"
        );
        let service = service_text(&pool.get_service_by_name("legacy.Orders").unwrap());
        assert!(service.contains("  option deprecated = true;"), "{service}");
        assert!(
            service.contains("returns (.legacy.Order) {\n    option deprecated = true;\n  }"),
            "{service}"
        );
    }

    #[test]
    fn default_json_names_are_lower_camel_case() {
        assert_eq!(default_json_name("delay_ms"), "delayMs");
        assert_eq!(default_json_name("message"), "message");
        assert_eq!(default_json_name("a_b_c"), "aBC");
    }
}

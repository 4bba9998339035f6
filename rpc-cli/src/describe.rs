//! `rpc list` and `rpc describe`: services, methods, messages and enums printed as
//! `.proto` text, with the comments the descriptors carry (source info: reflection of
//! this framework's servers, and `--proto` files).

use std::fmt::Write as _;

use prost_reflect::{
    EnumDescriptor, FieldDescriptor, FileDescriptor, Kind, MessageDescriptor, MethodDescriptor,
    ServiceDescriptor, Value,
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
    let text: String = lines.iter().map(|line| format!("{line}\n")).collect();
    crate::exit::write_stdout(text.as_bytes())
}

/// Runs `rpc describe`.
pub async fn describe(args: DescribeArgs) -> Result<(), Failure> {
    let mut schemas = open(&args.conn, &args.schema).await?;
    let text = match schemas.symbol(&args.symbol).await? {
        Symbol::Service(service) => service_text(&service),
        Symbol::Method(method) => method_text(&method, ""),
        Symbol::Message(message) => message_text(&message, ""),
        Symbol::Enum(enum_) => enum_text(&enum_, ""),
    };
    crate::exit::write_stdout(text.as_bytes())
}

async fn open(
    conn: &crate::cli::ConnArgs,
    schema: &crate::cli::SchemaArgs,
) -> Result<Schemas, Failure> {
    let request_metadata = metadata::parse_headers(&conn.headers)?;
    let target = target::connect(conn).await?;
    Schemas::open(
        schema,
        &target,
        &conn.uri,
        request_metadata,
        conn.lookup_timeout(),
    )
}

/// The comments of the element at `path` in `file`, as `// ` lines indented by
/// `indent` (leading comments, then trailing ones).
fn comments(file: &FileDescriptor, path: &[i32], indent: &str) -> String {
    let Some(info) = &file.file_descriptor_proto().source_code_info else {
        return String::new();
    };
    let Some(location) = info.location.iter().find(|l| l.path == path) else {
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
    match level {
        Some(level) => {
            let _ = writeln!(
                out,
                " {{\n{indent}  option idempotency_level = {level};\n{indent}}}"
            );
        }
        None => out.push_str(";\n"),
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
    let proto3_optional = field.field_descriptor_proto().proto3_optional();
    if field.is_list() {
        format!("repeated {base}")
    } else if proto3_optional {
        format!("optional {base}")
    } else {
        base
    }
}

fn field_line(field: &FieldDescriptor, indent: &str) -> String {
    let file = field.parent_file();
    let mut out = comments(&file, field.path(), indent);
    let json = if field.json_name() != default_json_name(field.name()) {
        format!(" [json_name = \"{}\"]", field.json_name())
    } else {
        String::new()
    };
    let _ = writeln!(
        out,
        "{indent}{} {} = {}{json};",
        field_type(field),
        field.name(),
        field.number()
    );
    out
}

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
    let mut in_oneof: Option<String> = None;
    for field in message.fields() {
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
    for value in enum_.values() {
        out.push_str(&comments(&file, value.path(), &format!("{indent}  ")));
        let _ = writeln!(out, "{indent}  {} = {};", value.name(), value.number());
    }
    let _ = writeln!(out, "{indent}}}");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_json_names_are_lower_camel_case() {
        assert_eq!(default_json_name("delay_ms"), "delayMs");
        assert_eq!(default_json_name("message"), "message");
        assert_eq!(default_json_name("a_b_c"), "aBC");
    }
}

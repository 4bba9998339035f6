//! The proto3 JSON mapping of dynamic messages, both ways (prost-reflect's, well-known
//! types included): output names in lowerCamelCase (or as in the `.proto`), input
//! accepting both; and errors that say where a value does not fit and what the field
//! expects.

use std::{fmt, io::Read};

use prost_reflect::{
    DeserializeOptions, DynamicMessage, FieldDescriptor, Kind, MessageDescriptor, SerializeOptions,
};
use serde_path_to_error::Segment;

/// How messages are printed.
#[derive(Debug, Clone, Copy, Default)]
pub struct PrintOptions {
    /// Print fields with their default value too.
    pub emit_defaults: bool,
    /// Field names as in the `.proto` instead of lowerCamelCase.
    pub proto_names: bool,
    /// Indented over several lines instead of one line.
    pub pretty: bool,
}

/// A message as proto3 JSON.
pub fn to_json(message: &DynamicMessage, options: PrintOptions) -> String {
    let serialize_options = SerializeOptions::new()
        .skip_default_fields(!options.emit_defaults)
        .use_proto_field_name(options.proto_names);
    let mut out = Vec::new();
    let result = if options.pretty {
        let mut serializer = serde_json::Serializer::pretty(&mut out);
        message.serialize_with_options(&mut serializer, &serialize_options)
    } else {
        let mut serializer = serde_json::Serializer::new(&mut out);
        message.serialize_with_options(&mut serializer, &serialize_options)
    };
    match result {
        Ok(()) => String::from_utf8(out).unwrap_or_default(),
        // Only a value JSON cannot hold fails (none in proto3): print the text format.
        Err(err) => format!("{{\"error\": {:?}}}", format!("{err}: {message:?}")),
    }
}

/// A JSON value that does not fit a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonError {
    /// The message type.
    pub message: String,
    /// Where in the value: `a.b[2]`, or empty for the value itself.
    pub path: String,
    /// What the field there is, e.g. `int32`, `repeated string`, `map<string, Foo>`.
    pub expected: Option<String>,
    /// What is wrong.
    pub reason: String,
}

impl fmt::Display for JsonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "JSON does not match {}", self.message)?;
        if !self.path.is_empty() {
            write!(f, " at `{}`", self.path)?;
        }
        if let Some(expected) = &self.expected {
            write!(f, " (a field of type {expected})")?;
        }
        write!(f, ": {}", self.reason)
    }
}

impl std::error::Error for JsonError {}

/// A message from a JSON value (field names in lowerCamelCase or as in the `.proto`;
/// unknown fields are refused).
pub fn from_value(
    descriptor: &MessageDescriptor,
    value: serde_json::Value,
) -> Result<DynamicMessage, JsonError> {
    let options = DeserializeOptions::new();
    let mut track = serde_path_to_error::Track::new();
    let deserializer = serde_path_to_error::Deserializer::new(value, &mut track);
    match DynamicMessage::deserialize_with_options(descriptor.clone(), deserializer, &options) {
        Ok(message) => Ok(message),
        Err(err) => {
            let path = track.path();
            Err(JsonError {
                message: descriptor.full_name().to_owned(),
                path: path_text(&path),
                expected: field_at(descriptor, &path).map(|f| type_name(&f)),
                reason: err.to_string(),
            })
        }
    }
}

/// A message from JSON text holding exactly one value.
pub fn from_str(descriptor: &MessageDescriptor, text: &str) -> Result<DynamicMessage, JsonError> {
    let value: serde_json::Value = serde_json::from_str(text).map_err(|err| JsonError {
        message: descriptor.full_name().to_owned(),
        path: String::new(),
        expected: None,
        reason: format!("not JSON: {err}"),
    })?;
    from_value(descriptor, value)
}

/// The JSON values of a reader, one after the other (JSON lines, or values separated
/// by any whitespace), each as soon as it is complete.
pub fn values<R: Read>(reader: R) -> impl Iterator<Item = Result<serde_json::Value, String>> {
    serde_json::Deserializer::from_reader(reader)
        .into_iter::<serde_json::Value>()
        .map(|value| value.map_err(|err| format!("not JSON: {err}")))
}

/// The path as `a.b[2]`.
fn path_text(path: &serde_path_to_error::Path) -> String {
    let mut out = String::new();
    for segment in path.iter() {
        match segment {
            Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            Segment::Map { key } => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            Segment::Enum { variant } => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(variant);
            }
            Segment::Unknown => out.push_str(".?"),
        }
    }
    out
}

/// The field a path ends at, walking the descriptors (map values and list elements
/// included); `None` if the path leaves the schema (an unknown field).
fn field_at(
    descriptor: &MessageDescriptor,
    path: &serde_path_to_error::Path,
) -> Option<FieldDescriptor> {
    let mut message = descriptor.clone();
    let mut field: Option<FieldDescriptor> = None;
    // Inside a map field, the next key is a map key, not a field name.
    let mut in_map = false;
    for segment in path.iter() {
        match segment {
            Segment::Map { key } => {
                if in_map {
                    in_map = false;
                    let value = field.as_ref()?.kind();
                    let entry = value.as_message()?.map_entry_value_field();
                    if let Kind::Message(m) = entry.kind() {
                        message = m;
                    }
                    field = Some(entry);
                    continue;
                }
                let next = message
                    .get_field_by_json_name(key)
                    .or_else(|| message.get_field_by_name(key))?;
                if next.is_map() {
                    in_map = true;
                } else if let Kind::Message(m) = next.kind() {
                    message = m;
                }
                field = Some(next);
            }
            Segment::Seq { .. } => {}
            Segment::Enum { .. } | Segment::Unknown => return None,
        }
    }
    field
}

/// How a field's type reads in a `.proto`: `int32`, `repeated string`,
/// `map<string, pkg.Foo>`, `pkg.Bar`.
pub fn type_name(field: &FieldDescriptor) -> String {
    if field.is_map() {
        if let Kind::Message(entry) = field.kind() {
            return format!(
                "map<{}, {}>",
                kind_name(&entry.map_entry_key_field().kind()),
                kind_name(&entry.map_entry_value_field().kind())
            );
        }
    }
    let name = kind_name(&field.kind());
    if field.is_list() {
        format!("repeated {name}")
    } else {
        name
    }
}

/// A scalar's name, or a message's or enum's full name.
pub fn kind_name(kind: &Kind) -> String {
    match kind {
        Kind::Double => "double".into(),
        Kind::Float => "float".into(),
        Kind::Int32 => "int32".into(),
        Kind::Int64 => "int64".into(),
        Kind::Uint32 => "uint32".into(),
        Kind::Uint64 => "uint64".into(),
        Kind::Sint32 => "sint32".into(),
        Kind::Sint64 => "sint64".into(),
        Kind::Fixed32 => "fixed32".into(),
        Kind::Fixed64 => "fixed64".into(),
        Kind::Sfixed32 => "sfixed32".into(),
        Kind::Sfixed64 => "sfixed64".into(),
        Kind::Bool => "bool".into(),
        Kind::String => "string".into(),
        Kind::Bytes => "bytes".into(),
        Kind::Message(m) => m.full_name().into(),
        Kind::Enum(e) => e.full_name().into(),
    }
}

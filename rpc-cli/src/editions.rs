//! Editions files (`edition = "2023"`, `"2024"`) from a server's reflection or a
//! `--protoset`, read as the proto2 files that mean the same on the wire and in JSON:
//! prost-reflect links `proto2` and `proto3` files only (an `editions` file made it
//! panic: a review found `rpc` crash on any such server). `--proto` files are rewritten
//! before they are compiled instead (`rpc_codegen::parse`).
//!
//! prost-types' descriptors drop the features (`edition` and the `features` options are
//! newer than they are), so they are read off the encoding: the file's, each message's
//! and each field's `FeatureSet`, the nearer one winning. What the wire and the JSON
//! mapping depend on is kept: `LEGACY_REQUIRED` fields become `required`, repeated
//! scalars are packed unless `EXPANDED`, and `DELIMITED` message fields are groups.
//! Explicit presence, edition 2023's default, is proto2's; an `IMPLICIT` field becomes
//! explicit, which changes nothing a peer sees (a peer that leaves such a field out is
//! read the same; one given as 0 in JSON is sent as 0 instead of left out). Which
//! enums are closed is kept beside the pool ([`is_closed`]): open unless `CLOSED`.

use prost::encoding::{decode_key, decode_varint, WireType};
use prost_types::{
    field_descriptor_proto::{Label, Type},
    DescriptorProto, FieldDescriptorProto, FieldOptions, FileDescriptorProto,
};

/// `FeatureSet` values this reads (0: not set here).
#[derive(Clone, Copy, Default)]
struct Features {
    /// `field_presence`: 1 EXPLICIT, 2 IMPLICIT, 3 LEGACY_REQUIRED.
    presence: u64,
    /// `repeated_field_encoding`: 1 PACKED, 2 EXPANDED.
    repeated: u64,
    /// `message_encoding`: 1 LENGTH_PREFIXED, 2 DELIMITED.
    message: u64,
    /// `enum_type`: 1 OPEN, 2 CLOSED.
    enum_type: u64,
}

impl Features {
    /// `self` with what `nearer` sets.
    fn with(self, nearer: Features) -> Features {
        let pick = |near: u64, far: u64| if near != 0 { near } else { far };
        Features {
            presence: pick(nearer.presence, self.presence),
            repeated: pick(nearer.repeated, self.repeated),
            message: pick(nearer.message, self.message),
            enum_type: pick(nearer.enum_type, self.enum_type),
        }
    }
}

const LEGACY_REQUIRED: u64 = 3;
const EXPANDED: u64 = 2;
const DELIMITED: u64 = 2;
const CLOSED: u64 = 2;

/// Checks `file`'s syntax, and turns an editions file into its proto2 equivalent,
/// reading its features from `raw`, its encoding. The reason, when it cannot be read.
pub(crate) fn normalize(file: &mut FileDescriptorProto, raw: &[u8]) -> Result<(), String> {
    match file.syntax.as_deref() {
        None | Some("" | "proto2" | "proto3") => return Ok(()),
        Some("editions") => {}
        Some(other) => {
            return Err(format!(
                "{} has syntax {:?}: proto2, proto3 and editions are read",
                crate::exit::printable(file.name()),
                crate::exit::printable(other)
            ))
        }
    }
    let name = crate::exit::printable(file.name()).into_owned();
    let bad = || format!("{name}: its encoding does not decode");
    let mut edition = 0;
    let mut features = Features::default();
    let (mut messages, mut extensions, mut enums) = (Vec::new(), Vec::new(), Vec::new());
    fields_of(raw, |tag, value| {
        match (tag, value) {
            (14, Value::Varint(v)) => edition = v,
            (8, Value::Bytes(options)) => features = features.with(options_features(options, 50)?),
            (4, Value::Bytes(message)) => messages.push(message),
            (5, Value::Bytes(enum_)) => enums.push(enum_),
            (7, Value::Bytes(field)) => extensions.push(field),
            _ => {}
        }
        Some(())
    })
    .ok_or_else(bad)?;
    // EDITION_2023 and EDITION_2024.
    if !matches!(edition, 1000 | 1001) {
        return Err(format!(
            "{name} is of edition {edition}: editions 2023 and 2024 are read"
        ));
    }
    if messages.len() != file.message_type.len()
        || extensions.len() != file.extension.len()
        || enums.len() != file.enum_type.len()
    {
        return Err(bad());
    }
    let mut walk = Walk {
        scope: match file.package() {
            "" => String::new(),
            package => format!("{package}."),
        },
        closed: std::collections::HashSet::new(),
    };
    for (enum_, raw) in file.enum_type.iter().zip(enums) {
        walk.enum_(enum_.name(), raw, features).ok_or_else(bad)?;
    }
    for (message, raw) in file.message_type.iter_mut().zip(messages) {
        walk.message(message, raw, features).ok_or_else(bad)?;
    }
    for (field, raw) in file.extension.iter_mut().zip(extensions) {
        normalize_field(field, raw, features, false).ok_or_else(bad)?;
    }
    read_from_editions()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(file.name().to_owned(), walk.closed);
    file.syntax = Some("proto2".to_owned());
    Ok(())
}

/// The files read from editions, by name, with their closed enums (full names).
type Editions = std::collections::HashMap<String, std::collections::HashSet<String>>;

fn read_from_editions() -> &'static std::sync::Mutex<Editions> {
    static FILES: std::sync::OnceLock<std::sync::Mutex<Editions>> = std::sync::OnceLock::new();
    FILES.get_or_init(Default::default)
}

/// Whether `enum_` is closed: a number it does not define is not a value of a field
/// of its type (a peer keeps it among the unknown fields). A proto2 file's are, an
/// editions file's when `enum_type = CLOSED` (the file reads as proto2 here).
pub(crate) fn is_closed(enum_: &prost_reflect::EnumDescriptor) -> bool {
    let file = enum_.parent_file();
    if let Some(closed) = read_from_editions()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(file.name())
    {
        return closed.contains(enum_.full_name());
    }
    file.syntax() == prost_reflect::Syntax::Proto2
}

/// A walk through an editions file's messages and enums: the scope of the names met
/// (`package.Message.`), and the closed enums found (enums are open unless their
/// features say CLOSED, where proto2's are closed).
struct Walk {
    scope: String,
    closed: std::collections::HashSet<String>,
}

impl Walk {
    /// Notes enum `name` (its encoding `raw`) as closed if its features (over
    /// `outer`) say so.
    fn enum_(&mut self, name: &str, raw: &[u8], outer: Features) -> Option<()> {
        if own_features(raw, 3, 7, outer)?.enum_type == CLOSED {
            self.closed.insert(format!("{}{name}", self.scope));
        }
        Some(())
    }

    /// Turns `message` (its encoding `raw`) and what it nests into proto2's terms,
    /// noting its closed enums.
    fn message(
        &mut self,
        message: &mut DescriptorProto,
        raw: &[u8],
        outer: Features,
    ) -> Option<()> {
        let mut features = outer;
        let (mut fields, mut nested, mut enums, mut extensions) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        fields_of(raw, |tag, value| {
            match (tag, value) {
                (7, Value::Bytes(options)) => {
                    features = features.with(options_features(options, 12)?)
                }
                (2, Value::Bytes(field)) => fields.push(field),
                (3, Value::Bytes(message)) => nested.push(message),
                (4, Value::Bytes(enum_)) => enums.push(enum_),
                (6, Value::Bytes(field)) => extensions.push(field),
                _ => {}
            }
            Some(())
        })?;
        if fields.len() != message.field.len()
            || nested.len() != message.nested_type.len()
            || enums.len() != message.enum_type.len()
            || extensions.len() != message.extension.len()
        {
            return None;
        }
        // A map's entries are length-prefixed whatever the features say.
        let entries: Vec<String> = message
            .nested_type
            .iter()
            .filter(|m| m.options.as_ref().is_some_and(|o| o.map_entry()))
            .map(|m| m.name().to_owned())
            .collect();
        for (field, raw) in message.field.iter_mut().zip(fields) {
            let is_map = field.label() == Label::Repeated
                && entries
                    .iter()
                    .any(|entry| field.type_name().rsplit('.').next() == Some(entry.as_str()));
            normalize_field(field, raw, features, is_map)?;
        }
        for (field, raw) in message.extension.iter_mut().zip(extensions) {
            normalize_field(field, raw, features, false)?;
        }
        let outer_scope = std::mem::take(&mut self.scope);
        self.scope = format!("{outer_scope}{}.", message.name());
        for (enum_, raw) in message.enum_type.iter().zip(enums) {
            self.enum_(enum_.name(), raw, features)?;
        }
        for (inner, raw) in message.nested_type.iter_mut().zip(nested) {
            self.message(inner, raw, features)?;
        }
        self.scope = outer_scope;
        Some(())
    }
}

/// An element's features: `outer`, with what its options (at field `options_tag` of
/// its encoding `raw`) set in their `FeatureSet` (at `features_tag`).
fn own_features(
    raw: &[u8],
    options_tag: u32,
    features_tag: u32,
    outer: Features,
) -> Option<Features> {
    let mut features = outer;
    fields_of(raw, |tag, value| {
        if let (true, Value::Bytes(options)) = (tag == options_tag, value) {
            features = features.with(options_features(options, features_tag)?);
        }
        Some(())
    })?;
    Some(features)
}

fn normalize_field(
    field: &mut FieldDescriptorProto,
    raw: &[u8],
    outer: Features,
    is_map: bool,
) -> Option<()> {
    let features = own_features(raw, 8, 21, outer)?;
    let repeated = field.label() == Label::Repeated;
    if !repeated && features.presence == LEGACY_REQUIRED {
        field.set_label(Label::Required);
    }
    if field.r#type() == Type::Message && features.message == DELIMITED && !is_map {
        field.set_type(Type::Group);
    }
    let packable = !matches!(
        field.r#type(),
        Type::String | Type::Bytes | Type::Message | Type::Group
    );
    if repeated && packable {
        field
            .options
            .get_or_insert_with(FieldOptions::default)
            .packed = Some(features.repeated != EXPANDED);
    }
    Some(())
}

/// The `FeatureSet` in the options message `options` (at field `tag` of it).
fn options_features(options: &[u8], tag: u32) -> Option<Features> {
    let mut features = Features::default();
    fields_of(options, |t, value| {
        if let (true, Value::Bytes(set)) = (t == tag, value) {
            fields_of(set, |t, value| {
                if let Value::Varint(v) = value {
                    match t {
                        1 => features.presence = v,
                        2 => features.enum_type = v,
                        3 => features.repeated = v,
                        5 => features.message = v,
                        _ => {}
                    }
                }
                Some(())
            })?;
        }
        Some(())
    })?;
    Some(features)
}

/// A field's value on the wire, as [`fields_of`] hands it out.
pub(crate) enum Value<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Other,
}

/// Calls `each` with every field of the encoded message `bytes`; `None` if it is
/// malformed (groups included: descriptors have none).
pub(crate) fn fields_of<'a>(
    mut bytes: &'a [u8],
    mut each: impl FnMut(u32, Value<'a>) -> Option<()>,
) -> Option<()> {
    while !bytes.is_empty() {
        let (tag, wire_type) = decode_key(&mut bytes).ok()?;
        let value = match wire_type {
            WireType::Varint => Value::Varint(decode_varint(&mut bytes).ok()?),
            WireType::SixtyFourBit => {
                bytes = bytes.get(8..)?;
                Value::Other
            }
            WireType::ThirtyTwoBit => {
                bytes = bytes.get(4..)?;
                Value::Other
            }
            WireType::LengthDelimited => {
                let len = usize::try_from(decode_varint(&mut bytes).ok()?).ok()?;
                let inner = bytes.get(..len)?;
                bytes = bytes.get(len..)?;
                Value::Bytes(inner)
            }
            WireType::StartGroup | WireType::EndGroup => return None,
        };
        each(tag, value)?;
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use prost::{encoding, Message};
    use prost_reflect::{DescriptorPool, DynamicMessage};
    use prost_types::{DescriptorProto, FieldDescriptorProto, FileDescriptorProto};

    use super::*;

    /// `fields` (key, value) encoded as a message, values of wire type LEN.
    fn message(fields: &[(u32, &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        for (tag, value) in fields {
            encoding::encode_key(*tag, WireType::LengthDelimited, &mut out);
            encoding::encode_varint(value.len() as u64, &mut out);
            out.extend_from_slice(value);
        }
        out
    }

    /// A field's encoding, with `features` (an encoded `FeatureSet`) in its options.
    fn field(
        name: &str,
        number: i32,
        label: Label,
        ty: Type,
        type_name: &str,
        features: &[u8],
    ) -> Vec<u8> {
        let mut out = FieldDescriptorProto {
            name: Some(name.into()),
            json_name: Some(name.into()),
            number: Some(number),
            label: Some(label as i32),
            r#type: Some(ty as i32),
            type_name: (!type_name.is_empty()).then(|| type_name.into()),
            ..Default::default()
        }
        .encode_to_vec();
        if !features.is_empty() {
            out.extend(message(&[(8, &message(&[(21, features)]))]));
        }
        out
    }

    /// An edition 2023 file as a server's reflection sends it: `probe.M` with a
    /// `DELIMITED` message field, a `LEGACY_REQUIRED` one, a repeated scalar packed by
    /// default and one `EXPANDED`; the message's own features say nothing.
    fn editions_file(syntax: &str, edition: u64) -> Vec<u8> {
        let inner = DescriptorProto {
            name: Some("Inner".into()),
            field: vec![FieldDescriptorProto::decode(
                field("x", 1, Label::Optional, Type::Int32, "", &[]).as_slice(),
            )
            .unwrap()],
            ..Default::default()
        }
        .encode_to_vec();
        let fields = [
            field(
                "delim",
                1,
                Label::Optional,
                Type::Message,
                ".probe.M.Inner",
                &[0x28, 2],
            ),
            field("req", 2, Label::Optional, Type::Int32, "", &[0x08, 3]),
            field("packed", 3, Label::Repeated, Type::Int32, "", &[]),
            field("expanded", 4, Label::Repeated, Type::Int32, "", &[0x18, 2]),
        ];
        let mut m = message(&[(1, b"M")]);
        for f in &fields {
            m.extend(message(&[(2, f)]));
        }
        m.extend(message(&[(3, &inner)]));
        let value = |name: &str| {
            prost_types::EnumValueDescriptorProto {
                name: Some(name.into()),
                number: Some(0),
                ..Default::default()
            }
            .encode_to_vec()
        };
        let mut closed = message(&[(1, b"Closed"), (2, &value("C_ZERO"))]);
        closed.extend(message(&[(3, &message(&[(7, &[0x10, 2])]))]));
        let open = message(&[(1, b"Open"), (2, &value("O_ZERO"))]);
        let mut file = message(&[
            (1, b"m.proto"),
            (2, b"probe"),
            (4, &m),
            (5, &closed),
            (5, &open),
            (12, syntax.as_bytes()),
        ]);
        encoding::encode_key(14, WireType::Varint, &mut file);
        encoding::encode_varint(edition, &mut file);
        file
    }

    #[test]
    fn an_editions_file_is_read_as_proto2_with_its_features_kept() {
        let raw = editions_file("editions", 1000);
        let mut file = FileDescriptorProto::decode(raw.as_slice()).unwrap();
        normalize(&mut file, &raw).unwrap();
        assert_eq!(file.syntax(), "proto2");
        let m = &file.message_type[0];
        assert_eq!(m.field[0].r#type(), Type::Group, "DELIMITED is a group");
        assert_eq!(m.field[1].label(), Label::Required, "LEGACY_REQUIRED");
        let packed = |i: usize| m.field[i].options.as_ref().and_then(|o| o.packed);
        assert_eq!(packed(2), Some(true), "packed, edition 2023's default");
        assert_eq!(packed(3), Some(false), "EXPANDED");
        // It links, and a message of it goes out as a peer of the edition expects:
        // the delimited field as a group, the repeated fields packed and not.
        let mut pool = DescriptorPool::new();
        pool.add_file_descriptor_protos([file]).unwrap();
        // Its enums are open, as edition 2023's are, unless CLOSED, though the file
        // now reads as proto2.
        assert!(is_closed(&pool.get_enum_by_name("probe.Closed").unwrap()));
        assert!(!is_closed(&pool.get_enum_by_name("probe.Open").unwrap()));
        let desc = pool.get_message_by_name("probe.M").unwrap();
        let mut de = serde_json::Deserializer::from_str(
            r#"{"delim":{"x":3},"req":1,"packed":[1,2],"expanded":[3,4]}"#,
        );
        let msg = DynamicMessage::deserialize(desc, &mut de).unwrap();
        assert_eq!(
            msg.encode_to_vec(),
            [0x0b, 0x08, 0x03, 0x0c, 0x10, 0x01, 0x1a, 0x02, 0x01, 0x02, 0x20, 0x03, 0x20, 0x04]
        );
    }

    /// From a review: an editions file made prost-reflect panic (any syntax it does not
    /// know did), so a server's reflection crashed the CLI.
    #[test]
    fn unknown_syntaxes_and_editions_are_errors_not_panics() {
        for (syntax, edition, says) in [
            ("proto4", 1000, "syntax \"proto4\""),
            ("editions", 9999, "edition 9999"),
        ] {
            let raw = editions_file(syntax, edition);
            let mut file = FileDescriptorProto::decode(raw.as_slice()).unwrap();
            let err = normalize(&mut file, &raw).unwrap_err();
            assert!(err.contains(says), "{err}");
        }
        // A file whose encoding and descriptor disagree is refused, not misread.
        let raw = editions_file("editions", 1000);
        let mut file = FileDescriptorProto::decode(raw.as_slice()).unwrap();
        file.message_type.push(DescriptorProto::default());
        assert!(normalize(&mut file, &raw).is_err());
    }
}

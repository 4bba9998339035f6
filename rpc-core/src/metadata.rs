//! Request and response metadata: string keys with text or binary values.
//!
//! Keys follow gRPC's rules so that metadata maps onto gRPC headers unchanged: 1 to 255
//! bytes of `a-z`, `0-9`, `-`, `_` and `.`. A key ending in `-bin` carries binary values;
//! any other key carries UTF-8 text. A key may appear more than once.

use std::fmt;

use bytes::Bytes;

use crate::bytestr::ByteStr;

/// Longest key accepted (it is carried with a one-byte length on the wire).
pub const MAX_KEY_LEN: usize = 255;

/// A metadata value: UTF-8 text, or bytes for keys ending in `-bin`.
#[derive(Clone, PartialEq, Eq, Hash)]
pub enum MetadataValue {
    /// A text value (any UTF-8).
    Text(ByteStr),
    /// A binary value (any bytes), for keys ending in `-bin`.
    Binary(Bytes),
}

impl MetadataValue {
    /// The text, if this is a text value.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetadataValue::Text(s) => Some(s.as_str()),
            MetadataValue::Binary(_) => None,
        }
    }

    /// The raw bytes of the value (text or binary).
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            MetadataValue::Text(s) => s.as_bytes(),
            MetadataValue::Binary(b) => b,
        }
    }
}

impl fmt::Debug for MetadataValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MetadataValue::Text(s) => fmt::Debug::fmt(s, f),
            MetadataValue::Binary(b) => fmt::Debug::fmt(b, f),
        }
    }
}

impl From<&'static str> for MetadataValue {
    fn from(s: &'static str) -> Self {
        MetadataValue::Text(ByteStr::from_static(s))
    }
}

impl From<String> for MetadataValue {
    fn from(s: String) -> Self {
        MetadataValue::Text(ByteStr::from(s))
    }
}

impl From<Bytes> for MetadataValue {
    fn from(b: Bytes) -> Self {
        MetadataValue::Binary(b)
    }
}

impl From<Vec<u8>> for MetadataValue {
    fn from(b: Vec<u8>) -> Self {
        MetadataValue::Binary(Bytes::from(b))
    }
}

/// Why a key or value was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidMetadata {
    reason: String,
}

impl fmt::Display for InvalidMetadata {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid metadata: {}", self.reason)
    }
}

impl std::error::Error for InvalidMetadata {}

/// Checks a key against the rules in the module docs.
pub fn validate_key(key: &str) -> Result<(), InvalidMetadata> {
    if key.is_empty() || key.len() > MAX_KEY_LEN {
        return Err(InvalidMetadata {
            reason: format!("key length {} is outside 1..={MAX_KEY_LEN}", key.len()),
        });
    }
    // One table lookup and an OR per byte, no branch: the check runs for every entry
    // of every request that carries metadata, on both sides.
    let bad = key
        .bytes()
        .fold(false, |bad, b| bad | !KEY_BYTE[usize::from(b)]);
    if bad {
        let bad = key
            .bytes()
            .find(|&b| !KEY_BYTE[usize::from(b)])
            .expect("a byte failed the check");
        return Err(InvalidMetadata {
            reason: format!("key {key:?} has byte 0x{bad:02x}; keys use only a-z 0-9 - _ ."),
        });
    }
    Ok(())
}

/// The bytes a key may hold: `a-z 0-9 - _ .`.
const KEY_BYTE: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        table[b] = matches!(b as u8, b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.');
        b += 1;
    }
    table
};

/// Whether values under `key` are binary (the key ends in `-bin`).
pub fn is_binary_key(key: &str) -> bool {
    key.ends_with("-bin")
}

/// An ordered multimap of metadata entries. Empty metadata allocates nothing.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Metadata {
    entries: Vec<(ByteStr, MetadataValue)>,
}

impl Metadata {
    /// Empty metadata.
    pub const fn new() -> Metadata {
        Metadata {
            entries: Vec::new(),
        }
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Replaces every value under `key` with `value`.
    ///
    /// Fails if the key breaks the key rules or the value's kind does not match the key
    /// (binary values need a `-bin` key, text values must not use one).
    pub fn insert(
        &mut self,
        key: impl Into<ByteStr>,
        value: impl Into<MetadataValue>,
    ) -> Result<(), InvalidMetadata> {
        let key = key.into();
        let value = value.into();
        check_entry(&key, &value)?;
        self.entries.retain(|(k, _)| *k != key);
        self.entries.push((key, value));
        Ok(())
    }

    /// Adds a value under `key`, keeping the values already there.
    pub fn append(
        &mut self,
        key: impl Into<ByteStr>,
        value: impl Into<MetadataValue>,
    ) -> Result<(), InvalidMetadata> {
        let key = key.into();
        let value = value.into();
        check_entry(&key, &value)?;
        self.entries.push((key, value));
        Ok(())
    }

    /// The first value under `key`.
    pub fn get(&self, key: &str) -> Option<&MetadataValue> {
        self.entries.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// The first value under `key` as text.
    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(MetadataValue::as_str)
    }

    /// Every value under `key`, in order.
    pub fn get_all<'a>(&'a self, key: &'a str) -> impl Iterator<Item = &'a MetadataValue> + 'a {
        self.entries
            .iter()
            .filter(move |(k, _)| k == key)
            .map(|(_, v)| v)
    }

    /// Removes every value under `key`; returns how many were removed.
    pub fn remove(&mut self, key: &str) -> usize {
        let before = self.entries.len();
        self.entries.retain(|(k, _)| k != key);
        before - self.entries.len()
    }

    /// All entries in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &MetadataValue)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Appends every entry of `other` (already valid, being metadata).
    pub fn extend(&mut self, other: Metadata) {
        self.entries.extend(other.entries);
    }

    /// Appends an entry that the frame decoder has already validated.
    pub(crate) fn push_unchecked(&mut self, key: ByteStr, value: MetadataValue) {
        self.entries.push((key, value));
    }
}

fn check_entry(key: &ByteStr, value: &MetadataValue) -> Result<(), InvalidMetadata> {
    validate_key(key)?;
    match (is_binary_key(key), value) {
        (true, MetadataValue::Binary(_)) | (false, MetadataValue::Text(_)) => Ok(()),
        (true, MetadataValue::Text(_)) => Err(InvalidMetadata {
            reason: format!("key {key:?} ends in -bin and takes binary values, not text"),
        }),
        (false, MetadataValue::Binary(_)) => Err(InvalidMetadata {
            reason: format!("binary values need a key ending in -bin, not {key:?}"),
        }),
    }
}

impl fmt::Debug for Metadata {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_checked() {
        let mut md = Metadata::new();
        assert!(md.insert("x-user", "alice").is_ok());
        assert!(md.insert("X-User", "alice").is_err());
        assert!(md.insert("", "a").is_err());
        assert!(md.insert("a b", "a").is_err());
        assert!(md.insert("trace-bin", "text").is_err());
        assert!(md.insert("trace", vec![1u8, 2]).is_err());
        assert!(md.insert("trace-bin", vec![0u8, 255]).is_ok());
    }

    #[test]
    fn every_key_byte_is_checked_in_every_position() {
        for b in 0..=255u8 {
            let allowed = matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.');
            for at in 0..3 {
                let mut key = b"k-x".to_vec();
                key[at] = b;
                let Ok(key) = String::from_utf8(key) else {
                    continue; // not a `str`: no key can hold it
                };
                let result = validate_key(&key);
                assert_eq!(result.is_ok(), allowed, "byte {b:#04x} at {at}");
                if let Err(err) = result {
                    assert!(err.to_string().contains(&format!("0x{b:02x}")), "{err}");
                }
            }
        }
        assert!(validate_key("caf\u{e9}").is_err());
    }

    #[test]
    fn insert_replaces_and_append_keeps() {
        let mut md = Metadata::new();
        md.append("k", "1").unwrap();
        md.append("k", "2").unwrap();
        assert_eq!(md.get_all("k").count(), 2);
        md.insert("k", "3").unwrap();
        assert_eq!(md.get_str("k"), Some("3"));
        assert_eq!(md.len(), 1);
        assert_eq!(md.remove("k"), 1);
        assert!(md.is_empty());
    }
}

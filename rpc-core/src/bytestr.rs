//! [`ByteStr`]: a UTF-8 string backed by [`Bytes`], so decoded frames can hand out
//! method names and metadata without copying.

use std::{borrow::Borrow, fmt, ops::Deref, str::Utf8Error};

use bytes::Bytes;

/// An immutable UTF-8 string that shares its storage with a [`Bytes`] buffer.
///
/// Built from a `&'static str` it allocates nothing; cut from a received frame it
/// points into that frame.
#[derive(Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ByteStr(Bytes);

impl ByteStr {
    /// An empty string.
    pub const fn new() -> ByteStr {
        ByteStr(Bytes::new())
    }

    /// A string that points at static data (no allocation).
    pub const fn from_static(s: &'static str) -> ByteStr {
        ByteStr(Bytes::from_static(s.as_bytes()))
    }

    /// Checks that `bytes` are UTF-8 and wraps them without copying.
    pub fn from_utf8(bytes: Bytes) -> Result<ByteStr, Utf8Error> {
        // Metadata keys and values are ASCII nearly always: `is_ascii` checks a word at
        // a time, where `from_utf8` takes several times as many instructions for the
        // same short string (a `traceparent` value: about 30 against 90).
        if !bytes.is_ascii() {
            std::str::from_utf8(&bytes)?;
        }
        Ok(ByteStr(bytes))
    }

    /// The string.
    #[allow(unsafe_code)]
    pub fn as_str(&self) -> &str {
        // SAFETY: every constructor either takes a `str`/`String` or checks the bytes
        // with `str::from_utf8`, and the bytes are immutable afterwards. Re-checking here
        // would scan the method name on every routing step of every call.
        unsafe { std::str::from_utf8_unchecked(&self.0) }
    }

    /// The underlying bytes.
    pub fn as_bytes(&self) -> &Bytes {
        &self.0
    }
}

impl Deref for ByteStr {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl Borrow<str> for ByteStr {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

impl From<String> for ByteStr {
    fn from(s: String) -> ByteStr {
        ByteStr(Bytes::from(s))
    }
}

impl From<&'static str> for ByteStr {
    fn from(s: &'static str) -> ByteStr {
        ByteStr::from_static(s)
    }
}

impl PartialEq<str> for ByteStr {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for ByteStr {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl fmt::Debug for ByteStr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for ByteStr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_utf8_takes_ascii_and_other_utf8_and_refuses_the_rest() {
        let ascii = ByteStr::from_utf8(Bytes::from_static(b"traceparent")).unwrap();
        assert_eq!(ascii.as_str(), "traceparent");
        let accented = ByteStr::from_utf8(Bytes::from("caf\u{e9} \u{1f980}")).unwrap();
        assert_eq!(accented.as_str(), "caf\u{e9} \u{1f980}");
        for bad in [
            &b"\xff"[..],
            b"ok\xc3",
            b"\xe2\x82",
            b"a\x80b",
            b"\xed\xa0\x80",
        ] {
            assert!(
                ByteStr::from_utf8(Bytes::copy_from_slice(bad)).is_err(),
                "{bad:?}"
            );
        }
    }
}

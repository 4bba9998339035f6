//! HPACK's two tables (RFC 7541 §2.3): the static table of Appendix A and the dynamic
//! table a connection's encoder and decoder each keep in step with the peer's.
//!
//! Indices are those of §2.3.3: 1–61 the static table, 62 and up the dynamic table,
//! newest first.

use std::collections::VecDeque;

use bytes::Bytes;

/// What RFC 7541 §4.1 adds to a field's name and value lengths for its size (in the
/// dynamic table, and for SETTINGS_MAX_HEADER_LIST_SIZE).
pub(crate) const ENTRY_OVERHEAD: usize = 32;

/// A field's size as RFC 7541 §4.1 counts it: its name and value lengths plus 32.
pub(crate) fn field_size(name: usize, value: usize) -> usize {
    name.saturating_add(value).saturating_add(ENTRY_OVERHEAD)
}

/// The number of entries in the static table; dynamic indices start after it.
pub(crate) const STATIC_LEN: usize = 61;

/// The static table (RFC 7541 Appendix A), `STATIC[index - 1]`.
#[rustfmt::skip]
pub(crate) const STATIC: [(&[u8], &[u8]); STATIC_LEN] = [
    /*  1 */ (b":authority", b""),
    /*  2 */ (b":method", b"GET"),
    /*  3 */ (b":method", b"POST"),
    /*  4 */ (b":path", b"/"),
    /*  5 */ (b":path", b"/index.html"),
    /*  6 */ (b":scheme", b"http"),
    /*  7 */ (b":scheme", b"https"),
    /*  8 */ (b":status", b"200"),
    /*  9 */ (b":status", b"204"),
    /* 10 */ (b":status", b"206"),
    /* 11 */ (b":status", b"304"),
    /* 12 */ (b":status", b"400"),
    /* 13 */ (b":status", b"404"),
    /* 14 */ (b":status", b"500"),
    /* 15 */ (b"accept-charset", b""),
    /* 16 */ (b"accept-encoding", b"gzip, deflate"),
    /* 17 */ (b"accept-language", b""),
    /* 18 */ (b"accept-ranges", b""),
    /* 19 */ (b"accept", b""),
    /* 20 */ (b"access-control-allow-origin", b""),
    /* 21 */ (b"age", b""),
    /* 22 */ (b"allow", b""),
    /* 23 */ (b"authorization", b""),
    /* 24 */ (b"cache-control", b""),
    /* 25 */ (b"content-disposition", b""),
    /* 26 */ (b"content-encoding", b""),
    /* 27 */ (b"content-language", b""),
    /* 28 */ (b"content-length", b""),
    /* 29 */ (b"content-location", b""),
    /* 30 */ (b"content-range", b""),
    /* 31 */ (b"content-type", b""),
    /* 32 */ (b"cookie", b""),
    /* 33 */ (b"date", b""),
    /* 34 */ (b"etag", b""),
    /* 35 */ (b"expect", b""),
    /* 36 */ (b"expires", b""),
    /* 37 */ (b"from", b""),
    /* 38 */ (b"host", b""),
    /* 39 */ (b"if-match", b""),
    /* 40 */ (b"if-modified-since", b""),
    /* 41 */ (b"if-none-match", b""),
    /* 42 */ (b"if-range", b""),
    /* 43 */ (b"if-unmodified-since", b""),
    /* 44 */ (b"last-modified", b""),
    /* 45 */ (b"link", b""),
    /* 46 */ (b"location", b""),
    /* 47 */ (b"max-forwards", b""),
    /* 48 */ (b"proxy-authenticate", b""),
    /* 49 */ (b"proxy-authorization", b""),
    /* 50 */ (b"range", b""),
    /* 51 */ (b"referer", b""),
    /* 52 */ (b"refresh", b""),
    /* 53 */ (b"retry-after", b""),
    /* 54 */ (b"server", b""),
    /* 55 */ (b"set-cookie", b""),
    /* 56 */ (b"strict-transport-security", b""),
    /* 57 */ (b"transfer-encoding", b""),
    /* 58 */ (b"user-agent", b""),
    /* 59 */ (b"vary", b""),
    /* 60 */ (b"via", b""),
    /* 61 */ (b"www-authenticate", b""),
];

/// The static entry at `index` (1-based), if there is one.
pub(crate) fn static_entry(index: usize) -> Option<(Bytes, Bytes)> {
    let &(name, value) = STATIC.get(index.checked_sub(1)?)?;
    Some((Bytes::from_static(name), Bytes::from_static(value)))
}

/// Looks a field up in the static table for the encoder: the index of the entry with
/// both its name and value, else of the first entry with its name.
pub(crate) fn static_find(name: &[u8], value: &[u8]) -> Option<Match> {
    // The entries with each name are consecutive: the first and last index of a name.
    let (first, last) = match name {
        b":authority" => (1, 1),
        b":method" => (2, 3),
        b":path" => (4, 5),
        b":scheme" => (6, 7),
        b":status" => (8, 14),
        b"accept-charset" => (15, 15),
        b"accept-encoding" => (16, 16),
        b"accept-language" => (17, 17),
        b"accept-ranges" => (18, 18),
        b"accept" => (19, 19),
        b"access-control-allow-origin" => (20, 20),
        b"age" => (21, 21),
        b"allow" => (22, 22),
        b"authorization" => (23, 23),
        b"cache-control" => (24, 24),
        b"content-disposition" => (25, 25),
        b"content-encoding" => (26, 26),
        b"content-language" => (27, 27),
        b"content-length" => (28, 28),
        b"content-location" => (29, 29),
        b"content-range" => (30, 30),
        b"content-type" => (31, 31),
        b"cookie" => (32, 32),
        b"date" => (33, 33),
        b"etag" => (34, 34),
        b"expect" => (35, 35),
        b"expires" => (36, 36),
        b"from" => (37, 37),
        b"host" => (38, 38),
        b"if-match" => (39, 39),
        b"if-modified-since" => (40, 40),
        b"if-none-match" => (41, 41),
        b"if-range" => (42, 42),
        b"if-unmodified-since" => (43, 43),
        b"last-modified" => (44, 44),
        b"link" => (45, 45),
        b"location" => (46, 46),
        b"max-forwards" => (47, 47),
        b"proxy-authenticate" => (48, 48),
        b"proxy-authorization" => (49, 49),
        b"range" => (50, 50),
        b"referer" => (51, 51),
        b"refresh" => (52, 52),
        b"retry-after" => (53, 53),
        b"server" => (54, 54),
        b"set-cookie" => (55, 55),
        b"strict-transport-security" => (56, 56),
        b"transfer-encoding" => (57, 57),
        b"user-agent" => (58, 58),
        b"vary" => (59, 59),
        b"via" => (60, 60),
        b"www-authenticate" => (61, 61),
        _ => return None,
    };
    let full = (first..=last).find(|&i| STATIC[i - 1].1 == value);
    Some(match full {
        Some(index) => Match::Field(index),
        None => Match::Name(first),
    })
}

/// What a table holds of a field the encoder looks up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Match {
    /// The entry at this index has the name and the value.
    Field(usize),
    /// The entry at this index has the name (and another value).
    Name(usize),
}

/// One dynamic table entry.
#[derive(Debug, Clone)]
struct Entry {
    /// The field's name.
    name: Bytes,
    /// The field's value.
    value: Bytes,
}

/// A dynamic table (RFC 7541 §2.3.2, §4): a ring of entries, newest first, whose
/// sizes (§4.1) add up to at most `max_size`; inserting evicts from the oldest (§4.4).
#[derive(Debug)]
pub(crate) struct DynamicTable {
    /// The entries, newest at the front (index 62).
    entries: VecDeque<Entry>,
    /// The sum of the entries' sizes.
    size: usize,
    /// The table's maximum size, as the last size update set it.
    max_size: usize,
}

impl DynamicTable {
    /// An empty table of at most `max_size` bytes.
    pub(crate) fn new(max_size: usize) -> DynamicTable {
        DynamicTable {
            entries: VecDeque::new(),
            size: 0,
            max_size,
        }
    }

    #[cfg(test)]
    /// How many entries the table holds.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    #[cfg(test)]
    /// The sum of the entries' sizes (§4.1).
    pub(crate) fn size(&self) -> usize {
        self.size
    }

    /// The table's maximum size.
    pub(crate) fn max_size(&self) -> usize {
        self.max_size
    }

    /// The entry at `position` (0 is the newest, index 62).
    pub(crate) fn get(&self, position: usize) -> Option<(&Bytes, &Bytes)> {
        self.entries.get(position).map(|e| (&e.name, &e.value))
    }

    #[cfg(test)]
    /// The entries, newest first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&Bytes, &Bytes)> {
        self.entries.iter().map(|e| (&e.name, &e.value))
    }

    /// Sets the maximum size (a size update, §4.3, §6.3), evicting the oldest entries
    /// until the table fits.
    pub(crate) fn set_max_size(&mut self, max_size: usize) {
        self.max_size = max_size;
        self.evict_to(max_size);
    }

    /// Whether an entry of `size` (§4.1) fits in the table at all (else inserting it
    /// empties the table, §4.4).
    pub(crate) fn fits(&self, size: usize) -> bool {
        size <= self.max_size
    }

    /// Empties the table (what inserting an entry larger than the table does, §4.4).
    pub(crate) fn clear(&mut self) {
        self.entries.clear();
        self.size = 0;
    }

    /// Adds a field as the newest entry, evicting the oldest until it fits; a field
    /// larger than the whole table empties it and is not added (§4.4).
    pub(crate) fn insert(&mut self, name: Bytes, value: Bytes) {
        let size = field_size(name.len(), value.len());
        if !self.fits(size) {
            self.clear();
            return;
        }
        self.evict_to(self.max_size - size);
        self.size += size;
        self.entries.push_front(Entry { name, value });
    }

    /// Evicts the oldest entries until the size is at most `size`.
    fn evict_to(&mut self, size: usize) {
        while self.size > size {
            match self.entries.pop_back() {
                Some(e) => self.size -= field_size(e.name.len(), e.value.len()),
                None => {
                    // Unreachable: the size is the sum of the entries' sizes.
                    self.size = 0;
                }
            }
        }
    }

    /// Looks a field up for the encoder: the position (0 the newest) of the newest
    /// entry with the name and value, else of the newest with the name.
    pub(crate) fn find(&self, name: &[u8], value: &[u8]) -> Option<Match> {
        let mut by_name = None;
        for (position, e) in self.entries.iter().enumerate() {
            if e.name == name {
                if e.value == value {
                    return Some(Match::Field(position));
                }
                by_name.get_or_insert(position);
            }
        }
        by_name.map(Match::Name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn insert(table: &mut DynamicTable, name: &'static str, value: &'static str) {
        table.insert(
            Bytes::from_static(name.as_bytes()),
            Bytes::from_static(value.as_bytes()),
        );
    }

    fn entries(table: &DynamicTable) -> Vec<(String, String)> {
        table
            .iter()
            .map(|(n, v)| {
                (
                    String::from_utf8(n.to_vec()).unwrap(),
                    String::from_utf8(v.to_vec()).unwrap(),
                )
            })
            .collect()
    }

    #[test]
    fn static_table_shape() {
        assert_eq!(STATIC[0], (&b":authority"[..], &b""[..]));
        assert_eq!(STATIC[1], (&b":method"[..], &b"GET"[..]));
        assert_eq!(STATIC[7], (&b":status"[..], &b"200"[..]));
        assert_eq!(STATIC[15], (&b"accept-encoding"[..], &b"gzip, deflate"[..]));
        assert_eq!(STATIC[60], (&b"www-authenticate"[..], &b""[..]));
        assert_eq!(static_entry(0), None);
        assert_eq!(static_entry(62), None);
        assert_eq!(
            static_entry(61),
            Some((Bytes::from_static(b"www-authenticate"), Bytes::new()))
        );
        // Every entry is found where it is, and every name at its first index.
        for (i, &(name, value)) in STATIC.iter().enumerate() {
            assert_eq!(static_find(name, value), Some(Match::Field(i + 1)), "{i}");
            let first = STATIC.iter().position(|e| e.0 == name).unwrap() + 1;
            assert_eq!(static_find(name, b"\xff"), Some(Match::Name(first)), "{i}");
        }
        assert_eq!(static_find(b"grpc-status", b"0"), None);
        assert_eq!(static_find(b":Method", b"GET"), None);
    }

    #[test]
    fn insert_evicts_the_oldest() {
        // Each entry is 32 + 2 = 34 bytes; three fit in 110, not four.
        let mut table = DynamicTable::new(110);
        insert(&mut table, "a", "1");
        insert(&mut table, "b", "2");
        insert(&mut table, "c", "3");
        assert_eq!((table.len(), table.size()), (3, 102));
        insert(&mut table, "d", "4");
        assert_eq!(
            entries(&table),
            [
                ("d".into(), "4".into()),
                ("c".into(), "3".into()),
                ("b".into(), "2".into())
            ]
        );
        assert_eq!(table.size(), 102);
        assert_eq!(
            table.get(0).map(|(n, _)| n.clone()),
            Some(Bytes::from_static(b"d"))
        );
        assert_eq!(table.get(3), None);
        // A bigger entry evicts two.
        insert(&mut table, "eeee", "55555555555555555555555555555555");
        assert_eq!(entries(&table).len(), 2);
        assert_eq!(table.size(), 68 + 34);
    }

    #[test]
    fn an_entry_exactly_the_table_size_fits() {
        let mut table = DynamicTable::new(34);
        insert(&mut table, "a", "1");
        insert(&mut table, "b", "2");
        assert_eq!(entries(&table), [("b".into(), "2".into())]);
        assert_eq!(table.size(), 34);
    }

    #[test]
    fn an_entry_larger_than_the_table_empties_it() {
        let mut table = DynamicTable::new(64);
        insert(&mut table, "a", "1");
        insert(
            &mut table,
            "big",
            "0123456789012345678901234567890123456789",
        );
        assert_eq!((table.len(), table.size()), (0, 0));
        let mut zero = DynamicTable::new(0);
        insert(&mut zero, "", "");
        assert_eq!(zero.len(), 0);
    }

    #[test]
    fn shrinking_evicts_and_growing_keeps() {
        let mut table = DynamicTable::new(4096);
        for _ in 0..10 {
            insert(&mut table, "k", "v");
        }
        assert_eq!(table.size(), 340);
        table.set_max_size(100);
        assert_eq!((table.len(), table.size()), (2, 68));
        table.set_max_size(4096);
        assert_eq!(table.len(), 2);
        table.set_max_size(0);
        assert_eq!((table.len(), table.size()), (0, 0));
    }

    #[test]
    fn find_prefers_the_newest_full_match() {
        let mut table = DynamicTable::new(4096);
        insert(&mut table, "x", "1");
        insert(&mut table, "x", "2");
        insert(&mut table, "y", "1");
        assert_eq!(table.find(b"x", b"1"), Some(Match::Field(2)));
        assert_eq!(table.find(b"x", b"2"), Some(Match::Field(1)));
        assert_eq!(table.find(b"x", b"3"), Some(Match::Name(1)));
        assert_eq!(table.find(b"z", b"1"), None);
    }
}

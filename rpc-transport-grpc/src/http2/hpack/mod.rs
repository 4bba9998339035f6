//! HPACK, HTTP/2's header compression (RFC 7541): an [`Encoder`] for the header blocks
//! we send and a [`Decoder`] for the ones the peer sends, each keeping its dynamic
//! table in step with the peer's.
//!
//! Sans-IO and allocation-light: the decoder hands out fields as [`Bytes`] — slices of
//! the block for plain strings, static strings for the static table, shared clones of
//! dynamic-table entries — and allocates only for Huffman-coded strings (at most 8/5 of
//! their coded length, and no more than the list limit or table size can use) and for
//! the copies it keeps in its dynamic table (bounded by the table size). The encoder
//! writes strings as they are (no Huffman: CPU matters more than bytes here).
//!
//! Everything a peer can send is checked before it is used: a string's length against
//! the rest of the block before anything is read or allocated, integers against 2^32,
//! indices against the tables, size updates against our setting and their place at the
//! start of a block.
//!
//! Layout: `table` (the static and dynamic tables), `huffman` (the Huffman code).

pub(crate) mod huffman;
mod table;

use std::fmt;

use bytes::{BufMut, Bytes, BytesMut};

pub(crate) use huffman::HuffmanError;
use table::{field_size, static_entry, static_find, DynamicTable, Match, STATIC_LEN};

/// The most dynamic table we keep for the peer's decoder, whatever larger size its
/// SETTINGS_HEADER_TABLE_SIZE allows: HTTP/2's default, enough for a gRPC call's
/// repeated headers, and it bounds our memory and lookup time per connection.
pub(crate) const MAX_ENCODER_TABLE_SIZE: usize = 4096;

/// SETTINGS_HEADER_TABLE_SIZE's initial value (RFC 9113 §6.5.2): the dynamic table
/// size each side starts with.
pub(crate) const DEFAULT_TABLE_SIZE: usize = 4096;

/// The largest integer the decoder reads (a length, an index, a table size): none
/// needs more than 32 bits, and a longer encoding is an error (RFC 7541 §5.1 lets a
/// decoder limit integers).
const MAX_INTEGER: u64 = u32::MAX as u64;

/// Size updates allowed at the start of a block: RFC 7541 §4.2 needs at most two (the
/// smallest size since the last block, then the final one).
const MAX_SIZE_UPDATES: u8 = 2;

/// How the encoder may add a field to the dynamic tables (RFC 7541 §6.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Indexing {
    /// Added to both sides' dynamic tables, so later blocks can send it as an index.
    Incremental,
    /// Not added (a value unlikely to repeat).
    No,
    /// Not added, and intermediaries must not add it either (a sensitive value, such
    /// as a token, which must not be guessable through compression; §7.1.3). Sent with
    /// its name at most indexed, never as a whole indexed field.
    Never,
}

/// Why a header block could not be decoded.
///
/// [`DecodeError::ListTooLarge`] concerns one stream (the tables are still in step);
/// every other variant breaks the connection's compression context, a connection error
/// of type COMPRESSION_ERROR (RFC 9113 §4.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DecodeError {
    /// The block ended inside a field's representation.
    Truncated,
    /// An integer over 2^32 - 1, or encoded in more than 5 octets after its prefix.
    IntegerOverflow,
    /// Index 0, which names no entry (RFC 7541 §6.1).
    IndexZero,
    /// An index past the static and dynamic tables (RFC 7541 §2.3.3).
    IndexOutOfRange,
    /// A Huffman-coded string is invalid (RFC 7541 §5.2).
    Huffman(HuffmanError),
    /// A size update above our SETTINGS_HEADER_TABLE_SIZE (RFC 7541 §6.3).
    SizeUpdateTooLarge,
    /// A size update after a field (RFC 7541 §4.2: only at the start of a block).
    SizeUpdateNotAtStart,
    /// More than two size updates at the start of a block.
    TooManySizeUpdates,
    /// A string's length is past the end of the block.
    StringTooLong,
    /// The fields add up to more than the list limit (SETTINGS_MAX_HEADER_LIST_SIZE
    /// semantics); the whole block was still decoded, so the tables are in step.
    ListTooLarge,
}

impl DecodeError {
    /// Whether the error breaks the connection (COMPRESSION_ERROR): all but
    /// [`DecodeError::ListTooLarge`].
    #[cfg(any(test, fuzzing))]
    pub(crate) fn is_connection_error(self) -> bool {
        self != DecodeError::ListTooLarge
    }
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match self {
            DecodeError::Truncated => "header block ends inside a field",
            DecodeError::IntegerOverflow => "integer too large",
            DecodeError::IndexZero => "index 0",
            DecodeError::IndexOutOfRange => "index past the tables",
            DecodeError::Huffman(HuffmanError::Eos) => "EOS in a Huffman string",
            DecodeError::Huffman(HuffmanError::PaddingTooLong) => "Huffman padding over 7 bits",
            DecodeError::Huffman(HuffmanError::PaddingNotOnes) => "Huffman padding not all ones",
            DecodeError::SizeUpdateTooLarge => "table size update above the setting",
            DecodeError::SizeUpdateNotAtStart => "table size update after a field",
            DecodeError::TooManySizeUpdates => "more than two table size updates",
            DecodeError::StringTooLong => "string longer than the rest of the block",
            DecodeError::ListTooLarge => "header list over the limit",
        };
        f.write_str(text)
    }
}

impl std::error::Error for DecodeError {}

impl From<HuffmanError> for DecodeError {
    fn from(err: HuffmanError) -> DecodeError {
        DecodeError::Huffman(err)
    }
}

/// Appends `value` as an HPACK integer (RFC 7541 §5.1) with a `prefix`-bit prefix
/// (1–8), the first octet's other bits taken from `high`.
fn encode_int(dst: &mut BytesMut, high: u8, prefix: u32, value: usize) {
    let max = (1usize << prefix) - 1;
    if value < max {
        dst.put_u8(high | value as u8);
        return;
    }
    dst.put_u8(high | max as u8);
    let mut rest = value - max;
    while rest >= 0x80 {
        dst.put_u8(0x80 | (rest & 0x7f) as u8);
        rest >>= 7;
    }
    dst.put_u8(rest as u8);
}

/// Appends a string literal without Huffman coding (RFC 7541 §5.2, H = 0).
fn encode_str(dst: &mut BytesMut, s: &[u8]) {
    encode_int(dst, 0, 7, s.len());
    dst.extend_from_slice(s);
}

/// The encoder of the header blocks we send (RFC 7541 §2, §6): one per connection, its
/// dynamic table a copy of the peer decoder's.
#[derive(Debug)]
pub(crate) struct Encoder {
    /// What the peer's decoder holds, as our blocks so far made it.
    table: DynamicTable,
    /// Size updates owed at the start of the next block: the smallest size since the
    /// last block and the final one.
    pending: Option<(usize, usize)>,
}

impl Default for Encoder {
    fn default() -> Encoder {
        Encoder::new()
    }
}

impl Encoder {
    /// An encoder with HTTP/2's initial table size (4096), which is also the most we
    /// keep ([`MAX_ENCODER_TABLE_SIZE`]).
    pub(crate) fn new() -> Encoder {
        Encoder {
            table: DynamicTable::new(DEFAULT_TABLE_SIZE.min(MAX_ENCODER_TABLE_SIZE)),
            pending: None,
        }
    }

    /// The peer's SETTINGS_HEADER_TABLE_SIZE changed: the table becomes
    /// min(`setting`, [`MAX_ENCODER_TABLE_SIZE`]), signalled by a size update at the
    /// start of the next block (RFC 7541 §4.2, §6.3). If the size went down and back
    /// up before that block, the block signals the smallest, then the final size.
    pub(crate) fn set_max_table_size(&mut self, setting: u32) {
        let size = usize::try_from(setting)
            .unwrap_or(usize::MAX)
            .min(MAX_ENCODER_TABLE_SIZE);
        self.pending = match self.pending {
            Some((smallest, _)) => Some((smallest.min(size), size)),
            None if size != self.table.max_size() => Some((size, size)),
            None => None,
        };
    }

    /// Starts a header block in `dst`: writes the size updates owed since the last
    /// block. Call it before the first [`Encoder::encode`] of every block.
    pub(crate) fn begin_block(&mut self, dst: &mut BytesMut) {
        if let Some((smallest, size)) = self.pending.take() {
            if smallest < size {
                self.table.set_max_size(smallest);
                encode_int(dst, 0x20, 5, smallest);
            }
            self.table.set_max_size(size);
            encode_int(dst, 0x20, 5, size);
        }
    }

    /// Appends one field to the block in `dst`: as an index if a table holds the whole
    /// field (the static table first), else as a literal with an indexed name if a
    /// table holds the name, else as a literal with a literal name. With
    /// [`Indexing::Incremental`] the field is added to the dynamic table (evicting the
    /// oldest entries; a field larger than the table empties it); [`Indexing::No`] and
    /// [`Indexing::Never`] add nothing, and `Never` is sent as never-indexed and never
    /// as a whole indexed field. Strings are written without Huffman coding. Names
    /// are written as given (HTTP/2 wants them lowercase).
    pub(crate) fn encode(
        &mut self,
        name: &[u8],
        value: &[u8],
        indexing: Indexing,
        dst: &mut BytesMut,
    ) {
        let in_static = static_find(name, value);
        let in_dynamic = match in_static {
            // The static table has it all (or, for a sensitive field, its name).
            Some(Match::Field(_)) => None,
            _ => self.table.find(name, value),
        };
        // A sensitive field is never sent as an index: its name at most.
        if indexing != Indexing::Never {
            let index = match (in_static, in_dynamic) {
                (Some(Match::Field(index)), _) => Some(index),
                (_, Some(Match::Field(position))) => Some(STATIC_LEN + 1 + position),
                _ => None,
            };
            if let Some(index) = index {
                encode_int(dst, 0x80, 7, index);
                return;
            }
        }
        let name_index = match (in_static, in_dynamic) {
            (Some(Match::Field(index) | Match::Name(index)), _) => index,
            (None, Some(Match::Field(position) | Match::Name(position))) => {
                STATIC_LEN + 1 + position
            }
            (None, None) => 0,
        };
        match indexing {
            Indexing::Incremental => encode_int(dst, 0x40, 6, name_index),
            Indexing::No => encode_int(dst, 0x00, 4, name_index),
            Indexing::Never => encode_int(dst, 0x10, 4, name_index),
        }
        if name_index == 0 {
            encode_str(dst, name);
        }
        encode_str(dst, value);
        if indexing == Indexing::Incremental {
            if self.table.fits(field_size(name.len(), value.len())) {
                // A name a table holds is shared, not copied.
                let shared = match (in_static, in_dynamic) {
                    (Some(Match::Field(index) | Match::Name(index)), _) => {
                        static_entry(index).map(|(name, _)| name)
                    }
                    (None, Some(Match::Field(position) | Match::Name(position))) => {
                        self.table.get(position).map(|(name, _)| name.clone())
                    }
                    (None, None) => None,
                };
                let name = shared.unwrap_or_else(|| Bytes::copy_from_slice(name));
                self.table.insert(name, Bytes::copy_from_slice(value));
            } else {
                self.table.clear();
            }
        }
    }
}

/// Appends one field without the dynamic table, neither reading nor changing it: an
/// index if the static table holds the whole field, else a literal without indexing
/// (with the static table's index of its name if it has one). Such a block decodes the
/// same whatever blocks are sent before it: for a block that waits to be sent while
/// others, encoded later, go first (trailers behind DATA).
pub(crate) fn encode_detached(name: &[u8], value: &[u8], dst: &mut BytesMut) {
    match static_find(name, value) {
        Some(Match::Field(index)) => encode_int(dst, 0x80, 7, index),
        Some(Match::Name(index)) => {
            encode_int(dst, 0x00, 4, index);
            encode_str(dst, value);
        }
        None => {
            encode_int(dst, 0x00, 4, 0);
            encode_str(dst, name);
            encode_str(dst, value);
        }
    }
}

/// The decoder of the header blocks the peer sends (RFC 7541 §3, §6): one per
/// connection, fed every block in the order received.
#[derive(Debug)]
pub(crate) struct Decoder {
    /// What the peer's encoder holds, as its blocks so far made it.
    table: DynamicTable,
    /// Our SETTINGS_HEADER_TABLE_SIZE: the most the peer may make the table.
    max_table_size: usize,
}

impl Decoder {
    /// A decoder whose table starts at, and may be made at most, `max_table_size`
    /// (our SETTINGS_HEADER_TABLE_SIZE). A connection should start with
    /// [`DEFAULT_TABLE_SIZE`] (the peer may use it before it has our SETTINGS) and
    /// call [`Decoder::set_max_table_size`] once the peer acknowledges a lower one.
    pub(crate) fn new(max_table_size: usize) -> Decoder {
        Decoder {
            table: DynamicTable::new(max_table_size),
            max_table_size,
        }
    }

    #[cfg(test)]
    /// Our SETTINGS_HEADER_TABLE_SIZE changed (call it when the peer acknowledges the
    /// SETTINGS): later size updates may go up to `max_table_size`, and a table larger
    /// than it is cut down now (a peer that follows RFC 7541 §4.2 has already sent
    /// the size update that does so).
    pub(crate) fn set_max_table_size(&mut self, max_table_size: usize) {
        self.max_table_size = max_table_size;
        if self.table.max_size() > max_table_size {
            self.table.set_max_size(max_table_size);
        }
    }

    /// Decodes one whole header block (a HEADERS frame's fragment with its
    /// CONTINUATIONs), calling `field(name, value)` for each field in order.
    ///
    /// `max_list_size` bounds the list as SETTINGS_MAX_HEADER_LIST_SIZE does (the
    /// fields' names and values plus 32 each). Once the list passes it, `field` is no
    /// longer called, but the block is decoded to its end so the dynamic table stays
    /// in step with the peer's, and the result is [`DecodeError::ListTooLarge`] (an
    /// error for the stream). Any other error leaves the table out of step: the
    /// connection must end with COMPRESSION_ERROR.
    pub(crate) fn decode(
        &mut self,
        block: &Bytes,
        max_list_size: usize,
        mut field: impl FnMut(Bytes, Bytes),
    ) -> Result<(), DecodeError> {
        let mut reader = Reader { block, pos: 0 };
        let mut list = List {
            size: 0,
            max: max_list_size,
            too_large: false,
        };
        let mut at_start = true;
        let mut size_updates = 0u8;
        while let Some(first) = reader.peek() {
            if first & 0x80 != 0 {
                // Indexed field (§6.1).
                at_start = false;
                let index = reader.int(7)?;
                let (name, value) = self.entry(index)?;
                list.add(name, value, &mut field);
                continue;
            }
            if first & 0xe0 == 0x20 {
                // Dynamic table size update (§6.3).
                if !at_start {
                    return Err(DecodeError::SizeUpdateNotAtStart);
                }
                size_updates += 1;
                if size_updates > MAX_SIZE_UPDATES {
                    return Err(DecodeError::TooManySizeUpdates);
                }
                let size = reader.int(5)?;
                if size > self.max_table_size {
                    return Err(DecodeError::SizeUpdateTooLarge);
                }
                self.table.set_max_size(size);
                continue;
            }
            // A literal (§6.2): with incremental indexing (01), without (0000) or
            // never indexed (0001).
            at_start = false;
            let incremental = first & 0x40 != 0;
            let index = reader.int(if incremental { 6 } else { 4 })?;
            // What the strings may take: what is left of the list, or for an entry to
            // add, the table; past it a string is only checked.
            let room = if incremental {
                list.room().max(self.table.max_size())
            } else {
                list.room()
            };
            let name = if index == 0 {
                reader.string(room)?
            } else {
                let (name, _) = self.entry(index)?;
                Str {
                    bytes: name,
                    from_block: false,
                    whole: true,
                }
            };
            let value_room = if name.whole {
                room.saturating_sub(name.bytes.len())
            } else {
                0
            };
            let value = reader.string(value_room)?;
            if !(name.whole && value.whole) {
                // Past the room: too large for the list, and for the table if it was
                // to be added (which empties the table, §4.4).
                list.too_large = true;
                if incremental {
                    self.table.clear();
                }
                continue;
            }
            let (mut name, mut value) = (name, value);
            if incremental {
                if self
                    .table
                    .fits(field_size(name.bytes.len(), value.bytes.len()))
                {
                    // The table keeps copies, not slices that would hold the whole
                    // block (and the read buffer it came from) in memory.
                    name.own();
                    value.own();
                    self.table.insert(name.bytes.clone(), value.bytes.clone());
                } else {
                    self.table.clear();
                }
            }
            list.add(name.bytes, value.bytes, &mut field);
        }
        if list.too_large {
            Err(DecodeError::ListTooLarge)
        } else {
            Ok(())
        }
    }

    /// The field at `index` of the static or dynamic table.
    fn entry(&self, index: usize) -> Result<(Bytes, Bytes), DecodeError> {
        if index == 0 {
            return Err(DecodeError::IndexZero);
        }
        if let Some(entry) = static_entry(index) {
            return Ok(entry);
        }
        let position = index.checked_sub(STATIC_LEN + 1);
        match position.and_then(|p| self.table.get(p)) {
            Some((name, value)) => Ok((name.clone(), value.clone())),
            None => Err(DecodeError::IndexOutOfRange),
        }
    }
}

/// A block's header list as the decoder hands it out, against the list limit.
struct List {
    /// The fields' sizes so far (RFC 7541 §4.1), handed out or not.
    size: usize,
    /// The limit.
    max: usize,
    /// The list went past the limit: nothing more is handed out.
    too_large: bool,
}

impl List {
    /// What a field may still take (0 once past the limit).
    fn room(&self) -> usize {
        if self.too_large {
            0
        } else {
            self.max.saturating_sub(self.size)
        }
    }

    /// Counts a decoded field, and hands it to `field` while within the limit.
    fn add(&mut self, name: Bytes, value: Bytes, field: &mut impl FnMut(Bytes, Bytes)) {
        self.size = self
            .size
            .saturating_add(field_size(name.len(), value.len()));
        if self.size > self.max {
            self.too_large = true;
        }
        if !self.too_large {
            field(name, value);
        }
    }
}

/// A string read from a block.
struct Str {
    /// The string (empty if not `whole`).
    bytes: Bytes,
    /// It is a slice of the block (not a copy).
    from_block: bool,
    /// It was read whole (a Huffman string past the room is only checked).
    whole: bool,
}

impl Str {
    /// Makes the string a copy of its own if it is a slice of the block.
    fn own(&mut self) {
        if self.from_block {
            self.bytes = Bytes::copy_from_slice(&self.bytes);
            self.from_block = false;
        }
    }
}

/// Reads a block's primitives (RFC 7541 §5), checking every length first.
struct Reader<'a> {
    /// The block.
    block: &'a Bytes,
    /// Where the next read starts.
    pos: usize,
}

impl Reader<'_> {
    /// The next octet, not consumed.
    fn peek(&self) -> Option<u8> {
        self.block.get(self.pos).copied()
    }

    /// The next octet.
    fn byte(&mut self) -> Result<u8, DecodeError> {
        let b = self.peek().ok_or(DecodeError::Truncated)?;
        self.pos += 1;
        Ok(b)
    }

    /// An integer with a `prefix`-bit prefix (RFC 7541 §5.1), at most [`MAX_INTEGER`]
    /// and 5 octets after the prefix.
    fn int(&mut self, prefix: u32) -> Result<usize, DecodeError> {
        let max = u8::MAX >> (8 - prefix);
        let first = self.byte()? & max;
        if first < max {
            return Ok(usize::from(first));
        }
        let mut value = u64::from(max);
        let mut shift = 0u32;
        loop {
            let b = self.byte()?;
            value += u64::from(b & 0x7f) << shift;
            if value > MAX_INTEGER {
                return Err(DecodeError::IntegerOverflow);
            }
            if b & 0x80 == 0 {
                break;
            }
            shift += 7;
            if shift > 28 {
                return Err(DecodeError::IntegerOverflow);
            }
        }
        usize::try_from(value).map_err(|_| DecodeError::IntegerOverflow)
    }

    /// A string literal (RFC 7541 §5.2): a slice of the block, or Huffman-decoded
    /// into at most `room` bytes (past that only checked, and not `whole`).
    fn string(&mut self, room: usize) -> Result<Str, DecodeError> {
        let huffman = self.peek().ok_or(DecodeError::Truncated)? & 0x80 != 0;
        let len = self.int(7)?;
        let start = self.pos;
        let end = start
            .checked_add(len)
            .filter(|&end| end <= self.block.len())
            .ok_or(DecodeError::StringTooLong)?;
        self.pos = end;
        if !huffman {
            return Ok(Str {
                bytes: self.block.slice(start..end),
                from_block: true,
                whole: true,
            });
        }
        let mut out = Vec::new();
        let whole = huffman::decode(&self.block[start..end], room, &mut out)?;
        Ok(Str {
            bytes: if whole {
                Bytes::from(out)
            } else {
                Bytes::new()
            },
            from_block: false,
            whole,
        })
    }
}

#[cfg(test)]
mod tests;

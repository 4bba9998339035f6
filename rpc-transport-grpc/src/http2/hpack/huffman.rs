//! HPACK's Huffman code (RFC 7541 §5.2, Appendix B): decoding through a table built
//! at compile time, and encoding (which our encoder does not use on the wire, but
//! tests and fuzzing do).
//!
//! The code is canonical (codes of one length are consecutive, in symbol order, and
//! each length continues where the shorter ones ended) and complete (every bit string
//! is a prefix of some code); [`build_tree`] checks both at compile time.
//!
//! Decoding keeps up to 64 input bits in an accumulator and looks its next 12 bits up
//! in [`FAST`] (4096 entries of 4 bytes, 16 KiB, within the L1 cache): the one or two
//! symbols whose codes fit in those bits, and how many bits each took. Header text
//! (letters, digits, punctuation) has 5–8 bit codes, so one look-up usually yields two
//! symbols, and a look-up depends on the last only through a shift of the accumulator. Codes
//! longer than 12 bits (control bytes, bytes over 0x7f, and EOS) are found from their
//! length instead ([`decode_long`]: the canonical code's first code of each length).
//!
//! A string may end only with at most 7 bits of padding that are all ones (the start
//! of EOS); decoding EOS itself is an error.

#[cfg(any(test, fuzzing))]
use bytes::{BufMut, BytesMut};

/// What is wrong with a Huffman-coded string (RFC 7541 §5.2: each is a decoding error).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HuffmanError {
    /// The string contains the EOS symbol.
    Eos,
    /// The string ends with more than 7 bits of padding.
    PaddingTooLong,
    /// The padding is not the leading bits of EOS (all ones), or the string ends
    /// inside a symbol's code.
    PaddingNotOnes,
}

/// The code of each symbol, `(code, bit length)`, the code in the low bits: bytes
/// 0–255, then EOS (256). RFC 7541 Appendix B, in its order.
#[rustfmt::skip]
const CODES: [(u32, u8); 257] = [
    /*   0 */ (0x1ff8, 13), (0x7fffd8, 23), (0xfffffe2, 28), (0xfffffe3, 28),
    /*   4 */ (0xfffffe4, 28), (0xfffffe5, 28), (0xfffffe6, 28), (0xfffffe7, 28),
    /*   8 */ (0xfffffe8, 28), (0xffffea, 24), (0x3ffffffc, 30), (0xfffffe9, 28),
    /*  12 */ (0xfffffea, 28), (0x3ffffffd, 30), (0xfffffeb, 28), (0xfffffec, 28),
    /*  16 */ (0xfffffed, 28), (0xfffffee, 28), (0xfffffef, 28), (0xffffff0, 28),
    /*  20 */ (0xffffff1, 28), (0xffffff2, 28), (0x3ffffffe, 30), (0xffffff3, 28),
    /*  24 */ (0xffffff4, 28), (0xffffff5, 28), (0xffffff6, 28), (0xffffff7, 28),
    /*  28 */ (0xffffff8, 28), (0xffffff9, 28), (0xffffffa, 28), (0xffffffb, 28),
    /*  32 */ (0x14, 6), (0x3f8, 10), (0x3f9, 10), (0xffa, 12),
    /*  36 */ (0x1ff9, 13), (0x15, 6), (0xf8, 8), (0x7fa, 11),
    /*  40 */ (0x3fa, 10), (0x3fb, 10), (0xf9, 8), (0x7fb, 11),
    /*  44 */ (0xfa, 8), (0x16, 6), (0x17, 6), (0x18, 6),
    /*  48 */ (0x0, 5), (0x1, 5), (0x2, 5), (0x19, 6),
    /*  52 */ (0x1a, 6), (0x1b, 6), (0x1c, 6), (0x1d, 6),
    /*  56 */ (0x1e, 6), (0x1f, 6), (0x5c, 7), (0xfb, 8),
    /*  60 */ (0x7ffc, 15), (0x20, 6), (0xffb, 12), (0x3fc, 10),
    /*  64 */ (0x1ffa, 13), (0x21, 6), (0x5d, 7), (0x5e, 7),
    /*  68 */ (0x5f, 7), (0x60, 7), (0x61, 7), (0x62, 7),
    /*  72 */ (0x63, 7), (0x64, 7), (0x65, 7), (0x66, 7),
    /*  76 */ (0x67, 7), (0x68, 7), (0x69, 7), (0x6a, 7),
    /*  80 */ (0x6b, 7), (0x6c, 7), (0x6d, 7), (0x6e, 7),
    /*  84 */ (0x6f, 7), (0x70, 7), (0x71, 7), (0x72, 7),
    /*  88 */ (0xfc, 8), (0x73, 7), (0xfd, 8), (0x1ffb, 13),
    /*  92 */ (0x7fff0, 19), (0x1ffc, 13), (0x3ffc, 14), (0x22, 6),
    /*  96 */ (0x7ffd, 15), (0x3, 5), (0x23, 6), (0x4, 5),
    /* 100 */ (0x24, 6), (0x5, 5), (0x25, 6), (0x26, 6),
    /* 104 */ (0x27, 6), (0x6, 5), (0x74, 7), (0x75, 7),
    /* 108 */ (0x28, 6), (0x29, 6), (0x2a, 6), (0x7, 5),
    /* 112 */ (0x2b, 6), (0x76, 7), (0x2c, 6), (0x8, 5),
    /* 116 */ (0x9, 5), (0x2d, 6), (0x77, 7), (0x78, 7),
    /* 120 */ (0x79, 7), (0x7a, 7), (0x7b, 7), (0x7ffe, 15),
    /* 124 */ (0x7fc, 11), (0x3ffd, 14), (0x1ffd, 13), (0xffffffc, 28),
    /* 128 */ (0xfffe6, 20), (0x3fffd2, 22), (0xfffe7, 20), (0xfffe8, 20),
    /* 132 */ (0x3fffd3, 22), (0x3fffd4, 22), (0x3fffd5, 22), (0x7fffd9, 23),
    /* 136 */ (0x3fffd6, 22), (0x7fffda, 23), (0x7fffdb, 23), (0x7fffdc, 23),
    /* 140 */ (0x7fffdd, 23), (0x7fffde, 23), (0xffffeb, 24), (0x7fffdf, 23),
    /* 144 */ (0xffffec, 24), (0xffffed, 24), (0x3fffd7, 22), (0x7fffe0, 23),
    /* 148 */ (0xffffee, 24), (0x7fffe1, 23), (0x7fffe2, 23), (0x7fffe3, 23),
    /* 152 */ (0x7fffe4, 23), (0x1fffdc, 21), (0x3fffd8, 22), (0x7fffe5, 23),
    /* 156 */ (0x3fffd9, 22), (0x7fffe6, 23), (0x7fffe7, 23), (0xffffef, 24),
    /* 160 */ (0x3fffda, 22), (0x1fffdd, 21), (0xfffe9, 20), (0x3fffdb, 22),
    /* 164 */ (0x3fffdc, 22), (0x7fffe8, 23), (0x7fffe9, 23), (0x1fffde, 21),
    /* 168 */ (0x7fffea, 23), (0x3fffdd, 22), (0x3fffde, 22), (0xfffff0, 24),
    /* 172 */ (0x1fffdf, 21), (0x3fffdf, 22), (0x7fffeb, 23), (0x7fffec, 23),
    /* 176 */ (0x1fffe0, 21), (0x1fffe1, 21), (0x3fffe0, 22), (0x1fffe2, 21),
    /* 180 */ (0x7fffed, 23), (0x3fffe1, 22), (0x7fffee, 23), (0x7fffef, 23),
    /* 184 */ (0xfffea, 20), (0x3fffe2, 22), (0x3fffe3, 22), (0x3fffe4, 22),
    /* 188 */ (0x7ffff0, 23), (0x3fffe5, 22), (0x3fffe6, 22), (0x7ffff1, 23),
    /* 192 */ (0x3ffffe0, 26), (0x3ffffe1, 26), (0xfffeb, 20), (0x7fff1, 19),
    /* 196 */ (0x3fffe7, 22), (0x7ffff2, 23), (0x3fffe8, 22), (0x1ffffec, 25),
    /* 200 */ (0x3ffffe2, 26), (0x3ffffe3, 26), (0x3ffffe4, 26), (0x7ffffde, 27),
    /* 204 */ (0x7ffffdf, 27), (0x3ffffe5, 26), (0xfffff1, 24), (0x1ffffed, 25),
    /* 208 */ (0x7fff2, 19), (0x1fffe3, 21), (0x3ffffe6, 26), (0x7ffffe0, 27),
    /* 212 */ (0x7ffffe1, 27), (0x3ffffe7, 26), (0x7ffffe2, 27), (0xfffff2, 24),
    /* 216 */ (0x1fffe4, 21), (0x1fffe5, 21), (0x3ffffe8, 26), (0x3ffffe9, 26),
    /* 220 */ (0xffffffd, 28), (0x7ffffe3, 27), (0x7ffffe4, 27), (0x7ffffe5, 27),
    /* 224 */ (0xfffec, 20), (0xfffff3, 24), (0xfffed, 20), (0x1fffe6, 21),
    /* 228 */ (0x3fffe9, 22), (0x1fffe7, 21), (0x1fffe8, 21), (0x7ffff3, 23),
    /* 232 */ (0x3fffea, 22), (0x3fffeb, 22), (0x1ffffee, 25), (0x1ffffef, 25),
    /* 236 */ (0xfffff4, 24), (0xfffff5, 24), (0x3ffffea, 26), (0x7ffff4, 23),
    /* 240 */ (0x3ffffeb, 26), (0x7ffffe6, 27), (0x3ffffec, 26), (0x3ffffed, 26),
    /* 244 */ (0x7ffffe7, 27), (0x7ffffe8, 27), (0x7ffffe9, 27), (0x7ffffea, 27),
    /* 248 */ (0x7ffffeb, 27), (0xffffffe, 28), (0x7ffffec, 27), (0x7ffffed, 27),
    /* 252 */ (0x7ffffee, 27), (0x7ffffef, 27), (0x7fffff0, 27), (0x3ffffee, 26),
    /* 256 */ (0x3fffffff, 30),
];

/// The EOS symbol's number in [`CODES`].
const EOS: usize = 256;

/// The code tree, as [`build_tree`] makes it.
struct Tree {
    /// The two children of each inner node: another inner node, or [`LEAF`] with a
    /// symbol.
    children: [[u16; 2]; 256],
}

/// Marks a child of [`Tree::children`] as a leaf; the low bits are its symbol.
const LEAF: u16 = 0x8000;
/// A child not yet placed while the tree is built.
const NONE: u16 = u16::MAX;

/// Builds the code tree from [`CODES`]; fails to compile if the code is not a complete
/// prefix code with 256 inner nodes.
const fn build_tree() -> Tree {
    let mut tree = Tree {
        children: [[NONE; 2]; 256],
    };
    let mut nodes = 1;
    let mut symbol = 0;
    while symbol < CODES.len() {
        let (code, len) = CODES[symbol];
        assert!(5 <= len);
        assert!(len <= 30);
        let mut node = 0;
        let mut bit = len - 1;
        while bit > 0 {
            let b = ((code >> bit) & 1) as usize;
            if tree.children[node][b] == NONE {
                assert!(nodes < 256, "more than 256 inner nodes: not a prefix code");
                tree.children[node][b] = nodes as u16;
                nodes += 1;
            }
            let child = tree.children[node][b];
            assert!(child & LEAF == 0, "a code is a prefix of another");
            node = child as usize;
            bit -= 1;
        }
        let b = (code & 1) as usize;
        assert!(tree.children[node][b] == NONE, "two codes are equal");
        tree.children[node][b] = LEAF | symbol as u16;
        symbol += 1;
    }
    assert!(nodes == 256, "the code is not complete");
    let mut node = 0;
    while node < 256 {
        assert!(tree.children[node][0] != NONE && tree.children[node][1] != NONE);
        node += 1;
    }
    tree
}

/// The decoding tree, for [`FAST`] (compile time only).
const TREE: Tree = build_tree();

/// How many input bits one [`FAST`] look-up reads.
const FAST_BITS: u32 = 12;

/// Builds [`FAST`]: walks the tree along each 12-bit string from the root, taking the
/// symbols completed on the way (at most two: codes are at least 5 bits).
///
/// An entry holds the first symbol (bits 0–7), the second (8–15), how many were
/// completed (16–17: 0, 1 or 2), the first's code length (20–23) and both codes'
/// (24–31). With none completed (a code longer than 12 bits) the entry is 0.
const fn build_fast() -> [u32; 1 << FAST_BITS] {
    let mut table = [0; 1 << FAST_BITS];
    let mut index = 0;
    while index < table.len() {
        let mut node = 0;
        let mut count = 0;
        let mut entry = 0;
        let mut bit = 0;
        while bit < FAST_BITS && count < 2 {
            let b = (index >> (FAST_BITS - 1 - bit)) & 1;
            let child = TREE.children[node][b];
            bit += 1;
            if child & LEAF == 0 {
                node = child as usize;
                continue;
            }
            let symbol = (child & !LEAF) as u32;
            assert!(symbol < 256, "EOS is 30 bits");
            if count == 0 {
                entry = symbol | (bit << 20);
            } else {
                entry |= symbol << 8;
            }
            count += 1;
            entry = (entry & 0x00f0_ffff) | (count << 16) | (bit << 24);
            node = 0;
        }
        table[index] = entry;
        index += 1;
    }
    table
}

/// The symbols in the first 12 bits of the input (see [`build_fast`]).
static FAST: [u32; 1 << FAST_BITS] = build_fast();

/// The canonical code's shape, per code length (0–30), for [`decode_long`].
struct Lengths {
    /// The first (smallest) code of each length, or where it would be.
    first: [u32; 31],
    /// How many codes each length has.
    count: [u16; 31],
    /// Where each length's symbols start in `symbols`.
    offset: [u16; 31],
    /// The symbols, by code length, then by symbol.
    symbols: [u16; 257],
}

/// Builds [`LENGTHS`] from [`CODES`].
const fn build_lengths() -> Lengths {
    let mut lengths = Lengths {
        first: [0; 31],
        count: [0; 31],
        offset: [0; 31],
        symbols: [0; 257],
    };
    let mut symbol = 0;
    while symbol < CODES.len() {
        lengths.count[CODES[symbol].1 as usize] += 1;
        symbol += 1;
    }
    let mut code = 0u32;
    let mut offset = 0u16;
    let mut len = 1;
    while len <= 30 {
        lengths.first[len] = code;
        lengths.offset[len] = offset;
        code = (code + lengths.count[len] as u32) << 1;
        offset += lengths.count[len];
        len += 1;
    }
    let mut next = lengths.offset;
    let mut symbol = 0;
    while symbol < CODES.len() {
        let (code, len) = CODES[symbol];
        let len = len as usize;
        assert!(code == lengths.first[len] + (next[len] - lengths.offset[len]) as u32);
        lengths.symbols[next[len] as usize] = symbol as u16;
        next[len] += 1;
        symbol += 1;
    }
    lengths
}

/// The canonical code's shape (see [`build_lengths`]).
static LENGTHS: Lengths = build_lengths();

/// Decodes a code longer than [`FAST_BITS`] from the next 30 input bits (`bits`,
/// in the low 30 bits): the symbol (256 for EOS) and its length. In a canonical code,
/// the length is the first whose codes end above the input's prefix of that length.
fn decode_long(bits: u32) -> (usize, u32) {
    let mut len = FAST_BITS + 1;
    while len <= 30 {
        let l = len as usize;
        let prefix = bits >> (30 - len);
        let end = LENGTHS.first[l] + u32::from(LENGTHS.count[l]);
        if prefix < end {
            // `prefix` is at least the length's first code: it is at least the end of
            // the shorter lengths (or of the 12 bits the fast table found no code in),
            // shifted by one. (Should that fail, EOS: an error, not a panic.)
            let symbol = prefix
                .checked_sub(LENGTHS.first[l])
                .and_then(|i| {
                    LENGTHS
                        .symbols
                        .get(usize::from(LENGTHS.offset[l]) + i as usize)
                })
                .map_or(EOS, |&s| usize::from(s));
            return (symbol, len);
        }
        len += 1;
    }
    // Unreachable: the code is complete, so every 30 bits start with a code.
    (EOS, 30)
}

/// The most bytes `len` bytes of Huffman code can decode to: every code is at least 5
/// bits, so 8/5 of the length.
pub(crate) fn max_decoded_len(len: usize) -> usize {
    (len / 5).saturating_mul(8).saturating_add(len % 5 * 8 / 5)
}

/// Decodes `src` and appends the bytes to `dst`, at most `max` of them: past `max` it
/// goes on checking the code but appends nothing. `Ok(true)` if the whole string was
/// appended, `Ok(false)` if it was longer than `max` (and valid). On an error, `dst`
/// is as it was.
pub(crate) fn decode(src: &[u8], max: usize, dst: &mut Vec<u8>) -> Result<bool, HuffmanError> {
    let start = dst.len();
    let room = max_decoded_len(src.len()).min(max);
    // One byte more than the room: the fast path writes two bytes for one symbol.
    dst.resize(start.saturating_add(room).saturating_add(1), 0);
    let result = decode_into(src, &mut dst[start..], room);
    let written = result.map_or(0, |(written, _)| written);
    dst.truncate(start + written);
    result.map(|(_, whole)| whole)
}

/// [`decode`] into `out` (at least `room` + 1 bytes), writing at most `room`: how many
/// bytes it wrote, and whether that was the whole string.
fn decode_into(src: &[u8], out: &mut [u8], room: usize) -> Result<(usize, bool), HuffmanError> {
    let mut written = 0;
    let mut whole = true;
    // The next input bits, from the most significant; `bits` of them are valid (the
    // rest are zeros or the same input bits again), and `next` is the first byte of
    // `src` not yet in them.
    let mut acc: u64 = 0;
    let mut bits: u32 = 0;
    let mut next = 0;
    loop {
        if bits < 32 {
            // Whole bytes of 8 read at once, as many as fit; at the end, one by one.
            if let Some(chunk) = src.get(next..).and_then(<[u8]>::first_chunk::<8>) {
                acc |= u64::from_be_bytes(*chunk) >> bits;
                let added = (63 - bits) / 8;
                next += added as usize;
                bits += added * 8;
            } else {
                while let Some(&byte) = src.get(next).filter(|_| bits <= 56) {
                    acc |= u64::from(byte) << (56 - bits);
                    next += 1;
                    bits += 8;
                }
            }
        }
        let entry = FAST[(acc >> (64 - FAST_BITS)) as usize];
        // The common case: 12 valid bits with one or two codes in them, and room for
        // two bytes. Both bytes are written; `written` counts the symbols.
        if entry != 0 && bits >= FAST_BITS && written + 2 <= room {
            if let Some(pair) = out.get_mut(written..written + 2) {
                pair[0] = entry as u8;
                pair[1] = (entry >> 8) as u8;
            }
            written += ((entry >> 16) & 3) as usize;
            let used = entry >> 24;
            acc <<= used;
            bits -= used;
            continue;
        }
        // Otherwise one symbol at a time: near the end of the input, near the room's
        // end, or a code longer than 12 bits.
        if bits == 0 {
            return Ok((written, whole));
        }
        let (symbol, len) = if entry != 0 {
            (usize::from(entry as u8), (entry >> 20) & 0xf)
        } else {
            decode_long((acc >> 34) as u32)
        };
        if len > bits {
            // No code ends within the input's last bits (`src` is all read, as
            // `bits` < 30): they must be padding.
            let ones = (1u64 << bits) - 1;
            return if acc >> (64 - bits) != ones {
                Err(HuffmanError::PaddingNotOnes)
            } else if bits > 7 {
                Err(HuffmanError::PaddingTooLong)
            } else {
                Ok((written, whole))
            };
        }
        if symbol == EOS {
            return Err(HuffmanError::Eos);
        }
        match out.get_mut(written).filter(|_| written < room) {
            Some(byte) => {
                *byte = symbol as u8;
                written += 1;
            }
            None => whole = false,
        }
        acc <<= len;
        bits -= len;
    }
}

#[cfg(any(test, fuzzing))]
/// How many bytes [`encode`] writes for `src`.
pub(crate) fn encoded_len(src: &[u8]) -> usize {
    let bits: usize = src
        .iter()
        .map(|&b| usize::from(CODES[usize::from(b)].1))
        .sum();
    bits.div_ceil(8)
}

#[cfg(any(test, fuzzing))]
/// Appends the Huffman code of `src` to `dst`, padded with the leading bits of EOS
/// (ones) to a whole byte.
pub(crate) fn encode(src: &[u8], dst: &mut BytesMut) {
    dst.reserve(encoded_len(src));
    // Bits not yet written, in the low `bits` bits; at most 31 + 30 of them.
    let mut acc: u64 = 0;
    let mut bits: u32 = 0;
    for &b in src {
        let (code, len) = CODES[usize::from(b)];
        acc = (acc << len) | u64::from(code);
        bits += u32::from(len);
        if bits >= 32 {
            bits -= 32;
            dst.put_u32((acc >> bits) as u32);
        }
    }
    if bits % 8 != 0 {
        let pad = 8 - bits % 8;
        acc = (acc << pad) | ((1 << pad) - 1);
        bits += pad;
    }
    while bits >= 8 {
        bits -= 8;
        dst.put_u8((acc >> bits) as u8);
    }
}

#[cfg(test)]
mod tests {
    use std::{collections::HashMap, sync::OnceLock};

    use super::*;

    /// Decodes a whole string.
    fn decode_all(src: &[u8]) -> Result<Vec<u8>, HuffmanError> {
        let mut out = Vec::new();
        assert!(decode(src, usize::MAX, &mut out)?);
        Ok(out)
    }

    fn encode_all(src: &[u8]) -> Vec<u8> {
        let mut out = BytesMut::new();
        encode(src, &mut out);
        assert_eq!(out.len(), encoded_len(src));
        out.to_vec()
    }

    /// The slow way: walks the tree one bit at a time from the codes themselves (not
    /// from the built tree), the reference the state machine is checked against.
    fn decode_bitwise(src: &[u8]) -> Result<Vec<u8>, HuffmanError> {
        static BY_CODE: OnceLock<HashMap<(u32, u8), usize>> = OnceLock::new();
        let by_code =
            BY_CODE.get_or_init(|| CODES.iter().enumerate().map(|(s, &c)| (c, s)).collect());
        let mut out = Vec::new();
        let (mut code, mut len) = (0u32, 0u8);
        for i in 0..src.len() * 8 {
            let bit = (src[i / 8] >> (7 - i % 8)) & 1;
            code = (code << 1) | u32::from(bit);
            len += 1;
            if let Some(&symbol) = by_code.get(&(code, len)) {
                if symbol == EOS {
                    return Err(HuffmanError::Eos);
                }
                out.push(symbol as u8);
                (code, len) = (0, 0);
            }
        }
        if len > 7 && code == (1 << len) - 1 {
            Err(HuffmanError::PaddingTooLong)
        } else if code != (1 << len) - 1 {
            Err(HuffmanError::PaddingNotOnes)
        } else {
            Ok(out)
        }
    }

    /// A small deterministic PRNG (xorshift64*).
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
    }

    #[test]
    fn code_is_canonical_and_complete() {
        // Canonical: sorted by (length, symbol), each code is the previous plus one,
        // shifted to the new length. A mistyped code or length breaks it.
        let mut order: Vec<usize> = (0..CODES.len()).collect();
        order.sort_by_key(|&s| (CODES[s].1, s));
        let mut next = 0u64;
        let mut prev_len = CODES[order[0]].1;
        for &s in &order {
            let (code, len) = CODES[s];
            next <<= len - prev_len;
            prev_len = len;
            assert_eq!(u64::from(code), next, "symbol {s}");
            next += 1;
        }
        // Complete: the last code is all ones (EOS), so Kraft's sum is exactly 1.
        assert_eq!(next, 1 << 30);
        assert_eq!(CODES[EOS], (0x3fff_ffff, 30));
    }

    #[test]
    fn spot_codes_from_the_rfc() {
        assert_eq!(CODES[usize::from(b' ')], (0x14, 6));
        assert_eq!(CODES[usize::from(b'0')], (0x0, 5));
        assert_eq!(CODES[usize::from(b'a')], (0x3, 5));
        assert_eq!(CODES[usize::from(b'~')], (0x1ffd, 13));
        assert_eq!(CODES[255], (0x3ff_ffee, 26));
    }

    #[test]
    fn rfc_examples_decode_and_encode() {
        // RFC 7541 C.4 and C.6 Huffman strings.
        let cases: &[(&str, &[u8])] = &[
            ("f1e3c2e5f23a6ba0ab90f4ff", b"www.example.com"),
            ("a8eb10649cbf", b"no-cache"),
            ("25a849e95ba97d7f", b"custom-key"),
            ("25a849e95bb8e8b4bf", b"custom-value"),
            ("6402", b"302"),
            ("aec3771a4b", b"private"),
            ("d07abe941054d444a8200595040b8166e082a62d1bff", b"Mon, 21 Oct 2013 20:13:21 GMT"),
            ("9d29ad171863c78f0b97c8e9ae82ae43d3", b"https://www.example.com"),
            ("640eff", b"307"),
            ("9bd9ab", b"gzip"),
            (
                "94e7821dd7f2e6c7b335dfdfcd5b3960d5af27087f3672c1ab270fb5291f9587316065c003ed4ee5b1063d5007",
                b"foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1",
            ),
        ];
        for (hex, text) in cases {
            let code = unhex(hex);
            assert_eq!(decode_all(&code).as_deref(), Ok(*text), "{hex}");
            assert_eq!(encode_all(text), code, "{hex}");
        }
    }

    fn unhex(hex: &str) -> Vec<u8> {
        (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn every_byte_round_trips() {
        for b in 0..=255u8 {
            for n in 1..=9 {
                let text = vec![b; n];
                assert_eq!(decode_all(&encode_all(&text)), Ok(text), "{b} x {n}");
            }
        }
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(decode_all(&encode_all(&all)), Ok(all.clone()));
        let rev: Vec<u8> = all.iter().rev().copied().collect();
        assert_eq!(decode_all(&encode_all(&rev)), Ok(rev));
        assert_eq!(decode_all(&[]), Ok(Vec::new()));
    }

    #[test]
    fn random_strings_round_trip() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for _ in 0..2000 {
            let len = (rng.next() % 64) as usize;
            // Mostly header-like text, sometimes any byte.
            let any = rng.next() % 4 == 0;
            let text: Vec<u8> = (0..len)
                .map(|_| {
                    let r = rng.next() as u8;
                    if any {
                        r
                    } else {
                        b'!' + r % 94
                    }
                })
                .collect();
            let code = encode_all(&text);
            assert_eq!(decode_all(&code), Ok(text.clone()));
            assert!(text.len() <= max_decoded_len(code.len()));
        }
    }

    #[test]
    fn table_decoder_agrees_with_the_bitwise_decoder() {
        // Random bytes are mostly invalid (long codes, bad padding): both decoders must
        // say the same about each, valid or not.
        let mut rng = Rng(7);
        let mut valid = 0;
        for _ in 0..20_000 {
            let len = (rng.next() % 40) as usize;
            let mut src: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            if rng.next() % 2 == 0 {
                // A valid string (text, or any bytes: long codes), then maybe one bit
                // flipped or the end cut.
                let any = rng.next() % 3 == 0;
                let text: Vec<u8> = src
                    .iter()
                    .map(|&b| if any { b } else { b'!' + b % 94 })
                    .collect();
                src = encode_all(&text);
                match rng.next() % 3 {
                    0 if !src.is_empty() => {
                        let bit = (rng.next() as usize) % (src.len() * 8);
                        src[bit / 8] ^= 0x80 >> (bit % 8);
                    }
                    1 => src.truncate((rng.next() as usize) % (src.len() + 1)),
                    _ => {}
                }
            }
            let fast = decode_all(&src);
            valid += usize::from(fast.is_ok());
            assert_eq!(fast, decode_bitwise(&src), "{src:02x?}");
        }
        assert!(valid > 3000, "only {valid} valid inputs");
    }

    #[test]
    fn invalid_strings() {
        // EOS (30 ones) inside a string, with 2 bits of padding.
        assert_eq!(
            decode_all(&[0xff, 0xff, 0xff, 0xff]),
            Err(HuffmanError::Eos)
        );
        // 'a' (00011), then EOS: 5 + 30 bits, padded with ones to 40.
        let mut with_eos = BytesMut::new();
        with_eos.put_u64((0b00011 << 59) | (0x3fff_ffff << 29) | ((1 << 29) - 1));
        assert_eq!(decode_all(&with_eos[..5]), Err(HuffmanError::Eos));
        // Padding of 8 ones: a whole byte of 0xff after a complete string.
        let mut padded = encode_all(b"ab");
        assert_eq!(padded.len(), 2); // 5 + 6 bits, 5 bits of padding.
        padded.push(0xff);
        assert_eq!(decode_all(&padded), Err(HuffmanError::PaddingTooLong));
        assert_eq!(decode_all(&[0xff]), Err(HuffmanError::PaddingTooLong));
        // Padding with a zero: 'a' then 000.
        assert_eq!(
            decode_all(&[0b0001_1000]),
            Err(HuffmanError::PaddingNotOnes)
        );
        // 'a' then 101 (not a prefix of EOS).
        assert_eq!(
            decode_all(&[0b0001_1101]),
            Err(HuffmanError::PaddingNotOnes)
        );
        // '0' (00000), then 000.
        assert_eq!(decode_all(&[0x00]), Err(HuffmanError::PaddingNotOnes));
    }

    #[test]
    fn decode_stops_writing_at_max_but_checks_the_rest() {
        let code = encode_all(b"hello world");
        let mut out = b"x".to_vec();
        assert_eq!(decode(&code, 5, &mut out), Ok(false));
        assert_eq!(out, b"xhello");
        let mut out = Vec::new();
        assert_eq!(decode(&code, 11, &mut out), Ok(true));
        assert_eq!(out, b"hello world");
        // An invalid tail is still found past the maximum.
        let mut bad = code.clone();
        bad.push(0xff);
        assert_eq!(
            decode(&bad, 0, &mut Vec::new()),
            Err(HuffmanError::PaddingTooLong)
        );
    }

    #[test]
    fn max_decoded_len_bounds() {
        assert_eq!(max_decoded_len(0), 0);
        assert_eq!(max_decoded_len(5), 8);
        // '0' has a 5-bit code: n of them take ceil(5n/8) bytes.
        for n in 0..100 {
            let code = encode_all(&vec![b'0'; n]);
            assert!(max_decoded_len(code.len()) >= n, "{n}");
        }
        assert!(max_decoded_len(usize::MAX) > 0);
    }
}

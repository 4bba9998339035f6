//! gzip: one or more gzip members (RFC 1952) per message, what gRPC peers speak (the
//! `gzip` feature: flate2 on miniz_oxide, pure Rust).

use std::io::{Read, Write};

use bytes::Bytes;

use super::INITIAL_OUTPUT;
use crate::Status;

/// Compresses `input` into one gzip member at `level` (gzip's scale: 0 stores … 9;
/// clamped into it).
pub(super) fn compress(input: &[u8], level: i32) -> Option<Vec<u8>> {
    let level = flate2::Compression::new(level.clamp(0, 9).unsigned_abs());
    let mut encoder =
        flate2::write::GzEncoder::new(Vec::with_capacity(input.len() / 2 + 32), level);
    encoder.write_all(input).ok()?;
    encoder.finish().ok()
}

/// The most gzip members one message may hold. A sender writes one; each member
/// costs the receiver a fresh decoder state, so a message of empty members (20 bytes
/// each) would buy about 100 times its size in CPU work without this bound.
pub(super) const MAX_MEMBERS: usize = 64;

/// Decompresses gzip members (at most [`MAX_MEMBERS`]) into at most `max_len` bytes.
///
/// gzip says nothing trustworthy about the size ahead (the trailer's `ISIZE` comes
/// last and is the size modulo 2^32), so nothing is reserved on its word: the output
/// starts at [`INITIAL_OUTPUT`] (or `max_len`, if smaller) and doubles, up to
/// `max_len`, only when data has really decompressed into all of it. When it is full at
/// `max_len`, one more byte of output is a decompression bomb: `RESOURCE_EXHAUSTED`,
/// after at most `max_len` bytes of work. The decoder's own state (a 32 KiB window)
/// is fixed, whatever the data says. Each member's CRC-32 and length are checked.
pub(super) fn decompress(
    data: &[u8],
    max_len: usize,
    reserved: &mut dyn FnMut(usize),
) -> Result<Bytes, Status> {
    let mut decoder = Members::new(data);
    let mut output: Vec<u8> = Vec::new();
    let mut filled = 0;
    loop {
        // Input is let through only as output comes of it (`Input`), and each read
        // asks for at most `READ_STEP` bytes, so a read cannot take much more input
        // than the allowance set before it.
        decoder.allow(filled);
        if filled == output.len() {
            if output.len() == max_len {
                let mut probe = [0u8; 1];
                if decoder.read(&mut probe)? != 0 {
                    return Err(Status::resource_exhausted(format!(
                        "compressed message expands to more than the limit of {max_len} bytes"
                    )));
                }
                break;
            }
            let capacity = if output.is_empty() {
                INITIAL_OUTPUT.min(max_len)
            } else {
                output.len().saturating_mul(2).min(max_len)
            };
            output.reserve_exact(capacity - output.len());
            reserved(output.capacity());
            output.resize(capacity, 0);
        }
        let end = output.len().min(filled + READ_STEP);
        let n = decoder.read(&mut output[filled..end])?;
        if n == 0 {
            break;
        }
        filled += n;
    }
    output.truncate(filled);
    // The buffer grows by doubling: up to twice the message, or 64 KiB for one byte,
    // which `Bytes` would keep while the budgets count only the message's length
    // (from a review). Given back when it is well over.
    if output.capacity() - filled > filled / 8 {
        output.shrink_to_fit();
    }
    Ok(Bytes::from(output))
}

/// Output asked of the decoder per read: bounds the input one read may take.
const READ_STEP: usize = 32 * 1024;

/// Input a message may take beyond its output so far (headers, Huffman tables, a
/// stored block's framing: a real gzip stream never needs more than this ahead).
const INPUT_SLACK: usize = 64 * 1024;

/// The message's bytes, let through to the decoder only as far as its output so far
/// allows: `output + output / 8 + INPUT_SLACK`. Work per input byte is not bounded by
/// the output (deflate blocks of nothing: ten bits each, and miniz_oxide rebuilds its
/// tables for each, about a microsecond; 16 MiB of them were some 15 s of CPU for an
/// empty message), and a real gzip stream, even of incompressible data (stored
/// blocks), expands to nearly its size at least (from a review).
struct Input<'a> {
    data: &'a [u8],
    taken: usize,
    allowed: std::rc::Rc<std::cell::Cell<usize>>,
}

impl Read for Input<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let available = std::io::BufRead::fill_buf(self)?;
        let n = available.len().min(buf.len());
        buf[..n].copy_from_slice(&available[..n]);
        std::io::BufRead::consume(self, n);
        Ok(n)
    }
}

impl std::io::BufRead for Input<'_> {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        let end = self.data.len().min(self.allowed.get());
        if end <= self.taken && self.taken < self.data.len() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "it does not expand with its size (a stream of empty blocks?)",
            ));
        }
        Ok(&self.data[self.taken..end.max(self.taken)])
    }

    fn consume(&mut self, n: usize) {
        self.taken = (self.taken + n).min(self.data.len());
    }
}

/// The members of one message, read one after another (as gzip readers concatenate
/// them), counted.
struct Members<'a> {
    decoder: flate2::bufread::GzDecoder<Input<'a>>,
    count: usize,
    allowed: std::rc::Rc<std::cell::Cell<usize>>,
}

impl<'a> Members<'a> {
    fn new(data: &'a [u8]) -> Self {
        let allowed = std::rc::Rc::new(std::cell::Cell::new(INPUT_SLACK));
        let input = Input {
            data,
            taken: 0,
            allowed: allowed.clone(),
        };
        Members {
            decoder: flate2::bufread::GzDecoder::new(input),
            count: 1,
            allowed,
        }
    }

    /// Lets input through for `output` bytes of output so far.
    fn allow(&mut self, output: usize) {
        self.allowed.set(
            output
                .saturating_add(output / 8)
                .saturating_add(INPUT_SLACK),
        );
    }

    /// Reads decompressed bytes into `buf` (not empty); 0 at the end of the last
    /// member.
    fn read(&mut self, buf: &mut [u8]) -> Result<usize, Status> {
        loop {
            let n = read(&mut self.decoder, buf)?;
            // The member's end: what follows it, if anything, is the next member.
            let input = self.decoder.get_ref();
            if n > 0 || input.taken == input.data.len() {
                return Ok(n);
            }
            self.count += 1;
            if self.count > MAX_MEMBERS {
                return Err(Status::internal(format!(
                    "compressed message (gzip) of more than {MAX_MEMBERS} members"
                )));
            }
            let rest = Input {
                data: input.data,
                taken: input.taken,
                allowed: self.allowed.clone(),
            };
            self.decoder = flate2::bufread::GzDecoder::new(rest);
        }
    }
}

/// One read of decompressed data; a corrupt or truncated member is `INTERNAL`.
fn read(decoder: &mut impl Read, buf: &mut [u8]) -> Result<usize, Status> {
    loop {
        match decoder.read(buf) {
            Ok(n) => return Ok(n),
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(err) => {
                return Err(Status::internal(format!(
                    "corrupt compressed message (gzip): {err}"
                )))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Code;

    /// Decompresses `data` with a limit of `max_len`; the result and the largest output
    /// buffer reserved on the way.
    fn measured(data: &[u8], max_len: usize) -> (Result<Bytes, Status>, usize) {
        let mut largest = 0;
        let result = decompress(data, max_len, &mut |n| largest = largest.max(n));
        (result, largest)
    }

    /// A gzip member of `blocks` empty fixed-Huffman deflate blocks (ten bits each):
    /// no output at all.
    fn empty_blocks(blocks: usize) -> Vec<u8> {
        let mut out = vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];
        let (mut acc, mut bits) = (0u32, 0u32);
        let mut put = |value: u32, n: u32, out: &mut Vec<u8>| {
            acc |= value << bits;
            bits += n;
            while bits >= 8 {
                out.push(acc as u8);
                acc >>= 8;
                bits -= 8;
            }
        };
        for i in 0..blocks {
            let last = u32::from(i + 1 == blocks);
            put(last, 1, &mut out); // BFINAL
            put(1, 2, &mut out); // BTYPE 01: fixed Huffman
            put(0, 7, &mut out); // end of block (256): seven zero bits
        }
        put(0, 7, &mut out); // to the byte
        out.truncate(out.len() - usize::from(bits == 0));
        out.extend_from_slice(&[0; 8]); // CRC-32 and size of nothing
        out
    }

    #[test]
    fn a_message_that_does_not_expand_with_its_size_is_refused_early() {
        let empty = empty_blocks(8);
        assert_eq!(
            measured(&empty, 1 << 20).0.unwrap().len(),
            0,
            "a real empty member"
        );
        // 200,000 empty blocks (250 KB): refused once the input is past what no
        // output allows, not decoded to the end.
        let (result, _) = measured(&empty_blocks(200_000), 16 << 20);
        let err = result.unwrap_err();
        assert_eq!(err.code(), Code::INTERNAL, "{err}");
        assert!(err.message().contains("does not expand"), "{err}");
        // Incompressible data, stored or deflated, still goes through whole.
        let random: Vec<u8> = (0..3_000_000u64)
            .map(|i| (i.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as u8)
            .collect();
        for level in [0, 6] {
            let packed = compress(&random, level).unwrap();
            assert_eq!(
                measured(&packed, 16 << 20).0.unwrap(),
                random,
                "level {level}"
            );
        }
    }

    #[test]
    fn output_grows_with_what_really_decompresses() {
        for len in [
            0,
            1,
            1000,
            INITIAL_OUTPUT,
            INITIAL_OUTPUT + 1,
            3 * 1024 * 1024,
        ] {
            let payload: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let packed = compress(&payload, 1).unwrap();
            let (result, largest) = measured(&packed, 16 * 1024 * 1024);
            assert_eq!(result.unwrap(), payload, "{len}");
            assert!(largest <= (2 * len).max(INITIAL_OUTPUT), "{len}: {largest}");
            // Exactly at the limit is fine; one byte under is not.
            assert_eq!(measured(&packed, len).0.unwrap().len(), len);
            if len > 0 {
                let (result, largest) = measured(&packed, len - 1);
                assert_eq!(result.unwrap_err().code(), Code::RESOURCE_EXHAUSTED);
                assert!(largest < len, "{len}: {largest}");
            }
        }
    }

    #[test]
    fn a_bomb_stops_at_the_limit() {
        // 64 MiB of zeros in about 64 KiB; the receiver's limit is 1 MiB.
        let bomb = compress(&vec![0u8; 64 << 20], 9).unwrap();
        assert!(bomb.len() < 128 * 1024, "{}", bomb.len());
        let (result, largest) = measured(&bomb, 1 << 20);
        assert_eq!(result.unwrap_err().code(), Code::RESOURCE_EXHAUSTED);
        assert!(largest <= 1 << 20, "reserved {largest} bytes");
        // A trailer that lies about the size (ISIZE, the last 4 bytes) buys nothing
        // either: the member is refused for its bad length.
        let mut liar = compress(&[7u8; 1000], 1).unwrap();
        let end = liar.len();
        liar[end - 4..].copy_from_slice(&u32::MAX.to_le_bytes());
        let (result, largest) = measured(&liar, 16 << 20);
        assert_eq!(result.unwrap_err().code(), Code::INTERNAL);
        assert!(largest <= INITIAL_OUTPUT);
    }

    #[test]
    fn corrupt_truncated_and_trailing_garbage_are_refused() {
        let packed = compress(&b"hello gzip ".repeat(100), 6).unwrap();
        let mut corrupt = packed.clone();
        let mid = corrupt.len() / 2;
        corrupt[mid] ^= 0xff;
        let truncated = &packed[..packed.len() - 3];
        let mut trailing = packed.clone();
        trailing.extend_from_slice(b"junk");
        for bad in [&corrupt[..], truncated, &trailing[..]] {
            let err = decompress(bad, 1 << 20, &mut |_| {}).unwrap_err();
            assert_eq!(err.code(), Code::INTERNAL, "{err}");
        }
        // Two members make one message (as gzip readers concatenate them).
        let mut two = compress(b"one ", 1).unwrap();
        two.extend(compress(b"two", 1).unwrap());
        assert_eq!(
            decompress(&two, 100, &mut |_| {}).unwrap(),
            Bytes::from_static(b"one two")
        );
    }

    #[test]
    fn members_past_the_bound_are_refused() {
        let empty = compress(b"", 1).unwrap();
        let data = compress(b"data", 1).unwrap();
        // Up to the bound, empty members around the data are fine.
        let mut fine = empty.repeat(MAX_MEMBERS - 2);
        fine.extend_from_slice(&data);
        fine.extend_from_slice(&empty);
        assert_eq!(
            decompress(&fine, 100, &mut |_| {}).unwrap(),
            Bytes::from_static(b"data")
        );
        // One more is refused, wherever the data is: 50,000 empty members are 1 MiB
        // that would cost a fresh decoder each.
        for over in [empty.repeat(MAX_MEMBERS + 1), empty.repeat(50_000), {
            let mut late = empty.repeat(MAX_MEMBERS);
            late.extend_from_slice(&data);
            late
        }] {
            let err = decompress(&over, 1 << 20, &mut |_| {}).unwrap_err();
            assert_eq!(err.code(), Code::INTERNAL, "{err}");
            assert!(err.message().contains("members"), "{err}");
        }
        // No member at all is corrupt, as before.
        assert_eq!(
            decompress(b"", 100, &mut |_| {}).unwrap_err().code(),
            Code::INTERNAL
        );
    }
}

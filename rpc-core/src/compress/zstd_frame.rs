//! zstd: one zstd frame **with its content size** per message (the `zstd` feature).

use bytes::Bytes;

use super::INITIAL_OUTPUT;
use crate::Status;

/// Compresses `input` at `level` (zstd's scale: 1 fast … 22; negative levels are
/// faster still). `None` if zstd fails, which it does not for valid levels.
pub(super) fn compress(input: &[u8], level: i32) -> Option<Vec<u8>> {
    zstd::bulk::compress(input, level).ok()
}

/// Decompresses one zstd frame into at most `max_len` bytes.
///
/// The content size in the frame header is the peer's claim: it is checked against
/// `max_len` but never reserved up front (nine bytes of header could otherwise claim
/// 16 MiB). The output starts at [`INITIAL_OUTPUT`] (or the claimed size, if smaller)
/// and doubles, up to the claimed size, only when decompression ran out of room, that
/// is when the data really expands that far. zstd decompresses in one pass into the
/// output (no window buffer of the frame's choosing); a retry decompresses again from
/// the start, which at most doubles the work for messages that expand a lot.
pub(super) fn decompress(
    data: &[u8],
    max_len: usize,
    reserved: &mut dyn FnMut(usize),
) -> Result<Bytes, Status> {
    use zstd::zstd_safe::{self, zstd_sys::ZSTD_ErrorCode};

    let size = match zstd_safe::get_frame_content_size(data) {
        Ok(Some(size)) => size,
        Ok(None) => {
            return Err(Status::internal(
                "compressed message without its content size (write zstd frames with it)",
            ))
        }
        Err(_) => return Err(Status::internal("compressed message is not zstd")),
    };
    let size = usize::try_from(size).unwrap_or(usize::MAX);
    if size > max_len {
        return Err(super::over_limit(size, max_len));
    }
    // A frame far larger than what it says it holds is no real one (raw blocks of
    // incompressible data add 3 bytes per 128 KiB): its blocks of nothing would each
    // cost work that no output counts (from a review).
    if data.len() > size.saturating_add(size / 100).saturating_add(64 * 1024) {
        return Err(Status::internal(format!(
            "compressed message of {} bytes for {size} bytes of content (zstd)",
            data.len()
        )));
    }
    // One frame, and nothing after it: zstd decodes every frame that follows the
    // first (skippable ones, ones without a content size), each at its own cost,
    // which the first frame's size check does not see (from a review).
    match zstd_safe::find_frame_compressed_size(data) {
        Ok(len) if len == data.len() => {}
        Ok(_) => {
            return Err(Status::internal(
                "compressed message is not one zstd frame (something follows the first)",
            ))
        }
        // The frame's blocks run past the message's end (a frame cut short), or are
        // malformed: not "something follows" (from a review).
        Err(_) => {
            return Err(Status::internal(
                "corrupt compressed message: the zstd frame is cut short or its blocks \
                 are malformed",
            ))
        }
    }
    let too_small = (ZSTD_ErrorCode::ZSTD_error_dstSize_tooSmall as usize).wrapping_neg();
    let mut dctx = zstd_safe::DCtx::create();
    let mut capacity = size.min(INITIAL_OUTPUT);
    let output = loop {
        let mut output = Vec::with_capacity(capacity);
        reserved(output.capacity());
        match dctx.decompress(&mut output, data) {
            Ok(_) => break output,
            Err(code) if code == too_small && capacity < size => {
                drop(output);
                capacity = capacity.saturating_mul(2).min(size);
            }
            Err(code) => {
                return Err(Status::internal(format!(
                    "corrupt compressed message: {}",
                    zstd_safe::get_error_name(code)
                )))
            }
        }
    };
    if output.len() != size {
        return Err(Status::internal(
            "compressed message shorter than its content size",
        ));
    }
    Ok(Bytes::from(output))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compress::{Algorithm, Payload};

    /// Decompresses `data` with a limit of 16 MiB; the result and the largest output
    /// buffer reserved on the way.
    fn decompress_measured(data: &[u8]) -> (Result<Bytes, Status>, usize) {
        let mut largest = 0;
        let result = decompress(data, 16 * 1024 * 1024, &mut |n| largest = largest.max(n));
        (result, largest)
    }

    fn packed(payload: &[u8]) -> Vec<u8> {
        crate::compress::compress(Algorithm::Zstd, &Payload::from(payload.to_vec()), 1, true)
            .unwrap()
            .to_bytes()
            .to_vec()
    }

    #[test]
    fn a_frame_cut_short_says_so() {
        let whole = packed(&[9; 4000]);
        let cut = &whole[..whole.len() - 3];
        let err = decompress_measured(cut).0.unwrap_err();
        assert_eq!(err.code(), crate::Code::INTERNAL);
        assert!(err.message().contains("cut short"), "{}", err.message());
        let mut twice = whole.clone();
        twice.extend_from_slice(&whole);
        let err = decompress_measured(&twice).0.unwrap_err();
        assert!(
            err.message().contains("something follows"),
            "{}",
            err.message()
        );
    }

    #[test]
    fn a_claimed_content_size_buys_no_allocation() {
        // Issue 19 item 10: a zstd frame header claiming 16,777,215 bytes of content
        // (single segment, 4-byte content size), and no block at all.
        let bomb = [0x28, 0xb5, 0x2f, 0xfd, 0xb4, 0xff, 0xff, 0xff, 0x00];
        assert!(matches!(
            zstd::zstd_safe::get_frame_content_size(&bomb),
            Ok(Some(16_777_215))
        ));
        let (result, largest) = decompress_measured(&bomb);
        assert_eq!(result.unwrap_err().code(), crate::Code::INTERNAL);
        assert!(largest <= INITIAL_OUTPUT, "reserved {largest} bytes");
    }

    #[test]
    fn a_frame_much_larger_than_its_content_is_refused() {
        // A frame of content size 0 (single segment, 1-byte size) made of 30,000 raw
        // blocks of nothing, then a last one: valid zstd, 90 KB for no output.
        let mut frame = vec![0x28, 0xb5, 0x2f, 0xfd, 0x20, 0x00];
        for _ in 0..30_000 {
            frame.extend_from_slice(&[0, 0, 0]);
        }
        frame.extend_from_slice(&[1, 0, 0]);
        let err = decompress_measured(&frame).0.unwrap_err();
        assert_eq!(err.code(), crate::Code::INTERNAL, "{err}");
        assert!(err.message().contains("bytes of content"), "{err}");
        // A few such blocks are within the slack: zstd takes them.
        let small = [0x28, 0xb5, 0x2f, 0xfd, 0x20, 0x00, 0, 0, 0, 1, 0, 0];
        assert_eq!(decompress_measured(&small).0.unwrap().len(), 0);
    }

    #[test]
    fn anything_after_the_first_frame_is_refused() {
        let one = packed(b"hello");
        assert_eq!(decompress_measured(&one).0.unwrap(), &b"hello"[..]);
        // A second frame (of no size) and a skippable frame (magic 0x184D2A50, a
        // 4-byte length, its bytes) after the first: each decoded at its own cost.
        let empty = zstd::bulk::compress(b"", 3).unwrap();
        let skippable = [0x50, 0x2a, 0x4d, 0x18, 4, 0, 0, 0, 1, 2, 3, 4];
        for tail in [&empty[..], &skippable[..], &[0u8][..]] {
            let mut two = one.clone();
            two.extend_from_slice(tail);
            let err = decompress_measured(&two).0.unwrap_err();
            assert_eq!(err.code(), crate::Code::INTERNAL, "{err}");
        }
    }

    #[test]
    fn output_grows_with_what_really_decompresses() {
        // Honest messages of every size come back whole; the largest buffer reserved
        // is never more than twice what the message really expands to.
        for len in [
            0,
            1,
            1000,
            INITIAL_OUTPUT,
            INITIAL_OUTPUT + 1,
            3 * 1024 * 1024,
        ] {
            let payload: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let (result, largest) = decompress_measured(&packed(&payload));
            assert_eq!(result.unwrap(), payload, "{len}");
            assert!(largest <= (2 * len).max(INITIAL_OUTPUT), "{len}: {largest}");
        }
        // A frame that claims more than its blocks hold reserves no more than they
        // hold (rounded up to a doubling), then fails.
        let mut packed = packed(&[1u8; 200_000]);
        // Content size is the 4 bytes after the magic and the descriptor (FCS 4 bytes,
        // single segment at level 1 for 200 kB): claim 8 MiB instead.
        assert_eq!(
            packed[4] & 0xe0,
            0xa0,
            "single segment, 4-byte content size"
        );
        packed[5..9].copy_from_slice(&(8u32 * 1024 * 1024).to_le_bytes());
        let (result, largest) = decompress_measured(&packed);
        assert!(result.is_err());
        assert!(largest <= 512 * 1024, "reserved {largest} bytes");
    }
}

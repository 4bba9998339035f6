//! Entry points for the fuzz targets in `fuzz/` to the crate's private decoders: the
//! link's messages ([`link_message`]), the soft provider's packets and its region
//! tables. Compiled only with `--cfg fuzzing` (which `fuzz/run` sets) and in tests; not
//! part of the API.

use crate::wire::{self, Message};

pub use crate::soft::fuzzing::{soft_local_table, soft_packets, soft_peer_table, LocalOp, Query};

/// Decodes one link message as a receive buffer holds it; checks what a decoded
/// rendezvous announcement promises (its parts add up to the frame, within the
/// bounds on inline bytes and regions). Returns whether it decoded.
pub fn link_message(msg: &[u8]) -> bool {
    let Ok((header, message)) = wire::decode(msg) else {
        return false;
    };
    if let Message::Batch(batch) = &message {
        // Its entries are whole frames that fill the message, as the link takes them.
        let (mut total, mut frames) = (0, 0);
        for frame in batch.frames() {
            assert!(!frame.is_empty() && frame.len() <= batch.longest);
            total += wire::ENTRY_LEN + frame.len();
            frames += 1;
        }
        assert_eq!(total, batch.body.len(), "{header:?}");
        assert_eq!(frames, batch.frames);
    }
    if let Message::Rts(rts) = &message {
        assert!(rts.head.len() <= wire::MAX_INLINE_HEAD);
        let segments: Vec<_> = rts.segments().collect();
        assert!(segments.len() <= wire::MAX_SEGMENTS);
        let total = segments
            .iter()
            .try_fold(rts.head.len() as u64, |sum, d| sum.checked_add(d.len));
        assert_eq!(total, Some(rts.frame_len), "{header:?}");
        // It encodes back to the fields it came from.
        let mut again = vec![0u8; wire::rts_len(rts.head.len(), segments.len())];
        wire::put_rts(
            &mut again,
            header.credits,
            header.id,
            rts.frame_len,
            rts.head,
            &segments,
        );
        let fixed = wire::HEADER_LEN..wire::HEADER_LEN + 12;
        assert_eq!(again[fixed.clone()], msg[fixed]);
    }
    true
}

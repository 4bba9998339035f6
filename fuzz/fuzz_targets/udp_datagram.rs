//! One UDP datagram (`docs/wire.md` §1.2): `Datagram::decode` never panics, and a
//! fragment, acknowledgement or control datagram it accepts encodes back to the same
//! bytes (the fragment's ignored flags byte, an acknowledgement's reserved flag bits
//! and a control datagram's reserved bytes aside, and a TAGGED acknowledgement with
//! tag 0).

#![no_main]

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use rpc_transport_udp::datagram::{
    Datagram, ACK_ABORTED, ACK_COMPLETE, ACK_REFUSED, ACK_TAGGED, CONTROL_LEN, FRAGMENT_HEADER_LEN,
};

fuzz_target!(|data: &[u8]| {
    let Ok(datagram) = Datagram::decode(Bytes::copy_from_slice(data)) else {
        return;
    };
    let mut again = BytesMut::new();
    match &datagram {
        Datagram::Whole(frame) => {
            assert_eq!(&frame[..], data);
            return;
        }
        Datagram::Fragment(header, bytes) => {
            let (start, len) = header.span();
            assert_eq!(bytes.len(), len);
            assert!(start + len <= header.total as usize);
            assert!(header.index < header.count());
            header.encode(&mut again);
            assert_eq!(again.len(), FRAGMENT_HEADER_LEN);
            again.extend_from_slice(bytes);
            again[1] = data[1];
        }
        Datagram::Control(control) => {
            control.encode(&mut again);
            assert_eq!(again.len(), CONTROL_LEN);
            // Bytes 4..8 are reserved: ignored by the decoder, written as zeros.
            again[4..8].copy_from_slice(&data[4..8]);
        }
        Datagram::Ack(ack) => {
            let _ = (ack.highest(), ack.covers(ack.cumulative));
            ack.encode(&mut again);
            assert_eq!(again.len(), ack.encoded_len());
            if data[1] & ACK_TAGGED != 0 && ack.tag == 0 {
                // TAGGED with tag 0 ("none") is accepted; the encoder writes no tag.
                return;
            }
            // Reserved flag bits are ignored by the decoder, written as zeros.
            let known = ACK_COMPLETE | ACK_REFUSED | ACK_ABORTED | ACK_TAGGED;
            again[1] |= data[1] & !known;
        }
    }
    assert_eq!(&again[..], data);
});

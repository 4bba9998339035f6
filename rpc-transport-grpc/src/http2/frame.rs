//! HTTP/2 frames (RFC 9113 §4 and §6): reading one from the bytes a peer sent, checked as
//! the RFC requires of each type, and writing ours. Sans-IO; payloads are slices of the
//! read buffer (`Bytes`), never copied here.

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// The 9-byte header every frame starts with.
pub(crate) const HEADER_LEN: usize = 9;

/// The client's connection preface (RFC 9113 §3.4), before its SETTINGS.
pub(crate) const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// HTTP/2's smallest and default `SETTINGS_MAX_FRAME_SIZE`.
pub(crate) const MIN_MAX_FRAME_SIZE: u32 = 16_384;
/// The largest `SETTINGS_MAX_FRAME_SIZE` a peer may announce (2^24 - 1).
pub(crate) const MAX_MAX_FRAME_SIZE: u32 = (1 << 24) - 1;
/// The largest flow-control window (2^31 - 1).
pub(crate) const MAX_WINDOW: u32 = (1 << 31) - 1;
/// The window of a connection and of each stream before SETTINGS say otherwise.
pub(crate) const DEFAULT_WINDOW: u32 = 65_535;

/// Frame types (RFC 9113 §6).
pub(crate) mod kind {
    /// DATA.
    pub(crate) const DATA: u8 = 0x0;
    /// HEADERS.
    pub(crate) const HEADERS: u8 = 0x1;
    /// PRIORITY (deprecated; read and ignored).
    pub(crate) const PRIORITY: u8 = 0x2;
    /// RST_STREAM.
    pub(crate) const RST_STREAM: u8 = 0x3;
    /// SETTINGS.
    pub(crate) const SETTINGS: u8 = 0x4;
    /// PUSH_PROMISE (never allowed here: push is off on both sides).
    pub(crate) const PUSH_PROMISE: u8 = 0x5;
    /// PING.
    pub(crate) const PING: u8 = 0x6;
    /// GOAWAY.
    pub(crate) const GOAWAY: u8 = 0x7;
    /// WINDOW_UPDATE.
    pub(crate) const WINDOW_UPDATE: u8 = 0x8;
    /// CONTINUATION.
    pub(crate) const CONTINUATION: u8 = 0x9;
}

/// Frame flags.
pub(crate) mod flag {
    /// DATA, HEADERS: the sender's last frame on the stream.
    pub(crate) const END_STREAM: u8 = 0x1;
    /// SETTINGS, PING: an acknowledgement.
    pub(crate) const ACK: u8 = 0x1;
    /// HEADERS, CONTINUATION: the header block ends in this frame.
    pub(crate) const END_HEADERS: u8 = 0x4;
    /// DATA, HEADERS: a pad length byte first, padding last.
    pub(crate) const PADDED: u8 = 0x8;
    /// HEADERS: a stream dependency and weight first.
    pub(crate) const PRIORITY: u8 = 0x20;
}

/// Error codes (RFC 9113 §7), in RST_STREAM and GOAWAY.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Reason(pub(crate) u32);

impl Reason {
    /// NO_ERROR.
    pub(crate) const NO_ERROR: Reason = Reason(0x0);
    /// PROTOCOL_ERROR.
    pub(crate) const PROTOCOL_ERROR: Reason = Reason(0x1);
    /// INTERNAL_ERROR.
    pub(crate) const INTERNAL_ERROR: Reason = Reason(0x2);
    /// FLOW_CONTROL_ERROR.
    pub(crate) const FLOW_CONTROL_ERROR: Reason = Reason(0x3);
    /// STREAM_CLOSED.
    pub(crate) const STREAM_CLOSED: Reason = Reason(0x5);
    /// FRAME_SIZE_ERROR.
    pub(crate) const FRAME_SIZE_ERROR: Reason = Reason(0x6);
    /// REFUSED_STREAM: the stream was not processed, so it may be retried.
    pub(crate) const REFUSED_STREAM: Reason = Reason(0x7);
    /// CANCEL.
    pub(crate) const CANCEL: Reason = Reason(0x8);
    /// COMPRESSION_ERROR.
    pub(crate) const COMPRESSION_ERROR: Reason = Reason(0x9);
    /// ENHANCE_YOUR_CALM.
    pub(crate) const ENHANCE_YOUR_CALM: Reason = Reason(0xb);
    /// INADEQUATE_SECURITY.
    pub(crate) const INADEQUATE_SECURITY: Reason = Reason(0xc);

    /// The code's name as RFC 9113 spells it, or `None` for a code it does not define.
    pub(crate) fn name(self) -> Option<&'static str> {
        const NAMES: [&str; 14] = [
            "NO_ERROR",
            "PROTOCOL_ERROR",
            "INTERNAL_ERROR",
            "FLOW_CONTROL_ERROR",
            "SETTINGS_TIMEOUT",
            "STREAM_CLOSED",
            "FRAME_SIZE_ERROR",
            "REFUSED_STREAM",
            "CANCEL",
            "COMPRESSION_ERROR",
            "CONNECT_ERROR",
            "ENHANCE_YOUR_CALM",
            "INADEQUATE_SECURITY",
            "HTTP_1_1_REQUIRED",
        ];
        NAMES.get(self.0 as usize).copied()
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name),
            None => write!(f, "error code {:#x}", self.0),
        }
    }
}

/// A frame's 9-byte header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Head {
    /// Payload length.
    pub(crate) len: usize,
    /// Frame type ([`kind`]).
    pub(crate) kind: u8,
    /// Flags ([`flag`]).
    pub(crate) flags: u8,
    /// Stream identifier (the reserved bit cleared).
    pub(crate) stream: u32,
}

impl Head {
    /// Reads a frame header from the first [`HEADER_LEN`] bytes of `buf`, if there are
    /// that many.
    pub(crate) fn read(buf: &[u8]) -> Option<Head> {
        let b: &[u8; HEADER_LEN] = buf.get(..HEADER_LEN)?.try_into().ok()?;
        Some(Head {
            len: (usize::from(b[0]) << 16) | (usize::from(b[1]) << 8) | usize::from(b[2]),
            kind: b[3],
            flags: b[4],
            stream: u32::from_be_bytes([b[5], b[6], b[7], b[8]]) & MAX_WINDOW,
        })
    }

    /// Whether flag `f` is set.
    pub(crate) fn has(&self, f: u8) -> bool {
        self.flags & f != 0
    }
}

/// Whether a frame error ends the connection (GOAWAY) or one stream (RST_STREAM).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Scope {
    /// GOAWAY with the code.
    Connection,
    /// RST_STREAM of the frame's stream with the code; the connection goes on.
    Stream(u32),
}

/// A frame the RFC says is malformed, with what to do about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct FrameError {
    /// Connection or stream error.
    pub(crate) scope: Scope,
    /// The code to send.
    pub(crate) reason: Reason,
    /// What was wrong, for the log and GOAWAY's debug data.
    pub(crate) what: &'static str,
}

fn conn_error(reason: Reason, what: &'static str) -> FrameError {
    FrameError {
        scope: Scope::Connection,
        reason,
        what,
    }
}

/// One frame read, its payload parsed (HEADERS and CONTINUATION keep their header block
/// fragment for the connection to join and decode).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Frame {
    /// DATA: `data` without padding; `flow_len` is what it counts against the flow
    /// control windows (the whole payload, padding included).
    Data {
        stream: u32,
        data: Bytes,
        flow_len: usize,
        end_stream: bool,
    },
    /// HEADERS: a header block fragment (padding and priority removed).
    /// `self_dependent`: its priority named the stream itself (a stream error).
    Headers {
        stream: u32,
        fragment: Bytes,
        end_stream: bool,
        end_headers: bool,
        self_dependent: bool,
    },
    /// PRIORITY, or what HEADERS said of priority: nothing to do but check it.
    Priority,
    /// RST_STREAM.
    Reset { stream: u32, reason: Reason },
    /// SETTINGS (not an acknowledgement): the identifier and value pairs, checked.
    Settings(Settings),
    /// A SETTINGS acknowledgement.
    SettingsAck,
    /// PUSH_PROMISE: always refused by the connection (push is off).
    PushPromise,
    /// PING.
    Ping { ack: bool, payload: [u8; 8] },
    /// GOAWAY.
    GoAway {
        last_stream: u32,
        reason: Reason,
        debug: Bytes,
    },
    /// WINDOW_UPDATE; stream 0 is the connection.
    WindowUpdate { stream: u32, increment: u32 },
    /// CONTINUATION.
    Continuation {
        stream: u32,
        fragment: Bytes,
        end_headers: bool,
    },
    /// A frame type RFC 9113 does not define: ignored.
    Unknown,
}

/// The settings a SETTINGS frame carries (each `None` if not in it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Settings {
    /// SETTINGS_HEADER_TABLE_SIZE (0x1).
    pub(crate) header_table_size: Option<u32>,
    /// SETTINGS_ENABLE_PUSH (0x2).
    pub(crate) enable_push: Option<bool>,
    /// SETTINGS_MAX_CONCURRENT_STREAMS (0x3).
    pub(crate) max_concurrent_streams: Option<u32>,
    /// SETTINGS_INITIAL_WINDOW_SIZE (0x4).
    pub(crate) initial_window_size: Option<u32>,
    /// SETTINGS_MAX_FRAME_SIZE (0x5).
    pub(crate) max_frame_size: Option<u32>,
    /// SETTINGS_MAX_HEADER_LIST_SIZE (0x6).
    pub(crate) max_header_list_size: Option<u32>,
}

impl Settings {
    const HEADER_TABLE_SIZE: u16 = 0x1;
    const ENABLE_PUSH: u16 = 0x2;
    const MAX_CONCURRENT_STREAMS: u16 = 0x3;
    const INITIAL_WINDOW_SIZE: u16 = 0x4;
    const MAX_FRAME_SIZE: u16 = 0x5;
    const MAX_HEADER_LIST_SIZE: u16 = 0x6;

    fn parse(mut payload: &[u8]) -> Result<Settings, FrameError> {
        if payload.len() % 6 != 0 {
            return Err(conn_error(
                Reason::FRAME_SIZE_ERROR,
                "SETTINGS length not a multiple of 6",
            ));
        }
        let mut settings = Settings::default();
        while payload.len() >= 6 {
            let id = payload.get_u16();
            let value = payload.get_u32();
            match id {
                Self::HEADER_TABLE_SIZE => settings.header_table_size = Some(value),
                Self::ENABLE_PUSH => {
                    settings.enable_push = Some(match value {
                        0 => false,
                        1 => true,
                        _ => {
                            return Err(conn_error(
                                Reason::PROTOCOL_ERROR,
                                "SETTINGS_ENABLE_PUSH not 0 or 1",
                            ))
                        }
                    })
                }
                Self::MAX_CONCURRENT_STREAMS => settings.max_concurrent_streams = Some(value),
                Self::INITIAL_WINDOW_SIZE => {
                    if value > MAX_WINDOW {
                        return Err(conn_error(
                            Reason::FLOW_CONTROL_ERROR,
                            "SETTINGS_INITIAL_WINDOW_SIZE above 2^31-1",
                        ));
                    }
                    settings.initial_window_size = Some(value);
                }
                Self::MAX_FRAME_SIZE => {
                    if !(MIN_MAX_FRAME_SIZE..=MAX_MAX_FRAME_SIZE).contains(&value) {
                        return Err(conn_error(
                            Reason::PROTOCOL_ERROR,
                            "SETTINGS_MAX_FRAME_SIZE outside 16384..=16777215",
                        ));
                    }
                    settings.max_frame_size = Some(value);
                }
                Self::MAX_HEADER_LIST_SIZE => settings.max_header_list_size = Some(value),
                // Unknown settings are ignored (RFC 9113 §6.5.2).
                _ => {}
            }
        }
        Ok(settings)
    }

    /// Writes a SETTINGS frame with the settings that are set.
    pub(crate) fn write(&self, dst: &mut BytesMut) {
        let pairs = [
            (Self::HEADER_TABLE_SIZE, self.header_table_size),
            (Self::ENABLE_PUSH, self.enable_push.map(u32::from)),
            (Self::MAX_CONCURRENT_STREAMS, self.max_concurrent_streams),
            (Self::INITIAL_WINDOW_SIZE, self.initial_window_size),
            (Self::MAX_FRAME_SIZE, self.max_frame_size),
            (Self::MAX_HEADER_LIST_SIZE, self.max_header_list_size),
        ];
        let count = pairs.iter().filter(|(_, v)| v.is_some()).count();
        write_head(dst, count * 6, kind::SETTINGS, 0, 0);
        for (id, value) in pairs {
            if let Some(value) = value {
                dst.put_u16(id);
                dst.put_u32(value);
            }
        }
    }
}

/// Removes a PADDED frame's pad length byte and padding from `payload`.
fn unpad(head: &Head, payload: &mut Bytes) -> Result<(), FrameError> {
    if !head.has(flag::PADDED) {
        return Ok(());
    }
    let Some(&pad) = payload.first() else {
        return Err(conn_error(
            Reason::FRAME_SIZE_ERROR,
            "padded frame without its pad length",
        ));
    };
    let pad = usize::from(pad);
    // The pad length counts against the rest of the payload (RFC 9113 §6.1: padding
    // the length of the payload or more is a PROTOCOL_ERROR).
    if pad >= payload.len() {
        return Err(conn_error(
            Reason::PROTOCOL_ERROR,
            "padding as long as the frame",
        ));
    }
    payload.advance(1);
    payload.truncate(payload.len() - pad);
    Ok(())
}

impl Frame {
    /// Parses a frame whose header is `head` and whose whole payload is `payload`. The
    /// caller has checked the length against its `SETTINGS_MAX_FRAME_SIZE`.
    pub(crate) fn parse(head: Head, mut payload: Bytes) -> Result<Frame, FrameError> {
        debug_assert_eq!(payload.len(), head.len);
        let stream = head.stream;
        let on_stream = |what| {
            if stream == 0 {
                Err(conn_error(Reason::PROTOCOL_ERROR, what))
            } else {
                Ok(())
            }
        };
        let on_connection = |what| {
            if stream != 0 {
                Err(conn_error(Reason::PROTOCOL_ERROR, what))
            } else {
                Ok(())
            }
        };
        match head.kind {
            kind::DATA => {
                on_stream("DATA on stream 0")?;
                let flow_len = payload.len();
                unpad(&head, &mut payload)?;
                Ok(Frame::Data {
                    stream,
                    data: payload,
                    flow_len,
                    end_stream: head.has(flag::END_STREAM),
                })
            }
            kind::HEADERS => {
                on_stream("HEADERS on stream 0")?;
                if head.has(flag::PADDED) && head.has(flag::PRIORITY) {
                    // The pad length and the priority fields both come before the
                    // fragment (RFC 9113 §6.2): a frame too short for them is a
                    // FRAME_SIZE_ERROR, padding past what is left a PROTOCOL_ERROR.
                    if payload.len() < 6 {
                        return Err(conn_error(
                            Reason::FRAME_SIZE_ERROR,
                            "HEADERS too short for its pad length and priority",
                        ));
                    }
                    if usize::from(payload[0]) > payload.len() - 6 {
                        return Err(conn_error(
                            Reason::PROTOCOL_ERROR,
                            "padding longer than the header block fragment",
                        ));
                    }
                }
                unpad(&head, &mut payload)?;
                let mut self_dependent = false;
                if head.has(flag::PRIORITY) {
                    if payload.len() < 5 {
                        return Err(conn_error(
                            Reason::FRAME_SIZE_ERROR,
                            "HEADERS too short for its priority",
                        ));
                    }
                    // RFC 9113 §5.3.1: a stream depending on itself is a stream error,
                    // told once the connection has decoded the block (HPACK in step).
                    self_dependent = payload.get_u32() & MAX_WINDOW == stream;
                    payload.advance(1);
                }
                Ok(Frame::Headers {
                    stream,
                    fragment: payload,
                    end_stream: head.has(flag::END_STREAM),
                    end_headers: head.has(flag::END_HEADERS),
                    self_dependent,
                })
            }
            kind::PRIORITY => {
                on_stream("PRIORITY on stream 0")?;
                if payload.len() != 5 {
                    return Err(FrameError {
                        scope: Scope::Stream(stream),
                        reason: Reason::FRAME_SIZE_ERROR,
                        what: "PRIORITY not 5 bytes long",
                    });
                }
                if payload.get_u32() & MAX_WINDOW == stream {
                    // RFC 9113 §5.3.1: a stream cannot depend on itself.
                    return Err(FrameError {
                        scope: Scope::Stream(stream),
                        reason: Reason::PROTOCOL_ERROR,
                        what: "PRIORITY making a stream depend on itself",
                    });
                }
                Ok(Frame::Priority)
            }
            kind::RST_STREAM => {
                on_stream("RST_STREAM on stream 0")?;
                if payload.len() != 4 {
                    return Err(conn_error(
                        Reason::FRAME_SIZE_ERROR,
                        "RST_STREAM not 4 bytes long",
                    ));
                }
                Ok(Frame::Reset {
                    stream,
                    reason: Reason(payload.get_u32()),
                })
            }
            kind::SETTINGS => {
                on_connection("SETTINGS on a stream")?;
                if head.has(flag::ACK) {
                    if !payload.is_empty() {
                        return Err(conn_error(
                            Reason::FRAME_SIZE_ERROR,
                            "SETTINGS acknowledgement with a payload",
                        ));
                    }
                    return Ok(Frame::SettingsAck);
                }
                Settings::parse(&payload).map(Frame::Settings)
            }
            kind::PUSH_PROMISE => Ok(Frame::PushPromise),
            kind::PING => {
                on_connection("PING on a stream")?;
                let Ok(bytes) = <[u8; 8]>::try_from(&payload[..]) else {
                    return Err(conn_error(
                        Reason::FRAME_SIZE_ERROR,
                        "PING not 8 bytes long",
                    ));
                };
                Ok(Frame::Ping {
                    ack: head.has(flag::ACK),
                    payload: bytes,
                })
            }
            kind::GOAWAY => {
                on_connection("GOAWAY on a stream")?;
                if payload.len() < 8 {
                    return Err(conn_error(
                        Reason::FRAME_SIZE_ERROR,
                        "GOAWAY shorter than 8 bytes",
                    ));
                }
                let last_stream = payload.get_u32() & MAX_WINDOW;
                let reason = Reason(payload.get_u32());
                Ok(Frame::GoAway {
                    last_stream,
                    reason,
                    debug: payload,
                })
            }
            kind::WINDOW_UPDATE => {
                if payload.len() != 4 {
                    return Err(conn_error(
                        Reason::FRAME_SIZE_ERROR,
                        "WINDOW_UPDATE not 4 bytes long",
                    ));
                }
                let increment = payload.get_u32() & MAX_WINDOW;
                if increment == 0 {
                    return Err(FrameError {
                        scope: if stream == 0 {
                            Scope::Connection
                        } else {
                            Scope::Stream(stream)
                        },
                        reason: Reason::PROTOCOL_ERROR,
                        what: "WINDOW_UPDATE of 0",
                    });
                }
                Ok(Frame::WindowUpdate { stream, increment })
            }
            kind::CONTINUATION => {
                on_stream("CONTINUATION on stream 0")?;
                Ok(Frame::Continuation {
                    stream,
                    fragment: payload,
                    end_headers: head.has(flag::END_HEADERS),
                })
            }
            _ => Ok(Frame::Unknown),
        }
    }
}

/// Writes a frame header.
pub(crate) fn write_head(dst: &mut BytesMut, len: usize, kind: u8, flags: u8, stream: u32) {
    debug_assert!(len <= MAX_MAX_FRAME_SIZE as usize);
    let len = len as u32;
    dst.put_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags]);
    dst.put_u32(stream & MAX_WINDOW);
}

/// Writes a SETTINGS acknowledgement.
pub(crate) fn write_settings_ack(dst: &mut BytesMut) {
    write_head(dst, 0, kind::SETTINGS, flag::ACK, 0);
}

/// Writes a PING (or its acknowledgement).
pub(crate) fn write_ping(dst: &mut BytesMut, ack: bool, payload: [u8; 8]) {
    write_head(dst, 8, kind::PING, if ack { flag::ACK } else { 0 }, 0);
    dst.put_slice(&payload);
}

/// Writes a GOAWAY.
pub(crate) fn write_goaway(dst: &mut BytesMut, last_stream: u32, reason: Reason, debug: &[u8]) {
    write_head(dst, 8 + debug.len(), kind::GOAWAY, 0, 0);
    dst.put_u32(last_stream & MAX_WINDOW);
    dst.put_u32(reason.0);
    dst.put_slice(debug);
}

/// Writes an RST_STREAM.
pub(crate) fn write_reset(dst: &mut BytesMut, stream: u32, reason: Reason) {
    write_head(dst, 4, kind::RST_STREAM, 0, stream);
    dst.put_u32(reason.0);
}

/// Writes a WINDOW_UPDATE (`increment` 1..=2^31-1).
pub(crate) fn write_window_update(dst: &mut BytesMut, stream: u32, increment: u32) {
    debug_assert!(increment > 0 && increment <= MAX_WINDOW);
    write_head(dst, 4, kind::WINDOW_UPDATE, 0, stream);
    dst.put_u32(increment);
}

/// Writes a header block as a HEADERS frame and as many CONTINUATIONs as `max_frame`
/// (the peer's `SETTINGS_MAX_FRAME_SIZE`) requires.
pub(crate) fn write_headers(
    dst: &mut BytesMut,
    stream: u32,
    block: &[u8],
    end_stream: bool,
    max_frame: usize,
) {
    let max_frame = max_frame.max(MIN_MAX_FRAME_SIZE as usize);
    let mut chunks = block.chunks(max_frame);
    let first = chunks.next().unwrap_or(&[]);
    let more = block.len() > first.len();
    let mut flags = if end_stream { flag::END_STREAM } else { 0 };
    if !more {
        flags |= flag::END_HEADERS;
    }
    write_head(dst, first.len(), kind::HEADERS, flags, stream);
    dst.put_slice(first);
    let mut rest = chunks.peekable();
    while let Some(chunk) = rest.next() {
        let flags = if rest.peek().is_none() {
            flag::END_HEADERS
        } else {
            0
        };
        write_head(dst, chunk.len(), kind::CONTINUATION, flags, stream);
        dst.put_slice(chunk);
    }
}

/// Writes a DATA frame's header for a payload of `len` bytes that follows it.
pub(crate) fn write_data_head(dst: &mut BytesMut, stream: u32, len: usize, end_stream: bool) {
    let flags = if end_stream { flag::END_STREAM } else { 0 };
    write_head(dst, len, kind::DATA, flags, stream);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Result<Frame, FrameError> {
        let mut buf = BytesMut::new();
        write_head(&mut buf, payload.len(), kind, flags, stream);
        buf.put_slice(payload);
        let head = Head::read(&buf).unwrap();
        assert_eq!(head.len, payload.len());
        Frame::parse(head, buf.freeze().slice(HEADER_LEN..))
    }

    fn conn_reason(result: Result<Frame, FrameError>) -> Reason {
        let error = result.unwrap_err();
        assert_eq!(error.scope, Scope::Connection, "{error:?}");
        error.reason
    }

    #[test]
    fn a_header_reads_back_with_the_reserved_bit_cleared() {
        let mut buf = BytesMut::new();
        write_head(&mut buf, 0x12_3456, kind::HEADERS, 0x25, 7);
        buf[5] |= 0x80;
        assert_eq!(
            Head::read(&buf),
            Some(Head {
                len: 0x12_3456,
                kind: kind::HEADERS,
                flags: 0x25,
                stream: 7
            })
        );
        assert_eq!(Head::read(&buf[..8]), None);
    }

    #[test]
    fn data_padding_is_removed_and_counted_for_flow_control() {
        let frame = frame(kind::DATA, flag::PADDED | flag::END_STREAM, 1, b"\x02abcXY").unwrap();
        assert_eq!(
            frame,
            Frame::Data {
                stream: 1,
                data: Bytes::from_static(b"abc"),
                flow_len: 6,
                end_stream: true
            }
        );
        // Padding as long as the rest, and a missing pad length.
        assert_eq!(
            conn_reason(super::tests::frame(kind::DATA, flag::PADDED, 1, b"\x03ab")),
            Reason::PROTOCOL_ERROR
        );
        assert_eq!(
            conn_reason(super::tests::frame(kind::DATA, flag::PADDED, 1, b"")),
            Reason::FRAME_SIZE_ERROR
        );
        assert_eq!(
            conn_reason(super::tests::frame(kind::DATA, 0, 0, b"x")),
            Reason::PROTOCOL_ERROR
        );
    }

    #[test]
    fn headers_lose_their_padding_and_priority() {
        let payload = b"\x01\x80\x00\x00\x03\x10blockP";
        let frame = frame(
            kind::HEADERS,
            flag::PADDED | flag::PRIORITY | flag::END_HEADERS,
            5,
            payload,
        )
        .unwrap();
        assert_eq!(
            frame,
            Frame::Headers {
                stream: 5,
                fragment: Bytes::from_static(b"block"),
                end_stream: false,
                end_headers: true,
                self_dependent: false
            }
        );
        assert_eq!(
            conn_reason(super::tests::frame(
                kind::HEADERS,
                flag::PRIORITY,
                5,
                b"\0\0\0"
            )),
            Reason::FRAME_SIZE_ERROR
        );
    }

    #[test]
    fn control_frames_of_the_wrong_length_or_stream_are_connection_errors() {
        let cases: [(u8, u8, u32, &[u8], Reason); 11] = [
            (kind::PING, 0, 0, b"1234567", Reason::FRAME_SIZE_ERROR),
            (kind::PING, 0, 1, b"12345678", Reason::PROTOCOL_ERROR),
            (kind::SETTINGS, 0, 0, b"12345", Reason::FRAME_SIZE_ERROR),
            (kind::SETTINGS, flag::ACK, 0, b"x", Reason::FRAME_SIZE_ERROR),
            (kind::SETTINGS, 0, 3, b"", Reason::PROTOCOL_ERROR),
            (kind::RST_STREAM, 0, 1, b"123", Reason::FRAME_SIZE_ERROR),
            (kind::RST_STREAM, 0, 0, b"1234", Reason::PROTOCOL_ERROR),
            (kind::GOAWAY, 0, 0, b"1234567", Reason::FRAME_SIZE_ERROR),
            (
                kind::WINDOW_UPDATE,
                0,
                0,
                b"12345",
                Reason::FRAME_SIZE_ERROR,
            ),
            (
                kind::WINDOW_UPDATE,
                0,
                0,
                b"\0\0\0\0",
                Reason::PROTOCOL_ERROR,
            ),
            (kind::CONTINUATION, 0, 0, b"", Reason::PROTOCOL_ERROR),
        ];
        for (kind, flags, stream, payload, reason) in cases {
            assert_eq!(
                conn_reason(frame(kind, flags, stream, payload)),
                reason,
                "type {kind} flags {flags} stream {stream} {payload:?}"
            );
        }
    }

    #[test]
    fn stream_level_errors_name_their_stream() {
        let error = frame(kind::WINDOW_UPDATE, 0, 3, b"\x80\0\0\0").unwrap_err();
        assert_eq!(error.scope, Scope::Stream(3));
        assert_eq!(error.reason, Reason::PROTOCOL_ERROR);
        let error = frame(kind::PRIORITY, 0, 3, b"1234").unwrap_err();
        assert_eq!(error.scope, Scope::Stream(3));
        assert_eq!(error.reason, Reason::FRAME_SIZE_ERROR);
    }

    #[test]
    fn settings_are_checked_and_unknown_ones_ignored() {
        let mut buf = BytesMut::new();
        let settings = Settings {
            header_table_size: Some(0),
            enable_push: Some(false),
            max_concurrent_streams: Some(100),
            initial_window_size: Some(MAX_WINDOW),
            max_frame_size: Some(MAX_MAX_FRAME_SIZE),
            max_header_list_size: Some(8192),
        };
        settings.write(&mut buf);
        // An unknown setting (0x99) on the end.
        buf.put_slice(&[0, 0x99, 0, 0, 0, 1]);
        let len = buf.len() - HEADER_LEN;
        buf[2] = len as u8;
        let head = Head::read(&buf).unwrap();
        assert_eq!(
            Frame::parse(head, buf.freeze().slice(HEADER_LEN..)),
            Ok(Frame::Settings(settings))
        );
        for (id, value, reason) in [
            (2u16, 2u32, Reason::PROTOCOL_ERROR),
            (4, MAX_WINDOW + 1, Reason::FLOW_CONTROL_ERROR),
            (5, MIN_MAX_FRAME_SIZE - 1, Reason::PROTOCOL_ERROR),
            (5, MAX_MAX_FRAME_SIZE + 1, Reason::PROTOCOL_ERROR),
        ] {
            let mut payload = Vec::new();
            payload.extend_from_slice(&id.to_be_bytes());
            payload.extend_from_slice(&value.to_be_bytes());
            assert_eq!(conn_reason(frame(kind::SETTINGS, 0, 0, &payload)), reason);
        }
    }

    #[test]
    fn a_large_header_block_continues_in_continuation_frames() {
        let block: Vec<u8> = (0..40_000u32).map(|i| i as u8).collect();
        let mut buf = BytesMut::new();
        write_headers(&mut buf, 9, &block, true, 16_384);
        let mut buf = buf.freeze();
        let mut joined = Vec::new();
        let mut kinds = Vec::new();
        while !buf.is_empty() {
            let head = Head::read(&buf).unwrap();
            buf.advance(HEADER_LEN);
            let payload = buf.split_to(head.len);
            kinds.push((head.kind, head.flags));
            match Frame::parse(head, payload).unwrap() {
                Frame::Headers { fragment, .. } | Frame::Continuation { fragment, .. } => {
                    joined.extend_from_slice(&fragment)
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(joined, block);
        assert_eq!(
            kinds,
            [
                (kind::HEADERS, flag::END_STREAM),
                (kind::CONTINUATION, 0),
                (kind::CONTINUATION, flag::END_HEADERS)
            ]
        );
    }

    #[test]
    fn goaway_and_reset_read_back() {
        let mut buf = BytesMut::new();
        write_goaway(&mut buf, 7, Reason::ENHANCE_YOUR_CALM, b"calm");
        let head = Head::read(&buf).unwrap();
        assert_eq!(
            Frame::parse(head, buf.freeze().slice(HEADER_LEN..)),
            Ok(Frame::GoAway {
                last_stream: 7,
                reason: Reason::ENHANCE_YOUR_CALM,
                debug: Bytes::from_static(b"calm")
            })
        );
        assert_eq!(Reason::ENHANCE_YOUR_CALM.to_string(), "ENHANCE_YOUR_CALM");
        assert_eq!(Reason(0x42).to_string(), "error code 0x42");
    }
}

#!/usr/bin/env python3
"""A client written from docs/wire.md alone (no code of this repository), used by
examples/tests/wire_doc.rs to check that the document is enough to talk to a server:
calls of every shape, and then the edge cases the document defines (protocol errors,
a frame too large, deadlines, cancellation, flow control, call keys).

Usage: client.py HOST PORT
Prints one line per check and exits non-zero on the first failure.
"""
import os
import socket
import struct
import sys

VERSION = 1
REQUEST, RESPONSE, CANCEL, GOAWAY, PING, PONG, DATA, WINDOW = 1, 2, 3, 4, 5, 6, 7, 8
FLAG_HAS_TIMEOUT = 0x0001
FLAG_HAS_CALL_KEY = 0x0002
FLAG_STREAMING = 0x0004
FLAG_END_STREAM = 0x0001
FLAG_HAS_METADATA = 0x0002
FLAG_NO_MESSAGE = 0x0004


def pb_string(field, text):
    """Protobuf: a length-delimited string field (wire type 2), short lengths only."""
    data = text.encode()
    assert len(data) < 128
    return bytes([(field << 3) | 2, len(data)]) + data


def pb_read_string(payload, field):
    """The first length-delimited field `field` of a protobuf message, or ''."""
    i = 0
    while i < len(payload):
        key = payload[i]
        i += 1
        wire = key & 7
        if wire == 2:
            length = payload[i]
            i += 1
            value = payload[i:i + length]
            i += length
            if key >> 3 == field:
                return value.decode()
        elif wire == 0:
            while payload[i] & 0x80:
                i += 1
            i += 1
        else:
            raise ValueError("unexpected wire type %d" % wire)
    return ""


def metadata_block(entries):
    block = b""
    for key, value in entries:
        k = key.encode()
        v = value if isinstance(value, bytes) else value.encode()
        block += struct.pack(">B", len(k)) + k + struct.pack(">I", len(v)) + v
    return struct.pack(">I", len(block)) + block


def request(call_id, method, payload, timeout_us=None, metadata=(), streaming=False,
            call_key=None):
    flags = FLAG_HAS_TIMEOUT if timeout_us is not None else 0
    if streaming:
        flags |= FLAG_STREAMING
    if call_key is not None:
        flags |= FLAG_HAS_CALL_KEY
    m = method.encode()
    frame = struct.pack(">BBHQ", VERSION, REQUEST, flags, call_id)
    frame += struct.pack(">Q", timeout_us or 0)
    if call_key is not None:
        client, call, attempt = call_key
        frame += client.to_bytes(16, "big") + struct.pack(">QI", call, attempt)
    frame += struct.pack(">H", len(m)) + m
    frame += metadata_block(metadata)
    frame += payload
    return struct.pack(">I", len(frame)) + frame


def frame(kind, flags, ident, rest=b""):
    body = struct.pack(">BBHQ", VERSION, kind, flags, ident) + rest
    return struct.pack(">I", len(body)) + body


def data(call_id, flags, message=b""):
    return frame(DATA, flags, call_id, message)


def pb_read_varint(payload, field):
    """The first varint field `field` of a protobuf message (one-byte keys), or 0."""
    i = 0
    while i < len(payload):
        key = payload[i]
        i += 1
        if key & 7 == 0:
            value, shift = 0, 0
            while True:
                b = payload[i]
                i += 1
                value |= (b & 0x7F) << shift
                shift += 7
                if not b & 0x80:
                    break
            if key >> 3 == field:
                return value
        elif key & 7 == 2:
            i += 1 + payload[i]
        else:
            raise ValueError("unexpected wire type %d" % (key & 7))
    return 0


def read_exact(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError("server closed the connection")
        data += chunk
    return data


def read_frame(sock):
    (length,) = struct.unpack(">I", read_exact(sock, 4))
    frame = read_exact(sock, length)
    version, kind, flags, ident = struct.unpack(">BBHQ", frame[:12])
    assert version == VERSION, version
    return kind, flags, ident, frame[12:]


def parse_metadata(rest):
    (block_len,) = struct.unpack(">I", rest[:4])
    block, rest = rest[4:4 + block_len], rest[4 + block_len:]
    entries = []
    while block:
        klen = block[0]
        key = block[1:1 + klen].decode()
        (vlen,) = struct.unpack(">I", block[1 + klen:5 + klen])
        value = block[5 + klen:5 + klen + vlen]
        block = block[5 + klen + vlen:]
        entries.append((key, value))
    return entries, rest


def parse_response(body):
    (code,) = struct.unpack(">I", body[:4])
    (mlen,) = struct.unpack(">I", body[4:8])
    message = body[8:8 + mlen].decode()
    rest = body[8 + mlen:]
    (dlen,) = struct.unpack(">I", rest[:4])
    details, rest = rest[4:4 + dlen], rest[4 + dlen:]
    metadata, payload = parse_metadata(rest)
    return code, message, details, metadata, payload


def check(condition, what):
    if not condition:
        print("FAIL", what)
        sys.exit(1)
    print("ok", what)


def main():
    host, port = sys.argv[1], int(sys.argv[2])
    sock = socket.create_connection((host, port), timeout=10)

    # Two calls in flight at once, answered by id.
    sock.sendall(
        request(1, "rpc.examples.v1.Echo/Say", pb_string(1, "hi"), 250_000, [("x-user", "py")])
        + request(2, "rpc.examples.v1.Echo/Say", pb_string(1, "there"))
    )
    answers = {}
    for _ in range(2):
        kind, _, ident, body = read_frame(sock)
        check(kind == RESPONSE, "RESPONSE frame for call %d" % ident)
        answers[ident] = parse_response(body)
    code, message, _, _, payload = answers[1]
    check(code == 0 and message == "", "call 1 OK")
    check(pb_read_string(payload, 1) == "hi", "call 1 echoes 'hi'")
    check(pb_read_string(answers[2][4], 1) == "there", "call 2 echoes 'there'")

    # An error status.
    sock.sendall(request(3, "rpc.examples.v1.KeyValue/Get", pb_string(1, "missing")))
    kind, _, ident, body = read_frame(sock)
    code, message, _, _, payload = parse_response(body)
    check(ident == 3 and code == 5, "NOT_FOUND for a missing key (code %d)" % code)
    check(payload == b"", "an error response has no payload")

    # Unknown method.
    sock.sendall(request(4, "rpc.examples.v1.Echo/Nope", b""))
    _, _, ident, body = read_frame(sock)
    check(ident == 4 and parse_response(body)[0] == 12, "UNIMPLEMENTED for an unknown method")

    # PING / PONG.
    sock.sendall(frame(PING, 0, 77, b"token"))
    kind, _, ident, body = read_frame(sock)
    check(kind == PONG and ident == 77 and body == b"token", "PONG echoes id and payload")

    # A server-streaming call (6.9): REQUEST with FLAG_STREAMING and no payload, the one
    # request message in DATA, the half-close; then the server's WINDOW(s), its headers
    # (FLAG_HAS_METADATA), a DATA per message, and the RESPONSE.
    count_request = bytes([0x08, 3])  # CountRequest{count: 3}
    sock.sendall(
        request(5, "rpc.examples.v1.Echo/Count", b"", 5_000_000, streaming=True)
        + data(5, 0, count_request)
        + data(5, FLAG_END_STREAM | FLAG_NO_MESSAGE)
    )
    seen, headers, numbers = [], False, []
    while True:
        kind, flags, ident, body = read_frame(sock)
        check(ident == 5, "stream frame for call 5 (kind %d)" % kind)
        if kind == WINDOW:
            (increment,) = struct.unpack(">I", body)
            check(increment > 0 and not headers, "WINDOW before the headers (+%d)" % increment)
            continue
        if kind == DATA:
            if flags & FLAG_HAS_METADATA:
                check(not headers and not numbers, "headers first")
                headers = True
                _, body = parse_metadata(body)
            check(not flags & FLAG_END_STREAM, "the server never sets FLAG_END_STREAM")
            if not flags & FLAG_NO_MESSAGE:
                numbers.append(pb_read_varint(body, 1))
            continue
        check(kind == RESPONSE, "the stream ends with a RESPONSE")
        code, _, _, _, payload = parse_response(body)
        check(code == 0 and payload == b"", "the stream ends OK, empty payload")
        break
    check(headers and numbers == [1, 2, 3], "Count streams 1, 2, 3 (%s)" % numbers)

    # A keyed REQUEST (6.8): the 28-byte call key after timeout_us.
    key = (0x0123456789ABCDEF0011223344556677, 9, 1)
    sock.sendall(request(6, "rpc.examples.v1.Echo/Say", pb_string(1, "keyed"), call_key=key))
    _, _, ident, body = read_frame(sock)
    code, _, _, _, payload = parse_response(body)
    check(ident == 6 and code == 0, "a keyed call is answered (code %d)" % code)
    check(pb_read_string(payload, 1) == "keyed", "the keyed call echoes 'keyed'")

    # A frame of another version: GOAWAY UNSUPPORTED_VERSION, then close.
    bad = struct.pack(">BBHQ", 9, CANCEL, 0, 1)
    sock.sendall(struct.pack(">I", len(bad)) + bad)
    kind, _, _, body = read_frame(sock)
    (goaway_code,) = struct.unpack(">I", body[:4])
    check(kind == GOAWAY and goaway_code == 3, "GOAWAY UNSUPPORTED_VERSION for version 9")
    try:
        closed = sock.recv(1) == b""
    except ConnectionResetError:
        closed = True
    check(closed, "the server closed the connection")


# ---------------------------------------------------------------------------------------
# Edge cases: each on a fresh connection where the connection ends (protocol errors).


def window(call_id, increment):
    return frame(WINDOW, 0, call_id, struct.pack(">I", increment))


def read_frame_within(sock, seconds):
    """The next frame, or None if nothing arrives within `seconds`."""
    sock.settimeout(seconds)
    try:
        return read_frame(sock)
    except socket.timeout:
        return None
    finally:
        sock.settimeout(10)


def goaway_then_close(host, port, data, code, what, last_id=None):
    """Sends `data` on a new connection; expects GOAWAY `code` (and `last_id`), then EOF,
    skipping the answers of calls that were in flight before the error."""
    sock = socket.create_connection((host, port), timeout=10)
    sock.sendall(data)
    while True:
        kind, _, ident, body = read_frame(sock)
        if kind == GOAWAY:
            break
    (got,) = struct.unpack(">I", body[:4])
    check(got == code, "%s: GOAWAY code %d (got %d)" % (what, code, got))
    if last_id is not None:
        check(ident == last_id, "%s: last_id %d (got %d)" % (what, last_id, ident))
    try:
        closed = sock.recv(1) == b""
    except ConnectionResetError:
        closed = True
    check(closed, "%s: the server closed the connection" % what)
    sock.close()


def stream_frames(sock, call_id):
    """Frames of stream `call_id` until its RESPONSE: (windows, headers seen, messages,
    (code, message))."""
    windows, headers, messages = [], False, []
    while True:
        kind, flags, ident, body = read_frame(sock)
        if kind == WINDOW and ident != call_id:
            continue  # credit of an earlier stream's message, given back late
        check(ident == call_id, "a frame of stream %d (kind %d)" % (call_id, kind))
        if kind == WINDOW:
            windows.append(struct.unpack(">I", body)[0])
        elif kind == DATA:
            if flags & FLAG_HAS_METADATA:
                headers = True
                _, body = parse_metadata(body)
            if not flags & FLAG_NO_MESSAGE:
                messages.append(body)
        else:
            check(kind == RESPONSE, "stream %d ends with a RESPONSE" % call_id)
            code, message, _, _, _ = parse_response(body)
            return windows, headers, messages, (code, message)


def pb_varint(field, value):
    out = bytes([field << 3])
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def edge_cases(host, port):
    say = "rpc.examples.v1.Echo/Say"
    sleep = "rpc.examples.v1.Echo/Sleep"

    # 2.4: protocol errors end the connection with GOAWAY PROTOCOL_ERROR (1).
    goaway_then_close(host, port, struct.pack(">I", 0), 1, "an empty frame")
    goaway_then_close(host, port, struct.pack(">I", 8) + bytes([1, CANCEL, 0, 0, 0, 0, 0, 0]), 1,
                      "a frame of 8 bytes")
    goaway_then_close(host, port, frame(11, 0, 1), 1, "an unknown kind")
    goaway_then_close(host, port, frame(CANCEL, 0x0001, 1), 1, "a flag CANCEL does not allow")
    goaway_then_close(host, port, frame(CANCEL, 0, 1, b"x"), 1, "a byte after a CANCEL")
    goaway_then_close(host, port, window(1, 0), 1, "a WINDOW of 0")
    goaway_then_close(host, port, frame(RESPONSE, 0, 1, bytes(16)), 1, "a RESPONSE from a client")
    goaway_then_close(host, port, request(1, say, pb_string(1, "x"), streaming=True), 1,
                      "a payload on a streaming REQUEST")
    goaway_then_close(host, port, request(1, say, b"", metadata=[("X-Up", "v")]), 1,
                      "an upper-case metadata key")
    # A duplicate id while the first call is in flight; last_id is the highest id read.
    goaway_then_close(
        host, port,
        request(1, sleep, pb_varint(1, 1000)) + request(1, sleep, pb_varint(1, 1000)),
        1, "an id already in flight", last_id=1)
    # 1.1: a length over the maximum frame length (16 MiB): FRAME_TOO_LARGE (2).
    goaway_then_close(host, port, struct.pack(">I", 16 * 1024 * 1024 + 1), 2,
                      "a length prefix over 16 MiB")

    sock = socket.create_connection((host, port), timeout=10)
    # 6.6: a zero budget is DEADLINE_EXCEEDED at once; a handler past its budget is stopped.
    sock.sendall(request(1, say, pb_string(1, "late"), timeout_us=0))
    _, _, ident, body = read_frame(sock)
    code, message, _, _, _ = parse_response(body)
    check(ident == 1 and code == 4, "a zero budget gets DEADLINE_EXCEEDED (%d %r)" % (code, message))
    sock.sendall(request(2, sleep, pb_varint(1, 3000), timeout_us=100_000))
    _, _, ident, body = read_frame(sock)
    code, message, _, _, _ = parse_response(body)
    check(ident == 2 and code == 4 and "the handler was stopped" in message,
          "a handler past its budget is stopped (%d %r)" % (code, message))

    # 6.2: a CANCELled call gets no RESPONSE; the connection goes on.
    sock.sendall(request(3, sleep, pb_varint(1, 600)) + frame(CANCEL, 0, 3)
                 + request(4, say, pb_string(1, "after")))
    _, _, ident, body = read_frame(sock)
    check(ident == 4 and pb_read_string(parse_response(body)[4], 1) == "after",
          "a call after a CANCEL is answered")
    check(read_frame_within(sock, 1.5) is None, "the cancelled call is not answered")

    # 4: a streaming method called as a unary one; an unknown method called as a stream
    # (refused before it opens: its RESPONSE alone, no WINDOW).
    sock.sendall(request(5, "rpc.examples.v1.Echo/Count", pb_varint(1, 2)))
    _, _, ident, body = read_frame(sock)
    check(ident == 5 and parse_response(body)[0] == 12, "Count called as unary: UNIMPLEMENTED")
    sock.sendall(request(6, "rpc.examples.v1.Echo/Nope", b"", streaming=True))
    kind, _, ident, body = read_frame(sock)
    check(kind == RESPONSE and ident == 6 and parse_response(body)[0] == 12,
          "an unknown method as a stream: RESPONSE UNIMPLEMENTED alone")

    # 6.9: client streaming (Sum) and bidirectional streaming (Chat).
    sock.sendall(request(7, "rpc.examples.v1.Echo/Sum", b"", streaming=True)
                 + data(7, 0, pb_varint(1, 5)) + data(7, 0, pb_varint(1, 7))
                 + data(7, FLAG_END_STREAM | FLAG_NO_MESSAGE))
    _, headers, messages, status = stream_frames(sock, 7)
    check(status[0] == 0 and headers and len(messages) == 1, "Sum ends OK with one message")
    check(pb_read_varint(messages[0], 1) == 12 and pb_read_varint(messages[0], 2) == 2,
          "Sum of 5 and 7 is 12, of 2 values")
    sock.sendall(request(8, "rpc.examples.v1.Echo/Chat", b"", streaming=True))
    replies = []
    for word in ["a", "b"]:
        sock.sendall(data(8, 0, pb_string(1, word)))
        while True:
            kind, flags, ident, body = read_frame(sock)
            check(ident == 8 and kind in (WINDOW, DATA), "a Chat frame (kind %d)" % kind)
            if kind == DATA:
                if flags & FLAG_HAS_METADATA:
                    _, body = parse_metadata(body)
                if not flags & FLAG_NO_MESSAGE:
                    replies.append(pb_read_string(body, 1))
                    break
    sock.sendall(data(8, FLAG_END_STREAM | FLAG_NO_MESSAGE))
    _, _, more, status = stream_frames(sock, 8)
    check(replies == ["re: a", "re: b"] and not more and status[0] == 0,
          "Chat answers each message as it comes (%s)" % replies)

    # 6.9 flow control: the client's initial credit to the server is 65,536 bytes and a
    # message costs at least 64, so without a WINDOW at most 1,024 small messages come;
    # WINDOWs bring the rest.
    total = 3000
    sock.sendall(request(9, "rpc.examples.v1.Echo/Count", b"", streaming=True)
                 + data(9, 0, pb_varint(1, total))
                 + data(9, FLAG_END_STREAM | FLAG_NO_MESSAGE))
    got, status = 0, None
    while got < 1024:
        kind, flags, ident, body = read_frame(sock)
        if kind == DATA and not flags & FLAG_NO_MESSAGE:
            if flags & FLAG_HAS_METADATA:
                _, body = parse_metadata(body)
            got += 1
    extra = read_frame_within(sock, 0.5)
    check(extra is None or extra[0] != DATA,
          "the server stops at its credit: 1,024 messages (then %s)" % (extra and extra[0]))
    sock.sendall(window(9, 64 * (total - 1024)))
    while status is None:
        kind, flags, ident, body = read_frame(sock)
        if kind == DATA and not flags & FLAG_NO_MESSAGE:
            got += 1
        elif kind == RESPONSE:
            status = parse_response(body)[0]
    check(got == total and status == 0, "a WINDOW brings the rest: %d of %d, then OK" % (got, total))

    # 6.8: a repeat of a keyed call gets the recorded outcome; it does not run again.
    # `client`: 128 random bits, never a constant (a key names one call, 6.8).
    key = (int.from_bytes(os.urandom(16), "big"), 1, 1)
    increment = pb_string(1, "wire-doc-counter") + pb_varint(2, 5)
    sock.sendall(request(10, "rpc.examples.v1.KeyValue/Increment", increment, call_key=key))
    _, _, _, body = read_frame(sock)
    first = pb_read_varint(parse_response(body)[4], 1)
    repeat = (key[0], key[1], 2)
    sock.sendall(request(11, "rpc.examples.v1.KeyValue/Increment", increment, call_key=repeat))
    _, _, ident, body = read_frame(sock)
    check(ident == 11 and pb_read_varint(parse_response(body)[4], 1) == first == 5,
          "a keyed repeat gets the recorded outcome (%d)" % first)
    sock.sendall(request(12, "rpc.examples.v1.KeyValue/Increment", increment,
                         call_key=(key[0], 2, 1)))
    _, _, _, body = read_frame(sock)
    check(pb_read_varint(parse_response(body)[4], 1) == 10, "a new call key runs again")
    sock.close()


if __name__ == "__main__":
    main()
    edge_cases(sys.argv[1], int(sys.argv[2]))

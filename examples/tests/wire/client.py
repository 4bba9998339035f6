#!/usr/bin/env python3
"""A client written from docs/wire.md alone (no code of this repository), used by
examples/tests/wire_doc.rs to check that the document is enough to talk to a server.

Usage: client.py HOST PORT
Prints one line per check and exits non-zero on the first failure.
"""
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


def data(call_id, flags, message=b""):
    frame = struct.pack(">BBHQ", VERSION, DATA, flags, call_id) + message
    return struct.pack(">I", len(frame)) + frame


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
    ping = struct.pack(">BBHQ", VERSION, PING, 0, 77) + b"token"
    sock.sendall(struct.pack(">I", len(ping)) + ping)
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


if __name__ == "__main__":
    main()

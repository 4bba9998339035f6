#!/usr/bin/env python3
"""A UDP client written from docs/wire.md alone (section 1.2 and the frame sections; no
code of this repository), used by examples/tests/wire_doc.rs to check that the document
is enough to talk to a server over UDP.

Usage: udp_client.py HOST PORT
Prints one line per check and exits non-zero on the first failure.
"""
import random
import socket
import struct
import sys
import time

VERSION = 1
REQUEST, RESPONSE, CANCEL, GOAWAY, PING, PONG = 1, 2, 3, 4, 5, 6
FLAG_HAS_TIMEOUT = 0x0001

# Datagram types (first byte). A whole frame starts with the frame's version byte.
WHOLE, FRAGMENT, ACK = 0x01, 0x81, 0x82
FRAG_HEADER = ">BBHQIII"  # type, flags, reserved, message, total, chunk, index: 24 bytes
ACK_HEADER = ">BBHQI"  # type, flags, bitmap_len, message, cumulative: 16 bytes
ACK_COMPLETE, ACK_REFUSED, ACK_ABORTED, ACK_TAGGED = 0x01, 0x02, 0x04, 0x08
MAX_BITMAP = 32  # bytes, so 256 fragments past `cumulative`
# Control datagrams (the handshake that opens an association): exactly 32 bytes.
CONTROL = 0x83
CONTROL_FMT = ">BBHIQ16s"  # type, kind, tag, reserved, client id, token
HELLO, RETRY, ACCEPT, REFUSE, CLOSE = 1, 2, 3, 4, 5

SAY = "rpc.examples.v1.Echo/Say"
OK, UNIMPLEMENTED = 0, 12
MAX_MESSAGE = 16 * 1024 * 1024


class Failed(Exception):
    pass


def check(condition, what):
    if not condition:
        print("FAIL", what, flush=True)
        sys.exit(1)
    print("ok", what, flush=True)


# --- protobuf (just what SayRequest / SayReply need) -------------------------------


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def read_varint(buf, i):
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, i


def pb_bytes(field, data):
    return varint((field << 3) | 2) + varint(len(data)) + data


def pb_fields(payload):
    """Length-delimited fields of a message: {field: bytes} (last one wins)."""
    fields, i = {}, 0
    while i < len(payload):
        key, i = read_varint(payload, i)
        wire = key & 7
        if wire == 2:
            length, i = read_varint(payload, i)
            fields[key >> 3] = payload[i:i + length]
            i += length
        elif wire == 0:
            _, i = read_varint(payload, i)
        else:
            raise ValueError("unexpected wire type %d" % wire)
    return fields


def say_request(message):
    return pb_bytes(1, message.encode())


def say_message(payload):
    return pb_fields(payload).get(1, b"").decode()


# --- frames (section 2) -------------------------------------------------------------


def metadata_block(entries):
    block = b""
    for key, value in entries:
        k = key.encode()
        v = value if isinstance(value, bytes) else value.encode()
        block += struct.pack(">B", len(k)) + k + struct.pack(">I", len(v)) + v
    return struct.pack(">I", len(block)) + block


def request(call_id, method, payload, timeout_us=None, metadata=()):
    """A REQUEST frame (section 2.5), without any length prefix."""
    flags = FLAG_HAS_TIMEOUT if timeout_us is not None else 0
    m = method.encode()
    return (struct.pack(">BBHQ", VERSION, REQUEST, flags, call_id)
            + struct.pack(">Q", timeout_us or 0)
            + struct.pack(">H", len(m)) + m
            + metadata_block(metadata)
            + payload)


def take(buf, pos, n):
    if pos + n > len(buf):
        raise ValueError("truncated frame")
    return buf[pos:pos + n], pos + n


def parse_metadata(f, pos):
    (n,) = struct.unpack(">I", take(f, pos, 4)[0])
    block, pos = take(f, pos + 4, n)
    entries, i = [], 0
    while i < len(block):
        k, i = take(block, i + 1, block[i])
        (vlen,) = struct.unpack(">I", take(block, i, 4)[0])
        v, i = take(block, i + 4, vlen)
        entries.append((k.decode(), v))
    return entries, pos


def parse_frame(f):
    """A decoded frame as a dict; raises ValueError on a malformed one."""
    if len(f) < 12 or f[0] != VERSION:
        raise ValueError("bad frame header %r" % f[:12])
    _, kind, flags, ident = struct.unpack(">BBHQ", f[:12])
    if flags:
        raise ValueError("flags %#x on kind %d" % (flags, kind))
    if kind == RESPONSE:
        (code,) = struct.unpack(">I", take(f, 12, 4)[0])
        (alen,) = struct.unpack(">I", take(f, 16, 4)[0])
        msg, pos = take(f, 20, alen)
        (dlen,) = struct.unpack(">I", take(f, pos, 4)[0])
        details, pos = take(f, pos + 4, dlen)
        md, pos = parse_metadata(f, pos)
        return {"kind": RESPONSE, "id": ident, "code": code, "message": msg.decode(),
                "details": details, "metadata": md, "payload": f[pos:]}
    if kind == GOAWAY:
        (code,) = struct.unpack(">I", take(f, 12, 4)[0])
        (rlen,) = struct.unpack(">H", take(f, 16, 2)[0])
        reason, pos = take(f, 18, rlen)
        return {"kind": GOAWAY, "id": ident, "code": code, "reason": reason.decode()}
    if kind in (PING, PONG):
        return {"kind": kind, "id": ident, "payload": f[12:]}
    raise ValueError("unexpected kind %d from the server" % kind)


# --- the UDP association (section 1.2) -----------------------------------------------


class Inbound:
    """Reassembly of one fragmented message from the server."""

    def __init__(self, total, chunk):
        self.total, self.chunk = total, chunk
        self.count = (total + chunk - 1) // chunk
        self.buf = bytearray(total)
        self.have = [False] * self.count
        self.received = 0
        self.cumulative = 0  # every index below it has arrived

    def ack(self, message):
        """Acknowledgement of what has arrived so far (flags 0)."""
        bits = bytearray()
        first = self.cumulative + 1
        last = min(self.count, first + 8 * MAX_BITMAP)  # exclusive
        # Only as many bitmap bytes as reach the highest fragment we have.
        top = -1
        for i in range(first, last):
            if self.have[i]:
                top = i
        if top >= first:
            n = top - first + 1
            bits = bytearray((n + 7) // 8)
            for j in range(n):
                if self.have[first + j]:
                    bits[j // 8] |= 0x80 >> (j % 8)
        return struct.pack(ACK_HEADER, ACK, 0, len(bits), message, self.cumulative) + bytes(bits)


class Association:
    """One client socket: the server sees it as one association."""

    def __init__(self, host, port, tag=0):
        family, _, _, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
        self.sock = socket.socket(family, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        self.sock.connect(addr)
        self.client_id = random.getrandbits(64) or 1  # new for every association
        self.retries = 0  # RETRYs received during the handshake
        self.next_message = 1  # our fragmented messages, numbered from 1
        self.inbound = {}  # server message number -> Inbound
        self.finished = {}  # server message number -> final ack flags
        self.frames = []  # frames received: (frame dict, "whole" | ("fragmented", count))
        self.acks = []  # acknowledgements received: dicts
        self.datagrams = 0  # datagrams received (any type, valid or not)
        self.acks_sent = 0
        self.tag = tag  # our association tag (0: none), in the HELLO and our fragments
        self.server_tag = 0  # the server's, from its ACCEPT

    def control(self, kind, token=bytes(16)):
        tag = self.tag if kind == HELLO else 0
        return struct.pack(CONTROL_FMT, CONTROL, kind, tag, 0, self.client_id, token)

    def open(self, budget=5.0):
        """The handshake: HELLO, RETRY with a token, HELLO with it, ACCEPT. Nothing
        else is sent before, and nothing else is taken."""
        token = bytes(16)
        wait = 0.1
        start = time.monotonic()
        while time.monotonic() - start < budget:
            self.sock.send(self.control(HELLO, token))
            deadline = time.monotonic() + wait
            answered = False
            while not answered and time.monotonic() < deadline:
                self.sock.settimeout(max(deadline - time.monotonic(), 0.0005))
                try:
                    data = self.sock.recv(65535)
                except socket.timeout:
                    break
                if len(data) != 32 or data[0] != CONTROL:
                    continue  # not ours to take before ACCEPT
                _, kind, tag, _, client, tok = struct.unpack(CONTROL_FMT, data)
                if client != self.client_id:
                    continue
                if kind == ACCEPT:
                    self.server_tag = tag
                    return
                if kind == REFUSE:
                    raise Failed("the server refused the association")
                if kind == RETRY:
                    self.retries += 1
                    token, answered = tok, True  # HELLO again at once, with the token
            if not answered:
                wait = min(wait * 2, 1.0)
        raise Failed("no ACCEPT within %.0f s" % budget)

    def close(self):
        self.sock.send(self.control(CLOSE))  # best effort: the server forgets us now
        self.sock.close()

    def send(self, datagram):
        self.sock.send(datagram)

    def poll(self, timeout):
        """Receives and handles at most one datagram, waiting up to `timeout` s."""
        self.sock.settimeout(max(timeout, 0.0005))
        try:
            data = self.sock.recv(65535)
        except socket.timeout:
            return False
        self.datagrams += 1
        self.handle(data)
        return True

    def handle(self, data):
        if not data:
            return
        if data[0] == WHOLE:
            self.deliver(data, "whole")
        elif data[0] == FRAGMENT and len(data) >= 24:
            self.on_fragment(data)
        elif data[0] == ACK and len(data) >= 16:
            _, flags, blen, message, cumulative = struct.unpack(ACK_HEADER, data[:16])
            tagged = 2 if flags & ACK_TAGGED else 0
            if len(data) != 16 + blen + tagged or blen > MAX_BITMAP:
                return
            tag = struct.unpack(">H", data[16 + blen:])[0] if tagged else None
            self.acks.append({"flags": flags & ~ACK_TAGGED, "message": message,
                              "cumulative": cumulative, "bitmap": data[16:16 + blen],
                              "tag": tag})
        # anything else: dropped

    def deliver(self, frame, how):
        f = parse_frame(frame)
        if f["kind"] == PING:
            self.send(struct.pack(">BBHQ", VERSION, PONG, 0, f["id"]) + f["payload"])
        self.frames.append((f, how))

    def on_fragment(self, data):
        _, _, _, message, total, chunk, index = struct.unpack(FRAG_HEADER, data[:24])
        body = data[24:]
        if chunk == 0 or total == 0:
            return
        count = (total + chunk - 1) // chunk
        if index >= count or len(body) != min(chunk, total - index * chunk):
            return
        if message in self.finished:
            self.send(struct.pack(ACK_HEADER, ACK, self.finished[message], 0, message, 0))
            self.acks_sent += 1
            return
        if total > MAX_MESSAGE:
            self.finished[message] = ACK_REFUSED
            self.send(struct.pack(ACK_HEADER, ACK, ACK_REFUSED, 0, message, 0))
            return
        m = self.inbound.get(message)
        if m is None:
            m = self.inbound[message] = Inbound(total, chunk)
        elif (m.total, m.chunk) != (total, chunk):
            return
        if not m.have[index]:
            m.have[index] = True
            m.received += 1
            m.buf[index * chunk:index * chunk + len(body)] = body
            while m.cumulative < m.count and m.have[m.cumulative]:
                m.cumulative += 1
        if m.received == m.count:
            del self.inbound[message]
            self.finished[message] = ACK_COMPLETE
            self.send(struct.pack(ACK_HEADER, ACK, ACK_COMPLETE, 0, message, 0))
            self.acks_sent += 1
            self.deliver(bytes(m.buf), ("fragmented", m.count))
        else:
            # Simpler than the reference receiver (4 in order or 1 ms): acknowledge
            # every fragment at once.
            self.send(m.ack(message))
            self.acks_sent += 1

    def pump(self, until, seconds):
        """Handles datagrams until `until()` is true or `seconds` have passed."""
        deadline = time.monotonic() + seconds
        while not until():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.poll(min(left, 0.02))
        return True

    def response(self, call_id):
        for f, how in self.frames:
            if f["kind"] == RESPONSE and f["id"] == call_id:
                return f, how
        return None

    def goaways(self):
        return [f for f, _ in self.frames if f["kind"] == GOAWAY]

    # Calls -------------------------------------------------------------------------

    def call_whole(self, call_id, method, payload, budget=5.0, retransmit=0.2,
                   metadata=()):
        """Sends a whole-frame REQUEST, re-sending it (same id, budget recomputed)
        when no RESPONSE arrives within `retransmit` s; gives up after `budget` s.
        Returns (response frame dict, how it arrived, attempts)."""
        start = time.monotonic()
        attempts = 0
        while True:
            left = budget - (time.monotonic() - start)
            if left <= 0:
                raise Failed("no RESPONSE to call %d within %.1f s (%d attempts)"
                             % (call_id, budget, attempts))
            # Not again while a response is arriving in fragments (it may be ours).
            if attempts == 0 or not self.inbound:
                frame = request(call_id, method, payload, int(left * 1e6), metadata)
                assert len(frame) <= 1200, "a whole frame must fit one datagram"
                self.send(frame)
                attempts += 1
            if self.pump(lambda: self.response(call_id) or self.goaways(),
                         min(retransmit, left)):
                if self.goaways():
                    raise Failed("GOAWAY: %r" % self.goaways())
                f, how = self.response(call_id)
                return f, how, attempts

    def send_message(self, frame, chunk=1000, window=64, budget=10.0, max_sends=None):
        """Sends `frame` as a fragmented message, re-sending what the acknowledgements
        show missing, until COMPLETE, REFUSED or ABORTED. Returns the final flags."""
        message = self.next_message
        self.next_message += 1
        total = len(frame)
        count = (total + chunk - 1) // chunk
        acked = [False] * count
        sent_at = [None] * count  # last transmission time
        next_new = 0
        start = last_progress = time.monotonic()
        seen_acks = len(self.acks)
        highest_acked = -1  # highest index any acknowledgement showed arrived

        def fragment(i):
            body = frame[i * chunk:(i + 1) * chunk]
            return (struct.pack(FRAG_HEADER, FRAGMENT, 0, self.tag, message, total, chunk, i)
                    + body)

        def transmit(i):
            self.send(fragment(i))
            sent_at[i] = time.monotonic()

        while True:
            now = time.monotonic()
            if now - start > budget:
                raise Failed("message %d (%d fragments of %d bytes) not delivered within "
                             "%.0f s; acknowledgements received: %r"
                             % (message, count, chunk, budget, self.acks[-5:]))
            lowest = next((i for i in range(count) if not acked[i]), count)
            in_flight = sum(1 for i in range(lowest, next_new) if not acked[i])
            # New fragments, within the window and 256 past the lowest unacknowledged.
            while (next_new < count and in_flight < window
                   and next_new <= lowest + 8 * MAX_BITMAP
                   and (max_sends is None or next_new < max_sends)):
                transmit(next_new)
                next_new += 1
                in_flight += 1
            self.poll(0.005)
            progressed = False
            for a in self.acks[seen_acks:]:
                if a["message"] != message:
                    continue
                if a["flags"] & (ACK_COMPLETE | ACK_REFUSED | ACK_ABORTED):
                    return a["flags"]
                for i in range(min(a["cumulative"], count)):
                    if not acked[i]:
                        acked[i] = progressed = True
                for j in range(8 * len(a["bitmap"])):
                    if a["bitmap"][j // 8] & (0x80 >> (j % 8)):
                        i = a["cumulative"] + 1 + j
                        if i < count:
                            highest_acked = max(highest_acked, i)
                            if not acked[i]:
                                acked[i] = progressed = True
                if a["cumulative"] > 0:
                    highest_acked = max(highest_acked, min(a["cumulative"], count) - 1)
            seen_acks = len(self.acks)
            now = time.monotonic()
            if progressed:
                last_progress = now
            # Fragments the acknowledgements show missing (below one acknowledged),
            # sent more than 30 ms ago: again.
            for i in range(lowest, min(highest_acked, next_new)):
                if not acked[i] and now - sent_at[i] > 0.03:
                    transmit(i)
            # No progress for a while: probe with the oldest fragment in flight.
            if now - last_progress > 0.1:
                for i in range(lowest, next_new):
                    if not acked[i] and now - sent_at[i] > 0.1:
                        transmit(i)
                        break
                last_progress = now


def fresh(host, port):
    a = Association(host, port)
    a.open()
    return a


def main():
    host, port = sys.argv[1], int(sys.argv[2])

    # 0. Without the handshake the server keeps nothing: a REQUEST gets GOAWAY NO_ERROR
    # (no larger than the request), a PING its PONG.
    raw = Association(host, port)
    frame = request(1, SAY, say_request("too early"), 2_000_000)
    raw.send(frame)
    raw.pump(lambda: raw.goaways(), 2.0)
    check(raw.goaways() and raw.goaways()[0]["code"] == 0 and raw.goaways()[0]["id"] == 0,
          "a REQUEST before the handshake gets GOAWAY NO_ERROR, last_id 0 (%r)"
          % raw.goaways())
    raw.send(struct.pack(">BBHQ", VERSION, PING, 0, 78) + b"stateless")
    raw.pump(lambda: any(f["kind"] == PONG for f, _ in raw.frames), 2.0)
    check(any(f["kind"] == PONG and f["payload"] == b"stateless" for f, _ in raw.frames),
          "a PING before the handshake gets its PONG")
    raw.sock.close()

    # a. A whole-frame REQUEST gets the right RESPONSE.
    a = fresh(host, port)
    check(a.retries == 1, "the handshake took one RETRY")
    f, how, attempts = a.call_whole(1, SAY, say_request("hi"), metadata=[("x-user", "py")])
    check(how == "whole", "a small RESPONSE arrives as a whole frame (%d attempt(s))"
          % attempts)
    check(f["code"] == OK and f["message"] == "", "Say OK over UDP")
    check(say_message(f["payload"]) == "hi", "Say echoes 'hi' over UDP")
    check(("x-user", b"py") in f["metadata"], "request metadata echoed over UDP")
    a.close()

    # b. The same request id sent twice quickly: one or two correct responses, no error.
    b = fresh(host, port)
    frame = request(5, SAY, say_request("twice"), 2_000_000)
    b.send(frame)
    b.send(frame)
    b.pump(lambda: False, 0.5)
    answers = [f for f, _ in b.frames if f["kind"] == RESPONSE and f["id"] == 5]
    check(not b.goaways(), "no GOAWAY for a duplicated request id")
    check(1 <= len(answers) <= 2, "%d response(s) to a request sent twice" % len(answers))
    check(all(f["code"] == OK and say_message(f["payload"]) == "twice" for f in answers),
          "every response to the duplicated request is correct")
    # Answered, so the same id again is handled again.
    b.send(frame)
    b.pump(lambda: len([f for f, _ in b.frames
                        if f["kind"] == RESPONSE and f["id"] == 5]) > len(answers), 2.0)
    again = [f for f, _ in b.frames if f["kind"] == RESPONSE and f["id"] == 5]
    check(len(again) == len(answers) + 1 and say_message(again[-1]["payload"]) == "twice",
          "an answered request id sent again is handled again")
    b.close()

    # c. A large REQUEST goes as fragments; the large RESPONSE comes back as fragments.
    c = fresh(host, port)
    big = "".join(chr(ord("a") + (i * 7 + i // 26) % 26) for i in range(100_000))
    frame = request(1, SAY, say_request(big), 10_000_000)
    check(len(frame) > 100_000, "large REQUEST is %d bytes" % len(frame))
    flags = c.send_message(frame, chunk=1000)
    check(flags == ACK_COMPLETE, "large REQUEST acknowledged COMPLETE (flags %#x)" % flags)
    check(c.pump(lambda: c.response(1) or c.goaways(), 10.0) and c.response(1),
          "large RESPONSE received")
    f, how = c.response(1)
    check(how != "whole" and how[1] > 1,
          "large RESPONSE arrived in %s fragments" % (how[1] if how != "whole" else "no"))
    check(f["code"] == OK and say_message(f["payload"]) == big,
          "large echo intact (%d bytes)" % len(say_message(f["payload"])))
    # The server may re-send fragments if our COMPLETE was lost: answer for a moment.
    c.pump(lambda: False, 0.2)
    c.close()

    # c2. A small REQUEST sent fragmented is answered as a fragmented message
    # (count = 1) even though it fits one datagram. (chunk 64: the reference server
    # drops fragments with a chunk below 64 bytes, which the document does not say.)
    c2 = fresh(host, port)
    text = "a small request, sent in pieces anyway"
    frame = request(1, SAY, say_request(text), 5_000_000)
    flags = c2.send_message(frame, chunk=64)
    check(flags == ACK_COMPLETE, "small REQUEST in %d fragments acknowledged COMPLETE"
          % ((len(frame) + 63) // 64))
    c2.pump(lambda: c2.response(1) or c2.goaways(), 5.0)
    got = c2.response(1)
    check(got is not None and got[0]["code"] == OK
          and say_message(got[0]["payload"]) == text,
          "RESPONSE to a fragmented REQUEST received")
    check(got[1] == ("fragmented", 1),
          "RESPONSE to a fragmented REQUEST arrives as a 1-fragment message (%r)"
          % (got[1],))
    c2.pump(lambda: False, 0.1)
    c2.close()

    # d. A fragment claiming a total over 16 MiB is REFUSED.
    d = fresh(host, port)
    chunk = 1000
    refused = None
    for _ in range(10):
        d.send(struct.pack(FRAG_HEADER, FRAGMENT, 0, 0, 1, MAX_MESSAGE + 1, chunk, 0)
               + b"\0" * chunk)
        d.pump(lambda: d.acks, 0.2)
        if d.acks:
            refused = d.acks[0]
            break
    check(refused is not None and refused["message"] == 1
          and refused["flags"] & ACK_REFUSED,
          "a fragment of total 16 MiB + 1 gets an acknowledgement REFUSED (%r)"
          % (refused and refused["flags"],))
    d.close()

    # d2. Exactly 16 MiB is accepted (an ordinary acknowledgement, not REFUSED).
    d2 = fresh(host, port)
    d2.send(struct.pack(FRAG_HEADER, FRAGMENT, 0, 0, 1, MAX_MESSAGE, chunk, 0)
            + b"\0" * chunk)
    d2.pump(lambda: d2.acks, 1.0)
    check(d2.acks and d2.acks[0]["message"] == 1 and d2.acks[0]["flags"] == 0
          and d2.acks[0]["cumulative"] == 1,
          "a fragment of total exactly 16 MiB is accepted (%r)" % (d2.acks[:1],))
    d2.close()

    # e. Garbage gets no answer and does not stop the server.
    e = fresh(host, port)
    garbage = [
        b"\x00",
        b"\x42hello",
        b"\xff" * 40,
        b"\x02\x01\x00\x00" + b"\0" * 30,  # a "version 2" frame: first byte unknown
        b"\x81" + b"\0" * 10,  # fragment shorter than its 24-byte header
        b"\x81" + b"\0" * 22,  # 23 bytes
        struct.pack(FRAG_HEADER, FRAGMENT, 0, 0, 7, 10, 0, 0) + b"x" * 10,  # chunk 0
        struct.pack(FRAG_HEADER, FRAGMENT, 0, 0, 8, 10, 4, 3) + b"x" * 4,  # index >= count
        struct.pack(FRAG_HEADER, FRAGMENT, 0, 0, 9, 10, 4, 0) + b"x" * 3,  # short data
        b"\x82\x00\x00",  # acknowledgement shorter than its 16-byte header
        struct.pack(ACK_HEADER, ACK, 0, 4, 1, 0) + b"\0",  # bitmap shorter than announced
    ]
    for g in garbage:
        e.send(g)
    e.pump(lambda: e.datagrams > 0, 0.3)
    check(e.datagrams == 0, "%d garbage datagrams get no answer" % len(garbage))
    f, _, _ = e.call_whole(1, SAY, say_request("still there"))
    check(f["code"] == OK and say_message(f["payload"]) == "still there",
          "the server still answers on the same association after garbage")
    e.close()

    # PING over UDP.
    p = fresh(host, port)
    p.send(struct.pack(">BBHQ", VERSION, PING, 0, 77) + b"token")
    p.pump(lambda: any(f["kind"] == PONG for f, _ in p.frames), 2.0)
    pongs = [f for f, _ in p.frames if f["kind"] == PONG]
    check(pongs and pongs[0]["id"] == 77 and pongs[0]["payload"] == b"token",
          "PONG echoes id and payload over UDP")
    p.close()

    # f. Unknown service and unknown method: UNIMPLEMENTED.
    u = fresh(host, port)
    f, _, _ = u.call_whole(1, "rpc.examples.v1.Nope/Say", b"")
    check(f["code"] == UNIMPLEMENTED
          and f["message"] == "unknown service rpc.examples.v1.Nope",
          "UNIMPLEMENTED for an unknown service over UDP (%d %r)" % (f["code"], f["message"]))
    f, _, _ = u.call_whole(2, "rpc.examples.v1.Echo/Nope", b"")
    check(f["code"] == UNIMPLEMENTED,
          "UNIMPLEMENTED for an unknown method over UDP (%d %r)" % (f["code"], f["message"]))
    u.close()

    # g. An association with a tag (1.2, "Association tags"): the server's ACCEPT carries
    # its own, and every acknowledgement it sends is TAGGED with it (2 more bytes).
    t = Association(host, port, tag=random.randint(1, 65535))
    t.open()
    check(t.server_tag != 0, "ACCEPT carries the server's tag (%d)" % t.server_tag)
    frame = request(1, SAY, say_request("tagged " * 500), 5_000_000)
    flags = t.send_message(frame, chunk=1000)
    check(flags == ACK_COMPLETE, "a fragmented REQUEST on a tagged association completes")
    check(t.acks and all(a["tag"] == t.server_tag for a in t.acks),
          "every acknowledgement is TAGGED with the server's tag (%d of them)" % len(t.acks))
    t.pump(lambda: t.response(1), 5.0)
    check(t.response(1) and t.response(1)[0]["code"] == OK, "and the call is answered")
    # A fragment of a message finished earlier is answered with its final
    # acknowledgement (COMPLETE), and its data thrown away.
    seen = len(t.acks)
    t.send(struct.pack(FRAG_HEADER, FRAGMENT, 0, t.tag, 1, len(frame), 1000, 0) + frame[:1000])
    t.pump(lambda: len(t.acks) > seen, 2.0)
    check(len(t.acks) > seen and t.acks[seen]["message"] == 1
          and t.acks[seen]["flags"] == ACK_COMPLETE,
          "a fragment of a finished message gets COMPLETE again (%r)" % t.acks[seen:])
    t.pump(lambda: False, 0.1)
    t.close()

    # h. CANCEL of a slow call: no RESPONSE comes for it; the association goes on.
    k = fresh(host, port)
    sleep = "rpc.examples.v1.Echo/Sleep"
    k.send(request(1, sleep, varint(1 << 3) + varint(600), 5_000_000))
    k.send(struct.pack(">BBHQ", VERSION, CANCEL, 0, 1))
    f, _, _ = k.call_whole(2, SAY, say_request("after"))
    check(f["code"] == OK and say_message(f["payload"]) == "after",
          "a call after a CANCEL is answered over UDP")
    k.pump(lambda: k.response(1), 1.5)
    check(k.response(1) is None, "the cancelled call is not answered over UDP")
    # After CLOSE the server forgets the association: a REQUEST then gets a whole
    # GOAWAY NO_ERROR with last_id 0, as from an address it does not know.
    k.send(k.control(CLOSE))
    time.sleep(0.2)
    k.send(request(3, SAY, say_request("closed"), 2_000_000))
    k.pump(lambda: k.goaways(), 2.0)
    g = k.goaways()
    check(g and g[0]["code"] == 0 and g[0]["id"] == 0,
          "a REQUEST after CLOSE gets GOAWAY NO_ERROR, last_id 0 (%r)" % g)
    k.sock.close()


if __name__ == "__main__":
    try:
        main()
    except Failed as err:
        print("FAIL", err, flush=True)
        sys.exit(1)

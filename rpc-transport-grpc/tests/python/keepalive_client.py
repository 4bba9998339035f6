"""A grpcio client with an aggressive keepalive against our Echo server: it must keep
its one connection through idle spells, calls and streams.

Usage: keepalive_client.py TARGET STUB_DIR KEEPALIVE_MS SECONDS. The channel PINGs
every KEEPALIVE_MS, with calls or without (permit_without_calls, no limit on PINGs
without data), for about SECONDS in all: idle, unary calls, a 20,000-message stream,
an open Chat stream left idle, a stream of messages 50 ms apart. The server must
never close the connection (GOAWAY ENHANCE_YOUR_CALM for too many control frames,
say): the channel is READY from its first call to its last, and every call
succeeds. Prints the channel's states and "ok".
"""

import sys
import threading
import time

sys.path.insert(0, sys.argv[2])

import grpc  # noqa: E402
from rpc.examples.v1 import echo_pb2 as pb  # noqa: E402
from rpc.examples.v1 import echo_pb2_grpc as pb_grpc  # noqa: E402

TIMEOUT = 20


def main(target, keepalive_ms, seconds):
    options = [
        ("grpc.keepalive_time_ms", keepalive_ms),
        ("grpc.keepalive_timeout_ms", 5000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ]
    states = []
    lock = threading.Lock()

    def watch(state):
        with lock:
            states.append(state)

    with grpc.insecure_channel(target, options=options) as channel:
        echo = pb_grpc.EchoStub(channel)
        echo.Say(pb.SayRequest(message="first"), timeout=TIMEOUT)
        channel.subscribe(watch, try_to_connect=False)
        phase = seconds / 4
        time.sleep(phase)  # idle: keepalive PINGs only
        calls = 0
        until = time.time() + phase
        while time.time() < until:
            echo.Say(pb.SayRequest(message="busy"), timeout=TIMEOUT)
            calls += 1
        many = sum(1 for _ in echo.Count(pb.CountRequest(count=20000), timeout=TIMEOUT))
        assert many == 20000, many

        # A Chat stream open and idle (PINGs with a call in flight), then used.
        def requests():
            time.sleep(phase)
            yield pb.SayRequest(message="late")

        replies = [r.message for r in echo.Chat(requests(), timeout=TIMEOUT)]
        assert replies == ["re: late"], replies
        slow = [
            r.n
            for r in echo.Count(
                pb.CountRequest(count=int(phase * 20), interval_ms=50), timeout=TIMEOUT
            )
        ]
        assert len(slow) == int(phase * 20), len(slow)
        echo.Say(pb.SayRequest(message="last"), timeout=TIMEOUT)
        channel.unsubscribe(watch)
    with lock:
        seen = [s.name for s in states]
    print("states:", seen, "unary calls:", calls)
    # Subscribing reports the current state (READY) first; any other state means the
    # connection went away and the channel reconnected.
    assert all(s == "READY" for s in seen), seen
    print("ok")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[3]), float(sys.argv[4]))

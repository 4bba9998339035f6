"""A grpcio client of our Echo server: every call kind, deadlines, errors, metadata.

Usage: echo_client.py TARGET STUB_DIR [CA CERT KEY]. With the three PEM files the
channel is TLS with a client certificate (grpcs://). The stubs are generated from
proto/proto/rpc/examples/v1/echo.proto by the Rust test. Exits non-zero (with a
traceback) at the first check that fails; prints one line per case that passed.
"""

import queue
import sys

sys.path.insert(0, sys.argv[2])

import grpc  # noqa: E402
from rpc.examples.v1 import echo_pb2 as pb  # noqa: E402
from rpc.examples.v1 import echo_pb2_grpc as pb_grpc  # noqa: E402

TIMEOUT = 20


def expect_error(code, call, *args, **kwargs):
    try:
        call(*args, **kwargs)
    except grpc.RpcError as err:
        assert err.code() == code, (err.code(), err.details())
        return err
    raise AssertionError(f"expected {code}, the call succeeded")


def open_channel(target, tls):
    if not tls:
        return grpc.insecure_channel(target)
    ca, cert, key = (open(path, "rb").read() for path in tls)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=ca, private_key=key, certificate_chain=cert
    )
    return grpc.secure_channel(target, credentials)


def main(target, tls):
    with open_channel(target, tls) as channel:
        echo = pb_grpc.EchoStub(channel)

        reply = echo.Say(pb.SayRequest(message="hi", payload=b"\x00\x01"), timeout=TIMEOUT)
        assert reply.message == "hi" and reply.payload == b"\x00\x01", reply
        print("unary Say")

        # A reply of zero bytes is still one message: gRPC's unary has exactly one.
        reply = echo.Say(pb.SayRequest(), timeout=TIMEOUT)
        assert reply == pb.SayReply(), reply
        print("unary Say with an empty reply")

        big = bytes(range(256)) * 4096  # 1 MiB: many HTTP/2 frames, flow control
        reply = echo.Say(pb.SayRequest(message="big", payload=big), timeout=TIMEOUT)
        assert reply.payload == big
        print("large unary Say")

        # gzip both ways: the request is compressed (grpc-encoding: gzip), and the
        # server, which compresses with gzip, answers compressed since grpcio accepts it.
        zeros = b"\x00" * (1024 * 1024)
        reply = echo.Say(
            pb.SayRequest(message="gz", payload=zeros),
            timeout=TIMEOUT,
            compression=grpc.Compression.Gzip,
        )
        assert reply.message == "gz" and reply.payload == zeros
        replies = echo.Chat(
            iter([pb.SayRequest(message=str(i), payload=zeros[:4096]) for i in range(3)]),
            timeout=TIMEOUT,
            compression=grpc.Compression.Gzip,
        )
        assert [r.message for r in replies] == ["re: 0", "re: 1", "re: 2"]
        print("gzip compression")

        # An encoding the server does not have: UNIMPLEMENTED, per the gRPC spec.
        expect_error(
            grpc.StatusCode.UNIMPLEMENTED,
            echo.Say,
            pb.SayRequest(message="deflate", payload=zeros[:4096]),
            timeout=TIMEOUT,
            compression=grpc.Compression.Deflate,
        )
        print("unsupported compression")

        numbers = [r.n for r in echo.Count(pb.CountRequest(count=5), timeout=TIMEOUT)]
        assert numbers == [1, 2, 3, 4, 5], numbers
        print("server streaming Count")

        many = [r.n for r in echo.Count(pb.CountRequest(count=20000), timeout=TIMEOUT)]
        assert many == list(range(1, 20001))
        print("server streaming Count, 20000 messages")

        total = echo.Sum(iter([pb.SumRequest(value=v) for v in (1, 2, 3, 4)]), timeout=TIMEOUT)
        assert (total.total, total.count) == (10, 4), total
        empty = echo.Sum(iter([]), timeout=TIMEOUT)
        assert (empty.total, empty.count) == (0, 0), empty
        print("client streaming Sum")

        # Ping-pong: each message is answered before the next is sent.
        outgoing = queue.Queue()

        def requests():
            while (word := outgoing.get()) is not None:
                yield pb.SayRequest(message=word)

        replies = echo.Chat(requests(), timeout=TIMEOUT)
        for word in ["a", "b", "c"]:
            outgoing.put(word)
            assert next(replies).message == "re: " + word
        outgoing.put(None)
        assert list(replies) == []
        print("bidirectional Chat")

        chat = echo.Chat(iter([]), timeout=TIMEOUT)
        assert list(chat) == []
        print("empty stream")

        expect_error(
            grpc.StatusCode.DEADLINE_EXCEEDED,
            echo.Sleep,
            pb.SleepRequest(delay_ms=10000),
            timeout=0.3,
        )
        print("deadline")

        message = "no such user: ünïcode\n100% \t done"
        err = expect_error(
            grpc.StatusCode.NOT_FOUND,
            echo.Fail,
            pb.FailRequest(code=5, message=message),
            timeout=TIMEOUT,
        )
        assert err.details() == message, repr(err.details())
        print("status and message")

        # Custom metadata both ways, through the test's metadata-echoing service: the
        # text keys come back as headers, the binary ones as trailers, on the unary
        # fast path (Echo) and on the stream path (any other name) alike.
        for name in ("Echo", "EchoOnStreamPath"):
            meta = channel.unary_unary(
                "/test.Meta/" + name,
                request_serializer=pb.SayRequest.SerializeToString,
                response_deserializer=pb.SayReply.FromString,
            )
            reply, call = meta.with_call(
                pb.SayRequest(message="m"),
                metadata=[("x-user", "alice"), ("x-trace-bin", b"\x00\xff\x10")],
                timeout=TIMEOUT,
            )
            assert reply.message == "m", reply
            initial = dict(call.initial_metadata())
            trailing = dict(call.trailing_metadata())
            assert initial.get("x-user") == "alice", (name, initial)
            assert "x-trace-bin" not in initial, (name, initial)
            assert trailing.get("x-trace-bin") == b"\x00\xff\x10", (name, trailing)
            assert "x-user" not in trailing, (name, trailing)
        print("custom metadata")

        nope = channel.unary_unary("/rpc.examples.v1.Echo/Nope")
        expect_error(grpc.StatusCode.UNIMPLEMENTED, nope, b"", timeout=TIMEOUT)
        nope = channel.unary_unary("/rpc.examples.v1.Nope/Say")
        expect_error(grpc.StatusCode.UNIMPLEMENTED, nope, b"", timeout=TIMEOUT)
        print("unimplemented method and service")

        # Over the server's message limit (the test sets 4 MiB): this call fails,
        # the connection goes on.
        huge = b"\x00" * (5 * 1024 * 1024)
        expect_error(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            echo.Say,
            pb.SayRequest(payload=huge),
            timeout=TIMEOUT,
        )
        assert echo.Say(pb.SayRequest(message="after"), timeout=TIMEOUT).message == "after"
        print("message over the limit")

        # Cancel after the first response: the call ends CANCELLED here.
        replies = echo.Count(pb.CountRequest(count=1000, interval_ms=50), timeout=TIMEOUT)
        assert next(replies).n == 1
        replies.cancel()
        try:
            list(replies)
            raise AssertionError("the cancelled stream went on")
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.CANCELLED, err.code()
        assert echo.Say(pb.SayRequest(message="still"), timeout=TIMEOUT).message == "still"
        print("cancel after first response")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[3:6])
    print("ok")

"""A grpcio Echo server for our client to call.

Usage: echo_server.py STUB_DIR [CERT KEY CA]. Prints "PORT <n>" once it listens on
127.0.0.1 and serves until its standard input closes. With the three PEM files it
serves TLS and requires a client certificate signed by CA.
"""

import sys
import time
from concurrent import futures

sys.path.insert(0, sys.argv[1])

import grpc  # noqa: E402
from rpc.examples.v1 import echo_pb2 as pb  # noqa: E402
from rpc.examples.v1 import echo_pb2_grpc as pb_grpc  # noqa: E402


class Echo(pb_grpc.EchoServicer):
    def Say(self, request, context):
        metadata = dict(context.invocation_metadata())
        if "x-user" in metadata:
            context.send_initial_metadata([("x-user", metadata["x-user"])])
        if "x-trace-bin" in metadata:
            context.set_trailing_metadata([("x-trace-bin", metadata["x-trace-bin"])])
        return pb.SayReply(message=request.message, payload=request.payload)

    def Sleep(self, request, context):
        deadline = time.monotonic() + request.delay_ms / 1000
        while time.monotonic() < deadline and context.is_active():
            time.sleep(0.01)
        return pb.SleepReply(slept_ms=request.delay_ms)

    def Fail(self, request, context):
        if request.code != 0:
            context.abort(grpc.StatusCode(_code(request.code)), request.message)
        return pb.FailReply()

    def Count(self, request, context):
        big = dict(context.invocation_metadata()).get("x-big-headers")
        if big:
            # Response headers of that many bytes: over the client's metadata limit.
            context.send_initial_metadata([("x-big", "v" * int(big))])
        for n in range(1, request.count + 1):
            if n > 1 and request.interval_ms:
                time.sleep(request.interval_ms / 1000)
            yield pb.CountReply(n=n)

    def Sum(self, request_iterator, context):
        values = [r.value for r in request_iterator]
        return pb.SumReply(total=sum(values), count=len(values))

    def Chat(self, request_iterator, context):
        for request in request_iterator:
            yield pb.SayReply(message="re: " + request.message, payload=request.payload)


def _code(number):
    for code in grpc.StatusCode:
        if code.value[0] == number:
            return code.value
    return grpc.StatusCode.UNKNOWN.value


def main():
    # gzip toward clients that accept it (grpc-accept-encoding), identity otherwise.
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=16), compression=grpc.Compression.Gzip
    )
    pb_grpc.add_EchoServicer_to_server(Echo(), server)
    if len(sys.argv) >= 5:
        cert, key, ca = (open(path, "rb").read() for path in sys.argv[2:5])
        credentials = grpc.ssl_server_credentials(
            [(key, cert)], root_certificates=ca, require_client_auth=True
        )
        port = server.add_secure_port("127.0.0.1:0", credentials)
    else:
        port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(f"PORT {port}", flush=True)
    sys.stdin.read()
    server.stop(grace=None)


if __name__ == "__main__":
    main()

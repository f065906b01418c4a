"""What an emulated host measures of itself, run inside its namespace and cgroup
(`python -m tag_tf.emulate.probe ...`):

    cpu ITERATIONS                 seconds a fixed pure-Python loop takes here (one thread)
    serve ADDRESS PORT             answer `send` until killed: a ping, or bytes counted then acknowledged
    send ADDRESS PORT BYTES        round trip (median of pings) and the seconds BYTES take to arrive

Each prints one JSON line. Operating-system level: what TensorFlow then gets is measured by
discovery (`tag_tf.measure.links`).
"""
from __future__ import annotations

import json
import socket
import statistics
import struct
import sys
import time

_HEADER = struct.Struct("!Q")
PINGS = 21


def cpu(iterations: int) -> float:
    start = time.perf_counter()
    x = 0
    for i in range(iterations):
        x = (x * 31 + i) & 0xFFFF
    return time.perf_counter() - start


def serve(address: str, port: int) -> None:
    with socket.create_server((address, port), reuse_port=False) as server:
        print(json.dumps({"listening": f"{address}:{port}"}), flush=True)
        while True:
            conn, _ = server.accept()
            with conn:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                _answer(conn)


def _answer(conn: socket.socket) -> None:
    buffer = bytearray(1 << 20)
    while True:
        header = _read_exactly(conn, _HEADER.size)
        if header is None:
            return
        (n,) = _HEADER.unpack(header)
        while n > 0:
            got = conn.recv_into(buffer, min(n, len(buffer)))
            if not got:
                return
            n -= got
        conn.sendall(b"k")


def _read_exactly(conn: socket.socket, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def send(address: str, port: int, nbytes: int) -> dict:
    with socket.create_connection((address, port), timeout=60) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        rtts = []
        for _ in range(PINGS):
            start = time.perf_counter()
            conn.sendall(_HEADER.pack(0))
            conn.recv(1)
            rtts.append(time.perf_counter() - start)
        payload = bytes(min(nbytes, 1 << 20))
        start = time.perf_counter()
        conn.sendall(_HEADER.pack(nbytes))
        left = nbytes
        while left > 0:
            chunk = payload[:min(left, len(payload))]
            conn.sendall(chunk)
            left -= len(chunk)
        conn.recv(1)
        seconds = time.perf_counter() - start
    return {"rtt_s": statistics.median(rtts), "bytes": nbytes, "seconds": seconds}


def main(argv: list[str]) -> int:
    what = argv[0] if argv else ""
    if what == "cpu" and len(argv) == 2:
        print(json.dumps({"seconds": cpu(int(argv[1]))}), flush=True)
    elif what == "serve" and len(argv) == 3:
        serve(argv[1], int(argv[2]))
    elif what == "send" and len(argv) == 4:
        print(json.dumps(send(argv[1], int(argv[2]), int(argv[3]))), flush=True)
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Parent <-> worker messages over a socket: a JSON header plus optional raw bytes.

Frame: ``u32 header_len | u64 body_len | JSON header | body``. Bodies are DSSST1 frames or
safetensors files produced by :mod:`cortex_training.wire`; nothing here is ever pickled.
"""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

_PREFIX = struct.Struct("<IQ")
MAX_HEADER_BYTES = 16 * 1024 * 1024


class ConnectionClosed(ConnectionError):
    """The peer went away."""


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionClosed("worker connection closed")
        got += k
    return bytes(buf)


def send_message(sock: socket.socket, header: dict[str, Any], body: bytes = b"") -> None:
    raw = json.dumps(header).encode("utf-8")
    sock.sendall(_PREFIX.pack(len(raw), len(body)) + raw)
    if body:
        sock.sendall(body)


def recv_message(sock: socket.socket) -> tuple[dict[str, Any], bytes]:
    header_len, body_len = _PREFIX.unpack(_recv_exact(sock, _PREFIX.size))
    if header_len > MAX_HEADER_BYTES:
        raise ConnectionClosed(f"worker header of {header_len} bytes exceeds the limit")
    header = json.loads(_recv_exact(sock, header_len).decode("utf-8"))
    body = _recv_exact(sock, body_len) if body_len else b""
    return header, body

"""A WebSocket client on a bare socket, for clients that misbehave on purpose.

aiohttp's client reads everything the server sends into memory as it arrives, so it cannot
play a client that stops reading. This one does the opening handshake, sends masked text
frames and reads only when asked, with a small receive buffer so the server feels it soon.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
import time
from typing import Any

import numpy as np


def connect(port: int, headers: dict[str, str] | None = None, *, recv_buffer: int = 4096,
            path: str = "/v1/realtime", timeout: float = 10.0) -> socket.socket:
    """Open a WebSocket on 127.0.0.1:port and return the socket after the 101."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, recv_buffer)  # before connect: sets the window
    sock.settimeout(timeout)
    sock.connect(("127.0.0.1", port))
    key = base64.b64encode(os.urandom(16)).decode()
    lines = [f"GET {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Upgrade: websocket", "Connection: Upgrade",
             f"Sec-WebSocket-Key: {key}", "Sec-WebSocket-Version: 13",
             *(f"{k}: {v}" for k, v in (headers or {}).items())]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(1)  # byte by byte: nothing after the head is consumed
        if not chunk:
            raise ConnectionError(f"closed during the handshake: {head!r}")
        head += chunk
    if not head.startswith(b"HTTP/1.1 101"):
        sock.close()
        raise ConnectionError(f"upgrade refused: {head.splitlines()[0]!r}")
    return sock


def send_text(sock: socket.socket, text: str) -> None:
    payload = text.encode()
    mask = os.urandom(4)
    n = len(payload)
    if n < 126:
        header = struct.pack("!BB", 0x81, 0x80 | n)
    elif n < 1 << 16:
        header = struct.pack("!BBH", 0x81, 0x80 | 126, n)
    else:
        header = struct.pack("!BBQ", 0x81, 0x80 | 127, n)
    data = np.frombuffer(payload, np.uint8)
    masked = (data ^ np.resize(np.frombuffer(mask, np.uint8), data.size)).tobytes()
    sock.sendall(header + mask + masked)


def send_event(sock: socket.socket, type: str, **fields: Any) -> None:
    send_text(sock, json.dumps({"type": type, **fields}))


def closed_by_peer(sock: socket.socket, timeout: float) -> bool:
    """Read (and discard) until the server closes the connection or `timeout` passes."""
    deadline = time.monotonic() + timeout
    try:
        while (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            if not sock.recv(65536):
                return True
    except ConnectionResetError:
        return True
    except (socket.timeout, TimeoutError):
        pass
    return False

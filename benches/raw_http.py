# SPDX-License-Identifier: Apache-2.0
"""A raw HTTP/1.1 server on loopback for the OTLP post bench and the light session's tests: reads
each request whole (headers and a `Content-Length` body) on kept-alive connections, one connection
at a time, and sends what `answer(head)` returns (None: closes without an answer)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 2\r\n\r\nok"


class RawHttpServer:
    """Records every request (head and body) and how many connections it accepted."""

    def __init__(self, answer: Callable[[bytes], bytes | None] = lambda _: OK) -> None:
        self._answer = answer
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self.requests: list[bytes] = []
        self.connections = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def url(self, path: str = "/v1/metrics") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            with conn:
                self._converse(conn)

    def _converse(self, conn: socket.socket) -> None:
        buffered = b""
        while True:
            while b"\r\n\r\n" not in buffered:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                buffered += chunk
            head, _, rest = buffered.partition(b"\r\n\r\n")
            lines = head.split(b"\r\n")
            length = next((int(h.split(b":")[1]) for h in lines if h.lower().startswith(b"content-length")), 0)
            while len(rest) < length:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                rest += chunk
            self.requests.append(head + b"\r\n\r\n" + rest[:length])
            buffered = rest[length:]
            reply = self._answer(head)
            if reply is None:
                return
            conn.sendall(reply)

    def close(self) -> None:
        self._listener.close()


__all__ = ["OK", "RawHttpServer"]

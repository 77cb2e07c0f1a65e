# SPDX-License-Identifier: Apache-2.0
"""A local address that is not loopback, so a test can be a non-loopback peer of a server on this
machine (the probe server listens on every interface): the source address of the default route, else
what the host name resolves to. None on a machine with loopback alone; tests then check the peer
test directly and skip the real connection."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket


def non_loopback_address() -> str | None:
    candidates: list[str] = []
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.connect(("192.0.2.254", 9))  # a UDP connect sends nothing: it only picks the route's source
        candidates.append(str(udp.getsockname()[0]))
    with contextlib.suppress(OSError):
        candidates.append(socket.gethostbyname(socket.gethostname()))
    for address in candidates:
        ip = ipaddress.ip_address(address)
        if not ip.is_loopback and not ip.is_unspecified and _bindable(address):
            return address
    return None


def _bindable(address: str) -> bool:
    with socket.socket() as s:
        try:
            s.bind((address, 0))
        except OSError:
            return False
    return True


async def http_get_from(source: str, port: int, path: str) -> tuple[int, bytes]:
    """GET `path` from `source`:`port` with the connection's local end bound to `source`, so the
    server sees `source` as the peer; (status, body)."""
    reader, writer = await asyncio.open_connection(source, port, local_addr=(source, 0))
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


__all__ = ["http_get_from", "non_loopback_address"]

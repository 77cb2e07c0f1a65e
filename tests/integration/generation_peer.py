# SPDX-License-Identifier: Apache-2.0
"""Two instruments for generation settlement tests over a real nats-server and a real Unix socket.

`JetStreamTrace` reads a protocol-traced nats-server's log (`traced_nats_server`, `-V`): every ACK,
NAK (with its delay) and progress ACK a client wrote to a JetStream message's ack subject, in the
order the server processed them. That is the settlement as JetStream saw it, not as the sidecar
counted it.

`GenerationPeer` sits between the sidecar and the reference backend: every request is passed
through, except a ProcessGenerate whose prompt names a script; the peer answers that one itself,
frame by frame, so a test can send what the backend library never writes (a stream that ends
unsettled, an unknown event kind, a frame for another request, a response chunk)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from sie_sidecar.backend.server import encode_response
from sie_sidecar.ipc.types import GenerateEvent

from .conftest import NatsServer

#: (kind, NAK delay in ns): ("ack", None), ("progress", None), ("nak", 200_000_000) or ("nak", None).
Settlement = tuple[str, int | None]

#: A PUB: `subject  size` (no reply) or `subject reply size` (a confirmed ACK, say).
_PUB = re.compile(r" - cid:(?P<cid>\d+) - .* - <<- \[PUB (?P<subject>\S+) (?:\S+ )? *(?P<size>\d+)\]$")
_PAYLOAD = re.compile(r" - cid:(?P<cid>\d+) - .* - <<- MSG_PAYLOAD: \[\"(?P<payload>.*)\"\]$")
_DELAY = re.compile(r'\\"delay\\":\s*(\d+)')


def _settlement(payload: str) -> Settlement:
    """An ack-subject payload as traced (Go-quoted): what it asks JetStream to do."""
    if payload in ("", "+ACK"):
        return ("ack", None)
    if payload == "+WPI":
        return ("progress", None)
    if payload.startswith("-NAK"):
        delay = _DELAY.search(payload)
        return ("nak", int(delay.group(1)) if delay else None)
    return (payload, None)


class JetStreamTrace:
    """Settlements of JetStream messages, read back from a traced nats-server's log."""

    def __init__(self, server: NatsServer) -> None:
        self.server = server

    def settlements(self, stream: str, sequence: int) -> list[Settlement]:
        """Every settlement written for the message `sequence` of `stream`, all deliveries, in order."""
        found: list[Settlement] = []
        pending: dict[str, bool] = {}  # cid -> the PUB just read was for this message
        for line in self.server.log_path.read_text(errors="replace").splitlines():
            pub = _PUB.search(line)
            if pub is not None:
                # $JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<ts>.<pending>
                tokens = pub["subject"].split(".")
                ours = tokens[:3] == ["$JS", "ACK", stream] and len(tokens) == 9 and tokens[5] == str(sequence)
                if ours and pub["size"] == "0":
                    found.append(("ack", None))  # an empty ACK: the server traces no payload line
                    ours = False
                pending[pub["cid"]] = ours
                continue
            payload = _PAYLOAD.search(line)
            if payload is not None and pending.pop(payload["cid"], False):
                found.append(_settlement(payload["payload"]))
        return found

    async def wait_for(
        self,
        stream: str,
        sequence: int,
        done: Callable[[list[Settlement]], bool],
        timeout: float = 10.0,
    ) -> list[Settlement]:
        """The message's settlements once `done` holds for them (the server logs as it goes)."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.settlements(stream, sequence)
            if done(found):
                return found
            if time.monotonic() > deadline:
                raise AssertionError(f"settlements of {stream} #{sequence} never satisfied the test: {found}")
            await asyncio.sleep(0.05)


def frame(body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + body


async def read_frame(reader: asyncio.StreamReader) -> bytes:
    header = await reader.readexactly(4)
    return await reader.readexactly(int.from_bytes(header, "big"))


def event_frame(request_id: str, kind: str, **fields: Any) -> bytes:
    """One ResponseEnvelope frame whose body is a GenerateEvent (wire-protocol §5.2)."""
    return frame(encode_response(request_id, True, GenerateEvent(kind=kind, **fields).to_body(), None))


def chunk_payload(work_item: Mapping[str, Any], seq: int, text: str, *, done: bool = False) -> bytes:
    """A chunk envelope (wire-protocol §5.3) for the work item's request."""
    envelope: dict[str, Any] = {
        "kind": "chunk",
        "request_id": work_item["request_id"],
        "attempt_id": f"peer:{work_item['work_item_id']}",
        "seq": seq,
        "text_delta": text,
        "done": done,
    }
    if done:
        envelope["finish_reason"] = "stop"
    return bytes(msgpack.packb(envelope, use_bin_type=True))


def publish_frame(request_id: str, work_item: Mapping[str, Any], seq: int, text: str, *, done: bool = False) -> bytes:
    payload = chunk_payload(work_item, seq, text, done=done)
    return event_frame(request_id, "publish", reply_subject=work_item["reply_subject"], payload=payload)


#: What the peer writes for one ProcessGenerate: frames, and pauses (seconds) between them.
Step = bytes | float
#: (the request's IPC request id, the re-encoded work item, which answer for this prompt it is,
#: from 1) -> the steps of the answer.
Script = Callable[[str, dict[str, Any], int], Sequence[Step]]


@dataclass
class Answered:
    """One ProcessGenerate the peer answered from a script."""

    prompt: str
    work_item: dict[str, Any]


class GenerationPeer:
    """Passes every request through to `upstream`, except ProcessGenerate for a prompt in `scripts`."""

    def __init__(self, upstream: str, scripts: Mapping[str, Script]) -> None:
        self.upstream = upstream
        self.scripts = dict(scripts)
        self.answered: list[Answered] = []
        self._writers: set[asyncio.StreamWriter] = set()

    def count(self, prompt: str) -> int:
        return sum(1 for a in self.answered if a.prompt == prompt)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        upstream: tuple[asyncio.StreamWriter, asyncio.Task[None]] | None = None
        try:
            while True:
                body = await read_frame(reader)
                if await self._scripted(body, writer):
                    continue
                if upstream is None:
                    up_reader, up_writer = await asyncio.open_unix_connection(self.upstream, limit=1 << 20)
                    upstream = (up_writer, asyncio.create_task(self._pump(up_reader, writer)))
                upstream[0].write(frame(body))
                await upstream[0].drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            if upstream is not None:
                upstream[1].cancel()
                upstream[0].close()
            writer.close()
            self._writers.discard(writer)

    async def _scripted(self, body: bytes, writer: asyncio.StreamWriter) -> bool:
        """Answer a scripted ProcessGenerate; False for anything else (passed through)."""
        request = msgpack.unpackb(body, raw=False)
        if request.get("method") != "ProcessGenerate":
            return False
        work_item = msgpack.unpackb(request["body"]["work_item_msgpack"], raw=False)
        prompt = str((work_item.get("generate") or {}).get("prompt") or "")
        script = self.scripts.get(prompt)
        if script is None:
            return False
        self.answered.append(Answered(prompt, work_item))
        for step in script(request["request_id"], work_item, self.count(prompt)):
            if isinstance(step, float):
                await asyncio.sleep(step)  # the backend's pace, part of the script
                continue
            writer.write(step)
            await writer.drain()
        return True

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                writer.write(frame(await read_frame(reader)))
                await writer.drain()

    def close_all(self) -> None:
        for writer in list(self._writers):
            writer.close()


__all__ = [
    "Answered",
    "GenerationPeer",
    "JetStreamTrace",
    "Script",
    "Settlement",
    "Step",
    "chunk_payload",
    "event_frame",
    "frame",
    "publish_frame",
    "read_frame",
]

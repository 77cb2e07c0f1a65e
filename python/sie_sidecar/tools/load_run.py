# SPDX-License-Identifier: Apache-2.0
"""One load run, whatever carries it: the WorkItems the gateway would write, the plan of requests
and arrivals, the run's bookkeeping of what came back, the progress bar and the summary.

`tools.loadgen` drives it over NATS and `tools.loadgen_local` over the local-ingest socket; both
import it here, so neither imports the other's internals.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import secrets
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

import msgpack
import numpy as np
from tqdm import tqdm

from .. import wire
from ..errors import SubjectError, WireError
from ..wire.limits import RESULT_CHUNK_KIND

if TYPE_CHECKING:
    from nats.aio.msg import Msg

_P50_WINDOW = 2048  # recent latencies the progress bar's p50 is taken over

OPERATIONS = ("encode", "score", "extract")
ARRIVALS = ("fixed", "poisson")
MAX_ITEMS_PER_REQUEST = 4096  # wire-protocol §7.1: max 4,096 items per request
SCORE_CANDIDATES = 4
EXTRACT_LABELS = ("person", "organization", "location")
TRANSPORT_FAILURE = "transport_failure"
_PROGRESS_TICK_S = 0.1  # how often the ticker feeds the bar; tqdm redraws at most as often

#: With a known capacity, the answers outstanding at the last publish are due within
#: LATE_FACTOR x outstanding / capacity + LATE_SLACK_S (twice the time the backlog needs, plus a
#: second for the last batches' round trips); the wait stops once nothing was answered for
#: max(STALL_MIN_S, STALL_ITEMS / capacity) after that.
LATE_FACTOR = 2.0
LATE_SLACK_S = 1.0
STALL_MIN_S = 3.0
STALL_ITEMS = 64

DEFAULT_TEXTS: tuple[str, ...] = (
    "The quick brown fox jumps over the lazy dog.",
    "Vector search retrieves documents by meaning rather than by exact keywords.",
    "A sidecar process handles queueing so the inference server can focus on the model.",
    "What is the capital of Australia?",
    "Canberra was chosen as a compromise between Sydney and Melbourne.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "How do I reset my password if I no longer have access to my email?",
    "The mitochondria is often called the powerhouse of the cell.",
    "Rust guarantees memory safety without a garbage collector.",
    "She sells sea shells by the sea shore.",
    "Quarterly revenue grew by twelve percent, driven by strong subscription renewals.",
    "Please find attached the signed contract and the updated delivery schedule.",
    "The Eiffel Tower was completed in 1889 for the World's Fair in Paris.",
    "Embeddings map text into a high-dimensional space where similar meanings lie close together.",
    "Preheat the oven to 180 degrees and grease a round cake tin.",
    "Symptoms include fever, a dry cough and tiredness.",
    "The defendant pleaded not guilty to all charges.",
    "Large language models are trained on vast amounts of text.",
    "Where is the nearest train station?",
    "Water boils at 100 degrees Celsius at sea level.",
    "The meeting has been moved to Thursday at three o'clock.",
    "JetStream persists messages so that consumers can process them at their own pace.",
    "A stitch in time saves nine.",
    "The patient was discharged after a three-day observation period.",
    "Our return policy allows exchanges within thirty days of purchase.",
    "Jupiter is the largest planet in the solar system.",
    "Always validate untrusted input before using it in a database query.",
    "The orchestra performed Beethoven's Ninth Symphony to a standing ovation.",
    "Interest rates were left unchanged at the central bank's latest meeting.",
    "Tokenizers split text into subword units that the model understands.",
    "Can you recommend a good Italian restaurant near the city centre?",
    "The glacier has retreated more than two kilometres over the past century.",
    "Marie Curie was the first person to win Nobel Prizes in two different sciences.",
    "Backpressure keeps a fast producer from overwhelming a slow consumer.",
    "The hiking trail is closed due to heavy snowfall.",
    "GPU memory is the scarcest resource when serving many models at once.",
    "I would like to book a table for four at seven thirty.",
    "The novel follows three generations of a family in rural Ireland.",
    "Cosine similarity measures the angle between two vectors.",
    "An apple a day keeps the doctor away.",
    "The software update fixes a bug that caused the app to crash on startup.",
    "Bees communicate the location of flowers through a waggle dance.",
    "Shipping is free for orders over fifty dollars.",
    "The committee will publish its final report next spring.",
    "Latency percentiles say more about user experience than averages do.",
    "Der schnelle braune Fuchs springt über den faulen Hund.",
    "El aprendizaje automático permite a las computadoras aprender de los datos.",
    "東京は日本の首都です。",
    "The password must contain at least twelve characters, including a digit.",
    "Sunlight takes about eight minutes to travel from the Sun to the Earth.",
)


class LoadgenError(Exception):
    """A setup problem (no server, no pool stream, bad configuration) that stops the run before load."""


def varied_texts(count: int = 256, *, min_words: int = 5, max_words: int = 120, seed: int = 0) -> tuple[str, ...]:
    """`count` texts whose word counts are uniform in [min_words, max_words], made of the words of
    DEFAULT_TEXTS (seeded, so runs are reproducible). Item costs (tokens) then vary the way real
    traffic does, which is what a cost-capped batch former and its controller react to."""
    if count < 1 or not 1 <= min_words <= max_words:
        raise LoadgenError("varied texts need count >= 1 and 1 <= min_words <= max_words")
    rng = random.Random(seed)
    vocabulary = sorted({word for text in DEFAULT_TEXTS for word in text.split()})
    return tuple(
        " ".join(rng.choice(vocabulary) for _ in range(rng.randint(min_words, max_words))) for _ in range(count)
    )


def arrival_offsets(plan: Sequence[int], rate: float, arrival: str = "fixed", seed: int = 0) -> list[float]:
    """When each request of `plan` (items per request) leaves, in seconds after the start.

    `fixed`: request j at items_before_j / rate. `poisson`: exponential gaps with mean
    items_j / rate (a Poisson process of requests whose item rate is `rate`; the first request goes
    at 0), from a seeded generator so a run can be repeated. Empty when `rate` is 0 (no schedule)."""
    if arrival not in ARRIVALS:
        raise LoadgenError(f"arrival must be one of {', '.join(ARRIVALS)}, not {arrival!r}")
    if rate <= 0:
        return []
    offsets: list[float] = []
    at = 0.0
    if arrival == "fixed":
        for total in plan:
            offsets.append(at)
            at += total / rate
        return offsets
    rng = random.Random(seed)
    for total in plan:
        offsets.append(at)
        at += rng.expovariate(rate / total)  # the gap after a request: mean items / rate
    return offsets


@dataclass(frozen=True, slots=True)
class Deadlines:
    """How long the run waits for the answers still outstanding after its last publish."""

    due_s: float | None  # answers later than this (after the last publish) are late; None: none are
    stall_s: float | None  # after due_s, stop once nothing was answered for this long; None: no such rule
    give_up_s: float  # never wait longer than this after the last publish


def deadlines(outstanding: int, capacity: float, timeout_s: float) -> Deadlines:
    """The wait for `outstanding` answers at a measured `capacity` (items/s; 0 = unknown: a fixed
    `timeout_s`). A late answer is still an answer: only one that never comes within the wait
    (nothing answered for `stall_s` past the due time, or `timeout_s` in all) is missing."""
    if capacity <= 0:
        return Deadlines(None, None, timeout_s)
    due = LATE_FACTOR * outstanding / capacity + LATE_SLACK_S
    return Deadlines(due, max(STALL_MIN_S, STALL_ITEMS / capacity), timeout_s)


def _default_router_id() -> str:
    return f"loadgen-{secrets.token_hex(4)}"


@dataclass(frozen=True)
class LoadConfig:
    """What to send and where. `items` counts WorkItems; encode/extract requests fan out into
    `items_per_request` WorkItems each, score requests are always one WorkItem."""

    nats_url: str
    pool: str = "default"
    machine_profile: str = "cpu"
    bundle: str = "default"
    model: str = "sentence-transformers/all-MiniLM-L6-v2"
    operation: str = "encode"
    items: int = 1000
    items_per_request: int = 1
    rate: float = 0.0  # items/s; 0 = as fast as possible, else open loop on the `arrival` schedule
    arrival: str = "fixed"  # "fixed" interval or "poisson" (exponential gaps, seeded by `seed`)
    seed: int = 0
    texts: Sequence[str] = DEFAULT_TEXTS
    timeout_s: float = 60.0  # wait for outstanding results after the last publish (at most, with `capacity`)
    #: Items/s the pipeline was measured to sustain (0: unknown). With it the wait after the last
    #: publish follows the backlog (`deadlines`): answers after the due time are counted late, and
    #: items are given up on only once answers stop coming.
    capacity: float = 0.0
    router_id: str = field(default_factory=_default_router_id)
    accepts_result_chunks: bool = True
    bundle_config_hash: str = ""
    max_in_flight: int = 10_000  # published-but-unanswered cap, well under the stream's 100k max_msgs
    stream_wait_s: float = 30.0  # how long to wait for the sidecar to create WORK_POOL_<pool>

    def __post_init__(self) -> None:
        if self.operation not in OPERATIONS:
            raise LoadgenError(f"operation must be one of {', '.join(OPERATIONS)}, not {self.operation!r}")
        if self.items < 0:
            raise LoadgenError("items must be >= 0")
        if not 1 <= self.items_per_request <= MAX_ITEMS_PER_REQUEST:
            raise LoadgenError(f"items_per_request must be in 1..{MAX_ITEMS_PER_REQUEST}")
        if not (self.rate >= 0 and math.isfinite(self.rate)):
            raise LoadgenError("rate must be a finite number >= 0")
        if self.arrival not in ARRIVALS:
            raise LoadgenError(f"arrival must be one of {', '.join(ARRIVALS)}, not {self.arrival!r}")
        if not self.timeout_s >= 0:
            raise LoadgenError("timeout must be >= 0")
        if not (self.capacity >= 0 and math.isfinite(self.capacity)):
            raise LoadgenError("capacity must be a finite number >= 0")
        if self.max_in_flight < 1:
            raise LoadgenError("max_in_flight must be >= 1")
        if not self.texts or not all(isinstance(t, str) for t in self.texts):
            raise LoadgenError("texts must be a non-empty sequence of str")
        if not self.model:
            raise LoadgenError("model must not be empty")
        # Lane tokens and the router id become subject tokens; reject what would change the subject shape.
        for what, value in (
            ("pool", self.pool),
            ("machine_profile", self.machine_profile),
            ("bundle", self.bundle),
            ("router_id", self.router_id),
        ):
            try:
                ok = wire.validate_lane_token(value) == value
            except SubjectError:
                ok = False
            if not ok:
                raise LoadgenError(f"{what} {value!r} is not a valid subject token (no '.', '*', '>' or whitespace)")

    @property
    def subject(self) -> str:
        """The 6-token pool work subject every WorkItem is published to."""
        return wire.pool_work_subject(self.pool, self.machine_profile, self.bundle, self.model)

    @property
    def stream_name(self) -> str:
        return wire.pool_stream_name(self.pool)

    @property
    def fan_out(self) -> int:
        """WorkItems per request: score always produces exactly one (§7.1)."""
        return 1 if self.operation == "score" else self.items_per_request


@dataclass
class LoadSummary:
    """The outcome of one run. Every item ends in exactly one of: a result, a publish error, lost
    (accepted by the stream but never answered while the run waited: missing) or unsent (publishing
    stalled). A result that came after the due time is also counted `late`: it is not lost."""

    items: int
    sent: int  # handed to the NATS client
    published: int  # sent and not rejected by JetStream (sent - publish_errors)
    publish_errors: int  # error PubAck, no stream for the subject, client error, or no PubAck and no result
    results: int  # items with a first result (success or error)
    successes: int
    errors_by_code: dict[str, int]
    duplicates: int  # further results for an item that already had one
    lost: int  # missing: never answered while the run waited
    unsent: int
    chunked_results: int  # first results that arrived as ResultChunkV1 transfers
    chunk_errors: int  # ResultChunkV1 validation failures (each fails its item as transport_failure)
    unexpected_replies: int  # undecodable inbox messages, or results for items this run never sent
    elapsed_s: float  # first publish -> last result
    items_per_s: float  # results / elapsed_s
    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    operation: str = "encode"
    subject: str = ""
    router_id: str = ""
    rate: float = 0.0
    arrival: str = "fixed"
    publish_error_samples: list[str] = field(default_factory=list)
    late: int = 0  # results that came after the due time (with a known capacity)
    due_s: float | None = None  # the due time, seconds after the last publish (None: no capacity given)

    @property
    def ok(self) -> bool:
        """Nothing lost and nothing refused: the run's exit status is 0."""
        return self.lost == 0 and self.publish_errors == 0 and self.unsent == 0

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict; latencies are nested under `latency_ms`."""
        data = asdict(self)
        data["latency_ms"] = {key: data.pop(f"{key}_ms") for key in ("p50", "p90", "p99", "max")}
        data["ok"] = self.ok
        return data

    def format(self) -> str:
        """A short human-readable report."""

        def ms(value: float | None) -> str:
            return "-" if value is None else f"{value:.2f}"

        errors = ", ".join(f"{code}={count:,}" for code, count in sorted(self.errors_by_code.items())) or "none"
        schedule = "fixed interval" if self.arrival == "fixed" else "Poisson arrivals"
        rate = "as fast as possible" if self.rate <= 0 else f"{self.rate:,.0f} items/s ({schedule})"
        lines = [
            f"loadgen {self.operation} -> {self.subject}  (router {self.router_id}, rate {rate})",
            f"  items      {self.items:,}   sent {self.sent:,}   published {self.published:,}"
            f"   publish errors {self.publish_errors:,}   unsent {self.unsent:,}",
            f"  results    {self.results:,}   successes {self.successes:,}   chunked {self.chunked_results:,}"
            f"   duplicates {self.duplicates:,}   lost {self.lost:,} (never answered)",
            *(
                [
                    f"  late       {self.late:,} answered more than {self.due_s:.1f} s after the last publish"
                    " (answered, not lost)"
                ]
                if self.due_s is not None
                else []
            ),
            f"  errors     {errors}   chunk errors {self.chunk_errors:,}"
            f"   unexpected replies {self.unexpected_replies:,}",
            f"  throughput {self.items_per_s:,.0f} items/s over {self.elapsed_s:.3f} s",
            f"  latency ms p50 {ms(self.p50_ms)}   p90 {ms(self.p90_ms)}   p99 {ms(self.p99_ms)}"
            f"   max {ms(self.max_ms)}",
        ]
        for sample in self.publish_error_samples:
            lines.append(f"  publish error: {sample}")
        lines.append("  OK" if self.ok else "  FAILED: lost, refused or unsent items")
        return "\n".join(lines)


def build_work_item(
    config: LoadConfig,
    *,
    request_id: str,
    item_index: int,
    total_items: int,
    text_index: int,
    timestamp: float,
) -> dict[str, Any]:
    """One WorkItem as a dict whose insertion order is the v0.7.1 gateway order (§7.2).

    Only the v0.7.1 rows are written; `admission_pool` is omit-if-empty and the loadgen has none,
    and the omit-if-none rows (display_model, generate, routing/cache keys, trace context) are absent.
    """
    texts = config.texts
    text = texts[text_index % len(texts)]
    operation = config.operation
    item: Any = None
    query_item: Any = None
    score_items: Any = None
    labels: Any = None
    if operation == "score":
        query_item = {"text": text}
        score_items = [
            {"text": texts[(text_index + 1 + j) % len(texts)], "id": f"c{j}"} for j in range(SCORE_CANDIDATES)
        ]
    else:
        item = {"text": text}
        if operation == "extract":
            labels = list(EXTRACT_LABELS)
    return {
        "work_item_id": f"{request_id}.{item_index}",
        "request_id": request_id,
        "item_index": item_index,
        "total_items": total_items,
        "operation": operation,
        "model_id": config.model,
        "profile_id": "default",
        "engine": "",
        "pool_name": config.pool,
        "machine_profile": config.machine_profile,
        "item": item,
        "payload_ref": None,
        "output_types": ["dense"] if operation == "encode" else None,
        "instruction": None,
        "is_query": False,
        "options": None,
        "query_item": query_item,
        "query_payload_ref": None,
        "score_items": score_items,
        "labels": labels,
        "output_schema": None,
        "bundle_config_hash": config.bundle_config_hash,
        "router_id": config.router_id,
        "reply_subject": f"_INBOX.{config.router_id}.{request_id}",
        "timestamp": float(timestamp),
        "accepts_result_chunks": config.accepts_result_chunks,
    }


def _parse_work_result(obj: Any) -> tuple[str, bool, str | None] | None:
    """(item key, success, error_code) of a decoded WorkResult, or None when it is not one.

    Accepts the named map and the legacy positional array (§8.2: fields in §8.1 order). The item
    key is the work_item_id, or `<request_id>.<item_index>` when a producer left it empty.
    """
    if isinstance(obj, dict):
        request_id = obj.get("request_id")
        work_item_id = obj.get("work_item_id", "")
        item_index = obj.get("item_index", 0)
        success = obj.get("success", False)
        error_code = obj.get("error_code")
    elif isinstance(obj, list) and len(obj) >= 2:
        padded = [*obj[:7], *([None] * (7 - min(len(obj), 7)))]
        work_item_id, request_id, item_index, success, _result, _error, error_code = padded
        work_item_id = work_item_id or ""
        item_index = 0 if item_index is None else item_index
        success = False if success is None else success
    else:
        return None
    if not isinstance(request_id, str) or not isinstance(work_item_id, str) or not isinstance(success, bool):
        return None
    if isinstance(item_index, bool) or not isinstance(item_index, int):
        return None
    key = work_item_id or f"{request_id}.{item_index}"
    return key, success, error_code if isinstance(error_code, str) else None


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


class Run:
    """State of one load run: what is outstanding, what came back, and the counters."""

    def __init__(self, config: LoadConfig) -> None:
        self.config = config
        self.sent_at: dict[str, float] = {}  # unsettled work_item_id -> perf_counter at publish
        self.settled: set[str] = set()  # every work_item_id that has a first result or a publish error
        self.failed_transfers: set[str] = set()  # items failed by a chunk error: later chunks are stale
        self.ack_waiting: dict[int, str] = {}  # PubAck reply seq -> work_item_id
        self.request_totals: dict[str, int] = {}  # request_id -> total_items (to fail a whole request)
        self.assembler = wire.ResultChunkAssembler()
        self.latencies_ms: list[float] = []
        self.errors_by_code: dict[str, int] = {}
        self.publish_error_samples: list[str] = []
        self.sent = 0
        self.results = 0
        self.successes = 0
        self.duplicates = 0
        self.publish_errors = 0
        self.chunked_results = 0
        self.chunk_errors = 0
        self.unexpected = 0
        self.first_publish: float | None = None
        self.last_result: float | None = None
        self.progress_event = asyncio.Event()  # set on every settlement: capacity may be free
        self.all_done = asyncio.Event()
        self.publishing_done = False
        self.ack_prefix = ""
        self.late = 0
        self.due_at: float | None = None  # perf_counter after which a result is late (None: never)
        self.publish_end: float | None = None

    # -- settlement --

    def _settle(self, key: str) -> float | None:
        """Mark an item settled; its publish time, or None if it was not outstanding."""
        sent = self.sent_at.pop(key, None)
        if sent is None:
            return None
        self.settled.add(key)
        self.progress_event.set()
        if self.publishing_done and not self.sent_at:
            self.all_done.set()
        return sent

    def record_result(self, key: str, success: bool, error_code: str | None, now: float, *, chunked: bool) -> None:
        sent = self._settle(key)
        if sent is None:
            if key in self.settled:
                self.duplicates += 1
            else:
                self.unexpected += 1
            return
        self.results += 1
        self.last_result = now
        if self.due_at is not None and now > self.due_at:
            self.late += 1
        self.latencies_ms.append((now - sent) * 1000.0)
        if chunked:
            self.chunked_results += 1
        if success:
            self.successes += 1
        else:
            code = error_code or "unknown"
            self.errors_by_code[code] = self.errors_by_code.get(code, 0) + 1

    def record_publish_error(self, key: str, reason: str) -> None:
        if self._settle(key) is None:
            return  # a result already arrived: the stream evidently took it
        self.publish_errors += 1
        if len(self.publish_error_samples) < 5:
            self.publish_error_samples.append(f"{key}: {reason}")

    def fail_transfer(self, key: str, now: float) -> None:
        """§9.4: a chunk validation failure is reported to the item as `transport_failure`."""
        self.failed_transfers.add(key)
        if key in self.sent_at:
            self.record_result(key, False, TRANSPORT_FAILURE, now, chunked=True)

    # -- inbox callbacks --

    async def on_reply(self, msg: Msg) -> None:
        """Every message on `_INBOX.<router_id>.>`: a ResultChunkV1 envelope or a WorkResult."""
        now = time.perf_counter()
        data = msg.data
        try:
            obj = _unpack(data)
        except Exception:  # msgpack raises many types; any of them means "not a reply"
            self.unexpected += 1
            return
        if isinstance(obj, dict) and obj.get("kind") == RESULT_CHUNK_KIND:
            self._on_chunk(obj, data, msg.subject, now)
            return
        parsed = _parse_work_result(obj)
        if parsed is None:
            self.unexpected += 1
            return
        key, success, error_code = parsed
        self.record_result(key, success, error_code, now, chunked=False)

    def _on_chunk(self, env: dict[Any, Any], data: bytes, subject: str, now: float) -> None:
        claimed = env.get("work_item_id")
        if isinstance(claimed, str) and claimed in self.failed_transfers:
            return  # the rest of a transfer that already failed: stale
        try:
            done = self.assembler.feed(data)
        except WireError:
            self.chunk_errors += 1
            if isinstance(claimed, str) and (claimed in self.sent_at or claimed in self.settled):
                self.fail_transfer(claimed, now)
            else:
                # Unattributable chunk: fail every outstanding item of the request named by the inbox subject.
                request_id = subject.rsplit(".", 1)[-1]
                for index in range(self.request_totals.get(request_id, 0)):
                    self.fail_transfer(f"{request_id}.{index}", now)
            return
        if done is None:
            return
        key, encoded = done
        try:
            parsed = _parse_work_result(_unpack(encoded))
        except Exception:
            parsed = None
        if parsed is None or parsed[0] != key:
            # Decode failure or a WorkResult whose identity differs from the chunks' (§9.4).
            self.chunk_errors += 1
            self.fail_transfer(key, now)
            return
        _, success, error_code = parsed
        self.record_result(key, success, error_code, now, chunked=True)

    async def on_ack(self, msg: Msg) -> None:
        """A JetStream PubAck (or error, or no-responders status) for one pipelined publish."""
        try:
            seq = int(msg.subject[len(self.ack_prefix) + 1 :])
        except ValueError:
            return
        key = self.ack_waiting.pop(seq, None)
        if key is None:
            return
        reason = pub_ack_error(msg)
        if reason is not None:
            self.record_publish_error(key, reason)


def request_plan(config: LoadConfig) -> list[int]:
    """Items per request, in order; the last fan-out request may be short."""
    per = config.fan_out
    full, rest = divmod(config.items, per)
    return [per] * full + ([rest] if rest else [])


_BAR_FORMAT = "{percentage:3.0f}%|{bar}| {n:,}/{total:,} items [{elapsed}<{remaining}, {rate_fmt}{postfix}]"


def progress_bar(
    total: int, *, stream: TextIO | None = None, force: bool = False, min_interval_s: float = 0.1
) -> tqdm[NoReturn]:
    """tqdm's self-overwriting line on stderr: done/total, the recent rate and the recent p50.

    Only on a terminal unless `force` (tqdm's `disable=None`), so piped or captured output stays
    clean; redraws are throttled to one per `min_interval_s`, so callers may feed it freely.
    """
    return tqdm(
        total=total,
        file=sys.stderr if stream is None else stream,
        disable=False if force else None,
        mininterval=min_interval_s,
        miniters=0,  # redraw on the clock even when nothing finished: the p50 and elapsed move on
        unit=" items",
        unit_scale=True,  # "12.3k items/s"
        bar_format=_BAR_FORMAT,
        dynamic_ncols=True,
    )


def show_progress(bar: tqdm[NoReturn], done: int, p50_ms: float | None) -> None:
    """Move the bar to `done` (tqdm counts increments) with the latest p50 as its postfix."""
    if p50_ms is not None:
        bar.set_postfix_str(f"p50 {p50_ms:.1f} ms", refresh=False)
    bar.update(done - bar.n)


async def tick(run: Run, bar: tqdm[NoReturn]) -> None:
    """Feed the progress bar about ten times a second, off the hot path."""
    while True:
        show_progress(bar, run.results + run.publish_errors, recent_p50(run.latencies_ms))
        await asyncio.sleep(_PROGRESS_TICK_S)


def recent_p50(latencies: list[float]) -> float | None:
    if not latencies:
        return None
    return float(np.median(np.asarray(latencies[-_P50_WINDOW:])))


def summarize(run: Run, *, lost: int, unsent: int) -> LoadSummary:
    config = run.config
    if run.latencies_ms:
        values = np.asarray(run.latencies_ms, dtype=np.float64)
        p50, p90, p99 = (float(v) for v in np.percentile(values, [50, 90, 99]))
        stats: tuple[float | None, ...] = (p50, p90, p99, float(values.max()))
    else:
        stats = (None, None, None, None)
    first = run.first_publish
    end = run.last_result if run.last_result is not None else first
    elapsed = (end - first) if first is not None and end is not None else 0.0
    return LoadSummary(
        items=config.items,
        sent=run.sent,
        published=run.sent - run.publish_errors,
        publish_errors=run.publish_errors,
        results=run.results,
        successes=run.successes,
        errors_by_code=dict(sorted(run.errors_by_code.items())),
        duplicates=run.duplicates,
        lost=lost,
        unsent=unsent,
        chunked_results=run.chunked_results,
        chunk_errors=run.chunk_errors,
        unexpected_replies=run.unexpected,
        elapsed_s=elapsed,
        items_per_s=run.results / elapsed if elapsed > 0 else 0.0,
        p50_ms=stats[0],
        p90_ms=stats[1],
        p99_ms=stats[2],
        max_ms=stats[3],
        operation=config.operation,
        subject=config.subject,
        router_id=config.router_id,
        rate=config.rate,
        arrival=config.arrival,
        publish_error_samples=run.publish_error_samples,
        late=run.late,
        due_s=None if run.due_at is None or run.publish_end is None else run.due_at - run.publish_end,
    )


def pub_ack_error(msg: Msg) -> str | None:
    """None for a `{"stream":..., "seq":...}` PubAck, else why the stream did not take the message."""
    data = msg.data
    if b'"seq"' in data and b'"error"' not in data and not msg.headers:
        return None  # the common case, without paying for json.loads on every message
    headers = msg.headers or {}
    status = headers.get("Status")
    if status == "503":
        return "no responders: no stream captures the subject"
    if not msg.data:
        return f"empty PubAck (status {status})" if status else "empty PubAck"
    try:
        ack = json.loads(msg.data)
    except ValueError:
        return "PubAck is not JSON"
    if not isinstance(ack, dict):
        return "PubAck is not a JSON object"
    error = ack.get("error")
    if error is not None:
        if isinstance(error, dict):
            return f"{error.get('description', 'error')} (code {error.get('err_code', error.get('code'))})"
        return str(error)
    if "seq" not in ack:
        return "PubAck without seq"
    return None


__all__ = [
    "ARRIVALS",
    "DEFAULT_TEXTS",
    "EXTRACT_LABELS",
    "LATE_FACTOR",
    "LATE_SLACK_S",
    "MAX_ITEMS_PER_REQUEST",
    "OPERATIONS",
    "SCORE_CANDIDATES",
    "STALL_ITEMS",
    "STALL_MIN_S",
    "TRANSPORT_FAILURE",
    "Deadlines",
    "LoadConfig",
    "LoadSummary",
    "LoadgenError",
    "Run",
    "arrival_offsets",
    "build_work_item",
    "deadlines",
    "progress_bar",
    "pub_ack_error",
    "recent_p50",
    "request_plan",
    "show_progress",
    "summarize",
    "tick",
    "varied_texts",
]

# SPDX-License-Identifier: Apache-2.0
"""`sie-sidecar loadgen`: stand in for the SIE gateway and drive a sidecar with WorkItems.

The load generator publishes WorkItems exactly as the v0.7.1 gateway writes them (wire-protocol
§7.2: same keys, same order, same types), collects the WorkResults and ResultChunkV1 transfers
that come back on its inbox (§8-§9), and reports counts and latencies. It needs nothing but a NATS
server and a running sidecar, so a sidecar can be exercised and measured without a gateway.

Throughput matters more than per-message confirmation here, so JetStream PubAcks are pipelined:
each WorkItem is published with core `PUB` and a per-message reply subject, and the PubAcks are
counted asynchronously instead of awaiting every `js.publish`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
import uuid

import msgpack
import nats
from nats.aio.client import Client
from nats.aio.subscription import Subscription

from .. import wire
from .load_run import (
    ARRIVALS,
    DEFAULT_TEXTS,
    OPERATIONS,
    Deadlines,
    LoadConfig,
    LoadgenError,
    LoadSummary,
    Run,
    arrival_offsets,
    build_work_item,
    deadlines,
    progress_bar,
    recent_p50,
    request_plan,
    show_progress,
    summarize,
    tick,
    varied_texts,
)
from .loadgen_local import generate_local_load

_STREAM_POLL_S = 0.25
_YIELD_EVERY = 64  # publishes between cooperative yields, so reply callbacks keep up


# --- WorkItem construction -----------------------------------------------------------------------


# --- the run -------------------------------------------------------------------------------------


async def _wait_for_stream(nc: Client, config: LoadConfig) -> None:
    """Poll until the sidecar has created the pool stream, and check that it captures our subject."""
    js = nc.jetstream()
    deadline = time.monotonic() + config.stream_wait_s
    last_error: Exception | None = None
    while True:
        try:
            info = await js.stream_info(config.stream_name)
        except Exception as exc:  # NotFoundError, or JetStream not (yet) available
            last_error = exc
        else:
            subjects = list(info.config.subjects or [])
            if not any(wire.filters_overlap(s, config.subject) for s in subjects):
                raise LoadgenError(
                    f"stream {config.stream_name} exists but its subjects {subjects} do not capture {config.subject}"
                )
            return
        if time.monotonic() >= deadline:
            break
        await asyncio.sleep(_STREAM_POLL_S)
    detail = f" (last error: {last_error.__class__.__name__}: {last_error})" if last_error else ""
    raise LoadgenError(
        f"pool stream {config.stream_name} was not found on {config.nats_url} within {config.stream_wait_s:g} s"
        f"{detail}; start a sidecar for pool {config.pool!r} first (it creates the stream), "
        "or check --pool and --nats-url"
    )


async def generate_load(config: LoadConfig, *, progress: bool = True) -> LoadSummary:
    """Publish `config.items` WorkItems to the pool subject and collect their results.

    With `rate > 0` request j is published at `start + arrival_offsets(...)[j]`: a fixed interval
    (`items_before_j / rate`) by default, or seeded Poisson arrivals with `arrival="poisson"`; a late
    schedule is caught up in a burst (open loop). Publishing also pauses while `max_in_flight` items
    are outstanding; if nothing settles for `timeout_s` while paused, publishing stops and the
    remaining items are unsent.
    """

    async def _on_client_error(exc: Exception) -> None:  # keep nats-py from logging tracebacks mid-bar
        client_errors.append(f"{exc.__class__.__name__}: {exc}")

    client_errors: list[str] = []
    try:
        nc = await nats.connect(
            config.nats_url,
            connect_timeout=5,
            max_reconnect_attempts=4,  # fail fast at startup (~2 s); ride out a brief blip mid-run
            reconnect_time_wait=0.5,
            pending_size=8 * 1024 * 1024,
            error_cb=_on_client_error,
        )
    except Exception as exc:
        raise LoadgenError(f"cannot connect to NATS at {config.nats_url}: {exc.__class__.__name__}: {exc}") from exc
    try:
        await _wait_for_stream(nc, config)
        return await _drive(nc, config, progress=progress)
    finally:
        await nc.close()


async def _drive(nc: Client, config: LoadConfig, *, progress: bool) -> LoadSummary:
    run = Run(config)
    run.ack_prefix = nc.new_inbox()
    subs: list[Subscription] = [
        await nc.subscribe(f"_INBOX.{config.router_id}.>", cb=run.on_reply),
        await nc.subscribe(f"{run.ack_prefix}.*", cb=run.on_ack),
    ]
    await nc.flush()  # the interest must be registered before the first reply can come back

    bar = progress_bar(config.items) if progress else None
    ticker = asyncio.create_task(tick(run, bar)) if bar is not None and not bar.disable else None
    unsent = 0
    try:
        unsent = await _publish_all(nc, run)
        run.publishing_done = True
        if not run.sent_at:
            run.all_done.set()
        await _wait_for_answers(run, deadlines(len(run.sent_at), config.capacity, config.timeout_s))
    finally:
        if ticker is not None:
            ticker.cancel()
        for sub in subs:
            with contextlib.suppress(Exception):  # the connection may be gone; the counts are what matter
                await sub.unsubscribe()
    if bar is not None:
        show_progress(bar, run.results + run.publish_errors, recent_p50(run.latencies_ms))
        bar.close()  # draws the final count whatever the throttle said, and ends the line

    # Whatever is still outstanding: never confirmed by the stream -> publish error, else lost.
    unconfirmed = set(run.ack_waiting.values())
    lost = 0
    for key in list(run.sent_at):
        if key in unconfirmed:
            run.record_publish_error(key, "no PubAck before the timeout")
        else:
            lost += 1
    return summarize(run, lost=lost, unsent=unsent)


async def _wait_for_answers(run: Run, limits: Deadlines) -> None:
    """Until every item is answered or the wait is over: `give_up_s` after the last publish, or,
    with a stall rule, once the due time has passed and nothing was answered for `stall_s`."""
    end = run.publish_end = time.perf_counter()
    run.due_at = None if limits.due_s is None else end + limits.due_s
    give_up_at = end + limits.give_up_s
    while not run.all_done.is_set():
        limit = give_up_at
        if run.due_at is not None and limits.stall_s is not None:
            last = max(end, run.last_result or end)
            limit = min(limit, max(run.due_at, last + limits.stall_s))
        remaining = limit - time.perf_counter()
        if remaining <= 0:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(remaining):  # later answers only move the stall limit out
                await run.all_done.wait()


async def _publish_all(nc: Client, run: Run) -> int:
    """Publish every request; returns how many items were never sent (publishing stalled)."""
    config = run.config
    subject = config.subject
    ack_prefix = run.ack_prefix
    packer = msgpack.Packer(use_bin_type=True)
    run_prefix = uuid.uuid4().hex[:12]
    plan = request_plan(config)
    cap = config.max_in_flight
    offsets = arrival_offsets(plan, config.rate, config.arrival, config.seed)
    # The schedule is anchored at the first publish (offset 0), so request j leaves no earlier than
    # first_publish + offsets[j] and `elapsed_s` covers the whole schedule however late the first was.
    start = 0.0
    items_before = 0
    seq = 0
    since_yield = 0
    for request_number, total in enumerate(plan):
        # Backpressure: never let more than max_in_flight items sit unanswered in the stream.
        while run.sent_at and len(run.sent_at) + total > cap:
            run.progress_event.clear()
            try:
                await asyncio.wait_for(run.progress_event.wait(), timeout=config.timeout_s)
            except TimeoutError:
                return config.items - items_before
        if offsets and run.first_publish is not None:
            delay = start + offsets[request_number] - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
                since_yield = 0
        request_id = f"{run_prefix}-{request_number:08d}"
        run.request_totals[request_id] = total
        timestamp = time.time()
        for index in range(total):
            item = build_work_item(
                config,
                request_id=request_id,
                item_index=index,
                total_items=total,
                text_index=items_before + index,
                timestamp=timestamp,
            )
            data = packer.pack(item)
            key = item["work_item_id"]
            seq += 1
            run.ack_waiting[seq] = key
            now = time.perf_counter()
            run.sent_at[key] = now
            if run.first_publish is None:
                run.first_publish = start = now
            run.sent += 1
            try:
                await nc.publish(subject, data, reply=f"{ack_prefix}.{seq}")
            except Exception as exc:  # MaxPayloadError, connection closed, outbound buffer full
                run.ack_waiting.pop(seq, None)
                run.record_publish_error(key, f"{exc.__class__.__name__}: {exc}")
        items_before += total
        since_yield += total
        if since_yield >= _YIELD_EVERY:
            since_yield = 0
            await asyncio.sleep(0)
    await nc.flush()
    return 0


# --- command line --------------------------------------------------------------------------------


def add_loadgen_arguments(parser: argparse.ArgumentParser) -> None:
    """The `sie-sidecar loadgen` flags."""
    defaults = LoadConfig(nats_url="nats://127.0.0.1:4222", router_id="loadgen")
    parser.add_argument(
        "--nats-url",
        default=os.environ.get("SIE_NATS_URL", "nats://127.0.0.1:4222"),
        help="NATS server URL (default: $SIE_NATS_URL or nats://127.0.0.1:4222)",
    )
    # The lane comes from the variables the sidecar reads, so `loadgen` next to `run` in one shell
    # feeds the lane that sidecar consumes (a mismatch leaves every item waiting in the stream).
    pool = os.environ.get("SIE_POOL") or defaults.pool
    profile = os.environ.get("SIE_MACHINE_PROFILE") or defaults.machine_profile
    bundle = os.environ.get("SIE_BUNDLE") or defaults.bundle
    parser.add_argument("--pool", default=pool, help=f"pool name (default $SIE_POOL or {defaults.pool})")
    parser.add_argument(
        "--machine-profile",
        default=profile,
        help=f"machine profile (default $SIE_MACHINE_PROFILE or {defaults.machine_profile})",
    )
    parser.add_argument("--bundle", default=bundle, help=f"bundle (default $SIE_BUNDLE or {defaults.bundle})")
    parser.add_argument("--model", default=defaults.model, help=f"model id (default {defaults.model})")
    parser.add_argument(
        "--operation", choices=OPERATIONS, default=defaults.operation, help="operation (default encode)"
    )
    parser.add_argument(
        "--items", type=int, default=defaults.items, help=f"WorkItems to send (default {defaults.items})"
    )
    parser.add_argument(
        "--items-per-request",
        type=int,
        default=defaults.items_per_request,
        help="encode/extract fan-out: WorkItems per request sharing one request_id (default 1)",
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=defaults.rate,
        help="items/s on an open-loop schedule (see --arrival); 0 = as fast as possible (default 0)",
    )
    parser.add_argument(
        "--arrival",
        choices=ARRIVALS,
        default=defaults.arrival,
        help="with --rate: a fixed interval, or Poisson arrivals (exponential gaps, seeded) (default fixed)",
    )
    parser.add_argument("--seed", type=int, default=defaults.seed, help="seed for --arrival poisson and --text-words")
    parser.add_argument(
        "--text-words",
        type=_word_range,
        default=None,
        metavar="MIN,MAX",
        help="send generated texts of MIN..MAX words (uniform, seeded) instead of the fixed sample sentences",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=defaults.timeout_s,
        help=f"seconds to wait for outstanding results after the last publish (default {defaults.timeout_s:g})",
    )
    parser.add_argument(
        "--capacity",
        type=float,
        default=defaults.capacity,
        help="items/s the pipeline sustains, if known: the wait after the last publish then follows the backlog,"
        " answers after the due time are counted late (not lost), and --timeout only caps it (default 0: unknown)",
    )
    parser.add_argument(
        "--local",
        metavar="SOCKET",
        default=None,
        help="send over a local-ingest socket (SIE_SIDECAR_INGEST=local) instead of NATS",
    )
    parser.add_argument("--json", metavar="PATH", default=None, help="also write the summary as JSON to PATH")
    parser.add_argument("--no-progress", action="store_true", help="do not draw the progress bar")
    parser.add_argument(
        "--bundle-config-hash",
        default=defaults.bundle_config_hash,
        help='bundle_config_hash to put in every WorkItem (default "": legacy, unattested)',
    )


def _word_range(text: str) -> tuple[int, int]:
    """`MIN,MAX` -> (min_words, max_words) with 1 <= MIN <= MAX."""
    try:
        low, high = (int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MIN,MAX word counts (e.g. 5,120), got {text!r}") from None
    if not 1 <= low <= high:
        raise argparse.ArgumentTypeError(f"need 1 <= MIN <= MAX, got {text!r}")
    return low, high


def config_from_args(args: argparse.Namespace) -> LoadConfig:
    """Build the LoadConfig the parsed `loadgen` flags describe."""
    words: tuple[int, int] | None = getattr(args, "text_words", None)
    texts = DEFAULT_TEXTS if words is None else varied_texts(min_words=words[0], max_words=words[1], seed=args.seed)
    return LoadConfig(
        nats_url=args.nats_url,
        pool=args.pool,
        machine_profile=args.machine_profile,
        bundle=args.bundle,
        model=args.model,
        operation=args.operation,
        items=args.items,
        items_per_request=args.items_per_request,
        rate=args.rate,
        arrival=args.arrival,
        seed=args.seed,
        texts=texts,
        timeout_s=args.timeout,
        capacity=args.capacity,
        bundle_config_hash=args.bundle_config_hash,
    )


async def run_loadgen(args: argparse.Namespace) -> int:
    """Run the load, print the summary, write `--json`; 0 when nothing was lost or refused, else 1."""
    try:
        config = config_from_args(args)
        socket = getattr(args, "local", None)
        if socket:
            summary = await generate_local_load(config, socket, progress=not args.no_progress)
        else:
            summary = await generate_load(config, progress=not args.no_progress)
    except LoadgenError as exc:
        print(f"sie-sidecar loadgen: error: {exc}", file=sys.stderr)
        return 1
    print(summary.format())
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(summary.to_json(), fh, indent=2)
            fh.write("\n")
    return 0 if summary.ok else 1


__all__ = [
    "ARRIVALS",
    "DEFAULT_TEXTS",
    "Deadlines",
    "LoadConfig",
    "LoadSummary",
    "LoadgenError",
    "add_loadgen_arguments",
    "arrival_offsets",
    "build_work_item",
    "config_from_args",
    "deadlines",
    "generate_load",
    "progress_bar",
    "run_loadgen",
    "show_progress",
    "varied_texts",
]

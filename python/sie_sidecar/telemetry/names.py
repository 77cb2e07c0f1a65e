# SPDX-License-Identifier: Apache-2.0
"""The §13 instrument catalog in one table: every name the sidecar may emit, its kind and its unit.

Recording sites use the constants; the OTLP encoder takes units from `INSTRUMENTS`; the dashboard
test and `sie-sidecar top` read names from here, so a renamed instrument breaks them loudly.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Literal

Kind = Literal["counter", "gauge", "histogram"]

QUEUE_DURATION: Final = "sie.worker.queue.duration"
QUEUE_DEPTH: Final = "sie.worker.queue.depth"
WORK_ITEM_AGE: Final = "sie.worker.work_item.age"
WORK_ITEM_DEADLINE_EXCEEDED: Final = "sie.worker.work_item.deadline_exceeded"
DISPATCH_WAIT: Final = "sie.worker.scheduler.request_batch.dispatch_wait"
REQUEST_BATCH_TOTAL: Final = "sie.worker.scheduler.request_batch.total"
BATCH_SIZE: Final = "sie.worker.batch.size"
BATCH_COST: Final = "sie.worker.batch.cost"
BATCH_FILL_RATIO: Final = "sie.worker.batch.fill_ratio"
IPC_REQUESTS: Final = "sie.worker.ipc.requests"
IPC_REQUEST_DURATION: Final = "sie.worker.ipc.request.duration"
IPC_RESPONSE_CHUNKS: Final = "sie.worker.ipc.response.chunks"
IPC_RECONSTRUCTED_SIZE: Final = "sie.worker.ipc.response.reconstructed.size"
IPC_CHUNK_COUNT: Final = "sie.worker.ipc.response.chunk.count"
IPC_CHUNK_RESERVED: Final = "sie.worker.ipc.response.chunk.reserved"
CONFIG_APPLIES: Final = "sie.worker.config.applies"
CONFIG_EPOCH: Final = "sie.worker.config.epoch"
CONFIG_DEGRADED: Final = "sie.worker.config.degraded"
NATS_OPERATIONS: Final = "sie.worker.nats.operations"
NATS_DELIVERY_ATTEMPTS: Final = "sie.worker.nats.delivery.attempts"
RESULT_TRANSPORT_ATTEMPTS: Final = "sie.worker.result.transport.attempts"
RESULT_CHUNKS_PUBLISHED: Final = "sie.worker.result.chunks.published"
RESULT_CHUNK_SIZE: Final = "sie.worker.result.chunk.size"
PAYLOAD_FETCHES: Final = "sie.worker.payload.fetches"
PAYLOAD_FETCH_DURATION: Final = "sie.worker.payload.fetch.duration"
PAYLOAD_SIZE: Final = "sie.worker.payload.size"
GPU_SLOTS: Final = "sie.worker.gpu.slots"
PENDING_ITEMS: Final = "sie.worker.pending.items"
PENDING_COST: Final = "sie.worker.pending.cost"
INFLIGHT_BATCHES: Final = "sie.worker.inflight.batches"
SATURATED: Final = "sie.worker.saturated"
IPC_CAPACITY: Final = "sie.worker.ipc.capacity"
IPC_INFLIGHT: Final = "sie.worker.ipc.inflight"
IPC_ACQUIRE_DURATION: Final = "sie.worker.ipc.acquire.duration"
ADAPTIVE_WAIT: Final = "sie.worker.scheduler.adaptive.wait"
ADAPTIVE_COST: Final = "sie.worker.scheduler.adaptive.cost"
ADAPTIVE_P50: Final = "sie.worker.scheduler.adaptive.p50"
STARVATION_RESETS: Final = "sie.worker.scheduler.starvation.resets"
GENERATION_LOADING_RESPONSES: Final = "sie.worker.generation.model_loading.responses"
SHUTDOWN_DRAIN_DURATION: Final = "sie.worker.shutdown.drain.duration"

#: name → (kind, unit, attribute keys in recording order; `lane` comes first on export), as §13 lists them.
INSTRUMENTS: Final[Mapping[str, tuple[Kind, str, tuple[str, ...]]]] = {
    QUEUE_DURATION: ("histogram", "s", ("operation", "model", "profile")),
    QUEUE_DEPTH: ("gauge", "{item}", ("operation", "model", "profile")),
    WORK_ITEM_AGE: ("histogram", "s", ("operation",)),
    WORK_ITEM_DEADLINE_EXCEEDED: ("counter", "{item}", ("operation", "action")),
    DISPATCH_WAIT: ("histogram", "s", ("operation", "model", "profile")),
    REQUEST_BATCH_TOTAL: ("histogram", "s", ("operation", "model", "profile")),
    BATCH_SIZE: ("histogram", "{item}", ("operation", "model", "profile")),
    BATCH_COST: ("histogram", "{cost}", ("operation", "model", "profile")),
    BATCH_FILL_RATIO: ("gauge", "1", ("operation", "model", "profile", "flush.reason")),
    IPC_REQUESTS: ("counter", "{request}", ("method", "outcome")),
    IPC_REQUEST_DURATION: ("histogram", "s", ("method", "outcome")),
    IPC_RESPONSE_CHUNKS: ("counter", "{transfer}", ("outcome",)),
    IPC_RECONSTRUCTED_SIZE: ("histogram", "By", ()),
    IPC_CHUNK_COUNT: ("histogram", "{chunk}", ()),
    IPC_CHUNK_RESERVED: ("gauge", "By", ()),
    CONFIG_APPLIES: ("counter", "{apply}", ("source", "operation", "outcome")),
    CONFIG_EPOCH: ("gauge", "{epoch}", ("source",)),
    CONFIG_DEGRADED: ("gauge", "1", ("source",)),
    NATS_OPERATIONS: ("counter", "{operation}", ("operation", "outcome", "reason")),
    NATS_DELIVERY_ATTEMPTS: ("histogram", "{attempt}", ("redelivered",)),
    RESULT_TRANSPORT_ATTEMPTS: ("counter", "{attempt}", ("mode", "outcome")),
    RESULT_CHUNKS_PUBLISHED: ("counter", "{chunk}", ()),
    RESULT_CHUNK_SIZE: ("histogram", "By", ()),
    PAYLOAD_FETCHES: ("counter", "{fetch}", ("outcome", "reason")),
    PAYLOAD_FETCH_DURATION: ("histogram", "s", ("outcome", "reason")),
    PAYLOAD_SIZE: ("histogram", "By", ("outcome", "reason")),
    GPU_SLOTS: ("gauge", "{slot}", ("state",)),
    PENDING_ITEMS: ("gauge", "{item}", ()),
    PENDING_COST: ("gauge", "{cost}", ()),
    INFLIGHT_BATCHES: ("gauge", "{batch}", ()),
    SATURATED: ("gauge", "1", ()),
    IPC_CAPACITY: ("gauge", "{request}", ("transport",)),
    IPC_INFLIGHT: ("gauge", "{request}", ("transport",)),
    IPC_ACQUIRE_DURATION: ("histogram", "s", ("transport", "outcome")),
    ADAPTIVE_WAIT: ("gauge", "s", ("model", "profile")),
    ADAPTIVE_COST: ("gauge", "{cost}", ("model", "profile")),
    ADAPTIVE_P50: ("gauge", "s", ("model", "profile", "kind")),
    STARVATION_RESETS: ("counter", "{reset}", ("model", "profile")),
    GENERATION_LOADING_RESPONSES: ("counter", "{response}", ("model", "profile", "state", "outcome")),
    SHUTDOWN_DRAIN_DURATION: ("histogram", "s", ("outcome",)),
}

__all__ = [
    "ADAPTIVE_COST",
    "ADAPTIVE_P50",
    "ADAPTIVE_WAIT",
    "BATCH_COST",
    "BATCH_FILL_RATIO",
    "BATCH_SIZE",
    "CONFIG_APPLIES",
    "CONFIG_DEGRADED",
    "CONFIG_EPOCH",
    "DISPATCH_WAIT",
    "GENERATION_LOADING_RESPONSES",
    "GPU_SLOTS",
    "INFLIGHT_BATCHES",
    "INSTRUMENTS",
    "IPC_ACQUIRE_DURATION",
    "IPC_CAPACITY",
    "IPC_CHUNK_COUNT",
    "IPC_CHUNK_RESERVED",
    "IPC_INFLIGHT",
    "IPC_RECONSTRUCTED_SIZE",
    "IPC_REQUESTS",
    "IPC_REQUEST_DURATION",
    "IPC_RESPONSE_CHUNKS",
    "NATS_DELIVERY_ATTEMPTS",
    "NATS_OPERATIONS",
    "PAYLOAD_FETCHES",
    "PAYLOAD_FETCH_DURATION",
    "PAYLOAD_SIZE",
    "PENDING_COST",
    "PENDING_ITEMS",
    "QUEUE_DEPTH",
    "QUEUE_DURATION",
    "REQUEST_BATCH_TOTAL",
    "RESULT_CHUNKS_PUBLISHED",
    "RESULT_CHUNK_SIZE",
    "RESULT_TRANSPORT_ATTEMPTS",
    "SATURATED",
    "SHUTDOWN_DRAIN_DURATION",
    "STARVATION_RESETS",
    "WORK_ITEM_AGE",
    "WORK_ITEM_DEADLINE_EXCEEDED",
    "Kind",
]

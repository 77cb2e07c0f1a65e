# SPDX-License-Identifier: Apache-2.0
"""NATS subject names: token normalisation, construction and parsing (wire-protocol §7.1, sidecar-behaviour §1.3, §3).

Pure-Python twin of the Cython `sie_sidecar._native.wire` subject helpers; both must give the same
answers for every input (test vectors TV-S1..TV-S7).
"""

from __future__ import annotations

from dataclasses import dataclass

from sie_sidecar.errors import SubjectError

# Character-wise mapping, so `/` and `.` never interact with the `_` they produce (TV-S2 `worker.*.foo`).
# Control characters are deliberately kept: the v0.7.1 sidecar does not map them (TV-S3).
_NORMALIZE_TABLE = str.maketrans({"/": "__", ".": "_dot_", "*": "_", ">": "_", " ": "_"})

_WORK_PREFIX = ("sie", "work")
_INBOX_PREFIX = "_INBOX."
_WORK_CANCEL_PREFIX = "work_cancel."
_GENERATE_CANCEL_PREFIX = "cancel."
_BATCH_CANCEL_PREFIX = "batch_cancel."
_POOL_SUBJECT_TOKENS = 6
_DIRECT_SUBJECT_TOKENS = 7


@dataclass(frozen=True, slots=True)
class WorkSubject:
    """The lane of a work subject; model denormalised, the other tokens as they appear on the wire."""

    pool: str
    machine_profile: str
    bundle: str
    model: str
    worker: str | None = None


def normalize_token(value: str) -> str:
    """Make a value safe as one subject token: `/`→`__`, `.`→`_dot_`, `*` `>` space → `_`."""
    return value.translate(_NORMALIZE_TABLE)


def denormalize_token(token: str) -> str:
    """Best-effort reverse of normalize_token (not injective: `org/a__b` and `org/a/b` collide)."""
    return token.replace("__", "/").replace("_dot_", ".")


def validate_lane_token(value: str) -> str:
    """Trim a pool/bundle/machine-profile value and reject what would break subjects or filters."""
    token = value.strip()
    if not token:
        raise SubjectError("lane token must not be empty")
    for ch in token:
        if ch in ".*>" or ch.isspace():
            raise SubjectError(f"lane token {token!r} must not contain '.', '*', '>' or whitespace")
    return token


def model_from_subject(subject: str) -> str | None:
    """Model of a work subject (token index 5, denormalised); None when there are fewer than six tokens."""
    tokens = subject.split(".")
    if len(tokens) < _POOL_SUBJECT_TOKENS:
        return None
    return denormalize_token(tokens[5])


def is_worker_direct_subject(subject: str) -> bool:
    """True for exactly seven tokens starting `sie.work`: work addressed to one worker."""
    tokens = subject.split(".")
    return len(tokens) == _DIRECT_SUBJECT_TOKENS and tokens[0] == "sie" and tokens[1] == "work"


def parse_work_subject(subject: str) -> WorkSubject | None:
    """Split a 6-token pool or 7-token worker-direct `sie.work.` subject; None for any other shape."""
    tokens = subject.split(".")
    count = len(tokens)
    if count not in (_POOL_SUBJECT_TOKENS, _DIRECT_SUBJECT_TOKENS) or (tokens[0], tokens[1]) != _WORK_PREFIX:
        return None
    worker = tokens[6] if count == _DIRECT_SUBJECT_TOKENS else None
    return WorkSubject(tokens[2], tokens[3], tokens[4], denormalize_token(tokens[5]), worker)


def is_safe_reply_subject(subject: str) -> bool:
    """Replies go only to gateway inboxes (`_INBOX.`, dot included); empty means fire-and-forget.

    A space, tab, CR, LF or other control character would split the `PUB` line the reply is framed
    into (a second command injected on the sidecar's connection), so such a subject is unsafe too.
    """
    if not subject:
        return True
    return subject.startswith(_INBOX_PREFIX) and not any(c <= " " or c == "\x7f" for c in subject)


def _parse_router_request(subject: str, prefix: str) -> tuple[str, str] | None:
    if not subject.startswith(prefix):
        return None
    router_id, sep, request_id = subject[len(prefix) :].partition(".")
    if not sep or not router_id or not request_id:
        return None
    return router_id, request_id


def parse_work_cancel(subject: str) -> tuple[str, str] | None:
    """`work_cancel.<router>.<request>` → (router, request); the request id may contain dots."""
    return _parse_router_request(subject, _WORK_CANCEL_PREFIX)


def parse_generate_cancel(subject: str) -> tuple[str, str] | None:
    """`cancel.<router>.<request>` → (router, request); the request id may contain dots."""
    return _parse_router_request(subject, _GENERATE_CANCEL_PREFIX)


def parse_batch_cancel(subject: str, own_worker_id: str) -> str | None:
    """Request id of `batch_cancel.<router>.<worker>.<request>` when addressed to this worker, else None."""
    if not subject.startswith(_BATCH_CANCEL_PREFIX):
        return None
    _router_id, sep, rest = subject[len(_BATCH_CANCEL_PREFIX) :].partition(".")
    if not sep:
        return None
    worker, sep, request_id = rest.partition(".")
    if not sep or not request_id or worker != normalize_token(own_worker_id):
        return None
    return request_id


def filters_overlap(a: str, b: str) -> bool:
    """Whether two NATS subject filters can match a common subject (`*` one token, `>` one or more)."""
    if not a or not b:
        return False
    ta = a.split(".")
    tb = b.split(".")
    la = len(ta)
    lb = len(tb)
    for i in range(min(la, lb)):
        x = ta[i]
        y = tb[i]
        if x == ">":
            return lb > i
        if y == ">":
            return la > i
        if x != y and "*" not in (x, y):
            return False
    # A length mismatch without `>` cannot match; `sie.work.>` vs `sie.work` ends here too (`>` needs a token).
    return la == lb


def pool_work_subject(pool: str, machine_profile: str, bundle: str, model: str) -> str:
    """`sie.work.<pool>.<mp>.<bundle>.<model>`; the pool is inserted unnormalised (TV-S4)."""
    return f"sie.work.{pool}.{normalize_token(machine_profile)}.{normalize_token(bundle)}.{normalize_token(model)}"


def worker_direct_subject(pool: str, machine_profile: str, bundle: str, model: str, worker_id: str) -> str:
    """The pool work subject plus the normalised worker id as a seventh token."""
    return f"{pool_work_subject(pool, machine_profile, bundle, model)}.{normalize_token(worker_id)}"


def pool_stream_name(pool: str) -> str:
    """`WORK_POOL_<pool>` (pool not normalised)."""
    return f"WORK_POOL_{pool}"


def pool_stream_subjects(pool: str) -> list[str]:
    """The single canonical subject of the pool stream."""
    return [f"sie.work.{pool}.*.*.*"]


def pool_durable_name(pool: str, machine_profile: str, bundle: str) -> str:
    """Durable consumer name; the only place the pool token is normalised."""
    return f"{normalize_token(pool)}_{normalize_token(machine_profile)}_{normalize_token(bundle)}"


def pool_durable_filter(pool: str, machine_profile: str, bundle: str) -> str:
    """Filter of the pool durable: every model of this lane."""
    return f"sie.work.{pool}.{normalize_token(machine_profile)}.{normalize_token(bundle)}.*"


def worker_stream_name(worker_id: str) -> str:
    """`WORK_WORKER_<normalised worker id>`."""
    return f"WORK_WORKER_{normalize_token(worker_id)}"


def worker_consumer_name(worker_id: str) -> str:
    """`gen-<normalised worker id>`."""
    return f"gen-{normalize_token(worker_id)}"


def worker_direct_filter(pool: str, machine_profile: str, bundle: str, worker_id: str) -> str:
    """Filter of the worker-direct durable: every model of this lane addressed to this worker."""
    return (
        f"sie.work.{pool}.{normalize_token(machine_profile)}.{normalize_token(bundle)}.*.{normalize_token(worker_id)}"
    )


def health_subject(worker_id: str) -> str:
    """`sie.health.<worker id>`; the id is inserted as is (TV-S4)."""
    return f"sie.health.{worker_id}"


__all__ = [
    "WorkSubject",
    "denormalize_token",
    "filters_overlap",
    "health_subject",
    "is_safe_reply_subject",
    "is_worker_direct_subject",
    "model_from_subject",
    "normalize_token",
    "parse_batch_cancel",
    "parse_generate_cancel",
    "parse_work_cancel",
    "parse_work_subject",
    "pool_durable_filter",
    "pool_durable_name",
    "pool_stream_name",
    "pool_stream_subjects",
    "pool_work_subject",
    "validate_lane_token",
    "worker_consumer_name",
    "worker_direct_filter",
    "worker_direct_subject",
    "worker_stream_name",
]

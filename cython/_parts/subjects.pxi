# SPDX-License-Identifier: Apache-2.0
# NATS subject names: token normalisation, construction and parsing (wire-protocol §7.1,
# sidecar-behaviour §1.3, §3). Same names and answers as sie_sidecar._wire_py.subjects
# (test vectors TV-S1..TV-S7); typed str locals let Cython call the unicode C API directly.

from sie_sidecar.errors import SubjectError


cdef class WorkSubject:
    """The lane of a work subject; model denormalised, the other tokens as they appear on the wire.

    Immutable; equal to (and hashing like) the twin's frozen dataclass with the same attributes.
    """

    cdef readonly str pool
    cdef readonly str machine_profile
    cdef readonly str bundle
    cdef readonly str model
    cdef readonly object worker

    __match_args__ = ("pool", "machine_profile", "bundle", "model", "worker")

    def __init__(self, str pool not None, str machine_profile not None, str bundle not None,
                 str model not None, worker=None):
        if worker is not None and not isinstance(worker, str):
            raise TypeError(f"worker must be str or None, not {type(worker).__name__}")
        self.pool = pool
        self.machine_profile = machine_profile
        self.bundle = bundle
        self.model = model
        self.worker = worker

    cdef tuple _fields(self):
        return (self.pool, self.machine_profile, self.bundle, self.model, self.worker)

    def __eq__(self, other):
        # Accept the twin's dataclass too, so parity tests can compare results across implementations.
        if isinstance(other, WorkSubject):
            return self._fields() == (<WorkSubject>other)._fields()
        if type(other).__name__ == "WorkSubject":
            try:
                theirs = (other.pool, other.machine_profile, other.bundle, other.model, other.worker)
            except AttributeError:
                return NotImplemented
            return self._fields() == theirs
        return NotImplemented

    def __ne__(self, other):
        result = self.__eq__(other)
        if result is NotImplemented:
            return result
        return not result

    def __hash__(self):
        # Same as a frozen dataclass: the hash of the field tuple.
        return hash(self._fields())

    def __repr__(self):
        return (f"WorkSubject(pool={self.pool!r}, machine_profile={self.machine_profile!r}, "
                f"bundle={self.bundle!r}, model={self.model!r}, worker={self.worker!r})")

    def __reduce__(self):
        return (WorkSubject, self._fields())


cpdef str normalize_token(str value):
    """Make a value safe as one subject token: `/`→`__`, `.`→`_dot_`, `*` `>` space → `_`.

    Chained replaces equal a character-wise mapping because no replacement introduces a later
    target character; control characters are kept (TV-S3).
    """
    return (value.replace("/", "__").replace(".", "_dot_").replace("*", "_")
            .replace(">", "_").replace(" ", "_"))


cpdef str denormalize_token(str token):
    """Best-effort reverse of normalize_token (not injective: `org/a__b` and `org/a/b` collide)."""
    return token.replace("__", "/").replace("_dot_", ".")


def validate_lane_token(str value not None):
    """Trim a pool/bundle/machine-profile value and reject what would break subjects or filters."""
    cdef str token = value.strip()
    cdef Py_UCS4 ch
    if not token:
        raise SubjectError("lane token must not be empty")
    for ch in token:
        if ch == u"." or ch == u"*" or ch == u">" or ch.isspace():
            raise SubjectError(f"lane token {token!r} must not contain '.', '*', '>' or whitespace")
    return token


def model_from_subject(str subject not None):
    """Model of a work subject (token index 5, denormalised); None when there are fewer than six tokens."""
    cdef list tokens = subject.split(".")
    if len(tokens) < 6:
        return None
    return denormalize_token(<str>tokens[5])


def is_worker_direct_subject(str subject not None):
    """True for exactly seven tokens starting `sie.work`: work addressed to one worker."""
    cdef list tokens = subject.split(".")
    return len(tokens) == 7 and <str>tokens[0] == "sie" and <str>tokens[1] == "work"


def parse_work_subject(str subject not None):
    """Split a 6-token pool or 7-token worker-direct `sie.work.` subject; None for any other shape."""
    cdef list tokens = subject.split(".")
    cdef Py_ssize_t count = len(tokens)
    if count != 6 and count != 7:
        return None
    if <str>tokens[0] != "sie" or <str>tokens[1] != "work":
        return None
    return WorkSubject(tokens[2], tokens[3], tokens[4], denormalize_token(<str>tokens[5]),
                       tokens[6] if count == 7 else None)


def is_safe_reply_subject(str subject not None):
    """Replies go only to gateway inboxes (`_INBOX.`, dot included); empty means fire-and-forget.

    A space, tab, CR, LF or other control character would split the `PUB` line the reply is framed
    into (a second command injected on the sidecar's connection), so such a subject is unsafe too.
    """
    cdef Py_UCS4 c
    if len(subject) == 0:
        return True
    if not subject.startswith("_INBOX."):
        return False
    for c in subject:
        if c <= 0x20 or c == 0x7f:
            return False
    return True


cdef object _parse_router_request(str subject, str prefix):
    cdef Py_ssize_t start = len(prefix)
    cdef Py_ssize_t dot
    if not subject.startswith(prefix):
        return None
    dot = subject.find(".", start)
    # Router id must be non-empty (dot > start) and so must the request id (dot + 1 < len).
    if dot <= start or dot + 1 >= len(subject):
        return None
    return (subject[start:dot], subject[dot + 1:])


def parse_work_cancel(str subject not None):
    """`work_cancel.<router>.<request>` → (router, request); the request id may contain dots."""
    return _parse_router_request(subject, "work_cancel.")


def parse_generate_cancel(str subject not None):
    """`cancel.<router>.<request>` → (router, request); the request id may contain dots."""
    return _parse_router_request(subject, "cancel.")


def parse_batch_cancel(str subject not None, str own_worker_id not None):
    """Request id of `batch_cancel.<router>.<worker>.<request>` when addressed to this worker, else None."""
    cdef Py_ssize_t start = 13  # len("batch_cancel.")
    cdef Py_ssize_t n = len(subject)
    cdef Py_ssize_t dot1, dot2
    if not subject.startswith("batch_cancel."):
        return None
    dot1 = subject.find(".", start)
    if dot1 < 0:
        return None
    dot2 = subject.find(".", dot1 + 1)
    if dot2 < 0 or dot2 + 1 >= n:
        return None
    if subject[dot1 + 1:dot2] != normalize_token(own_worker_id):
        return None
    return subject[dot2 + 1:]


def filters_overlap(str a not None, str b not None):
    """Whether two NATS subject filters can match a common subject (`*` one token, `>` one or more)."""
    cdef list ta, tb
    cdef Py_ssize_t la, lb, i, m
    cdef str x, y
    if not a or not b:
        return False
    ta = a.split(".")
    tb = b.split(".")
    la = len(ta)
    lb = len(tb)
    m = la if la < lb else lb
    for i in range(m):
        x = <str>ta[i]
        y = <str>tb[i]
        if x == ">":
            return lb > i
        if y == ">":
            return la > i
        if x != y and "*" not in (x, y):
            return False
    # A length mismatch without `>` cannot match; `sie.work.>` vs `sie.work` ends here too (`>` needs a token).
    return la == lb


def pool_work_subject(str pool not None, str machine_profile not None, str bundle not None, str model not None):
    """`sie.work.<pool>.<mp>.<bundle>.<model>`; the pool is inserted unnormalised (TV-S4)."""
    return f"sie.work.{pool}.{normalize_token(machine_profile)}.{normalize_token(bundle)}.{normalize_token(model)}"


def worker_direct_subject(str pool not None, str machine_profile not None, str bundle not None,
                          str model not None, str worker_id not None):
    """The pool work subject plus the normalised worker id as a seventh token."""
    return (f"sie.work.{pool}.{normalize_token(machine_profile)}.{normalize_token(bundle)}."
            f"{normalize_token(model)}.{normalize_token(worker_id)}")


def pool_stream_name(str pool not None):
    """`WORK_POOL_<pool>` (pool not normalised)."""
    return f"WORK_POOL_{pool}"


def pool_stream_subjects(str pool not None):
    """The single canonical subject of the pool stream."""
    return [f"sie.work.{pool}.*.*.*"]


def pool_durable_name(str pool not None, str machine_profile not None, str bundle not None):
    """Durable consumer name; the only place the pool token is normalised."""
    return f"{normalize_token(pool)}_{normalize_token(machine_profile)}_{normalize_token(bundle)}"


def pool_durable_filter(str pool not None, str machine_profile not None, str bundle not None):
    """Filter of the pool durable: every model of this lane."""
    return f"sie.work.{pool}.{normalize_token(machine_profile)}.{normalize_token(bundle)}.*"


def worker_stream_name(str worker_id not None):
    """`WORK_WORKER_<normalised worker id>`."""
    return f"WORK_WORKER_{normalize_token(worker_id)}"


def worker_consumer_name(str worker_id not None):
    """`gen-<normalised worker id>`."""
    return f"gen-{normalize_token(worker_id)}"


def worker_direct_filter(str pool not None, str machine_profile not None, str bundle not None,
                         str worker_id not None):
    """Filter of the worker-direct durable: every model of this lane addressed to this worker."""
    return f"sie.work.{pool}.{normalize_token(machine_profile)}.{normalize_token(bundle)}.*.{normalize_token(worker_id)}"


def health_subject(str worker_id not None):
    """`sie.health.<worker id>`; the id is inserted as is (TV-S4)."""
    return f"sie.health.{worker_id}"

# SPDX-License-Identifier: Apache-2.0
# Cancellation tombstones (sidecar-behaviour §7, test-vectors §9); same behaviour as
# sie_sidecar._wire_py.tombstones. Entries live in an OrderedDict in stamp order: the lookup on
# the hot path is a plain PyDict_GetItemWithError (an OrderedDict is a dict underneath), while
# inserts, refreshes and evictions go through the OrderedDict methods so its order stays right.

from cpython.object cimport PyObject
from cpython.dict cimport PyDict_GetItemWithError
from libc.math cimport isnan
from libc.stdint cimport int64_t
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec

import time as _tomb_time
from collections import OrderedDict as _TombOrderedDict

from sie_sidecar.wire.limits import (
    BATCH_TOMBSTONE_TTL_S as _BATCH_TOMBSTONE_TTL_S,
    TOMBSTONE_CAPACITY as _TOMBSTONE_CAPACITY,
    TOMBSTONE_TTL_S as _TOMBSTONE_TTL_S,
)


cdef double _tomb_check_ttl(object ttl_s) except? -1.0:
    cdef double ttl = float(ttl_s)
    if isnan(ttl) or ttl < 0.0:
        raise ValueError(f"tombstone ttl must be a non-negative number, got {ttl_s!r}")
    return ttl


cdef inline double _tomb_now(object clock, bint fast) except? -1.0:
    """The clock's reading; time.monotonic itself is read straight from CLOCK_MONOTONIC (saves a call).

    The conversion repeats CPython's (integer nanoseconds / 1e9), so the value equals time.monotonic().
    """
    cdef timespec ts
    cdef int64_t ns
    if fast and clock_gettime(CLOCK_MONOTONIC, &ts) == 0:
        ns = <int64_t>ts.tv_sec * 1000000000 + ts.tv_nsec
        if ns % 1000000000 == 0:
            return <double>(ns // 1000000000)
        return <double>ns / 1e9
    return float(clock())


cdef inline double _tomb_prune_front(object entries, double now) except? -1.0:
    """Drop expired entries from the old end; stops at the first live one (entries are in stamp order)."""
    cdef PyObject* found
    while entries:
        # iter() of an OrderedDict follows its linked list, so this is the oldest key in O(1).
        oldest = next(iter(entries))
        found = PyDict_GetItemWithError(entries, oldest)
        if found is NULL or now < <double><object>found:
            break
        del entries[oldest]
    return now


cdef class TombstoneSet:
    """Request tombstones keyed by (router_id, request_id), bounded by capacity and TTL.

    An entry is live while `clock() < recorded_at + ttl_s`; a TTL of 0 records nothing useful.
    `len()` counts stored entries, including expired ones not yet dropped (expiry is lazy).
    """

    cdef object _entries
    cdef Py_ssize_t _capacity
    cdef double _ttl
    cdef object _clock
    cdef bint _fast_clock

    def __init__(self, capacity=_TOMBSTONE_CAPACITY, ttl_s=_TOMBSTONE_TTL_S, clock=_tomb_time.monotonic):
        if capacity < 0:
            raise ValueError(f"tombstone capacity must be >= 0, got {capacity!r}")
        self._capacity = int(capacity)
        self._ttl = _tomb_check_ttl(ttl_s)
        self._clock = clock
        self._fast_clock = clock is _tomb_time.monotonic
        self._entries = _TombOrderedDict()

    def record(self, router_id, request_id):
        """Tombstone a request (or re-stamp it, moving it to the young end); evicts the oldest at capacity."""
        cdef object entries = self._entries
        cdef double now
        cdef tuple key
        if self._capacity == 0:
            return
        now = _tomb_now(self._clock, self._fast_clock)
        _tomb_prune_front(entries, now)
        key = (router_id, request_id)
        if PyDict_GetItemWithError(entries, key) is not NULL:
            entries.move_to_end(key)
        entries[key] = now + self._ttl
        while len(entries) > self._capacity:
            entries.popitem(last=False)

    def is_cancelled(self, router_id, request_id):
        """Whether a live tombstone exists for this request of this router; drops it if expired."""
        cdef tuple key = (router_id, request_id)
        cdef PyObject* found = PyDict_GetItemWithError(self._entries, key)
        if found is NULL:
            return False
        if _tomb_now(self._clock, self._fast_clock) < <double><object>found:
            return True
        del self._entries[key]
        return False

    def __len__(self):
        return len(self._entries)


cdef class BatchTombstones:
    """Worker-direct batch_cancel tombstones keyed by request id; no cap, expired entries pruned on every call."""

    cdef object _entries
    cdef double _ttl
    cdef object _clock
    cdef bint _fast_clock

    def __init__(self, ttl_s=_BATCH_TOMBSTONE_TTL_S, clock=_tomb_time.monotonic):
        self._ttl = _tomb_check_ttl(ttl_s)
        self._clock = clock
        self._fast_clock = clock is _tomb_time.monotonic
        self._entries = _TombOrderedDict()

    def record(self, request_id):
        """Tombstone a batch request (or re-stamp it, moving it to the young end)."""
        cdef object entries = self._entries
        cdef double now = _tomb_prune_front(entries, _tomb_now(self._clock, self._fast_clock))
        if PyDict_GetItemWithError(entries, request_id) is not NULL:
            entries.move_to_end(request_id)
        entries[request_id] = now + self._ttl

    def is_cancelled(self, request_id):
        """Whether a live tombstone exists for this request id."""
        cdef object entries = self._entries
        cdef double now = _tomb_prune_front(entries, _tomb_now(self._clock, self._fast_clock))
        cdef PyObject* found = PyDict_GetItemWithError(entries, request_id)
        if found is NULL:
            return False
        if now < <double><object>found:
            return True
        # Only reachable when the clock went backwards between stamps; keep the answer exact anyway.
        del entries[request_id]
        return False

    def __len__(self):
        """Live entries (pruning first, like every other operation)."""
        _tomb_prune_front(self._entries, _tomb_now(self._clock, self._fast_clock))
        return len(self._entries)

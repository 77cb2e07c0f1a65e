# SPDX-License-Identifier: Apache-2.0
# The fast path of inbound NATS deliveries: complete `MSG <subject> <sid> <reply> <size>\r\n<payload>\r\n`
# frames at the head of the client's read buffer, for subscriptions registered as direct, are turned
# into messages and handed over a run at a time in one C loop (sie_sidecar/bus/inbound.py). Anything
# else (HMSG, a MSG without a reply subject, PING, INFO, -ERR, another subscription, a frame not yet
# complete) stops the scan; nats-py's own parser takes it from there. Twin:
# sie_sidecar.bus.inbound.scan_direct_msgs_py.

from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_GetItemWithError
from cpython.object cimport PyObject
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdlib cimport free, realloc
from libc.stdint cimport uint64_t
from libc.string cimport memchr, memcmp, memcpy

# The longest control line nats-py accepts (its MAX_CONTROL_LINE_SIZE).
cdef Py_ssize_t _MAX_CONTROL_LINE = 4096


cdef inline bint _is_space(char c) nogil:
    return c == c' ' or c == c'\t'


cdef inline Py_ssize_t _skip_space(const char* s, Py_ssize_t i, Py_ssize_t end) nogil:
    while i < end and _is_space(s[i]):
        i += 1
    return i


cdef inline Py_ssize_t _token_end(const char* s, Py_ssize_t i, Py_ssize_t end) nogil:
    while i < end and not _is_space(s[i]):
        i += 1
    return i


cdef inline Py_ssize_t _token_end_no_tabs(const char* s, Py_ssize_t i, Py_ssize_t end) nogil:
    """`_token_end` in a line known to hold no tab: the next space, found by memchr (a subject and
    a reply subject are ~130 bytes a message, walked a byte at a time before)."""
    cdef const char* at
    if i >= end:
        return end
    at = <const char*>memchr(s + i, c' ', end - i)
    return end if at is NULL else at - s


cdef inline long long _parse_uint(const char* s, Py_ssize_t a, Py_ssize_t b) nogil:
    """A decimal of 1..18 digits, or -1."""
    cdef long long v = 0
    if b <= a or b - a > 18:
        return -1
    while a < b:
        if s[a] < c'0' or s[a] > c'9':
            return -1
        v = v * 10 + (s[a] - c'0')
        a += 1
    return v


cdef object _new_msg(object msg_cls, object client, object subject, object reply, object payload, long long sid):
    """A `msg_cls` (nats-py's `Msg` dataclass) without running its generated `__init__`: the instance
    dict is filled directly (the other fields keep their class defaults). About a third of the call."""
    cdef object msg = msg_cls.__new__(msg_cls)
    cdef dict d = msg.__dict__
    d["_client"] = client
    d["subject"] = subject
    d["reply"] = reply
    d["data"] = payload
    d["headers"] = None
    d["_sid"] = sid
    return msg


cdef inline void _put_u32(unsigned char* at, Py_ssize_t v) nogil:
    at[0] = v & 0xff
    at[1] = (v >> 8) & 0xff
    at[2] = (v >> 16) & 0xff
    at[3] = (v >> 24) & 0xff


cdef inline bint _ascii(const char* s, Py_ssize_t n) nogil:
    """No byte with its high bit set, eight bytes a step."""
    cdef Py_ssize_t i = 0
    cdef uint64_t word
    while i + 8 <= n:
        memcpy(&word, s + i, 8)
        if word & 0x8080808080808080ULL:
            return False
        i += 8
    while i < n:
        if <unsigned char>s[i] >= 0x80:
            return False
        i += 1
    return True


def scan_direct_msgs(object buf not None, dict direct not None, object client, object msg_cls, object make_run=None,
                     Py_ssize_t start=0):
    """Deliver the complete direct MSG frames of `buf` from `start` on, a run at a time.

    `buf` is nats-py's read buffer (a bytearray), or a read itself (`bytes`, immutable): then a
    run is not copied: `make_run` gets `buf` whole, and the spans are offsets in it.

    With `make_run` (`_native.deliveries_of_run`), a run is not made into `Msg` objects: its bytes
    (from a bytearray) are copied once, and `make_run(run, spans, subjects, sid, client, msg_cls)` makes what is
    delivered (one native delivery per frame, the payload read in place); `spans` holds four
    little-endian u32 per frame (reply offset and length, payload offset and length, in `run`).

    Consecutive frames of one subscription are handed to its callback as one list (one call per
    run, not per message). Only JetStream deliveries take this path: a MSG without a reply subject
    stops the scan like any frame this does not own.

    Returns (where the scan stopped, messages, payload bytes, stopped_mid_frame, error): the caller
    deletes (or keeps) what lies before that; `stopped_mid_frame` is True when the head is a direct
    frame still arriving (wait for more bytes rather than hand it to the slow parser); `error` is an
    exception a delivery callback raised (the scan stops after that run, which counts as consumed).
    """
    cdef bint fixed = type(buf) is bytes
    if not fixed and type(buf) is not bytearray:
        raise TypeError(f"scan_direct_msgs needs a bytearray or bytes, not {type(buf).__name__}")
    cdef Py_ssize_t n = PyBytes_GET_SIZE(buf) if fixed else PyByteArray_GET_SIZE(buf)
    if start < 0 or start > n:
        raise ValueError(f"start {start} is outside the buffer of {n} bytes")
    cdef Py_ssize_t pos = start, line_end, i, t0, t1, t2, t3, t4, t5, body, frame_end, limit
    cdef const char* at
    cdef Py_ssize_t count = 0, nbytes = 0
    cdef long long sid, size, run_sid = -1
    cdef const char* s
    cdef PyObject* found
    cdef object deliver, subject, reply, payload
    # The subject of the frame before (a run repeats one subject): reused, not decoded again.
    cdef object last_subject = None
    cdef Py_ssize_t last_t0 = 0, last_len = -1
    cdef object run_deliver = None
    cdef list run = None
    cdef bint partial = False
    cdef object error = None
    # The run being gathered for `make_run`: where it starts and ends in `buf`, its frames' spans.
    cdef Py_ssize_t run_start = 0, run_end = 0, run_count = 0, span_cap = 0
    # What the spans are offsets from: the run's start in a copy of it, 0 in `buf` itself.
    cdef Py_ssize_t base = 0
    cdef unsigned char* spans = NULL
    cdef unsigned char* grown
    cdef list subjects = None
    if fixed:
        s = PyBytes_AS_STRING(buf)
    try:
        while pos < n:
            if not fixed:  # a callback may have resized the bytearray
                s = PyByteArray_AS_STRING(buf)
                n = PyByteArray_GET_SIZE(buf)
            if n - pos < 4:
                partial = s[pos] == c'M'
                break
            if not (s[pos] == c'M' and s[pos + 1] == c'S' and s[pos + 2] == c'G' and _is_space(s[pos + 3])):
                break
            limit = min(n, pos + _MAX_CONTROL_LINE)
            # The line ends at its first CR when an LF follows it (memchr: the line is ~150 bytes,
            # and walking it a byte at a time, twice, was ~1,800 instructions a message).
            line_end = -1
            at = <const char*>memchr(s + pos + 4, c'\r', limit - pos - 4)
            if at is not NULL and at + 1 < s + limit and at[1] == c'\n':
                line_end = at - s
            elif at is not NULL and at + 1 < s + limit:
                # A stray CR: the line, if it is complete, holds it and is nats-py's to refuse.
                i = at - s
                while i + 1 < limit:
                    if s[i] == c'\r' and s[i + 1] == c'\n':
                        line_end = i
                        break
                    i += 1
                if line_end >= 0:
                    break
            if line_end < 0:
                partial = limit == n  # the control line itself is still arriving
                break
            # No CR before `line_end` (it is the first); nor LF, FF or VT: nats-py's parser decides.
            if (
                memchr(s + pos + 4, c'\n', line_end - pos - 4) is not NULL
                or memchr(s + pos + 4, c'\f', line_end - pos - 4) is not NULL
                or memchr(s + pos + 4, c'\v', line_end - pos - 4) is not NULL
            ):
                break
            # MSG <subject> <sid> [reply] <size>
            t0 = _skip_space(s, pos + 4, line_end)
            if memchr(s + pos + 4, c'\t', line_end - pos - 4) is NULL:
                t1 = _token_end_no_tabs(s, t0, line_end)
                t2 = _skip_space(s, t1, line_end)
                t3 = _token_end_no_tabs(s, t2, line_end)
                t4 = _skip_space(s, t3, line_end)
                t5 = _token_end_no_tabs(s, t4, line_end)
            else:
                t1 = _token_end(s, t0, line_end)
                t2 = _skip_space(s, t1, line_end)
                t3 = _token_end(s, t2, line_end)
                t4 = _skip_space(s, t3, line_end)
                t5 = _token_end(s, t4, line_end)
            i = _skip_space(s, t5, line_end)
            if t1 == t0 or t3 == t2 or t5 == t4:
                break
            sid = _parse_uint(s, t2, t3)
            if sid < 0:
                break
            if i >= line_end:
                break  # no reply subject: not a JetStream delivery; nats-py's parser takes it
            size = _parse_uint(s, i, _token_end(s, i, line_end))
            if _skip_space(s, _token_end(s, i, line_end), line_end) != line_end:
                break
            if size < 0:
                break
            found = PyDict_GetItemWithError(direct, sid)
            if found is NULL:
                break
            body = line_end + 2
            frame_end = body + <Py_ssize_t>size + 2
            if frame_end > n:
                partial = True
                break
            if s[frame_end - 2] != c'\r' or s[frame_end - 1] != c'\n':
                break  # malformed: nats-py's parser reports it
            deliver = <object>found
            try:
                if t1 - t0 == last_len and memcmp(s + t0, s + last_t0, last_len) == 0:
                    subject = last_subject
                else:
                    subject = PyUnicode_DecodeUTF8(s + t0, t1 - t0, "strict")
                if make_run is None or not _ascii(s + t4, t5 - t4):
                    reply = PyUnicode_DecodeUTF8(s + t4, t5 - t4, "strict")
            except UnicodeDecodeError:
                break  # nats-py's parser decides what a non-UTF-8 subject means
            if run_count and sid != run_sid:
                try:
                    if make_run is not None:
                        run = make_run(
                            buf if fixed else PyBytes_FromStringAndSize(s + run_start, run_end - run_start),
                            PyBytes_FromStringAndSize(<char*>spans, run_count * 16),
                            subjects, run_sid, client, msg_cls,
                        )
                    run_deliver(run)
                except BaseException as exc:
                    error = exc
                    run_count = 0
                    break
                run_count = 0
            if run_count == 0:
                run, run_sid, run_deliver = [], sid, deliver
                run_start = pos
                base = 0 if fixed else run_start
                subjects = []
            if make_run is None:
                payload = PyBytes_FromStringAndSize(s + body, <Py_ssize_t>size)
                run.append(_new_msg(msg_cls, client, subject, reply, payload, sid))
            else:
                if run_count == span_cap:
                    span_cap = 64 if span_cap == 0 else span_cap * 2
                    grown = <unsigned char*>realloc(spans, span_cap * 16)
                    if grown is NULL:
                        raise MemoryError()
                    spans = grown
                _put_u32(spans + run_count * 16, t4 - base)
                _put_u32(spans + run_count * 16 + 4, t5 - t4)
                _put_u32(spans + run_count * 16 + 8, body - base)
                _put_u32(spans + run_count * 16 + 12, <Py_ssize_t>size)
                subjects.append(subject)
            run_count += 1
            run_end = frame_end
            last_subject, last_t0, last_len = subject, t0, t1 - t0
            pos = frame_end
            count += 1
            nbytes += <Py_ssize_t>size
        if run_count:
            try:
                if make_run is not None:
                    if not fixed:
                        s = PyByteArray_AS_STRING(buf)
                    run = make_run(
                        buf if fixed else PyBytes_FromStringAndSize(s + run_start, run_end - run_start),
                        PyBytes_FromStringAndSize(<char*>spans, run_count * 16),
                        subjects, run_sid, client, msg_cls,
                    )
                run_deliver(run)
            except BaseException as exc:
                error = exc
    finally:
        free(spans)
    return pos, count, nbytes, partial, error

# SPDX-License-Identifier: Apache-2.0
"""The inbound MSG fast path: the Cython scanner and its twin agree frame for frame, stop at anything
they do not own, and never consume a frame that has not fully arrived."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from nats.aio.msg import Msg

from sie_sidecar._native import AttemptTally, LazyDelivery, deliveries_of_run, delivery_attempts
from sie_sidecar._native.wire import scan_direct_msgs
from sie_sidecar._twins.inbound import scan_direct_msgs as scan_direct_msgs_py
from sie_sidecar.wire.workitem import WorkItem

MAKE_RUN = functools.partial(deliveries_of_run, item_cls=WorkItem)


def _with_deliveries(scanner: Any) -> Any:
    """The scanner in its production mode: a run becomes native deliveries, not `Msg` objects."""
    return lambda buf, direct, client, msg_cls: scanner(buf, direct, client, msg_cls, MAKE_RUN)


#: Bytes before `start` in a read: the scan must neither read them nor count them.
READ_PREFIX = b"MSG _INBOX.a 7 $JS.ACK.before.start 1\r\nx\r\n"


def _in_a_read(scanner: Any, make_run: Any = None) -> Any:
    """The scanner over a read itself (`bytes`, from `start`), as `bus.inbound` scans one in place;
    where it stopped is given back relative to `start`."""

    def scan(buf: bytearray, direct: Any, client: Any, msg_cls: Any) -> Any:
        consumed, *rest = scanner(READ_PREFIX + bytes(buf), direct, client, msg_cls, make_run, len(READ_PREFIX))
        return (consumed - len(READ_PREFIX), *rest)

    return scan


SCANNERS = {
    "native": scan_direct_msgs,
    "py": scan_direct_msgs_py,
    "native-deliveries": _with_deliveries(scan_direct_msgs),
    "py-deliveries": _with_deliveries(scan_direct_msgs_py),
    "native-read": _in_a_read(scan_direct_msgs),
    "py-read": _in_a_read(scan_direct_msgs_py),
    "native-read-deliveries": _in_a_read(scan_direct_msgs, MAKE_RUN),
    "py-read-deliveries": _in_a_read(scan_direct_msgs_py, MAKE_RUN),
}
DIRECT_SIDS = (3, 7)


def run(
    scanner: Any, data: bytes
) -> tuple[tuple[int, int, int, bool, object], list[tuple[str, str, bytes, int | None]]]:
    got: list[Msg] = []
    direct = {sid: got.extend for sid in DIRECT_SIDS}
    consumed, count, nbytes, partial, error = scanner(bytearray(data), direct, None, Msg)
    return (consumed, count, nbytes, partial, error), [(m.subject, m.reply, m.data, m._sid) for m in got]


@pytest.mark.parametrize("name", sorted(SCANNERS))
def test_direct_frames_are_delivered_until_a_foreign_one(name: str) -> None:
    data = (
        b"MSG _INBOX.a 7 $JS.ACK.s.c.1.2.3.4.5 5\r\nhello\r\n"
        b"MSG _INBOX.a\t7  $JS.ACK.s.c.1.3.4.5.6 2\r\nhi\r\n"
        b"HMSG _INBOX.a 7 22 22\r\nNATS/1.0 408 Timeout\r\n\r\n\r\n"
        b"MSG _INBOX.a 7 1\r\nz\r\n"
    )
    (consumed, count, nbytes, partial, error), msgs = run(SCANNERS[name], data)
    assert msgs == [
        ("_INBOX.a", "$JS.ACK.s.c.1.2.3.4.5", b"hello", 7),
        ("_INBOX.a", "$JS.ACK.s.c.1.3.4.5.6", b"hi", 7),
    ]
    assert (count, nbytes, partial, error) == (2, 7, False, None)
    assert data[consumed:].startswith(b"HMSG")  # left for nats-py's parser


@pytest.mark.parametrize("name", sorted(SCANNERS))
def test_a_msg_without_a_reply_subject_is_left_to_nats_py(name: str) -> None:
    """Only JetStream deliveries (they always carry an ACK subject) take the fast path."""
    data = b"MSG _INBOX.a 7 $JS.ACK.x 1\r\na\r\nMSG _INBOX.a 7 1\r\nb\r\n"
    (consumed, count, _, partial, _), msgs = run(SCANNERS[name], data)
    assert (count, partial, [m[2] for m in msgs]) == (1, False, [b"a"])
    assert data[consumed:] == b"MSG _INBOX.a 7 1\r\nb\r\n"


@pytest.mark.parametrize("name", sorted(SCANNERS))
@pytest.mark.parametrize(
    "line",
    [
        b"MSG _INBOX.a 7 $JS.ACK.x.y 1",
        b"MSG\t_INBOX.a\t7\t$JS.ACK.x.y\t1",  # tabs separate tokens too, as nats-py reads them
        b"MSG  _INBOX.a \t 7\t\t$JS.ACK.x.y  1 ",
        b"MSG _INBOX.a 7 $JS.ACK.x.y\t1",
    ],
)
def test_tokens_are_separated_by_any_run_of_spaces_and_tabs(name: str, line: bytes) -> None:
    data = line + b"\r\na\r\n"
    (consumed, count, _, partial, _), msgs = run(SCANNERS[name], data)
    assert (consumed, count, partial) == (len(data), 1, False)
    assert msgs == [("_INBOX.a", "$JS.ACK.x.y", b"a", 7)]


@pytest.mark.parametrize("name", sorted(SCANNERS))
def test_each_run_of_one_subscription_is_one_call(name: str) -> None:
    """Consecutive frames of a subscription arrive as one list; a change of subscription starts a run."""
    calls: list[tuple[int, list[bytes]]] = []

    def recorder(sid: int) -> Callable[[list[Msg]], None]:
        return lambda msgs: calls.append((sid, [m.data for m in msgs]))

    direct = {sid: recorder(sid) for sid in DIRECT_SIDS}
    frames = [(3, b"a"), (3, b"b"), (3, b"c"), (7, b"d"), (3, b"e"), (3, b"f")]
    data = b"".join(b"MSG _INBOX.x %d $JS.ACK.y %d\r\n%s\r\n" % (sid, len(p), p) for sid, p in frames)
    consumed, count, _, _, error = SCANNERS[name](bytearray(data), direct, None, Msg)
    assert (consumed, count, error) == (len(data), 6, None)
    assert calls == [(3, [b"a", b"b", b"c"]), (7, [b"d"]), (3, [b"e", b"f"])]


def test_messages_are_nats_msgs_with_their_defaults() -> None:
    """Made without the dataclass `__init__`: every field still reads as nats-py's own would."""
    (_, _, _, _, _), _ = run(scan_direct_msgs, b"")
    got: list[Msg] = []
    scan_direct_msgs(bytearray(b"MSG s 3 $JS.ACK.r 2\r\nhi\r\n"), {3: got.extend}, "client", Msg)
    twin: list[Msg] = []
    scan_direct_msgs_py(bytearray(b"MSG s 3 $JS.ACK.r 2\r\nhi\r\n"), {3: twin.extend}, "client", Msg)
    expected = Msg(_client="client", subject="s", reply="$JS.ACK.r", data=b"hi", headers=None, _sid=3)  # type: ignore[arg-type]
    for msg in (got[0], twin[0]):
        assert type(msg) is Msg and msg == expected
        assert (msg.is_acked, msg.headers, msg.sid, msg._metadata) == (False, None, 3, None)


@pytest.mark.parametrize("name", sorted(SCANNERS))
@pytest.mark.parametrize(
    ("data", "partial"),
    [
        (b"MSG _INBOX.a 7 r 5\r\nhel", True),  # payload still arriving
        (b"MSG _INBOX.a 7 5\r\nhel", False),  # no reply subject: nats-py's, even while arriving
        (b"MSG _INBOX.a 7 r 5", True),  # control line still arriving
        (b"MS", True),
        (b"MSG _INBOX.a 9 r 1\r\nx\r\n", False),  # not a registered subscription
        (b"PING\r\n", False),
        (b"MSG _INBOX.a 7 r 1\r\nxy\r\n", False),  # size does not match: nats-py reports it
        (b"MSG _INBOX.a 7 r -1\r\n\r\n", False),
        (b"MSG _INBOX.a x r 1\r\nx\r\n", False),
        (b"MSG \xff 7 r 1\r\nx\r\n", False),  # a subject that is not UTF-8
        (b"MSG _INBOX.a 7 \xff 1\r\nx\r\n", False),  # a reply subject that is not UTF-8
        # Line-breaking whitespace inside the control line: nats-py's parser decides.
        (b"MSG _INBOX.a 7 r\r 1\r\nx\r\n", False),
        (b"MSG _INBOX.a 7 r\n 1\r\nx\r\n", False),
        (b"MSG _INBOX.a 7 r\x0c 1\r\nx\r\n", False),
        (b"MSG _INBOX.a 7 r\x0b 1\r\nx\r\n", False),
        (b"MSG _INBOX.a 7 r\r 1", True),  # a stray CR, and the line still arriving
        (b"MSG _INBOX.a 7 r 1\r", True),  # its CR in, its LF not yet
    ],
)
def test_nothing_is_consumed_that_is_not_a_complete_direct_frame(name: str, data: bytes, partial: bool) -> None:
    (consumed, count, _, was_partial, _), msgs = run(SCANNERS[name], data)
    assert (consumed, count, msgs) == (0, 0, [])
    assert was_partial is partial


@pytest.mark.parametrize("name", sorted(SCANNERS))
def test_a_failing_callback_stops_the_scan_after_its_run(name: str) -> None:
    boom = RuntimeError("boom")
    got: list[Msg] = []

    def deliver(msgs: list[Msg]) -> None:
        raise boom

    first = b"MSG a 7 r 1\r\nx\r\nMSG a 7 r 1\r\ny\r\n"
    data = first + b"MSG a 3 r 1\r\nz\r\nMSG a 7 r 1\r\nw\r\n"
    consumed, count, _, _, error = SCANNERS[name](bytearray(data), {7: deliver, 3: got.extend}, None, Msg)
    assert (consumed, count, error, got) == (len(first), 2, boom, [])


tokens = st.text(alphabet="abcdefgh._>*$", min_size=1, max_size=12)


@st.composite
def frames(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["msg", "msg", "msg", "hmsg", "ping", "junk"]))
    if kind == "ping":
        return b"PING\r\n"
    if kind == "junk":
        return draw(st.binary(max_size=20))
    sid = draw(st.sampled_from([3, 7, 9]))
    payload = draw(st.binary(max_size=40))
    reply = draw(st.one_of(st.none(), tokens))
    subject = draw(tokens)
    sep = draw(st.sampled_from([" ", "\t", "  "]))
    parts = [subject, str(sid)] + ([reply] if reply else [])
    if kind == "hmsg":
        return f"HMSG {sep.join(parts)} 12 {12 + len(payload)}\r\n".encode() + b"NATS/1.0\r\n\r\n" + payload + b"\r\n"
    return f"MSG {sep.join([*parts, str(len(payload))])}\r\n".encode() + payload + b"\r\n"


@given(stream=st.lists(frames(), max_size=12), cut=st.integers(min_value=0, max_value=2000))
def test_native_and_twin_agree_on_any_stream_cut_anywhere(stream: list[bytes], cut: int) -> None:
    data = b"".join(stream)[:cut]
    native = run(scan_direct_msgs, data)
    twin = run(scan_direct_msgs_py, data)
    assert native == twin
    # The delivery mode sees the same frames (the deliveries stand in for the Msg objects).
    assert run(SCANNERS["native-deliveries"], data) == native == run(SCANNERS["py-deliveries"], data)
    (consumed, count, nbytes, _, _), msgs = native
    assert consumed <= len(data) and count == len(msgs) and nbytes == sum(len(m[2]) for m in msgs)


@given(data=st.binary(max_size=300))
def test_arbitrary_bytes_never_crash(data: bytes) -> None:
    (consumed, _, _, _, error), _ = run(scan_direct_msgs, data)
    assert 0 <= consumed <= len(data) and error is None


def test_a_scanned_delivery_builds_the_msg_the_scanner_would_have_made() -> None:
    """No `Msg` per frame: the delivery keeps spans of the run, and builds nats-py's `Msg` (equal to
    the one the plain scanner makes) only when something asks for it; until then it stands in for it."""
    data = b"MSG s 3 $JS.ACK.s.c.1.2.3.4.0 2\r\nhi\r\nMSG s 3 $JS.ACK.s.c.1.3.4.5.0 3\r\nyou\r\n"
    got: list[Any] = []
    scan_direct_msgs(bytearray(data), {3: got.extend}, "client", Msg, MAKE_RUN)
    plain: list[Msg] = []
    scan_direct_msgs(bytearray(data), {3: plain.extend}, "client", Msg)
    assert all(type(d) is LazyDelivery for d in got)
    assert (got[1].data, got[1].reply, got[1].subject, got[1]._sid) == (b"you", "$JS.ACK.s.c.1.3.4.5.0", "s", 3)
    assert [d.msg for d in got] == plain and got[0].msg is got[0].msg  # built once
    meta = got[0].msg.metadata  # nats-py's own parsing of the ACK subject
    assert (meta.num_delivered, meta.sequence.stream, meta.sequence.consumer) == (1, 2, 3)


def test_deliveries_of_run_refuses_spans_outside_the_run() -> None:
    import struct

    with pytest.raises(ValueError, match="outside"):
        deliveries_of_run(b"abc", struct.pack("<4I", 0, 2, 2, 5), ["s"], 1, None, Msg, item_cls=WorkItem)
    with pytest.raises(ValueError, match="four u32"):
        deliveries_of_run(b"abc", b"\x00" * 8, ["s"], 1, None, Msg, item_cls=WorkItem)


def _acks(n: int, *, redelivered: int = 0) -> list[bytes]:
    """`n` direct frames of sid 3, the first `redelivered` of them on their second delivery."""
    return [
        f"MSG s 3 $JS.ACK.s.c.{2 if i < redelivered else 1}.{i + 1}.{i + 1}.1700000000000000000.0 2\r\nhi\r\n".encode()
        for i in range(n)
    ]


@given(stream=st.lists(frames(), max_size=12), cut=st.integers(min_value=0, max_value=2000))
def test_a_tallied_scan_counts_what_it_delivers_as_the_consumer_would(stream: list[bytes], cut: int) -> None:
    """Metrics on, the scan counts each delivered run's ACK subjects into its sid's tally: the same
    counts the consumer's own pass over the delivered runs took (`AttemptTally.add`), and nothing
    for a sid without a tally."""
    data = b"".join(stream)[:cut]
    tally = AttemptTally()
    runs: list[list[Any]] = []
    make_run = functools.partial(deliveries_of_run, item_cls=WorkItem, tallies={3: tally})
    scan_direct_msgs(bytearray(data), {sid: runs.append for sid in DIRECT_SIDS}, None, Msg, make_run)
    assert tally.take() == delivery_attempts([d for r in runs for d in r if d._sid == 3])


def test_a_scanned_run_is_counted_once_whole() -> None:
    """A redelivery is counted at its attempt; a run the maker refuses is counted not at all."""
    tally = AttemptTally()
    got: list[Any] = []
    maker = functools.partial(deliveries_of_run, item_cls=WorkItem, tallies={3: tally, 9: AttemptTally()})
    scan_direct_msgs(bytearray(b"".join(_acks(5, redelivered=2))), {3: got.extend}, None, Msg, maker)
    assert len(got) == 5 and tally.take() == ([(1, 3), (2, 2)], 0)
    import struct

    with pytest.raises(ValueError, match="outside"):
        maker(b"abc", struct.pack("<4I", 0, 3, 2, 5), ["s"], 3, None, Msg)
    assert tally.take() == ([], 0)


@pytest.mark.parametrize("scanner", [scan_direct_msgs, scan_direct_msgs_py], ids=["native", "py"])
def test_a_read_is_handed_over_whole_not_copied_and_a_buffer_run_is_copied(scanner: Any) -> None:
    """In a read (`bytes`) every run is the read itself, its spans offsets in it; in nats-py's
    buffer (a bytearray, which changes) a run is a copy of its frames, its spans offsets in that."""
    frames = [(3, b"a"), (3, b"bc"), (7, b"d")]
    data = b"".join(
        b"MSG _INBOX.x %d $JS.ACK.y.%d %d\r\n%s\r\n" % (sid, i, len(p), p) for i, (sid, p) in enumerate(frames)
    )
    handed: list[tuple[bytes, bytes]] = []

    def make_run(run: bytes, spans: bytes, *args: Any) -> list[LazyDelivery]:
        handed.append((run, spans))
        return MAKE_RUN(run, spans, *args)

    got: list[LazyDelivery] = []
    read = READ_PREFIX + data
    consumed, count, *_ = scanner(read, dict.fromkeys(DIRECT_SIDS, got.extend), None, Msg, make_run, len(READ_PREFIX))
    assert (consumed, count) == (len(read), 3)
    assert [run is read for run, _ in handed] == [True, True]
    assert [bytes(d.msg.data) for d in got] == [b"a", b"bc", b"d"]
    assert [d.msg.reply for d in got] == ["$JS.ACK.y.0", "$JS.ACK.y.1", "$JS.ACK.y.2"]

    handed.clear()
    scanner(bytearray(data), dict.fromkeys(DIRECT_SIDS, got.extend), None, Msg, make_run, 0)
    second = data.rindex(b"MSG")  # where the run of sid 7 begins
    assert [run for run, _ in handed] == [data[:second], data[second:]]


@pytest.mark.parametrize("scanner", [scan_direct_msgs, scan_direct_msgs_py], ids=["native", "py"])
def test_a_start_outside_the_buffer_or_another_type_is_refused(scanner: Any) -> None:
    with pytest.raises(ValueError, match="outside"):
        scanner(b"abc", {}, None, Msg, None, 4)
    with pytest.raises(ValueError, match="outside"):
        scanner(bytearray(b"abc"), {}, None, Msg, None, -1)
    with pytest.raises(TypeError, match="bytearray or bytes"):
        scanner(memoryview(b"abc"), {}, None, Msg, None, 0)

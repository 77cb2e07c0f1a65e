# SPDX-License-Identifier: Apache-2.0
"""The local payload store (sidecar-behaviour §12) on a real filesystem, and per-item resolution.

Traversal, symlink, special-file and oversize refs must be refused with typed errors; the kernel's
`openat2` guarantees are checked directly as well, so a wrong flag or struct layout in the ctypes
binding fails here rather than silently falling back to a plain open.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sie_sidecar.payloads import (
    PAYLOAD_ENVELOPE_LIMIT,
    InvalidPayloadRef,
    PayloadError,
    PayloadIOError,
    PayloadNotFound,
    PayloadOversized,
    PayloadStore,
    PayloadStoreConfigError,
    PayloadUnsupported,
    Resolved,
    ResolveFailure,
    local,
    resolve_items,
)
from sie_sidecar.payloads.local import LocalReader, openat2, read_bounded, relative_ref
from sie_sidecar.wire.workitem import WorkItem

LIMIT = 1024


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """root/ holds the readable files; outside/ is what no ref may reach."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "d").mkdir(parents=True)
    outside.mkdir()
    (root / "a.bin").write_bytes(b"inside")
    (root / "d" / "b.bin").write_bytes(b"nested")
    (outside / "secret").write_bytes(b"SECRET")
    (root / "ln_in").symlink_to("a.bin")
    (root / "ln_out").symlink_to("../outside/secret")
    (root / "ln_abs").symlink_to(outside / "secret")
    (root / "ln_dir").symlink_to(outside)
    (root / "ln_proc").symlink_to("/proc/self/root" + str(outside / "secret"))
    os.mkfifo(root / "fifo")
    return root


@pytest.fixture
def reader(tree: Path) -> LocalReader:
    r = LocalReader(str(tree))
    assert r.pinned
    return r


# -- reference rules (lexical) ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        ("a.bin", "a.bin"),
        ("./a.bin", "a.bin"),
        ("d//b.bin", "d/b.bin"),
        ("d/./b.bin", "d/b.bin"),
        ("d/b.bin/", "d/b.bin"),
        ("/base/dir/a.bin", "a.bin"),
        ("/base//dir/./d/b.bin", "d/b.bin"),
    ],
)
def test_relative_ref_accepts(ref: str, expected: str) -> None:
    assert relative_ref(ref, ["base", "dir"]) == expected


@pytest.mark.parametrize(
    "ref",
    [
        "",
        ".",
        "./",
        "..",
        "../x",
        "d/../../x",
        "d/..",
        "/etc/passwd",
        "/base/dirx/a.bin",  # a sibling that shares the prefix as a string, not as components
        "/base/dir",
        "/base/dir/../dir/a.bin",
        "/base",
        "a\0b",
    ],
)
def test_relative_ref_refuses(ref: str) -> None:
    with pytest.raises(InvalidPayloadRef):
        relative_ref(ref, ["base", "dir"])


@given(st.lists(st.sampled_from(["a", "/", ".", "..", "\0", "b/", "\\", " "]), max_size=12).map("".join))
def test_relative_ref_never_escapes(ref: str) -> None:
    """Whatever comes back is relative, has no `..` component and no NUL."""
    try:
        rel = relative_ref(ref, ["base"])
    except InvalidPayloadRef:
        return
    assert rel and not rel.startswith("/")
    assert ".." not in rel.split("/")
    assert "\0" not in rel


# -- reads --------------------------------------------------------------------------------------


def test_reads_relative_dot_and_absolute_refs(reader: LocalReader, tree: Path) -> None:
    assert reader.read("a.bin", LIMIT) == b"inside"
    assert reader.read("./d/b.bin", LIMIT) == b"nested"
    assert reader.read(str(tree / "d" / "b.bin"), LIMIT) == b"nested"


@pytest.mark.parametrize("ref", ["../outside/secret", "d/../../outside/secret", "d/../a.bin"])
def test_dotdot_is_refused(reader: LocalReader, ref: str) -> None:
    with pytest.raises(InvalidPayloadRef) as info:
        reader.read(ref, LIMIT)
    assert info.value.reason == "invalid_ref" and not info.value.too_large


def test_absolute_ref_outside_the_base_is_refused(reader: LocalReader, tree: Path) -> None:
    with pytest.raises(InvalidPayloadRef):
        reader.read(str(tree.parent / "outside" / "secret"), LIMIT)
    with pytest.raises(InvalidPayloadRef):
        reader.read(str(tree) + "x/a.bin", LIMIT)


@pytest.mark.parametrize("ref", ["ln_in", "ln_out", "ln_abs", "ln_dir/secret", "ln_proc"])
def test_every_symlink_is_refused(reader: LocalReader, ref: str) -> None:
    """Even one pointing at a file inside the base: no symlink is followed, ever."""
    with pytest.raises(InvalidPayloadRef) as info:
        reader.read(ref, LIMIT)
    assert "symbolic links" in str(info.value)


def test_kernel_refuses_escape_and_symlinks_even_without_the_lexical_check(tree: Path) -> None:
    """The ctypes `openat2` binding itself: RESOLVE_BENEATH → EXDEV, RESOLVE_NO_SYMLINKS → ELOOP."""
    dirfd = os.open(tree, os.O_PATH | os.O_DIRECTORY)
    try:
        with pytest.raises(OSError) as info:
            openat2(dirfd, b"../outside/secret")
        assert info.value.errno == errno.EXDEV
        with pytest.raises(OSError) as info:
            openat2(dirfd, str(tree / "a.bin").encode())  # absolute: not beneath
        assert info.value.errno == errno.EXDEV
        for link in (b"ln_in", b"ln_dir/secret"):
            with pytest.raises(OSError) as info:
                openat2(dirfd, link)
            assert info.value.errno == errno.ELOOP
        fd = openat2(dirfd, b"d/b.bin")
        try:
            assert os.read(fd, 100) == b"nested"
        finally:
            os.close(fd)
    finally:
        os.close(dirfd)


def test_fifo_and_directory_are_refused_without_blocking(reader: LocalReader) -> None:
    """A FIFO with no writer would block a plain open forever; O_NONBLOCK + S_ISREG refuse it."""
    for ref in ("fifo", "d"):
        with pytest.raises(InvalidPayloadRef, match="not a regular file"):
            reader.read(ref, LIMIT)


def test_missing_file_is_not_found_and_file_as_directory_is_invalid(reader: LocalReader) -> None:
    with pytest.raises(PayloadNotFound) as info:
        reader.read("nope.bin", LIMIT)
    assert info.value.reason == "not_found"
    with pytest.raises(PayloadNotFound):
        reader.read("nodir/x.bin", LIMIT)
    with pytest.raises(InvalidPayloadRef):
        reader.read("a.bin/x", LIMIT)  # ENOTDIR


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file regardless of its mode")
def test_unreadable_file_is_permission_denied(reader: LocalReader, tree: Path) -> None:
    (tree / "locked").write_bytes(b"x")
    (tree / "locked").chmod(0)
    with pytest.raises(PayloadError) as info:
        reader.read("locked", LIMIT)
    assert info.value.reason == "permission_denied"


def test_size_limit_is_inclusive(reader: LocalReader, tree: Path) -> None:
    (tree / "big.bin").write_bytes(b"x" * 100)
    assert reader.read("big.bin", 100) == b"x" * 100
    with pytest.raises(PayloadOversized) as info:
        reader.read("big.bin", 99)
    assert info.value.too_large and info.value.reason == "too_large"
    assert (info.value.size, info.value.limit) == (100, 99)


def test_read_bounded_stops_at_limit_plus_one_when_the_file_outgrew_its_stat(tmp_path: Path) -> None:
    """A file that grew after fstat: reading goes past the stat size but never past limit + 1."""
    path = tmp_path / "grown"
    path.write_bytes(b"y" * 5000)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert read_bounded(fd, 10, 10_000) == b"y" * 5000
        os.lseek(fd, 0, os.SEEK_SET)
        with pytest.raises(PayloadOversized) as info:
            read_bounded(fd, 10, 4000)
        assert info.value.size == 4001
    finally:
        os.close(fd)


def test_empty_file_reads_as_empty(reader: LocalReader, tree: Path) -> None:
    (tree / "empty").write_bytes(b"")
    assert reader.read("empty", LIMIT) == b""


def test_base_directory_is_pinned_at_start(tmp_path: Path) -> None:
    """Swapping the directory after start-up changes nothing: reads go to the descriptor."""
    base = tmp_path / "base"
    base.mkdir()
    (base / "f").write_bytes(b"original")
    r = LocalReader(str(base))
    base.rename(tmp_path / "moved")
    base.mkdir()
    (base / "f").write_bytes(b"impostor")
    assert r.read("f", LIMIT) == b"original"
    r.close()
    with pytest.raises(InvalidPayloadRef):
        r.read("f", LIMIT)


def test_relative_base_resolves_against_the_working_directory(
    tmp_path: Path, tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tree.parent)
    r = LocalReader("root")
    assert r.read("a.bin", LIMIT) == b"inside"
    assert r.read(str(tree / "a.bin"), LIMIT) == b"inside"  # absolute form of the relative base


@pytest.mark.parametrize("base", [None, "", "/nonexistent/dir", "FILE"])
def test_unusable_base_refuses_every_read(tree: Path, base: str | None) -> None:
    r = LocalReader(str(tree / "a.bin") if base == "FILE" else base)
    assert not r.pinned
    with pytest.raises(InvalidPayloadRef):
        r.read("a.bin", LIMIT)


def test_missing_openat2_fails_closed(reader: LocalReader, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local, "_syscall", None)
    with pytest.raises(PayloadUnsupported) as info:
        reader.read("a.bin", LIMIT)
    assert info.value.reason == "unsupported"


def test_other_open_errors_are_io(reader: LocalReader) -> None:
    with pytest.raises(PayloadIOError) as info:
        reader.read("n" * 300, LIMIT)  # ENAMETOOLONG
    assert info.value.reason == "io"


# -- properties: nothing outside the base is ever read --------------------------------------------


@pytest.fixture(scope="module")
def maze(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Files whose content is their own path below root, plus symlinks and files outside."""
    top = tmp_path_factory.mktemp("maze")
    root = top / "root"
    for rel in ("a", "d/a", "d/e/a", "e/d/a"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(f"in:{rel}".encode())
    (top / "a").write_bytes(b"OUT")
    (top / "d").mkdir()
    (top / "d" / "a").write_bytes(b"OUT")
    (root / "up").symlink_to("..")
    (root / "d" / "abs").symlink_to(top / "a")
    (root / "e" / "self").symlink_to(root / "d")
    return root


SEGMENTS = st.sampled_from(["a", "d", "e", "..", ".", "", "up", "abs", "self", "root", "maze"])


@given(segments=st.lists(SEGMENTS, max_size=6), absolute=st.booleans())
def test_random_refs_read_only_the_file_they_name_below_root(maze: Path, segments: list[str], absolute: bool) -> None:
    reader = LocalReader(str(maze))
    try:
        tail = "/".join(segments)
        ref = f"{maze}/{tail}" if absolute else tail
        try:
            data = reader.read(ref, LIMIT)
        except PayloadError as exc:
            assert exc.reason in ("invalid_ref", "not_found")
            return
        named = [s for s in segments if s not in ("", ".")]
        assert ".." not in named
        assert data == f"in:{'/'.join(named)}".encode()
    finally:
        reader.close()


@given(st.lists(SEGMENTS, min_size=1, max_size=6))
def test_kernel_never_opens_outside_root(maze: Path, segments: list[str]) -> None:
    """Straight to `openat2`, no lexical filter: whatever opens resolves below the root."""
    dirfd = os.open(maze, os.O_PATH | os.O_DIRECTORY)
    try:
        try:
            fd = openat2(dirfd, "/".join(segments).encode())
        except OSError as exc:
            assert exc.errno in (errno.EXDEV, errno.ELOOP, errno.ENOENT, errno.ENOTDIR)
            return
        try:
            where = os.readlink(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)
        real = os.path.realpath(maze)
        assert where == real or where.startswith(f"{real}/")
    finally:
        os.close(dirfd)


# -- the store ------------------------------------------------------------------------------------


@pytest.mark.parametrize("url", [None, ""])
async def test_unset_store_refuses_every_ref(url: str | None) -> None:
    store = PayloadStore.from_url(url)
    assert store.kind == "local"
    with pytest.raises(InvalidPayloadRef):
        await store.fetch("a.bin")


@pytest.mark.parametrize("scheme", ["file://", ""])
async def test_file_url_and_plain_path_are_local(tree: Path, scheme: str) -> None:
    store = PayloadStore.from_url(f"{scheme}{tree}")
    try:
        assert store.kind == "local"
        assert await store.fetch("d/b.bin") == b"nested"
        with pytest.raises(PayloadOversized):
            await store.fetch("a.bin", limit=5)
    finally:
        store.close()


@pytest.mark.parametrize("url", ["abfs://c@a.dfs.core.windows.net", "abfss://x"])
def test_malformed_azure_stores_are_startup_errors(url: str) -> None:
    with pytest.raises(PayloadStoreConfigError, match="container@account"):
        PayloadStore.from_url(url)


def test_envelope_limit_is_the_spec_value() -> None:
    assert PAYLOAD_ENVELOPE_LIMIT == 35_717_120


async def test_non_string_ref_is_invalid(tree: Path) -> None:
    store = PayloadStore.from_url(str(tree))
    with pytest.raises(InvalidPayloadRef):
        await store.fetch(b"a.bin")  # type: ignore[arg-type]
    store.close()


# -- a batch of good and bad refs -----------------------------------------------------------------


def work(index: int, operation: str = "encode", **fields: object) -> WorkItem:
    return WorkItem(
        work_item_id=f"req.{index}",
        request_id="req",
        item_index=index,
        total_items=12,
        operation=operation,
        model_id="m",
        pool_name="p",
        machine_profile="l4",
        reply_subject="_INBOX.gw.req",
        **fields,  # type: ignore[arg-type]
    )


async def test_mixed_batch_resolves_good_items_and_types_every_bad_one(tree: Path) -> None:
    (tree / "enc.bin").write_bytes(msgpack.packb({"text": "hello"}))
    (tree / "ext.bin").write_bytes(msgpack.packb({"images": [{"data": b"\x89PNG", "format": "png"}]}))
    (tree / "score.bin").write_bytes(msgpack.packb({b"query": {"text": "q"}, "items": [{"text": "d1"}]}))
    (tree / "score_bad.bin").write_bytes(msgpack.packb({"query": {"text": "q"}, "items": "nope"}))
    (tree / "garbage.bin").write_bytes(b"\xc1")  # 0xc1 is never valid msgpack
    (tree / "huge.bin").write_bytes(b"\x00" * 2048)
    items = [
        work(0, payload_ref="enc.bin"),
        work(1, payload_ref="../outside/secret"),
        work(2, "extract", payload_ref="ext.bin"),
        work(3, payload_ref="ln_out"),
        work(4, payload_ref="huge.bin"),
        work(5, "score", query_payload_ref="score.bin"),
        work(6, payload_ref="missing.bin"),
        work(7, item={"text": "inline"}),
        work(8, payload_ref="garbage.bin"),
        work(9, "score", query_payload_ref="score_bad.bin"),
        work(10, payload_ref="fifo"),
        work(11, payload_ref=str(tree / "enc.bin")),
    ]
    store = PayloadStore.from_url(str(tree))
    try:
        outcomes = await resolve_items(store, items, limit=1024, concurrency=3)
    finally:
        store.close()

    assert [o.item.item_index for o in outcomes] == list(range(12))  # input order, one each
    good = {o.item.item_index: o for o in outcomes if isinstance(o, Resolved)}
    bad = {o.item.item_index: o for o in outcomes if isinstance(o, ResolveFailure)}
    assert sorted(good) == [0, 2, 5, 7, 11]

    assert good[0].item.item == {"text": "hello"} and good[0].item.payload_ref is None
    assert good[0].fetched and good[0].fetch_ms >= 0.0 and good[0].size > 0
    assert good[2].item.item == {"images": [{"data": b"\x89PNG", "format": "png"}]}
    assert good[5].item.query_item == {"text": "q"} and good[5].item.score_items == [{"text": "d1"}]
    assert good[5].item.query_payload_ref is None
    assert good[7].item is items[7] and not good[7].fetched
    assert good[11].item.item == {"text": "hello"}

    too_large = ("PAYLOAD_TOO_LARGE", "referenced payload exceeds the worker size limit")
    payload_error = ("payload_error", "failed to resolve item")
    expected = {
        1: (*payload_error, "invalid_ref"),
        3: (*payload_error, "invalid_ref"),
        4: (*too_large, "too_large"),
        6: (*payload_error, "not_found"),
        8: (*payload_error, "decode"),
        9: (*payload_error, "decode"),
        10: (*payload_error, "invalid_ref"),
    }
    assert {i: (f.code, f.message, f.reason) for i, f in bad.items()} == expected
    assert all(f.item is items[i] for i, f in bad.items())  # the original, for the error result


async def test_generate_refs_are_left_alone(tree: Path) -> None:
    store = PayloadStore.from_url(str(tree))
    item = work(0, "generate", payload_ref="a.bin")
    [outcome] = await resolve_items(store, [item])
    store.close()
    assert isinstance(outcome, Resolved) and outcome.item is item and not outcome.fetched


async def test_unexpected_reader_bug_costs_one_item(tree: Path) -> None:
    class Exploding:
        async def fetch(self, ref: str, limit: int) -> bytes:
            if ref == "boom":
                raise RuntimeError("bug")
            return msgpack.packb("ok")  # type: ignore[no-any-return]

        def close(self) -> None:
            pass

    store = PayloadStore(Exploding(), "test")
    outcomes = await resolve_items(store, [work(0, payload_ref="boom"), work(1, payload_ref="fine")])
    assert isinstance(outcomes[0], ResolveFailure) and outcomes[0].code == "payload_error"
    assert isinstance(outcomes[1], Resolved) and outcomes[1].item.item == "ok"

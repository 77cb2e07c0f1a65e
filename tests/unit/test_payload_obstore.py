# SPDX-License-Identifier: Apache-2.0
"""The shared obstore read path: the size cap while streaming (a body that outgrows its metadata,
which no honest emulator serves) and the scheme-generic key rules of `object_keys`."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, cast

import pytest

from sie_sidecar.payloads import InvalidPayloadRef, PayloadOversized, PayloadStoreConfigError
from sie_sidecar.payloads.object_keys import ObjectRoot, parse_store_url, validate_key
from sie_sidecar.payloads.obstore_reader import bounded_read, client_options

if TYPE_CHECKING:
    from obstore import GetResult


class _LyingResult:
    """A get result whose metadata size understates what its stream yields."""

    def __init__(self, size: int, chunks: Sequence[bytes]) -> None:
        self.meta = {"size": size}
        self._chunks = chunks
        self.pulled = 0

    async def _iter(self) -> AsyncIterator[bytes]:
        for chunk in self._chunks:
            self.pulled += 1
            yield chunk

    def stream(self, min_chunk_size: int) -> AsyncIterator[bytes]:
        return self._iter()


async def test_stream_past_the_limit_is_too_large_and_stops_reading() -> None:
    fake = _LyingResult(10, [b"a" * 10, b"b" * 10, b"c" * 10])
    with pytest.raises(PayloadOversized) as info:
        await bounded_read(cast("GetResult", fake), limit=15)
    assert info.value.too_large and info.value.size == 20 and fake.pulled == 2


async def test_metadata_past_the_limit_is_refused_before_streaming() -> None:
    fake = _LyingResult(16, [b"x" * 16])
    with pytest.raises(PayloadOversized):
        await bounded_read(cast("GetResult", fake), limit=15)
    assert fake.pulled == 0


async def test_chunks_are_joined_and_a_single_chunk_is_returned_as_is() -> None:
    assert await bounded_read(cast("GetResult", _LyingResult(6, [b"abc", b"def"])), limit=6) == b"abcdef"
    one = b"whole"
    assert await bounded_read(cast("GetResult", _LyingResult(5, [one])), limit=5) is one
    assert await bounded_read(cast("GetResult", _LyingResult(0, [])), limit=5) == b""


def test_allow_http_is_carried_over_only_from_its_own_variable() -> None:
    assert client_options({"GOOGLE_ALLOW_HTTP": "true"}, "GOOGLE_ALLOW_HTTP").get("allow_http") is True
    assert "allow_http" not in client_options({"AWS_ALLOW_HTTP": "true"}, "GOOGLE_ALLOW_HTTP")
    assert "allow_http" not in client_options({"GOOGLE_ALLOW_HTTP": "nope"}, "GOOGLE_ALLOW_HTTP")


ROOT = ObjectRoot("gs://", "bkt", "p/q")


def test_object_root_maps_keys_and_urls_under_its_prefix() -> None:
    assert ROOT.url == "gs://bkt/p/q/"
    assert ROOT.object_path("a/b.bin") == "p/q/a/b.bin"
    assert ROOT.object_path("gs://bkt/p/q/a.bin") == "p/q/a.bin"
    assert ObjectRoot("s3://", "b", "").object_path("s3://b/k") == "k"


@pytest.mark.parametrize("ref", ["gs://bkt/p/qa.bin", "gs://bkt/p/q/", "s3://bkt/p/q/a", "http://x/a", "a/../b", "a/"])
def test_object_root_refuses_refs_outside_it(ref: str) -> None:
    with pytest.raises(InvalidPayloadRef):
        ROOT.object_path(ref)


def test_key_rules() -> None:
    assert validate_key("a/b.c") == "a/b.c"
    for bad in ("", "/a", "a\\b", "a\0b", "a//b", "./a", "a/..", "a/"):
        with pytest.raises(InvalidPayloadRef):
            validate_key(bad)


def test_store_url_rules() -> None:
    bucket = re.compile(r"[a-z]+")
    assert parse_store_url("x://b//p//", "x://", bucket) == ("b", "p")
    for bad in ("y://b", "x://B", "x://b/p/../q", "x://b/p\\q"):
        with pytest.raises(PayloadStoreConfigError):
            parse_store_url(bad, "x://", bucket)

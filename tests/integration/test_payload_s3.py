# SPDX-License-Identifier: Apache-2.0
"""The S3 payload store against a real S3-compatible HTTP server on loopback (moto in server mode).

The store is configured the way production configures it: `SIE_PAYLOAD_STORE_URL=s3://bucket/prefix`
plus the standard AWS environment (`AWS_ENDPOINT_URL`, keys, region, `AWS_ALLOW_HTTP` for plain HTTP).
Objects are written with obstore's own S3 client, so the bytes cross a real signed HTTP exchange
in both directions.
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator

import msgpack
import obstore
import pytest
from obstore.store import S3Store

from sie_sidecar.payloads import (
    InvalidPayloadRef,
    ObjectStoreError,
    PayloadOversized,
    PayloadStore,
    PayloadStoreConfigError,
    Resolved,
    ResolveFailure,
    resolve_items,
)
from sie_sidecar.payloads.s3 import parse_store_url
from sie_sidecar.tools.localhost import free_port, port_open
from sie_sidecar.wire.workitem import WorkItem

BUCKET = "payloads"
PREFIX = "gw/offload"
_START_TIMEOUT_S = 20.0


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    """One moto S3 server process for the module, on a free loopback port, with one bucket."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not port_open(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"moto server did not start (exit code {proc.poll()})")
            time.sleep(0.05)
        endpoint = f"http://127.0.0.1:{port}"
        urllib.request.urlopen(urllib.request.Request(f"{endpoint}/{BUCKET}", method="PUT"), timeout=10).close()
        yield endpoint
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def aws_env(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The standard AWS environment pointing at moto; nothing sidecar-specific."""
    for name, value in {
        "AWS_ENDPOINT_URL": moto_endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true",
    }.items():
        monkeypatch.setenv(name, value)
    return moto_endpoint


async def put(key: str, data: bytes) -> None:
    """Write one object with obstore's S3 client (configured from the same environment)."""
    await obstore.put_async(S3Store(BUCKET), key, data)


@pytest.fixture
def store(aws_env: str) -> PayloadStore:
    s = PayloadStore.from_url(f"s3://{BUCKET}/{PREFIX}/")
    assert s.kind == "s3"
    return s


async def test_plain_key_and_full_url_read_the_same_object(store: PayloadStore) -> None:
    await put(f"{PREFIX}/r1_0.bin", b"hello s3")
    assert await store.fetch("r1_0.bin") == b"hello s3"
    assert await store.fetch(f"s3://{BUCKET}/{PREFIX}/r1_0.bin") == b"hello s3"


async def test_nested_key_and_large_object_arrive_intact(store: PayloadStore) -> None:
    blob = bytes(range(256)) * (3 * 4096 + 7)  # ~3 MiB, not a multiple of any chunk size
    await put(f"{PREFIX}/deep/er/big.bin", blob)
    assert await store.fetch("deep/er/big.bin") == blob


async def test_size_limit_from_metadata_is_inclusive(store: PayloadStore) -> None:
    await put(f"{PREFIX}/sized.bin", b"s" * 1000)
    assert await store.fetch("sized.bin", limit=1000) == b"s" * 1000
    with pytest.raises(PayloadOversized) as info:
        await store.fetch("sized.bin", limit=999)
    assert info.value.too_large and info.value.size == 1000


async def test_missing_object_is_an_invalid_ref(store: PayloadStore) -> None:
    with pytest.raises(InvalidPayloadRef) as info:
        await store.fetch("never-written.bin")
    assert info.value.reason == "invalid_ref"


@pytest.mark.parametrize(
    "ref",
    [
        "",
        "/abs.bin",
        "a\\b.bin",
        "a//b.bin",
        "a/./b.bin",
        "../escape.bin",
        "a/../../escape.bin",
        "dir/",
        f"s3://{BUCKET}/other-prefix/x.bin",
        f"s3://{BUCKET}/{PREFIX}x/x.bin",  # shares the prefix as a string only
        f"s3://another-bucket/{PREFIX}/x.bin",
        f"s3://{BUCKET}/{PREFIX}/../x.bin",
        f"gs://{BUCKET}/{PREFIX}/x.bin",
        "oss://b/x.bin",
        "https://example.invalid/x.bin",
    ],
)
async def test_bad_refs_are_refused_before_any_request(store: PayloadStore, ref: str) -> None:
    with pytest.raises(InvalidPayloadRef):
        await store.fetch(ref)


async def test_objects_outside_the_prefix_are_unreachable(store: PayloadStore) -> None:
    await put("outside.bin", b"not yours")
    with pytest.raises(InvalidPayloadRef):
        await store.fetch("../outside.bin")
    with pytest.raises(InvalidPayloadRef):
        await store.fetch(f"s3://{BUCKET}/outside.bin")


async def test_store_without_prefix_reads_bucket_keys(aws_env: str) -> None:
    await put("top.bin", b"top")
    s = PayloadStore.from_url(f"s3://{BUCKET}")
    assert await s.fetch("top.bin") == b"top"
    assert await s.fetch(f"s3://{BUCKET}/top.bin") == b"top"


async def test_unreachable_server_is_an_object_store_error(monkeypatch: pytest.MonkeyPatch, aws_env: str) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    s = PayloadStore.from_url(f"s3://{BUCKET}")
    started = time.monotonic()
    with pytest.raises(ObjectStoreError) as info:
        await s.fetch("x.bin")
    assert info.value.reason == "object_store" and not info.value.too_large
    assert time.monotonic() - started < 20  # bounded retries, not the client's 3-minute default


@pytest.mark.parametrize("url", ["s3://", "s3:///prefix", "s3://bad bucket", "s3://user:pw@bucket", "s3://b/p/../q"])
def test_bad_store_urls_are_startup_errors(url: str) -> None:
    with pytest.raises(PayloadStoreConfigError):
        PayloadStore.from_url(url)


def test_store_url_parsing() -> None:
    assert parse_store_url("s3://b") == ("b", "")
    assert parse_store_url("s3://b/") == ("b", "")
    assert parse_store_url("s3://b/p/q/") == ("b", "p/q")


def work(index: int, operation: str = "encode", **fields: object) -> WorkItem:
    return WorkItem(
        work_item_id=f"r2.{index}",
        request_id="r2",
        item_index=index,
        total_items=6,
        operation=operation,
        model_id="m",
        pool_name="p",
        machine_profile="l4",
        reply_subject="_INBOX.gw.r2",
        **fields,  # type: ignore[arg-type]
    )


async def test_mixed_batch_against_s3(store: PayloadStore) -> None:
    """The gateway's offload layout (wire-protocol §7.3): one bad ref costs only its own item."""
    await put(f"{PREFIX}/r2_0.bin", msgpack.packb({"text": "offloaded"}))
    await put(f"{PREFIX}/r2_score.bin", msgpack.packb({"query": {"text": "q"}, "items": [{"text": "a"}]}))
    await put(f"{PREFIX}/r2_4.bin", b"\x00" * 4096)
    await put(f"{PREFIX}/r2_5.bin", b"\xc1")
    items = [
        work(0, payload_ref="r2_0.bin"),
        work(1, payload_ref="../r2_0.bin"),
        work(2, "score", query_payload_ref=f"s3://{BUCKET}/{PREFIX}/r2_score.bin"),
        work(3, "extract", payload_ref="r2_missing.bin"),
        work(4, payload_ref="r2_4.bin"),
        work(5, payload_ref="r2_5.bin"),
    ]
    outcomes = await resolve_items(store, items, limit=1024)
    assert isinstance(outcomes[0], Resolved) and outcomes[0].item.item == {"text": "offloaded"}
    assert isinstance(outcomes[2], Resolved) and outcomes[2].item.score_items == [{"text": "a"}]
    failures = {o.item.item_index: (o.code, o.reason) for o in outcomes if isinstance(o, ResolveFailure)}
    assert failures == {
        1: ("payload_error", "invalid_ref"),
        3: ("payload_error", "invalid_ref"),
        4: ("PAYLOAD_TOO_LARGE", "too_large"),
        5: ("payload_error", "decode"),
    }


async def test_plain_http_needs_aws_allow_http(store: PayloadStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without `AWS_ALLOW_HTTP` the client refuses a non-TLS endpoint rather than sending to it."""
    await put(f"{PREFIX}/tls.bin", b"x")
    monkeypatch.delenv("AWS_ALLOW_HTTP")
    strict = PayloadStore.from_url(f"s3://{BUCKET}/{PREFIX}")
    with pytest.raises(ObjectStoreError):
        await strict.fetch("tls.bin")
    assert await store.fetch("tls.bin") == b"x"  # the store built with it keeps working

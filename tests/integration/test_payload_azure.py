# SPDX-License-Identifier: Apache-2.0
"""The Azure payload store (`abfs://`, `abfss://`) against a loopback HTTP server shaped as Azure
Blob's Get Blob, which checks what Azure checks.

The server recomputes every SharedKey signature with the official SDK's own signing policy
(`azure-storage-blob`, a test dependency only) and refuses a wrong one with 403
AuthenticationFailed; it accepts a SAS only as the SDK generated it; and, for workload identity,
it is also the Entra ID token endpoint that trades the federated token file for a bearer token.
The reader reaches it through `AZURE_STORAGE_ENDPOINT` and `AZURE_AUTHORITY_HOST`, the standard
variables; nothing else differs from production.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.utils import formatdate
from pathlib import Path
from urllib.parse import parse_qsl

import msgpack
import pytest
from aiohttp import web
from azure.core.pipeline import PipelineContext, PipelineRequest
from azure.core.rest import HttpRequest
from azure.storage.blob import ContainerSasPermissions, generate_container_sas
from azure.storage.blob._shared.authentication import SharedKeyCredentialPolicy

from sie_sidecar.config import Settings
from sie_sidecar.payloads import (
    InvalidPayloadRef,
    PayloadOversized,
    PayloadStore,
    PayloadStoreConfigError,
    Resolved,
    ResolveFailure,
    resolve_items,
)
from sie_sidecar.payloads.azure import AzureReader, object_root, parse_store_url
from sie_sidecar.tools.localhost import free_port
from sie_sidecar.wire.workitem import WorkItem

ACCOUNT = "siepayloads"
CONTAINER = "offload"
PREFIX = "gw/items"
KEY = "c2llLWF6dXJlLXRlc3Qta2V5LWRvLW5vdC1sb2c="  # base64, as Azure account keys are
URL = f"abfss://{CONTAINER}@{ACCOUNT}.dfs.core.windows.net/{PREFIX}"
TENANT, CLIENT_ID = "00000000-0000-0000-0000-000000000001", "00000000-0000-0000-0000-000000000002"
FEDERATED_TOKEN = "eyJhbGciOi.federated-token-do-not-log"
BEARER = "entra-access-token-do-not-log"


def azure_error(status: int, code: str, message: str) -> web.Response:
    body = f"<?xml version='1.0' encoding='utf-8'?><Error><Code>{code}</Code><Message>{message}</Message></Error>"
    return web.Response(
        status=status, body=body.encode(), content_type="application/xml", headers={"x-ms-error-code": code}
    )


def sdk_authorization(request: web.Request, account: str, key: str) -> str:
    """The Authorization header the official SDK's SharedKey policy writes for this very request."""
    headers = {k: v for k, v in request.headers.items() if k.lower() != "authorization"}
    sdk_request = HttpRequest(request.method, str(request.url), headers=headers)
    policy = SharedKeyCredentialPolicy(account, key)  # type: ignore[no-untyped-call]
    policy.on_request(PipelineRequest(sdk_request, PipelineContext(None)))  # type: ignore[no-untyped-call]
    return str(sdk_request.headers["Authorization"])


@dataclass
class FakeAzure:
    """One container: its objects, what it accepts (the account key, one SAS, one bearer), and what
    it saw."""

    objects: dict[str, bytes] = field(default_factory=dict)
    sas: str = ""
    hits: Counter[str] = field(default_factory=Counter)
    token_requests: list[dict[str, str]] = field(default_factory=list)

    def refused(self, request: web.Request) -> web.Response | None:
        auth = request.headers.get("Authorization", "")
        if auth.startswith("SharedKey "):
            if auth != sdk_authorization(request, ACCOUNT, KEY):
                return azure_error(
                    403, "AuthenticationFailed", "The MAC signature found in the HTTP request is not the same"
                )
            return None
        if auth.startswith("Bearer "):
            return None if auth == f"Bearer {BEARER}" else azure_error(403, "AuthenticationFailed", "bad token")
        query = dict(parse_qsl(request.query_string, keep_blank_values=True))
        if self.sas and query == dict(parse_qsl(self.sas)):
            return None
        return azure_error(403, "AuthenticationFailed", "Server failed to authenticate the request")

    async def blob(self, request: web.Request) -> web.StreamResponse:
        container, name = request.match_info["container"], request.match_info["name"]
        self.hits[name] += 1
        refused = self.refused(request)
        if refused is not None:
            return refused
        data = self.objects.get(name) if container == CONTAINER else None
        if data is None:
            return azure_error(404, "BlobNotFound", "The specified blob does not exist.")
        headers = {
            "Content-Length": str(len(data)),
            "Content-Type": "application/octet-stream",
            "Last-Modified": formatdate(time.time(), usegmt=True),
            "ETag": '"0x8DBTEST"',
            "x-ms-blob-type": "BlockBlob",
        }
        if request.method == "HEAD":
            return web.Response(status=200, headers=headers)
        return web.Response(status=200, body=data, headers=headers)

    async def token(self, request: web.Request) -> web.Response:
        """Entra ID's token endpoint for a federated (workload identity) client assertion."""
        form = dict(await request.post())
        self.token_requests.append({k: str(v) for k, v in form.items()} | {"path": request.path})
        if form.get("client_assertion") != FEDERATED_TOKEN or form.get("client_id") != CLIENT_ID:
            return web.json_response({"error": "invalid_client"}, status=401)
        return web.json_response({"access_token": BEARER, "token_type": "Bearer", "expires_in": 3600})


@pytest.fixture
async def azure() -> AsyncIterator[tuple[FakeAzure, str]]:
    fake = FakeAzure()
    app = web.Application()
    app.router.add_post(f"/{TENANT}/oauth2/v2.0/token", fake.token)
    app.router.add_route("*", "/{container}/{name:.+}", fake.blob)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield fake, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@pytest.fixture
def azure_env(azure: tuple[FakeAzure, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeAzure]:
    """SharedKey credentials and the loopback endpoint, as the standard Azure variables."""
    fake, endpoint = azure
    for name in ("AZURE_STORAGE_SAS_KEY", "AZURE_FEDERATED_TOKEN_FILE", "AZURE_CLIENT_ID", "AZURE_TENANT_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AZURE_STORAGE_ENDPOINT", endpoint)
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", KEY)
    monkeypatch.setenv("AZURE_ALLOW_HTTP", "true")
    yield fake


def _item(ref: str) -> WorkItem:
    return WorkItem(
        work_item_id="r.0",
        request_id="r",
        item_index=0,
        total_items=1,
        operation="encode",
        model_id="m",
        pool_name="p",
        machine_profile="l4",
        reply_subject="_INBOX.gw.r",
        payload_ref=ref,
    )


async def test_plain_key_and_full_url_read_the_same_object(azure_env: FakeAzure) -> None:
    azure_env.objects[f"{PREFIX}/a/item.msgpack"] = msgpack.packb({"text": "from azure"})
    store = PayloadStore.from_url(URL)
    try:
        (by_key,) = await resolve_items(store, [_item("a/item.msgpack")])
        (by_url,) = await resolve_items(store, [_item(f"{URL}/a/item.msgpack")])
    finally:
        store.close()
    for outcome in (by_key, by_url):
        assert isinstance(outcome, Resolved) and outcome.item.item == {"text": "from azure"}
    assert azure_env.hits[f"{PREFIX}/a/item.msgpack"] >= 2  # both signed by SharedKey, as the SDK signs


async def test_a_large_object_arrives_intact(azure_env: FakeAzure) -> None:
    blob = bytes(range(256)) * 40_000  # 10 MB
    azure_env.objects[f"{PREFIX}/big.bin"] = blob
    reader = AzureReader(URL)
    assert await reader.fetch("big.bin", 16 * 1024 * 1024) == blob


async def test_the_size_limit_from_metadata_is_inclusive(azure_env: FakeAzure) -> None:
    azure_env.objects[f"{PREFIX}/exact.bin"] = b"x" * 1000
    reader = AzureReader(URL)
    assert await reader.fetch("exact.bin", 1000) == b"x" * 1000
    with pytest.raises(PayloadOversized):
        await reader.fetch("exact.bin", 999)


async def test_a_missing_object_is_an_invalid_ref(azure_env: FakeAzure) -> None:
    (outcome,) = await resolve_items(PayloadStore.from_url(URL), [_item("nope.msgpack")])
    assert isinstance(outcome, ResolveFailure) and outcome.reason == "invalid_ref"  # as the other stores


async def test_a_wrong_key_is_refused_and_the_error_leaks_nothing(
    azure_env: FakeAzure, monkeypatch: pytest.MonkeyPatch
) -> None:
    azure_env.objects[f"{PREFIX}/item.msgpack"] = msgpack.packb({"text": "x"})
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", "d3Jvbmcta2V5LWRvLW5vdC1sb2c=")
    (outcome,) = await resolve_items(PayloadStore.from_url(URL), [_item("item.msgpack")])
    assert isinstance(outcome, ResolveFailure) and outcome.reason == "object_store"
    assert outcome.code == "payload_error" and outcome.message == "failed to resolve item"
    assert "d3Jvbmc" not in repr(outcome) and KEY not in repr(outcome)


async def test_a_sas_authenticates_and_another_does_not(azure_env: FakeAzure, monkeypatch: pytest.MonkeyPatch) -> None:
    """A SAS as the official SDK generates it (read permission on the container) is sent as the
    query string; the server takes exactly that one."""
    azure_env.objects[f"{PREFIX}/sas.msgpack"] = msgpack.packb({"text": "via sas"})
    azure_env.sas = generate_container_sas(
        ACCOUNT,
        CONTAINER,
        account_key=KEY,
        permission=ContainerSasPermissions(read=True),
        expiry=datetime.now(UTC) + timedelta(hours=1),
    )
    monkeypatch.delenv("AZURE_STORAGE_ACCOUNT_KEY")
    monkeypatch.setenv("AZURE_STORAGE_SAS_KEY", azure_env.sas)
    (ok,) = await resolve_items(PayloadStore.from_url(URL), [_item("sas.msgpack")])
    assert isinstance(ok, Resolved) and ok.item.item == {"text": "via sas"}
    monkeypatch.setenv("AZURE_STORAGE_SAS_KEY", azure_env.sas.replace("sig=", "sig=AAAA"))
    (refused,) = await resolve_items(PayloadStore.from_url(URL), [_item("sas.msgpack")])
    assert isinstance(refused, ResolveFailure) and refused.reason == "object_store"


async def test_workload_identity_trades_the_federated_token_for_a_bearer(
    azure: tuple[FakeAzure, str], azure_env: FakeAzure, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """AKS workload identity: the federated token file, client and tenant ids (the variables the
    webhook injects) get a bearer token from the authority host, which signs the Get Blob."""
    _, endpoint = azure
    token_file = tmp_path / "azure-identity-token"
    token_file.write_text(FEDERATED_TOKEN)
    monkeypatch.delenv("AZURE_STORAGE_ACCOUNT_KEY")
    monkeypatch.setenv("AZURE_FEDERATED_TOKEN_FILE", str(token_file))
    monkeypatch.setenv("AZURE_CLIENT_ID", CLIENT_ID)
    monkeypatch.setenv("AZURE_TENANT_ID", TENANT)
    monkeypatch.setenv("AZURE_AUTHORITY_HOST", endpoint)
    azure_env.objects[f"{PREFIX}/wi.msgpack"] = msgpack.packb({"text": "via workload identity"})
    (ok,) = await resolve_items(PayloadStore.from_url(URL), [_item("wi.msgpack")])
    assert isinstance(ok, Resolved) and ok.item.item == {"text": "via workload identity"}
    assert [r["client_assertion"] for r in azure_env.token_requests] == [FEDERATED_TOKEN]


@pytest.mark.parametrize(
    "ref", ["", "/abs", "a/../b", "a//b", "s3://bucket/x", f"abfss://other@{ACCOUNT}.dfs.core.windows.net/{PREFIX}/x"]
)
async def test_bad_refs_are_refused_before_any_request(azure_env: FakeAzure, ref: str) -> None:
    reader = AzureReader(URL)
    with pytest.raises(InvalidPayloadRef):
        await reader.fetch(ref, 1000)
    assert sum(azure_env.hits.values()) == 0


async def test_objects_outside_the_prefix_are_unreachable(azure_env: FakeAzure) -> None:
    azure_env.objects["elsewhere/item.msgpack"] = msgpack.packb({"text": "secret"})
    reader = AzureReader(URL)
    with pytest.raises(InvalidPayloadRef):
        await reader.fetch(f"abfss://{CONTAINER}@{ACCOUNT}.dfs.core.windows.net/elsewhere/item.msgpack", 1000)


async def test_plain_http_needs_azure_allow_http(azure_env: FakeAzure, monkeypatch: pytest.MonkeyPatch) -> None:
    azure_env.objects[f"{PREFIX}/item.msgpack"] = msgpack.packb({"text": "x"})
    monkeypatch.delenv("AZURE_ALLOW_HTTP")
    (outcome,) = await resolve_items(PayloadStore.from_url(URL), [_item("item.msgpack")])
    assert isinstance(outcome, ResolveFailure)
    assert sum(azure_env.hits.values()) == 0


@pytest.mark.parametrize(
    "url",
    [
        "abfs://",
        "abfs://offload",  # no account
        f"abfs://Offload@{ACCOUNT}.dfs.core.windows.net",  # upper case container
        f"abfs://of@{ACCOUNT}.dfs.core.windows.net",  # too short
        f"abfs://off--load@{ACCOUNT}.dfs.core.windows.net",
        "abfs://offload@ab.dfs.core.windows.net",  # account too short
        "abfs://offload@siepayloads.file.core.windows.net",
        f"abfs://offload@{ACCOUNT}.dfs.core.windows.net/a/../b",
    ],
)
def test_bad_store_urls_are_startup_errors(url: str) -> None:
    with pytest.raises(PayloadStoreConfigError):
        PayloadStore.from_url(url)


def test_store_url_parsing() -> None:
    assert parse_store_url(f"abfs://{CONTAINER}@{ACCOUNT}.blob.core.windows.net") == (
        "abfs://",
        f"{CONTAINER}@{ACCOUNT}.blob.core.windows.net",
        CONTAINER,
        ACCOUNT,
    )
    root = object_root(f"{URL}/")
    assert (root.scheme, root.bucket, root.prefix) == (
        "abfss://",
        f"{CONTAINER}@{ACCOUNT}.dfs.core.windows.net",
        PREFIX,
    )
    assert root.object_path("x.msgpack") == f"{PREFIX}/x.msgpack"


def test_an_azure_store_is_served_not_refused() -> None:
    """§12: `abfs://` and `abfss://` were refused at start-up; they are served now."""
    env = {"SIE_NATS_URL": "nats://127.0.0.1:4222", "SIE_POOL": "p", "SIE_BUNDLE": "b", "SIE_MACHINE_PROFILE": "l4"}
    for url in (URL, f"abfs://{CONTAINER}@{ACCOUNT}.blob.core.windows.net"):
        Settings.from_env({**env, "SIE_PAYLOAD_STORE_URL": url}).require_supported()
        assert json.dumps(
            Settings.from_env({**env, "SIE_PAYLOAD_STORE_URL": url}).redacted()["payload_store_url"]
        ) == json.dumps(url)

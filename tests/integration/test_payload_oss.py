# SPDX-License-Identifier: Apache-2.0
"""The OSS payload store against loopback HTTP servers that check what real OSS and STS check.

The OSS server recomputes every request's V4 signature with the official SDK's signer
(`alibabacloud-oss-v2`, a test dependency only) and refuses a wrong one with 403
SignatureDoesNotMatch, echoing the string to sign as OSS does: the error the reader raises must
keep none of it. The STS server answers `AssumeRoleWithOIDC` for RRSA. Both are reached through
the reader's test-only endpoint hooks; nothing else differs from production.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp
import msgpack
import pytest
from aiohttp import web
from alibabacloud_oss_v2.signer.v4 import SignerV4  # type: ignore[import-untyped]
from alibabacloud_oss_v2.types import (  # type: ignore[import-untyped]
    Credentials,
    HttpRequest,
    SigningContext,
)

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
from sie_sidecar.payloads import oss as oss_module
from sie_sidecar.payloads.oss import OssReader
from sie_sidecar.tools.localhost import free_port
from sie_sidecar.wire.workitem import WorkItem

BUCKET = "sie-payloads"
PREFIX = "gw/offload"
REGION = "cn-hangzhou"
KEY_ID = "LTAI5tTestKeyId"
SECRET = "test-secret-do-not-log"
TOKEN = "CAIS-session-token-do-not-log"
OIDC_TOKEN = "eyJhbGciOi.oidc-token-do-not-log"
STS_ID, STS_SECRET, STS_TOKEN = "STS.NTestId", "sts-secret-do-not-log", "sts-token-do-not-log"
_AUTH_RE = re.compile(
    r"OSS4-HMAC-SHA256 Credential=(?P<id>[^/,]+)/(?P<date>\d{8})/(?P<region>[^/,]+)/oss/aliyun_v4_request"
    r"(?:,AdditionalHeaders=(?P<additional>[^,]*))?,Signature=(?P<sig>[0-9a-f]{64})"
)


def oss_error(status: int, code: str, message: str = "", **extra: str) -> web.Response:
    """An OSS XML error body (real OSS echoes the string to sign and the key in some of them)."""
    fields = "".join(f"<{k}>{v}</{k}>" for k, v in extra.items())
    body = f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code><Message>{message}</Message>"
    body += f"{fields}<RequestId>5C3D9175B6FC201293AD****</RequestId><HostId>{BUCKET}.oss</HostId></Error>"
    return web.Response(status=status, body=body.encode(), content_type="application/xml")


@dataclass
class FakeOss:
    """One bucket: its objects, the credentials it accepts, scripted failures and what it saw."""

    credentials: dict[str, tuple[str, str | None]] = field(default_factory=lambda: {KEY_ID: (SECRET, None)})
    objects: dict[str, bytes] = field(default_factory=dict)
    script: dict[str, list[str]] = field(default_factory=dict)  # name -> answers before the object
    chunked: set[str] = field(default_factory=set)  # names served without Content-Length
    hits: Counter[str] = field(default_factory=Counter)
    seen_headers: list[dict[str, str]] = field(default_factory=list)

    def verify(self, request: web.Request, name: str) -> web.Response | None:
        """None if the request is signed as the SDK would sign it, else OSS's 403."""
        match = _AUTH_RE.fullmatch(request.headers.get("Authorization", ""))
        if match is None:
            return oss_error(403, "AccessDenied", "bad Authorization")
        if match["id"] not in self.credentials:
            return oss_error(403, "InvalidAccessKeyId", f"key {match['id']} unknown")
        secret, token = self.credentials[match["id"]]
        if request.headers.get("x-oss-security-token") != token:
            return oss_error(403, "InvalidSecurityToken", "token mismatch")
        when = datetime.strptime(request.headers["x-oss-date"], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
        headers = {k.lower(): v for k, v in request.headers.items()}
        sdk_request = HttpRequest("GET", str(request.url), headers=headers)
        additional = set(filter(None, (match["additional"] or "").split(";")))
        ctx = SigningContext(
            product="oss",
            region=REGION,
            bucket=BUCKET,
            key=name,
            request=sdk_request,
            credentials=Credentials(match["id"], secret, token),
            signing_time=when,
            additional_headers=additional,
        )
        SignerV4().sign(ctx)
        if sdk_request.headers["Authorization"] != request.headers["Authorization"]:
            return oss_error(
                403,
                "SignatureDoesNotMatch",
                f"The request signature we calculated does not match the signature you provided for {name}",
                StringToSign=str(ctx.string_to_sign),
                OSSAccessKeyId=match["id"],
            )
        return None

    async def get(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        self.hits[name] += 1
        self.seen_headers.append(dict(request.headers))
        refused = self.verify(request, name)
        if refused is not None:
            return refused
        pending = self.script.get(name)
        if pending:
            answer = pending.pop(0)
            if answer == "stall":  # longer than the (shortened) request timeout
                await asyncio.sleep(1.0)
                return web.Response(body=b"late")
            if answer == "drop":  # half the body, then the connection goes
                data = self.objects[name]
                resp = web.StreamResponse(headers={"Content-Length": str(len(data))})
                await resp.prepare(request)
                await resp.write(data[: len(data) // 2])
                assert request.transport is not None
                request.transport.close()
                return resp
            status, code = answer.split(":")
            return oss_error(int(status), code, f"scripted for {name}")
        if name not in self.objects:
            return oss_error(404, "NoSuchKey", f"The specified key {name} does not exist.", Key=name)
        data = self.objects[name]
        if name in self.chunked:
            resp = web.StreamResponse()
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            for i in range(0, len(data), 1000):
                await resp.write(data[i : i + 1000])
            await resp.write_eof()
            return resp
        return web.Response(body=data, content_type="application/octet-stream")


@dataclass
class FakeSts:
    """`AssumeRoleWithOIDC`: issues credentials into `oss` for the expected role and token."""

    oss: FakeOss
    lifetime_s: int = 3600
    script: list[tuple[int, str]] = field(default_factory=list)
    calls: int = 0
    forms: list[dict[str, str]] = field(default_factory=list)

    async def post(self, request: web.Request) -> web.Response:
        self.calls += 1
        form = {k: str(v) for k, v in (await request.post()).items()}
        self.forms.append(form)
        if self.script:
            status, code = self.script.pop(0)
            return web.json_response(
                {"Code": code, "Message": f"scripted, token {form.get('OIDCToken')}"}, status=status
            )
        query = request.query
        if (query.get("Action"), query.get("Version"), query.get("Format")) != (
            "AssumeRoleWithOIDC",
            "2015-04-01",
            "JSON",
        ):
            return web.json_response({"Code": "InvalidAction"}, status=400)
        if form.get("OIDCToken") != OIDC_TOKEN or not form.get("RoleArn", "").endswith(":role/reader"):
            return web.json_response({"Code": "InvalidParameter.OIDCToken", "Message": "bad token"}, status=400)
        self.oss.credentials[STS_ID] = (STS_SECRET, STS_TOKEN)
        expires = (datetime.now(UTC) + timedelta(seconds=self.lifetime_s)).strftime("%Y-%m-%dT%H:%M:%SZ")
        creds = {
            "AccessKeyId": STS_ID,
            "AccessKeySecret": STS_SECRET,
            "SecurityToken": STS_TOKEN,
            "Expiration": expires,
        }
        return web.json_response({"RequestId": "r", "Credentials": creds})


async def serve(app: web.Application) -> AsyncIterator[str]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@pytest.fixture
def oss() -> FakeOss:
    return FakeOss()


@pytest.fixture
async def oss_endpoint(oss: FakeOss) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_get("/{name:.+}", oss.get)
    async for url in serve(app):
        yield url


@pytest.fixture
def sts(oss: FakeOss) -> FakeSts:
    return FakeSts(oss)


@pytest.fixture
async def sts_endpoint(sts: FakeSts) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/", sts.post)
    async for url in serve(app):
        yield url + "/"


ENV = {"SIE_OSS_REGION": REGION, "ALIBABA_CLOUD_ACCESS_KEY_ID": KEY_ID, "ALIBABA_CLOUD_ACCESS_KEY_SECRET": SECRET}


@pytest.fixture
async def reader(oss_endpoint: str) -> AsyncIterator[OssReader]:
    r = OssReader(f"oss://{BUCKET}/{PREFIX}/", ENV, endpoint=oss_endpoint)
    yield r
    await r.aclose()


def put(oss: FakeOss, key: str, data: bytes) -> None:
    oss.objects[f"{PREFIX}/{key}"] = data


async def test_plain_key_and_full_url_read_the_same_object(reader: OssReader, oss: FakeOss, oss_endpoint: str) -> None:
    put(oss, "r1_0.bin", b"hello oss")
    assert await reader.fetch("r1_0.bin", 1024) == b"hello oss"
    assert await reader.fetch(f"oss://{BUCKET}/{PREFIX}/r1_0.bin", 1024) == b"hello oss"
    assert oss.hits[f"{PREFIX}/r1_0.bin"] == 2
    sent = oss.seen_headers[0]
    assert sent["Host"] == oss_endpoint.removeprefix("http://")
    assert sent["x-oss-content-sha256"] == "UNSIGNED-PAYLOAD" and "Accept-Encoding" not in sent


async def test_large_object_arrives_intact(reader: OssReader, oss: FakeOss) -> None:
    blob = bytes(range(256)) * (3 * 4096 + 7)
    put(oss, "big.bin", blob)
    assert await reader.fetch("big.bin", len(blob)) == blob


async def test_oss_pair_with_session_token_is_signed_and_sent(oss: FakeOss, oss_endpoint: str) -> None:
    oss.credentials["oss-key"] = ("oss-secret", "oss-token")
    put(oss, "t.bin", b"token")
    env = {"SIE_OSS_REGION": REGION, "OSS_ACCESS_KEY_ID": "oss-key", "OSS_ACCESS_KEY_SECRET": "oss-secret"}
    r = OssReader(f"oss://{BUCKET}/{PREFIX}", {**env, "OSS_SESSION_TOKEN": "oss-token"}, endpoint=oss_endpoint)
    try:
        assert await r.fetch("t.bin", 100) == b"token"
        assert oss.seen_headers[-1]["x-oss-security-token"] == "oss-token"
    finally:
        await r.aclose()
    r = OssReader(f"oss://{BUCKET}/{PREFIX}", env, endpoint=oss_endpoint)  # no token: OSS refuses
    try:
        with pytest.raises(ObjectStoreError, match=r"HTTP 403, InvalidSecurityToken"):
            await r.fetch("t.bin", 100)
    finally:
        await r.aclose()


async def test_missing_object_is_an_invalid_ref_without_retry(reader: OssReader, oss: FakeOss) -> None:
    with pytest.raises(InvalidPayloadRef) as info:
        await reader.fetch("never-written.bin", 1024)
    assert info.value.reason == "invalid_ref" and not info.value.too_large
    assert str(info.value) == "OSS object not found (HTTP 404, NoSuchKey)"
    assert oss.hits[f"{PREFIX}/never-written.bin"] == 1


async def test_size_limit_from_content_length_is_inclusive(reader: OssReader, oss: FakeOss) -> None:
    put(oss, "sized.bin", b"s" * 1000)
    assert await reader.fetch("sized.bin", 1000) == b"s" * 1000
    with pytest.raises(PayloadOversized) as info:
        await reader.fetch("sized.bin", 999)
    assert info.value.too_large and info.value.size == 1000


async def test_size_limit_while_streaming_without_content_length(reader: OssReader, oss: FakeOss) -> None:
    put(oss, "stream.bin", b"z" * 5000)
    oss.chunked.add(f"{PREFIX}/stream.bin")
    assert await reader.fetch("stream.bin", 5000) == b"z" * 5000
    with pytest.raises(PayloadOversized) as info:
        await reader.fetch("stream.bin", 2500)
    assert info.value.too_large and 2500 < info.value.size <= 5000


async def test_throttling_is_retried_then_succeeds(reader: OssReader, oss: FakeOss) -> None:
    put(oss, "flaky.bin", b"eventually")
    oss.script[f"{PREFIX}/flaky.bin"] = ["429:SlowDown"]
    started = time.monotonic()
    assert await reader.fetch("flaky.bin", 100) == b"eventually"
    assert oss.hits[f"{PREFIX}/flaky.bin"] == 2 and time.monotonic() - started >= 0.05


async def test_a_dropped_connection_is_retried(reader: OssReader, oss: FakeOss) -> None:
    put(oss, "drop.bin", b"d" * 100_000)
    oss.script[f"{PREFIX}/drop.bin"] = ["drop"]
    assert await reader.fetch("drop.bin", 200_000) == b"d" * 100_000
    assert oss.hits[f"{PREFIX}/drop.bin"] == 2


async def test_a_stalled_request_times_out_and_is_retried(
    reader: OssReader, oss: FakeOss, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The 30 s request timeout (shortened here) bounds each attempt; a timeout is retried."""
    assert oss_module.REQUEST_TIMEOUT_S == 30.0
    monkeypatch.setattr(oss_module, "_TIMEOUT", aiohttp.ClientTimeout(total=0.2))
    put(oss, "slow.bin", b"in time")
    oss.script[f"{PREFIX}/slow.bin"] = ["stall"]
    assert await reader.fetch("slow.bin", 100) == b"in time"
    oss.script[f"{PREFIX}/slow.bin"] = ["stall"] * 3
    started = time.monotonic()
    with pytest.raises(ObjectStoreError) as info:
        await reader.fetch("slow.bin", 100)
    assert str(info.value) == "OSS GET failed after 3 attempts (transport error, TimeoutError)"
    assert oss.hits[f"{PREFIX}/slow.bin"] == 5 and time.monotonic() - started < 2.0


async def test_close_at_shutdown_closes_the_session(oss: FakeOss, oss_endpoint: str) -> None:
    """The store's synchronous close, called from the running loop (as the app's exit stack does)."""
    put(oss, "c.bin", b"c")
    store = PayloadStore(OssReader(f"oss://{BUCKET}/{PREFIX}", ENV, endpoint=oss_endpoint), "oss")
    assert await store.fetch("c.bin") == b"c"
    reader = store.reader
    assert isinstance(reader, OssReader)
    session = reader._session
    assert session is not None and not session.closed
    store.close()
    await asyncio.sleep(0.05)
    assert session.closed
    assert await store.fetch("c.bin") == b"c"  # a read after close opens a new session
    await reader.aclose()


async def test_server_errors_exhaust_three_attempts(reader: OssReader, oss: FakeOss) -> None:
    put(oss, "broken.bin", b"never served")
    oss.script[f"{PREFIX}/broken.bin"] = ["500:InternalError"] * 5
    started = time.monotonic()
    with pytest.raises(ObjectStoreError) as info:
        await reader.fetch("broken.bin", 100)
    assert str(info.value) == "OSS GET failed after 3 attempts (HTTP 500, InternalError)"
    assert oss.hits[f"{PREFIX}/broken.bin"] == 3
    assert time.monotonic() - started >= 0.15  # 50 ms, then 100 ms


async def test_access_denied_is_not_retried(reader: OssReader, oss: FakeOss) -> None:
    oss.script[f"{PREFIX}/denied.bin"] = ["403:AccessDenied"]
    with pytest.raises(ObjectStoreError) as info:
        await reader.fetch("denied.bin", 100)
    assert str(info.value) == "OSS GET failed (HTTP 403, AccessDenied)" and info.value.reason == "object_store"
    assert oss.hits[f"{PREFIX}/denied.bin"] == 1


async def test_a_wrong_signature_is_refused_and_the_error_leaks_nothing(oss: FakeOss, oss_endpoint: str) -> None:
    put(oss, "secret-name.bin", b"x")
    env = {**ENV, "ALIBABA_CLOUD_ACCESS_KEY_SECRET": "wrong-secret-do-not-log"}
    r = OssReader(f"oss://{BUCKET}/{PREFIX}", env, endpoint=oss_endpoint)
    try:
        with pytest.raises(ObjectStoreError) as info:
            await r.fetch("secret-name.bin", 100)
    finally:
        await r.aclose()
    text = str(info.value)
    assert text == "OSS GET failed (HTTP 403, SignatureDoesNotMatch)"
    for leak in ("secret-name", "do-not-log", KEY_ID, "127.0.0.1", BUCKET, "OSS4", "StringToSign"):
        assert leak not in text
    assert info.value.__cause__ is None and info.value.__context__ is None  # no chained client error


@pytest.mark.parametrize(
    "ref",
    [
        "",
        ".",
        "..",
        "a..b",
        "sub/r.bin",
        "/abs.bin",
        "a\\b",
        "sp ace",
        "pct%2F",
        "q?x",
        f"oss://{BUCKET}/{PREFIX}/sub/x.bin",
        f"oss://{BUCKET}/other/x.bin",
        f"oss://{BUCKET}/{PREFIX}x/x.bin",
        f"oss://another-bucket/{PREFIX}/x.bin",
        f"s3://{BUCKET}/{PREFIX}/x.bin",
        "https://example.invalid/x.bin",
    ],
)
async def test_bad_refs_are_refused_before_any_request(reader: OssReader, oss: FakeOss, ref: str) -> None:
    with pytest.raises(InvalidPayloadRef):
        await reader.fetch(ref, 100)
    assert not oss.hits


async def test_unreachable_endpoint_exhausts_three_attempts() -> None:
    r = OssReader(f"oss://{BUCKET}", ENV, endpoint=f"http://127.0.0.1:{free_port()}")
    try:
        with pytest.raises(ObjectStoreError) as info:
            await r.fetch("x.bin", 100)
    finally:
        await r.aclose()
    assert str(info.value).startswith("OSS GET failed after 3 attempts (transport error, ")
    assert "127.0.0.1" not in str(info.value)


# ------------------------------------------------------------------------------------------------ RRSA


@pytest.fixture
def rrsa_env(tmp_path: Path) -> dict[str, str]:
    token = tmp_path / "token"
    token.write_text(OIDC_TOKEN + "\n")
    return {
        "SIE_OSS_REGION": REGION,
        "ALIBABA_CLOUD_ROLE_ARN": "acs:ram::1234567890123456:role/reader",
        "ALIBABA_CLOUD_OIDC_PROVIDER_ARN": "acs:ram::1234567890123456:oidc-provider/ack-rrsa",
        "ALIBABA_CLOUD_OIDC_TOKEN_FILE": str(token),
        "ALIBABA_CLOUD_ROLE_SESSION_NAME": "pod-a",
    }


async def rrsa_reader(env: dict[str, str], oss_endpoint: str, sts_endpoint: str) -> OssReader:
    return OssReader(f"oss://{BUCKET}/{PREFIX}", env, endpoint=oss_endpoint, sts_endpoint=sts_endpoint)


async def test_rrsa_exchanges_once_and_signs_with_the_session_token(
    oss: FakeOss, sts: FakeSts, oss_endpoint: str, sts_endpoint: str, rrsa_env: dict[str, str]
) -> None:
    put(oss, "a.bin", b"via rrsa")
    r = await rrsa_reader(rrsa_env, oss_endpoint, sts_endpoint)
    try:
        got = await asyncio.gather(*(r.fetch("a.bin", 100) for _ in range(4)))
        assert got == [b"via rrsa"] * 4
        assert sts.calls == 1  # concurrent fetches share one exchange, later ones the cache
        assert await r.fetch("a.bin", 100) == b"via rrsa" and sts.calls == 1
    finally:
        await r.aclose()
    form = sts.forms[0]
    assert form["RoleSessionName"] == "pod-a" and form["OIDCToken"] == OIDC_TOKEN
    assert form["OIDCProviderArn"].endswith(":oidc-provider/ack-rrsa") and form["DurationSeconds"] == "3600"
    assert oss.seen_headers[-1]["x-oss-security-token"] == STS_TOKEN


async def test_rrsa_refreshes_credentials_about_to_expire(
    oss: FakeOss, sts: FakeSts, oss_endpoint: str, sts_endpoint: str, rrsa_env: dict[str, str]
) -> None:
    put(oss, "a.bin", b"x")
    sts.lifetime_s = 60  # inside the refresh margin: every fetch exchanges again
    r = await rrsa_reader(rrsa_env, oss_endpoint, sts_endpoint)
    try:
        await r.fetch("a.bin", 100)
        await r.fetch("a.bin", 100)
    finally:
        await r.aclose()
    assert sts.calls == 2


async def test_rrsa_retries_a_busy_sts(
    oss: FakeOss, sts: FakeSts, oss_endpoint: str, sts_endpoint: str, rrsa_env: dict[str, str]
) -> None:
    put(oss, "a.bin", b"x")
    sts.script = [(503, "ServiceUnavailable")]
    r = await rrsa_reader(rrsa_env, oss_endpoint, sts_endpoint)
    try:
        assert await r.fetch("a.bin", 100) == b"x"
    finally:
        await r.aclose()
    assert sts.calls == 2


async def test_rrsa_refusal_is_not_retried_and_leaks_nothing(
    oss: FakeOss, sts: FakeSts, oss_endpoint: str, sts_endpoint: str, rrsa_env: dict[str, str]
) -> None:
    sts.script = [(400, "InvalidParameter.OIDCToken")] * 3
    r = await rrsa_reader(rrsa_env, oss_endpoint, sts_endpoint)
    try:
        with pytest.raises(ObjectStoreError) as info:
            await r.fetch("a.bin", 100)
    finally:
        await r.aclose()
    assert str(info.value) == "OSS credentials: STS AssumeRoleWithOIDC failed (HTTP 400, InvalidParameter.OIDCToken)"
    assert "do-not-log" not in str(info.value) and sts.calls == 1 and not oss.hits


async def test_rrsa_token_file_gone_after_start(
    oss: FakeOss, sts: FakeSts, oss_endpoint: str, sts_endpoint: str, rrsa_env: dict[str, str]
) -> None:
    r = await rrsa_reader(rrsa_env, oss_endpoint, sts_endpoint)
    Path(rrsa_env["ALIBABA_CLOUD_OIDC_TOKEN_FILE"]).unlink()
    try:
        with pytest.raises(ObjectStoreError, match="OIDCTokenFileUnreadable"):
            await r.fetch("a.bin", 100)
    finally:
        await r.aclose()
    assert sts.calls == 0


# ------------------------------------------------------------------------------------ the store table


def test_from_url_builds_an_oss_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    store = PayloadStore.from_url(f"oss://{BUCKET}/{PREFIX}")
    assert store.kind == "oss" and isinstance(store.reader, OssReader)
    assert store.reader.location.host == f"{BUCKET}.oss-{REGION}.aliyuncs.com"
    store.close()


@pytest.mark.parametrize(
    ("url", "env", "match"),
    [
        (f"oss://{BUCKET}", {k: v for k, v in ENV.items() if k != "SIE_OSS_REGION"}, "SIE_OSS_REGION"),
        (f"oss://{BUCKET}", {**ENV, "SIE_OSS_USE_INTERNAL_ENDPOINT": "yes"}, "SIE_OSS_USE_INTERNAL_ENDPOINT"),
        (f"oss://{BUCKET}", {"SIE_OSS_REGION": REGION}, "OSS credentials"),
        (f"oss://{BUCKET}", {**ENV, "OSS_ACCESS_KEY_ID": "x", "OSS_ACCESS_KEY_SECRET": "y"}, "ambiguous"),
        ("oss://Bad_Bucket", ENV, "bucket"),
        (f"oss://{BUCKET}:8080/p", ENV, "port"),
        (f"oss://ak:sk@{BUCKET}/p", ENV, "credentials"),
    ],
)
def test_unusable_configuration_is_a_startup_error(
    monkeypatch: pytest.MonkeyPatch, url: str, env: dict[str, str], match: str
) -> None:
    for name in (*ENV, "OSS_ACCESS_KEY_ID", "OSS_ACCESS_KEY_SECRET", "SIE_OSS_USE_INTERNAL_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(PayloadStoreConfigError, match=match) as info:
        PayloadStore.from_url(url)
    assert SECRET not in str(info.value)


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


async def test_mixed_batch_against_oss(reader: OssReader, oss: FakeOss) -> None:
    """The gateway's offload layout (wire-protocol §7.3): one bad ref costs only its own item."""
    put(oss, "r2_0.bin", msgpack.packb({"text": "offloaded"}))
    put(oss, "r2_score.bin", msgpack.packb({"query": {"text": "q"}, "items": [{"text": "a"}]}))
    put(oss, "r2_4.bin", b"\x00" * 4096)
    put(oss, "r2_5.bin", b"\xc1")
    items = [
        work(0, payload_ref="r2_0.bin"),
        work(1, payload_ref="../r2_0.bin"),
        work(2, "score", query_payload_ref=f"oss://{BUCKET}/{PREFIX}/r2_score.bin"),
        work(3, "extract", payload_ref="r2_missing.bin"),
        work(4, payload_ref="r2_4.bin"),
        work(5, payload_ref="r2_5.bin"),
    ]
    outcomes = await resolve_items(PayloadStore(reader, "oss"), items, limit=1024)
    assert isinstance(outcomes[0], Resolved) and outcomes[0].item.item == {"text": "offloaded"}
    assert isinstance(outcomes[2], Resolved) and outcomes[2].item.score_items == [{"text": "a"}]
    failures = {o.item.item_index: (o.code, o.reason) for o in outcomes if isinstance(o, ResolveFailure)}
    assert failures == {
        1: ("payload_error", "invalid_ref"),
        3: ("payload_error", "invalid_ref"),
        4: ("PAYLOAD_TOO_LARGE", "too_large"),
        5: ("payload_error", "decode"),
    }

# SPDX-License-Identifier: Apache-2.0
"""Our OSS Signature V4 against the official SDK's signer (`alibabacloud-oss-v2`, a test dependency
only): for the same request, time and credentials, the Authorization header and the string to sign
must be the SDK's, byte for byte."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta, timezone

from alibabacloud_oss_v2.signer.v4 import SignerV4  # type: ignore[import-untyped]
from alibabacloud_oss_v2.types import (  # type: ignore[import-untyped]
    Credentials,
    HttpRequest,
    SigningContext,
)
from hypothesis import given
from hypothesis import strategies as st

from sie_sidecar.payloads import oss_sign
from sie_sidecar.payloads.oss_sign import sign

HOST = "bkt-1.oss-cn-hangzhou.aliyuncs.com"
NOW = datetime(2026, 12, 2, 7, 30, 5, tzinfo=UTC)


def sdk_sign(
    *, host: str, bucket: str, key: str, region: str, key_id: str, secret: str, token: str | None, now: datetime
) -> tuple[str, str, str]:
    """(Authorization, string to sign, canonical request) as the SDK's V4 signer computes them, with host
    signed additionally (the canonical request through the signer's own, private, step)."""
    request = HttpRequest("GET", f"https://{host}/{key}", headers={"host": host})
    ctx = SigningContext(
        product="oss",
        region=region,
        bucket=bucket,
        key=key,
        request=request,
        credentials=Credentials(key_id, secret, token),
        signing_time=now,
        additional_headers={"host"},
    )
    signer = SignerV4()
    signer.sign(ctx)
    canonical = signer._calc_canonical_request(signing_ctx=ctx, additional_headers=["host"])
    return str(request.headers["Authorization"]), str(ctx.string_to_sign), str(canonical)


def ours(
    *, host: str, bucket: str, key: str, region: str, key_id: str, secret: str, token: str | None, now: datetime
) -> oss_sign.Signature:
    return sign(
        method="GET",
        host=host,
        bucket=bucket,
        key=key,
        region=region,
        access_key_id=key_id,
        access_key_secret=secret,
        security_token=token,
        now=now,
    )


def test_authorization_and_string_to_sign_equal_the_sdk() -> None:
    args = {"host": HOST, "bucket": "bkt-1", "key": "gw/r1_0.bin", "region": "cn-hangzhou"}
    for token in (None, "CAIS+token/with==chars"):
        mine = ours(**args, key_id="LTAI5tExample", secret="s3cr3t", token=token, now=NOW)
        authorization, to_sign, canonical = sdk_sign(
            **args, key_id="LTAI5tExample", secret="s3cr3t", token=token, now=NOW
        )
        assert mine.headers["authorization"] == authorization
        assert mine.string_to_sign == to_sign
        assert mine.canonical_request == canonical
        assert mine.string_to_sign.endswith(hashlib.sha256(mine.canonical_request.encode()).hexdigest())


def test_canonical_request_layout() -> None:
    mine = ours(
        host=HOST, bucket="bkt-1", key="p/a.bin", region="cn-hangzhou", key_id="AK", secret="S", token="T", now=NOW
    )
    assert mine.canonical_request == (
        "GET\n/bkt-1/p/a.bin\n\n"
        f"host:{HOST}\nx-oss-content-sha256:UNSIGNED-PAYLOAD\nx-oss-date:20261202T073005Z\nx-oss-security-token:T\n"
        "\nhost\nUNSIGNED-PAYLOAD"
    )
    assert mine.string_to_sign.split("\n")[:3] == [
        "OSS4-HMAC-SHA256",
        "20261202T073005Z",
        oss_sign.scope("20261202", "cn-hangzhou"),
    ]
    assert mine.headers["x-oss-date"] == "20261202T073005Z"
    assert mine.headers["date"] == "Wed, 02 Dec 2026 07:30:05 GMT"
    assert mine.headers["authorization"].startswith(
        "OSS4-HMAC-SHA256 Credential=AK/20261202/cn-hangzhou/oss/aliyun_v4_request,"
    )


def test_a_local_time_is_signed_as_utc() -> None:
    local = NOW.astimezone(timezone(timedelta(hours=8)))
    args = {"host": HOST, "bucket": "bkt-1", "key": "k", "region": "cn-hangzhou", "key_id": "A", "secret": "S"}
    assert ours(**args, token=None, now=local).headers == ours(**args, token=None, now=NOW).headers


def test_the_secret_changes_the_signature_and_appears_nowhere() -> None:
    args = {"host": HOST, "bucket": "bkt-1", "key": "k", "region": "cn-hangzhou", "key_id": "A"}
    one = ours(**args, secret="secret-one", token=None, now=NOW)
    two = ours(**args, secret="secret-two", token=None, now=NOW)
    assert one.headers["authorization"] != two.headers["authorization"]
    for text in (*one.headers.values(), one.canonical_request, one.string_to_sign):
        assert "secret-one" not in text


_key_char = st.sampled_from("abcXYZ019_.-")
keys = st.lists(st.text(_key_char, min_size=1, max_size=12), min_size=1, max_size=3).map("/".join)
regions = st.sampled_from(["cn-hangzhou", "ap-southeast-1", "us-west-1", "cn-shanghai-finance-1", "eu-central-1"])
secrets = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=40)
tokens = st.none() | st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=60)
times = st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2099, 12, 31), timezones=st.just(UTC))


@given(key=keys, region=regions, secret=secrets, token=tokens, now=times)
def test_property_every_request_signs_like_the_sdk(
    key: str, region: str, secret: str, token: str | None, now: datetime
) -> None:
    now = now.replace(microsecond=0)
    host = f"bkt-1.oss-{region}.aliyuncs.com"
    args = {"host": host, "bucket": "bkt-1", "key": key, "region": region, "key_id": "AKID", "secret": secret}
    mine = ours(**args, token=token, now=now)
    expected = sdk_sign(**args, token=token, now=now)
    assert (mine.headers["authorization"], mine.string_to_sign, mine.canonical_request) == expected

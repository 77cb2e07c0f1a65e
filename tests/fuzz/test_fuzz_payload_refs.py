# SPDX-License-Identifier: Apache-2.0
"""Fuzz every payload-store parser (§12): store URLs, refs and keys of s3/gs/oss, the OSS region
settings, and the OSS/STS error and reply parsers. Any input in: a value obeying the rules, or only
the typed error of that parser out."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sie_sidecar.payloads import InvalidPayloadRef, ObjectStoreError, PayloadStoreConfigError, gcs, s3
from sie_sidecar.payloads.object_keys import ObjectRoot, validate_key
from sie_sidecar.payloads.oss import provider_code
from sie_sidecar.payloads.oss_credentials import _parse_sts_reply, sanitised_code
from sie_sidecar.payloads.oss_url import location_from_env, parse_oss_url, validate_oss_key

pytestmark = pytest.mark.fuzz

any_text = st.text(st.characters(exclude_categories=()), max_size=80)
pieces = ["s3://", "gs://", "oss://", "bkt", "b", "-", "_", ".", "..", "/", "//", "\\", "\0", "%2F", "@", ":", "?", "#"]
ref_like = st.lists(st.sampled_from([*pieces, "gw", "x.bin", "A", " "]), max_size=12).map("".join)
texts = st.one_of(any_text, ref_like)
_CODE = re.compile(r"[A-Za-z][A-Za-z0-9.]{0,63}|unknown")
_STS_FAILURE = re.compile(r"OSS credentials: STS AssumeRoleWithOIDC failed \(HTTP \d+, [A-Za-z][A-Za-z0-9.]*\)")


@given(url=texts)
def test_fuzz_store_urls(url: str) -> None:
    for parse in (s3.parse_store_url, gcs.parse_store_url, parse_oss_url):
        try:
            bucket, prefix = parse(url)
        except PayloadStoreConfigError:
            continue
        assert bucket and "/" not in bucket
        assert prefix == prefix.strip("/")
        if prefix:
            validate_key(prefix)  # never raises for an accepted prefix


@given(ref=texts)
def test_fuzz_refs_and_keys(ref: str) -> None:
    for root in (ObjectRoot("s3://", "bkt", "gw"), ObjectRoot("gs://", "bkt", ""), ObjectRoot("oss://", "bkt", "gw")):
        try:
            path = root.object_path(ref)
        except InvalidPayloadRef:
            continue
        assert path.startswith("gw/") or not root.prefix
        assert validate_key(path) == path
    try:
        key = validate_oss_key(ref)
    except InvalidPayloadRef:
        return
    assert re.fullmatch(r"[A-Za-z0-9_.-]+", key) and ".." not in key


@given(ref=texts, region=texts, internal=texts)
def test_fuzz_oss_location(ref: str, region: str, internal: str) -> None:
    env = {"SIE_OSS_REGION": region, "SIE_OSS_USE_INTERNAL_ENDPOINT": internal}
    try:
        loc = location_from_env("oss://bkt/gw", env)
    except PayloadStoreConfigError:
        return
    assert re.fullmatch(r"bkt\.oss-[a-z0-9-]+(-internal)?\.aliyuncs\.com", loc.host)
    try:
        name = loc.object_name(ref)
    except InvalidPayloadRef:
        return
    assert name.startswith("gw/") and "/" not in name[3:]


xml_like = st.lists(st.sampled_from([b"<Code>", b"</Code>", b"NoSuchKey", b"<", b" ", b"\xff", b"a.b"]), max_size=10)


@given(body=st.one_of(st.binary(max_size=200), xml_like.map(b"".join)))
def test_fuzz_provider_codes(body: bytes) -> None:
    assert _CODE.fullmatch(provider_code(body))
    assert _CODE.fullmatch(sanitised_code(body.decode("latin-1")))


json_like = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(["Credentials", "Code", "AccessKeyId", "AccessKeySecret", "SecurityToken", "Expiration"]),
            inner,
            max_size=6,
        )
    ),
    max_leaves=12,
)


@given(status=st.sampled_from([200, 400, 403, 429, 500, 503]), doc=json_like, raw=st.binary(max_size=64))
def test_fuzz_sts_replies(status: int, doc: object, raw: bytes) -> None:
    for body in (json.dumps(doc).encode(), raw):
        try:
            creds = _parse_sts_reply(status, body)
        except ObjectStoreError as exc:
            assert _STS_FAILURE.fullmatch(str(exc))
            continue
        assert status == 200 and creds.access_key_id and creds.access_key_secret

# SPDX-License-Identifier: Apache-2.0
"""§12 OSS rules for the store URL, object keys, region and endpoint flavour, with examples and
Hypothesis properties (any text in: only the typed error out, and what is accepted obeys the rules)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sie_sidecar.payloads import InvalidPayloadRef, PayloadStoreConfigError
from sie_sidecar.payloads.oss_url import (
    internal_from_env,
    location_from_env,
    parse_oss_url,
    region_from_env,
    validate_oss_key,
)

ENV = {"SIE_OSS_REGION": "cn-hangzhou"}
_BUCKET = re.compile(r"[a-z0-9][a-z0-9-]{1,61}[a-z0-9]")
_SEGMENT = re.compile(r"[A-Za-z0-9_.-]+")


@pytest.mark.parametrize(
    ("url", "parsed"),
    [
        ("oss://abc", ("abc", "")),
        ("oss://abc/", ("abc", "")),
        ("oss://my-bucket-01/gw/off_load.v1/", ("my-bucket-01", "gw/off_load.v1")),
        ("oss://" + "a" * 63, ("a" * 63, "")),
    ],
)
def test_good_urls(url: str, parsed: tuple[str, str]) -> None:
    assert parse_oss_url(url) == parsed


@pytest.mark.parametrize(
    "url",
    [
        "oss://",
        "oss://ab",  # too short
        "oss://" + "a" * 64,  # too long
        "oss://-abc",
        "oss://abc-",
        "oss://ABC",
        "oss://a_b",
        "oss://a.b",
        "oss://user:pw@bucket",
        "oss://bucket@x",
        "oss://bucket:443",
        "oss://bucket/p?x=1",
        "oss://bucket/p#frag",
        "oss://bucket/p%2Fq",
        "oss://bucket/p//q",
        "oss://bucket/p/../q",
        "oss://bucket/..",
        "oss://bucket/./p",
        "oss://bucket/a..b",
        "oss://bucket/p q",
        "oss://bucket/p\\q",
        "oss://bucket/é",
        "s3://bucket",
        "OSS://bucket",
    ],
)
def test_bad_urls_are_config_errors(url: str) -> None:
    with pytest.raises(PayloadStoreConfigError):
        parse_oss_url(url)


def test_keys() -> None:
    assert validate_oss_key("r1_0.bin") == "r1_0.bin"
    assert validate_oss_key("A-z.9_") == "A-z.9_"
    for bad in ("", ".", "..", "a..b", "a/b", "/a", "a\\b", "a b", "a%2F", "a\0", "é", "a?b"):
        with pytest.raises(InvalidPayloadRef):
            validate_oss_key(bad)


def test_refs_against_a_location() -> None:
    loc = location_from_env("oss://bkt/gw/p", ENV)
    assert loc.host == "bkt.oss-cn-hangzhou.aliyuncs.com"
    assert loc.object_name("r1.bin") == "gw/p/r1.bin"
    assert loc.object_name("oss://bkt/gw/p/r1.bin") == "gw/p/r1.bin"
    for bad in ("oss://bkt/gw/r1.bin", "oss://other/gw/p/r1.bin", "oss://bkt/gw/p/sub/r1.bin", "s3://bkt/gw/p/r1.bin"):
        with pytest.raises(InvalidPayloadRef):
            loc.object_name(bad)
    assert location_from_env("oss://bkt", ENV).object_name("x") == "x"


def test_region_and_internal_endpoint() -> None:
    assert location_from_env("oss://bkt", {**ENV, "SIE_OSS_USE_INTERNAL_ENDPOINT": "true"}).host == (
        "bkt.oss-cn-hangzhou-internal.aliyuncs.com"
    )
    assert region_from_env({"SIE_OSS_REGION": " ap-southeast-1 "}) == "ap-southeast-1"
    for bad in ({}, {"SIE_OSS_REGION": ""}, {"SIE_OSS_REGION": "oss-cn-hangzhou"}, {"SIE_OSS_REGION": "cn_hangzhou"}):
        with pytest.raises(PayloadStoreConfigError, match="SIE_OSS_REGION"):
            region_from_env(bad)
    for raw, value in (("true", True), ("1", True), ("false", False), ("0", False), ("", False)):
        assert internal_from_env({"SIE_OSS_USE_INTERNAL_ENDPOINT": raw}) is value
    assert internal_from_env({}) is False
    for raw in ("yes", "TRUE", "on", " 1", "2"):
        with pytest.raises(PayloadStoreConfigError, match="SIE_OSS_USE_INTERNAL_ENDPOINT"):
            internal_from_env({"SIE_OSS_USE_INTERNAL_ENDPOINT": raw})


# Any code point, plus strings assembled from the characters the parsers care about.
any_text = st.text(st.characters(exclude_categories=()), max_size=80)
url_like = st.lists(
    st.sampled_from(["oss://", "bkt", "a", "-", "/", "//", ".", "..", "_", "%", "@", ":", "?", "#", "A", "9", " "]),
    max_size=14,
).map("".join)
texts = st.one_of(any_text, url_like, url_like.map(lambda s: "oss://" + s))


@given(url=texts)
def test_property_url_parser_accepts_only_what_the_rules_allow(url: str) -> None:
    try:
        bucket, prefix = parse_oss_url(url)
    except PayloadStoreConfigError:
        return
    assert _BUCKET.fullmatch(bucket)
    assert url.startswith("oss://") and not any(c in url[len("oss://") :] for c in "%@:?#")
    for segment in prefix.split("/") if prefix else ():
        assert _SEGMENT.fullmatch(segment) and ".." not in segment and segment != "."


@given(ref=texts)
def test_property_refs_map_into_the_prefix_or_are_invalid(ref: str) -> None:
    loc = location_from_env("oss://bkt/gw", ENV)
    try:
        name = loc.object_name(ref)
    except InvalidPayloadRef:
        return
    assert name.startswith("gw/")
    key = name[3:]
    assert _SEGMENT.fullmatch(key) and ".." not in key and key != "."


@given(region=texts, internal=texts)
def test_property_region_settings_fail_only_as_config_errors(region: str, internal: str) -> None:
    env = {"SIE_OSS_REGION": region, "SIE_OSS_USE_INTERNAL_ENDPOINT": internal}
    try:
        loc = location_from_env("oss://bkt", env)
    except PayloadStoreConfigError:
        return
    assert re.fullmatch(r"bkt\.oss-[a-z0-9-]+\.aliyuncs\.com", loc.host)

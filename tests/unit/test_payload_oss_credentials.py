# SPDX-License-Identifier: Apache-2.0
"""Which OSS credential source the environment names (§12): exactly one of the Alibaba pair, the OSS
pair and the RRSA triple; everything else is a start-up error that names variables, never values."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sie_sidecar.payloads import ObjectStoreError, PayloadStoreConfigError
from sie_sidecar.payloads.oss_credentials import (
    ALIBABA_PAIR,
    OSS_PAIR,
    OssCredentials,
    RrsaCredentials,
    StaticCredentials,
    StsError,
    _parse_sts_reply,
    credentials_from_env,
    sanitised_code,
    sts_endpoint_for,
)

ROLE = "acs:ram::1234567890123456:role/payload-reader"
PROVIDER = "acs:ram::1234567890123456:oidc-provider/ack-rrsa-c0ffee"
ALI = {"ALIBABA_CLOUD_ACCESS_KEY_ID": "ali-id", "ALIBABA_CLOUD_ACCESS_KEY_SECRET": "ali-secret-value"}
OSS = {"OSS_ACCESS_KEY_ID": "oss-id", "OSS_ACCESS_KEY_SECRET": "oss-secret-value"}
SECRETS = ("ali-secret-value", "oss-secret-value", "tok-value", "ali-id", "oss-id")


@pytest.fixture
def rrsa(tmp_path: Path) -> dict[str, str]:
    token = tmp_path / "token"
    token.write_text("oidc-token-value\n")
    return {
        "ALIBABA_CLOUD_ROLE_ARN": ROLE,
        "ALIBABA_CLOUD_OIDC_PROVIDER_ARN": PROVIDER,
        "ALIBABA_CLOUD_OIDC_TOKEN_FILE": str(token),
    }


def source(env: dict[str, str]) -> object:
    return credentials_from_env(env, "cn-hangzhou", False)


def refused(env: dict[str, str], match: str) -> str:
    with pytest.raises(PayloadStoreConfigError, match=match) as info:
        source(env)
    text = str(info.value)
    for secret in SECRETS:
        assert secret not in text
    return text


def test_alibaba_pair_with_and_without_token() -> None:
    s = source(ALI)
    assert isinstance(s, StaticCredentials) and s.source == "alibaba"
    assert (s.credentials.access_key_id, s.credentials.access_key_secret) == ("ali-id", "ali-secret-value")
    assert s.credentials.security_token is None
    s = source({**ALI, "ALIBABA_CLOUD_SECURITY_TOKEN": "tok-value"})
    assert isinstance(s, StaticCredentials) and s.credentials.security_token == "tok-value"


def test_oss_pair_with_and_without_token() -> None:
    s = source(OSS)
    assert isinstance(s, StaticCredentials) and s.source == "oss"
    s = source({**OSS, "OSS_SESSION_TOKEN": "tok-value"})
    assert isinstance(s, StaticCredentials) and s.credentials.security_token == "tok-value"


def test_repr_hides_keys() -> None:
    s = source({**ALI, "ALIBABA_CLOUD_SECURITY_TOKEN": "tok-value"})
    for secret in SECRETS:
        assert secret not in repr(s)


def test_rrsa_triple(rrsa: dict[str, str]) -> None:
    s = source(rrsa)
    assert isinstance(s, RrsaCredentials)
    assert s.sts_endpoint == "https://sts.cn-hangzhou.aliyuncs.com/" and s.session_name == "sie-sidecar"
    s = credentials_from_env({**rrsa, "ALIBABA_CLOUD_ROLE_SESSION_NAME": "pod-a"}, "cn-hangzhou", True)
    assert isinstance(s, RrsaCredentials)
    assert s.sts_endpoint == "https://sts-vpc.cn-hangzhou.aliyuncs.com/" and s.session_name == "pod-a"
    assert sts_endpoint_for("ap-southeast-1", False) == "https://sts.ap-southeast-1.aliyuncs.com/"


def test_no_source_is_refused() -> None:
    refused({}, "OSS credentials")
    refused({"ALIBABA_CLOUD_ACCESS_KEY_ID": " "}, "OSS credentials")  # blank counts as unset


@pytest.mark.parametrize(
    "env",
    [
        {"ALIBABA_CLOUD_ACCESS_KEY_ID": "ali-id"},
        {"ALIBABA_CLOUD_ACCESS_KEY_SECRET": "ali-secret-value"},
        {"ALIBABA_CLOUD_SECURITY_TOKEN": "tok-value"},
        {"ALIBABA_CLOUD_ACCESS_KEY_ID": "ali-id", "ALIBABA_CLOUD_SECURITY_TOKEN": "tok-value"},
        {"OSS_ACCESS_KEY_ID": "oss-id"},
        {"OSS_ACCESS_KEY_SECRET": "oss-secret-value"},
        {"OSS_SESSION_TOKEN": "tok-value"},
    ],
)
def test_half_pairs_and_lone_tokens_are_refused(env: dict[str, str]) -> None:
    refused(env, "must be set together")


@pytest.mark.parametrize(
    "env",
    [
        {**ALI, **OSS},
        {**ALI, "OSS_SESSION_TOKEN": "tok-value"},  # a token of the other family is a second source
        {**OSS, "ALIBABA_CLOUD_SECURITY_TOKEN": "tok-value"},
        {**OSS, "ALIBABA_CLOUD_ROLE_ARN": ROLE},
    ],
)
def test_two_sources_are_ambiguous(env: dict[str, str]) -> None:
    text = refused(env, "ambiguous")
    assert "OSS_ACCESS_KEY_ID" in text or "OSS_SESSION_TOKEN" in text


def test_static_pair_and_rrsa_together_are_ambiguous(rrsa: dict[str, str]) -> None:
    refused({**ALI, **rrsa}, "ambiguous")


@pytest.mark.parametrize(
    "missing", ["ALIBABA_CLOUD_ROLE_ARN", "ALIBABA_CLOUD_OIDC_PROVIDER_ARN", "ALIBABA_CLOUD_OIDC_TOKEN_FILE"]
)
def test_partial_rrsa_is_refused(rrsa: dict[str, str], missing: str) -> None:
    env = dict(rrsa)
    del env[missing]
    assert missing in refused(env, "RRSA needs")


def test_bad_rrsa_values_are_refused(rrsa: dict[str, str], tmp_path: Path) -> None:
    refused({**rrsa, "ALIBABA_CLOUD_ROLE_ARN": PROVIDER}, "ALIBABA_CLOUD_ROLE_ARN")
    refused({**rrsa, "ALIBABA_CLOUD_OIDC_PROVIDER_ARN": ROLE}, "ALIBABA_CLOUD_OIDC_PROVIDER_ARN")
    refused({**rrsa, "ALIBABA_CLOUD_OIDC_TOKEN_FILE": str(tmp_path / "absent")}, "ALIBABA_CLOUD_OIDC_TOKEN_FILE")
    refused({**rrsa, "ALIBABA_CLOUD_ROLE_SESSION_NAME": "bad name"}, "ALIBABA_CLOUD_ROLE_SESSION_NAME")


def test_custom_sts_endpoint_is_refused(rrsa: dict[str, str]) -> None:
    refused({**rrsa, "ALIBABA_CLOUD_STS_ENDPOINT": "sts.example.com"}, "custom STS endpoint")
    refused({**ALI, "ALIBABA_CLOUD_STS_ENDPOINT": "sts.example.com"}, "custom STS endpoint")


def test_sts_replies() -> None:
    ok = b'{"Credentials": {"AccessKeyId": "STS.id", "AccessKeySecret": "sk", "SecurityToken": "tk",'
    ok += b' "Expiration": "2099-01-01T00:00:00Z"}, "RequestId": "r"}'
    creds = _parse_sts_reply(200, ok)
    assert creds == OssCredentials("STS.id", "sk", "tk", 4070908800.0)
    with pytest.raises(StsError) as info:
        _parse_sts_reply(400, b'{"Code": "InvalidParameter.OIDCToken", "Message": "token oidc-token-value bad"}')
    assert info.value.code == "InvalidParameter.OIDCToken" and not info.value.retryable
    assert "oidc-token-value" not in str(info.value) and isinstance(info.value, ObjectStoreError)
    with pytest.raises(StsError) as info:
        _parse_sts_reply(503, b"<html>busy</html>")
    assert info.value.code == "unknown" and info.value.retryable
    for bad in (b"{}", b'{"Credentials": {"AccessKeyId": "x"}}', b"[1]", b"\xff"):
        with pytest.raises(StsError, match="MalformedReply"):
            _parse_sts_reply(200, bad)
    odd = _parse_sts_reply(200, ok.replace(b"2099-01-01T00:00:00Z", b"soon"))
    assert odd.expires_at is not None and odd.expires_at <= time.time() + 1  # refreshed at the next fetch


def test_sanitised_code() -> None:
    assert sanitised_code("NoSuchKey") == "NoSuchKey"
    assert sanitised_code("InvalidParameter.OIDCToken") == "InvalidParameter.OIDCToken"
    for bad in ("", "has space", "x" * 65, "<b>", "1abc", None, 3, "key=secret"):
        assert sanitised_code(bad) == "unknown"


names = st.sampled_from(
    [
        "ALIBABA_CLOUD_ACCESS_KEY_ID",
        "ALIBABA_CLOUD_ACCESS_KEY_SECRET",
        "ALIBABA_CLOUD_SECURITY_TOKEN",
        "OSS_ACCESS_KEY_ID",
        "OSS_ACCESS_KEY_SECRET",
        "OSS_SESSION_TOKEN",
        "ALIBABA_CLOUD_ROLE_ARN",
        "ALIBABA_CLOUD_OIDC_PROVIDER_ARN",
        "ALIBABA_CLOUD_OIDC_TOKEN_FILE",
        "ALIBABA_CLOUD_STS_ENDPOINT",
    ]
)


@given(env=st.dictionaries(names, st.sampled_from(["", " ", "v-secret-value", ROLE, PROVIDER])))
def test_property_a_source_is_chosen_only_when_exactly_one_is_complete(env: dict[str, str]) -> None:
    try:
        chosen = credentials_from_env(env, "cn-hangzhou", False)
    except PayloadStoreConfigError as exc:
        assert "v-secret-value" not in str(exc)
        return
    set_names = {k for k, v in env.items() if v.strip()}
    assert isinstance(chosen, StaticCredentials)  # no token file exists, so RRSA is never complete here
    family = {"alibaba": ALIBABA_PAIR, "oss": OSS_PAIR}[chosen.source]
    assert set(family[:2]) <= set_names <= set(family)

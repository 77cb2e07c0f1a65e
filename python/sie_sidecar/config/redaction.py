# SPDX-License-Identifier: Apache-2.0
"""Secrets out of text: URL userinfo, NKey seeds and given secret values become `<redacted>`.

Secrets (`SIE_GATEWAY_API_KEY`, `SIE_ADMIN_TOKEN`, `SIE_CONFIG_SERVICE_TOKEN`, `SIE_NATS_PASSWORD`,
`SIE_NATS_TOKEN`, NKey seeds, userinfo in URLs) never appear in `repr()`, `redacted()`, `--help` or
error messages. These helpers are what the settings, the reader's refusal lines and the NATS
connection use to keep it so; they import nothing of the package.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

REDACTED = "<redacted>"

#: An NKey seed as it appears in text (`S` + the key type + 56 base32 characters): redacted wherever
#: it appears, whatever variable or file it came from.
NKEY_SEED_RE = re.compile(r"S[ACNOPUX][A-Z2-7]{56}")
_USERINFO_RE = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^\s/?#@,]*)@")


def redact_url_userinfo(url: str) -> str:
    """Replace `user:pass@` (or a bare `token@`) in each comma-separated URL with `<redacted>@`."""
    parts = []
    for part in url.split(","):
        scheme, sep, rest = part.partition("://")
        if not sep:
            scheme, rest = "", part
        end = len(rest)
        for stop in "/?#":
            index = rest.find(stop)
            if index != -1:
                end = min(end, index)
        at = rest.rfind("@", 0, end)
        if at != -1:
            rest = f"{REDACTED}@{rest[at + 1 :]}"
        parts.append(f"{scheme}{sep}{rest}")
    return ",".join(parts)


def strip_url_userinfo(url: str) -> tuple[str, bool]:
    """Each comma-separated URL without its `user:pass@` (or `token@`), and whether any had one:
    embedded userinfo is not used to authenticate (sidecar-behaviour §1.2, newer than v0.7.1)."""
    redacted = redact_url_userinfo(url)
    return redacted.replace(f"{REDACTED}@", ""), redacted != url


def redact_text(text: str, secrets: Sequence[str] = ()) -> str:
    """Free text with `scheme://userinfo@` replaced by `scheme://<redacted>@`, each secret and anything
    shaped like an NKey seed by `<redacted>`."""
    out = _USERINFO_RE.sub(lambda m: f"{m['scheme']}{REDACTED}@", text)
    out = NKEY_SEED_RE.sub(REDACTED, out)
    for secret in sorted(set(secrets), key=len, reverse=True):
        if secret:
            out = out.replace(secret, REDACTED)
    return out


def userinfo_parts(url: object) -> list[str]:
    """The `user:password` userinfo of each URL in a comma list, whole and split (for redaction)."""
    if not isinstance(url, str):
        return []
    parts: list[str] = []
    for entry in url.split(","):
        _, sep, rest = entry.partition("://")
        rest = rest if sep else entry
        end = min((i for i in (rest.find(c) for c in "/?#") if i != -1), default=len(rest))
        at = rest.rfind("@", 0, end)
        if at > 0:
            userinfo = rest[:at]
            parts.append(userinfo)
            parts.extend(p for p in userinfo.split(":", 1)[1:] if p)
    return parts

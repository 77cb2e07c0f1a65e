# SPDX-License-Identifier: Apache-2.0
"""The NATS logins checked at start-up: creds files, NKey seed files and client-certificate TLS.

Each login file is read here (bounded), its contents checked (the creds' JWT and seed agreeing, the
seed a user seed, the certificate and key loading), so that a mistake stops start-up with exit code
2 and one line naming the variable instead of a retry loop against the server. Seeds are read only
to be checked and are never kept or shown.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import time
from typing import TYPE_CHECKING, Any, Final

from ..errors import ConfigError

if TYPE_CHECKING:
    import ssl

#: The schemes nats-py connects with; a missing port is 4222 for nats:// and tls:// (every NATS
#: client's default) and the URL standard's 80 / 443 for ws:// / wss://.
NATS_URL_SCHEMES: Final = ("nats", "tls", "ws", "wss")
NATS_WEBSOCKET_SCHEMES: Final = ("ws", "wss")
#: The most of a creds, seed, certificate or key file read at start-up: a mistaken path (a log, a
#: device) must not be read whole. Real ones are a few KiB.
MAX_LOGIN_FILE_BYTES: Final = 1 << 20
#: The files' seeds by the two letters that start them (the key's type), for the refusal line.
_SEED_KINDS: Final = {"SA": "an account", "SO": "an operator", "SN": "a server", "SC": "a cluster", "SX": "a curve"}
_JWT_RE = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+")
_CREDS_JWT = "BEGIN NATS USER JWT"
_CREDS_SEED = "BEGIN USER NKEY SEED"


def read_login_file(env: str, path: str) -> bytes:
    """The bytes of the file `env` names, or a ConfigError naming `env`: missing, unreadable, not a
    regular file (a FIFO would block the start), or larger than any credential."""
    try:
        if not os.path.isfile(path):
            problem = "no such file" if not os.path.lexists(path) else "not a regular file"
            raise ConfigError(f"{env}: cannot read {path}: {problem}")
        with open(path, "rb") as f:
            data = f.read(MAX_LOGIN_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{env}: cannot read {path}: {exc.strerror or type(exc).__name__}") from None
    if len(data) > MAX_LOGIN_FILE_BYTES:
        raise ConfigError(f"{env}: {path} is larger than {MAX_LOGIN_FILE_BYTES >> 20} MiB: not a credential file")
    return data


def _line_after(text: str, marker: str) -> str | None:
    """The line after the first one holding `marker`, as nats-py reads a creds file (only the
    newline dropped: a CR or a space would be sent as part of the JWT or the seed)."""
    lines = text.split("\n")
    for index, line in enumerate(lines):
        if marker in line:
            return lines[index + 1] if index + 1 < len(lines) else ""
    return None


def user_seed_public_key(env: str, what: str, seed: str) -> str:
    """The public key (`U...`) of a user NKey seed, or a ConfigError naming `env` that never shows
    the seed: not a user seed, a wrong length or checksum (a typo would otherwise sign with a key the
    server does not know, and read as a wrong password)."""
    if not seed.startswith("SU"):
        kind = _SEED_KINDS.get(seed[:2])
        raise ConfigError(f"{env}: {what} is not a user NKey seed (SU...)" + (f": it is {kind} seed" if kind else ""))
    try:
        import nkeys  # type: ignore[import-untyped]  # nats-py[nkeys]; no type hints
    except ImportError:
        raise ConfigError(f"{env}: the nkeys package is missing (pip install 'nats-py[nkeys]')") from None
    try:
        decoded = base64.b32decode(seed + "=" * (-len(seed) % 8))
        body, checksum = decoded[:-2], decoded[-2:]
        if len(body) != 34 or int(nkeys.crc16(bytearray(body))).to_bytes(2, "little") != checksum:
            raise ValueError("length or checksum")
        pair = nkeys.from_seed(bytearray(seed.encode()))
        public = str(pair.public_key.decode())
        pair.wipe()
    except (binascii.Error, ValueError, TypeError, nkeys.NkeysError):
        raise ConfigError(f"{env}: {what} is not a valid NKey seed (wrong length or checksum)") from None
    return public


def _jwt_claims(token: str) -> dict[str, Any] | None:
    """The claims of a JWT (unverified: the server verifies it), or None when it is not one."""
    if not _JWT_RE.fullmatch(token):
        return None
    payload = token.split(".")[1]
    try:
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (binascii.Error, ValueError):
        return None
    return claims if isinstance(claims, dict) else None


def check_creds_file(env: str, path: str, now: float | None = None) -> None:
    """A creds file as `nsc` writes it: a user JWT (not expired) and the user's NKey seed, the seed
    being the key the JWT names (its `sub`). ConfigError naming `env` otherwise, never the seed."""
    text = read_login_file(env, path).decode("utf-8", "replace")
    jwt = _line_after(text, _CREDS_JWT)
    if jwt is None:
        raise ConfigError(f"{env}: {path} holds no user JWT (-----{_CREDS_JWT}-----): not a creds file")
    if "\r" in text:
        raise ConfigError(f"{env}: {path} has CRLF line endings, which nats-py does not read: convert it to LF")
    claims = _jwt_claims(jwt)
    if claims is None:
        raise ConfigError(f"{env}: the user JWT in {path} is malformed")
    nats = claims.get("nats")
    kind = nats.get("type") if isinstance(nats, dict) else None
    if kind != "user":
        raise ConfigError(f"{env}: the JWT in {path} is not a user JWT (type {kind!r})")
    expires = claims.get("exp")
    if isinstance(expires, int | float) and 0 < expires <= (time.time() if now is None else now):  # 0: never
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(expires))
        raise ConfigError(f"{env}: the user JWT in {path} expired at {stamp}")
    seed = _line_after(text, _CREDS_SEED)
    if seed is None:
        raise ConfigError(f"{env}: {path} holds no user NKey seed (-----{_CREDS_SEED}-----)")
    public = user_seed_public_key(env, f"the seed in {path}", seed)
    if claims.get("sub") != public:
        raise ConfigError(f"{env}: the seed in {path} is not the key of the JWT's user (its sub)")


def check_nkey_seed_file(env: str, path: str) -> None:
    """A file holding one user NKey seed (`SU...`), surrounding whitespace allowed (nats-py strips it)."""
    seed = read_login_file(env, path).decode("utf-8", "replace").strip()
    if not seed:
        raise ConfigError(f"{env}: {path} is empty")
    user_seed_public_key(env, path, seed)


def _ssl_reason(exc: BaseException) -> str:
    """An OpenSSL error as one short line (`[SSL] PEM lib (_ssl.c:3900)` → `PEM lib`)."""
    reason = getattr(exc, "reason", None) or getattr(exc, "strerror", None) or str(exc)
    return " ".join(str(reason).split()) or type(exc).__name__


def nats_tls_context(cert: str | None, key: str | None, ca: str | None) -> ssl.SSLContext:
    """The client context for NATS: verifies the server against `ca` (`SIE_NATS_TLS_CA_FILE`) or, without
    one, the system store (and `SSL_CERT_FILE`); presents `cert` + `key` when given. Each file is
    loaded here, so a mistake is a ConfigError naming its variable; an encrypted key is refused
    rather than prompted for on the terminal."""
    import ssl

    if (cert is None) != (key is None):
        raise ConfigError("SIE_NATS_TLS_CERT_FILE and SIE_NATS_TLS_KEY_FILE must be set together")
    for env, path in (("SIE_NATS_TLS_CA_FILE", ca), ("SIE_NATS_TLS_CERT_FILE", cert), ("SIE_NATS_TLS_KEY_FILE", key)):
        if path is not None:
            read_login_file(env, path)
    try:
        context = ssl.create_default_context(cafile=ca)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(
            f"SIE_NATS_TLS_CA_FILE: {ca} holds no CA certificate that loads: {_ssl_reason(exc)}"
        ) from None
    if cert is None or key is None:
        return context
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=cert)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(
            f"SIE_NATS_TLS_CERT_FILE: {cert} holds no certificate that loads: {_ssl_reason(exc)}"
        ) from None
    asked: list[bool] = []

    def no_passphrase() -> bytes:
        asked.append(True)
        return b""

    try:
        context.load_cert_chain(cert, key, password=no_passphrase)
    except (ssl.SSLError, OSError) as exc:
        if asked:
            problem = f"{key} is encrypted: give the key without a passphrase (the file is the secret)"
        else:
            problem = f"{key} does not load as the key of {cert}: {_ssl_reason(exc)}"
        raise ConfigError(f"SIE_NATS_TLS_KEY_FILE: {problem}") from None
    return context

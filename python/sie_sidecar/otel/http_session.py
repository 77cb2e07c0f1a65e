# SPDX-License-Identifier: Apache-2.0
"""The requests session the SDK's OTLP/HTTP exporters post through: one kept-alive `http.client`
connection behind requests' interface.

The SDK's HTTP exporters take a `requests.Session` (their public `session` argument) and call only
its `request(method=, url=, headers=, data=, timeout=, allow_redirects=False)`, reading the
response's `status_code`, `reason`, `content`/`text` and `headers`, and retrying on requests'
connection and timeout exceptions. A post through requests' whole stack (request preparation,
environment merging, adapters, urllib3's pool) cost ~0.5 ms of CPU here against ~0.08 ms for the
same post on `http.client`; the export threads beside the serving loop make one or two a second,
and requests was two thirds of a metrics export (docs/benchmarks.md, "Telemetry on: the export
threads"). This session keeps that interface and those exception types and skips the rest.

It serves only endpoints requests' extras would not change: `light_session` returns None (the
exporter then keeps requests' own session) when the environment names a proxy for the endpoint or
`.netrc` holds credentials for its host. Certificates as the sidecar's `OtlpSession` had them: the
configured CA file wins; without one, `REQUESTS_CA_BUNDLE` / `CURL_CA_BUNDLE`, else requests' bundle.
"""

from __future__ import annotations

import http.client
import os
import ssl
from typing import Any
from urllib.parse import SplitResult, urlsplit

import requests
from requests.structures import CaseInsensitiveDict
from requests.utils import DEFAULT_CA_BUNDLE_PATH, default_user_agent, get_environ_proxies, get_netrc_auth


class LightSession(requests.Session):
    """`requests.Session.request` for an OTLP exporter's posts, on one kept-alive connection
    (reopened after an error or a response that closes it). One thread uses it at a time: the
    exporter's."""

    def __init__(self) -> None:
        super().__init__()
        self._connection: http.client.HTTPConnection | None = None
        self._origin: tuple[str, str, int] | None = None

    def request(self, method: str | bytes, url: str | bytes, *args: Any, **kwargs: Any) -> requests.Response:
        if args or kwargs.get("params") or kwargs.get("files") or kwargs.get("json") is not None:
            return super().request(method, url, *args, **kwargs)  # type: ignore[arg-type]  # not an exporter's call
        method = method.decode() if isinstance(method, bytes) else method
        url = url.decode() if isinstance(url, bytes) else url
        parts = urlsplit(url)
        headers = CaseInsensitiveDict({"User-Agent": default_user_agent(), "Accept": "*/*"})
        headers.update(kwargs.get("headers") or {})  # one of each name: the caller's wins, as in requests
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        timeout = _seconds(kwargs.get("timeout"))
        try:
            connection = self._connect(parts, timeout)
            connection.request(method, target, body=kwargs.get("data"), headers=dict(headers))
            raw = connection.getresponse()
            content = raw.read()
        except TimeoutError as exc:
            self._drop()
            raise requests.exceptions.ReadTimeout(str(exc) or "timed out") from exc
        except ssl.SSLError as exc:
            self._drop()
            raise requests.exceptions.SSLError(str(exc)) from exc
        except (OSError, http.client.HTTPException) as exc:
            self._drop()
            raise requests.exceptions.ConnectionError(str(exc) or type(exc).__name__) from exc
        if raw.will_close:
            self._drop()
        response = requests.Response()
        response.status_code = raw.status
        response.reason = raw.reason
        response._content = content  # how requests itself fills a response's body
        response.headers = CaseInsensitiveDict(raw.getheaders())
        response.url = url
        response.encoding = "utf-8"
        return response

    def _connect(self, parts: SplitResult, timeout: float | None) -> http.client.HTTPConnection:
        scheme = parts.scheme.lower()
        host = parts.hostname or ""
        port = parts.port or (443 if scheme == "https" else 80)
        origin = (scheme, host, port)
        connection = self._connection
        if connection is None or origin != self._origin:
            self._drop()
            if scheme == "https":
                connection = http.client.HTTPSConnection(host, port, timeout=timeout, context=self._tls())
            else:
                connection = http.client.HTTPConnection(host, port, timeout=timeout)
            self._connection, self._origin = connection, origin
        else:
            connection.timeout = timeout
            if connection.sock is not None:
                connection.sock.settimeout(timeout)
        return connection

    def _tls(self) -> ssl.SSLContext:
        """`verify` and `cert` as the SDK's transport set them on the session."""
        verify: Any = self.verify
        if verify is False:
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        else:
            bundle = verify if isinstance(verify, str) else default_ca_bundle()
            if os.path.isdir(bundle):
                context = ssl.create_default_context(capath=bundle)
            else:
                context = ssl.create_default_context(cafile=bundle)
        cert: Any = self.cert
        if isinstance(cert, tuple):
            context.load_cert_chain(cert[0], cert[1])
        elif isinstance(cert, str):
            context.load_cert_chain(cert)
        return context

    def _drop(self) -> None:
        if self._connection is not None:
            self._connection.close()
        self._connection, self._origin = None, None

    def close(self) -> None:
        self._drop()
        super().close()


def default_ca_bundle() -> str:
    """The CA bundle requests would verify with when none is configured."""
    return os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE") or DEFAULT_CA_BUNDLE_PATH


def light_session(endpoint: str) -> LightSession | None:
    """A `LightSession` for `endpoint`, or None where requests' own session must serve it (a proxy
    from the environment applies, or `.netrc` has credentials for the host)."""
    if get_environ_proxies(endpoint) or get_netrc_auth(endpoint):
        return None
    return LightSession()


def _seconds(timeout: Any) -> float | None:
    if isinstance(timeout, tuple):  # requests' (connect, read): the longer bounds both here
        values = [t for t in timeout if t is not None]
        return max(values) if values else None
    return None if timeout is None else float(timeout)


__all__ = ["LightSession", "default_ca_bundle", "light_session"]

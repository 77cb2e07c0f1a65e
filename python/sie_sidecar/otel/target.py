# SPDX-License-Identifier: Apache-2.0
"""Where and how one signal is exported: the settings' resolution of the standard
`OTEL_EXPORTER_OTLP_[SIGNAL_]*` variables, as plain values (otel/ imports nothing of the settings)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

#: The protocols the SDK's exporters speak (`http/json` has no Python exporter).
PROTOCOLS: Final = ("grpc", "http/protobuf")


@dataclass(frozen=True, slots=True)
class Target:
    """One signal's OTLP exporter settings, already resolved (signal-specific variables first)."""

    endpoint: str
    protocol: str = "grpc"
    #: `key=value,...`, the `_HEADERS` text (API keys: never logged).
    headers: str = field(default="", repr=False)
    #: `gzip` or `none`.
    compression: str = "none"
    #: PEM files: the CA bundle that verifies the server, and the client pair for mutual TLS.
    certificate: str | None = None
    client_key: str | None = None
    client_certificate: str | None = None
    timeout_s: float = 10.0
    #: gRPC, for an endpoint without a scheme: plaintext instead of TLS.
    insecure: bool = False


__all__ = ["PROTOCOLS", "Target"]

# SPDX-License-Identifier: Apache-2.0
"""The OTLP side of the settings (§1.2, §13): where and how metrics and spans are exported.

Read from the standard `OTEL_*` variables by the env reader and handed to `otel/` as they are, so
that the SDK's exporters read nothing else of the environment. Its own module because `otel/` and
its tests need these values without the rest of the settings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from .redaction import REDACTED


class OtlpHeaders:
    """`OTEL_EXPORTER_OTLP_[SIGNAL_]HEADERS` as given (`key=value,...`, values URL-encoded; the SDK
    parses them). They carry API keys, so `repr`, `str` and a deep copy (what `dataclasses.asdict`,
    hence `Settings.redacted()`, makes of it) are `<redacted>`; `reveal()` is the text."""

    __slots__ = ("_text",)

    def __init__(self, text: str = "") -> None:
        self._text = text

    def reveal(self) -> str:
        return self._text

    def __bool__(self) -> bool:
        return bool(self._text)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OtlpHeaders) and other._text == self._text

    def __hash__(self) -> int:
        return hash(self._text)

    def __str__(self) -> str:
        return REDACTED if self._text else ""

    def __repr__(self) -> str:
        return repr(str(self))

    def __deepcopy__(self, memo: dict[int, object]) -> str:
        return str(self)


@dataclass(frozen=True, slots=True)
class OtlpTransport:
    """How one signal's OTLP exporter connects, beyond endpoint and protocol: each field from
    `OTEL_EXPORTER_OTLP_{METRICS,TRACES}_*`, else the generic `OTEL_EXPORTER_OTLP_*` (OTLP exporter
    spec). Passed to the SDK's exporters explicitly, so they read nothing else."""

    #: `_HEADERS`: sent with every export (HTTP headers; gRPC metadata).
    headers: OtlpHeaders = field(default_factory=OtlpHeaders)
    #: `_COMPRESSION`: `gzip` or `none`.
    compression: str = "none"
    #: `_CERTIFICATE` (the CA bundle to verify the server with), `_CLIENT_KEY`, `_CLIENT_CERTIFICATE`
    #: (mutual TLS): PEM file paths.
    certificate: str | None = None
    client_key: str | None = None
    client_certificate: str | None = None
    #: `_TIMEOUT`, milliseconds as the specification says (10,000); here in seconds.
    timeout_s: float = 10.0
    #: `_INSECURE` (gRPC, for an endpoint without a scheme): plaintext instead of TLS.
    insecure: bool = False


@dataclass(frozen=True, slots=True)
class OtelSettings:
    """The OTLP side of §1.2 and the resource of §13, from the standard `OTEL_*` variables (the
    OpenTelemetry SDK exports; `otel/`)."""

    metrics_endpoint: str | None = None
    metrics_protocol: str = "grpc"
    export_interval_s: float = 5.0
    service_name: str = "sie-worker-sidecar"
    lane: str = "other"
    deployment_environment: str = "unknown"
    cloud_region: str = "unknown"
    #: `SIE_METRIC_MODEL_ALLOWLIST`: the models the telemetry catalog starts with (profile `default`).
    model_allowlist: tuple[str, ...] = ()
    #: `OTEL_RESOURCE_ATTRIBUTES` (`key=value,...`, values URL-decoded), in order: they override the
    #: sidecar's own resource attributes (`service.instance.id` included) but `service.name`, which
    #: `OTEL_SERVICE_NAME` overrides in turn.
    resource_attributes: tuple[tuple[str, str], ...] = ()
    #: `OTEL_SDK_DISABLED=true`: no signal is exported.
    sdk_disabled: bool = False
    #: `OTEL_METRICS_EXPORTER` / `OTEL_TRACES_EXPORTER`: `otlp` (the default) or `none`.
    metrics_exporter: str = "otlp"
    traces_exporter: str = "otlp"
    #: `OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE`: `cumulative`, `delta` or `lowmemory`.
    metrics_temporality: str = "cumulative"
    metrics_transport: OtlpTransport = field(default_factory=OtlpTransport)
    # Traces (§1.2, `SIE_TRACING_ENABLED`): endpoint and protocol resolved like the metrics' ones;
    # the sampler and the batch span processor from the standard OTEL_TRACES_* / OTEL_BSP_* variables.
    traces_endpoint: str | None = None
    traces_protocol: str = "grpc"
    traces_transport: OtlpTransport = field(default_factory=OtlpTransport)
    #: `OTEL_TRACES_SAMPLER` (lower case; unknown → the OTEL default, with a warning).
    traces_sampler: str = "parentbased_always_on"
    #: `OTEL_TRACES_SAMPLER_ARG` for the ratio samplers, in [0, 1] (else 1.0, with a warning).
    traces_sampler_ratio: float = 1.0
    #: `OTEL_BSP_SCHEDULE_DELAY` (ms) / `OTEL_BSP_MAX_QUEUE_SIZE` / `OTEL_BSP_MAX_EXPORT_BATCH_SIZE` /
    #: `OTEL_BSP_EXPORT_TIMEOUT` (ms): the SDK's BatchSpanProcessor.
    traces_schedule_delay_s: float = 5.0
    traces_max_queue: int = 2048
    traces_max_export_batch: int = 512
    traces_export_timeout_s: float = 30.0


#: The OTLP protocols the SDK's exporters speak; `http/json` (the third of the spec) has none in Python.
OTLP_PROTOCOLS: Final = ("grpc", "http/protobuf")
#: `OTEL_EXPORTER_OTLP_*_COMPRESSION` values (OTLP exporter spec).
OTLP_COMPRESSIONS: Final = ("gzip", "none")
#: `OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE` values (OTLP metrics exporter spec).
OTLP_TEMPORALITIES: Final = ("cumulative", "delta", "lowmemory")


#: OTEL_TRACES_SAMPLER values (OTEL SDK environment spec); the ratio ones read OTEL_TRACES_SAMPLER_ARG.
TRACES_SAMPLERS: frozenset[str] = frozenset(
    {
        "always_on",
        "always_off",
        "traceidratio",
        "parentbased_always_on",
        "parentbased_always_off",
        "parentbased_traceidratio",
    }
)

#: The TLS files of an OTLP exporter (`OTEL_EXPORTER_OTLP_[SIGNAL_]<NAME>`, `OtlpTransport` fields).
OTLP_FILES: Final = ("certificate", "client_key", "client_certificate")

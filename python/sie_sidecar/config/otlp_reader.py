# SPDX-License-Identifier: Apache-2.0
"""The OTLP part of the env reader: the standard `OTEL_*` variables (OTLP exporter and SDK
environment specs) read into `OtelSettings`, and whether each enabled signal can be exported.

Signal-specific variables win over the generic ones; a value that cannot be used is ignored with a
warning (as the SDK would ignore it) rather than refused, except `SIE_METRICS_ENABLED` /
`SIE_TRACING_ENABLED`, whose unknown words are refused like every boolean's.
"""

from __future__ import annotations

import dataclasses
import math
import os
from urllib.parse import unquote

from .otlp import (
    OTLP_COMPRESSIONS,
    OTLP_FILES,
    OTLP_PROTOCOLS,
    OTLP_TEMPORALITIES,
    TRACES_SAMPLERS,
    OtelSettings,
    OtlpHeaders,
    OtlpTransport,
)
from .values import EnvValues


def _picked(picked: tuple[str, str] | None) -> str | None:
    return picked[1] if picked is not None else None


class OtlpEnvReader(EnvValues):
    """`EnvValues` plus the OTLP settings; the env reader builds on it."""

    def _otel_value(self, *names: str) -> tuple[str, str] | None:
        """(name, trimmed value) of the first of `names` set and not blank: a signal-specific OTEL
        variable, then the generic one (the OTLP exporter spec's precedence)."""
        for name in names:
            value = (self.environ.get(name) or "").strip()
            if value:
                return name, value
        return None

    def _otlp_value(self, signal: str, setting: str) -> tuple[str, str] | None:
        """`OTEL_EXPORTER_OTLP_<SIGNAL>_<SETTING>`, else `OTEL_EXPORTER_OTLP_<SETTING>` (`setting` in
        lower case, as the `OtlpTransport` field it fills)."""
        suffix = setting.upper()
        return self._otel_value(f"OTEL_EXPORTER_OTLP_{signal}_{suffix}", f"OTEL_EXPORTER_OTLP_{suffix}")

    def _otlp_target(self, signal: str) -> tuple[str | None, str]:
        """(endpoint, protocol) of one signal (§1.2): the signal-specific ones win over the generic
        ones; the protocol defaults to gRPC; a generic HTTP endpoint gets `/v1/<signal>` appended,
        a generic gRPC one is used as it is (OTLP exporter spec)."""
        picked = self._otlp_value(signal, "protocol")
        protocol = picked[1].lower() if picked is not None else "grpc"
        specific = self._otel_value(f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT")
        if specific is not None:
            return specific[1], protocol
        generic = self._otel_value("OTEL_EXPORTER_OTLP_ENDPOINT")
        if generic is None:
            return None, protocol
        if protocol.startswith("http"):
            return generic[1].rstrip("/") + f"/v1/{signal.lower()}", protocol
        return generic[1], protocol

    def _otlp_transport(self, signal: str) -> OtlpTransport:
        """Headers, compression, TLS files, timeout and gRPC plaintext of one signal, each variable
        signal-specific first. A value that cannot be used is ignored with a warning."""
        headers = self._otlp_value(signal, "headers")
        compression = "none"
        if (picked := self._otlp_value(signal, "compression")) is not None:
            compression = picked[1].lower()
            if compression not in OTLP_COMPRESSIONS:
                self.warnings.append(f"{picked[0]}={picked[1]!r} ignored (gzip or none); using none")
                compression = "none"
        timeout_s = 10.0
        if (picked := self._otlp_value(signal, "timeout")) is not None:
            try:
                millis = float(picked[1])
            except ValueError:
                millis = math.nan
            if math.isfinite(millis) and millis > 0:
                timeout_s = millis / 1000.0
            else:
                self.warnings.append(f"{picked[0]}={picked[1]!r} ignored (milliseconds > 0); using 10000")
        insecure = self._otlp_value(signal, "insecure")
        files = {setting: self._otlp_value(signal, setting) for setting in OTLP_FILES}
        return OtlpTransport(
            headers=OtlpHeaders(headers[1] if headers is not None else ""),
            compression=compression,
            certificate=_picked(files["certificate"]),
            client_key=_picked(files["client_key"]),
            client_certificate=_picked(files["client_certificate"]),
            timeout_s=timeout_s,
            insecure=insecure is not None and insecure[1].lower() == "true",
        )

    def _resource_attributes(self) -> tuple[tuple[str, str], ...]:
        """`OTEL_RESOURCE_ATTRIBUTES` read as the SDK reads it: comma-separated `key=value`, both
        trimmed, the value URL-decoded; an entry without `=` is ignored with a warning."""
        raw = self.environ.get("OTEL_RESOURCE_ATTRIBUTES") or ""
        out: dict[str, str] = {}
        for item in raw.split(","):
            if not item.strip():
                continue
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                self.warnings.append(f"OTEL_RESOURCE_ATTRIBUTES entry {item.strip()!r} is not key=value; ignored")
                continue
            out[key.strip()] = unquote(value.strip())
        return tuple(out.items())

    def _otel_exporter(self, name: str) -> str:
        """`OTEL_METRICS_EXPORTER` / `OTEL_TRACES_EXPORTER`: `otlp` when the list names it (the
        default), else `none`; the exporters this build has not (console, prometheus, ...) are
        ignored with a warning."""
        raw = self.environ.get(name) or ""
        values = [v.strip().lower() for v in raw.split(",") if v.strip()] or ["otlp"]
        unknown = [v for v in values if v not in ("otlp", "none")]
        if unknown:
            self.warnings.append(f"{name}={raw!r}: {', '.join(unknown)} not available (otlp and none are); ignored")
        return "otlp" if "otlp" in values else "none"

    def otel(self) -> OtelSettings:
        """The OTLP settings of both signals (the metrics' side, then the traces')."""
        return self._traces(self._metrics())

    def _metrics(self) -> OtelSettings:
        """§1.2 and §13 from the standard variables: the metrics' endpoint, protocol and transport,
        the SDK switches, the temporality and the resource."""
        env = self.environ
        endpoint, protocol = self._otlp_target("METRICS")
        interval = self.env_float("OTEL_METRIC_EXPORT_INTERVAL", 5000.0)
        attributes = self._resource_attributes()
        from_resource = dict(attributes)
        region = (env.get("SIE_OTEL_CLOUD_REGION") or env.get("SIE_CLOUD_REGION") or "").strip()
        environment = (env.get("SIE_OTEL_DEPLOYMENT_ENVIRONMENT") or "").strip()
        disabled = (env.get("OTEL_SDK_DISABLED") or "").strip().lower()
        if disabled not in ("", "true", "false"):
            self.warnings.append(f"OTEL_SDK_DISABLED={env['OTEL_SDK_DISABLED']!r} is not true or false; read as false")
        temporality = (env.get("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE") or "").strip().lower()
        if temporality and temporality not in OTLP_TEMPORALITIES:
            raw = env["OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE"]
            self.warnings.append(
                f"OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE={raw!r} ignored"
                " (cumulative, delta or lowmemory); using cumulative"
            )
            temporality = ""
        return OtelSettings(
            metrics_endpoint=endpoint,
            metrics_protocol=protocol,
            export_interval_s=max(0.1, interval / 1000.0),
            service_name=(env.get("OTEL_SERVICE_NAME") or "").strip()
            or from_resource.get("service.name")
            or "sie-worker-sidecar",
            lane=(env.get("SIE_OTEL_LANE") or "").strip() or "other",
            deployment_environment=environment or from_resource.get("deployment.environment") or "unknown",
            cloud_region=region or from_resource.get("cloud.region") or "unknown",
            model_allowlist=tuple(
                m.strip() for m in (env.get("SIE_METRIC_MODEL_ALLOWLIST") or "").split(",") if m.strip()
            ),
            resource_attributes=attributes,
            sdk_disabled=disabled == "true",
            metrics_exporter=self._otel_exporter("OTEL_METRICS_EXPORTER"),
            traces_exporter=self._otel_exporter("OTEL_TRACES_EXPORTER"),
            metrics_temporality=temporality or "cumulative",
            metrics_transport=self._otlp_transport("METRICS"),
        )

    def _traces(self, otel: OtelSettings) -> OtelSettings:
        """The traces' side of §1.2, resolved like the metrics' (signal-specific variables win; a
        generic HTTP endpoint gets `/v1/traces`), and the OTEL sampler and batch span processor."""
        env = self.environ
        endpoint, protocol = self._otlp_target("TRACES")
        sampler = (env.get("OTEL_TRACES_SAMPLER") or "").strip().lower() or "parentbased_always_on"
        if sampler not in TRACES_SAMPLERS:
            self.warnings.append(f"OTEL_TRACES_SAMPLER={sampler!r} ignored; using parentbased_always_on")
            sampler = "parentbased_always_on"
        ratio = 1.0
        if sampler.endswith("traceidratio"):
            ratio = self.env_float("OTEL_TRACES_SAMPLER_ARG", 1.0, lambda x: 0.0 <= x <= 1.0)
        queue = self.env_uint("OTEL_BSP_MAX_QUEUE_SIZE", 2048)
        return dataclasses.replace(
            otel,
            traces_endpoint=endpoint,
            traces_protocol=protocol,
            traces_transport=self._otlp_transport("TRACES"),
            traces_sampler=sampler,
            traces_sampler_ratio=ratio,
            traces_schedule_delay_s=max(0.01, self.env_float("OTEL_BSP_SCHEDULE_DELAY", 5000.0) / 1000.0),
            traces_max_queue=queue,
            traces_max_export_batch=min(queue, self.env_uint("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)),
            traces_export_timeout_s=self.env_float("OTEL_BSP_EXPORT_TIMEOUT", 30000.0) / 1000.0,
        )

    def _otlp_off(self, signal: str, otel: OtelSettings) -> str | None:
        """Why one enabled signal cannot be exported (the warning's reason), or None."""
        endpoint, protocol, exporter, transport = (
            (otel.metrics_endpoint, otel.metrics_protocol, otel.metrics_exporter, otel.metrics_transport)
            if signal == "METRICS"
            else (otel.traces_endpoint, otel.traces_protocol, otel.traces_exporter, otel.traces_transport)
        )
        if otel.sdk_disabled:
            return "OTEL_SDK_DISABLED is true"
        if exporter == "none":
            return f"OTEL_{signal}_EXPORTER is none"
        if endpoint is None:
            return f"no OTLP {signal.lower()} endpoint is set"
        if protocol not in OTLP_PROTOCOLS:
            return f"OTLP {signal.lower()} protocol {protocol!r} is not exported (grpc and http/protobuf are)"
        for setting in OTLP_FILES:
            path = getattr(transport, setting)
            if path is not None and not os.path.isfile(path):
                name, _ = self._otlp_value(signal, setting) or (f"OTEL_EXPORTER_OTLP_{setting.upper()}", "")
                return f"{name}={path!r} is not a file"
        return None

    def tracing_enabled(self, otel: OtelSettings) -> bool:
        """`SIE_TRACING_ENABLED`, off (with one warning) when the spans cannot be exported: the SDK
        disabled, `OTEL_TRACES_EXPORTER=none`, no endpoint, a protocol the SDK has no exporter for
        (`http/json`) or a TLS file that is not there."""
        if not self.env_flag("SIE_TRACING_ENABLED", default=False):
            return False
        reason = self._otlp_off("TRACES", otel)
        if reason is not None:
            self.warnings.append(f"SIE_TRACING_ENABLED is set but {reason}: tracing is off")
            return False
        return True

    def metrics_enabled(self, otel: OtelSettings) -> bool:
        """`SIE_METRICS_ENABLED`, off (with one warning) when the metrics cannot be exported, for the
        reasons tracing can be off (`tracing_enabled`)."""
        if not self.env_flag("SIE_METRICS_ENABLED", default=False):
            return False
        reason = self._otlp_off("METRICS", otel)
        if reason is not None:
            self.warnings.append(f"SIE_METRICS_ENABLED is set but {reason}: metrics are off")
            return False
        return True

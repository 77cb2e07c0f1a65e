# SPDX-License-Identifier: Apache-2.0
"""A minimal OTLP/HTTP metrics sink for benches: accepts every POST to /v1/metrics, decodes it (so the
sidecar pays what a real collector makes it pay), counts the requests and prints the count at exit.

Run: `python benches/otlp_sink.py PORT` (then point `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT` at it).
"""

from __future__ import annotations

import sys

from aiohttp import web
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest


def main(port: int) -> None:
    seen = {"requests": 0}

    async def metrics(request: web.Request) -> web.Response:
        parsed = ExportMetricsServiceRequest()
        parsed.ParseFromString(await request.read())
        seen["requests"] += 1
        return web.Response(content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/metrics", metrics)
    try:
        web.run_app(app, host="127.0.0.1", port=port, print=None)
    finally:
        print(f"otlp_sink: {seen['requests']} export requests", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]))

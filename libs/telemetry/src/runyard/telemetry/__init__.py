"""Tracing: one trace from a gateway request through every Kafka hop (R-62).

- `setup_tracing(service)` installs a tracer provider configured by the
  standard OTEL_* variables: OTEL_EXPORTER_OTLP_ENDPOINT (OTLP over HTTP, e.g.
  to the collector of docker-compose.yml) and OTEL_TRACES_EXPORTER=console;
  with neither, spans are created (so context propagates) but not exported.
- The gateway opens a server span per request (`TracingMiddleware`), taking
  the caller's `traceparent` when there is one; the W3C context of the active
  span goes into each event's metadata (`current_trace_context`).
- The relay copies that context into Kafka headers; FastStream's telemetry
  middleware on every consumer continues the trace; and what a service writes
  in reaction (`Metadata.caused_by`) carries the consumer span's context.

Metrics (`runyard.telemetry.metrics`): `setup_metrics(service)` and
`metrics_text()` behind every service's /metrics, the consumers' and the
store's instruments, and `register_gauge` for a service's own gauges.
"""

from __future__ import annotations

import os
from typing import Any

from opentelemetry import trace
from opentelemetry.propagate import extract, inject
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
)
from runyard.contracts.envelope import set_trace_context_source
from runyard.telemetry.metrics import (
    metrics_text,
    register_gauge,
    setup_metrics,
    track_lag,
)

__all__ = [
    "TracingMiddleware",
    "current_trace_context",
    "metrics_text",
    "register_gauge",
    "setup_metrics",
    "setup_tracing",
    "tracer",
    "track_lag",
]

_configured = False


def setup_tracing(service: str, exporter: SpanExporter | None = None) -> None:
    """Install the process's tracer provider once (later calls only add `exporter`)."""
    global _configured
    provider = trace.get_tracer_provider()
    if not _configured:
        provider = TracerProvider(resource=Resource.create({"service.name": service}))
        for configured in _exporters_from_env():
            provider.add_span_processor(BatchSpanProcessor(configured))
        trace.set_tracer_provider(provider)
        set_trace_context_source(current_trace_context)
        _configured = True
    if exporter is not None and isinstance(provider, TracerProvider):
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor

        provider.add_span_processor(SimpleSpanProcessor(exporter))


def _exporters_from_env() -> list[SpanExporter]:
    exporters: list[SpanExporter] = []
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
    ):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporters.append(OTLPSpanExporter())
    if "console" in os.environ.get("OTEL_TRACES_EXPORTER", ""):
        exporters.append(ConsoleSpanExporter())
    return exporters


def tracer(name: str = "runyard") -> trace.Tracer:
    return trace.get_tracer(name)


def current_trace_context() -> dict[str, str]:
    """W3C `traceparent`/`tracestate` of the active span ({} when there is none)."""
    carrier: dict[str, str] = {}
    inject(carrier)
    return carrier


class TracingMiddleware:
    """ASGI middleware: a server span per HTTP request, parent from `traceparent`."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", [])}
        name = f"{scope.get('method', 'HTTP')} {scope.get('path', '')}"
        with tracer("runyard.gateway").start_as_current_span(
            name, context=extract(headers), kind=trace.SpanKind.SERVER
        ):
            await self.app(scope, receive, send)

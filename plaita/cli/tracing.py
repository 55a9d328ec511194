"""``--otel``: the OpenTelemetry SDK set up for ``plaita worker`` and ``plaita enqueue``, when asked.

Off by default: plaita then configures nothing, and a worker traces only when something else set
a global tracer provider (``opentelemetry-instrument plaita worker …``, or a program calling
``run_worker`` after configuring the SDK). ``console`` writes finished spans to stderr as JSON (a
demo, a look; stdout keeps what the command prints); ``otlp`` sends them with the OTLP exporter
(``pip install opentelemetry-exporter-otlp``), configured by the standard
``OTEL_EXPORTER_OTLP_*`` variables. The SDK reads the others itself: ``OTEL_SERVICE_NAME``,
``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER``, ``OTEL_BSP_*``, ``OTEL_SDK_DISABLED``.
Spans still buffered at exit are flushed by the SDK's exit hook.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Mapping
from typing import Any

from plaita.config import env_first
from plaita.errors import ConfigError

#: What ``--otel`` accepts.
OTEL_MODES = ("off", "console", "otlp")
#: The OTLP exporter per ``OTEL_EXPORTER_OTLP_PROTOCOL`` (the SDK specification's default first).
_OTLP_MODULES = {
    "http/protobuf": "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "grpc": "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
}


def add_otel_option(p: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    p.add_argument(
        "--otel",
        metavar="MODE",
        type=str.lower,
        default=env_first(env, "PLAITA_OTEL") or "off",
        help="export OpenTelemetry spans: off, console (JSON on stderr) or otlp (needs "
        "opentelemetry-exporter-otlp; OTEL_EXPORTER_OTLP_* say where) (env PLAITA_OTEL; default off)",
    )


def configure_tracing(mode: str, service_name: str, env: Mapping[str, str]) -> None:
    """Install a global SDK tracer provider exporting to ``mode``; ConfigError for a bad mode or a
    missing package (exit 2 before anything runs)."""
    if mode not in OTEL_MODES:
        raise ConfigError(f"--otel {mode!r}: expected one of {', '.join(OTEL_MODES)}")
    if mode == "off":
        return
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import OTELResourceDetector, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError:
        raise ConfigError(f"--otel {mode} needs the OpenTelemetry SDK: pip install 'plaita[otel]'") from None
    exporter = ConsoleSpanExporter(out=sys.stderr) if mode == "console" else _otlp_exporter(env)
    # Our service name, unless OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES name one (they win).
    resource = Resource.create({"service.name": service_name}).merge(OTELResourceDetector().detect())
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)


def _otlp_exporter(env: Mapping[str, str]) -> Any:
    protocol = env_first(env, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf"
    module_name = _OTLP_MODULES.get(protocol)
    if module_name is None:
        raise ConfigError(f"OTEL_EXPORTER_OTLP_PROTOCOL {protocol!r}: expected one of {', '.join(_OTLP_MODULES)}")
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        raise ConfigError(
            f"--otel otlp ({protocol}) needs the OTLP exporter: pip install opentelemetry-exporter-otlp"
        ) from None
    return module.OTLPSpanExporter()

"""What every operator command does the same way: report a Redis failure as one line, exit 1;
print ``--json`` output that strict parsers accept."""

from __future__ import annotations

import json
import math
import sys
from typing import Any

from plaita.config import DEFAULT_REDIS_URL, redact_url
from plaita.errors import ConfigError
from plaita.store.errors import is_redis_failure


def redis_failed(command: str, redis_url: str | None, exc: Exception) -> int:
    """Print ``plaita COMMAND: Redis at URL failed: …`` (password redacted) and return 1;
    re-raise ``exc`` when it is not a Redis failure (a bug must not look like an outage)."""
    if not is_redis_failure(exc) or isinstance(exc, BrokenPipeError):
        raise exc  # a bug, or the reader of stdout left (``| head``): main() ends quietly
    url = redact_url(redis_url or DEFAULT_REDIS_URL)
    print(f"plaita {command}: Redis at {url} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
    return 1


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return json.dumps(value)  # "NaN" / "Infinity" as text: shown, and still strict JSON
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def json_arg(text: str | None, what: str) -> Any:
    """A flag's JSON value (None when not given); ConfigError (exit 2) naming ``what`` when not JSON."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{what} is not valid JSON: {exc}") from None


def json_text(value: Any, **options: Any) -> str:
    """``--json`` output: strict JSON even for a document an older plaita stored with NaN in it."""
    return json.dumps(_finite(value), allow_nan=False, **options)

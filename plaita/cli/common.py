"""What every operator command does the same way: report a Redis failure as one line, exit 1."""

from __future__ import annotations

import sys

from plaita.config import DEFAULT_REDIS_URL, redact_url
from plaita.store.errors import is_redis_failure


def redis_failed(command: str, redis_url: str | None, exc: Exception) -> int:
    """Print ``plaita COMMAND: Redis at URL failed: …`` (password redacted) and return 1;
    re-raise ``exc`` when it is not a Redis failure (a bug must not look like an outage)."""
    if not is_redis_failure(exc):
        raise exc
    url = redact_url(redis_url or DEFAULT_REDIS_URL)
    print(f"plaita {command}: Redis at {url} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
    return 1

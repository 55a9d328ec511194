"""The ``--status-file``: the worker's status as JSON, rewritten atomically (at most every second)."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

#: How often the status file is rewritten at most (state changes always rewrite it).
STATUS_EVERY_S = 1.0


class StatusFile:
    """Writes ``snapshot()`` to ``path`` via a temp file and rename, so readers never see half."""

    def __init__(self, path: str | None, snapshot: Callable[[], dict[str, Any]]) -> None:
        self.path = path
        self._snapshot = snapshot
        self._written_at_s = 0.0
        self._failing = False

    def write(self, *, force: bool = False) -> None:
        if not self.path:
            return
        now = time.monotonic()
        if not force and now - self._written_at_s < STATUS_EVERY_S:
            return
        self._written_at_s = now
        target = Path(self.path)
        tmp = target.with_name(f"{target.name}.{threading.get_ident()}.tmp")
        try:
            tmp.write_text(json.dumps(self._snapshot()), encoding="utf-8")
            tmp.replace(target)
        except OSError as exc:
            if not self._failing:  # once per failure streak: a full disk must not flood the log
                logger.warning("could not write the status file %s (%s); retrying every second", self.path, exc)
            self._failing = True
            return
        if self._failing:
            logger.info("status file %s written again", self.path)
        self._failing = False


def read_status_file(path: str | Path) -> dict[str, Any] | None:
    """The JSON a worker keeps at ``--status-file``, or None while absent or half written."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None

"""The lifecycle package owns only the vocabulary of failures; sorting exceptions into it is the store's job."""

from __future__ import annotations

import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import plaita.fsm
from plaita.fsm import ErrorKind

ROOT = Path(__file__).resolve().parents[2]


def test_the_vocabulary_is_the_four_kinds_the_worker_reacts_to() -> None:
    assert [k.value for k in ErrorKind] == ["transient", "persistent", "bad_input", "not_ours"]


def test_plaita_fsm_imports_neither_redis_nor_the_rest_of_plaita() -> None:
    """Importing every module of plaita.fsm in a fresh interpreter loads no redis and no other plaita package."""
    modules = sorted(m.name for m in pkgutil.walk_packages(plaita.fsm.__path__, "plaita.fsm."))
    assert "plaita.fsm.kinds" in modules and "plaita.fsm.classify" not in modules
    # What ``import plaita`` itself loads (the package root) is not fsm's doing; redis never may be.
    code = (
        "import sys, importlib, plaita; before = set(sys.modules); "
        f"[importlib.import_module(m) for m in {modules!r}]; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'redis' "
        "or (m not in before and m.startswith('plaita.') and not m.startswith('plaita.fsm'))); "
        "assert not bad, bad"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr

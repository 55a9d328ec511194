"""The wheel's make-up, checked from the source tree (``scripts/wheel-smoke.sh`` builds and runs it).

The version is written once (``plaita/version.py``); every file of the package that is not Python
(Lua scripts, dashboard templates and assets, ``py.typed``) is named by a package-data glob, so
a new one cannot be left out of the wheel unnoticed.
"""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path, PurePosixPath

from plaita.version import __version__

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_the_version_is_written_once() -> None:
    project = PYPROJECT["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "plaita.version.__version__"}
    assert importlib.metadata.version("plaita") == __version__


def test_every_package_data_file_is_named_in_pyproject() -> None:
    globs = PYPROJECT["tool"]["setuptools"]["package-data"]
    data = [
        p
        for p in (ROOT / "plaita").rglob("*")
        if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts
    ]
    assert any(p.name == "py.typed" for p in data) and any(p.suffix == ".lua" for p in data)

    def named(path: Path) -> bool:
        for package, patterns in globs.items():
            base = ROOT / package.replace(".", "/")
            if base in path.parents:
                rel = PurePosixPath(path.relative_to(base).as_posix())
                # As setuptools globs them: ``*`` never crosses a ``/``.
                if any(len(rel.parts) == len(PurePosixPath(pat).parts) and rel.match(pat) for pat in patterns):
                    return True
        return False

    missing = [p.relative_to(ROOT).as_posix() for p in data if not named(p)]
    assert not missing, f"not in [tool.setuptools.package-data], so not in the wheel: {missing}"

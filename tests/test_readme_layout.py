"""README's layout table names every package and top-level module of plaita (a newcomer's map)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _layout_rows() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    table = text.split("## Layout", 1)[1].split("\n## ", 1)[0]
    return [line for line in table.splitlines() if line.startswith("| `")]


def test_every_package_has_a_row() -> None:
    paths = {re.match(r"\| `([^`]+)`", row).group(1) for row in _layout_rows()}  # type: ignore[union-attr]
    packages = sorted(p.parent.name for p in (ROOT / "plaita").glob("*/__init__.py"))
    assert packages, "no packages found"
    missing = [name for name in packages if f"plaita/{name}/" not in paths]
    assert not missing, f"README's layout table has no row for {missing}"


def test_every_top_level_module_is_named() -> None:
    rows = "\n".join(_layout_rows())
    modules = sorted(p.stem for p in (ROOT / "plaita").glob("*.py") if p.stem != "__main__")
    braced = re.search(r"`plaita/\{([^}]+)\}\.py`", rows)
    named = set(braced.group(1).split(",")) if braced else set()
    named |= {m for m in modules if f"`plaita/{m}.py`" in rows}
    missing = [m for m in modules if m not in named]
    assert not missing, f"README's layout table does not name plaita/{missing}.py"

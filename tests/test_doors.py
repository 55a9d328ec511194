"""No module outside plaita/store/ reaches for a store object's raw Redis client.

The rule, checked on the syntax tree of every module under plaita/ but plaita/store/ (no server
needed): no attribute access ``X.client``, ``X.read_client`` or ``X.owner``, and no
``getattr(X, "client")`` (or the other two names). Those are the attributes through which a store
object hands out its connection (``StreamQueue.client`` / ``.read_client`` / ``.owner``,
``ExecutionStore.client``, ``DeadLetterQueue.client``, ...); whoever reads one holds the keys
instead of a door, and calls Redis past store/. The one exception is a submodule named ``client``
reached through an imported module (``http.client.HTTPException``, ``plaita.flows.producer.client``):
the base of the attribute is then a name bound by ``import``, not an object.

Code above store/ asks store/ for what it needs instead: ``FleetAccess`` (the registry, the
control channels, the fleet check's keys, the servers) and the functions of
``plaita.store.queue_access`` (the executions, leases, counts and cleanups of an opened queue).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "plaita"
#: Attributes that hand out a store object's raw client.
RAW_CLIENT_ATTRIBUTES = frozenset({"client", "read_client", "owner"})
#: Packages that may hold and use raw clients: the one that talks to Redis.
ALLOWED = ("store",)


def _module_names(tree: ast.Module) -> set[str]:
    """Names bound by ``import a.b`` / ``import a.b as c`` in the module (``a``, ``c``)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.asname or alias.name.split(".")[0] for alias in node.names)
    return names


def _is_module_path(node: ast.expr, modules: set[str]) -> bool:
    """``node`` is a dotted path that starts at an imported module (``http`` in ``http.client``)."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name) and node.id in modules


def _is_reach(node: ast.AST, modules: set[str]) -> bool:
    if isinstance(node, ast.Attribute):
        return node.attr in RAW_CLIENT_ATTRIBUTES and not _is_module_path(node.value, modules)
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "getattr"
        and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant)
        and node.args[1].value in RAW_CLIENT_ATTRIBUTES
    )


def raw_client_reaches(source: str) -> list[tuple[int, str]]:
    """(line, code) of every raw client reach in ``source``, by the rule in this module's docstring."""
    tree = ast.parse(source)
    modules = _module_names(tree)
    return sorted(
        (node.lineno, ast.unparse(node))
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute | ast.Call) and _is_reach(node, modules)
    )


def _checked_modules() -> list[Path]:
    skipped = ALLOWED
    return sorted(path for path in PACKAGE.rglob("*.py") if path.relative_to(PACKAGE).parts[0] not in skipped)


def test_no_module_outside_store_reaches_for_a_raw_client() -> None:
    reaches = [
        f"plaita/{path.relative_to(PACKAGE)}:{line}: {code}"
        for path in _checked_modules()
        for line, code in raw_client_reaches(path.read_text(encoding="utf-8"))
    ]
    assert not reaches, "raw Redis client reached outside plaita/store/ (use a store/ door):\n" + "\n".join(reaches)


def test_the_check_covers_the_layers_above_store() -> None:
    """A wrong path or a too-wide exemption would make the test above pass on nothing."""
    covered = {path.relative_to(PACKAGE).parts[0] for path in _checked_modules()}
    assert {"cli", "dashboard", "ops", "runtime", "fsm", "__init__.py"} <= covered
    assert "store" not in covered


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("queue.client.ping()", [(1, "queue.client")]),
        ("self.client = c", [(1, "self.client")]),
        ("x = dlq.queue.read_client", [(1, "dlq.queue.read_client")]),
        ("leases.on(queue.owner)", [(1, "queue.owner")]),
        ("c = getattr(store, 'client')", [(1, "getattr(store, 'client')")]),
        ("make().client.close()", [(1, "make().client")]),
        ("import http.client\nerr = http.client.HTTPException", []),
        ("import plaita.flows.producer.client as fc\nfc.FlowClient", []),
        ("from plaita.flows.producer.client import FlowClient\nflow_client = FlowClient", []),
        ("queue.client_name", []),
    ],
)
def test_the_rule(source: str, expected: list[tuple[int, str]]) -> None:
    assert raw_client_reaches(source) == expected

"""One exception family (issue 32 item 4): every exception class plaita declares is a
``PlaitaError``, so ``except PlaitaError`` catches whatever plaita raises on purpose, and the
retry policy reads ``retryable`` from it. No server needed."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import plaita
from plaita.errors import PlaitaError


def _declared_exceptions() -> list[type[BaseException]]:
    found = []
    for info in pkgutil.walk_packages(plaita.__path__, "plaita."):
        if info.name == "plaita.__main__":
            continue  # running it would start the CLI
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, BaseException) and cls.__module__ == info.name:
                found.append(cls)
    return found


def test_every_exception_plaita_declares_is_a_plaita_error() -> None:
    declared = _declared_exceptions()
    assert len(declared) >= 25  # the walk found the package's exceptions, not nothing
    strays = sorted(f"{c.__module__}.{c.__qualname__}" for c in declared if not issubclass(c, PlaitaError))
    assert strays == []

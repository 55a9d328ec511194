"""The ``plaita`` command: argv -> Settings -> Worker and tools. The only place that configures logging."""

from plaita.cli.main import main

__all__ = ["main"]

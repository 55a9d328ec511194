"""plaita: a Redis Streams worker daemon that never dies of a Redis fault."""

from plaita.errors import BadTaskError, ConfigError, PlaitaError

__version__ = "0.1.0"

__all__ = ["BadTaskError", "ConfigError", "PlaitaError", "__version__"]

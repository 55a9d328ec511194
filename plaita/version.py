"""plaita's version, in a module of its own: modules inside plaita read it from here, never from
the package root (which loads the public face, every layer above them)."""

__version__ = "0.1.0"

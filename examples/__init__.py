"""Example applications built on plaita (importable from a clone's root: ``examples.shop``)."""

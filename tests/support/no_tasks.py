"""A module without a TaskRegistry (``plaita worker --tasks`` must refuse it)."""

VALUE = 1

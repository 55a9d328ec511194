"""A flow module whose schedule names an unknown time zone: loading it is a ConfigError."""

from __future__ import annotations

from plaita.flows import Flow, Schedule

bad = Flow("bad-schedule", schedule=Schedule("*/5 * * * *", tz="Europe/Atlantis"))
bad.step(lambda ctx: None, name="run")

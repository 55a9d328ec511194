"""A flow module whose cron expression is valid field by field but never fires (30 February):
loading it is a ConfigError naming the flow."""

from __future__ import annotations

from plaita.flows import Flow

never = Flow("never-fires", schedule="0 0 30 2 *")
never.step(lambda ctx: None, name="run")

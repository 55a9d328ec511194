"""The producer: starting, steering and reading executions (``FlowClient``, cancel)."""

"""The flow runner: a worker handler advancing executions one checkpointed step at a time."""

"""Flow definitions and the execution document: values and checks, no Redis calls."""

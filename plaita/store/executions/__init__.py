"""Execution state: documents, checkpoints, children, flow limits, keeper and schedule keys,
crash strikes, and the flow runner's door onto them (``execution_io``)."""

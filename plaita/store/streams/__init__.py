"""Streams: the task queue, its partitions, entries, the DLQ, stats and the reclaim step."""

"""The path ``plaita.store.partitioned`` that the README and docs name (``open_queue``); the
partitioned queue lives in ``plaita.store.streams.partitioned``."""

from plaita.store.streams.partitioned import PartitionedQueue, open_queue

__all__ = ["PartitionedQueue", "open_queue"]

"""The only package that talks to Redis: client construction, streams, the DLQ, leases and
fenced writes, Lua scripts, what a Redis error means (``errors``), and the private redis-server
used by the demo and the tests."""

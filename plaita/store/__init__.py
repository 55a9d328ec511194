"""The only package that talks to Redis: client construction, streams, the DLQ, leases and
fenced writes, Lua scripts, and the private redis-server used by the demo and the tests."""

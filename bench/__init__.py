"""Benchmarks for plaita: throughput vs a raw redis-py loop, shutdown latency, freeze recovery.

Run ``.venv/bin/python -m bench`` from the repository root (``--quick`` for a smoke run).
Every measurement runs against one private redis-server on a free loopback port.
"""

"""Benchmarks for plaita: throughput vs a raw redis-py loop, latency, recovery, shutdown, leases, chaos matrix.

Run ``.venv/bin/python -m bench`` from the repository root (``--quick`` for a smoke run); it
writes docs/benchmarks.md and docs/img/*.png. ``python -m bench.matrix`` (or
``scripts/e2e-chaos-redis.sh --matrix``) runs the chaos matrix alone. Every measurement runs
against private redis-servers on free loopback ports, never 6379.
"""

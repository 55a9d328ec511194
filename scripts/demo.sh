#!/usr/bin/env bash
# The demo command: setup if needed, then `plaita demo` (a private redis-server, a worker,
# a few hundred tasks, Redis frozen for 5 s mid-run, and a tally). Arguments go to `plaita demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh
exec .venv/bin/plaita demo "$@"

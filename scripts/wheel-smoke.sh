#!/usr/bin/env bash
# The wheel stands alone: build it from the files a commit would hold (tracked plus new, never
# ignored ones), check it carries every package-data file of the source tree (Lua scripts,
# dashboard templates and assets, py.typed), install it with its runtime dependencies only into a
# fresh venv outside the repository, and from a directory outside it run `plaita doctor`, a worker
# with one flow, `plaita executions start --wait` and `plaita enqueue` against a private
# redis-server; SIGTERM must end the worker with 0. A package-data file missing from
# pyproject.toml, or an import of a dev-only dependency, fails here.
# Usage: ./scripts/wheel-smoke.sh (after ./scripts/bootstrap.sh; scripts/test.sh runs it).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
started_s=$SECONDS
python=$(.venv/bin/python -c 'import sys; print(sys._base_executable)')

tmp=$(mktemp -d -t plaita-wheel-XXXXXX)
redis_pid=""
worker_pid=""
cleanup() {
  # Only the processes this script started, by their pid.
  if [ -n "$worker_pid" ]; then kill -KILL "$worker_pid" 2>/dev/null || true; fi
  if [ -n "$redis_pid" ]; then kill -TERM "$redis_pid" 2>/dev/null || true; wait "$redis_pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
step() { echo "wheel-smoke: $* (at $((SECONDS - started_s)) s)"; }
fail() {
  echo "wheel-smoke: FAILED: $*" >&2
  for log in "$tmp"/run/worker.log "$tmp"/redis/redis.log; do
    if [ -f "$log" ]; then echo "--- $log (last 30 lines)" >&2; tail -n 30 "$log" >&2; fi
  done
  exit 1
}

step "building the wheel (pip wheel, isolated build) from a clean copy"
mkdir -p "$tmp/src" "$tmp/dist" "$tmp/run" "$tmp/redis"
# A clean copy: setuptools builds in place and its build/ directory would carry stale files.
git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
  if [ -e "$f" ]; then printf '%s\0' "$f"; fi
done | tar --null -T - -cf - | tar -xf - -C "$tmp/src"
pip_quiet() {  # pip's output only when it fails (this machine's pip.conf names absent local indexes)
  if ! "$@" >"$tmp/pip.log" 2>&1; then grep -v "^WARNING: Location" "$tmp/pip.log" >&2; return 1; fi
}
pip_quiet .venv/bin/python -m pip wheel -q --no-deps -w "$tmp/dist" "$tmp/src" || fail "pip wheel failed"
wheel=$(ls "$tmp"/dist/plaita-*.whl 2>/dev/null | head -n 1)
[ -n "$wheel" ] || fail "pip wheel made no wheel"

# Every non-Python file of the package in the source tree must be in the wheel, and py.typed.
.venv/bin/python - "$wheel" "$tmp/src" <<'EOF' || fail "the wheel lacks package files"
import sys, zipfile
from pathlib import Path

wheel, src = sys.argv[1], Path(sys.argv[2])
names = set(zipfile.ZipFile(wheel).namelist())
wanted = sorted(
    p.relative_to(src).as_posix()
    for p in (src / "plaita").rglob("*")
    if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts
)
missing = [w for w in wanted if w not in names]
kinds = {"lua": ".lua", "templates": ".html", "py.typed": "py.typed"}
for kind, suffix in kinds.items():
    if not any(n.endswith(suffix) for n in names):
        missing.append(f"(no {kind} file at all)")
if missing:
    sys.exit("missing from the wheel: " + ", ".join(missing))
print(f"wheel-smoke: {Path(wheel).name}: {len(names)} files, all {len(wanted)} package-data files in it")
EOF

step "installing it with its runtime dependencies into a fresh venv"
# No pip of its own (seeding one costs seconds): the dev venv's pip installs into it.
"$python" -m venv --without-pip "$tmp/venv"
pip_quiet .venv/bin/python -m pip --python "$tmp/venv/bin/python" install -q "$wheel" || fail "installing the wheel failed"
bin="$tmp/venv/bin"
[ -x "$bin/plaita" ] || fail "the wheel installed no plaita command"

cd "$tmp/run"  # outside the repository: only the installed package can be imported
cat > smoke_flows.py <<'EOF'
from plaita import Flow

smoke = Flow("smoke")


@smoke.step
def add(ctx):
    return {"sum": ctx.params["a"] + ctx.params["b"]}


@smoke.step
async def double(ctx):
    return {"doubled": ctx.state["sum"] * 2}
EOF
export PYTHONPATH="$tmp/run"  # the flow module only; never the repository
"$bin/python" - "$tmp/venv" <<'EOF' || fail "plaita is not importable from the fresh venv alone"
import sys
from pathlib import Path

import plaita
import plaita.version

where = Path(plaita.__file__).resolve()
assert Path(sys.argv[1]).resolve() in where.parents, f"plaita imported from {where}"
from importlib.metadata import version

assert version("plaita") == plaita.version.__version__, (version("plaita"), plaita.version.__version__)

# Every module imports with the runtime dependencies alone (the dashboard needs its extra, the
# testing kit's pytest fixtures need pytest).
import importlib
import pkgutil

for mod in pkgutil.walk_packages(plaita.__path__, "plaita."):
    if not mod.name.startswith(("plaita.dashboard", "plaita.testing.plugin")) and not mod.name.endswith(".__main__"):
        importlib.import_module(mod.name)
for dev_only in ("pytest", "freezegun", "hypothesis", "starlette"):
    assert importlib.util.find_spec(dev_only) is None, f"{dev_only} is in the fresh venv"
EOF

step "running doctor, a worker, one flow and an enqueue from the wheel"
port=$("$bin/python" -c 'import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
[ "$port" != 6379 ] || fail "free port was 6379"
redis-server --port "$port" --bind 127.0.0.1 --dir "$tmp/redis" --save "" --appendonly yes \
  --appendfsync always --daemonize no --logfile "$tmp/redis/redis.log" >/dev/null 2>&1 &
redis_pid=$!
url="redis://127.0.0.1:$port/0"
for _ in $(seq 1 200); do
  if "$bin/python" -c "import redis, sys; sys.exit(0 if redis.Redis.from_url('$url', socket_timeout=1).ping() else 1)" 2>/dev/null; then
    break
  fi
  sleep 0.05
done

"$bin/plaita" doctor --redis-url "$url" >doctor.out || fail "plaita doctor exited $? on a well-set server: $(cat doctor.out)"

"$bin/plaita" worker --redis-url "$url" --flows smoke_flows --read-block-ms 200 --status-file "$tmp/run/status.json" \
  >worker.log 2>&1 &
worker_pid=$!

started=$("$bin/plaita" executions --redis-url "$url" start smoke --input '{"a": 2, "b": 3}' --execution-id smoke-1 \
  --wait --timeout-s 30 --json) || fail "executions start --wait did not complete: $started"
"$bin/python" -c 'import json, sys; d = json.loads(sys.argv[1]); assert d["status"] == "completed" and d["state"]["doubled"] == 10, d' \
  "$started" || fail "unexpected execution: $started"

"$bin/plaita" enqueue --redis-url "$url" '{"type": "start", "flow_id": "smoke", "execution_id": "smoke-2", "params": {"a": 1, "b": 1}}' \
  >/dev/null || fail "plaita enqueue failed"
done_=""
for _ in $(seq 1 300); do  # at most about 30 s
  shown=$("$bin/plaita" executions --redis-url "$url" show smoke-2 --json 2>/dev/null || true)
  if [ -n "$shown" ] && "$bin/python" -c 'import json, sys; sys.exit(0 if json.loads(sys.argv[1]).get("status") == "completed" else 1)' "$shown" 2>/dev/null; then
    done_=yes
    break
  fi
  sleep 0.1
done
[ -n "$done_" ] || fail "the enqueued execution smoke-2 did not complete"

kill -TERM "$worker_pid"
rc=0
wait "$worker_pid" || rc=$?
worker_pid=""
[ "$rc" -eq 0 ] || fail "the worker exited $rc after SIGTERM"
if grep -q "Traceback" worker.log; then fail "the worker logged a traceback"; fi
cd "$repo"
echo "wheel-smoke: ok ($((SECONDS - started_s)) s: built, installed alone, worker + flow + enqueue + doctor from the wheel)"

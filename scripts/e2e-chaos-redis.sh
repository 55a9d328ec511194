#!/usr/bin/env bash
# End-to-end chaos run a person can watch: a private redis-server (free loopback port, temp
# dir, appendonly; never 6379), one `plaita worker`, and real faults:
#   1. baseline   a task completes
#   2. freeze     SIGSTOP Redis for 12 s, SIGCONT; the worker lives and a new task completes
#   3. kill -9    kill Redis, pause, restart it with its data (same dir and port); the worker
#                 lives, the consumer group survived and a new task completes
#   4. shutdown   SIGTERM: the worker exits 0
# Prints PASS/FAIL per step; exits 0 when all pass, 1 otherwise. Cleans up on any exit.
# --matrix: every fault (freeze 5 s, kill -9 + restart with / without data, proxy blackhole 5 s,
#   proxy connection resets) x (idle, under load, during drain), one private server per cell;
#   prints a table, writes docs/chaos-matrix.md; exits 0 when no cell had an unexpected worker
#   exit or a lost task, else 1. Extra arguments go to `python -m bench.matrix` (see its --help).
# Usage: scripts/e2e-chaos-redis.sh [--matrix [ARGS...]]
set -euo pipefail
cd "$(dirname "$0")/.."

FREEZE_S=12
KILL_PAUSE_S=2
TASK_TIMEOUT_S=30

case "${1:-}" in
  "") ;;
  --matrix)
    shift
    if [ ! -x .venv/bin/python ]; then
      echo "e2e-chaos-redis: $PWD/.venv is missing; run ./scripts/bootstrap.sh first" >&2
      exit 1
    fi
    exec .venv/bin/python -m bench.matrix "$@" ;;
  -h|--help)
    sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
    exit 0 ;;
  *)
    echo "e2e-chaos-redis: unknown argument '$1' (see --help)" >&2
    exit 2 ;;
esac

PY=.venv/bin/python
if [ ! -x "$PY" ]; then
  echo "e2e-chaos-redis: $PWD/.venv is missing; run ./scripts/bootstrap.sh first" >&2
  exit 1
fi
REDIS_BIN=$(command -v redis-server || true)
if [ -z "$REDIS_BIN" ]; then
  echo "e2e-chaos-redis: redis-server is not installed; run ./scripts/bootstrap.sh first" >&2
  exit 1
fi

WORK=$(mktemp -d -t plaita-e2e-chaos.XXXXXX)
REDIS_PID=""
WORKER_PID=""
STARTED_S=$SECONDS
FAILED=0
PASSED=0

cleanup() {
  local rc=$?
  set +e
  if [ -n "$WORKER_PID" ] && kill -0 "$WORKER_PID" 2>/dev/null; then
    kill -TERM "$WORKER_PID" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$WORKER_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$WORKER_PID" 2>/dev/null
    wait "$WORKER_PID" 2>/dev/null
  fi
  if [ -n "$REDIS_PID" ] && kill -0 "$REDIS_PID" 2>/dev/null; then
    kill -CONT "$REDIS_PID" 2>/dev/null
    kill -KILL "$REDIS_PID" 2>/dev/null
    wait "$REDIS_PID" 2>/dev/null
  fi
  if [ "$rc" -ne 0 ] && [ -f "$WORK/worker.log" ]; then
    echo "---- last lines of the worker log ----" >&2
    tail -n 25 "$WORK/worker.log" >&2
  fi
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A free loopback port, never 6379.
PORT=$("$PY" -c '
import socket
while True:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    if port != 6379:
        print(port)
        break
')
if [ "$PORT" = "6379" ]; then echo "e2e-chaos-redis: refusing port 6379" >&2; exit 1; fi
URL="redis://127.0.0.1:$PORT/0"
STREAM="plaita:flow:queue"
GROUP="plaita-workers"
mkdir -p "$WORK/redis"

start_redis() {
  "$REDIS_BIN" --port "$PORT" --bind 127.0.0.1 --dir "$WORK/redis" --daemonize no \
    --appendonly yes --appendfsync always --save "" --logfile "$WORK/redis.log" &
  REDIS_PID=$!
  "$PY" - "$PORT" <<'EOF'
import sys, time, redis
deadline = time.monotonic() + 10
while time.monotonic() < deadline:
    try:
        if redis.Redis(host="127.0.0.1", port=int(sys.argv[1]), socket_timeout=1).ping():
            sys.exit(0)
    except redis.RedisError:
        time.sleep(0.05)
sys.exit("redis-server did not answer within 10 s")
EOF
}

# Polls the worker's status file for up to $2 s; prints every state seen; exit 0 once state $1 was seen
# (with $1 = "-" it only watches for the full $2 s and always succeeds).
watch_states() {
  "$PY" - "$WORK/status.json" "$1" "$2" <<'EOF'
import json, sys, time
path, want, window_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
seen = []
end = time.monotonic() + window_s
while time.monotonic() < end:
    try:
        state = json.load(open(path)).get("state")
    except (OSError, ValueError):
        state = None
    if state and state not in seen:
        seen.append(state)
    if want != "-" and state == want:
        break
    time.sleep(0.05)
print(",".join(seen) or "none")
sys.exit(0 if want == "-" or want in seen else 1)
EOF
}

# Enqueues one task through `plaita enqueue` and waits until it was acked (the worker XDELs
# acked entries) and the worker counted it; prints the seconds it took.
enqueue_and_wait() {
  local label=$1 id before
  before=$(completed)
  id=$("$PY" -m plaita enqueue --redis-url "$URL" "{\"type\":\"start\",\"flow_id\":\"e2e-$label\"}") || return 1
  "$PY" - "$URL" "$STREAM" "$id" "$WORK/status.json" "$before" "$TASK_TIMEOUT_S" <<'EOF'
import json, sys, time, redis
url, stream, mid, status, before, timeout_s = sys.argv[1:7]
client = redis.Redis.from_url(url, socket_timeout=2)
started = time.monotonic()
while time.monotonic() - started < float(timeout_s):
    try:
        gone = client.xrange(stream, mid, mid) == []
        done = json.load(open(status))["counters"]["completed"] > int(before)
    except (redis.RedisError, OSError, ValueError, KeyError):
        gone = done = False
    if gone and done:
        print(f"{time.monotonic() - started:.1f}")
        sys.exit(0)
    time.sleep(0.05)
print(f">{timeout_s}")
sys.exit(1)
EOF
}

completed() {
  "$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["counters"]["completed"])' "$WORK/status.json" \
    2>/dev/null || echo 0
}

worker_alive() { kill -0 "$WORKER_PID" 2>/dev/null; }

result() { # result PASS|FAIL step text
  printf '%-4s  %-9s %s\n' "$1" "$2" "$3"
  if [ "$1" = PASS ]; then PASSED=$((PASSED + 1)); else FAILED=$((FAILED + 1)); fi
}

echo "e2e-chaos-redis: private redis-server on 127.0.0.1:$PORT (appendonly), work dir $WORK"
start_redis
"$PY" -m plaita worker --redis-url "$URL" --handler plaita.runtime.handlers:echo --consumer-name e2e-chaos:0 \
  --status-file "$WORK/status.json" --read-block-ms 200 --reclaim-interval-s 1 --claim-min-idle-ms 5000 \
  2>"$WORK/worker.log" &
WORKER_PID=$!
if ! watch_states READING 15 >/dev/null; then
  result FAIL start "the worker did not reach READING within 15 s"
  exit 1
fi

# 1. baseline
if took=$(enqueue_and_wait baseline); then
  result PASS baseline "a task completed in ${took} s"
else
  result FAIL baseline "a task did not complete within ${TASK_TIMEOUT_S} s"
fi

# 2. freeze Redis (SIGSTOP) for 12 s, then thaw
kill -STOP "$REDIS_PID"
seen=$(watch_states - "$FREEZE_S")
kill -CONT "$REDIS_PID"
if ! worker_alive; then
  result FAIL freeze "the worker died during a ${FREEZE_S} s freeze"
elif took=$(enqueue_and_wait after-freeze); then
  result PASS freeze "frozen ${FREEZE_S} s (worker states: $seen); worker alive; a new task completed in ${took} s"
else
  result FAIL freeze "worker alive but a task enqueued after the thaw did not complete within ${TASK_TIMEOUT_S} s"
fi

# 3. kill -9 Redis, pause, restart with its data on the same dir and port
kill -KILL "$REDIS_PID"
wait "$REDIS_PID" 2>/dev/null || true
REDIS_PID=""
seen=$(watch_states - "$KILL_PAUSE_S")
start_redis
groups=$("$PY" -c '
import sys, redis
c = redis.Redis.from_url(sys.argv[1], socket_timeout=2, decode_responses=True)
print(",".join(g["name"] for g in c.xinfo_groups(sys.argv[2])))' "$URL" "$STREAM" 2>/dev/null || echo none)
if ! worker_alive; then
  result FAIL kill-9 "the worker died after Redis was killed"
elif [ "$groups" != "$GROUP" ]; then
  result FAIL kill-9 "after the restart the stream's groups are '$groups', expected '$GROUP' (data lost?)"
elif took=$(enqueue_and_wait after-kill); then
  result PASS kill-9 "down ${KILL_PAUSE_S} s (worker states: $seen); group kept; worker alive; a new task completed in ${took} s"
else
  result FAIL kill-9 "worker alive but a task enqueued after the restart did not complete within ${TASK_TIMEOUT_S} s"
fi

# 4. graceful stop
rc=0
if ! worker_alive; then
  wait "$WORKER_PID" 2>/dev/null || rc=$?
  WORKER_PID=""
  result FAIL shutdown "the worker was no longer running (exit status $rc)"
else
  kill -TERM "$WORKER_PID"
  for _ in $(seq 100); do worker_alive || break; sleep 0.1; done
  if worker_alive; then
    result FAIL shutdown "the worker did not exit within 10 s of SIGTERM"
  else
    wait "$WORKER_PID" || rc=$?
    WORKER_PID=""
    if [ "$rc" -eq 0 ]; then result PASS shutdown "SIGTERM: exit code 0"; else result FAIL shutdown "exit code $rc"; fi
  fi
fi

outages=$(grep -c "Redis unavailable" "$WORK/worker.log" || true)
backs=$(grep -c "Redis is back" "$WORK/worker.log" || true)
echo "worker log: $outages 'Redis unavailable' warning(s), $backs 'Redis is back' line(s)"
elapsed=$((SECONDS - STARTED_S))
if [ "$FAILED" -eq 0 ]; then
  echo "e2e-chaos-redis: PASS ($PASSED/$((PASSED + FAILED)) steps) in ${elapsed} s"
  exit 0
fi
echo "e2e-chaos-redis: FAIL ($FAILED of $((PASSED + FAILED)) steps failed) in ${elapsed} s"
exit 1

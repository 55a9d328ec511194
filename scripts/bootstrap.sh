#!/usr/bin/env bash
# Idempotent setup for a fresh Debian machine: redis-server (apt), a Python >= 3.11 virtual
# environment in .venv/, and plaita installed in it with its dev tools, the bench extras
# (matplotlib), the dashboard extras and the otel extras (OpenTelemetry API and SDK); Debian's
# chromium for the dashboard's browser test.
# Fast when already done.
set -euo pipefail
cd "$(dirname "$0")/.."

sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi

apt_install() {
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "bootstrap: $* missing and this is not a Debian/Ubuntu machine; install it by hand" >&2
    exit 1
  fi
  echo "bootstrap: installing $* with apt-get" >&2
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq "$@" >/dev/null
}

# Tests, the demo and the benchmarks start private redis-servers; the binary must exist.
if ! command -v redis-server >/dev/null 2>&1; then
  apt_install redis-server
fi
# The TLS tests make their certificates with the openssl command line.
if ! command -v openssl >/dev/null 2>&1; then
  apt_install openssl
fi

# The dashboard's browser test drives the system chromium (Playwright cannot download one
# here); without it that one test is skipped, so a failed install does not stop the setup.
if ! command -v chromium >/dev/null 2>&1; then
  ( apt_install chromium ) || echo "bootstrap: chromium not installed; the dashboard browser test will be skipped" >&2
fi

pick_python() {
  for cand in python3.11 python3.12 python3.13 python3; do
    if command -v "$cand" >/dev/null 2>&1 &&
       "$cand" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
      echo "$cand"; return 0
    fi
  done
  return 1
}

if [ ! -x .venv/bin/python ]; then
  py=$(pick_python) || { apt_install python3 python3-venv; py=$(pick_python); }
  "$py" -m venv .venv 2>/dev/null || { apt_install python3-venv; rm -rf .venv; "$py" -m venv .venv; }
fi

# Reinstall only when the dependency list changed.
stamp=.venv/.plaita-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ] || ! .venv/bin/python -c 'import plaita' 2>/dev/null; then
  echo "bootstrap: installing plaita, its dev tools, the bench, dashboard and otel extras into .venv" >&2
  .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev,bench,dashboard,otel]'
  echo "$want" > "$stamp"
fi

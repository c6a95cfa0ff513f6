#!/usr/bin/env bash
# The test command (README, .ci/run): installs what it needs, then lint, types, tests.
#   bash scripts/test.sh            # everything
#   bash scripts/test.sh -k budget  # extra arguments go to the main suite's pytest (engine suites skipped)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_env.sh

# Debian's Prometheus server and promtool: the tests scrape the demo with the real thing.
if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "== installing prometheus (Debian package)"
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null
  elif [ "${CI:-}" = "true" ]; then
    echo "== CI needs Debian's prometheus package (promtool and the server) and cannot install it" >&2
    exit 1
  else
    echo "== prometheus/promtool not found and cannot apt-get: those tests will be skipped" >&2
  fi
fi

perfsdk_venv "dev,demo,otel,nvtx,bench,sglang,analyze"

echo "== ruff"
"$PY" -m ruff check .
"$PY" -m ruff format --check .
echo "== mypy"
"$PY" -m mypy
if "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "== mypy: the Grafana dashboard against Grafana's typed schema (grafana-foundation-sdk, Python 3.11)"
  "$PY" -m mypy --python-version 3.11 integrations/grafana/build_dashboard.py
fi
echo "== pytest"
set +e
"$PY" -m pytest --ignore=tests/engines "$@"
rc=$?
set -e
if [ "$rc" = 5 ]; then
  echo "pytest collected no tests: that is a failure here" >&2
  exit 1
fi
[ "$rc" = 0 ] || exit "$rc"

# The engine integrations, each against its real engine package in its own venv. Arguments given above
# select tests of the main suite only.
if [ "$#" = 0 ]; then
  engines_rc=0
  bash scripts/test_engine.sh vllm || engines_rc=1
  bash scripts/test_engine.sh sglang || engines_rc=1
  exit "$engines_rc"
fi

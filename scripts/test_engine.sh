#!/usr/bin/env bash
# One engine integration's tests against the real engine package, in that engine's own virtualenv
# (.venv-ENGINE): each engine pins its own torch, so none can share the main test venv. The engine's
# Python code is installed with --no-deps over CPU torch and constraints/ENGINE-cpu.txt: no model runs.
#   bash scripts/test_engine.sh vllm      # scripts/test.sh runs each engine
#   bash scripts/test_engine.sh sglang -k publisher
set -euo pipefail
cd "$(dirname "$0")/.."
ENGINE=${1:?usage: scripts/test_engine.sh vllm|sglang [pytest args]}
shift
case "$ENGINE" in
  vllm) VERSION=0.33.0 ;;
  sglang) VERSION=0.5.23 ;;
  *) echo "unknown engine: $ENGINE (vllm or sglang)" >&2; exit 2 ;;
esac
PYTHON=${PYTHON:-python3}
VENV=.venv-$ENGINE
PY="$VENV/bin/python"

if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "== $ENGINE $VERSION needs Python >= 3.11; $("$PYTHON" --version) cannot run its suite" >&2
  exit 1
fi
[ -x "$PY" ] || { echo "== creating $VENV"; "$PYTHON" -m venv "$VENV"; }
stamp="$VENV/.perfsdk-$ENGINE-$(cat constraints/ci.txt "constraints/$ENGINE-cpu.txt" pyproject.toml setup.py perfsdk/csrc/*.[ch] | cksum | cut -d' ' -f1)"
if [ ! -f "$stamp" ]; then
  echo "== installing $ENGINE $VERSION (its Python code; CPU torch: no model runs) into $VENV"
  "$PY" -m pip install -q --upgrade pip
  "$PY" -m pip install -q -c constraints/ci.txt torch -r "constraints/$ENGINE-cpu.txt" \
    pytest pytest-timeout opentelemetry-sdk "prometheus-client>=0.17"
  "$PY" -m pip install -q --no-deps "$ENGINE==$VERSION"
  "$PY" -m pip install -q --no-deps -e .   # perfsdk (with its vllm.stat_logger_plugins entry point)
  touch "$stamp"
fi
echo "== pytest ($ENGINE $VERSION)"
set +e
"$PY" -m pytest -p no:cacheprovider "tests/engines/test_$ENGINE.py" "$@"
rc=$?
set -e
if [ "$rc" = 5 ]; then
  echo "the $ENGINE suite collected no tests: that is a failure here" >&2
  exit 1
fi
exit "$rc"

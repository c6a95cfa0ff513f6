#!/usr/bin/env bash
# The vLLM integration's tests (tests/engines/test_vllm.py) against the real vllm package, in its own
# virtualenv (.venv-vllm): vLLM pins its own torch, so it cannot share the main test venv.
#   bash scripts/test_vllm.sh            # scripts/test.sh runs this too
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${PERFSDK_VLLM_VENV:-.venv-vllm}
PY="$VENV/bin/python"
VLLM_VERSION=0.33.0

if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "== vLLM $VLLM_VERSION needs Python >= 3.11; $("$PYTHON" --version) cannot run the vLLM suite" >&2
  exit 1
fi
[ -x "$PY" ] || { echo "== creating $VENV"; "$PYTHON" -m venv "$VENV"; }
stamp="$VENV/.perfsdk-vllm-$(cat constraints/ci.txt constraints/vllm-cpu.txt pyproject.toml setup.py perfsdk/_hotpath.c | cksum | cut -d' ' -f1)"
if [ ! -f "$stamp" ]; then
  echo "== installing vllm $VLLM_VERSION (its Python code; CPU torch: no model runs) into $VENV"
  "$PY" -m pip install -q --upgrade pip
  "$PY" -m pip install -q -c constraints/ci.txt torch -r constraints/vllm-cpu.txt \
    pytest pytest-timeout opentelemetry-sdk "prometheus-client>=0.17"
  "$PY" -m pip install -q --no-deps "vllm==$VLLM_VERSION"
  "$PY" -m pip install -q --no-deps -e .   # perfsdk, with its vllm.stat_logger_plugins entry point
  touch "$stamp"
fi
echo "== pytest (vLLM $VLLM_VERSION)"
set +e
"$PY" -m pytest -p no:cacheprovider tests/engines/test_vllm.py "$@"
rc=$?
set -e
if [ "$rc" = 5 ]; then
  echo "the vLLM suite collected no tests: that is a failure here" >&2
  exit 1
fi
exit "$rc"

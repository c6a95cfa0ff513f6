#!/usr/bin/env bash
# The SGLang integration's tests (tests/engines/test_sglang.py) against the real sglang package, in its own
# virtualenv (.venv-sglang): SGLang pins its own torch, so it cannot share the main test venv.
#   bash scripts/test_sglang.sh            # scripts/test.sh runs this too
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${PERFSDK_SGLANG_VENV:-.venv-sglang}
PY="$VENV/bin/python"
SGLANG_VERSION=0.5.23

if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "== SGLang $SGLANG_VERSION needs Python >= 3.11; $("$PYTHON" --version) cannot run the SGLang suite" >&2
  exit 1
fi
[ -x "$PY" ] || { echo "== creating $VENV"; "$PYTHON" -m venv "$VENV"; }
stamp="$VENV/.perfsdk-sglang-$(cat constraints/ci.txt constraints/sglang-cpu.txt pyproject.toml setup.py perfsdk/_hotpath.c | cksum | cut -d' ' -f1)"
if [ ! -f "$stamp" ]; then
  echo "== installing sglang $SGLANG_VERSION (its Python code; CPU torch: no model runs) into $VENV"
  "$PY" -m pip install -q --upgrade pip
  "$PY" -m pip install -q -c constraints/ci.txt torch -r constraints/sglang-cpu.txt \
    pytest pytest-timeout opentelemetry-sdk "prometheus-client>=0.17"
  "$PY" -m pip install -q --no-deps "sglang==$SGLANG_VERSION"
  "$PY" -m pip install -q --no-deps -e .   # perfsdk, with the perfsdk sglang command
  touch "$stamp"
fi
echo "== pytest (SGLang $SGLANG_VERSION)"
set +e
"$PY" -m pytest -p no:cacheprovider tests/engines/test_sglang.py "$@"
rc=$?
set -e
if [ "$rc" = 5 ]; then
  echo "the SGLang suite collected no tests: that is a failure here" >&2
  exit 1
fi
exit "$rc"

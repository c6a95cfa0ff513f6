#!/usr/bin/env bash
# One engine integration's tests against the real engine package, once for each release CI tests — the oldest
# and the newest the integration supports (perfsdk/engines: each hook's _instruments), one constraints file
# each: constraints/ENGINE-VERSION-cpu.txt. Each release runs in its own virtualenv (.venv-ENGINE-VERSION):
# every engine release pins its own torch and dependencies, so none can share the main test venv. The engine's
# Python code is installed with --no-deps over CPU torch and its constraints: no model runs.
#   bash scripts/test_engine.sh vllm                      # vLLM 0.26.0, then 0.33.0 (scripts/test.sh runs each engine)
#   bash scripts/test_engine.sh sglang -k publisher
#   ENGINE_VERSION=0.26.0 bash scripts/test_engine.sh vllm -k worker    # one release
set -euo pipefail
cd "$(dirname "$0")/.."
ENGINE=${1:?usage: scripts/test_engine.sh vllm|sglang [pytest args]}
shift
case "$ENGINE" in
  vllm|sglang) ;;
  *) echo "unknown engine: $ENGINE (vllm or sglang)" >&2; exit 2 ;;
esac
if [ -n "${ENGINE_VERSION:-}" ]; then
  VERSIONS=$ENGINE_VERSION
else
  VERSIONS=$(ls constraints/ | sed -n "s/^$ENGINE-\([0-9][0-9.]*\)-cpu\.txt$/\1/p" | sort -V)
fi
[ -n "$VERSIONS" ] || { echo "no constraints/$ENGINE-VERSION-cpu.txt: no release to test" >&2; exit 2; }
PYTHON=${PYTHON:-python3}

if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "== $ENGINE needs Python >= 3.11; $("$PYTHON" --version) cannot run its suite" >&2
  exit 1
fi

run_one() {  # VERSION [pytest args]
  local version=$1
  shift
  local constraints="constraints/$ENGINE-$version-cpu.txt"
  [ -f "$constraints" ] || { echo "no $constraints: cannot test $ENGINE $version" >&2; return 2; }
  local venv=".venv-$ENGINE-$version"
  local py="$venv/bin/python"
  [ -x "$py" ] || { echo "== creating $venv"; "$PYTHON" -m venv "$venv"; }
  local stamp
  stamp="$venv/.perfsdk-$(cat constraints/ci.txt "$constraints" pyproject.toml setup.py perfsdk/csrc/*.[ch] | cksum | cut -d' ' -f1)"
  if [ ! -f "$stamp" ]; then
    echo "== installing $ENGINE $version (its Python code; CPU torch: no model runs) into $venv"
    "$py" -m pip install -q --upgrade pip
    "$py" -m pip install -q -c constraints/ci.txt torch -r "$constraints" pytest pytest-timeout opentelemetry-sdk
    # perfsdk with its own dependencies (prometheus-client, wrapt) and its engines' entry points; before the
    # engine, whose GPU-only requirements (left out on purpose) pip would otherwise report as missing
    "$py" -m pip install -q -c constraints/ci.txt -e .
    "$py" -m pip install -q --no-deps "$ENGINE==$version"
    touch "$stamp"
  fi
  echo "== pytest ($ENGINE $version)"
  local rc=0
  "$py" -m pytest -p no:cacheprovider "tests/engines/test_$ENGINE.py" "$@" || rc=$?
  if [ "$rc" = 5 ]; then
    echo "the $ENGINE $version suite collected no tests: that is a failure here" >&2
    rc=1
  fi
  return "$rc"
}

status=0
for version in $VERSIONS; do
  run_one "$version" "$@" || status=1
done
exit "$status"

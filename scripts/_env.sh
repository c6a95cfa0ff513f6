# Shared by scripts/test.sh and scripts/demo.sh: a project virtualenv with perfsdk installed editable.
# torch is pinned by constraints/ci.txt (a CPU build; see the comment there); the package itself asks for a range.
PYTHON=${PYTHON:-python3}
VENV=${PERFSDK_VENV:-.venv}
PY="$VENV/bin/python"

perfsdk_venv() {
  local extras=$1
  if [ ! -x "$PY" ]; then
    echo "== creating $VENV"
    "$PYTHON" -m venv "$VENV"
  fi
  local stamp="$VENV/.perfsdk-$(echo "$extras" | tr ',' '-')-$(cat pyproject.toml setup.py perfsdk/csrc/*.[ch] constraints/ci.txt | cksum | cut -d' ' -f1)"
  if [ ! -f "$stamp" ]; then
    echo "== installing perfsdk[$extras] into $VENV"
    "$PY" -m pip install -q --upgrade pip
    "$PY" -m pip install -q -c constraints/ci.txt -e ".[$extras]"
    touch "$stamp"
  fi
}

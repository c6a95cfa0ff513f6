#!/usr/bin/env bash
# The main job (README): a real instrumented LLM server on loopback, streaming load, and a report.
#   bash scripts/demo.sh                 # about a minute on a 2-core CPU
#   bash scripts/demo.sh --serve         # keep the server up afterwards; extra arguments go to `perfsdk demo`
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_env.sh
perfsdk_venv "demo,otel"
exec "$PY" -m perfsdk.cli demo "$@"

#!/usr/bin/env bash
# Start the calculator: makes .venv, installs cabe with the web extra, serves on 127.0.0.1.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q -e '.[hub,web]'
exec .venv/bin/cabe serve "$@"

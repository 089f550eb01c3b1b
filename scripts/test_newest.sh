#!/usr/bin/env bash
# The second CI lane (issue 29): the trace smoke against the newest releases the package index offers, inside
# pyproject's supported window and without constraints.txt, so that a transformers / PEFT / bitsandbytes /
# accelerate release that breaks the trace is seen the day it is installed. Builds .venv-newest from nothing
# (torch pinned to the CPU wheel in the same command, see README), prints the versions it got, runs `pytest -m smoke`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
V=${VENV:-.venv-newest}
rm -rf "$V"
"$PY" -m venv "$V"
"$V"/bin/python -m pip install -q --upgrade -e '.[trace,rl,fp8,test]' 'torch==2.13.0'
"$V"/bin/python -m pip list 2>/dev/null | grep -iE '^(torch|transformers|peft|bitsandbytes|accelerate|kernels) '
exec "$V"/bin/python -m pytest -q -p no:cacheprovider -m smoke tests/trace/test_smoke.py tests/trace/test_compat.py "$@"

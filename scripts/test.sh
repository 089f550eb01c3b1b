#!/usr/bin/env bash
# The whole test suite from nothing: makes .venv, installs cabe with every extra, installs
# Chromium for the browser tests (Debian's package; needs root or sudo), runs pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
# torch pinned in the same command as everything that depends on it (a CPU wheel, see README);
# every other version pinned by constraints.txt, so a run today and a run next year install the same;
# DeepSpeed (the [deepspeed] extra) builds no op: DS_BUILD_OPS=0 says so where a CUDA toolkit is present
DS_BUILD_OPS=0 .venv/bin/python -m pip install -q -c constraints.txt -e '.[hub,web,trace,rl,fp8,deepspeed,test,browser,dev]' 'torch==2.13.0'
if ! command -v chromium >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  ($SUDO apt-get update -qq && $SUDO apt-get install -y -qq chromium >/dev/null) \
    || echo "warning: could not install chromium; browser tests will be skipped" >&2
fi
exec .venv/bin/python -m pytest -n 2 "$@"

#!/usr/bin/env bash
# Rewrites constraints.txt from what .venv has installed (after a deliberate upgrade of a dependency).
set -euo pipefail
cd "$(dirname "$0")/.."
{
  echo "# Exact versions the test suite and CI run with (pip install -c constraints.txt ...)."
  echo "# Regenerate after a deliberate upgrade: scripts/lock.sh. torch is the CPU wheel (see README)."
  .venv/bin/python -m pip freeze --exclude-editable | sed -E 's/^torch==([0-9.]+)\+cpu$/torch==\1/'
} > constraints.txt

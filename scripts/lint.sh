#!/usr/bin/env bash
# Lint, format and type checks (run by CI after scripts/test.sh, which makes .venv).
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check src tests benchmarks scripts
.venv/bin/ruff format --check src tests benchmarks scripts
.venv/bin/mypy
# the README's and guides' example output is real: each `$ cabe ...` block re-run and compared
.venv/bin/python scripts/update_docs.py --check

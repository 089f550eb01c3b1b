"""Trace tests: import cabe.trace before torch so the fake-CUDA shim can be installed in-process."""

import sys
from pathlib import Path

import cabe.trace  # noqa: F401  (must precede the first `import torch`)

sys.path.insert(0, str(Path(__file__).parent))

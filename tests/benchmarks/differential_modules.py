"""The differential benchmarks' scripts (benchmarks/differential/), loaded as modules for the seeded samples."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parents[2] / "benchmarks" / "differential"


def load(name: str) -> ModuleType:
    """``benchmarks/differential/<name>.py`` as a module (its directory importable: multigpu.py imports run.py)."""
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    spec = importlib.util.spec_from_file_location(f"differential_{name}", HERE / f"{name}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod

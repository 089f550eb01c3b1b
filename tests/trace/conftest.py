"""Trace tests: import cabe.trace before torch so the fake-CUDA shim can be installed in-process."""

import sys
from pathlib import Path

import cabe.trace  # noqa: F401  (must precede the first `import torch`)

sys.path.insert(0, str(Path(__file__).parent))


def fake_trace(config, setup, steps=2):
    """A fake-CUDA trace with events: in this process when the shim is loaded (cabe.trace was
    imported before torch), else in a subprocess (another test module imported torch first)."""
    from cabe.trace import _native
    from cabe.trace.engine import TraceResult, _subprocess, run_trace

    if _native.available():
        return run_trace(config, setup, steps, "fake")
    return TraceResult.from_json(_subprocess("trace", config, setup, steps, include_events=True))

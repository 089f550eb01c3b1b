"""The trace worker's server: ``python -m cabe.trace.serve`` runs in the second interpreter that
:mod:`cabe.trace.worker` starts, where the fake-CUDA shim is loaded before torch. ``--serve``: one JSON request per
line on stdin, one JSON response per line on stdout (anything else the libraries print goes to stderr); without it,
one request read from stdin.

Requests: ``{"fn": "trace"|"inventory", "config": {...}, "setup": {...}, "steps": n,
"include_events": bool}``, or ``{"fn": "generate", ...}`` (:func:`cabe.trace.generate.request`); responses: the result (``TraceResult.to_json`` with the note codes), or
``{"error": {...}}`` for a cabe error. Proved by tests/trace/test_errors.py and tests/web/test_unknown_architecture_api.py.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from cabe.errors import CabeError
from cabe.trace import _native
from cabe.trace.engine import layer_inventory, trace_step
from cabe.training import TrainingSetup


def _error(exc: Exception) -> dict[str, Any]:
    if isinstance(exc, CabeError):
        return {
            "type": type(exc).__name__,
            "code": exc.code,
            "field": exc.field,
            "params": {
                k: (v if isinstance(v, (str, int, float, bool)) or v is None else str(v)) for k, v in exc.params.items()
            },
        }
    return {
        "type": "ConfigError",
        "code": "trace_failed",
        "field": None,
        "params": {"why": "exception", "detail": f"{type(exc).__name__}: {str(exc)[:400]}"},
    }


def handle(payload: dict[str, Any]) -> dict[str, Any]:
    """The answer to one request."""
    from cabe.trace.tracker import NO_WORKSPACES_ENV

    if payload.get("no_workspaces"):
        os.environ[NO_WORKSPACES_ENV] = "1"
    else:
        os.environ.pop(NO_WORKSPACES_ENV, None)
    try:
        if payload["fn"] == "generate":  # transformers' generate (cabe.trace.generate)
            from cabe.trace.generate import handle_request

            return handle_request({k: v for k, v in payload.items() if k != "fn"})
        sd = dict(payload["setup"])
        if isinstance(sd.get("lora_targets"), list):
            sd["lora_targets"] = tuple(sd["lora_targets"])
        setup = TrainingSetup(**sd)
        if payload["fn"] == "inventory":
            return {"rows": layer_inventory(payload["config"], setup, mode="fake")}
        res = trace_step(payload["config"], setup, steps=payload["steps"], mode="fake")
        return res.to_json(include_events=bool(payload.get("include_events")), note_codes=True)
    except Exception as exc:
        return {"error": _error(exc)}


def main(argv: list[str] | None = None) -> int:
    _native.preload()
    argv = sys.argv[1:] if argv is None else argv
    out = sys.stdout
    sys.stdout = sys.stderr  # keep library chatter off the protocol channel
    if "--serve" in argv:
        for line in sys.stdin:
            if not line.strip():
                continue
            out.write(json.dumps(handle(json.loads(line))) + "\n")
            out.flush()
        return 0
    out.write("\n" + json.dumps(handle(json.loads(sys.stdin.read()))) + "\n")
    out.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

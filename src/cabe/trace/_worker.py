"""Subprocess entry point: traces with the fake-CUDA shim loaded before torch.

``python -m cabe.trace._worker``: reads one JSON request on stdin, writes one JSON line.
``python -m cabe.trace._worker --serve``: a long-lived worker, one JSON request per line on
stdin, one JSON response per line on stdout (anything else the libraries print goes to
stderr). Requests: ``{"fn": "trace"|"inventory", "config": {...}, "setup": {...}, "steps": n,
"include_events": bool}``; responses: the result, or ``{"error": {...}}`` for a cabe error.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def handle(payload: dict[str, Any]) -> dict[str, Any]:
    from cabe.errors import CabeError
    from cabe.training import TrainingSetup

    try:
        sd = dict(payload["setup"])
        if isinstance(sd.get("lora_targets"), list):
            sd["lora_targets"] = tuple(sd["lora_targets"])
        setup = TrainingSetup(**sd)
        if payload["fn"] == "inventory":
            from cabe.trace.engine import layer_inventory

            return {"rows": layer_inventory(payload["config"], setup, mode="fake")}
        from cabe.trace.engine import trace_step

        res = trace_step(payload["config"], setup, steps=payload["steps"], mode="fake")
        return res.to_json(include_events=bool(payload.get("include_events")))
    except CabeError as exc:
        return {
            "error": {
                "type": type(exc).__name__,
                "code": exc.code,
                "field": exc.field,
                "params": {
                    k: (v if isinstance(v, (str, int, float, bool)) or v is None else str(v))
                    for k, v in exc.params.items()
                },
            }
        }
    except Exception as exc:
        return {
            "error": {
                "type": "ConfigError",
                "code": "trace_failed",
                "field": None,
                "params": {"reason": f"{type(exc).__name__}: {str(exc)[:400]}"},
            }
        }


def main(argv: list[str] | None = None) -> int:
    from cabe.trace import _native

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

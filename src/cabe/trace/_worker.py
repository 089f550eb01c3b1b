"""Subprocess entry point: run one trace with the fake-CUDA shim loaded before torch.

Reads ``{"fn": "trace"|"inventory", "config": {...}, "setup": {...}, "steps": n}`` as JSON on
stdin and writes one JSON line on stdout: the result, or ``{"error": {...}}`` for a cabe error.
"""

from __future__ import annotations

import json
import sys


def main() -> int:
    from cabe.trace import _native

    _native.preload()
    payload = json.loads(sys.stdin.read())
    from cabe.errors import CabeError
    from cabe.training import TrainingSetup

    try:
        sd = dict(payload["setup"])
        if isinstance(sd.get("lora_targets"), list):
            sd["lora_targets"] = tuple(sd["lora_targets"])
        setup = TrainingSetup(**sd)
        from cabe.trace.engine import run_trace

        if payload["fn"] == "inventory":
            from cabe.trace.engine import layer_inventory

            out = {"rows": layer_inventory(payload["config"], setup, mode="fake")}
        else:
            from cabe.trace.engine import trace_step

            res = trace_step(payload["config"], setup, steps=payload["steps"], mode="fake")
            out = res.to_json(include_events=bool(payload.get("include_events")))
        del run_trace
    except CabeError as exc:
        out = {"error": {"type": type(exc).__name__, "code": exc.code, "field": exc.field,
                         "params": {k: (v if isinstance(v, (str, int, float, bool)) or v is None else str(v))
                                    for k, v in exc.params.items()}}}
    sys.stdout.write("\n" + json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

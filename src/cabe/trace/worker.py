"""The trace worker, this process's side: a second interpreter where the fake-CUDA shim is loaded before torch.

When torch was imported before :mod:`cabe.trace`, the shim cannot be installed in-process, so
:func:`request` sends each trace to a long-lived ``python -m cabe.trace.serve --serve`` (torch
is imported once; the other side is :mod:`cabe.trace.serve`): one JSON request per line on stdin, one JSON
response per line on stdout (anything else the libraries print goes to stderr).

Requests: ``{"fn": "trace"|"inventory", "config": {...}, "setup": {...}, "steps": n,
"include_events": bool}``, or ``{"fn": "generate", ...}`` (:func:`cabe.trace.generate.request`); responses: the result (``TraceResult.to_json`` with the note codes), or
``{"error": {...}}`` for a cabe error.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
from typing import Any

from cabe.errors import CabeError, ConfigError
from cabe.training import TrainingSetup

# ---- the client (in the process that traces) ------------------------------------------------
#: Seconds one trace may take in the worker before it is stopped (the server answers a typed error and starts
#: a fresh worker for the next request): a fake-tensor step of a 70B model takes about a minute on two cores,
#: so ten leave room while no request holds the server's one worker for hours. ``CABE_TRACE_TIME_LIMIT``
#: overrides it (seconds).
TIME_LIMIT_ENV = "CABE_TRACE_TIME_LIMIT"
DEFAULT_TIME_LIMIT = 600.0


def time_limit() -> float:
    try:
        value = float(os.environ.get(TIME_LIMIT_ENV, DEFAULT_TIME_LIMIT))
    except ValueError:
        return DEFAULT_TIME_LIMIT
    return value if value > 0 else DEFAULT_TIME_LIMIT


class _Worker:
    """A long-lived ``python -m cabe.trace.serve --serve`` (torch is imported once)."""

    def __init__(self) -> None:
        self.proc: Any = None
        self.lock = threading.Lock()

    def _start(self) -> None:
        env = dict(os.environ)
        src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cabe.trace.serve", "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )

    def request(self, payload: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            for _attempt in (0, 1):
                if self.proc is None or self.proc.poll() is not None:
                    self._start()
                limit = time_limit()
                try:
                    self.proc.stdin.write(json.dumps(payload) + "\n")
                    self.proc.stdin.flush()
                    ready, _, _ = select.select([self.proc.stdout], [], [], limit)
                    line = self.proc.stdout.readline() if ready else None
                except (BrokenPipeError, OSError):
                    line = ""
                if line is None:  # over the time limit: stopped, and a fresh worker for the next request
                    self.proc.kill()
                    self.proc.wait()
                    self.proc = None
                    raise ConfigError("trace_failed", None, why="time_limit", seconds=f"{limit:g}")
                if line:
                    return json.loads(line)
                self.proc = None  # died (e.g. killed for memory): one fresh try
            raise ConfigError("trace_failed", None, why="worker_exited")


_WORKER = _Worker()


def request(
    fn: str, config: dict[str, Any], setup: TrainingSetup, steps: int, include_events: bool = False
) -> dict[str, Any]:
    """Run one trace in the worker; its cabe errors are raised here, as the same types."""
    from cabe.trace.tracker import NO_WORKSPACES_ENV

    out = _WORKER.request(
        {
            "fn": fn,
            "config": config,
            "setup": setup.to_dict(),
            "steps": steps,
            "include_events": include_events,
            # the worker lives on between requests: this process's switch travels with each one
            "no_workspaces": os.environ.get(NO_WORKSPACES_ENV) == "1",
        }
    )
    return _raised(out)


def request_generate(req: dict[str, Any]) -> dict[str, Any]:
    """Trace transformers' ``generate`` in the worker (:mod:`cabe.trace.generate`; ``req``: its ``request``)."""
    return _raised(_WORKER.request({"fn": "generate", **req}))


def _raised(out: dict[str, Any]) -> dict[str, Any]:
    """The worker's answer, or its cabe error raised here as the same type."""
    if "error" in out:
        err = out["error"]
        import cabe.errors as errors

        cls = getattr(errors, err.get("type", "ConfigError"), ConfigError)
        if not (isinstance(cls, type) and issubclass(cls, CabeError)):
            cls = ConfigError
        raise cls(err["code"], err.get("field"), **err.get("params", {}))
    return out

"""A small seeded sample of the fuzz and abuse harness (benchmarks/fuzz/run.py; the full run prints
the counts of 5,000 CLI vectors and 6,000 HTTP requests): no internal error, no non-finite output, no
5xx, no traceback, nothing logged."""

from __future__ import annotations

import importlib.util
import socket
import sys
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("schemathesis")

pytestmark = pytest.mark.fuzz

_DIR = Path(__file__).parents[2] / "benchmarks" / "fuzz"


@pytest.fixture(scope="module")
def harness():
    sys.path.insert(0, str(_DIR))
    spec = importlib.util.spec_from_file_location("fuzz_run", _DIR / "run.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    yield mod
    sys.path.remove(str(_DIR))


@pytest.fixture()
def fake(harness, monkeypatch, tmp_path):
    hub = harness.fakehub.FakeHub(slow_s=2.0).start()
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    from cabe import hub as hub_module

    monkeypatch.setattr(hub_module, "CLI", hub_module.Policy(timeout_s=0.3, total_s=0.8, retries=1))
    yield hub
    hub.stop()


def test_cli_sample(harness, fake, tmp_path, monkeypatch):
    from cabe.cli import trace as trace_cmd

    monkeypatch.setattr(trace_cmd, "gather", _validated_only(trace_cmd))
    files = harness.hostile_files(tmp_path)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        counts = harness.run_cli(200, 12, files, busy.getsockname()[1])
    assert counts["vectors"] == 200
    assert counts["internal_errors"] == 0 and counts["non_finite_outputs"] == 0 and counts["escaped"] == 0, counts
    assert counts["exit_0"] > 0 and counts["exit_2"] > 0  # both kinds of answer were exercised


def _validated_only(trace_cmd):
    """``cabe trace`` up to the engine (a trace takes seconds): the inputs are validated, then stop."""

    def gather(args):
        trace_cmd.inputs(args, "trace")
        return {"peak_bytes": 1}

    return gather


def test_http_sample(harness, fake):
    counts = harness.run_http(200, 12, fake.url)
    assert counts["requests"] >= 200
    assert counts["server_errors"] == 0 and counts["tracebacks_in_responses"] == 0, counts
    assert counts["logged_errors"] == 0 and counts["logged_tracebacks"] == 0 and counts["logged_unvalidated"] == 0

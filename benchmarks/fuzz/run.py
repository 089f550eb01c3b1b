"""The fuzz and abuse harness (issue 12): prints counts, exits 1 when an invariant breaks.

    PYTHONPATH=src python benchmarks/fuzz/run.py                      # 5,000 CLI vectors, 6,000 HTTP requests, hub latency
    PYTHONPATH=src python benchmarks/fuzz/run.py --cli 300 --http 300 --latency 100 --seed 7   # a quick run

Three parts, each in-process (the machine has few cores):

1. **CLI**: random argument vectors over every subcommand (flags and choices read from the parser
   itself), values drawn from a pool of hostile ones (non-finite and 5,000-digit numbers, NUL bytes,
   4,000-character names, hostile files: 100,000-deep JSON, deep YAML, NaN configs, 10^300 layers,
   2 MiB files, directories, other formats) and Hub ids served by a fake hub on 127.0.0.1 (slow, huge,
   gated, lying). ``cabe.cli.main`` is called with captured output. Invariants: the exit code is 0 or
   2, never an "Internal error" or a traceback, and every ``--json`` output parses as strict JSON (no
   ``NaN`` / ``Infinity``). ``cabe trace`` / ``measure`` run up to the engine, which is stubbed (a
   trace takes seconds); ``cabe serve`` gets only ports that are bad or in use (a good one would serve).
2. **HTTP**: schemathesis cases from the OpenAPI document (positive and negative), and hostile
   requests of our own over every route (the page, ``/fragment``, static files, unknown routes and
   methods, bodies that are not JSON, not UTF-8, too large, 5,000 levels deep, with ``NaN``,
   spoofed ``Origin`` / ``Host``), through a Starlette ``TestClient`` of an app with ``--allow-hub``
   on the fake hub. Invariants: no 5xx, no traceback in a response, no error logged (the edge's
   "internal error" line, or "unvalidated input reached the core").
3. **Hub latency**: a real uvicorn server on 127.0.0.1 with ``--allow-hub``; 8 threads keep asking for
   slow, trickling, huge and lying Hub ids while preset requests are timed one after another. Target:
   p99 of the preset requests under 50 ms.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import random
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import fakehub  # noqa: E402

# ------------------------------------------------------------------------------------------ values

NUMBERS = [
    "0",
    "-1",
    "1",
    "7",
    "8",
    "4096",
    "1e999",
    "-1e999",
    "nan",
    "inf",
    "-inf",
    "1e308",
    "9" * 5000,
    "1_000",
    "7,5",
    "0.0000001",
    "",
    " ",
    "abc",
    "0x10",
    "1e-320",
    "2048",
    "131072",
    "65536",
    "3",
]
STRINGS = [
    "",
    " ",
    "x" * 4000,
    "../../etc/passwd",
    "é\u202e",
    "a,b,,c",
    "all-linear",
    "q_proj,v_proj",
    "<script>alert(1)</script>",
    "\x00",
    "'; DROP TABLE",
    "{{7*7}}",
    "%s%n",
    "-",
    "--json",
]
SANE = ["1", "2", "4", "8", "16", "64", "512", "1024", "2048", "0.5", "3"]
HUB_IDS = [
    "org/ok-a",
    "org/slow-a",
    "org/trickle-a",
    "org/huge-a",
    "org/liar-a",
    "org/gated-a",
    "org/missing-a",
    "org/noconfig-a",
    "org/nan-a",
    "org/../x",
    "a/b/c",
]
PRESETS = ["llama-7b", "llama-3.2-1b", "gpt2", "mixtral-8x7b", "qwen3-8b", "gemma-2-2b", "LLAMA-7B", "llama-99b"]


def hostile_files(root: Path) -> list[str]:
    """Files a careless or hostile user could name."""
    llama = dict(fakehub.CONFIG)
    files = {
        "deep.json": "[" * 100_000 + "]" * 100_000,
        "deep.yaml": "a: " + "[" * 5000 + "]" * 5000,
        "nan.json": json.dumps(llama).replace("2048", "NaN", 1),
        "inf.json": json.dumps(llama).replace("2048", "1e999", 1),
        "layers.json": json.dumps({**llama, "num_hidden_layers": 10**300}),
        "digits.json": json.dumps(llama).replace("2048", "9" * 5000, 1),
        "wide.json": json.dumps({**llama, "hidden_size": 10**12}),
        "head0.json": json.dumps({**llama, "hidden_size": 16}),
        "list.json": "[1, 2]",
        "empty.json": "",
        "junk.json": "\xff\xfe{not json",
        "good.json": json.dumps(llama),
        "adapter_config.json": json.dumps({"peft_type": "LORA", "r": 8, "target_modules": 5}),
        "adapter_ok.json": json.dumps({"peft_type": "LORA", "r": 8, "target_modules": ["q_proj"]}),
        "ds.json": json.dumps({"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": "auto"}),
        "args.yaml": "per_device_train_batch_size: .inf\nlearning_rate: .nan\n",
        "bomb.yaml": "a: &a [x, x]\nb: &b [*a, *a]\nc: &c [*b, *b]\nd: [*c, *c]\n",
        "big.json": "{" + '"k": 1,' * 300_000 + '"z": 0}',
    }
    out = []
    for name, text in files.items():
        p = root / name
        p.write_bytes(text.encode("utf-8", "surrogateescape") if name != "junk.json" else b"\xff\xfe{not json")
        out.append(str(p))
    (root / "adir").mkdir(exist_ok=True)
    out += [str(root / "adir"), str(root / "missing.json"), "x" * 5000 + ".json", "/dev/null", "."]
    out += [str(p) for p in sorted((Path(__file__).parents[2] / "tests" / "configs" / "files").glob("*"))]
    return out


# ------------------------------------------------------------------------------------------ CLI


def subcommands() -> dict[str, list[argparse.Action]]:
    from cabe.cli.parser import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {name: list(p._actions) for name, p in sub.choices.items()}


def _value(rng: random.Random, action: argparse.Action, files: list[str]) -> list[str]:
    if action.nargs == 0:
        return []
    if action.choices and rng.random() < 0.7:
        return [str(rng.choice(list(action.choices)))]
    dest = action.dest
    if dest in ("model", "m"):
        pool = PRESETS + HUB_IDS + files + STRINGS
    elif dest in ("files", "paths", "config", "file"):
        pool = files
    else:
        r = rng.random()
        pool = SANE if r < 0.5 else NUMBERS + STRINGS if r < 0.9 else files
    n = 1 if action.nargs in (None, "?") else rng.randint(1, 3)
    return [rng.choice(pool) for _ in range(n)]


def vector(
    rng: random.Random, commands: dict[str, list[argparse.Action]], files: list[str], busy_port: int
) -> list[str]:
    name = rng.choice(sorted(commands))
    argv = [name]
    actions = [a for a in commands[name] if a.option_strings and "-h" not in a.option_strings]
    positional = [a for a in commands[name] if not a.option_strings]
    if name in ("estimate", "fit", "infer", "lora", "trace", "measure") and rng.random() < 0.8:
        argv += ["--model", rng.choice(PRESETS + HUB_IDS + files)]
    for a in positional:
        argv += _value(rng, a, files) or [rng.choice(files)]
    for a in rng.sample(actions, min(len(actions), rng.randint(0, 4))):
        argv += [rng.choice(a.option_strings), *_value(rng, a, files)]
    if name == "serve":  # never a port that would serve
        argv = ["serve", "--port", rng.choice(["70000", "0", "-5", "abc", str(busy_port), "1e999"])]
        argv += ["--host", rng.choice(["127.0.0.1", "999.1.1.1", "no-such.invalid", "x" * 300])]
    if rng.random() < 0.5:
        argv.append("--json")
    return argv


def strict_json(text: str) -> bool:
    def refuse(c: str) -> Any:
        raise ValueError(c)

    try:
        json.loads(text, parse_constant=refuse)
        return True
    except ValueError:
        return False


def run_cli(n: int, seed: int, files: list[str], busy_port: int) -> Counter[str]:
    from cabe.cli import main

    rng = random.Random(seed)
    commands = subcommands()
    counts: Counter[str] = Counter({"internal_errors": 0, "non_finite_outputs": 0, "escaped": 0})
    for _ in range(n):
        argv = vector(rng, commands, files, busy_port)
        out, err = io.StringIO(), io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                rc = main(argv)
        except SystemExit as exc:  # argparse's own refusals (unknown flag, bad choice): exit 2
            rc = exc.code if isinstance(exc.code, int) else 2
        except EngineReached:
            rc = 0
        except Exception as exc:  # escaped main(): the worst failure
            counts["escaped"] += 1
            print("ESCAPED", argv[:8], repr(exc)[:200], file=sys.stderr)
            continue
        e = err.getvalue()
        counts["vectors"] += 1
        counts[f"exit_{rc}"] += 1
        if rc not in (0, 2) or "Internal error" in e or "Traceback" in e:
            counts["internal_errors"] += 1
            print("INTERNAL", [a[:60] for a in argv[:12]], e.strip()[-300:], file=sys.stderr)
        if "--json" in argv and out.getvalue().strip():
            body = out.getvalue()
            if not strict_json(body):  # a bare NaN / Infinity token (the text "NaN" in a string is fine)
                counts["non_finite_outputs"] += 1
                print("NONFINITE", argv[:10], file=sys.stderr)
    return counts


class EngineReached(BaseException):
    """The trace engine was reached: the request passed validation (the engine itself is not fuzzed)."""


def stub_engine() -> None:
    try:
        from cabe.trace import cli as trace_cli
    except ImportError:
        return

    def run(*a: Any, **k: Any) -> Any:
        raise EngineReached

    trace_cli.run = run  # type: ignore[assignment]
    try:
        from cabe.cli import measure

        measure_gather = measure.gather

        def gather(args: Any) -> Any:
            from cabe.cli import trace as trace_cmd

            trace_cmd.inputs(args, "measure")
            raise EngineReached

        measure.gather = gather  # type: ignore[assignment]
        del measure_gather
    except ImportError:
        pass


# ------------------------------------------------------------------------------------------ HTTP


class LogCounter(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _json_value(rng: random.Random, depth: int = 0) -> Any:
    r = rng.random()
    if r < 0.25:
        return rng.choice([0, -1, 1, 7, 2**70, -(2**63), 1.5, 1e300, -0.0, True, False, None])
    if r < 0.5:
        return rng.choice(STRINGS + PRESETS + HUB_IDS + ["nf4", "lora", "qlora", "full", "bf16", "h100-80gb"])
    if r < 0.7 and depth < 3:
        return [_json_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if r < 0.85 and depth < 3:
        return {rng.choice(["a", "hidden_size", "model_type", "x"]): _json_value(rng, depth + 1) for _ in range(2)}
    return rng.choice(["NaN", "Infinity", "1e999", "9" * 400])  # as text, or raw (below)


def hostile_request(rng: random.Random, fields: dict[str, tuple[str, ...]]) -> dict[str, Any]:
    """One request of our own: a route, a method, headers and a body."""
    route = rng.choice(
        [
            "/api/estimate",
            "/api/fit",
            "/api/infer",
            "/api/lora",
            "/fragment",
            "/",
            "/static/x",
            "/static/../../etc/passwd",
            "/api/models",
            "/api/gpus",
            "/api/health",
            "/openapi.json",
            "/nope",
            "/favicon.ico",
            "/static/app.js",
        ]
    )
    method = rng.choice(["POST"] * 6 + ["GET", "PUT", "DELETE", "OPTIONS", "PATCH", "HEAD"])
    headers: dict[str, str] = {"content-type": rng.choice(["application/json"] * 4 + ["text/plain", "x/y"])}
    if rng.random() < 0.1:
        headers["origin"] = rng.choice(["https://evil.example", "null", "http://testserver", "http://[bad"])
    if rng.random() < 0.05:
        headers["host"] = rng.choice(["evil.example", "testserver", "127.0.0.1:8000", "[::1", ""])
    if rng.random() < 0.3:
        headers["accept-language"] = rng.choice(["es", "xx", "es-ES,es;q=0.9", ";;;q=abc", "*" * 500])
    keys = fields.get(route, ("model", "config", "query"))
    body: Any = {rng.choice(keys + ("junk",)): _json_value(rng) for _ in range(rng.randint(0, 5))}
    if route == "/fragment":
        body = {
            "query": "&".join(f"{rng.choice(keys)}={rng.choice(NUMBERS + STRINGS + PRESETS)}" for _ in range(4)),
            **({"config": _json_value(rng)} if rng.random() < 0.4 else {}),
        }
    if route.startswith("/api/") and rng.random() < 0.04:  # the Hub, through the fake one
        body = {"model": rng.choice(HUB_IDS), **({"gpu": "h100-80gb"} if route == "/api/fit" else {})}
    raw = json.dumps(body)
    r = rng.random()
    if r < 0.08:  # a number no strict parser takes, raw
        raw = raw.replace('"NaN"', "NaN").replace('"Infinity"', "Infinity").replace('"1e999"', "1e999")
        raw = raw.replace('"' + "9" * 400 + '"', "9" * 5000)
    elif r < 0.1:
        raw = "[" * 5000 + "]" * 5000
    elif r < 0.12:
        raw = "{" + " " * (300 * 1024) + "}"
    elif r < 0.14:
        raw = "\xff\xfe"
    elif r < 0.16:
        raw = "{not json"
    params = {}
    if method in ("GET", "HEAD") and route == "/":
        params = {rng.choice(keys): rng.choice(NUMBERS + STRINGS + PRESETS + HUB_IDS) for _ in range(rng.randint(0, 6))}
    return {
        "method": method,
        "url": route,
        "headers": headers,
        "content": raw.encode("utf-8", "surrogateescape"),
        "params": params,
    }


def run_http(n: int, seed: int, hub_url: str) -> Counter[str]:
    import schemathesis
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis.errors import Unsatisfiable
    from starlette.testclient import TestClient

    from cabe import hub, schema
    from cabe.web.app import create_app

    server_hub = hub.ServerHub(hub.Policy(timeout_s=0.5, total_s=1.0, retries=0))
    app = create_app(hub=server_hub, allowed_hosts=("testserver", "127.0.0.1", "localhost"))
    logs = LogCounter()
    for name in ("cabe", "uvicorn", "starlette", ""):
        logging.getLogger(name).addHandler(logs)
    counts: Counter[str] = Counter({"server_errors": 0, "tracebacks_in_responses": 0})

    def check(status: int, text: str, what: str) -> None:
        counts["requests"] += 1
        counts[f"status_{status // 100}xx"] += 1
        if status >= 500:
            counts["server_errors"] += 1
            print("5XX", what[:200], text[:300], file=sys.stderr)
        if "Traceback" in text:
            counts["tracebacks_in_responses"] += 1

    # 1. schemathesis: a share of the budget over every operation, positive and negative cases
    api = schemathesis.openapi.from_asgi("/openapi.json", app)
    ops = [o.ok() for o in api.get_all_operations()]
    per_op = max(1, (n // 2) // max(1, len(ops)))
    for op in ops:
        for mode in ("positive", "negative"):
            from schemathesis.generation import GenerationMode

            strategy = op.as_strategy(generation_mode=GenerationMode(mode))

            @settings(
                max_examples=per_op // 2,
                deadline=None,
                database=None,
                phases=[Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
            @given(case=strategy)
            def one(case: Any) -> None:
                body = case.body
                if isinstance(body, dict) and isinstance(body.get("model"), str) and "/" in body["model"]:
                    body["model"] = "org/ok-" + str(abs(hash(body["model"])) % 50)  # the fake hub, not the net
                r = case.call()
                check(r.status_code, r.text, f"{case.method} {case.path} {str(case.body)[:100]}")

            try:
                one()
            except Unsatisfiable:  # no negative case exists (a GET without parameters)
                counts["schemathesis_unsatisfiable_ops"] += 1
    # 2. our own hostile requests, for the rest of the budget
    rng = random.Random(seed)
    fields = {f"/api/{c}": schema.accepted(f"api.{c}") for c in ("estimate", "fit", "infer", "lora")}
    fields["/"] = schema.names("estimate", output=True)
    fields["/fragment"] = fields["/"]
    with TestClient(app, raise_server_exceptions=False) as c:
        while counts["requests"] < n:
            req = hostile_request(rng, fields)
            try:
                r = c.request(
                    req["method"], req["url"], headers=req["headers"], content=req["content"], params=req["params"]
                )
            except Exception as exc:  # the client itself refused to send it (a malformed header)
                counts["unsendable"] += 1
                del exc
                continue
            check(r.status_code, r.text, f"{req['method']} {req['url']} {req['content'][:100]!r}")
    for name in ("cabe", "uvicorn", "starlette", ""):
        logging.getLogger(name).removeHandler(logs)
    counts["logged_errors"] = sum(1 for r in logs.records if r.levelno >= logging.ERROR)
    counts["logged_unvalidated"] = sum(1 for r in logs.records if "unvalidated" in r.getMessage())
    counts["logged_tracebacks"] = sum(1 for r in logs.records if r.exc_info)
    counts["hub_fetches"] = server_hub.fetches
    counts["hub_cache_entries"] = len(server_hub)
    return counts


# ------------------------------------------------------------------------------------------ latency


def run_latency(n: int, hub_url: str) -> dict[str, float]:
    """p50 / p99 of preset requests while 8 threads keep the Hub side busy with bad ids."""
    import http.client

    import uvicorn

    from cabe import hub
    from cabe.web.app import create_app

    app = create_app(hub=hub.ServerHub(hub.Policy(timeout_s=2.0, total_s=4.0, retries=0)))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error", access_log=False))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    stop = threading.Event()
    hub_answers: Counter[str] = Counter()

    def abuse(i: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        k = 0
        while not stop.is_set():
            k += 1
            repo = f"org/{['slow', 'trickle', 'huge', 'liar'][i % 4]}-{i}-{k}"
            try:
                conn.request("POST", "/api/estimate", json.dumps({"model": repo}), {"content-type": "application/json"})
                resp = conn.getresponse()
                hub_answers[str(resp.status)] += 1
                resp.read()
            except OSError:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    threads = [threading.Thread(target=abuse, args=(i,), daemon=True) for i in range(8)]
    for t in threads:
        t.start()
    time.sleep(1.0)  # let the fetches pile up
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    body = json.dumps({"model": "llama-3.1-8b", "method": "lora", "batch": 4, "seq": 2048})
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        conn.request("POST", "/api/estimate", body, {"content-type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        times.append((time.perf_counter() - t0) * 1000)
        assert resp.status == 200
    stop.set()
    server.should_exit = True
    times.sort()
    return {
        "preset_requests": n,
        "p50_ms": round(statistics.median(times), 2),
        "p99_ms": round(times[min(len(times) - 1, int(0.99 * len(times)))], 2),
        "max_ms": round(times[-1], 2),
        "hub_requests_meanwhile": sum(hub_answers.values()),
        **{f"hub_status_{k}": v for k, v in sorted(hub_answers.items())},
    }


# ------------------------------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cli", type=int, default=5000, help="CLI vectors (default 5000)")
    ap.add_argument("--http", type=int, default=6000, help="HTTP requests (default 6000)")
    ap.add_argument("--latency", type=int, default=1000, help="preset requests timed under Hub abuse (default 1000)")
    ap.add_argument("--seed", type=int, default=12)
    args = ap.parse_args(argv)
    fake = fakehub.FakeHub(slow_s=30.0).start()
    os.environ["HF_ENDPOINT"] = fake.url
    os.environ.pop("HF_HUB_OFFLINE", None)
    os.environ.pop("HF_TOKEN", None)
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["HF_HUB_CACHE"] = os.path.join(tmp, "hf")  # an empty user cache: every id is fetched
        from cabe import hub

        hub.CLI = hub.Policy(timeout_s=0.3, total_s=0.8, retries=1)  # the CLI's bounds, shortened for speed
        stub_engine()
        files = hostile_files(Path(tmp))
        with socket.socket() as busy:
            busy.bind(("127.0.0.1", 0))
            busy.listen(1)
            t0 = time.perf_counter()
            cli = run_cli(args.cli, args.seed, files, busy.getsockname()[1]) if args.cli else Counter()
        if args.cli:
            cli["seconds"] = round(time.perf_counter() - t0, 1)
            print("CLI:", json.dumps(dict(sorted(cli.items()))))
            ok &= cli["internal_errors"] == 0 and cli["non_finite_outputs"] == 0 and cli["escaped"] == 0
    if args.http:
        t0 = time.perf_counter()
        http = run_http(args.http, args.seed, fake.url)
        http["seconds"] = round(time.perf_counter() - t0, 1)
        print("HTTP:", json.dumps(dict(sorted(http.items()))))
        ok &= http["server_errors"] == 0 and http["tracebacks_in_responses"] == 0
        ok &= http["logged_errors"] == 0 and http["logged_tracebacks"] == 0 and http["logged_unvalidated"] == 0
    if args.latency:
        lat = run_latency(args.latency, fake.url)
        print("HUB LATENCY:", json.dumps(lat))
        ok &= lat["p99_ms"] < 50
    fake.stop()
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

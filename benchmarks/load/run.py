"""Bounded load test of ``POST /api/estimate`` against a local cabe server (127.0.0.1 only).

Starts ``cabe.web.app.serve`` in a child process on a free port (or uses ``--url`` if it points at
127.0.0.1/localhost), sends a fixed number of requests from a few keep-alive clients, stops at the
time limit, and prints requests/s, p50/p99 latency and the server's RSS before and after.

    .venv/bin/python benchmarks/load/run.py --requests 5000 --clients 2 --time-limit 60
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from urllib.parse import urlparse

BODIES = {
    "model": {"model": "llama-3.1-8b", "method": "lora", "batch": 4, "seq": 2048, "gpu": "rtx-4090"},
    "simple": {"params": 7, "bytes_per_param": 16, "activations_gb": 20},
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def wait_ready(host: str, port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            c = http.client.HTTPConnection(host, port, timeout=1)
            c.request("GET", "/api/health")
            if c.getresponse().status == 200:
                return
        except OSError:
            time.sleep(0.1)
    raise SystemExit("server did not become ready")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--body", choices=sorted(BODIES), default="model")
    ap.add_argument("--url", help="an already running server on 127.0.0.1 (default: start one)")
    args = ap.parse_args(argv)

    proc = None
    if args.url:
        u = urlparse(args.url)
        if u.hostname not in ("127.0.0.1", "localhost"):
            raise SystemExit("this load test only targets 127.0.0.1")
        host, port = "127.0.0.1", u.port or 80
        pid = None
    else:
        host, port = "127.0.0.1", free_port()
        src = os.path.join(os.path.dirname(__file__), "..", "..", "src")
        env = {**os.environ, "PYTHONPATH": os.path.abspath(src) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        proc = subprocess.Popen(
            [sys.executable, "-c", f"from cabe.web.app import serve; serve('127.0.0.1', {port})"],
            env=env,
            stdout=subprocess.DEVNULL,
        )
        pid = proc.pid
    try:
        wait_ready(host, port)
        body = json.dumps(BODIES[args.body]).encode()
        headers = {"Content-Type": "application/json", "Connection": "keep-alive"}

        def one(conn: http.client.HTTPConnection) -> float:
            t0 = time.perf_counter()
            conn.request("POST", "/api/estimate", body=body, headers=headers)
            r = conn.getresponse()
            r.read()
            if r.status != 200:
                raise RuntimeError(f"HTTP {r.status}")
            return time.perf_counter() - t0

        warm = http.client.HTTPConnection(host, port, timeout=10)
        for _ in range(args.warmup):
            one(warm)
        warm.close()
        rss_before = rss_kib(pid) if pid else None

        lat: list[float] = []
        errors: list[str] = []
        lock = threading.Lock()
        remaining = [args.requests]
        stop_at = time.monotonic() + args.time_limit

        def worker() -> None:
            conn = http.client.HTTPConnection(host, port, timeout=10)
            local: list[float] = []
            while time.monotonic() < stop_at:
                with lock:
                    if remaining[0] <= 0:
                        break
                    remaining[0] -= 1
                try:
                    local.append(one(conn))
                except Exception as exc:  # count, reconnect, go on
                    errors.append(repr(exc))
                    conn.close()
                    conn = http.client.HTTPConnection(host, port, timeout=10)
            conn.close()
            with lock:
                lat.extend(local)

        threads = [threading.Thread(target=worker) for _ in range(args.clients)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - t0
        rss_after = rss_kib(pid) if pid else None

        lat.sort()
        q = statistics.quantiles(lat, n=100, method="inclusive") if len(lat) >= 2 else [float("nan")] * 99
        print(
            f"body: {args.body}  requests: {len(lat)} ok, {len(errors)} errors  clients: {args.clients}  "
            f"elapsed: {elapsed:.2f} s{'  (time limit hit)' if time.monotonic() >= stop_at else ''}"
        )
        print(f"throughput: {len(lat) / elapsed:.0f} req/s")
        print(f"latency: p50 {q[49] * 1000:.2f} ms  p99 {q[98] * 1000:.2f} ms  max {lat[-1] * 1000:.2f} ms")
        if rss_before is not None:
            print(f"server RSS: before {rss_before / 1024:.1f} MiB  after {rss_after / 1024:.1f} MiB")
        if errors:
            print("first errors:", errors[:3])
        return 1 if errors else 0
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    sys.exit(main())

"""A fake Hugging Face Hub on 127.0.0.1, for the tests and the fuzz harness.

It answers ``HEAD`` / ``GET /<owner>/<name>/resolve/<rev>/config.json`` by the repo's name:

* ``*/ok-*``: a small Llama config.json (200);
* ``*/gated-*``: 403 with ``X-Error-Code: GatedRepo``; ``*/missing-*``: 404 ``RepoNotFound``;
  ``*/noconfig-*``: 404 ``EntryNotFound``;
* ``*/huge-*``: a 200 MiB body, announced by ``Content-Length`` (the size check must refuse it
  before the body); ``*/liar-*``: the same body with no length announced on HEAD (the streaming cap
  must stop it);
* ``*/slow-*``: waits ``slow_s`` seconds before answering; ``*/trickle-*``: sends one byte a second;
* ``*/nan-*``: a config.json with ``NaN`` in it.

Start it with ``hub = FakeHub(); hub.start()``; ``hub.url`` is its endpoint (set ``HF_ENDPOINT``);
``hub.requests`` counts what it was asked; ``hub.stop()``.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CONFIG = {
    "model_type": "llama",
    "hidden_size": 2048,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 8192,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
}
HUGE = 200 << 20


class FakeHub:
    def __init__(self, slow_s: float = 30.0) -> None:
        self.slow_s = slow_s
        self.requests: list[tuple[str, str]] = []
        self.server: ThreadingHTTPServer | None = None
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:  # quiet
                pass

            def do_HEAD(self) -> None:
                hub.answer(self, body=False)

            def do_GET(self) -> None:
                hub.answer(self, body=True)

        self.handler = Handler

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> FakeHub:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self.handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def answer(self, h: BaseHTTPRequestHandler, *, body: bool) -> None:
        self.requests.append((h.command, h.path))
        parts = h.path.strip("/").split("/")
        name = parts[1] if len(parts) > 1 else ""
        try:
            if name.startswith("slow-"):
                time.sleep(self.slow_s)
            if name.startswith("gated-"):
                return self._status(h, 403, "GatedRepo")
            if name.startswith("missing-"):
                return self._status(h, 404, "RepoNotFound")
            if name.startswith("noconfig-"):
                return self._status(h, 404, "EntryNotFound")
            if name.startswith(("huge-", "liar-")):
                return self._huge(h, body=body, announce=name.startswith("huge-"))
            if name.startswith("trickle-"):
                return self._trickle(h, body=body)
            text = json.dumps(CONFIG) if not name.startswith("nan-") else '{"model_type": "llama", "hidden_size": NaN}'
            data = text.encode()
            h.send_response(200)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(data)))
            h.end_headers()
            if body:
                h.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up: that is the point
            pass

    @staticmethod
    def _status(h: BaseHTTPRequestHandler, status: int, code: str) -> None:
        h.send_response(status)
        h.send_header("X-Error-Code", code)
        h.send_header("Content-Length", "0")
        h.end_headers()

    @staticmethod
    def _huge(h: BaseHTTPRequestHandler, *, body: bool, announce: bool) -> None:
        h.send_response(200)
        if announce:
            h.send_header("Content-Length", str(HUGE))
        else:
            h.send_header("Connection", "close")
        h.end_headers()
        if body:
            chunk = b" " * (1 << 16)
            for _ in range(HUGE >> 16):
                h.wfile.write(chunk)

    @staticmethod
    def _trickle(h: BaseHTTPRequestHandler, *, body: bool) -> None:
        h.send_response(200)
        h.send_header("Content-Length", "4096")
        h.end_headers()
        if body:
            for _ in range(4096):
                h.wfile.write(b" ")
                h.wfile.flush()
                time.sleep(1.0)

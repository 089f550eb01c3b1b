"""Reading a request body within bounds: its size (413), its pace (408) and strict JSON (422).

A client that announces more bytes than it sends would otherwise hold its connection for ever: uvicorn's
``timeout_keep_alive`` only runs between requests (uvicorn 0.55.0 ``protocols/http/h11_impl.py``: the timer is
started by ``on_response_complete`` and cancelled by ``data_received``), so the wait is bounded here.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from cabe import jsonio

#: Largest request body accepted (a config.json is a few kB).
MAX_BODY_BYTES = 256 * 1024

#: Longest wait for the next part of a request body, and for the whole of it (seconds): a client that sends
#: fewer bytes than its Content-Length is answered 408 instead of holding the connection. uvicorn's own
#: ``timeout_keep_alive`` only runs between requests (uvicorn 0.55.0 ``protocols/http/h11_impl.py``: the timer
#: is started by ``on_response_complete`` and cancelled by ``data_received``), see the module's docstring.
BODY_IDLE_S = 3.0
BODY_TOTAL_S = 15.0


class BodyTooLarge(Exception):
    pass


class BadJson(Exception):
    pass


class BodyTimeout(Exception):
    def __init__(self, seconds: float) -> None:
        super().__init__(seconds)
        self.seconds = seconds


async def read_body(request: Any, limit: int = MAX_BODY_BYTES) -> bytes:
    """The body, at most ``limit`` bytes (``BodyTooLarge``), each part within :data:`BODY_IDLE_S` of the last
    and all of it within :data:`BODY_TOTAL_S` (``BodyTimeout``). A client gone before the end raises
    Starlette's ``ClientDisconnect`` (:class:`InternalErrors` lets it pass without a log)."""
    length = request.headers.get("content-length")
    if length is not None:
        try:
            if int(length) > limit:
                raise BodyTooLarge()
        except ValueError:
            raise BadJson() from None
    chunks: list[bytes] = []
    size = 0
    parts = request.stream().__aiter__()
    deadline = time.monotonic() + BODY_TOTAL_S
    while True:
        left = deadline - time.monotonic()
        try:
            chunk = await asyncio.wait_for(parts.__anext__(), timeout=max(min(BODY_IDLE_S, left), 0.0))
        except StopAsyncIteration:
            break
        except asyncio.TimeoutError:
            raise BodyTimeout(BODY_IDLE_S if left > BODY_IDLE_S else BODY_TOTAL_S) from None
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge()
        chunks.append(chunk)
    return b"".join(chunks)


async def read_json(request: Any) -> Any:
    """The body as strict JSON (:func:`cabe.jsonio.loads`): ``NaN``, ``1e999``, a 400-digit integer or
    nesting 64 deep raise the typed error naming the key; anything else unreadable is ``BadJson``."""
    raw = await read_body(request)
    try:
        return jsonio.loads(raw, "body") if raw.strip() else {}
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise BadJson() from None

"""Fetching a model's ``config.json`` from the Hugging Face Hub, with bounds (standard library only).

Two users, two policies:

* the command line (:data:`CLI`): a few seconds per connection and read, one retry, a clear
  ``hub_offline`` / ``hub_timeout`` sentence; the user's token (``HF_TOKEN`` or huggingface_hub's
  login) is sent, so gated models the user has accepted work.
* the HTTP server (:class:`ServerHub`, only with ``cabe serve --allow-hub``): the size is checked with a
  ``HEAD`` before any byte of the body is read, the body is streamed with a hard cap, one request has a
  bounded total time, at most ``concurrency`` fetches run at once (the next is ``hub_busy``, HTTP 429),
  answers (and refusals) are kept in a bounded in-memory cache of the server's own — never the user's
  Hugging Face cache, never a file — and no token is sent. Errors name the repo id, never a local path.

The endpoint is ``HF_ENDPOINT`` (default https://huggingface.co); ``HF_HUB_OFFLINE=1`` means offline.
"""

from __future__ import annotations

import json
import os
import re
import socket
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from cabe import jsonio
from cabe.errors import CabeError, ConfigError, HubError, InvalidValueError

#: Largest config.json fetched (a real one is a few kB).
MAX_CONFIG_BYTES = 1 << 20

#: A Hub repo id: ``owner/name``, letters, digits, ``-``, ``_``, ``.`` (no ``..``, no leading ``.``).
REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")
#: A revision: a branch, tag or commit (no ``..``, no spaces).
REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_./-]{0,127}$")


@dataclass(frozen=True)
class Policy:
    """Bounds of one fetch. ``timeout_s``: each connect / read; ``total_s``: the whole fetch, retries
    included; ``retries``: extra tries after a timeout or a refused connection."""

    timeout_s: float = 5.0
    total_s: float = 15.0
    retries: int = 1
    max_bytes: int = MAX_CONFIG_BYTES
    send_token: bool = True


#: The command line: a few seconds, one retry.
CLI = Policy()
#: The server: shorter, no retry, no token.
SERVER = Policy(timeout_s=3.0, total_s=6.0, retries=0, send_token=False)


def endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def check_repo_id(repo_id: str, revision: str | None = None) -> None:
    if not isinstance(repo_id, str) or not REPO_ID.match(repo_id) or ".." in repo_id:
        raise InvalidValueError("hub_bad_id", "model", value=repo_id)
    if revision is not None and (not REVISION.match(revision) or ".." in revision):
        raise InvalidValueError("hub_bad_id", "model", value=f"{repo_id}@{revision}")


def _token() -> str | None:
    token = os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN")
    if token:
        return token
    try:
        from huggingface_hub import get_token

        return get_token()
    except Exception:  # not installed, or no login: fetch anonymously
        return None


class _Deadline:
    def __init__(self, total_s: float, timeout_s: float) -> None:
        self.end = time.monotonic() + total_s
        self.timeout_s = timeout_s

    def left(self) -> float:
        return self.end - time.monotonic()

    def timeout(self) -> float:
        left = self.left()
        if left <= 0:
            raise TimeoutError("the fetch ran out of time")
        return min(self.timeout_s, left)


def _status_error(status: int, headers: Any, repo_id: str) -> HubError:
    """The Hub's answer as a sentence code (``X-Error-Code`` tells a missing repo from a missing file)."""
    code = headers.get("X-Error-Code") or headers.get("x-error-code") or ""
    if code == "GatedRepo" or (status in (401, 403) and code != "RepoNotFound"):
        return HubError("hub_gated", "model", repo=repo_id)
    if code == "EntryNotFound":
        return HubError("hub_no_config", "model", repo=repo_id)
    if status in (401, 404) or code == "RepoNotFound":
        return HubError("hub_not_found", "model", repo=repo_id)
    return HubError("hub_error", "model", repo=repo_id, detail=f"HTTP {status}")


def _request(url: str, method: str, policy: Policy, deadline: _Deadline) -> Any:
    import urllib.request

    headers = {"User-Agent": "cabe", "Accept-Encoding": "identity"}
    token = _token() if policy.send_token else None
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, method=method, headers=headers)
    return urllib.request.urlopen(req, timeout=deadline.timeout())


def _fetch_once(repo_id: str, url: str, policy: Policy, deadline: _Deadline) -> bytes:
    import urllib.error

    try:
        with _request(url, "HEAD", policy, deadline) as head:
            size = head.headers.get("X-Linked-Size") or head.headers.get("Content-Length")
        if size is not None and size.isascii() and size.isdigit() and int(size) > policy.max_bytes:
            raise HubError("hub_too_large", "model", repo=repo_id, limit=policy.max_bytes)
        chunks: list[bytes] = []
        got = 0
        with _request(url, "GET", policy, deadline) as resp:
            while True:
                chunk = resp.read1(65536)  # one recv at most: a trickle cannot outlast the deadline
                if not chunk:
                    break
                got += len(chunk)
                if got > policy.max_bytes:  # the HEAD lied, or said nothing: stop reading here
                    raise HubError("hub_too_large", "model", repo=repo_id, limit=policy.max_bytes)
                chunks.append(chunk)
                deadline.timeout()
        return b"".join(chunks)
    except urllib.error.HTTPError as exc:
        raise _status_error(exc.code, exc.headers or {}, repo_id) from None


def fetch_bytes(repo_id: str, revision: str | None = None, policy: Policy = CLI) -> bytes:
    """The bytes of ``config.json``, within the policy's bounds, or a :class:`~cabe.errors.HubError`."""
    import urllib.error

    check_repo_id(repo_id, revision)
    if offline():
        raise HubError("hub_offline", "model", repo=repo_id)
    url = f"{endpoint()}/{repo_id}/resolve/{quote(revision or 'main', safe='')}/config.json"
    if not url.startswith(("http://", "https://")):
        raise HubError("hub_offline", "model", repo=repo_id)
    deadline = _Deadline(policy.total_s, policy.timeout_s)
    for attempt in range(policy.retries + 1):
        try:
            return _fetch_once(repo_id, url, policy, deadline)
        except CabeError:
            raise
        except TimeoutError:
            failure = "hub_timeout"
        except (urllib.error.URLError, ConnectionError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            failure = "hub_timeout" if isinstance(reason, (TimeoutError, socket.timeout)) else "hub_offline"
        except (ValueError, http_errors()) as exc:  # a broken answer (bad status line, bad chunking)
            raise HubError("hub_error", "model", repo=repo_id, detail=type(exc).__name__) from None
        if attempt == policy.retries or deadline.left() <= 0.5:
            break
    if failure == "hub_timeout":
        raise HubError("hub_timeout", "model", repo=repo_id, seconds=round(policy.total_s))
    raise HubError("hub_offline", "model", repo=repo_id)


def http_errors() -> type[Exception]:
    import http.client

    return http.client.HTTPException


def parse(raw: bytes, repo_id: str) -> dict[str, Any]:
    """The fetched bytes as a config mapping (strict JSON; the errors of a local config.json)."""
    try:
        data = jsonio.loads(raw, non_finite=True)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError("config_malformed", "model", path=repo_id, detail=str(exc)[:200]) from None
    except InvalidValueError as err:
        code = {"number_too_long": "config_number_too_long", "too_deep": "config_too_deep"}.get(err.code)
        raise ConfigError(code or "config_not_finite", "model", key=err.field or "", **err.params) from None
    if not isinstance(data, dict):
        raise ConfigError("config_not_object", "model")
    return data


class ServerHub:
    """The server's Hub: bounded fetches (:data:`SERVER`), a concurrency limit, a bounded cache.

    ``fetch(repo_id)`` returns the config mapping or raises; ``cached(repo_id)`` never touches the
    network (what a GET may use). A refusal (gated, not found, too large, malformed) is cached too, for
    ``error_ttl_s``, so a client naming the same bad id again costs nothing.
    """

    def __init__(
        self,
        policy: Policy = SERVER,
        *,
        concurrency: int = 4,
        max_entries: int = 256,
        max_bytes: int = 16 << 20,
        error_ttl_s: float = 300.0,
    ) -> None:
        self.policy = policy
        self.slots = threading.BoundedSemaphore(concurrency)
        self.max_entries, self.max_bytes, self.error_ttl_s = max_entries, max_bytes, error_ttl_s
        self._cache: OrderedDict[str, tuple[float, dict[str, Any] | CabeError, int]] = OrderedDict()
        self._lock = threading.Lock()
        self.fetches = 0  # network fetches started (for tests and the harness)

    def _get(self, key: str) -> dict[str, Any] | CabeError | None:
        with self._lock:
            hit = self._cache.get(key)
            if hit is None:
                return None
            stamp, value, _ = hit
            if isinstance(value, CabeError) and time.monotonic() - stamp > self.error_ttl_s:
                del self._cache[key]
                return None
            self._cache.move_to_end(key)
            return value

    def _put(self, key: str, value: dict[str, Any] | CabeError, size: int) -> None:
        with self._lock:
            self._cache[key] = (time.monotonic(), value, size)
            self._cache.move_to_end(key)
            while len(self._cache) > self.max_entries or self.cached_bytes() > self.max_bytes:
                self._cache.popitem(last=False)

    def cached_bytes(self) -> int:
        return sum(size for _, _, size in self._cache.values())

    def __len__(self) -> int:
        return len(self._cache)

    def cached(self, repo_id: str) -> dict[str, Any]:
        """The cached config, without a fetch: ``hub_not_fetched`` when it is not there."""
        check_repo_id(repo_id)
        value = self._get(repo_id)
        if value is None:
            raise HubError("hub_not_fetched", "model", repo=repo_id)
        if isinstance(value, CabeError):
            raise value
        return value

    def fetch(self, repo_id: str) -> dict[str, Any]:
        check_repo_id(repo_id)
        value = self._get(repo_id)
        if value is None:
            if not self.slots.acquire(blocking=False):
                raise HubError("hub_busy", "model", repo=repo_id)
            try:
                self.fetches += 1
                raw = fetch_bytes(repo_id, policy=self.policy)
                value, size = parse(raw, repo_id), len(raw)
            except (HubError, ConfigError) as err:
                if err.code in ("hub_timeout", "hub_offline", "hub_busy", "hub_error"):
                    raise  # passing trouble: try again later
                value, size = err, 64
            finally:
                self.slots.release()
            self._put(repo_id, value, size)
        if isinstance(value, CabeError):
            raise value
        return value


__all__ = ["CLI", "MAX_CONFIG_BYTES", "SERVER", "Policy", "ServerHub", "check_repo_id", "fetch_bytes", "parse"]

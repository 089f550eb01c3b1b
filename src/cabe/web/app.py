"""The HTTP server of ``cabe serve``: a JSON API (with an OpenAPI document) and the web page.

Starlette + uvicorn (the ``[web]`` extra). Every route is a thin layer over :mod:`cabe.api`:
the same request dict, the same report, the same errors (HTTP 422 with the sentence in the
asker's language). Request bodies are size-limited; an uploaded ``config.json`` arrives as the
``config`` field of a JSON body, is parsed as JSON only, and is never executed or stored.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from cabe import api, families, i18n, jsonio, models, schema
from cabe import gpus as gpu_catalog
from cabe.api import check_fields, lora_json
from cabe.errors import CabeError, HubError, InvalidValueError, MissingDependencyError
from cabe.hub import ServerHub
from cabe.inference import infer_json
from cabe.solver import plan_json
from cabe.web import compare as comparison
from cabe.web import config_upload as up
from cabe.web import page
from cabe.web.body import MAX_BODY_BYTES, BadJson, BodyTimeout, BodyTooLarge, read_body, read_json
from cabe.web.openapi import openapi_document

log = logging.getLogger("cabe.web")

#: Exceptions a malformed (but not malicious) body can still raise deep in the core; they become
#: 422 rather than 500, and are logged so that the core can be fixed.
_BAD_INPUT = (TypeError, ValueError, KeyError, AttributeError, OverflowError, IndexError, ZeroDivisionError)


def _starlette() -> Any:
    import importlib.util

    for package in ("starlette", "jinja2"):
        if importlib.util.find_spec(package) is None:  # pragma: no cover - depends on the environment
            raise MissingDependencyError("missing_extra", None, extra="web", package=package)


def lang_from(request: Any, body: Mapping[str, Any] | None = None) -> str:
    """``lang`` in the body, else ``?lang=``, else Accept-Language, else English."""
    explicit = None
    if isinstance(body, Mapping) and isinstance(body.get("lang"), str):
        explicit = body["lang"]
    explicit = explicit or request.query_params.get("lang")
    if explicit and explicit.lower()[:2] in i18n.LANGS:
        return explicit.lower()[:2]
    return accept_language(request.headers.get("accept-language", ""))


def accept_language(header: str) -> str:
    best, best_q = i18n.DEFAULT_LANG, -1.0
    for _i, part in enumerate(header.split(",")):
        bits = part.strip().split(";")
        code = bits[0].strip().lower()[:2]
        q = 1.0
        for b in bits[1:]:
            b = b.strip()
            if b.startswith("q="):
                try:
                    q = float(b[2:])
                except ValueError:
                    q = 0.0
        if code in i18n.LANGS and q > best_q:
            best, best_q = code, q
    return best


def _json(data: Any, status: int = 200) -> Any:
    from starlette.responses import Response

    return Response(
        jsonio.dumps(data, default=str),
        status_code=status,
        media_type="application/json",
    )


def _web_error(code: str, lang: str, http_status: int, field: str | None = None, **params: Any) -> Any:
    return _json(
        {
            "error": {
                "code": code,
                "field": field,
                "params": params,
                "message": i18n.t("web.error." + code, lang, **params),
            }
        },
        http_status,
    )


def _needs_thread(body: Mapping[str, Any], top: bool = True) -> bool:
    """A Hugging Face id means a network fetch, a config no family module reads a trace (seconds, in the
    trace worker: :mod:`cabe.via_trace`): keep both off the event loop."""
    setups = body.get("setups") if top else None  # /api/compare: any of its setups
    if isinstance(setups, list):
        return any(isinstance(one, Mapping) and _needs_thread(one, False) for one in setups[: comparison.MAX_SETUPS])
    m = body.get("model")
    if isinstance(m, str) and "/" in m and m.strip().lower() not in models.preset_names():
        return True
    config = body.get("config")
    return isinstance(config, Mapping) and config.get("model_type") not in families.supported_model_types()


async def _call(fn: Any, body: Any) -> Any:
    if isinstance(body, Mapping) and _needs_thread(body):
        from starlette.concurrency import run_in_threadpool

        return await run_in_threadpool(fn, body)
    return fn(body)


async def _read_body(request: Any, lang: str) -> tuple[Any, Any]:
    """(body, None), or (None, the 413 / 422 answer) for a body too large, not JSON, or not strict JSON."""
    try:
        return await read_json(request), None
    except BodyTooLarge:
        return None, _web_error("body_too_large", lang, 413, limit=MAX_BODY_BYTES)
    except BodyTimeout as late:  # the rest of the body will not come: answer, and close the connection
        resp = _web_error("body_timeout", lang, 408, seconds=f"{late.seconds:g}")
        resp.headers["connection"] = "close"
        return None, resp
    except BadJson:
        return None, _web_error("invalid_json", lang, 422)
    except CabeError as err:
        return None, _json(api.error_json(err, lang), 422)


async def _guarded(request: Any, fn: Any) -> Any:
    body, refused = await _read_body(request, lang_from(request))
    if refused is not None:
        return refused
    lang = lang_from(request, body)
    try:
        return _json(await _call(fn, body))
    except CabeError as err:
        return _json(api.error_json(err, lang), 429 if err.code == "hub_busy" else 422)
    except _BAD_INPUT as exc:  # a hole in the core's validation: answer 422, log it for a fix
        log.warning("unvalidated input reached the core: %r", exc)
        return _web_error("invalid_request", lang, 422)


# --------------------------------------------------------------------------------------- routes


#: the endpoints and the schema command that declares their request (cabe.schema)
ENDPOINTS = {"estimate": "api.estimate", "fit": "api.fit", "infer": "api.infer", "lora": "api.lora"}


def _checked(command: str, fn: Any) -> Any:
    def run(body: Any) -> Any:
        check_fields(body, command)
        return fn(body)

    return run


async def estimate(request: Any) -> Any:
    """The estimate; an architecture no family module reads is answered from a trace in the trace worker."""
    return await _guarded(
        request, _checked("api.estimate", lambda body: api.estimate_json(body, allow_files=False, trace="worker"))
    )


async def fit(request: Any) -> Any:
    """Make it fit: largest batch, longest sequence, fewest GPUs, ranked changes (cabe.solver)."""
    return await _guarded(request, _checked("api.fit", lambda body: plan_json(body, allow_files=False)))


async def infer(request: Any) -> Any:
    """Inference / serving memory: weights by format, KV cache, concurrent sequences (cabe.inference)."""
    return await _guarded(request, _checked("api.infer", infer_json))


async def compare(request: Any) -> Any:
    """Two or three estimates side by side (cabe.web.compare): each what /api/estimate answers for it."""
    one = _checked("api.estimate", lambda body: api.estimate_json(body, allow_files=False, trace="worker"))
    return await _guarded(request, lambda body: comparison.compare_json(body, one))


async def lora(request: Any) -> Any:
    return await _guarded(request, lora_json)


async def from_config(request: Any) -> Any:
    """Your own configs (``cabe from-config --json``): the files' texts as JSON or multipart (cabe.web.config_upload)."""
    from starlette.concurrency import run_in_threadpool

    lang = lang_from(request)
    try:
        raw = await read_body(request, up.MAX_UPLOAD_BYTES)
        items, fmt, fields = up.parse(raw, request.headers.get("content-type", ""))
    except BodyTooLarge:
        return _web_error("body_too_large", lang, 413, limit=up.MAX_UPLOAD_BYTES)
    except BodyTimeout as late:
        resp = _web_error("body_timeout", lang, 408, seconds=f"{late.seconds:g}")
        resp.headers["connection"] = "close"
        return resp
    except CabeError as err:  # a file too many, no files, strict JSON's errors
        return _json(api.error_json(err, lang), 422)
    except up.BadUpload:
        return _web_error("invalid_request", lang, 422)
    except (BadJson, ValueError):  # not JSON (json.JSONDecodeError, UnicodeDecodeError)
        return _web_error("invalid_json", lang, 422)
    lang = lang_from(request, fields)
    try:
        status, out = await run_in_threadpool(up.answer, items, fmt, fields, lang)
    except _BAD_INPUT as exc:  # a hole in a reader's validation: answer 422, log it for a fix
        log.warning("unvalidated input reached the config readers: %r", exc)
        return _web_error("invalid_request", lang, 422)
    return _json(out, status)


def models_json() -> list[dict[str, Any]]:
    out = []
    for name in models.preset_names():
        meta = models.preset(name).meta
        out.append({"name": name, **{k: meta.get(k) for k in ("display", "hf_id", "parameters", "family", "gated")}})
    return out


_MODELS_CACHE: list[dict[str, Any]] | None = None


async def list_models(request: Any) -> Any:
    global _MODELS_CACHE
    if _MODELS_CACHE is None:
        _MODELS_CACHE = models_json()
    return _json({"models": _MODELS_CACHE})


async def list_gpus(request: Any) -> Any:
    return _json({"gpus": [g.to_json() for g in gpu_catalog.all_gpus()]})


async def health(request: Any) -> Any:
    return _json({"status": "ok", "version": _version()})


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("cabe")
    except Exception:  # not installed as a distribution (e.g. PYTHONPATH=src)
        return "unknown"


async def openapi(request: Any) -> Any:
    return _json(openapi_document())


async def index(request: Any) -> Any:
    from starlette.responses import HTMLResponse

    lang = lang_from(request)
    query = dict(request.query_params)
    if comparison.PIN in query:  # "Compare": keep the form's setup in the address, and go there
        from starlette.responses import RedirectResponse

        return RedirectResponse("/" + comparison.pin(query, page.state, page.QUERY_KEYS), status_code=303)
    html = await _call(lambda q: page.render_page(q, lang), query)
    return HTMLResponse(html, headers=_PAGE_HEADERS)


async def favicon(request: Any) -> Any:
    from starlette.responses import RedirectResponse

    return RedirectResponse("/static/favicon.svg", status_code=301)


async def fragment(request: Any) -> Any:
    """The page's result panels for a query string (+ an uploaded config), for the script."""
    lang = lang_from(request)
    body, refused = await _read_body(request, lang)
    if refused is not None:
        return refused
    if not isinstance(body, Mapping) or not isinstance(body.get("query", ""), str):
        return _web_error("invalid_request", lang, 422)
    from urllib.parse import parse_qsl

    query = dict(parse_qsl(body.get("query", ""), keep_blank_values=True))
    lang = query["lang"] if query.get("lang") in i18n.LANGS else lang
    config = body.get("config")
    return _json(await _call(lambda q: page.render_fragments(q, lang, config=config), query))


async def http_error(request: Any, exc: Any) -> Any:
    """404 / 405 (and any other HTTP error) as the API's JSON error, in the asker's language."""
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    headers = getattr(exc, "headers", None) or {}
    resp = _web_error(code, lang_from(request), exc.status_code, status=exc.status_code)
    for k, v in headers.items():
        resp.headers[k] = v
    return resp


class Guard:
    """Who may ask, and how a request reaches the Hub.

    * ``Host`` must be one of ``allowed_hosts`` (when given: ``cabe serve`` gives the address it binds,
      plus ``localhost`` / ``127.0.0.1`` / ``::1`` on loopback) — a DNS-rebinding page is refused;
    * an ``Origin`` header must name this server (scheme, host and port of ``Host``) — another site's
      page cannot make a visitor's cabe compute, or fetch;
    * Hub ids: refused (``hub_disabled``) unless the server was started with ``--allow-hub``; then a
      POST fetches through the server's bounded :class:`~cabe.hub.ServerHub`, and a GET only reads its
      cache (``hub_not_fetched``): a link never fetches.
    """

    def __init__(self, app: Any, hub: Any = None, allowed_hosts: Any = None) -> None:
        self.app, self.hub = app, hub
        self.allowed_hosts = None if allowed_hosts is None else {h.lower() for h in allowed_hosts}

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        refused = self._refused(headers)
        if refused is not None:
            from starlette.requests import Request

            resp = _web_error("forbidden_origin", lang_from(Request(scope)), 403, value=refused[:100])
            await resp(scope, receive, send)
            return
        with models.hub_scope(self._hub_for(scope.get("method", "GET"))):
            await self.app(scope, receive, send)

    def _refused(self, headers: Mapping[str, str]) -> str | None:
        """The offending Host or Origin, or None when the request may go on."""
        from urllib.parse import urlsplit

        host = headers.get("host", "")
        try:
            name = urlsplit("//" + host).hostname or ""
        except ValueError:
            return host or "?"
        if self.allowed_hosts is not None and name.lower() not in self.allowed_hosts:
            return host or "?"
        origin = headers.get("origin")
        if origin is not None:
            try:
                parts = urlsplit(origin)
            except ValueError:
                return origin
            if parts.scheme not in ("http", "https") or parts.netloc.lower() != host.lower():
                return origin
        return None

    def _hub_for(self, method: str) -> Any:
        hub = self.hub
        if hub is None:

            def disabled(repo_id: str) -> Any:
                raise HubError("hub_disabled", "model", repo=repo_id)

            return disabled
        read = hub.cached if method in ("GET", "HEAD") else hub.fetch
        return lambda repo_id: models.hub_source(repo_id, read(repo_id))


class InternalErrors:
    """The edge: an exception no route turned into a 4xx (a bug, never bad input) answers one JSON 500
    in the asker's language and is logged once, on one line, without the request body or a traceback
    (the route, the exception and where it was raised: enough to find it, too little to flood a log)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_tracked(message: Any) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        from starlette.requests import ClientDisconnect

        try:
            await self.app(scope, receive, send_tracked)
        except ClientDisconnect:  # the client left before its body ended: no one to answer, nothing broken
            return
        except Exception as exc:
            log.error("internal error: %s %s: %s", scope.get("method"), scope.get("path"), _where(exc))
            if not started:
                from starlette.requests import Request

                resp = _web_error("internal", lang_from(Request(scope)), 500)
                await resp(scope, receive, send)


def _where(exc: BaseException) -> str:
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    at = f" at {frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno}" if frames else ""
    return f"{type(exc).__name__}: {str(exc)[:200]}{at}"


_PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def create_app(*, hub: Any = None, allowed_hosts: Any = None) -> Any:
    """The app. ``hub``: a :class:`cabe.hub.ServerHub` to let clients name Hugging Face ids (off when
    None); ``allowed_hosts``: the ``Host`` names it answers (any when None; ``cabe serve`` sets them)."""
    _starlette()
    from importlib import resources

    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.routing import Mount, Route
    from starlette.staticfiles import StaticFiles

    static_dir = str(resources.files("cabe") / "web" / "static")
    routes = [
        Route("/", index, methods=["GET"]),
        Route("/fragment", fragment, methods=["POST"]),
        Route("/favicon.ico", favicon, methods=["GET"]),
        Route("/api/estimate", estimate, methods=["POST"]),
        Route("/api/lora", lora, methods=["POST"]),
        Route("/api/compare", compare, methods=["POST"]),
        Route("/api/fit", fit, methods=["POST"]),
        Route("/api/infer", infer, methods=["POST"]),
        Route("/api/from-config", from_config, methods=["POST"]),
        Route("/api/models", list_models, methods=["GET"]),
        Route("/api/gpus", list_gpus, methods=["GET"]),
        Route("/api/health", health, methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"]),
        Mount("/static", app=StaticFiles(directory=static_dir), name="static"),
    ]
    from starlette.middleware import Middleware

    return Starlette(
        routes=routes,
        exception_handlers={HTTPException: http_error},
        middleware=[Middleware(InternalErrors), Middleware(Guard, hub=hub, allowed_hosts=allowed_hosts)],
    )


def listen_socket(host: str, port: Any) -> Any:
    """A listening socket on ``host:port``, or one sentence on what is wrong (before anything starts):
    a port outside 1-65535 (``out_of_range``), a host that is no address of this machine
    (``serve_bad_host``), a port another program holds (``serve_port_in_use``) or that needs privileges
    (``serve_port_denied``)."""
    import errno
    import socket

    if isinstance(port, bool) or not isinstance(port, int):
        port = schema.to_int("port", port)
    if not 1 <= port <= 65535:
        raise InvalidValueError("out_of_range", "port", value=str(port), minimum="1", maximum="65535")
    if not isinstance(host, str) or not host.strip() or len(host) > 253:
        raise InvalidValueError("serve_bad_host", "host", value=host)
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (OSError, UnicodeError, ValueError):
        raise InvalidValueError("serve_bad_host", "host", value=host) from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
    try:
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        code = {errno.EADDRINUSE: "serve_port_in_use", errno.EACCES: "serve_port_denied"}.get(
            exc.errno or 0, "serve_bad_host"
        )
        raise InvalidValueError(
            code, "port" if code != "serve_bad_host" else "host", value=host, port=str(port)
        ) from None
    return sock


#: the names a loopback server answers to
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def allowed_hosts_for(host: str) -> tuple[str, ...] | None:
    """The ``Host`` names a server bound to ``host`` answers: its own, and the loopback names when it is
    on loopback; None (any) when it listens on every interface (0.0.0.0 / ::), where only the
    ``Origin`` check stands (put it behind a proxy that checks the name)."""
    if host in ("0.0.0.0", "::", ""):
        return None
    return tuple(dict.fromkeys((host.strip("[]"),) + (LOOPBACK if host.strip("[]") in LOOPBACK else ())))


def serve(host: str = "127.0.0.1", port: int = 8000, *, allow_hub: bool = False) -> None:
    """Run the server (blocks). Binds 127.0.0.1 unless another host is asked for; the host and port
    are checked, and the socket bound, before the URL is printed (:func:`listen_socket`). Hugging Face
    ids are refused unless ``allow_hub`` (then fetched with the bounds of :class:`cabe.hub.ServerHub`)."""
    sock = listen_socket(host, port)
    app = create_app(hub=ServerHub() if allow_hub else None, allowed_hosts=allowed_hosts_for(host))
    import uvicorn

    config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", access_log=False, server_header=False, limit_concurrency=1000
    )
    server = uvicorn.Server(config)
    shown = f"[{host}]" if ":" in host else host
    print(f"cabe: http://{shown}:{port}", flush=True)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()

"""``cabe serve``: the web calculator and the JSON API (needs ``cabe[web]``)."""

from __future__ import annotations

import argparse

from cabe import schema
from cabe.cli import options
from cabe.errors import MissingDependencyError


def add_arguments(p: argparse.ArgumentParser) -> None:
    options.flag(p, "--host", key="host", default="127.0.0.1")
    options.flag(p, "--port", key="port", default="8000")
    options.flag(p, "--allow-hub", key="allow_hub", action="store_true")
    options.output(p)


def gather(args: argparse.Namespace) -> None:
    try:
        from cabe.web.app import serve
    except ImportError as exc:
        raise MissingDependencyError("missing_extra", None, extra="web", package=exc.name or "starlette") from None
    serve(host=args.host, port=schema.to_int("port", args.port), allow_hub=args.allow_hub)


def render(result: None, args: argparse.Namespace, lang: str, units: str) -> str | None:
    return None

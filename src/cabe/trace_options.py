"""The flags of `cabe trace`, kept apart from cabe.trace so that building the CLI parser imports no
torch (importing cabe.trace loads its CUDA shim: ~0.15 s on every command otherwise)."""

from __future__ import annotations

import argparse

from cabe import schema


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Trace-only flags, as :mod:`cabe.schema` declares them."""
    schema.add_arguments(parser, "trace", groups=("trace",))

"""``cabe measure``: the training step run for real on a CUDA GPU (needs ``cabe[trace]`` and a GPU)."""

from __future__ import annotations

import argparse
from typing import Any

from cabe.cli import options, trace
from cabe.errors import MissingDependencyError

COMMAND = "measure"


def add_arguments(p: argparse.ArgumentParser) -> None:
    options.training(p, COMMAND)
    options.output(p, COMMAND)


def gather(args: argparse.Namespace) -> dict[str, Any]:
    try:
        from cabe.trace import measure
    except ImportError as exc:
        raise MissingDependencyError("missing_extra", None, extra="trace", package=exc.name or "torch") from None
    config, setup = trace.inputs(args, COMMAND)
    return measure.measure_step(config, setup)


#: the same report as ``cabe trace``
render = trace.render

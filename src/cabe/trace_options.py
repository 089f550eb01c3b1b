"""The flags of `cabe trace`, kept apart from cabe.trace so that building the CLI parser imports no
torch (importing cabe.trace loads its CUDA shim: ~0.15 s on every command otherwise)."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Trace-only flags."""
    g = parser.add_argument_group("trace")
    g.add_argument("--steps", type=int, default=2, help="training steps to simulate (>= 2; the last is reported)")
    g.add_argument(
        "--mode",
        default="auto",
        choices=("auto", "fake", "meta"),
        help="fake CUDA tensors (default when available) or meta tensors",
    )
    g.add_argument("--timeline", metavar="FILE.json", help="write the live-memory timeline as JSON")
    g.add_argument("--plot", metavar="FILE.svg", help="draw the live-memory timeline as an SVG")
    g.add_argument(
        "--expandable-segments",
        action="store_true",
        help="report reserved memory for PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
    )
    g.add_argument("--inventory", action="store_true", help="also list the tensors decoder layer 0 saves for backward")

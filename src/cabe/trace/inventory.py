"""``python -m cabe.trace.inventory CONFIG.json [--precision bf16 --attention sdpa --batch 1 --seq 512 ...]``

Prints the tensors decoder layer 0 saves for backward in one forward pass (gradient
checkpointing off): the module inside the layer, the aten op that allocated the storage,
the autograd node that produced the tensor, shape, dtype, kind (activation, parameter,
weight_copy) and bytes (storages counted once, rounded to 512 B as on the GPU).

The rows are collected inside a trace by :mod:`cabe.trace.saved`; this module is the command line.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from cabe import schema
from cabe.errors import CabeError
from cabe.trace import layer_inventory
from cabe.trace.cli import add_setup_arguments, format_inventory, load_config, setup_from_args


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cabe.trace.inventory", description=__doc__.split("\n\n")[1])
    parser.add_argument("config", help="a config.json")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    add_setup_arguments(parser)
    schema.add_arguments(parser, "trace", only=("mode",))
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config)
        setup = setup_from_args(args)
        rows = layer_inventory(cfg, setup, mode=args.mode)
    except CabeError as exc:
        print(f"error: {exc.code} ({exc.field}): {dict(exc.params)}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(
            f"# layer 0 of {cfg.get('model_type')}: {setup.method}, dtype {setup.dtype}, autocast {setup.autocast}, attention {setup.attention}, "
            f"batch {setup.batch} x seq {setup.seq}"
        )
        print(format_inventory(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

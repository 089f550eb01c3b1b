"""The flags every command shares, built from :mod:`cabe.schema` (the one declaration of the request),
and the command-line flags that are not request fields (``--json``, ``--explain``, ``--host`` ...)."""

from __future__ import annotations

import argparse
from typing import Any

from cabe import schema
from cabe.i18n import t

#: the schema groups that describe a training run (model, setup, several GPUs)
TRAINING_GROUPS = ("model", "setup", "gpus")


def training(p: argparse.ArgumentParser, command: str, *, exclude: tuple[str, ...] = ()) -> None:
    """The model, setup and several-GPU flags of ``command``, as the schema declares them."""
    only = [f.name for f in schema.fields_for(command, output=False) if f.name not in exclude]
    schema.add_arguments(p, command, groups=TRAINING_GROUPS, only=only)


def output(p: argparse.ArgumentParser, command: str | None = None) -> None:
    """``--json`` and the output fields (``--lang``, ``--units``) of the schema.

    ``command`` None: a listing command the schema does not know (``models``, ``gpus``, ``serve``);
    it takes both output fields.
    """
    p.add_argument("--json", action="store_true", help=t("flag.json", "en"))
    for name in ("lang", "units"):
        f = schema.field(name)
        if command is None or command in f.commands:
            schema.add_flag(p, f, command or "estimate")


def flag(p: argparse.ArgumentParser, *flags: str, key: str, **kw: Any) -> None:
    """A flag that is not a request field; its help text is ``flag.<key>`` in the catalog."""
    p.add_argument(*flags, help=t(f"flag.{key}", "en"), **kw)


def request(args: argparse.Namespace, command: str, *, exclude: tuple[str, ...] = ()) -> dict[str, Any]:
    """The request dict of the training fields given on the command line (numbers converted and
    checked: a typed error names the field); see :func:`cabe.schema.values_from_args`."""
    body = schema.values_from_args(args, command, groups=TRAINING_GROUPS)
    return {k: v for k, v in body.items() if k not in exclude}

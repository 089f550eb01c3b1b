"""The ``cabe`` parser: one subcommand per module of :mod:`cabe.cli`, each with three layers —
``add_arguments`` (its flags, from :mod:`cabe.schema`), ``gather`` (the numbers, from the core) and
``render`` (text or JSON). Every module is imported here by name: a broken one fails loudly.

The modules import nothing heavy at the top, so ``cabe --help`` and every command start fast.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from types import ModuleType

from cabe.cli import estimate, fit, from_config, gpus, infer, lora, measure, models, recipes, serve, trace
from cabe.i18n import t

#: the subcommands, in the order of ``cabe --help``; the help text is ``command.<name>`` in the catalog
COMMANDS: tuple[tuple[str, ModuleType], ...] = (
    ("estimate", estimate),
    ("models", models),
    ("gpus", gpus),
    ("recipes", recipes),
    ("lora", lora),
    ("trace", trace),
    ("measure", measure),
    ("fit", fit),
    ("infer", infer),
    ("from-config", from_config),
    ("serve", serve),
)


def build_parser(argv: Sequence[str] | None = None, *, every: bool = True) -> argparse.ArgumentParser:
    """The parser of every subcommand; with ``every=False``, the flags of the one ``argv`` names only (the others
    keep their name and help: ``cabe --help`` lists them, and a command line names one command). Building every
    command's flags from the schema is a tenth of a cold ``cabe estimate``."""
    wanted = None if every else _command(argv)
    parser = argparse.ArgumentParser(prog="cabe", description=t("command.cabe", "en"))
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in COMMANDS:
        p = sub.add_parser(name, help=t(f"command.{name}", "en"))
        if every or name == wanted:
            module.add_arguments(p)
        p.set_defaults(_module=module)
    return parser


def _command(argv: Sequence[str] | None) -> str | None:
    """The subcommand a command line names: its first word that is not an option (the top level has no options but
    ``--help``), when it is one."""
    args = sys.argv[1:] if argv is None else argv
    first = next((a for a in args if not a.startswith("-")), None)
    return first if first in dict(COMMANDS) else None

"""The ``cabe`` parser: one subcommand per module of :mod:`cabe.cli`, each with three layers —
``add_arguments`` (its flags, from :mod:`cabe.schema`), ``gather`` (the numbers, from the core) and
``render`` (text or JSON). Every module is imported here by name: a broken one fails loudly.

The modules import nothing heavy at the top, so ``cabe --help`` and every command start fast.
"""

from __future__ import annotations

import argparse
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cabe", description=t("command.cabe", "en"))
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in COMMANDS:
        p = sub.add_parser(name, help=t(f"command.{name}", "en"))
        module.add_arguments(p)
        p.set_defaults(_module=module)
    return parser

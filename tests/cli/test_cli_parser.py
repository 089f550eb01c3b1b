"""The command line is built from the schema: every command's flags are the schema's fields, field by
field, plus the few flags that are not request fields; each subcommand is a module registered by name."""

from __future__ import annotations

import argparse
import pkgutil

import pytest

import cabe.cli
from cabe import schema
from cabe.cli.parser import COMMANDS, build_parser
from cabe.i18n import LANGS, catalog, t

#: flags that say how to show or run the answer, not what to compute
NOT_FIELDS = {"--json", "--fits", "--explain", "--format", "--host", "--port", "-h", "--help"}


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _options(p: argparse.ArgumentParser) -> dict[str, str]:
    """option string -> dest"""
    return {s: a.dest for a in p._actions for s in a.option_strings}


@pytest.mark.parametrize("command", list(schema.CLI_COMMANDS))
def test_flags_are_the_schema_fields(command: str) -> None:
    opts = _options(_subparsers()[command])
    expected: dict[str, str] = {}
    for f in schema.fields_for(command):
        for flag in f.flags + (tuple("--" + a for a in f.aliases) if command == "lora" else ()):
            expected[flag] = f.name
        if f.negatable:
            expected["--no-" + f.flags[0][2:]] = f.name
    got = {k: v for k, v in opts.items() if k not in NOT_FIELDS}
    assert got == expected


@pytest.mark.parametrize("command", list(schema.CLI_COMMANDS))
def test_help_comes_from_the_catalog(command: str) -> None:
    p = _subparsers()[command]
    by_dest: dict[str, argparse.Action] = {}
    for a in p._actions:
        by_dest.setdefault(a.dest, a)  # a negatable flag's --no- form comes second, without help
    for f in schema.fields_for(command):
        if f.flags:
            assert str(by_dest[f.name].help).startswith(t(f.key, "en")), f.name


def test_every_command_module_is_registered() -> None:
    """No subcommand hides behind a failed import: each module with ``gather`` is in COMMANDS."""
    registered = {m.__name__ for _, m in COMMANDS}
    for info in pkgutil.iter_modules(cabe.cli.__path__):
        module = __import__(f"cabe.cli.{info.name}", fromlist=["_"])
        if hasattr(module, "gather"):
            assert module.__name__ in registered, info.name
    for name, module in COMMANDS:
        assert callable(module.add_arguments) and callable(module.gather) and callable(module.render), name
        for lang in LANGS:
            assert f"command.{name}" in catalog(lang), (lang, name)


def test_the_same_request_as_the_http_api() -> None:
    """The CLI's request dict for a multi-GPU LoRA run is what /api/estimate would be sent."""
    from cabe.cli import options

    p = _subparsers()["estimate"]
    args = p.parse_args(
        ["--model", "llama-7b", "--method", "lora", "--lora-rank", "16", "--gpus", "8", "--shard", "zero3", "--tp", "2"]
    )
    assert options.request(args, "estimate") == {
        "model": "llama-7b",
        "method": "lora",
        "shard": "zero3",
        "lora_rank": 16,
        "gpus": 8,
        "tp": 2,
    }


def test_lora_accepts_the_old_spellings() -> None:
    p = _subparsers()["lora"]
    old = p.parse_args(["--model", "llama-7b", "--rank", "4", "--targets", "q_proj"])
    new = p.parse_args(["--model", "llama-7b", "--lora-rank", "4", "--lora-targets", "q_proj"])
    assert vars(old) == vars(new)

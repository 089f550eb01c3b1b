"""Subcommands registered by :mod:`cabe.cli` when present: ``cabe fit`` and ``cabe infer``."""

"""``python -m cabe.trace CONFIG.json [--precision bf16 ...]``: trace one setup and print a summary."""

from cabe.trace import _native

_native.preload()

from cabe.trace.cli import main  # noqa: E402

raise SystemExit(main())

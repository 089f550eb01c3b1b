"""The ``cabe`` command. Three layers per subcommand (one module each): the parser from the schema,
the numbers gathered from the core (:mod:`cabe.api`), the text or JSON rendered. Bad input: one
sentence on stderr in the user's language, exit code 2.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from cabe import jsonio
from cabe.errors import CabeError
from cabe.i18n import detect_lang
from cabe.units import check_output

EXIT_BAD_INPUT = 2


def main(argv: Sequence[str] | None = None) -> int:
    from cabe.cli.parser import build_parser

    parser = build_parser(argv, every=False)  # the flags of the command argv names only: a faster start
    args = parser.parse_args(argv)
    lang = detect_lang(getattr(args, "lang", None))
    if args.command is None:
        parser.print_help()
        return 0
    try:
        units = getattr(args, "units", None) or "GB"
        check_output(units, getattr(args, "lang", None))
        text = args._module.render(args._module.gather(args), args, lang, units)
        if text is not None:
            print(text)
        return 0
    except CabeError as err:
        from cabe.i18n import error_message

        if getattr(args, "json", False):
            print(jsonio.dumps({"error": err.to_dict(lang)}, indent=2))
        print(f"cabe: {error_message(err, lang)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `cabe ... | head`: the reader went away; nothing to report
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:  # a bug, not bad input: say so in one sentence, never a traceback
        from cabe.i18n import t

        print(f"cabe: {t('error.internal', lang, detail=f'{type(exc).__name__}: {exc}')}", file=sys.stderr)
        return 1


__all__ = ["EXIT_BAD_INPUT", "main"]

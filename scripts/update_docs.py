"""Re-run every ```console block's `$ cabe ...` command in the READMEs and docs/guides/*.md, and paste
its real output.

    .venv/bin/python scripts/update_docs.py        # rewrite the guides in place
    .venv/bin/python scripts/update_docs.py --check  # exit 1 if a guide's output is stale

Keeps the guides true after the model changes. Run from the repository root.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"```console\n\$ (cabe [^\n]+)\n(.*?)```", re.S)
VOLATILE = re.compile(r"Solved in [0-9.]+ ms\.")  # wall-clock lines differ run to run


def run(cmd: str) -> str:
    exe = str(ROOT / ".venv" / "bin" / "cabe")
    args = shlex.split(cmd)[1:]
    proc = subprocess.run([exe, *args], capture_output=True, text=True, cwd=ROOT, timeout=300)
    return proc.stdout + (proc.stderr if proc.returncode else "")


def main() -> int:
    check = "--check" in sys.argv
    stale = []
    for path in [ROOT / "README.md", ROOT / "README.es.md", *sorted((ROOT / "docs" / "guides").glob("*.md"))]:
        text = path.read_text(encoding="utf-8")

        def repl(m: re.Match[str], path: Path = path) -> str:
            out = run(m.group(1))
            if VOLATILE.sub("", out) != VOLATILE.sub("", m.group(2)):
                stale.append(f"{path.name}: {m.group(1)}")
            return f"```console\n$ {m.group(1)}\n{out}```"

        new = BLOCK.sub(repl, text)
        if not check and new != text:
            path.write_text(new, encoding="utf-8")
    for s in stale:
        print(("stale: " if check else "updated: ") + s)
    return 1 if (check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())

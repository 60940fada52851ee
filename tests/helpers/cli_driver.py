"""Run many ``lit-embed`` commands in one fresh process, each as the console script runs it, and report each.

    python tests/helpers/cli_driver.py CASES.json

``CASES.json`` is a list of ``{"id", "argv", "cwd"}``. Each command goes through ``lit_embed.commands.main`` with
its own stdout and stderr; one JSON line per case is printed: ``id``, ``status`` (what the process would
exit with: main's return value, a ``SystemExit`` code, or 1 where an exception escaped, whose traceback
then ends ``stderr`` as Python would print it), ``stderr`` and the tail of ``stdout``. One process pays the
imports once, so a whole matrix of faults costs seconds, not minutes.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import traceback


def run(argv: list[str]) -> tuple[int, str, str]:
    from lit_embed.commands import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(argv)
        except SystemExit as exit:
            status = exit.code if isinstance(exit.code, int) else (0 if exit.code is None else 1)
        except Exception:  # what Python prints before exiting 1
            traceback.print_exc()
            status = 1
    return status, err.getvalue(), out.getvalue()[-2000:]


def main() -> int:
    with open(sys.argv[1]) as handle:
        cases = json.load(handle)
    start = os.getcwd()
    for case in cases:
        os.chdir(case.get("cwd") or start)
        status, stderr, stdout = run(case["argv"])
        print(json.dumps({"id": case["id"], "status": status, "stderr": stderr, "stdout": stdout}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

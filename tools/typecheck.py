"""mypy over ``lit_embed/``, held to a baseline that only shrinks (CI runs it after ``ruff check``).

    python tools/typecheck.py            # exit 1 on an error the baseline does not list, or a listed one now fixed
    python tools/typecheck.py --shrink   # drop the fixed errors from the baseline (never adds one)

``tools/mypy-baseline.txt`` holds the errors the code had when the check came in, one a line, as
``file: [code] message`` without the line number, so that an edit above an error does not move it out of the
baseline. A new error fails the check: fix it (the baseline never grows by a tool). A fixed error fails it too,
until ``--shrink`` takes it out, so the file always says how many errors are left. mypy's settings live in
pyproject.toml (``[tool.mypy]``); its version is pinned in the test extra, since another version finds other errors.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BASELINE = REPO / "tools" / "mypy-baseline.txt"
ERROR = re.compile(r"^(?P<file>[^:\n]+):(?P<line>\d+): error: (?P<message>.*?)  \[(?P<code>[a-z0-9-]+)\]$")
HEADER = ("# mypy errors left in lit_embed/ (tools/typecheck.py): this list only shrinks; "
          "fix one, then run `python tools/typecheck.py --shrink`\n")


def errors(report: str) -> list[tuple[str, str]]:
    """mypy's error lines as ``(key, where)``: the line-free key the baseline holds, and ``file:line`` to look at."""
    found = []
    for line in report.splitlines():
        match = ERROR.match(line)
        if match:
            message = re.sub(r"\bline \d+\b", "line N", match["message"])  # "already defined on line 87"
            found.append((f"{match['file']}: [{match['code']}] {message}", f"{match['file']}:{match['line']}"))
    return found


def compare(found: list[tuple[str, str]], baseline: Counter) -> tuple[list[tuple[str, str]], Counter]:
    """The errors beyond what the baseline allows (with where they are), and the baseline's entries now fixed."""
    left = Counter(baseline)
    new = []
    for key, where in found:
        if left[key] > 0:
            left[key] -= 1
        else:
            new.append((key, where))
    return new, +left


def read_baseline(path: Path) -> Counter:
    return Counter(line for line in path.read_text().splitlines() if line and not line.startswith("#"))


def write_baseline(path: Path, keys: Counter) -> None:
    from lit_embed.storage.files import write_atomic

    write_atomic(path, HEADER + "".join(f"{key}\n" for key in sorted(keys.elements())))


def run_mypy() -> str:
    try:
        from mypy import api
    except ImportError:
        print("tools/typecheck.py: mypy is not installed: pip install -e '.[test]'", file=sys.stderr)
        sys.exit(2)
    out, err, status = api.run(["--config-file", str(REPO / "pyproject.toml")])
    if status not in (0, 1) or (status == 1 and not errors(out)):  # mypy itself failed, not the code
        sys.stderr.write(out + err)
        sys.exit(2)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shrink", action="store_true", help="drop the fixed errors from the baseline")
    args = parser.parse_args(argv)
    found = errors(run_mypy())
    baseline = read_baseline(BASELINE)
    new, fixed = compare(found, baseline)
    for key, where in new:
        print(f"{where}: new type error: {key.split(': ', 1)[1]}", file=sys.stderr)
    if args.shrink and fixed:
        write_baseline(BASELINE, baseline - fixed)
        print(f"{BASELINE.relative_to(REPO)}: {sum(fixed.values())} fixed errors dropped, "
              f"{sum((baseline - fixed).values())} left")
        fixed = Counter()
    elif fixed:
        print(f"{sum(fixed.values())} errors in {BASELINE.relative_to(REPO)} are fixed, well done: "
              "run `python tools/typecheck.py --shrink` and commit the shorter baseline", file=sys.stderr)
    if new:
        print(f"{len(new)} new type errors (above): fix them; the baseline only shrinks", file=sys.stderr)
    if not new and not fixed:
        print(f"mypy: no new errors ({len(found)} left in the baseline)")
    return 1 if new or fixed else 0


if __name__ == "__main__":
    sys.exit(main())

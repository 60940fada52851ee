"""The code a result timed: a digest of each of the repository's Python files the benchmark's process imported
(lit-embed's and the benchmarks'), recorded with the result, so that a figure cannot outlive the code it measured:
the headlines leave out a result whose files have changed since, and RESULTS.md marks it."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: The folders whose files a result's code is: the library and the benchmarks (not tests, not installed packages).
CODE = ("lit_embed/", "tools/bench/")


def file_digest(name: str) -> str:
    path = REPO / name
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12] if path.is_file() else "missing"


def combined(files: dict[str, str]) -> str:
    return hashlib.sha256(repr(sorted(files.items())).encode()).hexdigest()[:12]


def imported_code() -> dict:
    """``{"fingerprint", "files": {path: digest}}`` of the code this process has imported (over-inclusive where one
    process ran several benchmarks: a file one of them imported counts for the next)."""
    names = set()
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if not path:
            continue
        try:
            name = Path(path).resolve().relative_to(REPO).as_posix()
        except ValueError:
            continue
        if name.endswith(".py") and name.startswith(CODE):
            names.add(name)
    files = {name: file_digest(name) for name in sorted(names)}
    return {"fingerprint": combined(files), "files": files}


def changed_since(result: dict) -> list[str] | None:
    """The files of a result's code that differ now (``[]``: none); ``None`` where it recorded no code."""
    code = result.get("code")
    if not isinstance(code, dict) or not isinstance(code.get("files"), dict):
        return None
    return [name for name, digest in code["files"].items() if file_digest(name) != digest]


def describe(result: dict) -> str:
    """A result's code as a cell: its fingerprint, and whether the code has changed since."""
    changed = changed_since(result)
    if changed is None:
        return "no code fingerprint (measured before they were recorded)"
    fingerprint = result["code"]["fingerprint"]
    if not changed:
        return f"code {fingerprint}, current"
    shown = ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
    return f"code {fingerprint}, STALE: {shown} changed since"

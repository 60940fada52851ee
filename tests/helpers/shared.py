"""Folders several test files read (a trained demo run, ...), built once and shared by pytest-xdist's workers.

Each worker has a session of its own, so a session fixture alone would build the same run once per worker. A folder
here is built under a file lock in a cache both workers see, named by a digest of everything that decides its
contents (the inputs the caller names, lit-embed's source and configs, the tests' helpers, the library versions):
the first worker to ask builds it, the other waits and reads it. A list of every file's SHA-256, written atomically
when the build ends, marks it finished: a folder without one (a build that crashed) or whose files no longer match
(something wrote into it) is built again. Readers must not write into it: copy it (``shutil.copytree``) first.

The cache is the pytest session's base temporary folder (both workers', under xdist), so every session builds
afresh; ``LIT_EMBED_TEST_CACHE`` names another, kept between sessions.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from filelock import FileLock

from lit_embed.storage.files import write_json_atomic
from tests.helpers import CONFIGS, REPO

#: What decides what a build writes, besides the caller's inputs: read by every key.
SOURCES = (REPO / "lit_embed", CONFIGS, REPO / "tests" / "conftest.py", REPO / "tests" / "helpers")
VERSIONS = ("torch", "pytorch-lightning", "transformers", "tokenizers", "numpy", "datasets")
#: Written by a run and by whoever reads it (a run folder's lock): left out of the list of files.
UNLISTED = {".lock", ".launch.lock"}


def shared_folder(name: str, inputs: object, build: Callable[[Path], None], cache: Path) -> Path:
    """The folder ``build(folder)`` fills from ``inputs`` (JSON), built once for every process sharing ``cache``."""
    folder = cache / f"{name}-{key(name, inputs)[:16]}"
    listing = _listing(folder)
    cache.mkdir(parents=True, exist_ok=True)
    with _lock(folder):
        if changed(folder, listing) == []:
            return folder
        listing.unlink(missing_ok=True)
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        build(folder)
        write_json_atomic(listing, files(folder))
    return folder


def assert_untouched(folder: Path) -> None:
    """Fails naming the files a reader of the shared ``folder`` added, removed or rewrote."""
    with _lock(folder):
        changes = changed(folder, _listing(folder))
    assert changes == [], f"tests wrote into the shared {folder}: copy it first ({changes})"


def _listing(folder: Path) -> Path:
    return folder.with_name(folder.name + ".files.json")


def _lock(folder: Path) -> FileLock:
    return FileLock(folder.with_name(folder.name + ".lock"))


def changed(folder: Path, listing: Path) -> list[str] | None:
    """The files of ``folder`` that differ from its list (added, removed or rewritten); None where it has none."""
    try:
        recorded = json.loads(listing.read_text())
    except (OSError, ValueError):
        return None
    now = files(folder) if folder.is_dir() else {}
    return sorted(path for path in recorded.keys() | now.keys() if recorded.get(path) != now.get(path))


def files(folder: Path) -> dict[str, str]:
    return {path.relative_to(folder).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(folder.rglob("*")) if path.is_file() and path.name not in UNLISTED}


def key(name: str, inputs: object) -> str:
    return hashlib.sha256(json.dumps([name, inputs, _sources(), _versions()], sort_keys=True).encode()).hexdigest()


@functools.cache
def _sources() -> str:
    digest = hashlib.sha256()
    for root in SOURCES:
        for path in sorted(root.rglob("*") if root.is_dir() else [root]):
            if path.is_file() and "__pycache__" not in path.parts:
                digest.update(path.relative_to(REPO).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


@functools.cache
def _versions() -> dict[str, str]:
    return {"python": sys.version, **{name: metadata.version(name) for name in VERSIONS}}


def cache_root(tmp_path_factory) -> Path:
    """Where shared folders live: ``LIT_EMBED_TEST_CACHE``, else the session's base temporary folder (under xdist,
    the one above the workers' own)."""
    if os.environ.get("LIT_EMBED_TEST_CACHE"):
        return Path(os.environ["LIT_EMBED_TEST_CACHE"])
    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared"

"""A filesystem of its own, small enough to fill: what a full disk does to a writer, for real (a tmpfs, where this
machine lets the tests mount one; the tests that need it skip elsewhere)."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

BALLAST = "ballast"


@contextlib.contextmanager
def small_disk(path: Path, size: str = "16m") -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``path`` while the block runs."""
    import pytest

    path.mkdir(parents=True, exist_ok=True)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (it takes root)")
    try:
        yield path
    finally:
        subprocess.run(["umount", "--lazy", str(path)], capture_output=True)


def fill(folder: str | os.PathLike, leave: int = 0) -> None:
    """Fill the filesystem holding ``folder`` with a ballast file, then free ``leave`` bytes of it again."""
    ballast = Path(folder) / BALLAST
    handle = os.open(ballast, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for chunk in (1 << 16, 1):  # large blocks, then the last bytes one at a time
            try:
                while True:
                    os.write(handle, b"\0" * chunk)
            except OSError as error:
                assert error.errno == errno.ENOSPC, error
    finally:
        os.close(handle)
    if leave:
        os.truncate(ballast, max(0, ballast.stat().st_size - leave))

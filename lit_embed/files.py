"""Writing files so that a reader sees the old file or the new one, never half of one.

Every file lit-embed writes that another process (or a later command) reads goes through
:func:`atomic_writer`: checkpoints, results.json, reports, cluster codes, LSH n-grams, plots; every output
folder (``compress``, ``export``) through :func:`atomic_folder`.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import json
import os
import shutil
import socket
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from lit_embed.errors import DiskFullError, OutputExistsError


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike, mode: str = "wb") -> Iterator[IO]:
    """A file handle whose content appears at ``path`` only when the block ends without an error.

    The content goes to a temporary file in the same folder (so the final rename never crosses a
    filesystem), is flushed to disk, and replaces ``path`` with ``os.replace``: a reader sees the old
    file or the new one, never half of one, even if the process is killed mid-write. The temporary
    file's name carries the writer's host and process id: after a successful write, those left by
    killed writers of the same path on this host are removed, never a live writer's. A full disk is
    a :class:`~lit_embed.errors.DiskFullError` naming the device and the file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{path.name}."
    host = socket.gethostname()
    handle, temporary = tempfile.mkstemp(prefix=f"{prefix}{host}.{os.getpid()}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as out:
            yield out
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temporary, 0o644)  # mkstemp makes it private; results are for everyone who reads the runs
        os.replace(temporary, path)
    except BaseException as error:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        if _disk_full(error):
            raise DiskFullError(str(path), device_of(path.parent)) from None
        raise
    _sync_folder(path.parent)
    for stale in path.parent.glob(f"{glob.escape(prefix)}{glob.escape(host)}.*.tmp"):
        pid = stale.name[len(prefix) + len(host) + 1:].split(".", 1)[0]
        if pid.isdigit() and not process_alive(int(pid)):
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()


def atomic_folder(out: Path, overwrite: bool, fill: Callable[[Path], None], replaceable: Callable[[Path], None]) -> None:
    """Build ``out`` in a temporary folder beside it with ``fill``, then rename it into place.

    On any error the temporary folder is removed and ``out`` is left as it was (absent, or untouched).
    ``overwrite`` replaces only what ``replaceable`` accepts (it raises for anything else: an earlier output of
    the same command holding nothing foreign, say). Temporary folders that killed runs left beside ``out``
    (``.NAME.building-HOST-PID``) are removed once their process is gone.
    """
    out = Path(out).expanduser().absolute()

    def check() -> None:  # before the work, and again before the rename: a folder may appear meanwhile
        if out.exists():
            if not overwrite:
                raise OutputExistsError(f"output folder {str(out)!r} exists: choose another --out or pass --overwrite")
            replaceable(out)

    check()
    out.parent.mkdir(parents=True, exist_ok=True)
    host = socket.gethostname()
    _remove_stale(out.parent, f".{out.name}.building-{host}-")
    _remove_stale(out.parent, f".{out.name}.replaced-{host}-")
    building = out.parent / f".{out.name}.building-{host}-{os.getpid()}"
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir()
    try:
        fill(building)
        check()
        if out.exists():
            old = out.parent / f".{out.name}.replaced-{host}-{os.getpid()}"
            out.rename(old)
            building.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            try:
                building.rename(out)
            except OSError as error:  # another process put its output there meanwhile
                if error.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
                raise OutputExistsError(f"output folder {str(out)!r} was written by another process meanwhile: "
                                        f"choose another --out") from None
    except DiskFullError:
        shutil.rmtree(building, ignore_errors=True)
        raise DiskFullError(str(out), device_of(out.parent)) from None  # the user's folder, not the hidden one
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise


def _remove_stale(folder: Path, prefix: str) -> None:
    for path in folder.glob(glob.escape(prefix) + "*"):
        pid = path.name[len(prefix):]
        if pid.isdigit() and not process_alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _disk_full(error: BaseException | None) -> bool:
    """Whether ``error`` or what caused it is "no space left on device" (torch.save wraps it in a RuntimeError)."""
    seen = 0
    while error is not None and seen < 5:
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        error, seen = error.__cause__ or error.__context__, seen + 1
    return False


def device_of(folder: Path) -> str:
    """The mount point holding ``folder`` (what ``df`` names), for messages."""
    folder = folder.absolute()
    with contextlib.suppress(OSError):
        device = os.stat(folder).st_dev
        while folder.parent != folder and os.stat(folder.parent).st_dev == device:
            folder = folder.parent
    return str(folder)


def _sync_folder(folder: Path) -> None:
    """Make the rename durable (POSIX); a no-op where folders cannot be opened (Windows)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_atomic(path: str | os.PathLike, content: str | bytes) -> Path:
    """Write ``content`` to ``path`` atomically (see :func:`atomic_writer`)."""
    with atomic_writer(path, "wb" if isinstance(content, bytes) else "w") as out:
        out.write(content)
    return Path(path)


def write_json_atomic(path: str | os.PathLike, data: Any) -> Path:
    return write_atomic(path, json.dumps(data, indent=2, default=str) + "\n")


__all__ = ["atomic_folder", "atomic_writer", "device_of", "process_alive", "write_atomic", "write_json_atomic"]

"""Writing files so that a reader sees the old file or the new one, never half of one.

Every file lit-embed writes that another process (or a later command) reads goes through
:func:`atomic_writer`: checkpoints, results.json, reports, cluster codes, LSH n-grams, plots; every output
folder (``compress``, ``export``, ``analyze``) through :func:`atomic_folder`; what cannot be atomic (a log
appended to, TensorBoard's event files) through :func:`writing`. A full disk met by any of them is one
:class:`~lit_embed.errors.DiskFullError` naming the file and its device, however the library that wrote
wrapped it.

A file written in place (a lock, a log) is opened by :func:`open_in_place`, never through a symbolic link: a folder
that arrived from elsewhere (a tarball of runs) must not make lit-embed write a file outside it. An atomic write
replaces a link by its file, and writes nothing where it pointed.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import json
import os
import shlex
import shutil
import socket
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from lit_embed.errors import DiskFullError, OutputExistsError, RedirectedWriteError, causes


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
    if path.is_dir():  # os.replace would fail naming the temporary file
        raise OutputExistsError(f"{str(path)!r} is a folder: give the name of a file to write")
    path.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{path.name}."
    host = socket.gethostname()
    handle, temporary = tempfile.mkstemp(prefix=f"{prefix}{host}.{os.getpid()}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as out:
            yield out
            out.flush()
            os.fsync(out.fileno())
        _share_as_created(temporary)  # mkstemp makes it private; the user's umask says who reads their runs
        os.replace(temporary, path)
    except BaseException as error:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        if disk_full(error):
            raise DiskFullError(str(path), device_of(path), disk_full(error)) from None
        raise
    _sync_folder(path.parent)
    for stale in path.parent.glob(f"{glob.escape(prefix)}{glob.escape(host)}.*.tmp"):
        pid = stale.name[len(prefix) + len(host) + 1:].split(".", 1)[0]
        if pid.isdigit() and not process_alive(int(pid)):
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()


def atomic_folder(out: Path, overwrite: bool, fill: Callable[[Path], None], replaceable: Callable[[Path], None],
                  inputs: Iterable[str | os.PathLike | None] = ()) -> None:
    """Build ``out`` in a temporary folder beside it with ``fill``, then rename it into place.

    On any error the temporary folder is removed and ``out`` is left as it was (absent, or untouched); a full
    disk names ``out`` and its device, whichever file inside it (or library) met it. ``overwrite`` replaces only
    what ``replaceable`` accepts (it raises for anything else: an earlier output of the same command holding
    nothing foreign, say), and never a folder holding one of ``inputs``, what the command reads
    (:func:`check_output`). Temporary folders that killed runs left beside ``out``
    (``.NAME.building-HOST-PID``) are removed once their process is gone.
    """
    out = Path(out).expanduser().absolute()
    inputs = list(inputs)

    def check() -> None:  # before the work, and again before the rename: a folder may appear meanwhile
        check_output(out, overwrite, replaceable, inputs)

    check()
    host = socket.gethostname()
    building = out.parent / f".{out.name}.building-{host}-{os.getpid()}"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale(out.parent, f".{out.name}.building-{host}-")
        _remove_stale(out.parent, f".{out.name}.replaced-{host}-")
        shutil.rmtree(building, ignore_errors=True)
        building.mkdir()
        fill(building)
        for made in building.rglob("*"):  # libraries' writers (safetensors) may leave files private
            if not made.is_symlink():
                _share_as_created(made)
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
    except BaseException as error:
        shutil.rmtree(building, ignore_errors=True)
        if disk_full(error):  # the user's folder, not the hidden one, whichever file (or library) met it
            raise DiskFullError(str(out), device_of(out), disk_full(error)) from None
        raise


def _share_as_created(path: str | os.PathLike) -> None:
    """Give ``path`` the mode a plain ``open`` or ``mkdir`` would have given it under the user's umask (0644 under
    the usual 022; what keeps executable bits, folders among them, may be executed): ``mkstemp``, and libraries
    writing through temporary files as safetensors does, create files private (0600) whatever the umask says."""
    executable = os.stat(path).st_mode & 0o111
    os.chmod(path, (0o777 if executable else 0o666) & ~_umask())


def _umask() -> int:
    """The process's umask, read where Linux shows it without changing it (other threads may be creating files)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def check_output(out: Path, overwrite: bool, replaceable: Callable[[Path], None],
                 inputs: Iterable[str | os.PathLike | None] = (), option: str = "--out") -> None:
    """Refuse an existing ``out`` unless ``overwrite`` is given and ``replaceable`` accepts it; and refuse, whether it
    exists or not, an ``out`` that is one of ``inputs`` or holds one (symlinks resolved): replacing it would delete
    what the command reads. ``compress``, ``export`` and ``analyze`` check their ``--out`` with this, ``report`` its
    ``--output`` (``option``, as messages name it)."""
    out = Path(out).expanduser().absolute()
    where = out.resolve()
    for given in inputs:
        found = _local(given)
        if found is not None and (found == where or where in found.parents):
            raise OutputExistsError(f"{option} {str(out)!r} {'is' if found == where else 'holds'} {str(given)!r}, which "
                                    f"this command reads: the output would replace it; choose another {option}")
    if out.exists():
        if not overwrite:
            raise OutputExistsError(f"output folder {str(out)!r} exists: choose another --out or pass --overwrite")
        replaceable(out)


def check_file_output(out: str | os.PathLike, overwrite: bool, inputs: Iterable[str | os.PathLike | None] = (),
                      option: str = "OUT") -> Path:
    """Refuse a file to write (``option``, as messages name it) that is one of ``inputs`` (through a symbolic or a hard
    link too), a folder, or a file that exists unless ``overwrite``; ``out`` as given, checked."""
    path = Path(out).expanduser()
    for given in inputs:
        found = _local(given)
        if found is not None and path.exists() and os.path.samefile(found, path):
            raise OutputExistsError(f"{option} {str(out)!r} is {str(given)!r}, which this command reads: the output would "
                                    f"replace it; choose another {option}")
    if path.is_dir():
        raise OutputExistsError(f"{option} {str(out)!r} is a folder: give the name of a file to write")
    if path.exists() or path.is_symlink():
        if not overwrite:
            raise OutputExistsError(f"{option} {str(out)!r} exists: choose another {option} or pass --overwrite")
    return path


def _local(given: str | os.PathLike | None) -> Path | None:
    """``given`` resolved (symlinks followed) where it is a file or folder here; ``None`` for anything else (a hub
    name, a path too long to be one)."""
    if given is None or str(given) == "":
        return None
    try:
        path = Path(given).expanduser()
        return path.resolve() if path.exists() else None
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def writing(path: str | os.PathLike | Callable[[], str | os.PathLike]) -> Iterator[None]:
    """Run the block that writes ``path`` (a file or a folder, or a function giving it, asked only on a full disk); a
    full disk met inside it, however wrapped, becomes :class:`~lit_embed.errors.DiskFullError` naming ``path`` and its
    device. For writes that cannot be atomic (a log appended to, a library's own files); atomic writes go through
    :func:`atomic_writer` and :func:`atomic_folder`."""
    try:
        yield
    except DiskFullError:
        raise
    except BaseException as error:
        if disk_full(error):
            where = Path(path() if callable(path) else path)
            raise DiskFullError(str(where), device_of(where), disk_full(error)) from None
        raise


def open_in_place(path: str | os.PathLike, what: str, append: bool = False) -> int:
    """A descriptor of ``path`` open for writing, created (0644 under the umask) where absent: never through a symbolic
    link, and only onto a regular file (:func:`refuse_redirect` says why not). ``append``: writes go to its end."""
    path = Path(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags | (os.O_APPEND if append else 0), 0o644)  # O_NONBLOCK: a FIFO there does not hang
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
            refuse_redirect(path, what)
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        refuse_redirect(path, what)
    os.set_blocking(fd, True)
    return fd


def refuse_redirect(path: str | os.PathLike, what: str) -> None:
    """:class:`~lit_embed.errors.RedirectedWriteError` where ``path`` is a symbolic link or exists as anything but a
    regular file: a file lit-embed writes in place (the logger's hparams.yaml, a lock) would be written where it points."""
    path = Path(path)
    with contextlib.suppress(FileNotFoundError):
        mode = path.lstat().st_mode
        if stat.S_ISLNK(mode):
            found = f"a symbolic link (to {os.readlink(path)})"
        elif not stat.S_ISREG(mode):
            found = "a folder" if stat.S_ISDIR(mode) else "not a regular file"
        else:
            return
        raise RedirectedWriteError(f"{what} {path} is {found}: lit-embed writes no file in place through it, which "
                                   f"would write elsewhere; remove it (rm {shlex.quote(str(path))}) or use another folder")


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


#: The OS errors of a write that met a limit of space: a full disk, a quota, a file-size limit (ulimit -f, which
#: Python's ignored SIGXFSZ turns into EFBIG, or the filesystem's largest file).
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
#: What they read as, where a library kept only its text (safetensors' and tokenizers' Rust errors: "No space left on
#: device (os error 28)").
_DISK_FULL_TEXTS = {os.strerror(code): code for code in _DISK_FULL}


def disk_full(error: BaseException | None) -> int:
    """The errno (ENOSPC, EDQUOT or EFBIG; 0: none) where ``error``, or what caused it, is "no space left on device",
    "disk quota exceeded" or "file too large": an ``OSError`` (torch.save wraps it in a ``RuntimeError``), or a
    library's error that kept only its text (safetensors' ``SafetensorError``)."""
    for e in causes(error):
        if isinstance(e, OSError) and e.errno in _DISK_FULL:
            return e.errno
        found = next((code for text, code in _DISK_FULL_TEXTS.items() if text in str(e)), 0)
        if found:
            return found
    return 0


def full_disk_message(error: BaseException) -> str:
    """The line for a full disk met outside lit-embed's writers: the file and its device where the error names them
    (a copy's destination, else its file), or that it names none."""
    named = next((e.filename2 or e.filename for e in causes(error)
                  if isinstance(e, OSError) and isinstance(e.filename2 or e.filename, (str, bytes, os.PathLike))), None)
    if named is None:
        if disk_full(error) == errno.EFBIG:
            return (f"file too large, writing a file the error does not name ({error}): it met a file-size limit (the "
                    f"shell's ulimit -f, or the filesystem's largest file): raise the limit or write elsewhere")
        return f"no space left on a device, writing a file the error does not name ({error}): free space or write elsewhere"
    path = Path(os.fsdecode(named))
    return str(DiskFullError(str(path), device_of(path), disk_full(error)))


def device_of(path: Path) -> str:
    """The mount point holding ``path`` (what ``df`` names), for messages; ``path`` need not exist yet."""
    folder = Path(path).absolute()
    while not folder.exists() and folder.parent != folder:
        folder = folder.parent
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


__all__ = ["atomic_folder", "atomic_writer", "check_file_output", "check_output", "device_of", "disk_full", "full_disk_message", "open_in_place", "process_alive", "refuse_redirect",
           "write_atomic", "write_json_atomic", "writing"]

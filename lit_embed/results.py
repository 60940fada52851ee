"""Run results: one ``results.json`` per run folder, written atomically, read back by ``lit-embed report``.

The file holds what a table row needs without the checkpoint: the config, seed, task and label, the
library versions, the final metrics, the parameter figures and the timings (see
:class:`lit_embed.callbacks.ResultsWriter`, which writes it).
"""

from __future__ import annotations

import contextlib
import errno
import glob
import json
import os
import platform
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from lit_embed.errors import ConfigError, DiskFullError, MissingFileError

RESULTS_FILE = "results.json"
#: Bumped when the layout of ``results.json`` changes incompatibly.
RESULTS_FORMAT = 1
#: What every ``results.json`` holds (``status``, added later, defaults to ``complete``).
REQUIRED_KEYS = ("label",)
#: The last component of a metric name that is a score (higher is better): PRR is defined for these.
SCORE_METRICS = ("accuracy", "f1", "matthews", "pearson", "spearman", "exact_match")
#: Stages whose metrics are evaluations (PRR is computed for these, not for training metrics).
EVAL_STAGES = ("val", "test")


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
        with os.fdopen(handle, mode) as out:
            yield out
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temporary, 0o644)  # mkstemp makes it private; results are for everyone who reads the runs
        os.replace(temporary, path)
    except BaseException as error:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        if _disk_full(error):
            raise DiskFullError(str(path), _device(path.parent)) from None
        raise
    _sync_folder(path.parent)
    for stale in path.parent.glob(f"{glob.escape(prefix)}{glob.escape(host)}.*.tmp"):
        pid = stale.name[len(prefix) + len(host) + 1:].split(".", 1)[0]
        if pid.isdigit() and not process_alive(int(pid)):
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()


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


def _device(folder: Path) -> str:
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


def versions() -> dict[str, str]:
    """The versions a result depends on."""
    import pytorch_lightning
    import torch
    import transformers

    import lit_embed

    return {
        "lit_embed": lit_embed.__version__,
        "torch": str(torch.__version__),  # a TorchVersion object otherwise: not plain data
        "pytorch_lightning": pytorch_lightning.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }


def is_score(name: str) -> bool:
    """Whether metric ``name`` (``{stage}/...{metric}``) is an evaluation score that PRR applies to."""
    parts = name.split("/")
    return len(parts) >= 2 and parts[0] in EVAL_STAGES and parts[-1] in SCORE_METRICS


def load_results(run_dir: str | os.PathLike) -> dict:
    """The results of one run folder, with ``run_dir`` set; a clear error when there are none."""
    path = Path(run_dir) / RESULTS_FILE
    if not path.is_file():
        raise MissingFileError(
            f"{run_dir}: no {RESULTS_FILE}. The run did not finish, or ran without the "
            f"lit_embed.callbacks.ResultsWriter callback (the shipped trainer configs enable it): "
            f"rerun it, or leave the folder out"
        )
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ConfigError(f"{path} is not valid JSON ({error}): rerun the run or delete the file") from error
    if not isinstance(data, dict) or data.get("format") != RESULTS_FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise ConfigError(f"{path} has format {found!r}, expected {RESULTS_FORMAT}: it was not written by this lit-embed")
    missing = [key for key in REQUIRED_KEYS if key not in data]
    if missing:
        raise ConfigError(f"{path} lacks {', '.join(missing)}: it was not written by ResultsWriter; rerun the run or leave it out")
    data["run_dir"] = str(run_dir)
    return data


def find_run_dirs(paths: list[str]) -> list[Path]:
    """Run folders among ``paths``: each path is a run folder, or a folder holding run folders at any depth."""
    found: list[Path] = []
    for name in paths:
        path = Path(name)
        if not path.is_dir():
            raise MissingFileError(f"{name}: no such run folder")
        if (path / RESULTS_FILE).is_file():
            found.append(path)
            continue
        nested = sorted(p.parent for p in path.rglob(RESULTS_FILE))
        if not nested:
            load_results(path)  # raises the "no results.json" explanation
        found.extend(nested)
    unique: dict[Path, Path] = {}
    for path in found:
        unique.setdefault(path.resolve(), path)
    return list(unique.values())


def describe_backbone(backbone: dict | None) -> str:
    if not backbone:
        return "unknown backbone"
    return f"{backbone['arch']} {backbone['layers']}x{backbone['hidden']} ({backbone['heads']} heads, FFN {backbone['ffn']})"


def check_same_backbone(run: dict, baseline: dict) -> None:
    """Refuse a baseline whose encoder differs: PCR and speed-up compare embeddings on one backbone."""
    mine, theirs = run.get("backbone"), baseline.get("backbone")
    if mine and theirs and mine != theirs:
        raise ConfigError(
            f"baseline {baseline.get('run_dir', '?')} has backbone {describe_backbone(theirs)} but "
            f"{run.get('run_dir', 'this run')} has {describe_backbone(mine)}: compare against a baseline run "
            f"with the same backbone (the dense strategy on it, as the papers do)"
        )

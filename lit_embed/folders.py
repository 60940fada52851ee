"""Run folders: every run writes into a folder of its own and finds its checkpoints there again.

This module imports no Lightning (`lit-embed report` and the sweeps read run folders without it); the
logger that claims a run's folder is :class:`lit_embed.runs.RunLogger`.

* A run's folder is ``<root>/version_N``. ``root`` is the trainer's ``default_root_dir`` (``runs/<config
  name>`` unless the config says otherwise) for :class:`~lit_embed.runs.RunLogger`, the logger the CLI gives every run;
  N is the next free number, claimed with an atomic ``mkdir``, so runs started together never share one.
* The process holds a lock on its run folder, and on every checkpoint folder it writes, for as long as
  it lives (released when it exits, however it exits): another live run that would write there is
  refused. The lock file (``.lock``) stays behind, unlocked.
* Checkpoints go to ``version_N/checkpoints``. ``--ckpt_path last`` resumes the newest checkpoint under
  ``root`` and continues in its run folder; a config starts from a finished run by naming its run
  folder or its experiment folder (``checkpoint: runs/demo``: the newest run there with a checkpoint
  whose results, where it wrote some, say it completed). A run folder gives the model the run reported:
  its best checkpoint where a monitor chose one (``results.json`` records it), else its newest ``last``.
  A run that diverged gives none: its checkpoints are refused by name, never taken for its model.
* A killed run leaves its folder with what it wrote; later commands skip folders without the file they
  look for (results, checkpoints).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import re
import shutil
import socket
import sys
from pathlib import Path

from lit_embed.errors import CheckpointError, MissingFileError, RunBusyError, did_you_mean
from lit_embed.files import writing
from lit_embed.results import COMPLETE, DIVERGED, RESULTS_FILE, status_of

try:
    import fcntl
except ImportError:  # Windows: runs are not locked
    fcntl = None

LOCK_FILE = ".lock"
#: The lock of a folder that holds other processes' runs (a sweep's launch).
LAUNCH_LOCK = ".launch.lock"
CHECKPOINTS = "checkpoints"
LAST = "last.ckpt"
_held: dict[str, int] = {}  # folder -> open file descriptor of its lock, for this process's life
_claimed: list[Path] = []  # version folders this process created
_made: list[Path] = []  # the folders above them that it created too (``runs/<name>``, ``runs``), innermost first
#: What a run writes before it has done anything.
STARTED = frozenset({LOCK_FILE, "config.yaml", "hparams.yaml"})


def hold(folder: str | os.PathLike, what: str = "run folder", holds_runs: bool = False) -> None:
    """Lock ``folder`` for this process (until it exits); :class:`RunBusyError` if a live process holds it, or holds a
    folder it lies in. ``holds_runs``: a folder other processes' runs go into (a sweep's), locked by a file of its own
    (:data:`LAUNCH_LOCK`) that leaves them be."""
    folder = Path(folder).absolute()
    lock = LAUNCH_LOCK if holds_runs else LOCK_FILE
    if fcntl is None or any(Path(held) in (folder, *folder.parents) for held in _held):
        return  # held already, or inside a folder this process holds
    owner = None if holds_runs else next((parent for parent in folder.parents if held(parent)), None)
    if owner is not None:  # inside another live run's folder
        _refuse(folder, what, owner / LOCK_FILE, f" (inside {owner}, which it holds)")
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        _refuse(folder, what, folder / lock)
    try:
        with writing(folder / lock):
            os.ftruncate(fd, 0)
            os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
    except OSError:
        os.close(fd)
        raise
    _held[str(folder)] = fd


def _refuse(folder: Path, what: str, lock: Path, where: str = "") -> None:
    who = ""
    with contextlib.suppress(OSError):
        who = lock.read_text(errors="replace").strip()
    raise RunBusyError(
        f"{what} {folder}{where} is in use by a live run ({who or 'another process'}): runs must not share folders; give "
        f"this run its own (trainer.default_root_dir, or the checkpoint callback's dirpath) or wait for that one"
    )


def held(folder: str | os.PathLike) -> bool:
    """Whether a live process holds ``folder`` (:func:`hold`), on this host or another that shares the
    filesystem: the lock dies with its process, however it ended."""
    path = Path(folder).absolute() / LOCK_FILE
    if fcntl is None or not path.is_file():
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # releases the shared lock taken just now
    return False


def claim_version(root: str | os.PathLike) -> int:
    """The next free ``version_N`` under ``root``, created atomically (two processes never get the same N)."""
    root = Path(root).absolute()
    _made.extend(folder for folder in (root, *root.parents) if not folder.exists() and folder not in _made)
    root.mkdir(parents=True, exist_ok=True)
    number = max((_number(p) for p in root.glob("version_*")), default=-1) + 1
    while True:
        try:
            (root / f"version_{number}").mkdir()
        except FileExistsError:
            number += 1
            continue
        except FileNotFoundError:  # another process's refused run removed the folder it had made
            root.mkdir(parents=True, exist_ok=True)
            continue
        _claimed.append((root / f"version_{number}").absolute())
        return number


def discard_unstarted() -> list[Path]:
    """Remove the run folders this process claimed that hold nothing but what a run writes as it starts (its
    locks, config.yaml, hparams.yaml): a run refused for bad input or stopped before its first step leaves no
    ``version_N`` for later commands, TensorBoard or ``report`` to find, nor an empty ``runs/<name>`` it created to
    hold one. Returns the run folders removed."""
    removed = []
    for folder in _claimed:
        if folder.is_dir() and all(p.is_dir() or p.name in STARTED for p in folder.rglob("*")):
            for locked in [Path(held) for held in _held if folder in (Path(held), *Path(held).parents)]:
                os.close(_held.pop(str(locked)))
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    for made in _made:  # innermost first; only where empty (another run may have put its own there)
        with contextlib.suppress(OSError):
            made.rmdir()
    _claimed.clear()
    _made.clear()
    return removed


def version_folders(root: str | os.PathLike) -> list[Path]:
    """``root``'s ``version_N`` folders, oldest first."""
    found = [p for p in Path(root).glob("version_*") if p.is_dir() and _number(p) >= 0]
    return sorted(found, key=_number)


def newest_checkpoint(root: str | os.PathLike, default_root_dir: str | os.PathLike | None = None) -> Path | None:
    """The checkpoint ``--ckpt_path last`` resumes: the newest ``last*.ckpt`` of any run under ``root``, or a
    checkpoint Lightning saved for a SLURM requeue (``hpc_ckpt_N.ckpt``) there or in ``default_root_dir``; refused
    (:class:`CheckpointError`) where it is one of a run that diverged."""
    candidates = []
    for folder in version_folders(root):
        candidates += (folder / CHECKPOINTS).glob("last*.ckpt")
        candidates += folder.glob("hpc_ckpt_*.ckpt")
    for folder in {Path(root), Path(default_root_dir or root)}:
        candidates += folder.glob("hpc_ckpt_*.ckpt")
    found = _newest(candidates)
    run = next((parent for parent in found.parents if parent.parent == Path(root)), None) if found else None
    if run is not None and _status(run) == DIVERGED:
        raise CheckpointError(
            f"--ckpt_path last: the newest checkpoint under {root} is {found}, of the run {run}, which diverged "
            f"({_detail(run)}): resuming it would not give a trained model. Start a new run (without --ckpt_path last), "
            f"or give the checkpoint file to resume it anyway"
        )
    return found


def _newest(paths) -> Path | None:
    """The newest of ``paths`` that holds something (a file a killed save left empty does not count)."""
    whole = [p for p in paths if p.is_file() and p.stat().st_size > 0]
    return max(whole, key=lambda p: p.stat().st_mtime_ns) if whole else None


def run_of(path: str | os.PathLike, root: str | os.PathLike) -> int | None:
    """The version number of the run under ``root`` that ``path`` lies in (``None`` if it is not in one)."""
    path, root = Path(path).absolute(), Path(root).absolute()
    for parent in path.parents:
        if parent.parent == root and _number(parent) >= 0:
            return _number(parent)
    return None


def start_checkpoint(name: str | os.PathLike, what: str = "checkpoint", newest: bool = False) -> Path:
    """The checkpoint a command takes, given as a file, a run folder or an experiment folder.

    A run folder gives the model its run reported: the best checkpoint its ``results.json`` records where a monitor
    chose one, else its newest ``last*.ckpt`` (or its only checkpoint); ``newest``: the newest state whatever was
    reported (what ``fit`` resumes). An experiment folder (one holding ``version_N`` folders) gives that of the newest
    of its runs that has a checkpoint and did not stop short (interrupted, untested or diverged: its results.json says
    so). A run that diverged is refused.
    """
    path = Path(name).expanduser()
    if path.is_file():
        return taken(what, name, path, "the file given")
    if not path.is_dir():
        raise MissingFileError(f"{what} {str(name)!r} does not exist{did_you_mean(path)}: give a .ckpt file, a run folder "
                               f"or an experiment folder")
    if (path / CHECKPOINTS).is_dir() or (path / RESULTS_FILE).is_file():
        return _said(what, name, *_checkpoint_of_run(path, what, newest))
    usable = [run for run in version_folders(path) if _checkpoints(run) and _status(run) in (None, COMPLETE)]
    if not usable:
        seen = ", ".join(f"{p.name} ({_status(p) or 'no results'})" for p in version_folders(path)) or "none"
        raise MissingFileError(
            f"{what} {str(name)!r} holds no finished run with a checkpoint (runs: {seen}): train one first, or "
            f"give a .ckpt file"
        )
    checkpoint, why = _checkpoint_of_run(usable[-1], what, newest)
    return _said(what, name, checkpoint, f"{why}; {usable[-1].name} is the newest finished run of {str(name)!r}")


#: (what, folder, checkpoint) already said by the command running: it may ask more than once. Each command runs in a
#: context of its own (lit_embed.commands.main), so the next command in the same process says it again.
_SAID: contextvars.ContextVar[frozenset] = contextvars.ContextVar("checkpoints_said", default=frozenset())


def _said(what: str, name, checkpoint: Path, why: str) -> Path:
    """Say on stderr which file a folder gave, and why (the user named a folder, not this file)."""
    key = (what, str(name), str(checkpoint))
    if key not in _SAID.get():
        _SAID.set(_SAID.get() | {key})  # a new set: a copied context keeps the one it had
        step = re.search(r"step=(\d+)", checkpoint.name)
        at = f" (step {step.group(1)})" if step else ""
        print(f"lit-embed: {what} {str(name)!r} is {checkpoint}{at}: {why}", file=sys.stderr, flush=True)
    return taken(what, name, checkpoint, why)


#: The checkpoints the command running took, oldest first (:func:`checkpoints_taken`); per command, as :data:`_SAID`.
_TAKEN: contextvars.ContextVar[tuple] = contextvars.ContextVar("checkpoints_taken", default=())


def taken(what: str, name, checkpoint: Path, why: str) -> Path:
    """Record that the command running took ``checkpoint`` as its ``what``, given ``name``, and why; returns it."""
    record = {"what": what, "given": str(name), "file": str(checkpoint.absolute()), "step": _step(checkpoint), "why": why}
    if record not in _TAKEN.get():
        _TAKEN.set((*_TAKEN.get(), record))
    return checkpoint


def new_command() -> None:
    """Forget what was taken and said before the command starting now (by a caller of this module outside any command,
    whose context the command's copies): each command records and says its own."""
    _SAID.set(frozenset())
    _TAKEN.set(())


def checkpoints_taken() -> list[dict]:
    """Which checkpoints the command running took (:func:`start_checkpoint`), for its outputs to record: for each,
    what it was for, the name given (a file, a run or an experiment folder), the file, its training step where its
    name or its run's results say it, and why that file (the file given, the best its run reported, its newest)."""
    return [dict(record) for record in _TAKEN.get()]


def _step(checkpoint: Path) -> int | None:
    """The step ``checkpoint`` was saved at: as its name says (``step=N``), or, for a run's ``last`` checkpoint, as the
    run's results do (the step the run ended at)."""
    found = re.search(r"step=(\d+)", checkpoint.name)
    if found:
        return int(found.group(1))
    if checkpoint.parent.name == CHECKPOINTS and checkpoint == _newest(checkpoint.parent.glob("last*.ckpt")):
        step = _results(checkpoint.parent.parent).get("global_step")
        return step if isinstance(step, int) else None
    return None


def _checkpoint_of_run(run: Path, what: str, newest: bool) -> tuple[Path, str]:
    if _status(run) == DIVERGED:
        raise CheckpointError(
            f"{what} {str(run)!r} is a run that diverged ({_detail(run)}): it has no trained model to take. Rerun it "
            f"(a lower learning rate, or another precision), or give one of its checkpoint files to take that one anyway"
        )
    reported = _results(run).get("checkpoint") or {}
    if reported.get("monitor") is not None and reported.get("best") and not newest:
        best = run / reported["best"]  # relative to the run folder (absolute where it was saved elsewhere)
        if not best.is_file():
            raise MissingFileError(f"{what} {str(run)!r} reports {reported['best']} as its best checkpoint (by "
                                   f"{reported['monitor']}), which is gone: give a .ckpt file")
        return best, f"the best checkpoint by {reported['monitor']} its run reported"
    files = _checkpoints(run)
    last = _newest(p for p in files if p.name.startswith("last"))  # last-v1.ckpt: Lightning's beside a stale last.ckpt
    step = _results(run).get("global_step")
    chose = "its newest state" + (f", step {step}" if isinstance(step, int) else "")
    chose += " (asked for)" if newest else " (the run reported no best)"
    if last is not None:
        return last, chose
    if len(files) == 1:
        return files[0], "the run's only checkpoint"
    if not files:
        raise MissingFileError(f"{what} {str(run)!r} is a run folder without checkpoints: give a .ckpt file")
    raise CheckpointError(f"{what} {str(run)!r} holds several checkpoints ({', '.join(p.name for p in files)}): name one")


def _checkpoints(run: Path) -> list[Path]:
    return sorted(p for p in (run / CHECKPOINTS).glob("*.ckpt") if p.is_file())


def _results(run: Path) -> dict:
    """What ``run``'s results.json says (empty where it has none, or one that cannot be read)."""
    with contextlib.suppress(OSError, ValueError):
        found = json.loads((run / RESULTS_FILE).read_text())
        return found if isinstance(found, dict) else {}
    return {}


def _status(run: Path) -> str | None:
    """The status ``run``'s results.json records (``None``: it has none)."""
    found = _results(run)
    return status_of(found) if found else None


def _detail(run: Path) -> str:
    found = _results(run)
    return found.get("detail") or f"at step {found.get('global_step')}"


def _number(path: Path) -> int:
    suffix = path.name.removeprefix("version_")
    return int(suffix) if suffix.isdigit() and path.name.startswith("version_") else -1


__all__ = ["CHECKPOINTS", "LAST", "LOCK_FILE", "checkpoints_taken", "claim_version", "discard_unstarted", "held", "hold", "new_command", "newest_checkpoint", "run_of",
           "start_checkpoint", "taken", "version_folders"]

"""Run folders: every run writes into a folder of its own and finds its checkpoints there again.

This module imports no Lightning (`lit-embed report` and the sweeps read run folders without it); the
logger that claims a run's folder is :class:`lit_embed.runs.logger.RunLogger`.

* A run's folder is ``<root>/version_N``. ``root`` is the trainer's ``default_root_dir`` (``runs/<config
  name>`` unless the config says otherwise) for :class:`~lit_embed.runs.logger.RunLogger`, the logger the CLI gives every run;
  N is the next free number, claimed with an atomic ``mkdir``, so runs started together never share one.
* The process holds a lock on its run folder, and on every checkpoint folder it writes, for as long as
  it lives (released when it exits, however it exits): another live run that would write there is
  refused. The lock file (``.lock``) stays behind, unlocked.
* Checkpoints go to ``version_N/checkpoints``. ``--ckpt_path last`` resumes the newest checkpoint under
  ``root`` and continues in its run folder; a config starts from a finished run by naming its run
  folder or its experiment folder (``checkpoint: runs/demo``: the newest run there with a checkpoint
  whose results say it completed; a run without results was killed, and is never taken as finished). A run
  folder gives the model the run reported: its best checkpoint where a monitor chose one (``results.json``
  records it), else its newest state: the highest step its checkpoint files record, never the step their
  names say nor which is called ``last``. A run that diverged gives none: its checkpoints are refused by
  name, never taken for its model.
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

from lit_embed.errors import CheckpointError, MissingFileError, OutputExistsError, RunBusyError, did_you_mean
from lit_embed.runs.results import COMPLETE, DIVERGED, RESULTS_FILE, status_of
from lit_embed.storage.files import open_in_place, refuse_redirect, writing

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
#: What a run's logger writes in place (Lightning's ``hparams.yaml``, not atomically): :func:`hold` refuses a link there.
IN_PLACE = "hparams.yaml"
#: What a run writes before it has done anything.
STARTED = frozenset({LOCK_FILE, "config.yaml", IN_PLACE})


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
    fd = open_in_place(folder / lock, f"{what}'s lock")
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
    if not holds_runs:
        refuse_redirect(folder / IN_PLACE, f"{what}'s hyperparameters")


def _refuse(folder: Path, what: str, lock: Path, where: str = "") -> None:
    who = ""
    with contextlib.suppress(OSError), open(os.open(lock, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)), "rb") as text:
        who = text.read(200).decode(errors="replace").strip()
    raise RunBusyError(
        f"{what} {folder}{where} is in use by a live run ({who or 'another process'}): runs must not share folders; give "
        f"this run its own (trainer.default_root_dir, or the checkpoint callback's dirpath) or wait for that one"
    )


def holds(folder: str | os.PathLike) -> bool:
    """Whether this process holds ``folder`` (:func:`hold`), as an inline sweep launch holds its sweep's."""
    return str(Path(folder).absolute()) in _held


def held(folder: str | os.PathLike, lock: str = LOCK_FILE) -> bool:
    """Whether a live process holds ``folder`` (:func:`hold`; ``lock``: :data:`LAUNCH_LOCK` for a folder of runs), on
    this host or another that shares the filesystem: the lock dies with its process, however it ended."""
    path = Path(folder).absolute() / lock
    if fcntl is None or path.is_symlink() or not path.is_file():
        return False  # a link is no run's lock (hold refuses it)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return False
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


def claim_folder(folder: str | os.PathLike, numbered: bool, option: str) -> Path:
    """Create ``folder`` atomically for this process's output (``predict``'s): where it exists, ``numbered`` takes the
    first free ``folder-2``, ``folder-3``, ...; otherwise it is refused, naming ``option``. Like a claimed run folder,
    it is removed again if the command stops before writing more than a run writes as it starts."""
    folder = Path(folder).absolute()
    _made.extend(made for made in (folder.parent, *folder.parent.parents) if not made.exists() and made not in _made)
    folder.parent.mkdir(parents=True, exist_ok=True)
    candidate, number = folder, 1
    while True:
        try:
            candidate.mkdir()
        except FileExistsError:
            if not numbered:
                raise OutputExistsError(f"{option} {str(folder)!r} exists: choose another {option}, or remove it") from None
            number += 1
            candidate = folder.with_name(f"{folder.name}-{number}")
            continue
        _claimed.append(candidate)
        return candidate


def discard_unstarted() -> list[Path]:
    """Remove the run folders this process claimed that hold nothing but what a run writes as it starts (its
    locks, config.yaml, hparams.yaml): a run refused for bad input or stopped before its first step leaves no
    ``version_N`` for later commands, TensorBoard or ``report`` to find, nor an empty ``runs/<name>`` it created to
    hold one. Returns the run folders removed."""
    removed = []
    for folder in _claimed:
        if folder.is_dir() and all(p.is_dir() or p.name in STARTED or _no_events(p) for p in folder.rglob("*")):
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


def _no_events(path: Path) -> bool:
    """Whether ``path`` is a TensorBoard event file holding only its header (the one record of its version): what a
    logger that has logged nothing leaves. A record is its length (8 bytes), their CRC (4), the data, its CRC (4)."""
    if not path.name.startswith("events.out.tfevents.") or path.stat().st_size > 256:
        return False
    data = path.read_bytes()
    return len(data) >= 12 and 16 + int.from_bytes(data[:8], "little") == len(data) and b"brain.Event:" in data


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
    if run is not None and found is not None:  # a run killed before its last save: its newest state is another file
        found = _newest_state([found, *_checkpoints(run)])
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


def _newest_state(files: list[Path]) -> Path:
    """Of one run's checkpoint ``files``, the newest state: the highest step the files record (never their names: a
    run killed between a periodic save and its ``last.ckpt`` leaves a stale ``last.ckpt``); among equals, a ``last``
    file, then the newest written."""
    def rank(path: Path) -> tuple:
        step = saved_step(path)
        return (-1 if step is None else step, path.name.startswith("last"), path.stat().st_mtime_ns)
    return max((p for p in files if p.is_file() and p.stat().st_size > 0), key=rank, default=files[0])


#: The steps :func:`saved_step` read, by file and its size and time: a file is read for its step once per process.
_STEPS: dict[tuple[str, int, int], int | None] = {}


def saved_step(checkpoint: str | os.PathLike, read: bool = True) -> int | None:
    """The global step ``checkpoint`` records, read from the file (its tensors mapped, not read; no Python object
    unpickled); ``None`` where it records none or cannot be read so, or (``read`` false) it was not read before."""
    try:
        stat = os.stat(checkpoint)
    except OSError:
        return None
    key = (os.path.abspath(checkpoint), stat.st_size, stat.st_mtime_ns)
    if key not in _STEPS and read:
        import torch  # here: report and the sweeps read run folders without torch

        _STEPS[key] = None
        with contextlib.suppress(Exception):
            found = torch.load(checkpoint, map_location="cpu", mmap=True, weights_only=True)
            step = found.get("global_step") if isinstance(found, dict) else None
            _STEPS[key] = step if isinstance(step, int) else None
    return _STEPS.get(key)


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
    chose one, else its newest state (the highest step its checkpoint files record, a ``last`` among equals);
    ``newest``: the newest state whatever was reported (what ``fit`` resumes). An experiment folder (one holding
    ``version_N`` folders) gives that of the newest of its runs that has a checkpoint and completed (its results.json
    says so: one without was killed). A run that diverged is refused.
    """
    path = Path(name).expanduser()
    if path.is_file():
        return taken(what, name, path, "the file given")
    if not path.is_dir():
        raise MissingFileError(f"{what} {str(name)!r} does not exist{did_you_mean(path)}: give a .ckpt file, a run folder "
                               f"or an experiment folder")
    if (path / CHECKPOINTS).is_dir() or (path / RESULTS_FILE).is_file():
        return _said(what, name, *_checkpoint_of_run(path, what, newest))
    usable = [run for run in version_folders(path) if _checkpoints(run) and _status(run) == COMPLETE]
    if not usable:
        seen = ", ".join(f"{p.name} ({_status(p) or _without_results(p)})" for p in version_folders(path)) or "none"
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
        step = _step(checkpoint)
        at = f" (step {step})" if step is not None else ""
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
    """The step ``checkpoint`` was saved at: as the file records it where a run folder's choice read it (a file given is
    read by its command, once); else as its name says (``step=N``), or, for a run's ``last`` checkpoint, as the run's
    results do (the step the run ended at)."""
    recorded = saved_step(checkpoint, read=False)
    if recorded is not None:
        return recorded
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
    if not files:
        raise MissingFileError(f"{what} {str(run)!r} is a run folder without checkpoints: give a .ckpt file")
    if len(files) == 1 and not files[0].name.startswith("last"):
        return files[0], "the run's only checkpoint" + _unfinished(run)
    chosen = _newest_state(files)
    step = _step(chosen)
    chose = "its newest state" + (f", step {step}" if step is not None else "")
    chose += " (asked for)" if newest else " (the run reported no best)"
    last = _newest(p for p in files if p.name.startswith("last"))  # last-v1.ckpt: Lightning's beside a stale last.ckpt
    behind = _step(last) if last is not None and last != chosen else None
    if last is not None and behind is not None and step is not None and behind < step:
        chose += f"; {last.name} records step {behind}, saved before it"
    if saved_step(chosen) is None and not chosen.name.startswith("last"):
        raise CheckpointError(f"{what} {str(run)!r} holds several checkpoints ({', '.join(p.name for p in files)}) "
                              f"without a step it can read: name one")
    return chosen, chose + _unfinished(run)


def _unfinished(run: Path) -> str:
    """What to add to the reason a file of ``run`` was taken where the run did not finish."""
    status = _status(run)
    if status == COMPLETE:
        return ""
    return f"; the run {_without_results(run)}" if status is None else f"; the run did not finish ({status})"


def _without_results(run: Path) -> str:
    """Why ``run`` has no results.json: it runs now, or it was killed (or has no ResultsWriter)."""
    return "runs now, no results yet" if held(run) else "has no results: killed, or run without a ResultsWriter"


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


__all__ = ["CHECKPOINTS", "LAST", "LAUNCH_LOCK", "LOCK_FILE", "checkpoints_taken", "claim_folder", "claim_version", "discard_unstarted", "held", "hold", "holds", "new_command", "newest_checkpoint", "run_of",
           "start_checkpoint", "taken", "version_folders"]

"""The cache of folders the test files share (tests/helpers/shared.py): one build for every process asking at once,
a new build for new inputs and for an entry a crash or a reader left broken, and readers that wrote are named."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

import pytest

from tests.helpers import shared
from tests.helpers.shared import assert_untouched, shared_folder


def builder(log: Path, pause: float = 0.0):
    """A build that writes two files and notes each time it runs in ``log`` (appends are atomic for a line)."""

    def build(folder: Path) -> None:
        with log.open("a") as handle:
            handle.write(f"{folder.name}\n")
        time.sleep(pause)
        (folder / "sub").mkdir()
        (folder / "sub" / "weights.bin").write_bytes(b"\x00" * 100)
        (folder / "results.json").write_text("{}")

    return build


def _ask(cache: str, log: str, answers) -> None:
    answers.put(str(shared_folder("run", {"steps": 4}, builder(Path(log), pause=1.0), Path(cache))))


def test_processes_asking_at_once_share_one_build(tmp_path):
    context = multiprocessing.get_context("fork")
    answers = context.Queue()
    workers = [context.Process(target=_ask, args=(str(tmp_path / "cache"), str(tmp_path / "log"), answers))
               for _ in range(3)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
        assert worker.exitcode == 0
    folders = {answers.get(timeout=5) for _ in workers}
    assert len(folders) == 1 and len((tmp_path / "log").read_text().splitlines()) == 1
    assert (Path(folders.pop()) / "sub" / "weights.bin").read_bytes() == b"\x00" * 100


def test_other_inputs_sources_or_versions_build_another_folder(tmp_path, monkeypatch):
    log, cache = tmp_path / "log", tmp_path / "cache"
    first = shared_folder("run", {"steps": 4}, builder(log), cache)
    assert shared_folder("run", {"steps": 4}, builder(log), cache) == first
    assert shared_folder("run", {"steps": 5}, builder(log), cache) != first
    assert shared_folder("other", {"steps": 4}, builder(log), cache) != first
    monkeypatch.setattr(shared, "_sources", lambda: "lit-embed's source, edited")
    edited = shared_folder("run", {"steps": 4}, builder(log), cache)
    monkeypatch.setattr(shared, "_versions", lambda: {"torch": "another"})
    assert shared_folder("run", {"steps": 4}, builder(log), cache) not in (first, edited)
    assert len(log.read_text().splitlines()) == 5


@pytest.mark.parametrize("damage", ["no list (a build that crashed)", "a corrupt list", "a file rewritten",
                                    "a file removed", "a file added"])
def test_a_broken_entry_is_built_again(tmp_path, damage):
    log, cache = tmp_path / "log", tmp_path / "cache"
    folder = shared_folder("run", {"steps": 4}, builder(log), cache)
    listing = folder.with_name(folder.name + ".files.json")
    {"no list (a build that crashed)": listing.unlink,
     "a corrupt list": lambda: listing.write_text('{"results.json": '),
     "a file rewritten": lambda: (folder / "sub" / "weights.bin").write_bytes(b"\x01" * 100),
     "a file removed": (folder / "results.json").unlink,
     "a file added": lambda: (folder / "stray.tmp").write_text("half")}[damage]()
    assert shared_folder("run", {"steps": 4}, builder(log), cache) == folder
    assert len(log.read_text().splitlines()) == 2
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")) == ["results.json", "sub", "sub/weights.bin"]
    assert (folder / "sub" / "weights.bin").read_bytes() == b"\x00" * 100
    assert_untouched(folder)


def test_a_build_that_fails_leaves_no_entry_and_the_next_one_builds(tmp_path):
    log, cache = tmp_path / "log", tmp_path / "cache"

    def failing(folder: Path) -> None:
        (folder / "results.json").write_text("{")
        raise RuntimeError("the fit broke")

    with pytest.raises(RuntimeError, match="the fit broke"):
        shared_folder("run", {"steps": 4}, failing, cache)
    folder = shared_folder("run", {"steps": 4}, builder(log), cache)
    assert (folder / "results.json").read_text() == "{}" and len(log.read_text().splitlines()) == 1


def test_a_reader_that_wrote_into_a_shared_folder_is_named(tmp_path):
    folder = shared_folder("run", {"steps": 4}, builder(tmp_path / "log"), tmp_path / "cache")
    (folder / ".lock").write_text("")  # a run folder's lock: every reader may take it
    assert_untouched(folder)
    (folder / "sub" / "predictions.jsonl").write_text("{}\n")
    with pytest.raises(AssertionError, match=rf"tests wrote into the shared {folder}: copy it first"):
        assert_untouched(folder)

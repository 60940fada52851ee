"""``lit-embed data check --config FILE``: whether every hub name a config uses loads, before a long job."""

from __future__ import annotations

import time
from pathlib import Path

import yaml

from lit_embed.data import hub_names
from lit_embed.data.hub_names import USAGE, Name, TaskReads, check_all, names_in
from lit_embed.data.sources import how_to_fetch
from lit_embed.errors import ConfigError, HubError
from lit_embed.measures.tables import Table, render


def main(argv: list[str]) -> int:
    """data check --config FILE: whether every hub name a config uses loads, before a long job."""
    if argv[:1] in (["-h"], ["--help"]) or argv[1:2] in (["-h"], ["--help"]):
        print(f"usage: {USAGE}\n")
        print(hub_names.__doc__.split("\n\n")[1])  # what it checks (the rest of the docstring is for maintainers)
        return 0
    if argv[:1] != ["check"] or not any(arg.startswith("--config") for arg in argv[1:]):
        raise ConfigError(f"usage: {USAGE}")
    start = time.monotonic()
    names, trusted = names_in(*parse_config(argv[1:]))
    offline = check_all(names, trusted)
    problems = _problems(names)
    table = Table(
        f"Hub names of {' '.join(argv[1:])}",
        ["name", "used as", "reachable", "format", "remote code", "revision"],
        [[n.shown, ", ".join(n.uses), n.reachable, n.format, n.remote_code, n.resolved] for n in names],
        problems,
    )
    print(render([table]))
    print(f"{len(names)} name(s), {time.monotonic() - start:.1f} s")
    failures = []
    if problems:
        failures.append(f"{sum(bool(n.problem) for n in names)} name(s) cannot be used as configured: {'; '.join(problems)}")
    if offline is not None:
        unchecked = sum(n.reachable == f"no ({offline})" for n in names)
        unset = "HF_HUB_OFFLINE=0 " if offline.startswith("HF_HUB_OFFLINE") else ""  # what the user set, else nothing
        failures.append(
            f"the hub could not be reached ({offline}), so {unchecked} hub name(s) were not checked: run it where the "
            f"hub is reachable ({unset}lit-embed data {' '.join(argv)})"
        )
    if failures:
        raise HubError("data check: " + "; and ".join(failures))
    print("Every name loads without remote code (or with the remote code the config trusts).")
    return 0


def _problems(names: list[Name]) -> list[str]:
    """One line per problem, naming every name that has it (missing local files: with how to get them)."""
    missing = [n for n in names if n.kind == "file" and n.reachable == "no: missing"]
    for name in missing:
        name.problem = f"missing (relative paths are read from {Path.cwd()}): {how_to_fetch([n.shown for n in missing])}"
    grouped: dict[str, list[str]] = {}
    for name in names:
        if name.problem:
            grouped.setdefault(name.problem, []).append(name.shown)
    return [
        f"{', '.join(shown[:3])}{f' and {len(shown) - 3} more' if len(shown) > 3 else ''}: {problem}"
        for problem, shown in grouped.items()
    ]


def parse_config(argv: list[str]) -> tuple[dict, TaskReads | None]:
    """The composed config of ``--config`` files and overrides, as ``fit``'s own parser composes it (nothing is built:
    no model, no Trainer), and what its task's data module reads (``None`` for other data).

    A data piece (``configs/data/*.yaml``: a data module's ``class_path`` and ``init_args`` alone) is checked as
    the data of a config.
    """
    piece = _data_piece(argv)
    if piece is not None:
        return piece
    from lit_embed.commands.lightning import ModelOnlyCLI  # imports Lightning

    class ParseOnly(ModelOnlyCLI):
        def instantiate_classes(self) -> None:
            """Nothing: the check builds only what it asks for."""

    config = ParseOnly(args=argv, run=False, prog="lit-embed data check").config.as_dict()
    return config, _task_reads(config.get("data") or {})


def _data_piece(argv: list[str]) -> tuple[dict, TaskReads | None] | None:
    """The data module config of ``--config PIECE`` where that is all ``argv`` gives and PIECE is a data piece."""
    if len(argv) != 2 or argv[0] != "--config" or not Path(argv[1]).is_file():
        return None
    document = yaml.safe_load(Path(argv[1]).read_text())
    if not isinstance(document, dict) or "class_path" not in document or {"model", "data", "trainer"} & set(document):
        return None
    data = {"class_path": document["class_path"], "init_args": document.get("init_args") or {}}
    is_data, reads = _full_piece(data)
    if not is_data:
        raise ConfigError(f"{argv[1]} is a piece of a config ({document['class_path']}), not a config or its data: give an "
                          f"experiment config that uses it")
    return {"data": data}, reads


def _full_piece(data: dict) -> tuple[bool, TaskReads | None]:
    """Whether a data piece's class is a data module's, and what it reads where it is a task's (imports Lightning)."""
    import pytorch_lightning as pl

    from lit_embed.checkpoints.format import resolve_class

    cls = resolve_class(data["class_path"])
    if not (isinstance(cls, type) and issubclass(cls, pl.LightningDataModule)):
        return False, None
    return True, _task_reads(data)


def _task_reads(data: dict) -> TaskReads | None:
    """What the config's task data module reads (it is built: that downloads nothing), or ``None`` for other data."""
    import pytorch_lightning as pl

    from lit_embed.checkpoints.format import build_from_config, resolve_class
    from lit_embed.data.finetune import TaskDataModule
    from lit_embed.data.tasks import TaskSources

    cls = resolve_class(str(data.get("class_path") or ""))
    if not (isinstance(cls, type) and issubclass(cls, TaskDataModule)):
        return None  # not a task's data module (the config's own parse has resolved its class)
    module = build_from_config(pl.LightningDataModule, data, "data")
    return TaskReads(module.task, module.data_dir,
                     TaskSources(module.train_sources(), module.validation_sources(), module.test_sources()))

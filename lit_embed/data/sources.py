"""Reading text: HF hub datasets by name for users online, local files (txt, jsonl, csv, parquet) for everyone."""

from __future__ import annotations

import csv
import json
import lzma
import os
from collections.abc import Collection
from fnmatch import fnmatch
from pathlib import Path

from lit_embed.errors import ConfigError, HubError, MissingFileError, did_you_mean
from lit_embed.hub import require_hub
from lit_embed.progress import Stage

SAMPLE_DIR = Path(__file__).parent / "sample"
#: Data that ships with the package, usable anywhere by name.
SAMPLES = {"sample-corpus": SAMPLE_DIR / "corpus.txt", "sample-topics": SAMPLE_DIR / "topics" / "train.tsv"}
#: The ``datasets`` builder of each file type; ``.txt.xz`` (CC-100's downloads) is decompressed as it is read.
BUILDERS = {
    ".txt": "text", ".text": "text", ".txt.xz": "text", ".jsonl": "json", ".json": "json", ".csv": "csv",
    ".tsv": "csv", ".parquet": "parquet",
}
#: A compressed text file is checked for UTF-8 over its first bytes only (decompressing it all would take long).
COMPRESSED_CHECK_BYTES = 16 << 20
CC100_ROUTE = (
    "download its files (one per language: https://data.statmt.org/cc-100/LANG.txt.xz) and pass them with "
    "`files:` as they are (configs/data/cc100_xnli.yaml has the download loop)"
)
BOOKCORPUS_ROUTE = (
    "use rojagtap/bookcorpus (the same books_large_p1.txt and books_large_p2.txt its script reads, as text files), "
    "or pass those files with `files:`"
)
#: Hub datasets that are loading scripts only (docs/experiments.md, "Hub datasets and models"): ``datasets`` 4+ refuses them,
#: so a corpus naming one is refused when it is built, with the way to the same data.
SCRIPT_DATASETS = {
    "statmt/cc100": CC100_ROUTE,
    "cc100": CC100_ROUTE,
    "bookcorpus/bookcorpus": BOOKCORPUS_ROUTE,
    "bookcorpus": BOOKCORPUS_ROUTE,
    "shunk031/jglue": "fine-tune on the tasks jcola, jsts, jnli or marc_ja, which read its parquet conversion",
}
#: Where files that shipped configs name can be downloaded: ``folder/file`` pattern -> address (``{name}``: the file).
DOWNLOADS = {"cc100/*.txt.xz": "https://data.statmt.org/cc-100/{name}"}


def file_kind(path: Path) -> str | None:
    """The ``datasets`` builder that reads ``path``, by its suffix (``None``: a type lit-embed does not read)."""
    return BUILDERS.get("".join(path.suffixes[-2:])) or BUILDERS.get(path.suffix)


def check_files(names: list[str]) -> None:
    """Refuse local data files that do not exist (all of them named, with where to download them where that is
    known) or whose type lit-embed does not read. Samples shipped with lit-embed are always there."""
    paths = {name: Path(name).expanduser() for name in names if name not in SAMPLES}
    folders = [name for name, path in paths.items() if path.is_dir()]
    if folders:
        raise ConfigError(f"data file {folders[0]!r} is a folder: give the files in it (e.g. {folders[0]}/train.txt)")
    missing = [name for name, path in paths.items() if not path.is_file()]
    if missing:
        listed = ", ".join(repr(name) for name in missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        where = f" (relative paths are read from {os.getcwd()})" if any(not paths[n].is_absolute() for n in missing) else ""
        verb = "does" if len(missing) == 1 else "do"
        raise MissingFileError(f"data file{'s' * (len(missing) > 1)} {listed} {verb} not exist{where}"
                               f"{did_you_mean(missing[0])}: {how_to_fetch(missing)}")
    for name, path in paths.items():
        if file_kind(path) is None:
            raise ConfigError(f"data file {name!r}: unsupported type {path.suffix!r}; use one of {sorted(BUILDERS)}")


def header(name: str, wanted: Collection[str] = ()) -> list[str] | None:
    """The column names of a data file as ``load_files`` reads them, without reading its rows where it can: a csv or
    tsv file's first row (a byte-order mark dropped), a parquet file's schema, a jsonl file's keys (the union over its
    lines, read until every ``wanted`` column has been seen, so a file holding them all is read no further than the
    line that completes them); ``None`` for other types and for a file its loader will refuse with its own message."""
    path = resolve_file(name)
    try:
        if path.suffix in (".csv", ".tsv"):
            with path.open(newline="", encoding="utf-8", errors="replace") as handle:
                rows = csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE) if path.suffix == ".tsv" else csv.reader(handle)
                first = next(rows, [])
            return [column.lstrip("\ufeff") if i == 0 else column for i, column in enumerate(first)]
        if path.suffix == ".jsonl":
            return _jsonl_keys(path, set(wanted))
        if path.suffix == ".parquet":
            import pyarrow.parquet  # not torch: a fraction of a second, and only for a parquet file named

            try:
                return list(pyarrow.parquet.read_schema(path).names)
            except pyarrow.ArrowException:
                return None
    except PermissionError:
        raise ConfigError(f"data file {name!r} cannot be read (permission denied): make it readable (chmod u+r)") from None
    return None


def _jsonl_keys(path: Path, wanted: set[str]) -> list[str] | None:
    keys: dict[str, None] = {}
    with path.open(encoding="utf-8", errors="replace") as handle:
        for line in handle:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                return None
            if not isinstance(row, dict):
                return None
            keys.update(dict.fromkeys(row))
            if wanted and wanted <= keys.keys():
                break
    return list(keys)


def how_to_fetch(missing: list[str]) -> str:
    """How to get missing files: a download command where their folder is known, else what can be given."""
    folders: dict[tuple[Path, str], list[str]] = {}
    for name in missing:
        path = Path(name).expanduser()
        url = next((url for pattern, url in DOWNLOADS.items() if fnmatch(f"{path.parent.name}/{path.name}", pattern)), None)
        if url is None:
            return f"check the paths, or give samples shipped with lit-embed ({', '.join(sorted(SAMPLES))})"
        folders.setdefault((path.parent, url), []).append(path.name)
    commands = [
        f"mkdir -p {folder} && for f in {' '.join(files)}; do wget -c -P {folder} {url.format(name='$f')}; done"
        for (folder, url), files in folders.items()
    ]
    return "download them first: " + "; ".join(commands)


def resolve_file(name: str) -> Path:
    """A local data file, or a sample that ships with lit-embed (``sample-corpus``)."""
    if name in SAMPLES:
        return SAMPLES[name]
    check_files([name])
    return Path(name).expanduser()


def check_utf8(path: Path) -> None:
    """Refuse a text file that is not valid UTF-8, naming the line, before ``datasets`` fails obscurely
    (a compressed one: its first :data:`COMPRESSED_CHECK_BYTES`)."""
    compressed = path.suffix == ".xz"
    with lzma.open(path, "rb") if compressed else path.open("rb") as handle:
        read = 0
        for number, line in enumerate(handle, start=1):
            read += len(line)
            if compressed and read > COMPRESSED_CHECK_BYTES:
                break
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as error:
                raise ConfigError(
                    f"{path}:{number}: not valid UTF-8 ({error.reason} at byte {error.start}): "
                    f"re-encode the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8`)"
                ) from error


def text_lines(name: str, what: str = "predict_input") -> list[str]:
    """The lines of the text file ``name``, one row each, so that an output row stands for every line: refused, naming
    the line, where one is not UTF-8 or is blank between texts (it would have no row); blank lines at its end are
    none."""
    path = resolve_file(name)
    check_utf8(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    blank = next((number for number, line in enumerate(lines, 1) if not line.strip()), None)
    if blank is not None:
        raise ConfigError(f"{what} {str(path)}:{blank}: the line is blank, and each line is one text that gets its row "
                          f"of output: remove the line or give it a text")
    return lines


def load_files(files: list[str], split: str = "train", streaming: bool = False, column: str | None = None):
    """One dataset of all local ``files`` (all of one type).

    ``.tsv`` is read tab-separated without quoting (as GLUE's own TSV files are written): a field
    cannot hold a tab or a newline, and quotes are kept as text.
    """
    paths = [resolve_file(f) for f in files]
    kinds = {file_kind(p) for p in paths}
    if len(kinds) != 1:
        raise ConfigError(f"data files {files} mix types {sorted(kinds)}: give files of one type per source")
    kind = kinds.pop()
    for path in paths:
        if path.stat().st_size == 0:
            raise ConfigError(f"data file {str(path)!r} is empty (0 bytes): give it data")
        if kind == "text":
            check_utf8(path)
    kwargs = {"delimiter": "\t", "quoting": csv.QUOTE_NONE} if all(p.suffix == ".tsv" for p in paths) else {}
    import datasets  # here, not above: lit-embed data check reads this module's names without it (a second)
    import pyarrow
    from datasets.arrow_writer import SchemaInferenceError
    from datasets.exceptions import DatasetGenerationError

    try:
        with Stage(f"Loading {split} split ({', '.join(p.name for p in paths)})") as stage:
            rows = datasets.load_dataset(
                kind, data_files={split: [str(p) for p in paths]}, split=split, streaming=streaming, **kwargs
            )
            stage.count = len(rows) if isinstance(rows, datasets.Dataset) else None  # a stream: not known
        return rows
    except (DatasetGenerationError, SchemaInferenceError, UnicodeDecodeError, pyarrow.ArrowException) as error:
        cause = _innermost(error)
        raise ConfigError(
            f"data file(s) {', '.join(repr(str(p)) for p in paths)} could not be read as {kind} "
            f"({type(cause).__name__}: {str(cause).splitlines()[0][:200] if str(cause) else 'no rows'}): "
            f"give UTF-8 {kind} with {'a header row and ' if kind == 'csv' else ''}at least one row"
        ) from error


def _innermost(error: BaseException) -> BaseException:
    while error.__cause__ is not None or (error.__context__ is not None and not error.__suppress_context__):
        error = error.__cause__ or error.__context__
    return error


def parse_hub_name(name: str) -> tuple[str, str | None, str | None]:
    """``repository[@revision][:config]`` (``wikimedia/wikipedia@SHA:20231101.en``) -> its three parts."""
    path, _, config = name.partition(":")
    path, _, revision = path.partition("@")
    return path, revision or None, config or None


def refuse_script_datasets(names: list[str]) -> None:
    """Refuse hub datasets known to be loading scripts only, before anything is downloaded."""
    found = [name for name in names if parse_hub_name(name)[0].lower() in SCRIPT_DATASETS]
    if found:
        routes = dict.fromkeys(SCRIPT_DATASETS[parse_hub_name(name)[0].lower()] for name in found)
        raise ConfigError(
            f"hub dataset{'s' * (len(found) > 1)} {', '.join(repr(n) for n in found)}: a loading script on the hub, "
            f"which datasets 4+ refuses to run: {'; '.join(routes)}"
        )


def is_script_refusal(error: BaseException) -> bool:
    """Whether ``error`` is ``datasets`` refusing a hub dataset that is a loading script (datasets 4+)."""
    return isinstance(error, RuntimeError) and "Dataset scripts are no longer supported" in str(error)


def script_refusal(name: str, route: str, error: BaseException) -> HubError:
    """The error to raise when ``datasets`` refused the loading script of hub dataset ``name``."""
    import datasets

    return HubError(
        f"hub dataset {name!r} is a loading script, which datasets {datasets.__version__} refuses to run: {route}. "
        f"`lit-embed data check --config FILE` finds such names before a run. Cause: {error}"
    )


def load_hub(name: str, split: str = "train", streaming: bool = False):
    """A hub dataset given as ``name``, ``name:config`` (e.g. ``wikimedia/wikipedia:20231101.en``) or with the
    commit to read, ``name@revision[:config]``."""
    path, revision, config = parse_hub_name(name)
    require_hub()
    import datasets

    try:
        with Stage(f"Loading {split} split ({name})") as stage:
            rows = datasets.load_dataset(path, config, split=split, streaming=streaming, revision=revision)
            stage.count = len(rows) if isinstance(rows, datasets.Dataset) else None  # a stream: not known
        return rows
    except RuntimeError as error:
        if not is_script_refusal(error):
            raise
        route = SCRIPT_DATASETS.get(path.lower()) or (
            "download the files its script reads (their addresses are in the script on the hub) and pass them with "
            "`files:`, or find a parquet copy of the same data"
        )
        raise script_refusal(name, route, error) from error
    except (ConnectionError, FileNotFoundError, OSError) as error:
        raise HubError(
            f"could not load dataset {name!r} from the HuggingFace hub ({str(error).splitlines()[0][:300]}). Offline? "
            f"Save it once where the hub is reachable (dataset.to_parquet(...)) and pass the files with `files:` instead"
        ) from error

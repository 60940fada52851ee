"""Reading text: HF hub datasets by name for users online, local files (txt, jsonl, csv, parquet) for everyone."""

from __future__ import annotations

import csv
from pathlib import Path

import datasets
import pyarrow
from datasets.arrow_writer import SchemaInferenceError
from datasets.exceptions import DatasetGenerationError

from lit_embed.errors import ConfigError, HubError, MissingFileError

SAMPLE_DIR = Path(__file__).parent / "sample"
#: Data that ships with the package, usable anywhere by name.
SAMPLES = {"sample-corpus": SAMPLE_DIR / "corpus.txt"}
BUILDERS = {".txt": "text", ".text": "text", ".jsonl": "json", ".json": "json", ".csv": "csv", ".tsv": "csv", ".parquet": "parquet"}


def resolve_file(name: str) -> Path:
    """A local data file, or a sample that ships with lit-embed (``sample-corpus``)."""
    if name in SAMPLES:
        return SAMPLES[name]
    path = Path(name).expanduser()
    if not path.is_file():
        raise MissingFileError(f"data file {name!r} does not exist (samples shipped: {sorted(SAMPLES)})")
    if path.suffix not in BUILDERS:
        raise ConfigError(f"data file {name!r}: unsupported type {path.suffix!r}; use one of {sorted(BUILDERS)}")
    return path


def check_utf8(path: Path) -> None:
    """Refuse a text file that is not valid UTF-8, naming the line, before ``datasets`` fails obscurely."""
    with path.open("rb") as handle:
        for number, line in enumerate(handle, start=1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as error:
                raise ConfigError(
                    f"{path}:{number}: not valid UTF-8 ({error.reason} at byte {error.start}): "
                    f"re-encode the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8`)"
                ) from error


def load_files(files: list[str], split: str = "train", streaming: bool = False, column: str | None = None):
    """One dataset of all local ``files`` (all of one type).

    ``.tsv`` is read tab-separated without quoting (as GLUE's own TSV files are written): a field
    cannot hold a tab or a newline, and quotes are kept as text.
    """
    paths = [resolve_file(f) for f in files]
    kinds = {BUILDERS[p.suffix] for p in paths}
    if len(kinds) != 1:
        raise ConfigError(f"data files {files} mix types {sorted(kinds)}: give files of one type per source")
    kind = kinds.pop()
    for path in paths:
        if path.stat().st_size == 0:
            raise ConfigError(f"data file {str(path)!r} is empty (0 bytes): give it data")
        if kind == "text":
            check_utf8(path)
    kwargs = {"delimiter": "\t", "quoting": csv.QUOTE_NONE} if all(p.suffix == ".tsv" for p in paths) else {}
    try:
        return datasets.load_dataset(
            kind, data_files={split: [str(p) for p in paths]}, split=split, streaming=streaming, **kwargs
        )
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


def load_hub(name: str, split: str = "train", streaming: bool = False):
    """A hub dataset given as ``name`` or ``name:config`` (e.g. ``wikimedia/wikipedia:20231101.en``)."""
    path, _, config = name.partition(":")
    try:
        return datasets.load_dataset(path, config or None, split=split, streaming=streaming)
    except (ConnectionError, FileNotFoundError, OSError) as error:
        raise HubError(
            f"could not load dataset {name!r} from the HuggingFace hub ({error}). Offline? Save it once where "
            f"the hub is reachable (dataset.to_parquet(...)) and pass the files with `files:` instead"
        ) from error

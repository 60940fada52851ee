"""Reading text: HF hub datasets by name for users online, local files (txt, jsonl, csv, parquet) for everyone."""

from __future__ import annotations

import csv
from pathlib import Path

import datasets

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
        raise FileNotFoundError(f"data file {name!r} does not exist (samples shipped: {sorted(SAMPLES)})")
    if path.suffix not in BUILDERS:
        raise ValueError(f"data file {name!r}: unsupported type {path.suffix!r}; use one of {sorted(BUILDERS)}")
    return path


def check_utf8(path: Path) -> None:
    """Refuse a text file that is not valid UTF-8, naming the line, before ``datasets`` fails obscurely."""
    with path.open("rb") as handle:
        for number, line in enumerate(handle, start=1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as error:
                raise ValueError(
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
        raise ValueError(f"data files {files} mix types {sorted(kinds)}: give files of one type per source")
    kind = kinds.pop()
    if kind == "text":
        for path in paths:
            check_utf8(path)
    kwargs = {"delimiter": "\t", "quoting": csv.QUOTE_NONE} if all(p.suffix == ".tsv" for p in paths) else {}
    return datasets.load_dataset(
        kind, data_files={split: [str(p) for p in paths]}, split=split, streaming=streaming, **kwargs
    )


def load_hub(name: str, split: str = "train", streaming: bool = False):
    """A hub dataset given as ``name`` or ``name:config`` (e.g. ``wikimedia/wikipedia:20231101.en``)."""
    path, _, config = name.partition(":")
    try:
        return datasets.load_dataset(path, config or None, split=split, streaming=streaming)
    except (ConnectionError, FileNotFoundError, OSError) as error:
        raise OSError(
            f"could not load dataset {name!r} from the HuggingFace hub ({error}). Offline? Save it once where "
            f"the hub is reachable (dataset.to_parquet(...)) and pass the files with `files:` instead"
        ) from error

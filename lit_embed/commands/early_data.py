"""Before torch and Lightning load (seconds, a minute on a busy machine): the local data files a config's data module
names exist, can be read, and, for a task defined in the config, have the columns it reads (a csv or tsv header, a
parquet schema, the keys of a jsonl file).

The data section is read as the user gave it: the ``--config`` files in order, then the ``--data.*`` options (YAML
values, as the parser reads them). Where it is not plain data this can read for sure (a data section given as a
file name or a whole ``--data`` value), nothing is checked here, and the data module says it after the imports,
with the same messages.
"""

from __future__ import annotations

from pathlib import Path

from lit_embed.errors import ConfigError, MissingFileError, did_you_mean

#: The commands whose data module reads every file its config names.
COMMANDS = ("fit", "validate", "test")


def check_data_files(argv: list[str]) -> None:
    """Refuse ``lit-embed ARGV`` where its data names a local file that is missing, unreadable or lacks a column."""
    if not argv or argv[0] not in COMMANDS or {"-h", "--help"} & set(argv) or any(a.startswith("--print_config") for a in argv):
        return  # help, or a config printed as it stands (its data may come later)
    # imported here, not above: lit_embed.data.sources imports the hub's module, 50 ms for every command
    from lit_embed.data.sources import check_files

    data = given_data(argv[1:]) or {}
    init = data.get("init_args")
    if not isinstance(init, dict):
        return
    if isinstance(init.get("task"), dict):
        _check_task(init["task"])
    data_dir = init.get("data_dir")
    if isinstance(data_dir, str) and not Path(data_dir).expanduser().is_dir():
        raise MissingFileError(f"data_dir {data_dir!r} is not a folder{did_you_mean(data_dir)}: check the path")
    files = init.get("files")
    if str(data.get("class_path", "")).endswith("CorpusDataModule") and files:
        names = [files] if isinstance(files, str) else files
        if isinstance(names, list) and all(isinstance(name, str) for name in names):
            check_files(names)


def _check_task(task: dict) -> None:
    """A task defined in the config: its files exist and hold its text and label columns."""
    from lit_embed.data.sources import check_files, header

    files = task.get("files")
    if files is None or task.get("hub") is not None:
        return
    columns = task.get("text_columns")
    columns = [columns] if isinstance(columns, str) else list(columns or [])
    columns.append(task.get("label_column") or "label")
    for paths in (files.values() if isinstance(files, dict) else [files]):
        for path in [paths] if isinstance(paths, str) else paths or []:
            if not isinstance(path, str):
                return
            check_files([path])
            found = header(path, columns)
            missing = [column for column in columns if found is not None and column not in found]
            if missing:
                raise ConfigError(f"{path}: no column(s) {missing} (columns: {found}); task {task.get('name')!r} expects "
                                  f"{columns}: set text_columns and label_column to its columns")


def given_data(words: list[str]) -> dict | None:
    """The data section the ``--config`` files and ``--data.*`` options give, merged in order; ``None`` where one is
    not plain data (a file name, a whole ``--data``)."""
    import yaml

    data: dict = {}
    position = 0
    while position < len(words):
        key, equals, value = words[position].partition("=")
        takes_value = (key.startswith("--") or key == "-c") and not equals and position + 1 < len(words) \
            and not words[position + 1].startswith("--")
        if takes_value:
            position += 1
            value = words[position]
        if key in ("--config", "-c"):
            document = yaml.safe_load(Path(value).read_text()) if Path(value).is_file() else None
            section = document.get("data") if isinstance(document, dict) else None
            if section is not None and not isinstance(section, dict):
                return None
            if section:
                same = section.get("class_path") in (None, data.get("class_path"))
                data = _merged(data, section) if same else dict(section)
        elif key == "--data":
            return None
        elif key.startswith("--data."):
            *parents, last = key.removeprefix("--data.").split(".")
            if (parents or [last])[0] not in ("init_args", "class_path"):  # --data.batch_size: init_args left out
                parents.insert(0, "init_args")
            node = data
            for part in parents:
                node = node.setdefault(part, {})
                if not isinstance(node, dict):
                    return None
            try:
                node[last] = yaml.safe_load(value)
            except yaml.YAMLError:
                return None
        position += 1
    return data


def _merged(base: dict, update: dict) -> dict:
    """``base`` with ``update``'s keys, dictionaries merged key by key."""
    merged = dict(base)
    for key, value in update.items():
        merged[key] = _merged(merged[key], value) if isinstance(value, dict) and isinstance(merged.get(key), dict) else value
    return merged

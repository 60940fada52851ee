"""MLM pre-training step (forward, backward, AdamW step) of RoBERTa_S: subspace against dense.

The models are built from the shipped experiment configs (`configs/experiments/subspace/`), fed the
same batch of 32 x 128 tokens with RoBERTa masking (15% predicted), tied decoder. "gathered decoder"
is the subspace strategy scoring against the full N x d matrix rebuilt from its tables (the base
class's default), the obvious alternative to its factored decoder.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import torch

from harness import time_call

TITLE = "MLM training step: RoBERTa_S with subspace embeddings against dense"
CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def build(config: Path, smoke: bool):
    from lit_embed.cli import ModelOnlyCLI

    args = ["--config", str(config)]
    if smoke:  # the tiny backbone, same strategies
        args += ["--model.init_args.encoder", str(CONFIGS / "backbone" / "tiny.yaml")]
    return ModelOnlyCLI(args=args, run=False).model


def batch(model, size: tuple[int, int]) -> dict:
    from lit_embed.data.collate import MaskedLMCollator

    class Codes:  # vocabulary ids of RoBERTa's specials; no tokenizer download needed
        def special_code(self, name):
            return np.asarray({"cls": 0, "pad": 1, "sep": 2, "mask": 50264, "unk": 3}[name])

    rng = np.random.default_rng(0)
    items = [{"codes": np.r_[0, rng.integers(4, 50000, size[1] - 2), 2]} for _ in range(size[0])]
    torch.manual_seed(0)
    return MaskedLMCollator(Codes(), functools.partial(torch.randint, 50265))(items)


def step_timer(model, data: dict, ctx):
    from lit_embed.models.optim import configure_adamw

    model.to(ctx.device).train()
    data = {k: v.to(ctx.device) for k, v in data.items()}
    optimizer = configure_adamw(model, model.optim, 10_000)["optimizer"]

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss, _, _ = model(data)
        loss.backward()
        optimizer.step()

    return step


def run(ctx) -> list[dict]:
    size = (4, 32) if ctx.smoke else (32, 128)
    subspace = CONFIGS / "experiments" / "subspace"
    variants = {
        "dense (baseline)": (subspace / "roberta_s.yaml", False),
        "3-sub-embedding": (subspace / "roberta_s_3se.yaml", False),
        "3-sub-embedding, gathered decoder": (subspace / "roberta_s_3se.yaml", True),
        "8-sub-embedding": (subspace / "roberta_s_8se.yaml", False),
    }
    rows, baseline = [], None
    data = None
    for name, (config, gathered) in variants.items():
        model = build(config, ctx.smoke)
        if gathered:
            from lit_embed.embeddings import EmbeddingStrategy

            model.embedding.decoder_logits = EmbeddingStrategy.decoder_logits.__get__(model.embedding)
        data = data or batch(model, size)
        timing = time_call(step_timer(model, data, ctx), ctx, warmup=2, repeat=5)
        baseline = baseline or timing["seconds"]
        rows.append({
            "model": name, "batch": f"{size[0]}x{size[1]}", "embedding params": model.embedding.num_embedding_parameters(),
            "seconds per step": timing["seconds"], "speed-up vs dense": baseline / timing["seconds"],
        })
        del model
    return rows

"""MLM pre-training step (forward, backward, AdamW step) of RoBERTa_S and XLM-R_S: subspace f=3 against
the HuggingFace masked LM an expert would train, against HuggingFace's full-logit masked LM, and against
lit-embed's own dense table.

Models are composed from the shipped config pieces (`configs/backbone/{roberta_s,xlmr_s}.yaml`,
`configs/embedding/{dense,subspace_3}.yaml`): RoBERTa masking (15% predicted) and the tied decoder,
scored at the predicted positions only. The peers are HuggingFace's `RobertaForMaskedLM` /
`XLMRobertaForMaskedLM` built from a config of the backbone's shape (its tied word table, its MLM head,
no pooler), fed the same batch and trained with the same AdamW, dtype and threads:

- the expert peer ("LM head on masked positions"): HuggingFace's encoder, then its LM head on the
  masked positions only (fairseq's `masked_tokens`; a few lines over HuggingFace's model). The headline
  ratios are against it: what lit-embed saves over it is the embedding's own cost (the dense table's
  gradient and AdamW update, and the decoder's product with the full table), nothing else;
- HuggingFace's model as `*ForMaskedLM(..., labels=)` runs it, with logits over the vocabulary at every
  position (6 x d x V FLOP per token more, and the logits' memory: at 250002 words 1 GB of fp32 logits
  per 1024 tokens, several copies for the softmax and gradients, so XLM-R_S meets it at 8 x 128 only).
  It is HashFormers' Table 3 baseline (BERT-MLM), labelled, not a headline peer.

"gathered decoder" is subspace scoring against the N x d matrix rebuilt from its tables (the base class's
default), the obvious alternative to its factored decoder. Inputs: windows of real English text
(`real_text.py`), the headline, and uniformly random ids as labelled second rows. On the CPU fp32; on a
GPU (the kit, `--device cuda`) RoBERTa_S at 32 x 512 in bf16 and in fp16 autocast (fp16 with a gradient
scaler), as `configs/trainer/gpu.yaml`, and in bf16 both lit-embed's subspace model and the expert peer with
their encoder under `torch.compile` (lit-embed's `torch_compile: true`; compiled in the warm-up), each row with
its tokens/s and model FLOPs utilisation (PaLM's formula over the device's dense 16-bit peak). The models of one group take turns step by step (a warm-up, then
3 rounds on the CPU, 10 on a GPU): medians, spreads, and speed-ups as the median of per-round ratios
with their range; on the CPU a batch size's models are timed in groups of two or three, subspace in each
(so subspace has a row per group, each with the ratios of its group). "peak memory MB": on the CPU each row's model trains two steps in a process of its
own (after two steps of the same model on the tiny backbone, so that what loads on first use is not
counted), its peak resident set size (VmHWM) less the resident size before; on a GPU CUDA's peak
allocated bytes while the model is built and trains two steps, less those allocated before. Only the
real-text rows of the groups marked in `GROUPS` are measured (memory does not depend on the ids).
"""

from __future__ import annotations

import functools

import torch

from builders import IDS, HuggingFaceMLM, backbone_config, batch, compose, step_timer, time_group
from harness import child_main, in_children, memory_of

TITLE = "MLM pre-training step: RoBERTa_S and XLM-R_S subspace against HuggingFace's masked LM (expert and full-logit) and dense"
MODELS = {"RoBERTa_S": ("roberta_s", 50265), "XLM-R_S": ("xlmr_s", 250002)}
EXPERT = "HuggingFace *ForMaskedLM, LM head on masked positions (expert peer)"
FULL = "HuggingFace *ForMaskedLM(labels=), logits at every position"
DENSE, SUBSPACE, GATHERED = "dense (lit-embed)", "subspace f=3", "subspace f=3, gathered decoder"
#: Both sides with their encoder under torch.compile (lit-embed's ``torch_compile: true``): a GPU's own group.
SUBSPACE_COMPILED, EXPERT_COMPILED = f"{SUBSPACE}, torch.compile", f"{EXPERT}, torch.compile"
EMBEDDINGS = {DENSE: "dense", SUBSPACE: "subspace_3", GATHERED: "subspace_3", SUBSPACE_COMPILED: "subspace_3"}
GROUPS = [  # model, batch (sequences x tokens), dtype, rows, rows also timed on uniform ids, memory measured
    # On the CPU the models of a batch size take turns in groups of two or three, the subspace model in each,
    # so that a group holds a few GB (the machine's memory is shared).
    ("RoBERTa_S", (32, 128), torch.float32, (SUBSPACE, EXPERT, DENSE), (SUBSPACE, EXPERT), True),
    ("RoBERTa_S", (32, 128), torch.float32, (SUBSPACE, FULL), (), True),
    ("XLM-R_S", (8, 128), torch.float32, (SUBSPACE, EXPERT, DENSE), (SUBSPACE, EXPERT), True),
    ("XLM-R_S", (8, 128), torch.float32, (SUBSPACE, FULL, GATHERED), (), True),
    ("XLM-R_S", (32, 128), torch.float32, (SUBSPACE, EXPERT), (), False),  # full logits: ~15 GB
    ("XLM-R_S", (32, 128), torch.float32, (SUBSPACE, DENSE), (), False),
]
GPU_GROUPS = [  # the GPU kit's: RoBERTa_S 3-SE at 512 tokens in bf16 and fp16
    ("RoBERTa_S", (32, 512), dtype, (DENSE, SUBSPACE, EXPERT, FULL), (SUBSPACE, EXPERT), True)
    for dtype in (torch.bfloat16, torch.float16)
] + [("RoBERTa_S", (32, 512), torch.bfloat16, (SUBSPACE_COMPILED, EXPERT_COMPILED), (), True)]


def build(model_name: str, label: str, smoke: bool):
    backbone, vocab_size = MODELS[model_name]
    if label in (EXPERT, FULL, EXPERT_COMPILED):
        return HuggingFaceMLM(backbone_config(backbone, vocab_size, smoke), masked_only=label != FULL,
                              compiled=label == EXPERT_COMPILED)
    model = compose("MaskedLM", backbone, EMBEDDINGS[label], vocab_size, smoke, compiled=label == SUBSPACE_COMPILED)
    if label == GATHERED:
        from lit_embed.embeddings import EmbeddingStrategy

        model.embedding.decoder_logits = EmbeddingStrategy.decoder_logits.__get__(model.embedding)
    return model


def groups(ctx) -> list[tuple]:
    """At smoke size one group of every row at 4 x 32 on the tiny backbone (its dtype: fp32 on the CPU, bf16 on a GPU)."""
    chosen = GPU_GROUPS if ctx.device.startswith("cuda") else GROUPS
    if ctx.smoke:
        return [("RoBERTa_S", (4, 32), chosen[0][2], (DENSE, SUBSPACE, GATHERED, EXPERT, FULL), (SUBSPACE, EXPERT), True)]
    return chosen


def two_steps(model_name: str, label: str, size: tuple[int, int], dtype: torch.dtype, smoke: bool, ctx):
    """Build a row's model and train it two steps (what its peak memory is measured over); the model."""
    model = build(model_name, label, smoke)
    step = step_timer(model, batch(model, size), ctx, dtype)
    step()
    step()
    return model


def measure_memory(job: dict, ctx) -> dict:
    """Two training steps of one row's model in this process, after two of it on the tiny backbone."""
    dtype = getattr(torch, job["dtype"])
    return {"peak memory MB": memory_of(lambda: two_steps(job["model"], job["label"], tuple(job["batch"]), dtype, ctx.smoke, ctx),
                                        ctx.device,
                                        None if ctx.smoke else lambda: two_steps(job["model"], job["label"], (4, 32), dtype, True, ctx))}


def add_mfu(rows: list[dict], model_name: str, size: tuple[int, int], ctx) -> None:
    """Each row's model FLOPs utilisation: the backbone's training FLOPs per token by PaLM's formula (the same
    transformer in every row, lit-embed's or HuggingFace's) times its tokens/s, over the device's dense 16-bit
    peak (``lit_embed.callbacks.efficiency``); the basis named where the peak is unknown."""
    from lit_embed.callbacks.efficiency import peak_tflops

    name = torch.cuda.get_device_name(ctx.device)
    peak = peak_tflops(name)
    flops = compose("MaskedLM", MODELS[model_name][0], "dense", MODELS[model_name][1], ctx.smoke).encoder.training_flops_per_token(size[1])
    for row in rows:
        if peak is None:
            row["MFU"] = f"no peak known for {name}"
        else:
            row["MFU"] = flops * row["tokens/s"] / (peak * 1e12)


def run(ctx) -> list[dict]:
    rows, measured = [], []
    peers = {"vs expert peer": EXPERT, "vs HF full logits": FULL, "vs dense": DENSE, "vs compiled expert peer": EXPERT_COMPILED}
    for model_name, size, dtype, labels, uniform, with_memory in groups(ctx):
        models = {label: functools.partial(build, model_name, label, ctx.smoke) for label in labels}
        group = [{"model": model_name, **row} for row in time_group(ctx, models, size, dtype, uniform, peers)]
        if ctx.device.startswith("cuda"):
            add_mfu(group, model_name, size, ctx)
        if with_memory and not ctx.device.startswith("cuda"):  # on a GPU time_group measured it
            jobs = []
            for label, row in zip(labels, [row for row in group if row["ids"] == IDS["text"]]):
                job = {"model": model_name, "label": label, "batch": list(size), "dtype": row["dtype"]}
                if label != GATHERED and job not in measured:  # each model once
                    jobs.append((row, job))
                    measured.append(job)
            for (row, _), memory in zip(jobs, in_children(__file__, [job for _, job in jobs], ctx, measure_memory)):
                row.update(memory)
        rows += group
        for row in rows:
            peer = next((r for r in rows if r["model"] == row["model"] and r["batch"] == row["batch"]
                         and r["dtype"] == row["dtype"] and r["strategy"] == EXPERT and "peak memory MB" in r), None)
            if peer is not None and "peak memory MB" in row and peer["peak memory MB"] > 0:  # 0 possible in one process
                row["memory vs expert peer"] = row["peak memory MB"] / peer["peak memory MB"]
        ctx.report(rows)  # each group's times and memory as soon as they exist
    return rows


if __name__ == "__main__":
    child_main(measure_memory)

"""Pre-training step (forward, backward, AdamW step) of RoBERTa_S and XLM-R_S: subspace and
HashFormer-Proj against dense, with MLM and with Shuffle+Random (S+R), and against HuggingFace's own
masked LM.

Models are composed from the shipped config pieces (`configs/backbone/{roberta_s,xlmr_s}.yaml`,
`configs/embedding/{dense,subspace_3,md5_proj}.yaml`) and fed batches of 32 x 128 tokens: MLM with
RoBERTa masking (15% predicted) and the tied decoder, S+R with its 3-way token head (on a GPU in
fp16 mixed precision, as `configs/trainer/gpu.yaml`). HashFormer-Proj
has no vocabulary to predict, so it pre-trains with S+R only. "gathered decoder" is the subspace
strategy scoring against the N x d matrix rebuilt from its tables (the base class's default), the
obvious alternative to its factored decoder. The peer a user would otherwise train is HuggingFace's
`RobertaForMaskedLM` / `XLMRobertaForMaskedLM`, built from a config of the backbone's shape (its tied
word table, its MLM head, no pooler) and fed the same batch with the same AdamW: it computes logits
over the full vocabulary at every position, where lit-embed's MLM scores only the 15% predicted ones,
so what bounds its step is the decoder over the other 85%: 6 x 512 x V FLOP per token (forward and
backward) and the logits' memory. At XLM-R_S's 250002 words that is 1 GB of fp32 logits per 1024
tokens, with several copies for the softmax and gradients, so XLM-R_S meets it at 8 x 128 (a peak
of about 5 GB on the CPU, 3 GB of it growing with the tokens: over 14 GB at 32 x 128); RoBERTa_S at
32 x 128. The models of one row group take turns step by step
(a warm-up, then 3 rounds, medians), so a busy machine slows them alike. Target (issue 8): XLM-R_S
S+R with subspace at least 1.3x faster than with dense. "dense - this" is the time a step saves:
without a decoder, at most the dense table's own cost (its gradient and AdamW update, see the
embedding step), which is fixed per step while the encoder's grows with the batch; hence XLM-R_S
S+R again at 4 x 128. "tokens/s" counts every token of the batch. "peak memory MB": each row's
model trains two steps in a process of its own (the second holds weights, gradients, AdamW's state
and activations at once), after two steps of the same model on the tiny backbone (so that what
loads on first use is not counted); its peak resident set size (VmHWM, lowered to the resident size
through /proc/self/clear_refs before the model is built) less that resident size, CUDA's peak
allocated bytes less those allocated before on a GPU.

The 1.3x target is out of reach on two CPU cores at 32 x 128, and arithmetic bounds it: subspace
saves only the dense table's own cost (its 250002 x 512 gradient and fused AdamW update; embedding
step), a fixed 0.2-0.3 s a step on a quiet machine, while XLM-R_S's encoder needs about 630 GFLOP a
step at 32 x 128 (8 layers of 3.1M matmul weights, 4096 tokens, forward + backward), about 4.5 s on
two cores: 1.04x. At 4 x 128 the encoder's step is about 0.6 s and the same saving gives 1.4x.
`python tools/bench/profile_step.py` (XLM-R_S S+R, dense, 32 x 128, 2 threads, busy machine) shows
where a step goes: of 23.7 s, the encoder's matmuls (mm, addmm, bmm) take 13.0 s and dropout's masks
(bernoulli_) 1.6 s, while what the dense table adds is in fused AdamW (2.3 s against subspace's
1.05 s for the encoder alone) and zeroing its gradient (fill_, 0.55 s). The papers' speed-ups are on
GPUs, where the encoder's matmuls are cheap and the table's memory-bound update weighs more.
"""

from __future__ import annotations

from builders import HuggingFaceMLM, backbone_config, batch, compose, step_timer
from harness import child_main, in_children, memory_of, time_interleaved

TITLE = "Pre-training step: RoBERTa_S and XLM-R_S, subspace and HashFormer-Proj against dense and HuggingFace's MLM"
MODELS = {"RoBERTa_S": ("roberta_s", 50265), "XLM-R_S": ("xlmr_s", 250002)}
HF = "HuggingFace *ForMaskedLM"
STRATEGIES = {"dense (baseline)": "dense", "subspace f=3": "subspace_3", "subspace f=3, gathered decoder": "subspace_3",
              "HashFormer-Proj": "md5_proj", HF: None}
MLM = ("dense (baseline)", "subspace f=3", "subspace f=3, gathered decoder")
SR = ("dense (baseline)", "subspace f=3", "HashFormer-Proj")
GROUPS = [  # model, objective, batch (sequences x tokens), rows
    ("RoBERTa_S", "MLM", (32, 128), (*MLM, HF)),
    ("RoBERTa_S", "S+R", (32, 128), SR),
    ("XLM-R_S", "MLM", (32, 128), MLM),
    ("XLM-R_S", "MLM", (8, 128), ("dense (baseline)", "subspace f=3", HF)),  # HF's full logits at 32 x 128: ~15 GB
    ("XLM-R_S", "S+R", (32, 128), SR),
    ("XLM-R_S", "S+R", (4, 128), SR),  # the embedding's fixed cost per step weighs more in a small batch
]
OBJECTIVES = {"MLM": "MaskedLM", "S+R": "ShuffleRandom"}


def gather_decoder(model) -> None:
    """Score against the full matrix rebuilt from the tables: the base class's decoder."""
    from lit_embed.embeddings import EmbeddingStrategy

    model.embedding.decoder_logits = EmbeddingStrategy.decoder_logits.__get__(model.embedding)


def build(model_name: str, objective: str, label: str, smoke: bool, config=None):
    """The row's model; HuggingFace's from ``config`` (:func:`hf_config`), built beforehand."""
    backbone, vocab_size = MODELS[model_name]
    if label == HF:
        return HuggingFaceMLM(config)
    model = compose(OBJECTIVES[objective], backbone, STRATEGIES[label], vocab_size, smoke)
    if "gathered" in label:
        gather_decoder(model)
    return model


def hf_config(model_name: str, smoke: bool):
    return backbone_config(*MODELS[model_name], smoke)


def groups(ctx) -> list[tuple]:
    """At smoke size every batch is 4 x 32 on the tiny backbone, where the models differ only in their
    vocabulary: one group per objective, on RoBERTa_S, with every row of that objective."""
    if not ctx.smoke:
        return GROUPS
    rows = {}
    for _, objective, _, labels in GROUPS:
        rows.setdefault(objective, set()).update(labels)
    return [("RoBERTa_S", objective, (4, 32), tuple(label for label in STRATEGIES if label in labels)) for objective, labels in rows.items()]


def measure_memory(job: dict, ctx) -> dict:
    """Two training steps of one row's model in this process, after two of it on the tiny backbone:
    its peak memory above the start."""

    def two_steps(smoke: bool, size: tuple[int, int]) -> None:
        config = hf_config(job["model"], smoke) if job["label"] == HF else None
        model = build(job["model"], job["objective"], job["label"], smoke, config)
        step = step_timer(model, batch(model, size), ctx)
        step()
        step()

    return {"peak memory MB": memory_of(lambda: two_steps(ctx.smoke, tuple(job["batch"])), ctx.device,
                                        None if ctx.smoke else lambda: two_steps(True, (4, 32)))}


def run(ctx) -> list[dict]:
    rows = []
    for model_name, objective, size, labels in groups(ctx):
        steps, params, names = {}, {}, {}
        for label in labels:
            model = build(model_name, objective, label, ctx.smoke, hf_config(model_name, ctx.smoke) if label == HF else None)
            names[label] = f"HuggingFace {type(model.model).__name__}" if label == HF else label
            params[label] = model.parameter_counts()["total_params"]
            steps[label] = step_timer(model, batch(model, size), ctx)
        timing = time_interleaved(steps, ctx, warmup=1, repeat=3)
        dense = timing["dense (baseline)"]["seconds"]
        hf = timing[HF]["seconds"] if HF in timing else None
        for label in labels:
            seconds = timing[label]["seconds"]
            rows.append({
                "model": model_name, "objective": objective, "strategy": names[label], "batch": f"{size[0]}x{size[1]}",
                "params": params[label], "seconds per step": seconds, "tokens/s": size[0] * size[1] / seconds,
                "dense - this, s": dense - seconds, "speed-up vs dense": dense / seconds,
                "speed-up vs HuggingFace MLM": hf / seconds if hf else None,
                "job": {"model": model_name, "objective": objective, "label": label, "batch": list(size)},
            })
        del steps, model
    for row, memory in zip(rows, in_children(__file__, [row.pop("job") for row in rows], ctx, measure_memory)):
        row.update(memory)
    for row in rows:
        hf_row = next((r for r in rows if r["model"] == row["model"] and r["objective"] == row["objective"]
                       and r["batch"] == row["batch"] and r["strategy"].startswith("HuggingFace")), None)
        if hf_row is not None and hf_row["peak memory MB"] > 0:  # 0 possible in one process (smoke size)
            row["memory vs HuggingFace MLM"] = row["peak memory MB"] / hf_row["peak memory MB"]
    return rows


if __name__ == "__main__":
    child_main(measure_memory)

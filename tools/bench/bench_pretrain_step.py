"""Pre-training step (forward, backward, AdamW step) of RoBERTa_S and XLM-R_S: subspace and
HashFormer-Proj against dense, with MLM and with Shuffle+Random (S+R).

Models are composed from the shipped config pieces (`configs/backbone/{roberta_s,xlmr_s}.yaml`,
`configs/embedding/{dense,subspace_3,md5_proj}.yaml`) and fed batches of 32 x 128 tokens: MLM with
RoBERTa masking (15% predicted) and the tied decoder, S+R with its 3-way token head (on a GPU in
fp16 mixed precision, as `configs/trainer/gpu.yaml`). HashFormer-Proj
has no vocabulary to predict, so it pre-trains with S+R only. "gathered decoder" is the subspace
strategy scoring against the N x d matrix rebuilt from its tables (the base class's default), the
obvious alternative to its factored decoder. The models of one row group take turns step by step
(a warm-up, then 3 rounds, medians), so a busy machine slows them alike. Target (issue 8): XLM-R_S
S+R with subspace at least 1.3x faster than with dense. "dense - this" is the time a step saves:
without a decoder, at most the dense table's own cost (its gradient and AdamW update, see the
embedding step), which is fixed per step while the encoder's grows with the batch; hence XLM-R_S
S+R again at 4 x 128.

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

from builders import batch, compose, step_timer
from harness import time_interleaved

TITLE = "Pre-training step: RoBERTa_S and XLM-R_S, subspace and HashFormer-Proj against dense (MLM, S+R)"
MODELS = {"RoBERTa_S": ("roberta_s", 50265), "XLM-R_S": ("xlmr_s", 250002)}
VARIANTS = {
    "MLM": {"dense (baseline)": "dense", "subspace f=3": "subspace_3", "subspace f=3, gathered decoder": "subspace_3"},
    "S+R": {"dense (baseline)": "dense", "subspace f=3": "subspace_3", "HashFormer-Proj": "md5_proj"},
}
OBJECTIVES = {"MLM": "MaskedLM", "S+R": "ShuffleRandom"}


def gather_decoder(model) -> None:
    """Score against the full matrix rebuilt from the tables: the base class's decoder."""
    from lit_embed.embeddings import EmbeddingStrategy

    model.embedding.decoder_logits = EmbeddingStrategy.decoder_logits.__get__(model.embedding)


def run(ctx) -> list[dict]:
    groups = [(model, objective, (32, 128)) for model in MODELS for objective in VARIANTS]
    groups.append(("XLM-R_S", "S+R", (4, 128)))  # the embedding's fixed cost per step weighs more in a small batch
    rows = []
    for model_name, objective, size in groups:
        backbone, vocab_size = MODELS[model_name]
        size = (4, 32) if ctx.smoke else size
        steps, params = {}, {}
        for label, embedding in VARIANTS[objective].items():
            model = compose(OBJECTIVES[objective], backbone, embedding, vocab_size, ctx.smoke)
            if "gathered" in label:
                gather_decoder(model)
            params[label] = model.parameter_counts()["total_params"]
            steps[label] = step_timer(model, batch(model, size), ctx)
        timing = time_interleaved(steps, ctx, warmup=1, repeat=3)
        dense = timing["dense (baseline)"]["seconds"]
        for label, seconds in ((label, t["seconds"]) for label, t in timing.items()):
            rows.append({
                "model": model_name, "objective": objective, "strategy": label, "batch": f"{size[0]}x{size[1]}",
                "params": params[label], "seconds per step": seconds, "dense - this, s": dense - seconds,
                "speed-up vs dense": dense / seconds,
            })
        del steps
    return rows

"""HashFormers' Table 3 (pre-training speed): time per sample of a pre-training step of the BERT-base-size
HashFormers (Shuffle+Random) against BERT-MLM as HuggingFace computes it.

The paper's protocol (Section 4, Table 3 and Table 4): a pre-training step is a forward and a backward
pass; time per sample is its time over the sequences in it, in ms; sequences are 512 tokens; the speed-up
is BERT-MLM's time over the model's; BERT-MLM is a BERT-base encoder with a 50K BPE vocabulary trained
with HuggingFace's masked LM, which computes logits over the vocabulary at every position. The paper
measured on V100s with 16 sequences per GPU and reports S+R 2.1x and Proj 2.4x. Here: the baseline is
HuggingFace's `RobertaForMaskedLM(labels=)` of `configs/backbone/roberta_base.yaml`'s shape (12 layers,
hidden 768, vocabulary 50265); the other rows are built from the shipped experiment configs
(`configs/experiments/hashformers/`): lit-embed's own BERT-MLM (dense table, MLM scored at the 15% masked
positions only, a labelled extra row: the peer an expert would train), BERT-S+R (dense, Shuffle+Random),
and HashFormer-MD-Emb (50K), -Pool, -Add and -Proj (Shuffle+Random on MD5 codes of words). Batches: 512
tokens, 16 sequences on a GPU (fp16 autocast with a gradient scaler, as the kit runs it), 2 on the CPU
(fp32; the paper's size with a small batch, since a BERT-base step at 2 x 512 takes seconds on two
cores); the tokens are windows of real English text (`real_text.py`: WordPiece ids for the vocabulary
models, MD5 codes of its words for the HashFormers), and the baseline and HashFormer-MD-Proj are timed on
uniformly random ids too (labelled rows). The models take turns step by step (a warm-up, then 3 rounds on
the CPU, 10 on a GPU): medians, spreads, and speed-ups as the median of the per-round ratios with their
range; on the CPU in two groups, the baseline in each (so it has a row per group), to keep memory low.
"""

from __future__ import annotations

import functools

from builders import CONFIGS, HuggingFaceMLM, backbone_config, from_config, time_group

TITLE = "HashFormers' Table 3: pre-training time per sample, BERT-base size, 512 tokens, against BERT-MLM as HuggingFace computes it"
BASELINE = "BERT-MLM, HuggingFace RobertaForMaskedLM(labels=), logits at every position (baseline)"
PROJ = "HashFormer-MD-Proj, S+R"
EXPERIMENTS = {
    "BERT-MLM, lit-embed (masked positions only)": "bert_mlm",
    "BERT-S+R, dense": "bert_sr",
    "HashFormer-MD-Emb (50K), S+R": "md5_emb50k",
    "HashFormer-MD-Pool, S+R": "md5_pool",
    "HashFormer-MD-Add, S+R": "md5_add",
    PROJ: "md5_proj",
}
#: The paper's Table 3 (V100, ms per sample, speed-up against BERT-MLM), beside each row.
PAPER = {BASELINE: (24.9, 1.0), "BERT-S+R, dense": (11.6, 2.1), "HashFormer-MD-Emb (50K), S+R": (11.6, 2.1),
         "HashFormer-MD-Pool, S+R": (12.0, 2.1), "HashFormer-MD-Add, S+R": (11.7, 2.1), PROJ: (10.6, 2.4)}


def run(ctx) -> list[dict]:
    """On a GPU one group of every model; on the CPU two, the baseline in each, so that a group holds a few GB."""
    cuda = ctx.device.startswith("cuda")
    size = (2, 32) if ctx.smoke else (16, 512) if cuda else (2, 512)
    labels = list(EXPERIMENTS)
    rows = []
    for group in [labels] if cuda or ctx.smoke else [labels[:3], labels[3:]]:
        models = {BASELINE: lambda: HuggingFaceMLM(backbone_config("roberta_base", 50265, ctx.smoke), masked_only=False)}
        for label in group:
            models[label] = functools.partial(from_config, CONFIGS / "experiments" / "hashformers" / f"{EXPERIMENTS[label]}.yaml", ctx.smoke)
        uniform = (BASELINE, PROJ) if PROJ in group else ()
        rows += time_group(ctx, models, size, uniform=uniform, peers={"vs BERT-MLM (HF)": BASELINE}, optimizer_step=False)
        for row in rows:
            paper = PAPER.get(row["strategy"], (None, None))
            row.update({"ms per sample": 1000 * row["seconds per step"] / size[0], "paper ms per sample (V100)": paper[0],
                        "paper speed-up": paper[1]})
        ctx.report(rows)
    return rows

"""Frequency-aware partial sparse coding: the time to compress, and what rebuilding rare rows adds to a forward pass.

Compressing: DistilBERT's shape, a 30522 x 768 table (synthetic Gaussian rows; the real matrix needs the
hub), with the paper's largest common set (QNLI: 26180 tokens seen) at retention 0.5, k=5; and the
packaged all-MiniLM-L6-v2's real 30522 x 384 table split by the token counts of real English prose read on
this machine (`real_text.py`; its first 80% of paragraphs, the "training data"). lit-embed batches
the cosine top-k (matrix products over blocks of rare rows) and the k x k solves; the obvious alternative
loops over rare tokens in numpy (one similarity row, argpartition, one solve each), timed on 500 tokens
and scaled to all of them.

Inference: a DistilBERT-size encoder (6 layers, hidden 768, built from a config), batch 32 x 128, the
same weights with the dense table and with its sparse-coded form (retention 0.5 of the prose's tokens,
k=5), in eval mode without gradients. Batches: real text, the prose's last 20% of paragraphs, which the
split did not count (mostly common tokens), and uniformly random ids (almost every token rare: the worst
case for rebuilding). The two models are
timed in turns; "rebuild / dense forward" is the extra lookup time of the sparse-coded table over the
dense one, as a share of the dense forward pass (the encoder's part is the same computation), which a
busy machine disturbs less than the difference of two whole passes.
"""

from __future__ import annotations

import os
import time

import numpy as np
import torch

from harness import time_call

TITLE = "Sparse coding: compressing a 30522 x 768 table, and rebuilding rare rows in a forward pass"
LOOPED_TOKENS = 500


def looped_sparse_code(weight: np.ndarray, common: np.ndarray, rare: np.ndarray, k: int) -> None:
    """The per-token loop sparse coding replaces: for each rare row, cosine to every common row,
    the k largest, one k x k solve."""
    basis = weight[common] / np.linalg.norm(weight[common], axis=1, keepdims=True)
    for row in weight[rare]:
        target = row / np.linalg.norm(row)
        nearest = np.argpartition(-(basis @ target), k)[:k]
        offsets = basis[nearest] - target
        gram = offsets @ offsets.T
        gram += np.eye(k) * 1e-6 * np.trace(gram) / k
        w = np.linalg.solve(gram, np.ones(k))
        w /= w.sum()


def corpus_split(vocab: int, retention: float):
    """The common ids of real prose's first 80% of paragraphs at ``retention``, the tokenizer, and the last 20%."""
    import real_text

    from lit_embed.compress.vocabulary import split_vocabulary
    from lit_embed.data.frequencies import count_tokens

    paragraphs, _ = real_text.prose()
    seen, unseen = paragraphs[: len(paragraphs) * 4 // 5], paragraphs[len(paragraphs) * 4 // 5 :]
    encoder = real_text.tokenizer()
    split = split_vocabulary(count_tokens(list(seen), encoder, vocab).counts, retention, encoder.tokenizer.all_special_ids)
    return split.common_ids, encoder, list(unseen)


def compress_rows(ctx) -> list[dict]:
    from lit_embed.compress.partial import sparse_code
    from lit_embed.embeddings.sparse_coded import rare_ids_of

    generator = torch.Generator().manual_seed(0)
    if ctx.smoke:
        tables = {"synthetic 2000x64": (torch.randn(2000, 64, generator=generator), torch.randperm(2000, generator=generator)[:600])}
    else:
        from lit_embed.embeddings.pretrained import load_embedding_matrix

        seen = torch.randperm(30522, generator=generator)[:26180]  # QNLI's tokens seen (Table 1)
        synthetic = torch.randn(30522, 768, generator=generator), seen[: 26180 // 2].sort().values
        tables = {"synthetic 30522x768": synthetic,
                  "MiniLM 30522x384": (load_embedding_matrix("all-MiniLM-L6-v2"), corpus_split(30522, 0.5)[0])}
    rows = []
    for name, (weight, common) in tables.items():
        rare = rare_ids_of(len(weight), common)
        timing = time_call(lambda w=weight, c=common: sparse_code(w, c, [5]), ctx, warmup=1, repeat=3)
        sample = rare[torch.randperm(len(rare), generator=generator)[:LOOPED_TOKENS]]
        start = time.perf_counter()
        looped_sparse_code(weight.numpy(), common.numpy(), sample.numpy(), 5)
        looped = (time.perf_counter() - start) * len(rare) / len(sample)
        rows.append({"what": "compress (retention 0.5, k=5)", "table": name, "common": len(common), "rare": len(rare),
                     "seconds": timing["seconds"], "baseline": f"per-token numpy loop ({LOOPED_TOKENS} tokens, scaled)",
                     "baseline seconds": looped, "speed-up": looped / timing["seconds"]})
    return rows


def forward_rows(ctx) -> list[dict]:
    from lit_embed.compress.partial import sparse_code
    from lit_embed.embeddings import DenseEmbedding
    from lit_embed.models import Encoder

    if ctx.smoke:
        shape, size = dict(hidden_size=64, num_layers=1, num_heads=2, intermediate_size=128), (4, 32)
    else:
        shape, size = dict(hidden_size=768, num_layers=6, num_heads=12, intermediate_size=3072), (32, 128)
    torch.manual_seed(0)
    encoder = Encoder(arch="bert", max_position_embeddings=512, type_vocab_size=2, **shape).eval().to(ctx.device)
    dense = DenseEmbedding(30522, shape["hidden_size"])
    common, text, lines = corpus_split(30522, 0.5)
    coded = sparse_code(dense.weight.detach(), common, [5])[5]
    codes = [np.r_[101, ids[: size[1] - 2], 102] for ids in text.encode([" ".join(lines[i : i + 8]) for i in range(0, 8 * size[0], 8)])]
    longest = max(len(c) for c in codes)
    batches = {
        "real text": torch.as_tensor(np.stack([np.pad(c, (0, longest - len(c))) for c in codes])),
        "uniform random ids": torch.randint(0, 30522, size, generator=torch.Generator().manual_seed(0)),
    }
    rows = []
    for name, ids in batches.items():
        ids = ids.to(ctx.device)
        mask = (ids != 0).long()
        rare_share = float((coded.row_of.to(ids.device)[ids] < 0).float().mean())
        forward, lookup = alternating_medians(encoder, {"dense": dense, "sparse-coded": coded}, ids, mask, ctx)
        rebuild = (lookup["sparse-coded"] - lookup["dense"]) / forward["dense"]
        rows.append({"what": "forward pass", "table": f"batch {tuple(ids.shape)}, {name}", "rare tokens": f"{100 * rare_share:.1f}%",
                     "dense seconds": forward["dense"], "sparse-coded seconds": forward["sparse-coded"],
                     "forward overhead": f"{100 * (forward['sparse-coded'] / forward['dense'] - 1):+.1f}%",
                     "lookup seconds (dense, sparse-coded)": f"{lookup['dense']:.4f}, {lookup['sparse-coded']:.4f}",
                     "rebuild / dense forward": f"{100 * rebuild:.2f}%"})
    return rows


def alternating_medians(encoder, strategies: dict, ids, mask, ctx) -> tuple[dict, dict]:
    """Median seconds of each strategy's forward pass (strategy then encoder) and of its lookup alone,
    timed in turns so that a busy machine slows both alike."""
    forward, lookup = {name: [] for name in strategies}, {name: [] for name in strategies}
    repeats = 1 if ctx.smoke else 7
    for turn in range(repeats + 1):  # the first turn warms up
        for name, strategy in strategies.items():
            strategy.to(ctx.device)
            with torch.no_grad():
                one = time_call(lambda s=strategy: encoder(s(ids), attention_mask=mask), ctx, warmup=0, repeat=1)
                alone = time_call(lambda s=strategy: s(ids), ctx, warmup=0, repeat=1)
            if turn:
                forward[name].append(one["seconds"])
                lookup[name].append(alone["seconds"])
    return ({name: float(np.median(v)) for name, v in forward.items()},
            {name: float(np.median(v)) for name, v in lookup.items()})


def run(ctx) -> list[dict]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return compress_rows(ctx) + forward_rows(ctx)

"""The embedding-compression zoo (issue 28): each well-known method as a strategy, counted by its paper's formula,
sized to a budget of a 30522 x 384 table (or refusing, naming what it can meet), trained by every objective, and
exported to transformers computing what lit-embed computes."""

from __future__ import annotations

import functools
import json
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

from lit_embed.checkpoints.format import FACTS, build_from_config, describe, load_model
from lit_embed.embeddings import (
    DeepHashEmbedding,
    DPQEmbedding,
    EmbeddingStrategy,
    FactorizedEmbedding,
    HashingTrickEmbedding,
    MixedDimensionEmbedding,
    QREmbedding,
    ROBEEmbedding,
    SubspaceEmbedding,
    TTEmbedding,
    WeightedHashEmbedding,
)
from lit_embed.embeddings.hashed_ids import PRIME, hash_ids
from lit_embed.embeddings.sizing import TOLERANCE, fit_budget
from lit_embed.errors import ConfigError
from lit_embed.export.folder import export
from lit_embed.models import MaskedLM, SequenceClassifier, ShuffleRandom
from tests.helpers import CONFIGS, REPO, tiny_encoder
from tests.helpers.cli import page

V, D = 30522, 384


def papers_count(cls, vocab: int, d: int, **a) -> int:
    """Each paper's parameter count, written from the paper (not from the strategy's code)."""
    if cls is HashingTrickEmbedding:  # Weinberger et al.: a table of m buckets
        return a["num_buckets"] * d
    if cls is WeightedHashEmbedding:  # Svenstrup et al. §3: B d shared vectors + K k importance parameters (K = V: one
        k = a.get("num_hashes", 2)   # row per word, their dictionary case); appending the weights narrows the pool
        return a["num_buckets"] * (d - k if a.get("append_weights") else d) + a.get("importance_rows", vocab) * k
    if cls is ROBEEmbedding:  # Desai et al.: the array's size is the memory
        return a["memory"]
    if cls is DeepHashEmbedding:  # Kang et al.: only the decoder network's weights and biases
        widths = [a.get("num_hashes", 1024)] + [a["width"]] * a.get("num_layers", 2) + [d]
        normalised = 2 * a["width"] * a.get("num_layers", 2) if a.get("batch_norm") else 0  # a scale and shift a unit
        return sum(i * o + o for i, o in zip(widths, widths[1:])) + normalised
    if cls is FactorizedEmbedding:  # ALBERT §3.1: O(V x E + E x H)
        return vocab * a["rank"] + a["rank"] * d + (d if a.get("bias") else 0)
    if cls is QREmbedding:  # Shi et al. §3: (ceil(|S| / m) + m) x D; concatenation halves D per table
        m, halves = a["remainder_rows"], a.get("operation") == "concat"
        return math.ceil(vocab / m) * (d // 2 if halves else d) + m * (d - d // 2 if halves else d)
    if cls is TTEmbedding:  # Khrulkov et al. eq. (3) / TT-Rec: sum_k R_{k-1} I_k J_k R_k
        ranks = [1] + [a["rank"]] * (len(a["vocab_factors"]) - 1) + [1]
        return sum(ranks[k] * i * j * ranks[k + 1] for k, (i, j) in enumerate(zip(a["vocab_factors"], a["dim_factors"])))
    if cls is MixedDimensionEmbedding:  # Ginart et al. §3: sum_i n_i d_i + d_i d (block tables and projections)
        return sum(n * di + di * d for n, di in zip(a["block_sizes"], a["block_dims"]))
    if cls is DPQEmbedding:  # Chen et al. §4: what inference keeps, K x d values and V x D codes (one parameter each)
        return a["codewords"] * d + vocab * a.get("groups", 8)
    raise AssertionError(cls)


def papers_bytes(cls, vocab: int, d: int, **a) -> int:
    """The bytes inference keeps: the paper's float32 values at 4 bytes each, and the integer state stored beside them
    (each hash function's two int64 coefficients; mixed dimension's int64 block and row of each id; DPQ's V x D codes,
    which its paper counts one parameter each, at a byte each for K <= 256)."""
    values = papers_count(cls, vocab, d, **a)
    if cls is DPQEmbedding:
        codes = vocab * a.get("groups", 8)
        return 4 * (values - codes) + codes * (1 if a["codewords"] <= 256 else 2)
    stored = {HashingTrickEmbedding: 2 * 2 * 8, WeightedHashEmbedding: (2 + ("importance_rows" in a)) * 2 * 8, ROBEEmbedding: 2 * 2 * 8,
              DeepHashEmbedding: a.get("num_hashes", 1024) * 2 * 8, MixedDimensionEmbedding: 2 * vocab * 8}
    return 4 * values + stored.get(cls, 0)


def zipf_widths(vocab: int, base_dim: int, blocks: int = 4, alpha: float = 0.3, d: int = 384) -> tuple[list, list]:
    """Mixed dimensions by the id-order proxy, worked from the paper's rule: blocks of 1, 2, 4, 8 fifteenths of the
    vocabulary, popularity the mean of 1/rank over a block, d_i = round(base_dim (p_i / p_0)^alpha)."""
    sizes = [vocab * 2**i // (2**blocks - 1) for i in range(blocks - 1)]
    sizes.append(vocab - sum(sizes))
    popularity, start = [], 0
    for n in sizes:
        popularity.append(sum(1 / r for r in range(start + 1, start + n + 1)) / n)
        start += n
    return sizes, [min(d, max(1, round(base_dim * (p / popularity[0]) ** alpha))) for p in popularity]


#: method -> argument sets its count is checked with (built small: 3000 ids, width 24)
FORMULAS = {
    HashingTrickEmbedding: [{"num_buckets": 7}, {"num_buckets": 500, "signed": False}],
    WeightedHashEmbedding: [{"num_buckets": 50}, {"num_buckets": 9, "num_hashes": 3},
                            {"num_buckets": 40, "importance_rows": 100}, {"num_buckets": 40, "importance_rows": 7, "append_weights": True}],
    ROBEEmbedding: [{"memory": 100, "block_size": 8}, {"memory": 7777, "block_size": 5}],
    DeepHashEmbedding: [{"width": 16, "num_hashes": 32}, {"width": 5, "num_layers": 3, "num_hashes": 64},
                        {"width": 6, "num_layers": 2, "num_hashes": 16, "batch_norm": True}],
    FactorizedEmbedding: [{"rank": 4}, {"rank": 24, "bias": True}],
    QREmbedding: [{"remainder_rows": 55}, {"remainder_rows": 7, "operation": "add"}, {"remainder_rows": 100, "operation": "concat"}],
    DPQEmbedding: [{"codewords": 16}, {"codewords": 5, "groups": 3}],
    TTEmbedding: [{"rank": 3, "vocab_factors": [15, 15, 15], "dim_factors": [2, 3, 4]},
                  {"rank": 5, "num_cores": 2, "vocab_factors": [60, 50], "dim_factors": [4, 6]}],
}


def test_mixed_dimension_counts_what_its_paper_counts():
    """The widths the power law gives by the id-order proxy, and widths given, both counted as the paper counts."""
    for base_dim, alpha in ((24, 0.3), (10, 0.0), (17, 1.0)):
        sizes, dims = zipf_widths(3000, base_dim, alpha=alpha, d=24)
        strategy = MixedDimensionEmbedding(3000, 24, base_dim=base_dim, alpha=alpha, frequencies="id_order")
        assert strategy.block_dims == dims and [t.shape[0] for t in strategy.tables] == sizes
        count = papers_count(MixedDimensionEmbedding, 3000, 24, block_sizes=sizes, block_dims=dims)
        assert strategy.num_embedding_parameters() == count == MixedDimensionEmbedding.count_parameters(
            3000, 24, base_dim=base_dim, alpha=alpha)
    given = MixedDimensionEmbedding(3000, 24, num_blocks=2, block_dims=[5, 3], frequencies="id_order")
    assert given.num_embedding_parameters() == papers_count(MixedDimensionEmbedding, 3000, 24, block_sizes=[1000, 2000],
                                                            block_dims=[5, 3])


def test_mixed_dimension_ranks_by_a_count_file_and_its_checkpoint_needs_no_file(tmp_path):
    counts = np.zeros(300, dtype=int)
    counts[[299, 7, 150]] = [50, 40, 30]  # the three most frequent, in that order
    path = tmp_path / "counts.txt"
    path.write_text("\n".join(map(str, counts)) + "\n")
    strategy = MixedDimensionEmbedding(300, 12, num_blocks=3, frequencies=str(path), alpha=0.5)
    assert strategy.block_of[[299, 7, 150]].tolist() == [0, 0, 0] and strategy.row_of[[299, 7, 150]].tolist() == [0, 1, 2]
    assert strategy.block_dims == [12, 1, 1]  # the rare blocks count nothing: the narrowest width
    config = strategy.config(with_sizes=True)
    assert config["init_args"]["frequencies"] is None and config["init_args"]["block_dims"] == [12, 1, 1]
    budgeted = MixedDimensionEmbedding(300, 12, num_blocks=3, frequencies=str(path), alpha=0.5, budget=876 * 4 + 4800)
    assert budgeted.block_dims == [11, 1, 1] and budgeted.num_embedding_parameters() == 876  # (42 + 12) 11 + 85 + 173 + 24
    assert budgeted.inference_bytes() == 876 * 4 + 2 * 300 * 8  # and each id's int64 block and row
    path.unlink()
    rebuilt = build_from_config(EmbeddingStrategy, config, "embedding")
    rebuilt.load_state_dict(strategy.state_dict())
    ids = torch.arange(300)
    assert torch.equal(rebuilt(ids), strategy(ids))


@pytest.mark.parametrize("content, message", [
    (None, "is not a file of one integer count per line"),
    ("1\n2\nthree\n", "is not a file of one integer count per line"),
    ("1\n2\n", "holds 2 counts: it needs one non-negative count per vocabulary id, 300 lines"),
    ("\n".join(["1"] * 299 + ["-4"]), "holds 300 counts (some negative)"),
])
def test_a_count_file_that_is_not_one_count_per_id_is_refused_naming_it(tmp_path, content, message):
    path = tmp_path / "counts.txt"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=re.escape(f"frequencies={str(path)!r}") + ".*" + re.escape(message)):
        MixedDimensionEmbedding(300, 12, frequencies=str(path))


@pytest.mark.parametrize("cls", list(FORMULAS), ids=lambda cls: cls.__name__)
def test_each_method_counts_what_its_paper_counts(cls):
    for arguments in FORMULAS[cls]:
        expected = papers_count(cls, 3000, 24, **arguments)
        assert cls.count_parameters(3000, 24, **arguments) == expected, arguments
        assert cls(3000, 24, **arguments).num_embedding_parameters() == expected, arguments


#: method -> what a budget of 10%, 1% and 0.1% of a 30522 x 384 float32 table's bytes gives: the value chosen, or the
#: values either side that the refusal names (one where the budget lies beyond the method's smallest size)
BUDGETS = {
    HashingTrickEmbedding: {0.1: 3052, 0.01: 305, 0.001: (30, 31)},  # rows of 1,536 bytes: 0.1% lies between two
    WeightedHashEmbedding: {0.1: 2893, 0.01: 146, 0.001: (1,)},  # the V x 2 float32 importance weights are 0.52% alone
    ROBEEmbedding: {0.1: 1_172_037, 0.01: 117_196, 0.001: 11_712},  # any number of values (and 32 bytes of hashing)
    DeepHashEmbedding: {0.1: 585, 0.01: 76, 0.001: (5, 6)},  # 1024 hashes' int64 coefficients are 16,384 bytes
    FactorizedEmbedding: {0.1: 38, 0.01: (3, 4), 0.001: (1,)},  # each unit of E costs (V + H) x 4 = 123,624 bytes
    QREmbedding: {0.1: 3041, 0.01: (175,), 0.001: (175,)},  # (ceil(V/m) + m) d is smallest at m = sqrt(V): 1.15%
    TTEmbedding: {0.1: 77, 0.01: (23, 24), 0.001: (6, 7)},  # the middle core grows as r^2
    MixedDimensionEmbedding: {0.1: 90, 0.01: (1,), 0.001: (1,)},  # each id's int64 block and row: 6.25% of the bytes
    DPQEmbedding: {0.1: 2734, 0.01: 146, 0.001: (2,)},  # 8 one-byte codes per token are 0.52% already
}


@pytest.mark.parametrize("share", [0.1, 0.01, 0.001])
@pytest.mark.parametrize("cls", list(BUDGETS), ids=lambda cls: cls.__name__)
def test_each_method_meets_a_budget_within_one_percent_or_names_the_nearest_it_can(cls, share):
    expected, target = BUDGETS[cls][share], round(share * V * D * 4)
    if isinstance(expected, int):
        sizing = fit_budget(cls, V, D, share, {})
        assert sizing.value == expected and abs(sizing.count - target) <= TOLERANCE * target
        assert sizing.count == papers_bytes(cls, V, D, **_full_arguments(cls, sizing.value))
        return
    with pytest.raises(ConfigError) as refused:
        fit_budget(cls, V, D, share, {})
    message = str(refused.value)
    for value in expected:
        count = papers_bytes(cls, V, D, **_full_arguments(cls, value))
        assert abs(count - target) > TOLERANCE * target and f"{count:,}" in message and f"{cls.size_parameter}={value})" in message
    assert len(expected) == 2 or "its smallest size" in message


def _full_arguments(cls, value: int) -> dict:
    arguments = {cls.size_parameter: value}
    if cls is TTEmbedding:  # 32^3 >= 30522, 384 = 8 x 6 x 8
        arguments |= {"vocab_factors": [32, 32, 32], "dim_factors": [8, 6, 8]}
    if cls is MixedDimensionEmbedding:
        arguments["block_sizes"], arguments["block_dims"] = zipf_widths(V, value)
    if cls is DPQEmbedding:
        arguments["codewords"] = value
    return arguments


@pytest.mark.parametrize("append", [False, True])
def test_hash_embeddings_hash_each_id_to_an_importance_row_and_may_append_its_weights(append):
    """Svenstrup et al. eq. (1)-(2), written out: e(x) = sum_i P[h_0(x), i] E[h_i(x)], h_0 into the K importance rows;
    with the weights appended, [e(x), P[h_0(x)]]. K far below V is what lets hash embeddings meet 1% and 0.1%."""
    torch.manual_seed(0)
    hashed = WeightedHashEmbedding(3000, 24, num_buckets=40, num_hashes=3, importance_rows=7, append_weights=append)
    ids = torch.tensor([0, 5, 2999, 1234])
    slots = hash_ids(ids, hashed.importance_hash, 7)[:, 0]
    rows = hash_ids(ids, hashed.hash_coefficients, 40)
    weights = hashed.importance[slots]
    expected = sum(weights[:, i, None] * hashed.pool[rows[:, i]] for i in range(3))
    if append:
        expected = torch.cat([expected, weights], dim=-1)
    assert torch.allclose(hashed(ids), expected) and hashed(ids).shape == (4, 24)
    assert len(set(slots.tolist())) > 1 and int(slots.max()) < 7
    assert WeightedHashEmbedding(V, D, importance_rows=1000, budget=0.001).num_buckets == 25  # 0.1%: was out of reach


def test_dhe_batch_normalises_each_hidden_layer_as_its_paper_when_asked():
    """Kang et al.'s decoder, written out: h = Mish(BN(W x + b)) per hidden layer, BN with the running statistics at
    inference; in training the batch's own, over every token of the batch."""
    torch.manual_seed(0)
    dhe = DeepHashEmbedding(3000, 12, width=8, num_layers=2, num_hashes=16, batch_norm=True)
    ids = torch.randint(3000, (3, 5), generator=torch.Generator().manual_seed(1))
    trained = dhe(ids)  # training mode: updates the running statistics
    assert trained.shape == (3, 5, 12) and dhe.decoder[1].num_batches_tracked == 1
    dhe.eval()
    x = dhe.encode(ids).reshape(-1, 16)
    for linear, norm in ((dhe.decoder[0], dhe.decoder[1]), (dhe.decoder[3], dhe.decoder[4])):
        z = (linear(x) - norm.running_mean) / torch.sqrt(norm.running_var + norm.eps) * norm.weight + norm.bias
        x = z * torch.tanh(torch.nn.functional.softplus(z))  # Mish
    expected = dhe.decoder[6](x).reshape(3, 5, 12)
    assert torch.allclose(dhe(ids), expected, atol=1e-6)
    assert torch.allclose(dhe(ids[:1]), dhe(ids)[:1], atol=1e-6)  # at inference a vector does not depend on its batch


def test_dpq_batch_normalises_its_scores_as_the_authors_code_does():
    """softmax_BN: each codeword's score normalised over the batch's tokens and groups, no scale or shift; the choice is
    the argmax of the normalised scores; training moves the running statistics by 1% of the way (TensorFlow's
    momentum 0.99); inference, and the codes the inference form stores, use the running statistics."""
    torch.manual_seed(0)
    dpq = DPQEmbedding(300, 12, codewords=7, groups=3, batch_norm_scores=True)
    ids = torch.randint(300, (4, 9), generator=torch.Generator().manual_seed(1))
    raw = torch.einsum("...gw,gkw->...gk", dpq.queries[ids], dpq.keys).reshape(-1, 7).detach()
    dpq(ids)  # a training step's forward
    assert torch.allclose(dpq.score_mean, 0.01 * raw.mean(0), atol=1e-7)
    assert torch.allclose(dpq.score_var, 0.99 + 0.01 * raw.var(0, unbiased=True), atol=1e-6)
    dpq.eval()
    normalised = ((raw - dpq.score_mean) / torch.sqrt(dpq.score_var + 1e-3)).reshape(4, 9, 3, 7)
    expected = dpq.values[torch.arange(3), normalised.argmax(-1)].flatten(-2)
    with torch.no_grad():
        assert torch.equal(dpq(ids), expected)
        assert torch.equal(dpq.for_inference()(ids), expected)


@pytest.mark.parametrize("batch_norm", [False, True])
def test_dpq_sx_passes_the_softmaxs_gradient_straight_through_the_hard_choice(batch_norm):
    """Chen et al. §3.2, written out with its one-hot: the vector is ``(hard + soft - sg(soft)) @ V`` (the hard
    choice's value, the tempered softmax's gradient), the scores batch-normalised by the batch's statistics where asked;
    the strategy's output and every gradient (queries, keys, values) are the formula's."""
    torch.manual_seed(0)
    dpq = DPQEmbedding(300, 12, codewords=7, groups=3, temperature=0.5, batch_norm_scores=batch_norm)
    ids = torch.randint(300, (4, 9), generator=torch.Generator().manual_seed(1))
    weight = torch.randn(4, 9, 12, generator=torch.Generator().manual_seed(2))
    scores = torch.einsum("...gw,gkw->...gk", dpq.queries[ids], dpq.keys)
    if batch_norm:  # the batch's own statistics, over its tokens and groups, per codeword; no scale or shift
        flat = scores.reshape(-1, 7)
        scores = ((flat - flat.mean(0)) / torch.sqrt(flat.var(0, unbiased=False) + 1e-3)).reshape(scores.shape)
    soft = (scores / 0.5).softmax(-1)
    choice = torch.nn.functional.one_hot(scores.argmax(-1), 7).to(soft.dtype) + soft - soft.detach()
    expected = torch.einsum("...gk,gkw->...gw", choice, dpq.values).flatten(-2)
    wanted = torch.autograd.grad((expected * weight).sum(), [dpq.queries, dpq.keys, dpq.values])
    out = dpq(ids)
    got = torch.autograd.grad((out * weight).sum(), [dpq.queries, dpq.keys, dpq.values])
    assert torch.allclose(out, expected, atol=1e-6)
    for name, mine, formula in zip(("queries", "keys", "values"), got, wanted):
        assert formula.abs().sum() > 0 and torch.allclose(mine, formula, atol=1e-5), name


def test_qr_with_concatenation_is_the_two_sub_embedding_but_for_its_quotient_rows():
    """The docs' sentence: QR-concat with m rows is SubspaceEmbedding(f=2, Q=m, radix codes), the quotient table
    ceil(V/m) rows (the same vectors where V = m^2)."""
    qr, subspace = QREmbedding(400, 8, remainder_rows=20, operation="concat"), SubspaceEmbedding(400, 8, num_tables=2)
    with torch.no_grad():
        q_table, r_table = subspace.tables  # radix codes: digit 0 is n % Q, digit 1 is n // Q
        q_table.copy_(qr.remainder)
        r_table.copy_(qr.quotient)
    ids = torch.arange(400)
    assert torch.equal(qr(ids)[:, [*range(4, 8), *range(4)]], subspace(ids))


def test_hash_functions_are_seeded_universal_hashes_kept_in_the_checkpoint():
    """Never Python's hash(): (a x + b) mod p mod m with (a, b) drawn from NumPy's generator of the seed, the same in
    any process, and a persistent buffer, so a checkpoint brings them back whatever the seed then given."""
    strategy = HashingTrickEmbedding(1000, 8, num_buckets=64, seed=3)
    drawn = np.random.default_rng(3)
    a, b = drawn.integers(1, PRIME, 2), drawn.integers(0, PRIME, 2)
    assert strategy.hash_coefficients.tolist() == [[int(a[0]), int(b[0])], [int(a[1]), int(b[1])]]
    ids = torch.tensor([0, 1, 999])
    assert hash_ids(ids, strategy.hash_coefficients, 64)[:, 0].tolist() == [(int(a[0]) * x + int(b[0])) % PRIME % 64
                                                                          for x in (0, 1, 999)]
    other = HashingTrickEmbedding(1000, 8, num_buckets=64, seed=4)
    assert not torch.equal(other.hash_coefficients, strategy.hash_coefficients)
    other.load_state_dict(strategy.state_dict())
    assert torch.equal(other(ids), strategy(ids))


ZOO = {
    "hashing_trick": functools.partial(HashingTrickEmbedding, num_buckets=300),
    "hash_embeddings": functools.partial(WeightedHashEmbedding, num_buckets=100, num_hashes=3),
    "robe": functools.partial(ROBEEmbedding, memory=1000, block_size=4),
    "dhe": functools.partial(DeepHashEmbedding, width=16, num_hashes=32),
    "albert": functools.partial(FactorizedEmbedding, rank=4, bias=True),
    "qr": functools.partial(QREmbedding, remainder_rows=100),
    "tt": functools.partial(TTEmbedding, rank=3),
    "mixed_dimension": functools.partial(MixedDimensionEmbedding, base_dim=8, frequencies="id_order"),
    "dpq": functools.partial(DPQEmbedding, codewords=8, groups=4),
    "dpq_vq": functools.partial(DPQEmbedding, codewords=8, groups=4, variant="vq"),
}


@pytest.mark.parametrize("commitment", [0.0, 0.25])
def test_dpq_vq_takes_the_nearest_centroid_straight_through_and_trains_its_centroids_by_its_own_loss(commitment):
    """Chen et al.'s DPQ-VQ, written out: in each group the centroid nearest the query (Euclidean), its value forward,
    the output's gradient to the query unchanged (straight through); the centroids' gradient from
    mean((C - sg(q))^2) + commitment * mean((sg(C) - q)^2) alone."""
    torch.manual_seed(0)
    dpq = DPQEmbedding(300, 12, codewords=5, groups=3, variant="vq", commitment=commitment)
    assert not hasattr(dpq, "keys") and dpq.num_embedding_parameters() == 5 * 12 + 300 * 3  # the keys are the values
    ids = torch.randint(300, (4, 9), generator=torch.Generator().manual_seed(1))
    upstream = torch.randn(4, 9, 12, generator=torch.Generator().manual_seed(2))

    queries = dpq.queries.detach()[ids]  # (4, 9, 3, 4)
    distances = torch.stack([torch.cdist(queries[..., g, :].reshape(-1, 4), dpq.values.detach()[g]) for g in range(3)], 1)
    nearest = distances.argmin(-1).reshape(4, 9, 3)
    chosen = dpq.values.detach()[torch.arange(3), nearest]  # (4, 9, 3, 4)
    out = dpq(ids)
    assert torch.allclose(out, chosen.flatten(-2), atol=1e-6)
    term = dpq.auxiliary_loss()
    n = chosen.numel()
    assert torch.allclose(term, (1 + commitment) * (chosen - queries).pow(2).sum() / n)
    assert dpq.auxiliary_loss() is None  # taken once
    ((out * upstream).sum() + term).backward()
    query_grad = torch.zeros_like(dpq.queries)
    query_grad.index_put_((ids,), upstream.reshape(4, 9, 3, 4) + commitment * 2 * (queries - chosen) / n, accumulate=True)
    assert torch.allclose(dpq.queries.grad, query_grad, atol=1e-6)
    value_grad = torch.zeros_like(dpq.values)
    for g in range(3):
        value_grad[g].index_add_(0, nearest[..., g].reshape(-1), (2 * (chosen - queries) / n)[..., g, :].reshape(-1, 4))
    assert torch.allclose(dpq.values.grad, value_grad, atol=1e-7)
    dpq.eval()
    with torch.no_grad():  # inference: the codes read from the nearest centroids, kept alone
        assert torch.equal(dpq.codes(), torch.cat([torch.cdist(dpq.queries[:, g], dpq.values[g]).argmin(-1, keepdim=True)
                                                   for g in range(3)], 1))
        assert torch.equal(dpq.for_inference()(ids), dpq(ids))


def test_a_training_step_adds_dpq_vqs_own_loss_to_the_objectives():
    codes = torch.randint(30522, (2, 10), generator=torch.Generator().manual_seed(0))
    batch = {"codes": codes, "attention_mask": torch.ones_like(codes), "labels": torch.zeros(2, dtype=torch.long)}
    model = SequenceClassifier("topics", encoder=tiny_encoder(16), embedding=functools.partial(
        DPQEmbedding, codewords=8, groups=4, variant="vq"), vocab_size=30522)
    torch.manual_seed(0)
    objective = model.losses(model(batch), batch["labels"]).mean()
    term = model.embedding.auxiliary_loss()
    torch.manual_seed(0)
    total = model.training_step(batch, 0)
    assert term is not None and torch.allclose(total, objective + term)
    total.backward()
    assert model.embedding.values.grad.abs().sum() > 0  # the centroids learn from it


def test_dpq_without_gradients_gives_the_trained_path_s_vectors_and_its_full_weight():
    """Inference reads the values at the codes (no N x D x K one-hot and softmax: the zoo's post-hoc DPQ at 10% took
    12.5 GB for it); the vectors are the straight-through path's (whose hard + soft - soft carries the softmax's
    rounding: within 1e-6), and the full weight's exactly."""
    torch.manual_seed(0)
    dpq = DPQEmbedding(300, 12, codewords=7, groups=3)
    ids = torch.randint(300, (4, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        inferred = dpq(ids)
    trained = dpq(ids)
    assert trained.requires_grad and torch.allclose(inferred, trained.detach(), rtol=0, atol=1e-6)
    assert torch.equal(dpq.full_weight()[ids], inferred)


@pytest.mark.parametrize("name", list(ZOO))
def test_each_method_trains_in_every_objective(name):
    """MLM with the decoder tied to the strategy's V x d weight, Shuffle+Random, and fine-tuning: every parameter of
    the strategy gets a gradient."""
    codes = torch.randint(30522, (2, 10), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(codes)
    labels = torch.full_like(codes, -100)
    labels[:, 2:6] = codes[:, 2:6]
    shuffled = torch.full_like(codes, -100)
    shuffled[:, 1:9] = torch.randint(3, (2, 8))
    runs = [
        (MaskedLM(tiny_encoder(16), vocab_size=30522, embedding=ZOO[name]), {"labels": labels}, lambda out: out[0]),
        (ShuffleRandom(tiny_encoder(16), vocab_size=30522, embedding=ZOO[name]), {"labels": shuffled}, lambda out: out[0]),
        (SequenceClassifier("topics", encoder=tiny_encoder(16), embedding=ZOO[name], vocab_size=30522), {},
         lambda out: out.sum()),
    ]
    for module, extra, loss in runs:
        module.train()
        objective = loss(module({"codes": codes, "attention_mask": mask, **extra}))
        term = module.embedding.auxiliary_loss()  # added by each training step (DPQ-VQ's centroids learn from it)
        (objective if term is None else objective + term).backward()
        for parameter_name, parameter in module.embedding.named_parameters():
            assert parameter.grad is not None and parameter.grad.abs().sum() > 0, (type(module).__name__, parameter_name)


ZOO_YAMLS = ["hashing_trick", "hash_embeddings", "robe", "dhe", "albert_factorized", "qr", "tt", "mixed_dimension", "dpq"]


@pytest.mark.parametrize("name", ZOO_YAMLS)
def test_each_methods_yaml_counts_at_a_budget_of_the_demo_as_the_readme_says(name):
    """`lit-embed params --config configs/demo.yaml --model.init_args.embedding configs/embedding/<method>.yaml
    --model.init_args.embedding.init_args.budget 0.01`: the count it reports is the one the budget chose, or the
    method refuses (exit 2) naming the nearest sizes; the strategies page's table shows either."""
    import contextlib
    import io

    from lit_embed.commands import main

    row = next(line.split(" | ")[1:] for line in page("strategies").splitlines() if line.startswith(f"| {name} |"))
    out, err = io.StringIO(), io.StringIO()
    argv = ["params", "--config", str(CONFIGS / "demo.yaml"), "--model.init_args.embedding",
            str(CONFIGS / "embedding" / f"{name}.yaml"), "--model.init_args.embedding.init_args.budget", "0.01", "--json"]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    if code == 2:
        message = err.getvalue()
        assert "cannot meet budget=0.01" in message and row[0].startswith("refused: nearest ")
        parameter, values = row[0].removeprefix("refused: nearest ").split("=")
        for value, count in zip(values.split(" or "), row[1].split(" or ")):
            assert f"{count}, " in message and f"({parameter}={value})" in message
        return
    report = json.loads(out.getvalue())
    sizing, dense = report["sizing"], 30522 * report["hidden_size"] * 4
    assert code == 0 and sizing["count"] == report["embedding_bytes"]
    assert abs(report["embedding_bytes"] - 0.01 * dense) <= 0.01 * 0.01 * dense
    assert row[:2] == [f"{sizing['parameter']}={sizing['value']}", f"{sizing['count']:,}"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Every method in a MaskedLM, its weights perturbed, saved as lit-embed saves, exported, and loaded by transformers
    in one subprocess where lit_embed cannot be imported."""
    tmp = tmp_path_factory.mktemp("zoo_export")
    jobs, checkpoints = [], {}
    ids = torch.randint(0, 30522, (2, 7), generator=torch.Generator().manual_seed(0))
    for number, (name, factory) in enumerate(ZOO.items()):
        module = MaskedLM(tiny_encoder(16), vocab_size=30522, embedding=factory)
        generator = torch.Generator().manual_seed(number)
        with torch.no_grad():
            for parameter in module.parameters():
                parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
        checkpoints[name] = tmp / f"{name}.ckpt"
        torch.save({"state_dict": module.state_dict(), FACTS: describe(module, "all-MiniLM-L6-v2", None)}, checkpoints[name])
        export(str(checkpoints[name]), str(tmp / name))
        jobs.append({"folder": str(tmp / name), "auto": "AutoModel", "out": str(tmp / f"{name}.pt"),
                     "inputs": {"input_ids": ids.tolist(), "attention_mask": [[1] * 7, [1] * 5 + [0] * 2]}})
    (tmp / "jobs.json").write_text(json.dumps(jobs))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"HF_MODULES_CACHE": str(tmp / "hf_modules")}
    (tmp / "elsewhere").mkdir()
    done = subprocess.run([sys.executable, str(REPO / "tests" / "helpers" / "export_loader.py"), str(tmp / "jobs.json")],
                          capture_output=True, text=True, cwd=tmp / "elsewhere", env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "lit_embed imported: False" in done.stdout
    return {name: (checkpoints[name], torch.load(tmp / f"{name}.pt")) for name in ZOO}


@pytest.mark.parametrize("name", list(ZOO))
def test_each_methods_export_computes_what_lit_embed_computes(exported, name):
    checkpoint, loaded = exported[name]
    module, _ = load_model(checkpoint)
    inputs = loaded["inputs"]
    with torch.no_grad():
        expected = module.eval().encode({"codes": inputs["input_ids"], "attention_mask": inputs["attention_mask"]})
    assert torch.allclose(loaded["output"], expected.last_hidden_state, atol=1e-5)

"""Every built-in compression method keeps the contract plugin authors run (lit_embed.testing.check_compression_method),
and a broken one fails it, naming the property."""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

import pytest
import torch
from torch.nn import functional as F

from lit_embed.compress.methods import CompressionMethod, Job, method_named
from lit_embed.compress.partial import with_common_rows
from lit_embed.compress.strategy_fit import strategy_from
from lit_embed.embeddings import (
    FactorizedEmbedding,
    PCAEmbedding,
    ProductQuantizedEmbedding,
    ScalarQuantizedEmbedding,
    UnkEmbedding,
)
from lit_embed.embeddings.base import state_bytes
from lit_embed.errors import BudgetError, ConfigError, UserError
from lit_embed.testing import check_compression_method
from tests.helpers import CONFIGS

#: Each built-in method's options for the check: small, so that it runs in seconds.
CONTRACT_OPTIONS = {
    "sparse_coding": {"k": [2, 3]},
    "pca": {"k": 4},
    "unk": {},
    "aq": {"codebooks": 4, "codewords": 8, "max_steps": 3},
    "svd": {"rank": 5},
    "int8": {},
    "int4": {},
    "dense": {},
    "pq": {"groups": 4, "codewords": 16, "iterations": 3},
    "fit": {"strategy": {"class_path": "lit_embed.embeddings.QREmbedding", "init_args": {"remainder_rows": 300}},
            "max_steps": 3, "eval_every": 2},
}


@pytest.mark.parametrize("method", sorted(CONTRACT_OPTIONS))
def test_every_built_in_method_keeps_the_contract(method):
    candidates = check_compression_method(method, options=CONTRACT_OPTIONS[method])
    assert all(strategy.vocab_size == 30522 for strategy in candidates.values())


def test_the_cases_cover_every_built_in_method():
    built_in = {name for name, cls in CompressionMethod.registry.items() if cls.__module__.startswith("lit_embed.")}
    assert built_in == set(CONTRACT_OPTIONS)


# -- a broken method fails, naming the property ----------------------------------------------------------


class Broken(CompressionMethod):
    """Rare tokens take a common row; each subclass below breaks one property of the contract."""

    def fit(self, job):
        strategy = with_common_rows(UnkEmbedding, job.weight, job.common_ids)
        strategy.unk_row.fill_(self.pick(job))
        return {None: strategy}

    def pick(self, job) -> int:
        return 0


@dataclass
class NoDefault:
    """Args:
        row: a row, with no default.
    """

    row: int


class Undefaulted(Broken):
    name = "contract_undefaulted"
    Options = NoDefault


class Undeterministic(Broken):
    name = "contract_undeterministic"

    fits = itertools.count(1)

    def pick(self, job) -> int:
        return next(self.fits)  # state kept between fits, not drawn from the job's seed


class Sized(Broken):
    name = "contract_sized"

    def fit(self, job):
        return {None: with_common_rows(UnkEmbedding, job.weight[:, :8], job.common_ids)}


class Miscounted(Broken):
    name = "contract_miscounted"

    def fit(self, job):
        strategy = super().fit(job)[None]
        strategy.num_embedding_parameters = lambda: 7  # says one count, its formula another
        return {None: strategy}


@pytest.mark.parametrize(("broken", "message"), [
    (Undefaulted, "Undefaulted breaks the compression method contract (options): options ['row'] have no default"),
    (Sized, "Sized breaks the compression method contract (fits): fit()[None] is 30522 x 8, the table 30522 x 16"),
    (Miscounted, "Miscounted breaks the compression method contract (parameter count): fit()[None] reports 7 parameters"),
    (Undeterministic, "Undeterministic breaks the compression method contract (deterministic): fitted twice with seed 0"),
])
def test_a_broken_method_fails_the_contract_naming_the_property(broken, message):
    with pytest.raises(AssertionError) as failed:
        check_compression_method(broken)
    assert message in str(failed.value)


# -- the post-hoc methods: formulas and what they rebuild ---------------------------------------------------


def table(vocab: int = 300, hidden: int = 12, seed: int = 0) -> torch.Tensor:
    return torch.randn(vocab, hidden, generator=torch.Generator().manual_seed(seed))


def job_of(weight: torch.Tensor, **fields) -> Job:
    return Job(weight, torch.arange(0, len(weight), 3), **fields)


@pytest.mark.parametrize(("bits", "hidden", "code_bytes"), [(8, 10, 10), (8, 9, 9), (4, 10, 5), (4, 9, 5)])
def test_scalar_quantisation_counts_bytes_and_rebuilds_each_value_within_half_a_step(bits, hidden, code_bytes):
    weight = table(100, hidden)
    weight[7] = 0.25  # a constant row: rebuilt exactly
    (strategy,) = method_named(f"int{bits}").fit(job_of(weight)).values()
    assert isinstance(strategy, ScalarQuantizedEmbedding) and strategy.codes.dtype == torch.uint8
    stored = 100 * code_bytes + 100 * 8  # codes, and a float32 scale and offset per row
    assert state_bytes(strategy.state_dict()) == stored
    assert strategy.num_embedding_parameters() == ScalarQuantizedEmbedding.count_parameters(100, hidden, bits) == -(-stored // 4)
    rebuilt = strategy(torch.arange(100)).detach()
    step = (weight.max(1).values - weight.min(1).values) / (2**bits - 1)
    assert ((rebuilt - weight).abs() <= step[:, None] / 2 + 1e-6).all()
    assert torch.equal(rebuilt[7], weight[7])
    assert torch.allclose(rebuilt.min(1).values, weight.min(1).values) and torch.allclose(rebuilt.max(1).values, weight.max(1).values)


def test_svd_is_the_best_rank_r_approximation_and_sizes_to_a_budget():
    weight = table(300, 12)
    centred = weight.double() - weight.double().mean(0)
    singular = torch.linalg.svdvals(centred)
    for rank in (3, 12):
        method = method_named("svd", {"rank": rank})
        (strategy,) = method.fit(job_of(weight)).values()
        assert isinstance(strategy, FactorizedEmbedding) and method.details == {"rank": rank}
        assert strategy.num_embedding_parameters() == 300 * rank + rank * 12 + 12  # V r + r d + the mean
        error = (strategy(torch.arange(300)).detach().double() - weight.double()).pow(2).sum()
        assert float(error) == pytest.approx(float(singular[rank:].pow(2).sum()), rel=1e-4, abs=1e-6)  # Eckart-Young
    method = method_named("svd", {"budget": 4 * (300 * 4 + 4 * 12 + 12)})  # bytes: float32 factors and mean
    (strategy,) = method.fit(job_of(weight)).values()
    assert strategy.rank == method.details["rank"] == 4 and "budget=" in method.details["budget"]
    with pytest.raises(ConfigError, match=r"rank=13 must lie in \[1, min\(vocabulary=300, hidden=12\)\]: change --rank"):
        method_named("svd", {"rank": 13}).check(job_of(weight))


@pytest.mark.parametrize("backend", ["torch", "faiss"])
def test_product_quantisation_finds_clusters_and_says_which_k_means_ran(backend):
    if backend == "faiss":
        faiss = pytest.importorskip("faiss")
    centres = table(4, 6, seed=1)  # 4 distinct rows per group of 6 dimensions: 4 codewords rebuild the table exactly
    pick = torch.randint(0, 4, (200, 2), generator=torch.Generator().manual_seed(2))
    weight = torch.cat([centres[pick[:, 0]], centres[pick[:, 1]]], dim=1)
    method = method_named("pq", {"groups": 2, "codewords": 4, "iterations": 10, "backend": backend})
    (strategy,) = method.fit(job_of(weight)).values()
    assert isinstance(strategy, ProductQuantizedEmbedding)
    assert strategy.num_embedding_parameters() == 4 * 12 + 200 * 2  # K d codebook values and V G codes
    assert state_bytes(strategy.state_dict()) == 4 * 12 * 4 + 200 * 1  # two 2-bit codes (K = 4) a row: one byte
    assert torch.allclose(strategy(torch.arange(200)).detach(), weight, atol=1e-5)
    ran = method.details["k-means"]
    assert ran == (f"faiss {faiss.__version__}" if backend == "faiss" else "torch (lit-embed's k-means++ and Lloyd)")
    with pytest.raises(ConfigError, match="groups=5 must divide the hidden size 12: change --groups"):
        method_named("pq", {"groups": 5}).check(job_of(weight))
    with pytest.raises(ConfigError, match=r"codewords=256 exceeds the vocabulary \(200 rows\)"):
        method_named("pq", {"groups": 2}).fit(job_of(weight))


# -- fit: any strategy fitted to the table, its loss and stopping rule as stated ------------------------------------

FACTORISED = {"class_path": "lit_embed.embeddings.FactorizedEmbedding", "init_args": {"rank": 8}}


def fit_job(counts: torch.Tensor | None = None) -> Job:
    weight = table(200, 8)
    return Job(weight, torch.arange(0, 200, 3), counts=counts)


@pytest.mark.parametrize(("loss", "weighting"), [("mse", "frequency"), ("cosine", "frequency"), ("mse", "uniform")])
def test_fit_minimises_the_stated_weighted_loss(loss, weighting):
    counts = torch.arange(200) ** 2  # skewed: the weights log(2 + count) differ
    job = fit_job(counts)
    method = method_named("fit", {"strategy": FACTORISED, "loss": loss, "weighting": weighting, "solver": "gradient", "max_steps": 150,
                                  "tolerance": 0.0, "eval_every": 50, "lr": 0.05, "batch_size": 64})
    with torch.random.fork_rng():
        torch.manual_seed(job.seed)  # the strategy starts where the method's own seeded build starts
        start = strategy_from(FACTORISED, 200, 8)
    (strategy,) = method.fit(job).values()
    weights = torch.log(2.0 + counts.double()) if weighting == "frequency" else torch.ones(200, dtype=torch.float64)

    def stated(rows: torch.Tensor) -> float:
        target = job.weight.double()
        per_row = (1 - F.cosine_similarity(rows.double(), target, dim=-1) if loss == "cosine"
                   else (rows.double() - target).pow(2).mean(-1))
        return float((per_row * weights).sum() / weights.sum())

    details = method.details
    assert details["loss before"] == pytest.approx(stated(start(torch.arange(200)).detach()), rel=1e-4, abs=1e-6)
    assert details["loss after"] == pytest.approx(stated(strategy(torch.arange(200)).detach()), rel=1e-4, abs=1e-6)
    assert details["loss after"] < 0.1 * details["loss before"]  # rank 8 of an 8-wide table: it can fit it
    assert (details["steps"], details["stopped by"]) == (150, "max_steps (150)")
    assert details["strategy"] == "FactorizedEmbedding"
    assert ("log(2 + the token's count in the data)" in details["loss"]) is (weighting == "frequency")


@pytest.mark.parametrize(("options", "steps", "stopped"), [
    ({"max_steps": 7}, 7, "max_steps (7)"),
    ({"tolerance": 1.0, "eval_every": 4}, 4, "tolerance (whole-table loss"),  # any gain short of 100% stops at once
    ({"max_seconds": 1e-9}, 1, "max_seconds (1e-09)"),
])
def test_fit_stops_by_each_rule_and_says_which(options, steps, stopped):
    method = method_named("fit", {"strategy": FACTORISED, "solver": "gradient", "max_steps": 50, **options})
    method.fit(fit_job())
    assert method.details["steps"] == steps and method.details["stopped by"].startswith(stopped)


def test_fit_refuses_what_it_cannot_fit_before_any_work(tmp_path):
    (tmp_path / "not_a_strategy.yaml").write_text("rank: 3\n")
    cases = {
        None: "method 'fit' needs --strategy: a strategy YAML (configs/embedding/*.yaml) to fit",
        str(tmp_path / "missing.yaml"): "does not exist: give a strategy YAML",
        str(tmp_path / "not_a_strategy.yaml"): "is not a strategy config: it needs a class_path",
        str(CONFIGS / "embedding" / "md5_emb1k.yaml"): "HashEmbedding does not index vocabulary ids",
    }
    for strategy, message in cases.items():
        with pytest.raises(UserError, match=re.escape(message)):
            method_named("fit", {"strategy": strategy}).check(fit_job())
    with pytest.raises(ConfigError, match="max_steps=0 must be at least 1"):
        method_named("fit", {"strategy": FACTORISED, "max_steps": 0}).check(fit_job())


def test_pq_and_sparse_coding_take_a_budget_of_bytes_and_refuse_one_they_cannot_meet():
    """--budget on pq sizes K (the V x G one-byte codes fixed by the groups); on sparse_coding it sizes |V_C|, the most
    frequent tokens of the data common (the split's unseen common ids, its specials, first), for one k."""
    weight = table(600, 64)
    dense = 600 * 64 * 4
    (pq,) = method_named("pq", {"groups": 4, "budget": 0.1, "iterations": 2}).fit(job_of(weight)).values()
    # K = 53 takes 6 bits: a row's 4 codes are 3 bytes, packed
    assert pq.codewords == round((0.1 * dense - 600 * 3) / (64 * 4)) == 53 and abs(pq.inference_bytes() - 0.1 * dense) <= 0.01 * 0.1 * dense
    # packed, K = 2 to 4 share 2-bit codes (a byte a row): 1% lies between K = 3 and 4
    with pytest.raises(ConfigError, match=r"ProductQuantizedEmbedding cannot meet budget=0.01 .*1,368, .*\(codewords=3\) "
                                          r"and 1,624, .*\(codewords=4\)"):
        method_named("pq", {"groups": 4, "budget": 0.01}).check(job_of(weight))
    counts = torch.arange(600, dtype=torch.float).flip(0)  # id 0 the most frequent
    counts[[3, 597]] = 0  # common in the split but unseen: special tokens
    job = Job(weight, torch.tensor([0, 1, 2, 3, 597]), counts=counts)
    method = method_named("sparse_coding", {"k": 3, "budget": 0.3})
    method.check(job)
    (coded,) = method.fit(job).values()
    assert abs(coded.inference_bytes() - 0.3 * dense) <= 0.01 * 0.3 * dense and "num_common=" in method.details["budget"]
    common = coded.common_ids().tolist()
    assert {3, 597} <= set(common) and sorted(common) == [i for i in range(len(common) - 1)] + [597]
    with pytest.raises(ConfigError, match=r"--budget sizes the common tokens for one k, and k=\[1, 2\]: give a single --k"):
        method_named("sparse_coding", {"k": [1, 2], "budget": 0.3}).check(job)
    with pytest.raises(ConfigError, match=r"SparseCodedEmbedding cannot meet budget=0.0001"):
        method_named("sparse_coding", {"k": 3, "budget": 0.0001}).check(job)


@pytest.mark.parametrize(("method", "options", "cls"), [("unk", {}, UnkEmbedding), ("pca", {"k": 2}, PCAEmbedding)])
def test_unk_and_pca_take_a_budget_that_sizes_their_common_tokens_the_most_frequent_first(method, options, cls):
    """As sparse coding's: |V_C| is what the bytes allow (every common row d float32 values), the data's most frequent
    tokens common, the split's unseen specials first; a budget below the smallest size is refused in the check."""
    weight, dense = table(600, 64), 600 * 64 * 4
    counts = torch.arange(600, dtype=torch.float).flip(0)  # id 0 the most frequent
    counts[[3, 597]] = 0  # common in the split but unseen: special tokens
    job = Job(weight, torch.tensor([0, 1, 2, 3, 597]), unk_id=3, counts=counts)
    compression = method_named(method, {**options, "budget": 0.3})
    compression.check(job)
    (strategy,) = compression.fit(job).values()
    assert isinstance(strategy, cls) and abs(strategy.inference_bytes() - 0.3 * dense) <= 0.01 * 0.3 * dense
    common = strategy.common_ids().tolist()
    assert sorted(common) == list(range(len(common) - 1)) + [597] and "num_common=" in compression.details["budget"]
    with pytest.raises(ConfigError, match=rf"{cls.__name__} cannot meet budget=0.0001"):
        method_named(method, {**options, "budget": 0.0001}).check(job)


@pytest.mark.parametrize(("method", "bits"), [("int8", 8), ("int4", 4)])
def test_int8_and_int4_accept_the_budget_their_bytes_meet_and_refuse_another_saying_what_they_take(method, bits):
    weight = table(600, 64)
    reach = 600 * (64 * bits // 8 + 8)  # the codes, and each row's float32 minimum and step
    (strategy,) = method_named(method, {"budget": reach}).fit(job_of(weight)).values()
    assert strategy.inference_bytes() == reach
    method_named(method, {"budget": round(reach * 1.009)}).check(job_of(weight))  # within 1%
    message = (f"{method} cannot meet budget=0.1 (15,360 bytes, 10% of the table) within 1%: it takes "
               f"{reach:,} bytes, {100 * reach / (600 * 64 * 4):.3g}% of the table, at any budget")
    with pytest.raises(BudgetError, match=re.escape(message)):
        method_named(method, {"budget": 0.1}).check(job_of(weight))


def test_dense_keeps_the_table_bit_for_bit_as_the_reference_and_meets_only_its_own_bytes():
    weight = table(600, 64)
    (strategy,) = method_named("dense", {"budget": 1.0}).fit(job_of(weight)).values()
    assert type(strategy).__name__ == "DenseEmbedding" and torch.equal(strategy(torch.arange(600)), weight)
    with pytest.raises(BudgetError, match=r"dense cannot meet budget=0.5 .* it takes 153,600 bytes, 100% of the table"):
        method_named("dense", {"budget": 0.5}).check(job_of(weight))


def test_aq_takes_a_budget_of_bytes_for_its_codebooks():
    """Each of M codebooks costs K d float32 values and a 4-bit code per row (K = 16), a row's codes packed: 10% of a
    600 x 64 table (15,360 bytes) lies between M = 3 (12,288 + 600 x 2 = 13,488) and M = 4 (17,584), and no M meets it
    within 1%; M = 2 is 8,192 + 600 bytes."""
    weight = table(600, 64)
    with pytest.raises(ConfigError, match=r"AdditiveQuantizedEmbedding cannot meet budget=0.1"):
        method_named("aq", {"codewords": 16, "budget": 0.1}).check(job_of(weight))
    method = method_named("aq", {"codewords": 16, "budget": 2 * 16 * 64 * 4 + 600, "max_steps": 1})
    (strategy,) = method.fit(job_of(weight)).values()
    assert strategy.num_codebooks == 2 and strategy.inference_bytes() == 2 * 16 * 64 * 4 + 600
    assert "codebooks=2" in method.details["budget"]

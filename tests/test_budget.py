"""A strategy sized to a memory budget (lit_embed.embeddings.sizing): every built-in strategy counts its parameters and
its inference bytes from its arguments as it counts them built, meets a budget of bytes (or of a fraction of the dense
float32 table's bytes) within 1% or refuses naming the budgets it can meet, and `lit-embed params` shows what the budget
chose."""

from __future__ import annotations

import functools
import re

import pytest
import torch

from lit_embed.checkpoints.format import build_from_config
from lit_embed.commands import main
from lit_embed.embeddings import (
    AdditiveQuantizedEmbedding,
    CanineHashEmbedding,
    DenseEmbedding,
    DPQEmbedding,
    EmbeddingStrategy,
    HashAdd,
    HashEmbedding,
    HashingTrickEmbedding,
    HashPool,
    HashProj,
    PCAEmbedding,
    ProductQuantizedEmbedding,
    ProFormerEmbedding,
    ScalarQuantizedEmbedding,
    SparseCodedEmbedding,
    SubspaceEmbedding,
    UnkEmbedding,
)
from lit_embed.embeddings.sizing import TOLERANCE, fit_budget
from lit_embed.errors import ConfigError
from tests.helpers import REPO
from tests.helpers.cli import params_json, section

V, D = 30522, 384  # the table the budgets are fractions of
#: strategy -> argument sets it is counted with (built small, so a formula that differs from the module shows)
BUILT = {
    DenseEmbedding: [{}],
    SubspaceEmbedding: [{"num_tables": 3}, {"num_tables": 2, "table_size": 200}, {"num_tables": 5, "padding_idx": 0}],
    HashEmbedding: [{"num_buckets": 300}],
    HashPool: [{"num_bits": 64, "chunk_bits": 6}, {"num_bits": 30, "chunk_bits": 7}],
    HashAdd: [{"num_bits": 64}],
    HashProj: [{"num_bits": 17}],
    ProFormerEmbedding: [{"num_bits": 70}],
    CanineHashEmbedding: [{"num_hashes": 4, "num_buckets": 97}, {"num_hashes": 4, "num_buckets": 97, "counted_buckets": 50}],
    SparseCodedEmbedding: [{"num_common": 200, "k": 3}],
    UnkEmbedding: [{"num_common": 200}],
    PCAEmbedding: [{"num_common": 200, "k": 4}],
    AdditiveQuantizedEmbedding: [{"codebooks": 4, "codewords": 8}],
    ScalarQuantizedEmbedding: [{"bits": 8}, {"bits": 4}],
    ProductQuantizedEmbedding: [{"groups": 4, "codewords": 16}],
}


def _sizes(cls):
    vocab = None if cls.unlimited_vocabulary else 3000
    return vocab, 24 if cls is CanineHashEmbedding else 20


@pytest.mark.parametrize("cls", list(BUILT), ids=lambda cls: cls.__name__)
def test_a_strategy_counts_itself_from_its_arguments_as_it_counts_itself_built(cls):
    vocab, hidden = _sizes(cls)
    for arguments in BUILT[cls]:
        built = cls(vocab, hidden, **arguments)
        assert cls.count_parameters(vocab, hidden, **arguments) == built.num_embedding_parameters(), arguments
        assert cls.count_bytes(vocab, hidden, **arguments) == built.inference_bytes(), arguments


#: strategy -> its arguments beside the budget, for the 30522 x 384 table (counts for the unlimited vocabularies)
BUDGETED = {
    SubspaceEmbedding: {"num_tables": 3},
    HashEmbedding: {},
    HashPool: {},
    HashAdd: {},
    HashProj: {},
    ProFormerEmbedding: {},
    CanineHashEmbedding: {},
    SparseCodedEmbedding: {"k": 5},
    UnkEmbedding: {},
    PCAEmbedding: {"k": 5},
    AdditiveQuantizedEmbedding: {"codewords": 16},
    ProductQuantizedEmbedding: {"groups": 2},
}


@pytest.mark.parametrize("share", [0.1, 0.01, 0.001])
@pytest.mark.parametrize("cls", list(BUDGETED), ids=lambda cls: cls.__name__)
def test_a_budget_is_met_within_one_percent_or_refused_naming_what_can_be_met(cls, share):
    """At 10%, 1% and 0.1% of a 30522 x 384 float32 table's bytes: the bytes chosen lie within 1% of the budget, and
    the strategy built holds them; or the refusal names bytes the strategy does reach, on either side of the budget (or
    its one edge), none of them within 1%."""
    vocab = None if cls.unlimited_vocabulary else V
    target = round(share * V * D * 4)
    budget = share if vocab else target
    try:
        sizing = fit_budget(cls, vocab, D, budget, BUDGETED[cls])
    except ConfigError as refused:
        named = [int(n.replace(",", "")) for n in re.findall(r"([\d,]+)(?:, [\d.]+% of dense)? \(\w+=\d+\)", str(refused))]
        values = [int(v) for v in re.findall(r"\(\w+=(\d+)\)", str(refused))]
        assert named and all(abs(n - target) > TOLERANCE * target for n in named), refused
        for value, count in zip(values, named):  # the nearest budgets named are what those sizes give
            assert cls.count_bytes(vocab, D, **{**BUDGETED[cls], cls.size_parameter: value}) == count
        assert len(named) == 2 or "smallest size" in str(refused) or "largest size" in str(refused)
        return
    assert abs(sizing.count - target) <= TOLERANCE * target
    assert sizing.count == cls.count_bytes(vocab, D, **{**BUDGETED[cls], sizing.parameter: sizing.value})
    if cls not in (CanineHashEmbedding, SubspaceEmbedding):  # built small enough to hold here
        assert cls(vocab, D, **BUDGETED[cls], budget=budget).inference_bytes() == sizing.count


def test_the_known_choices_of_the_existing_strategies():
    """Figures worked by hand in bytes (1% of the 30522 x 384 float32 table is 468,818 bytes): DPQ's K = (468,818 -
    30522 x 8 one-byte codes) / (384 x 4) = 146.3 codewords; the hashing trick's (468,818 - 32 bytes of hash
    coefficients) / 1536 = 305 buckets; PQ's 30522 x 2 codes leave (468,818 - 61,044) / 1536 = 265 codewords, beyond
    the 256 a byte indexes: refused, naming its largest size; HashAdd's largest, 128 bits, is (2 x 128 + 6) x 384 float32
    values and MD5's 2-byte key: 402,434 bytes; int4's codes and row scales are 13% of the table's bytes,
    its one size."""
    assert fit_budget(DPQEmbedding, V, D, 0.01, {}).value == 146
    assert fit_budget(HashingTrickEmbedding, V, D, 0.01, {}).value == 305
    assert fit_budget(HashingTrickEmbedding, V, D, 468_512, {}).count == 305 * 384 * 4 + 32
    with pytest.raises(ConfigError, match=r"ProductQuantizedEmbedding cannot meet budget=0.01 \(468,818 bytes, 1% of dense\)"
                                          r".*454,260, 0.969% of dense \(codewords=256\), its largest size"):
        fit_budget(ProductQuantizedEmbedding, V, D, 0.01, {"groups": 2})
    with pytest.raises(ConfigError, match=r"402,434 \(num_bits=128\), its largest size"):
        fit_budget(HashAdd, None, D, 1_172_045, {})


def test_a_scalar_quantised_table_has_one_size_for_its_bits():
    stored = V * D // 2 + 8 * V  # two 4-bit codes a byte, a float32 scale and offset a row
    assert ScalarQuantizedEmbedding.count_bytes(V, D, bits=4) == stored
    assert ScalarQuantizedEmbedding(V, D, bits=4, budget=stored).sizing.count == stored
    with pytest.raises(ConfigError, match=r"ScalarQuantizedEmbedding has one size, 6,104,400 bytes, 13% of dense, which is "
                                          r"not budget=0.1"):
        ScalarQuantizedEmbedding(V, D, bits=4, budget=0.1)


def test_the_dense_table_has_one_size():
    assert fit_budget(DenseEmbedding, V, D, 1.0, {}).count == V * D * 4
    assert DenseEmbedding(100, 8, budget=3200).sizing.count == 3200
    with pytest.raises(ConfigError, match=r"DenseEmbedding has one size, 3,200 bytes, 100% of dense, which is not "
                                          r"budget=0.5 \(1,600 bytes, 50% of dense\)"):
        DenseEmbedding(100, 8, budget=0.5)


@pytest.mark.parametrize("budget, message", [
    (0, r"budget=0 must be a positive number of bytes"),
    (-5, r"budget=-5 must be a positive number"),
    (1.5, r"budget=1.5 is a fraction outside \(0, 1\].*an integer such as 2"),
    (0.0, r"budget=0.0 is a fraction outside"),
    (True, r"budget=True must be a number of bytes"),
    ("1%", r"budget='1%' must be a number of bytes"),
])
def test_a_budget_that_is_no_count_or_fraction_is_refused_by_its_value(budget, message):
    with pytest.raises(ConfigError, match=message):
        SubspaceEmbedding(300, 8, budget=budget)


def test_a_fraction_needs_a_vocabulary_to_be_a_fraction_of():
    with pytest.raises(ConfigError, match=r"HashProj has an unlimited vocabulary, so budget=0.01 has no dense table.*"
                                          r"as an integer"):
        HashProj(None, 8, budget=0.01)


def test_the_budget_replaces_the_size_given_and_the_config_rebuilds_the_choice(caplog):
    """3000 x 20 float32 is 240,000 bytes; 2 radix tables keep 3000 x 2 int32 codes (24,000 bytes): 25% leaves
    (60,000 - 24,000) / (20 x 4) = 450 rows."""
    with caplog.at_level("INFO", "lit_embed.embeddings.sizing"):
        strategy = SubspaceEmbedding(3000, 20, num_tables=2, table_size=80, budget=0.25)
    assert strategy.table_size == 450 and strategy.inference_bytes() == 60_000 == strategy.sizing.count
    assert "table_size=450 gives 60,000" in caplog.text and "in place of the 80 given" in caplog.text
    config = strategy.config()["init_args"]
    assert config["budget"] == 0.25 and config["table_size"] == 450
    again = build_from_config(EmbeddingStrategy, strategy.config(with_sizes=True), "embedding")
    assert again.table_size == 450 and again.sizing == strategy.sizing
    assert SubspaceEmbedding(3000, 20).sizing is None
    # a size argument without default may be left to the budget: <unk> keeps C rows, and the int32 row map of 3000 ids
    unk = UnkEmbedding(3000, 20, budget=36_008)
    assert unk.num_common == 300 and unk.inference_bytes() == 300 * 20 * 4 + 3000 * 4 + 8
    coded = functools.partial(SparseCodedEmbedding, budget=0.6)(3000, 20)
    assert coded.inference_bytes() == coded.sizing.count == pytest.approx(0.6 * 240_000, rel=0.01)


DEMO = str(REPO / "configs" / "demo.yaml")


def test_params_shows_what_the_budget_chose_and_refuses_what_cannot_be_met(capsys):
    report = params_json(["params", "--config", DEMO, "--json", "--model.init_args.embedding.init_args.budget", "0.1"])
    sizing = report["sizing"]
    assert sizing["parameter"] == "table_size" and sizing["count"] == report["embedding_bytes"]
    assert sizing["target"] == round(0.1 * 30522 * report["hidden_size"] * 4) and sizing["budget"] == 0.1
    assert abs(sizing["count"] - sizing["target"]) <= 0.01 * sizing["target"]
    assert main(["params", "--config", DEMO, "--model.init_args.embedding.init_args.budget", "0.1"]) == 0
    printed = capsys.readouterr().out
    assert f"table_size={sizing['value']} gives {sizing['count']:,}" in printed
    shown = next(line for line in section("strategies", "Parameter accounting").splitlines() if line.startswith("budget  "))
    assert shown in printed.splitlines()  # the strategies page shows what params prints
    assert params_json(["params", "--config", DEMO, "--json"])["sizing"] is None
    assert main(["params", "--config", DEMO, "--model.init_args.embedding.init_args.budget", "0.0001"]) == 2
    error = capsys.readouterr().err
    assert "SubspaceEmbedding cannot meet budget=0.0001" in error and "(table_size=32), its smallest size" in error


@pytest.mark.parametrize("strategy", ["md5_proj", "md5_add"])
def test_a_budget_beyond_the_configured_hashers_bits_is_refused_with_its_largest_size(strategy, capsys):
    """The hasher as a config gives it (jsonargparse's factory, not the class): MD5's 128 bits bound the sizing, so a
    budget that would need more is a budget the strategy cannot meet, never a num_bits the hasher then refuses."""
    argv = ["params", "--config", str(REPO / "configs" / "demo_hashformer.yaml"), "--model.init_args.embedding",
            str(REPO / "configs" / "embedding" / f"{strategy}.yaml"), "--model.init_args.embedding.init_args.budget"]
    assert main([*argv, "800000"]) == 2
    error = capsys.readouterr().err
    assert "cannot meet budget=800000" in error and "(num_bits=128), its largest size" in error, error
    assert "exceeds the 128 bits" not in error


class _LowRank(EmbeddingStrategy):
    """A plugin's strategy that takes a budget but gives no count formula: the base class counts it built on the meta
    device."""

    size_parameter = "rank"

    def __init__(self, vocab_size: int, hidden_size: int, rank: int = 4, budget: int | float | None = None) -> None:
        super().__init__(vocab_size, hidden_size)
        self.rank = rank
        self.a = torch.nn.Parameter(torch.zeros(vocab_size, rank))
        self.b = torch.nn.Parameter(torch.zeros(rank, hidden_size))

    def forward(self, codes):
        return self.a[codes] @ self.b

    @classmethod
    def size_range(cls, vocab_size: int, hidden_size: int, **_) -> tuple[int, int]:
        return 1, hidden_size


def test_a_strategy_without_a_formula_is_counted_built_on_the_meta_device():
    assert _LowRank.count_parameters(1000, 16, rank=3) == 3 * (1000 + 16)
    assert _LowRank.count_bytes(1000, 16, rank=3) == 4 * 3 * (1000 + 16)
    strategy = _LowRank(1000, 16, budget=4 * 5 * 1016)
    assert strategy.rank == 5 and strategy.a.device.type == "cpu" and strategy.num_embedding_parameters() == 5080

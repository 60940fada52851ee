"""HashFormer strategies, Shuffle+Random pre-training, ProFormer, the paper's Table 2 counts, the demo."""

from __future__ import annotations

import contextlib
import functools
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from lit_embed.commands import main
from lit_embed.data.collate import ShuffleRandomCollator
from lit_embed.embeddings import (
    CanineHashEmbedding,
    DenseEmbedding,
    HashAdd,
    HashEmbedding,
    HashPool,
    HashProj,
    LSHHasher,
    ProFormerEmbedding,
    VocabTextEncoder,
)
from lit_embed.embeddings.hash_text import unpack_bits
from lit_embed.errors import ConfigError
from lit_embed.measures.accounting import human
from lit_embed.models import ShuffleRandom
from tests.helpers import CONFIGS, REPO, TINY_CANINE, TINY_CANINE_TABLES, tiny_encoder
from tests.helpers.cli import fit_demo, page, run_params
from tests.helpers.papers import CANINE_C_COUNTED, CANINE_C_MODULES, EMB_1K_COUNTED, TABLE_2, TABLE_6_SUBWORD
from tests.helpers.run_if import requires_gpus

DEMO = CONFIGS / "demo_hashformer.yaml"


@contextlib.contextmanager
def one_thread():
    """Tiny models train many times faster on one thread of a busy 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def hash_codes(strategy, texts: list[str]) -> torch.Tensor:
    encoder = strategy.text_encoder(None)
    return torch.from_numpy(np.stack([np.concatenate(encoder.encode([t])) for t in texts]))


# -- parameter counts: the paper's Table 2 and Appendix B --------------------------------------------------


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [
        (functools.partial(HashEmbedding, num_buckets=50265), 38_603_520),  # 38.6M, BERT's
        (functools.partial(HashEmbedding, num_buckets=1000), 768_000),  # 768.0K: the text's 1K
        (HashPool, 797_184),  # (13 + 1024 + 1) x 768
        (HashAdd, 197_376),  # (2 x 128 + 1) x 768 = 197.4K
        (HashProj, 99_072),  # (128 + 1) x 768 = 99.1K
        (ProFormerEmbedding, 322_560),  # 420 x 768 = 322.6K
    ],
    ids=["emb50k", "emb1k", "pool", "add", "proj", "proformer"],
)
def test_embedding_parameters_are_appendix_b(strategy, expected):
    emb = strategy(None, 768)
    assert emb.num_embedding_parameters() == expected
    # Left out: the special-token rows (5 of the 6; ProFormer counts no shared word row, so all 6).
    uncounted = {HashEmbedding: 0, ProFormerEmbedding: 6 * 768}.get(type(emb), 5 * 768)
    assert sum(p.numel() for p in emb.parameters()) - expected == uncounted





def counted(figure: str) -> float:
    """A count as the paper prints it (``86.1M``, ``99.1K``) back to a number."""
    return float(figure[:-1]) * {"K": 1e3, "M": 1e6}[figure[-1]]


def test_every_hashformers_experiment_is_in_table_2_or_table_6():
    subword = {f"{name}_subword" for name in TABLE_6_SUBWORD}
    assert {p.stem for p in (CONFIGS / "experiments" / "hashformers").glob("*.yaml")} == set(TABLE_2) | subword


#: Table 2 rows lit-embed counts otherwise, each with its own test below.
COUNTED_OTHERWISE = {"canine_c", "md5_emb1k", "lsh_emb1k"}


def printed_config(path: Path, capsys) -> dict:
    """The config ``lit-embed fit`` composes from ``path`` (``--print_config``), as data."""
    import yaml

    with pytest.raises(SystemExit) as stop:
        main(["fit", "--config", str(path), "--print_config"])
    assert stop.value.code in (0, None)
    return yaml.safe_load(capsys.readouterr().out)


@pytest.mark.parametrize("name", TABLE_6_SUBWORD)
def test_table_6_pretrains_the_word_model_on_bpe_pieces(name, capsys):
    """Appendix C: each subword experiment is its word model, pre-trained and hashed the same way, on the pieces of
    the BERT baselines' BPE tokenizer."""
    folder = CONFIGS / "experiments" / "hashformers"
    word, subword = printed_config(folder / f"{name}.yaml", capsys), printed_config(folder / f"{name}_subword.yaml", capsys)
    strategy = subword["model"]["init_args"]["embedding"]["init_args"]
    assert strategy.pop("tokenization") == "subword" and word["model"]["init_args"]["embedding"]["init_args"].pop(
        "tokenization", "word") == "word"
    assert subword["data"]["init_args"]["tokenizer"] == "roberta-base"
    for config in (word, subword):
        config.pop("config", None)
    assert subword == word


@pytest.mark.parametrize("name", sorted(set(TABLE_2) - COUNTED_OTHERWISE) + [f"{n}_subword" for n in TABLE_6_SUBWORD])
def test_params_reproduce_table_2(name):
    total, embedding, pcr_all, pcr_emb, poep = TABLE_2[name.removesuffix("_subword")]  # Table 6: the word model's
    report = run_params(CONFIGS / "experiments" / "hashformers" / f"{name}.yaml")
    assert (human(report["total_params"]), human(report["embedding_params"])) == (total, embedding)
    assert human(report["baseline_total_params"]) == "124.6M" and human(report["baseline_embedding_params"]) == "38.6M"
    # The paper computes PCR from its rounded counts (ProFormer: 1 - 15.1M/124.6M = 87.9%, exactly 87.85%).
    assert round(100 * (1 - counted(total) / counted("124.6M")), 1) == pcr_all
    assert round(100 * (1 - counted(embedding) / counted("38.6M")), 1) == pcr_emb
    assert 100 * report["pcr_all"] == pytest.approx(pcr_all, abs=0.1)
    # The paper prints Pool's and Emb (1K)'s PoEP, 797.2K / 86.8M = 0.92%, as 1.0.
    assert 100 * report["poep"] == pytest.approx(poep, abs=0.1)


@pytest.mark.parametrize("name", ["md5_emb1k", "lsh_emb1k"])
def test_emb_1k_has_the_texts_1000_rows_where_table_2_repeats_pools_row(name):
    report = run_params(CONFIGS / "experiments" / "hashformers" / f"{name}.yaml")
    assert report["embedding_params"] == 1000 * 768 and report["counting_rules"] == []
    assert (human(report["total_params"]), human(report["embedding_params"])) == EMB_1K_COUNTED
    assert TABLE_2[name] == TABLE_2[name.replace("emb1k", "pool")]  # the misprint: Pool's row, word for word
    assert round(100 * report["pcr_emb"], 2) == 98.01 and round(100 * report["poep"], 3) == 0.885


def test_params_count_canine_c_as_its_authors_and_hashformers_do_offline(capsys):
    """google/canine-c's modules (transformers' CanineModel from its config) less the position rows CANINE's README
    leaves out, and its embedding as HashFormers' eq. 10: Table 2's row within its rounding, with the rules printed."""
    import transformers

    from lit_embed.hub import KNOWN_ARCHITECTURES

    config = CONFIGS / "experiments" / "hashformers" / "canine_c.yaml"
    report = run_params(config)
    shape = {k: v for k, v in KNOWN_ARCHITECTURES["google/canine-c"].items() if k != "model_type"}
    with torch.device("meta"):
        model = transformers.CanineModel(transformers.CanineConfig(**shape))
    held = sum(p.numel() for p in model.parameters())
    tables = sum(p.numel() for name, p in model.named_parameters() if "HashBucketCodepointEmbedder" in name)
    assert (report["module_total_params"], report["module_embedding_params"]) == (held, 8 * 16384 * 96) == (held, tables)
    assert (human(held), human(tables)) == CANINE_C_MODULES
    assert report["total_params"] == held - (16384 - 2048) * 768
    assert report["embedding_params"] == 16000 * 768
    assert (human(report["total_params"]), human(report["embedding_params"])) == CANINE_C_COUNTED
    assert human(report["baseline_total_params"]) == "124.6M" and human(report["baseline_embedding_params"]) == "38.6M"
    total, embedding, pcr_all, pcr_emb, poep = TABLE_2["canine_c"]
    assert abs(report["total_params"] - counted(total)) < 0.1e6  # 121.07M: CANINE's README says "121M"
    assert embedding == CANINE_C_COUNTED[1]
    for figure, published in (("pcr_all", pcr_all), ("pcr_emb", pcr_emb), ("poep", poep)):
        assert 100 * report[figure] == pytest.approx(published, abs=0.1)  # the paper rounds its counts first
    assert len(report["counting_rules"]) == 2
    assert main(["params", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "121,072,896 (121.1M)" in out and "12,288,000 (12.3M)" in out
    assert "held by the modules  132,082,944 total, 12,582,912 embedding" in out
    assert "only the first 2,048 of 16,384 position rows are trained: 14,336 x 768 are not counted" in out
    assert "HashFormers eq. 10: 16,000 hash buckets x 768 (the tables hold 8 x 16,384 x 96)" in out
    command = f"$ lit-embed params --config {config.relative_to(REPO)}\n"
    shown = page("experiments").split(command, 1)[1].split("```", 1)[0]
    assert shown.splitlines() == out.splitlines()  # the experiments page's output is what params prints


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--model.init_args.embedding.init_args.counted_buckets", "20000"],
         "counted_buckets=20000 must lie in [1, num_buckets=16384]"),
        (["--model.init_args.encoder.init_args.trained_positions", "0"], "trained_positions=0 must lie in [1, 16384]"),
        (["--model.init_args.encoder.init_args.trained_positions", "16385"],
         "trained_positions=16385 must lie in [1, 16384]"),
    ],
    ids=["more buckets counted than held", "no trained positions", "more trained positions than rows"],
)
def test_counting_rules_refuse_figures_the_modules_cannot_hold(extra, message, capsys):
    config = CONFIGS / "experiments" / "hashformers" / "canine_c.yaml"
    assert main(["params", "--config", str(config), *extra]) == 2
    assert message in capsys.readouterr().err


def test_counting_rules_apply_to_any_backbone_and_leave_others_alone():
    """trained_positions is a backbone's rule, not CANINE's: a RoBERTa-shaped encoder counts as its rows say."""
    full = tiny_encoder()
    partial = tiny_encoder(trained_positions=16)
    assert full.num_parameters() == sum(p.numel() for p in full.parameters()) and full.counting_rule() is None
    assert full.num_parameters() - partial.num_parameters() == (66 - 16) * 32
    assert "only the first 16 of 66 position rows are trained" in partial.counting_rule()
    model = ShuffleRandom(partial, embedding=HashProj, baseline_vocab_size=1000)
    assert model.parameter_counts()["total_params"] == model.module_counts()["total_params"] - 50 * 32
    assert len(model.counting_rules()) == 2  # the backbone's, then Appendix B's special rows


def test_canine_takes_the_pretrained_hash_tables_and_embeds_as_transformers_does(tmp_path):
    import transformers

    from lit_embed.models import Encoder

    config = transformers.CanineConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                       max_position_embeddings=256, num_hash_buckets=101)
    torch.manual_seed(0)
    transformers.CanineModel(config).save_pretrained(tmp_path)
    reference = transformers.CanineModel.from_pretrained(tmp_path).char_embeddings
    encoder = Encoder(pretrained=str(tmp_path))
    assert not any("HashBucket" in name for name, _ in encoder.named_parameters())  # the strategy owns them
    strategy = CanineHashEmbedding(None, 32, num_buckets=101)
    assert strategy.load_pretrained(encoder.take_pretrained_word_embeddings())
    codes = [torch.from_numpy(c) for c in strategy.text_encoder(None).encode(["Héllo, 世界 🙂"])][0]
    assert codes.tolist()[:2] == [ord("H"), ord("é")] and len(codes) == 11
    expected = reference._embed_hash_buckets(codes, 32, config.num_hash_functions, 101)
    assert torch.equal(strategy(codes), expected)
    with pytest.raises(ConfigError, match="set num_buckets to the model's num_hash_buckets"):
        CanineHashEmbedding(None, 32).load_pretrained(expected)


def test_canine_c_fine_tunes_on_characters_through_the_cli_and_reports(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = ["fit", "--config", str(CONFIGS / "experiments" / "hashformers" / "canine_c.yaml"),
            "--model.init_args.encoder", TINY_CANINE, "--model.init_args.embedding", TINY_CANINE_TABLES,
            "--model.init_args.baseline_encoder", "null", "--model.init_args.task", "topics",
            "--data.init_args.task", "topics", "--data.init_args.max_length", "96", "--data.init_args.batch_size", "4",
            "--trainer.accelerator", "cpu", "--trainer.precision", "32-true", "--trainer.max_steps", "2",
            "--trainer.limit_val_batches", "1", "--trainer.limit_test_batches", "1", "--trainer.enable_progress_bar", "false"]
    with one_thread():
        assert main(args) == 0
    results = json.loads(next((tmp_path / "runs").rglob("results.json")).read_text())
    assert results["status"] == "complete" and results["paper"] == "hashformers" and results["label"] == "canine_c"
    assert results["parameters"]["embedding_params"] == 8 * 97 * 4
    capsys.readouterr()
    assert main(["report", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    assert "| canine_c |" in out.split("Memory efficiency")[1], out
    assert "| canine_c (topics) |" in out.split("Training and inference speed")[1]


# -- what the strategies compute ----------------------------------------------------------------------


def test_specials_get_their_row_and_words_the_shared_row():
    proj = HashProj(None, 6)
    codes = torch.stack([torch.from_numpy(proj.text_encoder(None).special_code(n)) for n in ("cls", "sep", "pad")]
                        + [hash_codes(proj, ["play"])[0, 0]])
    out = proj(codes)
    table = proj.special.weight
    assert torch.equal(out[0], table[0]) and torch.equal(out[1], table[2])
    assert torch.equal(out[2], table[1]) and table[1].abs().sum() > 0  # <pad>: drawn like every row, as the authors'
    out.sum().backward()
    assert not table.grad[1].any()  # ... and never trained
    bits = unpack_bits(codes[3:, 1:], 128).double()
    assert torch.allclose(out[3], proj.word_vectors(bits)[0].float() + table[5])
    proformer = ProFormerEmbedding(None, 6, hasher=functools.partial(LSHHasher, num_ngrams=50))
    proformer.text_encoder(None).fit(["play the game"])
    word = hash_codes(proformer, ["play"])[0]
    assert torch.allclose(proformer(word), proformer.word_vectors(unpack_bits(word[:, 1:], 420)))  # no shared row


def test_proj_is_the_pearson_correlation_with_each_axis():
    proj = HashProj(None, 5, num_bits=128).double()
    codes = hash_codes(proj, ["play", "plays", "house"])[:, 0]
    bits = unpack_bits(codes[:, 1:], 128).numpy()
    axes = proj.axes.detach().numpy()
    expected = np.array([[np.corrcoef(b, axes[:, j])[0, 1] for j in range(5)] for b in bits])
    got = (proj(codes) - proj.special.weight[5]).detach().numpy()
    assert np.allclose(got, expected)
    assert torch.equal(proj.word_vectors(torch.ones(1, 128, dtype=torch.double)), torch.zeros(1, 5, dtype=torch.double))


def test_add_and_pool_follow_their_equations():
    add = HashAdd(None, 4, num_bits=16).double().eval()
    bits = torch.randint(0, 2, (3, 16))
    manual = sum(torch.where(bits[:, j, None] == 1, add.ones[j], add.zeros[j]) for j in range(16)) / 4.0
    assert torch.allclose(add.word_vectors(bits), manual)
    pool = HashPool(None, 4, num_bits=16, chunk_bits=5).double().eval()  # chunks of 5, 5, 5, 1 bits
    assert pool.codebook.shape == (32, 4) and pool.chunk_weights.shape == (4, 4)
    chunks = pool.chunks(bits)
    for row in range(3):
        text = "".join(map(str, bits[row].tolist()))
        assert chunks[row].tolist() == [int(text[0:5], 2), int(text[5:10], 2), int(text[10:15], 2), int(text[15:], 2)]
    weights = pool.chunk_weights.softmax(0)
    manual = sum(weights[j] * pool.codebook[chunks[:, j]] for j in range(4))
    assert torch.allclose(pool.word_vectors(bits), manual)



@pytest.mark.parametrize("shape", [(3,), (4, 20)], ids=["fewer words than codebook rows", "more words than codebook rows"])
def test_pool_computes_its_equation_and_gradients_at_every_batch_size(shape):
    pool = HashPool(None, 4, num_bits=16, chunk_bits=5).double().eval()  # 2^5 = 32 codebook rows
    bits = torch.randint(0, 2, (*shape, 16))
    chunks = pool.chunks(bits)
    weights = pool.chunk_weights.softmax(0)
    manual = sum(weights[j] * pool.codebook[chunks[..., j]] for j in range(4))
    grad = torch.randn_like(manual)
    expected = torch.autograd.grad(manual, [pool.codebook, pool.chunk_weights], grad)
    vectors = pool.word_vectors(bits)
    assert vectors.shape == (*shape, 4) and torch.allclose(vectors, manual)
    for got, want in zip(torch.autograd.grad(vectors, [pool.codebook, pool.chunk_weights], grad), expected):
        assert torch.allclose(got, want)

def test_pooled_chunks_pass_gradcheck_and_give_what_is_asked():
    """Pool's pooling as one autograd Function (a gather per chunk, gathered again in the backward): its gradients
    are the finite differences', and it computes none for an input that needs none."""
    from lit_embed.embeddings.hashformer import PooledChunks

    generator = torch.Generator().manual_seed(0)
    chunks = torch.randint(0, 8, (11, 3), generator=generator)
    codebook = torch.randn(8, 5, dtype=torch.double, generator=generator, requires_grad=True)
    weights = torch.randn(3, 5, dtype=torch.double, generator=generator, requires_grad=True)
    assert torch.autograd.gradcheck(PooledChunks.apply, (chunks, codebook, weights))
    frozen = weights.detach()
    (grad,) = torch.autograd.grad(PooledChunks.apply(chunks, codebook, frozen).sum(), [codebook])
    assert torch.allclose(grad, torch.zeros_like(codebook).index_add_(0, chunks.reshape(-1), frozen.repeat(11, 1)))


def test_add_drops_weights_not_activations_with_a_new_mask_each_training_step():
    """DropConnect as the authors' DropoutLinear: one mask over each map's weights per forward, shared by every word of
    the batch, the kept weights scaled by 1/(1 - p); a fresh mask each step; none in evaluation."""
    add = HashAdd(None, 8, num_bits=16).double()
    assert add.training and add.drop_connect == 0.1
    bits = torch.randint(0, 2, (1, 16)).repeat(3, 1)  # one word three times
    torch.manual_seed(7)
    first = add.word_vectors(bits)
    assert torch.equal(first[0], first[1]) and torch.equal(first[0], first[2])  # dropped activations would differ
    torch.manual_seed(7)
    ones, zeros = (torch.nn.functional.dropout(w, 0.1, True) for w in (add.ones, add.zeros))
    for dropped, weight in ((ones, add.ones), (zeros, add.zeros)):
        kept = dropped != 0
        assert torch.allclose(dropped[kept], weight[kept] / 0.9) and 0.05 < (~kept).double().mean() < 0.15
    b = bits.double()
    assert torch.allclose(first, (b @ ones + (1 - b) @ zeros) / 4.0)
    assert not torch.equal(add.word_vectors(bits), first)  # the next step draws another mask
    add.eval()
    b = bits.double()
    expected = (b @ add.ones + (1 - b) @ add.zeros) / 4.0
    assert torch.allclose(add.word_vectors(bits), expected) and torch.equal(add.word_vectors(bits), add.word_vectors(bits))
    assert HashAdd(None, 8, num_bits=16, drop_connect=0.0).word_vectors(bits).unique(dim=0).shape[0] == 1


def _pool_codes(words: int, tokens: int, num_bits: int = 16, seed: int = 0) -> torch.Tensor:
    """``tokens`` codes of ``words`` distinct words (specials among them) for Pool with T = ``num_bits``."""
    from lit_embed.embeddings.hash_text import pack_bits

    generator = torch.Generator().manual_seed(seed)
    packed = torch.as_tensor(pack_bits(torch.randint(0, 2, (words, num_bits), generator=generator).numpy()))
    codes = torch.cat([torch.full((tokens, 1), 5), packed[torch.randint(0, words, (tokens,), generator=generator)]], 1)
    codes[::5, 0] = torch.randint(0, 5, (len(codes[::5]),), generator=generator)
    return codes


def _pool_with_mask(pool: HashPool, codes: torch.Tensor, drop: torch.Tensor) -> torch.Tensor:
    """Pool's training vectors written out: dropout with the given mask over each word's gathered, weighted
    codebook rows (``words x chunks x d``), the kept terms scaled by 1/(1 - p), plus the special rows."""
    words = codes[:, 0] == 5
    chunks = pool.chunks(unpack_bits(codes[words, 1:], pool.num_bits))
    terms = pool.codebook[chunks] * pool.chunk_weights.softmax(0) * ~drop / (1 - pool.dropout)
    vectors = pool.special(codes[:, 0])
    return vectors.index_put((words.nonzero().squeeze(1),), terms.sum(1), accumulate=True)


@pytest.mark.parametrize("words", [6, 40], ids=["fewer words than codebook rows", "more words than codebook rows"])
def test_pool_dropout_equals_dropout_on_the_gathered_terms_with_the_same_mask(words):
    """Pool's training forward and gradients are those of dropout applied to each word's gathered codebook terms, with
    the mask its seeded draw picks (the dropped terms' positions); two draws differ, one seed repeats."""
    from lit_embed.embeddings.hashformer import bernoulli_positions

    pool = HashPool(None, 8, num_bits=16, chunk_bits=5, dropout=0.3).double()  # 4 chunks of 32 rows; 40 > 32 words
    codes = _pool_codes(words, 300)
    grad = torch.randn(300, 8, dtype=torch.double)
    torch.manual_seed(3)
    vectors = pool(codes)
    mine = torch.autograd.grad(vectors, list(pool.parameters()), grad)
    torch.manual_seed(3)
    words_in = int((codes[:, 0] == 5).sum())
    drop = torch.zeros(words_in * 4 * 8, dtype=torch.bool)
    drop[bernoulli_positions(len(drop), 0.3)] = True
    expected = _pool_with_mask(pool, codes, drop.view(words_in, 4, 8))
    torch.testing.assert_close(vectors, expected)
    for got, want in zip(mine, torch.autograd.grad(expected, list(pool.parameters()), grad)):
        torch.testing.assert_close(got, want)
    torch.manual_seed(3)
    assert torch.equal(pool(codes), vectors) and not torch.equal(pool(codes), vectors)  # seeded: repeats; next: new mask
    assert vectors[codes[:, 0] != 5].equal(pool.special(codes[codes[:, 0] != 5, 0]))  # specials: their row, no dropout


def test_pool_dropout_drops_each_term_independently_with_probability_p_and_keeps_the_expectation():
    """Over many seeded draws: each (token, chunk, dimension) term is dropped with probability p, a pair of terms both
    with p^2 (independent), the number dropped per draw is binomial; the mean vector converges to the evaluation one."""
    from lit_embed.embeddings.hashformer import bernoulli_positions

    total, p, draws = 1000, 0.1, 2000
    torch.manual_seed(0)
    masks = torch.zeros(draws * total, dtype=torch.bool)
    masks[bernoulli_positions(draws * total, p)] = True  # the same stream as 2000 draws of 1000 terms
    masks = masks.view(draws, total)
    frequency = masks.double().mean(0)  # each term's drop rate: binomial(2000, 0.1), sd 0.0067
    assert (frequency - p).abs().max() < 6 * math.sqrt(p * (1 - p) / draws)
    assert abs(frequency.mean() - p) < 4 * math.sqrt(p * (1 - p) / (draws * total))
    both = (masks[:, :-1] & masks[:, 1:]).double().mean()  # neighbours: the gap distribution's first term
    assert abs(both - p * p) < 6 * math.sqrt(p * p / (draws * total))
    counts = masks.sum(1).double()
    assert abs(counts.var() / (total * p * (1 - p)) - 1) < 0.15

    pool, rounds = HashPool(None, 4, num_bits=16, chunk_bits=5, dropout=0.2).double(), 400
    codes = _pool_codes(6, 30)
    with torch.no_grad():
        mean = sum(pool(codes) for _ in range(rounds)) / rounds
        evaluated = pool.eval()(codes)
        words = codes[:, 0] == 5
        terms = pool.codebook[pool.chunks(unpack_bits(codes[:, 1:], 16))] * pool.chunk_weights.softmax(0)
        spread = (0.2 / 0.8 * (terms**2).sum(1) / rounds).sqrt() * words.unsqueeze(1)  # sd of the mean of a value
    assert ((mean - evaluated).abs() <= 6 * spread + 1e-12).all() and (spread > 0).any()
    assert not torch.equal(pool.train()(codes), evaluated) and torch.equal(pool.eval()(codes), evaluated)


@requires_gpus()
def test_pool_dropout_on_a_gpu_is_one_mask_over_the_gathered_terms_without_a_host_sync():
    pool = HashPool(None, 8, num_bits=16, chunk_bits=5, dropout=0.3).double().cuda()
    codes = _pool_codes(40, 300).cuda()
    torch.manual_seed(3)
    torch.cuda.set_sync_debug_mode("error")
    try:
        vectors = pool(codes)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.manual_seed(3)
    drop = torch.rand(300, 4, 8, device="cuda") < 0.3  # the draw the GPU path makes, over every token
    torch.testing.assert_close(vectors, _pool_with_mask(pool, codes, drop[codes[:, 0] == 5]))


@pytest.mark.parametrize("total", [1, 7, 100_000])
@pytest.mark.parametrize("p", [1e-6, 0.5, 0.99])
def test_bernoulli_positions_are_ascending_distinct_and_inside(total, p):
    from lit_embed.embeddings.hashformer import bernoulli_positions

    torch.manual_seed(1)
    positions = bernoulli_positions(total, p, torch.int32)
    assert positions.dtype == torch.int32 and len(positions.unique()) == len(positions)
    assert (positions.diff() > 0).all() and (len(positions) == 0 or 0 <= positions[0] <= positions[-1] < total)
    if total == 100_000:
        assert abs(len(positions) - total * p) <= 6 * math.sqrt(total * p * (1 - p)) + 1


@pytest.mark.parametrize(("strategy", "extra"), [
    (functools.partial(HashAdd, drop_connect=1.0), "drop_connect=1.0 must lie in [0, 1)"),
    (functools.partial(HashPool, dropout=-0.1), "dropout=-0.1 must lie in [0, 1)"),
])
def test_dropout_probabilities_outside_0_1_are_refused(strategy, extra):
    with pytest.raises(ConfigError, match=re.escape(extra)):
        strategy(None, 8)


def truncated_normal_std(std: float = 0.02) -> float:
    """The standard deviation of a normal of ``std`` cut at +-2 ``std``: 0.88 ``std``."""
    density, mass = math.exp(-2.0) / math.sqrt(2 * math.pi), math.erf(math.sqrt(2.0))
    return std * math.sqrt(1 - 2 * 2 * density / mass)


@pytest.mark.parametrize("strategy", [HashEmbedding, HashPool, HashAdd, HashProj, ProFormerEmbedding])
def test_hash_layers_start_from_the_authors_truncated_normal(strategy):
    emb = strategy(None, 256)
    for name, weight in emb.named_parameters():
        assert weight.abs().max() <= 0.04, name  # nothing beyond the truncation bound
        assert weight.std().item() == pytest.approx(truncated_normal_std(), rel=0.05), name


def test_truncated_normal_init_draws_the_whole_model_but_what_it_loads(tmp_path):
    import transformers

    from lit_embed.models import Encoder, SequenceClassifier

    torch.manual_seed(0)
    default = ShuffleRandom(tiny_encoder(hidden=64), vocab_size=5000)
    assert default.encoder.model.encoder.layer[0].intermediate.dense.weight.abs().max() > 0.04  # HuggingFace's normal
    model = ShuffleRandom(tiny_encoder(hidden=64), vocab_size=5000, init="truncated_normal")
    matrices = {name: p for name, p in model.named_parameters() if p.dim() >= 2}
    assert {"embedding.weight", "head.weight", "encoder.model.embeddings.position_embeddings.weight"} <= set(matrices)
    values = torch.cat([p.detach().flatten() for p in matrices.values()])
    assert values.abs().max() <= 0.04 and values.std().item() == pytest.approx(truncated_normal_std(), rel=0.02)
    assert model.encoder.model.embeddings.position_embeddings.weight[1].abs().sum() > 0  # its padding row too
    assert not model.head.bias.any()
    norms = [m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]
    assert norms and all(bool((m.weight == 1).all() and not m.bias.any()) for m in norms)
    # A pretrained encoder keeps its weights; only the new head is drawn.
    config = transformers.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=40)
    transformers.BertModel(config).save_pretrained(tmp_path)
    reference = transformers.BertModel.from_pretrained(tmp_path).state_dict()
    loaded = SequenceClassifier("sst2", encoder=Encoder(pretrained=str(tmp_path)), vocab_size=50, init="truncated_normal")
    for name, value in loaded.encoder.model.state_dict().items():
        assert torch.equal(value, reference[name]), name
    assert torch.equal(loaded.embedding.weight, reference["embeddings.word_embeddings.weight"])
    head = loaded.classifier[1].weight
    assert head.abs().max() <= 0.04 and not loaded.classifier[1].bias.any()
    with pytest.raises(ConfigError, match="init='xavier' is not a scheme"):
        ShuffleRandom(tiny_encoder(), vocab_size=50, init="xavier")


def test_emb_rows_are_the_specials_then_the_buckets():
    emb = HashEmbedding(None, 4, num_buckets=50265)
    codes = hash_codes(emb, ["hello"])
    assert codes.tolist() == [[46797]]
    assert torch.equal(emb(codes)[0, 0], emb.weight[46797])
    assert torch.equal(emb(torch.tensor([2])), emb.weight[2:3])


@pytest.mark.parametrize("strategy", [HashEmbedding, HashPool, HashAdd, HashProj, ProFormerEmbedding])
def test_every_parameter_learns_through_shuffle_random(strategy):
    lsh = functools.partial(LSHHasher, num_ngrams=200)
    factory = functools.partial(strategy, hasher=lsh) if strategy is ProFormerEmbedding else strategy
    model = ShuffleRandom(tiny_encoder(), embedding=factory, baseline_vocab_size=1000)
    encoder = model.text_encoder(None)
    if not encoder.fitted:
        encoder.fit(["the play was played by the players of the house"])
    codes = encoder.encode(["the play was played by the players of the house and a garden"] * 8)
    items = [{"codes": np.concatenate([encoder.special_code("cls")[None], c, encoder.special_code("sep")[None]])}
             for c in codes]
    torch.manual_seed(0)
    batch = model.collator(encoder)(items)
    loss, logits, targets = model(batch)
    assert logits.shape == (len(targets), 3) and torch.isfinite(loss)
    loss.backward()
    unused = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum()]
    assert [n for n in unused if ".pooler." not in n] == []


# -- Shuffle+Random corruption ------------------------------------------------------------------------


class IdCodes:
    """Vocabulary ids with RoBERTa's specials, without a tokenizer."""

    def special_code(self, name):
        return np.asarray({"cls": 0, "pad": 1, "sep": 2, "mask": 4, "unk": 3}[name])


def test_shuffle_random_labels_and_rates():
    collate = ShuffleRandomCollator(IdCodes(), functools.partial(torch.randint, 1000, 2000), prob=0.10)
    torch.manual_seed(0)
    items = [{"codes": np.r_[0, np.arange(10, 210), 2]} for _ in range(60)]  # token value = 10 + position - 1
    items.append({"codes": np.r_[0, np.arange(10, 20), 2]})  # a short row: its tail is padding
    batch = collate(items)
    codes, labels, special = batch["codes"], batch["labels"], batch["special_mask"]
    original = torch.full_like(codes, 1)
    original[:, 0] = 0
    original[:60, 1:201] = torch.arange(10, 210)
    original[:60, 201] = 2
    original[60, 1:11], original[60, 11] = torch.arange(10, 20), 2
    assert (labels[special] == -100).all() and (labels[~special] >= 0).all()
    body = labels[:60][~special[:60]]
    assert 0.08 < (body == 1).float().mean() < 0.12  # shuffled: p
    assert 0.07 < (body == 2).float().mean() < 0.11  # random: p of the rest, 0.09
    assert torch.equal(codes[labels == 0], original[labels == 0])
    assert ((codes[labels == 2] >= 1000) & (codes[labels == 2] < 2000)).all()
    # One permutation per batch: a shuffled position takes the same source position in every row.
    moved = (labels[:60] == 1) & (codes[:60] != original[:60])
    sources = {}
    for row, position in moved.nonzero().tolist():
        assert sources.setdefault(position, int(codes[row, position])) == int(codes[row, position])
    # In the short row, a position shuffled from beyond its end keeps its own token (specials are put back).
    short = (labels[60] == 1).nonzero().flatten().tolist()
    for position in short:
        value = int(codes[60, position])
        assert value == int(original[60, position]) or 10 <= value < 20


def test_shuffle_random_draws_random_tokens_in_code_space():
    for strategy in (HashProj(None, 8), HashEmbedding(None, 8, num_buckets=1000)):
        encoder = strategy.text_encoder(None)
        codes = encoder.encode(["one two three four five six seven eight nine ten " * 20])[0]
        cls, sep = encoder.special_code("cls")[None], encoder.special_code("sep")[None]
        batch = ShuffleRandomCollator(encoder, strategy.code_sampler())([{"codes": np.concatenate([cls, codes, sep])}] * 40)
        drawn = batch["codes"][batch["labels"] == 2]
        if isinstance(strategy, HashProj):
            assert drawn.shape[1:] == (3,) and (drawn[:, 0] == 5).all()
            assert unpack_bits(drawn[:, 1:], 128).float().mean().item() == pytest.approx(0.5, abs=0.02)
        else:
            assert ((drawn >= 5) & (drawn < 1000)).all()


def test_bert_sr_is_shuffle_random_over_vocabulary_ids(minilm_path):
    model = ShuffleRandom(tiny_encoder(), vocab_size=30522)
    assert isinstance(model.embedding, DenseEmbedding)
    encoder = model.text_encoder(minilm_path)
    assert isinstance(encoder, VocabTextEncoder)
    ids = encoder.encode(["shuffle and random tokens make a cheap objective"] * 4)
    batch = model.collator(encoder)([{"codes": np.r_[101, i, 102]} for i in ids])
    loss, _, _ = model(batch)
    assert torch.isfinite(loss)
    with pytest.raises(ValueError, match="prob=1.5"):
        ShuffleRandom(tiny_encoder(), vocab_size=30522, prob=1.5)


def test_shuffle_random_beats_always_original_on_held_out_text():
    """S+R learns something real on the shipped corpus: held-out accuracy above the always-"original" rate."""
    from lit_embed.data.sources import SAMPLES

    torch.manual_seed(0)
    model = ShuffleRandom(tiny_encoder(), embedding=HashProj, baseline_vocab_size=50265)
    encoder = model.text_encoder(None)
    stream = np.concatenate(encoder.encode(SAMPLES["sample-corpus"].read_text().splitlines()))
    cls, sep = encoder.special_code("cls")[None], encoder.special_code("sep")[None]
    blocks = [np.concatenate([cls, stream[i : i + 62], sep]) for i in range(0, len(stream) - 62, 62)]
    train, held_out = blocks[:-160], blocks[-160:]
    collate = model.collator(encoder)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    rng = np.random.default_rng(0)
    with one_thread():
        for _ in range(150):
            loss, _, _ = model(collate([{"codes": train[i]} for i in rng.integers(len(train), size=16)]))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            results = [model(collate([{"codes": b} for b in held_out[i : i + 16]])) for i in range(0, 160, 16)]
    logits = torch.cat([r[1] for r in results])
    targets = torch.cat([r[2] for r in results])
    accuracy, original = (logits.argmax(-1) == targets).float().mean(), (targets == 0).float().mean()
    assert accuracy > original + 0.02, (accuracy, original)


# -- the demo, the CLI, checkpoints -----------------------------------------------------------------------


def test_demo_runs_with_fast_dev_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with one_thread():
        assert main(["fit", "--config", str(DEMO), "--trainer.fast_dev_run", "true"]) == 0


def run_demo(tmp_path: Path, *extra: str) -> Path:
    with one_thread():
        return fit_demo(tmp_path, *extra, config=DEMO)


def scalars(tmp_path: Path, tag: str) -> list[float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(next(tmp_path.rglob("events.out.tfevents*")).parent))
    events.Reload()
    return [s.value for s in events.Scalars(tag)]


def test_lsh_checkpoint_restores_the_hasher_and_its_ngram_vocabulary(tmp_path):
    ckpt = run_demo(tmp_path, "--model.init_args.embedding", str(CONFIGS / "embedding" / "lsh_proj.yaml"),
                    "--trainer.max_steps", "3", "--trainer.val_check_interval", "3", "--trainer.limit_val_batches", "1")
    artefact = next(tmp_path.rglob("lsh_ngrams.json"))
    ngrams = json.loads(artefact.read_text())["ngrams"]
    assert "the" in ngrams and len(ngrams) == len(set(ngrams)) > 300
    state = torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]
    restored = ShuffleRandom.load_from_checkpoint(ckpt, map_location="cpu").eval()
    hasher = restored.embedding.hasher
    assert hasher.fitted and hasher.ngrams() == ngrams
    for name in ("eta", "ngram_bytes", "ngram_ends"):
        assert torch.equal(getattr(hasher, name), state[f"embedding.hasher.{name}"])
    text = ["The gardener plays with unseen words like zyxwv."]
    encoder = restored.text_encoder(None)
    assert encoder.fitted
    codes = torch.from_numpy(np.concatenate(encoder.encode(text)))[None]
    again = ShuffleRandom.load_from_checkpoint(ckpt, map_location="cpu").eval()
    assert torch.equal(codes, torch.from_numpy(np.concatenate(again.text_encoder(None).encode(text)))[None])
    batch = {"codes": codes, "attention_mask": torch.ones(codes.shape[:2], dtype=torch.long)}
    with torch.no_grad():
        assert torch.equal(restored.encode(batch).last_hidden_state, again.encode(batch).last_hidden_state)


def test_a_hashformer_fine_tuned_from_its_checkpoint_alone_is_counted_against_its_baseline(tmp_path, monkeypatch):
    """A sweep's fine-tuning gives only the pre-training checkpoint (backbone, strategy and vocabulary unset): a hash
    strategy has no vocabulary, so the dense baseline its figures compare with comes from the checkpoint too."""
    monkeypatch.chdir(tmp_path)
    ckpt = run_demo(tmp_path / "pretrain", "--trainer.max_steps", "2", "--trainer.val_check_interval", "2",
                    "--trainer.limit_val_batches", "1")
    args = ["fit", "--config", str(CONFIGS / "demo_finetune.yaml"), "--model.init_args.checkpoint", str(ckpt),
            "--model.init_args.encoder", "null", "--model.init_args.embedding", "null", "--model.init_args.vocab_size", "null",
            "--trainer.max_steps", "2", "--trainer.val_check_interval", "2", "--trainer.limit_val_batches", "1",
            "--trainer.limit_test_batches", "1", "--trainer.default_root_dir", str(tmp_path / "finetune"),
            "--trainer.enable_progress_bar", "false"]
    with one_thread():
        assert main(args) == 0
    results = json.loads(next((tmp_path / "finetune").rglob("results.json")).read_text())
    assert results["strategy"] == "HashProj" and results["parameters"]["baseline_embedding_params"] == 50265 * 64
    finetuned = torch.load(next((tmp_path / "finetune").rglob("*.ckpt")), map_location="cpu", weights_only=False)
    assert finetuned["hyper_parameters"]["baseline_vocab_size"] == 50265  # the fine-tuned checkpoint rebuilds alone


@pytest.mark.slow
def test_full_demo_accuracy_beats_always_original(tmp_path):
    run_demo(tmp_path)
    accuracy, original = scalars(tmp_path, "val/accuracy")[-1], scalars(tmp_path, "val/original_rate")[-1]
    assert accuracy > original + 0.03, (accuracy, original)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--model.init_args.embedding.init_args.num_bits", "0"], "num_bits=0 must be a positive number of hash bits (T)"),
        (["--model.init_args.embedding", str(CONFIGS / "embedding" / "md5_pool.yaml"),
          "--model.init_args.embedding.init_args.chunk_bits", "200"], "chunk_bits k=200 must lie between 1 and num_bits T=128"),
        (["--model.init_args.embedding", str(CONFIGS / "embedding" / "md5_emb1k.yaml"),
          "--model.init_args.embedding.init_args.num_buckets", "0"], "num_buckets=0 leaves no bucket for words"),
        (["--model.init_args.vocab_size", "30522"], "vocab_size must be unset (got 30522)"),
    ],
)
def test_bad_hash_arguments_exit_non_zero_with_the_fix(extra, message, capsys):
    assert main(["params", "--config", str(DEMO), *extra]) == 2
    assert message in capsys.readouterr().err


def test_proformer_trains_from_scratch_on_a_task_from_its_config(tmp_path, monkeypatch):
    """The experiment file as users run it, on local SST-2 files in the hub's layout: LSH n-grams
    fitted on the task's text, fit and test, results.json with its Table 2 figures."""
    import json

    from lit_embed.data.tasks import get_task
    from tests.helpers.tasks import write_task

    monkeypatch.chdir(tmp_path)
    data = write_task(tmp_path / "glue", get_task("sst2"), "parquet")
    args = ["fit", "--config", str(CONFIGS / "experiments" / "hashformers" / "proformer.yaml"),
            "--data.init_args.data_dir", str(data), "--trainer.accelerator", "cpu", "--trainer.precision", "32-true",
            "--trainer.max_epochs", "1", "--trainer.default_root_dir", str(tmp_path), "--trainer.enable_progress_bar", "false"]
    assert main(args) == 0
    results = json.loads(next(tmp_path.rglob("results.json")).read_text())
    assert "test/accuracy" in results["metrics"]
    assert round(100 * results["parameters"]["pcr_all"], 1) == 87.8
    assert next(tmp_path.rglob("lsh_ngrams.json")).stat().st_size > 0


def _repeating_codes(num_bits: int, tokens: int = 600, words: int = 90) -> torch.Tensor:
    """Codes of text-like batches: ``tokens`` drawn from ``words`` distinct words, with specials among them."""
    from lit_embed.embeddings.hash_text import pack_bits

    generator = torch.Generator().manual_seed(0)
    packed = torch.as_tensor(pack_bits(torch.randint(0, 2, (words, num_bits), generator=generator).numpy()))
    codes = torch.cat([torch.full((tokens, 1), 5), packed[torch.randint(0, words, (tokens,), generator=generator)]], 1)
    codes[::7, 0] = torch.randint(0, 5, (len(codes[::7]),), generator=generator)  # specials: their row, bits ignored
    return codes.view(6, tokens // 6, -1)


@pytest.mark.parametrize("cls", [HashProj, HashAdd, HashPool, ProFormerEmbedding], ids=lambda cls: cls.__name__)
@pytest.mark.parametrize("training", [False, True])
def test_vectors_once_per_distinct_code_equal_those_of_every_token(cls, training):
    """Real text repeats its words: each distinct code's vector is computed once and gathered back, with the outputs
    and gradients of the per-token computation (to fp32 rounding); Pool's dropout then takes the same draw away."""
    strategy = cls(None, 48).train(training)
    codes = _repeating_codes(strategy.num_bits)
    grad = torch.randn(*codes.shape[:-1], 48)
    results = []
    for distinct in (True, False):
        strategy.zero_grad()
        torch.manual_seed(1)  # the same dropout draws
        out = strategy(codes) if distinct else strategy._vectors(codes)
        if not distinct and training and cls is HashPool:
            out = out - strategy.dropped(codes)
        (out * grad).sum().backward()
        results.append((out.detach(), {n: p.grad.clone() for n, p in strategy.named_parameters() if p.grad is not None}))
    (mine, mine_grads), (theirs, their_grads) = results
    torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)
    assert mine_grads.keys() == their_grads.keys()
    for name in mine_grads:  # sums in another order: fp32 rounding of the largest (the shared row 5 sums every word's)
        difference = (mine_grads[name] - their_grads[name]).abs().max()
        assert difference <= 1e-5 * their_grads[name].abs().max(), (name, difference)


@pytest.mark.parametrize("cls", [HashProj, HashAdd, ProFormerEmbedding], ids=lambda cls: cls.__name__)
def test_the_word_mask_and_special_rows_fused_into_the_product_give_the_unfused_vectors_and_gradients(cls):
    """features x mask, then addmm with the special rows: the vectors of word_vectors(bits) x mask + special(row),
    specials' (shared row left out for ProFormer) included; their gradients, the padding row's none."""
    strategy = cls(None, 16).double().eval()
    codes = _repeating_codes(strategy.num_bits).reshape(-1, 3 if strategy.num_bits <= 128 else 8)
    row = codes[:, 0]
    is_word = (row == 5).unsqueeze(-1)
    special = strategy.special(row)
    if cls is ProFormerEmbedding:
        special = special.masked_fill(is_word, 0.0)
    expected = strategy.word_vectors(unpack_bits(codes[:, 1:], strategy.num_bits)) * is_word + special
    fused = strategy._vectors(codes)
    grad = torch.randn_like(fused)
    params = list(strategy.parameters())
    torch.testing.assert_close(fused, expected)
    grads = torch.autograd.grad(fused, params, grad)
    for got, want in zip(grads, torch.autograd.grad(expected, params, grad)):
        torch.testing.assert_close(got, want)
    special_grad = grads[[name for name, _ in strategy.named_parameters()].index("special.weight")]
    assert (row == 1).any() and not special_grad[1].any() and special_grad[0].any()  # padding row 1: never trained


def test_distinct_rows_are_torch_unique_s():
    from lit_embed.embeddings.hashformer import distinct_rows

    codes = _repeating_codes(128).reshape(-1, 3)
    rows, inverse = distinct_rows(codes)
    expected, expected_inverse = torch.unique(codes, dim=0, return_inverse=True)
    assert torch.equal(rows, expected) and torch.equal(inverse, expected_inverse)
    assert torch.equal(rows[inverse], codes) and len(rows) < len(codes) / 3

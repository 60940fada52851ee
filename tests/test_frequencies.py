"""Real token frequencies (issue 35 item 4): a strategy that ranks tokens by frequency (mixed dimension's blocks) takes
the training data's counts, counted by lit-embed before the model is built and cached beside the run; a count file
when given; the tokenizer's id order only when asked for by name."""

from __future__ import annotations

import itertools
import json
import re

import numpy as np
import pytest
import torch

from lit_embed.commands.lightning import LitEmbedCLI
from lit_embed.compress.methods import Job, method_named
from lit_embed.data import frequencies
from lit_embed.embeddings import MixedDimensionEmbedding
from lit_embed.embeddings.text import VocabTextEncoder
from lit_embed.errors import ConfigError
from tests.conftest import CONFIGS

#: Three words WordPiece keeps whole, far from the start of its ids, made the corpus's most frequent, in this order.
FREQUENT = ["zebra", "quartz", "violin"]


def write_corpus(path, extra: str = "") -> None:
    lines = [" ".join(["zebra"] * 9 + ["quartz"] * 6 + ["violin"] * 3) for _ in range(40)]
    lines += ["the cat sat on a mat", extra]
    path.write_text("\n".join(line for line in lines if line) + "\n")


def build(corpus, *more: str) -> LitEmbedCLI:
    """The demo's model with mixed dimension (its YAML: frequencies: data) on ``corpus``, built as fit builds it."""
    return LitEmbedCLI(args=["--config", str(CONFIGS / "demo.yaml"), "--model.init_args.embedding",
                             str(CONFIGS / "embedding/mixed_dimension.yaml"), "--data.init_args.files", f"[{corpus}]",
                             "--trainer.logger", "false", "--trainer.callbacks", "[]", *more], run=False)


def ids_of(words: list[str]) -> list[int]:
    encoder = VocabTextEncoder("all-MiniLM-L6-v2")
    return [int(encoder.encode([word])[0][0]) for word in words]


def test_the_training_datas_most_frequent_tokens_land_in_the_widest_block_and_the_count_is_kept_beside_the_run(
        tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_corpus(tmp_path / "corpus.txt")
    cli = build("corpus.txt")
    strategy = cli.model.embedding
    frequent = ids_of(FREQUENT)
    assert strategy.block_of[frequent].tolist() == [0, 0, 0] and strategy.row_of[frequent].tolist() == [0, 1, 2]
    assert strategy.block_dims[0] == max(strategy.block_dims) == 64  # the widest: base_dim, the hidden size
    (counted,) = (tmp_path / "runs/demo").glob("token_counts-*.txt")
    counts = np.array([int(line) for line in counted.read_text().split()])
    encoder = VocabTextEncoder("all-MiniLM-L6-v2")
    texts = (tmp_path / "corpus.txt").read_text().splitlines()
    expected = np.bincount(np.concatenate(encoder.encode(texts)), minlength=30522)
    assert np.array_equal(counts, expected) and counts[frequent].tolist() == [360, 240, 120]
    # the run's config names the file it used; the strategy's own config needs none (its buffers hold the ranking)
    assert cli.config.model.init_args.embedding.init_args.frequencies == str(counted.relative_to(tmp_path))
    assert strategy.config()["init_args"]["frequencies"] is None
    # id order, by name: the ids ranked as they come
    by_id = build("corpus.txt", "--model.init_args.embedding.init_args.frequencies", "id_order").model.embedding
    assert torch.equal(by_id.block_of, torch.sort(by_id.block_of).values) and by_id.row_of[:3].tolist() == [0, 1, 2]


def test_the_cached_count_is_reused_and_another_corpus_or_a_damaged_file_is_counted_again(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_corpus(tmp_path / "corpus.txt")
    first = build("corpus.txt").model.embedding
    (cached,) = (tmp_path / "runs/demo").glob("token_counts-*.txt")

    def refuse(*_args, **_kwargs):
        raise AssertionError("counted again")

    with monkeypatch.context() as patch:
        patch.setattr(frequencies, "count_tokens", refuse)
        again = build("corpus.txt").model.embedding  # resumed, or another run of the experiment: the file is read
    assert torch.equal(again.block_of, first.block_of) and torch.equal(again.row_of, first.row_of)

    cached.write_text("1\n2\n")  # damaged: counted again, and written whole
    build("corpus.txt")
    assert len(cached.read_text().split()) == 30522

    write_corpus(tmp_path / "corpus.txt", extra=" ".join(["violin"] * 1000))  # another corpus under the same name
    edited = build("corpus.txt").model.embedding
    assert len(list((tmp_path / "runs/demo").glob("token_counts-*.txt"))) == 2  # its own key: never the old counts
    assert edited.row_of[ids_of(["violin"])].tolist() == [0]


def test_a_given_count_file_is_honoured_and_nothing_is_counted(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_corpus(tmp_path / "corpus.txt")
    counts = np.zeros(30522, dtype=int)
    counts[ids_of(["cat", "mat"])] = [5, 9]
    given = tmp_path / "my_counts.txt"
    given.write_text("\n".join(map(str, counts)) + "\n")
    monkeypatch.setattr(frequencies, "count_tokens", lambda *a, **k: pytest.fail("counted"))
    strategy = build("corpus.txt", "--model.init_args.embedding.init_args.frequencies", str(given)).model.embedding
    assert strategy.row_of[ids_of(["mat", "cat"])].tolist() == [0, 1] and not list(tmp_path.glob("runs/demo/token_counts-*"))


def test_frequencies_from_the_data_are_never_silently_id_order():
    """Built outside a run (in Python, where no data is counted), ``frequencies: data`` (the default) is refused, naming
    what to give; ``None`` ranks by nothing unless a checkpoint's widths come with it."""
    with pytest.raises(ConfigError, match=re.escape("frequencies='data': the training data's token counts are counted by "
                                                    "lit-embed fit")):
        MixedDimensionEmbedding(300, 12)
    with pytest.raises(ConfigError, match="frequencies=None ranks by nothing: give 'data'"):
        MixedDimensionEmbedding(300, 12, frequencies=None)
    assert MixedDimensionEmbedding(300, 12, frequencies=None, num_blocks=2, block_dims=[4, 2]).block_dims == [4, 2]


def test_fitting_mixed_dimension_post_hoc_ranks_by_the_datas_counts():
    """compress --method fit with the mixed-dimension YAML (frequencies: data): the job's counts rank the blocks."""
    vocab, hidden = 120, 8
    counts = torch.zeros(vocab, dtype=torch.long)
    counts[[100, 7, 55]] = torch.tensor([30, 20, 10])
    method = method_named("fit", {"strategy": str(CONFIGS / "embedding/mixed_dimension.yaml"), "max_steps": 1})
    job = Job(torch.randn(vocab, hidden), torch.arange(vocab), None, counts)
    method.check(job)
    (strategy,) = method.fit(job).values()
    assert strategy.block_of[[100, 7, 55]].tolist() == [0, 0, 0] and strategy.row_of[[100, 7, 55]].tolist() == [0, 1, 2]
    with pytest.raises(ConfigError, match="ranks tokens by the data's counts .frequencies: data. and none were counted"):
        method.check(Job(torch.randn(vocab, hidden), torch.arange(vocab)))


def test_compress_takes_a_count_file_in_place_of_counting_the_data(tmp_path, monkeypatch):
    """`lit-embed compress --frequencies FILE`: the sparse-coding split keeps the file's most frequent tokens (and the
    specials), not the data's; a file that is not one count per id is refused by name, before anything is written."""
    from lit_embed.commands import compress, main

    monkeypatch.chdir(tmp_path)
    counts = np.zeros(30522, dtype=int)
    frequent = ids_of(["zebra", "quartz", "violin"])
    counts[frequent] = [3, 2, 1]
    given = tmp_path / "counts.txt"
    given.write_text("\n".join(map(str, counts)) + "\n")
    monkeypatch.setattr(compress, "count_tokens", lambda *a, **k: pytest.fail("counted"))
    args = ["compress", "--ckpt", "all-MiniLM-L6-v2", "--data", "sample-corpus", "--method", "unk", "--frequencies"]
    assert main([*args, str(given), "--out", "out"]) == 0
    report = json.loads((tmp_path / "out/report.json").read_text())
    assert report["frequencies"] == str(given) and report["vocabulary"]["seen"] == 3
    assert report["vocabulary"]["common"] == 3 + len(report["vocabulary"]["special_ids"])
    given.write_text("1\n2\n")
    assert main([*args, str(given), "--out", "out2"]) == 2 and not (tmp_path / "out2").exists()


def test_a_model_built_only_to_be_counted_reads_no_data(tmp_path, monkeypatch, capsys):
    """`lit-embed params` and a sweep's plan build the model to count it: frequencies: data is sized by the id-order
    widths there, nothing counted or written (a plan of the cluster sweeps would otherwise read Wikipedia)."""
    from lit_embed.commands import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(frequencies, "count_tokens", lambda *a, **k: pytest.fail("counted"))
    assert main(["params", "--config", str(CONFIGS / "demo.yaml"), "--model.init_args.embedding",
                 str(CONFIGS / "embedding/mixed_dimension.yaml"), "--json"]) == 0
    estimate = MixedDimensionEmbedding.count_bytes(30522, 64, frequencies="id_order")
    assert json.loads(capsys.readouterr().out)["embedding_bytes"] == estimate and not list(tmp_path.rglob("token_counts-*"))


def counted_files(folder) -> dict[int | None, tuple[np.ndarray, dict]]:
    """Each cached count of ``folder`` by its cap: the counts and the sidecar that says what they are."""
    found = {}
    for path in folder.glob("token_counts-*.txt"):
        record = json.loads(path.with_suffix(".json").read_text())
        found[record["counted_tokens"]] = (np.array([int(line) for line in path.read_text().split()]), record)
    return found


def test_a_cap_counts_exactly_the_first_tokens_and_another_cap_is_counted_again(tmp_path, monkeypatch, caplog):
    """counted_tokens: N counts the training data's first N tokens, the texts in order and the last one cut at N (each
    corpus line is 9 zebra, 6 quartz, 3 violin: 100 tokens are 5 lines and 10 tokens of the sixth); the cap is in the
    key and the sidecar, so another cap (null: all) is counted anew, and the same cap is read back."""
    monkeypatch.chdir(tmp_path)
    write_corpus(tmp_path / "corpus.txt")
    cap = ["--model.init_args.embedding.init_args.counted_tokens"]
    with caplog.at_level("INFO", logger="lit_embed.data.frequencies"):
        build("corpus.txt", *cap, "100")
    assert "the first 100 tokens of the training data (6 of 41 texts: 14.6%)" in caplog.text
    assert "counted_tokens: null counts them all" in caplog.text
    counts, record = counted_files(tmp_path / "runs/demo")[100]
    assert counts.sum() == 100 and counts[ids_of(FREQUENT)].tolist() == [5 * 9 + 9, 5 * 6 + 1, 5 * 3]
    assert (record["tokens"], record["texts"], record["whole_split"]) == (100, 6, False)

    every = tmp_path / "every_token.yaml"  # null in the YAML (jsonargparse takes no nested null on the command line)
    every.write_text((CONFIGS / "embedding/mixed_dimension.yaml").read_text() + "  counted_tokens: null\n")
    whole = build("corpus.txt", "--model.init_args.embedding", str(every))
    found = counted_files(tmp_path / "runs/demo")
    assert set(found) == {100, None}
    counts, record = found[None]
    assert counts[ids_of(FREQUENT)].tolist() == [360, 240, 120] and record["whole_split"] and record["texts"] == 41
    assert whole.config.model.init_args.embedding.init_args.counted_tokens is None
    assert whole.model.embedding.config()["init_args"]["counted_tokens"] is None  # a checkpoint needs no cap

    monkeypatch.setattr(frequencies, "count_tokens", lambda *a, **k: pytest.fail("counted"))
    build("corpus.txt", *cap, "100")  # the same cap: read back
    with pytest.raises(ConfigError, match=re.escape("counted_tokens=0 must be a number of tokens of at least 1, or null")):
        build("corpus.txt", *cap, "0")


def test_a_stream_is_counted_up_to_the_cap_and_read_no_further():
    """An endless stream (a streaming hub corpus) is counted: its first ``most`` tokens, drawn a batch at a time and
    no further than the batch that reaches the cap."""
    encoder = VocabTextEncoder("all-MiniLM-L6-v2")
    drawn = []

    def endless():
        for i in itertools.count():
            drawn.append(i)
            yield "zebra quartz violin"  # 3 tokens a text

    counted = frequencies.count_tokens(endless(), encoder, 30522, batch_size=8, most=20)
    assert counted.counts.sum() == 20 and counted.texts == 7 and not counted.whole
    assert counted.described() == "the first 20 tokens of the training data (7 texts; it holds more)"  # no length
    assert counted.counts[ids_of(FREQUENT)].tolist() == [7, 7, 6] and len(drawn) == 8  # one batch of 8 texts
    exact = frequencies.count_tokens(["zebra quartz", "violin"], encoder, 30522, most=3)  # the cap is the whole split
    assert exact.whole and exact.counts.sum() == 3
    assert not frequencies.count_tokens(["zebra quartz", "violin", "zebra"], encoder, 30522, most=3).whole

"""Post-hoc compression (`lit-embed compress`): the method, its baselines and their accounting, each
end to end on the packaged MiniLM, the offline example, tied decoders and bad input."""

from __future__ import annotations

import errno
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import pytorch_lightning as pl
import torch
import yaml
from torch.nn import functional as F

from lit_embed import progress
from lit_embed.checkpoints.format import build_from_config
from lit_embed.commands import main
from lit_embed.commands.compress import parser
from lit_embed.commands.parsing import named_method
from lit_embed.compress import AQOptions, load_compact, methods
from lit_embed.compress.codebooks import additive_quantize
from lit_embed.compress.model_io import load_source
from lit_embed.compress.partial import pca_code, sparse_code, unk_backoff
from lit_embed.compress.vocabulary import coverage, split_vocabulary
from lit_embed.data.frequencies import count_tokens
from lit_embed.embeddings import AdditiveQuantizedEmbedding, PCAEmbedding, SparseCodedEmbedding, UnkEmbedding
from lit_embed.embeddings.base import state_bytes
from lit_embed.errors import ConfigError
from lit_embed.measures.accounting import human
from lit_embed.reports.papers import compress_reports, cosine_tables, coverage_tables
from lit_embed.storage.files import device_of
from tests.helpers import CONFIGS, REPO
from tests.helpers.cli import params_json

QUIET = ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]
SAMPLE_CORPUS = str(REPO / "lit_embed" / "data" / "sample" / "corpus.txt")


# -- the method -----------------------------------------------------------------------------------------


def circle_table() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Three common rows on a circle of the unit sphere (their affine span holds the whole circle), other
    common rows far away, and one rare row: a point of that circle, scaled to length 2.5."""
    d, h, r = 16, 0.6, 0.8
    e = torch.eye(d, dtype=torch.float32)
    on_circle = lambda angle: h * e[2] + r * (math.cos(angle) * e[0] + math.sin(angle) * e[1])  # noqa: E731
    rows = [3.0 * on_circle(0.0), 0.5 * on_circle(0.5), 2.0 * on_circle(1.0), -e[2], e[3], -e[0], e[4], 2.5 * on_circle(0.3)]
    table = torch.stack(rows)
    return table, torch.arange(7), torch.tensor([7])


def test_lle_weights_sum_to_one_and_rebuild_a_vector_in_the_span_of_its_neighbours():
    table, common, rare = circle_table()
    strategy = sparse_code(table, common, [3])[3]
    assert sorted(strategy.neighbours[0].tolist()) == [0, 1, 2]  # the three on the circle, by cosine
    assert float(strategy.weights.sum()) == pytest.approx(1.0, abs=1e-6)
    rebuilt = strategy(rare)
    assert torch.allclose(rebuilt, table[rare], atol=1e-5)
    assert float(strategy.norms[0]) == pytest.approx(2.5)

    torch.manual_seed(0)
    table = torch.randn(300, 32)
    common = torch.arange(0, 300, 3)
    for k, strategy in sparse_code(table, common, [1, 2, 5]).items():
        assert torch.allclose(strategy.weights.sum(1), torch.ones(strategy.num_rare), atol=1e-5)
        cosine = F.normalize(table[strategy.rare_ids()], dim=-1) @ F.normalize(table[common], dim=-1).T
        assert torch.equal(strategy.neighbours[:, 0].long(), cosine.argmax(1))  # nearest by cosine first
        rebuilt = strategy(strategy.rare_ids())
        assert torch.allclose(rebuilt.norm(dim=-1), table[strategy.rare_ids()].norm(dim=-1), atol=1e-5)  # length kept
        if k == 1:  # one neighbour: its direction at the rare row's length
            nearest = F.normalize(table[common][strategy.neighbours[:, 0].long()], dim=-1)
            assert torch.allclose(rebuilt, nearest * table[strategy.rare_ids()].norm(dim=-1, keepdim=True), atol=1e-5)


def test_common_rows_stay_bit_identical_and_state_restores_exactly():
    torch.manual_seed(0)
    table = torch.randn(200, 24)
    common = torch.tensor(sorted(set(range(0, 200, 4)) | {3}))
    fitted = [sparse_code(table, common, [3])[3], pca_code(table, common, [4])[4], unk_backoff(table, common, 3)]
    ids = torch.randint(0, 200, (4, 9))
    for strategy in fitted:
        assert torch.equal(strategy(common), table[common])
        assert torch.equal(strategy.common_ids(), common)
        fresh = type(strategy)(200, 24, **strategy.init_args())
        fresh.load_state_dict(strategy.state_dict())
        assert torch.equal(fresh(ids), strategy(ids))
        assert torch.equal(fresh.full_weight(), strategy(torch.arange(200)))
    unk = fitted[2]
    assert torch.equal(unk(unk.rare_ids()), table[3].expand(unk.num_rare, -1))


def test_pca_with_every_component_rebuilds_rare_rows_exactly():
    torch.manual_seed(0)
    table = torch.randn(120, 8)
    strategy = pca_code(table, torch.arange(60), [8])[8]
    assert torch.allclose(strategy(torch.arange(60, 120)), table[60:], atol=1e-4)


def test_parameter_accounting_follows_the_paper():
    # Table 8, QNLI at r(V_C)=1.0: |V_C|=26180 (Table 1), k=2 -> 20.13M embedding parameters of DistilBERT.
    qnli = SparseCodedEmbedding(30522, 768, num_common=26180, k=2)
    assert qnli.num_embedding_parameters() == 26180 * 768 + (2 * 2 + 1) * (30522 - 26180) == 20_127_950
    assert human(qnli.num_embedding_parameters()) == "20.1M"
    assert UnkEmbedding(30522, 768, 26180).num_embedding_parameters() == 26180 * 768
    assert PCAEmbedding(30522, 768, 26180, k=7).num_embedding_parameters() == 26180 * 768 + 8 * 768 + 7 * 4342
    assert AdditiveQuantizedEmbedding(30522, 768).num_embedding_parameters() == 32 * 16 * 768 + 30522 * 32
    # bytes as stored: common rows and weights float32, ids int32, codes packed at their bits (4 of 4 bits: 2 bytes a row)
    small = SparseCodedEmbedding(100, 8, num_common=30, k=3)
    assert state_bytes(small.state_dict()) == 30 * 8 * 4 + 100 * 4 + 70 * 3 * 4 + 70 * 3 * 4 + 70 * 4
    assert state_bytes(AdditiveQuantizedEmbedding(100, 8, 4, 16).state_dict()) == 4 * 16 * 8 * 4 + 100 * 2


def test_additive_quantization_learns_codes_that_rebuild_the_table():
    torch.manual_seed(0)
    centres = torch.randn(4, 16)
    table = centres[torch.arange(256) % 4] + 0.05 * torch.randn(256, 16)
    options = AQOptions(codebooks=4, codewords=8, epochs=20, lr=1e-2, clip_norm=1.0)
    strategy = additive_quantize(table, options, seed=0)
    assert strategy.codes.dtype == torch.uint8 and int(strategy.code_table().max()) < 8
    cosine = F.cosine_similarity(strategy(torch.arange(256)), table).mean()
    assert cosine > 0.9
    short = AQOptions(codebooks=4, codewords=8, max_steps=5)
    first, again = (additive_quantize(table, short, seed=1) for _ in range(2))
    assert torch.equal(again.codes, first.codes) and torch.equal(again.codebooks, first.codebooks)  # seeded


def test_the_fitting_loops_say_their_progress_in_a_log(monkeypatch, capsys):
    """stderr no terminal (pytest's capture): AQ's steps with the loss, sparse coding's rare rows (a block at a time),
    the texts counted; here every update (a line every INTERVAL seconds otherwise), and a closing line each."""
    monkeypatch.setattr(progress, "INTERVAL", 0.0)
    monkeypatch.setattr(methods, "BLOCK_BYTES", 4 * 10 * 3)  # 3 rare rows a block: 10 rows, 4 blocks
    table = torch.randn(20, 8)
    additive_quantize(table, AQOptions(codebooks=2, codewords=4, epochs=3, batch_size=8), seed=0)  # 3 steps an epoch
    sparse_code(table, torch.arange(10), [2])
    count_tokens((f"{i % 10} 1" for i in range(25)), WordIds(), 10, batch_size=10)
    lines = capsys.readouterr().err.splitlines()
    aq = [line for line in lines if line.startswith("AQ step")]
    assert [re.match(r"AQ step (\d+)/9 ", line).group(1) for line in aq] == [str(n) for n in range(1, 10)]
    assert all(re.search(r", loss \d", line) for line in aq) and ", ETA " in aq[0] and ", done in " in aq[-1]
    assert [line.split(" (")[0] for line in lines if line.startswith("sparse coding")] == [
        "sparse coding, rare row 3/10", "sparse coding, rare row 6/10", "sparse coding, rare row 9/10",
        "sparse coding, rare row 10/10"]
    assert [line.split(",")[1] for line in lines if line.startswith("counting tokens")] == [" text 10", " text 20",
                                                                                         " text 25", " text 25"]
    monkeypatch.setattr(progress.sys.stderr, "isatty", lambda: True)  # a terminal: nothing extra
    sparse_code(table, torch.arange(10), [2])
    assert capsys.readouterr().err == ""


def test_vocabulary_split_keeps_the_most_frequent_and_the_specials():
    counts = torch.tensor([0, 5, 0, 9, 1, 5, 0, 2]).numpy()
    split = split_vocabulary(counts, 0.5, special_ids=[0, 2])
    assert (split.seen, split.kept) == (5, 3)  # round(0.5 * 5) = 3 (2.5 rounds up)
    assert split.common_ids.tolist() == [0, 1, 2, 3, 5]  # 9, 5, 5 (ties: smaller id), and the specials
    assert split_vocabulary(counts, 1.0, []).common_ids.tolist() == [1, 3, 4, 5, 7]


class WordIds:
    """A text encoder whose ids are the words themselves (``"3 5"`` -> ``[3, 5]``)."""

    def encode(self, texts):
        return [np.array([int(w) for w in text.split()], dtype=np.int64) for text in texts]


def test_coverage_counts_common_tokens_and_examples_made_only_of_them():
    examples = [["1 3", "3 5"], ["1 1"], ["4 9", ""], [""]]  # pairs and single texts; 9 is past every common id
    report = coverage(examples, WordIds(), torch.tensor([1, 3, 5]))
    assert report == {"tokens": 6 / 8, "sentences": 3 / 4, "examples": 4}  # an empty example is covered


# -- end to end on the packaged MiniLM ------------------------------------------------------------------


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory) -> Path:
    """The offline example's fine-tuning (configs/experiments/sparse_coding/minilm_topics.yaml), shortened."""
    folder = tmp_path_factory.mktemp("minilm_topics")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")
        patch.setenv("HF_DATASETS_OFFLINE", "1")
        patch.setenv("HF_DATASETS_CACHE", str(folder / "datasets"))
        patch.chdir(folder)
        assert main(["fit", "--config", str(CONFIGS / "experiments/sparse_coding/minilm_topics.yaml"),
                     "--trainer.max_steps", "3", "--trainer.val_check_interval", "3", "--trainer.limit_val_batches", "1",
                     "--trainer.limit_test_batches", "1", "--trainer.logger", "false", *QUIET]) == 0
    ckpt = folder / "runs/minilm_topics/checkpoints/last.ckpt"
    assert ckpt.is_file()
    return ckpt


def compress(*args: str) -> int:
    """The exit status of ``lit-embed compress ARGS`` run in this process (an argument error exits 2 from the parser)."""
    try:
        return main(["compress", *args])
    except SystemExit as stopped:
        return stopped.code


@pytest.fixture(scope="module")
def compressed(finetuned, tmp_path_factory):
    """``method -> output folder`` of the fine-tuned MiniLM (given as its run folder) compressed at retention 0.5 with
    k=2 (each once)."""
    folders: dict[str, Path] = {}

    def get(method: str) -> Path:
        if method not in folders:
            out = tmp_path_factory.mktemp("compressed") / method
            own = {"sparse_coding": ["--k", "2"], "pca": ["--k", "2"], "aq": ["--max_steps", "3"]}.get(method, [])
            assert compress("--ckpt", str(finetuned.parent.parent), "--method", method, "--retention", "0.5", *own,
                            "--out", str(out)) == 0
            folders[method] = out
        return folders[method]

    return get


def read_report(out: Path) -> dict:
    return json.loads((out / "report.json").read_text())


def load_compressed(out: Path):
    config = yaml.safe_load((out / "config.yaml").read_text())
    module = build_from_config(pl.LightningModule, config["model"], "model")
    module.load_state_dict(torch.load(out / "model.ckpt", map_location="cpu", weights_only=True)["state_dict"])
    return module.eval()


@pytest.mark.parametrize("method", ["sparse_coding", "unk", "pca", "aq"])
def test_each_method_end_to_end(method, compressed, finetuned, tmp_path, monkeypatch, capsys):
    out = compressed(method)
    assert sorted(p.name for p in out.iterdir()) == ["config.yaml", "model.ckpt", "report.json", "report.md"]
    report = read_report(out)
    run = finetuned.parent.parent
    best = json.loads((run / "results.json").read_text())["checkpoint"]["best"]  # by val/score, at its one validation
    assert {"what": "checkpoint", "given": str(run), "file": str(run / best), "step": 3,
            "why": "the best checkpoint by val/score its run reported"} in report["checkpoints_taken"]
    vocab, d, common, rare = (report["vocabulary"][key] for key in ("size", "hidden", "common", "rare"))
    expected = {"sparse_coding": common * d + 5 * rare, "unk": common * d, "pca": common * d + 3 * d + 2 * rare,
                "aq": 32 * 16 * d + 32 * vocab}[method]
    params = report["parameters"]
    assert params["embedding"] == {"before": vocab * d, "after": expected}
    load = report["load"]  # what its seconds ran beside
    assert len(load["load_1min"]) == 2 and all(x >= 0 for x in load["load_1min"]) and load["cores"] == os.cpu_count()
    assert params["total"]["before"] - params["total"]["after"] == vocab * d - expected
    assert report["bytes"]["embedding"]["before"] == vocab * d * 4
    checkpoint = torch.load(out / "model.ckpt", map_location="cpu", weights_only=True)
    stored = {k.removeprefix("embedding."): v for k, v in checkpoint["state_dict"].items() if k.startswith("embedding.")}
    assert report["bytes"]["embedding"]["after"] == state_bytes(stored)
    assert report["cosine"]["common_rows_identical"] is (method != "aq")
    assert report["cosine"]["common"] == pytest.approx(1.0) or method == "aq"
    assert -1.0 <= report["cosine"]["rare"] <= 1.0
    assert "Table 9" in (out / "report.md").read_text()
    assert "(Table 5), sentences" in (out / "report.md").read_text() and report["coverage"]["examples"] > 0
    counted = params_json(["params", "--config", str(out / "config.yaml"), "--json"])
    head = sum(p.numel() for p in load_compressed(out).classifier.parameters())  # params counts no task head
    assert counted["embedding_params"] == expected and counted["total_params"] == params["total"]["after"] - head
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main(["report", str(out)]) == 0  # a compress output alone: its coverage tables
    assert "Token coverage of the test data by V_C (%)" in capsys.readouterr().out
    assert main(["validate", "--config", str(out / "config.yaml"), "--ckpt_path", str(out / "model.ckpt"),
                 "--trainer.limit_val_batches", "2", *QUIET]) == 0
    results = json.loads((out / "version_0" / "results.json").read_text())  # runs of the compressed model log beside it
    assert results["parameters"]["embedding_params"] == expected
    assert {"what": "--ckpt_path checkpoint", "given": str(out / "model.ckpt"), "file": str(out / "model.ckpt"),
            "step": None, "why": "the file given"} in results["checkpoints_taken"]
    capsys.readouterr()
    assert main(["report", str(out)]) == 0
    assert "Sentence coverage of the test data only by V_C (%)" in capsys.readouterr().out


def test_report_gives_table_9_from_the_compress_outputs_of_each_method(compressed, tmp_path, monkeypatch, capsys):
    """Sparse-coding Table 9's layout: a row per method and k, the rare rows' cosine where common rows are kept exactly,
    AQ's on all, common and rare rows; x 100, a column per task."""
    reports = {method: read_report(compressed(method)) for method in ("unk", "sparse_coding", "pca", "aq")}
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main(["report", *(str(compressed(method)) for method in ("aq", "pca", "unk", "sparse_coding"))]) == 0
    out = capsys.readouterr().out
    table = out.split("### Cosine similarity of the rebuilt embeddings to the original ones, r(V_C) = 0.5 (x 100)\n")[1]
    rows = [line for line in table.strip().split("\n\n")[0].splitlines() if line.startswith("| ")][1:]

    def cell(method: str, kind: str) -> str:
        return f"{100 * reports[method]['cosine'][kind]:.2f}"

    assert rows == [
        f"| <unk> | {cell('unk', 'rare')} |",
        f"| sparse coding k=2 | {cell('sparse_coding', 'rare')} |",
        f"| PCA k=2 | {cell('pca', 'rare')} |",
        f"| AQ (V_C ∪ V_R) | {cell('aq', 'all')} |",
        f"| AQ (V_C) | {cell('aq', 'common')} |",
        f"| AQ (V_R) | {cell('aq', 'rare')} |",
    ]


POST_HOC = {  # method -> (its options, small; its embedding parameters for a V x d table)
    "svd": (["--rank", "8"], lambda v, d: v * 8 + 8 * d + d),
    "int8": ([], lambda v, d: (v * d + 8 * v) // 4),
    "int4": ([], lambda v, d: (v * d // 2 + 8 * v) // 4),
    "pq": (["--groups", "48", "--codewords", "16", "--iterations", "2", "--backend", "torch"], lambda v, d: 16 * d + 48 * v),
}


@pytest.mark.parametrize("method", sorted(POST_HOC))
def test_post_hoc_methods_compress_the_packaged_minilm(method, minilm_matrix, tmp_path):
    """svd, int8, int4 and pq on a HuggingFace model: the count by the method's formula (int8/int4: the bytes stored,
    in float32 equivalents), the bytes as stored, cosine and squared error per row (rare and common), what it chose,
    and a HuggingFace folder whose table is the compressed one's."""
    from transformers import AutoModel

    options, formula = POST_HOC[method]
    out = tmp_path / method
    assert compress("--ckpt", "all-MiniLM-L6-v2", "--data", SAMPLE_CORPUS, "--method", method, *options,
                    "--out", str(out)) == 0
    report = read_report(out)
    vocab, d = minilm_matrix.shape
    assert report["parameters"]["embedding"] == {"before": vocab * d, "after": formula(vocab, d)}
    strategy = load_compact(out / "hf")
    assert report["bytes"]["embedding"]["after"] == state_bytes(strategy.state_dict())
    if method.startswith("int"):
        assert report["bytes"]["embedding"]["after"] == 4 * report["parameters"]["embedding"]["after"]
    rebuilt = strategy.full_weight().detach()
    assert torch.equal(AutoModel.from_pretrained(out / "hf").get_input_embeddings().weight.detach(), rebuilt)
    error = (rebuilt.double() - minilm_matrix.double()).pow(2).mean(-1)
    assert report["mse"]["all"] == pytest.approx(float(error.mean()), rel=1e-6)
    assert 0 < report["mse"]["common"] and 0 < report["mse"]["rare"]
    floor = {"int8": 0.999, "int4": 0.95}.get(method, 0.0)  # within half a step of 255 or of 15 in each row's range
    assert floor < report["cosine"]["rare"] <= 1.0 and report["cosine"]["common_rows_identical"] is False
    assert report["details"] == {"svd": {"rank": 8}, "pq": {"k-means": "torch (lit-embed's k-means++ and Lloyd)"}}.get(method, {})
    summary = (out / "report.md").read_text()
    assert "Mean squared error of rebuilt rows: rare" in summary


def test_outputs_equal_the_original_on_sentences_of_common_tokens(finetuned, compressed):
    original = load_source(str(finetuned)).module.eval()
    model = load_compressed(compressed("sparse_coding"))
    strategy = model.embedding
    assert isinstance(strategy, SparseCodedEmbedding) and strategy.k == 2
    words = [i for i in strategy.common_ids().tolist() if i > 103][:12]
    codes = torch.tensor([[101, *words, 102], [101, *words[::-1], 102]])
    batch = {"codes": codes, "attention_mask": torch.ones_like(codes), "token_type_ids": torch.zeros_like(codes)}
    with torch.no_grad():
        assert torch.equal(model(batch), original(batch))
        assert torch.equal(model.encode(batch).last_hidden_state, original.encode(batch).last_hidden_state)
        batch["codes"][0, 3] = int(strategy.rare_ids()[500])
        assert not torch.equal(model(batch)[0], original(batch)[0])  # a rare token is approximated


def test_coverage_of_the_test_data_is_that_of_the_common_tokens_kept(finetuned, compressed, minilm_path):
    """Tables 5 and 6 of the sparse-coding paper, on the demo task's test set under its protocol (the validation split)."""
    from lit_embed.data import TaskDataModule
    from lit_embed.embeddings import VocabTextEncoder

    report = read_report(compressed("sparse_coding"))["coverage"]
    common = set(load_compressed(compressed("sparse_coding")).embedding.common_ids().tolist())
    encoder = VocabTextEncoder(minilm_path)
    examples = list(TaskDataModule(task="topics", tokenizer=minilm_path, protocol="split_train").test_examples())
    ids = [[i for text in example for i in encoder.encode([text])[0].tolist()] for example in examples]
    assert report["examples"] == len(examples) > 0
    assert report["tokens"] == pytest.approx(sum(i in common for x in ids for i in x) / sum(map(len, ids)))
    assert report["sentences"] == pytest.approx(sum(all(i in common for i in x) for x in ids) / len(ids))
    assert 0 < report["sentences"] < report["tokens"] < 1  # retention 0.5 leaves some test tokens rare
    tokens, sentences = coverage_tables(compress_reports([str(compressed("sparse_coding").parent)]))  # report's tables
    assert tokens.header == sentences.header == ["r(V_C)", "TOPICS"]
    assert tokens.rows == [["0.5", f"{100 * report['tokens']:.2f}"]]
    assert sentences.rows == [["0.5", f"{100 * report['sentences']:.2f}"]]


def test_huggingface_input_writes_a_huggingface_folder(minilm_path, minilm_matrix, tmp_path):
    from transformers import AutoModel

    out = tmp_path / "hf_out"
    assert compress("--ckpt", "all-MiniLM-L6-v2", "--data", SAMPLE_CORPUS, "--retention", "0.8", "--k", "4",
                    "--out", str(out)) == 0
    assert sorted(p.name for p in out.iterdir()) == ["hf", "report.json", "report.md"]  # no task: no classifier
    strategy = load_compact(out / "hf")
    assert isinstance(strategy, SparseCodedEmbedding) and strategy.k == 4
    dense = AutoModel.from_pretrained(out / "hf").get_input_embeddings().weight.detach()
    assert torch.equal(dense, strategy.full_weight().detach())
    common = strategy.common_ids()
    assert torch.equal(dense[common], minilm_matrix[common])
    assert (out / "hf" / "tokenizer.json").is_file() and (out / "hf" / "modules.json").is_file()
    report = read_report(out)
    compact = (out / "hf" / "compressed_embedding.safetensors").stat().st_size
    assert 0 < compact - report["bytes"]["embedding"]["after"] < 4096  # the tensors plus a header
    assert report["files"]["hf/compressed_embedding.safetensors"] == compact


def test_offline_example_chooses_k_on_validation_and_tests(finetuned, tmp_path, monkeypatch, capsys):
    """configs/experiments/sparse_coding/minilm_topics.yaml (fitted above), then configs/compress/sparse_coding.yaml;
    its progress in a log (stderr no terminal), here every line."""
    monkeypatch.setattr(progress, "INTERVAL", 0.0)
    out = tmp_path / "sparse_coding_r0.5"
    assert compress("--config", str(CONFIGS / "compress/sparse_coding.yaml"), "--ckpt", str(finetuned),
                    "--limit_val_batches", "2", "--out", str(out)) == 0
    report = read_report(out)
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("choosing k")]
    assert [line.split(" (")[0] for line in said] == [f"choosing k, validation {n}/6" for n in (1, 2, 3, 4, 5, 6)]
    assert [re.search(r", k (\d), val/score [\d.]+$", line).group(1) for line in said[:5]] == ["1", "2", "3", "4", "5"]
    assert re.search(r"done in \d+\w, original model's val/score [\d.]+$", said[-1])
    assert {"what": "checkpoint", "given": str(finetuned), "file": str(finetuned), "step": 3,  # the run's last step
            "why": "the file given"} in report["checkpoints_taken"]
    validation = report["validation"]
    assert sorted(validation["scores"]) == ["1", "2", "3", "4", "5"]
    best = max(validation["scores"].values())
    assert validation["scores"][str(report["k"])] == best and 0.0 <= validation["original"] <= 1.0
    assert report["retention"] == 0.5 and report["vocabulary"]["kept"] == round(0.5 * report["vocabulary"]["seen"])
    # Every candidate's cosines (Table 9's rows k=1 to k=5), the chosen one's as "cosine".
    by_k = report["cosine_by_k"]
    assert sorted(by_k) == ["1", "2", "3", "4", "5"] and by_k[str(report["k"])] == report["cosine"]
    source = load_source(str(finetuned))
    common = torch.tensor(sorted(load_compressed(out).embedding.common_ids().tolist()))
    for k, strategy in sparse_code(source.weight, common, [1, 4]).items():
        rebuilt = strategy(torch.arange(len(source.weight))).detach()
        rare = torch.ones(len(source.weight), dtype=torch.bool)
        rare[common] = False
        cosine = F.cosine_similarity(rebuilt[rare].double(), source.weight[rare].double(), dim=-1).mean()
        assert by_k[str(k)]["rare"] == pytest.approx(float(cosine), abs=1e-6)
    (table,) = cosine_tables(compress_reports([str(out)]))
    assert table.header == ["", "TOPICS"]
    assert table.rows == [[f"sparse coding k={k}", f"{100 * by_k[str(k)]['rare']:.2f}"] for k in range(1, 6)]
    monkeypatch.chdir(tmp_path)
    assert main(["test", "--config", str(out / "config.yaml"), "--ckpt_path", str(out / "model.ckpt"),
                 "--trainer.limit_test_batches", "2", *QUIET]) == 0
    results = json.loads((out / "version_0" / "results.json").read_text())
    assert "test/score" in results["metrics"] and results["command"] == "test"
    assert [r["file"] for r in results["checkpoints_taken"] if r["what"] == "--ckpt_path checkpoint"] == [str(out / "model.ckpt")]


def test_a_checkpoint_without_its_config_takes_model_config(tmp_path, capsys):
    """A checkpoint saved from Python records no config: --model_config names it; --data a full config's data."""
    from lit_embed.models import Encoder, SequenceClassifier

    experiment = str(CONFIGS / "experiments/sparse_coding/minilm_topics.yaml")
    model = SequenceClassifier("topics", Encoder(pretrained="all-MiniLM-L6-v2"), vocab_size=30522)
    torch.save({"state_dict": model.state_dict()}, tmp_path / "bare.ckpt")
    args = ["--ckpt", str(tmp_path / "bare.ckpt"), "--data", experiment, "--method", "unk", "--out", str(tmp_path / "out")]
    assert compress(*args) == 2
    assert "does not record its model config" in capsys.readouterr().err
    assert compress(*args, "--model_config", experiment) == 0
    assert read_report(tmp_path / "out")["data"] == f"{experiment} (task topics)"
    strategy = load_compressed(tmp_path / "out").embedding
    assert isinstance(strategy, UnkEmbedding)
    assert torch.equal(strategy.common, model.embedding.weight.detach()[strategy.common_ids()])


@pytest.mark.parametrize("preset", sorted((CONFIGS / "compress").glob("*.yaml")), ids=lambda p: p.stem)
def test_compress_presets_parse(preset):
    argv = ["--config", str(preset), "--ckpt", "x.ckpt", "--out", "y"]
    config = parser(named_method(argv)).parse_args(argv)
    assert config.method == preset.stem and 0 < config.retention <= 1
    if preset.stem == "aq":
        assert (config.codebooks, config.codewords) == (32, 16)


# -- tied decoders ----------------------------------------------------------------------------------------


def test_a_tied_mlm_decoder_is_refused_unless_untied(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["fit", "--config", str(CONFIGS / "demo.yaml"), "--model.init_args.embedding",
                 str(CONFIGS / "embedding/dense.yaml"), "--trainer.max_steps", "1", "--trainer.limit_val_batches", "0",
                 "--trainer.logger", "false", *QUIET]) == 0
    ckpt = tmp_path / "runs/demo/checkpoints/last.ckpt"
    args = ["--ckpt", str(ckpt), "--data", "sample-corpus", "--k", "2", "--out", str(tmp_path / "out")]
    assert compress(*args) == 2
    assert "tied to the input embedding" in capsys.readouterr().err and not (tmp_path / "out").exists()
    assert compress(*args, "--untie") == 0
    module = load_compressed(tmp_path / "out")
    assert module.tie_decoder is False and isinstance(module.embedding, SparseCodedEmbedding)
    dense = torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]["embedding.weight"]
    assert torch.equal(module.decoder.weight.detach(), dense)  # the output layer keeps the whole table


def test_a_tied_huggingface_model_is_refused_unless_untied(tmp_path, capsys):
    from transformers import AutoModelForMaskedLM, AutoTokenizer, BertConfig, BertForMaskedLM

    from lit_embed.hub import resolve_pretrained

    folder = tmp_path / "tiny_mlm"
    config = BertConfig(vocab_size=30522, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    torch.manual_seed(0)
    BertForMaskedLM(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(resolve_pretrained("all-MiniLM-L6-v2")).save_pretrained(folder)
    args = ["--ckpt", str(folder), "--data", "sample-corpus", "--k", "2", "--out", str(tmp_path / "out")]
    assert compress(*args) == 2
    assert "Pass --untie" in capsys.readouterr().err
    assert compress(*args, "--untie") == 0
    model = AutoModelForMaskedLM.from_pretrained(tmp_path / "out" / "hf")
    original = BertForMaskedLM.from_pretrained(folder)
    assert torch.equal(model.get_output_embeddings().weight, original.get_output_embeddings().weight)
    assert not torch.equal(model.get_input_embeddings().weight, original.get_input_embeddings().weight)


# -- bad input: a clear error naming the value and the fix, a non-zero exit, no output folder --------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--retention", "0"], "retention=0.0 is outside (0, 1]"),
        (["--retention", "1.5"], "retention=1.5 is outside (0, 1]"),
        (["--k", "0"], "k=0 must be at least 1"),
        (["--k", "10"], "k=10 exceeds |V_C|=9, the common tokens to choose neighbours from: lower k or raise --retention"),
        (["--method", "pca", "--k", "10"], "k=10 exceeds min(|V_C|=9, hidden=384)"),
        (["--data", "EMPTY"], "no token of the vocabulary occurs in the data"),
        (["--data", "missing.txt"], "data file 'missing.txt' does not exist"),
        (["--k", "[1,2]"], "choosing k on the validation split needs a fine-tuned lit-embed classifier checkpoint"),
    ],
)
def test_bad_arguments_exit_non_zero_naming_the_fix(args, message, tmp_path, capsys):
    (tmp_path / "few.txt").write_text("the river . the city\n")  # 4 tokens seen; with the 5 specials |V_C| = 9
    (tmp_path / "blank.txt").write_text("\n \n")
    data = ["--data", str(tmp_path / "few.txt")]
    args = [str(tmp_path / "blank.txt") if a == "EMPTY" else a for a in args]
    out = tmp_path / "out"
    assert compress("--ckpt", "all-MiniLM-L6-v2", *data, *args, "--out", str(out)) == 2
    assert message in capsys.readouterr().err
    assert not out.exists() and not list(tmp_path.glob(".out.*"))


def test_checkpoints_the_method_cannot_read_are_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["fit", "--config", str(CONFIGS / "demo.yaml"), "--trainer.max_steps", "1", "--trainer.limit_val_batches", "0",
                 "--trainer.logger", "false", *QUIET]) == 0
    subspace = tmp_path / "runs/demo/checkpoints/last.ckpt"
    (tmp_path / "junk.ckpt").write_bytes(b"not a checkpoint")
    cases = {
        str(subspace): "has a SubspaceEmbedding embedding; compress reads a dense vocabulary x hidden table",
        str(tmp_path / "junk.ckpt"): "is not a readable checkpoint",
        str(tmp_path / "missing.ckpt"): "checkpoint '" + str(tmp_path / "missing.ckpt") + "' does not exist",
    }
    for ckpt, message in cases.items():
        assert compress("--ckpt", ckpt, "--data", "sample-corpus", "--out", str(tmp_path / "out")) == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_output_folder_is_complete_or_untouched(finetuned, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    args = ["--ckpt", "all-MiniLM-L6-v2", "--data", SAMPLE_CORPUS, "--k", "2", "--out", str(out)]
    assert compress(*args) == 0
    earlier = {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert compress(*args) == 2
    assert "exists: choose another --out or pass --overwrite" in capsys.readouterr().err

    def broken(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", "model.safetensors")

    monkeypatch.setattr("safetensors.torch.save_file", broken)  # the last file written
    assert compress(*args, "--overwrite") == 2
    # the output folder and its device, not the file inside it (nor the hidden folder it was built in)
    assert f"no space left on {device_of(tmp_path)} writing {out}: free space" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()} == earlier and not list(tmp_path.glob(".out.*"))
    monkeypatch.undo()
    assert compress(*args, "--overwrite") == 0  # an earlier output of compress, holding nothing else: replaced
    assert (out / "hf").is_dir() and not list(tmp_path.glob(".out.*"))


@pytest.mark.parametrize("holds", ["user_files", "source_run", "compressed_runs"])
def test_overwrite_replaces_only_an_earlier_compress_output(holds, finetuned, tmp_path, capsys):
    """--overwrite never deletes what compress did not write: a user's folder, the source run's, or runs made
    with the compressed model."""
    out = tmp_path / "out"
    args = ["--ckpt", "all-MiniLM-L6-v2", "--data", SAMPLE_CORPUS, "--k", "2", "--out"]
    if holds == "source_run":
        out = finetuned.parent.parent  # the fine-tuning's own folder, checkpoints and all
    elif holds == "user_files":
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    else:
        assert compress(*args, str(out)) == 0
        (out / "version_0").mkdir()
        (out / "version_0" / "results.json").write_text("{}")
    before = sorted((p.relative_to(out), p.read_bytes()) for p in out.rglob("*") if p.is_file())
    assert compress(*args, str(out), "--overwrite") == 2
    assert "--overwrite replaces only" in capsys.readouterr().err or holds == "compressed_runs"
    assert sorted((p.relative_to(out), p.read_bytes()) for p in out.rglob("*") if p.is_file()) == before


@pytest.mark.parametrize("path", sorted((CONFIGS / "compress").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_compress_config_parses_into_its_method(path):
    from lit_embed._compat import instantiate
    argv = ["--config", str(path), "--ckpt", "CKPT", "--out", "OUT"]
    parsing = parser(named_method(argv))
    arguments = instantiate(parsing, parsing.parse_args(argv))
    assert arguments.method == path.stem and 0.0 < arguments.retention <= 1.0


def test_a_new_method_is_one_class_found_by_name(tmp_path, capsys):
    """A compression method is a CompressionMethod subclass: defining it registers its name for --method."""
    from lit_embed.compress.methods import CompressionMethod, method_named
    from lit_embed.compress.partial import with_common_rows
    from lit_embed.embeddings import UnkEmbedding

    @dataclass
    class RowOptions:
        """Args:
            row: the common row every rare token takes.
        """

        row: int = 0

    class FirstCommon(CompressionMethod):
        """Rare tokens take one row of the common table (a toy: row 0 is a special token's)."""

        name = "first_common"
        Options = RowOptions

        def fit(self, job):
            strategy = with_common_rows(UnkEmbedding, job.weight, job.common_ids)
            strategy.unk_row.fill_(self.options.row)
            self.details["row"] = self.options.row
            return {None: strategy}

    try:
        assert isinstance(method_named("first_common"), FirstCommon)
        out = tmp_path / "out"
        assert compress("--ckpt", "all-MiniLM-L6-v2", "--data", SAMPLE_CORPUS, "--method", "first_common",
                        "--retention", "0.5", "--row", "3", "--out", str(out)) == 0
        report = read_report(out)
        assert (report["method"], report["options"], report["details"]) == ("first_common", {"row": 3}, {"row": 3})
        strategy = load_compact(out / "hf")
        assert torch.equal(strategy(strategy.rare_ids()[:2]), strategy.common[3].expand(2, -1))
        capsys.readouterr()
        assert compress("--ckpt", "all-MiniLM-L6-v2", "--method", "first_common", "--rows", "3", "--out", "x") == 2
        err = capsys.readouterr().err
        assert "unrecognized arguments: --rows 3 (method 'first_common' takes --row)" in err and "did you mean --row?" in err
        assert compress("--ckpt", "all-MiniLM-L6-v2", "--data", SAMPLE_CORPUS, "--method", "sparse_codng",
                        "--out", str(tmp_path / "x")) == 2
        assert "did you mean 'sparse_coding'?" in capsys.readouterr().err
    finally:
        CompressionMethod.registry.pop("first_common")


def test_a_killed_compress_leaves_nothing_the_next_one_trips_on(finetuned, tmp_path):
    """A compress killed mid-way leaves its hidden .OUT.building-HOST-PID folder; the next compress to the same
    place removes it once that process is gone, and never a live process's."""
    import socket
    import subprocess
    import sys

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        host = socket.gethostname()
        stale, busy = (tmp_path / f".out.building-{host}-{p.pid}" for p in (dead, alive))
        for folder in (stale, busy):
            folder.mkdir()
            (folder / "model.ckpt").write_bytes(b"half")
        assert compress("--ckpt", "all-MiniLM-L6-v2", "--data", SAMPLE_CORPUS, "--k", "2", "--out", str(tmp_path / "out")) == 0
        assert not stale.exists() and busy.exists() and (tmp_path / "out" / "report.json").is_file()
    finally:
        alive.kill()
        alive.wait()


@pytest.mark.parametrize("given", ["flag", "config", "python"])
def test_an_option_the_method_does_not_take_is_refused_naming_its_options(given, tmp_path, capsys):
    """Options belong to their method: another method's (or a misspelt) option is one clear line, exit 2, no output,
    whether given on the command line, in a compress config or to compress() from Python."""
    from lit_embed.commands.compress import compress as compress_function

    out = tmp_path / "out"
    base = ["--ckpt", "all-MiniLM-L6-v2", "--data", SAMPLE_CORPUS, "--out", str(out)]
    if given == "python":
        with pytest.raises(ConfigError, match=r"'max_step' is not an option of compression method 'aq': did you mean "
                                              r"'max_steps'\? its options: codebooks, codewords, epochs, max_steps"):
            compress_function("all-MiniLM-L6-v2", str(out), method="aq", data=SAMPLE_CORPUS, options={"max_step": 2})
    else:
        if given == "flag":
            args = ["--method", "unk", "--k", "3"]
        else:
            (tmp_path / "unk.yaml").write_text("method: unk\nk: 3\n")
            args = ["--config", str(tmp_path / "unk.yaml")]
        assert compress(*base, *args) == 2
        err = capsys.readouterr().err
        assert "(method 'unk' takes no options; --k is an option of --method pca, sparse_coding)" in err
        assert len(err.strip().splitlines()) == 2  # the error, and where help is (nothing is close to --k)
    assert not out.exists()


# -- fit: any zoo strategy fitted to a pretrained table ------------------------------------------------------------


def test_fit_sizes_a_zoo_strategy_to_a_budget_on_the_packaged_minilm(minilm_matrix, tmp_path):
    """`--method fit --strategy YAML --budget F`, the budget given in place of the YAML's (a sweep gives one file
    several): the hashing trick at 10% of MiniLM's table, a few steps; the report states the loss, the stopping rule,
    what the budget chose, and the fit's figures."""
    strategy_file = tmp_path / "hashing_trick_50.yaml"
    config = yaml.safe_load((CONFIGS / "embedding" / "hashing_trick.yaml").read_text())
    config["init_args"] = {**config["init_args"], "budget": 0.5}
    strategy_file.write_text(yaml.safe_dump(config))
    out = tmp_path / "out"
    assert compress("--ckpt", "all-MiniLM-L6-v2", "--data", SAMPLE_CORPUS, "--method", "fit", "--strategy",
                    str(strategy_file), "--budget", "0.1", "--solver", "gradient", "--max_steps", "6", "--eval_every", "3", "--tolerance", "0",
                    "--out", str(out)) == 0
    report = read_report(out)
    dense = minilm_matrix.numel()
    after = report["parameters"]["embedding"]["after"]
    assert abs(after - 0.1 * dense) <= 0.01 * 0.1 * dense
    strategy = load_compact(out / "hf")
    assert type(strategy).__name__ == "HashingTrickEmbedding" and strategy.num_embedding_parameters() == after
    details = report["details"]
    assert details["strategy"] == "HashingTrickEmbedding" and "num_buckets=" in details["budget"]
    assert details["loss"].startswith("mean squared error of each rebuilt row, weighted by log(2 + the token's count")
    assert details["stopping rule"].startswith("6 steps, or a whole-table loss (every 3 steps) improving by less than 0")
    assert details["steps"] == 6 and details["loss after"] < details["loss before"]
    error = (strategy.full_weight().detach().double() - minilm_matrix.double()).pow(2).mean(-1)
    assert report["mse"]["all"] == pytest.approx(float(error.mean()), rel=1e-6)
    assert report["options"]["strategy"] == str(strategy_file) and report["options"]["budget"] == 0.1
    assert "What fit did:" in (out / "report.md").read_text()


def test_a_strategy_fitted_to_a_tiny_model_fine_tunes_tests_and_exports(tmp_path, monkeypatch):
    """A tiny fine-tuned classifier's dense table, fitted into the QR strategy: the output fine-tunes from it (the
    run starts from the fitted table), tests, and exports like any compress output."""
    from lit_embed.checkpoints.format import FACTS, describe
    from lit_embed.embeddings import DenseEmbedding
    from lit_embed.models import SequenceClassifier
    from tests.helpers import tiny_encoder

    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    model = SequenceClassifier("topics", encoder=tiny_encoder(16), embedding=DenseEmbedding, vocab_size=30522)
    torch.save({"state_dict": model.state_dict(), FACTS: describe(model, "all-MiniLM-L6-v2", None)}, tmp_path / "tiny.ckpt")
    data = {"class_path": "lit_embed.data.TaskDataModule", "init_args": {
        "task": "topics", "tokenizer": "all-MiniLM-L6-v2", "protocol": "split_train", "max_length": 64, "batch_size": 8}}
    (tmp_path / "data.yaml").write_text(yaml.safe_dump({"data": data}))
    out = tmp_path / "qr"
    assert compress("--ckpt", str(tmp_path / "tiny.ckpt"), "--data", str(tmp_path / "data.yaml"), "--method", "fit",
                    "--strategy", str(CONFIGS / "embedding" / "qr.yaml"), "--max_steps", "5", "--out", str(out)) == 0
    fitted = load_compressed(out).embedding
    assert type(fitted).__name__ == "QREmbedding"
    assert main(["fit", "--config", str(out / "config.yaml"), "--model.init_args.checkpoint", str(out / "model.ckpt"),
                 "--model.init_args.optim.lr", "1e-12", "--trainer.max_steps", "1", "--trainer.limit_val_batches", "1",
                 "--trainer.limit_test_batches", "1", "--trainer.logger", "false", *QUIET]) == 0
    tuned = next(p for p in out.rglob("last.ckpt"))  # written at training's end, since a test follows the fit
    state = torch.load(tuned, map_location="cpu", weights_only=True)["state_dict"]
    for name, value in fitted.state_dict().items():  # one step at learning rate 1e-12: the fitted table, all but still
        assert torch.allclose(state[f"embedding.{name}"], value, rtol=0, atol=1e-9), name
    assert "test/score" in json.loads((out / "results.json").read_text())["metrics"]
    assert main(["export", "--ckpt", str(out / "model.ckpt"), "--out", str(tmp_path / "exported")]) == 0
    assert (tmp_path / "exported" / "config.json").is_file()

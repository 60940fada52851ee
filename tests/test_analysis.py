"""Embedding analysis: similarity and PCA against brute force, PNG plots from a callback and `lit-embed analyze`."""

from __future__ import annotations

import functools
import itertools
import json

import numpy as np
import pytest
import torch

from lit_embed.analysis.embedding_space import embedding_pca, inter_intra_similarity
from lit_embed.commands import main
from lit_embed.embeddings import DenseEmbedding, SubspaceEmbedding

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def brute_force_similarity(vectors: np.ndarray, types: list[int]) -> tuple[float, float]:
    """The paper's definitions, pair by pair: S_intra averages over types the mean cosine of pairs of a
    type's occurrences; S_inter averages over pairs of types the mean cosine of their occurrences."""
    units = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    groups = {t: units[[i for i, ti in enumerate(types) if ti == t]] for t in sorted(set(types))}
    intra = [np.mean([a @ b for (i, a), (j, b) in itertools.product(enumerate(g), repeat=2) if i != j])
             for g in groups.values() if len(g) > 1]
    inter = [np.mean(groups[s] @ groups[t].T) for s, t in itertools.permutations(groups, 2)]
    return float(np.mean(inter)), float(np.mean(intra))


def test_inter_and_intra_similarity_match_the_pairwise_definitions():
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(40, 6)) + 0.5
    types = [int(t) for t in rng.integers(0, 7, 40)]
    types[-1] = 99  # a type seen once counts for S_inter only
    inter, intra = inter_intra_similarity(torch.tensor(vectors), torch.tensor(types))
    assert (inter, intra) == pytest.approx(brute_force_similarity(vectors, types), rel=1e-9)
    same = torch.ones(5, 3)
    assert inter_intra_similarity(same, torch.tensor([0, 0, 1, 1, 2])) == pytest.approx((1.0, 1.0))


def test_pca_explained_variance_and_projection_match_numpy():
    strategy = SubspaceEmbedding(vocab_size=500, hidden_size=12, num_tables=3)
    result = embedding_pca(strategy, points=100, chunk=64)  # several chunks
    weight = strategy.full_weight().detach().double().numpy()
    eigenvalues = np.linalg.eigvalsh(np.cov(weight, rowvar=False))[::-1]
    np.testing.assert_allclose(result["explained_variance_ratio"].numpy(), eigenvalues / eigenvalues.sum(), atol=1e-9)
    assert result["vectors"] == 500 and result["projected"].shape == (100, 3)
    # the points are the centred vectors' coordinates on the top components (up to each axis' sign)
    chosen = torch.randperm(500, generator=torch.Generator().manual_seed(0))[:100].sort().values
    centred = weight[chosen.numpy()] - weight.mean(0)
    _, _, axes = np.linalg.svd(weight - weight.mean(0), full_matrices=False)
    np.testing.assert_allclose(np.abs(result["projected"].numpy()), np.abs(centred @ axes[:3].T), atol=1e-4)
    # coloured by each token's last sub-embedding (its row in the last table)
    assert torch.equal(result["colour"], strategy.codes[chosen, -1])
    assert embedding_pca(DenseEmbedding(50, 8))["colour"] is None


def assert_png(path) -> None:
    from PIL import Image

    assert path.read_bytes()[:8] == PNG_SIGNATURE
    with Image.open(path) as image:
        image.verify()
    with Image.open(path) as image:
        assert image.size[0] > 300 and image.size[1] > 200


def test_the_analysis_callback_saves_plots_and_sends_them_to_tensorboard(demo_runs):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for run in demo_runs.values():
        folder = run / "analysis"
        assert_png(folder / "embedding_pca.png")
        assert_png(folder / "similarity.png")
        assert_png(folder / "layer_pca.png")
        summary = json.loads((folder / "analysis.json").read_text())
        layer_pca = summary["layer_pca"]  # Figures 4-10: per layer, with the/to/and/of/a highlighted
        assert [layer["layer"] for layer in layer_pca["layers"]] == [0, 1, 2]
        seen = {word for word, count in layer_pca["highlighted"].items() if count}
        assert {"the", "and", "a"} <= seen and layer_pca["tokens"] <= 3000  # the sample corpus has no "to" or "of"
        assert all(set(layer["centroids"]) == seen for layer in layer_pca["layers"])
        layers = summary["similarity"]["layers"]
        assert [layer["layer"] for layer in layers] == [0, 1, 2]  # the embedding output, then 2 layers
        assert all(-1 <= layer["inter"] <= 1 and -1 <= layer["intra"] <= 1 for layer in layers)
        assert 0 < summary["pca"]["r_3"] < 1 and summary["pca"]["vectors"] == 30522
        events = EventAccumulator(str(run))
        events.Reload()
        assert {"analysis/embedding_pca", "analysis/similarity", "analysis/layer_pca"} <= set(events.Tags()["images"])
    coloured = json.loads((demo_runs["subspace"] / "analysis" / "analysis.json").read_text())["pca"]
    assert coloured["coloured_by_last_sub_embedding"] and coloured["plotted"] == 2000
    dense = json.loads((demo_runs["dense"] / "analysis" / "analysis.json").read_text())["pca"]
    assert not dense["coloured_by_last_sub_embedding"]


def test_analyze_a_checkpoint_from_the_command_line(demo_runs, tmp_path, capsys):
    run = demo_runs["subspace"]
    out = tmp_path / "plots"
    assert main(["analyze", "--ckpt", str(run), "--max-texts", "20", "--points", "500", "--out", str(out),
                 "--no-tensorboard"]) == 0
    assert_png(out / "embedding_pca.png")
    assert_png(out / "similarity.png")
    assert_png(out / "layer_pca.png")
    printed = capsys.readouterr().out
    assert '"strategy": "SubspaceEmbedding"' in printed and "wrote" in printed
    summary = json.loads((out / "analysis.json").read_text())
    assert summary["texts"] == 20
    assert {"what": "checkpoint", "given": str(run), "file": str(run / "checkpoints/epoch=0-step=10.ckpt"), "step": 10,
            "why": "the run's only checkpoint"} in summary["checkpoints_taken"]  # which file the run folder gave


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--ckpt", "missing.ckpt"], "checkpoint 'missing.ckpt' does not exist"),
        (["--ckpt", "x.ckpt", "--max-texts", "0"], "--max-texts=0"),
    ],
)
def test_analyze_bad_input_exits_non_zero(argv, message, capsys):
    assert main(["analyze", *argv]) == 2
    assert message in capsys.readouterr().err


def test_analyze_refuses_a_checkpoint_not_written_by_fit(tmp_path, capsys):
    torch.save({"state_dict": {}, "hyper_parameters": {}}, tmp_path / "bare.ckpt")
    assert main(["analyze", "--ckpt", str(tmp_path / "bare.ckpt")]) == 2
    assert "not written by `lit-embed fit`" in capsys.readouterr().err


def test_hidden_states_of_a_strategy_without_vocabulary_ids(monkeypatch):
    """Strategies with an unlimited vocabulary are analysed on the codes the sample text gives."""
    from lit_embed.analysis.embedding_space import analyse
    from lit_embed.models import Encoder, MaskedLM

    model = MaskedLM(Encoder(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32), vocab_size=30522,
                     embedding=functools.partial(DenseEmbedding))
    monkeypatch.setattr(model.embedding, "vocab_size", None)  # as a hash strategy: no ids to enumerate
    result = analyse(model, ["the cat sat on the mat", "the dog sat"], "all-MiniLM-L6-v2", points=50)
    assert result["pca"]["vectors"] == result["similarity"]["types"] == 6  # the, cat, sat, on, mat, dog
    assert result["pca"]["colour"] is None


def test_layer_pca_projects_each_layer_on_its_top_components_and_marks_the_highlighted_tokens():
    from lit_embed.analysis.embedding_space import analyse, layer_pca
    from lit_embed.models import Encoder, MaskedLM

    states = torch.randn(60, 8, generator=torch.Generator().manual_seed(0)) * torch.arange(1.0, 9.0)
    result = layer_pca(states)
    centred = states.double().numpy() - states.double().numpy().mean(0)
    _, singular, axes = np.linalg.svd(centred, full_matrices=False)
    np.testing.assert_allclose(np.abs(result["projected"].numpy()), np.abs(centred @ axes[:3].T), atol=1e-4)
    np.testing.assert_allclose(result["explained_variance_ratio"].numpy(), (singular**2 / (singular**2).sum())[:3], atol=1e-6)

    model = MaskedLM(Encoder(hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32), vocab_size=30522,
                     embedding=functools.partial(DenseEmbedding))
    texts = ["The cat sat on the mat and a dog ran to the end of it", "the end"]
    similarity = analyse(model, texts, "all-MiniLM-L6-v2", points=50)["similarity"]
    assert len(similarity["layer_pca"]) == 3 and similarity["layer_pca"][0]["projected"].shape == (17, 3)
    counts = np.bincount(similarity["highlighted"].numpy() + 1, minlength=6)  # -1 (others), the, to, and, of, a
    assert counts.tolist() == [17 - 8, 4, 1, 1, 1, 1]

"""The embedding-space analysis of the k-sub-embedding paper, for any strategy.

* PCA of the strategy's embedding vectors (its Figure 2): a 3-d scatter of the first three principal
  components, coloured by each token's last sub-embedding where the strategy composes its vectors
  from shared components, and the explained variance ratio ``r_p = sum_{i<=p} s_i / sum_i s_i`` of
  the eigenvalues ``s_i`` of the vectors' covariance matrix.
* Layer-wise similarity of hidden states (its Figure 3), on sample text: ``S_intra(l)`` is the mean
  cosine between two occurrences of the same token type, averaged over types;
  ``S_inter(l)`` the mean cosine between occurrences of two different types, averaged over pairs of
  types (Cai et al. 2021 draw one occurrence per type; this is that draw's expectation, without
  sampling noise). Special tokens and padding are left out; layer 0 is the embedding layer's output.
* Per-layer PCA of hidden states (its Figures 4-10): each layer's hidden states of the sample text's
  tokens, projected on that layer's first three principal components, with the occurrences of
  ``the``, ``to``, ``and``, ``of`` and ``a`` highlighted.

``lit-embed analyze --ckpt FILE`` runs it on a checkpoint; :class:`lit_embed.callbacks.EmbeddingAnalysis`
at the end of training. Both save PNGs and ``analysis.json`` and send the figures to TensorBoard.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from lit_embed.data.collate import PadCollator
from lit_embed.data.sources import load_files
from lit_embed.errors import ConfigError, OutputExistsError
from lit_embed.storage.files import write_atomic, write_json_atomic, writing

ANALYSIS_DIR = "analysis"
#: The tokens the k-sub-embedding paper's Figures 4-10 highlight in each layer's hidden states.
HIGHLIGHTED = ("the", "to", "and", "of", "a")
#: At most this many tokens in each layer's scatter (every layer's states of them are kept in memory).
LAYER_POINTS = 3000


# -- geometry --------------------------------------------------------------------------------------
def type_sums(vectors: Tensor, types: Tensor, num_types: int) -> tuple[Tensor, Tensor]:
    """Per type: the sum of its occurrences' unit vectors ``(T, d)`` and its count ``(T,)`` (float64)."""
    units = torch.nn.functional.normalize(vectors.double(), dim=-1)
    sums = torch.zeros(num_types, units.shape[-1], dtype=torch.float64, device=units.device)
    sums.index_add_(0, types, units)
    counts = torch.bincount(types, minlength=num_types).double()
    return sums, counts


def similarity_from_sums(sums: Tensor, counts: Tensor) -> tuple[float, float]:
    """``(S_inter, S_intra)`` from :func:`type_sums` (``nan`` where too few types or repeats).

    With ``S_t`` the sum of type t's unit vectors: the pairs of distinct occurrences of t add up to
    ``|S_t|^2 - n_t``; the mean cosine between types a and b is ``m_a . m_b`` with ``m_t = S_t / n_t``.
    """
    present = counts > 0
    sums, counts = sums[present], counts[present]
    means = sums / counts[:, None]
    types = len(counts)
    inter = float("nan")
    if types >= 2:
        inter = float((means.sum(0).square().sum() - means.square().sum()) / (types * (types - 1)))
    repeated = counts >= 2
    intra = float("nan")
    if repeated.any():
        n = counts[repeated]
        intra = float(((sums[repeated].square().sum(1) - n) / (n * (n - 1))).mean())
    return inter, intra


def inter_intra_similarity(vectors: Tensor, types: Tensor) -> tuple[float, float]:
    """``(S_inter, S_intra)`` of ``vectors`` ``(n, d)`` whose token types are ``types`` ``(n,)``."""
    unique, inverse = torch.unique(types, return_inverse=True)
    return similarity_from_sums(*type_sums(vectors, inverse, len(unique)))


@torch.no_grad()
def embedding_pca(strategy, codes: Tensor | None = None, points: int = 10_000, chunk: int = 8192) -> dict:
    """PCA of the strategy's vectors for every vocabulary id (or for ``codes``, where it has no vocabulary).

    The covariance is accumulated in chunks (no ``N x d`` matrix is kept); ``points`` vectors, drawn
    with a fixed seed, are projected for the scatter.
    """
    if codes is None:
        if strategy.vocab_size is None:
            raise ConfigError(f"{type(strategy).__name__} has no vocabulary to enumerate: pass the codes to analyse")
        codes = torch.arange(strategy.vocab_size)
    device = strategy.device
    codes = codes.to(device)
    count = len(codes)
    if count < 2:
        raise ConfigError(f"PCA needs at least 2 embedding vectors, got {count}: give more text")
    total = torch.zeros(strategy.hidden_size, dtype=torch.float64, device=device)
    gram = torch.zeros(strategy.hidden_size, strategy.hidden_size, dtype=torch.float64, device=device)
    for part in codes.split(chunk):
        vectors = strategy(part).double()
        total += vectors.sum(0)
        gram += vectors.T @ vectors
    mean = total / count
    covariance = (gram - count * torch.outer(mean, mean)) / (count - 1)
    eigenvalues, eigenvectors = torch.linalg.eigh(covariance)
    eigenvalues, eigenvectors = eigenvalues.flip(0).clamp_min(0), eigenvectors.flip(1)
    ratios = eigenvalues / eigenvalues.sum()
    chosen = torch.randperm(count, generator=torch.Generator().manual_seed(0))[:points].sort().values.to(device)
    projected = (strategy(codes[chosen]).double() - mean) @ eigenvectors[:, :3]
    components = strategy.component_codes() if codes.dim() == 1 else None
    colour = components[codes[chosen], -1] if components is not None else None
    return {
        "vectors": count,
        "projected": projected.float().cpu(),
        "colour": None if colour is None else colour.cpu(),
        "explained_variance_ratio": ratios.cpu(),
    }


# -- hidden states on text -------------------------------------------------------------------------
def text_batches(model, texts: list[str], tokenizer: str, batch_size: int = 16) -> list[dict[str, Tensor]]:
    """``texts`` as the model's codes, wrapped in its specials, cut to the backbone's length, padded."""
    encoder = model.text_encoder(tokenizer)
    cls, sep = encoder.special_code("cls"), encoder.special_code("sep")
    body = model.encoder.max_length - 2
    items = [{"codes": np.concatenate([cls[None], codes[:body], sep[None]])} for codes in encoder.encode(texts) if len(codes)]
    if not items:
        raise ConfigError("the sample text gives no tokens: pass a file with text (--text)")
    collate = PadCollator(encoder)
    return [collate(items[i : i + batch_size]) for i in range(0, len(items), batch_size)]


def highlighted_codes(encoder, words: tuple[str, ...] = HIGHLIGHTED) -> list[list[np.ndarray]]:
    """The codes each of ``words`` takes where it is one token: alone, after a space, and after another word
    (a byte-level BPE codes `` the`` apart from ``the``)."""
    forms = []
    for word in words:
        alone, spaced, running = encoder.encode([word, f" {word}", f"x {word}"])
        codes = [c[0] for c in (alone, spaced) if len(c) == 1]
        if len(running) == 2:
            codes.append(running[1])
        forms.append(codes)
    return forms


@torch.no_grad()
def hidden_state_similarity(model, batches: list[dict[str, Tensor]], points: int = 3000,
                            highlight: list[list[np.ndarray]] | None = None) -> dict:
    """``S_inter`` and ``S_intra`` of every layer's hidden states over the non-special tokens of ``batches``,
    and each layer's PCA of up to ``points`` of those tokens (drawn with a fixed seed) with the occurrences of
    the ``highlight`` codes (one list of codes per word) marked."""
    kept = [b["attention_mask"].bool() & ~b["special_mask"] for b in batches]
    codes = torch.cat([b["codes"][k] for b, k in zip(batches, kept)])
    if not len(codes):
        raise ConfigError("the sample text has no tokens besides specials: pass a file with text (--text)")
    unique, inverse = torch.unique(codes.reshape(len(codes), -1), dim=0, return_inverse=True)
    device = model.device
    drawn = torch.zeros(len(codes), dtype=torch.bool)
    drawn[torch.randperm(len(codes), generator=torch.Generator().manual_seed(0))[:points]] = True
    sums = counts = None
    kept_states: list[list[Tensor]] = []
    start = 0
    for batch, keep in zip(batches, kept):
        inputs = {k: v.to(device) for k, v in batch.items()}
        states = model.encode(inputs, output_hidden_states=True).hidden_states
        types = inverse[start : start + int(keep.sum())].to(device)
        chosen = drawn[start : start + len(types)].to(device)
        kept_states.append([layer[keep.to(device)][chosen].float().cpu() for layer in states])
        start += len(types)
        parts = [type_sums(layer[keep.to(device)], types, len(unique)) for layer in states]
        if sums is None:
            sums, counts = [p[0] for p in parts], parts[0][1]
        else:
            sums = [s + p[0] for s, p in zip(sums, parts)]
            counts = counts + parts[0][1]
    layers = []
    for index, layer_sums in enumerate(sums):
        inter, intra = similarity_from_sums(layer_sums, counts)
        layers.append({"layer": index, "inter": inter, "intra": intra})
    word = torch.full((len(codes),), -1, dtype=torch.long)  # which highlighted word each token is, else -1
    flat = codes.reshape(len(codes), -1)
    for index, forms in enumerate(highlight or []):
        for form in forms:
            word[(flat == torch.as_tensor(form).reshape(1, -1)).all(1)] = index
    by_layer = [torch.cat(parts) for parts in zip(*kept_states)]
    return {"tokens": len(codes), "types": len(unique), "layers": layers, "unique_codes": unique,
            "layer_pca": [layer_pca(states) for states in by_layer], "highlighted": word[drawn]}


def layer_pca(states: Tensor) -> dict:
    """The ``(n, 3)`` coordinates of ``states`` on their first three principal components, and the share of
    variance each explains."""
    centred = states.double() - states.double().mean(0)
    _, singular, axes = torch.linalg.svd(centred, full_matrices=False)
    variance = singular**2
    ratios = variance / variance.sum() if variance.sum() > 0 else variance
    projected = torch.zeros(len(states), 3, dtype=torch.float64)
    width = min(3, axes.shape[0])
    projected[:, :width] = centred @ axes[:width].T
    return {"projected": projected.float(), "explained_variance_ratio": ratios[:3].float()}


def analyse(model, texts: list[str], tokenizer: str, points: int = 10_000, batch_size: int = 16) -> dict:
    """The analyses of ``model`` (an EmbeddingModule) on ``texts``; the model is left as it was."""
    was_training = model.training
    model.eval()
    try:
        model.embedding.prepare()
        highlight = highlighted_codes(model.text_encoder(tokenizer))
        batches = text_batches(model, texts, tokenizer, batch_size)
        similarity = hidden_state_similarity(model, batches, min(points, LAYER_POINTS), highlight)
        strategy = model.embedding
        codes = None if strategy.vocab_size is not None else similarity["unique_codes"].reshape(-1, *strategy.code_shape)
        pca = embedding_pca(strategy, codes, points=points)
    finally:
        model.train(was_training)
    del similarity["unique_codes"]
    return {"strategy": type(model.embedding).__name__, "texts": len(texts), "pca": pca, "similarity": similarity}


# -- figures and files -----------------------------------------------------------------------------
def pca_figure(result: dict):
    from matplotlib.figure import Figure

    pca = result["pca"]
    ratios = pca["explained_variance_ratio"].numpy()
    cumulative = np.cumsum(ratios)
    figure = Figure(figsize=(11, 5), layout="constrained")
    scatter_axes = figure.add_subplot(1, 2, 1, projection="3d")
    xyz = pca["projected"].numpy()
    if pca["colour"] is not None:
        colour = pca["colour"].numpy()
        drawn = scatter_axes.scatter(xyz[:, 0], xyz[:, 1], xyz[:, 2], c=colour, cmap="turbo", s=3, alpha=0.8)
        figure.colorbar(drawn, ax=scatter_axes, shrink=0.6, label="last sub-embedding index")
    else:
        scatter_axes.scatter(xyz[:, 0], xyz[:, 1], xyz[:, 2], color="tab:blue", s=3, alpha=0.8)
    for axis, setter in enumerate((scatter_axes.set_xlabel, scatter_axes.set_ylabel, scatter_axes.set_zlabel)):
        setter(f"PC{axis + 1} ({100 * ratios[axis]:.1f}%)")
    scatter_axes.set_title(f"{result['strategy']}: {len(xyz)} of {pca['vectors']} vectors, $r_3$ = {cumulative[2]:.3f}")
    curve = figure.add_subplot(1, 2, 2)
    curve.plot(np.arange(1, len(cumulative) + 1), cumulative, marker=".")
    curve.set_xlabel("number of principal components p")
    curve.set_ylabel("explained variance ratio $r_p$")
    curve.set_ylim(0, 1.02)
    curve.grid(alpha=0.3)
    return figure


def similarity_figure(result: dict):
    from matplotlib.figure import Figure

    layers = result["similarity"]["layers"]
    x = [layer["layer"] for layer in layers]
    figure = Figure(figsize=(6, 4), layout="constrained")
    axes = figure.add_subplot()
    axes.plot(x, [layer["inter"] for layer in layers], marker="o", label="$S_{inter}$")
    axes.plot(x, [layer["intra"] for layer in layers], marker="s", label="$S_{intra}$")
    axes.set_xticks(x, ["emb", *map(str, x[1:])])
    axes.set_xlabel("layer")
    axes.set_ylabel("mean cosine similarity")
    axes.set_ylim(min(0.0, *(layer["inter"] for layer in layers)) - 0.05, 1.05)
    axes.set_title(f"{result['strategy']}: hidden states of {result['similarity']['tokens']} tokens")
    axes.legend()
    axes.grid(alpha=0.3)
    return figure


def layer_pca_figure(result: dict):
    """One 3-d scatter per layer, the highlighted tokens in colour over the others in grey (Figures 4-10)."""
    from matplotlib.figure import Figure

    similarity = result["similarity"]
    layers, word = similarity["layer_pca"], similarity["highlighted"].numpy()
    columns = min(4, len(layers))
    rows = -(-len(layers) // columns)
    figure = Figure(figsize=(3.6 * columns, 3.4 * rows), layout="constrained")
    for index, layer in enumerate(layers):
        axes = figure.add_subplot(rows, columns, index + 1, projection="3d")
        xyz = layer["projected"].numpy()
        rest = word < 0
        axes.scatter(xyz[rest, 0], xyz[rest, 1], xyz[rest, 2], color="lightgrey", s=2, alpha=0.5)
        for w, name in enumerate(HIGHLIGHTED):
            mine = word == w
            if mine.any():
                axes.scatter(xyz[mine, 0], xyz[mine, 1], xyz[mine, 2], s=6, label=name)
        axes.set_title("embedding" if index == 0 else f"layer {index}", fontsize=9)
        axes.tick_params(labelsize=6)
        if index == 0 and (word >= 0).any():
            axes.legend(fontsize=7, loc="upper left")
    figure.suptitle(f"{result['strategy']}: PCA of each layer's hidden states, {len(word)} tokens")
    return figure


#: The figures, by file name: the k-sub-embedding paper's Figure 2, Figure 3 and Figures 4-10.
FIGURES = {"embedding_pca": pca_figure, "similarity": similarity_figure, "layer_pca": layer_pca_figure}
#: What an analysis folder holds.
ANALYSIS_FILES = frozenset({*(f"{name}.png" for name in FIGURES), "analysis.json"})


def draw(result: dict) -> dict:
    """The figures of :data:`FIGURES`, drawn from ``analyse``'s result."""
    return {name: build(result) for name, build in FIGURES.items()}


def save_analysis(result: dict, out_dir: str | os.PathLike, writer=None, step: int = 0, figures: dict | None = None) -> list[Path]:
    """Write ``embedding_pca.png``, ``similarity.png``, ``layer_pca.png`` and ``analysis.json``; then send the
    figures (``figures``, drawn where not given) to ``writer``, a TensorBoard ``SummaryWriter`` (a TensorBoardLogger's
    ``experiment``) or ``None``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    figures = figures or draw(result)
    paths = [_save_png(figure, out / f"{name}.png") for name, figure in figures.items()]
    pca = result["pca"]
    ratios = pca["explained_variance_ratio"]
    summary = {
        "strategy": result["strategy"],
        "texts": result["texts"],
        "pca": {
            "vectors": pca["vectors"],
            "plotted": len(pca["projected"]),
            "coloured_by_last_sub_embedding": pca["colour"] is not None,
            "explained_variance_ratio": ratios[:10].tolist(),
            "r_3": float(ratios[:3].sum()),
        },
        "similarity": {k: v for k, v in result["similarity"].items() if k not in ("layer_pca", "highlighted")},
        "layer_pca": layer_pca_summary(result["similarity"]),
    }
    if "checkpoints_taken" in result:  # lit-embed analyze's: which checkpoint file it took, and why
        summary["checkpoints_taken"] = result["checkpoints_taken"]
    paths.append(write_json_atomic(out / "analysis.json", summary))
    if writer is not None:
        with writing(writer.log_dir):  # TensorBoard's event file, appended to
            for name, figure in figures.items():
                writer.add_figure(f"analysis/{name}", figure, global_step=step)
    return paths


def earlier_analysis(out: Path) -> None:
    """Refuse to replace ``out`` unless it holds an analysis and nothing else (``lit-embed analyze --out``)."""
    found = {p.name for p in out.iterdir()} if out.is_dir() else set()
    if "analysis.json" not in found or found - ANALYSIS_FILES:
        raise OutputExistsError(f"--out {str(out)!r} exists and is not an earlier analysis (analysis.json and its "
                                f"figures, nothing else): choose another --out")


def layer_pca_summary(similarity: dict) -> dict:
    """The figure's data: per layer, the variance its three components explain and each highlighted word's
    centroid on them; how many drawn tokens each word has."""
    word = similarity["highlighted"]
    layers = []
    for index, layer in enumerate(similarity["layer_pca"]):
        centroids = {name: layer["projected"][word == w].mean(0).tolist()
                     for w, name in enumerate(HIGHLIGHTED) if (word == w).any()}
        layers.append({"layer": index, "explained_variance_ratio": layer["explained_variance_ratio"].tolist(),
                       "centroids": centroids})
    return {"tokens": len(word), "highlighted": {name: int((word == w).sum()) for w, name in enumerate(HIGHLIGHTED)},
            "layers": layers}


def _save_png(figure, path: Path) -> Path:
    image = io.BytesIO()
    figure.savefig(image, format="png", dpi=110)
    return write_atomic(path, image.getvalue())


# -- lit-embed analyze -----------------------------------------------------------------------------
def read_texts(name: str, limit: int) -> list[str]:
    """Up to ``limit`` non-empty texts from a local file or a shipped sample (``sample-corpus``)."""
    texts = []
    for text in load_files([name])["text"]:
        if isinstance(text, str) and text.strip():
            texts.append(text)
            if len(texts) == limit:
                break
    return texts



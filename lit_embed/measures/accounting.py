"""The papers' figures against a baseline: PCR_All, PCR_Emb, PoEP (parameters), PRR (scores), speed-up; and the zoo's
unit beside them, the bytes the embedding needs at inference.

Position and token-type embeddings belong to the backbone, not to the embedding, for these figures.
"""

from __future__ import annotations

#: Bytes of one value of the dense table a budget's fraction and the bytes' share refer to (float32). Here, not in
#: lit_embed.embeddings.sizing, so that a report reads it without importing torch.
DENSE_VALUE_BYTES = 4


def compression(embedding: int, total: int, baseline_embedding: int, baseline_total: int) -> dict[str, float]:
    """PCR_All = 1 - params/baseline_params; PCR_Emb = 1 - emb/baseline_emb; PoEP = emb/total."""
    return {
        "pcr_all": 1.0 - total / baseline_total,
        "pcr_emb": 1.0 - embedding / baseline_embedding,
        "poep": embedding / total,
    }


def performance_retention(score: float, baseline_score: float) -> float | None:
    """PRR = score / baseline_score (HashFormers eq. 4); ``None`` where the baseline scored 0."""
    return None if baseline_score == 0 else score / baseline_score


def speed_up(time: float, baseline_time: float) -> float | None:
    """Speed-up rate = 1 / (time / baseline_time) (HashFormers eq. 8); ``None`` without a time."""
    return None if not time else baseline_time / time


def parameter_report(model, baseline: dict[str, int] | None = None) -> dict:
    """Counts of ``model`` (an :class:`~lit_embed.models.base.EmbeddingModule`) beside a baseline's.

    ``baseline`` holds another model's ``total_params`` and ``embedding_params`` (a baseline run's);
    by default the dense strategy on the same backbone and vocabulary.
    """
    own, base = model.parameter_counts(), baseline or model.baseline_counts()
    held = model.module_counts()
    report = {
        "strategy": type(model.embedding).__name__,
        "vocab_size": model.embedding.vocab_size,
        "hidden_size": model.encoder.hidden_size,
        "total_params": own["total_params"],
        "embedding_params": own["embedding_params"],
        "baseline_total_params": base["total_params"],
        "baseline_embedding_params": base["embedding_params"],
    }
    report.update(compression(own["embedding_params"], own["total_params"], base["embedding_params"], base["total_params"]))
    report["baseline_poep"] = base["embedding_params"] / base["total_params"]
    report.update(module_total_params=held["total_params"], module_embedding_params=held["embedding_params"],
                  counting_rules=model.counting_rules())
    report.update(embedding_bytes=model.embedding.inference_bytes(),
                  baseline_embedding_bytes=base.get("embedding_bytes", DENSE_VALUE_BYTES * base["embedding_params"]),
                  **{f"embedding_{key}": value for key, value in model.embedding.training_figures().items()})
    sizing = model.embedding.sizing  # what the strategy's budget chose, where it was given one
    report["sizing"] = None if sizing is None else {**sizing.as_dict(), "chosen": sizing.describe()}
    return report


def human(n: float) -> str:
    """Counts the way the papers print them: 25.7M, 115.2K, 2.0K."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f}{unit}"
    return str(int(n))


def human_bytes(n: float) -> str:
    """Bytes in decimal units: 46.9 MB, 1.2 KB, 512 B."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def format_parameters(report: dict) -> str:
    rows = [
        ("strategy", report["strategy"]),
        ("vocabulary x hidden", f"{report['vocab_size'] or 'unlimited'} x {report['hidden_size']}"),
        ("total params", f"{report['total_params']:,} ({human(report['total_params'])})"),
        ("embedding params", f"{report['embedding_params']:,} ({human(report['embedding_params'])})"),
        ("baseline total", f"{report['baseline_total_params']:,} ({human(report['baseline_total_params'])})"),
        ("baseline embedding", f"{report['baseline_embedding_params']:,} ({human(report['baseline_embedding_params'])})"),
        ("embedding bytes", f"{report['embedding_bytes']:,} at inference ({human_bytes(report['embedding_bytes'])}, "
                            f"{100 * report['embedding_bytes'] / report['baseline_embedding_bytes']:.3g}% of the baseline's "
                            f"{human_bytes(report['baseline_embedding_bytes'])}); training holds "
                            f"{report['embedding_training_bytes']:,}, {report['embedding_trainable_params']:,} trainable"),
        ("PCR_All", f"{100 * report['pcr_all']:.2f}%"),
        ("PCR_Emb", f"{100 * report['pcr_emb']:.2f}%"),
        ("PoEP", f"{100 * report['poep']:.2f}% (baseline {100 * report['baseline_poep']:.2f}%)"),
    ]
    if report.get("sizing"):
        rows.append(("budget", report["sizing"]["chosen"]))
    rules = report.get("counting_rules") or []
    if rules:  # the figures above are the papers' counts: the modules' own beside them, and the rules between
        rows.append(("held by the modules", f"{report['module_total_params']:,} total, "
                                            f"{report['module_embedding_params']:,} embedding"))
        rows += [("counted as" if i == 0 else "", rule) for i, rule in enumerate(rules)]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)

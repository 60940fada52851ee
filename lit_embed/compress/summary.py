"""What compression did, in the paper's terms: parameters (Tables 7 and 8), bytes, and how close the
rebuilt rows are to the original ones (Table 9)."""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F

from lit_embed.embeddings.base import EmbeddingStrategy, state_bytes
from lit_embed.measures.accounting import human
from lit_embed.models.base import EmbeddingModule
from lit_embed.models.encoder import count_parameters


def rebuilt_rows(strategy: EmbeddingStrategy, vocab_size: int) -> Tensor:
    """Every row the strategy gives, as a ``V x d`` table."""
    with torch.no_grad():
        return strategy(torch.arange(vocab_size))


def by_frequency(per_row: Tensor, common_ids: Tensor) -> dict[str, float | None]:
    """The mean of a per-row figure over the rare tokens, the common (frequent) ones and all."""
    common = torch.zeros(len(per_row), dtype=torch.bool)
    common[common_ids] = True
    return {
        "rare": float(per_row[~common].mean()) if (~common).any() else None,
        "common": float(per_row[common].mean()),
        "all": float(per_row.mean()),
    }


def rebuilt_cosines(weight: Tensor, strategy: EmbeddingStrategy, common_ids: Tensor) -> dict[str, float]:
    """Mean cosine similarity between each rebuilt row and the original one: over the rare tokens, the
    common ones and all (the paper's Table 9); and whether every common row is bit-identical."""
    rebuilt = rebuilt_rows(strategy, len(weight))
    figures = by_frequency(F.cosine_similarity(rebuilt.double(), weight.double(), dim=-1), common_ids)
    figures["common_rows_identical"] = bool(torch.equal(rebuilt[common_ids], weight[common_ids].to(rebuilt.dtype)))
    return figures


def rebuilt_errors(weight: Tensor, strategy: EmbeddingStrategy, common_ids: Tensor) -> dict[str, float]:
    """Mean squared error of the rebuilt rows (the mean over a row's values, then over the rows): rare, common, all."""
    rebuilt = rebuilt_rows(strategy, len(weight))
    return by_frequency((rebuilt.double() - weight.double()).pow(2).mean(-1), common_ids)


def counts(weight: Tensor, strategy: EmbeddingStrategy, model) -> dict:
    """Embedding and total parameters, and tensor bytes, before and after.

    ``model`` holds the dense table still (the lit-embed module, or the HuggingFace model). The total is
    every parameter of the model, task head included: Table 8 counts DistilBERT's 67.0M that way.
    """
    table = weight.numel()
    after = strategy.num_embedding_parameters()
    total = count_parameters(model)
    dense = model.embedding.weight if isinstance(model, EmbeddingModule) else model.get_input_embeddings().weight
    rest = state_bytes({k: v for k, v in model.state_dict().items() if v.data_ptr() != dense.data_ptr()})
    table_bytes, strategy_bytes = table * dense.element_size(), strategy.inference_bytes()
    return {
        "parameters": {
            "embedding": {"before": table, "after": after},
            "total": {"before": total, "after": total - table + after},
        },
        "bytes": {
            "embedding": {"before": table_bytes, "after": strategy_bytes},
            "model": {"before": rest + table_bytes, "after": rest + strategy_bytes},
        },
    }


def format_summary(report: dict) -> str:
    """The report as a short readable text (Markdown)."""
    v = report["vocabulary"]
    k = f", k={report['k']}" if report.get("k") is not None else ""
    lines = [
        f"# lit-embed compress: {report['method']} (retention {report['retention']}{k})",
        "",
        f"- model: {report['source']}",
        f"- data: {report['data']}",
        f"- vocabulary {v['size']} x {v['hidden']}: {v['seen']} tokens seen in the data, {v['kept']} kept; "
        + (f"common |V_C| = {v['common']} (special tokens included), rare |V_R| = {v['rare']}" if v.get("partial", True)
           else f"{report['method']} compresses the whole table (the frequent |V_C| = {v['common']} and rare rows below are "
                f"only groups to report by)"),
        "",
        "| | before | after | after / before |",
        "| --- | ---: | ---: | ---: |",
    ]
    for label, key, group in (("embedding parameters (Table 7)", "embedding", "parameters"),
                              ("total parameters (Table 8)", "total", "parameters"),
                              ("embedding bytes", "embedding", "bytes"), ("model bytes", "model", "bytes")):
        row = report[group][key]
        lines.append(f"| {label} | {row['before']:,} ({human(row['before'])}) | {row['after']:,} ({human(row['after'])}) "
                     f"| {100 * row['after'] / row['before']:.2f}% |")
    c = report["cosine"]
    rare = "n/a" if c["rare"] is None else f"{c['rare']:.4f}"
    lines += ["", f"Cosine similarity of rebuilt to original rows (Table 9): rare {rare}, common {c['common']:.4f}, "
              f"all {c['all']:.4f}; common rows bit-identical: {'yes' if c['common_rows_identical'] else 'no'}."]
    error = report.get("mse")
    if error:
        rare = "n/a" if error["rare"] is None else f"{error['rare']:.3g}"
        lines += ["", f"Mean squared error of rebuilt rows: rare {rare}, common {error['common']:.3g}, all {error['all']:.3g}."]
    details = report.get("details")
    if details:
        lines += ["", f"What {report['method']} did:", *(f"- {key}: {value}" for key, value in details.items())]
    by_k = report.get("cosine_by_k") or {}
    if len(by_k) > 1:
        lines += ["", "Rare rows' cosine with each k: " + ", ".join(
            f"k={k} {'n/a' if c['rare'] is None else format(c['rare'], '.4f')}" for k, c in by_k.items()) + "."]
    covered = report.get("coverage")
    if covered:
        lines += ["", f"Coverage of the test data ({covered['examples']:,} examples) by V_C: tokens {100 * covered['tokens']:.2f}% "
                  f"(Table 5), sentences {100 * covered['sentences']:.2f}% (Table 6)."]
    validation = report.get("validation")
    if validation:
        scores = ", ".join(f"k={k}: {s:.4f}" for k, s in validation["scores"].items())
        lines += ["", f"k chosen on the validation split ({validation['metric']}): original {validation['original']:.4f}; "
                  f"{scores}; chosen k={report['k']}."]
    files = report.get("files")
    if files:
        lines += ["", "Files: " + ", ".join(f"{name} ({size:,} bytes)" for name, size in files.items()) + "."]
    return "\n".join(lines) + "\n"

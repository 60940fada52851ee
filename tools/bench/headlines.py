"""The headline figures, read from the result files: each names lit-embed's row, its peer's row of the same
run, the input and the code's fingerprint, so that a claim is never stronger than the rows it comes from and follows
them when the benchmarks run again (`python tools/bench/run.py --headlines` runs the benchmarks they read); a result
whose code has changed since it was measured makes no headline."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fingerprint import changed_since

TEXT, UNIFORM = "real-text ids", "uniform ids"


def best_peer(row: dict) -> bool:
    return "best peer (time)" in str(row.get("note"))


@dataclass(frozen=True)
class Headline:
    """One claim: lit-embed's row and its peer's row in ``results/<benchmark>.<device>.json`` (each picked by
    column values, or a predicate on the row), the column shown for both, and the lit-embed row's ratio
    column (and its per-round range)."""

    what: str
    benchmark: str
    ours: dict
    peer: dict
    value: str
    ratio: str
    spread: str | None = None
    limit: str | None = None
    devices: tuple[str, ...] = ("cpu",)
    name: str = field(default="strategy")
    peer_from: str | None = None  # a column of lit-embed's row naming its peer (the peer's ``name``)
    input: str | None = None  # the input, where the rows do not name it in their "ids"
    peer_value: str | None = None  # a column of lit-embed's row with its peer's figure in the same rounds


EMBEDDING = {"V x d": "250002 x 512"}
MINILM = "all-MiniLM-L6-v2's input embeddings (real)"
SAME_ROUNDS = "best peer ms, same rounds"
HEADLINES = [
    Headline("subspace f=3 embedding step (fwd + bwd + AdamW), 250002 x 512, 32 x 128, one thread", "embedding_step",
             {**EMBEDDING, "ids": TEXT, "strategy": "subspace f=3"}, {**EMBEDDING, "ids": TEXT, "pick": best_peer},
             "ms per step", "speed-up vs best peer", "speed-up range", "% of limit",
             peer_value=SAME_ROUNDS),
    Headline("the same, uniform ids (the lazy peers' worst case)", "embedding_step",
             {**EMBEDDING, "ids": UNIFORM, "strategy": "subspace f=3"}, {**EMBEDDING, "ids": UNIFORM, "pick": best_peer},
             "ms per step", "speed-up vs best peer", "speed-up range", "% of limit",
             peer_value=SAME_ROUNDS),
    *[Headline(f"the same step, {name}", "embedding_step", {**EMBEDDING, "ids": TEXT, "strategy": name},
               {**EMBEDDING, "ids": TEXT, "pick": best_peer}, "ms per step", "speed-up vs best peer", "speed-up range",
               "% of limit", peer_value=SAME_ROUNDS)
      for name in ("HashFormer-Proj, T=128", "HashFormer-Add, T=128", "HashFormer-Pool, T=128, k=10")],
    *[Headline(f"{model} MLM step, subspace f=3, {batch}", "pretrain_step",
               {"model": model, "batch": batch, "ids": TEXT, "strategy": "subspace f=3"},
               {"model": model, "batch": batch, "ids": TEXT, "strategy": peer}, "seconds per step", ratio, spread)
      for model, batch in (("RoBERTa_S", "32x128"), ("XLM-R_S", "8x128"), ("XLM-R_S", "32x128"))
      for peer, ratio, spread in (
          ("HuggingFace *ForMaskedLM, LM head on masked positions (expert peer)", "speed-up vs expert peer", "vs expert peer range"),
          ("HuggingFace *ForMaskedLM(labels=), logits at every position", "speed-up vs HF full logits", "vs HF full logits range"))
      if not (batch == "32x128" and model == "XLM-R_S" and "every position" in peer)],
    *[Headline(f"RoBERTa_S MLM step, subspace f=3, 32 x 512, {dtype}", "pretrain_step",
               {"batch": "32x512", "dtype": dtype, "ids": TEXT, "strategy": "subspace f=3"},
               {"batch": "32x512", "dtype": dtype, "ids": TEXT,
                "strategy": "HuggingFace *ForMaskedLM, LM head on masked positions (expert peer)"},
               "seconds per step", "speed-up vs expert peer", "vs expert peer range", devices=("cuda",))
      for dtype in ("bfloat16", "float16")],
    *[Headline(f"XLM-R_S S+R step, subspace f=3, {batch}", "sr_step",
               {"batch": batch, "ids": TEXT, "strategy": "subspace f=3"}, {"batch": batch, "ids": TEXT, "strategy": "dense (baseline)"},
               "seconds per step", "speed-up vs dense", "vs dense range") for batch in ("32x128", "4x128")],
    Headline("HashFormers' Table 3: HashFormer-MD-Proj S+R, time per sample, BERT-base, 512 tokens (paper: 2.4x on V100)", "table3",
             {"ids": TEXT, "strategy": "HashFormer-MD-Proj, S+R"},
             {"ids": TEXT, "strategy": "BERT-MLM, HuggingFace RobertaForMaskedLM(labels=), logits at every position (baseline)"},
             "ms per sample", "speed-up vs BERT-MLM (HF)", "vs BERT-MLM (HF) range", devices=("cpu", "cuda")),
    Headline("equal-size clusters of MiniLM's 30522 x 384 table into Q=100", "cluster",
             {"matrix": "MiniLM 30522x384", "method": "lit-embed equal-size"},
             {"matrix": "MiniLM 30522x384", "what": "one split into Q=100", "method": "k-means-constrained"},
             "seconds", "speed-up vs best peer", "speed-up range", name="method", input=MINILM),
    Headline("naive k-means of the same table into Q=100", "cluster",
             {"matrix": "MiniLM 30522x384", "what": "one split into Q=100", "method": "lit-embed naive k-means"},
             {"matrix": "MiniLM 30522x384", "what": "one split into Q=100"},
             "seconds", "speed-up vs best peer", "speed-up range", name="method", peer_from="best peer", input=MINILM),
    Headline("data pipeline, text to 32 x 512 MLM batches, tokens/s on one core", "pipeline",
             {"way": "lit-embed MLM, streaming"}, {"way": "HuggingFace run_mlm way (map + group + collator)"},
             "tokens/s per core", "vs HF run_mlm", None, "% of memory limit", name="way",
             input="real English prose (real_text.py), MiniLM WordPiece"),
]


def matches(row: dict, spec: dict) -> bool:
    return all(value(row) if key == "pick" else row.get(key) == value for key, value in spec.items())


def cell(value, column: str) -> str:
    if value is None:
        return "-"
    unit = {"ms per step": " ms", "seconds per step": " s", "ms per sample": " ms", "seconds": " s",
            "tokens/s per core": " tokens/s"}.get(column, "")
    return f"{value:.3g}{unit}" if isinstance(value, float) else f"{value}{unit}"


def table(results: Path, render_row: Callable[[list[str]], str] = lambda cells: "| " + " | ".join(cells) + " |") -> str:
    """The headlines whose rows exist in ``results``, as a markdown table (empty where none do)."""
    lines = []
    for headline in HEADLINES:
        for device in headline.devices:
            path = results / f"{headline.benchmark}.{device}.json"
            if not path.exists():
                continue
            result = json.loads(path.read_text())
            changed = changed_since(result)
            if changed:  # the code it timed has changed since: no claim from it
                continue
            ours = next((row for row in result["rows"] if matches(row, headline.ours) and row.get(headline.ratio) is not None), None)
            if ours is None:
                continue
            spec = {**headline.peer, headline.name: ours.get(headline.peer_from)} if headline.peer_from else headline.peer
            # the peer's row of lit-embed's group, the nearest one (a benchmark may time the peer in every group)
            here = result["rows"].index(ours)
            peer = min(((abs(index - here), index, row) for index, row in enumerate(result["rows"]) if matches(row, spec)),
                       default=(0, 0, None))[2]
            if peer is None or ours.get(headline.ratio) is None:
                continue
            env = result["environment"]
            where = env.get("gpu") or f"{env['cpu_count']} CPU cores, {env['torch_threads']} threads"
            ratio = f"{ours[headline.ratio]:.3g}x" + (f" ({ours[headline.spread]})" if ours.get(headline.spread) else "")
            lines.append(render_row([
                headline.what, ours.get("ids") or headline.input or "-", cell(ours.get(headline.value), headline.value),
                f"{peer[headline.name]}: {cell(ours[headline.peer_value] if headline.peer_value else peer.get(headline.value), headline.value)}", ratio,
                cell(ours.get(headline.limit), headline.limit) + ("%" if headline.limit and ours.get(headline.limit) is not None else ""),
                f"{result['date']}, {where}, {rounds(result, ours)}load {env.get('load average', '?')}",
                "not recorded" if changed is None else result["code"]["fingerprint"],
            ]))
    if not lines:
        return ""
    head = ["what", "input", "lit-embed", "peer, same run", "lit-embed vs peer (range over rounds)", "% of memory limit",
            "measured", "code"]
    return "\n".join([render_row(head), "|" + "---|" * len(head), *lines])


def rounds(result: dict, row: dict) -> str:
    """The interleaved rounds behind a row, as a cell's words: those ``run.py --rounds`` gave, else the row's repeats."""
    count = result.get("rounds") or row.get("rounds")
    return f"{count} rounds, " if count else ""


def benchmarks() -> list[str]:
    """The benchmarks the headlines read, in a fixed order."""
    return sorted({headline.benchmark for headline in HEADLINES})

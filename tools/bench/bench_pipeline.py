"""Data pipeline: corpus text to packed pre-training batches, in tokens per second on one CPU core, against
HuggingFace's `run_mlm` way; how many cores keep one GPU fed.

The corpus: real English prose read on this machine (`real_text.py`, about 4M characters, one paragraph
a line), written to a text file at benchmark time. Every way reads that file and yields batches of 32
blocks of 512 tokens (RoBERTa_S's pre-training length) with the all-MiniLM-L6-v2 WordPiece tokenizer
(the one available offline), each in a process of its own with one thread everywhere (PyTorch, the
Rust tokenizer: `TOKENIZERS_PARALLELISM=false`, `RAYON_NUM_THREADS=1`) and a fresh `datasets` cache:

- lit-embed, streaming (`CorpusDataModule(streaming=True)`): no pre-processing pass; texts stream from
  the file, are tokenised and packed into blocks as they come (`BlockBuilder`), shuffled in a buffer of
  10000 blocks and masked by the MLM collator (`MaskedLMCollator`) in the training loader's
  `StatefulDataLoader`, for one pass (the validation blocks are set aside first);
- lit-embed, cached (`streaming=False`, the default): one `datasets.map` pass writes the blocks to the
  cache, then the batches of one epoch;
- lit-embed Shuffle+Random with HashFormer-MD-Proj, streaming: words hashed by HMAC-MD5 through the
  per-word cache instead of WordPiece, S+R corruption instead of masking (no HuggingFace counterpart);
- HuggingFace's `run_mlm` way (its defaults): `load_dataset("text")`, `map` of the tokenizer (special
  tokens per text, `return_special_tokens_mask`), `map` of grouping into 512-token blocks, then
  `DataCollatorForLanguageModeling(mlm_probability=0.15)` in a `DataLoader`; and the same with
  `streaming=True` (run_mlm's `--streaming`), which has no pre-processing pass either.

"tokens/s per core" counts every position of the batches made (32 x 512 each) over the wall time from the
file to the last batch; the ways take turns (3 rounds, medians, spread). "vs HF run_mlm" divides by the
median of HuggingFace's cached way. Where the time goes ("tokenizer share"): the time the way's tokenizer
(or hasher) alone takes over the same texts, in the same process, over the way's total. The physical
limit: "bytes per token" is what a token cannot avoid moving (its share of the text read, and the
batch's tensors written), "% of memory limit" the rate the machine's copy bandwidth (measured in the same
run, one thread) would allow over the measured rate: the pipeline is bound by tokenising, not by memory.

The GPU it must keep busy: one H100 training RoBERTa_S 3-SE with MLM at 512 tokens in bf16 consumes the
step rate the GPU kit measures (`results/pretrain_step.cuda.json`); until that exists, an estimate from
published throughput: NVIDIA's BERT-Large pre-training on one A100 80GB, mixed precision, 512 tokens:
210 sequences/s (NVIDIA DeepLearningExamples, PyTorch/LanguageModeling/BERT/README.md, "Pre-training
NVIDIA DGX A100 (8x A100 80GB)"), scaled by the dense BF16 tensor peaks of H100 SXM and A100 (989 and 312
TFLOPS, NVIDIA's datasheets) and by training FLOP per token (6 x matmul weights + 12 x layers x length x
hidden, and the masked-only decoder: 1.96 GFLOP for BERT-Large, 0.20 GFLOP for RoBERTa_S 3-SE): about
3.4M tokens/s, an estimate that assumes RoBERTa_S reaches the same share of peak, which a model this small
rarely does (so it overstates the cores needed). "cores for one H100" divides that by tokens/s per core.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import tempfile
import time
from pathlib import Path

import torch

from harness import RESULTS, child_main, in_children, memory_bandwidth, spread_cell

TITLE = "Data pipeline: corpus text to packed MLM / S+R batches, tokens/s per CPU core, against HuggingFace's run_mlm way"
THREADS = 1  # per core; the children also get ONE_CORE
LENGTH, BATCH, ROUNDS = 512, 32, 3
LIT_STREAM, LIT_CACHED, LIT_SR = "lit-embed MLM, streaming", "lit-embed MLM, cached (datasets.map pass)", "lit-embed S+R, MD5 hashing, streaming"
HF, HF_STREAM = "HuggingFace run_mlm way (map + group + collator)", "HuggingFace run_mlm way, streaming"
WAYS = (LIT_STREAM, LIT_CACHED, LIT_SR, HF, HF_STREAM)
ONE_CORE = {"TOKENIZERS_PARALLELISM": "false", "RAYON_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
#: The published-throughput estimate of one H100's tokens/s on RoBERTa_S 3-SE MLM (see the docstring).
A100_BERT_LARGE_TOKENS = 210 * 512
H100_OVER_A100 = 989.4 / 312
FLOP_RATIO = (6 * 24 * 12 * 1024**2 + 12 * 24 * 512 * 1024) / (6 * 8 * 12 * 512**2 + 12 * 8 * 512 * 512 + 0.15 * 6 * 512 * 50265)
ESTIMATED_H100_TOKENS = A100_BERT_LARGE_TOKENS * H100_OVER_A100 * FLOP_RATIO


def stand_in(way: str, smoke: bool):
    """The model whose text encoder and collator a lit-embed way uses (only its data side runs; RoBERTa_S has
    the 512 positions the blocks need, the tiny backbone the smoke size's 32)."""
    from builders import compose

    if way == LIT_SR:
        return compose("ShuffleRandom", "roberta_s", "md5_proj", 30522, smoke)
    return compose("MaskedLM", "roberta_s", "subspace_3", 30522, smoke)


def lit_embed_batches(way: str, corpus: str, length: int, model):
    """lit-embed's training batches of one pass over ``corpus`` (``CorpusDataModule`` feeding ``model``), and its
    text encoder. A streamed pass goes through the loader ``train_dataloader`` builds, without the wrappers that
    make the stream endless and record its position (an endless stream would start the next pass, and refill
    its shuffle buffer, to fill the batch that straddles the two)."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    from lit_embed.data import CorpusDataModule

    streaming = way != LIT_CACHED
    data = CorpusDataModule(tokenizer=None if way == LIT_SR else "all-MiniLM-L6-v2", files=[corpus], max_length=length,
                            batch_size=BATCH, streaming=streaming, val_size=4 if streaming else 0.01, seed=0)
    data.model = lambda: model  # no trainer: the data module feeds this model
    data.prepare_data()
    data.setup("fit")
    loader = StatefulDataLoader(data.train_set, batch_size=BATCH, collate_fn=data.collate) if streaming else data.train_dataloader()
    return ((batch["codes"], batch) for batch in loader), data.text_encoder.encode


def huggingface_batches(way: str, corpus: str, length: int, model=None):
    """HuggingFace run_mlm's batches of ``corpus`` (its defaults: texts tokenised with their special tokens,
    concatenated and cut into ``length`` blocks, the last partial block dropped), and its tokenizer."""
    import datasets
    from torch.utils.data import DataLoader
    from transformers import AutoTokenizer, DataCollatorForLanguageModeling

    from lit_embed.hub import resolve_pretrained

    tokenizer = AutoTokenizer.from_pretrained(resolve_pretrained("all-MiniLM-L6-v2", what="tokenizer"))
    streaming = way == HF_STREAM
    texts = datasets.load_dataset("text", data_files={"train": [corpus]}, split="train", streaming=streaming)

    def tokenize(rows):
        return tokenizer(rows["text"], return_special_tokens_mask=True)

    def group(rows):
        joined = {key: list(itertools.chain.from_iterable(rows[key])) for key in rows}
        usable = len(joined["input_ids"]) // length * length
        return {key: [ids[i : i + length] for i in range(0, usable, length)] for key, ids in joined.items()}

    tokenized = texts.map(tokenize, batched=True, remove_columns=["text"])
    blocks = tokenized.map(group, batched=True)
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15)
    loader = DataLoader(blocks, batch_size=BATCH, shuffle=not streaming, collate_fn=collator)
    return ((batch["input_ids"], batch) for batch in loader), lambda texts: tokenizer(texts)["input_ids"]


def measure(job: dict, ctx) -> dict:
    """One way over the corpus, timed from the file to the last batch; its tokens, bytes and tokenizer time."""
    length, hugging_face = job["length"], job["way"] in (HF, HF_STREAM)
    model = None if hugging_face else stand_in(job["way"], ctx.smoke)  # not data work: built before the clock starts
    with tempfile.TemporaryDirectory() as cache, fresh_cache(cache):
        start = time.perf_counter()
        make = huggingface_batches if hugging_face else lit_embed_batches
        batches, tokenize = make(job["way"], job["corpus"], length, model)
        tokens = count = batch_bytes = 0
        for ids, batch in batches:
            tokens += ids.shape[0] * ids.shape[1]
            count += 1
            batch_bytes += sum(v.element_size() * v.numel() for v in batch.values() if isinstance(v, torch.Tensor))
        seconds = time.perf_counter() - start
    texts = Path(job["corpus"]).read_text(encoding="utf-8").splitlines()
    start = time.perf_counter()
    for i in range(0, len(texts), 1000):
        tokenize(texts[i : i + 1000])
    return {"way": job["way"], "seconds": seconds, "tokens": tokens, "batches": count, "batch bytes": batch_bytes,
            "tokenizer seconds": time.perf_counter() - start}


@contextlib.contextmanager
def fresh_cache(folder: str):
    """``datasets`` caches in ``folder`` (nothing cached before is found) while the block runs."""
    import datasets

    datasets.disable_progress_bars()
    before = datasets.config.HF_DATASETS_CACHE
    datasets.config.HF_DATASETS_CACHE = Path(folder)
    try:
        yield
    finally:
        datasets.config.HF_DATASETS_CACHE = before


def write_corpus(folder: Path, chars: int) -> tuple[str, int]:
    import real_text

    paragraphs, _ = real_text.prose(chars)
    path = folder / "corpus.txt"
    path.write_text("\n".join(paragraphs) + "\n", encoding="utf-8")
    return str(path), path.stat().st_size


def gpu_rate() -> tuple[float, str]:
    """Tokens/s one GPU consumes training RoBERTa_S 3-SE with MLM at 512 tokens in bf16: the GPU kit's figure where
    it exists, else the published-throughput estimate."""
    path = RESULTS / "pretrain_step.cuda.json"
    if path.exists():
        result = json.loads(path.read_text())
        for row in result["rows"]:
            if row["strategy"] == "subspace f=3" and row["dtype"] == "bfloat16" and row["ids"] == "real-text ids":
                return row["tokens/s"], f"measured by the GPU kit on {result['environment'].get('gpu')} ({result['date']})"
    return ESTIMATED_H100_TOKENS, "H100, estimated from published throughput (see above)"


def run(ctx) -> list[dict]:
    length = 32 if ctx.smoke else LENGTH
    bandwidth = memory_bandwidth(ctx)
    with tempfile.TemporaryDirectory() as folder:
        corpus, corpus_bytes = write_corpus(Path(folder), 50_000 if ctx.smoke else 4_000_000)
        jobs = [{"way": way, "corpus": corpus, "length": length} for _ in range(1 if ctx.smoke else ROUNDS) for way in WAYS]
        measured = in_children(__file__, jobs, ctx, measure, env=ONE_CORE)
    rates = {way: sorted(m["tokens"] / m["seconds"] for m in measured if m["way"] == way) for way in WAYS}
    hf = rates[HF][len(rates[HF]) // 2]
    gpu, source = gpu_rate()
    rows = []
    for way in WAYS:
        runs = [m for m in measured if m["way"] == way]
        middle = sorted(runs, key=lambda m: m["tokens"] / m["seconds"])[len(runs) // 2]
        rate = middle["tokens"] / middle["seconds"]
        per_token = corpus_bytes / middle["tokens"] + middle["batch bytes"] / middle["tokens"]
        seconds = [m["seconds"] for m in runs]
        rows.append({
            "way": way, "tokens": middle["tokens"], "seconds": middle["seconds"],
            "spread": spread_cell({"spread": (max(seconds) - min(seconds)) / middle["seconds"], "repeats": len(runs)}),
            "tokens/s per core": rate, "vs HF run_mlm": rate / hf,
            "tokenizer share": middle["tokenizer seconds"] / middle["seconds"],
            "bytes per token": per_token, "% of memory limit": 100 * rate * per_token / (bandwidth["GB/s"] * 1e9),
            "memory GB/s (copy, 1 thread)": bandwidth["GB/s"],
            "cores for one GPU": gpu / rate if way.startswith("lit-embed MLM") or way == HF else None,
        })
    rows.append({"way": f"GPU rate: RoBERTa_S 3-SE MLM, 512 tokens, bf16 ({source})", "tokens/s per core": None,
                 "tokens": None, "note": f"{gpu:.4g} tokens/s"})
    return rows


if __name__ == "__main__":
    child_main(measure)

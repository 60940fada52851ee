"""Tokenise + hash throughput of the HashFormers' text encoders, on one core, over a Zipf word stream.

The stream: 1M words drawn with Zipf exponent 1.1 from a synthetic vocabulary of 100K lowercase
words of 2-12 letters, in texts of 50 words (what the data pipeline encodes). "cold" is a fresh
encoder (every unique word hashed once, then cached), "warm" one whose cache already holds every
word. The obvious alternative, in the same run: hashing every occurrence without a cache. LSH is
the paper's (character 1-4-grams, top-50K fitted on the stream, T = 128 hyperplanes); LSH-Emb takes
the argmax over 50260 hyperplanes, far costlier per new word, so it runs on the first 10K words. For reference, the packaged MiniLM fast (Rust) WordPiece tokenizer on the same texts.
Targets (issue 3): MD5 at least 500k words/s warm, LSH at least 200k words/s warm.

The peer: xxHash's XXH3-128 (`pip install xxhash`; `datasets` already depends on it), a widely used
fast non-cryptographic hash, giving the same 128 bits per word through the same encoder and cache;
"vs MD5" is its words/s over HMAC-MD5's in the same cache state. It is not a drop-in: the HashFormers'
codes are HMAC-MD5 with the key "en" (the golden values in tests/test_hashing.py), so a model trained
on xxHash codes gets other codes for every word and cannot be compared with the paper's checkpoints
or figures. What it would save is bounded by the hash's share of the encoder's time: cold (each new
word hashed once) and uncached rows pay it per word, warm rows only look codes up.
"""

from __future__ import annotations

import functools
import importlib.util
import os

import numpy as np
import torch

from lit_embed.embeddings.hashers import Hasher

from harness import time_call

TITLE = "Tokenise + hash throughput (one core, Zipf word stream): per-word cache against none, HMAC-MD5 against xxHash"
MD5, XXH3 = "MD5, 128 bits", "xxHash XXH3-128 (peer), 128 bits"


def stream(smoke: bool) -> tuple[list[str], int]:
    """Texts of 50 words and their word count."""
    rng = np.random.default_rng(0)
    vocab_size, count = (2_000, 5_000) if smoke else (100_000, 1_000_000)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    vocab = ["".join(rng.choice(letters, n)) for n in rng.integers(2, 13, vocab_size)]
    weights = 1.0 / np.arange(1, vocab_size + 1) ** 1.1
    words = [vocab[i] for i in rng.choice(vocab_size, count, p=weights / weights.sum())]
    return [" ".join(words[i : i + 50]) for i in range(0, count, 50)], count


class XXH3Hash:
    """XXH3-128's bits of each word's UTF-8 bytes (bucket: XXH3-64 modulo N), as lit-embed's hashers give them."""

    def __init__(self, num_outputs: int) -> None:
        self.num_outputs = num_outputs

    def buckets(self, words: list[str]) -> np.ndarray:
        from xxhash import xxh3_64_intdigest

        hashes = [xxh3_64_intdigest(word.encode("utf-8", "surrogatepass")) for word in words]
        return (np.array(hashes, dtype=np.uint64) % np.uint64(self.num_outputs)).astype(np.int64)

    def bits(self, words: list[str]) -> np.ndarray:
        from xxhash import xxh3_128_digest

        digests = b"".join(xxh3_128_digest(word.encode("utf-8", "surrogatepass")) for word in words)
        return np.unpackbits(np.frombuffer(digests, dtype=np.uint8).reshape(len(words), 16), axis=1)[:, : self.num_outputs]

    def fingerprint(self) -> str:
        return f"xxh3-{self.num_outputs}"


class XXH3Hasher(Hasher):
    max_bits = 128

    def function(self) -> XXH3Hash:
        return XXH3Hash(self.num_outputs)


def encoders(smoke: bool) -> dict:
    """The strategies whose text encoders are measured (``None``: the peer's package is missing)."""
    from lit_embed.embeddings import HashEmbedding, HashProj, LSHHasher

    lsh = functools.partial(LSHHasher, num_ngrams=2_000 if smoke else 50_000)
    return {
        MD5: HashProj(None, 8),
        XXH3: HashProj(None, 8, hasher=XXH3Hasher) if importlib.util.find_spec("xxhash") else None,
        "LSH, 128 bits": HashProj(None, 8, hasher=lsh),
        "LSH-Emb, 50260 buckets": HashEmbedding(None, 8, num_buckets=50265, hasher=lsh),
    }


def measure(name: str, strategy, texts: list[str], count: int, ctx) -> list[dict]:
    """Rows for one strategy's text encoder: fitting (LSH), no cache, cache cold, cache warm."""
    from lit_embed.embeddings.hash_text import HashTextEncoder, split_words

    rows = []
    encoder = strategy.text_encoder(None)
    if not encoder.fitted:
        fit = time_call(lambda: encoder.fit(texts), ctx, warmup=0, repeat=1)
        rows.append({"encoder": name, "cache": "fit n-grams", "words": count, "words/s": count / fit["seconds"]})
    if "Emb" in name:
        texts = texts[: max(1, len(texts) // 100)]
    words = sum(len(split_words(t)) for t in texts)
    function, codes = strategy.hasher.function(), strategy.codes
    none = time_call(lambda: codes.of_words(function, [w for t in texts for w in split_words(t)]), ctx, warmup=1, repeat=3)
    cold = time_call(lambda: HashTextEncoder(strategy.hasher, codes).encode(texts), ctx, warmup=1, repeat=3)
    encoder.encode(texts)
    warm = time_call(lambda: encoder.encode(texts), ctx, warmup=1, repeat=3)
    for label, timing in (("none (hash every word)", none), ("cold", cold), ("warm", warm)):
        rows.append({"encoder": name, "cache": label, "words": words, "words/s": words / timing["seconds"],
                     "vs no cache": none["seconds"] / timing["seconds"]})
    return rows


def run(ctx) -> list[dict]:
    from lit_embed.embeddings import VocabTextEncoder

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    texts, count = stream(ctx.smoke)
    rows = []
    try:
        for name, strategy in encoders(ctx.smoke).items():
            if strategy is None:
                rows.append({"encoder": name, "note": "not installed (pip install xxhash)"})
                continue
            rows += measure(name, strategy, texts, count, ctx)
        md5 = {row["cache"]: row["words/s"] for row in rows if row["encoder"] == MD5}
        for row in rows:
            if row["encoder"] == XXH3 and "words/s" in row:
                row["vs MD5"] = row["words/s"] / md5[row["cache"]]
        wordpiece = VocabTextEncoder("all-MiniLM-L6-v2")
        timing = time_call(lambda: wordpiece.encode(texts), ctx, warmup=1, repeat=3)
        rows.append({"encoder": "MiniLM WordPiece ids (Rust, reference)", "cache": "-", "words": count,
                     "words/s": count / timing["seconds"]})
    finally:
        torch.set_num_threads(threads)
    return rows

"""Hashing words: golden MD5 values, LSH locality, determinism across processes, bad input, the cache."""

from __future__ import annotations

import functools
import hmac
import json
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch

from lit_embed.embeddings import HashEmbedding, HashPool, HashProj, LSHHasher, MD5Hasher
from lit_embed.embeddings.hash_text import BitCodes, HashTextEncoder, pack_bits, split_words, unpack_bits
from lit_embed.embeddings.hashers import char_ngrams
from tests.helpers import REPO

CORPUS = [
    "Children play in the park. She plays the piano; they played chess and were playing cards.",
    "A player plays. Players play games; the play was played twice.",
    "The house stands by the river. A green garden, a quiet street, and the old bridge.",
    "Music, rivers and mountains; the teacher writes numbers on the board.",
]


def hamming(encoder: HashTextEncoder, a: str, b: str) -> int:
    codes = encoder.encode([a, b])
    bits = unpack_bits(torch.from_numpy(np.concatenate(codes)[:, 1:]), encoder.codes.num_bits)
    return int((bits[0] != bits[1]).sum())


def lsh_encoder(num_bits: int = 128, texts=CORPUS) -> HashTextEncoder:
    strategy = HashProj(None, 16, num_bits=num_bits, hasher=functools.partial(LSHHasher, num_ngrams=500))
    encoder = strategy.text_encoder(None)
    encoder.fit(texts)
    return encoder


# -- MD5: the reference notes' golden values ------------------------------------------------------------


def test_md5_golden_digests_and_bucket():
    md5 = MD5Hasher(50265 - 5).function()
    assert md5.digests(["hello", "play"]).tobytes().hex() == (
        "1dec56025892c637efb2601c8e1a3ab4" "95ea122b0b72902c5a95d7ba740ff838"
    )
    codes = HashEmbedding(None, 8).text_encoder(None).encode(["Hello"])[0]
    assert codes.tolist() == [46797]  # v % (N - 5) + 5 with N = 50265


def test_md5_bits_are_the_digest_most_significant_first_and_match_hmac():
    words = ["hello", "Ünïcödé", "東京", "😀", "a" * 200, "\x00\x1f"]
    md5 = MD5Hasher(128).function()
    for word, bits in zip(words, md5.bits(words)):
        expected = hmac.digest(b"en", word.encode(), "md5")
        assert int("".join(map(str, bits)), 2) == int.from_bytes(expected, "big")
    long_key = MD5Hasher(128, key="k" * 100).function()  # keys longer than a block are hashed first (RFC 2104)
    assert long_key.digests(["x"]).tobytes() == hmac.digest(b"k" * 100, b"x", "md5")
    assert MD5Hasher(128, key="de").function().digests(["x"]).tobytes() != md5.digests(["x"]).tobytes()


def test_a_state_dict_gives_the_md5_hasher_its_key_whatever_its_length():
    saved = MD5Hasher(128, key="a key longer than en")
    fresh = MD5Hasher(128)  # built from a config that left the key out: a 2-byte buffer until loaded
    fresh.load_state_dict(saved.state_dict())
    assert fresh.init_args() == {"key": "a key longer than en"}
    assert fresh.function().digests(["x"]).tobytes() == hmac.digest(b"a key longer than en", b"x", "md5")


def test_md5_buckets_equal_python_big_integers():
    words = [f"w{i}" for i in range(300)]
    for n in (1, 1033, 50260, 2**32):
        md5 = MD5Hasher(n).function()
        expected = [int.from_bytes(hmac.digest(b"en", w.encode(), "md5"), "big") % n for w in words]
        assert md5.buckets(words).tolist() == expected


def test_pool_chunks_follow_the_reference():
    """13 chunks of 10 bits, the last of 8; the reference adds 1 to reserve row 0 for specials, which
    this implementation masks instead (so its codebook row is the chunk's own integer)."""
    pool = HashPool(None, 8)
    codes = pool.text_encoder(None).encode(["hello"])[0]
    chunks = pool.chunks(unpack_bits(torch.from_numpy(codes[:, 1:]), 128))
    assert (chunks[0] + 1).tolist() == [120, 710, 385, 601, 588, 100, 508, 947, 385, 457, 903, 571, 181]


def test_bits_pack_and_unpack_round_trip():
    bits = np.random.default_rng(0).integers(0, 2, (7, 5, 130)).astype(np.uint8)
    words = pack_bits(bits)
    assert words.shape == (7, 5, 3) and words.dtype == np.int64
    assert torch.equal(unpack_bits(torch.from_numpy(words), 130), torch.from_numpy(bits).long())
    assert pack_bits(np.ones((1, 64), np.uint8))[0, 0] == -1  # the top bit is the sign bit of the word


# -- words, specials, bad input -------------------------------------------------------------------------


def test_word_tokens_and_special_ids():
    assert split_words("Hello, WORLD!! it's 3.5...") == ["hello", ",", "world", "!!", "it", "'", "s", "3", ".", "5", "..."]
    encoder = HashProj(None, 8).text_encoder(None)
    ids = {name: int(encoder.special_code(name)[0]) for name in ("cls", "pad", "sep", "unk", "mask")}
    assert ids == {"cls": 0, "pad": 1, "sep": 2, "unk": 3, "mask": 4}
    assert not encoder.special_code("pad")[1:].any()
    assert HashEmbedding(None, 8).text_encoder(None).special_code("mask").tolist() == 4


BAD_TEXTS = ["", "   \t\n ", "a\x00b\x07c\x1b[0m", "🙂👍🏽 🇬🇧", "東京は晴れです 北京", "مرحبا بالعالم שלום עולם", "x" * 10_000]


@pytest.mark.parametrize("hasher", ["md5", "lsh"])
def test_bad_text_gets_defined_codes(hasher):
    encoder = lsh_encoder() if hasher == "lsh" else HashProj(None, 8).text_encoder(None)
    codes = encoder.encode(BAD_TEXTS)
    again = encoder.encode(list(reversed(BAD_TEXTS)))[::-1]
    assert [len(c) for c in codes] == [len(split_words(t)) for t in BAD_TEXTS]
    assert len(codes[0]) == len(codes[1]) == 0 and codes[0].shape == (0, 3)
    assert all(np.array_equal(a, b) for a, b in zip(codes, again))
    assert all((c[:, 0] == 5).all() for c in codes)  # every token is a hashed word, never a special


def test_undecodable_local_file_names_the_file_and_line(tmp_path, capsys):
    from lit_embed.commands import main

    bad = tmp_path / "corpus.txt"
    bad.write_bytes(b"fine line\nbroken \xff\xfe line\n")
    args = ["fit", "--config", str(REPO / "configs" / "demo_hashformer.yaml"), "--data.init_args.files", f"[{bad}]",
            "--trainer.fast_dev_run", "true"]
    assert main(args) == 2
    assert f"{bad}:2: not valid UTF-8" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: HashProj(None, 8, num_bits=0), "num_bits=0 must be a positive number of hash bits"),
        (lambda: HashPool(None, 8, num_bits=0), "num_bits=0 must be a positive number"),
        (lambda: HashPool(None, 8, num_bits=8, chunk_bits=10), "chunk_bits k=10 must lie between 1 and num_bits T=8"),
        (lambda: HashPool(None, 8, chunk_bits=0), "chunk_bits k=0 must lie between 1"),
        (lambda: HashEmbedding(None, 8, num_buckets=0), "num_buckets=0 leaves no bucket for words"),
        (lambda: HashEmbedding(None, 8, num_buckets=5), "use at least 6"),
        (lambda: HashProj(None, 8, num_bits=200), "num_bits=200 exceeds the 128 bits of MD5Hasher"),
        (lambda: HashProj(50265, 8), "vocab_size must be unset (got 50265)"),
        (lambda: LSHHasher(128, num_ngrams=0), "num_ngrams=0 must be at least 1"),
    ],
)
def test_bad_sizes_are_refused_with_the_fix(build, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build()


# -- LSH ----------------------------------------------------------------------------------------------


def test_lsh_puts_inflections_closer_than_unrelated_words():
    encoder = lsh_encoder()
    for inflection in ("plays", "played", "playing"):
        near = hamming(encoder, "play", inflection)
        for other in ("house", "river", "teacher", "bridge", "music"):
            assert near < hamming(encoder, "play", other), (inflection, other)
    buckets = HashEmbedding(None, 8, num_buckets=1005, hasher=functools.partial(LSHHasher, num_ngrams=500))
    emb = buckets.text_encoder(None)
    emb.fit(CORPUS)
    assert emb.encode(["play"])[0].tolist() == emb.encode(["play"])[0].tolist()


def test_lsh_features_are_counted_ngrams_of_the_fitted_vocabulary():
    assert char_ngrams("aab", 2) == ["a", "a", "b", "aa", "ab"]
    hasher = LSHHasher(16, num_ngrams=3, max_ngram=2)
    hasher.fit(iter([["aab", "ab"], ["b"]]))  # a:3, b:3, ab:2, aa:1
    assert hasher.ngrams() == ["a", "b", "ab"]
    owners, features = hasher.function().features(["aab", "zz"])
    assert owners.tolist() == [0, 0, 0, 0] and sorted(features.tolist()) == [0, 0, 1, 2]


def test_lsh_hyperplanes_are_cyclic_shifts_of_one_gaussian_vector():
    hasher = LSHHasher(10, num_ngrams=6, max_ngram=1, seed=3)
    hasher.fit(iter([list("abcdef")]))
    function = hasher.function()
    eta = hasher.eta.double().numpy()
    x = np.zeros(6)
    x[hasher.ngrams().index("c")] += 2
    x[hasher.ngrams().index("f")] += 1
    expected = np.array([sum(x[f] * eta[(f + j + 1) % len(eta)] for f in range(6)) for j in range(10)])
    assert len(eta) == 10  # max(num_ngrams, outputs): every hyperplane a different shift
    assert np.allclose(function.scores(["ccf"])[0], expected)
    assert function.bits(["ccf"])[0].tolist() == (expected >= 0).astype(int).tolist()
    assert function.buckets(["ccf"]).tolist() == [int(expected.argmax())]


def test_lsh_needs_fitting_and_fitting_changes_the_fingerprint(tmp_path):
    strategy = HashProj(None, 8, hasher=functools.partial(LSHHasher, num_ngrams=100))
    encoder = strategy.text_encoder(None)
    assert not encoder.fitted
    with pytest.raises(RuntimeError, match="not fitted"):
        encoder.encode(["play"])
    encoder.fit(CORPUS[:2])
    first = encoder.fingerprint()
    encoder.fit(CORPUS)
    assert encoder.fingerprint() != first
    name, text = encoder.artefact()
    path = tmp_path / name
    path.write_text(text)
    assert name == "lsh_ngrams.json" and json.loads(text)["ngrams"] == strategy.hasher.ngrams()
    reused = HashProj(None, 8, hasher=functools.partial(LSHHasher, num_ngrams=100, ngrams=str(path))).text_encoder(None)
    assert reused.fitted and reused.fingerprint() == encoder.fingerprint()
    assert np.array_equal(np.concatenate(reused.encode(CORPUS)), np.concatenate(encoder.encode(CORPUS)))
    with pytest.raises(ValueError, match="max_ngram=3"):
        LSHHasher(128, max_ngram=3, ngrams=str(path))


# -- determinism and the cache ---------------------------------------------------------------------------

CODES_SCRIPT = """
import functools, json, sys, numpy as np
from lit_embed.embeddings import HashEmbedding, HashPool, LSHHasher
texts = json.load(sys.stdin)
md5 = HashPool(None, 8).text_encoder(None)
lsh = HashEmbedding(None, 8, num_buckets=2000, hasher=functools.partial(LSHHasher, num_ngrams=300)).text_encoder(None)
lsh.fit(texts)
out = [np.concatenate(e.encode(texts)).tolist() for e in (md5, lsh)]
print(out, md5.fingerprint(), lsh.fingerprint())
"""


def test_codes_are_identical_in_processes_with_different_hash_seeds():
    outputs = []
    for seed in ("0", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        done = subprocess.run([sys.executable, "-c", CODES_SCRIPT], input=json.dumps(CORPUS + BAD_TEXTS), env=env,
                              capture_output=True, text=True, check=True)
        outputs.append(done.stdout)
    assert outputs[0] == outputs[1] and len(outputs[0]) > 1000


def test_a_small_cache_and_a_pickled_copy_give_the_same_codes():
    encoder = lsh_encoder(num_bits=70)
    assert encoder.codes == BitCodes(70) and encoder.codes.code_shape == (3,)
    expected = encoder.encode(CORPUS)
    tiny = HashTextEncoder(encoder._hasher, encoder.codes, cache_size=4)
    copy = pickle.loads(pickle.dumps(encoder))
    assert copy._hasher is None  # workers get the NumPy snapshot, not the module
    for other in (tiny, copy):
        assert all(np.array_equal(a, b) for a, b in zip(expected, other.encode(CORPUS)))


def test_subword_tokenization_hashes_the_tokenizers_pieces(minilm_path):
    strategy = HashProj(None, 8, tokenization="subword")
    encoder = strategy.text_encoder(minilm_path)
    codes = encoder.encode(["unaffordable houses"])[0]
    pieces = encoder.tokens("unaffordable houses")
    assert len(pieces) > 2 and any(p.startswith("##") for p in pieces)
    assert np.array_equal(codes, strategy.codes.of_words(strategy.hasher.function(), pieces))
    unknown = encoder.encode(["\U0001f642"])[0]  # WordPiece's [UNK] is the <unk> special
    assert np.array_equal(unknown, encoder.special_code("unk")[None])
    with pytest.raises(ValueError, match="set data.init_args.tokenizer"):
        strategy.text_encoder(None)

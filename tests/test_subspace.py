"""Subspace / k-sub-embedding: codes, counts, equivalence with dense, cluster assignment, OOV growth."""

from __future__ import annotations

import hashlib
import io
import os
import pickle

import numpy as np
import pytest
import torch
from safetensors.numpy import save as safetensors_bytes

from lit_embed.checkpoints.format import state_differences
from lit_embed.embeddings import ClusterAssignment, DenseEmbedding, RadixAssignment, SubspaceEmbedding
from lit_embed.embeddings.assignment import cluster_codes, radix_codes, smallest_table_size
from lit_embed.embeddings.state import fixed_shapes
from lit_embed.storage.cache import FORMAT, NAME, read_codes
from tests.helpers.run_if import requires_gpus


@pytest.mark.parametrize(
    ("n", "f", "q"), [(50265, 2, 225), (50265, 3, 37), (50265, 4, 15), (50265, 6, 7), (50265, 8, 4), (250002, 3, 63)]
)
def test_table_size_matches_the_papers(n, f, q):
    assert smallest_table_size(n, f) == q
    assert q**f >= n > (q - 1) ** f


def test_radix_codes_follow_algorithm_1_and_are_unique():
    n, f, q = 1000, 3, 10
    codes = RadixAssignment().codes(n, f, q)
    for token in (0, 7, 123, 999):
        assert codes[token].tolist() == [(token // q**k) % q for k in range(f)]
    assert len(np.unique(codes, axis=0)) == n
    assert codes.min() == 0 and codes.max() == q - 1


@pytest.mark.parametrize(("d", "f", "widths"), [(512, 3, [170, 170, 172]), (512, 2, [256, 256]), (10, 4, [2, 2, 2, 4])])
def test_columns_split_with_the_remainder_last(d, f, widths):
    emb = SubspaceEmbedding(vocab_size=100, hidden_size=d, num_tables=f)
    assert emb.widths == widths
    assert [t.shape[1] for t in emb.tables] == widths


@pytest.mark.parametrize(("f", "expected"), [(2, 115_200), (3, 18_944), (8, 2_048)])
def test_parameter_count_is_q_times_d(f, expected):
    emb = SubspaceEmbedding(vocab_size=50265, hidden_size=512, num_tables=f)
    assert emb.num_embedding_parameters() == expected == emb.table_size * 512


def test_vectors_are_the_concatenated_rows():
    emb = SubspaceEmbedding(vocab_size=50, hidden_size=6, num_tables=2, table_size=8)
    token = 37  # digits 5, 4 in base 8
    expected = torch.cat([emb.tables[0][5], emb.tables[1][4]])
    assert torch.equal(emb(torch.tensor([token]))[0], expected)


def test_f1_equals_dense_when_its_table_is_copied_in():
    sub = SubspaceEmbedding(vocab_size=300, hidden_size=16, num_tables=1)
    dense = DenseEmbedding(vocab_size=300, hidden_size=16)
    dense.weight.data.copy_(sub.tables[0].data)
    ids = torch.randint(300, (4, 9))
    assert torch.equal(sub(ids), dense(ids))
    assert torch.equal(sub.full_weight(), dense.full_weight())


@pytest.mark.parametrize("padding_idx", [None, 1])
def test_tied_logits_and_gradients_equal_the_gathered_matrix_product(padding_idx):
    emb = SubspaceEmbedding(vocab_size=200, hidden_size=13, num_tables=3, padding_idx=padding_idx).double()
    hidden = torch.randn(5, 13, dtype=torch.double, requires_grad=True)
    factored, gathered = emb.decoder_logits(hidden), hidden @ emb(torch.arange(200)).T
    assert torch.allclose(factored, gathered)
    wrt = [hidden, *emb.tables]
    for a, b in zip(torch.autograd.grad(factored.square().sum(), wrt), torch.autograd.grad(gathered.square().sum(), wrt)):
        assert torch.allclose(a, b)


def _concatenated_lookups(emb: SubspaceEmbedding, ids: torch.Tensor) -> torch.Tensor:
    """The vectors as the strategy computed them before its one-buffer forward: f lookups, concatenated."""
    sub = emb.codes[ids]
    pads = emb.rows if emb.padding_idx is not None else [None] * emb.num_tables
    return torch.cat([torch.nn.functional.embedding(sub[..., k], table, padding_idx=pad)
                      for k, (table, pad) in enumerate(zip(emb.tables, pads))], dim=-1)


@pytest.mark.parametrize(("f", "hidden", "padding_idx"), [(3, 512, None), (3, 13, 1), (2, 64, 1), (8, 512, 1), (1, 7, None)])
def test_the_one_buffer_forward_equals_the_concatenated_lookups_with_their_gradients(f, hidden, padding_idx, device="cpu"):
    """Outputs and table gradients equal f embedding lookups concatenated (unequal widths where f does not divide d,
    a padding row that stays zero and untrained), for a (batch, length) input that repeats ids."""
    emb = SubspaceEmbedding(vocab_size=3000, hidden_size=hidden, num_tables=f, padding_idx=padding_idx).to(device)
    ids = torch.randint(3000, (6, 50), generator=torch.Generator().manual_seed(0)).to(device)
    ids[:, -5:] = 1
    grad = torch.randn(6, 50, hidden, generator=torch.Generator().manual_seed(1)).to(device)
    vectors, expected = emb(ids), _concatenated_lookups(emb, ids)
    assert vectors.shape == (6, 50, hidden) and torch.equal(vectors, expected)
    mine = torch.autograd.grad(vectors, list(emb.tables), grad)
    for got, want in zip(mine, torch.autograd.grad(expected, list(emb.tables), grad)):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    if padding_idx is not None:
        assert not vectors[:, -5:].any() and not any(g[emb.table_size].any() for g in mine)


@requires_gpus()
def test_the_one_buffer_forward_on_a_gpu_equals_the_concatenated_lookups():
    test_the_one_buffer_forward_equals_the_concatenated_lookups_with_their_gradients(3, 512, 1, "cuda")


@pytest.mark.parametrize("padding_idx", [None, 1])
def test_the_tied_decoders_backward_sorts_nothing_after_its_first_step(padding_idx):
    """The tokens reading each row of the stacked scores are sorted once, with the decoder's constants: a later step's
    forward and backward call no sort (embedding_bag's own backward sorts the V x f rows every time), with the
    gradients of the gathered matrix product."""
    emb = SubspaceEmbedding(vocab_size=300, hidden_size=12, num_tables=3, padding_idx=padding_idx).double()
    hidden = torch.randn(7, 12, dtype=torch.double, requires_grad=True)
    emb.decoder_logits(hidden).sum().backward()  # the first step derives the constants
    with torch.autograd.profiler.profile() as profile:  # it sees the operations the kernels call, too
        logits = emb.decoder_logits(hidden)
        mine = torch.autograd.grad(logits.square().sum(), [hidden, *emb.tables])
    assert not [event.name for event in profile.function_events if "sort" in event.name]
    gathered = hidden @ emb(torch.arange(300)).T
    for got, want in zip(mine, torch.autograd.grad(gathered.square().sum(), [hidden, *emb.tables])):
        torch.testing.assert_close(got, want)


def test_padding_row_is_dedicated_zero_and_frozen():
    emb = SubspaceEmbedding(vocab_size=100, hidden_size=9, num_tables=3, padding_idx=1)
    assert emb.num_embedding_parameters() == (emb.table_size + 1) * 9
    out = emb(torch.tensor([1, 2]))
    assert torch.equal(out[0], torch.zeros(9))
    out.sum().backward()
    assert all(torch.equal(t.grad[emb.table_size], torch.zeros(t.shape[1])) for t in emb.tables)


def test_checkpoint_round_trip_restores_codes_and_outputs(tmp_path):
    source = SubspaceEmbedding(vocab_size=500, hidden_size=12, num_tables=2)
    source.codes.copy_(torch.from_numpy(np.random.default_rng(0).permutation(source.codes.numpy())))
    torch.save(source.state_dict(), tmp_path / "strategy.pt")
    restored = SubspaceEmbedding(vocab_size=500, hidden_size=12, num_tables=2)
    restored.load_state_dict(torch.load(tmp_path / "strategy.pt"))
    ids = torch.arange(500)
    assert torch.equal(restored.codes, source.codes)
    assert torch.equal(restored(ids), source(ids))


def test_oov_growth_uses_unused_codes_without_new_parameters():
    emb = SubspaceEmbedding(vocab_size=1000, hidden_size=12, num_tables=3, table_size=11)
    before = emb.num_embedding_parameters()
    old = emb(torch.arange(1000)).detach()
    emb.grow_vocab(1100)
    assert emb.num_embedding_parameters() == before
    assert emb.codes.shape == (1100, 3)
    assert len(np.unique(emb.codes.numpy(), axis=0)) == 1100
    assert torch.equal(emb(torch.arange(1000)), old)  # old tokens keep their vectors
    assert emb(torch.arange(1000, 1100)).shape == (100, 12)
    with pytest.raises(ValueError, match="unused codes"):
        emb.grow_vocab(11**3 + 1)


def test_grown_vocabulary_survives_a_checkpoint():
    emb = SubspaceEmbedding(vocab_size=100, hidden_size=6, num_tables=2, table_size=12)
    emb.grow_vocab(120)
    fresh = SubspaceEmbedding(vocab_size=100, hidden_size=6, num_tables=2, table_size=12)
    fresh.load_state_dict(emb.state_dict())
    assert fresh.vocab_size == 120 and torch.equal(fresh.codes, emb.codes)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_tables": 3, "table_size": 36, "vocab_size": 50265}, r"Q=36 gives 36\^3=46656 codes for 50265 tokens: raise Q to at least 37"),
        ({"num_tables": 0}, "num_tables=0 must be at least 1"),
        ({"num_tables": 20, "hidden_size": 16}, "num_tables=20 exceeds hidden_size=16"),
        ({"padding_idx": 5000}, "padding_idx=5000 is outside"),
    ],
)
def test_bad_arguments_are_refused_clearly(kwargs, message):
    args = {"vocab_size": 1000, "hidden_size": 64, **kwargs}
    with pytest.raises(ValueError, match=message):
        SubspaceEmbedding(**args)


# -- cluster assignment (Algorithm 2) ----------------------------------------------------------------


def test_cluster_codes_are_unique_on_synthetic_data():
    x = torch.randn(2000, 16, generator=torch.Generator().manual_seed(0))
    for method in ("equal", "kmeans"):
        codes = cluster_codes(x, 3, 13, method, max_iter=5)
        assert len(np.unique(codes, axis=0)) == 2000
        assert codes.min() >= 0
    assert codes[:, :2].max() < 13  # naive k-means: at most Q clusters per split; the last digit may run past Q


def test_naive_kmeans_is_uncapped_and_gives_small_groups_fewer_clusters():
    # 3 tight blobs of 50, 30 and 4 points, 6 clusters per split: Lloyd's clusters are as large as the data
    # makes them, and a group of 4 points cannot fill 6 clusters.
    centres = torch.tensor([[20.0, 0.0], [-20.0, 0.0], [0.0, 20.0]])
    sizes = torch.tensor([50, 30, 4])
    x = centres.repeat_interleave(sizes, 0) + 0.01 * torch.randn(84, 2, generator=torch.Generator().manual_seed(2))
    codes = cluster_codes(x, 2, 6, "kmeans", max_iter=20)
    assert len(np.unique(codes, axis=0)) == 84
    groups = np.bincount(codes[:, 0])
    assert groups.max() > 6  # uncapped: 6 clusters of 84 points cannot all stay within Q
    assert codes[:, 1].max() + 1 == groups.max()  # the last table holds as many rows as the largest group needs
    small = np.flatnonzero(np.arange(84) >= 80)
    assert len(set(codes[small, 0])) <= 4  # the 4-point blob fills no more clusters than it has points


def test_kmeans_first_digit_groups_nearby_points():
    centres = torch.tensor([[10.0, 0.0], [-10.0, 0.0], [0.0, 10.0]])
    x = centres.repeat_interleave(20, 0) + 0.1 * torch.randn(60, 2, generator=torch.Generator().manual_seed(1))
    codes = cluster_codes(x, 2, 25, "kmeans")  # 25 clusters for 3 blobs: blobs split, never mix
    blob = np.arange(60) // 20
    for cluster in np.unique(codes[:, 0]):
        assert len(set(blob[codes[:, 0] == cluster])) == 1


def test_equal_size_clusters_of_the_packaged_minilm_keep_q_rows(minilm_path, tmp_path):
    assignment = ClusterAssignment(source=minilm_path, method="equal", max_iter=4, cache_dir=str(tmp_path))
    emb = SubspaceEmbedding(30522, 384, num_tables=3, table_size=32, assignment=assignment)
    assert not emb.shaped_by_prepare
    emb.prepare()
    codes = emb.codes.numpy()
    assert len(np.unique(codes, axis=0)) == 30522
    first = np.bincount(codes[:, 0], minlength=32)
    assert first.max() - first.min() <= 1  # equal-size groups, within 1
    groups = codes[:, 0] * 32 + codes[:, 1]
    for g in np.unique(codes[:, 0])[:5]:  # second split is equal-size inside each group too
        sizes = np.bincount(codes[codes[:, 0] == g, 1], minlength=32)
        assert sizes.max() - sizes.min() <= 1
    assert np.bincount(groups).max() <= 32 and codes.max() < 32  # room for a distinct last digit
    assert [t.shape[0] for t in emb.tables] == [32, 32, 32]
    assert emb.num_embedding_parameters() == 32 * 384 and emb.table_rows is None
    assert repr(assignment).startswith("ClusterAssignment(")


def test_naive_kmeans_tables_of_the_packaged_minilm_grow_beyond_q(minilm_path, tmp_path):
    assignment = ClusterAssignment(source=minilm_path, method="kmeans", max_iter=4, cache_dir=str(tmp_path))
    emb = SubspaceEmbedding(30522, 384, num_tables=3, table_size=32, assignment=assignment)
    assert emb.shaped_by_prepare and emb.num_embedding_parameters() == 32 * 384  # Q rows until the codes exist
    emb.prepare()
    codes = emb.codes.numpy()
    assert len(np.unique(codes, axis=0)) == 30522
    rows = [t.shape[0] for t in emb.tables]
    assert rows == emb.table_rows == (codes.max(0) + 1).tolist()  # each table holds its largest index
    assert rows[0] <= 32 and rows[1] <= 32 and rows[2] > 32  # the largest final group needs more than Q
    groups = np.unique(codes[:, :2], axis=0, return_counts=True)[1]
    assert rows[2] == groups.max()
    assert emb.num_embedding_parameters() == sum(r * w for r, w in zip(rows, emb.widths)) > 32 * 384
    rebuilt = SubspaceEmbedding(30522, 384, **{k: v for k, v in emb.init_args().items() if k != "assignment"},
                                assignment=assignment)
    rebuilt.load_state_dict(emb.state_dict())  # its config records the rows: a checkpoint loads strictly
    assert torch.equal(rebuilt(torch.arange(30522)), emb(torch.arange(30522)))
    # A config that does not record the rows (a fine-tuning YAML naming the strategy) takes the checkpoint's:
    # the tables' shapes are the checkpoint's to decide, not a difference to refuse.
    unsized = SubspaceEmbedding(30522, 384, num_tables=3, table_size=32, assignment=assignment)
    assert {f"tables.{k}" for k in range(3)} | {"codes"} == set(unsized.state_dict()) - fixed_shapes(unsized)
    assert state_differences(unsized.state_dict(), emb.state_dict(), sized=fixed_shapes(unsized)) == ""
    unsized.load_state_dict(emb.state_dict())
    assert torch.equal(unsized(torch.arange(30522)), emb(torch.arange(30522)))
    radix = SubspaceEmbedding(30522, 384, num_tables=3, table_size=32)
    assert set(radix.state_dict()) - fixed_shapes(radix) == {"codes"}  # equal-size tables stay fixed


def test_cluster_assignment_is_cached_and_deterministic(minilm_path, tmp_path):
    a = ClusterAssignment(source=minilm_path, method="kmeans", max_iter=2, cache_dir=str(tmp_path))
    first = a.codes(30522, 2, 175)
    assert [p.suffix for p in (tmp_path / "assignments").iterdir()] == [".safetensors"]
    again = ClusterAssignment(source=minilm_path, method="kmeans", max_iter=2, cache_dir=str(tmp_path)).codes(30522, 2, 175)
    assert np.array_equal(first, again)


class Marker:
    """Unpickling it runs a command that leaves a file."""

    def __init__(self, path) -> None:
        self.path = path

    def __reduce__(self):
        return os.system, (f"touch {self.path}",)


def _cached(codes: np.ndarray, key: str, extra: dict | None = None, digest_of: np.ndarray | None = None) -> bytes:
    """What lit_embed.storage.cache writes for ``codes`` under ``key``, with ``extra`` tensors, or the digest of other codes."""
    digest = hashlib.sha256((codes if digest_of is None else digest_of).tobytes()).hexdigest()
    return safetensors_bytes({NAME: codes, **(extra or {})}, metadata={"format": FORMAT, "key": key, "sha256": digest})


def _bytes(write) -> bytes:
    handle = io.BytesIO()
    write(handle)
    return handle.getvalue()


#: A kind of file in place of the cached codes -> its bytes, from the path, the codes lit-embed wrote and their key.
MALFORMED = {
    "truncated": lambda path, codes, key: path.read_bytes()[:100],
    "empty": lambda path, codes, key: b"",
    "random bytes": lambda path, codes, key: bytes(range(256)) * 16,
    "an .npy of the codes": lambda path, codes, key: _bytes(lambda f: np.save(f, codes)),
    "an .npz of the codes": lambda path, codes, key: _bytes(lambda f: np.savez(f, codes=codes)),
    "a pickle": lambda path, codes, key: pickle.dumps(Marker(path.parent / "ran")),
    "another dtype": lambda path, codes, key: _cached(codes.astype(np.int32), key),
    "another shape": lambda path, codes, key: _cached(codes[:-1], key),
    "another key's": lambda path, codes, key: _cached(codes, "0" * len(key)),
    "edited codes": lambda path, codes, key: _cached(codes[::-1].copy(), key, digest_of=codes),
    "no header": lambda path, codes, key: safetensors_bytes({NAME: codes}),
    "an extra tensor": lambda path, codes, key: _cached(codes, key, extra={"more": codes}),
}


@pytest.mark.parametrize("kind", ["as written", *MALFORMED])
def test_a_cache_file_that_is_not_exactly_what_lit_embed_wrote_is_computed_again(kind, tmp_path, monkeypatch):
    """Never an error, never unpickled: anything but the array lit-embed wrote for that key (dtype, shape, key,
    content) is computed again and replaced; the file as written is read, not computed."""
    from lit_embed.embeddings import assignment

    torch.save(torch.randn(64, 4, generator=torch.Generator().manual_seed(0)), tmp_path / "m.pt")
    cache = tmp_path / "cache"
    fresh = ClusterAssignment(str(tmp_path / "m.pt"), cache_dir=str(cache)).codes(64, 2, 8)
    (path,) = (cache / "assignments").iterdir()
    if kind != "as written":
        path.write_bytes(MALFORMED[kind](path, fresh, path.stem))
    computed = []
    monkeypatch.setattr(assignment, "cluster_codes", lambda *args: computed.append(args) or cluster_codes(*args))
    assert np.array_equal(ClusterAssignment(str(tmp_path / "m.pt"), cache_dir=str(cache)).codes(64, 2, 8), fresh)
    assert len(computed) == (kind != "as written") and not (path.parent / "ran").exists()
    assert np.array_equal(read_codes(path, path.stem, fresh.shape), fresh)  # what lit-embed wrote is there again


def test_cluster_source_rows_must_match_the_vocabulary(tmp_path):
    np.save(tmp_path / "m.npy", np.zeros((10, 4), dtype=np.float32))
    with pytest.raises(ValueError, match="has 10 rows but the vocabulary has 12 tokens"):
        ClusterAssignment(source=str(tmp_path / "m.npy"), cache_dir=str(tmp_path)).codes(12, 2, 4)


def test_cluster_source_that_cannot_be_found_says_how_to_fix(tmp_path):
    with pytest.raises(OSError, match="local folder"):
        ClusterAssignment(source="no-such-org/no-such-model", cache_dir=str(tmp_path)).codes(12, 2, 4)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ClusterAssignment(source=str(tmp_path / "missing.pt"), cache_dir=str(tmp_path)).codes(12, 2, 4)


def test_cluster_strategy_defers_codes_until_prepare(tmp_path):
    x = torch.randn(300, 8, generator=torch.Generator().manual_seed(0))
    torch.save(x, tmp_path / "m.pt")
    emb = SubspaceEmbedding(300, 12, num_tables=2, assignment=ClusterAssignment(str(tmp_path / "m.pt"), cache_dir=str(tmp_path)))
    with pytest.raises(RuntimeError, match="prepare"):
        emb(torch.tensor([0]))
    emb.prepare()
    assert len(np.unique(emb.codes.numpy(), axis=0)) == 300
    assert np.array_equal(emb.codes.numpy(), cluster_codes(x, 2, emb.table_size, "equal", 0, 20))
    assert np.array_equal(radix_codes(np.array([5]), 2, 18)[0], [5, 0])

"""One memory unit (issue 35): every strategy and every post-hoc method reports the bytes its embedding needs at
inference, and the tensors of the file ``lit-embed compress`` saves add up to exactly that (read from the file's
header, not from a formula); DPQ saves no queries or keys; params --json gives bytes beside the papers' counts."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import pytest
import torch
import yaml

from lit_embed.checkpoints.format import build_from_config
from lit_embed.compress import load_compact
from lit_embed.compress.methods import Job, method_named
from lit_embed.compress.model_io import save_compact
from lit_embed.embeddings import (
    AdditiveQuantizedEmbedding,
    DPQEmbedding,
    EmbeddingStrategy,
    ProductQuantizedEmbedding,
)
from lit_embed.embeddings.dpq import code_dtype
from lit_embed.embeddings.quantized import pack_codes, unpack_codes
from tests.helpers import CONFIGS
from tests.helpers.cli import params_json

V, D = 600, 384


def file_tensor_bytes(path: Path) -> tuple[int, dict[str, str]]:
    """Bytes of the tensors a safetensors file holds (its size less the 8-byte length and the JSON header), and each
    tensor's dtype, from the header."""
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + length])
    header.pop("__metadata__", None)
    spans = sum(end - start for start, end in (entry["data_offsets"] for entry in header.values()))
    assert spans == len(raw) - 8 - length
    return spans, {name: entry["dtype"] for name, entry in header.items()}


def saved(strategy: EmbeddingStrategy, tmp_path: Path) -> tuple[int, dict[str, str]]:
    path = tmp_path / "compressed_embedding.safetensors"
    save_compact(strategy.for_inference(), path)
    return file_tensor_bytes(path)


def table(seed: int = 0) -> torch.Tensor:
    return torch.randn(V, D, generator=torch.Generator().manual_seed(seed))


VOCABULARY_CONFIGS = sorted(
    path.stem for path in (CONFIGS / "embedding").glob("*.yaml")
    if not yaml.safe_load(path.read_text())["class_path"].split(".")[-1].startswith(("Hash", "ProFormer", "Canine"))
    and not path.stem.startswith("subspace_3_")  # cluster codes need pretrained rows: the radix configs stand for them
)


@pytest.mark.parametrize("name", VOCABULARY_CONFIGS)
def test_each_strategy_s_saved_tensors_are_the_bytes_it_reports(name, tmp_path):
    config = yaml.safe_load((CONFIGS / "embedding" / f"{name}.yaml").read_text())
    init = {k: v for k, v in (config.get("init_args") or {}).items() if k != "budget"}
    if name == "dpq":
        init["codewords"] = 300  # past 256: codes need two bytes each
    if init.get("frequencies") == "data":  # what lit-embed fit counts in the training data: a count file here
        (tmp_path / "counts.txt").write_text("".join(f"{c}\n" for c in torch.randint(0, 50, (V,), generator=torch.Generator().manual_seed(0)).tolist()))
        init["frequencies"] = str(tmp_path / "counts.txt")
    strategy = build_from_config(EmbeddingStrategy, {"class_path": config["class_path"],
                                                     "init_args": {"vocab_size": V, "hidden_size": D, **init}}, "e")
    strategy.prepare()
    on_file, _ = saved(strategy, tmp_path)
    assert strategy.inference_bytes() == on_file > 0
    ids = torch.arange(V)
    with torch.no_grad():
        assert torch.equal(load_compact(tmp_path / "compressed_embedding.safetensors")(ids), strategy(ids))


@pytest.mark.parametrize(("method", "options"), [
    ("pq", {"groups": 4, "codewords": 16, "iterations": 3}),
    ("int4", {}),
    ("int8", {}),
    ("dense", {}),
    ("aq", {"codebooks": 4, "codewords": 8, "max_steps": 2}),
    ("svd", {"rank": 5}),
    ("sparse_coding", {"k": 3}),
    ("pca", {"k": 4}),
    ("unk", {}),
    ("fit", {"strategy": str(CONFIGS / "embedding" / "dpq.yaml"), "budget": 0.2, "max_steps": 2}),
    ("fit", {"strategy": str(CONFIGS / "embedding" / "hashing_trick.yaml"), "budget": 0.1, "max_steps": 2}),
    ("fit", {"strategy": str(CONFIGS / "embedding" / "robe.yaml"), "budget": 0.05, "max_steps": 2}),
])
def test_each_post_hoc_method_s_file_holds_the_bytes_it_reports(method, options, tmp_path):
    (strategy,) = method_named(method, options).fit(Job(table(), torch.arange(0, V, 4), unk_id=0)).values()
    on_file, dtypes = saved(strategy, tmp_path)
    assert strategy.inference_bytes() == on_file
    if isinstance(strategy, DPQEmbedding):  # the codes and values; the queries and keys that chose them are not kept
        assert set(dtypes) == {"values", "code_table"}
        assert on_file == strategy.codewords * D * 4 + V * strategy.groups * code_dtype(strategy.codewords).itemsize
    if method == "int4":  # two codes a byte, a float32 scale and offset a row
        assert on_file == V * D // 2 + 8 * V and dtypes["codes"] == "U8"
    if method == "pq":  # 4 groups of 4-bit codes (K = 16) a row, packed: 2 bytes; K d float32 codebook values
        assert on_file == V * 2 + 16 * D * 4 and dtypes["codes"] == "U8"
    if method == "aq":  # 4 codebooks of 3-bit codes (K = 8): 12 bits a row, 2 bytes
        assert on_file == V * 2 + 4 * 8 * D * 4
    ids = torch.arange(V)
    with torch.no_grad():  # the file decodes as the strategy computes
        assert torch.equal(load_compact(tmp_path / "compressed_embedding.safetensors")(ids), strategy(ids))


@pytest.mark.parametrize("codewords", [2, 3, 5, 16, 17, 100, 255, 256])
@pytest.mark.parametrize("per_row", [1, 3, 7, 8])
def test_codes_are_packed_at_their_bit_width_and_unpack_exactly(codewords, per_row):
    codes = torch.randint(codewords, (50, per_row), generator=torch.Generator().manual_seed(codewords))
    packed = pack_codes(codes, codewords)
    bits = math.ceil(math.log2(codewords))
    assert packed.dtype == torch.uint8 and packed.shape == (50, math.ceil(per_row * bits / 8))
    assert torch.equal(unpack_codes(packed, per_row, codewords), codes)
    assert torch.equal(unpack_codes(packed[[7, 3, 7]], per_row, codewords), codes[[7, 3, 7]])  # rows alone, as ids read


@pytest.mark.parametrize("cls", [ProductQuantizedEmbedding, AdditiveQuantizedEmbedding])
def test_codes_saved_a_byte_each_before_packing_load_into_the_packed_strategy(cls):
    """An artefact written before the codes were packed ((V, G) bytes) loads, and computes what it computed."""
    strategy = cls(V, D, 4, 16)
    codes = torch.randint(16, (V, 4), generator=torch.Generator().manual_seed(0))
    strategy.set_codes(codes)
    torch.nn.init.normal_(strategy.codebooks)
    old = {**strategy.state_dict(), "codes": codes.to(torch.uint8)}
    loaded = cls(V, D, 4, 16)
    loaded.load_state_dict(old)
    ids = torch.arange(V)
    with torch.no_grad():
        assert torch.equal(loaded.code_table(), codes) and torch.equal(loaded(ids), strategy(ids))


def test_dpq_s_inference_form_computes_what_it_computed_and_reports_no_training_tensors():
    torch.manual_seed(0)
    dpq = DPQEmbedding(V, D, codewords=300, groups=4)
    kept = dpq.for_inference()
    assert kept.codes_only and kept.code_table.dtype == torch.int16 and not hasattr(kept, "queries")
    ids = torch.arange(V)
    with torch.no_grad():
        assert torch.equal(kept(ids), dpq(ids))
    assert dpq.inference_bytes() == kept.inference_bytes() == 300 * D * 4 + V * 4 * 2
    assert dpq.training_figures()["training_bytes"] == (V * D + 2 * 300 * D) * 4  # queries, keys and values
    assert kept.for_inference() is kept
    rebuilt = build_from_config(EmbeddingStrategy, kept.config(with_sizes=True), "e")
    rebuilt.load_state_dict(kept.state_dict())
    with torch.no_grad():
        assert torch.equal(rebuilt(ids), kept(ids))


def test_params_json_gives_inference_bytes_beside_the_papers_counts():
    config = str(CONFIGS / "sweeps" / "zoo" / "demo_pretrain.yaml")
    dpq = ["--model.init_args.embedding", str(CONFIGS / "embedding" / "dpq.yaml")]
    report = params_json(["params", "--config", config, "--json", *dpq])
    vocab, d = 30522, report["hidden_size"]
    assert report["embedding_params"] == 32 * d + vocab * 8  # the paper's count: a code is one parameter
    assert report["embedding_bytes"] == 32 * d * 4 + vocab * 8  # a code is a byte (K = 32), no queries or keys
    assert report["embedding_training_bytes"] == (vocab * d + 2 * 32 * d + 2 * 32) * 4  # queries, keys, values, and the
    # scores' running mean and variance (batch_norm_scores: the yaml follows the authors' default)
    assert report["embedding_trainable_params"] == vocab * d + 2 * 32 * d
    assert report["baseline_embedding_bytes"] == vocab * d * 4
    dense = params_json(["params", "--config", config, "--json"])
    assert dense["embedding_bytes"] == dense["embedding_training_bytes"] == 4 * dense["embedding_params"] == vocab * d * 4

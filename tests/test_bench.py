"""The benchmark suite keeps working: every benchmark runs at its smallest size (figures are not checked
here), the peers and inputs written for it are what they claim to be, and the GPU kit refuses a machine
without a GPU and keeps what each of its parts wrote however the part ends."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers import REPO


def test_benchmark_suite_runs_at_smoke_size():
    done = subprocess.run(
        [sys.executable, str(REPO / "tools" / "bench" / "run.py"), "--smoke", "--no-write"],
        capture_output=True, text=True, cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    names = sorted(p.stem.removeprefix("bench_") for p in (REPO / "tools" / "bench").glob("bench_*.py"))
    for name in names:
        assert f"== {name}:" in done.stdout
    out = done.stdout
    assert "lit-embed equal-size" in out and "speed-up vs dense" in out
    # the peers an expert would pick, each in the table of what it is compared with (optional ones may be skipped)
    assert "SparseAdam" in out and "AdamW on touched rows" in out and "speed-up vs best peer" in out
    assert "LM head on masked positions (expert peer)" in out and "speed-up vs expert peer" in out
    assert "logits at every position" in out and "speed-up vs HF full logits" in out
    assert "RobertaForMaskedLM(labels=)" in out and "speed-up vs BERT-MLM (HF)" in out  # HashFormers' Table 3
    assert "faiss Kmeans" in out and "xxHash XXH3-128" in out
    assert "== startup:" in out and "import torch" in out and "lit-embed report" in out
    assert "bf16 autocast" in out and "largest loss gap vs fp32" in out
    # real text as the headline input, uniform ids as a second row; the physical limit; the data pipeline
    assert "real-text ids" in out and "uniform ids" in out and "% of limit" in out
    assert "HuggingFace run_mlm way" in out and "tokens/s per core" in out and "cores for one GPU" in out


def bench_module(monkeypatch, name: str):
    monkeypatch.syspath_prepend(str(REPO / "tools" / "bench"))
    return importlib.import_module(name)


def test_touched_row_adamw_peer_is_adamw_on_the_rows_it_touches(monkeypatch):
    """The embedding step's touched-row peer is AdamW: on the rows a batch touches it steps as torch's AdamW
    does (same settings), and it leaves every other row alone (lazy, like SparseAdam)."""
    bench = bench_module(monkeypatch, "bench_embedding_step")
    table = bench.TouchedRowsAdamW(50, 8)
    reference = torch.nn.Embedding(50, 8)
    reference.weight.data.copy_(table.weight)
    start = table.weight.clone()
    config = table.config
    optimizer = torch.optim.AdamW(reference.parameters(), lr=config.lr, betas=config.betas, eps=config.eps,
                                  weight_decay=config.weight_decay)
    ids = torch.tensor([[3, 7, 7, 11], [3, 42, 0, 11]])
    for seed in range(3):  # the same rows every step: dense AdamW moves them exactly as the lazy one does
        grad = torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(seed))
        for module, step in ((table, table), (reference, optimizer)):
            step.zero_grad(set_to_none=True)
            module(ids).backward(grad)
            step.step()
    touched = ids.unique()
    untouched = torch.ones(50, dtype=torch.bool)
    untouched[touched] = False
    torch.testing.assert_close(table.weight[touched], reference.weight.detach()[touched])
    assert torch.equal(table.weight[untouched], start[untouched])
    assert not torch.equal(table.weight[touched], start[touched])


def test_results_say_when_no_gpu_figures_exist(monkeypatch, tmp_path):
    record = bench_module(monkeypatch, "record")
    environment = {"cpu_count": 2, "torch_threads": 2, "torch": "2"}
    payload = {"title": "T", "description": "D", "date": "2026-01-01", "command": "c", "environment": environment,
               "rows": [{"what": "x", "seconds": 1.0}]}
    (tmp_path / "x.cpu.json").write_text(json.dumps(payload))
    assert "No GPU results" in record.render(tmp_path)
    (tmp_path / "x.cuda.json").write_text(json.dumps({**payload, "environment": {**environment, "gpu": "H100"}}))
    assert "No GPU results" not in record.render(tmp_path)


def test_a_measurement_in_a_child_process_comes_back_as_its_row(monkeypatch):
    """The path every full-size memory figure takes (the smoke run measures in its own process)."""
    harness = bench_module(monkeypatch, "harness")
    bench = bench_module(monkeypatch, "bench_embedding_step")
    jobs = [{"shape": [100, 8], "label": "nn.Embedding(sparse=True), SparseAdam"}]
    rows = harness.in_children(bench.__file__, jobs, harness.Context(), bench.measure_memory)
    assert len(rows) == 1 and rows[0]["step memory MB"] >= 0


def test_the_expert_mlm_peer_computes_huggingfaces_loss_on_the_masked_positions_alone(monkeypatch):
    """The headline MLM peer (HuggingFace's encoder, its LM head on the masked positions only) is HuggingFace's
    masked LM: with the same weights it gives the loss and gradients that ``*ForMaskedLM(labels=)`` gives."""
    builders = bench_module(monkeypatch, "builders")
    config = builders.backbone_config("roberta_s", 1000, smoke=True)
    expert, full = builders.HuggingFaceMLM(config, masked_only=True), builders.HuggingFaceMLM(config, masked_only=False)
    full.load_state_dict(expert.state_dict())
    data = builders.batch(expert, (3, 40), seed=1, ids="uniform")
    assert (data["labels"] != -100).sum() > 0
    losses = []
    for model in (expert, full):
        model.eval()  # no dropout: the two runs see the same network
        loss, logits, _ = model(data)
        loss.backward()
        losses.append(loss.detach())
    torch.testing.assert_close(losses[0], losses[1])
    assert logits.shape[:2] == data["codes"].shape  # the full peer scores every position, the expert only the masked
    weight = "model.roberta.encoder.layer.0.attention.self.query.weight"
    grads = [dict(model.named_parameters())[weight].grad for model in (expert, full)]
    torch.testing.assert_close(grads[0], grads[1])


@pytest.mark.parametrize("vocab_size", [50265, 250002, 1000])
def test_text_like_ids_are_real_text_inside_any_vocabulary(monkeypatch, vocab_size):
    """Windows of real prose, the same for a seed, inside the vocabulary and clear of the specials (ids 0-3 and
    the last), whether the vocabulary is larger than the tokenizer's (ids kept) or smaller (folded); and, as
    text does, they repeat: fewer distinct ids than uniform ids of the same batch."""
    real_text = bench_module(monkeypatch, "real_text")
    ids = real_text.text_ids((8, 66), vocab_size, seed=3, chars=60_000)
    assert ids.shape == (8, 64) and np.array_equal(ids, real_text.text_ids((8, 66), vocab_size, seed=3, chars=60_000))
    assert not np.array_equal(ids, real_text.text_ids((8, 66), vocab_size, seed=4, chars=60_000))
    assert ids.min() >= 4 and ids.max() <= vocab_size - 2
    uniform = real_text.uniform_ids((8, 66), vocab_size, seed=3)
    assert uniform.min() >= 4 and uniform.max() <= vocab_size - 2
    assert len(np.unique(ids)) < 0.8 * len(np.unique(uniform))
    if vocab_size > 30523:  # the tokenizer's own ids: the windows decode to words of the prose
        words = real_text.tokenizer().tokenizer.decode(ids[0].tolist()).split()
        assert sum(word.isalpha() for word in words) > len(words) / 2


def test_without_prose_on_the_machine_text_like_ids_are_zipf_ids_and_say_so(monkeypatch):
    real_text = bench_module(monkeypatch, "real_text")
    monkeypatch.setattr(real_text, "sources", lambda: iter(()))
    for cached in (real_text.prose, real_text.token_stream):
        cached.cache_clear()
        monkeypatch.setattr(real_text, cached.__name__, cached)
    from lit_embed.embeddings import HashProj

    try:
        ids = real_text.text_ids((4, 130), 50265, chars=12_345)
        assert real_text.describe(12_345).startswith("Zipf ids")
        codes = real_text.text_codes(HashProj(None, 8).text_encoder(None), (4, 130), chars=12_345)  # hashed Zipf words
        assert codes.shape == (4, 128, 3) and (codes[..., 0] == 5).all()  # every token a hashed word (row 5)
    finally:
        real_text.prose.cache_clear()
        real_text.token_stream.cache_clear()
    assert ids.shape == (4, 128) and ids.min() >= 4 and ids.max() <= 50263
    assert np.bincount(ids.ravel()).argmax() == 4  # rank 1 of the Zipf law is the most frequent id


def test_prose_is_sentences_read_once(monkeypatch):
    """Manual pages lose their roff requests and escapes; code, commit records and headings are not prose; a
    paragraph met twice (a licence copied into many packages) is taken once."""
    real_text = bench_module(monkeypatch, "real_text")
    page = ('.TH LS 1\n.SH NAME\nls \\- list directory contents\n.SH DESCRIPTION\n.PP\nList information about the '
            '\\fBFILEs\\fR (the current directory by default), sorted alphabetically when no option is given.\n')
    assert "\\f" not in real_text.man_page_text(page) and ".SH" not in real_text.man_page_text(page)
    licence = "Permission is hereby granted to any person obtaining a copy of this software and its documentation."
    texts = [("docs", real_text.man_page_text(page)), ("docs", f"{licence}\n\ncommit 8683bdd7 Author: A <a@b.c> 2011-02-27"),
             ("other", f"def f(x):\n    return x ** 2 + g(x, y=3) * h[0]\n\n{licence}\n\nUsage:")]
    monkeypatch.setattr(real_text, "sources", lambda: iter(texts))
    real_text.prose.cache_clear()
    try:
        paragraphs, taken = real_text.prose(10_000)
    finally:
        real_text.prose.cache_clear()
    assert paragraphs == ("List information about the FILEs (the current directory by default), sorted alphabetically "
                          "when no option is given.", licence)
    assert taken == {"docs": sum(len(p) for p in paragraphs)}


def test_what_an_embedding_step_must_move(monkeypatch):
    """The embedding step's physical limit counts the output and its gradient, the codes, the table rows a
    forward reads, and 8 accesses per parameter the optimiser steps: every row of a dense table, the touched
    rows for the lazy peers, the small tables of subspace."""
    bench = bench_module(monkeypatch, "bench_embedding_step")
    from lit_embed.embeddings import SubspaceEmbedding

    codes = torch.tensor([[5, 7, 7, 9], [5, 11, 12, 9]])  # 8 tokens, 5 distinct rows
    tokens, unique, d, vocab = 8, 5, 16, 1000
    activations = 4 * 2 * tokens * d + 8 * tokens
    dense = torch.nn.Embedding(vocab, d)
    assert bench.step_bytes("nn.Embedding, fused AdamW", dense, codes, d) == activations + 4 * (unique * d + 8 * vocab * d)
    lazy = bench.TouchedRowsAdamW(vocab, d)
    assert bench.step_bytes("dense table, AdamW on touched rows", lazy, codes, d) == activations + 4 * 9 * unique * d
    subspace = SubspaceEmbedding(vocab, d, num_tables=3)
    assert bench.step_bytes("subspace f=3", subspace, codes, d) == activations + 4 * 8 * subspace.table_size * d


def test_what_a_one_product_strategys_step_computes(monkeypatch):
    """The arithmetic floor of Proj, Add and ProFormer: the product and the weight's gradient, each 2 x distinct codes
    x features x d operations (Add's features are the T bits and a 1); none for a strategy that is not one product;
    the GEMM rate is a positive figure of the shape it was measured at."""
    bench = bench_module(monkeypatch, "bench_embedding_step")
    harness = bench_module(monkeypatch, "harness")
    from lit_embed.embeddings import HashAdd, HashPool, HashProj, ProFormerEmbedding

    d = 16
    torch.manual_seed(0)  # 5 random 16-bit codes, distinct
    for strategy, features in ((HashProj(None, d, num_bits=16), 16), (HashAdd(None, d, num_bits=16), 17),
                               (ProFormerEmbedding(None, d, num_bits=16), 16)):
        codes = strategy.code_sampler()((2, 5))
        codes[1] = codes[0]  # 5 distinct codes among 10 tokens
        assert bench.step_flops(strategy, codes, d) == 4 * 5 * features * d
    assert bench.step_flops(HashPool(None, d, num_bits=8, chunk_bits=4), codes, d) is None
    rate = harness.gemm_rate(harness.Context(smoke=True), 8, 4, d)
    assert rate["GFLOP/s"] > 0 and rate["shape"] == "8 x 4 x 16"


@pytest.mark.parametrize("argv", [
    ["--device", "cuda", "--quick"],
    ["--device", "cuda:1", "--quick", "--budget", "60", "--out", "{tmp}/out"],
    ["--device", "cuda", "pretrain_step"],
    ["--device", "cuda", "--headlines"],
])
def test_a_gpu_run_on_a_machine_without_a_gpu_says_so_in_one_line_and_runs_and_writes_nothing(
        monkeypatch, tmp_path, capsys, argv):
    """Whatever asks for a GPU (the kit, with its options, or benchmarks) where torch sees no CUDA device:
    one line saying so and what to do, exit 2, no part or benchmark started, and nothing written (results,
    RESULTS.md, --out, $OUT)."""
    run = bench_module(monkeypatch, "run")
    kit = bench_module(monkeypatch, "kit")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    results = tmp_path / "bench" / "results"
    results.mkdir(parents=True)
    (results / "embedding_step.cpu.json").write_text("{}")
    monkeypatch.setattr(run, "RESULTS", results)
    monkeypatch.setenv("OUT", str(tmp_path / "from_env"))

    def started(*args, **kwargs):
        raise AssertionError("a GPU part or benchmark was started without a GPU")

    monkeypatch.setattr(kit, "run_parts", started)
    monkeypatch.setattr(run, "importlib", type("NoImports", (), {"import_module": staticmethod(started)}))
    before = sorted(tmp_path.rglob("*"))
    assert run.main([arg.format(tmp=tmp_path) for arg in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("No GPU is present") and err.count("\n") == 1, err
    assert "nothing was run or written" in err
    assert ("the GPU kit (--quick) needs one" if "--quick" in argv else f"--device {argv[1]} needs one") in err
    assert sorted(tmp_path.rglob("*")) == before and (results / "embedding_step.cpu.json").read_text() == "{}"


def test_the_gpu_kit_keeps_every_partial_result_when_parts_fail_or_run_out_of_time(monkeypatch, tmp_path):
    """The kit's budget and bookkeeping on the CPU, with parts standing in for the GPU ones: a part that passes,
    one that writes a partial result and then runs past its share of the budget (it and the process it started
    are stopped, its result kept), one that fails, one skipped. The kit goes on after each, records how each
    ended, logs with timestamps, copies what it has to --out, and exits 1."""
    kit = bench_module(monkeypatch, "kit")
    results, out = tmp_path / "bench" / "results", tmp_path / "out"
    partial = results / "slow.cuda.json"
    pid_file = tmp_path / "pids"
    python = sys.executable
    slow = (f"import json, os, pathlib, subprocess, sys, time; pathlib.Path({str(partial)!r}).write_text(json.dumps("
            f"{{'title': 'slow', 'description': '', 'date': '', 'command': '', 'environment': {{'cpu_count': 2, "
            f"'torch_threads': 1, 'torch': '2'}}, 'complete': False, 'rows': [{{'figure': 1.5}}]}})); "
            f"child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
            f"pathlib.Path({str(pid_file)!r}).write_text(f'{{os.getpid()}} {{child.pid}}'); print('measured 1 row', flush=True); "
            f"time.sleep(600)")
    parts = [kit.Part("passes", [python, "-c", "print('hello from the GPU')"], 1),
             kit.Part("slow", [python, "-c", slow], 1),
             kit.Part("fails", [python, "-c", "import sys; sys.exit(3)"], 1),
             kit.Part("DDP", [python, "-c", "raise SystemExit('must not run')"], 1, "needs 2 GPUs, this machine has 1")]
    monkeypatch.setattr(kit, "parts", lambda gpus: parts)
    monkeypatch.setattr(kit, "gpu_count", lambda: 1)
    harness = bench_module(monkeypatch, "harness")
    monkeypatch.setattr(harness, "environment", lambda ctx: {"cpu_count": 2, "torch_threads": 1, "torch": "2"})
    assert kit.main(24, str(out), results) == 1
    summary = json.loads((results / "gpu_kit.cuda.json").read_text())
    assert summary["complete"] and [row["status"] for row in summary["rows"]] == ["passed", "out of time", "failed (exit 3)", "skipped"]
    assert json.loads(partial.read_text())["rows"] == [{"figure": 1.5}]  # what the stopped part had written
    # stopped, not waited for: the part and the process it started are gone when the kit returns
    assert not any(running(int(pid)) for pid in pid_file.read_text().split())
    log = (results / "gpu_kit.log").read_text()
    assert "hello from the GPU" in log and "measured 1 row" in log and "must not run" not in log
    assert all(line.startswith("[") and "s] " in line for line in log.splitlines())
    assert "**Partial" in (results.parent / "RESULTS.md").read_text()
    assert sorted(p.name for p in out.iterdir()) == ["RESULTS.md", "gpu_kit.cuda.json", "gpu_kit.log", "slow.cuda.json"]


def running(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie, ended but not yet reaped by its new parent, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def test_the_gpu_kit_refuses_a_budget_too_short_to_run_anything(monkeypatch, tmp_path, capsys):
    kit = bench_module(monkeypatch, "kit")
    assert kit.main(3, None, tmp_path) == 2
    assert "--budget 3 is too short" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_headlines_name_their_peer_and_input_and_follow_the_rows(monkeypatch, tmp_path):
    """A headline is read from the rows of a result file: lit-embed's figure, its peer's of the same run, the input
    and the ratio with its range; a headline whose rows are missing is left out rather than guessed."""
    run, record = bench_module(monkeypatch, "run"), bench_module(monkeypatch, "record")
    environment = {"cpu_count": 2, "torch_threads": 2, "torch": "2", "load average": 3.5}
    expert = "HuggingFace *ForMaskedLM, LM head on masked positions (expert peer)"
    rows = [{"model": "RoBERTa_S", "strategy": "subspace f=3", "ids": "real-text ids", "batch": "32x128",
             "seconds per step": 5.0, "speed-up vs expert peer": 1.21, "vs expert peer range": "1.1-1.3"},
            {"model": "RoBERTa_S", "strategy": expert, "ids": "real-text ids", "batch": "32x128", "seconds per step": 6.05}]
    payload = {"title": "T", "description": "D", "date": "2026-01-01", "command": "c", "environment": environment}
    (tmp_path / "pretrain_step.cpu.json").write_text(json.dumps({**payload, "rows": rows}))
    text = record.render(tmp_path)
    line = next(line for line in text.splitlines() if line.startswith("| RoBERTa_S MLM step, subspace f=3, 32x128"))
    assert "| real-text ids | 5 s |" in line and f"{expert}: 6.05 s" in line and "1.21x (1.1-1.3)" in line and "load 3.5" in line
    assert "XLM-R_S" not in text.split("## Headlines")[1].split("No GPU results")[0]  # no rows, no claim
    headlines = bench_module(monkeypatch, "headlines")
    assert all("ids" in headline.ours or headline.input for headline in headlines.HEADLINES)  # each names its input
    ways = [{"way": "lit-embed MLM, streaming", "tokens/s per core": 2e5, "vs HF run_mlm": 2.0},
            {"way": "HuggingFace run_mlm way (map + group + collator)", "tokens/s per core": 1e5}]
    (tmp_path / "pipeline.cpu.json").write_text(json.dumps({**payload, "rows": ways}))
    baseline = "BERT-MLM, HuggingFace RobertaForMaskedLM(labels=), logits at every position (baseline)"
    table3 = [{"strategy": baseline, "ids": "real-text ids", "ms per sample": 20.0},  # another group's baseline
              {"strategy": baseline, "ids": "real-text ids", "ms per sample": 17.0},
              {"strategy": "HashFormer-MD-Proj, S+R", "ids": "real-text ids", "ms per sample": 16.0,
               "speed-up vs BERT-MLM (HF)": 1.06, "vs BERT-MLM (HF) range": "1.01-1.1"}]
    (tmp_path / "table3.cpu.json").write_text(json.dumps({**payload, "rows": table3}))
    lines = record.render(tmp_path).splitlines()
    line = next(line for line in lines if line.startswith("| data pipeline"))
    assert "| real English prose" in line and "run_mlm way (map + group + collator): 1e+05 tokens/s" in line
    line = next(line for line in lines if line.startswith("| HashFormers' Table 3"))
    assert f"{baseline}: 17 ms |" in line and "1.06x (1.01-1.1)" in line  # the peer of its own group
    for name in ("pipeline", "table3"):
        (tmp_path / f"{name}.cpu.json").unlink()
    (tmp_path / "pretrain_step.cpu.json").write_text(json.dumps({**payload, "rows": rows[:1]}))
    assert "## Headlines" not in record.render(tmp_path)  # its peer's row is missing: the claim goes
    with pytest.raises(SystemExit):
        run.main(["--headlines", "cluster"])


def test_a_result_records_its_code_and_a_stale_one_makes_no_headline(monkeypatch, tmp_path):
    """A result records a digest of every file of the repository its process imported; once one of them changes the
    result's section says STALE, naming the file, and its headline is left out."""
    record, fingerprint = bench_module(monkeypatch, "record"), bench_module(monkeypatch, "fingerprint")
    code = fingerprint.imported_code()
    assert "tools/bench/record.py" in code["files"] and "lit_embed/storage/files.py" in code["files"]
    assert not any(name.startswith("tests/") for name in code["files"])
    monkeypatch.setattr(fingerprint, "REPO", tmp_path / "repo")
    timed = tmp_path / "repo" / "lit_embed" / "models" / "mlm.py"
    timed.parent.mkdir(parents=True)
    timed.write_text("v = 1\n")
    files = {"lit_embed/models/mlm.py": fingerprint.file_digest("lit_embed/models/mlm.py")}
    expert = "HuggingFace *ForMaskedLM, LM head on masked positions (expert peer)"
    rows = [{"model": "RoBERTa_S", "strategy": "subspace f=3", "ids": "real-text ids", "batch": "32x128",
             "seconds per step": 5.0, "speed-up vs expert peer": 1.21, "vs expert peer range": "1.1-1.3"},
            {"model": "RoBERTa_S", "strategy": expert, "ids": "real-text ids", "batch": "32x128", "seconds per step": 6.05}]
    result = {"title": "T", "description": "D", "date": "2026-01-01", "command": "c", "rows": rows,
              "environment": {"cpu_count": 2, "torch_threads": 1, "torch": "2", "load average": 3.5},
              "code": {"fingerprint": fingerprint.combined(files), "files": files}}
    (tmp_path / "pretrain_step.cpu.json").write_text(json.dumps(result))
    text = record.render(tmp_path)
    headline = next(line for line in text.splitlines() if line.startswith("| RoBERTa_S MLM step"))
    assert headline.endswith(f"| {result['code']['fingerprint']} |") and "code " + result["code"]["fingerprint"] + ", current" in text
    timed.write_text("v = 2\n")  # the code it timed changes
    text = record.render(tmp_path)
    assert "## Headlines" not in text
    assert f"code {result['code']['fingerprint']}, STALE: lit_embed/models/mlm.py changed since" in text


def test_rounds_replace_every_benchmarks_own_and_the_headline_set_runs_fifteen(monkeypatch, tmp_path, capsys):
    """``--rounds N`` times every interleaved call N times after its warm-up, whatever the benchmark asks, and the
    result records N (the headlines name it); ``--headlines`` runs its benchmarks with 15; a round count below 1 is
    refused in one line."""
    harness, run = bench_module(monkeypatch, "harness"), bench_module(monkeypatch, "run")
    calls = {"a": 0, "b": 0}
    timing = harness.time_interleaved({name: lambda name=name: calls.__setitem__(name, calls[name] + 1) for name in calls},
                                      harness.Context(rounds=4), warmup=1, repeat=7)
    assert calls == {"a": 5, "b": 5} and timing["a"]["repeats"] == timing["b"]["repeats"] == 4
    assert harness.time_interleaved({"a": lambda: None}, harness.Context(), repeat=7)["a"]["repeats"] == 7

    seen = []
    monkeypatch.setattr(run, "RESULTS", tmp_path)

    class Benchmark:
        TITLE, THREADS = "fake", 1

        @staticmethod
        def run(ctx):
            seen.append(ctx.rounds)
            return [{"x": 1}]

    monkeypatch.setattr(run.importlib, "import_module", lambda name: Benchmark)
    monkeypatch.setattr(run, "save", lambda path, payload, rows, complete: seen.append(payload["rounds"]))
    assert run.main(["--headlines", "--no-write"]) == 0 and set(seen) == {run.HEADLINE_ROUNDS} == {15}
    seen.clear()
    assert run.main(["--rounds", "3", "cluster"]) == 0 and seen == [3, 3]  # the context's and the result's
    with pytest.raises(SystemExit):
        run.main(["--rounds", "0", "cluster"])
    assert "--rounds 0 must be at least 1" in capsys.readouterr().err

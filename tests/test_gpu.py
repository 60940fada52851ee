"""The GPU paths: fp16 mixed precision, CUDA timings and memory, NCCL DDP. They run wherever GPUs are
visible (skipped elsewhere, saying why): CI has none, the papers' users do."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

from lit_embed.callbacks.efficiency import peak_tflops
from lit_embed.commands import main
from tests.helpers import CONFIGS, REPO
from tests.helpers.run_if import requires_gpus

QUIET = ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]
SHORT = ["--trainer.max_steps", "6", "--trainer.val_check_interval", "6", "--trainer.limit_val_batches", "2",
         "--data.init_args.batch_size", "8", *QUIET]


def probed(out) -> list[str]:
    """The arguments that add :class:`~tests.helpers.probes.StateProbe` to a run's callbacks."""
    probe = {"class_path": "tests.helpers.probes.StateProbe", "init_args": {"out": str(out)}}
    return ["--trainer.callbacks+", json.dumps(probe)]


@requires_gpus(1)
def test_mixed_precision_pretraining_on_one_gpu(tmp_path, monkeypatch):
    """configs/trainer/gpu.yaml: fp16 with a gradient scaler, fused AdamW; the figures are CUDA's."""
    monkeypatch.chdir(tmp_path)
    assert main(["fit", "--config", str(CONFIGS / "demo.yaml"), "--trainer", str(CONFIGS / "trainer" / "gpu.yaml"),
                 "--trainer.devices", "1", *SHORT, *probed(tmp_path / "state.json")]) == 0
    seen = json.loads((tmp_path / "state.json").read_text())
    assert seen["precision"] == "16-mixed" and seen["fused"] and seen["devices"] == ["cuda"]
    assert seen["dtypes"] == ["torch.float32"]  # fp32 master weights; fp16 only inside autocast
    run = tmp_path / "runs" / "demo" / "version_0"
    results = json.loads((run / "results.json").read_text())
    assert results["status"] == "complete" and results["global_step"] == 6
    assert results["efficiency"]["device"] == torch.cuda.get_device_name(0)
    assert results["efficiency"]["peak_memory_mb"] > 0
    train = results["efficiency"]["train"]  # timed by CUDA events, read without a sync per step
    assert train["ms_per_sample"] > 0 and train["tokens_per_s"] > 0
    assert (train["mfu"] is None) == (peak_tflops(torch.cuda.get_device_name(0)) is None)
    assert all(torch.isfinite(torch.tensor(v)) for k, v in results["metrics"].items() if k.startswith("val/"))
    state = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert state["global_step"] == 6 and all(v.device.type == "cpu" for v in state["state_dict"].values())


@requires_gpus(1)
def test_a_backbone_replayed_as_cuda_graphs_computes_what_eager_does_and_trains_through_the_cli(tmp_path, monkeypatch):
    """``torch_compile: reduce-overhead``: the third call (a replayed CUDA graph) gives eager's loss and gradients,
    with the graph's own output buffers reused between calls; and a fit through the CLI validates and saves."""
    import functools

    from lit_embed.embeddings import SubspaceEmbedding
    from lit_embed.models import MaskedLM
    from tests.helpers import tiny_encoder

    torch.manual_seed(0)
    codes = torch.randint(5, 1000, (4, 24), device="cuda")
    batch = {"codes": codes, "attention_mask": torch.ones_like(codes),
             "labels": torch.where(torch.rand(4, 24, device="cuda") < 0.3, codes, torch.full_like(codes, -100))}
    factory = functools.partial(SubspaceEmbedding, num_tables=3)
    eager = MaskedLM(tiny_encoder(), vocab_size=1000, embedding=factory).cuda().eval()
    graphed = MaskedLM(tiny_encoder(), vocab_size=1000, embedding=factory, torch_compile="reduce-overhead").cuda().eval()
    graphed.load_state_dict(eager.state_dict())
    expected = eager(batch)[0]
    expected.backward()
    for _ in range(3):  # recorded on an early call, replayed on the later ones
        graphed.zero_grad(set_to_none=True)
        loss = graphed(batch)[0]
        loss.backward()
        torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)
    for (name, a), b in zip(eager.named_parameters(), graphed.parameters()):
        if a.grad is not None:
            torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-6, msg=name)

    monkeypatch.chdir(tmp_path)
    assert main(["fit", "--config", str(CONFIGS / "demo.yaml"), "--trainer.accelerator", "gpu", "--trainer.devices", "1",
                 "--model.init_args.torch_compile", "reduce-overhead", *SHORT]) == 0
    results = json.loads((tmp_path / "runs/demo/version_0/results.json").read_text())
    assert results["status"] == "complete" and results["global_step"] == 6
    assert all(torch.isfinite(torch.tensor(v)) for k, v in results["metrics"].items() if k.startswith("val/"))


@requires_gpus(1)
def test_fp16_with_gradient_clipping_takes_the_unfused_optimiser(tmp_path, monkeypatch):
    """Lightning cannot clip a fused optimiser's gradients under fp16's scaler: the unfused AdamW runs instead."""
    monkeypatch.chdir(tmp_path)
    assert main(["fit", "--config", str(CONFIGS / "demo.yaml"), "--trainer", str(CONFIGS / "trainer" / "gpu.yaml"),
                 "--trainer.devices", "1", "--trainer.gradient_clip_val", "1.0", *SHORT,
                 *probed(tmp_path / "state.json")]) == 0
    assert json.loads((tmp_path / "runs/demo/version_0/results.json").read_text())["global_step"] == 6
    assert json.loads((tmp_path / "state.json").read_text())["fused"] is False


@requires_gpus(1)
def test_fp16s_scaler_skips_a_non_finite_loss_and_a_persistent_one_is_divergence(tmp_path, monkeypatch):
    """configs/trainer/gpu.yaml's fp16 with its gradient scaler (fused AdamW): NaN losses at steps 2 and 3 are skipped
    steps (the run completes, its weights finite, the scale halved twice); NaN from step 2 on stops the run, exit 3,
    after RunGuard's SKIPPED_STEPS of them."""
    from lit_embed.callbacks.guard import SKIPPED_STEPS

    monkeypatch.chdir(tmp_path)

    def run(name: str, max_steps: int, **nan) -> int:
        probe = {"class_path": "tests.helpers.probes.NonFiniteLoss", "init_args": nan}
        return main(["fit", "--config", str(CONFIGS / "demo.yaml"), "--trainer", str(CONFIGS / "trainer" / "gpu.yaml"),
                     "--trainer.devices", "1", *SHORT, "--trainer.max_steps", str(max_steps),
                     "--trainer.val_check_interval", str(max_steps), "--trainer.default_root_dir", f"runs/{name}",
                     "--trainer.callbacks+", json.dumps(probe)])

    assert run("skipped", 6, steps=[2, 3]) == 0
    results = json.loads((tmp_path / "runs/skipped/version_0/results.json").read_text())
    assert results["status"] == "complete" and results["global_step"] == 6
    state = torch.load(tmp_path / "runs/skipped/version_0/checkpoints/last.ckpt", weights_only=True)
    assert all(bool(torch.isfinite(v).all()) for v in state["state_dict"].values() if v.is_floating_point())
    assert state["MixedPrecision"]["scale"] <= 2.0**16 / 4  # each NaN step skipped (a real overflow may add more)
    assert run("persistent", SKIPPED_STEPS + 4, from_step=2) == 3
    results = json.loads((tmp_path / "runs/persistent/version_0/results.json").read_text())
    assert results["status"] == "diverged" and SKIPPED_STEPS + 1 <= results["global_step"] <= SKIPPED_STEPS + 4  # read later
    assert results["detail"].startswith(f"the training loss was nan at step {SKIPPED_STEPS + 1} ")


@requires_gpus(2)
def test_ddp_over_nccl_on_two_gpus_agrees_across_ranks(tmp_path):
    """configs/trainer/ddp.yaml on 2 GPUs: the run finishes with the same weights on both ranks, and rank 0 writes
    one run folder and its checkpoint."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0,1")}
    done = subprocess.run([sys.executable, "-m", "lit_embed.commands", "fit", "--config", str(CONFIGS / "demo.yaml"),
                           "--trainer", str(CONFIGS / "trainer" / "ddp.yaml"), "--trainer.devices", "2", *SHORT,
                           *probed(tmp_path / "state-{rank}.json")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.name for p in (tmp_path / "runs" / "demo").iterdir()) == ["version_0"]
    assert json.loads((tmp_path / "runs/demo/version_0/results.json").read_text())["global_step"] == 6
    ranks = [json.loads((tmp_path / f"state-{rank}.json").read_text()) for rank in (0, 1)]
    assert ranks[0] == ranks[1] and ranks[0]["devices"] == ["cuda"]


@requires_gpus(1)
def test_the_benchmarks_run_on_the_gpu():
    done = subprocess.run([sys.executable, str(REPO / "tools" / "bench" / "run.py"), "--smoke", "--no-write",
                           "--device", "cuda"], capture_output=True, text=True, cwd=REPO, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]

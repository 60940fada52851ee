"""MLM pre-training end to end: masking, tied decoder, no dead parameters, the demo, checkpoints."""

from __future__ import annotations

import copy
import functools

import numpy as np
import pytest
import torch

from lit_embed.commands import main
from lit_embed.data.collate import MaskedLMCollator
from lit_embed.embeddings import SubspaceEmbedding, VocabTextEncoder
from lit_embed.models import Encoder, MaskedLM
from tests.helpers import CONFIGS, tiny_encoder
from tests.helpers.cli import fit_demo


def test_masking_follows_roberta():
    encoder = VocabTextEncoder("all-MiniLM-L6-v2")
    collate = MaskedLMCollator(encoder, functools.partial(torch.randint, 30522), mask_prob=0.15)
    torch.manual_seed(0)
    items = [{"codes": np.r_[101, np.random.default_rng(i).integers(1000, 2000, 200), 102]} for i in range(50)]
    items.append({"codes": np.array([101, 1500, 102])})  # a short one gets padded
    batch = collate(items)
    labels, codes, special = batch["labels"], batch["codes"], batch["special_mask"]
    chosen = labels != -100
    assert not (chosen & special).any()  # cls, sep and padding are never predicted
    assert 0.13 < chosen[:50].float().mean() / (~special[:50]).float().mean() < 0.17
    masked = codes[chosen] == encoder.special_code("mask").item()
    kept = codes[chosen] == labels[chosen]
    assert 0.75 < masked.float().mean() < 0.85
    assert 0.05 < (kept & ~masked).float().mean() < 0.16
    assert batch["attention_mask"][-1].tolist()[:4] == [1, 1, 1, 0]
    assert (codes[-1, 3:] == encoder.special_code("pad").item()).all()


@pytest.mark.parametrize("tie", [True, False])
def test_every_parameter_learns_and_none_is_dead(tie):
    model = MaskedLM(tiny_encoder(), vocab_size=500, embedding=functools.partial(SubspaceEmbedding, num_tables=2), tie_decoder=tie)
    codes = torch.randint(500, (2, 12))
    labels = torch.full_like(codes, -100)
    labels[:, 3:9] = codes[:, 3:9]
    loss, logits, _ = model({"codes": codes, "attention_mask": torch.ones_like(codes), "labels": labels}, need_logits=True)
    assert logits.shape == (12, 500)  # logits only at the predicted positions
    loss.backward()
    unused = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum()]
    pooler = [n for n in unused if ".pooler." in n]  # the pooler serves fine-tuning heads, not MLM
    assert unused == pooler
    untied = sum(p.numel() for n, p in model.named_parameters() if n.startswith("decoder."))
    assert untied == (0 if tie else 500 * 32)
    assert "word_embeddings" not in " ".join(n for n, _ in model.named_parameters())


def test_tied_decoder_of_dense_is_the_embedding_weight():
    model = MaskedLM(tiny_encoder(), vocab_size=300)
    hidden = torch.randn(4, 32)
    assert torch.equal(model.embedding.decoder_logits(hidden), hidden @ model.embedding.weight.T)


def test_demo_runs_with_fast_dev_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["fit", "--config", str(CONFIGS / "demo.yaml"), "--trainer.fast_dev_run", "true"]) == 0


def test_demo_loss_falls_and_checkpoint_restores_the_strategy(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ckpt = fit_demo(tmp_path, "--trainer.max_steps", "40", "--trainer.val_check_interval", "40",
                    "--trainer.limit_val_batches", "4", "--data.init_args.batch_size", "8")
    events = list(tmp_path.rglob("events.out.tfevents*"))
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(events[0].parent))
    acc.Reload()
    losses = [s.value for s in acc.Scalars("train/loss")]
    # the factorised softmax trains without logits; the accuracy, which needs them, is computed where it is written
    assert [s.step for s in acc.Scalars("train/accuracy")] == [s.step for s in acc.Scalars("train/loss")]
    # starts near ln(30522) = 10.3; single batches of 8 blocks are noisy, so the best later one is compared
    assert min(losses[1:]) < losses[0] - 1.0 and losses[-1] < losses[0] - 0.5, losses
    restored = MaskedLM.load_from_checkpoint(ckpt, map_location="cpu")
    state = torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]
    assert torch.equal(restored.embedding.codes, state["embedding.codes"])
    ids = torch.arange(100, 140)[None]
    restored.eval()
    with torch.no_grad():
        out = restored.encode({"codes": ids, "attention_mask": torch.ones_like(ids)}).last_hidden_state
    again = MaskedLM.load_from_checkpoint(ckpt, map_location="cpu").eval()
    with torch.no_grad():
        assert torch.equal(out, again.encode({"codes": ids, "attention_mask": torch.ones_like(ids)}).last_hidden_state)


@pytest.mark.slow
def test_full_demo_loss_falls(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fit_demo(tmp_path)


def test_adamw_uses_the_fused_kernel_and_matches_the_reference_update():
    """The fused AdamW (the speed-up of issue 8) takes the same steps as PyTorch's reference loop."""
    from lit_embed.models.optim import OptimConfig, configure_adamw

    torch.manual_seed(0)
    fused_model = torch.nn.Sequential(torch.nn.Embedding(50, 8), torch.nn.LayerNorm(8))
    reference_model = copy.deepcopy(fused_model)
    config = OptimConfig(lr=1e-2, warmup=0, schedule="constant")
    fused = configure_adamw(fused_model, config, 10)["optimizer"]
    assert fused.defaults["fused"]
    embedding, norm = reference_model
    reference = torch.optim.AdamW(
        [{"params": [embedding.weight], "weight_decay": config.weight_decay},
         {"params": [norm.weight, norm.bias], "weight_decay": 0.0}],
        lr=config.lr, betas=config.betas, eps=config.eps, foreach=False,
    )
    ids = torch.randint(50, (4, 6))
    for _ in range(3):
        for model, optimizer in ((fused_model, fused), (reference_model, reference)):
            optimizer.zero_grad()
            model(ids).pow(2).sum().backward()
            optimizer.step()
    for a, b in zip(fused_model.parameters(), reference_model.parameters()):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("clip, precision, fused", [(None, "16-mixed", True), (1.0, "32-true", True), (1.0, "16-mixed", None)])
def test_fused_adamw_is_left_out_only_where_lightning_cannot_clip_it(clip, precision, fused):
    from types import SimpleNamespace

    model = MaskedLM(Encoder(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32), vocab_size=40)
    model._trainer = SimpleNamespace(gradient_clip_val=clip, precision=precision, estimated_stepping_batches=10)
    assert model.configure_optimizers()["optimizer"].defaults["fused"] is fused


def test_mlm_accuracy_is_the_share_of_targets_scored_highest():
    from lit_embed.models.mlm import _accuracy

    logits, targets = torch.randn(200, 1000), torch.randint(1000, (200,))
    targets[:50] = logits[:50].argmax(-1)
    assert _accuracy(logits, targets) == (logits.argmax(-1) == targets).float().mean()
    assert _accuracy(logits[:0], targets[:0]) == 0.0


@pytest.mark.parametrize("setting", [True, "reduce-overhead"])
def test_torch_compile_takes_a_mode_and_refuses_what_is_none_by_name(setting):
    """``true`` is torch.compile's default mode; a mode by name (``reduce-overhead``: CUDA graphs on a GPU) is passed
    on; anything else is refused naming the value and the modes. Compiling is lazy: building costs nothing."""
    from lit_embed.errors import ConfigError

    model = MaskedLM(tiny_encoder(), vocab_size=1000, torch_compile=setting)
    assert model.encoder._compiled_call_impl is not None
    assert MaskedLM(tiny_encoder(), vocab_size=1000).encoder._compiled_call_impl is None
    with pytest.raises(ConfigError, match=r"torch_compile='fast' is not a torch.compile mode.*reduce-overhead"):
        MaskedLM(tiny_encoder(), vocab_size=1000, torch_compile="fast")


@pytest.mark.slow
def test_a_compiled_backbone_gives_the_eager_loss_and_gradients():
    """``torch_compile: true`` compiles the backbone in place (inductor; about 20-40 s on 2 cores): the same loss and
    gradients as eager to float tolerance, the same state dict keys; the strategy stays eager, so any strategy works."""
    torch.manual_seed(0)
    codes = torch.randint(5, 1000, (4, 24))
    batch = {"codes": codes, "attention_mask": torch.ones_like(codes),
             "labels": torch.where(torch.rand(4, 24) < 0.3, codes, torch.full_like(codes, -100))}
    factory = functools.partial(SubspaceEmbedding, num_tables=3)
    eager = MaskedLM(tiny_encoder(), vocab_size=1000, embedding=factory).eval()
    compiled = MaskedLM(tiny_encoder(), vocab_size=1000, embedding=factory, torch_compile=True).eval()
    assert list(compiled.state_dict()) == list(eager.state_dict())
    compiled.load_state_dict(eager.state_dict())
    losses = [model(batch)[0] for model in (eager, compiled)]
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-5)
    for loss in losses:
        loss.backward()
    for (name, a), b in zip(eager.named_parameters(), compiled.parameters()):
        if a.grad is not None:
            torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-6, msg=name)

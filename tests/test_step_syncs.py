"""A training step reads nothing back from the device: no ``.item()``, no boolean-mask count, no sync per step."""

from __future__ import annotations

import functools
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from lit_embed.data.collate import MaskedLMCollator
from lit_embed.embeddings import DenseEmbedding, SubspaceEmbedding
from lit_embed.models import MaskedLM
from lit_embed.models.optim import configure_adamw
from tests.helpers import tiny_encoder
from tests.helpers.run_if import requires_gpus
from tests.helpers.syncs import NoHostSync

#: transformers' SDPA mask checks whether any row is padded (``padding_mask.all()``) to use the flash kernel where none
#: is: its own sync, once per forward, which the encoder's callers cannot avoid without giving up that kernel.
TRANSFORMERS_MASK = "transformers/masking_utils.py"
STRATEGIES = {"subspace": functools.partial(SubspaceEmbedding, num_tables=3), "dense": DenseEmbedding}


class _Specials:
    def special_code(self, name: str) -> np.ndarray:
        return np.asarray({"cls": 0, "pad": 1, "sep": 2, "unk": 3, "mask": 4}[name])


def _step(strategy: str, device: str = "cpu"):
    """A MaskedLM's training step (forward, backward, fused AdamW) on a collated batch, as a function."""
    torch.manual_seed(0)
    model = MaskedLM(tiny_encoder(), vocab_size=1000, embedding=STRATEGIES[strategy]).to(device)
    collate = MaskedLMCollator(_Specials(), functools.partial(torch.randint, 1000))
    rng = np.random.default_rng(0)
    batch = collate([{"codes": np.r_[0, rng.integers(5, 1000, n), 2]} for n in (30, 20, 30, 25)])
    batch = {key: value.to(device) for key, value in batch.items()}
    optimizer = configure_adamw(model, model.optim, 100)["optimizer"]

    def step(batch: dict = batch) -> torch.Tensor:
        loss, _, _ = model(batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return step, batch


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_a_masked_lm_training_step_never_waits_for_the_device(strategy):
    step, _ = _step(strategy)
    with NoHostSync(allowed=(TRANSFORMERS_MASK,)) as mode:
        step()
    assert mode.allowed_syncs == ["aten._local_scalar_dense.default"]  # transformers' one check, nothing of lit-embed's


def test_the_check_catches_a_boolean_mask():
    """Without the collator's flat indices the model finds the predicted positions by a boolean mask: a sync."""
    step, batch = _step("subspace")
    with pytest.raises(AssertionError, match="a GPU would synchronise here"), NoHostSync(allowed=(TRANSFORMERS_MASK,)):
        step({key: value for key, value in batch.items() if key != "predicted"})


@requires_gpus(1)
@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_a_masked_lm_training_step_on_a_gpu_synchronises_only_in_transformers_mask_check(strategy):
    step, _ = _step(strategy, "cuda")
    step()  # first use: the allocator and lazy initialisation may synchronise
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    syncs = [f"{w.filename}:{w.lineno}" for w in caught if "synchroniz" in str(w.message)]
    assert all(TRANSFORMERS_MASK in place for place in syncs), syncs


def test_the_run_guard_reads_the_losses_from_the_device_only_every_check_every_batches(monkeypatch):
    """RunGuard keeps each batch's loss on the device: no sync in the batches between two checks; the check itself reads
    them all at once (one sync) and stops at the first non-finite one, naming its step."""
    from types import SimpleNamespace

    from lit_embed.callbacks.guard import RunGuard
    from lit_embed.errors import DivergedError

    monkeypatch.setattr("lit_embed.callbacks.guard.run_folder", lambda trainer: Path("run"))
    guard = RunGuard(check_every=4)
    trainer = SimpleNamespace(global_step=0, strategy=SimpleNamespace(reduce=lambda tensor, reduce_op: tensor),
                              precision_plugin=None, optimizers=[], precision="32-true")
    module = SimpleNamespace(device=torch.device("cpu"))
    with NoHostSync():
        for step, loss in enumerate([1.0, float("nan"), 2.0], start=1):
            trainer.global_step = step
            guard.on_train_batch_end(trainer, module, {"loss": torch.tensor(loss)}, None, step - 1)
    trainer.global_step = 4
    with pytest.raises(AssertionError, match="a GPU would synchronise here"), NoHostSync():
        guard.on_train_batch_end(trainer, module, {"loss": torch.tensor(3.0)}, None, 3)  # the fourth: the check reads
    guard._steps = [1, 2, 3, 4]  # the same four again, checked outside the dispatch mode
    with pytest.raises(DivergedError, match="the training loss was nan at step 2"):
        guard._check_losses(trainer)
